#!/usr/bin/env bash
# The main job on an embedded default: N=1024, L=120 challenge-style network and 60,000
# digit-like inputs calibrated to the official survivor regime (generated once, cached under
# data/; see data/README.md), inference on RANKS (default 2) ranks, PASS/FAIL against the
# truth (computed by the independent plain-scipy reference), timings and the challenge rate.
#   scripts/run_default.sh [RANKS] [extra mpisdnn infer flags...]
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
RANKS="${1:-2}"; shift || true
DATA="$ROOT/data/default"
NET="$DATA/neuron1024-l120.h5"
# The name carries the generator's calibration, so inputs cached by an older one are not reused.
INPUTS="$DATA/digits-1024-60000-calibrated.h5"
mkdir -p "$DATA" "$ROOT/results"
if [ ! -f "$NET" ]; then
  echo "[data] generating network N=1024 L=120 -> $NET"
  mpisdnn generate network --neurons 1024 --layers 120 --seed 1 -o "$NET"
fi
if [ ! -f "$INPUTS" ]; then
  echo "[data] generating 60,000 calibrated inputs and their truth (scipy reference) -> $INPUTS"
  mpiexec -n "$RANKS" mpisdnn generate inputs --neurons 1024 --count 60000 --seed 1 \
    --network "$NET" -o "$INPUTS"
fi
echo "[run] mpiexec -n $RANKS mpisdnn infer --network $NET --inputs $INPUTS"
exec mpiexec -n "$RANKS" mpisdnn infer --network "$NET" --inputs "$INPUTS" \
  --report "$ROOT/results/default-n$RANKS.json" "$@"
