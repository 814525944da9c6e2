"""``mpisdnn challenge`` on tiny configuration sets (N=1024, 2-3 layers, a few hundred inputs).

Risks guarded: a configuration checked against the wrong truth or against mpisdnn itself,
a finished configuration run again (or a cached file regenerated) after an interruption,
the official files not found in the layout the challenge publishes, a truth file named for
another layer count paired silently with a run, and the independent check that cannot fail.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile

import numpy as np
import pytest

from mpisdnn.cli import main

from .conftest import SHARED, run_cli, self_comm

pytestmark = pytest.mark.xdist_group("challenge")


def _challenge(data, out, *extra, comm=None):
    argv = ["challenge", str(data), "--neurons", "1024", "--out", str(out), "--progress", "0",
            *map(str, extra)]  # fmt: skip
    return main(argv, comm or self_comm())


def _rows(out):
    return json.loads((out / "challenge.json").read_text())["rows"]


def _mtimes(d):
    return {p.name: p.stat().st_mtime_ns for p in d.iterdir()}


@pytest.fixture(scope="session")
def generated(tmp_path_factory):
    """A sitting with nothing official: network and inputs generated, reference check."""
    tmp = tmp_path_factory.mktemp("challenge")
    (tmp / "data").mkdir()
    code = _challenge(tmp / "data", tmp / "out", "--layers", 2, 3, "--count", 300)
    return tmp, code


def test_generated_sitting_passes_against_the_reference(generated):
    tmp, code = generated
    assert code == 0
    rows = _rows(tmp / "out")
    assert [(r["n"], r["l"]) for r in rows] == [(1024, 2), (1024, 3)]
    for r in rows:
        assert r["status"] == "PASS" and r["check"] == "reference, all rows"
        assert r["network_origin"] == r["inputs_origin"] == "generated"
        assert r["truth_origin"] == "reference" and r["rows"] == r["checked_rows"] == 300
        assert r["edges"] == r["l"] * 32 * 1024
        assert set(r["published_te_per_s"]) == {"2020 champion", "XY-2021", "SNICIT"}
    md = (tmp / "out" / "challenge.md").read_text()
    assert md.count("**PASS**") == 2 and md.count("| generated | generated |") == 2
    assert (tmp / "out" / "challenge.png").stat().st_size > 0


def test_resume_skips_finished_configurations_and_reuses_the_cache(generated, capsys):
    tmp, _ = generated
    out, cache = tmp / "out", tmp / "out" / "cache"
    runs = out / "runs"
    before, kept = _mtimes(cache), (runs / "N1024-L2.json").stat().st_mtime_ns
    (runs / "N1024-L3.json").unlink()  # a sitting stopped after its first configuration
    capsys.readouterr()
    assert _challenge(tmp / "data", out, "--layers", 2, 3, "--count", 300) == 0
    said = capsys.readouterr().out
    assert "N=1024 L=2: done before" in said and "[2/2] N=1024 L=3: PASS" in said
    assert "generating" not in said and "converting" not in said
    assert _mtimes(cache) == before  # network and inputs re-used, not made again
    assert (runs / "N1024-L2.json").stat().st_mtime_ns == kept
    assert json.loads((runs / "N1024-L3.json").read_text())["status"] == "PASS"


def _official_style(d, layers, count, seed=7):
    """A data folder in the published layout, from generated files: ``neuron1024/`` layer
    TSVs, ``sparse-images-1024.tsv`` and its truth ``neuron1024-l{L}-categories.tsv``
    computed by the scipy reference (``generate inputs --network``)."""
    d.mkdir()
    ok = main(["generate", "network", "--neurons", "1024", "--layers", str(layers), "--seed",
               str(seed), "--tsv-dir", str(d / "neuron1024"), "--progress", "0"], self_comm())
    assert ok == 0
    assert main(["generate", "inputs", "--neurons", "1024", "--count", str(count), "--seed",
                 str(seed), "--network", str(d / "neuron1024"), "--tsv",
                 str(d / "sparse-images-1024.tsv"), "--truth-tsv",
                 str(d / f"neuron1024-l{layers}-categories.tsv"), "--progress", "0"],
                self_comm()) == 0  # fmt: skip


@pytest.fixture(scope="session")
def official_style(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("official-style")
    _official_style(tmp / "data", 3, 400)
    return tmp


def test_official_files_are_found_converted_once_and_checked_by_their_truth(official_style):
    tmp = official_style
    assert _challenge(tmp / "data", tmp / "out", "--layers", 3) == 0
    (row,) = _rows(tmp / "out")
    assert row["network_origin"] == row["inputs_origin"] == row["truth_origin"] == "official"
    assert row["check"] == "official truth" and row["status"] == "PASS"
    assert row["truth"].endswith("neuron1024-l3-categories.tsv") and row["converted_now"]
    assert row["rows"] == 400
    # a configuration deeper than the official network runs a generated one, says so, and
    # is checked by the reference (the official truth belongs to the official network)
    assert _challenge(tmp / "data", tmp / "out", "--layers", 3, 4, "--count", 400) == 0
    rows = _rows(tmp / "out")
    assert rows[0]["status"] == "PASS" and rows[1]["status"] == "PASS"
    assert rows[1]["network_origin"] == "generated" and rows[1]["inputs_origin"] == "official"
    assert rows[1]["check"] == "reference, all rows"


def test_a_wrong_truth_fails(official_style, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(official_style / "data", data)
    truth = data / "neuron1024-l3-categories.tsv"
    lines = truth.read_text().splitlines()
    assert len(lines) > 2
    truth.write_text("\n".join(lines[1:]) + "\n")  # one category missing from the truth
    assert _challenge(data, tmp_path / "out", "--layers", 3) == 1
    (row,) = _rows(tmp_path / "out")
    assert row["status"] == "FAIL" and row["check"] == "official truth"


@pytest.mark.parametrize("how", ["full", "sampled"])
def test_reference_check_fails_on_a_wrong_category(generated, how):
    """The independent check itself: the right categories pass, one swapped for a dead row
    fails, on every row and on sampled rows."""
    from mpisdnn.sdnn import challenge as ch

    tmp, _ = generated
    out = tmp / "out"
    row = json.loads((out / "runs" / "N1024-L2.json").read_text())
    extra = {"full_check_edges": 0.0, "check_rows": 300} if how == "sampled" else {}
    opts = ch.ChallengeOptions(data_dir=str(tmp / "data"), neurons=(1024,), layers=(2,),
                               out=str(out), inputs=300, **extra)  # fmt: skip
    comm = self_comm()
    src = ch.find_sources(opts.data_dir, 1024)
    inputs = ch._read_inputs(comm, opts, src, 1024)
    everything = ch.ChallengeOptions(**{**opts.__dict__, "full_check_edges": 1e30})
    # the reference's own answer (every row), then the run's claim altered by one row
    right = ch._reference_rows(everything, row["network"], 2, inputs, np.arange(300))
    assert right.size == row["categories"] > 1
    res = ch.reference_check(comm, opts, row["network"], 2, inputs, right)
    assert res["pass"] is True
    assert res["check"] == ("reference, all rows" if how == "full" else "reference, sampled rows")
    wrong = np.sort(np.append(right[1:], np.setdiff1d(np.arange(1, 301), right)[0]))
    assert ch.reference_check(comm, opts, row["network"], 2, inputs, wrong)["pass"] is False


def test_sources_found_in_the_published_layout(tmp_path):
    from mpisdnn.sdnn.challenge import find_sources, truth_layers

    (tmp_path / "dnn").mkdir()
    (tmp_path / "mnist").mkdir()
    (tmp_path / "dnn" / "neuron4096.tar.gz").write_bytes(b"")
    (tmp_path / "dnn" / "neuron4096-l120-categories.tsv").write_text("1\n")
    (tmp_path / "dnn" / "neuron4096-l1920-categories.tsv").write_text("1\n")
    (tmp_path / "mnist" / "sparse-images-4096.tsv.gz").write_bytes(b"")
    src = find_sources(tmp_path, 4096)
    assert src.network.endswith("dnn/neuron4096.tar.gz") and src.network_layers is None
    assert src.inputs.endswith("mnist/sparse-images-4096.tsv.gz")
    assert sorted(src.truth) == [120, 1920]
    # the unpacked layout wins over the archive once it has layer files; .tsv over .tsv.gz
    (tmp_path / "neuron4096").mkdir()
    for k in (1, 2):
        (tmp_path / "neuron4096" / f"n4096-l{k}.tsv").write_text("1\t1\t0.0625\n")
    (tmp_path / "sparse-images-4096.tsv").write_text("1\t1\t1\n")
    src = find_sources(tmp_path, 4096)
    assert src.network.endswith("neuron4096") and src.network_layers == 2
    assert src.inputs.endswith("sparse-images-4096.tsv")
    assert find_sources(tmp_path, 1024).network is None
    assert truth_layers("x/neuron65536-l1920-categories.tsv") == (65536, 1920)
    assert truth_layers("cats.tsv") is None


def test_a_size_given_twice_runs_once(generated):
    """``--neurons 1024 1024`` ran every configuration of N=1024 twice (the table had four
    rows for ``--layers 2 2``); each configuration now runs and is tabled once."""
    from mpisdnn.sdnn.challenge import ChallengeOptions

    tmp, _ = generated
    opts = ChallengeOptions(data_dir=str(tmp / "data"), neurons=(1024, 4096, 1024),
                            layers=(3, 2, 3))  # fmt: skip
    assert opts.neurons == (1024, 4096) and opts.layers == (2, 3)
    out = tmp / "twice"
    assert _challenge(tmp / "data", out, "--neurons", 1024, "--layers", 2, 2, "--count", 300,
                      "--cache", tmp / "out" / "cache") == 0  # fmt: skip
    assert [(r["n"], r["l"]) for r in _rows(out)] == [(1024, 2)]


def test_an_unpacking_cut_short_gives_way_to_the_archive_and_is_said(tmp_path):
    """A ``neuron{N}/`` directory with fewer layer files than the sitting asks for (a ``tar
    xzf`` stopped) was converted and passed over for a generated network, although the whole
    archive was beside it, with no word. Now the archive is used and one note says why; with
    no archive, the note says which configurations run a generated network."""
    from mpisdnn.sdnn.challenge import find_sources

    d = tmp_path / "neuron64"
    d.mkdir()
    for k in (1, 2, 3, 5, 6):  # n64-l4.tsv missing
        (d / f"n64-l{k}.tsv").write_text("1\t1\t0.0625\n")
    src = find_sources(tmp_path, 64, 6)
    assert src.network == str(d) and src.network_layers == 3
    (note,) = src.notes
    assert "holds 3 layer files (n64-l4.tsv is missing; 2 layer files numbered after it are " \
           "not used): configurations of more layers run a generated network" in note
    (tmp_path / "neuron64.tar.gz").write_bytes(b"")
    src = find_sources(tmp_path, 64, 6)
    assert src.network == str(tmp_path / "neuron64.tar.gz") and src.network_layers is None
    (note,) = src.notes
    assert note.endswith(f"fewer than the 6 asked: using {tmp_path / 'neuron64.tar.gz'}")
    src = find_sources(tmp_path, 64, 3)  # enough layers for the sitting: the gap is said
    assert src.network == str(d) and src.network_layers == 3
    assert src.notes == (f"{d} holds 3 layer files (n64-l4.tsv is missing; 2 layer files "
                         f"numbered after it are not used)",)  # fmt: skip
    assert find_sources(tmp_path, 64).notes == src.notes  # no depth asked: the directory


def test_a_decompression_cut_short_gives_way_to_the_gz_and_truth_may_be_gz(tmp_path):
    """``sparse-images-{N}.tsv`` is preferred to its ``.gz``, but a ``gunzip -k`` stopped
    leaves a shorter ``.tsv``: its size against the ``.gz``'s trailer tells it, the ``.gz``
    is read and a note says so. A gzipped truth file is found too."""
    import gzip

    from mpisdnn.sdnn.challenge import find_sources

    text = b"".join(b"%d\t%d\t1\n" % (r, c) for r in range(1, 200) for c in (3, 9))
    (tmp_path / "sparse-images-64.tsv.gz").write_bytes(gzip.compress(text))
    (tmp_path / "sparse-images-64.tsv").write_bytes(text)
    (tmp_path / "neuron64-l120-categories.tsv.gz").write_bytes(gzip.compress(b"1\n"))
    src = find_sources(tmp_path, 64)
    assert src.inputs == str(tmp_path / "sparse-images-64.tsv") and src.notes == ()
    assert src.truth == {120: str(tmp_path / "neuron64-l120-categories.tsv.gz")}
    (tmp_path / "sparse-images-64.tsv").write_bytes(text[:-1000])
    src = find_sources(tmp_path, 64)
    assert src.inputs == str(tmp_path / "sparse-images-64.tsv.gz")
    (note,) = src.notes
    assert f"({len(text) - 1000:,} bytes) is not the whole text of" in note
    assert f"its gzip trailer says {len(text):,} bytes" in note
    (tmp_path / "neuron64-l120-categories.tsv").write_text("1\n")
    assert find_sources(tmp_path, 64).truth[120].endswith("neuron64-l120-categories.tsv")


def test_a_layer_cut_at_a_line_end_is_said_by_the_sitting(official_style, tmp_path, capfd):
    """A layer file cut at the end of a line parses as a smaller layer: the official network
    ran, and passed or failed, as if it were the one published. The sitting now names the
    layer that lacks the challenge's 32 weights per neuron (the truth still decides)."""
    data = tmp_path / "data"
    shutil.copytree(official_style / "data", data)
    layer = data / "neuron1024" / "n1024-l2.tsv"
    lines = layer.read_text().splitlines(keepends=True)
    layer.write_text("".join(lines[:20000]))
    capfd.readouterr()
    assert _challenge(data, tmp_path / "out", "--layers", 3) == 1  # the truth: FAIL
    err = capfd.readouterr().err
    (line,) = [x for x in err.splitlines() if "published" in x]
    assert line == ("mpisdnn challenge: warning: N=1024 L=3: layer 2 of the official network "
                    "has 20,000 weights, the challenge's layers have 32 per neuron (32,768): "
                    "not the network as published (a layer file cut short?)")  # fmt: skip
    capfd.readouterr()
    assert _challenge(official_style / "data", tmp_path / "out2", "--layers", 3) == 0
    assert "published" not in capfd.readouterr().err


