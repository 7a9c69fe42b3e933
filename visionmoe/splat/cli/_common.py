"""Shared pieces of the ``visionmoe-splat`` commands: the user-error type, argument types,
input/output checks, logging set-up. Imports nothing of the command modules."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

EXIT_USAGE = 2


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that cleanup (temporary files) runs."""


def _on_sigterm(signum, frame):
    raise Terminated()


def install_signal_handlers() -> None:
    """SIGTERM -> :class:`Terminated`; SIGINT keeps Python's KeyboardInterrupt. Called first
    thing, before torch or the library load (``visionmoe.splat`` imports lazily)."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background: leave it
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)


def import_with_signals_held(*modules: str) -> None:
    """Import ``modules`` with SIGINT and SIGTERM held back until they are in. A Ctrl-C in the
    middle of numpy's own import leaves it half-initialised and the next import of it recurses
    (a RecursionError with a traceback, not a KeyboardInterrupt); held back, the signal arrives
    once the import is done and ends the command as cleanly as anywhere else."""
    import importlib

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


def add_common_options(p: argparse.ArgumentParser) -> None:
    """-q/--quiet and -v/--verbose on a command (where it has not defined them itself)."""
    have = p._option_string_actions
    if "--quiet" not in have:
        p.add_argument("-q", "--quiet", action="store_true", help="no progress bars, only errors and results")
    elif "-q" not in have:
        have["-q"] = have["--quiet"]
        have["--quiet"].option_strings.insert(0, "-q")
    if "--verbose" not in have:
        p.add_argument("-v", "--verbose", action="store_true", help="log the library's steps on stderr")


def apply_verbosity(args) -> None:
    if getattr(args, "verbose", False):
        enable_verbose_logging()


def add_output_options(p: argparse.ArgumentParser, what: str, required: bool = True) -> None:
    p.add_argument("-o", "--out", required=required, help=what)
    p.add_argument("-w", "--overwrite", action="store_true", help="replace existing output files")


def plan_outputs(inputs: list[str], out: str, suffix: str, overwrite: bool) -> list[tuple[Path, Path]]:
    """(input, output) pairs, every path checked before any work: inputs exist; with one input
    ``out`` is the output file, with several a folder (created) that gets ``<stem><suffix>``
    per input; an existing output is refused unless ``overwrite``; outputs are never an input,
    never a special file, and their folder must accept a new file."""
    from ..io import check_writable

    ins = [Path(p) for p in inputs]
    for inp in ins:
        if not inp.is_file():
            raise CLIError(f"input file {inp} does not exist")
    out_path = Path(out)
    if len(ins) == 1 and not out_path.is_dir():
        pairs = [(ins[0], out_path)]
    else:
        if out_path.exists() and not out_path.is_dir():
            raise CLIError(f"-o {out_path}: with several inputs -o names a folder, and this is a file")
        out_path.mkdir(parents=True, exist_ok=True)
        pairs = [(inp, out_path / (_stem(inp) + suffix)) for inp in ins]
        names = [o.name for _i, o in pairs]
        if len(set(names)) != len(names):
            raise CLIError(f"two inputs would write the same output name in {out_path}; decode them separately")
    for inp, o in pairs:
        if same_file(inp, o) or any(same_file(i, o) for i in ins):
            raise CLIError(f"output {o} is the input file; choose another path")
        if o.is_dir() and not o.is_symlink():
            raise CLIError(f"output {o} is a folder; give a {suffix} file path")
        if not o.parent.exists():
            raise CLIError(f"output folder {o.parent} does not exist")
        check_writable(o)  # special files refused, the folder probed (before any encode)
        if o.exists() and not overwrite:
            raise CLIError(f"output {o} exists; use -w/--overwrite to replace it")
    return pairs


def _stem(p: Path) -> str:
    name = p.name
    for ext in (".compressed.ply", ".ply", ".splat", ".pgms"):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return p.stem


def progress_over(items: list, quiet: bool, desc: str):
    """A progress bar over files when there are several (and not quiet)."""
    if len(items) < 2 or quiet:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="file", file=sys.stderr, leave=False)


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
