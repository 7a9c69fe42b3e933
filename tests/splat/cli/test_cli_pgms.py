"""visionmoe-splat compress/decompress/eval/info: round trips and bad input (one line, exit 2)."""

from __future__ import annotations

import json
import shutil

import pytest
from pgms_helpers import ASSET, random_scene

from visionmoe.splat.cli import main
from visionmoe.splat.io import read_ply, write_ply

FAST = ["--views", "4", "--view-size", "64", "--quiet"]
LOUD = FAST[:-1]  # the result line on stdout (-q prints nothing but errors)


@pytest.fixture(scope="module")
def pgms_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    scene = d / "scene.ply"
    shutil.copy(ASSET, scene)
    out = d / "scene.pgms"
    assert main(["compress", str(scene), "-o", str(out), "--ratio", "25", *FAST]) == 0
    return scene, out


def one_error_line(capsys, command):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"visionmoe-splat {command}: error:") or "error:" in err[0]
    assert "Traceback" not in err[0]
    return err[0]


def test_round_trip_through_cli(pgms_file, tmp_path, capsys):
    scene, pgms = pgms_file
    ref = scene.stat().st_size / 25  # the asset is a native-degree float32 .ply
    assert 0.95 * ref <= pgms.stat().st_size <= ref * 1.001
    ply = tmp_path / "out.ply"
    assert main(["decompress", str(pgms), "-o", str(ply)]) == 0
    dec = read_ply(ply)
    assert dec.sh_degree == 3 and dec.num_gaussians > 1000
    assert main(["decompress", str(pgms), "-o", str(tmp_path / "l0.ply"), "--level", "0"]) == 0
    assert read_ply(tmp_path / "l0.ply").num_gaussians < dec.num_gaussians
    capsys.readouterr()
    assert main(["info", str(pgms), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["sections"][0]["tag"] == "HEAD" and meta["ratio"] > 20
    assert main(["eval", str(scene), str(pgms), "--eval-views", "2", "--eval-size", "64", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["psnr_db"] > 25 and 0 < res["ssim"] <= 1 and res["ratio"] > 20


def test_compress_refuses_to_overwrite_input(pgms_file, capsys):
    scene, _ = pgms_file
    before = scene.read_bytes()
    assert main(["compress", str(scene), "-o", str(scene), *FAST]) == 2
    assert "is the input file" in one_error_line(capsys, "compress")
    assert scene.read_bytes() == before


@pytest.mark.parametrize("content,match", [
    (b"", "not a .ply"),
    (b"ply\nformat binary_little_endian 1.0\nelement vertex 5\nproperty float x\nend_header\n", "missing vertex properties"),
    (b"hello world", "not a .ply"),
])
def test_compress_bad_ply(tmp_path, capsys, content, match):
    p = tmp_path / "bad.ply"
    p.write_bytes(content)
    assert main(["compress", str(p), "-o", str(tmp_path / "o.pgms"), *FAST]) == 2
    assert match in one_error_line(capsys, "compress")
    assert not (tmp_path / "o.pgms").exists()


def test_compress_nan_and_truncated_ply(tmp_path, capsys):
    s = random_scene(50, 1)
    s.means[3, 1] = float("nan")
    write_ply(s, tmp_path / "nan.ply")
    assert main(["compress", str(tmp_path / "nan.ply"), "-o", str(tmp_path / "o.pgms"), *FAST]) == 2
    assert "NaN/Inf" in one_error_line(capsys, "compress")
    raw = (tmp_path / "nan.ply").read_bytes()
    (tmp_path / "cut.ply").write_bytes(raw[: len(raw) - 100])
    assert main(["compress", str(tmp_path / "cut.ply"), "-o", str(tmp_path / "o.pgms"), *FAST]) == 2
    assert "truncated" in one_error_line(capsys, "compress")
    assert not (tmp_path / "o.pgms").exists()


def test_compress_missing_and_bad_target(tmp_path, capsys):
    assert main(["compress", str(tmp_path / "none.ply"), "-o", str(tmp_path / "o.pgms")]) == 2
    assert "does not exist" in one_error_line(capsys, "compress")
    with pytest.raises(SystemExit) as e:
        main(["compress", str(ASSET), "-o", str(tmp_path / "o.pgms"), "--ratio", "0.5"])
    assert e.value.code == 2
    assert "expected a finite number >= 1" in capsys.readouterr().err
    for flag in ("--prune-search", "--coverage-views"):
        with pytest.raises(SystemExit) as e:
            main(["compress", str(ASSET), "-o", str(tmp_path / "o.pgms"), flag, "-1"])
        assert e.value.code == 2
        assert "expected an integer >= 0" in capsys.readouterr().err
    for bad in ("-3", "some"):
        with pytest.raises(SystemExit) as e:
            main(["compress", str(ASSET), "-o", str(tmp_path / "o.pgms"), "--refine-steps", bad])
        assert e.value.code == 2
        assert "expected 'auto' or an integer >= 0" in capsys.readouterr().err
    assert not (tmp_path / "o.pgms").exists()


def test_compress_fractional_and_bad_preset(tmp_path, capsys):
    """``--preset`` pins a geometry rung between two ladder rungs too; one out of the ladder is one
    error line and writes nothing."""
    out = tmp_path / "o.pgms"
    assert main(["compress", str(ASSET), "-o", str(out), "--ratio", "5", "--preset", "14.5,0", "--refine-steps", "0",
                 *LOUD]) == 0
    assert "preset 14.5,0" in capsys.readouterr().out and out.exists()
    out.unlink()
    assert main(["compress", str(ASSET), "-o", str(out), "--preset", "17.5,0", *FAST]) == 2
    assert "preset rungs must be in" in one_error_line(capsys, "compress")
    with pytest.raises(SystemExit) as e:
        main(["compress", str(ASSET), "-o", str(out), "--preset", "fine,0"])
    assert e.value.code == 2 and "expected two rungs" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d[: len(d) // 2], "truncated"),
    (lambda d: d[:100] + bytes([d[100] ^ 0x10]) + d[101:], "checksum"),
    (lambda d: b"GIF89a" + d[6:], "magic"),
    (lambda d: d[:8] + b"\x07\x00\x00\x00" + d[12:], "version"),
])
def test_decompress_bad_pgms(pgms_file, tmp_path, capsys, mutate, match):
    _, pgms = pgms_file
    bad = tmp_path / "bad.pgms"
    bad.write_bytes(mutate(pgms.read_bytes()))
    out = tmp_path / "out.ply"
    assert main(["decompress", str(bad), "-o", str(out)]) == 2
    assert match in one_error_line(capsys, "decompress")
    assert not out.exists()
    assert main(["info", str(bad)]) == 2
    one_error_line(capsys, "info")


def test_decompress_into_missing_folder(pgms_file, tmp_path, capsys):
    _, pgms = pgms_file
    assert main(["decompress", str(pgms), "-o", str(tmp_path / "no" / "x.ply")]) == 2
    assert "does not exist" in one_error_line(capsys, "decompress")


def test_cli_keeps_freed_memory_on_glibc():
    """The command line asks glibc's malloc to reuse freed memory (fewer page faults); it says
    whether that applied, and elsewhere it is a no-op."""
    import platform

    from visionmoe.splat.memory import keep_freed_memory

    applied = keep_freed_memory()
    assert applied is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


@pytest.mark.parametrize("command", ["compress", "eval"])
@pytest.mark.parametrize("device,match", [
    ("tpu", "device must be 'cpu', 'cuda' or 'cuda:N'"),
    ("cuda:99", "CUDA GPU"),  # no GPU here: "torch sees none"; with one: "sees only N"
])
def test_bad_device_is_one_error_line_and_writes_nothing(pgms_file, tmp_path, capsys, command, device, match):
    scene, _ = pgms_file
    out = tmp_path / "x.pgms"
    args = [command, str(scene), *(["-o", str(out)] if command == "compress" else []), "--device", device, *FAST]
    assert main(args) == 2
    assert match in one_error_line(capsys, command)
    assert not out.exists()


def test_compress_verbose_logs_each_stage_with_its_time(pgms_file, tmp_path, capsys):
    """``--verbose`` shows the encoder's stage lines (result and seconds) on stderr; the file is
    the one a quiet run writes, with the user's umask permissions; the command leaves no log
    handler behind."""
    import logging
    import os
    import stat

    scene, quiet = pgms_file
    out = tmp_path / "v.pgms"
    handlers = list(logging.getLogger("visionmoe").handlers)
    assert main(["compress", str(scene), "-o", str(out), "--ratio", "25", *LOUD, "--verbose"]) == 0
    assert logging.getLogger("visionmoe").handlers == handlers
    err = capsys.readouterr().err
    for stage in ("contributions", "pyramid", "allocate"):
        assert f"stage {stage}: " in err and " s" in err, err
    assert out.read_bytes() == quiet.read_bytes()
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
