"""Checkpoint directories that cannot be mixed up (issue 31 item 5).

A directory records its run's identity and an owner lock: a new run into another run's
checkpoints, or into a directory in use, is refused with one line; ``--resume`` refuses
result-defining flags that contradict the checkpoint and accepts the others; a
``--checkpoint`` target that cannot be used is refused before any data is read.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from mpisdnn.formats import write_inputs, write_network
from mpisdnn.generate import digit_images, radixnet
from mpisdnn.sdnn.checkpoint_identity import LOCK_FILE, RUN_FILE


def _main(argv, capsys):
    from mpi4py import MPI

    from mpisdnn.cli import main

    code = main([str(a) for a in argv], MPI.COMM_SELF)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    return code, out, lines


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck")
    write_network(d / "n.h5", radixnet(1024, 6, seed=1))
    write_inputs(d / "a.h5", digit_images(120, 1024, seed=2))
    write_inputs(d / "b.h5", digit_images(120, 1024, seed=3))
    return d


def _run(files, ck, inputs="a.h5", *extra):
    return ["infer", "--network", files / "n.h5", "--inputs", files / inputs, "--backend",
            "reference", "--quiet", "--checkpoint", ck, "--checkpoint-every", "0.000001",
            *extra]  # fmt: skip


def test_new_run_into_another_runs_checkpoints_is_refused(files, tmp_path, capsys):
    """Was: accepted, and ``--resume`` then continued whichever run wrote last."""
    ck = tmp_path / "ck"
    code, _, err = _main(_run(files, ck), capsys)
    assert code == 0, err
    assert any(ck.glob("ckpt-*")) and (ck / RUN_FILE).exists()
    assert not (ck / LOCK_FILE).exists()  # released at the end
    before = sorted(p.name for p in ck.iterdir())
    code, _, err = _main(_run(files, ck, "b.h5"), capsys)
    assert code == 2 and len(err) == 1, err
    assert "holds the checkpoints of another run" in err[0] and "--resume" in err[0]
    assert sorted(p.name for p in ck.iterdir()) == before
    code, _, err = _main(_run(files, ck), capsys)  # the same run again is its own
    assert code == 0, err


def test_directory_in_use_is_refused_and_a_dead_owner_is_taken_over(files, tmp_path, capsys):
    ck = tmp_path / "ck"
    ck.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (ck / LOCK_FILE).write_text(f"{os.uname().nodename} {sleeper.pid}\n")
        code, _, err = _main(_run(files, ck), capsys)
        assert code == 2 and len(err) == 1, err
        assert "in use by another run" in err[0] and str(sleeper.pid) in err[0]
        assert not any(ck.glob("ckpt-*"))
    finally:
        sleeper.kill()
        sleeper.wait()
    code, _, err = _main(_run(files, ck), capsys)  # its owner is dead now
    assert code == 0, err
    assert not (ck / LOCK_FILE).exists()


def _file(path):
    path.write_text("x")
    return path


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda d: _file(d / "ck"), id="existing-file"),
        pytest.param(lambda d: _file(d / "f") / "ck", id="below-a-file"),
    ],
)
def test_checkpoint_target_checked_before_any_data_is_read(files, tmp_path, capsys, make):
    """Was: exit 3 and an 18-line traceback, after loading."""
    ck = make(tmp_path)
    argv = _run(files, ck)
    corrupt = tmp_path / "corrupt.h5"  # reading it first would fail on it
    corrupt.write_bytes(b"not hdf5" * 100)
    argv[argv.index("--network") + 1] = corrupt
    code, _, err = _main(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert "--checkpoint" in err[0] and "corrupt.h5" not in err[0], err


def test_checkpoint_on_a_full_file_system_is_refused(files, tmp_path, capsys, monkeypatch):
    from mpisdnn.sdnn import checkpoint_identity

    class Full:
        f_bavail, f_frsize = 0, 4096

    monkeypatch.setattr(checkpoint_identity.os, "statvfs", lambda path: Full)
    code, _, err = _main(_run(files, tmp_path / "ck"), capsys)
    assert code == 2 and len(err) == 1 and "no space left" in err[0], err


@pytest.fixture
def stopped(files, tmp_path, capsys):
    """A checkpoint directory of a run stopped after its first checkpoint (``DIR/STOP``)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "STOP").write_text("")
    code, _, err = _main(_run(files, ck), capsys)
    assert code == 75, err
    return ck


