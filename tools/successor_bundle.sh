#!/usr/bin/env bash
# numba-cuda-mlir (the successor compiler, issue 62) for the GPU machine, which has no network and
# takes at most 64 MiB of files a run. Its wheel (71 MB) is past that; unpacked and packed again
# with xz it is about 49 MB. Run on a CPU machine with network, from the project root:
#     bash tools/successor_bundle.sh        # -> .successor/site.tar.xz (git-ignored)
# then on the GPU machine (carry [".whl", ".successor"]), after the install line of ../shared/GPU.md:
#     tar -xJf .successor/site.tar.xz -C /tmp/site
# Its other needs (cuda-bindings, cuda-core) are there already.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
version=${1:-0.6.0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$work/wheels" "numba-cuda-mlir==$version"
mkdir -p "$work/site" .successor
for wheel in "$work"/wheels/*.whl; do
  python3 -m zipfile -e "$wheel" "$work/site"
done
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$work/site" -cf - . | xz -T0 -9e > .successor/site.tar.xz
ls -la .successor/site.tar.xz
