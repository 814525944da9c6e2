"""Operations: progress lines, ``mpisdnn info`` under mpiexec, fail-fast aborts, exit codes."""

import io
import json
import re
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from mpisdnn.progress import Progress, format_duration

from .conftest import mpiexec, run_cli, run_cli_batch

# --- progress ---------------------------------------------------------------------------------


class FakeComm:
    def __init__(self, rank=0):
        self.rank = rank
        self.size = 2


class FakeStream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def _drive(progress, total=5, dt=1.0):
    for k in range(1, total + 1):
        progress(k, total, 1000 - 100 * k, k * dt)


def test_progress_batch_log_is_plain_lines():
    out = FakeStream(tty=False)
    _drive(Progress(FakeComm(0), 1000, 2e6, interval=1e-9, stream=out))
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 5 and text.endswith("\n")
    assert lines[1].startswith("[progress] layer 2/5  active rows (rank 0) 800")
    # rate so far = inputs x edges per layer x layers done / seconds = 1000 x 2e6 x 2 / 2
    assert "rate 2.00 GE/s" in lines[1] and "elapsed 2.0 s" in lines[1]
    assert "ETA 3.0 s" in lines[1] and "ETA 0.0 s" in lines[-1]


def test_progress_terminal_rewrites_one_line():
    out = FakeStream(tty=True)
    p = Progress(FakeComm(0), 1000, 2e6, interval=1e-9, stream=out, label="layer")
    p(1, 3, 12345, 1.0)
    p(2, 3, 5, 2.0)  # shorter line: must blank out the rest of the previous one
    assert "\n" not in out.getvalue()
    p(3, 3, 5, 3.0)
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    first, second = text.split("\r")[1:3]
    assert len(second) >= len(first)  # padded over the longer first line


def test_progress_interval_quiet_and_other_ranks():
    out = FakeStream(tty=False)
    _drive(Progress(FakeComm(1), 1000, 2e6, interval=1e-9, stream=out))  # not rank 0
    _drive(Progress(FakeComm(0), 1000, 2e6, interval=0, stream=out))  # --quiet
    _drive(Progress(FakeComm(0), 1000, 2e6, interval=3600, stream=out))  # run shorter
    assert out.getvalue() == ""


