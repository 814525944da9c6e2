#!/usr/bin/env python3
"""Structure figures of the mpisdnn package, read from the source (nothing is imported or run).

    python scripts/arch_stats.py            # the report, in words
    python scripts/arch_stats.py --json     # the same as JSON (to diff a before and an after)
    python scripts/arch_stats.py --check    # exit 1 when a bound below is broken

What it counts, and how:

imports
    Arrows between the package's modules (an ``import`` anywhere in a file, lazy ones inside
    functions included), the cycles among them, and the imports that run up the layers of
    docs/architecture.md; all three exactly as ``tests/test_layering.py`` computes them (its
    functions are used). Also the arrows between top-level units (a sub-package, or a module
    of the base) with how many module arrows each stands for.
long modules
    Modules over ``--max-lines`` physical lines (600). Kernel files are listed apart: a file is
    a kernel file when numba-compiled functions (decorated ``njit``, ``jit``, ``cuda.jit``,
    ``intrinsic``, ``overload``, ``register_jitable``, ``vectorize``, ``guvectorize``) hold at
    least half of its functions' statements.
long functions
    Functions over ``--max-statements`` statements (60), the way ruff's PLR0915 and pylint
    count: every statement node (``ast.stmt``) inside the function, at any depth of ``if``,
    ``for``, ``while``, ``with``, ``try``/``except``/``else``/``finally`` and ``match``; a
    compound statement counts once for itself plus its body; a nested ``def`` or ``class``
    counts once and its body is its own function; the docstring is not a statement.
    Numba-compiled functions are listed apart, as kernels.
attributes written from outside
    Writes ``obj.attr = …`` (also augmented and annotated assignments, ``del``, and
    ``setattr(obj, "attr", …)``) whose ``obj`` is not the ``self``/``cls`` of a method of the
    class itself, attributed to a class of the package by: (a) ``self.x`` whose class assigns
    ``self.x = Class(…)``; (b) a local ``obj = Class(…)`` or ``Class.method(…)``, or a
    parameter annotated ``obj: Class``; (c) failing those, the attribute's name when exactly
    one class of the package assigns it, it is not a common name of numpy/scipy objects and
    ``obj`` is not ``args`` (argparse's namespace). (c) can err both ways: each write is
    listed with its file and line, to be checked.
MPI calls outside parallel.py
    ``grep_lines``: the lines issue 39's grep finds (``comm.`` + one of 14 method names, lines
    with "parallel" anywhere dropped, which also drops formats/*_parallel.py); ``calls``: every
    call of an MPI communicator method (the collectives, point-to-point, ``Split``, ``Waitall``,
    ...) on any receiver other than numpy's and the ``parallel`` module itself (its wrappers
    take ``comm``), in every file but ``mpisdnn/parallel.py``; the calls of the modules that
    parallel.py owns (``_accounting.py``, ``_handoff.py``) are counted apart.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mpisdnn"

KERNEL_DECORATORS = {
    "njit", "jit", "intrinsic", "overload", "overload_method", "register_jitable",
    "vectorize", "guvectorize", "generated_jit", "cfunc",
}
#: Attribute names of numpy arrays and scipy matrices: never attributed by name alone.
COMMON = {
    "data", "indices", "indptr", "shape", "dtype", "flags", "size", "nnz", "T", "real",
    "imag", "has_sorted_indices", "has_canonical_format", "name", "value", "daemon",
}
ISSUE_GREP = re.compile(
    r"comm\.(Allreduce|allreduce|Bcast|bcast|Gather|gather|Alltoallv|Send|Recv|Isend|Irecv"
    r"|Barrier|barrier)"
)
MPI_METHODS = {
    "Allreduce", "allreduce", "Reduce", "Bcast", "bcast", "Gather", "Gatherv", "gather",
    "Allgather", "Allgatherv", "allgather", "Scatter", "Scatterv", "scatter", "Alltoall",
    "Alltoallv", "Alltoallw", "alltoall", "Send", "Recv", "Isend", "Irecv", "Ssend", "send",
    "recv", "isend", "irecv", "Sendrecv", "sendrecv", "Barrier", "barrier", "Ibarrier",
    "Exscan", "exscan", "Scan", "Split", "Split_type", "Dup", "Waitall", "Waitany",
    "Testall", "Iallreduce", "Ibcast", "Iallgather", "Ialltoallv", "Probe", "Iprobe",
}


def _files():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


# --- statements -----------------------------------------------------------------------------


def _body_blocks(node):
    for name in ("body", "orelse", "finalbody"):
        yield from getattr(node, name, None) or []
    for handler in getattr(node, "handlers", None) or []:
        yield from handler.body
    for case in getattr(node, "cases", None) or []:
        yield from case.body


def statements(func) -> int:
    """Statements of ``func`` at any depth, nested ``def``/``class`` bodies not included."""
    body = list(func.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            body = body[1:]
    count, todo = 0, body
    while todo:
        node = todo.pop()
        count += 1
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        todo.extend(_body_blocks(node))
    return count


def _is_kernel(func) -> bool:
    for dec in func.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in KERNEL_DECORATORS:
            return True
    return False


def _functions(tree, prefix=""):
    """``(qualified name, node)`` of every function, nested ones and methods included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def sizes(max_lines: int, max_statements: int) -> dict:
    modules, kernel_modules, functions, kernels = [], [], [], []
    for path in _files():
        tree = _parse(path)
        lines = len(path.read_text().splitlines())
        funcs = list(_functions(tree))
        total = sum(statements(f) for _, f in funcs) or 1
        in_kernels = sum(statements(f) for _, f in funcs if _is_kernel(f))
        kernel_file = in_kernels >= total / 2
        if lines > max_lines:
            (kernel_modules if kernel_file else modules).append((_rel(path), lines))
        for name, func in funcs:
            n = statements(func)
            if n > max_statements:
                where = f"{_rel(path)}:{func.lineno}:{name}"
                (kernels if _is_kernel(func) else functions).append((where, n))
    by_size = lambda rows: sorted(rows, key=lambda r: -r[1])  # noqa: E731
    return {
        "modules_over": by_size(modules),
        "kernel_modules_over": by_size(kernel_modules),
        "functions_over": by_size(functions),
        "kernels_over": by_size(kernels),
    }


