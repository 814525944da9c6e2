#!/usr/bin/env bash
# Stop the Slurm cluster (one node or K virtual nodes) started by scripts/slurm_start.sh.
#   scripts/slurm_stop.sh [STATE_DIR]      # default $MPISDNN_SLURM_DIR or /tmp/mpisdnn-slurm
# Cancels its jobs, ends every slurmd and slurmctld by their pid files (TERM, then KILL after 10 s)
# and munged if slurm_start.sh started it and no other slurmctld still needs it.
set -uo pipefail

STATE="${1:-${MPISDNN_SLURM_DIR:-/tmp/mpisdnn-slurm}}"
[ -d "$STATE" ] || { echo "[slurm] nothing to stop in $STATE"; exit 0; }
STATE="$(cd "$STATE" && pwd)"
export SLURM_CONF="$STATE/slurm.conf"

stop_pid() {  # stop_pid NAME PIDFILE
  local pid
  [ -f "$2" ] || return 0
  pid="$(cat "$2")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "[slurm] $1 ($pid) ignored TERM; killing"
      kill -9 "$pid" 2>/dev/null
    fi
    echo "[slurm] stopped $1 ($pid)"
  fi
  rm -f "$2"
}

if [ -f "$SLURM_CONF" ] && command -v scancel >/dev/null; then
  jobs="$(squeue -h -o '%i' 2>/dev/null || true)"
  # shellcheck disable=SC2086  # one argument per job id
  [ -z "$jobs" ] || scancel $jobs 2>/dev/null || true
fi
for pidfile in "$STATE"/slurmd*.pid; do
  # slurmd.pid (one node) or slurmd-vnodeK.pid (virtual nodes; their namespaces end with them)
  [ -f "$pidfile" ] && stop_pid "$(basename "$pidfile" .pid)" "$pidfile"
done
stop_pid slurmctld "$STATE/slurmctld.pid"
# What the daemons started and outlived them (a job's batch shell, mpiexec and ranks, when
# slurmctld was gone before scancel could reach it): every process of a job (SLURM_JOB_ID)
# whose environment names this cluster's configuration. A shell that only sourced
# STATE/env has no job id and is left alone.
for env_file in /proc/[0-9]*/environ; do
  pid="${env_file#/proc/}"
  pid="${pid%/environ}"
  [ "$pid" != "$$" ] && [ "$pid" != "$PPID" ] || continue
  env_text="$(tr '\0' '\n' <"$env_file" 2>/dev/null)" || continue
  if grep -qxF "SLURM_CONF=$SLURM_CONF" <<<"$env_text" && grep -q '^SLURM_JOB_ID=' <<<"$env_text"; then
    kill -9 "$pid" 2>/dev/null && echo "[slurm] killed job process $pid"
  fi
done
if [ -f "$STATE/munged.started-here" ]; then
  # Another cluster on this machine (another test session) may share munged.
  if pgrep -x slurmctld >/dev/null; then
    echo "[slurm] leaving munged running: another slurmctld uses it"
  else
    stop_pid munged /run/munge/munged.pid
  fi
  rm -f "$STATE/munged.started-here"
fi
exit 0
