"""A real, local Kubernetes control plane for tests: build it once (`install`), run it (`cluster`).

`python -m k8s.install` (with `scripts/` on `PYTHONPATH`) builds or extracts every binary into
`$NEURONMODEL_CACHE/k8s/<version>/`; `python -m k8s.cluster up|down` starts and stops etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kwok with fake EKS Neuron nodes.
"""
