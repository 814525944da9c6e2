#!/usr/bin/env python
"""Survivor counts of generated digit inputs on a network: the calibration of ``generate inputs``.

The official 60,000 MNIST inputs leave 1,812 survivors after 120 layers at N=1024 (1,918 at
N=16384, 1,994 at N=65536). Survival is set by the stroke-width mix of the generated digits
(``mpisdnn.generate.images``: per-digit thin ranges plus a share of bold digits). This script
measures, on one network:

* ``--components``: the survival rate of thin-only and bold-only sets and, per N, the bold
  share that would hit the target, ``q = (t - thin) / (bold - thin)``;
* otherwise: the survivors of the default set (or ``--bold-share``), scaled to 60,000 rows
  when ``--count`` is smaller, with the nnz per row and the generation time.

Inference uses the fast cpu engine on one process, in row blocks (``--block``) to bound
memory: survival is a property of each row alone. Examples::

    python scripts/calibrate_inputs.py --network neuron1024/ --neurons 1024
    python scripts/calibrate_inputs.py --network net65536.h5 --neurons 65536 --count 6000 \\
        --layers 40 --components
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np

#: Official survivors of 60,000 inputs after 120 layers (the counts do not change with depth).
TARGETS = {1024: 1812, 16384: 1918, 65536: 1994}


def survivors(net, neurons, count, seed, bold_share, block):
    """Survivor row indices (0-based) of rows ``[0, count)``, generation and inference time."""
    from mpi4py import MPI

    import mpisdnn
    from mpisdnn.generate import digit_images

    found, gen, run, nnz = [], 0.0, 0.0, 0
    for start in range(0, count, block):
        t0 = time.perf_counter()
        y = digit_images(min(block, count - start), neurons, seed, start, bold_share)
        t1 = time.perf_counter()
        res = mpisdnn.infer(net, y, MPI.COMM_SELF, row_offset=start, **_cpu())
        run += time.perf_counter() - t1
        gen += t1 - t0
        nnz += y.nnz
        found.append(res.categories - 1)
    return np.concatenate(found), gen, run, nnz


def _cpu():
    """``infer`` keywords for the cpu backend (option object when the engine has one)."""
    try:
        from mpisdnn.sdnn.engine import InferOptions
    except ImportError:
        return {"backend": "cpu"}
    return {"options": InferOptions(backend="cpu")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--network", required=True, help="network HDF5 file or official TSV dir")
    p.add_argument("--neurons", type=int, required=True)
    p.add_argument("--layers", type=int, help="first L layers only (default all)")
    p.add_argument("--count", type=int, default=60000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--block", type=int, default=10000, help="rows per inference block")
    p.add_argument("--bold-share", type=float, help="default: the calibrated share")
    p.add_argument("--components", action="store_true", help="thin-only and bold-only rates")
    args = p.parse_args(argv)

    from mpi4py import MPI

    from mpisdnn.generate import images
    from mpisdnn.sdnn.load import load_network

    net = load_network(MPI.COMM_SELF, args.network, args.layers)
    target = TARGETS.get(args.neurons)
    head = f"N={args.neurons} L={len(net.layers)} count={args.count} seed={args.seed}"
    if args.components:
        rates = {}
        for name, share in (("thin", 0.0), ("bold", 1.0)):
            rows, gen, run, _ = survivors(
                net, args.neurons, args.count, args.seed, share, args.block
            )
            rates[name] = rows.size / args.count
            print(
                f"{head} {name}: {rows.size} survivors ({rates[name]:.4%}), "
                f"gen {gen:.1f} s, infer {run:.1f} s",
                flush=True,
            )
        if target:
            q = (target / 60000 - rates["thin"]) / (rates["bold"] - rates["thin"])
            print(f"bold share for {target} survivors of 60,000: {q:.4f}")
        return 0
    share = images.bold_share_for(args.neurons) if args.bold_share is None else args.bold_share
    rows, gen, run, nnz = survivors(net, args.neurons, args.count, args.seed, share, args.block)
    scaled = rows.size * 60000 / args.count
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    note = f" (target {target}: {scaled / target - 1:+.1%})" if target else ""
    print(
        f"{head} bold_share={share}: {rows.size} survivors = {scaled:.0f} per 60,000{note}; "
        f"nnz/row {nnz / args.count:.1f}; gen {gen:.1f} s, infer {run:.1f} s; "
        f"peak RSS {rss:.2f} GiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
