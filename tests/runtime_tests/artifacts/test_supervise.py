"""The compile Job's engine under watch (artifacts/supervise.py beside `artifacts store`), run as the pod runs them:
the supervisor as a script of its own (the engine image's python, none of our code), `artifacts store` through the
CLI, the two meeting in one folder (the pod's /tmp).

What a user sees: a vLLM that exits fails the compile Job's pod at once, with its status and its last lines, and the
store container with it; a stored folder stops vLLM, so the pod completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuronmodel_runtime import cli
from neuronmodel_runtime.artifacts import handoff, supervise
from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.config import keys

#: How long an engine takes to end, and the store to see it, when they should: the supervisor polls every 0.5 s
#: (supervise.POLL_S); the margin is a busy machine's. A mutation that leaves one running is caught when it runs out.
STOPS_WITHIN_S = 15
INPUTS = {"engine": "vllm", "line": "native", "target": "trn2", "flags": ["--max-num-seqs", "4"]}
REFUSING_VLLM = "import sys; print('vllm serve: error: unrecognized arguments: --no-such-flag', file=sys.stderr); " \
                "sys.exit(2)"


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv(env_names.ARTIFACT_KEY_INPUTS, keys.canonical_json(INPUTS))


@pytest.fixture
def installed(tmp_path, capsys) -> Path:
    """`artifacts supervisor` as the init container runs it: the script, alone, where the engine's python finds it."""
    path = tmp_path / "handoff" / "supervise.py"
    assert cli.main(["artifacts", "supervisor", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"supervisor": str(path)}
    return path


@pytest.fixture
def engines():
    """Supervised engines, killed at the end whatever the test saw (a mutation may leave one running)."""
    started: list[subprocess.Popen] = []

    def start(script: Path, *command: str) -> subprocess.Popen:
        # -I: isolated, as in the engine's image: no PYTHONPATH, none of our code importable
        started.append(subprocess.Popen([sys.executable, "-I", str(script), str(script.parent), "--", *command],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True))
        return started[-1]

    yield start
    for engine in started:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait()


def test_the_installed_supervisor_needs_nothing_but_the_standard_library(installed):
    imports = [line.split()[1].split(".")[0] for line in installed.read_text().splitlines()
               if line.startswith(("import ", "from ")) and "__future__" not in line]
    assert set(imports) <= set(sys.stdlib_module_names), imports
    assert installed.read_text() == Path(supervise.__file__).read_text()


def test_a_vllm_that_exits_fails_with_its_status_and_the_store_stops_waiting(tmp_path, installed, capsys, key_env,
                                                                              engines):
    engine = engines(installed, sys.executable, "-c", REFUSING_VLLM)
    _, err = engine.communicate(timeout=STOPS_WITHIN_S)
    assert engine.returncode == 2  # vLLM's own: the pod fails, the Job counts a failure
    lines = err.strip().splitlines()
    assert lines[0] == "vllm serve: error: unrecognized arguments: --no-such-flag"  # the termination message's tail
    assert "exited with status 2 before its compiled folder was stored" in lines[-1]
    assert json.loads((installed.parent / supervise.EXITED).read_text()) == {"status": 2}
    # store-artifacts, waiting on a health URL nobody answers, exits too: with a line that says so
    code = cli.main(["artifacts", "store", str(tmp_path / "vllm"), "--store", str(tmp_path / "store"),
                     "--ready-url", "http://127.0.0.1:9/health", "--ready-timeout-s", str(STOPS_WITHIN_S),
                     "--engine-dir", str(installed.parent)])
    err = capsys.readouterr().err
    assert code == 2 and "the engine exited with status 2 before it answered on http://127.0.0.1:9/health" in err
    assert not (tmp_path / "store").exists()


def test_a_stored_folder_stops_vllm_and_the_pod_completes(tmp_path, installed, capsys, key_env, engines):
    serving = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(600)"
    engine = engines(installed, sys.executable, "-c", serving)
    folder = tmp_path / "vllm" / "neuron" / "compile_cache" / "0123"
    folder.mkdir(parents=True)
    (folder / "model.neff").write_text("neff")
    code = cli.main(["artifacts", "store", str(tmp_path / "vllm"), "--store", str(tmp_path / "store"),
                     "--engine-dir", str(installed.parent), "--neff-in", "neuron/compile_cache"])
    assert code == 0 and json.loads(capsys.readouterr().out)["stored"] is True
    _, err = engine.communicate(timeout=STOPS_WITHIN_S)
    assert engine.returncode == 0 and "stopped: its compiled folder is stored" in err


def test_a_failed_store_stops_vllm_too(tmp_path, installed, capsys, key_env, engines):
    engine = engines(installed, sys.executable, "-c", "import time; time.sleep(600)")
    (tmp_path / "empty").mkdir()
    code = cli.main(["artifacts", "store", str(tmp_path / "empty"), "--store", str(tmp_path / "store"),
                     "--engine-dir", str(installed.parent)])
    assert code == 2 and "holds no files" in capsys.readouterr().err
    engine.communicate(timeout=STOPS_WITHIN_S)
    assert engine.returncode == 0  # the pod fails by the store container's status, and ends


def test_sigterm_reaches_vllm(installed, engines):
    """The kubelet's SIGTERM (the Job deleted, the node drained) is passed on: vLLM drains, its status is the pod's."""
    engine = engines(installed, sys.executable, "-c", "import signal, sys, time; "
                         "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print('up', flush=True); "
                         "time.sleep(600)")
    assert engine.stdout.readline().strip() == "up"
    engine.send_signal(signal.SIGTERM)
    engine.communicate(timeout=STOPS_WITHIN_S)
    assert engine.returncode == 7
    assert not (installed.parent / supervise.EXITED).exists()


def test_usage(installed):
    out = subprocess.run([sys.executable, "-I", str(installed), "x"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage" in out.stderr


# --- the native line's entry must hold compiled graphs -----------------------------------------------------------

def _engine(handoff_dir: Path, neuron_plugin: bool) -> Path:
    handoff_dir.mkdir(parents=True, exist_ok=True)
    supervise.write_json(handoff_dir / supervise.ENGINE, {"neuron_plugin": neuron_plugin})
    return handoff_dir


def test_a_native_folder_without_a_neff_is_refused_naming_where_it_looked(tmp_path, capsys, key_env):
    """The compile library may write its NEFFs outside the stored folder (NEURON_LIBTORCH_CACHE_ROOT): an entry
    without one would fail every serving pod, which never compiles."""
    compiled = tmp_path / "vllm"
    (compiled / "torch_compile_cache").mkdir(parents=True)
    (compiled / "torch_compile_cache" / "graph.py").write_text("# traced")
    # the plugin's cache layout, its entry marked complete, but the NEFF written elsewhere
    (compiled / "neuron" / "compile_cache" / "0123456789abcdef").mkdir(parents=True)
    (compiled / "neuron" / "compile_cache" / "0123456789abcdef" / ".compilation_complete").write_text("")
    args = ["artifacts", "store", str(compiled), "--store", str(tmp_path / "store"), "--neff-in",
            "neuron/compile_cache", "--neff-in", "neuron-libtorch"]
    code = cli.main([*args, "--engine-dir", str(_engine(tmp_path / "neuron", True))])
    err = capsys.readouterr().err
    assert code == 2 and "holds no compiled graph (no *.neff under " in err
    assert f"{compiled / 'neuron/compile_cache'}, {compiled / 'neuron-libtorch'}" in err
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").rglob("manifest.json"))
    # vLLM's CPU build (no vllm_neuron in its image) compiles no NEFF: nothing to check
    code = cli.main([*args, "--engine-dir", str(_engine(tmp_path / "cpu", False))])
    assert code == 0 and json.loads(capsys.readouterr().out)["neff_checked"] is False
    # a NEFF under the compile library's root counts
    (compiled / "neuron-libtorch" / "ab").mkdir(parents=True)
    (compiled / "neuron-libtorch" / "ab" / "graph.neff").write_text("neff")
    code = cli.main([*args, "--engine-dir", str(_engine(tmp_path / "neuron", True)), "--policy", "Always"])
    assert code == 0 and json.loads(capsys.readouterr().out)["neff_checked"] is True


def test_the_check_is_the_handoffs(tmp_path):
    with pytest.raises(handoff.HandoffError, match="holds no compiled graph"):
        handoff.check_graphs(tmp_path, ["neuron/compile_cache"], None)
    assert handoff.check_graphs(tmp_path, [], None) is None
