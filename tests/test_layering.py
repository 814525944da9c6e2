"""The import layering of docs/architecture.md, read from the source (imports inside functions
count too: a lazy import is still a dependency, and hides a cycle rather than removing it).

    commands/, cli, __main__            the command line
    sdnn/, projection/, backends/,      the work (and paths: output checks that
      generate/, reporting/, paths        use the formats' temporary names)
    formats/                            readers and writers
    base: errors, network, weights,     types and plumbing that import nothing above them
      parallel, partition, leftovers, progress, system, _signals

A module may import from its own layer or below, never above; nothing outside the command
line imports it; and no two modules import each other, directly or through others.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mpisdnn"

COMMAND_LINE = ("mpisdnn.commands", "mpisdnn.cli", "mpisdnn.__main__")
WORK = ("mpisdnn.sdnn", "mpisdnn.projection", "mpisdnn.backends", "mpisdnn.generate")
WORK += ("mpisdnn.reporting", "mpisdnn.paths")
FORMATS = ("mpisdnn.formats",)


def _module_name(path: Path, root: Path) -> str:
    parts = ("mpisdnn", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set:
    """Every ``mpisdnn`` module ``path`` imports (as written; ``from . import x`` names x)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mpisdnn"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("mpisdnn"):
                target = node.module
            else:
                continue
            found.add(target)
            # ``from .pkg import module`` depends on that module, not only on the package
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def import_graph(root: Path = PACKAGE) -> dict:
    """``{module: {mpisdnn modules it imports}}`` over every module below ``root``."""
    paths = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        # keep what names a module of the package (``from .x import func`` -> ``x``)
        graph[name] = {t for t in _imports(path, name) if t in paths and t != name}
    return graph


def _layer(module: str) -> int:
    for rank, prefixes in enumerate((FORMATS, WORK, COMMAND_LINE), start=1):
        if module.startswith(prefixes):
            return rank
    return 0  # base


