"""Inputs TSV files for the parallel reader's tests, and an independent reference reader."""

import numpy as np
import scipy.sparse as sp

#: Value spellings the official files and other writers use (all must parse exactly).
VALUES = [
    "1",
    "1.0",
    "6.250000e-02",
    "0.0625",
    "-3.25e+01",
    "7.",
    ".5",
    "+2",
    "0",
    "-0",
    "123456.789012",
    "3.4028234e38",  # beyond the exact fast path: the serial reader takes the block
    "1e-30",
    "0.1",
    "2.5E-3",
]


def reference(path, neurons, rows=None):
    """Plain Python: split each non-blank line, ``float()`` every field, scipy CSR."""
    r, c, v = [], [], []
    with open(path, "rb") as fh:
        for line in fh.read().splitlines():
            fields = line.split()
            if not fields:
                continue
            r.append(int(float(fields[0])) - 1)
            c.append(int(float(fields[1])) - 1)
            v.append(float(fields[2]))
    nrows = rows if rows is not None else max(r) + 1
    vals = np.array(v, dtype=np.float64).astype(np.float32)
    m = sp.csr_matrix((vals, (np.array(r), np.array(c))), shape=(nrows, neurons))
    m.sort_indices()
    return m


def messy_file(path, rows, neurons, seed, crlf=False, pad=0):
    """A column-ordered file (a row's entries spread over the whole file) with mixed value
    spellings, blank lines, spaces and CRLF, and ``pad`` leading blank lines (shifting where
    the ranks' byte ranges cut)."""
    rng = np.random.default_rng(seed)
    y = sp.random(rows, neurons, density=0.3, random_state=rng, format="coo")
    order = np.lexsort((y.row, y.col))
    eol = "\r\n" if crlf else "\n"
    lines = ["" for _ in range(pad)]
    for k, i in enumerate(order):
        value = VALUES[int(rng.integers(len(VALUES)))]
        sep = "\t" if k % 7 else " \t "
        row = str(y.row[i] + 1)
        if k % 11 == 5:
            row = row + ".0"  # an integer written as a float: the serial reader's block
        lines.append(f"{row}{sep}{y.col[i] + 1}\t{value}")
        if k % 13 == 0:
            lines.append("   ")
    path.write_bytes((eol.join(lines) + eol).encode())
    return path


def fixed_width_file(path, rows, neurons, nparts, seed):
    """Lines of one length, a multiple of ``nparts`` of them: every rank's byte range starts
    exactly at a line start."""
    rng = np.random.default_rng(seed)
    pairs = {
        (int(r), int(c))
        for r, c in zip(rng.integers(1, rows + 1, 60), rng.integers(1, neurons + 1, 60))
    }
    pairs = sorted(pairs, key=lambda rc: (rc[1], rc[0]))
    pairs = pairs[: len(pairs) - len(pairs) % nparts]
    lines = [f"{r:06d}\t{c:06d}\t1.5\n" for r, c in pairs]
    path.write_text("".join(lines))
    return path


READ_KERNELS = ("parse_block", "band_counts", "band_scatter", "place_keys", "owner_cuts",
                "sort_rows", "count_newlines")  # fmt: skip


def kernel_types(monkeypatch, run, module=None, names=READ_KERNELS) -> dict:
    """``{kernel: {argument types}}``: what ``run()`` passes the compiled kernels ``names``
    of ``module`` (default: the inputs reader's, ``formats._tsv_kernels``), each called
    through the module (numba's own ``typeof``, so one entry per specialisation it
    dispatches to)."""
    if module is None:
        from mpisdnn.formats import _tsv_kernels as module

    seen = {}
    with monkeypatch.context() as m:
        for name in names:
            m.setattr(module, name, _spy(getattr(module, name), name, seen))
        run()
    return seen


def _spy(real, name, seen):
    import numba

    def spy(*args):
        seen.setdefault(name, set()).add(tuple(numba.typeof(a) for a in args))
        return real(*args)

    return spy


def uncovered(read: dict, warm: dict) -> dict:
    """The specialisations ``read`` used that ``warm`` did not compile."""
    return {k: t - warm.get(k, set()) for k, t in read.items() if t - warm.get(k, set())}