# --- imports --------------------------------------------------------------------------------


def imports() -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.test_layering import _layer, cycles, import_graph, upward_imports

    graph = import_graph(PACKAGE)
    arrows = sorted((a, b) for a, targets in graph.items() for b in targets)

    def unit(module):
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else module

    units = Counter((unit(a), unit(b)) for a, b in arrows if unit(a) != unit(b))
    return {
        "modules": len(graph),
        "arrows": len(arrows),
        "cycles": cycles(graph),
        "upward": upward_imports(graph),
        "unit_arrows": sorted(
            ([a, b, n, _layer(a), _layer(b)] for (a, b), n in units.items()),
            key=lambda r: (-r[3], r[0], r[1]),
        ),
    }


# --- attribute writes -----------------------------------------------------------------------


class _Class:
    def __init__(self, name, module, node):
        self.name, self.module, self.node = name, module, node
        self.attrs = set()
        self.member_types = {}  # self.x = Class(...) -> {x: Class}


def _call_class(value):
    """``Class`` of ``Class(...)``, ``Class.method(...)`` or ``module.Class(...)``."""
    if not isinstance(value, ast.Call):
        return None
    f = value.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        if f.attr[:1].isupper():
            return f.attr
        if isinstance(f.value, ast.Name) and f.value.id[:1].isupper():
            return f.value.id
    return None


def _targets(node):
    if isinstance(node, (ast.Assign,)):
        out = []
        for t in node.targets:
            out.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
        return out
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _collect_classes():
    classes = []
    for path in _files():
        for node in ast.walk(_parse(path)):
            if not isinstance(node, ast.ClassDef):
                continue
            cls = _Class(node.name, _rel(path), node)
            for item in node.body:
                for t in _targets(item):
                    if isinstance(t, ast.Name):
                        cls.attrs.add(t.id)
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.args.args:
                    me = item.args.args[0].arg
                    for sub in ast.walk(item):
                        for t in _targets(sub):
                            if (
                                isinstance(t, ast.Attribute)
                                and isinstance(t.value, ast.Name)
                                and t.value.id == me
                            ):
                                cls.attrs.add(t.attr)
                                kind = _call_class(getattr(sub, "value", None))
                                if kind:
                                    cls.member_types[t.attr] = kind
            classes.append(cls)
    return classes


def _writes(func):
    """``(receiver, attr, line)`` of every attribute write in ``func`` (not nested defs)."""
    todo = list(func.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for t in _targets(node):
            if isinstance(t, ast.Attribute):
                yield t.value, t.attr, t.lineno
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id == "setattr"
                and len(sub.args) == 3
                and isinstance(sub.args[1], ast.Constant)
            ):
                yield sub.args[0], sub.args[1].value, sub.lineno
        todo.extend(_body_blocks(node))


