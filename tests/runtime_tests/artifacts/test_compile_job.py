"""`neuronmodel-runtime compile`: hit, miss, retries of the compiler's failures, and the CLI on the NxDI fake."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime_tests.helpers.fake_neuron.install import install_nxdi
from neuronmodel_runtime import cli
from neuronmodel_runtime.compile_job import CompileFailed, run_compile
from neuronmodel_runtime.runners.base import RunnerError

TARGET = Path(__file__).resolve().parents[2] / "assets" / "tiny" / "target"


class Flaky:
    """A runner whose compile fails `failures` times with `error`, then succeeds with no artifacts."""

    framework = "flaky"

    def __init__(self, log: list, failures: int, error: type = RuntimeError):
        self.log, self.failures, self.error = log, failures, error

    def compile(self):
        self.log.append("compile")
        if self.log.count("compile") <= self.failures:
            raise self.error("neuronx-cc failed with 70")
        return None

    def shutdown(self):
        self.log.append("shutdown")


def test_a_compiler_failure_is_retried_with_backoff():
    log, sleeps = [], []
    summary = run_compile(lambda: Flaky(log, 2), attempts=3, backoff_s=5, sleep=sleeps.append)
    assert summary["attempts"] == 3 and sleeps == [5, 10] and log.count("shutdown") == 3
    with pytest.raises(CompileFailed, match="failed 3 times; last error: RuntimeError: neuronx-cc failed with 70"):
        run_compile(lambda: Flaky([], 9), attempts=3, backoff_s=0, sleep=lambda s: None)


def test_a_configuration_error_is_not_retried():
    log = []
    with pytest.raises(RunnerError):
        run_compile(lambda: Flaky(log, 1, RunnerError), attempts=3, sleep=lambda s: None)
    assert log == ["compile", "shutdown"]


def nxdi_compile_argv(monkeypatch, tmp_path) -> list[str]:
    """`compile` of the tiny target on the fake NxDI 0.9, into the store folder tmp_path/pvc."""
    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "cache"))
    install_nxdi(monkeypatch, "0.9.17334", tmp_path / "site")
    return ["compile", "--model", str(TARGET), "--framework", "nxdi", "--max-num-seqs", "2", "--max-model-len", "64",
            "--max-context-length", "32", "--compile-cache-url", str(tmp_path / "pvc")]


def test_the_cli_compiles_into_the_store_once_then_hits(monkeypatch, tmp_path, capsys):
    argv = nxdi_compile_argv(monkeypatch, tmp_path)
    from neuronx_distributed_inference.models import model_base

    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["compiled"] is True and first["hit"] is False and model_base.COMPILES == 1
    assert (tmp_path / "pvc" / first["key"] / "manifest.json").is_file()
    shutil.rmtree(first["folder"])  # another pod: the store has it
    assert cli.main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert (second["hit"], second["source"], second["key"]) == (True, "store", first["key"])
    assert model_base.COMPILES == 1
    assert cli.main([*argv, "--compile-cache-policy", "Always"]) == 0 and model_base.COMPILES == 2
    assert cli.main([*argv, "--compile-cache-policy", "Never"]) == 2
    assert "is Never, which never compiles" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["corrupt file", "no manifest"])
def test_a_damaged_store_entry_is_ignored_with_a_warning_compiled_and_stored_again(monkeypatch, tmp_path, capsys,
                                                                                   caplog, damage):
    """A new pod's start-up path (the CLI, prepare_artifacts, the store): an entry with a file that does not verify,
    or whose writer died before its manifest, is a miss with a WARNING naming the entry; the key is compiled again
    and its entry stored again, so the pod after it fetches a good one."""
    argv = nxdi_compile_argv(monkeypatch, tmp_path)
    from neuronx_distributed_inference.models import model_base

    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    entry = tmp_path / "pvc" / first["key"]
    victim = sorted(p for p in entry.rglob("*") if p.is_file() and p.name != "manifest.json")[0]
    if damage == "corrupt file":
        victim.write_bytes(victim.read_bytes() + b"!")
    else:
        (entry / "manifest.json").unlink()
    for pod in ("second", "third"):
        shutil.rmtree(first["folder"])  # a new pod: nothing local
        caplog.clear()
        with caplog.at_level("WARNING", logger="neuronmodel_runtime.artifacts"):
            assert cli.main(argv) == 0
        summary = json.loads(capsys.readouterr().out)
        warnings = "\n".join(r.getMessage() for r in caplog.records
                              if r.name.startswith("neuronmodel_runtime.artifacts") and r.levelname == "WARNING")
        if pod == "second":
            assert (summary["compiled"], summary["hit"]) == (True, False) and model_base.COMPILES == 2
            assert first["key"] in warnings and "a miss" in warnings
            assert (victim.relative_to(entry).as_posix() if damage == "corrupt file" else "no manifest") in warnings
        else:
            assert (summary["hit"], summary["source"]) == (True, "store") and model_base.COMPILES == 2
            assert warnings == ""


def test_a_compile_that_fills_the_local_volume_fails_with_one_line(monkeypatch, tmp_path, capsys, small_volume):
    """The compile Job's folder on a full volume: exit 1 (the Job may retry once there is room), one line naming
    the folder, 'no space left' and the fix; the store gets no entry and keeps no lock, nothing is left staged."""
    volume = small_volume("cache", 4096)  # one page: the compiled files need more
    monkeypatch.setenv("NEURONMODEL_CACHE", str(volume.folder))
    install_nxdi(monkeypatch, "0.9.17334", tmp_path / "site")
    argv = ["compile", "--model", str(TARGET), "--framework", "nxdi", "--max-num-seqs", "2", "--max-model-len", "64",
            "--max-context-length", "32", "--compile-cache-url", str(tmp_path / "pvc")]
    assert cli.main(argv) == 1
    out = capsys.readouterr()
    line = out.err.strip().splitlines()[-1]
    assert out.out == "" and line.startswith("neuronmodel-runtime compile: compile_cache: compiling artifact key "), line
    assert f"no space left on device writing {volume.folder}/compiled/" in line, (volume.mode, line)
    assert "free space on that volume or make it larger, or point $NEURON_COMPILED_ARTIFACTS" in line
    assert [p for p in (volume.folder / "compiled").rglob("*") if p.is_file()] == []  # (digests/ is a memo)
    assert [p.name for p in (tmp_path / "pvc").rglob("*") if p.is_file()] == []


#: Run by a child process: the fake NxDI's compile announces that it runs (under the store's lock) and never ends.
HANGING_COMPILE = """
import pathlib, sys, time
sys.path.insert(0, sys.argv[1])
from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
def _compile(self, *args):
    pathlib.Path(sys.argv[2]).write_text("compiling")
    time.sleep(3600)
