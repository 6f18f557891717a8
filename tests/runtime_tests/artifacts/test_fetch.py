"""`neuronmodel-runtime fetch SOURCE DEST`: what the operator's init container does, run as the installed console
script against real HTTP endpoints: moto's S3 server (behind a proxy that counts requests and injects faults) and a
local Hugging Face Hub (fake_hf_hub.py). Plus the pure helpers: parse_source and select_hf_files."""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Callable, Optional
from urllib.parse import urlsplit

import pytest

from runtime_tests.helpers.fake_hf_hub import BodyFaults, FakeHub, Request
from neuronmodel_runtime import cli
from neuronmodel_runtime.config.sources import ACCEPTED_FORMS, ModelSource, parse_source
from neuronmodel_runtime.fetch import MARKER, PROGRESS, FetchError, fetch
from neuronmodel_runtime.remotes import select_hf_files

SCRIPT = Path(sys.executable).parent / "neuronmodel-runtime"
MiB = 1 << 20
TOKEN = "hf_test_secret_0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_files(big: int) -> dict[str, bytes]:
    """A fake model folder: config, tokenizer, random weights of `big` bytes."""
    return {"config.json": json.dumps({"model_type": "llama", "hidden_size": 64}).encode(),
            "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
            "model.safetensors": os.urandom(big)}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without HF_* / AWS_* settings (a developer's token or profile), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "AWS_"))}
    return {**env, "AWS_EC2_METADATA_DISABLED": "true", "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


def run_fetch(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), "fetch", *args], env=env, capture_output=True, text=True, timeout=timeout)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The run failed as a start-up error does: exit code 2, no traceback, one `neuronmodel-runtime:` line, last."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr, result.stderr
    assert [line for line in lines if line.startswith("neuronmodel-runtime:")] == lines[-1:], result.stderr
    return lines[-1]


def assert_fetched(dest: Path, files: dict[str, bytes], source: str) -> dict:
    """DEST holds exactly `files`, byte for byte, and the marker; no staging folder is left beside it."""
    found = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert found == set(files) | {MARKER}
    for name, data in files.items():
        assert (dest / name).read_bytes() == data, name
    marker = json.loads((dest / MARKER).read_text())
    assert marker["source"] == source
    assert marker["files"] == {name: {"size": len(data), "etag": marker["files"][name]["etag"]}
                               for name, data in files.items()}
    assert not dest.with_name(dest.name + ".partial").exists()
    return marker


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def recorded(root: Path) -> set[str]:
    """The files a fetch's progress record under `root` lists as complete (wherever the fetch keeps it)."""
    for record in root.rglob(PROGRESS):
        try:
            return set(json.loads(record.read_text())["files"])
        except (OSError, ValueError):
            pass
    return set()


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


# --- the pure helpers ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, expected, canonical", [
    ("hf://HuggingFaceTB/SmolLM2-135M-Instruct", ("hf", "HuggingFaceTB/SmolLM2-135M-Instruct", ""),
     "hf://HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("hf://org/name/", ("hf", "org/name", ""), "hf://org/name"),
    ("s3://models", ("s3", "models", ""), "s3://models"),
    ("s3://my.models-1/llama/3.1-8b/", ("s3", "my.models-1", "llama/3.1-8b"), "s3://my.models-1/llama/3.1-8b"),
    ("pvc://model-cache", ("pvc", "model-cache", ""), "pvc://model-cache"),
    ("pvc://model-cache/llama/8b", ("pvc", "model-cache", "llama/8b"), "pvc://model-cache/llama/8b"),
    ("/models/llama//8b/", ("path", "/models/llama/8b", ""), "/models/llama/8b"),
])
def test_parse_source_accepts(url, expected, canonical):
    source = parse_source(url)
    assert (source.scheme, source.location, source.path) == expected
    assert source.url == canonical and parse_source(source.url) == source
    assert source.needs_fetch == (source.scheme in ("hf", "s3"))


