"""The compile-artifact cache (neuronmodel_runtime.artifacts): artifact keys, entries, fetch/put, locks and `prepare`,
against a filesystem store and an S3 store (moto's S3 server, a separate process on a free port, reached through
AWS_ENDPOINT_URL as boto3 reads it). S3-only behaviour (multipart, the lease's conditional writes) is at the end."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from neuronmodel_runtime.artifacts.folder import ARTIFACTS_MARKER, sweep
from neuronmodel_runtime.artifacts.key import artifact_key, canonical_json, is_prepared, write_marker
from neuronmodel_runtime.artifacts.prepare import CacheMiss, Outcome, open_store, prepare
from neuronmodel_runtime.artifacts.file_store import FileStore
from neuronmodel_runtime.artifacts.store import MANIFEST, CacheError, CacheLockTimeout, lease_body

RUNTIME = Path(__file__).resolve().parents[3] / "runtime"
BUCKET = "artifacts"

INPUTS = {
    "model": {"source": "hf://org/llama", "revision": "abc123"},
    "framework": {"name": "nxdi", "version": "0.7.0"},
    "compiler": "neuronx-cc 2.21.1",
    "instance_family": "trn2",
    "logical_nc_config": 2,
    "tp_degree": 8,
    "batch_size": 4,
    "context_length": 1024,
    "seq_len": 2048,
    "buckets": [128, 512, 1024],
    "dtype": "bfloat16",
    "on_device_sampling": {"global_topk": 256, "dynamic": True},
    "speculation": {"mode": "none", "k": 0, "temperature": 0.7},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """moto's S3 server as a subprocess on a free port, with the bucket BUCKET."""
    boto3 = pytest.importorskip("boto3")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "moto's server did not start"
            time.sleep(0.05)
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing-secret").create_bucket(Bucket=BUCKET)
    yield endpoint
    proc.terminate()
    proc.wait(10)


def s3_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["file", "s3"])
def store_url(request, tmp_path, monkeypatch) -> str:
    if request.param == "file":
        return str(tmp_path / "store")
    s3_env(monkeypatch, request.getfixturevalue("moto_endpoint"))
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/cache"


@pytest.fixture
def store(store_url):
    return open_store(store_url)


def make_tree(folder: Path, tag: bytes = b"a") -> dict[str, bytes]:
    """Compiled-looking artifacts, nested, with an empty file; returns {relative path: bytes}."""
    files = {
        "neuron_config.json": b'{"tp_degree": 8, "tag": "' + tag + b'"}',
        "graphs/context_encoding/bucket_128.neff": os.urandom(150_000) + tag,
        "graphs/token_generation/b4.neff": os.urandom(70_000) + tag,
        "weights/tp0_sharded_checkpoint.safetensors": os.urandom(33_333) + tag,
        "weights/empty.bin": b"",
    }
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return files


def read_tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != ARTIFACTS_MARKER}


def stored(store, tmp_path: Path, key, tag: bytes = b"a") -> dict[str, bytes]:
    src = tmp_path / f"src-{tag.decode()}"
    files = make_tree(src, tag)
    store.put(key, src, {"compile_s": 1.5})
    return files


def src_file(tmp_path: Path) -> Path:
    return tmp_path / "src-a" / "graphs/context_encoding/bucket_128.neff"


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


# --- keys ------------------------------------------------------------------------------------------------------------

def test_key_is_stable_and_ignores_dict_order():
    key = artifact_key(INPUTS)
    assert key.digest == artifact_key(json.loads(json.dumps(INPUTS))).digest
    reordered = {name: INPUTS[name] for name in reversed(INPUTS)}
    reordered["model"] = {"revision": "abc123", "source": "hf://org/llama"}
    assert artifact_key(reordered) == key and len(key.digest) == 64
    assert artifact_key({**INPUTS, "buckets": (128, 512, 1024)}) == key  # tuples are lists
    assert key.inputs == INPUTS and hash(key) == hash(artifact_key(reordered))
    # the canonical form is fixed: this digest must never change (artifacts already stored carry it)
    assert canonical_json({"b": [1, 2.5, None, True], "a": "é"}) == '{"a":"\\u00e9","b":[1,2.5,null,true]}'


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value + [value[-1]]
    raise AssertionError(value)


def _leaves(value, path=()):
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _leaves(item, path + (name,))
    else:
        yield path


