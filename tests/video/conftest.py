"""tests/video: the shared synthetic clips (``clips.py``) are importable from every room."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