def upward_imports(graph: dict) -> list:
    """``(importer, imported)`` pairs where a module imports from a layer above its own."""
    return sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if _layer(b) > _layer(a) and not b == "mpisdnn"
    )


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm).

    A package's ``__init__`` re-exporting its modules is not a cycle when they import their
    siblings by module path; edges into a package ``__init__`` from its own modules are
    left out for that reason (they name the package only to reach a sibling).
    """
    edges = {
        a: {b for b in targets if not (a.startswith(b + ".") and b != "mpisdnn")}
        for a, targets in graph.items()
    }
    edges = {a: {b for b in t if b != "mpisdnn"} for a, t in edges.items()}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_module_imports_a_layer_above_its_own():
    # formats imports nothing from sdnn, projection, backends or the command line; no library
    # module imports the command line; base modules import only base modules
    assert upward_imports(import_graph()) == []


def test_checks_catch_a_new_upward_import_and_a_cycle(tmp_path):
    """The checks themselves: a copy of the package with one upward import and one cycle."""
    import shutil

    copy = tmp_path / "mpisdnn"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    leaf = copy / "formats" / "tsv.py"
    leaf.write_text(leaf.read_text() + "\n\ndef _up():\n    from ..sdnn import engine\n")
    base = copy / "partition.py"
    base.write_text(base.read_text() + "\n\ndef _cycle():\n    from .formats import tsv\n")
    graph = import_graph(copy)
    up = upward_imports(graph)
    assert ("mpisdnn.formats.tsv", "mpisdnn.sdnn.engine") in up
    assert ("mpisdnn.partition", "mpisdnn.formats.tsv") in up
    assert any("mpisdnn.partition" in c and "mpisdnn.formats.tsv" in c for c in cycles(graph))


@pytest.mark.parametrize("layer", ["formats", "sdnn", "projection", "backends", "reporting"])
def test_library_never_imports_the_command_line(layer):
    graph = import_graph()
    bad = [
        (a, b)
        for a, targets in graph.items()
        if a.startswith(f"mpisdnn.{layer}")
        for b in targets
        if b.startswith(COMMAND_LINE)
    ]
    assert bad == []


# --- every MPI call goes through parallel.py ------------------------------------------------

#: Communicator methods of mpi4py (collectives, point-to-point, splits, requests).
MPI_METHODS = frozenset(
    "Allreduce allreduce Reduce reduce Bcast bcast Gather Gatherv gather Allgather Allgatherv "
    "allgather Scatter Scatterv scatter Alltoall Alltoallv Alltoallw alltoall Send Recv Isend "
    "Irecv Ssend send recv isend irecv Sendrecv sendrecv Barrier barrier Ibarrier Exscan exscan "
    "Scan scan Split Split_type Dup Waitall Waitany Testall Iallreduce Ibcast Iallgather "
    "Ialltoallv Probe Iprobe".split()
)
#: The modules that own MPI: parallel.py and the three it keeps its parts in.
MPI_HOMES = frozenset({"parallel.py", "_accounting.py", "_handoff.py", "_node.py"})
#: Files with raw MPI calls that are being rewritten by other branches as this list was made;
#: each goes once its calls use parallel.py's wrappers. Never add to it: the test fails when a
#: listed file has no raw call left, so the list only shrinks.
MPI_NOT_YET = {
}


def raw_mpi_calls(root: Path = PACKAGE) -> dict:
    """``{file relative to the package: [line of each raw communicator call]}``.

    A call ``X.method(...)`` whose method is an mpi4py communicator method and whose receiver
    is not numpy; ``parallel.gather(comm, ...)`` and the like name the module, not a
    communicator, and are what the rest of the package calls.
    """
    found: dict = {}
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in MPI_METHODS:
                continue
            base = node.func.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in ("np", "numpy", "parallel", "functools"):
                continue
            found.setdefault(rel, []).append(node.lineno)
    return found


def test_mpi_calls_go_through_parallel():
    calls = raw_mpi_calls()
    outside = {f: lines for f, lines in calls.items() if f not in MPI_HOMES | set(MPI_NOT_YET)}
    assert outside == {}, "raw MPI calls outside parallel.py (use its wrappers)"


def test_the_list_of_files_not_yet_through_parallel_only_shrinks():
    calls = raw_mpi_calls()
    done = sorted(f for f in MPI_NOT_YET if f not in calls)
    assert done == [], f"no raw MPI call left in {done}: remove them from MPI_NOT_YET"


def test_the_mpi_scan_finds_a_raw_call(tmp_path):
    leaf = tmp_path / "sdnn" / "engine.py"
    leaf.parent.mkdir()
    leaf.write_text("def f(comm, x):\n    parallel.bcast(comm, x)\n    return comm.bcast(x)\n")
    assert raw_mpi_calls(tmp_path) == {"sdnn/engine.py": [3]}


# --- the parsed command line stays in the command line --------------------------------------

#: Calls that read an object's attributes by name.
_BY_NAME = frozenset({"getattr", "hasattr", "setattr", "delattr", "vars"})


def namespace_reads(root: Path = PACKAGE) -> list:
    """``file:line what`` for every place outside the command line (``commands/``, ``cli.py``,
    ``__main__.py``) that imports argparse or reads a parsed command line: ``args.X``,
    ``getattr(args, ...)`` and the like, or a parameter annotated ``Namespace``.

    The command line turns its flags into typed objects (``InferPlan``, ``ProjectionOptions``,
    ``paths.CommandPaths``) and passes those down; a library function that took the namespace
    would tie the library to the command line's argument names.
    """
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "commands" or str(rel) in ("cli.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            line = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
                found.append(f"{line} imports argparse")
            elif isinstance(node, ast.ImportFrom) and node.module == "argparse":
                found.append(f"{line} imports from argparse")
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "args"
            ):
                found.append(f"{line} reads args.{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in _BY_NAME
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "args"
            ):
                found.append(f"{line} reads args through {node.func.id}()")
            elif isinstance(node, ast.arg) and node.annotation is not None:
                if "Namespace" in ast.unparse(node.annotation):
                    found.append(f"{line} takes a Namespace ({node.arg})")
    return found


def test_no_library_module_reads_the_parsed_command_line():
    assert namespace_reads() == [], "pass typed objects down from commands/, not args"


def test_the_namespace_scan_finds_a_library_read(tmp_path):
    leaf = tmp_path / "paths.py"
    leaf.write_text(
        "import argparse\n\n\ndef f(args, ns: argparse.Namespace):\n"
        "    return args.output, getattr(args, 'report', None)\n"
    )
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "infer.py").write_text("def run(args, comm):\n    return args.x\n")
    assert sorted(namespace_reads(tmp_path)) == [
        "paths.py:1 imports argparse",
        "paths.py:4 takes a Namespace (ns)",
        "paths.py:5 reads args through getattr()",
        "paths.py:5 reads args.output",
    ]
