"""Checks on the files a command reads and writes, done before any work starts.

Two promises of the command line rest on this module (docs/reliability.md):

- no command overwrites one of its own inputs: every output is compared with every input (and
  with every other output) by resolved path and by inode, so a symbolic or hard link to the
  input is caught as well as the same name, and an output named like a layer file inside an
  input network directory is refused (it would overwrite or add a layer);
- an output that cannot be written fails at once with one line, not after an hour of work:
  the path is not a directory, and the directory it lands in exists (or can be created) and
  is writable.
"""

from __future__ import annotations

import os

from .errors import InputError, UsageError

__all__ = [
    "same_file",
    "is_layer_of",
    "check_distinct",
    "check_writable",
    "check_paths",
    "command_paths",
    "prepare_outputs",
]


def _present(named: dict | None) -> list[tuple[str, str]]:
    return [(flag, os.fspath(path)) for flag, path in (named or {}).items() if path]


def same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name one file: same inode, or same resolved path.

    The resolved-path test also covers an output that does not exist yet but would be created
    through a symbolic link to an input's location.
    """
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:  # one of them does not exist (yet)
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def is_layer_of(out, src) -> bool:
    """Whether output ``out`` would be a layer file ``n{N}-l{k}.tsv`` of input directory ``src``.

    An input network directory is read as all its layer files, so such an output would
    overwrite one of them, or add a layer that the next read picks up.
    """
    if not os.path.isdir(src):
        return False
    from .formats.tsv import is_layer_file

    same_dir = os.path.realpath(os.path.dirname(os.path.abspath(out))) == os.path.realpath(src)
    return same_dir and is_layer_file(os.path.basename(out))


def check_distinct(inputs: dict, outputs: dict) -> None:
    """Refuse an output that is one of the inputs or another output.

    Parameters
    ----------
    inputs, outputs : dict
        Flag (as the user typed it, e.g. ``"--inputs"``) to path; ``None`` paths are skipped.

    Raises
    ------
    UsageError
        Naming both flags and paths.
    """
    ins, outs = _present(inputs), _present(outputs)
    for out_flag, out in outs:
        for in_flag, src in ins:
            if same_file(out, src):
                raise UsageError(
                    f"{out_flag} {out} is the same file as {in_flag} {src}: "
                    "the output would overwrite the input"
                )
            if is_layer_of(out, src):
                raise UsageError(
                    f"{out_flag} {out} is a layer file of {in_flag} {src}: "
                    "the output would overwrite or add a layer of the input network"
                )
    for k, (flag_a, a) in enumerate(outs):
        for flag_b, b in outs[k + 1 :]:
            if same_file(a, b):
                raise UsageError(f"{flag_a} {a} and {flag_b} {b} name the same output file")


def check_writable(flag: str, path, *, directory: bool = False) -> None:
    """Refuse an output path that cannot be written, before any work is done.

    Parameters
    ----------
    flag : str
        The option that named the path (for the message).
    path : path-like
        The output. Its directory may be missing if it can be created.
    directory : bool
        The output is a directory (``--tsv-dir``) rather than a file.

    Raises
    ------
    UsageError
        The path is a directory where a file is expected (or the reverse), a parent is a
        file, or the directory it would be created in is not writable.
    """
    path = os.fspath(path)
    if os.path.isdir(path) and not directory:
        raise UsageError(f"{flag} {path}: is a directory (give a file name)")
    if os.path.exists(path) and directory and not os.path.isdir(path):
        raise UsageError(f"{flag} {path}: exists and is not a directory")
    if directory and os.path.isdir(path):
        parent = path
    else:
        parent = os.path.dirname(os.path.abspath(path))
    # The nearest existing ancestor decides: missing directories below it are created later.
    while not os.path.exists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: directory {parent} is not writable")
    _check_name_length(flag, path, parent)


def _check_name_length(flag: str, path: str, parent: str) -> None:
    """Refuse a name that fits alone but not once the writer's temporary name extends it
    (host, PID and token): found only at the end of the run otherwise."""
    from .formats._atomic import temp_name

    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):  # pragma: no cover - not POSIX
        name_max = 255
    longest = len(os.path.basename(temp_name(path, "tmpdir")))
    if longest > name_max:
        raise UsageError(
            f"{flag} {path}: file name too long (with its temporary suffix it would have "
            f"{longest} characters, the file system allows {name_max})"
        )


def check_paths(inputs: dict, outputs: dict, directories: dict | None = None) -> None:
    """:func:`check_distinct` and :func:`check_writable` for every output.

    ``directories`` are outputs that are directories (flag to path); they take part in the
    identity check like the other outputs.
    """
    for flag, path in _present(outputs):
        check_writable(flag, path)
    for flag, path in _present(directories):
        check_writable(flag, path, directory=True)
    check_distinct(inputs, {**(outputs or {}), **(directories or {})})


#: Argument names (``argparse`` dests) that name files a command reads, with the flag to print.
INPUT_ARGS = {
    "network": "--network",
    "inputs": "--inputs",
    "truth": "--truth",
    "source": "SOURCE",
    "input": "INPUT",
}
#: Argument names that name files a command writes.
OUTPUT_ARGS = {
    "output": "-o",
    "report": "--report",
    "categories_out": "--categories-out",
    "output_y": "--output-y",
    "tsv": "--tsv",
    "truth_tsv": "--truth-tsv",
    "table": "--table",
}
#: Argument names that name directories a command writes into.
DIRECTORY_ARGS = {"tsv_dir": "--tsv-dir", "checkpoint": "--checkpoint"}


#: Input flags whose files (or a network directory's layer files) must be regular files:
#: reading a FIFO blocks until a writer comes, a device may never end. (``--inputs`` and
#: ``--truth`` are checked by their readers in ``formats/tsv.py``.)
REGULAR_CHECKED = ("--network", "SOURCE", "INPUT")


def check_regular(inputs: dict) -> None:
    """Refuse an input that is neither a regular file nor a directory, and a directory's
    ``n{N}-l{k}.tsv`` layer files that are not regular files (a FIFO would hang the run).

    Raises
    ------
    InputError
        One line naming the flag and the path.
    """
    import stat

    from .formats.tsv import is_layer_file

    def kind(path):
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return None  # missing or unreadable: the reader says which
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            return "ok"
        return "FIFO" if stat.S_ISFIFO(mode) else "socket or device"

    for flag, path in _present(inputs):
        what = kind(path)
        if what not in (None, "ok"):
            raise InputError(
                f"{flag} {path}: not a regular file (a {what}; reading it could block)"
            )
        if what == "ok" and os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if is_layer_file(name) and kind(full) not in (None, "ok"):
                    raise InputError(
                        f"{full}: layer file of {flag} {path} is not a regular file "
                        f"(a {kind(full)}; reading it could block)"
                    )


def command_paths(args) -> tuple[dict, dict, dict]:
    """The inputs, file outputs and directory outputs a parsed command line names.

    Every sub-command uses the argument names above for the same role, so one table serves
    them all (a flag added later under one of these names is checked without more code).
    """

    def pick(table):
        return {
            flag: getattr(args, name) for name, flag in table.items() if getattr(args, name, None)
        }

    return pick(INPUT_ARGS), pick(OUTPUT_ARGS), pick(DIRECTORY_ARGS)


def prepare_outputs(comm, args) -> list:
    """Before a command works: check its paths, then remove what crashed runs left behind.

    Rank 0 checks (:func:`check_paths` on :func:`command_paths`); a failure is one line from
    rank 0 and exit code 2 on every rank. Only leftovers that provably belong to a dead run
    are removed (:func:`mpisdnn.leftovers.remove_stale` with its one-day age rule).

    Returns
    -------
    list of str
        The leftover files removed (on every rank).
    """
    from .leftovers import AUTO_MIN_AGE, remove_stale
    from .parallel import agree_root

    inputs, outputs, directories = command_paths(args)

    def work():
        check_regular({f: p for f, p in inputs.items() if f in REGULAR_CHECKED})
        check_paths(inputs, outputs, directories)
        removed = []
        for _flag, path in _present(outputs):
            removed += remove_stale(path, min_age=AUTO_MIN_AGE)
        return removed

    return agree_root(comm, work)
