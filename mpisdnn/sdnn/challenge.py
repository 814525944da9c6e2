"""The Graph Challenge table in one command: find the official files, convert each network
once, generate what is missing, run every configuration, check it independently, resume.

``mpiexec -n R mpisdnn challenge DATA_DIR`` runs this module with the job's ranks
(:func:`run_challenge`): every configuration N x L runs in-process on the same communicator
(one start-up, kernels compiled or loaded once), its inputs read once per N.

Files, in the layout the challenge publishes (``DATA_DIR`` itself or its ``dnn/`` and
``mnist/`` folders; :func:`find_sources`; the files and the cache are
:mod:`mpisdnn.sdnn.challenge_files`):

- network: ``neuron{N}.tar.gz`` or the unpacked ``neuron{N}/n{N}-l{k}.tsv`` -> converted once
  into the cache (a v2 HDF5 file, re-used while the source's size and modification time
  match); a network with fewer than L layers, or none, is generated (a seeded RadiX-Net);
- inputs: ``sparse-images-{N}.tsv`` (or ``.tsv.gz``) -> read as published; when missing,
  digit-like inputs are generated into the cache as an official-format TSV;
- truth: ``neuron{N}-l{L}-categories.tsv``, picked by its name, used only when both the
  network and the inputs are the official ones. Otherwise the categories are checked against
  the independent reference (plain scipy, :func:`mpisdnn.reference_inference`) on every row
  when ``rows x edges <= full_check_edges``, else on a seeded sample of the claimed
  categories and of the other rows (generated rows are drawn again from their seed, not read
  back from the file the run read).

Each finished configuration is one JSON file under ``OUT/runs/`` written atomically; a later
run skips it (``rerun`` to run it again), so an interrupted table resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import MpisdnnError, UsageError
from ..parallel import (
    agree,
    agree_root,
    allgather,
    allgather_array,
    barrier,
    bcast,
    log,
    phase,
)
from .challenge_files import (
    Sources,
    find_sources,
    generated_inputs,
    generated_network,
    official_network,
    truth_layers,
    truth_mismatch,
    unlike_published,
)
from .options import InferOptions

__all__ = [
    "OFFICIAL_NEURONS",
    "OFFICIAL_LAYERS",
    "ChallengeOptions",
    "Sources",
    "find_sources",
    "truth_layers",
    "truth_mismatch",
    "run_challenge",
    "result_path",
]

OFFICIAL_NEURONS = (1024, 4096, 16384, 65536)
OFFICIAL_LAYERS = (120, 480, 1920)
#: Published inputs per configuration.
OFFICIAL_INPUTS = 60000


@dataclass(frozen=True)
class ChallengeOptions:
    """What one ``mpisdnn challenge`` sitting runs (validated when made).

    Parameters
    ----------
    data_dir : str
        Where the official files are (may hold none: everything is then generated).
    neurons, layers : tuple of int
        The configurations: every N x L.
    out : str
        Results: ``runs/N{N}-L{L}.json``, ``challenge.md``, ``challenge.json``,
        ``challenge.png``.
    cache : str, optional
        Converted and generated files (default ``OUT/cache``).
    inputs : int
        Inputs to generate where the official ones are missing.
    seed : int
        Seed of generated networks and inputs.
    check_rows, check_budget, full_check_edges
        The independent check: sampled rows per configuration, edge visits the reference
        may spend on surviving sampled rows, and the size (rows x edges) up to which every
        row is checked.
    rerun : bool
        Run finished configurations again.
    infer : InferOptions
        Backend, threads and the rest, as ``infer`` takes them.
    progress : float
        Seconds between progress lines (0: none).
    """

    data_dir: str
    neurons: tuple = OFFICIAL_NEURONS
    layers: tuple = OFFICIAL_LAYERS
    out: str = "challenge"
    cache: str | None = None
    inputs: int = OFFICIAL_INPUTS
    seed: int = 1
    check_rows: int = 32
    check_budget: float = 1e10
    full_check_edges: float = 3e11
    rerun: bool = False
    infer: InferOptions = field(default_factory=InferOptions)
    progress: float = 10.0

    def __post_init__(self):
        # each configuration once: a size given twice ran, and was tabled, twice
        object.__setattr__(self, "neurons", tuple(dict.fromkeys(self.neurons)))
        object.__setattr__(self, "layers", tuple(sorted(set(self.layers))))
        for n in self.neurons:
            side = int(round(n**0.5))
            if n < 1024 or side * side != n or side % 32 or (side // 32) & (side // 32 - 1):
                raise UsageError(
                    f"--neurons {n}: not a challenge size (1024, 4096, 16384, 65536, ...)"
                )
        if not self.neurons or not self.layers or min(self.layers) < 1:
            raise UsageError("--neurons and --layers need at least one value each, layers >= 1")
        if self.inputs < 1 or self.check_rows < 2:
            raise UsageError("--inputs must be >= 1 and --check-rows >= 2")
        if not os.path.isdir(self.data_dir):
            raise UsageError(f"{self.data_dir}: no such directory (DATA_DIR)")

    @property
    def cache_dir(self) -> str:
        return self.cache or os.path.join(self.out, "cache")

    def replace(self, **changes) -> ChallengeOptions:
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------------------ the files
# ------------------------------------------------------------------------------ running
def result_path(opts: ChallengeOptions, n: int, layers: int) -> str:
    """The JSON result of one configuration."""
    return os.path.join(opts.out, "runs", f"N{n}-L{layers}.json")


@dataclass
class _Inputs:
    """One N's inputs, read once for all its configurations."""

    path: str
    official: bool
    y: object
    row_offset: int
    g_rows: int
    g_nnz: int
    offsets: object
    seconds: float
    stats: dict


