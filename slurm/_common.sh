# Shared by the sbatch scripts in slurm/ (sourced, not run): options, venv, MPI launcher,
# provenance files and the status file. See docs/cluster.md.
#
# Every setting comes from, in increasing priority: the default here, the environment
# (MPISDNN_*), a command-line argument of the script. Resolved values are written to
# OUT/config.env so a run can be repeated exactly.
#
# shellcheck disable=SC2034  # the settings parsed here are read by the scripts that source it
# shellcheck disable=SC2015  # `check && check || _die`: _die exits, so it is an if-not

# --- options ----------------------------------------------------------------------------------

_usage() {
  cat <<EOF
usage: sbatch [SBATCH OPTIONS] slurm/$JOB_KIND.sbatch [OPTIONS] [-- EXTRA MPISDNN FLAGS]

options (environment variable in brackets):
  --out DIR          results directory [MPISDNN_OUT] (default results/<job>-<jobid>)
  --ranks N          MPI ranks [MPISDNN_RANKS] (default SLURM_NTASKS, else 2)
  --threads T        threads per rank [MPISDNN_THREADS] (default SLURM_CPUS_PER_TASK, else 1)
  --launcher L       mpiexec or srun [MPISDNN_LAUNCHER] (default mpiexec)
  --network F        network HDF5 file or neuron{N}/ TSV dir [MPISDNN_NETWORK]
  --inputs F         inputs HDF5 (with truth) or sparse-images TSV [MPISDNN_INPUTS]
  --truth F          categories TSV [MPISDNN_TRUTH] (default: truth stored in the inputs)
  --layers L         layers to use / generate [MPISDNN_LAYERS] (default all / 120)
  --graph F          projection input .mtx/.tsv/.h5 [MPISDNN_GRAPH] (default: generated R-MAT)
  --onto cols|rows   projection H = A^T A (cols) or A A^T (rows) [MPISDNN_ONTO] (default cols)
  --weight W         projection weighting [MPISDNN_WEIGHT] (default count)
  --memory-per-rank M
                     projection memory budget per rank, e.g. 4G [MPISDNN_MEMORY_PER_RANK]
                     (default 80% of Slurm's memory per rank, else 1G)
  --data-dir DIR     where generated data goes (reused when present) [MPISDNN_DATA_DIR]
  --neurons N --count C --seed S --scale S --edge-factor E
                     sizes of generated data [MPISDNN_GEN_NEURONS, _COUNT, _SEED, _SCALE,
                     _EDGE_FACTOR] (defaults 1024, 60000, 1, 16, 16)
  --checkpoint-every S
                     infer: seconds between checkpoints in OUT/checkpoint
                     [MPISDNN_CHECKPOINT_EVERY] (default 600; 0 = only at the time limit;
                     none in pipeline stages, -- --stages S > 1)
  --scaling-ranks "1 2 4"
                     rank counts of the scaling sweep [MPISDNN_SCALING_RANKS]
                     (default 1, 2, 4, ... up to --ranks, and --ranks itself)
other environment: MPISDNN_ROOT (repository; default the submit dir), MPISDNN_VENV (venv to
activate; default ROOT/.venv; "none" to use the environment as it is), MPISDNN_SRUN_MPI
(srun --mpi= plugin, default pmi2), MPISDNN_LAUNCHER_ARGS (extra launcher flags),
MPISDNN_REQUEUE (infer: 1 = requeue the job after the time-limit checkpoint, the default
under Slurm; 0 = end it with status STOPPED 75 and resubmit with the same --out to continue).
EOF
}

_die() {
  echo "[$JOB_KIND] error: $*" >&2
  exit 2
}

_need_value() {
  [ "$#" -ge 2 ] && [ -n "$2" ] || _die "option $1 needs a value (see --help)"
}

# mpisdnn_setup KIND "$@": parse options, activate the venv, create OUT, install the trap.
mpisdnn_setup() {
  JOB_KIND="$1"
  shift
  OUT="${MPISDNN_OUT:-}"
  RANKS="${MPISDNN_RANKS:-${SLURM_NTASKS:-2}}"
  THREADS="${MPISDNN_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"
  LAUNCHER="${MPISDNN_LAUNCHER:-mpiexec}"
  NETWORK="${MPISDNN_NETWORK:-}"
  INPUTS="${MPISDNN_INPUTS:-}"
  TRUTH="${MPISDNN_TRUTH:-}"
  LAYERS="${MPISDNN_LAYERS:-}"
  GRAPH="${MPISDNN_GRAPH:-}"
  ONTO="${MPISDNN_ONTO:-cols}"
  WEIGHT="${MPISDNN_WEIGHT:-count}"
  MEMORY_PER_RANK="${MPISDNN_MEMORY_PER_RANK:-}"
  DATA_DIR="${MPISDNN_DATA_DIR:-}"
  GEN_NEURONS="${MPISDNN_GEN_NEURONS:-1024}"
  GEN_COUNT="${MPISDNN_GEN_COUNT:-60000}"
  GEN_SEED="${MPISDNN_GEN_SEED:-1}"
  GEN_SCALE="${MPISDNN_GEN_SCALE:-16}"
  GEN_EDGE_FACTOR="${MPISDNN_GEN_EDGE_FACTOR:-16}"
  SCALING_RANKS="${MPISDNN_SCALING_RANKS:-}"
  CHECKPOINT_EVERY="${MPISDNN_CHECKPOINT_EVERY:-600}"
  SRUN_MPI="${MPISDNN_SRUN_MPI:-pmi2}"
  EXTRA=()
  while [ "$#" -gt 0 ]; do
    case "$1" in
      -h | --help) _usage; exit 0 ;;
      --out) _need_value "$@"; OUT="$2"; shift ;;
      --ranks) _need_value "$@"; RANKS="$2"; shift ;;
      --threads) _need_value "$@"; THREADS="$2"; shift ;;
      --launcher) _need_value "$@"; LAUNCHER="$2"; shift ;;
      --network) _need_value "$@"; NETWORK="$2"; shift ;;
      --inputs) _need_value "$@"; INPUTS="$2"; shift ;;
      --truth) _need_value "$@"; TRUTH="$2"; shift ;;
      --layers) _need_value "$@"; LAYERS="$2"; shift ;;
      --graph) _need_value "$@"; GRAPH="$2"; shift ;;
      --onto) _need_value "$@"; ONTO="$2"; shift ;;
      --weight) _need_value "$@"; WEIGHT="$2"; shift ;;
      --memory-per-rank) _need_value "$@"; MEMORY_PER_RANK="$2"; shift ;;
      --data-dir) _need_value "$@"; DATA_DIR="$2"; shift ;;
      --neurons) _need_value "$@"; GEN_NEURONS="$2"; shift ;;
      --count) _need_value "$@"; GEN_COUNT="$2"; shift ;;
      --seed) _need_value "$@"; GEN_SEED="$2"; shift ;;
      --scale) _need_value "$@"; GEN_SCALE="$2"; shift ;;
      --edge-factor) _need_value "$@"; GEN_EDGE_FACTOR="$2"; shift ;;
      --scaling-ranks) _need_value "$@"; SCALING_RANKS="$2"; shift ;;
      --checkpoint-every) _need_value "$@"; CHECKPOINT_EVERY="$2"; shift ;;
      --) shift; EXTRA=("$@"); break ;;
      *) _die "unknown option '$1' (mpisdnn flags go after --; see --help)" ;;
    esac
    shift
  done
  for v in RANKS THREADS GEN_NEURONS GEN_COUNT GEN_SEED GEN_SCALE GEN_EDGE_FACTOR; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || _die "$v must be a non-negative integer, got '${!v}'"
  done
  [ "$RANKS" -ge 1 ] && [ "$THREADS" -ge 1 ] || _die "--ranks and --threads must be >= 1"
  [ -z "$LAYERS" ] || [[ "$LAYERS" =~ ^[1-9][0-9]*$ ]] || _die "--layers must be >= 1"
  [[ "$CHECKPOINT_EVERY" =~ ^[0-9]+(\.[0-9]+)?$ ]] || _die "--checkpoint-every must be a number of seconds >= 0"
  case "$LAUNCHER" in mpiexec | srun) ;; *) _die "--launcher must be mpiexec or srun" ;; esac
  if [ "$LAUNCHER" = srun ] && [ -z "${SLURM_JOB_ID:-}" ]; then
    _die "--launcher srun needs a Slurm allocation"
  fi

  _activate
  OUT="${OUT:-$ROOT/results/${SLURM_JOB_NAME:-mpisdnn-$JOB_KIND}-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}}"
  mkdir -p "$OUT"
  OUT="$(cd "$OUT" && pwd)"
  DATA_DIR="${DATA_DIR:-$OUT/data}"
  STATUS_FILE="$OUT/status"
  CKPT_DIR="$OUT/checkpoint"
  # Slurm's --signal=B:USR1@T (the time limit is near): before RUNNING is written, so a
  # signal that comes at any point later is a checkpoint request and never kills the script.
  trap _request_checkpoint USR1
  echo "RUNNING" >"$STATUS_FILE"
  trap _finish EXIT
  # Slurm sends TERM at the time limit and on scancel: record that as a failure too.
  trap 'exit 143' TERM
  trap 'exit 130' INT

  # The numerical libraries must not start a thread per core in every rank.
  export OMP_NUM_THREADS="$THREADS"
  export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
  # Open MPI refuses root without these (containers, CI); MPICH ignores them.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  : >"$OUT/commands.sh"
  _write_config
  echo "[$JOB_KIND] job ${SLURM_JOB_ID:-(not under Slurm)} on ${SLURM_JOB_NODELIST:-$(hostname)}:" \
    "$RANKS ranks x $THREADS threads, launcher $LAUNCHER, results in $OUT"
}

