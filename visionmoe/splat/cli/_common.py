"""Shared pieces of the ``visionmoe-splat`` commands: the user-error type, argument types,
input/output checks, logging set-up. Imports nothing of the command modules."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

EXIT_USAGE = 2


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def rgb(text: str):
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three numbers like 0,0,0 or 1,1,1, got {text!r}") from None
    if len(values) != 3 or not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected three numbers in [0, 1] like 1,1,1, got {text!r}")
    return values


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


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def check_io(inp: Path, out: Path, suffix: str) -> None:
    """An input file that exists and an output path that is neither it nor a folder, in a folder that exists."""
    if not inp.is_file():
        raise CLIError(f"input file {inp} does not exist")
    if same_file(inp, out):
        raise CLIError(f"output {out} is the input file; choose another path")
    if out.exists() and out.is_dir():
        raise CLIError(f"output {out} is a folder; give a {suffix} file path")
    if not out.parent.exists():
        raise CLIError(f"output folder {out.parent} does not exist")


def enable_verbose_logging() -> None:
    """Show the library's INFO log lines (the encoder's stages and their timings) on stderr."""
    log = logging.getLogger("visionmoe.splat")
    if not any(getattr(h, "_visionmoe_cli", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._visionmoe_cli = True
        log.addHandler(handler)
    log.setLevel(logging.INFO)