def test_every_input_changes_the_key():
    base, digests = artifact_key(INPUTS).digest, set()
    for path in _leaves(INPUTS):
        changed = json.loads(json.dumps(INPUTS))
        parent = changed
        for name in path[:-1]:
            parent = parent[name]
        parent[path[-1]] = _changed(parent[path[-1]])
        digest = artifact_key(changed).digest
        assert digest != base, path
        digests.add(digest)
    assert len(digests) == len(list(_leaves(INPUTS)))
    assert artifact_key({**INPUTS, "extra": None}).digest != base
    assert artifact_key({**INPUTS, "tp_degree": 8.0}).digest != base  # 8 and 8.0 differ in JSON: callers normalise


@pytest.mark.parametrize("bad, where", [(float("nan"), "speculation.temperature"),
                                        (float("inf"), "speculation.temperature"),
                                        ({1: "x"}, "speculation.temperature"),
                                        ({"a": [1, {2, 3}]}, "speculation.temperature.a[1]")])
def test_key_refuses_nan_and_non_json(bad, where):
    inputs = json.loads(json.dumps(INPUTS))
    inputs["speculation"]["temperature"] = bad
    with pytest.raises(ValueError, match=re.escape(f"artifact key input {where}")):
        artifact_key(inputs)


# --- stores ----------------------------------------------------------------------------------------------------------

def test_open_store_forms(tmp_path, monkeypatch):
    assert isinstance(open_store(str(tmp_path)), FileStore)
    assert open_store(f"file://{tmp_path}").root == tmp_path
    for bad in ("", "ftp://host/x", "s3://", "file://relative/x", "pvc://claim/x"):
        with pytest.raises(ValueError, match="compile_cache.url"):
            open_store(bad)


def test_round_trip_nested_folders(store, tmp_path):
    key = artifact_key(INPUTS)
    src = tmp_path / "src"
    files = make_tree(src)
    (src / "graphs" / "link.neff").symlink_to(src / "graphs" / "token_generation" / "b4.neff")  # inside: stored
    (src / "outside").symlink_to(tmp_path)  # a folder outside: not stored
    assert store.lookup(key) is None and store.fetch(key, tmp_path / "dest") is False
    manifest = store.put(key, src, {"compile_s": 12.5})
    files["graphs/link.neff"] = files["graphs/token_generation/b4.neff"]
    assert [f.path for f in manifest.files] == sorted(files)
    assert manifest.key == key.digest and manifest.inputs == INPUTS and manifest.timings == {"compile_s": 12.5}
    assert manifest.writer.endswith(f"/{os.getpid()}") and manifest.created[:4].isdigit()
    assert store.lookup(key) == manifest
    raw = json.loads(store._read(f"{key.digest}/{MANIFEST}"))
    assert set(raw) == {"key", "inputs", "files", "timings", "created", "writer"}
    assert set(raw["files"][0]) == {"path", "size", "sha256"}

    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "stale.bin").write_bytes(b"from before")
    assert store.fetch(key, dest) is True
    assert read_tree(dest) == files  # byte for byte, the stale file gone
    assert is_prepared(dest, key) and not is_prepared(dest, artifact_key({"other": 1}))
    assert leftovers(dest) == []


def test_partial_entry_is_a_miss(store, tmp_path):
    key = artifact_key(INPUTS)
    stored(store, tmp_path, key)
    store._delete(f"{key.digest}/{MANIFEST}")  # a writer that died before the manifest
    assert store._list(key.digest)  # the files are there
    assert store.lookup(key) is None
    assert store.fetch(key, tmp_path / "dest") is False and not (tmp_path / "dest").exists()
    with pytest.raises(CacheMiss):
        prepare(store, key, tmp_path / "dest", "Never", lambda folder: pytest.fail("Never compiled"))


@pytest.mark.parametrize("damage", ["changed bytes", "wrong size", "missing file", "bad manifest", "other key",
                                    "path escapes"])