def _archive_supported(tmp_path) -> bool:
    """Whether ``convert network`` reads a ``neuron{N}.tar.gz`` (issue 41's readers)."""
    from mpisdnn.formats.tsv import write_triples
    from mpisdnn.generate import radixnet

    d = tmp_path / "probe"
    (d / "neuron1024").mkdir(parents=True)
    write_triples(d / "neuron1024" / "n1024-l1.tsv", radixnet(1024, 1, seed=1).layers[0])
    with tarfile.open(d / "neuron1024.tar.gz", "w:gz") as t:
        t.add(d / "neuron1024", arcname="neuron1024")
    res = run_cli(["convert", "network", d / "neuron1024.tar.gz", "-o", d / "n.h5"])
    return res.returncode == 0


def test_official_archive_as_published(tmp_path, capfd):
    """The official neuron1024.tar.gz (../shared) and its 120-layer truth; inputs generated,
    so the reference checks them. Unpacked when ``convert`` cannot read archives yet. The
    conversion prints challenge's own progress lines (it printed none: 9 silent minutes for
    neuron65536.tar.gz)."""
    archive = SHARED / "neuron1024.tar.gz"
    if not archive.exists():
        pytest.skip(f"official data not present at {SHARED} (only on the developers' machines)")
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(SHARED / "neuron1024-l120-categories.tsv", data)
    if _archive_supported(tmp_path):
        os.symlink(archive, data / "neuron1024.tar.gz")
    else:  # the unpacked layout (what the challenge's archive gives)
        with tarfile.open(archive) as t:
            t.extractall(data, filter="data")
    capfd.readouterr()
    assert _challenge(data, tmp_path / "out", "--layers", 120, "--count", 200,
                      "--progress", "1e-9") == 0  # fmt: skip
    assert "[progress] converting" in capfd.readouterr().out
    (row,) = _rows(tmp_path / "out")
    assert row["network_origin"] == "official" and row["inputs_origin"] == "generated"
    assert row["truth_origin"] == "reference" and row["check"] == "reference, all rows"
    assert row["edges"] == 120 * 32 * 1024 and row["status"] == "PASS"


