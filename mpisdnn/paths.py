"""Checks on the files a command reads and writes, done before any work starts.

Four promises of the command line rest on this module (docs/reliability.md):

- no command overwrites one of its own inputs: every output is compared with every input (and
  with every other output) by resolved path and by inode, so a symbolic or hard link to the
  input is caught as well as the same name, and an output named like a layer file inside an
  input network directory is refused (it would overwrite or add a layer);
- an output that cannot be written fails at once with one line, not after an hour of work:
  the path is not a directory, and the directory it lands in exists (or can be created) and
  is writable;
- an output is never written into a checkpoint directory (``--checkpoint``/``--resume``, or
  any directory that holds checkpoints): it would damage the checkpoints;
- an output that is not a regular file (``/dev/null``, a FIFO, ``/dev/stdout``) is never
  replaced: text outputs are written through it, the others are refused
  (:func:`check_stream`; the writers keep the same rule, :mod:`mpisdnn.formats._atomic`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import InputError, UsageError

__all__ = [
    "same_file",
    "is_layer_of",
    "check_distinct",
    "check_writable",
    "check_paths",
    "check_stream",
    "checkpoint_dir_of",
    "CommandPaths",
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
    _check_link(flag, path, directory)
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


def _check_link(flag: str, path: str, directory: bool) -> None:
    """Refuse a symbolic link that leads nowhere: a loop (nothing can be written through
    it), or, for a directory output, a dangling link (was ``FileExistsError`` from
    ``makedirs``)."""
    import errno

    if not os.path.islink(path):
        return
    try:
        os.stat(path)
        return
    except OSError as exc:
        loop = exc.errno == errno.ELOOP
    if loop or directory:
        what = "a loop of symbolic links" if loop else "a symbolic link to nothing"
        raise UsageError(f"{flag} {path}: {what}; give a directory" if directory else
                         f"{flag} {path}: {what}; give a file name")


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


#: Files in a checkpoint directory (:mod:`mpisdnn.sdnn.checkpoint_identity`).
RUN_FILE = "RUN.json"
LOCK_FILE = "LOCK"


def _holds_checkpoints(directory: str) -> bool:
    """Whether ``directory`` is a checkpoint directory: it has ``RUN.json``, ``LOCK`` beside a
    ``ckpt-NNNNNN`` directory, or a ``ckpt-NNNNNN/manifest.json``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    if RUN_FILE in names and _is_run_record(os.path.join(directory, RUN_FILE)):
        return True
    ckpts = [n for n in names if n.startswith("ckpt-") and n[5:].isdigit()]
    if ckpts and LOCK_FILE in names:
        return True
    return any(os.path.isfile(os.path.join(directory, n, "manifest.json")) for n in ckpts)


def _is_run_record(path) -> bool:
    """Whether ``path`` is a checkpoint directory's ``RUN.json`` (a run's identity), not
    some other file of that name."""
    import json

    try:
        if not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
            return False
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"network", "inputs", "options"} <= set(data)


def checkpoint_dir_of(path, known=()) -> str | None:
    """The checkpoint directory ``path`` lies in (or is), or None.

    ``known`` names checkpoint directories of this command (``--checkpoint DIR`` before it
    exists); the others are found by their contents (:func:`_holds_checkpoints`) on the way
    from ``path`` up to the root.
    """
    here = os.path.realpath(os.fspath(path))
    marked = {os.path.realpath(os.fspath(k)) for k in known if k}
    current = here
    while True:
        if current in marked or (current != here and _holds_checkpoints(current)):
            return current
        up = os.path.dirname(current)
        if up == current:
            return None
        current = up


def check_not_in_checkpoint(flag: str, path, known=()) -> None:
    """Refuse an output inside a checkpoint directory (it would damage a checkpoint, or be
    taken for one), before any work."""
    ck = checkpoint_dir_of(path, known)
    if ck is not None:
        raise UsageError(
            f"{flag} {path}: inside the checkpoint directory {ck}; an output there would "
            "damage its checkpoints: give a path outside it"
        )


#: Outputs written once from the start as text: written through a FIFO, a device or
#: ``/dev/stdout`` (the others are HDF5, parts renamed into place, or directories).
THROUGH_OUTPUTS = ("--report", "--categories-out", "--tsv", "--truth-tsv", "--table")