def test_corrupt_entry_is_a_miss_with_a_warning(store, tmp_path, caplog, damage):
    key = artifact_key(INPUTS)
    files = stored(store, tmp_path, key)
    name = f"{key.digest}/graphs/context_encoding/bucket_128.neff"
    data = files["graphs/context_encoding/bucket_128.neff"]
    if damage == "changed bytes":
        store._write(name, bytes([data[0] ^ 1]) + data[1:])
    elif damage == "wrong size":
        store._write(name, data + b"!")
    elif damage == "missing file":
        store._delete(name)
    elif damage == "bad manifest":
        store._write(f"{key.digest}/{MANIFEST}", b'{"key": "' + key.digest.encode() + b'", "files": [{"path": "../x"')
    else:
        other = json.loads(store._read(f"{key.digest}/{MANIFEST}"))
        if damage == "other key":
            other["key"] = "0" * 64
        else:  # a manifest naming a file outside the entry (and outside dest): never followed
            store._write("escaped.neff", data)
            other["files"][0]["path"] = "../escaped.neff"
            other["files"][0].update(size=len(data), sha256=hashlib.sha256(src_file(tmp_path).read_bytes()).hexdigest())
        store._write(f"{key.digest}/{MANIFEST}", json.dumps(other).encode())
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "previous.bin").write_bytes(b"kept")
    with caplog.at_level(logging.WARNING, logger="neuronmodel_runtime.artifacts.store"):
        assert store.fetch(key, dest) is False
    assert read_tree(dest) == {"previous.bin": b"kept"} and leftovers(dest) == []
    assert not (tmp_path / "escaped.neff").exists()
    warning = caplog.text
    assert key.digest in warning and "a miss" in warning
    if damage in ("changed bytes", "wrong size", "missing file"):
        assert "graphs/context_encoding/bucket_128.neff" in warning
        assert {"changed bytes": "sha256", "wrong size": "bytes", "missing file": "missing"}[damage] in warning
    # and prepare treats it as a miss: IfNotCached compiles and replaces the entry
    compiled = []
    out = prepare(store, key, tmp_path / "served", "IfNotCached", lambda f: (compiled.append(f), make_tree(f)),
                  poll_s=0.05)
    assert out.compiled and not out.hit and len(compiled) == 1 and store.fetch(key, tmp_path / "again")


def test_fetch_is_atomic(store, tmp_path, monkeypatch):
    key = artifact_key(INPUTS)
    files = stored(store, tmp_path, key)
    dest = tmp_path / "dest"
    old = make_tree(dest, b"o")
    write_marker(dest, key, "compiled")
    real, seen = store._download, []

    def download(name, path):
        assert read_tree(dest) == old and is_prepared(dest, key)  # while fetching, dest is the old complete folder
        seen.append(name)
        if len(seen) == 3:
            raise ConnectionError("the network went away")
        return real(name, path)

    monkeypatch.setattr(store, "workers", 1)
    monkeypatch.setattr(store, "_download", download)
    with pytest.raises(ConnectionError):
        store.fetch(key, dest)
    assert read_tree(dest) == old and leftovers(dest) == []  # a crash mid-fetch: the old folder, no half one
    seen.clear()
    monkeypatch.setattr(store, "_download", lambda name, path: (seen.append(name), real(name, path))[1])
    assert store.fetch(key, dest) and read_tree(dest) == files and len(seen) == len(files)


def test_fetch_into_a_mount_point(store, tmp_path, monkeypatch):
    """A `local` that is a mount point cannot be renamed: built inside it, its files moved in, the marker last."""
    key = artifact_key(INPUTS)
    files = stored(store, tmp_path, key)
    dest = tmp_path / "mnt"
    make_tree(dest, b"o")
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == dest)
    assert store.fetch(key, dest) and read_tree(dest) == files and is_prepared(dest, key)
    assert [p.name for p in dest.iterdir() if p.name.startswith(".partial")] == []


def test_always_overwrites(store, tmp_path, monkeypatch):
    key = artifact_key(INPUTS)
    stored(store, tmp_path, key, b"a")
    store._write(f"{key.digest}/only-in-a.bin", b"stale")
    calls = []
    for op in ("_delete", "_upload", "_write"):
        real = getattr(store, op)
        monkeypatch.setattr(store, op, lambda *a, _op=op, _real=real: (
            calls.append((_op, a[1] if _op == "_upload" else a[0])), _real(*a))[1])
    local = tmp_path / "local"
    new = {}
    out = prepare(store, key, local, "Always", lambda f: new.update(make_tree(f, b"b")), poll_s=0.05)
    assert out.compiled and not out.hit and out.source == "compiled" and out.compile_s > 0 and out.store_s > 0
    assert calls[0] == ("_delete", f"{key.digest}/{MANIFEST}")  # the old entry stops being a hit first
    assert calls[-1] == ("_write", f"{key.digest}/{MANIFEST}")  # the new one is a hit last
    assert ("_delete", f"{key.digest}/only-in-a.bin") in calls
    assert read_tree(local) == new
    assert store.fetch(key, tmp_path / "fetched") and read_tree(tmp_path / "fetched") == new
    assert sorted(store._list(key.digest)) == sorted([*new, MANIFEST])
    assert store.lookup(key).timings["compile_s"] == pytest.approx(out.compile_s)
    # Always recompiles even when local holds the key
    again = prepare(store, key, local, "Always", lambda f: make_tree(f, b"c"), poll_s=0.05)
    assert again.compiled and read_tree(local)["neuron_config.json"].endswith(b'"c"}')