_activate() {
  local venv="${MPISDNN_VENV:-$ROOT/.venv}"
  if [ "$venv" != none ]; then
    [ -f "$venv/bin/activate" ] || _die "no virtual environment at $venv (set MPISDNN_VENV, or MPISDNN_VENV=none to use the loaded modules)"
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
  fi
  command -v mpisdnn >/dev/null || _die "mpisdnn is not on PATH (venv: $venv)"
  if [ "$LAUNCHER" = mpiexec ]; then
    command -v mpiexec >/dev/null || _die "no mpiexec on PATH (load your MPI module or use --launcher srun)"
  fi
}

_finish() {
  local code=$?
  trap - EXIT TERM INT
  if [ "$code" -eq 0 ]; then
    echo "FINISHED 0" >"$STATUS_FILE"
    echo "[$JOB_KIND] FINISHED; results in $OUT"
  elif [ "$code" -eq 75 ]; then
    echo "STOPPED 75" >"$STATUS_FILE"
    echo "[$JOB_KIND] STOPPED after a checkpoint; continue with the same --out $OUT" >&2
  elif [ "$code" -eq 143 ] && compgen -G "$CKPT_DIR/ckpt-*/manifest.json" >/dev/null; then
    # SIGTERM (scancel, a time limit without --signal, one rank's node): every rank of
    # mpisdnn exits 143 after its checkpoint; not requeued (scancel means stop).
    echo "TERMINATED 143" >"$STATUS_FILE"
    echo "[$JOB_KIND] TERMINATED (SIGTERM) after a checkpoint; continue with the same --out $OUT" >&2
  else
    echo "FAILED $code" >"$STATUS_FILE"
    echo "[$JOB_KIND] FAILED with exit code $code; results so far in $OUT" >&2
  fi
  exit "$code"
}

