"""`teola profile ENGINE` measures a real engine and writes a profile the engines load."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("pgvector")

from teola.cli import main
from teola_core.profiles.profile import LatencyProfile


@pytest.mark.parametrize(("engine", "curves"), [("embeddings", {"embed"}), ("pgvector", {"ingest", "search"})])
def test_profile_command_writes_a_loadable_profile(
    engine: str, curves: set[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"{engine}.json"
    assert main(["profile", engine, "--out", str(out), "--repeats", "1"]) == 0
    profile = LatencyProfile.load(out)
    assert set(profile.curves) == curves
    assert all(len(c.points) >= 3 for c in profile.curves.values())
    assert f"wrote {out}" in capsys.readouterr().out


def test_profile_vllm_needs_a_server() -> None:
    with pytest.raises(SystemExit, match="--url and --model are required"):
        main(["profile", "vllm"])
