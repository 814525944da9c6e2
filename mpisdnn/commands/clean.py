"""``mpisdnn clean``: list, and with ``--yes`` remove, temporary files of crashed runs."""

from __future__ import annotations

from ..parallel import AgreedError, bcast, gather, log, phase
from ._common import nonneg_float

DESCRIPTION = (
    "List the temporary files that killed runs writing OUTPUT left behind "
    "(.OUTPUT.tmp-*, .OUTPUT.tmpdir-* of --tsv-dir, OUTPUT.parts/ parts the index does not "
    "list, text projection parts; for a directory, also those of every output in it) "
    "and say which are stale. A file is stale when the process named in its name ran on "
    "this host and is gone, or, naming no live process, when it has not been modified "
    "for --min-age seconds. With --yes the stale ones are removed; nothing else is."
)


def add_arguments(p) -> None:
    from ..leftovers import DEFAULT_MIN_AGE

    p.add_argument("outputs", nargs="+", metavar="OUTPUT", help="output file(s) of earlier runs")
    p.add_argument("--yes", action="store_true", help="remove the stale leftovers")
    p.add_argument(
        "--min-age",
        type=nonneg_float,
        default=DEFAULT_MIN_AGE,
        metavar="SECONDS",
        help=f"age that makes an ownerless leftover stale (default {DEFAULT_MIN_AGE:.0f}; "
        "0 when you know no run is writing these outputs)",
    )
    p.set_defaults(run=run)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)  # not reached


@phase("setup")
def run(args, comm) -> int:
    import os

    from ..leftovers import find_leftovers, find_leftovers_in, remove_stale

    def work():
        lines, removed, stale_bytes, stale_count = [], 0, 0, 0
        for output in args.outputs:
            items = find_leftovers(output, args.min_age)
            if os.path.isdir(output) and not os.path.islink(output):
                # DIR: the leftovers of the outputs written into it, too
                items += find_leftovers_in(output, args.min_age)
            if not items:
                lines.append(f"{output}: no leftovers")
                continue
            for item in items:
                state = "stale" if item.stale else "kept"
                lines.append(f"{item.path}  {_size(item.size)}  {state}: {item.reason}")
                if item.stale:
                    stale_count += 1
                    stale_bytes += item.size
            if args.yes:
                removed += len(remove_stale(output, args.min_age))
        if args.yes:
            lines.append(f"removed {removed} file(s), {_size(stale_bytes)}")
        elif stale_count:
            lines.append(
                f"{stale_count} stale file(s), {_size(stale_bytes)}: run again with --yes "
                "to remove them"
            )
        return "\n".join(lines)

    # Leftovers sit where their writer ran (a node's own /tmp or scratch is seen only there)
    # and only a process on the owner's host can prove its PID dead: one rank per node looks.
    found = gather(comm, _on_node_leader(comm, work))
    failure = None
    if comm.rank == 0:
        found = [item for item in found if item is not None]
        failure = next((item[2] for item in found if item[2] is not None), None)
    failure = bcast(comm, failure)
    if failure is not None:
        raise AgreedError(*failure)
    if comm.rank == 0:
        if len(found) == 1:
            log(comm, found[0][1])
        for host, text, _ in found if len(found) > 1 else ():
            log(comm, "\n".join(f"[{host}] {line}" for line in text.splitlines()))
    return 0


def _on_node_leader(comm, work):
    """``(host, text, failure)`` of ``work()`` on the first rank of each node, else None."""
    import socket

    from ..errors import MpisdnnError
    from ..system import node_comm

    node = node_comm(comm)
    leader = node.rank == 0
    node.Free()
    if not leader:
        return None
    host = socket.gethostname()
    try:
        return host, work(), None
    except MpisdnnError as exc:
        return host, "", (str(exc), getattr(exc, "exit_code", 2))
    except (OSError, ValueError) as exc:
        from ..parallel import failure_text

        return host, "", (failure_text(exc), 2)
