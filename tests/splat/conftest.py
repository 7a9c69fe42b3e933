"""The splat tests' shared helpers (``pgms_helpers``, ``hostile``) sit in this folder; the tests of
each room (``pgms/``, ``encoder/``, ``cli/``, ``formats/``) import them by name."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
