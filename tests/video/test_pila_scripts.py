"""scripts/generate_video.py on the embedded tiny Wan (in-process, offline)."""

import importlib.util
from pathlib import Path

import imageio.v2 as imageio
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "generate_video.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("generate_video", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generates_mp4(gen, tmp_path, capsys):
    out = tmp_path / "v.mp4"
    args = ["--steps", "2", "--frames", "5", "--height", "32", "--width", "32", "--physics", "liquid", "--out", str(out)]
    assert gen.main(args) == 0
    frames = imageio.mimread(out)
    assert len(frames) == 5 and frames[0].shape == (32, 32, 3)
    assert not (tmp_path / "v.partial.mp4").exists()
    assert "physics categories (user): liquid" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--height", "30"], "--height 30 is impossible: it must be a positive multiple of 16"),
        (["--frames", "8"], "--frames 8 is impossible: it must be 4k+1"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--model", "no/such/dir"], "no such directory"),
        (["--model", "."], "not a diffusers checkpoint"),
        (["--adapter", "missing_adapter"], "--adapter 'missing_adapter': no such directory"),
        (["--out", "video.gif"], "must name an .mp4"),
        (["--physics", "plasma"], "no PILA category for any label .plasma."),
        (["--device", "tpu"], "--device 'tpu' is not a device name"),
        (["--device", "cuda:99"], "--device cuda:99: torch sees"),
    ],
)
def test_clear_errors(gen, tmp_path, args, message):
    with pytest.raises(gen.UsageError, match=message.replace("(", r"\(").replace("+", r"\+")):
        gen.main(args + ([] if "--out" in args else ["--out", str(tmp_path / "x.mp4")]))
