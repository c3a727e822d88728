"""Where a real engine's latency profile comes from.

A real engine's latency depends on the machine, so its profile is measured
(`measure_profile` in each engine's package) and kept as JSON. An engine takes a
`LatencyProfile`, a path to such a JSON file, or nothing: then the file bundled beside
the engine's module is used if present (measured on a 2-core CPU machine), else none.
"""

from __future__ import annotations

from pathlib import Path

from teola_core.profiles.profile import LatencyProfile

ProfileSource = LatencyProfile | str | Path | None


def load_profile(source: ProfileSource, engine: str, bundled: Path | None = None) -> LatencyProfile | None:
    """The profile named by `source`, renamed to `engine` (curves are what matters)."""
    if isinstance(source, LatencyProfile):
        profile = source
    elif source is not None:
        profile = LatencyProfile.load(source)
    elif bundled is not None and bundled.is_file():
        profile = LatencyProfile.load(bundled)
    else:
        return None
    return profile if profile.engine == engine else LatencyProfile(engine, profile.curves)
