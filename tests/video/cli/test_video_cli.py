"""visionmoe-video (visionmoe.video.cli) and its adapter-config validation, in-process and offline."""

import json
import os
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import pytest

from visionmoe.video import cli
from visionmoe.video.cli.common import write_mp4
from visionmoe.video.models.toy_world import TOY_WORLD_DEFAULTS, TOY_WORLD_PATH
from visionmoe.video.pila.config import AdapterConfigError, adapter_parameter_count, read_adapter_config, validate_adapter_config

REPO = Path(__file__).resolve().parents[3]
SMALL = ["--steps", "2", "--frames", "5", "--height", "32", "--width", "32"]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a command tries to load a model (argument errors must come first)."""
    from visionmoe.video.pipelines.wan_pila import WanPILAPipeline

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(WanPILAPipeline, "from_pretrained", classmethod(boom))


def run_error(argv, capsys):
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1, err
    return err[0]


def test_generate_small(tmp_path, capsys):
    out = tmp_path / "v.mp4"
    old = os.umask(0o027)
    try:
        assert cli.main(["generate", *SMALL, "--physics", "liquid", "-o", str(out)]) == 0
    finally:
        os.umask(old)
    frames = imageio.mimread(out)
    assert len(frames) == 5 and frames[0].shape == (32, 32, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]  # no temp file left
    assert (out.stat().st_mode & 0o777) == 0o640  # the user's umask, not mkstemp's 0600
    text = capsys.readouterr().out
    assert "physics categories (user): liquid" in text
    assert f"adapter: {TOY_WORLD_PATH / 'pila'}" in text
    assert text.strip().endswith(f"wrote {out.resolve()}")


def test_generate_defaults_are_the_toy_world(tmp_path, capsys, monkeypatch):
    """No size flags: the toy world's own sizes (17x64x64), its adapter, the default file name."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["generate", "--steps", "1", "-q"]) == 0
    frames = imageio.mimread(tmp_path / "toy_world.mp4")
    assert len(frames) == TOY_WORLD_DEFAULTS["num_frames"]
    assert frames[0].shape == (TOY_WORLD_DEFAULTS["height"], TOY_WORLD_DEFAULTS["width"], 3)
    captured = capsys.readouterr()
    assert captured.out == ""  # -q: nothing but errors
    assert "float32" not in captured.err and "Warning" not in captured.err
    assert run_error(["generate", "--steps", "1"], capsys).endswith("exists; pass -w/--overwrite to replace it")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--height", "30"], "--height 30 is impossible: it must be a positive multiple of 16 (e.g. 32)"),
        (["--width", "0"], "--width 0 is impossible"),
        (["--frames", "8"], "--frames 8 is impossible: it must be 4k+1"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--scale", "-1"], "--scale must be >= 0, got -1"),
        (["--scale", "inf"], "--scale must be a finite number"),
        (["--trajectory-guidance", "-0.1"], "--trajectory-guidance must be >= 0"),
        (["--fps", "0"], "--fps must be > 0, got 0"),
        (["--guidance", "nan"], "--guidance must be a finite number"),
        (["--start", "0.6", "--end", "0.5"], "need 0 <= --start <= --end <= 1"),
        (["--seed", "-3"], "--seed must lie in [0, 2^63)"),
        (["--model", "no/such/dir"], "no such directory"),
        (["--model", "."], "not a diffusers checkpoint"),
        (["--adapter", "missing_adapter"], "adapter 'missing_adapter': no such directory"),
        (["--physics", "plasma"], "no PILA category for any label 'plasma'"),
        (["--device", "tpu"], "--device 'tpu' is not a device name"),
        (["--device", "cuda:99"], "--device cuda:99: torch sees"),
        (["-o", "video.gif"], "must name an .mp4"),
        (["-o", "no/such/dir/v.mp4"], "directory 'no/such/dir' does not exist"),
    ],
)
def test_generate_argument_errors(args, message, tmp_path, capsys, no_model_load, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = run_error(["generate", *args], capsys)
    assert line.startswith("visionmoe-video generate: error: ") and message in line, line
    assert list(tmp_path.iterdir()) == []


def test_generate_out_checks(tmp_path, capsys, no_model_load):
    (tmp_path / "d.mp4").mkdir()
    assert "is a directory" in run_error(["generate", "-o", str(tmp_path / "d.mp4")], capsys)
    assert "is a directory" in run_error(["generate", "-o", str(tmp_path)], capsys)
    os.mkfifo(tmp_path / "fifo.mp4")
    assert "not a regular file" in run_error(["generate", "-o", str(tmp_path / "fifo.mp4"), "-w"], capsys)
    (tmp_path / "f").write_text("x")
    assert "does not exist" in run_error(["generate", "-o", str(tmp_path / "f" / "v.mp4")], capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_generate_unwritable_dir(tmp_path, capsys, no_model_load):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert "cannot write in" in run_error(["generate", "-o", str(ro / "v.mp4")], capsys)
    finally:
        ro.chmod(0o700)


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import imageio.v2 as iio

    def broken(path, *a, **k):
        Path(path).write_bytes(b"half a video")
        raise OSError("disk full")

    monkeypatch.setattr(iio, "mimwrite", broken)
    with pytest.raises(OSError, match="disk full"):
        write_mp4([], tmp_path / "v.mp4", 16)
    assert list(tmp_path.iterdir()) == []


BAD_CONFIGS = [
    ({"hidden_dim": -5}, "hidden_dim must be an integer in [1, 16384], got -5"),
    ({"slot_dim": "96"}, "slot_dim must be an integer in [1, 4096], got '96' (a str)"),
    ({"hidden_dim": 1e9}, "hidden_dim must be an integer in [1, 16384], got 1000000000.0 (a float)"),
    ({"experts_per_category": 1000000}, "experts_per_category must be an integer in [1, 64], got 1000000"),
    ({"experts_per_category": True}, "(a boolean)"),
    ({"flow_window": 4}, "flow_window must be an odd integer"),
    ({"kappa": 0}, "kappa must be a number in (0, 1e+06]"),
    ({"top_k": 7}, "top_k must be at most the number of experts (6), got 7"),
    ({"hidden_dim": 16384, "expert_hidden": 65536}, "parameters"),  # every key in range, the total is not
    ({"colour": 3}, "unknown key(s) colour"),
    ({"_class_name": "UNet2DModel"}, "not 'PILAAdapter'"),
]


@pytest.mark.parametrize("config, message", BAD_CONFIGS)
def test_validate_adapter_config(config, message):
    with pytest.raises(AdapterConfigError, match="^adapter config: ") as info:
        validate_adapter_config(config)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_adapter_config_budget_and_count():
    from visionmoe.video.pila.adapter import PILAAdapter

    cfg = {"hidden_dim": 16, "slot_dim": 4, "expert_hidden": 8, "text_dim": 12}
    assert adapter_parameter_count(cfg) == sum(p.numel() for p in PILAAdapter(**cfg).parameters())
    assert validate_adapter_config(cfg, max_parameters=10**6) == cfg
    with pytest.raises(AdapterConfigError, match="over the budget of 1,000"):
        validate_adapter_config(cfg, max_parameters=1000)
    shipped = read_adapter_config(TOY_WORLD_PATH / "pila")
    assert shipped["latent_channels"] == 16 and "_class_name" not in shipped


@pytest.mark.parametrize("config, message", [(c, m) for c, m in BAD_CONFIGS if m != "parameters"][:4]
                         + [("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object")])
def test_generate_bad_adapter_is_one_line(config, message, tmp_path, capsys, no_model_load):
    adapter = tmp_path / "pila"
    adapter.mkdir()
    (adapter / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    line = run_error(["generate", "--adapter", str(adapter), "-o", str(tmp_path / "v.mp4")], capsys)
    assert line.startswith("visionmoe-video generate: error: --adapter: ") and message in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pila"]


def test_train_checks_before_loading(tmp_path, capsys, monkeypatch):
    import visionmoe.video.training as T

    monkeypatch.setattr(T, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    base = ["train", "--data", str(tmp_path), "--output-dir", str(tmp_path / "o")]
    assert "hidden_dim must be an integer" in run_error(base + ["--set", "adapter={hidden_dim: -5}"], capsys)
    assert "unknown config key(s) ['colour']" in run_error(base + ["--set", "colour=1"], capsys)
    assert "--set expects KEY=VALUE" in run_error(base + ["--set", "colour"], capsys)
    assert "stage must be 1, 2 or 3" in run_error(base + ["--stage", "4"], capsys)
    assert "give data" in run_error(["train"], capsys)


def test_command_line_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--no-such-flag"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments: --no-such-flag" in err[0]
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and "visionmoe-video (visionmoe) " in capsys.readouterr().out


def test_generate_video_script_is_an_alias(tmp_path):
    """scripts/generate_video.py = visionmoe-video generate, without sys.path patches."""
    script = REPO / "scripts" / "generate_video.py"
    assert "sys.path" not in script.read_text()
    r = subprocess.run([sys.executable, str(script), "--fps", "0", "-o", str(tmp_path / "v.mp4")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "visionmoe-video generate: error: --fps must be > 0, got 0"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num", "0"], "--num must be >= 1, got 0"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--scale", "-0.5"], "--scale must be >= 0"),
        (["--window", "0.8", "0.2"], "need 0 <= START <= END <= 1 for --window"),
        (["--trajectory-guidance", "nan"], "--trajectory-guidance must be a finite number"),
        (["--model", "."], "is not a diffusers checkpoint folder"),
        (["--adapter", "missing"], "adapter 'missing': no such directory"),
        (["--device", "cuda:7"], "torch sees"),
        (["-o", "no/such/dir"], "directory 'no/such' does not exist"),
    ],
)
def test_eval_argument_errors(args, message, tmp_path, capsys, monkeypatch):
    import visionmoe.video.evaluation as E

    monkeypatch.setattr(E, "evaluate_toy_world", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    monkeypatch.chdir(tmp_path)
    line = run_error(["eval", *args], capsys)
    assert line.startswith("visionmoe-video eval: error: ") and message in line, line


def test_eval_writes_table(tmp_path, capsys):
    out = tmp_path / "ev"
    assert cli.main(["eval", "--num", "1", "--steps", "1", "--batch", "1", "-q", "-o", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "| base |" in table and "PILA (scale 1)" in table
    assert "scale-0 control bit-identical to the base: True" in table
    assert json.loads((out / "results.json").read_text())["control_bit_identical"] is True


def test_eval_with_trajectory_guidance_arm(tmp_path, capsys):
    out = tmp_path / "ev"
    assert cli.main(["eval", "--num", "1", "--steps", "2", "--batch", "1", "--no-control", "--trajectory-guidance",
                     "0.05", "-q", "-o", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "| trajectory guidance 0.05 |" in table and "change of trajectory guidance 0.05 vs base" in table


def test_generate_with_trajectory_projection(tmp_path, capsys):
    out = tmp_path / "v.mp4"
    assert cli.main(["generate", *SMALL, "--trajectory-projection", "gravity", "-o", str(out)]) == 0
    assert len(imageio.mimread(out)) == 5
    assert "trajectory projection: gravity law, decoded video" in capsys.readouterr().out
    out = tmp_path / "v_latent.mp4"
    assert cli.main(["generate", *SMALL, "--trajectory-projection", "lines", "--projection-space", "latent",
                     "-o", str(out)]) == 0
    assert len(imageio.mimread(out)) == 5
    assert "trajectory projection: lines law, last step" in capsys.readouterr().out


def test_eval_with_trajectory_projection_arms(tmp_path, capsys):
    out = tmp_path / "ev"
    assert cli.main(["eval", "--num", "1", "--steps", "2", "--batch", "1", "--no-control", "--trajectory-projection",
                     "gravity", "--trajectory-projection", "lines", "-q", "-o", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "| trajectory projection (gravity, pixels) |" in table and "| trajectory projection (lines, pixels) |" in table
    assert cli.main(["eval", "--num", "1", "--steps", "2", "--batch", "1", "--no-control", "--trajectory-projection",
                     "gravity", "--projection-space", "latent", "-q", "-o", str(out)]) == 0
    assert "| trajectory projection (gravity) |" in (out / "table.md").read_text()


def test_eval_script_projection_specs(load_script):
    projection_arm = load_script("eval_toy_world").projection_arm
    arm = projection_arm("gravity:0:2")
    assert (arm.trajectory_projection, arm.projection_strength, arm.projection_steps) == ("gravity", 0.0, 2)
    assert arm.name == "trajectory projection (gravity, strength 0, last 2 steps)"
    assert projection_arm("lines").name == "trajectory projection (lines)"
    arm = projection_arm("lines:0@pixels")
    assert (arm.projection_space, arm.name) == ("pixels", "trajectory projection (lines, strength 0, pixels)")
    for bad in ("orbits", "gravity:2", "gravity:1:0", "gravity:1:1:1", "gravity@voxels", "gravity:1:2@pixels"):
        with pytest.raises(ValueError):
            projection_arm(bad)


def test_validation_knows_every_adapter_option():
    """Every PILAAdapter option has a type/range rule (add one to ADAPTER_KEYS with a new option)."""
    import inspect

    from visionmoe.video.pila.adapter import PILAAdapter
    from visionmoe.video.pila.config import ADAPTER_KEYS

    params = [p for p in inspect.signature(PILAAdapter.__init__).parameters if p != "self"]
    assert sorted(params) == sorted(ADAPTER_KEYS)
    with pytest.raises(AdapterConfigError, match="structure must be one of 'physics', 'plain', got 'fancy'"):
        validate_adapter_config({"structure": "fancy"})
    with pytest.raises(AdapterConfigError, match="anchor must be true or false, got 1"):
        validate_adapter_config({"anchor": 1})
    assert validate_adapter_config({"structure": "plain", "plain_blocks": 2, "hidden_dim": 16}) is not None


@pytest.mark.parametrize("caption, message", [(5, "'caption' must be text, got int 5"),
                                              (["a", "b"], "'caption' must be text, got list"),
                                              ("   ", "missing 'caption'")])
def test_manifest_caption_type(tmp_path, caption, message):
    from visionmoe.video.data.manifest import ManifestError, read_manifest

    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"video": "a.mp4", "caption": caption}) + "\n")
    with pytest.raises(ManifestError, match=message.replace("(", r"\(")):
        read_manifest(str(path), check_files=False)
