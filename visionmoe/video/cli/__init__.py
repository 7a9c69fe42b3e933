"""``visionmoe-video``: generate physics-aware videos with PILA, evaluate and train adapters.

    visionmoe-video generate                       # the shipped toy world + its adapter -> toy_world.mp4
    visionmoe-video generate --prompt "a blue ball is dropped and falls straight down" -o fall.mp4
    visionmoe-video generate --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --adapter path/to/pila \\
        --prompt "water pours into a glass" --physics liquid --offload -o pour.mp4
    visionmoe-video eval --num 32                  # base vs PILA vs scale-0 control on the toy world
    visionmoe-video train --data manifest.jsonl --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --stage 1 ...

Every argument is checked before a model is loaded: a bad one is one ``error:`` line on
stderr and exit status 2 (so is a missing ``[video]`` extra, naming the ``pip install`` line, and
an allocation that fails); ``-q`` prints nothing but errors, Python warnings are never shown raw,
a closed output pipe ends quietly. ``--version`` and ``--help`` import neither torch nor diffusers. This package is a thin layer over the library
(:mod:`visionmoe.video.pipelines`, :mod:`visionmoe.video.evaluation`, :mod:`visionmoe.video.training`),
one module per command (:mod:`.generate`, :mod:`.eval`, :mod:`.train`) and the checks they
share (:mod:`.common`); nothing in the library imports it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

from ...common.cli import CLIError, OneLineParser, exit_program, exit_status, finish_stdout, signals_as_exceptions
from ...common.cli_output import NORMAL, QUIET, VERBOSE, command_output
from . import eval as eval_command
from . import generate as generate_command
from . import train as train_command

PROG = "visionmoe-video"
#: the import names of the ``[video]`` extra's packages (pyproject.toml)
VIDEO_EXTRA = ("diffusers", "transformers", "accelerate", "safetensors", "imageio_ffmpeg", "cv2", "yaml")
INSTALL_EXTRA = 'pip install "visionmoe[video]"'


def missing_extra() -> list[str]:
    """The ``[video]`` extra's modules that cannot be imported (looked up, not imported)."""
    missing = []
    for name in VIDEO_EXTRA:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked installation
            found = False
        if not found:
            missing.append(name)
    return missing


def _extra_error(exc: BaseException) -> CLIError | None:
    """A module of the extra missing at import time -> the one line that says what to install."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if isinstance(exc, ModuleNotFoundError) and name in VIDEO_EXTRA:
        return CLIError(f"the [video] extra is not installed (no module {name!r}): {INSTALL_EXTRA}")
    return None


def build_parser() -> argparse.ArgumentParser:
    from ..._version import __version__

    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                      epilog="Run `visionmoe-video COMMAND --help` for a command's options.")
    p.add_argument("--version", action="version", version=f"{PROG} (visionmoe) {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    generate_command.add_parser(sub)
    eval_command.add_parser(sub)
    train_command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    try:
        a = parser.parse_args(argv)
    except SystemExit:  # --help, --version or a usage error (one line): argparse's own exit
        finish_stdout()
        raise
    # train shows its progress log lines unless -q; generate and eval only their warnings
    level = QUIET if a.quiet else VERBOSE if a.command == "train" else NORMAL
    with signals_as_exceptions():
        try:
            with command_output(level):
                missing = missing_extra()
                if missing:
                    raise CLIError(f"the [video] extra is not installed (no module {', '.join(map(repr, missing))}): "
                                   f"{INSTALL_EXTRA}")
                status = a.func(a)
                finish_stdout()
            return status
        except BaseException as exc:  # noqa: BLE001 - mapped to one line and a status, or re-raised
            status = exit_status(_extra_error(exc) or exc, f"{PROG} {a.command}", ())
            if status is None:
                raise
            return status


def run() -> None:
    """The ``visionmoe-video`` program: :func:`main` on ``sys.argv``, then exit with its status."""
    exit_program(main())


if __name__ == "__main__":
    run()
