"""Every start-up failure is one line on stderr naming the setting and the fix, with exit code 2 and no traceback:
through `cli.main` in this process, and through the installed `neuronmodel-runtime` script."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from neuronmodel_runtime import cli

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny"
SCRIPT = Path(sys.executable).parent / "neuronmodel-runtime"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def busy_port():
    """A port some other process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def copy_model(src: Path, dst: Path, **config_changes) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **config_changes}))
    return dst


def start_error(capsys, *argv: str) -> str:
    """main(argv) fails at start-up: exit code 2 and exactly one line on stderr, which is returned."""
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, expected", [
    (["--port", "99999"], r"server\.port \(--port, NEURONMODEL_PORT\): Input should be less than or equal to 65535"),
    (["--on-device-sampling", "maybe"], r"sampling\.on_device \(--on-device-sampling, .*valid boolean"),
    (["--speculation-mode", "draft"], r"speculation\.draft_model is required .* set speculation\.draft_model "
                                      r"\(--draft-model, NEURONMODEL_DRAFT_MODEL\)"),
    (["--max-model-len", "100", "--max-context-length", "200"], r"max_context_length must be <= max_model_len"),
    (["--prompt-lookup-min", "5"], r"prompt_lookup_min must be <= speculation\.prompt_lookup_max \(5 > 4\)"),
    (["--bogus", "1"], r"unrecognized arguments: --bogus 1 \(see neuronmodel-runtime --help\)"),
    (["--log-level", "loud"], r"--log-level: invalid choice: 'LOUD'"),
], ids=["range", "bool", "required", "lengths", "ngram", "unknown-flag", "log-level"])
def test_bad_settings(capsys, argv, expected):
    err = start_error(capsys, "info", *argv)  # `info`: a case that wrongly passed would not go on serving
    assert re.search(expected, err), err