_write_config() {
  {
    echo "# mpisdnn $JOB_KIND job, $(date -Is)"
    local v
    for v in JOB_KIND ROOT OUT RANKS THREADS LAUNCHER SRUN_MPI NETWORK INPUTS TRUTH LAYERS GRAPH \
      ONTO WEIGHT MEMORY_PER_RANK DATA_DIR GEN_NEURONS GEN_COUNT GEN_SEED GEN_SCALE GEN_EDGE_FACTOR SCALING_RANKS \
      CHECKPOINT_EVERY; do
      printf '%s=%q\n' "$v" "${!v}"
    done
    if [ "${#EXTRA[@]}" -gt 0 ]; then
      printf 'EXTRA=(%s)\n' "$(printf '%q ' "${EXTRA[@]}")"
    else
      echo 'EXTRA=()'
    fi
    if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
      echo "GIT_COMMIT=$(git -C "$ROOT" describe --always --dirty 2>/dev/null)"
    fi
    echo "# environment"
    env | grep -E '^(MPISDNN_|SLURM_|OMP_|NUMBA_|CUDA_VISIBLE_DEVICES=|OMPI_MCA_|MPIR_CVAR_|I_MPI_|UCX_)' \
      | sort | sed 's/^/# /'
  } >"$OUT/config.env"
  # The script as submitted (under sbatch $0 is Slurm's spooled copy of it).
  cp "$0" "$OUT/job.sbatch" 2>/dev/null || true
}

