#!/usr/bin/env bash
# Start a Slurm cluster on this machine, for the sbatch tests and for trying the scripts in
# slurm/ without a real cluster: one node (the machine itself), or K virtual nodes.
# Needs root and a Debian/Ubuntu system (apt-get).
#
#   scripts/slurm_start.sh [--nodes K] [STATE_DIR]  # default $MPISDNN_SLURM_DIR or /tmp/mpisdnn-slurm
#   source STATE_DIR/env                           # sets SLURM_CONF for sinfo/sbatch/squeue
#   scripts/slurm_stop.sh [STATE_DIR]
#
# What it does: installs slurmctld, slurmd, slurm-client and munge from the distribution when
# missing; starts munged (as user munge; there is no systemd in containers) unless one already
# answers; writes STATE_DIR/slurm.conf (node line from `slurmd -C`, NodeAddr=127.0.0.1,
# cons_tres with CR_Core_Memory, no cgroups, no accounting, SlurmUser=root so jobs may run as
# root, MpiDefault=none); starts slurmctld and slurmd with pid files in STATE_DIR and waits
# until sinfo shows the node idle. Ports: MPISDNN_SLURM_PORT (slurmctld, default 6817) and the
# next one (slurmd), so two clusters on one machine do not collide. Idempotent: a cluster that
# already runs from STATE_DIR is reused.
#
# --nodes K (or MPISDNN_SLURM_NODES=K), K > 1: K virtual nodes vnode0..vnodeK-1, each a
# `slurmd -N vnodeK` on its own port (PORT+1+k) started under `unshare --uts --mount` with
# the hostname vnodeK and a private bind mount of STATE_DIR/hosts over /etc/hosts that resolves
# the vnode names to 127.0.0.1 (jobs inherit both, so hydra's proxies, started by srun on each
# node, reach the batch node by name). The host's hostname and /etc/hosts are not touched.
# Each node declares the machine's CPUs and 1/K of its memory: `sbatch -N 2
# --ntasks-per-node=1` runs a job on two hosts, which MPI and mpisdnn see as two nodes.
set -euo pipefail

NODES="${MPISDNN_SLURM_NODES:-1}"
if [ "${1:-}" = "--nodes" ]; then
  NODES="${2:?--nodes needs a count}"
  shift 2
fi
STATE="${1:-${MPISDNN_SLURM_DIR:-/tmp/mpisdnn-slurm}}"
PORT="${MPISDNN_SLURM_PORT:-6817}"
TIMEOUT="${MPISDNN_SLURM_TIMEOUT:-60}"
CONF="$STATE/slurm.conf"

say() { echo "[slurm] $*"; }
die() { echo "[slurm] error: $*" >&2; exit 1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages, starts daemons)"
case "$NODES" in '' | *[!0-9]* | 0) die "--nodes must be a positive integer, got '$NODES'" ;; esac
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
CONF="$STATE/slurm.conf"
export SLURM_CONF="$CONF"

all_slurmd_alive() {
  local f found=0
  for f in "$STATE"/slurmd*.pid; do
    [ -f "$f" ] || continue
    alive "$f" || return 1
    found=$((found + 1))
  done
  [ "$found" -eq "$NODES" ]
}
if alive "$STATE/slurmctld.pid" && all_slurmd_alive \
  && [ "$(sinfo -h -N -t idle -o '%N' 2>/dev/null | wc -l)" -eq "$NODES" ]; then
  say "already running from $STATE"
  exit 0
fi

# --- packages ---------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
  || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || die "slurm is not installed and there is no apt-get"
  say "installing slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  # An empty package index (fresh container) makes install fail: update first.
  apt-get update -qq >"$STATE/apt.log" 2>&1 || die "apt-get update failed (see $STATE/apt.log)"
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
    >>"$STATE/apt.log" 2>&1 || die "apt-get install failed (see $STATE/apt.log)"
fi

# --- munge ------------------------------------------------------------------------------------
# slurm authenticates every message with munge; without systemd nobody started it.
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "munged already running"
else
  mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile=/etc/munge/munge.key
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
  fi
  # munged refuses keys and directories that others can read or write.
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
  chmod 0700 /etc/munge /var/log/munge
  chmod 0711 /var/lib/munge
  chmod 0755 /run/munge
  chmod 0400 /etc/munge/munge.key
  rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  runuser -u munge -- munged
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
  touch "$STATE/munged.started-here"
  say "munged started"
fi

# --- slurm.conf -------------------------------------------------------------------------------
# Leftovers of an earlier cluster in this directory (state, spool, stale pid files) would
# resurrect old jobs: start clean.
for pidfile in "$STATE"/slurmd*.pid "$STATE/slurmctld.pid"; do
  if alive "$pidfile"; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
