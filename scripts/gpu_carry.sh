#!/usr/bin/env bash
# Run HERE (the development machine) before a device call: fills .gpu/, which git ignores and
# the device tool's `carry` takes along (docs/gpu.md, "On a device"):
#   .gpu/whl/        the wheels the device image lacks or has in a version the kernels cannot
#                    use: numba-cuda 0.30.4 (the extra's range) and NumPy 2.4.6 (numba-cuda
#                    0.30.4 fails at its first compile with the image's NumPy 2.5), for its
#                    Python 3.12 / x86-64
#   .gpu/neuron1024.tar.gz   the official N=1024 network (11 MB), when ../shared has it
#   .gpu/COMMIT      the commit and whether the tree was dirty (the device copy has no .git)
# Stays far under the 64 MiB a call may carry (about 30 MB).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
git check-ignore -q .gpu/ || { echo "gpu_carry.sh: .gpu/ is not ignored by git" >&2; exit 1; }
mkdir -p .gpu/whl
PY="${PYTHON:-python3}"
WHEELS="${GPU_WHEELS:-numba-cuda==0.30.4 numpy==2.4.6}"
# shellcheck disable=SC2086 # one word per wheel
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu/whl $WHEELS
TAR="${MPISDNN_OFFICIAL:-$ROOT/../shared/data/graphchallenge/neuron1024.tar.gz}"
if [ -f "$TAR" ]; then cp -f "$TAR" .gpu/neuron1024.tar.gz; fi
{
  git rev-parse --short HEAD
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then echo "dirty"; fi
} > .gpu/COMMIT
du -sh .gpu
ls -l .gpu .gpu/whl
