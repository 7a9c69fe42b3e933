"""visionmoe: PILA (physics MoE adapter for Wan video pipelines) and PGMS (pyramidal
Gaussian-mixture compression of 3DGS scenes), on one compiled extension.

Importing the package never needs the compiled extension; ops that do need it say how
to build it. The plug-ins are imported on demand: ``visionmoe.video``, ``visionmoe.splat``.
"""

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
