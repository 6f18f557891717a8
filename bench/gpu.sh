#!/usr/bin/env bash
# The reference runner on one GPU (bench/_gpu.py: a random Llama-3.2-1B-shaped model; server overhead, on-device vs
# host sampling at vocab 128k and batch 32, self-draft speculation, compiled vs eager), for a machine lent for a
# 15-minute slot with nothing reachable outside it. Finishes within GPU_BENCH_HARD_S (480 s) from its start: the
# stages start only within GPU_BENCH_SOFT_S (420 s), each writes its results as it ends, and a run still going at the
# hard limit is killed with the finished stages' results kept.
#
#   bench/gpu.sh [OUT]      run (from anywhere; OUT: the first argument, else $OUT, else bench/out/gpu):
#                           OUT/figures.jsonl, OUT/gpu_results.json, OUT/gpu.log
#   bench/gpu.sh --wheels   here, before: download into .whl/ the wheels of the runtime's dependencies that the GPU
#                           machine lacks (for its Python 3.12, x86-64), so that they travel with the repo
#
# What it needs there: a python3 (PYTHON names another) with torch that sees a CUDA device, transformers, tokenizers,
# safetensors, numpy, httpx, prometheus-client; the rest (pydantic, fastapi, starlette, uvicorn) from
# .whl/ (GPU_BENCH_WHEELS names another folder), else from PyPI where PyPI can be reached; otherwise it says what is
# missing and exits 3 (4: no CUDA torch). GPU_BENCH_SMALL=1: the same run on the CPU with a small model (a test).
# Afterwards: python bench/report.py --from bench/out/figures.jsonl OUT/figures.jsonl puts its figures in the report.
set -uo pipefail
ARG=${1:-}
[ -n "$ARG" ] && [ "$ARG" != --wheels ] && ARG=$(realpath -m "$ARG")  # relative to where it was run from
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
WHEELS=${GPU_BENCH_WHEELS:-.whl}
SITE=${GPU_BENCH_SITE:-/tmp/neuronmodel-gpu-site}
INDEX=${GPU_BENCH_INDEX:-https://pypi.org/simple/}
HARD_S=${GPU_BENCH_HARD_S:-480}
SOFT_S=${GPU_BENCH_SOFT_S:-420}
# What the runtime imports that the GPU machines' image lacks, or has maybe too old for the others (pydantic needs a
# typing-extensions of 2025, fastapi imports opentelemetry), as distributions; the image has the rest of their needs.
CARRIED="pydantic pydantic-core annotated-types typing-inspection typing-extensions fastapi starlette anyio uvicorn \
opentelemetry-api"
MODULES="torch transformers tokenizers safetensors numpy httpx pydantic fastapi starlette uvicorn prometheus_client"

say() { echo "bench/gpu.sh: $*" >&2; }

if [ "$ARG" = "--wheels" ]; then
  # The versions of the dev venv's distributions (PYTHON's, else .venv's), for CPython 3.12 on manylinux x86-64.
  [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
  mkdir -p "$WHEELS"
  # shellcheck disable=SC2086  # CARRIED is a list of names
  pins=$("$PY" -c 'import sys; from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))' $CARRIED) || { say "$PY lacks one of: $CARRIED"; exit 1; }
  platforms=()
  for n in 17 27 28 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  # shellcheck disable=SC2086  # pins is a list of requirements
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d "$WHEELS" $pins || exit 1
  du -sh "$WHEELS"; ls "$WHEELS"
  exit 0
fi

OUT_DIR=${ARG:-${OUT:-bench/out/gpu}}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD/runtime:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

missing() {  # the modules of $@ that do not import (absent, or too old for another), each with why on stderr
  "$PY" -c 'import importlib, sys
bad = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        bad.append(name)
        print(f"  {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
print(" ".join(bad))' "$@"
}
pypi_reachable() {
  "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "pip/", timeout=5)' "$INDEX" 2>/dev/null
}

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    || { say "could not install $WHEELS/*.whl"; exit 3; }
fi
# shellcheck disable=SC2086  # MODULES is a list of names
lacking=$(missing $MODULES)
if [ -n "$lacking" ]; then
  if ! pypi_reachable; then
    say "missing: $lacking; PyPI cannot be reached from here: carry the wheels (bench/gpu.sh --wheels, before)"
    exit 3
  fi
  say "installing from PyPI: $lacking"
  # shellcheck disable=SC2086  # the names, with the distributions' spelling
  "$PY" -m pip install -q --target "$SITE" --index-url "$INDEX" ${lacking//_/-} || exit 3
fi
if [ "${GPU_BENCH_SMALL:-}" != "1" ] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  if ! pypi_reachable; then
    say "$PY's torch sees no CUDA device, and PyPI (for one that does) cannot be reached from here"
    exit 4
  fi
  say "installing torch from PyPI (its Linux wheel is built for CUDA)"
  "$PY" -m pip install -q --target "$SITE" --index-url "$INDEX" torch || exit 4
  "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' \
    || { say "torch still sees no CUDA device"; exit 4; }
fi

left=$((HARD_S - SECONDS))
say "running bench/_gpu.py (soft budget ${SOFT_S} s, killed after ${left} s); results in $OUT_DIR"
timeout -k 5 "$left" "$PY" bench/_gpu.py --out "$OUT_DIR" --soft-budget "$((SOFT_S - SECONDS))" 2>&1 \
  | tee "$OUT_DIR/gpu.log"
status=${PIPESTATUS[0]}
[ "$status" = 124 ] || [ "$status" = 137 ] && say "killed at the hard limit; the finished stages are in $OUT_DIR"
say "done in ${SECONDS} s (exit $status)"
exit "$status"
