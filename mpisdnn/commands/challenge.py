"""``mpisdnn challenge DATA_DIR``: the Graph Challenge table in one command.

Runs every configuration N x L (default the official 12) with the job's ranks: the official
files where ``DATA_DIR`` has them (archives or unpacked), generated ones where not, each
network converted once into a cache, each result checked against the official truth or the
independent reference, resumed after an interruption. The library part is
:mod:`mpisdnn.sdnn.challenge`; the table :mod:`mpisdnn.reporting.challenge`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from ..parallel import agree, agree_root, log, phase
from ._common import add_progress, nonneg_int, positive_int

DESCRIPTION = (
    "Run the Graph Challenge configurations N x L from the official files in DATA_DIR "
    "(neuron{N}.tar.gz or neuron{N}/, sparse-images-{N}.tsv[.gz], neuron{N}-l{L}-"
    "categories.tsv; what is missing is generated), check each one, and write the table "
    "with the published rates beside each row. Finished configurations are skipped."
)


def add_arguments(p) -> None:
    from .infer import _backend_arguments

    p.add_argument("data_dir", metavar="DATA_DIR", help="folder with the official files")
    p.add_argument("--neurons", type=positive_int, nargs="+", metavar="N",
                   help="N values (default 1024 4096 16384 65536)")  # fmt: skip
    p.add_argument("--layers", type=positive_int, nargs="+", metavar="L",
                   help="L values (default 120 480 1920)")  # fmt: skip
    p.add_argument("--out", default="challenge", metavar="DIR",
                   help="results: runs/N{N}-L{L}.json, challenge.md/.json/.png "
                   "(default ./challenge)")  # fmt: skip
    p.add_argument("--cache", metavar="DIR",
                   help="converted and generated files (default OUT/cache)")  # fmt: skip
    p.add_argument("--count", dest="inputs", type=positive_int, default=60000, metavar="COUNT",
                   help="inputs to generate where the official ones are missing "
                   "(default 60000)")  # fmt: skip
    p.add_argument("--seed", type=nonneg_int, default=1, help="of generated networks and inputs")
    p.add_argument("--check-rows", type=positive_int, default=32, metavar="K",
                   help="rows the reference checks when not every row (default 32)")  # fmt: skip
    p.add_argument("--full-check-edges", type=float, default=3e11, metavar="X",
                   help="check every row when inputs x edges <= X (default 3e11)")  # fmt: skip
    p.add_argument("--rerun", action="store_true", help="run finished configurations again")
    add_progress(p)
    _backend_arguments(p)
    p.set_defaults(run=run)


def options_from_args(args, comm):
    """The validated :class:`~mpisdnn.sdnn.challenge.ChallengeOptions` of the flags."""
    from ..sdnn.challenge import OFFICIAL_LAYERS, OFFICIAL_NEURONS, ChallengeOptions
    from .infer import options_from_args as infer_options

    infer = infer_options(args)  # the same flags as infer's, read the same way
    return ChallengeOptions(
        data_dir=args.data_dir,
        neurons=tuple(args.neurons or OFFICIAL_NEURONS),
        layers=tuple(args.layers or OFFICIAL_LAYERS),  # each once, in order: ChallengeOptions
        out=args.out,
        cache=args.cache,
        inputs=args.inputs,
        seed=args.seed,
        check_rows=args.check_rows,
        full_check_edges=args.full_check_edges,
        rerun=args.rerun,
        infer=infer,
        progress=args.progress,
    )


def convert_network(comm, source, output, progress=None) -> None:
    """An official network (archive or directory) -> v2 file with all its layers, by the
    ``convert network`` command (collective; its own checks, and progress lines every
    ``progress`` seconds: challenge's own ``--progress``)."""
    from . import convert
    from ._common import resolve_args

    parser = argparse.ArgumentParser(prog="mpisdnn convert")
    convert.add_arguments(parser)
    argv = ["network", os.fspath(source), "-o", os.fspath(output)]
    if progress is not None:
        argv += ["--progress", repr(float(progress))]
    args = parser.parse_args(argv)
    resolve_args(args)  # the defaults the command line fills (--progress), as cli.main does
    args.run(args, comm)


def run(args, comm) -> int:
    """Every configuration, then the table."""
    from .. import kernel_cache
    from ..progress import Progress
    from ..reporting.challenge import write_challenge
    from ..sdnn.challenge import run_challenge
    from ..system import load_average_text
    from ..walltime import WallClock

    with phase("setup"):
        clock = WallClock(comm)
        opts = agree(comm, options_from_args, args, comm)
    interval = args.progress

    def progress(inputs, edges_per_layer):
        return Progress(comm, inputs, edges_per_layer, interval=interval)

    load_before = load_average_text(3)
    kernel_cache.preload()
    convert = functools.partial(convert_network, progress=interval)
    rows = run_challenge(comm, opts, convert, progress)
    clock.mark("run")
    meta = {
        "command": " ".join(sys.argv),
        "ranks": comm.size,
        "backend": opts.infer.backend,
        "data_dir": os.path.abspath(opts.data_dir),
        "cache": os.path.abspath(opts.cache_dir),
        "load_average": f"{load_before} before, {load_average_text(3)} after",
        "wall_seconds": clock.elapsed(),
        "startup_seconds": clock.startup,
    }
    with phase("gather"):
        paths = agree_root(comm, write_challenge, opts.out, rows, meta)
    log(comm, "\n" + paths.pop("table"))
    bad = [r for r in rows if r["status"] != "PASS"]
    log(
        comm,
        f"mpisdnn challenge: {len(rows) - len(bad)}/{len(rows)} PASS in "
        f"{clock.elapsed():.1f} s; wrote " + ", ".join(paths.values()),
    )
    return 1 if bad else 0
