"""One line on a full disk for the writers the first sweep missed (issue 31 item 6).

A full disk is simulated with a file size limit (``RLIMIT_FSIZE``: writes past it fail with
``EFBIG``, SIGXFSZ is ignored by Python), set in the child after MPI start-up, so no tmpfs
and no root are needed. Each case checks: exit 2, one ``mpisdnn: error:`` line naming the
output and "no space left", and nothing left behind but what was there before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from mpisdnn.formats import write_inputs, write_network
from mpisdnn.generate import digit_images, radixnet
from mpisdnn.generate.graphs import bipartite
from mpisdnn.projection import write_graph
from mpisdnn.sdnn.checkpoint_identity import RUN_FILE

from .test_writers_reliability import _assert_one_error_line, _cli


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("full")
    write_network(d / "n.h5", radixnet(1024, 4, seed=1))
    write_inputs(d / "in.h5", digit_images(300, 1024, seed=2))
    write_graph(d / "g.h5", bipartite(3000, 400, edges=60000, seed=1))
    return d


def test_checkpoint_on_a_full_disk_is_one_line_and_keeps_nothing_half_written(files, tmp_path):
    """Was: ``RUN.json`` failing gave "OSError: [Errno 27] File too large" without a file and
    left ``.RUN.json.tmp-PID``; a checkpoint failing on one rank was an internal error (exit 3,
    a traceback per rank) and left ``.ckpt-000001.tmp/``."""
    infer = ["infer", "--network", files / "n.h5", "--inputs", files / "in.h5", "--backend",
             "reference", "--quiet", "--checkpoint-every", "0.000001"]  # fmt: skip
    ck = tmp_path / "a"
    res = _cli([*infer, "--checkpoint", ck], fsize=64)
    _assert_one_error_line(res, f"{ck}{os.sep}{RUN_FILE}", "no space left")
    assert os.listdir(ck) == []
    ck = tmp_path / "b"
    res = _cli([*infer, "--checkpoint", ck], ranks=2, fsize=4096)
    _assert_one_error_line(res, f"{ck}{os.sep}ckpt-000001", "no space left")
    assert os.listdir(ck) == [RUN_FILE]  # the run's identity stays; no temporary directory


@pytest.mark.parametrize("compress", ["none", "gzip"])
def test_projection_parts_filling_mid_stream_at_two_ranks_is_one_line(files, tmp_path, compress):
    """Was: each rank raised when its part hit the limit while streaming: one line per rank
    plus MPICH's ``Abort(2)`` line. Now kept until the (collective) close: one line."""
    out = tmp_path / "h.h5"
    res = _cli(["project", files / "g.h5", "--quiet", "-o", out, "--memory-per-rank", "256K",
                "--compress", compress], ranks=2, fsize=20000)  # fmt: skip
    _assert_one_error_line(res, str(out), "no space left")
    assert os.listdir(tmp_path) == []


def test_kernel_cache_on_a_full_disk_does_not_end_the_command(tmp_path):
    """numba saving a new kernel to a full disk raised out of the compile: every command's
    first run on that disk ended with a traceback (exit 3) before writing anything."""
    code = textwrap.dedent(
        """
        import resource
        from numba import njit
        from mpisdnn.system import tolerate_full_numba_cache
        tolerate_full_numba_cache()
        tolerate_full_numba_cache()  # idempotent
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

        @njit(cache=True)
        def twice(x):
            return 2 * x

        print(twice(21))
        """
    )
    (tmp_path / "k.py").write_text(code)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, str(tmp_path / "k.py")], capture_output=True,
                         text=True, env=env, timeout=120)  # fmt: skip
    assert res.returncode == 0 and res.stdout.split() == ["42"], res.stderr
