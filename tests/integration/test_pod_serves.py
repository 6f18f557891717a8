"""The pod the operator builds actually serves: spec, ConfigMap and runtime agree.

No kubelet runs containers here (kwok only pretends), so this test plays the kubelet's part for the runtime
container of the tiny-model sample: it takes the pod template as stored on the API server, materialises its
volumes (the ConfigMap's files, emptyDirs, hostPaths at their own path) and its env, runs the container's command
with this checkout's runtime, waits on the probe paths and the port the template declares, and asks for a chat
completion.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client as kube

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "assets" / "tiny" / "target"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _materialise(template: dict, core: kube.CoreV1Api, namespace: str, root: Path) -> dict[str, Path]:
    """mountPath -> local folder, for every volume the runtime container mounts."""
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "runtime"]
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    mounts = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            local = root / mount["name"]
            local.mkdir()
            data = core.read_namespaced_config_map(volume["configMap"]["name"], namespace).data
            for key, text in data.items():
                (local / key).write_text(text)
        elif "emptyDir" in volume:
            local = root / mount["name"]
            local.mkdir()
        elif "hostPath" in volume:
            assert volume["hostPath"]["path"] == mount["mountPath"], "hostPaths are mounted at their own path"
            local = Path(mount["mountPath"])
        else:
            raise AssertionError(f"the tiny sample mounts only ConfigMaps, emptyDirs and hostPaths, not {volume}")
        mounts[mount["mountPath"]] = local
    return mounts


def _local(value: str, mounts: dict[str, Path]) -> str:
    for mount_path, local in sorted(mounts.items(), key=lambda item: -len(item[0])):
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(local) + value[len(mount_path):]
    return value


def _env(container: dict, mounts: dict[str, Path]) -> dict[str, str]:
    env = {}
    for var in container.get("env", []):
        assert "value" in var, f"the tiny sample's env is plain values, not {var}"
        env[var["name"]] = _local(var["value"], mounts)
    return env


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except OSError:
        return 0


def test_the_operators_pod_template_serves_a_chat_completion(api, tmp_path):
    body = yaml.safe_load((ROOT / "crds" / "samples" / "tiny-torch.yaml").read_text())
    body["spec"]["model"]["source"] = str(TINY)
    port = _free_port()
    body["spec"].setdefault("server", {})["port"] = port
    api.apply(body)
    name = body["metadata"]["name"]
    api.phase(name, "Ready")  # every child applied (kwok reports the pod Ready; no container ran)
    deployment = api.deployment(name)
    template = api.apps.api_client.sanitize_for_serialization(deployment.spec.template)
    assert not template["spec"].get("initContainers"), "a path source is mounted, never fetched"
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "runtime"]
    mounts = _materialise(template, api.core, api.ns, tmp_path)
    command = [_local(arg, mounts) for arg in container["command"] + container.get("args", [])]
    assert command[0] == "neuronmodel-runtime"
    command[0] = str(Path(sys.executable).parent / "neuronmodel-runtime")  # this checkout's runtime
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {"PATH": os.environ["PATH"], **_env(container, mounts)}

    log = tmp_path / "runtime.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def probe_url(probe: dict) -> str:
            http = probe["httpGet"]
            target = http["port"] if isinstance(http["port"], int) else ports[http["port"]]
            return f"http://127.0.0.1:{target}{http['path']}"

        startup = probe_url(container["startupProbe"])
        budget = container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"]
        deadline = time.monotonic() + min(budget, 120)
        while _get(startup) != 200:
            assert process.poll() is None, f"the runtime exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"startup probe never passed:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        assert _get(probe_url(container["readinessProbe"])) == 200
        assert _get(probe_url(container["livenessProbe"])) == 200

        config = json.loads((mounts["/etc/neuronmodel"] / "config.json").read_text())
        request = urllib.request.Request(
            f"http://127.0.0.1:{ports['http']}/v1/chat/completions", method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"model": config["server"]["served_model_name"], "max_tokens": 8, "temperature": 0,
                             "messages": [{"role": "user", "content": "Hello"}]}).encode())
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.loads(response.read())
        assert reply["object"] == "chat.completion"
        assert reply["model"] == config["server"]["served_model_name"]
        assert reply["usage"]["completion_tokens"] >= 1
        assert isinstance(reply["choices"][0]["message"]["content"], str)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