def test_never_raises_cache_miss_with_the_fix(store, tmp_path):
    key = artifact_key(INPUTS)
    with pytest.raises(CacheMiss) as err:
        prepare(store, key, tmp_path / "local", "Never", lambda folder: pytest.fail("a Never pod compiled"))
    message = str(err.value)
    for part in (store.url, key.digest, "neuronmodel-runtime compile", "IfNotCached", "compile Job"):
        assert part in message
    files = stored(store, tmp_path, key)
    out = prepare(store, key, tmp_path / "local", "Never", lambda folder: pytest.fail("a Never pod compiled"))
    assert out.hit and not out.compiled and out.source == "store" and out.fetch_s > 0
    assert read_tree(tmp_path / "local") == files


def test_if_not_cached_compiles_once_then_hits(store, tmp_path):
    key, compiled = artifact_key(INPUTS), []

    def compile(folder: Path) -> None:
        assert folder.is_dir() and not any(folder.iterdir())  # a fresh folder
        compiled.append(make_tree(folder))

    first = prepare(store, key, tmp_path / "pod1", "IfNotCached", compile, poll_s=0.05)
    assert (first.hit, first.compiled, first.source) == (False, True, "compiled") and len(compiled) == 1
    assert first.key == key.digest and is_prepared(tmp_path / "pod1", key)
    second = prepare(store, key, tmp_path / "pod2", "IfNotCached", compile, poll_s=0.05)
    assert (second.hit, second.compiled, second.source) == (True, False, "store") and len(compiled) == 1
    assert read_tree(tmp_path / "pod2") == compiled[0]
    again = prepare(store, key, tmp_path / "pod2", "Never", compile)  # a restarted pod keeps its folder
    assert again.source == "local" and again.fetch_s == 0
    other = prepare(store, artifact_key({**INPUTS, "tp_degree": 16}), tmp_path / "pod2", "IfNotCached", compile,
                    poll_s=0.05)
    assert other.compiled and len(compiled) == 2 and not is_prepared(tmp_path / "pod2", key)


def test_compile_failure_propagates_and_releases_the_lock(store, tmp_path):
    key = artifact_key(INPUTS)
    local = tmp_path / "local"

    def broken(folder: Path) -> None:
        make_tree(folder)
        raise RuntimeError("neuronx-cc failed with 70")

    with pytest.raises(RuntimeError, match="failed with 70"):
        prepare(store, key, local, "IfNotCached", broken, poll_s=0.05)
    assert not local.exists() and leftovers(local) == [] and store.lookup(key) is None
    with store.lock(key, wait_s=0):  # released
        pass


def test_folders_of_crashed_compiles_are_swept(store, tmp_path):
    """A compile killed mid-way (SIGKILL, the OOM killer) leaves its staging folder: the next prepare on the host
    removes those whose process is gone, and leaves a live compile's and another host's alone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host, local = socket.gethostname(), tmp_path / "local"
    names = {"dead": f"local.partial-{host}-{dead.pid}-0badc0de", "old": f"local.old-{host}-{dead.pid}-0badc0df",
             "ours": f"local.partial-{host}-{os.getpid()}-00000000",  # this pid, not in flight: a restarted container
             "alive": f"local.partial-{host}-{alive.pid}-11111111", "other": f"local.partial-other-host-{dead.pid}-2"}
    try:
        for name in names.values():
            (tmp_path / name / "weights").mkdir(parents=True)
            (tmp_path / name / "weights" / "tp0.safetensors").write_bytes(b"w" * 4096)
        prepare(store, artifact_key(INPUTS), local, "IfNotCached", make_tree, poll_s=0.05)
        assert leftovers(local) == sorted([names["alive"], names["other"]])
    finally:
        alive.kill()
        alive.wait()
    assert sweep(local) == 1 and leftovers(local) == [names["other"]]


def test_no_store_compiles_into_local(tmp_path):
    key, compiled = artifact_key(INPUTS), []
    local = tmp_path / "local"
    with pytest.raises(CacheMiss, match="compile_cache.url is unset"):
        prepare(None, key, local, "Never", compiled.append)
    out = prepare(None, key, local, "IfNotCached", lambda f: compiled.append(make_tree(f)))
    assert out.compiled and out.source == "compiled" and read_tree(local) == compiled[0]
    assert prepare(None, key, local, "Never", compiled.append).source == "local" and len(compiled) == 1
    assert prepare(None, key, local, "Always", lambda f: compiled.append(make_tree(f))).compiled
    assert len(compiled) == 2
    with pytest.raises(ValueError, match="compile_cache.policy"):
        prepare(None, key, local, "Sometimes", compiled.append)


def test_concurrent_prepare_compiles_once_threads(store_url, tmp_path):
    key, compiled, outcomes, errors = artifact_key(INPUTS), [], [], []
    start = threading.Barrier(4)

    def compile(folder: Path) -> None:
        compiled.append(folder)
        time.sleep(0.4)
        make_tree(folder)

    def pod(i: int) -> None:
        try:
            store = open_store(store_url)  # each pod its own store and client
            start.wait()
            outcomes.append(prepare(store, key, tmp_path / f"pod{i}", "IfNotCached", compile, poll_s=0.05))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=pod, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(outcomes) == 4
    assert len(compiled) == 1
    assert sorted(o.source for o in outcomes) == ["compiled", "store", "store", "store"]
    assert sum(o.lock_wait_s > 0.2 for o in outcomes) >= 1  # the others waited for the compile, then fetched
    trees = [read_tree(tmp_path / f"pod{i}") for i in range(4)]
    assert all(tree == trees[0] for tree in trees)


POD = textwrap.dedent("""
    import dataclasses, json, os, sys, time
    from pathlib import Path
    from neuronmodel_runtime.artifacts.key import artifact_key
    from neuronmodel_runtime.artifacts.prepare import open_store, prepare
    url, local, counter, go = sys.argv[1:5]
    store = open_store(url)
    while not os.path.exists(go):
        time.sleep(0.01)
    def compile(folder):
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(0.5)
        (folder / "graph.neff").write_bytes(b"neff" * 1000)
    out = prepare(store, artifact_key({"model": "m", "tp": 2}), Path(local), "IfNotCached", compile, poll_s=0.05)
    print(json.dumps(dataclasses.asdict(out)))