done
sleep 0.2
rm -rf "$STATE/ctld" "$STATE"/spool* "$STATE"/*.pid "$STATE"/*.log
mkdir -p "$STATE/ctld" "$STATE/spool"

NODE_LINE="$(slurmd -C | grep '^NodeName=')"
NODE="$(sed 's/^NodeName=\([^ ]*\).*/\1/' <<<"$NODE_LINE")"
CPUS="$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$NODE_LINE")"
MEM="$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$NODE_LINE")"
# The whole node's memory spread over its CPUs: a job gets memory in proportion to its cores.
MEM_PER_CPU=$((MEM / NODES / (CPUS > 0 ? CPUS : 1)))
CTLD_HOST="$(hostname -s)"
if [ "$NODES" -gt 1 ]; then
  # K virtual nodes: the machine's CPUs each (a job asks for tasks per node), 1/K of its
  # memory each (together they promise no more than the machine has).
  NODE="vnode[0-$((NODES - 1))]"
  NODE_LINES=""
  for k in $(seq 0 $((NODES - 1))); do
    NODE_LINES+="$(sed "s/^NodeName=[^ ]*/NodeName=vnode$k/; s/RealMemory=[0-9]*/RealMemory=$((MEM / NODES))/" <<<"$NODE_LINE")"
    NODE_LINES+=" NodeHostname=vnode$k NodeAddr=127.0.0.1 Port=$((PORT + 1 + k)) State=UNKNOWN"$'\n'
  done
  SPOOL="$STATE/spool/%n"
  SLURMD_PID="$STATE/slurmd-%n.pid"
  SLURMD_LOG="$STATE/slurmd-%n.log"
  for k in $(seq 0 $((NODES - 1))); do mkdir -p "$STATE/spool/vnode$k"; done
  { cat /etc/hosts; echo "127.0.0.1 $(seq -f 'vnode%g' -s ' ' 0 $((NODES - 1)))"; } >"$STATE/hosts"
else
  NODE_LINES="$NODE_LINE NodeAddr=127.0.0.1 State=UNKNOWN"
  SPOOL="$STATE/spool"
  SLURMD_PID="$STATE/slurmd.pid"
  SLURMD_LOG="$STATE/slurmd.log"
fi

FIRST_JOB=$(( (RANDOM * 32768 + RANDOM) % 60000000 + 1000 ))
cat >"$CONF" <<EOF
# Generated by scripts/slurm_start.sh: a test cluster of $NODES node(s) on one machine.
ClusterName=mpisdnn
SlurmctldHost=$CTLD_HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
# Root runs the daemons and may run jobs (CI containers have no other user).
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$SLURMD_LOG
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups (containers rarely delegate them) and no accounting daemon.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Like most sites: plain srun starts independent processes; MPI needs --mpi=pmi2/pmix.
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$MEM_PER_CPU
ReturnToService=2
SlurmdTimeout=120
InactiveLimit=0
KillWait=5
# sbatch --wait polls after 2, 8, 32, 32... s unless MinJobAge/2 <= 2: then every 2 s, which
# turns a 10 s test job from a 42 s wait into a 12 s one. 4 s still leaves sbatch time to see
# a finished job before slurmctld forgets it.
MinJobAge=4
# A fresh cluster numbers its jobs from 1 again, and MPICH names an srun (PMI-2) job's
# shared-memory segment after the job: a segment left in /dev/shm by a killed job of an
# earlier cluster then fails the new job's MPI_Init ("MPIDI_POSIX_comm_bootstrap: Out of
# memory"). Start each cluster's numbering somewhere random.
FirstJobId=$FIRST_JOB
$NODE_LINES
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$STATE/env" <<EOF
export SLURM_CONF=$CONF
EOF

# --- daemons ----------------------------------------------------------------------------------
say "starting slurmctld and $NODES slurmd (node $NODE: $CPUS CPUs, $MEM MB; ports from $PORT)"
slurmctld -f "$CONF" || die "slurmctld did not start (see $STATE/slurmctld.log)"
if [ "$NODES" -gt 1 ]; then
  command -v unshare >/dev/null || die "virtual nodes need unshare (util-linux)"
  for k in $(seq 0 $((NODES - 1))); do
    # A private UTS and mount namespace per node: its hostname and its /etc/hosts; slurmd
    # and the jobs it starts stay inside. Propagation is private: nothing leaks to the host.
    unshare --uts --mount --propagation private sh -c \
      "hostname vnode$k && mount --bind '$STATE/hosts' /etc/hosts && exec slurmd -f '$CONF' -N vnode$k" \
      || die "slurmd vnode$k did not start (see $STATE/slurmd-vnode$k.log)"
  done
else
  slurmd -f "$CONF" -N "$NODE" || die "slurmd did not start (see $STATE/slurmd.log)"
fi

deadline=$((SECONDS + TIMEOUT))
idle=0
while [ "$SECONDS" -lt "$deadline" ]; do
  idle="$(sinfo -h -N -t idle -o '%N' 2>/dev/null | wc -l)"
  [ "$idle" -eq "$NODES" ] && break
  for n in $(sinfo -h -N -t down,drain,unk -o '%N' 2>/dev/null); do
    scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
  done
  sleep 0.5
done
if [ "$idle" -ne "$NODES" ]; then
  tail -n 20 "$STATE"/slurmctld.log "$STATE"/slurmd*.log >&2 || true
  die "$idle of $NODES node(s) idle after ${TIMEOUT}s: $(sinfo -h -N -o '%N %t' 2>/dev/null | tr '\n' ' ')"
fi
say "cluster up in ${SECONDS}s: $(sinfo -h -o '%P %D %t %c CPUs %m MB')"
say "use it with: source $STATE/env"
