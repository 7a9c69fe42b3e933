"""What both command lines share: exit codes, the user-error type, signals turned into
exceptions (so that an atomic write in progress removes its temporary file), imports held
from signals, a one-line argparse error, and the mapping from an exception to one error line
and an exit status (a closed pipe ends quietly, an allocation that failed is one line naming its
size). Standard library only: ``--version`` and ``--help`` stay instant."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

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


def exit_program(status: int) -> NoReturn:
    """End a command-line program with ``status``: its work is done, so a Ctrl-C or SIGTERM that
    lands while the interpreter tears down (torch's atexit finalisers) is held back and dropped
    instead of printing a traceback over a finished command."""
    if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(status)


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
    exit status 2, instead of the usage block (``--help`` still prints it). argparse makes the
    subcommands' parsers of the same class."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


_TORCH_ALLOC = re.compile(r"(?:can't allocate memory|out of memory).*?tried to allocate (\d+) bytes", re.I | re.S)


def _address_space_limit() -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def memory_error_line(exc: BaseException) -> str | None:
    """The one line for an allocation that failed, naming the size asked for, or ``None`` when
    ``exc`` is no allocation failure. Knows numpy's ``_ArrayMemoryError`` (size, shape, item
    size), torch's CPU allocator ``RuntimeError`` and CUDA ``OutOfMemoryError`` (by their text:
    this module imports neither), and a bare ``MemoryError`` (size unknown: the address-space
    limit, if one is set, is named instead)."""
    if isinstance(exc, MemoryError):
        total, shape, dtype = (getattr(exc, a, None) for a in ("_total_size", "shape", "dtype"))
        if total is not None and shape is not None and dtype is not None:
            items = "x".join(map(str, shape)) or "1"
            return (f"out of memory: could not allocate {_gib(total)} ({total} bytes: an array of {items} items of "
                    f"{dtype.itemsize} bytes); free memory or use a smaller input")
        limit = _address_space_limit()
        where = f" within the process's address-space limit of {_gib(limit)}" if limit else ""
        text = first_line(exc) if str(exc).strip() else "an allocation failed"
        return f"out of memory{where}: {text}; free memory or use a smaller input"
    if isinstance(exc, RuntimeError):
        m = _TORCH_ALLOC.search(str(exc))
        if m:
            nbytes = int(m.group(1))
            return f"out of memory: could not allocate {_gib(nbytes)} ({nbytes} bytes); free memory or use a smaller input"
        if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA)
            return f"out of GPU memory: {first_line(exc)}"
    return None


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (``| head`` after its lines). A broken pipe
    elsewhere (a writer's subprocess that died) is a real failure and is not mistaken for it."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _fd, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll (Windows), stdout replaced or closed
        return False


def quiet_broken_pipe() -> None:
    """After the reader of stdout went away: point stdout at the null device so that the
    interpreter's last flush does not fail again with a second traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout replaced (tests) or already closed
        pass


def finish_stdout() -> None:
    """Flush stdout before the command returns (its result, ``--help``, ``--version``), so that a
    reader that has gone (``| head``) is seen here and ends quietly, rather than at the
    interpreter's exit (a second traceback, exit status 120)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_closed():
            raise
        quiet_broken_pipe()


def exit_status(exc: BaseException, command: str, user_errors: tuple[type[BaseException], ...]) -> int | None:
    """Print the one line a command ends with on ``exc`` and return its exit status: 130 for
    Ctrl-C, 143 for SIGTERM, 2 for a user error (``CLIError`` and ``user_errors``) and for an
    allocation that failed (:func:`memory_error_line`), 0 and nothing printed for a closed
    output pipe (``| head``: the reader has what it wanted). ``None`` for anything else: a bug,
    whose traceback the caller lets through."""
    if isinstance(exc, BrokenPipeError) and stdout_closed():
        quiet_broken_pipe()
        return EXIT_OK
    memory = memory_error_line(exc)
    if memory is not None:
        print(f"{command}: error: {memory}", file=sys.stderr)
        return EXIT_USAGE
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
