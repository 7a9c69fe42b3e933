#!/usr/bin/env python
"""Alias of ``visionmoe-video train`` (kept for old command lines and ``accelerate launch``
scripts); see ``visionmoe-video train --help``.

    python scripts/train_pila.py --data manifest.jsonl --stage 1 --output-dir runs/s1   # = visionmoe-video train ...
    accelerate launch --num_processes 2 scripts/train_pila.py --cache-dir runs/s1/cache --stage 3 ...
"""

import sys

from visionmoe.video.cli import main as cli_main


def main(argv=None) -> int:
    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
