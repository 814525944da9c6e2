#!/usr/bin/env bash
# Every GPU session starts with this, before changing anything, and runs it again after:
# the device tests (tests/test_gpu.py), then the benchmark table (scripts/bench_gpu.py: the
# gpu backend, the plain CuPy CSR loop and the cpu backend on the machine's cores, on data
# generated there in parallel), all inside a global time budget (default 470 s: a second
# run still fits a 15-minute lease). Results under $OUT: gpu_check.log (everything),
# env.txt, tests.log, prepare.log, bench_gpu.json. The table is printed last.
#
#   scripts/gpu_check.sh                  on a device machine (see docs/gpu.md for the `run`
#                                         call and its `carry` list; scripts/gpu_carry.sh
#                                         prepares .gpu/ here first)
#   scripts/gpu_check.sh --sim            the same steps under the CUDA simulator on tiny data
#                                         (CI: tests/test_gpu_check.py); or GPU_CHECK_SIM=1
#   scripts/gpu_check.sh --budget 300 --configs 1024x120
#
# Environment: OUT (default results/gpu_check), GPU_CHECK_BUDGET, GPU_CHECK_CONFIGS,
# GPU_CHECK_CONTENDERS (default gpu,cupy,cpu; ablations: gpu-nosets, gpu-notail,
# gpu-nosplit, gpu-nodedup, gpu-longgroups), GPU_CHECK_ABLATIONS (the gpu ablations run after
# the first three configurations, name or name@NxL; default: bench_gpu.py's
# DEFAULT_ABLATIONS; empty: none), GPU_CHECK_DATA (default /tmp/mpisdnn-gpu-data; kept
# between runs on one machine).
set -uo pipefail
START=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIM="${GPU_CHECK_SIM:-0}"
BUDGET="${GPU_CHECK_BUDGET:-470}"
CONFIGS="${GPU_CHECK_CONFIGS:-}"
CONTENDERS="${GPU_CHECK_CONTENDERS:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --sim) SIM=1 ;;
    --budget) BUDGET="$2"; shift ;;
    --configs) CONFIGS="$2"; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (--sim, --budget S, --configs NxL,...)" >&2
       exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$ROOT/results/gpu_check}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
DEADLINE=$((START + BUDGET))
left() { echo $((DEADLINE - $(date +%s))); }
say() { echo "[gpu_check $(date +%H:%M:%S) +$(($(date +%s) - START))s] $*"; }

export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$SIM" != "0" ]; then
  # The project's own environment (CI's): numba-cuda's simulator, no device.
  source "$ROOT/scripts/_env.sh"
  export NUMBA_ENABLE_CUDASIM=1
  PY=python
  DATA="${GPU_CHECK_DATA:-$OUT/data}"
  BENCH_ARGS=(--sim --ranks 2 --threads 2)
else
  # The device image's python3 (CuPy, numba, h5py, mpi4py are there); what it lacks or has
  # in a version the kernels cannot use comes as carried wheels (scripts/gpu_carry.sh).
  PY=python3
  DATA="${GPU_CHECK_DATA:-/tmp/mpisdnn-gpu-data}"
  SITE=/tmp/mpisdnn-site
  if compgen -G "$ROOT/.gpu/whl/*.whl" > /dev/null; then
    say "installing carried wheels: $(cd "$ROOT/.gpu/whl" && echo *.whl)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$ROOT"/.gpu/whl/*.whl || { say "wheel install failed"; exit 3; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    say "no .gpu/whl/*.whl carried: using the image's packages as they are"
  fi
  BENCH_ARGS=()
  if [ -f "$ROOT/.gpu/neuron1024.tar.gz" ]; then
    BENCH_ARGS+=(--official "$ROOT/.gpu/neuron1024.tar.gz")
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$CONFIGS" ]; then BENCH_ARGS+=(--configs "$CONFIGS"); fi
if [ -n "$CONTENDERS" ]; then BENCH_ARGS+=(--contenders "$CONTENDERS"); fi
if [ -n "${GPU_CHECK_ABLATIONS+set}" ]; then BENCH_ARGS+=(--ablations "$GPU_CHECK_ABLATIONS"); fi
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || cat "$ROOT/.gpu/COMMIT" 2>/dev/null \
  || echo unknown)"
export MPISDNN_COMMIT="$(echo "$COMMIT" | tr '\n' ' ' | sed 's/ $//')"
mkdir -p "$DATA"

say "environment -> $OUT/env.txt (commit $MPISDNN_COMMIT, budget ${BUDGET}s, sim=$SIM)"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $MPISDNN_COMMIT"
  echo "host: $(hostname) cores: $(nproc) $(grep MemTotal /proc/meminfo)"
  nvidia-smi 2>&1 | head -20 || true
  "$PY" - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for mod in ("numpy", "scipy", "numba", "numba_cuda", "cupy", "mpi4py", "h5py"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod} {getattr(m, '__version__', '?')} {getattr(m, '__file__', '')}")
    except Exception as exc:
        print(f"{mod}: {type(exc).__name__}: {exc}")
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

say "data -> $DATA (in the background, while the tests run)"
"$PY" scripts/bench_gpu.py --prepare --data "$DATA" --deadline "$DEADLINE" "${BENCH_ARGS[@]}" \
  > "$OUT/prepare.log" 2>&1 &
PREP=$!

TEST_LIMIT=$(( $(left) < 200 ? $(left) / 2 : 200 ))
say "tests/test_gpu.py (limit ${TEST_LIMIT}s)"
timeout "$TEST_LIMIT" "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_gpu.py \
  2>&1 | tee "$OUT/tests.log"
TESTS=${PIPESTATUS[0]}
say "tests exit $TESTS"

# The bench waits for each configuration's files; the data job ends at the deadline anyway.
say "benchmark table ($(left)s left)"
"$PY" scripts/bench_gpu.py --data "$DATA" --out "$OUT" --deadline "$DEADLINE" \
  --prepared-by "$PREP" "${BENCH_ARGS[@]}"
BENCH=$?
wait "$PREP"
PREPARED=$?
cat "$OUT/prepare.log"
if [ "$SIM" = "0" ] && [ "$(left)" -gt 40 ]; then
  # Its own process: a capture that fails cannot cost the table (docs/gpu.md, CUDA graphs).
  say "CUDA graph probe (split kernel on one row, 8 layers)"
  timeout 60 "$PY" scripts/bench_gpu.py --graph-probe 2>&1 | tail -3
fi
say "done: tests exit $TESTS, bench exit $BENCH, data exit $PREPARED, $(( $(date +%s) - START ))s"
# pytest exit 5 = nothing collected/all skipped is not a failure of the check itself
if [ "$TESTS" != 0 ] && [ "$TESTS" != 5 ]; then exit 1; fi
exit "$BENCH"
