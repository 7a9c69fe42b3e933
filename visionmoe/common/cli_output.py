"""What a command line shows besides its result and its error line: the library's log on
stderr at the level ``-q``/``-v`` ask for, Python warnings as log lines (never the raw
``file:line: RuntimeWarning`` block), and nothing on stdout with ``-q``. Standard library only.

Levels: ``-q`` shows nothing but the error line; the default shows the library's warnings
(``warning: ...``, one line each: a counted drop, a target not met); ``-v`` adds its INFO lines
(the encoder's stages). Python warnings (numpy's overflow in a cast, a deprecation inside a
dependency) are logged at INFO: they describe the library's internals, not the user's input,
and a refused input's error line must stay the only line (issue 52)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator

QUIET, NORMAL, VERBOSE = -1, 0, 1
WARNINGS_LOGGER = "visionmoe.warnings"
_LEVELS = {QUIET: logging.CRITICAL + 1, NORMAL: logging.WARNING, VERBOSE: logging.INFO}


def verbosity(quiet: bool, verbose: bool) -> int:
    """``-q`` wins over ``-v``: a script that asks for silence gets it."""
    return QUIET if quiet else VERBOSE if verbose else NORMAL


class _LineFormatter(logging.Formatter):
    """INFO lines as they are; warnings and errors prefixed, every record on one line."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).split("\n")[0]
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` replacement: one INFO line, the message's first line."""
    first = str(message).strip().split("\n")[0]
    where = os.path.basename(filename or "?")
    logging.getLogger(WARNINGS_LOGGER).info("%s: %s (%s:%s)", category.__name__, first, where, lineno)


@contextlib.contextmanager
def _no_last_resort() -> Iterator[None]:
    """A silent handler on the root logger, so that a dependency's warning (a logger without a
    handler of its own) does not reach stderr through logging's last resort."""
    root, null = logging.getLogger(), logging.NullHandler()
    root.addHandler(null)
    try:
        yield
    finally:
        root.removeHandler(null)


@contextlib.contextmanager
def command_output(level: int, logger_name: str = "visionmoe", *, keep_stdout: bool = False) -> Iterator[logging.Handler]:
    """For the duration of a command: a stderr handler on ``logger_name`` (one line per record,
    at ``level``: :data:`QUIET`, :data:`NORMAL` or :data:`VERBOSE`), Python warnings turned into
    INFO lines of :data:`WARNINGS_LOGGER`, and stdout discarded when quiet. Everything is
    restored afterwards, so a command run in-process (tests) leaves no handler behind.
    ``keep_stdout``: stdout is the data the user asked for (``--json``), kept when quiet. Yields
    the handler (a progress display redirects it so that lines never land on its bar)."""
    log = logging.getLogger(logger_name)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LineFormatter("%(message)s"))
    handler.setLevel(_LEVELS[level])
    previous_level = log.level
    log.addHandler(handler)  # a handler, even a silent one, also keeps logging's last resort quiet
    log.setLevel(logging.INFO if level == VERBOSE else logging.WARNING)
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.showwarning = _log_warning
        if level == QUIET and not keep_stdout:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
        if level == QUIET:
            stack.enter_context(_no_last_resort())
        try:
            yield handler
        finally:
            log.removeHandler(handler)
            log.setLevel(previous_level)
