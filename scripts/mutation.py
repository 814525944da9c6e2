#!/usr/bin/env python
"""Mutation check: do the tests catch small semantic mistakes in the code that computes results?

Each mutant below is one small change a reviewer could make by mistake (a ``>`` that becomes
``>=``, a local index where a global one belongs, a constant where an argument belongs). The
script copies the repository to a scratch directory, applies one mutant at a time, runs the
tests that guard that code, and counts the mutant *killed* when they fail. It prints
``killed/total`` and lists the survivors; docs/testing.md records the score and argues every
survivor equivalent or names the test that kills it.

A mutant is located by ``(file, exact source snippet, replacement)``: the snippet must occur
exactly once. When the code it names has changed (another branch rewrote it), the mutant is
reported as ``SNIPPET NOT FOUND`` (or ``NOT UNIQUE``) and the run exits non-zero: update the
snippet, never drop the mutant silently.

numba caches compiled kernels on disk (``cache=True``) and does not notice that a function a
kernel inlines changed in another file, so a mutant in a file that uses numba runs with a
fresh ``NUMBA_CACHE_DIR``; the others share one cache warmed by the baseline run.

Usage (from the repository, with its venv: ``source scripts/_env.sh``)::

    python scripts/mutation.py                 # baseline, then every mutant
    python scripts/mutation.py --check         # only check that every snippet is found (fast)
    python scripts/mutation.py --list
    python scripts/mutation.py -k push -k ref  # mutants whose name contains push or ref
    python scripts/mutation.py --json out.json --keep

Exit status: 0 all killed, 1 some survived, 2 a snippet was not found or a run could not start.
It is not part of CI (a full run takes about an hour on 2 cores); run it before resolving an
issue that touches the modules it mutates, and after merging branches that move their code.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXACT = "tests/test_exactness.py"  # its mpi tests, in the MPI runs
_EX = EXACT + "::test_"
EX_THR = _EX + "sum_exactly_on_threshold_stores_nothing"
EX_REF_THR = _EX + "reference_on_threshold"
EX_CPU_YMAX = _EX + "cpu_ymax_other_than_32"
EX_REF_YMAX = _EX + "reference_ymax_other_than_32"
EX_H5 = _EX + "ymax_survives_an_hdf5_round_trip"
EX_ONE = _EX + "one_rank_categories_and_y_exact"
EX_GPU = _EX + "gpu_kernels_threshold_and_ymax"
EX_GPU_BIAS = _EX + "gpu_positive_bias_only_where_the_sum_is_non_zero"
ODD = "tests/test_kernels.py::test_odd_sizes_and_cancellations"
SEMANTICS = "tests/test_semantics.py"
GPU_ENGINE = "tests/test_gpu_sim.py::test_engine_gpu_matches_reference_and_cpu"
NX = ("tests/test_projection.py::test_davis_equals_networkx",
      "tests/test_projection.py::test_random_bipartite_equals_networkx")  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    """One semantic mutation and the tests expected to catch it.

    ``serial``, ``mpi`` and ``sim`` are pytest arguments for the serial run, the 2-rank MPI
    run (``-m mpi``) and the gpu simulator run (``-m gpu_sim``, ``NUMBA_ENABLE_CUDASIM=1``);
    they run in that order and the first failure kills the mutant.
    """

    name: str
    area: str
    path: str
    old: str
    new: str
    serial: tuple = ()
    mpi: tuple = ()
    sim: tuple = ()
    why: str = ""


M = Mutant
MUTANTS = [
    # -- cpu kernels: tiles and push ----------------------------------------------------------
    M("push-threshold-ge", "kernels", "mpisdnn/backends/_kernels.py",
      "if z != 0 and z + smax[q] > 0:", "if z != 0 and z + smax[q] >= 0:",
      serial=(EX_THR, ODD),
      why="issue 32 #1: a set whose sum lands exactly on the threshold is activated"),
    M("push-residue-no-clamp", "kernels", "mpisdnn/backends/_kernels.py",
      "actz[a] = o if o < top else top", "actz[a] = o",
      serial=(EX_CPU_YMAX,), why="push residue writer (one bias) ignores ymax"),
    M("push-residue-clamp-32", "kernels", "mpisdnn/backends/_kernels.py",
      "actz[a] = o if o < top else top", "actz[a] = o if o < 32.0 else np.float32(32.0)",
      serial=(EX_CPU_YMAX,), why="push residue writer clamps at 32 whatever ymax says"),
    M("push-activate-no-relu", "kernels", "mpisdnn/backends/_kernels.py",
      "o = o if o > 0 else np.float32(0.0)", "o = o",
      serial=(EX_THR, ODD), why="per-neuron-bias writers keep negative values"),
    M("push-residue-count-zero", "kernels", "mpisdnn/backends/_kernels.py",
      "ad[cnt] = o\n                cnt += 1 if o != 0 else 0",
      "ad[cnt] = o\n                cnt += 1",
      serial=(EX_THR, ODD), why="residue writer (bias per neuron) stores explicit zeros"),
    M("push-bitmap-zero", "kernels", "mpisdnn/backends/_kernels.py",
      "                if o != 0:\n                    bd[c] = o",
      "                if o >= 0:\n                    bd[c] = o",
      serial=(EX_THR, ODD), why="bitmap writer stores explicit zeros"),
    M("tile-ymax-32", "kernels", "mpisdnn/backends/_kernels.py",
      "    top = np.float32(ymax)\n    slots, step = _slots(n, lay)",
      "    top = np.float32(32.0)\n    slots, step = _slots(n, lay)",
      serial=(EX_CPU_YMAX,), why="tile kernel clamps at 32 whatever ymax says"),
    M("tile-tail-zero", "kernels", "mpisdnn/backends/_kernels.py",
      "if k[i] > 0 and v != 0.0:", "if k[i] > 0:",
      serial=(EX_THR, ODD), why="columns past the last 16 (N % 16 != 0) stored as zeros"),
    M("tile-repack-lane", "kernels", "mpisdnn/backends/_kernels.py",
      "lane_row[hole] = lane_row[i]", "lane_row[hole] = hole",
      serial=(EX_THR, ODD), why="a repacked row is written back as another row"),
    M("tile-bias-on-zero", "kernels", "mpisdnn/backends/_simd.py",
      "return builder.select(builder.fcmp_unordered(\"!=\", z, zero), v, zero)", "return v",
      serial=(SEMANTICS, ODD), why="bias added where Y W is zero (empty rows revive)"),
    M("tile-relu-dropped", "kernels", "mpisdnn/backends/_simd.py",
      "v = builder.select(builder.fcmp_ordered(\">\", v, zero), v, zero)", "pass",
      serial=(EX_THR, SEMANTICS), why="no ReLU in the tile activation"),
    # -- gpu kernels (simulator) -------------------------------------------------------------
    M("gpu-ymax-32", "gpu", "mpisdnn/backends/_cuda_arith.py",
      "        if z > ymax:\n            z = ymax",
      "        if z > float32(32):\n            z = float32(32)",
      sim=(EX_GPU, GPU_ENGINE), why="gpu activation clamps at 32"),
    M("gpu-bias-on-zero", "gpu", "mpisdnn/backends/_cuda_arith.py",
      "if z != zero:  # the bias only", "if True:  # the bias only",
      sim=(EX_GPU_BIAS, SEMANTICS, EX_GPU, GPU_ENGINE), why="gpu adds the bias to zero sums"),
    M("gpu-csr-keeps-zero", "gpu", "mpisdnn/backends/_cuda_kernels.py",
      "                v = y[base + int64(j) * CH]\n                if v != float32(0):",
      "                v = y[base + int64(j) * CH]\n                if v >= float32(0):",
      sim=(EX_GPU, GPU_ENGINE), why="gpu to_csr stores zeros (counts disagree)"),
    # -- the reference backend -----------------------------------------------------------------
    M("ref-ymax-32", "reference", "mpisdnn/sdnn/reference.py",
      "np.clip(z.data, 0, np.float32(ymax), out=z.data)",
      "np.clip(z.data, 0, np.float32(32.0), out=z.data)",
      serial=(EX_REF_YMAX, SEMANTICS), why="issue 32 #2: reference clamps at 32 whatever ymax"),
    M("ref-bias-on-cancelled", "reference", "mpisdnn/sdnn/reference.py",
      "    z.eliminate_zeros()\n    bias = np.asarray(bias, dtype=np.float32)",
      "    bias = np.asarray(bias, dtype=np.float32)",
      serial=(SEMANTICS, EX_REF_THR), why="bias added to an exact cancellation"),
    M("ref-keeps-zeros", "reference", "mpisdnn/sdnn/reference.py",
      "    z.eliminate_zeros()\n    return z", "    return z",
      serial=(EX_REF_THR, SEMANTICS), why="reference stores explicit zeros"),
    M("ref-categories-0-based", "reference", "mpisdnn/sdnn/reference.py",
      "np.flatnonzero(sums != 0).astype(np.int64) + row_offset + 1",
      "np.flatnonzero(sums != 0).astype(np.int64) + row_offset",
      serial=(EX_REF_THR, SEMANTICS),
      sim=(GPU_ENGINE,), why="categories_of 0-based"),
    # -- output assembly across ranks ----------------------------------------------------------
    M("engine-categories-local", "assembly", "mpisdnn/sdnn/engine.py",
      "local_cats = dd.expand_ids(gid[sums != 0]) + 1",
      "local_cats = np.flatnonzero(sums != 0) + 1",
      mpi=(EXACT, "tests/test_mpi_infer.py"),
      why="issue 32 #3: categories from the local row position (MPI tests alone)"),
    M("engine-categories-block", "assembly", "mpisdnn/sdnn/engine.py",
      "local_cats = dd.expand_ids(gid[sums != 0]) + 1",
      "local_cats = np.flatnonzero(sums != 0) + row_offset + 1",
      mpi=(EXACT, "tests/test_mpi_infer.py"),
      why="categories from the position in the rank's block (wrong once rows are pruned)"),
    M("pipeline-categories-local", "assembly", "mpisdnn/sdnn/pipeline.py",
      "gid[np.asarray(y.sum(axis=1)).ravel() != 0]",
      "np.flatnonzero(np.asarray(y.sum(axis=1)).ravel() != 0)",
      serial=(EX_ONE,), mpi=(EXACT, "tests/test_pipeline.py"),
      why="--stages categories from the local position"),
    M("pipeline-head-merges-dropped", "assembly", "mpisdnn/_handoff.py",
      "state = None if self.merges is None else self.merges.handoff(g)", "state = None",
      serial=("tests/test_pipeline.py::test_pipeline_with_a_data_parallel_head",),
      why="the head's merges of identical rows not handed to the stages"),
    M("engine-expand-packed", "assembly", "mpisdnn/sdnn/runner.py",
      "lens[np.asarray(local_ids, dtype=np.int64)] = np.diff(y.indptr)",
      "lens[: y.shape[0]] = np.diff(y.indptr)",
      serial=(EX_ONE,), why="surviving rows put back at the top of the block"),
    M("engine-no-return-home", "assembly", "mpisdnn/sdnn/engine.py",
      "moved=bool(stats.events)", "moved=False",
      mpi=(EXACT, "tests/test_rebalance.py"), why="re-balanced rows not brought back home"),
    M("output-y-nnz-offset", "assembly", "mpisdnn/sdnn/results.py",
      "y.indptr[1:].astype(np.int64) + nnz_offset", "y.indptr[1:].astype(np.int64)",
      mpi=("tests/test_infer_outputs.py",),
      why="--output-y row pointers of ranks > 0 not shifted"),
    M("projection-part-offset", "assembly", "mpisdnn/formats/projection/output.py",
      "offset = len(header) + sum(sizes[: comm.rank])",
      "offset = len(header) + sum(sizes[: comm.rank + 1])",
      mpi=("tests/test_projection_outputs_mpi.py",),
      why="text output: a rank's part copied at the wrong offset"),
    # -- partitioning ------------------------------------------------------------------------
    M("partition-even-extra", "partition", "mpisdnn/partition.py",
      "sizes[:extra] += 1", "sizes[extra:] += 1",
      serial=("tests/test_partition.py",), why="even blocks do not cover n"),
    M("partition-last-offset", "partition", "mpisdnn/partition.py",
      "    offsets[-1] = n\n", "",
      serial=("tests/test_partition.py",), why="trailing weightless items belong to no block"),
    M("partition-side-right", "partition", "mpisdnn/partition.py",
      'offsets = np.searchsorted(cum, targets, side="left")',
      'offsets = np.searchsorted(cum, targets, side="right")',
      serial=("tests/test_partition.py",), why="blocks start after the row reaching the target"),
    M("partition-layers-max", "partition", "mpisdnn/partition.py",
      "pick = int(np.argmin(cost))", "pick = int(np.argmax(cost))",
      serial=("tests/test_partition.py",), why="stage bounds that maximise the busiest stage"),
    # -- re-balancing ------------------------------------------------------------------------
    M("rebalance-nnz-displ", "rebalance", "mpisdnn/sdnn/rebalance.py",
      "nnz_counts = (cum[row_end] - cum[row_end - row_counts]).astype(np.int64)",
      "nnz_counts = (cum[row_end] - cum[row_end - row_counts] - 1).astype(np.int64)",
      mpi=("tests/test_rebalance.py", EXACT), why="one value too few sent per destination"),
    M("rebalance-imbalance-min", "rebalance", "mpisdnn/sdnn/rebalance.py",
      "return float(w.max() / w.mean())", "return float(w.min() / w.mean())",
      serial=("tests/test_rebalance.py",), mpi=("tests/test_rebalance.py", EXACT),
      why="imbalance measured by the idlest rank: never re-balances"),
    M("rebalance-dest-left", "rebalance", "mpisdnn/sdnn/rebalance.py",
      'dest = np.searchsorted(offsets, pos, side="right") - 1',
      'dest = np.searchsorted(offsets, pos, side="left") - 1',
      serial=("tests/test_rebalance.py",), mpi=("tests/test_rebalance.py", EXACT),
      why="a row at a block start goes to the previous rank"),
    # -- checkpoints ---------------------------------------------------------------------------
    M("checkpoint-next-layer", "checkpoint", "mpisdnn/sdnn/checkpoint.py",
      '            "next_layer": int(next_layer),',
      '            "next_layer": int(next_layer) - 1,',
      serial=("tests/test_checkpoint.py",), why="resume runs a layer twice"),
    M("checkpoint-read-block", "checkpoint", "mpisdnn/sdnn/checkpoint.py",
      "sel = np.flatnonzero((gid >= r0) & (gid < r1))",
      "sel = np.flatnonzero((gid > r0) & (gid < r1))",
      serial=("tests/test_checkpoint.py",), mpi=("tests/test_checkpoint.py",),
      why="resume loses the live row at each block start"),
    # -- streaming -------------------------------------------------------------------------------
    M("streaming-skip-layer", "streaming", "mpisdnn/sdnn/streaming.py",
      "for k in range(0, nlayers, size)]", "for k in range(0, nlayers, size + 1)]",
      serial=(EX_H5, "tests/test_bignet.py", "tests/test_infer_outputs.py"),
      why="weight blocks skip a layer"),
    M("streaming-ymax-32", "streaming", "mpisdnn/sdnn/streaming.py",
      'self.ymax = float(meta.get("ymax", 32.0))', "self.ymax = 32.0",
      serial=(EX_H5, "tests/test_bignet.py"), why="streamed HDF5 network loses its ymax"),
    M("streaming-read-past", "streaming", "mpisdnn/sdnn/streaming.py",
      "while stop < k1 and 8 * int(self._nnz[k : stop + 1].sum()) <= READ_BYTES:",
      "while stop <= k1 and 8 * int(self._nnz[k : stop + 1].sum()) <= READ_BYTES:",
      serial=(EX_H5, "tests/test_bignet.py"), why="a read slice runs past its block"),
    # -- readers ---------------------------------------------------------------------------------
    M("tsv-column-1-based", "readers", "mpisdnn/formats/_tsv_text.py",
      "        c.astype(np.int64) - 1,", "        c.astype(np.int64),",
      serial=("tests/test_formats.py", "tests/test_cli.py"), why="TSV columns not shifted"),
    M("tsv-last-row", "readers", "mpisdnn/formats/tsv.py",
      "nrows = rows if rows is not None else int(r.max()) + 1",
      "nrows = rows if rows is not None else int(r.max())",
      serial=("tests/test_formats.py", "tests/test_cli.py"), why="last input row dropped"),
    M("hdf5-inputs-offset", "readers", "mpisdnn/formats/hdf5.py",
      "(data, indices.astype(np.int32), ptr - lo)", "(data, indices.astype(np.int32), ptr)",
      serial=("tests/test_formats.py",),
      mpi=("tests/test_mpi_infer.py::test_load_problem_from_hdf5_and_tsv",),
      why="a rank's row block of an inputs file read with global pointers"),
    M("hdf5-layer-slice", "readers", "mpisdnn/formats/hdf5.py",
      "a, b = int(offsets[layer_start + k]) - lo, int(offsets[layer_start + k + 1]) - lo",
      "a, b = int(offsets[k]) - lo, int(offsets[k + 1]) - lo",
      serial=("tests/test_formats.py", "tests/test_pipeline.py"),
      why="a layer slice of a v1 file reads the first layers' weights"),
    M("hdf5-ymax-32", "readers", "mpisdnn/formats/_validate.py",
      'v = f.attrs.get("ymax", 32.0)', "v = 32.0",
      serial=(EX_H5, "tests/test_formats.py"), why="network file's ymax ignored"),
    # -- projection weightings -----------------------------------------------------------------
    M("proj-jaccard", "projection", "mpisdnn/projection/_kernels.py",
      "return c / (du + dv - c)", "return c / (du + dv)",
      serial=NX, why="jaccard without the intersection"),
    M("proj-overlap", "projection", "mpisdnn/projection/_kernels.py",
      "return c / min(du, dv)", "return c / max(du, dv)",
      serial=NX, why="overlap over the larger degree"),
    M("proj-ratio", "projection", "mpisdnn/projection/_kernels.py",
      "return c / rule.n_other", "return c / (rule.n_other + 1)",
      serial=NX, why="ratio over n + 1"),
    M("proj-newman", "projection", "mpisdnn/projection/weightings.py",
      "1.0 / np.maximum(deg_k - 1, 1)", "1.0 / np.maximum(deg_k, 1)",
      serial=NX, why="newman over deg(k), not deg(k) - 1"),
]


# -- running ---------------------------------------------------------------------------------


def _uses_numba(text: str) -> bool:
    return "numba" in text or "njit" in text or "cuda.jit" in text


def locate(root: Path, m: Mutant) -> str | None:
    """``None`` when the snippet occurs exactly once in ``m.path``, else what is wrong."""
    path = root / m.path
    if not path.exists():
        return f"file not found: {m.path}"
    n = path.read_text().count(m.old)
    if n == 0:
        return f"snippet not found in {m.path}: {m.old!r}"
    if n > 1:
        return f"snippet not unique in {m.path} ({n} places): {m.old!r}"
    return None


def make_scratch(keep: bool) -> Path:
    """A copy of the working tree (tracked and untracked, not ignored) next to a ``shared``
    link, where the tests look for the official data."""
    base = Path(tempfile.mkdtemp(prefix="mpisdnn-mutation-"))
    repo = base / "repo"
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            dst = repo / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    shared = ROOT.parent / "shared"
    if shared.exists():
        (base / "shared").symlink_to(shared.resolve())
    if not keep:
        print(f"[mutation] scratch copy {repo} (removed at the end; --keep keeps it)")
    else:
        print(f"[mutation] scratch copy {repo}")
    return repo


def _commands(m: Mutant, ranks: int):
    py = sys.executable
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(py)) or shutil.which("mpiexec")
    quiet = ["-q", "-x", "-p", "no:cacheprovider"]
    if m.serial:
        yield "serial", [py, "-m", "pytest", *quiet, *m.serial], {}
    if m.mpi:
        yield "mpi", [mpiexec, "-n", str(ranks), py, "-m", "mpi4py", "-m", "pytest",
                      "--with-mpi", "-m", "mpi", *quiet, *m.mpi], {}  # fmt: skip
    if m.sim:
        yield "sim", [py, "-m", "pytest", "-m", "gpu_sim", *quiet, *m.sim], {
            "NUMBA_ENABLE_CUDASIM": "1"
        }


def run_tests(repo: Path, m: Mutant, cache: Path, ranks: int, timeout: float):
    """Run the mutant's tests; returns (outcome, stage, seconds, tail of the output).

    outcome: ``killed`` (a test failed), ``timeout`` (counted as killed), ``survived`` or
    ``error`` (pytest could not run the selection: no tests collected, bad arguments).
    """
    env = dict(os.environ, PYTHONPATH=str(repo), NUMBA_CACHE_DIR=str(cache),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")  # fmt: skip
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    t0 = time.perf_counter()
    for stage, cmd, extra in _commands(m, ranks):
        try:
            proc = subprocess.run(cmd, cwd=repo, env=dict(env, **extra), capture_output=True,
                                  text=True, timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            return "timeout", stage, time.perf_counter() - t0, ""
        tail = (proc.stdout + proc.stderr)[-1500:]
        if proc.returncode in (3, 4, 5):  # internal error, usage error, nothing collected
            return "error", stage, time.perf_counter() - t0, tail
        if proc.returncode != 0:
            return "killed", stage, time.perf_counter() - t0, tail
    return "survived", "", time.perf_counter() - t0, ""


def check_import(repo: Path) -> None:
    """The tests must import the scratch copy, not the installed (editable) package."""
    env = dict(os.environ, PYTHONPATH=str(repo))
    out = subprocess.run([sys.executable, "-c", "import mpisdnn; print(mpisdnn.__file__)"],
                         cwd=repo, env=env, capture_output=True, text=True, check=True)  # fmt: skip
    where = Path(out.stdout.strip()).resolve()
    if repo.resolve() not in where.parents:
        sys.exit(f"[mutation] the tests would import {where}, not the scratch copy {repo}")


def stale_modules(repo: Path, rel: str) -> set:
    """The module names whose cached kernels a change to ``rel`` makes stale: its own, and
    those of the numba modules of its package that import it (numba inlines across modules
    and keys a cache entry only on its own file)."""
    path = repo / rel
    stem = path.stem
    out = {stem}
    for other in path.parent.glob("*.py"):
        text = other.read_text()
        if other != path and _uses_numba(text) and (
            f"from .{stem} import" in text or f"import {stem}" in text
        ):
            out.add(other.stem)
    return out


def fresh_cache(repo: Path, rel: str, warm: Path, cache_root: Path) -> Path:
    """A copy of the warm cache without the entries the mutant makes stale."""
    cache = Path(tempfile.mkdtemp(prefix="numba-", dir=cache_root))
    shutil.copytree(warm, cache, dirs_exist_ok=True)
    stale = stale_modules(repo, rel)
    for f in cache.rglob("*"):
        if f.is_file() and f.name.split(".", 1)[0] in stale:
            f.unlink()
    return cache


def mutate(repo: Path, m: Mutant, cache_root: Path, warm: Path, args) -> dict:
    path = repo / m.path
    original = path.read_text()
    stat = path.stat()
    fresh = _uses_numba(original)
    cache = fresh_cache(repo, m.path, warm, cache_root) if fresh else warm
    path.write_text(original.replace(m.old, m.new, 1))
    try:
        outcome, stage, seconds, tail = run_tests(repo, m, cache, args.ranks, args.timeout)
    finally:
        path.write_text(original)
        # Restore the time stamp too: numba's cache index keys on it.
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        if fresh:
            shutil.rmtree(cache, ignore_errors=True)
    return {"outcome": outcome, "stage": stage, "seconds": round(seconds, 1), "tail": tail}


def baseline(repo: Path, mutants, warm: Path, args) -> set:
    """Run every selection unmutated (and warm the shared numba cache); returns the
    selections that fail without a mutant (a flaky or broken test: their mutants are
    reported as errors, not counted as killed)."""
    seen, bad = set(), set()
    for m in mutants:
        key = (m.serial, m.mpi, m.sim)
        if key in seen:
            continue
        seen.add(key)
        plain = Mutant("baseline", "", m.path, "", "", m.serial, m.mpi, m.sim)
        outcome, stage, seconds, tail = run_tests(repo, plain, warm, args.ranks, args.timeout)
        sel = " ".join((*m.serial, *m.mpi, *m.sim))
        print(f"[baseline] {outcome:8s} {seconds:6.1f}s  {sel}", flush=True)
        if outcome != "survived":
            bad.add(key)
            print(f"  {stage} run failed unmutated (its mutants are skipped):\n{tail}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", action="append", default=[], help="only mutants whose name has this")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--check", action="store_true", help="only check every snippet is found")
    ap.add_argument("--ranks", type=int, default=2, help="ranks of the MPI runs (default 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per test run")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)

    mutants = [m for m in MUTANTS if not args.k or any(k in m.name for k in args.k)]
    names = [m.name for m in MUTANTS]
    assert len(set(names)) == len(names), "mutant names must be unique"
    if args.list:
        for m in mutants:
            print(f"{m.name:28s} {m.area:11s} {m.path}  -- {m.why}")
        return 0
    missing = {m.name: err for m in mutants if (err := locate(ROOT, m))}
    for name, err in missing.items():
        print(f"[mutation] {name}: SNIPPET NOT FOUND: {err}")
    if args.check:
        print(f"[mutation] {len(mutants) - len(missing)}/{len(mutants)} snippets found")
        return 2 if missing else 0

    repo = make_scratch(args.keep)
    cache_root = repo.parent / "numba-cache"
    warm = cache_root / "warm"
    warm.mkdir(parents=True)
    results = {}
    try:
        check_import(repo)
        todo = [m for m in mutants if m.name not in missing]
        bad = set() if args.no_baseline else baseline(repo, todo, warm, args)
        for m in todo:
            if (m.serial, m.mpi, m.sim) in bad:
                results[m.name] = {"outcome": "error", "stage": "baseline", "seconds": 0,
                                   "tail": "its tests fail without the mutant"}
        todo = [m for m in todo if m.name not in results]
        for i, m in enumerate(todo, 1):
            r = mutate(repo, m, cache_root, warm, args)
            results[m.name] = r
            mark = {"killed": "KILLED", "timeout": "KILLED (timeout)"}.get(
                r["outcome"], r["outcome"].upper()
            )
            print(f"[{i:2d}/{len(todo)}] {m.name:28s} {mark:17s} {r['stage']:6s} "
                  f"{r['seconds']:6.1f}s  {m.why}", flush=True)  # fmt: skip
            if r["outcome"] == "error":
                print(r["tail"])
    finally:
        if not args.keep:
            shutil.rmtree(repo.parent, ignore_errors=True)

    killed = [n for n, r in results.items() if r["outcome"] in ("killed", "timeout")]
    survived = [n for n, r in results.items() if r["outcome"] == "survived"]
    errors = [n for n, r in results.items() if r["outcome"] == "error"]
    total = len(mutants)
    print(f"\n[mutation] killed {len(killed)}/{total}")
    for n in survived:
        print(f"  SURVIVED           {n}")
    for n in missing:
        print(f"  SNIPPET NOT FOUND  {n}: {missing[n]}")
    for n in errors:
        print(f"  ERROR              {n} (the test selection did not run)")
    if args.json:
        rows = [dict(asdict(m), **results.get(m.name, {})) for m in mutants]
        out = {"killed": len(killed), "total": total, "survived": survived,
               "not_found": missing, "errors": errors, "mutants": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1))
    if missing or errors:
        return 2
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
