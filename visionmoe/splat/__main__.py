"""`python -m visionmoe.splat ...` runs the visionmoe-splat command line."""

from .cli import run

run()
