"""The optional real node (`scripts/k8s/realnode.py`): kubelet + containerd + runc + CNI bridge + kube-proxy.

`real_node` (session) joins one real node to the parent conftest's `control_plane` and removes everything it made at
the end (at exit, and through its reaper if pytest is killed: all but its logs). It skips, with the reason, where
the node cannot run: not root, `make k8s-bin` not run (kubelet, kube-proxy), or the Debian packages missing
(`PYTHONPATH=scripts python -m k8s.realnode packages`). Pods meant for it select the label
`neuronmodel.dev/real-node=true` and tolerate the taint of the same name (`realnode.TOLERATION`). Its containerd may
pull from the parent conftest's `oci_registry` over plain http.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest

from k8s import realnode


@pytest.fixture(scope="session")
def real_node(control_plane, oci_registry, tmp_path_factory) -> realnode.RealNode:
    # run state outside pytest's basetemp: pytest (of any concurrent session) prunes old basetemps, even live ones
    node = realnode.RealNode(control_plane, Path(tempfile.mkdtemp(prefix="neuronmodel-node-")) / "node",
                             registries=(oci_registry.address,))
    problems = [p for p in node.preflight() if "exists" not in p]
    if problems:
        pytest.skip("REAL NODE NOT AVAILABLE: " + "; ".join(problems))
    atexit.register(node.stop, keep_logs=True)
    seconds = node.start(die_with_parent=True)
    print(f"\nreal node {node.name} Ready in {seconds:.1f} s ({node.timings}); logs in {node.data_dir / 'logs'}")
    yield node
    node.stop(remove=False)
    shutil.copytree(node.data_dir / "logs", tmp_path_factory.mktemp("real-node-logs"), dirs_exist_ok=True)
    node.stop(remove=True)
    node.data_dir.parent.rmdir()