def check_stream(flag: str, path) -> None:
    """Refuse an output that is not a regular file when ``flag`` cannot write through it
    (:data:`THROUGH_OUTPUTS` can: a text output to ``/dev/stdout`` or a FIFO)."""
    from .formats._atomic import _a, stream_kind

    kind = stream_kind(path)
    if kind is not None and flag not in THROUGH_OUTPUTS:
        raise UsageError(
            f"{flag} {path}: not a regular file ({_a(kind)}); {flag} is written to a temporary "
            "file and renamed, which would replace it: give a file name"
        )


def check_paths(inputs: dict, outputs: dict, directories: dict | None = None) -> None:
    """:func:`check_distinct` and :func:`check_writable` for every output.

    ``directories`` are outputs that are directories (flag to path); they take part in the
    identity check like the other outputs.
    """
    for flag, path in _present(outputs):
        check_stream(flag, path)
        if os.path.isdir(path) or not _is_stream(path):
            check_writable(flag, path)
    for flag, path in _present(directories):
        check_writable(flag, path, directory=True)
    check_distinct(inputs, {**(outputs or {}), **(directories or {})})


def _path_or_none(where: str, path) -> str | None:
    """``path`` as a string, ``None`` for a path not given (``None`` or empty)."""
    if path is None or path == "":
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{where} must be a path, got {type(path).__name__}")
    return os.fspath(path)


def _named_paths(field: str, named) -> Mapping:
    """``named`` (flag to path) as a read-only mapping of the paths given: a flag not given
    (``None`` or an empty path) names nothing."""
    if not isinstance(named, Mapping):
        raise InputError(
            f"CommandPaths.{field} must map flags to paths, got {type(named).__name__}"
        )
    kept = {}
    for flag, path in named.items():
        if not isinstance(flag, str) or not flag:
            raise InputError(f"CommandPaths.{field}: every flag must be a non-empty string")
        path = _path_or_none(f"CommandPaths.{field}[{flag}]", path)
        if path is not None:
            kept[flag] = path
    return MappingProxyType(kept)


@dataclass(frozen=True)
class CommandPaths:
    """What one command reads and writes, each path under the flag that named it (the flag is
    what a refusal prints). The command line builds it from its parsed flags
    (``mpisdnn.commands._common.command_paths``); :func:`prepare_outputs` checks it.

    Attributes
    ----------
    inputs : mapping of str to str
        Files and directories the command reads: ``{"--network": "net.h5", ...}``.
    outputs : mapping of str to str
        Files it writes (``-o``, ``--report``, ...).
    directories : mapping of str to str
        Directories it writes into (``--tsv-dir``), the checkpoint directory apart.
    hdf5 : tuple of str
        The output flags whose file is always HDF5 (a network, inputs, activations): a name
        that says another format (``.tsv``, ``.tsv.gz``, ``.csv``, ...) is refused.
    checkpoint : str, optional
        The ``--checkpoint`` directory it writes (it may not exist yet): no other output
        may land inside it.
    resume : str, optional
        The ``--resume`` directory it reads: no output may land inside it, nor overwrite
        the files its run reads.

    Paths given as ``None`` or empty are dropped (a flag not given names nothing); the
    mappings are read-only copies.
    """

    inputs: Mapping = field(default_factory=dict)
    outputs: Mapping = field(default_factory=dict)
    directories: Mapping = field(default_factory=dict)
    checkpoint: str | None = None
    resume: str | None = None
    hdf5: tuple = ()

    def __post_init__(self):
        # frozen: the checked forms are stored once, here (the dataclass idiom for that)
        for name in ("inputs", "outputs", "directories"):
            object.__setattr__(self, name, _named_paths(name, getattr(self, name)))
        for name in ("checkpoint", "resume"):
            value = _path_or_none(f"CommandPaths.{name}", getattr(self, name))
            object.__setattr__(self, name, value)

    def written_directories(self) -> dict:
        """Every directory it writes into, flag to path: :attr:`directories`, then the
        checkpoint directory under ``--checkpoint``."""
        found = dict(self.directories)
        if self.checkpoint is not None:
            found["--checkpoint"] = self.checkpoint
        return found


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


def _is_stream(path) -> bool:
    from .formats._atomic import stream_kind

    return stream_kind(path) is not None