# --- running ----------------------------------------------------------------------------------

# launcher_extra: MPISDNN_LAUNCHER_ARGS split into words in the array LAUNCHER_EXTRA. Split on
# blanks only: `read -a` neither expands globs (a `*` stays a `*`) nor runs anything.
launcher_extra() {
  LAUNCHER_EXTRA=()
  [ -z "${MPISDNN_LAUNCHER_ARGS:-}" ] || read -r -a LAUNCHER_EXTRA <<<"$MPISDNN_LAUNCHER_ARGS"
}

# launch N CMD...: run CMD on N MPI ranks with the chosen launcher.
launch() {
  local n="$1"
  shift
  launcher_extra
  local extra=("${LAUNCHER_EXTRA[@]}")
  if [ "$LAUNCHER" = srun ]; then
    # Never a plain srun: with MpiDefault=none it starts N independent rank-0 processes.
    # Since Slurm 22.05 srun does not inherit --cpus-per-task from sbatch: pass it.
    srun --mpi="$SRUN_MPI" --ntasks="$n" --cpus-per-task="$THREADS" "${extra[@]}" "$@"
  else
    # Hydra (MPICH) and Open MPI's mpirun detect the allocation and start through Slurm.
    mpiexec -n "$n" "${extra[@]}" "$@"
  fi
}

# run_logged N CMD...: record the exact command in OUT/commands.sh, then launch it.
# The launcher flags from MPISDNN_LAUNCHER_ARGS are part of the record (a `launch` line
# sourced with _common.sh repeats the run exactly).
run_logged() {
  local n="$1"
  shift
  local line
  if [ "$n" -gt 0 ]; then
    line="$(printf '%q ' launch "$n" "$@")"
    if [ -n "${MPISDNN_LAUNCHER_ARGS:-}" ]; then
      line="MPISDNN_LAUNCHER_ARGS=$(printf '%q' "$MPISDNN_LAUNCHER_ARGS") $line"
    fi
  else
    line="$(printf '%q ' "$@")"
  fi
  echo "$line" >>"$OUT/commands.sh"
  # stderr: stdout may be captured (versions.json); both end up in the Slurm log.
  echo "[$JOB_KIND] \$ $line" >&2
  if [ "$n" -gt 0 ]; then launch "$n" "$@"; else "$@"; fi
}

# record_versions: `mpisdnn info --json` on RANKS ranks -> OUT/versions.json, and a check that
# the launcher really made one MPI job of RANKS ranks (not RANKS singletons).
record_versions() {
  run_logged "$RANKS" mpisdnn info --json >"$OUT/versions.json.tmp"
  python - "$OUT/versions.json.tmp" "$RANKS" <<'EOF' || _die "launcher check failed (see above)"
import json, sys
path, want = sys.argv[1], int(sys.argv[2])
text = open(path).read()
try:
    info = json.loads(text)
except ValueError:
    sys.exit(f"{path}: expected one JSON object from rank 0; several ranks each think they "
             "are rank 0 (srun without --mpi=pmi2/pmix, or an mpiexec from another MPI?)")
if info["ranks"] != want:
    sys.exit(f"asked for {want} ranks, MPI_COMM_WORLD has {info['ranks']}")
EOF
  mv "$OUT/versions.json.tmp" "$OUT/versions.json"
}

