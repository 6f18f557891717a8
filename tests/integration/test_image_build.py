"""The operator, runtime-cpu and runtime-vllm-cpu images built here (scripts/images/), then run without a kubelet.

Each image is built (or found cached: the first cold run takes minutes, most of it runtime-cpu's 5 GB torch layer)
and then run as containerd would: runc on a bundle whose root is the image's root filesystem (read-only, as the
pods' readOnlyRootFilesystem), with the image config's user, entrypoint, working directory and environment, the
emptyDirs of the operator's pods as tmpfs, and a network namespace of its own with only `lo` up. The runtime image
serves the tiny test model (mounted read-only) and answers a completion on its port inside that namespace.
The image configs are checked against the Dockerfile (user, entrypoint, cmd, ports, labels, environment), the
operator image has no torch, and no wheel of the wheelhouse is in any image. runtime-vllm-cpu (vLLM's CPU build, the
engine vllm pods' image without Neuron) runs the pods' args through its entrypoint as 1000 on a read-only root, with
no code of ours; serving the tiny model from the operator's vLLM pods, its compile cache handed through the store,
is the real node's part (realnode/test_end_to_end.py, step 6). Root only (buildah, runc, netns).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from images import build, tools, wheelhouse  # noqa: E402

from test_images import BY_NAME, env as stage_env, exec_form, labels as stage_labels  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="buildah, runc and network namespaces need root")]

TINY = ROOT / "tests" / "assets" / "tiny" / "target"
#: What the operator's pods mount writable (builders/pod.py): emptyDirs, here tmpfs.
POD_WRITABLE = ["/tmp", "/var/cache/neuronmodel", "/var/tmp"]
#: Labels an image gets besides its Dockerfile's: ours, the base's (inherited) and buildah's.
EXTRA_LABELS = {build.LABEL_INPUTS, "dev.neuronmodel.base.inputs", "dev.neuronmodel.base.source",
                "io.buildah.version"}


class Built(dict):
    """target -> build.ensure(target), built (or found cached) on first use: a test of one image waits for no other."""

    def __missing__(self, target: str) -> dict:
        self[target] = build.ensure(target)
        return self[target]


@pytest.fixture(scope="module")
def built():
    tools.ensure()
    return Built()


# --- a container without a kubelet: runc on the mounted image -------------------------------------------------

@contextmanager
def netns():
    """A network namespace of our own with `lo` up (what CNI's loopback plugin does for a pod)."""
    name = f"nm-img-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


class Container:
    """One runc container of a built image, as containerd would start it from the image config."""

    def __init__(self, target: str, tmp: Path, netns_name: str, args: list[str] | None = None,
                 readonly: bool = True, env: dict[str, str] | None = None, binds: dict[str, Path] | None = None,
                 pod_args: list[str] | None = None):
        """`args`: the process's whole argv (the image's entrypoint bypassed); `pod_args`: a pod's container args,
        after the image's ENTRYPOINT (replacing its CMD), as the kubelet runs them; `binds`: read-only bind mounts."""
        self.id = f"nm-img-{uuid.uuid4().hex[:10]}"
        self.bundle = tmp / self.id
        self.bundle.mkdir()
        self.target = target
        self.netns = netns_name
        cfg = build.config(target)
        self.working = tools.buildah("from", *tools.signature_policy(), "--pull=never", "--name", self.id,
                                     build.local_ref(target)).stdout.strip()
        self.rootfs = rootfs = Path(tools.buildah("mount", self.working).stdout.strip())
        uid, _, gid = (cfg.get("User") or "0").partition(":")
        process_env = dict(e.split("=", 1) for e in cfg.get("Env") or [])
        process_env.update(env or {})
        mounts = [{"destination": "/proc", "type": "proc", "source": "proc"},
                  {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
                  {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
                  {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "nodev"]},
                  {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "ro"]}]
        mounts += [{"destination": path, "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "nodev", "mode=1777"]} for path in POD_WRITABLE]
        mounts += [{"destination": dest, "type": "bind", "source": str(src), "options": ["rbind", "ro"]}
                   for dest, src in (binds or {}).items()]
        if args is None:
            args = (cfg.get("Entrypoint") or []) + (pod_args if pod_args is not None else cfg.get("Cmd") or [])
        spec = {
            "ociVersion": "1.0.2",
            "process": {"terminal": False, "user": {"uid": int(uid), "gid": int(gid or uid)},
                        "args": args,
                        "env": [f"{k}={v}" for k, v in process_env.items()],
                        "cwd": cfg.get("WorkingDir") or "/",
                        "noNewPrivileges": True, "capabilities": {}},  # drop ALL, as the pods do
            "root": {"path": str(rootfs), "readonly": readonly},
            "hostname": self.id,
            "mounts": mounts,
            "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                                     {"type": "network", "path": f"/var/run/netns/{netns_name}"}],
                      "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list"],
                      "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"]},
        }
        (self.bundle / "config.json").write_text(json.dumps(spec))
        self.runc = str(tools.cache_dir() / "runc")
        self.process: subprocess.Popen | None = None
        self.log = self.bundle / "out.log"

    def run(self, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run to completion (the entrypoint or `args`)."""
        return subprocess.run([self.runc, "run", "--bundle", str(self.bundle), self.id], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def start(self) -> None:
        """Run in the background, output into `log`."""
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([self.runc, "run", "--bundle", str(self.bundle), self.id],
                                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def remove(self) -> None:
        if self.process is not None and self.process.poll() is None:
            subprocess.run([self.runc, "kill", self.id, "TERM"], check=False, capture_output=True)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                subprocess.run([self.runc, "kill", self.id, "KILL"], check=False, capture_output=True)
                self.process.wait(timeout=30)
        subprocess.run([self.runc, "delete", "--force", self.id], check=False, capture_output=True)
        tools.buildah("umount", self.working, check=False)
        tools.buildah("rm", self.working, check=False)


@pytest.fixture
def container(tmp_path):
    made = []

    @contextmanager
    def make(target: str, **kwargs):
        with netns() as name:
            c = Container(target, tmp_path, name, **kwargs)
            made.append(c)
            try:
                yield c
            finally:
                c.remove()

    yield make


def in_netns(name: str, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The host's Python in the container's network namespace (a client beside the pod)."""
    return subprocess.run(["ip", "netns", "exec", name, sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


# --- the image configs are the Dockerfile's ---------------------------------------------------------------------

def expected_labels(stage_name: str) -> dict[str, str]:
    values = {"${VERSION}": build.version(), "${REVISION}": "unknown"}
    return {key: values.get(value, value) for key, value in stage_labels(BY_NAME[stage_name]).items()}


@pytest.mark.parametrize("target", build.TARGETS)
def test_the_image_config_is_the_dockerfiles(built, target):
    built[target]
    stage = BY_NAME[target]
    cfg = build.config(target)
    assert cfg.get("User") == stage.last("USER").args
    assert cfg.get("Entrypoint") == exec_form(stage.last("ENTRYPOINT"))
    assert cfg.get("Cmd") == (exec_form(stage.last("CMD")) if stage.last("CMD") else None)
    assert cfg.get("WorkingDir", "") == (stage.last("WORKDIR").args if stage.last("WORKDIR") else "")
    assert set(cfg.get("ExposedPorts") or {}) == {f"{p}/tcp" for p in stage.last("EXPOSE").args.split()}
    got = cfg.get("Labels") or {}
    want = expected_labels(target)
    assert {k: got.get(k) for k in want} == want
    assert set(got) - set(want) <= EXTRA_LABELS, sorted(set(got) - set(want))
    assert got[build.LABEL_INPUTS] == built[target]["inputs"]
    environment = dict(e.split("=", 1) for e in cfg.get("Env") or [])
    assert {k: environment.get(k) for k in stage_env(stage)} == stage_env(stage)
    assert not {"PIP_NO_INDEX", "PIP_FIND_LINKS"} & set(environment), "build args never reach the image"


# --- the images run -----------------------------------------------------------------------------------------------

PROBE = """
import importlib.util, json, os, sys
found = {m: importlib.util.find_spec(m) is not None for m in ("torch", "kopf", "kubernetes", "fastapi", "vllm",
                                                              "neuronmodel_operator", "neuronmodel_runtime")}
try:
    open("/usr/probe", "w")
    wrote = True
except OSError:
    wrote = False
print(json.dumps({"found": found, "uid": os.getuid(), "gid": os.getgid(), "wrote_usr": wrote,
                  "python": sys.version.split()[0]}))
"""


def probe(container, target: str, through_entrypoint: bool = False) -> dict:
    """What the image holds, seen from inside (as its user, read-only root) and, for files the pods' emptyDirs
    would hide (/tmp), from the host in its mounted root filesystem: every wheel file left in it."""
    where = {"pod_args": ["python", "-c", PROBE]} if through_entrypoint else {"args": ["python", "-c", PROBE]}
    with container(target, **where) as c:
        out = c.run()
        wheels = sorted(str(p.relative_to(c.rootfs)) for p in c.rootfs.rglob("*.whl"))
        # buildah leaves the bind mount's mount point, an empty folder, in the layers of the RUN steps
        mount_point = c.rootfs / wheelhouse.MOUNT.lstrip("/")
        wheelhouse_left = sorted(p.name for p in mount_point.iterdir()) if mount_point.exists() else []
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"wheels": wheels, "wheelhouse": wheelhouse_left}


def test_the_operator_image_runs_its_entrypoint_as_65532_on_a_read_only_root_and_has_no_torch(built, container):
    built["operator"]
    with container("operator", args=build.config("operator")["Entrypoint"] + ["--help"]) as c:  # the image's own
        out = c.run()
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower() and "neuronmodel-operator" in out.stdout
    found = probe(container, "operator")
    assert (found["uid"], found["gid"]) == (65532, 65532)
    assert found["wrote_usr"] is False, "the root filesystem is read-only"
    assert found["found"]["kopf"] and found["found"]["kubernetes"] and found["found"]["neuronmodel_operator"]
    assert not found["found"]["torch"] and not found["found"]["fastapi"], found["found"]
    assert found["wheels"] == [] and found["wheelhouse"] == [], "nothing of the wheelhouse is in the image"
    assert found["python"].startswith(wheelhouse.PYTHON_VERSION + ".")


def test_the_runtime_image_serves_the_tiny_model_on_a_read_only_root_as_1000(built, container):
    built["runtime-cpu"]
    found = probe(container, "runtime-cpu")
    assert (found["uid"], found["gid"]) == (1000, 1000)
    assert found["wrote_usr"] is False
    assert found["found"]["torch"] and found["found"]["fastapi"] and found["found"]["neuronmodel_runtime"]
    assert found["wheels"] == [] and found["wheelhouse"] == []

    with container("runtime-cpu", args=["neuronmodel-runtime", "--help"]) as c:
        out = c.run()
    assert out.returncode == 0 and "serve" in out.stdout, out.stderr

    port = 8000
    # The image's own ENTRYPOINT and CMD (`neuronmodel-runtime serve`); the rest as the operator's pods set it.
    env = {"HOME": "/tmp", "NEURONMODEL_MODEL": "/models/tiny", "NEURONMODEL_FRAMEWORK": "torch",
           "NEURONMODEL_MAX_NUM_SEQS": "2", "NEURONMODEL_MAX_MODEL_LEN": "128", "NEURONMODEL_MAX_CONTEXT_LENGTH": "64"}
    with container("runtime-cpu", env=env, binds={"/models/tiny": TINY}) as c:
        c.start()
        ready = f"""
import time, urllib.request
deadline = time.monotonic() + 240
while True:
    try:
        with urllib.request.urlopen("http://127.0.0.1:{port}/ready", timeout=5) as r:
            print(r.status); break
    except Exception as err:
        if time.monotonic() > deadline: print("never ready:", err); break
        time.sleep(0.5)
"""
        name = c.netns
        out = in_netns(name, ready, timeout=300)
        assert out.stdout.strip() == "200", out.stdout + out.stderr + c.output()[-3000:]
        ask = f"""
import json, urllib.request
with urllib.request.urlopen("http://127.0.0.1:{port}/v1/models", timeout=10) as r:
    model = json.loads(r.read())["data"][0]["id"]
body = json.dumps({{"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}}).encode()
req = urllib.request.Request("http://127.0.0.1:{port}/v1/completions", data=body,
                             headers={{"Content-Type": "application/json"}})
with urllib.request.urlopen(req, timeout=60) as r:
    print(json.dumps({{"status": r.status, "body": json.loads(r.read())}}))
"""
        out = in_netns(name, ask, timeout=120)
        assert out.returncode == 0, out.stderr + c.output()[-3000:]
        answer = json.loads(out.stdout.strip().splitlines()[-1])
        assert answer["status"] == 200
        assert answer["body"]["choices"][0]["finish_reason"] in ("length", "stop")
        assert answer["body"]["usage"]["completion_tokens"] >= 1
        info = in_netns(name, f"import urllib.request; print(urllib.request.urlopen("
                              f"'http://127.0.0.1:{port}/v1/info', timeout=10).read().decode())")
        assert '"torch"' in info.stdout, info.stdout


def test_the_runtime_image_compiles_the_tiny_model_and_a_second_run_is_a_cache_hit(built, container, tmp_path):
    """What the operator's compile Job runs with a compile cache (RuntimeConfig compile: true): torch.compile's C++
    kernels need the image's g++; the second run in the same container finds the entry the first one stored."""
    built["runtime-cpu"]
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "config.json").write_text(json.dumps({
        "model": "/models/tiny", "framework": "torch", "compile": True, "max_num_seqs": 1, "max_model_len": 128,
        "max_context_length": 64, "compile_cache": {"url": "/tmp/store", "policy": "IfNotCached"}}))
    compile_twice = "neuronmodel-runtime compile --config /etc/neuronmodel/config.json && " \
                    "rm -rf /tmp/local/compiled && " \
                    "neuronmodel-runtime compile --config /etc/neuronmodel/config.json"
    env = {"HOME": "/tmp", "NEURONMODEL_CACHE": "/tmp/local"}  # /tmp: the container's writable tmpfs
    with container("runtime-cpu", args=["sh", "-c", compile_twice], env=env,
                   binds={"/models/tiny": TINY, "/etc/neuronmodel": etc}) as c:
        out = c.run(timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    first, second = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert (first["compiled"], first["source"]) == (True, "compiled"), first
    assert (second["hit"], second["compiled"], second["source"]) == (True, False, "store"), second
    assert second["key"] == first["key"]


# --- runtime-vllm-cpu: vLLM's CPU build, run as the engine vllm pods run AWS's vLLM Neuron image ------------------

VLLM_CPU = "runtime-vllm-cpu"


def test_the_vllm_cpu_image_runs_its_args_as_1000_on_a_read_only_root_with_no_code_of_ours(built, container):
    built[VLLM_CPU]
    found = probe(container, VLLM_CPU, through_entrypoint=True)  # the image's entrypoint runs the pod's args
    assert (found["uid"], found["gid"]) == (1000, 1000)
    assert found["wrote_usr"] is False, "the root filesystem is read-only"
    assert found["found"]["vllm"] and found["found"]["torch"], found["found"]
    assert not found["found"]["neuronmodel_runtime"] and not found["found"]["neuronmodel_operator"], found["found"]
    assert found["wheels"] == [] and found["wheelhouse"] == [], "nothing of the wheelhouse is in the image"
    with container(VLLM_CPU, pod_args=["vllm", "--version"], env={"HOME": "/tmp"}) as c:
        out = c.run()
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "0.32.0+cpu", out.stdout + out.stderr
    # the DLC's entrypoint, as it behaves there: check_call raises on the command's failure (Python exits 1 with the
    # CalledProcessError naming the command's own status), and with no args there is no command to run
    with container(VLLM_CPU, pod_args=["sh", "-c", "exit 3"]) as c:
        out = c.run()
    assert out.returncode == 1 and "returned non-zero exit status 3" in out.stderr, out.stderr
    with container(VLLM_CPU, pod_args=None) as c:
        out = c.run()
    assert out.returncode == 1 and "IndexError" in out.stderr, out.stderr


# --- cached, and what changes the cache key ---------------------------------------------------------------------

@pytest.mark.parametrize("target", build.TARGETS)
def test_a_second_build_is_a_cache_hit_of_the_same_image(built, target):
    again = build.ensure(target)
    assert again["cached"] is True and again["id"] == built[target]["id"]
    assert again["inputs"] == built[target]["inputs"]
    assert again["steps"]["wheelhouse"]["cached"] and again["steps"]["base"]["cached"]


def test_the_inputs_digest_follows_sources_wheelhouse_and_base(tmp_path, monkeypatch):
    wheels = {"digest": "w1", "path": "/x"}
    one = build.inputs_digest("operator", wheels, "base1")
    assert one == build.inputs_digest("operator", wheels, "base1")
    assert one != build.inputs_digest("runtime-cpu", wheels, "base1")
    assert one != build.inputs_digest("operator", {**wheels, "digest": "w2"}, "base1")
    assert one != build.inputs_digest("operator", wheels, "base2")
    files = build.source_files()
    assert ROOT / "Dockerfile" in files and ROOT / "docker" / "install-runtime.sh" in files
    assert not [f for f in files if "__pycache__" in f.parts]
    # A copy of the build context: an edit of a source changes the digest, a byte-compiled file does not.
    copy = tmp_path / "tree"
    copy.mkdir()
    for name in build.SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, copy / name)
    monkeypatch.setattr(build, "ROOT", copy)
    assert build.inputs_digest("operator", wheels, "base1") == one
    cache = copy / "runtime" / "neuronmodel_runtime" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "new.cpython-311.pyc").write_bytes(b"x")
    assert build.inputs_digest("operator", wheels, "base1") == one
    with open(copy / "runtime" / "neuronmodel_runtime" / "cli.py", "a") as f:
        f.write("\n")
    assert build.inputs_digest("operator", wheels, "base1") != one


