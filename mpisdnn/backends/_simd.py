"""A 16-lane float32 vector type for numba kernels, as explicit LLVM vector IR.

numba leaves SLP vectorisation off and fully unrolls short constant loops before the loop
vectoriser sees them, so a 16-wide update written as a Python loop compiles to scalar code
(measured: 4-5x slower). These intrinsics emit ``<16 x float>`` operations directly; LLVM
lowers them to one zmm instruction with AVX-512, two ymm with AVX2 and four xmm with SSE/NEON.

Exactness: multiplies and adds are emitted as separate ``fmul``/``fadd`` without fast-math
flags, so LLVM never contracts them into an FMA and never reorders a sum; every lane computes
exactly what the scalar float32 reference computes.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, models, register_model

__all__ = [
    "LANES",
    "vec",
    "vstore",
    "vzero",
    "vmuladd",
    "vactivate",
    "vcount",
    "vcompress",
]

#: Lanes per vector (and rows per feature-major tile).
LANES = 16

_F32 = ir.FloatType()
_VT = ir.VectorType(_F32, LANES)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_VB = ir.VectorType(ir.IntType(1), LANES)
_VI64 = ir.VectorType(_I64, LANES)


class VecType(types.Type):
    """numba type of a ``<16 x float>`` register value."""

    def __init__(self):
        super().__init__(name=f"f32x{LANES}")


vec = VecType()


@register_model(VecType)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VT)


def _vptr(context, builder, arrty, arr, off):
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [off]), _VT.as_pointer())


def _splat(builder, x):
    v = builder.insert_element(ir.Constant(_VT, ir.Undefined), x, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES)
    return builder.shuffle_vector(v, ir.Constant(_VT, ir.Undefined), mask)


def _zero():
    return ir.Constant(_VT, [0.0] * LANES)


@intrinsic
def vstore(typingctx, arr, off, v):
    """``arr[off:off + 16] = v`` (unaligned store; no bounds check)."""

    def codegen(context, builder, sig, args):
        builder.store(args[2], _vptr(context, builder, sig.args[0], args[0], args[1]), align=4)
        return context.get_dummy_value()

    return types.void(arr, off, v), codegen


@intrinsic
def vzero(typingctx):
    """All-zero vector."""

    def codegen(context, builder, sig, args):
        return _zero()

    return vec(), codegen


@intrinsic
def vmuladd(typingctx, acc, arr, off, w):
    """``acc + arr[off:off + 16] * w``: a multiply then an add, never fused."""

    def codegen(context, builder, sig, args):
        y = builder.load(_vptr(context, builder, sig.args[1], args[1], args[2]), align=4)
        return builder.fadd(args[0], builder.fmul(y, _splat(builder, args[3])))

    return vec(acc, arr, off, w), codegen


@intrinsic
def vactivate(typingctx, z, b, top):
    """The challenge activation per lane: ``min(max(z + b, 0), top)`` where ``z != 0``, else 0.

    The bias only goes where the product is non-zero (MATLAB's ``Z(Z ~= 0) += b``).
    """

    def codegen(context, builder, sig, args):
        z, bias, ceiling = args
        zero = _zero()
        v = builder.fadd(z, _splat(builder, bias))
        v = builder.select(builder.fcmp_ordered(">", v, zero), v, zero)
        t = _splat(builder, ceiling)
        v = builder.select(builder.fcmp_ordered("<", v, t), v, t)
        return builder.select(builder.fcmp_unordered("!=", z, zero), v, zero)

    return vec(z, b, top), codegen


@intrinsic
def vcount(typingctx, cnt, v):
    """``cnt + (v != 0)`` per lane; counts are float32 (exact up to 2**24)."""

    def codegen(context, builder, sig, args):
        one = ir.Constant(_VT, [1.0] * LANES)
        nz = builder.fcmp_unordered("!=", args[1], _zero())
        return builder.fadd(args[0], builder.select(nz, one, _zero()))

    return vec(cnt, v), codegen


def _function(module, name, fnty):
    return module.globals.get(name) or ir.Function(module, fnty, name)


def _ptr_suffix() -> str:
    """Name mangling of a float pointer in overloaded intrinsics: ``p0`` since LLVM 15
    (opaque pointers), ``p0f32`` before (numba < 0.60 ships LLVM 14)."""
    from llvmlite import binding

    return "p0" if binding.llvm_version_info[0] >= 15 else "p0f32"


def _splat_i(builder, x, vt):
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES)
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined), mask)


def _vec_name(elem) -> str:
    """Element suffix of an overloaded vector intrinsic: ``i32``, ``i64``, ``f32``, ``f64``."""
    if isinstance(elem, ir.IntType):
        return f"i{elem.width}"
    return {"float": "f32", "double": "f64"}[str(elem)]


def compress_pair(builder, values, keep, val_ptr, first, idx_type, idx_ptr):
    """Compress-store ``values`` where ``keep`` to ``val_ptr``, and the column numbers
    ``first + i`` (as ``idx_type``) of the kept lanes to ``idx_ptr``; returns how many (i64).

    The emit step shared by the tile kernel (:func:`vcompress`) and the projection's sweep:
    nothing is written past the last kept entry.
    """
    mod = builder.module
    if idx_type.width < first.type.width:
        first = builder.trunc(first, idx_type)
    vi = ir.VectorType(idx_type, LANES)
    cols = builder.add(_splat_i(builder, first, vi), ir.Constant(vi, list(range(LANES))))
    for vec_, ptr in ((values, val_ptr), (cols, idx_ptr)):
        elem = vec_.type.element
        store = _function(
            mod,
            f"llvm.masked.compressstore.v{LANES}{_vec_name(elem)}",
            ir.FunctionType(ir.VoidType(), [vec_.type, elem.as_pointer(), _VB]),
        )
        builder.call(store, [vec_, ptr, keep])
    bits = builder.bitcast(keep, ir.IntType(LANES))
    popcount = _function(
        mod,
        f"llvm.ctpop.i{LANES}",
        ir.FunctionType(ir.IntType(LANES), [ir.IntType(LANES)]),
    )
    return builder.zext(builder.call(popcount, [bits]), _I64)


@intrinsic
def vcompress(typingctx, tile, off, step, oi, od, pos, col):
    """Append the non-zeros of one lane of a tile to a CSR row; returns how many.

    Reads ``tile[off + step * i]`` for ``i < 16`` (one row, 16 consecutive features: a
    strided gather; ``step`` is ``LANES`` times the slots between two features), and
    compress-stores the non-zero values to ``od[pos:]`` and their feature numbers
    ``col + i`` to ``oi[pos:]`` (``vcompressps`` with AVX-512). Branch-free, so the
    cost does not depend on the sparsity pattern (a per-entry branch mispredicts on
    irregular rows: measured 10-20x slower there).
    """

    def codegen(context, builder, sig, args):
        tarr, off, step, oiarr, odarr, pos, col = args
        tp = context.make_array(sig.args[0])(context, builder, tarr).data
        oip = context.make_array(sig.args[3])(context, builder, oiarr).data
        odp = context.make_array(sig.args[4])(context, builder, odarr).data
        mod = builder.module
        base = builder.ptrtoint(builder.gep(tp, [off]), _I64)
        step = context.cast(builder, step, sig.args[2], types.int64)
        lanes = ir.Constant(_VI64, [4 * i for i in range(LANES)])
        offs = builder.mul(lanes, _splat_i(builder, step, _VI64))
        addr = builder.add(_splat_i(builder, base, _VI64), offs)
        ptrs = builder.inttoptr(addr, ir.VectorType(_F32.as_pointer(), LANES))
        gather = _function(
            mod,
            f"llvm.masked.gather.v{LANES}f32.v{LANES}{_ptr_suffix()}",
            ir.FunctionType(_VT, [ptrs.type, _I32, _VB, _VT]),
        )
        every = ir.Constant(_VB, [1] * LANES)
        v = builder.call(
            gather, [ptrs, ir.Constant(_I32, 4), every, ir.Constant(_VT, ir.Undefined)]
        )
        nz = builder.fcmp_unordered("!=", v, _zero())
        return compress_pair(
            builder, v, nz, builder.gep(odp, [pos]), col, _I32, builder.gep(oip, [pos])
        )

    return types.int64(tile, off, step, oi, od, pos, col), codegen
