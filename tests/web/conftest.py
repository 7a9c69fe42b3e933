"""The .pgms fixtures of the web tests with their Python-decoded levels, written once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pgms_web")
    subprocess.run([sys.executable, str(ROOT / "tests" / "web" / "make_fixtures.py"), "--out", str(out)], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)
    return out
