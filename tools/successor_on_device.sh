#!/usr/bin/env bash
# numba-cuda-mlir on the GPU machine (issue 62), from the project root there. Before, on a CPU machine
# with network: `bash ../shared/gpu/wheels.sh --no-numpy` (-> .whl) and `bash tools/successor_bundle.sh`
# (-> .successor/site.tar.xz); then run through the device tool with carry [".whl", ".successor"]:
#     LIMIT=540 bash tools/successor_on_device.sh tests tests/test_successor.py tests/test_ch03_amp_unscale.py
#         the tests, every chapter launch built and run by the successor (WORKBOOK_COMPILER)
#     LIMIT=540 bash tools/successor_on_device.sh compilers ch02 ch03 launch
#         python -m workbook compilers: $OUT/compilers.json, whose chapters go into
#         results/<device>/compilers.json here (then `python -m workbook table --readme`)
#     bash tools/successor_on_device.sh run ncu ... python tools/successor_ncu.py ch08-half-weights
#         any command, with the successor importable
# LIMIT: seconds the command may take (default 300), inside the device tool's own limit; TAILN:
# lines of its output shown (default 30).
set -u
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
[ -d /tmp/site/numba_cuda_mlir ] || tar -xJf .successor/site.tar.xz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD WORKBOOK_DEVICE=gpu PYTHONUNBUFFERED=1 WORKBOOK_RESULTS=$OUT/results
what=${1:-}; shift || true
case $what in
  tests) WORKBOOK_COMPILER=numba-cuda-mlir timeout "${LIMIT:-300}" python -m pytest -q -p no:cacheprovider "$@" 2>&1 \
           | tail -n "${TAILN:-30}" ;;
  compilers) timeout "${LIMIT:-300}" python -m workbook compilers "$@" 2>&1 | tail -n "${TAILN:-30}"
             cp "$OUT"/results/*/compilers.json "$OUT"/ 2>/dev/null ;;
  run) timeout "${LIMIT:-300}" "$@" 2>&1 | tail -n "${TAILN:-30}" ;;
  *) echo "usage: bash tools/successor_on_device.sh tests <pytest args> | compilers <chNN ...> [launch] | run <command>" >&2
     exit 2 ;;
esac
