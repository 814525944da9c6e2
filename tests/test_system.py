"""``mpisdnn.system``: the load average the benchmarks print next to their timings."""

import math
import os

import numpy as np
import pytest

from mpisdnn import system


def test_load_average_reads_proc_loadavg(tmp_path, monkeypatch):
    f = tmp_path / "loadavg"
    f.write_text("3.07 1.50 0.05 2/81 30044\n")
    monkeypatch.setattr(system, "_LOADAVG", str(f))
    assert system.load_average() == (3.07, 1.5, 0.05)
    # the text keeps /proc/loadavg's two decimals (old benchmark results compare as strings)
    assert system.load_average_text() == "3.07"
    assert system.load_average_text(3) == "3.07 1.50 0.05"
    with pytest.raises(ValueError):
        system.load_average_text(4)


def test_load_average_falls_back_then_gives_none(tmp_path, monkeypatch):
    monkeypatch.setattr(system, "_LOADAVG", str(tmp_path / "missing"))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.25, 2.0))
    assert system.load_average() == (0.5, 0.25, 2.0)
    assert system.load_average_text(2) == "0.50 0.25"

    def unknown():
        raise OSError("load average unobtainable")

    monkeypatch.setattr(os, "getloadavg", unknown)
    assert all(math.isnan(x) for x in system.load_average())
    assert system.load_average_text() == "?"


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="Linux /proc only")
def test_load_average_matches_the_kernel():
    # /proc/loadavg changes every 5 s: retry until two reads bracket ours unchanged
    for _ in range(5):
        before = open("/proc/loadavg").read().split()[:3]
        text = system.load_average_text(3)
        if open("/proc/loadavg").read().split()[:3] == before:
            break
    assert text.split() == before
    assert all(x >= 0 for x in system.load_average())


def test_release_hands_back_only_whole_pages_past_start():
    """``release`` drops the pages wholly past ``arr[start - 1]`` (they read as zeros again,
    an anonymous private map) and keeps every value before ``start``."""
    import mmap

    from mpisdnn.system import release

    m = mmap.mmap(-1, 4 * 102_400, flags=mmap.MAP_PRIVATE)  # whole pages
    a = np.frombuffer(m, np.int32)
    a[:] = 7
    start = 30_001  # inside a page: that page stays
    release(a, start)
    page_end = -(-(a.ctypes.data + 4 * start) // 4096) * 4096
    first_free = (page_end - a.ctypes.data) // 4
    assert np.all(a[:first_free] == 7) and np.all(a[first_free:] == 0)
    release(a, a.size)  # nothing past the end: a no-op
    assert np.all(a[:first_free] == 7)
