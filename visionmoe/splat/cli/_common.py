"""Shared pieces of the ``visionmoe-splat`` commands: common options, input/output checks,
the progress display. Imports nothing of the command modules; the exit codes, signals, user-error
type and argument validators both command lines share are in :mod:`visionmoe.common`."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from ...common.cli import CLIError
from ...common.files import check_writable


def add_common_options(p: argparse.ArgumentParser) -> None:
    """-q/--quiet and -v/--verbose on a command (where it has not defined them itself)."""
    have = p._option_string_actions
    if "--quiet" not in have:
        p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    elif "-q" not in have:
        have["-q"] = have["--quiet"]
        have["--quiet"].option_strings.insert(0, "-q")
    if "--verbose" not in have:
        p.add_argument("-v", "--verbose", action="store_true", help="log the library's steps on stderr, one line each")


def add_output_options(p: argparse.ArgumentParser, what: str, required: bool = True) -> None:
    p.add_argument("-o", "--out", required=required, help=what)
    p.add_argument("-w", "--overwrite", action="store_true", help="replace existing output files")


def plan_outputs(inputs: list[str], out: str, suffix: str, overwrite: bool) -> list[tuple[Path, Path]]:
    """(input, output) pairs, every path checked before any work: inputs exist; with one input
    ``out`` is the output file, with several a folder (created) that gets ``<stem><suffix>``
    per input; an existing output is refused unless ``overwrite``; outputs are never an input,
    never a special file, and their folder must accept a new file."""
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
    if name.lower() == "meta.json":  # an unbundled SOG: the folder names the scene
        return p.resolve().parent.name or p.stem
    for ext in (".compressed.ply", ".ply", ".splat", ".spz", ".sog", ".ksplat", ".pgms"):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return p.stem


_PYTHON_HINT = re.compile(r" \((?:use|drop them first:)[^()]*nonfinite=[^)]*\)+")


def read_scene(path: Path, drop_nonfinite: bool | None = None):
    """A scene from any supported input format. The library's hint for non-finite values names
    a Python call; here it names ``--drop-nonfinite`` only where that helps: a command that has
    the flag (``drop_nonfinite`` not None), reading a format that can hold such values (not a
    .pgms, whose decoder refuses them)."""
    from ..formats import format_of, read_any
    from ..io import SceneError

    try:
        return read_any(path, nonfinite="drop" if drop_nonfinite else "reject")
    except SceneError as exc:
        message = str(exc)
        if not _PYTHON_HINT.search(message):
            raise
        helps = drop_nonfinite is False and format_of(path) != "pgms"
        raise CLIError(_PYTHON_HINT.sub(" (--drop-nonfinite skips them)" if helps else "", message, count=1)) from None


def progress_over(items: list, quiet: bool, desc: str):
    """A progress bar over files when there are several (and not quiet)."""
    if len(items) < 2 or quiet:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="file", file=sys.stderr, leave=False)


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


class _AboveTheBar:
    """A stream for the log handler while a bar is shown: each line is written through
    ``tqdm.write``, which clears the bar, prints the line on a line of its own and redraws it."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        from tqdm import tqdm

        tqdm.write(text, file=self.stream, end="")

    def flush(self) -> None:
        self.stream.flush()


class EncodeProgress:
    """The display of one encode: the encoder's ``(stage, done, total)`` reports
    (``encoder.stages.ProgressFn``) on one tqdm bar on stderr that shows them as they come (the
    stage as its label, ``done`` of ``total`` steps), with the log lines (``-v``: the stage
    lines) printed above it. A context manager: the bar is closed and the log handlers restored
    on the way out."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.bar, self.stage = enabled, None, None
        self._handlers: list[tuple[logging.StreamHandler, object]] = []

    def __enter__(self) -> EncodeProgress:
        if self.enabled:
            for h in logging.getLogger("visionmoe").handlers:
                if isinstance(h, logging.StreamHandler) and h.stream is sys.stderr:
                    self._handlers.append((h, h.setStream(_AboveTheBar(sys.stderr))))
        return self

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", file=sys.stderr, leave=False, dynamic_ncols=True)
        if total != self.bar.total:
            self.bar.total = total
        if stage != self.stage:
            self.stage = stage
            self.bar.set_description_str(stage, refresh=False)
        self.bar.n = max(0, min(done, total))
        self.bar.refresh()

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
        for h, stream in self._handlers:
            h.setStream(stream)
        self._handlers.clear()