@pytest.mark.parametrize("url, names", [
    ("ftp://host/model", "unknown scheme ftp://"),
    ("hf://", "hf:// needs a Hugging Face repository id ORG/NAME"),
    ("hf://only-a-name", "hf:// needs a Hugging Face repository id ORG/NAME"),
    ("hf://org/name/extra", "hf:// needs a Hugging Face repository id ORG/NAME"),
    ("s3://", "s3:// needs an S3 bucket name"),
    ("s3:///prefix", "s3:// needs an S3 bucket name"),
    ("s3://Bad_Bucket/x", "s3:// needs an S3 bucket name"),
    ("s3://bucket/a/../b", "the path 'a/../b' has an empty, '.' or '..' part"),
    ("pvc://claim/a//b", "the path 'a//b' has an empty, '.' or '..' part"),
    ("pvc://", "pvc:// needs a PersistentVolumeClaim name"),
    ("models/llama", "not a URL or an absolute path"),
    ("", "not a URL or an absolute path"),
])
def test_parse_source_rejects(url, names):
    with pytest.raises(ValueError) as info:
        parse_source(url)
    assert names in str(info.value) and f"accepted: {ACCEPTED_FORMS}" in str(info.value)


LLAMA_REPO = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "tokenizer.model", "chat_template.jinja", "model.safetensors.index.json",
              "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "pytorch_model.bin.index.json",
              "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin", "original/consolidated.00.pth",
              "original/params.json", "original/tokenizer.model", "onnx/model.onnx", "model.gguf", "flax_model.msgpack",
              "tf_model.h5", "training_args.bin", "README.md", "LICENSE", ".gitattributes", "figure.png"]


@pytest.mark.parametrize("repo, expected", [
    (LLAMA_REPO, ["chat_template.jinja", "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                  "model-00002-of-00002.safetensors", "model.safetensors.index.json", "special_tokens_map.json",
                  "tokenizer.json", "tokenizer.model", "tokenizer_config.json"]),
    # Mistral: its own consolidated.safetensors is a second copy of the weights
    (["config.json", "params.json", "tekken.json", "consolidated.safetensors", "model-00001-of-00001.safetensors",
      "model.safetensors.index.json"],
     ["config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json", "params.json",
      "tekken.json"]),
    (["config.json", "consolidated.safetensors"], ["config.json", "consolidated.safetensors"]),
    # no safetensors: the PyTorch weights, never other .bin files
    (["config.json", "vocab.json", "merges.txt", "pytorch_model.bin", "training_args.bin", "model.onnx"],
     ["config.json", "merges.txt", "pytorch_model.bin", "vocab.json"]),
], ids=["llama", "mistral", "consolidated-only", "bin-fallback"])
def test_select_hf_files(repo, expected):
    assert select_hf_files(repo) == expected


