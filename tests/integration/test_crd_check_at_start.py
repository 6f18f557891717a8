"""The operator refuses to start on an older NeuronModel CRD (crd_check.py), on the real control plane, as its own
ServiceAccount: the installed CRD's revision annotation is set back (or removed, as operator 0.1.0's CRD has none),
`neuronmodel-operator` exits within seconds saying how to apply the new CRD, and the CRD is restored for the other
tests. That it starts on the current CRD is what the session `operator` fixture shows.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuronmodel_operator import api, crd_check

pytestmark = pytest.mark.slow

OPERATOR = Path(sys.executable).parent / "neuronmodel-operator"


@pytest.fixture
def crd_restored(neuronmodel_crd, install_crds):
    """The CRD as generated again after the test, whatever the test did to it (other tests share the cluster)."""
    yield
    install_crds(neuronmodel_crd)


@pytest.mark.parametrize(("annotation", "found"), [
    (f"{crd_check.ANNOTATION_REVISION}={api.CRD_REVISION - 1}", f"revision {api.CRD_REVISION - 1}"),
    (f"{crd_check.ANNOTATION_REVISION}-", f"no {crd_check.ANNOTATION_REVISION} annotation"),
], ids=["older", "unannotated"])
def test_an_older_crd_stops_the_operator_at_start(control_plane, operator_rbac, crd_restored, annotation, found):
    control_plane.kubectl("annotate", "--overwrite", "crd", api.CRD_NAME, annotation)
    started = time.monotonic()
    try:
        ran = subprocess.run([str(OPERATOR), "--kubeconfig", str(operator_rbac.kubeconfig), "--liveness", "",
                              "--metrics-port", "0"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"neuronmodel-operator kept running on a CRD with {found}")
    seconds = time.monotonic() - started
    last = ran.stderr.strip().splitlines()[-1] if ran.stderr.strip() else ""
    assert ran.returncode == 2, (ran.returncode, ran.stderr[-2000:])
    assert last.startswith(f"neuronmodel-operator: the installed CustomResourceDefinition {api.CRD_NAME} is older "
                           f"than this operator ({found}, needs revision {api.CRD_REVISION})"), ran.stderr[-2000:]
    assert f"kubectl apply --server-side --force-conflicts -f crds/{api.CRD_NAME}.yaml" in last
    assert seconds < 20, f"it took {seconds:.1f} s to refuse"
