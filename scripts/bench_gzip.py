#!/usr/bin/env python
"""Which gzip decompressor should the readers use? Every candidate on the same file, one run.

    python scripts/bench_gzip.py FILE.gz [--repeat 3] [--block 4M]

Each candidate streams the whole file, as a reader does (blocks of ``--block`` bytes of
output handed to the caller), to nothing; the figure is MB/s of decompressed text (and of
the compressed file). Peers in the same run: ``gzip -dc FILE > /dev/null`` and ``pigz -dc``
(when installed). Candidates that are not installed are listed as such:

* ``zlib``: the standard library's ``zlib.decompressobj`` (the fallback, always there);
* ``isal``: ``isal.isal_zlib.decompressobj`` (Intel ISA-L's inflate);
* ``isal-threaded``: ``isal.igzip_threaded.open(threads=1)`` (inflate in a second thread);
* ``zlib-ng``: ``zlib_ng.zlib_ng.decompressobj``;
* ``rapidgzip-P``: ``rapidgzip.open(parallelization=P)`` for P = 1 and the cores;
* ``indexed_gzip``: ``indexed_gzip.IndexedGzipFile`` (zlib underneath, with seek points);
* ``mpisdnn``: :func:`mpisdnn.formats.gz.open_bytes` (the reader the project uses).

The load average is printed beside the figures: re-measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time


def _stream_obj(make, path, block):
    def run():
        d = make()
        total = 0
        with open(path, "rb") as fh:
            while True:
                raw = fh.read(1 << 20)
                if not raw:
                    break
                while raw:
                    out = d.decompress(raw, block)
                    total += len(out)
                    raw = d.unconsumed_tail
                    if d.eof:
                        rest = d.unused_data
                        d = make()
                        raw = rest
        return total

    return run


def _stream_file(opener, path, block):
    def run():
        total = 0
        with opener(path) as fh:
            buf = bytearray(block)
            view = memoryview(buf)
            while True:
                n = fh.readinto(view)
                if not n:
                    break
                total += n
        return total

    return run


def candidates(path, block):
    import zlib

    out = {"zlib": _stream_obj(lambda: zlib.decompressobj(47), path, block)}
    try:
        from isal import igzip_threaded, isal_zlib

        out["isal"] = _stream_obj(lambda: isal_zlib.decompressobj(47), path, block)
        out["isal-threaded"] = _stream_file(
            lambda p: igzip_threaded.open(p, "rb", threads=1), path, block
        )
    except ImportError:
        out["isal"] = None
    try:
        from zlib_ng import zlib_ng

        out["zlib-ng"] = _stream_obj(lambda: zlib_ng.decompressobj(47), path, block)
    except ImportError:
        out["zlib-ng"] = None
    try:
        import rapidgzip

        for p in sorted({1, os.cpu_count() or 1}):
            out[f"rapidgzip-{p}"] = _stream_file(
                lambda q, p=p: rapidgzip.open(q, parallelization=p), path, block
            )
    except ImportError:
        out["rapidgzip"] = None
    try:
        import indexed_gzip

        out["indexed_gzip"] = _stream_file(
            lambda q: indexed_gzip.IndexedGzipFile(q), path, block
        )
    except ImportError:
        out["indexed_gzip"] = None
    from mpisdnn.formats import gz

    def ours():
        total = 0
        with gz.open_bytes(path) as s:
            for chunk in s.blocks(block):
                total += len(chunk)
        return total

    out["mpisdnn"] = ours
    for tool in ("gzip", "pigz"):
        exe = shutil.which(tool)
        if exe is None:
            out[f"{tool} -dc"] = None
            continue

        def run(exe=exe):
            with open(os.devnull, "wb") as null:
                subprocess.run([exe, "-dc", path], stdout=null, check=True)
            return None

        out[f"{tool} -dc"] = run
    return out


def main(argv=None) -> None:
    from mpisdnn.system import load_average_text

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--block", default="4M")
    args = p.parse_args(argv)
    block = int(args.block.rstrip("MK")) << (20 if args.block.endswith("M") else 10)
    packed = os.path.getsize(args.file)
    print(f"{args.file}: {packed / 1e6:.1f} MB compressed; {load_average_text()}")
    text = None
    cands = {k: v for k, v in candidates(args.file, block).items() if v is not None}
    for name in candidates(args.file, block):
        if name not in cands:
            print(f"  {name:16s} not installed")
    best = dict.fromkeys(cands, float("inf"))
    for _ in range(args.repeat):  # rounds over every candidate: load changes hit all alike
        for name, fn in cands.items():
            t0 = time.perf_counter()
            got = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
            if got is not None:
                text = got if text is None else text
                if got != text:
                    raise SystemExit(f"{name}: {got} bytes, others {text}")
    rows = list(best.items())
    gzip_s = dict(rows).get("gzip -dc")
    for name, sec in rows:
        ratio = f"  {gzip_s / sec:5.2f}x gzip -dc" if gzip_s else ""
        print(
            f"  {name:16s} {sec:7.3f} s  {text / sec / 1e6:7.0f} MB/s text  "
            f"{packed / sec / 1e6:6.0f} MB/s packed{ratio}"
        )
    print(f"({text / 1e6:.1f} MB of text; best of {args.repeat}; {load_average_text()})")
    print("re-measure on a quiet machine: python scripts/bench_gzip.py FILE.gz --repeat 5")


if __name__ == "__main__":
    main()