@pytest.mark.parametrize("repo, message", [
    (["model.safetensors", "tokenizer.json"], "no config.json at the repository's top level"),
    (["config.json", "original/model.safetensors", "model.gguf"], "no weights (*.safetensors, or pytorch_model*.bin)"),
])
def test_select_hf_files_refuses_what_cannot_be_served(repo, message):
    with pytest.raises(FetchError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        select_hf_files(repo)


# --- command-line contract -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["ftp://x", "DEST"], f"model source 'ftp://x': unknown scheme ftp://; accepted: {ACCEPTED_FORMS}"),
    (["hf://", "DEST"], "hf:// needs a Hugging Face repository id ORG/NAME"),
    (["s3://", "DEST"], "s3:// needs an S3 bucket name first"),
    (["pvc://model-cache/llama", "DEST"], "pvc://model-cache/llama: a PersistentVolumeClaim needs no fetch: the "
                                          "operator mounts it into the pod; fetch downloads hf:// and s3:// sources"),
    (["/models/llama", "DEST"], "/models/llama: a local path needs no fetch"),
    (["s3://models/llama", "DEST", "--revision", "v2"], "--revision v2: s3://models/llama has no revisions "
                                                        "(only hf:// sources do)"),
    (["hf://org/name"], "the following arguments are required: DEST"),
], ids=["ftp", "hf-no-name", "s3-no-bucket", "pvc", "path", "s3-revision", "no-dest"])
def test_bad_sources(capsys, tmp_path, argv, message):
    argv = [str(tmp_path / "m") if a == "DEST" else a for a in argv]
    assert cli.main(["fetch", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("neuronmodel-runtime"), err
    assert message in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.partial").exists()


# --- S3 --------------------------------------------------------------------------------------------------------------

class S3Proxy:
    """An HTTP proxy in front of moto's S3 server: logs each request, answers 403 AccessDenied while `deny` is set,
    and applies BodyFaults to object bodies (named by the key's last path part)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.requests: list[Request] = []
        self.faults = BodyFaults()
        self.deny = False
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy._forward(self)

            do_HEAD = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.faults.release()
        self._server.shutdown()
        self._server.server_close()

    def gets(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.split("?")[0].endswith("/" + name)]

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        self.requests.append(Request(handler.command, path, handler.headers.get("Range"), None))
        if self.deny:
            body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            handler.send_response(403)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        upstream = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        upstream.request(handler.command, path, headers={k: v for k, v in handler.headers.items()
                                                          if k.lower() != "connection"})
        response = upstream.getresponse()
        body = response.read()
        upstream.close()
        handler.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command == "GET":
            self.faults.send(handler, path.split("?")[0].rsplit("/", 1)[-1], body)


@pytest.fixture(scope="module")
def moto_url():
    """moto's S3 server on a free port of 127.0.0.1 (a real HTTP endpoint), for this module."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class Bucket:
    """A bucket with a fake model under `prefix/`, and the environment that points fetch at it."""

    def __init__(self, moto_url: str, name: str, files: dict[str, bytes]) -> None:
        import boto3

        self.name, self.files, self.prefix = name, files, "llama/8b"
        self.client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing-secret-key")
        self.client.create_bucket(Bucket=name)
        for key, data in files.items():
            self.client.put_object(Bucket=name, Key=f"{self.prefix}/{key}", Body=data)
        self.proxy = S3Proxy(moto_url)
        self.url = f"s3://{name}/{self.prefix}"
        self.env = clean_env(AWS_ENDPOINT_URL=self.proxy.url, AWS_ACCESS_KEY_ID="testing",
                             AWS_SECRET_ACCESS_KEY="testing-secret-key", AWS_DEFAULT_REGION="us-east-1")


@pytest.fixture
def bucket(moto_url, request):
    """A bucket of its own for this test, with config.json, tokenizer.json, 6 MiB of weights and a nested file."""
    files = {**model_files(6 * MiB), "extra/notes/readme.txt": b"nested paths are kept\n"}
    made = Bucket(moto_url, "models-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12], files)
    yield made
    made.proxy.close()


def test_s3_fetch(bucket, tmp_path):
    dest = tmp_path / "models" / "model"
    result = run_fetch(bucket.url, str(dest), env=bucket.env)
    assert result.returncode == 0, result.stderr
    marker = assert_fetched(dest, bucket.files, bucket.url)
    assert marker["revision"] is None
    log = result.stderr
    assert "Found endpoint for s3 via: environment_global" in log  # boto3 itself read AWS_ENDPOINT_URL
    for name, data in bucket.files.items():
        assert f"downloading {name} ({len(data)} bytes)" in log
        assert f"downloaded {name}: {len(data)} bytes in " in log and " MB/s)" in log
    total = sum(map(len, bucket.files.values()))
    assert f"fetched {bucket.url} into {dest}: 4 files, {total} bytes in " in log
    assert len(log.splitlines()) < 20  # no flood
    assert "testing-secret-key" not in log
    assert [len(bucket.proxy.gets(name)) for name in bucket.files] == [1, 1, 1, 1]


def test_s3_already_fetched_makes_no_request(bucket, tmp_path):
    dest = tmp_path / "model"
    assert run_fetch(bucket.url, str(dest), env=bucket.env).returncode == 0
    nowhere = {**bucket.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}  # any request would fail
    started = time.monotonic()
    again = run_fetch(bucket.url, str(dest), "--revision", "main", env=nowhere)
    assert again.returncode == 0, again.stderr
    assert f"{bucket.url} already fetched into {dest}" in again.stderr
    assert time.monotonic() - started < 10
    assert_fetched(dest, bucket.files, bucket.url)


def write_tree(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


@pytest.mark.parametrize("leftover", ["no-marker", "other-source", "truncated-file"])
def test_s3_stale_dest_is_not_complete(bucket, tmp_path, leftover):
    """A DEST that is not a complete fetch of this source is fetched again and replaced, leftovers and all."""
    dest = tmp_path / "model"
    write_tree(dest, {**bucket.files, "stale.bin": b"old"})
    if leftover == "other-source":
        (dest / MARKER).write_text(json.dumps({"source": "s3://other/model", "revision": None, "files": {}}))
    elif leftover == "truncated-file":
        (dest / "model.safetensors").write_bytes(bucket.files["model.safetensors"][:MiB])
        files = {name: {"size": len(data), "etag": "x"} for name, data in bucket.files.items()}
        (dest / MARKER).write_text(json.dumps({"source": bucket.url, "revision": None, "files": files}))
    result = run_fetch(bucket.url, str(dest), env=bucket.env)
    assert result.returncode == 0, result.stderr
    assert f"{dest} holds no complete fetch of {bucket.url}" in result.stderr
    assert_fetched(dest, bucket.files, bucket.url)
    assert not dest.with_name("model.old").exists()


def part_size(root: Path, name: str) -> int:
    """The size of the partial download of `name` under `root` (0: none)."""
    return max((part.stat().st_size for part in root.rglob(f"{name}.*.part")), default=0)


def test_s3_killed_fetch_resumes_with_a_range(bucket, tmp_path):
    """A fetch killed mid-file leaves no DEST; the next run downloads only the rest: the finished files not again,
    the big one from its partial bytes (a ranged GET)."""
    dest = tmp_path / "model"
    bucket.proxy.faults.stall("model.safetensors", 2 * MiB)
    proc = subprocess.Popen([str(SCRIPT), "fetch", bucket.url, str(dest)], env=bucket.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: part_size(tmp_path, "model.safetensors") == 2 * MiB
                 and recorded(tmp_path) == set(bucket.files) - {"model.safetensors"}, "a partial model.safetensors")
    finally:
        kill(proc)
    assert not dest.exists()  # a partial download is never used
    result = run_fetch(bucket.url, str(dest), env=bucket.env)
    assert result.returncode == 0, result.stderr
    assert "3 files already downloaded by an earlier run" in result.stderr
    assert f"model.safetensors: resuming at byte {2 * MiB} of {6 * MiB}" in result.stderr
    assert_fetched(dest, bucket.files, bucket.url)
    assert [r.range for r in bucket.proxy.gets("model.safetensors")] == [None, f"bytes={2 * MiB}-"]
    assert all(len(bucket.proxy.gets(name)) == 1 for name in bucket.files if name != "model.safetensors")


def test_s3_connection_cut_midway_resumes(bucket, tmp_path):
    dest = tmp_path / "model"
    bucket.proxy.faults.cut("model.safetensors", 3 * MiB)
    result = run_fetch(bucket.url, str(dest), env=bucket.env)
    assert result.returncode == 0, result.stderr
    assert "model.safetensors: connection lost at byte" in result.stderr
    assert_fetched(dest, bucket.files, bucket.url)
    first, second = bucket.proxy.gets("model.safetensors")
    assert first.range is None and second.range.startswith("bytes=") and second.range != "bytes=0-"


@pytest.mark.parametrize("faults", [[("corrupt", 5 * MiB)], [("cut", 5 * MiB), ("corrupt", 1000)]],
                         ids=["whole-body", "resumed-body"])
def test_s3_corrupt_download_is_refused(bucket, tmp_path, faults):
    """A body corrupted on the way is refused, and nothing of it kept: a whole one by botocore's check of the
    object's checksum, a resumed (ranged) one by the MD5 a plain ETag is."""
    dest = tmp_path / "model"
    for fault, at in faults:
        getattr(bucket.proxy.faults, fault)("model.safetensors", at)
    line = error_line(run_fetch(bucket.url, str(dest), env=bucket.env))
    assert f"{bucket.url}: model.safetensors arrived corrupted (" in line
    assert line.endswith("the partial file was removed: run fetch again")
    if len(faults) == 2:
        assert "its MD5 is not its ETag" in line and bucket.proxy.gets("model.safetensors")[-1].range
    assert not dest.exists() and part_size(tmp_path, "model.safetensors") == 0
    result = run_fetch(bucket.url, str(dest), env=bucket.env)
    assert result.returncode == 0, result.stderr
    assert_fetched(dest, bucket.files, bucket.url)


def test_s3_fetch_into_a_full_volume(bucket, small_volume):
    """A volume without room for the weights: one line naming DEST, 'no space left' and the fix, exit 2, and no DEST
    (a partial download is never a model folder); given room, the next run resumes and DEST holds the files byte
    for byte."""
    volume = small_volume("models", 2 * MiB)  # the weights are 6 MiB
    dest = volume.folder / "model"
    result = subprocess.run(volume.command("fetch", bucket.url, str(dest)), env=volume.env(bucket.env),
                            capture_output=True, text=True, timeout=60)
    line = error_line(result)
    assert f"{bucket.url}: no space left on device writing {dest}: free space on that volume or make it larger, " \
           f"then run fetch again (the files it finished stay in {dest}.partial" in line, volume.mode
    assert not dest.exists() and "model.safetensors" not in recorded(volume.folder)
    volume.grow(16 * MiB)
    again = subprocess.run(volume.command("fetch", bucket.url, str(dest)), env=volume.env(bucket.env),
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert "model.safetensors: resuming at byte " in again.stderr  # the bytes that fitted, checked by the MD5
    assert_fetched(dest, bucket.files, bucket.url)


def test_s3_errors(bucket, tmp_path):
    dest = str(tmp_path / "model")
    line = error_line(run_fetch(f"s3://no-such-bucket-{bucket.name}/llama", dest, env=bucket.env))
    assert f"no such bucket 'no-such-bucket-{bucket.name}': check the source" in line
    line = error_line(run_fetch(f"{bucket.url}/nothing-here", dest, env=bucket.env))
    assert f"no objects under s3://{bucket.name}/{bucket.prefix}/nothing-here/: check the prefix" in line
    bucket.proxy.deny = True
    line = error_line(run_fetch(bucket.url, dest, env=bucket.env))
    assert (f"{bucket.url}: access denied (AccessDenied): the pod's AWS credentials need s3:ListBucket on "
            f"arn:aws:s3:::{bucket.name} and s3:GetObject on arn:aws:s3:::{bucket.name}/{bucket.prefix}/*") in line
    assert "IRSA or EKS Pod Identity" in line and "testing-secret-key" not in line
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_s3_unreachable(tmp_path):
    env = clean_env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", AWS_ACCESS_KEY_ID="testing",
                    AWS_SECRET_ACCESS_KEY="testing-secret-key", AWS_DEFAULT_REGION="us-east-1")
    line = error_line(run_fetch("s3://models/llama", str(tmp_path / "model"), env=env, timeout=120))
    assert "s3://models/llama: cannot reach S3 at http://127.0.0.1:" in line and "after retries" in line


def test_progress_lines_while_a_file_is_slow(bucket, tmp_path, monkeypatch, caplog):
    """A periodic line while files are in flight; in process, to see it at a short interval."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in bucket.env.items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    bucket.proxy.faults.stall("model.safetensors", 2 * MiB, seconds=1.0)
    caplog.set_level(logging.INFO, logger="neuronmodel_runtime.fetch")
    started = time.monotonic()
    fetch(bucket.url, tmp_path / "model", progress_every_s=0.2)
    took = time.monotonic() - started
    records = [r for r in caplog.records if r.getMessage().startswith("progress: ")]
    lines = [r.getMessage() for r in records]
    total = sum(map(len, bucket.files.values()))
    # at least the stall's worth of lines, and no more than one per interval (however slow a loaded machine makes it)
    assert 2 <= len(lines) <= took / 0.2 + 1, (took, lines)
    assert all(later.created - earlier.created >= 0.15 for earlier, later in zip(records, records[1:])), lines
    assert all(re.search(rf" of {total} bytes \(\d+%\), [\d.]+ MB/s, [1-{len(bucket.files)}] files in flight$", line)
               for line in lines), lines
    assert_fetched(tmp_path / "model", bucket.files, bucket.url)


# --- Hugging Face Hub ------------------------------------------------------------------------------------------------

HUB_REPO = "neuronmodel-test/tiny-llama"
#: Beside what serving needs, what it does not: a second weight format, the original checkpoint, an export.
HUB_EXTRA = {"pytorch_model.bin": b"\0" * 1000, "original/consolidated.00.pth": b"\1" * 1000,
             "onnx/model.onnx": b"\2" * 100, "README.md": b"# tiny\n"}


@pytest.fixture
def hub():
    """A local Hub serving HUB_REPO (needing TOKEN): config, tokenizer, 12 MiB of weights, and HUB_EXTRA."""
    with FakeHub(HUB_REPO, {**model_files(12 * MiB), "tokenizer_config.json": b"{}", **HUB_EXTRA},
                 token=TOKEN) as server:
        yield server


def hub_env(hub: FakeHub, tmp_path: Path, token: Optional[str] = TOKEN) -> dict[str, str]:
    env = clean_env(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"))
    return {**env, "HF_TOKEN": token} if token else env


def served(hub: FakeHub) -> dict[str, bytes]:
    return {name: data for name, data in hub.files.items() if name not in HUB_EXTRA}


def test_hf_fetch(hub, tmp_path):
    dest = tmp_path / "model"
    result = run_fetch(f"hf://{HUB_REPO}", str(dest), env=hub_env(hub, tmp_path))
    assert result.returncode == 0, result.stderr
    marker = assert_fetched(dest, served(hub), f"hf://{HUB_REPO}")
    assert (marker["revision"], marker["commit"]) == ("main", hub.commit)
    assert f"fetching hf://{HUB_REPO} (revision main) = commit {hub.commit} into {dest}: 4 files" in result.stderr
    assert "downloaded model.safetensors: 12582912 bytes in " in result.stderr
    # HF_ENDPOINT honoured, HF_TOKEN sent as a bearer token, the files serving does not need never asked for
    repo_requests = [r for r in hub.requests if HUB_REPO in r.path]
    assert repo_requests and all(r.authorization == f"Bearer {TOKEN}" for r in repo_requests)
    assert all(not hub.gets(name) for name in HUB_EXTRA)
    assert all(len(hub.gets(name)) == 1 for name in served(hub))
    assert TOKEN not in result.stderr
    assert "HTTP Request:" not in result.stderr and "Downloading" not in result.stderr  # no flood below DEBUG


def test_hf_already_fetched_makes_no_request(hub, tmp_path):
    dest = tmp_path / "model"
    assert run_fetch(f"hf://{HUB_REPO}", str(dest), env=hub_env(hub, tmp_path)).returncode == 0
    before = len(hub.requests)
    again = run_fetch(f"hf://{HUB_REPO}", str(dest), env=hub_env(hub, tmp_path))
    assert again.returncode == 0, again.stderr
    assert f"hf://{HUB_REPO} (revision main) already fetched into {dest}" in again.stderr
    assert len(hub.requests) == before
    other = run_fetch(f"hf://{HUB_REPO}", str(dest), "--revision", hub.commit, env=hub_env(hub, tmp_path))
    assert other.returncode == 0 and "already fetched" not in other.stderr  # another revision is fetched


def test_hf_fetch_into_a_full_volume(hub, tmp_path, small_volume):
    """As for S3 (test_s3_fetch_into_a_full_volume), through huggingface_hub's own downloads."""
    volume = small_volume("models", 4 * MiB)  # the weights are 12 MiB
    dest, env = volume.folder / "model", volume.env(hub_env(hub, tmp_path))
    result = subprocess.run(volume.command("fetch", f"hf://{HUB_REPO}", str(dest)), env=env, capture_output=True,
                            text=True, timeout=60)
    line = error_line(result)
    assert f"hf://{HUB_REPO} (revision main): no space left on device writing {dest}" in line, volume.mode
    assert "free space on that volume or make it larger, then run fetch again" in line and not dest.exists()
    volume.grow(32 * MiB)
    again = subprocess.run(volume.command("fetch", f"hf://{HUB_REPO}", str(dest)), env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert_fetched(dest, served(hub), f"hf://{HUB_REPO}")


def test_hf_connection_cut_midway_resumes_with_a_range(hub, tmp_path):
    """A dropped connection is resumed from the bytes already there (huggingface_hub 2.x keeps them in 10 MiB
    chunks; 0.x resumes its .incomplete file when fetch retries the file)."""
    dest = tmp_path / "model"
    hub.faults.cut("model.safetensors", 11 * MiB)
    result = run_fetch(f"hf://{HUB_REPO}", str(dest), env=hub_env(hub, tmp_path))
    assert result.returncode == 0, result.stderr
    assert_fetched(dest, served(hub), f"hf://{HUB_REPO}")
    assert [r.range for r in hub.gets("model.safetensors")] == [None, "bytes=10485760-"]
    assert result.stderr.count("Trying to resume download") <= 1  # huggingface_hub's warning, not printed twice


def test_hf_killed_fetch_keeps_finished_files(hub, tmp_path):
    dest = tmp_path / "model"
    hub.faults.stall("model.safetensors", 2 * MiB)
    proc = subprocess.Popen([str(SCRIPT), "fetch", f"hf://{HUB_REPO}", str(dest)], env=hub_env(hub, tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: hub.faults.stalled.is_set() and recorded(tmp_path) == set(served(hub)) - {"model.safetensors"},
                 "the small files done and model.safetensors half-sent")
    finally:
        kill(proc)
    assert not dest.exists()
    result = run_fetch(f"hf://{HUB_REPO}", str(dest), env=hub_env(hub, tmp_path))
    assert result.returncode == 0, result.stderr
    assert "3 files already downloaded by an earlier run" in result.stderr
    assert_fetched(dest, served(hub), f"hf://{HUB_REPO}")
    assert len(hub.gets("model.safetensors")) == 2
    assert all(len(hub.gets(name)) == 1 for name in served(hub) if name != "model.safetensors")


@pytest.mark.parametrize("token, source, revision, message", [
    (None, HUB_REPO, [], "the Hub refused the request (HTTP 401): set HF_TOKEN (the model's token secret) to a "
                         "token with access to it"),
    ("hf_wrong_token_9876543210", HUB_REPO, [], "the Hub refused the request (HTTP 401): check that the HF_TOKEN "
                                                "secret is a token with access to it"),
    (TOKEN, "neuronmodel-test/no-such-model", [], "no such repository, or it is private or gated (HTTP 404): check "
                                                  "the name, or check that the HF_TOKEN secret"),
    (TOKEN, HUB_REPO, ["--revision", "v9"], "no revision 'v9' (HTTP 404): check --revision (a branch, tag or commit)"),
], ids=["no-token", "wrong-token", "no-such-repo", "no-such-revision"])
def test_hf_errors(hub, tmp_path, token, source, revision, message):
    result = run_fetch(f"hf://{source}", str(tmp_path / "model"), *revision, env=hub_env(hub, tmp_path, token))
    line = error_line(result)
    assert line == f"neuronmodel-runtime: hf://{source}: {message}" or message in line, line
    assert line.startswith(f"neuronmodel-runtime: hf://{source}: ")
    assert TOKEN not in result.stderr and "hf_wrong_token_9876543210" not in result.stderr
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_hf_unreachable(tmp_path):
    env = clean_env(HF_ENDPOINT=f"http://127.0.0.1:{free_port()}", HF_HOME=str(tmp_path / "hf-home"))
    line = error_line(run_fetch(f"hf://{HUB_REPO}", str(tmp_path / "model"), env=env))
    assert f"hf://{HUB_REPO}: no connection to http://127.0.0.1:" in line
    assert "after retries (Connect" in line and "check the pod's network, or HF_ENDPOINT" in line


def test_model_source_is_hashable_and_plain():
    """The operator keys children by source: ModelSource is a frozen value."""
    assert {parse_source("s3://models/p/"), parse_source("s3://models/p")} == {ModelSource("s3", "models", "p")}
