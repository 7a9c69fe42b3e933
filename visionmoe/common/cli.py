"""What both command lines share: exit codes, the user-error type, signals turned into
exceptions (so that an atomic write in progress removes its temporary file), imports held
from signals, a one-line argparse error, and the mapping from an exception to one error line
and an exit status. Standard library only: ``--version`` and ``--help`` stay instant."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Iterator

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class CLIError(Exception):
    """A user-facing error: printed as one ``error:`` line, exit status 2."""


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that cleanup (temporary files) runs; a
    ``BaseException`` so that library code catching ``Exception`` does not swallow it."""


def _on_sigterm(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """SIGTERM -> :class:`Terminated` and SIGINT -> ``KeyboardInterrupt`` for the duration of a
    command, restored afterwards (a CLI called in-process leaves no handler behind). Outside
    the main thread Python allows no handlers: nothing changes there. A SIGINT ignored by the
    shell (a command started in the background) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_term = signal.signal(signal.SIGTERM, _on_sigterm)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        if previous_int is not signal.SIG_IGN and previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def import_with_signals_held(*modules: str) -> None:
    """Import ``modules`` with SIGINT and SIGTERM held back until they are in. A Ctrl-C in the
    middle of numpy's own import leaves it half-initialised and the next import of it recurses
    (a RecursionError with a traceback, not a KeyboardInterrupt); held back, the signal arrives
    once the import is done and ends the command as cleanly as anywhere else."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks, import as usual
        for name in modules:
            importlib.import_module(name)
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (``PROG CMD: error: ... (see PROG --help)``),
    exit status 2, instead of the usage block."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def exit_status(exc: BaseException, command: str, user_errors: tuple[type[BaseException], ...]) -> int | None:
    """Print the one line a command ends with on ``exc`` and return its exit status: 130 for
    Ctrl-C, 143 for SIGTERM, 2 for a user error (``CLIError`` and ``user_errors``). ``None``
    for anything else: a bug, whose traceback the caller lets through."""
    if isinstance(exc, KeyboardInterrupt):
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(exc, Terminated):
        print(f"{command}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    if isinstance(exc, (CLIError, *user_errors)):
        print(f"{command}: error: {first_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    return None
