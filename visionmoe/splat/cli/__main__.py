"""`python -m visionmoe.splat.cli ...` runs the visionmoe-splat command line."""

import sys

from . import main

sys.exit(main())
