"""`python -m visionmoe.video`: the visionmoe-video command line."""

from .cli import run

run()