# gen_network / gen_inputs: generated challenge-style data in DATA_DIR (reused when present).
ensure_infer_data() {
  if [ -n "$NETWORK" ] && [ -n "$INPUTS" ]; then
    [ -e "$NETWORK" ] || _die "network $NETWORK not found"
    [ -e "$INPUTS" ] || _die "inputs $INPUTS not found"
    return 0
  fi
  [ -z "$NETWORK$INPUTS" ] || _die "give both --network and --inputs, or neither (generated data)"
  local layers="${LAYERS:-120}"
  mkdir -p "$DATA_DIR"
  NETWORK="$DATA_DIR/net-n$GEN_NEURONS-l$layers-s$GEN_SEED.h5"
  INPUTS="$DATA_DIR/inputs-n$GEN_NEURONS-l$layers-c$GEN_COUNT-s$GEN_SEED.h5"
  if [ ! -f "$NETWORK" ]; then
    run_logged 0 mpisdnn generate network --neurons "$GEN_NEURONS" --layers "$layers" \
      --seed "$GEN_SEED" -o "$NETWORK"
  fi
  if [ ! -f "$INPUTS" ]; then
    # The truth comes from the reference backend, computed in parallel on RANKS ranks.
    run_logged "$RANKS" mpisdnn generate inputs --neurons "$GEN_NEURONS" --count "$GEN_COUNT" \
      --seed "$GEN_SEED" --network "$NETWORK" --layers "$layers" -o "$INPUTS"
  fi
}