NeuronApplicationBase._compile = _compile
from neuronmodel_runtime import cli
sys.exit(cli.main(sys.argv[3:]))
"""


def test_sigterm_during_a_compile_releases_the_store_lock(monkeypatch, tmp_path, capsys):
    """The operator replaces a compile Job (the kubelet sends SIGTERM): the compile stops at once, exit 143, and
    its store lock is released, so the next compile of the key takes it without waiting out the lease."""
    argv = nxdi_compile_argv(monkeypatch, tmp_path)
    site, started = tmp_path / "site" / "fake-nxdi-0.9.17334", tmp_path / "started"
    child = subprocess.Popen([sys.executable, "-c", HANGING_COMPILE, str(site), str(started), *argv],
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [str(site), *sys.path])})
    try:
        while not started.exists():  # the compile runs under the lock
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.05)
        assert [p.name for p in (tmp_path / "pvc").iterdir() if p.name.endswith(".lock")]
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 143
    finally:
        child.kill()
    assert "stopped by SIGTERM; the compile lock is released" in child.stderr.read()
    assert [p.name for p in (tmp_path / "pvc").iterdir() if p.name.endswith(".lock")] == []
    assert cli.main(argv) == 0  # the next compile finds no holder
    summary = json.loads(capsys.readouterr().out)
    assert summary["compiled"] is True