@pytest.mark.parametrize(
    "flags",
    [["--layers", "3"], ["--layers", "50"], ["--bias", "-0.2"], ["--inputs", "b.h5"]],
    ids=["fewer-layers", "more-layers", "bias", "inputs"],
)
def test_resume_refuses_options_that_contradict_the_checkpoint(files, stopped, capsys, flags):
    """Was: ``--layers``/``--bias`` silently ignored (the run said PASS for another problem)."""
    flags = [str(files / f) if f.endswith(".h5") else f for f in flags]
    code, _, err = _main(["infer", "--resume", stopped, "--quiet", *flags], capsys)
    assert code == 2 and len(err) == 1, err
    assert flags[0] in err[0], err


def test_resume_accepts_backend_and_checks_the_truth_it_is_given(files, stopped, tmp_path,
                                                                  capsys):  # fmt: skip
    from mpisdnn import reference_inference
    from mpisdnn.formats import read_inputs, read_network, write_categories

    y0 = read_inputs(files / "a.h5", with_truth=False)
    y0 = y0[0] if isinstance(y0, tuple) else y0
    y = reference_inference(y0, read_network(files / "n.h5"))
    right, wrong = tmp_path / "right.tsv", tmp_path / "wrong.tsv"
    cats = np.flatnonzero(np.asarray(y.sum(axis=1)).ravel() > 0) + 1
    write_categories(right, cats)
    write_categories(wrong, cats[1:] if cats.size else np.array([1]))
    snapshot = {p.name for p in stopped.iterdir()}
    code, out, err = _main(["infer", "--resume", stopped, "--backend", "cpu", "--truth", wrong],
                           capsys)  # fmt: skip
    assert code == 1 and "FAIL" in out, (out, err)  # the truth given is the one checked
    assert {p.name for p in stopped.iterdir()} == snapshot
    code, out, err = _main(["infer", "--resume", stopped, "--truth", right], capsys)
    assert code == 0 and "PASS" in out, (out, err)


def _edit_manifest(ck, change, seal=True):
    """Apply ``change(manifest)`` to every complete checkpoint of ``ck`` (re-sealed: a
    manifest that is consistent with itself but not with the run or its files)."""
    import json

    from mpisdnn.sdnn.checkpoint import _sealed

    edited = 0
    for path in sorted(ck.glob("ckpt-*/manifest.json")):
        m = json.loads(path.read_text())
        change(m)
        m.pop("checksum", None)
        path.write_text(json.dumps(_sealed(m) if seal else {**m, "checksum": "0" * 64}))
        edited += 1
    assert edited


def _set(key, value):
    return lambda m: m.__setitem__(key, value)


@pytest.mark.parametrize(
    "change,seal,words",
    [
        (_set("next_layer", 1000), True, "next_layer 1000 is outside the run's 6 layers"),
        (_set("next_layer", -5), True, "next_layer must be a whole number >= 0, got -5"),
        (_set("next_layer", "2"), True, 'next_layer must be a whole number >= 0, got "2"'),
        (_set("layers", 0), True, "layers must be a whole number >= 1, got 0"),
        (_set("g_rows", 1 << 40), True, "had 1099511627776 inputs"),
        (_set("next_layer", 1), False, "checksum differs"),
    ],
    ids=["next-layer-1000", "next-layer-negative", "next-layer-text", "layers-0",
         "g-rows-huge", "edited-unsealed"],
)  # fmt: skip
def test_resume_refuses_a_manifest_that_disagrees_with_the_run(
    files, stopped, capsys, change, seal, words
):
    """Issue 42 item 5: was ``resuming at layer 1001`` and nothing computed (exit 0, wrong
    categories without a truth), a traceback for ``-5``, a 7.28 TiB allocation for a huge
    ``g_rows``; an edited manifest was trusted."""
    _edit_manifest(stopped, change, seal)
    code, out, err = _main(["infer", "--resume", stopped, "--quiet"], capsys)
    assert code == 2 and len(err) == 1, (out, err)
    assert words in err[0] and "np." not in err[0], err


def test_resume_refuses_a_rank_file_left_out_of_the_manifest(files, tmp_path):
    """Issue 42 item 5: a 2-rank checkpoint whose manifest (re-sealed) lists only rank 0's
    file: refused, at 2 ranks (was: rank 1's rows silently dropped, exit 0)."""
    from .conftest import run_cli

    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "STOP").write_text("")
    r = run_cli(_run(files, ck), ranks=2)
    assert r.returncode == 75, r.stdout + r.stderr

    def drop_rank_1(m):
        m["files"] = m["files"][:1]
        m["written_ranks"] = 1

    _edit_manifest(ck, drop_rank_1)
    r = run_cli(["infer", "--resume", ck, "--quiet"], ranks=2)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("mpisdnn: error")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert "rank-00001.npz, which its manifest does not list" in errors[0]