# infer_args [BACKEND]: the common `mpisdnn infer` flags, in the array INFER_ARGS. --threads
# only where the run's backend (the script's BACKEND, or one given after --) is cpu: mpisdnn
# refuses a flag that has no effect (--threads with --backend reference or gpu).
infer_args() {
  local backend="${1:-cpu}" i
  for ((i = 0; i < ${#EXTRA[@]}; i++)); do
    case "${EXTRA[i]}" in
      --backend) backend="${EXTRA[i + 1]:-$backend}" ;;
      --backend=*) backend="${EXTRA[i]#--backend=}" ;;
    esac
  done
  INFER_ARGS=(--network "$NETWORK" --inputs "$INPUTS")
  [ "$backend" != cpu ] || INFER_ARGS+=(--threads "$THREADS")
  [ -z "$TRUTH" ] || INFER_ARGS+=(--truth "$TRUTH")
  [ -z "$LAYERS" ] || INFER_ARGS+=(--layers "$LAYERS")
}

# memory_per_rank: MEMORY_PER_RANK, or 80% of what Slurm gives each rank (the rest is Python,
# MPI buffers and the page cache), or 1G outside Slurm.
memory_per_rank() {
  # Slurm's values are plain numbers (MB, nodes). Anything else is refused before bash
  # arithmetic sees it: $(( )) evaluates a variable's text as an expression, and an array
  # subscript in it (`X[$(cmd)]`) would run cmd.
  local v
  for v in SLURM_MEM_PER_CPU SLURM_MEM_PER_NODE SLURM_JOB_NUM_NODES; do
    [ -z "${!v:-}" ] || [[ "${!v}" =~ ^[0-9]+$ ]] || _die "$v must be a number of MB/nodes, got '${!v}'"
  done
  # the node count divides below
  [ -z "${SLURM_JOB_NUM_NODES:-}" ] || [ "$((10#$SLURM_JOB_NUM_NODES))" -ge 1 ] ||
    _die "SLURM_JOB_NUM_NODES must be >= 1, got '$SLURM_JOB_NUM_NODES'"
  if [ -n "$MEMORY_PER_RANK" ]; then
    echo "$MEMORY_PER_RANK"
  elif [ -n "${SLURM_MEM_PER_CPU:-}" ]; then
    echo "$((10#$SLURM_MEM_PER_CPU * THREADS * 8 / 10))M"
  elif [ -n "${SLURM_MEM_PER_NODE:-}" ]; then
    local nodes="${SLURM_JOB_NUM_NODES:-1}"
    local per_node=$(((RANKS + 10#$nodes - 1) / 10#$nodes))
    echo "$((10#$SLURM_MEM_PER_NODE * 8 / 10 / per_node))M"
  else
    echo 1G
  fi
}

# --- checkpoint / requeue (infer) ---------------------------------------------------------------

# _request_checkpoint: the USR1 trap. The running `mpisdnn infer` polls CKPT_DIR/STOP at every
# layer-group boundary, writes a checkpoint and exits 75 (a file works whatever the launcher
# does with signals; the run deletes it once answered).
_request_checkpoint() {
  echo "[$JOB_KIND] time limit near (USR1): asking mpisdnn for a checkpoint and a stop" >&2
  mkdir -p "$CKPT_DIR"
  : >"$CKPT_DIR/STOP"
}

# _extra_stages: the value of --stages among the extra mpisdnn flags (1 when not given).
_extra_stages() {
  local s=1 i
  for ((i = 0; i < ${#EXTRA[@]}; i++)); do
    case "${EXTRA[i]}" in
      --stages) s="${EXTRA[i + 1]:-1}" ;;
      --stages=*) s="${EXTRA[i]#--stages=}" ;;
    esac
  done
  echo "$s"
}

# checkpoint_args: CKPT_ARGS continue from OUT/checkpoint when it holds a complete checkpoint
# (a requeued or resubmitted job), else write checkpoints there every CHECKPOINT_EVERY s. A
# run in pipeline stages (-- --stages S, S > 1) writes none (mpisdnn checkpoints with
# --stages 1 only: rows in a pipeline are at different layers) but may resume.
checkpoint_args() {
  local stages
  stages="$(_extra_stages)"
  mkdir -p "$CKPT_DIR"
  if compgen -G "$CKPT_DIR/ckpt-*/manifest.json" >/dev/null; then
    CKPT_ARGS=(--resume "$CKPT_DIR")
    [ "$stages" != 1 ] || CKPT_ARGS+=(--checkpoint-every "$CHECKPOINT_EVERY")
    echo "[$JOB_KIND] continuing from the checkpoints in $CKPT_DIR" >&2
  elif [ "$stages" != 1 ]; then
    CKPT_ARGS=()
    echo "[$JOB_KIND] --stages $stages: no checkpoints (written with --stages 1 only);" \
      "the time limit ends this run" >&2
  else
    CKPT_ARGS=(--checkpoint "$CKPT_DIR" --checkpoint-every "$CHECKPOINT_EVERY")
  fi
}

# run_checkpointed LOG N CMD...: run_logged N CMD... (output also to LOG) in the background, so
# the USR1 trap runs at once instead of after the run; on exit code 75 (stopped after a
# checkpoint) requeue the job when MPISDNN_REQUEUE allows it.
run_checkpointed() {
  local log="$1" pid code=0
  shift
  { run_logged "$@" 2>&1 | tee "$log"; } &
  pid=$!
  while :; do
    code=0
    wait "$pid" || code=$?
    # wait returns >128 when a trapped signal interrupted it; the run goes on.
    if [ "$code" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    break
  done
  if [ "$code" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "${MPISDNN_REQUEUE:-1}" = 1 ]; then
    echo "[$JOB_KIND] requeueing job $SLURM_JOB_ID to continue from $CKPT_DIR" >&2
    echo "REQUEUED 75" >"$STATUS_FILE"
    # Slurm ends this script when it requeues the job: that is no failure.
    trap - EXIT TERM INT USR1
    if scontrol requeue "$SLURM_JOB_ID"; then
      sleep 300 &
      wait $! || true
      exit 0
    fi
    echo "[$JOB_KIND] scontrol requeue failed; resubmit with --out $OUT to continue" >&2
    trap _finish EXIT
  fi
  return "$code"
}