""")


def test_concurrent_prepare_compiles_once_processes(store_url, tmp_path):
    counter, go = tmp_path / "compiles.txt", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(RUNTIME)}
    pods = [subprocess.Popen([sys.executable, "-c", POD, store_url, str(tmp_path / f"pod{i}"), str(counter), str(go)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(3)]
    time.sleep(0.3)
    go.touch()
    results = [p.communicate(timeout=60) for p in pods]
    assert all(p.returncode == 0 for p in pods), [err for _, err in results]
    assert len(counter.read_text().split()) == 1  # one process compiled
    sources = sorted(json.loads(out)["source"] for out, _ in results)
    assert sources == ["compiled", "store", "store"]
    assert all((tmp_path / f"pod{i}" / "graph.neff").read_bytes() == b"neff" * 1000 for i in range(3))


# --- a full volume (helpers/full_disk.py: a real tmpfs where mounts work, else ENOSPC at Python's writes) ------------

def assert_no_space(message: str, start: str, folder, end: str) -> None:
    """`message` is `start`, 'no space left on device writing FOLDER' (the file after it where the OS named one:
    inside FOLDER, or beside it while staged), the fix, then `end`."""
    pattern = (re.escape(f"{start}no space left on device writing {folder}") + rf"( \({re.escape(str(folder))}\S*\))?"
               + re.escape(": free space on that volume or make it larger") + re.escape(end))
    assert re.fullmatch(pattern, message), message

def test_a_full_store_volume_keeps_no_half_written_entry(small_volume, tmp_path):
    """A PVC store that fills mid-put: a CacheError naming the store, 'no space left' and the fix; no entry (never a
    hit), and what it wrote is removed; given room, the same put stores an entry that fetches byte for byte."""
    volume = small_volume("pvc", 120_000)  # the tree is 253 KB
    store, key = FileStore(volume.folder / "cache"), artifact_key(INPUTS)
    files = make_tree(tmp_path / "src")
    with pytest.raises(CacheError) as caught:
        store.put(key, tmp_path / "src", {"compile_s": 1.0})
    assert_no_space(str(caught.value), f"{store.url}: storing entry {key.digest}: ", store.url,
                    " (the partial entry was removed)")
    assert store.lookup(key) is None and store._list(key.digest) == []
    volume.grow(1_000_000)
    store.put(key, tmp_path / "src", {"compile_s": 1.0})
    assert store.fetch(key, tmp_path / "dest") and read_tree(tmp_path / "dest") == files


def test_a_full_local_volume_installs_nothing(store, small_volume, tmp_path):
    """A pod's artifacts folder on a volume without room for the entry: fetch raises (prepare does not compile into
    the same full volume instead), the folder that was there stays complete, no staging folder is left; given
    room, prepare fetches the entry."""
    key = artifact_key(INPUTS)
    files = stored(store, tmp_path, key)
    volume = small_volume("local", 400_000)
    dest, before = volume.folder / "artifacts", artifact_key({**INPUTS, "tp_degree": 16})
    old = make_tree(dest, b"o")  # the artifacts of the pod's previous spec
    write_marker(dest, before, "compiled")
    with pytest.raises(CacheError) as caught:
        prepare(store, key, dest, "IfNotCached", lambda f: pytest.fail("compiled into a full volume"), poll_s=0.05)
    assert_no_space(str(caught.value), f"{store.url}: fetching entry {key.digest}: ", dest,
                    " (nothing was installed; the next start fetches it again)")
    assert read_tree(dest) == old and is_prepared(dest, before) and leftovers(dest) == []
    volume.grow(1_000_000)
    assert prepare(store, key, dest, "Never", lambda f: pytest.fail("compiled")).source == "store"
    assert read_tree(dest) == files


def test_a_compile_that_fills_its_volume_leaves_nothing(store, small_volume):
    volume = small_volume("local", 120_000)
    local, key = volume.folder / "artifacts", artifact_key(INPUTS)
    with pytest.raises(CacheError) as caught:
        prepare(store, key, local, "IfNotCached", make_tree, poll_s=0.05)
    assert_no_space(str(caught.value), f"compiling artifact key {key.digest}: ", local,
                    ", or point $NEURON_COMPILED_ARTIFACTS (or NEURONMODEL_CACHE) at a larger one")
    assert not local.exists() and leftovers(local) == [] and store.lookup(key) is None
    with store.lock(key, wait_s=0):  # released
        pass


# --- locks -----------------------------------------------------------------------------------------------------------

def test_lock_timeout_names_key_and_holder(store):
    key = artifact_key(INPUTS)
    with store.lock(key, ttl_s=60) as held:
        started = time.monotonic()
        with pytest.raises(CacheLockTimeout) as err:
            with store.lock(key, wait_s=0.3, poll_s=0.05):
                pytest.fail("two holders")
        assert 0.3 <= time.monotonic() - started < 5
    assert err.value.key == key.digest and held.owner in err.value.holder
    assert key.digest in str(err.value) and held.owner in str(err.value) and "expires" in str(err.value)
    with store.lock(key, wait_s=0):  # released
        pass


HOLDER = textwrap.dedent("""
    import logging, sys
    from neuronmodel_runtime.artifacts.key import artifact_key
    from neuronmodel_runtime.artifacts.prepare import open_store
    logging.basicConfig(level=logging.WARNING)
    url, digest_of, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open_store(url).lock(artifact_key({"k": digest_of}), ttl_s=ttl, wait_s=0) as lease:
        print(lease.owner, flush=True)
        sys.stdin.readline()  # held until told to release it
    print("released", flush=True)
