"""Sphinx configuration: the user guide, the reference and the design notes of mpisdnn.

Build (what ``scripts/test.sh`` runs, warnings are errors)::

    python -m sphinx -W --keep-going -q -b html docs docs/_build/html

The pages are Markdown (MyST); the Python API comes from the numpydoc docstrings (autodoc +
napoleon) and the CLI reference from the argparse parsers themselves
(``docs/reference/cli_reference.py``), so neither can drift from the code.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the mpisdnn of this checkout, installed or not
sys.path.insert(0, str(HERE / "reference"))  # the CLI directive

import mpisdnn  # noqa: E402

project = "mpisdnn"
author = "the mpisdnn developers"
release = version = mpisdnn.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "cli_reference",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# GitHub-style anchors, so "performance.md#some-heading" links work here as on the forge.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# numpydoc sections through napoleon (a stdlib-only Sphinx extension: nothing to compile).
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
# Each directive says ":members:" itself: a default of True would override an explicit list.
autodoc_default_options = {"show-inheritance": True}

# "--flag" stays two hyphens, quotes stay straight: the pages are full of commands.
smartquotes = False

html_theme = "alabaster"
html_title = f"mpisdnn {release}"
html_show_sourcelink = False