def test_the_vllm_cpu_inputs_digest_reads_none_of_our_code(tmp_path, monkeypatch):
    """runtime-vllm-cpu holds no code of ours: an edit of the runtime or the operator rebuilds none of its 6 GB; its
    entrypoint, the Dockerfile and the resolved list (the sha256 the build passes) do."""
    wheels = {"digest": "w1", "path": "/x", "requirements_sha256": "r1"}
    one = build.inputs_digest(VLLM_CPU, wheels, "base1")
    assert one == build.inputs_digest(VLLM_CPU, wheels, "base1")
    assert one != build.inputs_digest(VLLM_CPU, {**wheels, "requirements_sha256": "r2"}, "base1")
    assert one != build.inputs_digest(VLLM_CPU, {**wheels, "digest": "w2"}, "base1")
    assert build.build_args(VLLM_CPU, wheels)["VLLM_CPU_REQUIREMENTS_SHA256"] == "r1"
    copy = tmp_path / "tree"
    copy.mkdir()
    for name in build.SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, copy / name)
    monkeypatch.setattr(build, "ROOT", copy)
    assert build.inputs_digest(VLLM_CPU, wheels, "base1") == one
    runtime_cpu = build.inputs_digest("runtime-cpu", wheels, "base1")
    for source in ("runtime/neuronmodel_runtime/cli.py", "operator/neuronmodel_operator/images.py", "pyproject.toml"):
        with open(copy / source, "a") as f:
            f.write("\n")
    assert build.inputs_digest(VLLM_CPU, wheels, "base1") == one
    assert build.inputs_digest("runtime-cpu", wheels, "base1") != runtime_cpu
    with open(copy / "docker" / "vllm_entrypoint.py", "a") as f:
        f.write("\n")
    assert build.inputs_digest(VLLM_CPU, wheels, "base1") != one


