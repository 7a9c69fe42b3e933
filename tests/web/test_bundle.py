"""The viewer bundle that ships as package data (visionmoe/splat/viewer/site, built from web/ by
setup.py with web/tools/bundle.mjs): current, self-contained, licensed, and its build's errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from web_env import NODE, ROOT, WEB, needs_node

from visionmoe.splat.viewer.server import NPM_ROOT, check_npm_root, site_root

SHIPPED = ("viewer/index.html", "viewer/viewer.js", "tools/screenshot.mjs", "THIRD_PARTY_LICENSES.md")


@needs_node
def test_the_package_site_is_the_bundle_of_the_current_web_sources(tmp_path):
    """What the tests serve is what a wheel ships: the in-tree site equals a fresh build, byte for byte."""
    res = subprocess.run([NODE, "tools/bundle.mjs", "--out", str(tmp_path / "site")], cwd=WEB,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    site = site_root()
    assert site == NPM_ROOT and check_npm_root() == site
    for name in SHIPPED:
        assert (site / name).read_bytes() == (tmp_path / "site" / name).read_bytes(), (
            f"{site / name} is stale: run `make build` (setup.py rebuilds the bundle when web/ changed)")


def test_the_page_loads_nothing_but_its_own_bundle():
    site = site_root()
    html = (site / "viewer" / "index.html").read_text()
    assert "importmap" not in html and "node_modules" not in html
    assert re.findall(r'<script[^>]*src="([^"]+)"', html) == ["./viewer.js"]
    js = (site / "viewer" / "viewer.js").read_bytes()
    # one ES module with no import of its own (static or dynamic) and no address to fetch from
    assert not re.search(rb'\bimport\s*[("\'{*]|\bfrom\s*["\']|node_modules', js)
    assert re.findall(rb"https?://[\w.-]+", js) == [b"http://www.w3.org"]  # the SVG/XHTML namespace


def test_bundled_packages_and_their_licences():
    site = site_root()
    manifest = json.loads((site / "bundle.json").read_text())
    packages = {p["name"]: p for p in manifest["packages"]}
    for name, licence in (("three", "MIT"), ("@sparkjsdev/spark", "MIT"), ("fzstd", "MIT"), ("puppeteer-core", "Apache-2.0")):
        assert packages[name]["license"] == licence
    lock = json.loads((WEB / "package-lock.json").read_text())["packages"]
    text = (site / "THIRD_PARTY_LICENSES.md").read_text()
    for name, p in packages.items():
        assert p["version"] == lock[f"node_modules/{name}"]["version"], name  # the lock file's packages
        assert re.fullmatch(r"[\w.+-]+( (OR|AND) [\w.+-]+)*|\([\w.+ -]+\)", p["license"]), p
        assert f"## {name} {p['version']} ({p['license']})" in text
    assert re.fullmatch(r"[0-9a-f]{64}", manifest["stamp"])  # setup.py's hash of the inputs


@needs_node
def test_bundle_tool_refuses_bad_arguments_in_one_line(tmp_path):
    for args in ([], ["--out"], ["out", str(tmp_path)]):
        res = subprocess.run([NODE, "tools/bundle.mjs", *args], cwd=WEB, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and res.stdout == ""
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("bundle.mjs: "), res.stderr


def test_building_without_node_says_what_to_install(tmp_path):
    """setup.py with a stale bundle and no Node: one line naming Node.js and npm, before anything is built."""
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "visionmoe", tmp_path / "visionmoe",
                    ignore=shutil.ignore_patterns("site", "__pycache__", "*.so", "assets"))
    web = tmp_path / "web"
    for name in ("viewer", "src", "tools"):
        shutil.copytree(WEB / name, web / name)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(WEB / name, web / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.path.dirname(sys.executable)  # this Python, no node or npm
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_py"], cwd=tmp_path, env=env | {"VISIONMOE_SKIP_EXT": "1"},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("building the viewer bundle (package data) needs Node.js 20+ and npm"), res.stderr[-2000:]
    assert not (tmp_path / "visionmoe" / "splat" / "viewer" / "site").exists()
