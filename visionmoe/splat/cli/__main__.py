"""`python -m visionmoe.splat.cli ...` runs the visionmoe-splat command line."""

from . import run

run()