def _finished(opts, n, layers):
    import json

    path = result_path(opts, n, layers)
    try:
        with open(path, encoding="utf-8") as fh:
            row = json.load(fh)
    except (OSError, ValueError):
        return None
    same = row.get("inputs_count") == opts.inputs and row.get("seed") == opts.seed
    return row if same and row.get("status") == "PASS" else None


def run_challenge(comm, opts: ChallengeOptions, convert, progress_factory=None) -> list:
    """Run every configuration of ``opts`` not finished before; the rows in table order.

    Parameters
    ----------
    comm : mpi4py communicator
    opts : ChallengeOptions
    convert : callable
        ``convert(comm, source, output)``: an official network (archive or directory) to a
        v2 file with all its layers (collective; the ``convert network`` command).
    progress_factory : callable, optional
        ``progress_factory(inputs, edges_per_layer)`` -> a layer-loop progress callback.

    Returns
    -------
    list of dict
        One row per configuration (finished before, or run now), in ``neurons`` x ``layers``
        order.
    """
    from .. import backends

    configs = [(n, ell) for n in opts.neurons for ell in opts.layers]  # each once (the options)
    with phase("setup"):
        agree_root(comm, os.makedirs, os.path.join(opts.out, "runs"), exist_ok=True)
        # the machine's defaults (weight memory) filled once for every configuration
        opts = dataclasses.replace(opts, infer=opts.infer.resolved(comm))
        backend = agree(comm, backends.create, opts.infer, comm)
    rows = []
    for n in opts.neurons:
        todo = [ell for (m, ell) in configs if m == n]
        done = {ell: agree_root(comm, _finished, opts, n, ell) for ell in todo}
        if not opts.rerun and all(done.values()):
            for ell in todo:
                log(comm, f"mpisdnn challenge: N={n} L={ell}: done before "
                          f"({result_path(opts, n, ell)}), skipped")  # fmt: skip
                rows.append(done[ell])
            continue
        src = agree_root(comm, find_sources, opts.data_dir, n, max(todo))
        for note in src.notes:
            log(comm, f"mpisdnn challenge: warning: N={n}: {note}", file=sys.stderr)
        inputs = None
        for ell in todo:
            index = configs.index((n, ell)) + 1
            if done[ell] and not opts.rerun:
                log(comm, f"mpisdnn challenge: [{index}/{len(configs)}] N={n} L={ell}: "
                          f"done before ({result_path(opts, n, ell)}), skipped")  # fmt: skip
                rows.append(done[ell])
                continue
            head = f"[{index}/{len(configs)}] N={n} L={ell}"
            try:
                if inputs is None:
                    inputs = _read_inputs(comm, opts, src, n)
                row = _run_one(comm, opts, src, ell, inputs, backend, convert, progress_factory)
            except MpisdnnError as exc:  # agreed by every rank: the next configuration runs
                row = _error_row(opts, n, ell, str(exc))
            agree_root(comm, _save_row, opts, row)
            log(comm, f"mpisdnn challenge: {head}: {one_line(row)}")
            rows.append(row)
        del inputs
    return rows


@phase("load")
def _read_inputs(comm, opts, src: Sources, n: int) -> _Inputs:
    """This rank's rows of N's inputs (official or generated), read from the TSV once."""
    from ..progress import Heartbeat
    from .load import load_inputs

    official = src.inputs is not None
    path = src.inputs if official else generated_inputs(comm, opts, n)
    stats: dict = {}
    barrier(comm)
    t0 = time.perf_counter()
    with Heartbeat(comm, f"reading {os.path.basename(path)}", opts.progress):
        y, r0, g_rows, g_nnz, offsets, _ = load_inputs(comm, path, n, stats)
    barrier(comm)
    return _Inputs(path, official, y, r0, g_rows, g_nnz, offsets, time.perf_counter() - t0, stats)