def test_progress_interval_limits_lines(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("mpisdnn.progress.time.perf_counter", lambda: clock[0])
    out = FakeStream(tty=False)
    p = Progress(FakeComm(0), 10, 1e3, interval=10, stream=out)
    for k in range(1, 101):  # one layer per second for 100 s
        clock[0] = float(k)
        p(k, 100, 1, float(k))
    lines = out.getvalue().splitlines()
    assert len(lines) == 10  # every 10 s, the last one at layer 100/100
    assert lines[0].startswith("[progress] layer 10/100") and "100/100" in lines[-1]


def test_format_duration():
    assert format_duration(8.24) == "8.2 s"
    assert format_duration(187) == "3m07s"
    assert format_duration(7500) == "2h05m"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("ops")
    r = run_cli(["generate", "network", "--layers", "10", "--seed", "5", "-o", d / "net.h5"])
    assert r.returncode == 0, r.stderr
    r = run_cli(
        [
            "generate",
            "inputs",
            "--count",
            "600",
            "--seed",
            "6",
            "--network",
            d / "net.h5",
            "-o",
            d / "in.h5",
        ],
        ranks=2,
    )
    assert r.returncode == 0, r.stderr
    return d


def test_cli_progress_on_rank_0_only(tiny):
    args = ["infer", "--network", tiny / "net.h5", "--inputs", tiny / "in.h5"]
    # one MPI job for the three runs (run_cli_batch)
    r, q, both = run_cli_batch([[*args, "--progress", "1e-9"], [*args, "--quiet"],
                                [*args, "--progress", "1e-9", "--quiet"]], ranks=2)  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[progress]")]
    # the layer lines, once each (a second rank would repeat them); the load's heartbeat
    # lines ("[progress] network: ...  elapsed T") come from rank 0 too
    layers = [ln.split()[2] for ln in lines if re.match(r"\[progress\] \S+ \d+/\d+ ", ln)]
    assert layers == [f"{k}/10" for k in range(1, 11)], r.stdout
    assert all("elapsed" in ln for ln in lines if not re.match(r"\[progress\] \S+ \d+/", ln))
    assert "\r" not in r.stdout  # stdout is a pipe here, as in a batch job
    assert q.returncode == 0 and "[progress]" not in q.stdout
    # --progress with --quiet has no effect: refused in one line (tests/test_options.py)
    assert both.returncode == 2 and "--progress" in both.stderr


def test_convert_inputs_takes_progress_and_quiet(tmp_path, monkeypatch):
    """``convert inputs`` had neither flag (the reader printed every 5 s, whatever was
    asked); its byte-progress lines now follow ``--progress``, and ``--quiet`` silences them.
    Small blocks make a small file a read of many blocks (in-process run, one rank)."""
    from mpisdnn.formats import tsv_parallel, write_triples

    from .conftest import random_inputs

    monkeypatch.setattr(tsv_parallel, "BLOCK_BYTES", 4096)
    src = tmp_path / "in.tsv"
    write_triples(src, random_inputs(400, 256, seed=2))
    base = ["convert", "inputs", src, "--neurons", "256"]
    loud = run_cli([*base, "-o", tmp_path / "a.h5", "--progress", "1e-9"])
    quiet = run_cli([*base, "-o", tmp_path / "b.h5", "--quiet"])
    assert loud.returncode == 0 and quiet.returncode == 0, loud.stderr + quiet.stderr
    assert "[progress] reading" in loud.stdout, loud.stdout
    assert "[progress]" not in quiet.stdout, quiet.stdout


def test_graph_generators_take_progress_and_quiet(tmp_path):
    """``generate rmat`` (scale 21: 34 s on 2 cores) and ``generate bipartite`` printed
    nothing while they worked and took neither flag."""
    loud = run_cli(["generate", "rmat", "--scale", "17", "-o", tmp_path / "a.h5",
                    "--progress", "0.5"])  # fmt: skip
    quiet = run_cli(["generate", "bipartite", "--rows", "50", "--cols", "40", "--edges", "90",
                     "-o", tmp_path / "b.h5", "--quiet"])  # fmt: skip
    assert loud.returncode == 0 and quiet.returncode == 0, loud.stderr + quiet.stderr
    assert f"[progress] generating {tmp_path / 'a.h5'}" in loud.stdout, loud.stdout
    assert "[progress]" not in quiet.stdout


# --- mpisdnn info -----------------------------------------------------------------------------


def test_info_text_under_mpiexec():
    r = run_cli(["info"], ranks=2)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    # rank 0 only: one header line (the optional packages' lines also name mpisdnn)
    assert sum(ln.startswith("mpisdnn ") for ln in out.splitlines()) == 1, out
    for needle in ("numpy", "scipy", "h5py", "mpi4py", "MPI: ", "CUDA-aware", "ranks 2 on 1"):
        assert needle in out, needle
    assert "backend cpu" in out and "backend reference" in out and "backend gpu" in out
    assert "GPUs:" in out and "threads:" in out


def test_info_json_under_mpiexec():
    import mpi4py
    import numpy
    from mpi4py import MPI

    r = run_cli(["info", "--json"], ranks=2)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)  # exactly one JSON document
    assert info["ranks"] == 2
    assert sum(h["ranks"] for h in info["ranks_per_host"].values()) == 2
    v = info["versions"]
    assert v["numpy"] == numpy.__version__ and v["mpi4py"] == mpi4py.__version__
    assert info["mpi"]["vendor"] == MPI.get_vendor()[0]
    assert info["mpi"]["library"] and info["mpi"]["cuda_aware"]
    assert info["threads"]["local_ranks"] == 2 and info["threads"]["default_threads_per_rank"] >= 1
    assert info["backends"]["reference"]["available"] is True
    assert set(info["backends"]) == {"reference", "cpu", "gpu"}
    assert "devices" in info["gpu"] and "cupy" in info["gpu"]


# --- fail fast --------------------------------------------------------------------------------


