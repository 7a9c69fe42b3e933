"""argparse ``type=`` validators and post-parse number checks shared by both command lines.
Each error says what was expected and what was given."""

from __future__ import annotations

import argparse
import math

from .cli import CLIError


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def rgb(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three numbers like 0,0,0 or 1,1,1, got {text!r}") from None
    if len(values) != 3 or not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected three numbers in [0, 1] like 1,1,1, got {text!r}")
    return values


def check_finite(name: str, value: float, lo: float | None = None, *, strict: bool = False) -> None:
    """``value`` finite and ``>= lo`` (``> lo`` when ``strict``), else :class:`CLIError`."""
    if not math.isfinite(value):
        raise CLIError(f"{name} must be a finite number, got {value}")
    if lo is not None and (value <= lo if strict else value < lo):
        raise CLIError(f"{name} must be {'>' if strict else '>='} {lo:g}, got {value:g}")
