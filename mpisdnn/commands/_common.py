"""Argument helpers shared by the sub-commands."""

from __future__ import annotations

import argparse
import math


def _typed(text: str, convert, accept, expected: str, unparsable: str | None = None):
    """``convert(text)`` when it parses and ``accept`` takes it, else argparse's one-line error
    ("expected EXPECTED, got 'TEXT'"; ``unparsable`` replaces EXPECTED when it does not parse)."""
    try:
        value = convert(text)
    except ValueError:
        wanted = unparsable or expected
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    if not accept(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _typed(text, int, lambda v: v >= 1, "a positive integer")


def nonneg_int(text: str) -> int:
    return _typed(text, int, lambda v: v >= 0, "an integer >= 0")


def finite_float(text: str) -> float:
    return _typed(text, float, math.isfinite, "a finite number", unparsable="a number")


def nonneg_float(text: str) -> float:
    return _typed(text, finite_float, lambda v: v >= 0, "a number >= 0")


def add_choice(parser, flag: str, choices: tuple, **kwargs) -> None:
    """Add the option ``flag`` taking one of ``choices``; its default is the first choice."""
    parser.add_argument(flag, choices=choices, default=choices[0], **kwargs)


#: Seconds between progress lines when ``--progress`` is not given (every command that has it).
DEFAULT_PROGRESS = 10.0


def add_progress(parser, what: str = "progress line") -> None:
    """``--progress SECONDS`` and ``--quiet`` (no progress lines), the same in every command
    that prints progress lines; :func:`resolve_args` turns them into ``args.progress``."""
    parser.add_argument(
        "--progress",
        type=nonneg_float,
        default=None,
        metavar="SECONDS",
        help=f"{what} interval on rank 0 (default {DEFAULT_PROGRESS:g} s; 0 = off)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines (--progress 0)")
    add_needs(parser, PROGRESS_NEEDS)


def add_needs(parser, rules) -> None:
    """Declare ``rules`` (:class:`~mpisdnn.sdnn.options.Needs` over the parsed arguments) of
    a command: :func:`resolve_args` refuses a flag given where it has no effect."""
    parser.set_defaults(_needs=(*(parser.get_default("_needs") or ()), *rules))


def resolve_args(args) -> None:
    """Refuse the command-line flags ``args`` gives where they have no effect (one
    :class:`~mpisdnn.errors.UsageError` line) and fill the defaults that depend on other
    flags (``--progress``). Called once by :func:`mpisdnn.cli.main`, before the command."""
    from ..errors import UsageError

    # judged here, on the parsed flags themselves (the library judges its own rules on the
    # objects the flags become: InferOptions, InferPlan): no argparse namespace leaves the
    # command line
    for rule in getattr(args, "_needs", ()):
        if rule.given(getattr(args, rule.field)) and not rule.effective(args):
            raise UsageError(rule.message())
    if hasattr(args, "quiet") and hasattr(args, "progress") and args.progress is None:
        args.progress = 0.0 if args.quiet else DEFAULT_PROGRESS


def _needs(*args, **kwargs):
    from ..sdnn.options import Needs

    return Needs(*args, **kwargs)


PROGRESS_NEEDS = (
    _needs("--progress", "progress", "no --quiet", lambda a: not a.quiet,
           example=("--progress", "5"), without=("--quiet",)),
)  # fmt: skip


#: Argument names (``argparse`` dests) that name files a command reads, with the flag to print.
#: Every sub-command uses these names for the same role, so one table serves them all (a flag
#: added later under one of these names is checked without more code).
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
    "archive": "--archive",
}
#: Argument names that name directories a command writes into (``--checkpoint`` apart: the
#: :class:`~mpisdnn.paths.CommandPaths` knows it as the checkpoint directory).
DIRECTORY_ARGS = {"tsv_dir": "--tsv-dir"}


def command_paths(args, hdf5=()):
    """The :class:`~mpisdnn.paths.CommandPaths` a parsed command line names: what the command
    reads and writes, by flag, with its ``--checkpoint`` and ``--resume`` directories;
    ``hdf5``: the output flags whose file is always HDF5 (``--output-y`` is, wherever it
    is given)."""
    from ..paths import CommandPaths

    def pick(table):
        return {
            flag: getattr(args, name) for name, flag in table.items() if getattr(args, name, None)
        }

    return CommandPaths(
        inputs=pick(INPUT_ARGS),
        outputs=pick(OUTPUT_ARGS),
        directories=pick(DIRECTORY_ARGS),
        checkpoint=getattr(args, "checkpoint", None),
        resume=getattr(args, "resume", None),
        hdf5=(*hdf5, "--output-y"),
    )
