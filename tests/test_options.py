"""Options resolved once (issue 39): a flag without effect is refused, one spelling and one
meaning per option across commands, the CLI's choices are the library's constants, and each
default is computed in one place. Serial and fast: parsers and dataclasses, no MPI run.
"""

import argparse
import ast
from pathlib import Path

import pytest

from mpisdnn import backends
from mpisdnn.cli import build_parser, main
from mpisdnn.sdnn.options import OPTION_NEEDS, InferOptions
from mpisdnn.sdnn.session import PLAN_NEEDS, InferPlan

PACKAGE = Path(__file__).resolve().parents[1] / "mpisdnn"

#: Commands of this test (project is checked once its owner's branch merges:
#: see ONE_MEANING_PENDING).
COMMANDS = ("infer", "challenge", "project", "generate network", "generate inputs",
            "generate bipartite", "generate rmat", "info", "report", "clean", "convert network",
            "convert inputs")  # fmt: skip

#: Flags that take effect in every combination their command accepts (each was walked
#: through its command: what it changes, and that nothing else switches it off). A new flag
#: must be added here or get a rule (sdnn.options.Needs): test_every_flag_is_declared.
ALWAYS_EFFECTIVE = {
    "infer": {
        "--network", "--inputs", "--truth", "--layers", "--bias", "--backend",
        "--rebalance-threshold", "--weight-memory", "--memory-per-rank", "--dedup",
        "--no-prune", "--categories-out", "--output-y", "--report", "--quiet", "--stages",
        "--checkpoint", "--resume",
    },
    "challenge": {
        "data_dir", "--neurons", "--layers", "--out", "--cache", "--count", "--seed",
        "--check-rows", "--full-check-edges", "--rerun", "--quiet", "--backend",
        "--rebalance-threshold", "--weight-memory", "--memory-per-rank", "--dedup",
    },
    "project": {"input", "--format", "--onto", "--weight", "--self-loops", "--min-weight",
                "--top-k", "--memory-per-rank", "--threads", "--output", "--report", "--quiet"},
    "generate network": {"--neurons", "--layers", "--seed", "--bias", "--output", "--tsv-dir",
                         "--archive", "--quiet"},
    "generate inputs": {"--neurons", "--count", "--seed", "--network", "--output", "--tsv",
                        "--truth-tsv", "--quiet"},
    "generate bipartite": {"--rows", "--cols", "--degrees", "--preset", "--edges", "--density",
                           "--seed", "--weights", "--output", "--quiet"},
    "generate rmat": {"--scale", "--edge-factor", "--seed", "--directed", "--keep-self-loops",
                      "--keep-duplicates", "--no-scramble", "--output", "--quiet"},
    "info": {"--json"},
    "report": {"reports", "--output", "--table"},
    "clean": {"outputs", "--yes", "--min-age"},
    "convert network": {"source", "--output", "--layers", "--bias", "--layout"},
    "convert inputs": {"source", "--output", "--neurons", "--rows", "--truth", "--quiet"},
}  # fmt: skip

#: Words that make a command line complete enough to reach the flag checks.
BASE = {
    "infer": ["--network", "n.h5", "--inputs", "i.h5"],
    "challenge": ["data"],
    "generate inputs": ["-o", "i.h5"],
    "report": ["r.json"],
    "project": ["g.h5"],
    "convert network": ["neuron4", "-o", "n.h5"],
    "convert inputs": ["i.tsv", "-o", "i.h5", "--neurons", "4"],
    "generate rmat": ["--scale", "4", "-o", "g.h5"],
    "generate bipartite": ["--rows", "3", "--cols", "3", "--edges", "2", "-o", "g.h5"],
}

#: Old spellings kept as aliases of one option (same dest, help "the same as FLAG ..."):
#: checked as the flag they stand for.
ALIASES = {"--one-based": "--index-base"}


def _subparser(parser, words):
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _flags(command):
    """``{flag (or positional dest): action}`` of ``command``'s parser."""
    parser = _subparser(build_parser(), command.split())
    out = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs and longs[0] in ALIASES:
            continue
        out[longs[0] if longs else action.dest] = action
    return out


def _rules(command):
    parser = _subparser(build_parser(), command.split())
    return tuple(parser.get_default("_needs") or ())


def _library_rules(command):
    return (*OPTION_NEEDS, *PLAN_NEEDS) if command == "infer" else \
        OPTION_NEEDS if command == "challenge" else ()  # fmt: skip


def _refusal_cases():
    for command in COMMANDS:
        for rule in (*_rules(command), *_library_rules(command)):
            yield pytest.param(command, rule, id=f"{command}:{rule.flag}")


