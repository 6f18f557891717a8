"""The real node end to end: identity, a hardened pod with volumes and a probe, a Service, logs, exec, cleanup.

The last test stops the node and asserts that nothing of it remains, so it runs last in this module.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from kubernetes import client as kube
from kubernetes import config as kube_config

from k8s import realnode

pytestmark = pytest.mark.slow
WEB_PAGE = "hello from the real node\n"


def on_real_node(spec: dict) -> dict:
    """A pod spec that lands on the real node only: its label selected, its taint tolerated."""
    return spec | {"nodeSelector": {"neuronmodel.dev/real-node": "true"}, "tolerations": [realnode.TOLERATION]}


def hardened(image: str, command: list[str], **extra) -> dict:
    return {"name": "main", "image": image, "command": command,
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}}} | extra


POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.fixture(scope="module")
def web(real_node, control_plane, admin_client, wait_until):
    """A Ready web pod (ConfigMap page, memory emptyDir, env from a Secret), its Service, and a client pod."""
    core = kube.CoreV1Api(admin_client)
    ns = "real-node"
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "page"}, "data": {"index.html": WEB_PAGE}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "web-secret"}, "stringData": {"token": "s3cret"}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "unused-secret"}, "stringData": {"token": "no"}})
    image = real_node.images["busybox"]
    t0 = time.monotonic()
    core.create_namespaced_pod(ns, {"metadata": {"name": "web", "labels": {"app": "web"}}, "spec": on_real_node({
        "securityContext": POD_SECURITY, "automountServiceAccountToken": False,
        "containers": [hardened(
            image, ["sh", "-c", "echo web starting as $(id -u); exec httpd -f -v -p 8080 -h /www"],
            ports=[{"containerPort": 8080}],
            env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "web-secret", "key": "token"}}}],
            readinessProbe={"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1},
            volumeMounts=[{"name": "page", "mountPath": "/www"}, {"name": "scratch", "mountPath": "/tmp"}])],
        "volumes": [{"name": "page", "configMap": {"name": "page"}},
                    {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]})})
    core.create_namespaced_service(ns, {"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    core.create_namespaced_pod(ns, {"metadata": {"name": "client"}, "spec": on_real_node({
        "securityContext": POD_SECURITY, "automountServiceAccountToken": False,
        "containers": [hardened(image, ["sleep", "3600"])]})})

    def ready(name):
        pod = core.read_namespaced_pod(name, ns)
        return pod if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []) else None

    try:
        pod = wait_until("web pod Ready", lambda: ready("web"), timeout=120)
    except TimeoutError:
        events = control_plane.kubectl("get", "events", "-n", ns, "-o", "wide").stdout
        raise AssertionError(f"web pod not Ready: {core.read_namespaced_pod('web', ns).status}\n{events}") from None
    real_node.timings["web pod Ready"] = time.monotonic() - t0
    print(f"\nweb pod Ready in {real_node.timings['web pod Ready']:.1f} s")
    wait_until("client pod Ready", lambda: ready("client"), timeout=120)
    return {"ns": ns, "pod": pod, "service": core.read_namespaced_service("web", ns)}


def node_client(real_node) -> kube.ApiClient:
    return kube_config.new_client_from_config(config_file=str(real_node.kubeconfig))


def test_node_registers_ready_as_its_own_identity(real_node, control_plane, admin_client):
    node = kube.CoreV1Api(admin_client).read_node(real_node.name)
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "m5.xlarge"
    assert "type" not in node.metadata.labels  # kwok manages type=kwok nodes only
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [(realnode.TAINT["key"], "true", "NoSchedule")]
    assert node.status.node_info.kubelet_version == "v1.34.4"
    assert {a.type: a.address for a in node.status.addresses}["InternalIP"] == real_node.node_ip
    assert {f.manager for f in node.metadata.managed_fields} >= {"kubelet"}
    whoami = json.loads(control_plane.kubectl("auth", "whoami", f"--kubeconfig={real_node.kubeconfig}",
                                              "-o", "json").stdout)["status"]["userInfo"]
    assert whoami["username"] == f"system:node:{real_node.name}"
    assert "system:nodes" in whoami["groups"] and "system:masters" not in whoami["groups"]


def test_node_authorizer_limits_the_kubelet_to_its_own_pods(real_node, web):
    as_node = kube.CoreV1Api(node_client(real_node))
    assert as_node.read_namespaced_secret("web-secret", web["ns"]).data["token"]  # its pod's Secret: allowed
    with pytest.raises(kube.exceptions.ApiException) as denied:
        as_node.read_namespaced_secret("unused-secret", web["ns"])  # no pod of this node uses it
    assert denied.value.status == 403
    with pytest.raises(kube.exceptions.ApiException) as listing:
        as_node.list_namespaced_secret(web["ns"])
    assert listing.value.status == 403
    with pytest.raises(kube.exceptions.ApiException) as other_node:  # NodeRestriction: only its own Node object
        as_node.patch_node("kwok-m5-xlarge", {"metadata": {"labels": {"stolen": "yes"}}})
    assert other_node.value.status == 403


def test_hardened_pod_serves_on_its_pod_ip(real_node, web, control_plane):
    pod = web["pod"]
    assert pod.spec.node_name == real_node.name and pod.status.phase == "Running"
    assert pod.status.pod_ip.startswith("10.244.0.")
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8080/index.html", timeout=10) as resp:
        assert resp.read().decode() == WEB_PAGE
    mounts = control_plane.kubectl("exec", "-n", web["ns"], "web", "--", "cat", "/proc/mounts").stdout
    assert any(line.split()[1] == "/tmp" and line.split()[2] == "tmpfs" for line in mounts.splitlines())
    status = control_plane.kubectl("exec", "-n", web["ns"], "web", "--", "cat", "/proc/self/status").stdout
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split()[0] == "65534" and fields["CapEff"].strip() == "0000000000000000"
    assert fields["Seccomp"].strip() == "2" and fields["NoNewPrivs"].strip() == "1"


def test_service_cluster_ip_answers_from_another_pod_and_the_host(web, control_plane):
    cluster_ip = web["service"].spec.cluster_ip
    out = control_plane.kubectl("exec", "-n", web["ns"], "client", "--", "wget", "-q", "-O", "-",
                                f"http://{cluster_ip}/index.html").stdout
    assert out == WEB_PAGE
    with urllib.request.urlopen(f"http://{cluster_ip}/index.html", timeout=10) as resp:
        assert resp.read().decode() == WEB_PAGE


def test_pods_reach_nothing_beyond_the_node(web, control_plane):
    routes = control_plane.kubectl("exec", "-n", web["ns"], "client", "--", "cat", "/proc/net/route").stdout
    destinations = [line.split()[1] for line in routes.splitlines()[1:]]
    assert "00000000" not in destinations  # no default route
    probe = control_plane.kubectl("exec", "-n", web["ns"], "client", "--", "wget", "-q", "-O", "-",
                                  "http://192.0.2.1/", check=False)
    assert probe.returncode != 0 and "unreachable" in probe.stderr.lower()


def test_a_pod_that_adds_a_route_out_still_reaches_nothing(real_node, web, admin_client, wait_until, control_plane):
    """NET_ADMIN lets a pod add a default route; the node's egress chain rejects what it then sends off the bridge."""
    core, ns = kube.CoreV1Api(admin_client), web["ns"]
    core.create_namespaced_pod(ns, {"metadata": {"name": "escaper"}, "spec": on_real_node({
        "automountServiceAccountToken": False, "containers": [{
            "name": "main", "image": real_node.images["busybox"], "command": ["sleep", "3600"],
            "securityContext": {"runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}]})})
    wait_until("escaper Running", lambda: core.read_namespaced_pod("escaper", ns).status.phase == "Running", 120)
    run = ["exec", "-n", ns, "escaper", "--"]
    control_plane.kubectl(*run, "ip", "route", "add", "default", "via", real_node.gateway)
    probe = control_plane.kubectl(*run, "timeout", "-s", "KILL", "10", "wget", "-q", "-O", "-",
                                  "http://203.0.113.1/", check=False)
    assert probe.returncode != 0 and "unreachable" in probe.stderr.lower(), probe.stderr


def test_pulls_from_a_plain_http_registry(real_node, oci_registry, web, admin_client, wait_until):
    """hosts.toml under containerd's config_path: a pod's image comes from the local registry over plain HTTP."""
    core, ns = kube.CoreV1Api(admin_client), web["ns"]
    ref = f"{oci_registry.address}/neuronmodel/busybox:pulled"
    real_node.ctr("images", "tag", real_node.images["busybox"], ref)
    real_node.ctr("images", "push", "--plain-http", ref)
    real_node.ctr("images", "rm", ref)
    assert oci_registry.tags("neuronmodel/busybox") == ["pulled"]
    core.create_namespaced_pod(ns, {"metadata": {"name": "pulled"}, "spec": on_real_node({
        "securityContext": POD_SECURITY, "automountServiceAccountToken": False,
        "containers": [hardened(ref, ["sleep", "3600"], imagePullPolicy="Always")]})})

    def running():
        status = core.read_namespaced_pod("pulled", ns).status
        return status.phase == "Running" and status.container_statuses[0].image_id

    image_id = wait_until("pulled pod Running", running, 120)
    assert image_id.startswith(f"{oci_registry.address}/neuronmodel/busybox@sha256:")


def test_kubectl_logs_and_exec(web, control_plane):
    logs = control_plane.kubectl("logs", "-n", web["ns"], "web").stdout
    assert "web starting as 65534" in logs
    assert control_plane.kubectl("exec", "-n", web["ns"], "web", "--", "sh", "-c", "echo $TOKEN").stdout == "s3cret\n"


def test_stop_leaves_nothing_behind(real_node, web):
    """Runs last: stops the session's node."""
    before = real_node.leftovers()
    for kind in ("processes", "mounts", "cgroups", "links", "iptables chains", "netns"):
        assert before[kind], f"no {kind} while the node runs: the check below would prove nothing"
    real_node.stop(remove=False)
    assert real_node.leftovers() == {kind: [] for kind in before}
