"""`neuronmodel-runtime artifacts fetch|store` (artifacts/handoff.py), run as the engine vllm pods run them: an
engine's compiled folder out of a real store and back, named by the operator's key inputs.

What a user sees: the command's exit code, its one-line error (which is also the termination message the operator's
status shows), and the files in the store and in the engine's folder."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from neuronmodel_runtime import cli
from neuronmodel_runtime.artifacts import handoff
from neuronmodel_runtime.artifacts.folder import ARTIFACTS_MARKER
from neuronmodel_runtime.artifacts.key import artifact_key
from neuronmodel_runtime.artifacts.file_store import FileStore
from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.config import keys

INPUTS = {"engine": "vllm", "target": "trn2", "flags": ["--tensor-parallel-size", "8", "--max-num-seqs", "4"]}
DIGEST = keys.digest(INPUTS)


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv(env_names.ARTIFACT_KEY_INPUTS, keys.canonical_json(INPUTS))


def _compiled(folder: Path, text: str = "neff-1") -> Path:
    """What vLLM leaves in VLLM_CACHE_ROOT after a compile (the native line's layout)."""
    entry = folder / "neuron" / "compile_cache" / "0123456789abcdef0123456789abcdef"
    entry.mkdir(parents=True)
    (entry / "model.neff").write_text(text)
    (entry / ".compilation_complete").write_text("")
    (folder / "torch_compile_cache").mkdir()
    (folder / "torch_compile_cache" / "graph.py").write_text("# traced")
    return folder


def _files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


class _Health:
    """An engine's /health on loopback: 503 for the first `starting` requests, then 200."""

    def __init__(self, starting: int) -> None:
        self.calls = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.calls += 1
                self.send_response(503 if outer.calls <= starting else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fast_poll(monkeypatch):
    monkeypatch.setattr(handoff, "READY_POLL_S", 0.05)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["artifacts", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_required_miss_fails_at_once_naming_the_key_and_the_store(tmp_path, capsys, key_env):
    code, out, err = _run(capsys, "fetch", str(tmp_path / "vllm"), "--store", str(tmp_path / "store"), "--required")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"neuronmodel-runtime: {keys.ARTIFACTS_MISSING}: no compiled artifacts for key {DIGEST} "
                           f"in {tmp_path / 'store'}")
    assert "compile Job" in line and not (tmp_path / "vllm").exists()


def test_the_compile_jobs_miss_is_no_error(tmp_path, capsys, key_env):
    code, out, _ = _run(capsys, "fetch", str(tmp_path / "vllm"), "--store", str(tmp_path / "store"))
    assert code == 0 and json.loads(out)["hit"] is False


def test_store_waits_for_the_engine_then_the_entry_reaches_another_pods_folder(tmp_path, capsys, key_env,
                                                                                fast_poll):
    compiled, health = _compiled(tmp_path / "job-vllm"), _Health(starting=3)
    try:
        code, out, err = _run(capsys, "store", str(compiled), "--store", str(tmp_path / "store"),
                              "--ready-url", health.url)
    finally:
        health.close()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["stored"] is True and summary["key"] == DIGEST and health.calls == 4  # stored once it was up
    manifest = FileStore(tmp_path / "store").lookup(artifact_key(INPUTS))
    assert manifest is not None and dict(manifest.inputs) == INPUTS  # the entry records what it was compiled for

    serving = tmp_path / "pod-vllm"
    code, out, _ = _run(capsys, "fetch", str(serving), "--store", str(tmp_path / "store"), "--required")
    assert code == 0 and json.loads(out)["hit"] is True
    fetched = _files(serving)
    assert fetched.pop(ARTIFACTS_MARKER)  # the folder says which key it holds
    assert fetched == _files(compiled)


def test_if_not_cached_keeps_the_entry_the_job_fetched_and_always_replaces_it(tmp_path, capsys, key_env):
    """The compile Job of a key already stored fetches the entry (a warm vLLM start): IfNotCached stores nothing
    then; Always stores its folder again (without the fetch's marker)."""
    store = str(tmp_path / "store")
    assert _run(capsys, "store", str(_compiled(tmp_path / "a", "first")), "--store", store)[0] == 0
    _run(capsys, "fetch", str(tmp_path / "warm"), "--store", store)
    code, out, _ = _run(capsys, "store", str(tmp_path / "warm"), "--store", store)
    assert code == 0 and json.loads(out)["stored"] is False
    code, out, _ = _run(capsys, "store", str(_compiled(tmp_path / "b", "second")), "--store", store, "--policy",
                        "Always")
    assert code == 0 and json.loads(out)["stored"] is True
    _run(capsys, "fetch", str(tmp_path / "got"), "--store", store, "--required")
    assert "second" in _files(tmp_path / "got").values() and "first" not in _files(tmp_path / "got").values()
    assert _run(capsys, "store", str(tmp_path / "got"), "--store", store, "--policy", "Always")[0] == 0
    manifest = FileStore(tmp_path / "store").lookup(artifact_key(INPUTS))
    assert ARTIFACTS_MARKER not in {f.path for f in manifest.files}


def test_a_corrupt_entry_is_replaced_by_the_next_compile_job(tmp_path, capsys, key_env):
    """Its fetch misses (the entry does not verify), vLLM compiles, and IfNotCached stores what it compiled."""
    store = tmp_path / "store"
    _run(capsys, "store", str(_compiled(tmp_path / "a", "first")), "--store", str(store))
    next(store.rglob("model.neff")).write_text("truncated")
    assert json.loads(_run(capsys, "fetch", str(tmp_path / "job"), "--store", str(store))[1])["hit"] is False
    code, out, _ = _run(capsys, "store", str(_compiled(tmp_path / "job2", "again")), "--store", str(store))
    assert code == 0 and json.loads(out)["stored"] is True
    _run(capsys, "fetch", str(tmp_path / "pod"), "--store", str(store), "--required")
    assert "again" in _files(tmp_path / "pod").values()


def test_a_corrupt_entry_is_a_miss_never_a_wrong_folder(tmp_path, capsys, key_env):
    store = tmp_path / "store"
    _run(capsys, "store", str(_compiled(tmp_path / "a")), "--store", str(store))
    neff = next(store.rglob("model.neff"))
    neff.write_text("truncated")
    code, _, err = _run(capsys, "fetch", str(tmp_path / "pod"), "--store", str(store), "--required")
    assert code == 2 and keys.ARTIFACTS_MISSING in err and not (tmp_path / "pod").exists()


def _no_space_line(err: str, folder: Path) -> None:
    (line,) = err.strip().splitlines()
    assert line.startswith("neuronmodel-runtime: ") and f"no space left on device writing {folder}" in line, line
    assert "free space on that volume or make it larger" in line, line


def test_a_full_volume_fails_the_container_with_one_line_and_keeps_nothing_half_written(tmp_path, capsys, key_env,
                                                                                        small_volume):
    """`store` into a full PVC store and `fetch` into a full engine folder: exit 2 and one line (the termination
    message) naming the folder, 'no space left' and the fix; no entry, no folder; with room, both work."""
    compiled = _compiled(tmp_path / "job-vllm", "n" * 300_000)
    pvc = small_volume("pvc", 100_000)
    code, out, err = _run(capsys, "store", str(compiled), "--store", str(pvc.folder))
    assert code == 2 and out == ""
    _no_space_line(err, pvc.folder)
    assert [p.name for p in pvc.folder.rglob("*") if p.is_file()] == []
    pvc.grow(1_000_000)
    assert _run(capsys, "store", str(compiled), "--store", str(pvc.folder))[0] == 0
    pod = small_volume("pod", 100_000)
    code, out, err = _run(capsys, "fetch", str(pod.folder / "vllm"), "--store", str(pvc.folder), "--required")
    assert code == 2 and out == ""
    _no_space_line(err, pod.folder / "vllm")
    assert list(pod.folder.iterdir()) == []
    pod.grow(1_000_000)
    assert _run(capsys, "fetch", str(pod.folder / "vllm"), "--store", str(pvc.folder), "--required")[0] == 0
    assert _files(pod.folder / "vllm") == {**_files(compiled), ARTIFACTS_MARKER: _files(pod.folder / "vllm")[
        ARTIFACTS_MARKER]}


def test_another_key_is_another_entry(tmp_path, capsys, key_env, monkeypatch):
    store = str(tmp_path / "store")
    _run(capsys, "store", str(_compiled(tmp_path / "a")), "--store", store)
    monkeypatch.setenv(env_names.ARTIFACT_KEY_INPUTS, keys.canonical_json({**INPUTS, "target": "trn3"}))
    code, _, err = _run(capsys, "fetch", str(tmp_path / "pod"), "--store", store, "--required")
    assert code == 2 and keys.digest({**INPUTS, "target": "trn3"}) in err


def test_an_engine_that_never_comes_up_fails_the_job_pod(tmp_path, capsys, key_env, fast_poll):
    health = _Health(starting=10**6)
    try:
        code, _, err = _run(capsys, "store", str(_compiled(tmp_path / "a")), "--store", str(tmp_path / "store"),
                            "--ready-url", health.url, "--ready-timeout-s", "0.3")
    finally:
        health.close()
    assert code == 2 and "did not answer 200 within" in err and "--ready-url" in err
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").rglob("manifest.json"))


@pytest.mark.parametrize("value, says", [(None, "is unset"), ("[1, 2]", "not a JSON object"),
                                         ("{not json", "not a JSON object")])
def test_the_key_inputs_are_checked_at_the_edge(tmp_path, capsys, monkeypatch, value, says):
    if value is None:
        monkeypatch.delenv(env_names.ARTIFACT_KEY_INPUTS, raising=False)
    else:
        monkeypatch.setenv(env_names.ARTIFACT_KEY_INPUTS, value)
    code, _, err = _run(capsys, "fetch", str(tmp_path / "pod"), "--store", str(tmp_path / "store"))
    assert code == 2 and env_names.ARTIFACT_KEY_INPUTS in err and says in err


def test_an_empty_folder_is_not_stored(tmp_path, capsys, key_env):
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "store", str(tmp_path / "empty"), "--store", str(tmp_path / "store"))
    assert code == 2 and "holds no files" in err


def test_a_bad_store_url_names_the_flag(tmp_path, capsys, key_env):
    code, _, err = _run(capsys, "fetch", str(tmp_path / "pod"), "--store", "ftp://x/y", "--required")
    assert code == 2 and "--store" in err and "unsupported scheme" in err
