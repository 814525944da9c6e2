"""The CLI reference, generated from the argparse parsers of :mod:`mpisdnn.cli` at build time.

``{mpisdnn-cli}`` (a MyST directive) renders the top-level options and every sub-command of
:func:`mpisdnn.cli.build_parser`: its description, usage line and every flag with its help,
choices and default. The nodes are built directly (no reStructuredText is generated), so help
texts need no escaping. :func:`commands` is what the directive and ``tests/test_docs.py`` read.
"""

from __future__ import annotations

import argparse

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def commands(parser: argparse.ArgumentParser | None = None) -> list:
    """``[(name, subparser), ...]`` in the order ``mpisdnn --help`` lists them."""
    if parser is None:
        from mpisdnn.cli import build_parser

        parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def flags(parser: argparse.ArgumentParser) -> list:
    """Every option string and positional of ``parser`` (``--help`` included)."""
    out = []
    for action in parser._actions:
        out.extend(action.option_strings or [action.dest])
    return out


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The flag's help as ``--help`` prints it, with its choices and default when the help
    text does not already give them."""
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    extra = []
    if action.choices is not None and action.metavar is not None:
        extra.append("one of " + ", ".join(str(c) for c in action.choices))
    if (
        action.option_strings
        and action.nargs != 0
        and action.default not in (None, False, argparse.SUPPRESS)
        and "default" not in text
    ):
        extra.append(f"default {action.default}")
    if extra:
        text = f"{text} ({'; '.join(extra)})" if text else "; ".join(extra)
    return text


def _term(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """``--flag METAVAR`` (or ``{a,b,c}``), every spelling of the flag, as ``--help`` has it."""
    return parser._get_formatter()._format_action_invocation(action)


def _groups(parser: argparse.ArgumentParser) -> list:
    groups = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        if actions:
            groups.append((group.title, group.description, actions))
    return groups


class CliDirective(SphinxDirective):
    """``{mpisdnn-cli}``: the top-level options, then one section per sub-command, every flag
    in a definition list."""

    has_content = False

    def run(self):
        from mpisdnn.cli import build_parser

        parser = build_parser()
        out = [_section("mpisdnn", "mpisdnn", parser, sub_commands=False)]
        for name, sub in commands(parser):
            out.append(_section(f"mpisdnn-{name}", f"mpisdnn {name}", sub))
        for section in out:
            self.state.document.note_implicit_target(section, section)
        return out


def _section(ident: str, title: str, parser, sub_commands: bool = True) -> nodes.section:
    """A section: the parser's description, usage line and flags (the sub-commands' list
    left out of the top level, where each has its own section)."""
    section = nodes.section(ids=[ident], names=[title])
    section += nodes.title(text=title)
    if parser.description:
        section += nodes.paragraph(text=parser.description)
    usage = parser.format_usage().replace("usage: ", "", 1).strip()
    section += nodes.literal_block(usage, usage)
    for group_title, description, actions in _groups(parser):
        if not sub_commands:
            actions = [a for a in actions if not isinstance(a, argparse._SubParsersAction)]
            if not actions:
                continue
        section += nodes.rubric(text=group_title)
        if description:
            section += nodes.paragraph(text=description)
        items = nodes.definition_list()
        for action in actions:
            item = nodes.definition_list_item()
            item += nodes.term("", "", nodes.literal(text=_term(parser, action)))
            body = nodes.definition()
            body += nodes.paragraph(text=_help(parser, action))
            item += body
            items += item
        section += items
    if parser.epilog:
        section += nodes.paragraph(text=parser.epilog)
    return section


def setup(app):
    app.add_directive("mpisdnn-cli", CliDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