""")


def hold(store_url: str, name: str, ttl_s: float) -> tuple[subprocess.Popen, str]:
    """A compiler process holding the lock of artifact_key({"k": name}); returns it and its lease's owner."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, store_url, name, str(ttl_s)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(RUNTIME)})
    owner = proc.stdout.readline().strip()
    assert owner, proc.communicate(timeout=30)[1]
    return proc, owner


def test_a_holder_renews_its_lease(store):
    """A compile longer than the ttl keeps its lock: the holder renews it every ttl/3."""
    key = artifact_key(INPUTS)
    with store.lock(key, ttl_s=1.5) as held:
        with pytest.raises(CacheLockTimeout, match=held.owner):
            with store.lock(key, wait_s=4.5, poll_s=0.05):  # three ttls
                pytest.fail("took over a lease that was being renewed")
    with store.lock(key, wait_s=0):  # released
        pass


def test_a_killed_holder_blocks_for_at_most_its_ttl(store, caplog):
    """A compiler killed while it compiles (SIGKILL, as the OOM killer does) stops renewing: its lease lapses after
    one ttl and the next compiler takes it over."""
    proc, dead = hold(store.url, "killed", 1.0)
    key = artifact_key({"k": "killed"})
    with pytest.raises(CacheLockTimeout, match=dead):
        with store.lock(key, wait_s=0.3, poll_s=0.05):
            pass
    proc.kill()
    proc.wait(10)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        with store.lock(key, ttl_s=60, wait_s=10, poll_s=0.05) as lease:
            assert lease.broke and dead in lease.broke and lease.owner != dead
    assert time.monotonic() - started < 6  # its ttl (1 s) and polls, not the wait (10 s)
    assert "took over the expired compile lock" in caplog.text and dead in caplog.text


def test_a_frozen_holder_never_releases_the_new_lock(store):
    """A holder frozen past its ttl (SIGSTOP: a stalled node, a paused VM) loses its lease; when it runs again it
    says so and leaves the new holder's lease alone."""
    proc, frozen = hold(store.url, "frozen", 1.0)
    key = artifact_key({"k": "frozen"})
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with store.lock(key, ttl_s=60, wait_s=10, poll_s=0.05) as lease:
            assert frozen in lease.broke
            os.kill(proc.pid, signal.SIGCONT)
            out, err = proc.communicate("release\n", timeout=30)
            assert "released" in out and "taken over" in err  # noticed by its renewal, or at its release
            with pytest.raises(CacheLockTimeout, match=lease.owner):  # still held by the new holder
                with store.lock(key, wait_s=0.1, poll_s=0.02):
                    pass
    finally:
        os.kill(proc.pid, signal.SIGCONT) if proc.poll() is None else None
    with store.lock(key, wait_s=0):
        pass