def _network_for(comm, opts, src: Sources, ell: int, convert) -> tuple:
    """``(path, origin, converted now?)`` of the network the configuration runs."""
    short = src.network_layers is not None and src.network_layers < ell  # a directory's
    path, have, fresh = (None, 0, False) if short else official_network(comm, opts, src, convert)
    if path is not None and have >= ell:
        note = agree_root(comm, unlike_published, path, src.neurons, ell)
        if note:
            log(comm, f"mpisdnn challenge: warning: N={src.neurons} L={ell}: {note}",
                file=sys.stderr)
        return path, "official", fresh
    return generated_network(comm, opts, src.neurons, ell), "generated", False


def _run_one(comm, opts, src, ell, inputs: _Inputs, backend, convert, progress_factory) -> dict:
    """Load, run and check one configuration; its result row."""
    from ..parallel import allreduce
    from ..reporting.infer import timed_kernels_note
    from ..system import peak_rss_bytes, pss_bytes
    from . import session
    from .engine import check_categories
    from .load import Problem, load_network, load_truth

    n = src.neurons
    net_path, net_origin, converted = _network_for(comm, opts, src, ell, convert)
    truth_path = src.truth.get(ell) if (net_origin == "official" and inputs.official) else None
    _reset_peak_rss()
    t0 = time.perf_counter()
    with phase("load"):
        barrier(comm)
        net = load_network(comm, net_path, ell, None, opts.infer.weight_memory,
                           backend.prepared_bytes)  # fmt: skip
        truth = load_truth(comm, truth_path) if truth_path else None
        barrier(comm)
    net_seconds = time.perf_counter() - t0
    problem = Problem(net, inputs.y.copy(), inputs.row_offset, inputs.g_rows, inputs.g_nnz,
                      inputs.offsets, truth, net_seconds, inputs.stats)  # fmt: skip
    plan = session.InferPlan(network=net_path, inputs=inputs.path, truth=truth_path,
                             layers=ell, options=opts.infer)  # fmt: skip
    loaded = session.Loaded(problem, len(net))
    progress = progress_factory(inputs.g_rows, net.edges / max(1, len(net))) if \
        progress_factory else None  # fmt: skip
    result = session.run(comm, plan, loaded, backend, progress)
    note = timed_kernels_note(result.timed_kernel_seconds)
    if note:
        log(comm, f"mpisdnn challenge: warning: N={n} L={ell}: {note}", file=sys.stderr)
    peak = allgather(comm, peak_rss_bytes())
    pss = allreduce(comm, pss_bytes() or 0)
    del problem, loaded
    if hasattr(net, "close"):
        net.close()
    if truth_path:
        check = bcast(comm, check_categories(result.categories, truth) if comm.rank == 0
                      else None)  # fmt: skip
        check = {"check": "official truth", "checked_rows": inputs.g_rows,
                 "pass": check["status"] == "PASS", "missing": check["missing"],
                 "extra": check["extra"]}  # fmt: skip
    else:
        check = reference_check(comm, opts, net_path, ell, inputs, result.categories)
    wall = time.perf_counter() - t0
    return {
        "n": n, "l": ell, "status": "PASS" if check["pass"] else "FAIL",
        "network": net_path, "network_origin": net_origin,
        "network_source": src.network if net_origin == "official" else None,
        "converted_now": converted,
        "inputs": inputs.path, "inputs_origin": "official" if inputs.official else "generated",
        "truth": truth_path, "truth_origin": "official" if truth_path else "reference",
        "inputs_count": opts.inputs, "seed": opts.seed, "ranks": comm.size,
        "rows": int(inputs.g_rows), "edges": int(result.edges),
        "network_load_s": net_seconds, "inputs_read_s": inputs.seconds,
        "part1_s": float(result.part1), "part2_s": float(result.part2),
        "part_kernel_s": float(result.timed_kernel_seconds),
        "rate": float(result.rate), "categories": int(np.size(result.categories)),
        "distinct": min((c["distinct_rows"] for c in (result.dedup or {}).get("checks") or []),
                        default=None),
        "config_wall_s": wall, "peak_rss_bytes": peak, "pss_bytes": pss,
        "backend": result.backend, **check,
    }  # fmt: skip