def test_config_file_errors(capsys, tmp_path):
    assert "cannot read --config" in start_error(capsys, "info", "--config", str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{nope")
    assert "is not valid JSON" in start_error(capsys, "info", "--config", str(tmp_path / "bad.json"))
    (tmp_path / "typo.json").write_text(json.dumps({"speculation": {"mod": "draft"}}))
    err = start_error(capsys, "info", "--config", str(tmp_path / "typo.json"))
    assert "speculation.mod: unknown key (did you mean speculation.mode?)" in err


def test_missing_model_folder(capsys, tmp_path):
    assert "model: no Hugging Face model folder (config.json) at" in start_error(
        capsys, "selftest", "--model", str(tmp_path))


def test_framework_not_installed(capsys):
    err = start_error(capsys, "serve", "--framework", "nxdi", "--port", str(free_port()), "--model", str(TINY / "target"))
    assert "neuronx-distributed-inference is not installed" in err


def test_port_in_use_fails_before_the_model_loads(capsys, busy_port):
    err = start_error(capsys, "serve", "--port", str(busy_port), "--model", "/nonexistent")
    assert f"server.port (--port, NEURONMODEL_PORT): cannot listen on 127.0.0.1:{busy_port}" in err
    assert "choose another port" in err


def test_host_that_does_not_resolve(capsys):
    err = start_error(capsys, "serve", "--host", "no-such-host.invalid", "--port", str(free_port()))
    assert "server.host (--host, NEURONMODEL_HOST): cannot resolve 'no-such-host.invalid'" in err


def test_explicit_length_above_the_model_limit(capsys):
    err = start_error(capsys, "selftest", "--model", str(TINY / "target"), "--max-model-len", "2048")
    assert "max_model_len 2048 exceeds the model's limit (max_position_embeddings 1024 in its config.json)" in err


def test_unsupported_architecture(capsys, tmp_path):
    model = copy_model(TINY / "target", tmp_path / "gpt2", architectures=["GPT2LMHeadModel"])
    err = start_error(capsys, "selftest", "--model", str(model))
    assert "architecture 'GPT2LMHeadModel' is not supported by the torch reference runner" in err


def test_eagle_on_the_torch_runner(capsys):
    err = start_error(capsys, "selftest", "--model", str(TINY / "target"), "--speculation-mode", "eagle",
                      "--draft-model", str(TINY / "draft"))
    assert "speculation.mode 'eagle' is not supported by the torch reference runner" in err


def test_draft_with_another_vocabulary(capsys, tmp_path):
    draft = copy_model(TINY / "draft", tmp_path / "draft", vocab_size=4000)
    err = start_error(capsys, "selftest", "--model", str(TINY / "target"), "--speculation-mode", "draft",
                      "--draft-model", str(draft))
    assert "speculation.draft_model cannot serve this model" in err


def test_missing_weight(capsys, tmp_path):
    model = copy_model(TINY / "target", tmp_path / "deeper", num_hidden_layers=5)
    assert "checkpoint has no tensor 'model.layers.4." in start_error(capsys, "selftest", "--model", str(model))


def test_corrupt_weights_file(capsys, tmp_path):
    model = copy_model(TINY / "target", tmp_path / "corrupt")
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    err = start_error(capsys, "selftest", "--model", str(model))
    assert f"{model / 'model.safetensors'}: not a complete safetensors file" in err


def test_a_group_that_cannot_form_stops_at_start_naming_the_variable(capsys, monkeypatch):
    target = ["--model", str(TINY / "target"), "--framework", "torch"]
    err = start_error(capsys, "worker", *target)
    assert "`neuronmodel-runtime worker` runs a rank of a multi-process group, but this config serves alone" in err
    err = start_error(capsys, "worker", *target, "--tensor-parallel-degree", "2", "--nodes", "2", "--worker-index", "0",
                      "--leader-address", "127.0.0.1")
    assert "--worker-index 0 is the group's leader: run `neuronmodel-runtime serve` there" in err
    err = start_error(capsys, "worker", *target, "--tensor-parallel-degree", "2", "--nodes", "2", "--worker-index", "1")
    assert "parallelism.nodes is 2 but LWS_LEADER_ADDRESS is not set" in err
    monkeypatch.setenv("LWS_GROUP_SIZE", "4")
    err = start_error(capsys, "serve", *target, "--port", str(free_port()), "--tensor-parallel-degree", "2",
                      "--nodes", "2")
    assert "LWS_GROUP_SIZE=4 but parallelism.nodes is 2" in err
    monkeypatch.delenv("LWS_GROUP_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "8")
    err = start_error(capsys, "serve", *target, "--port", str(free_port()))
    assert "WORLD_SIZE=8 in a process of a single-process model" in err


def test_the_torch_runner_alone_refuses_tp_above_one(capsys):
    """selftest builds its runner without a group: TP 2 needs the ranks `serve` starts."""
    err = start_error(capsys, "selftest", "--model", str(TINY / "target"), "--tensor-parallel-degree", "2")
    assert "parallelism.tensor_parallel_degree 2 on framework torch runs 2 processes" in err


def test_the_tiny_speculative_pair_needs_no_length_flags(capsys):
    """The README's example: the tiny models allow 1024 positions, below the 2048 default."""
    assert cli.main(["selftest", "--model", str(TINY / "target"), "--speculation-mode", "draft",
                     "--draft-model", str(TINY / "draft"), "--num-speculative-tokens", "4", "--tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "selftest passed" and "pass  speculation" in out


def run_script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)


def assert_one_line_failure(out: subprocess.CompletedProcess, expected: str) -> None:
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1].startswith("neuronmodel-runtime: ") and expected in out.stderr.splitlines()[-1]


def test_script_port_in_use(busy_port):
    argv = ("serve", "--port", str(busy_port), "--model", str(TINY / "target"))
    assert_one_line_failure(run_script(*argv), "cannot listen on")
    quiet = run_script(*argv, "--log-level", "error")
    assert quiet.returncode == 2 and len(quiet.stderr.splitlines()) == 1, quiet.stderr


def test_script_unsupported_architecture(tmp_path):
    model = copy_model(TINY / "target", tmp_path / "gpt2", architectures=["GPT2LMHeadModel"])
    assert_one_line_failure(run_script("selftest", "--model", str(model)), "is not supported")
    quiet = run_script("selftest", "--model", str(model), "--log-level", "ERROR")
    assert quiet.returncode == 2 and len(quiet.stderr.splitlines()) == 1, quiet.stderr


def test_script_usage_error():
    out = run_script("serve", "--max-num-seqs")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "neuronmodel-runtime serve: argument --max-num-seqs: expected one argument "
        "(see neuronmodel-runtime serve --help)"]