def test_infer_warns_once_when_the_truth_names_another_layer_count(official_style, capfd):
    """``--layers`` defaults to all the network's layers: a truth named for 2 layers with a
    3-layer network gets one warning line (and the check still decides: FAIL here)."""
    d = official_style / "data"
    truth = official_style / "neuron1024-l2-categories.tsv"
    shutil.copy(d / "neuron1024-l3-categories.tsv", truth)
    code = main(["infer", "--network", str(d / "neuron1024"), "--inputs",
                 str(d / "sparse-images-1024.tsv"), "--truth", str(truth), "--quiet"],
                self_comm())  # fmt: skip
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "named for 2 layers, the run has 3" in warnings[0]
    assert "--layers 2" in warnings[0] and code == 0  # the 3-layer truth passes a 3-layer run
    main(["infer", "--network", str(d / "neuron1024"), "--inputs",
          str(d / "sparse-images-1024.tsv"), "--truth", str(d / "neuron1024-l3-categories.tsv"),
          "--quiet"], self_comm())  # fmt: skip
    assert "warning" not in capfd.readouterr().err


def test_two_ranks_and_resume(tmp_path):
    """2 ranks through mpiexec: the same categories as 1 rank; a finished configuration is
    skipped by the next sitting."""
    data = tmp_path / "data"
    data.mkdir()
    args = ["challenge", data, "--neurons", "1024", "--layers", 2, "--count", 300,
            "--out", tmp_path / "out", "--progress", "0"]  # fmt: skip
    res = run_cli(args, ranks=2, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (row,) = _rows(tmp_path / "out")
    assert row["ranks"] == 2 and row["status"] == "PASS"
    res = run_cli(args, ranks=2, timeout=300)
    assert res.returncode == 0 and "done before" in res.stdout, res.stdout + res.stderr
    serial = tmp_path / "serial"
    assert _challenge(data, serial, "--layers", 2, "--count", 300,
                      "--cache", tmp_path / "out" / "cache") == 0  # fmt: skip
    assert _rows(serial)[0]["categories"] == row["categories"]