def _reset_peak_rss() -> None:
    """Reset this process's peak RSS so the next reading is one configuration's (Linux:
    ``/proc/self/clear_refs``, 5; elsewhere the peak stays the process's)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _error_row(opts, n, ell, message) -> dict:
    return {"n": n, "l": ell, "status": "ERROR", "error": message,
            "inputs_count": opts.inputs, "seed": opts.seed}  # fmt: skip


def _save_row(opts, row) -> None:
    from ..reporting.schema import write_json

    write_json(result_path(opts, row["n"], row["l"]), row)


def one_line(row: dict) -> str:
    """A configuration's result in one line."""
    if row["status"] not in ("PASS", "FAIL"):
        return f"{row['status']}: {row.get('error', '')}"
    return (
        f"{row['status']} ({row['check']}, {row['checked_rows']:,} rows)  part 1 "
        f"{row['part1_s']:.3f} s  {row['rate'] / 1e12:.3f} TE/s  categories "
        f"{row['categories']:,}  network {row['network_origin']}, inputs "
        f"{row['inputs_origin']}  ({row['config_wall_s']:.1f} s)"
    )


# ------------------------------------------------------------------------------ checking
def sample_rows(found, rows: int, n: int, layers: int, opts: ChallengeOptions) -> np.ndarray:
    """0-based rows the reference checks: claimed categories (as many as the budget allows:
    a surviving row costs about N x 32 edge visits per layer) and as many others, seeded."""
    rng = np.random.default_rng(opts.seed * 1000003 + n + layers)
    cats = np.asarray(found, dtype=np.int64) - 1
    pos = int(min(opts.check_rows // 2, max(1, opts.check_budget // (n * 32 * layers)),
                  cats.size))  # fmt: skip
    others = np.setdiff1d(np.arange(rows, dtype=np.int64), cats)
    neg = min(opts.check_rows - pos, others.size)
    pick = [rng.choice(cats, pos, replace=False), rng.choice(others, neg, replace=False)]
    return np.unique(np.concatenate(pick))


def reference_check(comm, opts, net_path, layers, inputs: _Inputs, found) -> dict:
    """PASS/FAIL of the run's categories ``found`` against plain scipy on every row or on
    sampled rows; each rank checks the chosen rows of its own block (collective)."""
    edges = agree_root(comm, _edges_of, net_path, layers)
    full = inputs.g_rows * edges <= opts.full_check_edges
    if full:
        rows = np.arange(inputs.g_rows, dtype=np.int64)
    else:
        rows = bcast(comm, sample_rows(found, inputs.g_rows, inputs.y.shape[1], layers, opts)
                     if comm.rank == 0 else None)  # fmt: skip
    r0, r1 = inputs.row_offset, inputs.row_offset + inputs.y.shape[0]
    mine = rows[(rows >= r0) & (rows < r1)]
    t0 = time.perf_counter()
    got = agree(comm, _reference_rows, opts, net_path, layers, inputs, mine)
    ref = np.sort(allgather_array(comm, got))
    claimed = np.intersect1d(np.asarray(found, dtype=np.int64), rows + 1)
    return {
        "check": "reference, all rows" if full else "reference, sampled rows",
        "checked_rows": int(rows.size),
        "checked_categories": int(claimed.size),
        "check_seconds": time.perf_counter() - t0,
        "pass": bool(np.array_equal(np.unique(ref), claimed)),
    }


def _edges_of(path, layers) -> int:
    from ..formats import hdf5

    return int(sum(hdf5.read_network_meta(path)["layer_nnz"][:layers]))


def _reference_rows(opts, net_path, layers, inputs: _Inputs, rows) -> np.ndarray:
    """1-based categories among ``rows`` (0-based, this rank's) by the scipy reference."""
    from mpi4py import MPI

    from ..generate import digit_rows
    from .load import load_network
    from .reference import categories_of, reference_inference

    if rows.size == 0:
        return np.zeros(0, np.int64)
    n = inputs.y.shape[1]
    if inputs.official:
        y = inputs.y[rows - inputs.row_offset]
    else:  # drawn again from the seed: independent of the file and of its reader
        y = digit_rows(rows, n, opts.seed)
    net = load_network(MPI.COMM_SELF, net_path, layers)
    step = max(1, 2**26 // n)  # rows are independent: blocks bound the memory
    found = [rows[categories_of(reference_inference(y[i : i + step], net), i) - 1] + 1
             for i in range(0, y.shape[0], step)]  # fmt: skip
    if hasattr(net, "close"):
        net.close()
    return np.concatenate(found or [np.zeros(0, np.int64)]).astype(np.int64)
