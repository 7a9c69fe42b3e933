"""`python -m visionmoe.splat ...` runs the visionmoe-splat command line."""

import sys

from .cli import main

sys.exit(main())
