#!/usr/bin/env bash
# hydra's "ssh" for a virtual cluster on one machine: starts the proxy of virtual node HOST
# as a local process in its own UTS and mount namespaces, so hostname(), MPI_Get_processor_name
# and MPI_Comm_split_type(COMM_TYPE_SHARED) see HOST, and, when VCLUSTER_TMP is set, with its
# own /tmp (VCLUSTER_TMP/HOST bind-mounted in the private mount namespace).
#
#   mpiexec -launcher ssh -launcher-exec tests/vcluster/node.sh -hosts vnode0:2,vnode1:2 CMD
#
# hydra calls it like ssh: `node.sh [-x] HOST "PROXY" ARGS...`, the words quoted for a remote
# shell, which is why the command is run through `sh -c`. Needs root (unshare) and Linux.
# Nothing leaves the namespaces: mounts are private and the real hostname is untouched; they
# vanish with the proxy.
#
# VCLUSTER_KEEP: paths under /tmp the job needs (the venv, the repository: a clone under /tmp)
# stay visible through the private /tmp: each one's top directory under /tmp is bind-mounted
# into it before the swap (an empty directory of that name is left in VCLUSTER_TMP/HOST).
# VCLUSTER_HOSTS_MASKED=1: mpiexec runs with an /etc/hosts that maps the vnode names to
# addresses of no local interface (tests/vcluster/__init__.py), so that hydra starts every
# proxy through this script; the proxy gets the machine's own /etc/hosts back here.
set -euo pipefail
[ "${1:-}" = "-x" ] && shift
host="$1"
shift
case "$host" in
  *[!A-Za-z0-9.-]* | "") echo "vcluster: bad host name '$host'" >&2; exit 2 ;;
esac
# sh -c sees the proxy command as one string, exactly as a remote shell would.
inner="hostname $host"
if [ "${VCLUSTER_HOSTS_MASKED:-}" = 1 ]; then
  inner="$inner && umount /etc/hosts"
fi
if [ -n "${VCLUSTER_TMP:-}" ]; then
  node_tmp="$VCLUSTER_TMP/$host"
  mkdir -p "$node_tmp"
  chmod 1777 "$node_tmp"
  # The host's /tmp stays reachable at a mount point outside /tmp for the kept paths.
  seen=""
  keeps=""
  IFS=: read -r -a kept <<<"${VCLUSTER_KEEP:-}"
  for path in "${kept[@]}"; do
    case "$path" in /tmp/?*) ;; *) continue ;; esac
    top="${path#/tmp/}"
    top="${top%%/*}"
    case " $seen " in *" $top "*) continue ;; esac
    case "$top" in *[!A-Za-z0-9._-]*) continue ;; esac
    seen="$seen $top"
    mkdir -p "$node_tmp/$top"
    keeps="$keeps && mount --bind '/tmp/$top' '$node_tmp/$top'"
  done
  inner="$inner$keeps && mount --rbind '$node_tmp' /tmp"
fi
exec unshare --uts --mount --propagation private sh -c "$inner && exec $*"