def outside_writes() -> list:
    classes = _collect_classes()
    by_name = defaultdict(list)
    for cls in classes:
        by_name[cls.name].append(cls)
    owners = defaultdict(set)
    for cls in classes:
        for attr in cls.attrs:
            owners[attr].add(cls.name)
    found = []
    for path in _files():
        tree = _parse(path)
        for qual, func in _functions(tree):
            owner = _enclosing_class(tree, func)
            me = func.args.args[0].arg if owner and func.args.args else None
            local = {}
            for a in func.args.args + func.args.kwonlyargs:
                if isinstance(a.annotation, ast.Name):
                    local[a.arg] = a.annotation.id
                elif isinstance(a.annotation, ast.Constant) and isinstance(
                    a.annotation.value, str
                ):
                    local[a.arg] = a.annotation.value
            for node in ast.walk(func):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    t = node.targets[0]
                    if isinstance(t, ast.Name) and _call_class(node.value):
                        local[t.id] = _call_class(node.value)
            for receiver, attr, line in _writes(func):
                if isinstance(receiver, ast.Name) and receiver.id in (me, "self", "cls"):
                    continue  # the class itself (or a subclass) writing its own attribute
                target, how = None, None
                if (
                    isinstance(receiver, ast.Attribute)
                    and isinstance(receiver.value, ast.Name)
                    and receiver.value.id in (me, "self")
                    and owner is not None
                ):
                    target = owner.member_types.get(receiver.attr)
                    how = f"self.{receiver.attr}"
                elif isinstance(receiver, ast.Name) and receiver.id in local:
                    target, how = local[receiver.id], f"{receiver.id}: {local[receiver.id]}"
                if target not in by_name:
                    target = None
                namespace = isinstance(receiver, ast.Name) and receiver.id == "args"
                if (
                    target is None
                    and not namespace  # argparse's namespace, not a class of ours
                    and attr not in COMMON
                    and len(owners.get(attr, ())) == 1
                ):
                    target, how = next(iter(owners[attr])), "by name"
                if target is None or target not in by_name:
                    continue
                if owner is not None and owner.name == target:
                    continue  # a method of the class, writing another instance of it
                found.append(
                    {
                        "class": target,
                        "attr": attr,
                        "where": f"{_rel(path)}:{line}",
                        "in": qual,
                        "how": how,
                    }
                )
    return found


def _enclosing_class(tree, func):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and func in node.body:
            cls = _Class(node.name, "", node)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.args.args:
                    me = item.args.args[0].arg
                    for sub in ast.walk(item):
                        for t in _targets(sub):
                            if (
                                isinstance(t, ast.Attribute)
                                and isinstance(t.value, ast.Name)
                                and t.value.id == me
                            ):
                                kind = _call_class(getattr(sub, "value", None))
                                if kind:
                                    cls.member_types[t.attr] = kind
            return cls
    return None


# --- MPI calls ------------------------------------------------------------------------------


#: Modules that parallel.py owns (it re-exports them; docs/architecture.md says so): their
#: communicator calls are parallel.py's, counted apart.
PARALLEL_OWNS = ("mpisdnn/_accounting.py", "mpisdnn/_handoff.py", "mpisdnn/_node.py")


def mpi_calls() -> dict:
    grep_lines = []
    for path in _files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{_rel(path)}:{number}:{line}"
            if ISSUE_GREP.search(line) and "parallel" not in where:
                grep_lines.append(f"{_rel(path)}:{number}")
    calls = []
    for path in _files():
        if _rel(path) == "mpisdnn/parallel.py":
            continue
        for node in ast.walk(_parse(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MPI_METHODS
            ):
                base = node.func.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in ("np", "numpy", "functools"):
                    continue
                if isinstance(node.func.value, ast.Name) and node.func.value.id == "parallel":
                    continue  # parallel.bcast(comm, ...): the module's wrapper, not a comm
                receiver = ast.unparse(node.func.value)
                calls.append((f"{_rel(path)}:{node.lineno}", f"{receiver}.{node.func.attr}"))
    owned = [c for c in calls if c[0].rsplit(":", 1)[0] in PARALLEL_OWNS]
    calls = [c for c in calls if c not in owned]
    per_file = Counter(where.rsplit(":", 1)[0] for where, _ in calls + owned)
    return {
        "grep_lines": grep_lines,
        "calls": calls,
        "owned_calls": owned,
        "calls_per_file": sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0])),
    }


