#!/usr/bin/env bash
# hydra's "ssh" for a virtual cluster on one machine: starts the proxy of virtual node HOST
# as a local process in its own UTS namespace, so hostname(), MPI_Get_processor_name and
# MPI_Comm_split_type(COMM_TYPE_SHARED) see HOST, and, when VCLUSTER_TMP is set, with its
# own /tmp (VCLUSTER_TMP/HOST bind-mounted in a private mount namespace).
#
#   mpiexec -launcher ssh -launcher-exec tests/vcluster/node.sh -hosts vnode0:2,vnode1:2 CMD
#
# hydra calls it like ssh: `node.sh [-x] HOST "PROXY" ARGS...`, the words quoted for a remote
# shell, which is why the command is run through `sh -c`. Needs root (unshare) and Linux.
# Nothing leaves the namespaces: mounts are private (unshare's default propagation) and the
# real hostname is untouched; they vanish with the proxy.
set -euo pipefail
[ "${1:-}" = "-x" ] && shift
host="$1"
shift
case "$host" in
  *[!A-Za-z0-9.-]* | "") echo "vcluster: bad host name '$host'" >&2; exit 2 ;;
esac
# sh -c sees the proxy command as one string, exactly as a remote shell would.
inner="hostname $host"
ns=(--uts)
if [ -n "${VCLUSTER_TMP:-}" ]; then
  mkdir -p "$VCLUSTER_TMP/$host"
  chmod 1777 "$VCLUSTER_TMP/$host"
  ns+=(--mount --propagation private)
  inner="$inner && mount --bind '$VCLUSTER_TMP/$host' /tmp"
fi
exec unshare "${ns[@]}" sh -c "$inner && exec $*"
