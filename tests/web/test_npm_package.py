"""web/ as the npm package visionmoe-pgms: publishable metadata and types, and `npm pack`'s tarball
installed into an empty folder, imported by its name and decoding the fixtures bit for bit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib

import pytest
from web_env import NODE, NPM, ROOT, WEB, needs_browser, needs_node

PACKAGE = json.loads((WEB / "package.json").read_text())
PACKED = {"package.json", "README.md", "LICENSE", "index.js", "index.d.ts", "spark.d.ts",
          "src/pgms.js", "src/rans.js", "src/memory.js", "src/scene.js", "src/loader.js"}


def _exported_names(js: str) -> set[str]:
    names = set(re.findall(r"^export (?:async )?(?:function|class|const|let) (\w+)", js, re.M))
    for group in re.findall(r"^export \{([^}]*)\}", js, re.M):
        names |= {n.split(" as ")[-1].strip() for n in group.split(",") if n.strip()}
    return names


def _declared_names(dts: str) -> set[str]:
    return set(re.findall(r"^export (?:declare )?(?:function|class|const|interface|type) (\w+)", dts, re.M))


def test_package_metadata_is_publishable():
    assert PACKAGE["name"] == "visionmoe-pgms" and not PACKAGE.get("private")
    assert PACKAGE["type"] == "module"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert PACKAGE["license"] == pyproject["project"]["license"]
    assert (WEB / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    for entry in PACKAGE["exports"].values():
        targets = entry.values() if isinstance(entry, dict) else [entry]
        assert all((WEB / t).is_file() for t in targets), entry
    # the decoder needs fzstd only; the Spark loader's packages are optional peers
    assert set(PACKAGE["dependencies"]) == {"fzstd"}
    assert set(PACKAGE["peerDependencies"]) == {"three", "@sparkjsdev/spark"}
    assert all(m["optional"] for m in PACKAGE["peerDependenciesMeta"].values())
    readme = (WEB / "README.md").read_text()
    assert 'from "visionmoe-pgms"' in readme and 'from "visionmoe-pgms/spark"' in readme
    for licence in ("three.js", "Spark", "fzstd", "MIT"):
        assert licence in readme


@pytest.mark.parametrize("module, types", [("index.js", "index.d.ts"), ("src/loader.js", "spark.d.ts")])
def test_every_export_has_a_type(module, types):
    js = (WEB / module).read_text()
    if module == "index.js":  # re-exports: check that the modules they name export them
        for names, source in re.findall(r"^export \{([^}]*)\} from \"\./([^\"]+)\"", js, re.M):
            wanted = {n.strip() for n in names.split(",")}
            assert wanted <= _exported_names((WEB / source).read_text()), source
    exported = _exported_names(js)
    assert exported and exported <= _declared_names((WEB / types).read_text())


@needs_node
@pytest.mark.skipif(NPM is None, reason="needs npm")
def test_npm_pack_installs_into_an_empty_folder_and_decodes_bit_exactly(fixtures, tmp_path):
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false", "npm_config_audit": "false"}
    res = subprocess.run([NPM, "pack", "--pack-destination", str(tmp_path), "--json"], cwd=WEB, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (tgz,) = tmp_path.glob("visionmoe-pgms-*.tgz")
    with tarfile.open(tgz) as tar:
        files = {m.name.removeprefix("package/") for m in tar.getmembers() if m.isfile()}
    assert files == PACKED
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    lock = json.loads((WEB / "package-lock.json").read_text())["packages"]
    peers = [f"{p}@{lock[f'node_modules/{p}']['version']}" for p in ("three", "@sparkjsdev/spark")]
    # from npm's cache when it has them (`npm ci` in web/ put them there), else from the registry
    res = subprocess.run([NPM, "install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error", str(tgz), *peers],
                         cwd=app, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (app / "node_modules" / "visionmoe-pgms" / "test").exists()
    shutil.copy(ROOT / "tests" / "web" / "pack_check.mjs", app / "pack_check.mjs")
    res = subprocess.run([NODE, "pack_check.mjs"], cwd=app, env=env | {"PGMS_FIXTURES": str(fixtures)},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    manifest = json.loads((fixtures / "manifest.json").read_text())
    assert report["files"] == len(manifest["files"]) and report["levels"] == sum(f["levels"] for f in manifest["files"])


@needs_browser
def test_the_readme_example_shows_a_streamed_scene(fixtures, tmp_path):
    """The README's browser example, bundled as a web developer would, shows the scene in Chromium."""
    section = (WEB / "README.md").read_text().split("## Show a .pgms as it streams", 1)[1]
    (tmp_path / "example.mjs").write_text(re.search(r"```js\n(.*?)```", section, re.S).group(1))
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "visionmoe-pgms").symlink_to(WEB, target_is_directory=True)
    shutil.copy(fixtures / "fruit_drops_minimal_20x.pgms", tmp_path / "scene.pgms")
    res = subprocess.run([NODE, str(ROOT / "tests" / "web" / "readme_example.mjs"), "--web", str(WEB), "--dir", str(tmp_path),
                          "--out", str(tmp_path / "shot.png")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["errors"] == [] and report["lit"] > 0.05, report
