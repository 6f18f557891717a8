"""A model folder with a file missing or damaged: the real `neuronmodel-runtime serve` (a subprocess, framework torch,
on a copy of the tiny model) exits non-zero with one line naming the file and the fix (no traceback), and its
/ready never answers 200 while it lives.

The damaged weights' messages are checked against safetensors' own loader: the error it raises for the same file is
carried in ours."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from runtime_tests.helpers import probe

TARGET = Path(__file__).resolve().parents[1] / "assets" / "tiny" / "target"
SCRIPT = Path(sys.executable).parent / "neuronmodel-runtime"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_fails(model: Path, timeout: float = 120) -> str:
    """Run `serve` on `model` until it exits, asking /ready all along; assert it exits 2 with a one-line reason (no
    traceback) and /ready was never 200; the reason."""
    port = free_port()
    proc = subprocess.Popen([str(SCRIPT), "serve", "--model", str(model), "--framework", "torch", "--port", str(port),
                             "--max-model-len", "256"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    answers, deadline = [], time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                answers.append(probe.get(f"http://127.0.0.1:{port}/ready", timeout=0.5).status_code)
            time.sleep(0.05)
        assert proc.poll() is not None, f"serve still running after {timeout:.0f} s on a broken model"
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert 200 not in answers, answers
    assert proc.returncode == 2 and "Traceback" not in err, err
    line = err.splitlines()[-1]
    assert line.startswith("neuronmodel-runtime: "), err
    return line


def broken_copy(tmp_path: Path, damage: Callable[[Path], None]) -> Path:
    model = tmp_path / "model"
    shutil.copytree(TARGET, model)
    damage(model)
    return model


def safetensors_own_error(path: Path) -> str:
    from safetensors import SafetensorError, safe_open

    with pytest.raises(SafetensorError) as caught:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                f.get_tensor(name)
    return str(caught.value)


def truncate_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


@pytest.mark.parametrize("damage", [truncate_half, lambda p: p.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")],
                         ids=["truncated", "garbage"])
def test_damaged_weights_name_the_file_and_the_fix(tmp_path, damage):
    model = broken_copy(tmp_path, lambda m: damage(m / "model.safetensors"))
    line = serve_fails(model)
    assert f"{model / 'model.safetensors'}: not a complete safetensors file" in line
    assert safetensors_own_error(model / "model.safetensors") in line
    assert "re-download or re-convert the model" in line


def test_missing_weights(tmp_path):
    model = broken_copy(tmp_path, lambda m: (m / "model.safetensors").unlink())
    assert f"{model}: no model.safetensors or model.safetensors.index.json" in serve_fails(model)


def test_missing_config(tmp_path):
    model = broken_copy(tmp_path, lambda m: (m / "config.json").unlink())
    line = serve_fails(model)
    assert f"no Hugging Face model folder (config.json) at {model}; the folder holds other files: re-download or " \
           "re-convert the model, or check `model`" in line


def test_corrupt_config(tmp_path):
    model = broken_copy(tmp_path, lambda m: (m / "config.json").write_text('{"hidden_size": '))
    line = serve_fails(model)
    assert f"{model / 'config.json'} is not valid JSON" in line and "re-download or re-convert the model" in line


def test_missing_tokenizer(tmp_path):
    def remove(model: Path) -> None:
        (model / "tokenizer.json").unlink()
        (model / "tokenizer_config.json").unlink()

    line = serve_fails(broken_copy(tmp_path, remove))
    assert f"model: {tmp_path / 'model'} has no tokenizer (no tokenizer.json, " in line
    assert "copy the model's tokenizer files into it, or re-download the model" in line


def test_corrupt_tokenizer(tmp_path):
    model = broken_copy(tmp_path, lambda m: (m / "tokenizer.json").write_text(json.dumps({"version": "1.0"})[:-3]))
    line = serve_fails(model)
    assert f"cannot load the tokenizer from {model / 'tokenizer.json'} (" in line
    assert "re-download or re-convert the model" in line