def _corrupt_last_chunk(src, dst, chunk=1024):
    """Copy an inputs file with small gzip chunks and garble the last chunk of
    /features/data on disk, so only the rank reading the last rows hits a bad chunk."""
    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        g.attrs.update(dict(f.attrs))
        feats = g.create_group("features")
        feats["indptr"] = f["features/indptr"][()]
        for name in ("indices", "data"):
            feats.create_dataset(
                name,
                data=f[f"features/{name}"][()],
                chunks=(chunk,),
                compression="gzip",
                fletcher32=True,
            )
        if "truth" in f:
            g["truth"] = f["truth"][()]
    with h5py.File(dst, "r") as g:
        ds = g["features/data"]
        n = ds.id.get_num_chunks()
        info = ds.id.get_chunk_info(n - 1)
        offset, size = info.byte_offset, info.size
        indptr = g["features/indptr"][()]
        first_entry = info.chunk_offset[0]
    with open(dst, "r+b") as fh:
        fh.seek(offset + size // 4)
        fh.write(np.random.default_rng(0).bytes(size // 2))
    return int(np.searchsorted(indptr, first_entry, side="right") - 1)


def test_corrupt_input_on_one_rank_ends_job_fast(tiny, tmp_path):
    bad = tmp_path / "corrupt.h5"
    first_bad_row = _corrupt_last_chunk(tiny / "in.h5", bad)
    assert first_bad_row > 2 * 600 // 3  # only the last of 3 ranks reads the bad chunk
    start = time.monotonic()
    r = run_cli(["infer", "--network", tiny / "net.h5", "--inputs", bad], ranks=3, timeout=60)
    elapsed = time.monotonic() - start
    assert r.returncode == 2, r.stdout + r.stderr
    assert elapsed < 10, f"took {elapsed:.1f} s"
    errors = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith("mpisdnn: error: (rank 2)") and "/features/data" in errors[0]
    assert "Traceback" not in r.stderr


_DRIVER = """
import sys
import time
from mpi4py import MPI
import mpisdnn.progress
from mpisdnn.cli import main

RANK, LAYER, KIND = {rank}, {layer}, {kind!r}
original = mpisdnn.progress.Progress.__call__

# The engine calls the progress reporter after every layer on every rank: a stable place to
# make one rank fail mid-run while the others carry on to their next collective.
def after_layer(self, done, total, active, seconds):
    if MPI.COMM_WORLD.rank == RANK and done == LAYER:
        print(f"FAILING_AT {{time.time()}}", file=sys.stderr, flush=True)
        if KIND == "input":
            from mpisdnn.errors import InputError
            raise InputError("weights of layer 3 went bad")
        raise ZeroDivisionError("a bug on one rank only")
    return original(self, done, total, active, seconds)

mpisdnn.progress.Progress.__call__ = after_layer
sys.exit(main(sys.argv[1:]))
"""


def _run_driver(tiny, tmp_path, kind, ranks=3):
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(_DRIVER.format(rank=1, layer=3, kind=kind)))
    cmd = [
        mpiexec(),
        "-n",
        str(ranks),
        sys.executable,
        str(script),
        "infer",
        "--network",
        str(tiny / "net.h5"),
        "--inputs",
        str(tiny / "in.h5"),
        "--quiet",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    end = time.time()
    # From the moment one rank fails to the end of the whole job (start-up time excluded,
    # which on a loaded CI machine says nothing about the abort).
    failed_at = re.search(r"FAILING_AT ([0-9.]+)", r.stderr)
    assert failed_at, r.stdout + r.stderr
    return r, end - float(failed_at.group(1))


def test_internal_error_on_one_rank_mid_run_aborts_everything(tiny, tmp_path):
    """A bug on rank 1 at layer 3, while ranks 0 and 2 go on to the next collective."""
    r, elapsed = _run_driver(tiny, tmp_path, "bug")
    assert r.returncode == 3, r.stdout + r.stderr
    assert elapsed < 5, f"job ended {elapsed:.1f} s after the failure"
    assert r.stderr.count("mpisdnn: internal error on rank 1/3:") == 1, r.stderr
    assert r.stderr.count("Traceback") == 1 and "ZeroDivisionError" in r.stderr
    assert "PASS" not in r.stdout


def test_input_error_on_one_rank_mid_run_is_one_line(tiny, tmp_path):
    r, elapsed = _run_driver(tiny, tmp_path, "input")
    assert r.returncode == 2, r.stdout + r.stderr
    assert elapsed < 5, f"job ended {elapsed:.1f} s after the failure"
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("mpisdnn:")]
    assert ours == ["mpisdnn: error [rank 1/3]: weights of layer 3 went bad"], r.stderr
    assert "Traceback" not in r.stderr


def test_in_process_main_returns_3_on_a_crash(monkeypatch, capsys):
    """With nothing else to abort, a crash is a return code, not the end of the caller."""
    from mpi4py import MPI

    import mpisdnn.commands.info as info
    from mpisdnn.cli import main

    def boom(args, comm):
        raise RuntimeError("bug")

    monkeypatch.setattr(info, "run", boom)
    assert main(["info"], MPI.COMM_SELF) == 3
    assert "mpisdnn: internal error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, code",
    [
        (["info"], 0),
        (["infer", "--network", "nope.h5", "--inputs", "nope.h5"], 2),
        (["report", "nope.json"], 2),
        (["infer"], 2),
    ],
)
def test_exit_codes_and_one_message(args, code):
    r = run_cli(args, ranks=2, timeout=60)
    assert r.returncode == code, r.stderr
    if code:
        assert sum("error" in ln for ln in r.stderr.splitlines()) == 1, r.stderr
