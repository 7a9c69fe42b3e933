"""Packaging: declared dependencies, package data, lazy attributes, and a wheel that works when
installed into a fresh virtual environment (next to the already-installed dependencies)."""

import ast
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
ASSET = REPO / "assets" / "fruit_drops_minimal.ply"
#: imported inside try/except or behind an option, and declared in an extra
OPTIONAL = {"gsplat": "gsplat"}
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(reqs) -> set[str]:
    return {_norm(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in reqs}


def _third_party_imports(folder: Path) -> set[str]:
    mods = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m != "visionmoe" and m != "__future__"}


def _distributions(modules: set[str]) -> dict[str, str]:
    owners = md.packages_distributions()
    missing = sorted(m for m in modules if m not in owners)
    assert not missing, f"imported but not installed here: {missing}"
    return {m: _norm(owners[m][0]) for m in modules}


def test_runtime_imports_are_declared():
    """`pip install visionmoe` covers the splat tools and ops; `[video]` adds the video side."""
    base = _requirement_names(PYPROJECT["project"]["dependencies"])
    extras = {k: _requirement_names(v) for k, v in PYPROJECT["project"]["optional-dependencies"].items()}
    core = _third_party_imports(REPO / "visionmoe" / "splat") | _third_party_imports(REPO / "visionmoe" / "ops")
    for mod, dist in _distributions(core - set(OPTIONAL)).items():
        assert dist in base, f"visionmoe.splat/ops import {mod} ({dist}) but it is not in [project].dependencies"
    for mod, extra in OPTIONAL.items():
        assert _norm(mod) in extras[extra]
    video = _third_party_imports(REPO / "visionmoe" / "video")
    for mod, dist in _distributions(video).items():
        assert dist in base | extras["video"], f"visionmoe.video imports {mod} ({dist}) but [video] lacks it"
    # the test extra brings the video side and what the tests import
    assert "visionmoe[video]" in PYPROJECT["project"]["optional-dependencies"]["test"]
    local = {p.stem for p in (REPO / "tests").rglob("*.py")}  # helper modules of the tests
    tests = _third_party_imports(REPO / "tests") - local
    for mod, dist in _distributions(tests).items():
        assert dist in base | extras["video"] | extras["test"] | extras["gsplat"], f"tests import {mod} ({dist})"
    pinned = _requirement_names(l for l in (REPO / "requirements.txt").read_text().splitlines()
                                if l.strip() and not l.startswith("#"))
    declared = base | set().union(*extras.values()) - {"visionmoe"}
    assert declared <= pinned, f"declared but not pinned for CI: {sorted(declared - pinned)}"
    assert "scipy" not in pinned | declared  # imported nowhere


def test_package_metadata_and_data():
    import visionmoe

    assert visionmoe.__version__ == md.version("visionmoe")
    assert "Apache License" in (REPO / "LICENSE").read_text() and "Version 2.0" in (REPO / "LICENSE").read_text()
    assert (REPO / "visionmoe" / "py.typed").is_file()
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts == {"visionmoe-splat": "visionmoe.splat.cli:run", "visionmoe-video": "visionmoe.video.cli:run"}
    from visionmoe.video.models.tiny import DEFAULT_ASSETS
    from visionmoe.video.models.toy_world import TOY_WORLD_PATH

    for folder in (TOY_WORLD_PATH, DEFAULT_ASSETS):
        assert folder.is_dir() and folder.is_relative_to(REPO / "visionmoe")  # package data, not the checkout's assets/


