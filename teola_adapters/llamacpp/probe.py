"""Run llama.cpp's decode paths in a child process, so a native crash is reported, not fatal.

    result = probe()            # or: python -m teola_adapters.llamacpp.probe  (prints "ok")
    if not result.ok:
        print(result.detail)    # "llama.cpp died with SIGSEGV (signal 11) in a child process: ..."

The child loads the default model as the engine and the tests' reference do
(`loading`), evaluates a prompt in canonical chunks, one step of two sequences, one of
one, and a `Llama.create_completion`. A segfault there (as in `ggml_backend_amx_mul_mat`
on AMX CPUs without `loading.model_params`) kills the child only.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeResult:
    returncode: int
    detail: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def probe(command: Sequence[str] | None = None, timeout_s: float = 180.0) -> ProbeResult:
    """Run `main` (or `command`) in a child process; how it ended."""
    argv = list(command) if command is not None else [sys.executable, "-m", __name__]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    tail = " | ".join(done.stderr.strip().splitlines()[-5:])
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return ProbeResult(
            done.returncode, f"llama.cpp died with {name} (signal {-done.returncode}) in a child process: {tail}"
        )
    if done.returncode != 0:
        return ProbeResult(done.returncode, f"the llama.cpp probe failed (exit {done.returncode}): {tail}")
    return ProbeResult(0, done.stdout.strip())


def main() -> None:
    import llama_cpp
    import numpy

    from teola_adapters.llamacpp.loading import default_model_path, reference_llama
    from teola_adapters.llamacpp.lowlevel import BatchedLlama

    llm = BatchedLlama(llama_cpp, numpy, default_model_path(), n_ctx=256, n_seq=2, chunk=32, n_threads=1)
    try:
        tokens = llm.tokenize(b"Count from one to twenty in words: one, two, three, four, five, six, seven, eight")
        for seq in (0, 1):
            llm.eval(seq, tokens, 0)
        token = llm.argmax(llm.step([(0, tokens[-1], len(tokens)), (1, tokens[-1], len(tokens))])[0])
        llm.step([(0, token, len(tokens) + 1)])
    finally:
        llm.close()
    reference = reference_llama(n_ctx=256, n_batch=32, n_threads=1, verbose=False)
    reference.create_completion("Hi", max_tokens=4, temperature=0)
    reference.close()
    print("ok")


if __name__ == "__main__":
    main()
