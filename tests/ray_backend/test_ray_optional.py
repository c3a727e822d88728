"""Ray is optional: the core and the adapter import without it, and name the extra when needed."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_ray_backend_does_not_import_ray() -> None:
    code = (
        "import sys, teola_core, teola_core.runtime.ray, teola_core.runtime.ray.pool\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_ray_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['ray'] = None  # as if not installed\n"
        "from teola_core.runtime.ray import RayRuntime\n"
        "from teola_core.engines.protocol import EngineSet\n"
        "try:\n"
        "    RayRuntime(EngineSet())\n"
        "except ImportError as exc:\n"
        "    assert 'pip install \"teola[ray]\"' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
        "from teola_core.runtime.ray.pool import RayEnginePool\n"
        "try:\n"
        "    RayEnginePool(lambda: None)\n"
        "except ImportError as exc:\n"
        "    assert 'pip install \"teola[ray]\"' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