# --- report ---------------------------------------------------------------------------------


def ruff_statements(max_statements: int) -> list:
    """ruff's own PLR0915 findings (it counts nested ``def`` bodies into the outer function,
    ``else``/``except``/``finally`` clauses and the docstring, not ``for`` or ``return``), to
    set beside this count; empty when ruff is not installed."""
    import shutil
    import subprocess

    ruff = shutil.which("ruff")
    if ruff is None:
        return []
    out = subprocess.run(
        [ruff, "check", "--isolated", "--select", "PLR0915", "--output-format", "json",
         "--config", f"lint.pylint.max-statements={max_statements}", str(PACKAGE)],
        capture_output=True, text=True, check=False,
    ).stdout
    rows = []
    for item in json.loads(out or "[]"):
        count = re.search(r"\((\d+) >", item["message"])
        where = f"{Path(item['filename']).relative_to(ROOT)}:{item['location']['row']}"
        rows.append((where, int(count.group(1)) if count else None))
    return sorted(rows, key=lambda r: -(r[1] or 0))


def gather(max_lines=600, max_statements=60) -> dict:
    return {
        "imports": imports(),
        **sizes(max_lines, max_statements),
        "ruff_statements_over": ruff_statements(max_statements),
        "outside_writes": outside_writes(),
        "mpi": mpi_calls(),
    }


def _print(stats, max_lines, max_statements):
    imp = stats["imports"]
    print(f"imports: {imp['modules']} modules, {imp['arrows']} arrows, "
          f"{len(imp['cycles'])} cycles, {len(imp['upward'])} upward imports")
    for cycle in imp["cycles"]:
        print("  cycle:", " -> ".join(cycle))
    for a, b in imp["upward"]:
        print(f"  upward: {a} -> {b}")
    print("  arrows between units (layer 3 = command line, 2 = work, 1 = formats, 0 = base):")
    for a, b, n, la, lb in imp["unit_arrows"]:
        print(f"    {a} ({la}) -> {b} ({lb}): {n}")
    print(f"\nmodules over {max_lines} lines: {len(stats['modules_over'])}")
    for where, n in stats["modules_over"]:
        print(f"  {n:5d}  {where}")
    print(f"kernel files over {max_lines} lines (not counted): {len(stats['kernel_modules_over'])}")
    for where, n in stats["kernel_modules_over"]:
        print(f"  {n:5d}  {where}")
    print(f"\nfunctions over {max_statements} statements: {len(stats['functions_over'])}")
    for where, n in stats["functions_over"]:
        print(f"  {n:5d}  {where}")
    print(f"kernels over {max_statements} statements (not counted): {len(stats['kernels_over'])}")
    for where, n in stats["kernels_over"]:
        print(f"  {n:5d}  {where}")
    print(f"ruff PLR0915 over {max_statements} (its count, kernels included):")
    for where, n in stats["ruff_statements_over"]:
        print(f"  {n:5d}  {where}")
    writes = stats["outside_writes"]
    classes = Counter(w["class"] for w in writes)
    print(f"\nclasses whose attributes are written from outside: {len(classes)} "
          f"({len(writes)} writes)")
    for cls, n in classes.most_common():
        print(f"  {cls}: {n}")
        for w in writes:
            if w["class"] == cls:
                print(f"      .{w['attr']:<22} {w['where']}  in {w['in']}  ({w['how']})")
    mpi = stats["mpi"]
    print(f"\nMPI calls outside parallel.py: {len(mpi['grep_lines'])} lines by issue 39's grep, "
          f"{len(mpi['calls'])} calls of communicator methods elsewhere, "
          f"{len(mpi['owned_calls'])} in the modules parallel.py owns ({', '.join(PARALLEL_OWNS)})")
    for where, n in mpi["calls_per_file"]:
        print(f"  {n:3d}  {where}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 when a bound is broken")
    ap.add_argument("--max-lines", type=int, default=600)
    ap.add_argument("--max-statements", type=int, default=60)
    args = ap.parse_args(argv)
    stats = gather(args.max_lines, args.max_statements)
    if args.json:
        print(json.dumps(stats, indent=1))
    else:
        _print(stats, args.max_lines, args.max_statements)
    broken = (
        stats["imports"]["cycles"]
        or stats["imports"]["upward"]
        or stats["modules_over"]
        or stats["functions_over"]
        or stats["outside_writes"]
        or stats["mpi"]["calls"]
    )
    return 1 if args.check and broken else 0


if __name__ == "__main__":
    sys.exit(main())
