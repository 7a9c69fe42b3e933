"""`python -m visionmoe.video`: the visionmoe-video command line."""

import sys

from .cli import main

sys.exit(main())