def test_a_holder_whose_lock_was_taken_over_leaves_it_alone(store, caplog):
    """The release of a lease taken over meanwhile (another pod found it expired) deletes nothing."""
    key = artifact_key(INPUTS)
    name = f"{key.digest}.lock"
    with caplog.at_level(logging.WARNING):
        with store.lock(key, ttl_s=60) as held:
            seen = store._lock_read(name)
            assert seen.owner == held.owner
            assert store._lock_replace(name, seen, lease_body("another-pod", time.time() + 60)) is not None
    assert "taken over" in caplog.text and held.owner in caplog.text
    assert store._lock_read(name).owner == "another-pod"
    with pytest.raises(CacheLockTimeout, match="another-pod"):
        with store.lock(key, wait_s=0.1, poll_s=0.02):
            pass


def test_filesystem_unreadable_lock_expires_after_a_minute(tmp_path):
    store, key = FileStore(tmp_path), artifact_key(INPUTS)
    lock = tmp_path / f"{key.digest}.lock"
    lock.write_text("")  # its owner died between the create and the write
    with pytest.raises(CacheLockTimeout, match="an unreadable lock"):
        with store.lock(key, wait_s=0.05, poll_s=0.02):
            pass
    os.utime(lock, (time.time() - 61, time.time() - 61))
    with store.lock(key, wait_s=1, poll_s=0.02) as lease:
        assert lease.broke == "an unreadable lock"
        assert json.loads(lock.read_text())["owner"] == lease.owner
    assert not lock.exists()


def test_put_skips_sockets_and_refuses_a_manifest_file(tmp_path):
    store, key = FileStore(tmp_path / "store"), artifact_key(INPUTS)
    src = tmp_path / "s"
    make_tree(src)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(src / "compiler.sock"))
    try:
        assert "compiler.sock" not in [f.path for f in store.put(key, src, {}).files]
    finally:
        server.close()
    (tmp_path / "empty").mkdir()
    with pytest.raises(CacheError, match="holds no files"):
        store.put(key, tmp_path / "empty", {})
    with pytest.raises(CacheError, match="not a folder"):
        store.put(key, tmp_path / "nowhere", {})
    (src / MANIFEST).write_text("{}")
    with pytest.raises(CacheError, match="manifest.json"):
        store.put(key, src, {})


