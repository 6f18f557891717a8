"""How `make test` spreads the suite over the machine's cores (pytest-xdist, `-n 2 --dist loadgroup`).

Each test module stays on one worker, so its module-scoped fixtures (an operator process, a Ready model) start
once; each worker has its own session fixtures (a control plane on free ports, its own data dirs). What exists once
per machine runs on one worker: the real node (its kubelet, containerd, CNI bridge and iptables rules), the tests
that build images (buildah's storage; `images.tools.machine_lock` serialises builds across processes too) and those
of the OCI registry whose storage is the machine's cache (a second session gets an empty one, and pushes again).
"""

from __future__ import annotations

import pytest

#: Test paths (prefixes of node ids) whose tests share one worker: they use what the machine has once.
MACHINE_WIDE = ("tests/integration/realnode/", "tests/integration/test_image_build.py",
                "tests/integration/test_chart_oci.py")
MACHINE_GROUP = "machine"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(MACHINE_GROUP if path.startswith(MACHINE_WIDE) else path))