def test_resumed_block_sized_by_g_rows_is_checked_against_memory(files, stopped):
    """With TSV inputs nothing but the manifest says how many inputs the run had: a rank's
    block (sized by ``g_rows``) is checked against the available memory before it exists."""
    from mpi4py import MPI

    from mpisdnn.parallel import AgreedError
    from mpisdnn.sdnn.checkpoint import choose_checkpoint, read_live_rows

    _edit_manifest(stopped, _set("g_rows", 1 << 50))
    manifest, _ = choose_checkpoint(MPI.COMM_SELF, stopped)
    with pytest.raises(AgreedError, match="more than the .* available"):
        read_live_rows(MPI.COMM_SELF, manifest)


def test_resume_with_the_runs_own_layer_count_is_accepted(files, stopped, capsys):
    """Issue 42 item 12: ``--resume --layers 6`` of a 6-layer run that named no ``--layers``
    was refused as contradicting it."""
    code, out, err = _main(["infer", "--resume", stopped, "--layers", "6"], capsys)
    assert code == 0 and "resuming from" in out and "categories 11" in out, (out, err)


needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"),
    reason="a read-only bind mount needs root and unshare",
)


@needs_namespaces
def test_resume_from_a_read_only_directory(files, stopped):
    """Issue 42 item 12: ``--resume`` on a read-only mount was ``OSError: [Errno 30] ...
    LOCK``. A resume that writes nothing runs (no lock needed: nobody can write there); one
    that would write checkpoints is refused in one line."""
    inner = (f"mount --bind {stopped} {stopped} && mount -o remount,bind,ro {stopped} && "
             f"{sys.executable} -m mpisdnn infer --resume {stopped} --quiet {{}}")  # fmt: skip
    for extra, code in (("", 0), ("--checkpoint-every 5", 2)):
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            inner.format(extra)], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
        if "mount:" in r.stderr:
            pytest.skip(f"no read-only bind mount here: {r.stderr.strip()}")
        assert r.returncode == code, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and "Errno" not in r.stderr, r.stderr
    assert "Read-only file system" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr


def test_checkpoint_directory_that_is_a_loop_of_links(files, tmp_path, capsys):
    """Issue 42 item 12: was ``FileExistsError`` (exit 2, the raw exception)."""
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    code, _, err = _main(_run(files, loop), capsys)
    assert code == 2 and len(err) == 1 and "a loop of symbolic links" in err[0], err
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    code, _, err = _main(_run(files, dangling), capsys)
    assert code == 2 and len(err) == 1 and "a symbolic link to nothing" in err[0], err


def test_bias_with_a_network_file_is_refused(files, capsys):
    """Issue 42 item 12: ``--bias`` was silently ignored for HDF5 networks (their own bias
    was used); refused like ``convert network --bias`` of a network file."""
    code, _, err = _main(["infer", "--network", files / "n.h5", "--inputs", files / "a.h5",
                          "--bias", "-0.2"], capsys)  # fmt: skip
    assert code == 2 and len(err) == 1 and "--bias applies to TSV layers" in err[0], err


@pytest.mark.parametrize(
    "make",
    [
        lambda P, O: P(network="n.h5", inputs="i.h5", layers="4"),
        lambda P, O: P(network="n.h5", inputs="i.h5", bias="-0.3"),
        lambda P, O: P(network="n.h5", inputs="i.h5", checkpoint_every=float("nan")),
        lambda P, O: P(network=3, inputs="i.h5"),
        lambda P, O: P(network="n.h5", inputs="i.h5", batch_rows=np.float64(5)),
        lambda P, O: O(prune="no"),
        lambda P, O: O(threads=np.float64(2.0)),
    ],
    ids=["layers-text", "bias-text", "checkpoint-every-nan", "network-int", "batch-rows-float",
         "prune-text", "threads-float"],
)  # fmt: skip
def test_plan_and_option_fields_are_validated_by_type(make):
    """Issue 42 item 12: a field given as text was accepted by one dataclass and refused by
    another (``ymax="32"`` against ``layers="4"``); every field of the plan and the options
    is checked, and the message shows the value without a Python repr."""
    from mpisdnn.errors import UsageError
    from mpisdnn.sdnn.options import InferOptions
    from mpisdnn.sdnn.session import InferPlan

    with pytest.raises(UsageError) as got:
        make(InferPlan, InferOptions).check(1)
    assert "np." not in str(got.value) and "None" not in str(got.value)