# --- out of the storage: an OCI registry (plain http) and an OCI archive ----------------------------------------

def test_the_operator_image_goes_to_the_local_registry_and_into_an_oci_archive(built, tmp_path):
    from k8s import install, registry

    if "registry" in install.missing():
        pytest.skip("the OCI registry is not installed: make k8s-bin")
    with registry.Registry(tmp_path / "registry") as reg:
        ref = build.push("operator", reg.address)
        assert ref == f"{reg.address}/neuronmodel/neuronmodel-operator:{build.version()}"
        assert reg.tags("neuronmodel/neuronmodel-operator") == [build.version()]
        pulled = tools.buildah("pull", *tools.signature_policy(), "--tls-verify=false", f"docker://{ref}")
        assert pulled.stdout.strip().splitlines()[-1] == built["operator"]["id"], "the same image comes back"
        tools.buildah("rmi", ref, check=False)
    archive = build.export_oci_archive("operator", tmp_path / "operator.oci.tar", name=ref)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        index = json.load(tar.extractfile("index.json"))
    assert {"index.json", "oci-layout"} <= names
    (manifest,) = index["manifests"]
    assert manifest["annotations"]["org.opencontainers.image.ref.name"] == ref
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"


def test_sizes_are_reported(built):
    for target in build.TARGETS:
        built[target]
    sizes = build.sizes()
    assert sizes["storage"] > 0
    assert {name.rsplit("-", 1)[0] for name in sizes if name.startswith("wheelhouse-")} == {
        f"wheelhouse-{target}" for target in build.TARGETS}