@pytest.mark.parametrize("command,rule", list(_refusal_cases()))
def test_flag_without_effect_is_refused(command, rule, capsys):
    """The rule's flag, given in a combination where it does nothing: exit 2, one line that
    names the flag and what it needs, before any file is opened (the files do not exist)."""
    argv = [*command.split(), *BASE.get(command, []), *rule.without, *rule.example]
    from mpi4py import MPI

    assert main(argv, MPI.COMM_SELF) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert rule.flag in err[0] and rule.needs in err[0] and "no effect" in err[0], err[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_is_declared(command):
    """Every flag is either always effective (walked through by hand, listed above) or has
    a rule: a new flag cannot skip the question."""
    ruled = {r.flag for r in (*_rules(command), *_library_rules(command))}
    flags = set(_flags(command))
    assert flags - ruled - ALWAYS_EFFECTIVE[command] == set()
    assert ALWAYS_EFFECTIVE[command] & ruled == set()  # one answer per flag
    assert (ruled | ALWAYS_EFFECTIVE[command]) - flags == set()  # no stale entry


def test_the_library_refuses_what_the_cli_refuses():
    """The API gets the same refusals: the rules live on the options and the plan."""
    from mpisdnn.errors import UsageError

    with pytest.raises(UsageError, match="--threads has no effect here: it needs --backend cpu"):
        InferOptions(backend="reference", threads=2)
    with pytest.raises(UsageError, match="--share-gpus"):
        InferOptions(backend="cpu", gpus_per_rank=0)
    with pytest.raises(UsageError, match="--stage-head has no effect here"):
        InferPlan(network="n", inputs="i", stage_head=1).check(1)
    InferPlan(network="n", inputs="i", stages=2, stage_head=1, batch_rows=8).check(2)
    InferOptions(backend="gpu", gpus_per_rank=0, max_group=4)


#: Options whose meaning differs between a command of this branch and one that is not yet
#: changed (commands/project.py, commands/convert.py: issue 40/41 branches). The lead
#: removes an entry once the change (in the i39b report) is applied; never add one.
ONE_MEANING_PENDING: dict = {}


def _first_clause(text):
    return (text or "").split("(")[0].split(";")[0].strip()


def test_one_spelling_across_commands():
    """A flag shared by two commands has one type, one set of choices and one help; the
    index base has one spelling."""
    seen = {}
    for command in COMMANDS:
        for flag, action in _flags(command).items():
            if not flag.startswith("--") or flag in ONE_MEANING_PENDING:
                continue
            key = (action.type, tuple(action.choices or ()), type(action).__name__)
            seen.setdefault(flag, {}).setdefault(key, []).append(command)
    # The network/inputs flags mean other things in other commands by design (the source
    # of a run vs the network a generator computes the truth with); their types agree.
    mixed = {f: k for f, k in seen.items() if len(k) > 1}
    assert mixed == {}, mixed
    quiet = {c: _flags(c)["--quiet"].help for c in COMMANDS if "--quiet" in _flags(c)}
    assert len(set(quiet.values())) == 1, quiet
    progress = {c: _first_clause(_flags(c)["--progress"].help)
                for c in COMMANDS if "--progress" in _flags(c)}  # fmt: skip
    assert len(set(progress.values())) == 1, progress
    for command in COMMANDS:
        parser = _subparser(build_parser(), command.split())
        for alias, flag in ALIASES.items():
            dests = {a.dest for a in parser._actions if {alias, flag} & set(a.option_strings)}
            assert len(dests) <= 1, (command, alias, dests)  # one option, two spellings


def test_cli_choices_are_the_library_constants():
    for command in ("infer", "challenge"):
        action = _flags(command)["--backend"]
        assert action.choices is backends.NAMES and action.default == backends.NAMES[0]
        for name in backends.NAMES:
            assert f"{name}: {backends.HELP[name]}" in action.help
    assert "numba-cuda" in backends.HELP["gpu"] and "CuPy" in backends.HELP["gpu"]
    from mpisdnn import projection

    assert _flags("project")["--weight"].choices is projection.WEIGHTINGS


def _calls(name):
    """``(file, line)`` of every call of ``name`` in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called == name:
                    found.append((str(path.relative_to(PACKAGE)), node.lineno))
    return found


#: Where a memory default may still be computed from available_memory() until the branch
#: that owns the file merges (issue 40: the projection memory default, one home to come in
#: projection/options.py); never add one.
MEMORY_PENDING: set = set()


def test_every_default_has_one_home():
    """The weight-memory default is computed by options.resolved only (the commands, the
    runner, the stage flow and the challenge all call it); available_memory() is read by
    that default, by checks of a size against memory, and by system.py itself."""
    assert {f for f, _ in _calls("default_weight_memory")} == {"sdnn/options.py"}
    users = {f for f, _ in _calls("available_memory")} - MEMORY_PENDING
    # streaming.py: the weight-memory default; checkpoint_manifest.py and formats/_validate.py:
    # a checkpoint's block and an allocation checked against memory (refusals, not defaults);
    # projection/options.py: the projection memory default (default_memory_per_rank)
    assert users <= {"system.py", "sdnn/streaming.py", "sdnn/checkpoint_manifest.py",
                     "formats/_validate.py", "projection/options.py"}, users  # fmt: skip
    # threads: system.default_threads, read by the cpu backend and shown by info
    threads = {f for f, _ in _calls("default_threads")} - MEMORY_PENDING
    assert threads <= {"backends/cpu.py", "commands/info.py", "system.py",
                       "projection/options.py"}, threads  # fmt: skip


def test_numpy_scalars_are_taken_as_the_numbers_they_are():
    """``InferOptions(threads=np.int64(2))`` was refused ("must be a positive integer, got
    2"), ``prune=np.True_`` too; they are now Python values, as a report needs them."""
    import json

    import numpy as np

    from mpisdnn.projection import ProjectionOptions

    opts = InferOptions(threads=np.int64(2), max_group=np.int32(4), prune=np.True_,
                        push_density=np.float32(0.5))  # fmt: skip
    assert (opts.threads, opts.max_group, opts.prune, opts.push_density) == (2, 4, True, 0.5)
    assert type(opts.threads) is int and type(opts.prune) is bool
    json.dumps(opts.as_dict())
    proj = ProjectionOptions(top_k=np.int64(3), threads=np.int16(2))
    assert type(proj.top_k) is int and proj.top_k == 3 and type(proj.threads) is int

