#!/usr/bin/env bash
# The whole test suite: lint, serial pytest, then the MPI tests at 2 and 3 ranks.
# Creates .venv and installs everything on first use. Exit non-zero on any failure.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
echo "[test] ruff"
ruff check .
echo "[test] docs"
# The guide, the reference (API from the docstrings, CLI from the parsers) and the design
# notes; any warning (a broken link, a bad docstring) fails the build.
python -m sphinx -W --keep-going -q -E -b html docs docs/_build/html
echo "[test] serial pytest"
# Three workers (pytest-xdist) on CI's 2 cores: most tests wait (mpiexec start-up, compile
# locks, child processes), so a third worker cuts the serial wall 804 -> 638 s from a cold
# kernel cache (2026-12-02). The Slurm tests share one worker and so one cluster.
python -m pytest -q -n 3 --dist loadgroup "$@" tests
echo "[test] gpu backend under the CUDA simulator"
NUMBA_ENABLE_CUDASIM=1 python -m pytest -q -n 2 -m gpu_sim tests
for n in 2 3; do
  echo "[test] MPI tests at $n ranks"
  # -m mpi4py aborts the whole job when one rank raises, so a failure never hangs.
  timeout 900 mpiexec -n "$n" python -m mpi4py -m pytest --with-mpi -p no:cacheprovider \
    -m mpi -q tests
done
echo "[test] all passed"