def _recorded_inputs(directory) -> dict:
    """The files a checkpoint directory's run reads (``--resume DIR`` names them only there):
    ``{"--network (of DIR)": path, ...}``."""
    import json

    found = {}
    candidates = [os.path.join(directory, RUN_FILE)]
    try:
        ckpts = sorted(n for n in os.listdir(directory) if n.startswith("ckpt-"))
    except OSError:
        ckpts = []
    candidates += [os.path.join(directory, n, "manifest.json") for n in ckpts]
    for path in candidates:
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        ident = data.get("identity", data) if isinstance(data, dict) else {}
        for key in ("network", "inputs", "truth"):
            rec = ident.get(key) if isinstance(ident, dict) else None
            if isinstance(rec, dict) and isinstance(rec.get("path"), str):
                found.setdefault(f"--{key} (of --resume {directory})", rec["path"])
    return found


def check_checkpoint_outputs(paths: CommandPaths) -> dict:
    """Refuse outputs inside a checkpoint directory; returns the inputs a ``--resume``
    directory's run reads (outputs must not overwrite those either)."""
    known = [paths.checkpoint, paths.resume]
    # the checkpoint directory itself is the one output that belongs there
    for flag, path in _present({**paths.outputs, **paths.directories}):
        check_not_in_checkpoint(flag, path, known)
    resume = paths.resume
    return _recorded_inputs(resume) if resume and os.path.isdir(resume) else {}


#: Output flags whose file is always text (a TSV, or the ``.tar.gz`` of TSVs) wherever
#: they are given.
TEXT_OUTPUTS = ("--tsv", "--truth-tsv", "--categories-out", "--archive")


def check_output_names(paths: CommandPaths) -> None:
    """Refuse an output whose name says another format than the one written: an HDF5-only
    output named ``.tsv``/``.csv``/``.gz``... (``generate inputs -o sparse-images-1024.tsv``
    wrote an HDF5 file under that name without a word), or a text output named ``.h5``
    (``--categories-out c.h5`` wrote a TSV)."""
    from .formats.names import format_of_name, names_another_format

    for flag in paths.hdf5:
        path = paths.outputs.get(flag)
        if path is not None and names_another_format(path):
            raise UsageError(
                f"{flag} {path}: this file is written as HDF5 but its name says another "
                "format: end it in .h5 (the text forms have flags of their own: see --help)"
            )
    for flag in TEXT_OUTPUTS:
        path = paths.outputs.get(flag)
        if path is not None and format_of_name(path, ("h5",)) is not None:
            what, name = (("a .tar.gz of TSV layers", ".tar.gz") if flag == "--archive"
                          else ("text (TSV)", ".tsv"))  # fmt: skip
            raise UsageError(
                f"{flag} {path}: this file is written as {what} but its name says HDF5: "
                f"end it in {name}"
            )


def prepare_outputs(comm, paths: CommandPaths) -> list:
    """Before a command works: check its paths, then remove what crashed runs left behind.

    Rank 0 checks (:func:`check_paths` on ``paths``); a failure is one line from rank 0 and
    exit code 2 on every rank. Only leftovers that provably belong to a dead run are removed
    (:func:`mpisdnn.leftovers.remove_stale` with its one-day age rule).

    Parameters
    ----------
    comm : MPI communicator
    paths : CommandPaths
        What the command reads and writes (the command line builds it from its flags).

    Returns
    -------
    list of str
        The leftover files removed (on every rank).
    """
    from .leftovers import AUTO_MIN_AGE, remove_stale
    from .parallel import agree_root

    if not isinstance(paths, CommandPaths):
        raise InputError(f"paths must be a CommandPaths, got {type(paths).__name__}")

    def work():
        check_regular({f: p for f, p in paths.inputs.items() if f in REGULAR_CHECKED})
        recorded = check_checkpoint_outputs(paths)
        check_paths({**paths.inputs, **recorded}, paths.outputs, paths.written_directories())
        check_output_names(paths)  # after the checks that guard a user's files
        removed = []
        for _flag, path in _present(paths.outputs):
            if not _is_stream(path):
                removed += remove_stale(path, min_age=AUTO_MIN_AGE)
        return removed

    return agree_root(comm, work)
