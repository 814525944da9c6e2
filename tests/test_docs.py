"""The documentation says what the code has: the reference is complete, no page names a file
that is not there, and the site builds without a warning.

The site is built once here (Sphinx's ``dummy`` builder: every page read and every reference
resolved, no HTML written) and its Python domain and CLI page are read back, so "appears in the
reference" means what a reader would find, not what a directive asked for (autodoc silently
skips an undocumented member). ``scripts/test.sh`` builds the HTML with ``-W`` as well.
"""

import argparse
import importlib
import io
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: The public API: the package faces and the base modules a library user calls. Every name in
#: their ``__all__`` must be in the API reference.
PUBLIC_MODULES = (
    "mpisdnn",
    "mpisdnn.errors",
    "mpisdnn.sdnn",
    "mpisdnn.weights",
    "mpisdnn.backends",
    "mpisdnn.formats",
    "mpisdnn.projection",
    "mpisdnn.generate",
    "mpisdnn.reporting",
    "mpisdnn.partition",
    "mpisdnn.parallel",
    "mpisdnn.system",
    "mpisdnn.cli",
)

#: Packages whose contents are not API: the sub-commands are documented by the CLI reference.
NOT_API = ("mpisdnn.commands",)

pytestmark = pytest.mark.xdist_group("docs")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The documentation built once: ``(app, warnings)``."""
    sphinx_app = pytest.importorskip("sphinx.application")
    from sphinx.util.console import nocolor

    nocolor()
    out = tmp_path_factory.mktemp("docs")
    warnings = io.StringIO()
    app = sphinx_app.Sphinx(
        str(DOCS),
        str(DOCS),
        str(out / "dummy"),
        str(out / "doctrees"),
        "dummy",
        status=None,
        warning=warnings,
        freshenv=True,
    )
    app.build()
    return app, warnings.getvalue()


def _documented_objects(app) -> dict:
    """``{id(object): full name}`` of every Python object the reference describes."""
    found = {}
    for name in app.env.get_domain("py").objects:
        module, _, attr = name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError):
            continue  # a method or attribute: its class is what counts here
        found[id(obj)] = name
    return found


def test_the_site_builds_without_a_warning(site):
    _, warnings = site
    assert warnings == "", warnings


def test_every_public_name_is_in_the_api_reference(site):
    app, _ = site
    names = set(app.env.get_domain("py").objects)
    documented = _documented_objects(app)
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            # a re-export counts where the object is documented under another public path;
            # data (tuples, strings) is matched by name, since equal values may be distinct
            # objects or shared ones
            if f"{module_name}.{name}" not in names and id(obj) not in documented:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"not in docs/reference/api-*.md: {missing}"


def test_every_package_is_public_or_named_as_not_api():
    packages = sorted(
        ".".join(("mpisdnn", *p.parent.relative_to(ROOT / "mpisdnn").parts))
        for p in (ROOT / "mpisdnn").rglob("__init__.py")
    )
    packages = [p.rstrip(".") for p in packages]
    # formats/projection is reached through mpisdnn.projection, which re-exports its names
    inner = {"mpisdnn.formats.projection"}
    unlisted = [p for p in packages if p not in PUBLIC_MODULES + NOT_API and p not in inner]
    assert not unlisted, f"add to PUBLIC_MODULES or NOT_API: {unlisted}"


def _cli_terms(app) -> dict:
    """``{command: [every flag spelling shown on its section of the CLI page]}``."""
    from docutils import nodes

    doctree = app.env.get_doctree("reference/cli")
    shown = {}
    for section in doctree.findall(nodes.section):
        ids = [i for i in section["ids"] if i == "mpisdnn" or i.startswith("mpisdnn-")]
        if not ids:
            continue
        terms = []
        for term in section.findall(nodes.term):
            for spelling in term.astext().split(", "):
                terms.append(spelling.split(" ")[0])
        # only this section's own flags (a section holds no sub-section here)
        shown[ids[0].removeprefix("mpisdnn-")] = terms
    return shown


def test_every_cli_flag_is_in_the_cli_reference(site):
    app, _ = site
    sys.path.insert(0, str(DOCS / "reference"))
    try:
        from cli_reference import commands
    finally:
        sys.path.remove(str(DOCS / "reference"))
    from mpisdnn.cli import COMMANDS

    shown = _cli_terms(app)
    assert [name for name, _ in commands()] == list(COMMANDS)
    top = shown["mpisdnn"]
    missing = [f"mpisdnn {flag}" for flag in ("--version", "--help") if flag not in top]
    for name, parser in commands():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            spellings = action.option_strings or [action.metavar or action.dest]
            missing += [f"{name} {s}" for s in spellings if s not in shown.get(name, ())]
    assert not missing, f"not in the CLI reference: {missing}"


# --- no doc names a file that does not exist -------------------------------------------------

#: Paths from the repository root, and module paths from inside mpisdnn/ (docs/architecture.md
#: writes ``sdnn/runner.py``).
_ROOTS = ("mpisdnn", "scripts", "docs", "tests", "slurm", ".ci")
_INNER = ("sdnn", "projection", "formats", "backends", "commands", "reporting", "generate")
_PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join(re.escape(r) for r in _ROOTS + _INNER) + r")/[\w./-]*)"
)
_FILE = re.compile(r"\.(py|sh|sbatch|md|toml|png|json|txt|cfg|ini)$")


def _named_paths(text: str):
    """``(line, path)`` of every repository path a text names: a file with an extension, or
    a folder ending in ``/``; placeholders (``commands/NAME.py``, ``{N}``, ``…``) skipped."""
    for number, line in enumerate(text.splitlines(), 1):
        for match in _PATH.finditer(line):
            path = match.group(1).rstrip(".")
            if not (_FILE.search(path) or path.endswith("/")):
                continue
            if any(part.isupper() for part in re.split(r"[/.]", path)):
                continue
            yield number, path


def _exists(path: str) -> bool:
    if path.split("/")[0] in _ROOTS:
        return (ROOT / path).exists()
    return (ROOT / "mpisdnn" / path).exists()


def test_path_scanner_finds_stale_and_passes_real_paths():
    text = "see `mpisdnn/sdnn/runner.py`, sdnn/engine.py and mpisdnn/sdnn/nowhere.py\n"
    text += "commands/NAME.py, scripts/test.sh, docs/img/, sdnn/gone/\n"
    paths = [p for _, p in _named_paths(text)]
    assert paths == [
        "mpisdnn/sdnn/runner.py",
        "sdnn/engine.py",
        "mpisdnn/sdnn/nowhere.py",
        "scripts/test.sh",
        "docs/img/",
        "sdnn/gone/",
    ]
    assert [p for p in paths if not _exists(p)] == ["mpisdnn/sdnn/nowhere.py", "sdnn/gone/"]


def test_no_doc_names_a_file_that_does_not_exist():
    stale = []
    for doc in sorted([ROOT / "README.md", *DOCS.rglob("*.md")]):
        if "_build" in doc.parts:
            continue
        for number, path in _named_paths(doc.read_text()):
            if not _exists(path):
                stale.append(f"{doc.relative_to(ROOT)}:{number}: {path}")
    assert not stale, "docs name files that do not exist:\n" + "\n".join(stale)


# --- README's links land on a page and a heading -------------------------------------------
# Sphinx checks the links between docs pages (anchors included); README.md is not a page of
# the site, so its links into docs/ are checked here, the way a forge renders them.

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set:
    """The anchors a page offers: its headings' slugs (as MyST and GitHub make them) and
    explicit ``<a id="...">`` targets (the redirect pages keep old anchors that way)."""
    slugify = pytest.importorskip("myst_parser.mdit_to_docutils.base").default_slugify
    found, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        heading = re.match(r"#{1,6} (.*)", line)
        if heading and not fence:
            found.add(slugify(heading.group(1).strip()))
    found.update(re.findall(r'<a id="([^"]+)"', path.read_text()))
    return found


def _broken_links(text: str, base: Path) -> list:
    broken = []
    for match in _LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        page = base / path if path else None
        if page is None or not page.exists():
            broken.append(target)
        elif anchor and page.suffix == ".md" and anchor not in _anchors(page):
            broken.append(target)
    return broken


def test_link_checker_finds_a_missing_page_and_a_missing_anchor():
    text = "[a](docs/index.md) [b](docs/nowhere.md) [c](docs/index.md#no-such-heading)\n"
    text += "[d](docs/design/results.md#re-measuring) [e](https://example.org/x#y)"
    assert _broken_links(text, ROOT) == ["docs/nowhere.md", "docs/index.md#no-such-heading"]


def test_every_readme_link_lands_on_a_page_and_heading():
    broken = _broken_links((ROOT / "README.md").read_text(), ROOT)
    assert not broken, f"README.md links to missing pages or anchors: {broken}"
