"""Paths and tools of the web tests: Node 20+, web/'s npm packages and the distribution's
Chromium (`make web-deps` installs them); tests that need one skip, saying why, where it is missing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
NODE = shutil.which("node")
NPM = shutil.which("npm")
CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser")
                 if p and Path(p).exists()), None)
HAS_NPM = all((WEB / "node_modules" / p).is_dir() for p in ("fzstd", "puppeteer-core", "esbuild", "@sparkjsdev/spark"))

needs_node = pytest.mark.skipif(NODE is None or not HAS_NPM,
                                reason="needs node and the npm packages of web/ (make web-deps)")
needs_browser = pytest.mark.skipif(NODE is None or not HAS_NPM or CHROMIUM is None,
                                   reason="needs node, web/node_modules and Chromium (make web-deps)")
