"""``visionmoe-video``: generate physics-aware videos with PILA, evaluate and train adapters.

    visionmoe-video generate                       # the shipped toy world + its adapter -> toy_world.mp4
    visionmoe-video generate --prompt "a blue ball is dropped and falls straight down" -o fall.mp4
    visionmoe-video generate --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --adapter path/to/pila \\
        --prompt "water pours into a glass" --physics liquid --offload -o pour.mp4
    visionmoe-video eval --num 32                  # base vs PILA vs scale-0 control on the toy world
    visionmoe-video train --data manifest.jsonl --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --stage 1 ...

Every argument is checked before a model is loaded: a bad one is one ``error:`` line on
stderr and exit status 2. This package is a thin layer over the library
(:mod:`visionmoe.video.pipelines`, :mod:`visionmoe.video.evaluation`, :mod:`visionmoe.video.training`),
one module per command (:mod:`.generate`, :mod:`.eval`, :mod:`.train`) and the checks they
share (:mod:`.common`); nothing in the library imports it.
"""

from __future__ import annotations

import argparse
import os
import sys

from ...common.cli import OneLineParser, exit_status, signals_as_exceptions
from . import eval as eval_command
from . import generate as generate_command
from . import train as train_command

PROG = "visionmoe-video"


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
    a = parser.parse_args(argv)
    with signals_as_exceptions():
        try:
            return a.func(a)
        except BaseException as exc:  # noqa: BLE001 - mapped to one line and a status, or re-raised
            status = exit_status(exc, f"{PROG} {a.command}", ())
            if status is None:
                raise
            return status


if __name__ == "__main__":
    sys.exit(main())
