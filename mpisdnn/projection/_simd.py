"""16-lane integer helpers for the projection kernels, as explicit LLVM vector IR.

numba does not vectorise a stream compaction (``out[pos] = v; pos += c != 0``), and that loop
is a third of the count kernel's time on dense output rows. :func:`sweep16` emits
``llvm.masked.compressstore`` directly: one ``vpcompressd`` per 16 columns with AVX-512 (3-4.6x
faster than the scalar loop, measured at 10,000 and 65,536 columns), LLVM's generic expansion
elsewhere, so results never depend on the CPU. (A gather/scatter increment was measured too:
no faster than scalar increments, so the accumulate loop stays scalar.)

The array element types are read from the numba signature (int32 or int64 accumulators,
indices and values), so one kernel source serves every index width.
"""

from __future__ import annotations

from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..backends._simd import LANES, compress_pair

__all__ = ["LANES", "prefetch", "sweep16"]


def _data(context, builder, arrty, arr):
    return context.make_array(arrty)(context, builder, arr).data


def _int_type(context, arrty):
    t = context.get_data_type(arrty.dtype)
    if not isinstance(t, ir.IntType):
        raise TypeError(f"integer array expected, got {arrty}")
    return t


def _resize(builder, v, vt):
    """Sign-extend or truncate an integer vector to ``vt``."""
    w_from = v.type.element.width
    w_to = vt.element.width
    if w_from == w_to:
        return v
    return builder.sext(v, vt) if w_to > w_from else builder.trunc(v, vt)


@intrinsic
def sweep16(typingctx, acc, v, oi, od, pos):
    """Emit the non-zeros of ``acc[v:v + 16]`` and clear them; returns how many.

    The non-zero counts go to ``od[pos:]`` (integer or float) and their columns ``v + i`` to
    ``oi[pos:]``, in column order (compress-stores: nothing is written past the last kept
    entry). No bounds checks: callers keep ``v + 16 <= acc.size``.
    """
    if not all(isinstance(a, types.Array) for a in (acc, oi, od)):
        return None

    def codegen(context, builder, sig, args):
        accarr, v, oiarr, odarr, pos = args
        at = _int_type(context, sig.args[0])
        it = _int_type(context, sig.args[2])
        vt_ = context.get_data_type(sig.args[3].dtype)
        va = ir.VectorType(at, LANES)
        vv = ir.VectorType(vt_, LANES)
        src = builder.bitcast(
            builder.gep(_data(context, builder, sig.args[0], accarr), [v]), va.as_pointer()
        )
        x = builder.load(src, align=at.width // 8)
        builder.store(ir.Constant(va, [0] * LANES), src, align=at.width // 8)
        nz = builder.icmp_signed("!=", x, ir.Constant(va, [0] * LANES))
        odp = _data(context, builder, sig.args[3], odarr)
        oip = _data(context, builder, sig.args[2], oiarr)
        xv = _resize(builder, x, vv) if isinstance(vt_, ir.IntType) else builder.sitofp(x, vv)
        return compress_pair(
            builder, xv, nz, builder.gep(odp, [pos]), v, it, builder.gep(oip, [pos])
        )

    return types.int64(acc, v, oi, od, pos), codegen


@intrinsic
def prefetch(typingctx, arr, i):
    """Hint the cache to fetch ``arr[i]`` for a read soon (``llvm.prefetch``; no fault, no
    effect on results, and no bounds check needed: a prefetch of any address is harmless).

    The count kernel reads rows of ``B`` in the order the neighbour lists give them, so
    every row starts with a cache miss the hardware prefetcher cannot foresee; fetching a
    few rows ahead hides it (measured 13 % of the accumulation on the MovieLens-20M shape).
    """
    if not isinstance(arr, types.Array) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        data = _data(context, builder, sig.args[0], args[0])
        i8p = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        name = "llvm.prefetch.p0" if binding.llvm_version_info[0] >= 15 else "llvm.prefetch"
        fnty = ir.FunctionType(ir.VoidType(), [i8p.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        # read, high temporal locality, data cache
        builder.call(fn, [i8p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, i), codegen
