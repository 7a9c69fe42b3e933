"""``visionmoe-splat``: command line of visionmoe.splat (also ``python -m visionmoe.splat``).

A thin layer over the library; nothing in the library imports it. Each command module
(``render``, ``pgms``) registers its subcommands with ``add_<name>_parser(subparsers)``
functions (listed in ``SUBCOMMANDS``) that set ``func`` to a ``cmd_<name>(args) -> int``.
Bad input (a bad argument included) gives one ``visionmoe-splat <command>: error: ...`` line on
stderr and exit status 2, never a traceback or a usage block (``--help`` has it); an allocation
that fails is such a line naming its size; a closed output pipe (``| head``) ends quietly with
exit status 0. ``-q`` shows only errors, ``-v`` the library's INFO lines, Python warnings are never
shown raw (:mod:`visionmoe.common.cli_output`). Files are written atomically
(``visionmoe.common.files.atomic_write``). ``--version`` and ``--help`` import neither torch nor numpy.
"""

from __future__ import annotations

import argparse

from ...common.cli import (
    EXIT_USAGE, CLIError, OneLineParser, exit_program, exit_status, finish_stdout, import_with_signals_held,
    signals_as_exceptions,
)
from ...common.cli_output import command_output, verbosity
from ._common import add_common_options
from .pgms import PGMS_SUBCOMMANDS
from .render import add_render_parser
from .view import add_view_parser

__all__ = ["main", "run", "build_parser", "CLIError", "SUBCOMMANDS", "EXIT_USAGE"]

# Subcommand registrars, in the order `--help` lists them.
SUBCOMMANDS = [add_render_parser, *PGMS_SUBCOMMANDS, add_view_parser]


def build_parser() -> argparse.ArgumentParser:
    from ..._version import __version__

    parser = OneLineParser(
        prog="visionmoe-splat", description="PGMS tools for 3D Gaussian splatting scenes (visionmoe.splat)."
    )
    parser.add_argument("--version", action="version", version=f"visionmoe-splat {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(subparsers)
    for p in subparsers.choices.values():
        add_common_options(p)  # -q/--quiet, -v/--verbose on every command
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    from ...ops import ExtensionNotBuiltError
    from ..cameras import CameraError
    from ..io import SceneError
    from ..render import RenderError

    return (SceneError, CameraError, RenderError, ExtensionNotBuiltError, ValueError, OSError)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 success, 2 bad input, 130 Ctrl-C, 143 SIGTERM).

    SIGTERM is turned into an exception (as Ctrl-C is) before anything heavy is imported, so
    that a write in progress removes its temporary file either way."""
    command = "visionmoe-splat"
    with signals_as_exceptions():
        try:
            parser = build_parser()
            args = parser.parse_args(argv)  # usage errors: one line, exit status 2
            command = f"visionmoe-splat {args.command}"
            with command_output(verbosity(args.quiet, args.verbose), keep_stdout=getattr(args, "json", False)):
                if args.command != "view":  # every other command loads the library (torch, numpy)
                    import_with_signals_held("numpy", "torch")
                status = int(args.func(args) or 0)
                finish_stdout()  # a closed pipe is seen here, not at the interpreter's exit
            return status
        except SystemExit:  # argparse's own exit: --help, --version or a usage error
            finish_stdout()
            raise
        except BaseException as exc:  # noqa: BLE001 - sorted by exit_status; a bug keeps its traceback
            # the user errors' types load the library: only looked up for an Exception (not for
            # Ctrl-C, SIGTERM or argparse's exit, which may come before or during that import)
            status = exit_status(exc, command, _user_errors() if isinstance(exc, Exception) else ())
            if status is None:
                raise
            return status


def run() -> None:
    """The ``visionmoe-splat`` program: :func:`main` on ``sys.argv``, then exit with its status."""
    exit_program(main())
