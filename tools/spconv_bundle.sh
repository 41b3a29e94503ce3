#!/usr/bin/env bash
# spconv 2.x for the GPU machine, which has no network and takes at most 64 MiB of files a run.
# Its wheels (spconv-cu126 70 MB, cumm-cu126 27 MB) are past that; unpacked and packed again with
# xz they are about 40 MB: spconv's one 284 MB library is mostly kernels for many GPUs, which xz
# squeezes far better than a wheel's zip. Run on a CPU machine with network, from the project root:
#     bash tools/spconv_bundle.sh          # -> .spconv/site.tar.xz (git-ignored)
# then on the GPU machine, after the numpy line of ../shared/GPU.md (carry [".whl", ".spconv"]):
#     tar -xJf .spconv/site.tar.xz -C /tmp/site
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$work/wheels" \
  "spconv-cu126==2.3.8" "cumm-cu126>=0.7.11,<0.8" pccm ccimport pybind11 fire lark portalocker termcolor
mkdir -p "$work/site" .spconv
for wheel in "$work"/wheels/*.whl; do
  python3 -m zipfile -e "$wheel" "$work/site"  # a wheel is a zip of what site-packages holds
done
tar -C "$work/site" -cf - . | xz -T0 -9e > .spconv/site.tar.xz
ls -la .spconv/site.tar.xz
