#!/usr/bin/env python
"""Alias of ``visionmoe-video generate`` (kept for old command lines); see ``visionmoe-video generate --help``.

    python scripts/generate_video.py -o ball.mp4      # = visionmoe-video generate -o ball.mp4
"""

import sys

from visionmoe.video.cli import main

if __name__ == "__main__":
    sys.exit(main(["generate", *sys.argv[1:]]))
