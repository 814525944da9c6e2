"""Argument helpers shared by the sub-commands."""

from __future__ import annotations

import argparse
import math


def _typed(text: str, convert, accept, expected: str, unparsable: str | None = None):
    """``convert(text)`` when it parses and ``accept`` takes it, else argparse's one-line error
    ("expected EXPECTED, got 'TEXT'"; ``unparsable`` replaces EXPECTED when it does not parse)."""
    try:
        value = convert(text)
    except ValueError:
        wanted = unparsable or expected
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    if not accept(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _typed(text, int, lambda v: v >= 1, "a positive integer")


def nonneg_int(text: str) -> int:
    return _typed(text, int, lambda v: v >= 0, "an integer >= 0")


def finite_float(text: str) -> float:
    return _typed(text, float, math.isfinite, "a finite number", unparsable="a number")


def nonneg_float(text: str) -> float:
    return _typed(text, finite_float, lambda v: v >= 0, "a number >= 0")


def add_choice(parser, flag: str, choices: tuple, **kwargs) -> None:
    """Add the option ``flag`` taking one of ``choices``; its default is the first choice."""
    parser.add_argument(flag, choices=choices, default=choices[0], **kwargs)
