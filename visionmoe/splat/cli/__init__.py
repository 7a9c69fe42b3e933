"""``visionmoe-splat``: command line of visionmoe.splat (also ``python -m visionmoe.splat``).

A thin layer over the library; nothing in the library imports it. Each command module
(``render``, ``pgms``) registers its subcommands with ``add_<name>_parser(subparsers)``
functions (listed in ``SUBCOMMANDS``) that set ``func`` to a ``cmd_<name>(args) -> int``.
Bad input gives one ``visionmoe-splat <command>: error: ...`` line on stderr and exit status 2,
never a traceback; files are written atomically (``io.atomic_write``).
"""

from __future__ import annotations

import argparse
import sys

from ._common import EXIT_USAGE, CLIError
from .pgms import PGMS_SUBCOMMANDS
from .render import add_render_parser
from .view import add_view_parser

__all__ = ["main", "build_parser", "CLIError", "SUBCOMMANDS", "EXIT_USAGE"]

# Subcommand registrars, in the order `--help` lists them.
SUBCOMMANDS = [add_render_parser, *PGMS_SUBCOMMANDS, add_view_parser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="visionmoe-splat", description="PGMS tools for 3D Gaussian splatting scenes (visionmoe.splat)."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    from ...ops import ExtensionNotBuiltError
    from ..cameras import CameraError
    from ..io import SceneError
    from ..render import RenderError

    return (CLIError, SceneError, CameraError, RenderError, ExtensionNotBuiltError, ValueError, OSError)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 success, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors: argparse prints one line and exits 2
    try:
        return int(args.func(args) or 0)
    except _user_errors() as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"visionmoe-splat {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"visionmoe-splat {args.command}: interrupted", file=sys.stderr)
        return 130
