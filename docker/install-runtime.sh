#!/bin/sh
# Puts neuronmodel into a runtime image. Every runtime target of the Dockerfile runs it once, as root:
#   COPY --from=wheel /wheels/ /tmp/wheels/
#   RUN sh /tmp/wheels/install-runtime.sh
# The wheel (py3-none-any, built once in the wheel stage) lies beside this script. HOME and NEURONMODEL_CACHE come
# from the target's ENV. POSIX sh: the bases' /bin/sh is dash. Any failure fails the build.
set -eu
export LC_ALL=C  # one collation for sort and comm

here=$(dirname "$0")
: "${HOME:?the target sets HOME}" "${NEURONMODEL_CACHE:?the target sets NEURONMODEL_CACHE}"

# 1. The user with UID 1000 (the operator's pods run as runAsUser 1000). The DLCs already have one (ubuntu on 24.04,
#    model-server on 22.04): it is reused, not renamed. A base without one (python:*-slim) gets neuronmodel.
if ! getent group 1000 > /dev/null; then groupadd --gid 1000 neuronmodel; fi
if ! getent passwd 1000 > /dev/null; then
  useradd --uid 1000 --gid 1000 --home-dir "${HOME}" --no-create-home --shell /bin/bash neuronmodel
fi

# 2. HOME and NEURONMODEL_CACHE, writable by UID 1000.
mkdir -p "${HOME}" "${NEURONMODEL_CACHE}"
chown 1000:1000 "${HOME}" "${NEURONMODEL_CACHE}"

# 3. The wheel with its runtime extra, under a constraints file written from the base's own `pip list`: every
#    distribution already in the image is pinned to exactly the version it has (torch, torch-neuronx, neuronx-cc,
#    neuronx-distributed(-inference), transformers-neuronx, transformers, ...), so pip adds only what the base lacks
#    (fastapi, uvicorn, prometheus-client, ...), and a requirement of ours that the base cannot meet
#    fails here naming the package, instead of upgrading a Neuron package under the compiler's feet.
#    Not `--no-deps` plus a hand-kept list of what the base lacks: that list rots with every DLC, skips transitive
#    dependencies, and installs even when the base's versions break our bounds (it would fail at run time instead).
set -- "${here}"/neuronmodel-*.whl
if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then echo "install-runtime.sh: not one wheel in ${here}: $*" >&2; exit 1; fi
wheel=$1
work=$(mktemp -d)
python -m pip list --format=freeze > "${work}/base.txt"
python -m pip install --no-cache-dir --constraint "${work}/base.txt" "${wheel}[runtime]"

# 4. No distribution of the base changed version or went away (pip honours the constraints; this proves it).
python -m pip list --format=freeze > "${work}/after.txt"
sort -o "${work}/base.txt" "${work}/base.txt"
sort -o "${work}/after.txt" "${work}/after.txt"
comm -23 "${work}/base.txt" "${work}/after.txt" > "${work}/changed.txt"
if [ -s "${work}/changed.txt" ]; then
  echo "install-runtime.sh: the install changed the base's:" >&2
  cat "${work}/changed.txt" >&2
  exit 1
fi

# 5. Nothing of the install stays behind: the lists, the wheel, this script and its folder.
rm -rf "${work}"
rm -f "${wheel}" "$0"
rmdir "${here}"

# 6. The entry point imports and runs.
neuronmodel-runtime --help > /dev/null
