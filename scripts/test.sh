#!/usr/bin/env bash
# The whole test suite: lint, serial pytest, then the MPI tests at 2 and 3 ranks.
# Creates .venv and installs everything on first use. Exit non-zero on any failure.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
# Byte-code kept: with PYTHONDONTWRITEBYTECODE set (as on this project's machines) every
# process the suite starts (about 600) compiled the package's 70-odd modules from source
# again (0.14 s of CPU each), and every pytest process (15) rewrote the test modules' asserts
# again (1.8 s each; 2026-12-03). The package's byte-code is written once, up front.
export PYTHONDONTWRITEBYTECODE=
python -m compileall -q mpisdnn > /dev/null
echo "[test] ruff"
ruff check .
echo "[test] docs"
# The guide, the reference (API from the docstrings, CLI from the parsers) and the design
# notes; any warning (a broken link, a bad docstring) fails the build.
python -m sphinx -W --keep-going -q -E -b html docs docs/_build/html
echo "[test] serial pytest"
# Four workers (pytest-xdist) on CI's 2 cores: most tests wait (mpiexec start-up, compile
# locks, child processes, signals), so more workers than cores keep both busy. From a cold
# kernel cache the serial wall went 804 -> 638 s with a third worker (2026-12-02) and
# 992-1001 -> 937 s with a fourth (2026-12-03). The Slurm tests share one worker and so one
# cluster.
python -m pytest -q -n 4 --dist loadgroup "$@" tests
echo "[test] gpu backend under the CUDA simulator"
# The simulator runs every GPU thread as a Python thread: 177-228 s at 2 workers, 141 s at
# 3, 118 s at 4 (warm kernel cache, 2026-12-03).
NUMBA_ENABLE_CUDASIM=1 python -m pytest -q -n 4 -m gpu_sim tests
for n in 2 3; do
  echo "[test] MPI tests at $n ranks"
  # -m mpi4py aborts the whole job when one rank raises, so a failure never hangs.
  timeout 900 mpiexec -n "$n" python -m mpi4py -m pytest --with-mpi -p no:cacheprovider \
    -m mpi -q tests
done
echo "[test] all passed"