def test_lazy_submodules():
    code = ("import sys, visionmoe; assert 'torch' not in sys.modules and 'visionmoe.splat' not in sys.modules; "
            "assert 'ops' in dir(visionmoe); ops = visionmoe.ops; assert ops is sys.modules['visionmoe.ops']; "
            "assert callable(visionmoe.splat.compress) and visionmoe.video.__name__ == 'visionmoe.video'; "
            "import pytest\n"
            "try:\n    visionmoe.nothing\nexcept AttributeError as e:\n    print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "module 'visionmoe' has no attribute 'nothing'"


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> SimpleNamespace:
    """Build the wheel (reusing the compiled objects in build/), install it into a new venv that sees
    the installed dependencies but not the checkout, and compress the demo scene with it from
    elsewhere (work/scene.pgms): the tests below share this venv."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheels = tmp_path / "wheels"
    env = {**os.environ, "MAX_JOBS": os.environ.get("MAX_JOBS", "2"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(wheels),
          str(REPO)], env=env, timeout=1800)
    (wheel,) = wheels.glob("visionmoe-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=300)
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    deps = [p for p in sys.path if p.endswith("site-packages")]
    # the dependencies of this environment, as plain path entries (their .pth files, among them the
    # editable install of the checkout, are not processed)
    (site / "_deps.pth").write_text("\n".join(deps) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         env=env, timeout=600)
    work = tmp_path / "elsewhere"
    work.mkdir()
    run_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "NODE_PATH")} | {"HF_HUB_OFFLINE": "1"}
    bin_ = venv / "bin"
    _run([str(bin_ / "visionmoe-splat"), "compress", str(ASSET), "-o", "scene.pgms", "--ratio", "10",
          "--prune-search", "0", "--refine-steps", "0"],
         cwd=work, env=run_env, timeout=900)
    return SimpleNamespace(py=py, bin=bin_, site=site, work=work, env=run_env)


@pytest.mark.slow
def test_wheel_in_a_fresh_venv(installed_wheel):
    """Both command lines and the package data, from the wheel, run from elsewhere."""
    py, bin_, site, work, run_env = (installed_wheel.py, installed_wheel.bin, installed_wheel.site,
                                     installed_wheel.work, installed_wheel.env)
    where = _run([str(py), "-c", "import visionmoe, visionmoe.video.models.toy_world as t; print(visionmoe.__file__); "
                  "print(t.TOY_WORLD_PATH); print(visionmoe.__version__)"], cwd=work, env=run_env).split()
    assert all(Path(p).is_relative_to(site) for p in where[:2]), where
    assert where[2] == md.version("visionmoe")
    assert _run([str(bin_ / "visionmoe-video"), "--version"], cwd=work, env=run_env).strip().endswith(where[2])
    helptext = _run([str(bin_ / "visionmoe-splat"), "--help"], cwd=work, env=run_env)
    if "--version" in helptext:
        assert where[2] in _run([str(bin_ / "visionmoe-splat"), "--version"], cwd=work, env=run_env)
    # decompress what the fixture compressed (the demo scene)
    _run([str(bin_ / "visionmoe-splat"), "decompress", "scene.pgms", "-o", "decoded.ply"],
         cwd=work, env=run_env, timeout=300)
    n = _run([str(py), "-c", "from visionmoe.splat import read_ply; print(read_ply('decoded.ply').num_gaussians)"],
             cwd=work, env=run_env)
    assert 0 < int(n) <= 4721
    # the toy world with its adapter, from the installed package data
    out = _run([str(bin_ / "visionmoe-video"), "generate", "--steps", "2", "-o", "toy.mp4"],
               cwd=work, env=run_env, timeout=900)
    assert f"adapter: {Path(where[1]) / 'pila'}" in out and (work / "toy.mp4").stat().st_size > 1000


# Where the page's requests may go: the page, its one bundled module, and the scene.
VIEWER_REQUESTS = {"/viewer/index.html", "/viewer/viewer.js", "/scene.pgms"}
PROBE = """
import json, subprocess, sys
from pathlib import Path
from visionmoe.splat.viewer import server
data = Path("scene.pgms").read_bytes()
site = server.site_root()
with server.serve(data) as srv:
    url = srv.page_url(hud=0, width=96, height=96, level=0, camera=server.default_camera(data, 0))
    res = subprocess.run(["node", str(server.check_npm_root() / "tools" / "screenshot.mjs"), "--url", url,
                          "--out", "probe.png", "--width", "96", "--height", "96"], capture_output=True, text=True)
    print(json.dumps({"site": str(site), "npm_root": str(server.NPM_ROOT), "rc": res.returncode,
                      "stderr": res.stderr[-2000:], "requests": sorted({p for p, _ in srv.requests})}))
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None or not any(Path(p).exists() for p in CHROMIUM_PATHS),
                    reason="needs node and Chromium (make web-deps)")
def test_viewer_from_the_wheel(installed_wheel):
    """The viewer ships in the wheel: `view --screenshot` works with no checkout or npm packages in
    reach, and the served page loads nothing but files of the installed package."""
    py, bin_, site, work, run_env = (installed_wheel.py, installed_wheel.bin, installed_wheel.site,
                                     installed_wheel.work, installed_wheel.env)
    page = site / "visionmoe" / "splat" / "viewer" / "site"
    for name in ("viewer/index.html", "viewer/viewer.js", "tools/screenshot.mjs", "THIRD_PARTY_LICENSES.md"):
        assert (page / name).is_file() and not (page / name).is_symlink(), name
    assert not (page / "src").exists() and not (page / "node_modules").exists()
    _run([str(bin_ / "visionmoe-splat"), "view", "scene.pgms", "--screenshot", "shot.png", "--width", "160",
          "--height", "120"], cwd=work, env=run_env, timeout=600)
    import imageio.v3 as iio

    shot = iio.imread(work / "shot.png")
    assert shot.shape[:2] == (120, 160)
    assert (shot[..., :3].max(-1) > 20).mean() > 0.05  # the scene, not the black background
    probe = json.loads(_run([str(py), "-c", PROBE], cwd=work, env=run_env, timeout=600).strip().splitlines()[-1])
    assert probe["rc"] == 0, probe["stderr"]
    assert Path(probe["site"]) == page and Path(probe["npm_root"]) == page
    assert set(probe["requests"]) == VIEWER_REQUESTS, probe["requests"]