def test_artifacts_import_no_torch_and_boto3_only_for_s3(tmp_path):
    code = ("import sys; import neuronmodel_runtime.artifacts.prepare as p; p.open_store(sys.argv[1]); "
            "assert 'torch' not in sys.modules and 'boto3' not in sys.modules, sorted(sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(RUNTIME)}
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_outcome_fields():
    assert [f.name for f in dataclasses.fields(Outcome)] == [
        "key", "hit", "compiled", "source", "fetch_s", "compile_s", "store_s", "lock_wait_s"]


# --- S3 only ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def s3(moto_endpoint, monkeypatch):
    """A raw client on moto, and the environment the store reads."""
    import boto3

    s3_env(monkeypatch, moto_endpoint)
    return boto3.client("s3", region_name="us-east-1")


def test_s3_client_reads_the_environment(s3, moto_endpoint, monkeypatch):
    store = open_store(f"s3://{BUCKET}/x")
    assert store.client.meta.endpoint_url == moto_endpoint  # AWS_ENDPOINT_URL, read by boto3 itself
    assert store.client.meta.region_name == "us-east-1"
    assert store.client.meta.config.retries == {"mode": "standard", "total_max_attempts": 5}
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert open_store(f"s3://{BUCKET}/x").client.meta.region_name == "eu-west-1"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert open_store(f"s3://{BUCKET}/x").client.meta.region_name == "us-west-2"


def test_s3_multipart_round_trip_at_the_bucket_root(s3, tmp_path):
    from neuronmodel_runtime.artifacts.s3 import MiB, S3Store

    bucket = "bare-" + uuid.uuid4().hex[:8]
    s3.create_bucket(Bucket=bucket)
    store = S3Store(f"s3://{bucket}", bucket, "", multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    key = artifact_key(INPUTS)
    src = tmp_path / "src"
    files = make_tree(src)
    files["model.pt"] = os.urandom(11 * MiB)
    (src / "model.pt").write_bytes(files["model.pt"])
    with store.lock(key, wait_s=0):
        assert s3.head_object(Bucket=bucket, Key=f"{key.digest}.lock")["ContentLength"] > 0
        store.put(key, src, {"compile_s": 3.0})
    assert s3.head_object(Bucket=bucket, Key=f"{key.digest}/model.pt")["ETag"].endswith('-3"')  # 3 parts
    names = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert names == {f"{key.digest}/{rel}" for rel in [*files, MANIFEST]}  # the layout; the lease is gone
    assert store.fetch(key, tmp_path / "dest") and read_tree(tmp_path / "dest") == files


def test_moto_honours_conditional_writes(s3):
    """What the lease relies on, checked on the server the tests use: If-None-Match on create, If-Match on
    overwrite and delete."""
    from botocore.exceptions import ClientError

    name = f"probe-{uuid.uuid4().hex[:8]}"
    etag = s3.put_object(Bucket=BUCKET, Key=name, Body=b"1", IfNoneMatch="*")["ETag"]
    for call in (lambda: s3.put_object(Bucket=BUCKET, Key=name, Body=b"2", IfNoneMatch="*"),
                 lambda: s3.put_object(Bucket=BUCKET, Key=name, Body=b"2", IfMatch='"0123"'),
                 lambda: s3.delete_object(Bucket=BUCKET, Key=name, IfMatch='"0123"')):
        with pytest.raises(ClientError, match="PreconditionFailed"):
            call()
    etag = s3.put_object(Bucket=BUCKET, Key=name, Body=b"3", IfMatch=etag)["ETag"]
    s3.delete_object(Bucket=BUCKET, Key=name, IfMatch=etag)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=BUCKET, Key=name)


def test_s3_lease_uses_conditional_writes(s3):
    store, key, calls = open_store(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"), artifact_key(INPUTS), []
    for op in ("PutObject", "DeleteObject"):
        store.client.meta.events.register(f"provide-client-params.s3.{op}",
                                          lambda params, _op=op, **kw: calls.append((_op, dict(params))))
    with store.lock(key):
        pass
    assert [(op, "IfNoneMatch" in p, "IfMatch" in p) for op, p in calls] == [("PutObject", True, False),
                                                                             ("DeleteObject", False, True)]
    calls.clear()
    lapsed = json.dumps({"owner": "a-crashed-compiler", "expires": time.time() - 1}).encode()
    s3.put_object(Bucket=BUCKET, Key=store._key(f"{key.digest}.lock"), Body=lapsed)
    with store.lock(key, ttl_s=0.6, wait_s=5, poll_s=0.05) as lease:
        assert "a-crashed-compiler" in lease.broke
        time.sleep(0.5)  # one renewal
    puts = [("IfNoneMatch" in p, "IfMatch" in p) for op, p in calls if op == "PutObject"]
    assert puts[:2] == [(True, False), (False, True)]  # create (refused), take over
    assert len(puts) > 2 and set(puts[2:]) == {(False, True)}  # renewals
    assert [op for op, _ in calls][-1] == "DeleteObject" and "IfMatch" in calls[-1][1]


def test_s3_fallback_without_conditional_writes(s3, monkeypatch, caplog):
    """A store answering NotImplemented to conditional writes: the best-effort lock (read, create, settle, read
    back), logged once."""
    from botocore.exceptions import ClientError

    from neuronmodel_runtime.artifacts import s3 as s3_store

    monkeypatch.setattr(s3_store, "SETTLE_S", 0.05)
    store, key = open_store(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"), artifact_key(INPUTS)
    for op in ("put_object", "delete_object"):
        real = getattr(store.client, op)

        def refuse(*args, _real=real, _op=op, **kwargs):
            if "IfNoneMatch" in kwargs or "IfMatch" in kwargs:
                raise ClientError({"Error": {"Code": "NotImplemented", "Message": "no"}}, _op)
            return _real(*args, **kwargs)

        monkeypatch.setattr(store.client, op, refuse)
    with caplog.at_level(logging.WARNING):
        with store.lock(key, wait_s=0) as held:
            assert "best effort" in caplog.text
            with pytest.raises(CacheLockTimeout, match=held.owner):
                with store.lock(key, wait_s=0.1, poll_s=0.02):
                    pass
    with store.lock(key, wait_s=0):  # released by the plain delete
        pass


def test_s3_errors_are_not_misses(s3, tmp_path):
    store = open_store("s3://no-such-bucket-here/cache")
    with pytest.raises(CacheError, match=r"s3://no-such-bucket-here/cache: .*NoSuchBucket"):
        store.lookup(artifact_key(INPUTS))
    with pytest.raises(CacheError, match="NoSuchBucket"):
        prepare(store, artifact_key(INPUTS), tmp_path / "local", "IfNotCached", lambda f: None, poll_s=0.05)
