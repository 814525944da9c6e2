# Sourced by the other scripts: make (once) and activate the project's virtual environment.
# MPI comes from the mpich wheel, so no system MPI is needed. Set MPISDNN_VENV to use another
# venv, or MPISDNN_SYSTEM_MPI=1 to skip the mpich wheel (mpi4py built against your MPI).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MPISDNN_VENV:-$ROOT/.venv}"
EXTRAS="${MPISDNN_EXTRAS:-test}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
# Reinstall only when pyproject.toml changed since the last install.
STAMP="$VENV/.mpisdnn-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ] || ! grep -qx "$EXTRAS" "$STAMP"; then
  echo "[setup] installing mpisdnn[$EXTRAS] into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[$EXTRAS]"
  echo "$EXTRAS" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# Open MPI refuses to start as root without these; harmless for MPICH.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Numba/BLAS threads must not fight MPI ranks for cores; mpisdnn sets numba's own count.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
cd "$ROOT"
