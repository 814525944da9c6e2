"""Reading and validating JSON run reports (any kind, any schema version up to ours)."""

from __future__ import annotations

import json
import os

from ..errors import InputError
from .schema import KINDS, SCHEMA, SCHEMA_NAME, SCHEMA_VERSION

__all__ = ["load_report"]


def load_report(path) -> dict:
    """Read and validate one JSON report.

    Raises
    ------
    InputError
        The file is missing, not JSON, not an mpisdnn report, of an unknown kind, written by
        a newer schema, or lacks a section the plots need. The message names the file.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except FileNotFoundError:
        raise InputError(f"{path}: report not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a JSON report ({exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    schema = obj.get("schema") if isinstance(obj, dict) else None
    name, _, version = str(schema).partition("/")
    if not isinstance(schema, str) or name != SCHEMA_NAME:
        raise InputError(
            f'{path}: not an mpisdnn run report (no "schema": "{SCHEMA}"; write one with '
            f"mpisdnn infer --report)"
        )
    if not version.isdigit() or not 1 <= int(version):
        raise InputError(  # "mpisdnn.report" or "mpisdnn.report/x" was called "newer"
            f'{path}: report schema "{schema}" has no version (expected "{SCHEMA}")'
        )
    if int(version) > SCHEMA_VERSION:
        raise InputError(
            f'{path}: report schema "{schema}" is newer than this mpisdnn reads ({SCHEMA}); '
            f"upgrade mpisdnn"
        )
    kind = obj.get("kind")
    if kind == "challenge":  # the sitting's own table, written beside it as Markdown
        table = os.path.join(os.path.dirname(path) or ".", "challenge.md")
        raise InputError(
            f"{path}: an mpisdnn challenge table, not a run report: the table is {table} "
            f"(run reports: infer --report, project --report)"
        )
    if kind not in KINDS:
        raise InputError(f"{path}: unknown report kind {kind!r} (expected one of {KINDS})")
    needed = ("run", "problem", "phases", "layers", "ranks") if kind == "infer" else ("run",)
    missing = [key for key in needed if not isinstance(obj.get(key), dict)]
    if missing:
        raise InputError(f"{path}: {kind} report lacks section(s) {', '.join(missing)}")
    obj["_path"] = path
    return obj
