"""``visionmoe-splat`` conventions (issue 29) and output safety (issue 31).

Every command: ``-q/--quiet`` and ``-v/--verbose``; commands that write files: ``-o/--out`` and
``-w/--overwrite`` (an existing output is refused otherwise: one error line, exit 2);
``--version``; several inputs per call for compress/decompress/info (``-o`` then names a
folder); outputs with the user's umask permissions; never a special file replaced (FIFO,
symlink, device), no temporary file left by SIGTERM, no traceback on Ctrl-C at any moment, an
unwritable output location reported before the encode starts.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from pgms_helpers import random_scene

import hostile as h
from visionmoe.splat import compress, write_ply

REPO = Path(__file__).resolve().parents[3]
FAST = ["--views", "4", "--view-size", "48", "--refine-steps", "0", "--prune-search", "0", "--quiet"]
ERROR_LINE = re.compile(r"^visionmoe-splat \w+: error: \S")


def splat_cli(*args, timeout=180, umask: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    pre = (lambda: os.umask(umask)) if umask is not None else None
    try:
        return subprocess.run([sys.executable, "-m", "visionmoe.splat", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=REPO, preexec_fn=pre)
    except subprocess.TimeoutExpired:
        pytest.fail(f"visionmoe-splat {' '.join(map(str, args))} did not end within {timeout} s")


def one_error_line(r: subprocess.CompletedProcess, match: str = "") -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and ERROR_LINE.match(lines[0]), (r.returncode, r.stderr[-2000:])
    assert re.search(match, lines[0], re.I), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    scenes = {}
    for name, seed in (("a", 1), ("b", 2)):
        s = random_scene(60, 1, seed=seed)
        write_ply(s, d / f"{name}.ply")
        contrib = torch.rand(60, generator=torch.Generator().manual_seed(seed)) * 5
        (d / f"{name}.pgms").write_bytes(compress(s, ratio=4, contributions=contrib, preset=(3, 3)).data)
        scenes[name] = s
    big = d / "big.pgms"  # 1M leaves: a 62 MB .ply, long enough a write to interrupt
    big.write_bytes(h.valid_two_level(n0=20_000, child=50))
    return d


# --------------------------------------------------------------------------- conventions

COMMANDS = ["compress", "decompress", "render", "info"]


def test_version():
    r = splat_cli("--version")
    assert r.returncode == 0 and re.match(r"visionmoe-splat \d+\.\d+", r.stdout.strip()), (r.stdout, r.stderr)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_quiet_and_verbose(command):
    r = splat_cli(command, "--help")
    assert r.returncode == 0
    for flag in ("-q, --quiet", "-v, --verbose"):
        assert flag in r.stdout, f"{command} --help lacks {flag}"


@pytest.mark.parametrize("command", ["compress", "decompress", "render"])
def test_writing_commands_have_out_and_overwrite(command):
    r = splat_cli(command, "--help")
    for flag in ("-o OUT, --out OUT", "-w, --overwrite"):
        assert flag in r.stdout, f"{command} --help lacks {flag}"


def test_existing_output_is_refused_without_overwrite(work, tmp_path):
    out = tmp_path / "a.ply"
    out.write_bytes(b"keep me")
    one_error_line(splat_cli("decompress", work / "a.pgms", "-o", out), "exists.*--overwrite")
    assert out.read_bytes() == b"keep me"
    r = splat_cli("decompress", work / "a.pgms", "-o", out, "-w")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes().startswith(b"ply")


def test_several_inputs_per_call(work, tmp_path):
    out = tmp_path / "decoded"
    r = splat_cli("decompress", work / "a.pgms", work / "b.pgms", "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a.ply", "b.ply"]
    r = splat_cli("compress", work / "a.ply", work / "b.ply", "-o", tmp_path / "enc", "--ratio", "4", *FAST)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "enc").iterdir()) == ["a.pgms", "b.pgms"]
    r = splat_cli("info", work / "a.pgms", work / "b.pgms")
    assert r.returncode == 0 and "a.pgms" in r.stdout and "b.pgms" in r.stdout, r.stderr


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])  # issue 27: one atomic writer, umask modes
def test_outputs_follow_the_umask(work, tmp_path, umask, mode):
    out = tmp_path / "a.ply"
    r = splat_cli("decompress", work / "a.pgms", "-o", out, umask=umask)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == mode


def test_nan_error_names_the_flag(tmp_path):
    s = random_scene(30, 0, seed=4)
    s.means[3, 1] = float("nan")
    write_ply(s, tmp_path / "nan.ply")
    one_error_line(splat_cli("compress", tmp_path / "nan.ply", "-o", tmp_path / "nan.pgms", *FAST), "--drop-nonfinite")
    assert not (tmp_path / "nan.pgms").exists()


def test_up_option(work, tmp_path):
    """--up takes an axis name or three numbers; anything else is one error line, nothing written."""
    src = next(iter(sorted(work.glob("*.ply"))))
    for up in ("+z", "0,0.2,1"):
        r = splat_cli("compress", src, "-o", tmp_path / "u.pgms", "-w", "--up", up, "--ratio", "4", *FAST)
        assert r.returncode == 0, r.stderr
    for bad in ("sideways", "0,0,0", "1,2"):  # argparse's usage, then its one error line
        r = splat_cli("compress", src, "-o", tmp_path / "bad.pgms", f"--up={bad}", *FAST)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "error: argument --up" in r.stderr.strip().splitlines()[-1], r.stderr
    assert not (tmp_path / "bad.pgms").exists()


# --------------------------------------------------------------------------- output safety

def test_fifo_is_not_replaced(work, tmp_path):
    out = tmp_path / "fifo.ply"
    os.mkfifo(out)
    one_error_line(splat_cli("decompress", work / "a.pgms", "-o", out, "-w", timeout=60), "not a regular file")
    assert stat.S_ISFIFO(out.lstat().st_mode)


def test_symlink_is_not_replaced(work, tmp_path):
    target = tmp_path / "target.ply"
    target.write_bytes(b"target")
    link = tmp_path / "link.ply"
    link.symlink_to(target)
    one_error_line(splat_cli("decompress", work / "a.pgms", "-o", link, "-w"), "not a regular file|symbolic link")
    assert link.is_symlink() and target.read_bytes() == b"target"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_device_is_not_replaced(work, tmp_path):
    """A copy of /dev/null (char 1:3) made here: as root the old writer replaced any device."""
    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    one_error_line(splat_cli("decompress", work / "a.pgms", "-o", dev, "-w"), "not a regular file")
    assert stat.S_ISCHR(dev.lstat().st_mode)


def test_sigterm_during_ply_write_leaves_no_temp_file(work, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "visionmoe.splat", "decompress", str(work / "big.pgms"), "-o",
                             str(out_dir / "big.ply")], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline, seen = time.monotonic() + 120, False
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.name.endswith(".tmp") for p in out_dir.iterdir()):
            seen = True
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.002)
    _out, err = proc.communicate(timeout=60)
    assert seen, "the write ended before a temporary file was seen; make big.pgms bigger"
    assert list(out_dir.iterdir()) == [], list(out_dir.iterdir())
    assert "Traceback" not in err and proc.returncode != 0, err


@pytest.mark.parametrize("delay", [0.3, 0.8, 1.5])
def test_ctrl_c_during_startup_is_clean(work, delay):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "visionmoe.splat", "info", str(work / "a.pgms")], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    # -SIGINT: the signal came before Python could install any handler (interpreter start-up,
    # slow on a loaded machine); the process then dies silently, which is as clean
    assert proc.returncode in (0, 130, -signal.SIGINT) and "Traceback" not in err, (proc.returncode, err[-2000:])


def test_unwritable_output_is_reported_before_the_encode(tmp_path):
    """50k Gaussians encode for minutes; the error must come at once (before any encode)."""
    write_ply(random_scene(50_000, 1, seed=9), tmp_path / "big.ply")
    where = Path("/proc") if os.geteuid() == 0 else tmp_path / "ro"
    if where != Path("/proc"):
        where.mkdir()
        where.chmod(0o555)
    t = time.monotonic()
    one_error_line(splat_cli("compress", tmp_path / "big.ply", "-o", where / "big.pgms", timeout=60), "writ|permission")
    assert time.monotonic() - t < 60


# --------------------------------------------------------------------------- formats in and out


@pytest.mark.parametrize("name", ["a.splat", "a.compressed.ply", "a.spz", "a.sog"])
def test_decompress_writes_the_format_its_name_asks_for(work, tmp_path, name):
    from visionmoe.splat.formats import read_any

    r = splat_cli("decompress", work / "a.pgms", "-o", tmp_path / name, "-q")
    assert r.returncode == 0, r.stderr
    ref = read_any(work / "a.pgms")
    assert read_any(tmp_path / name).num_gaussians == ref.num_gaussians


def test_decompress_refuses_a_read_only_format(work, tmp_path):
    one_error_line(splat_cli("decompress", work / "a.pgms", "-o", tmp_path / "a.ksplat"), "decompress writes")
    assert not (tmp_path / "a.ksplat").exists()


def test_compress_and_render_read_other_formats(tmp_path):
    src = Path(__file__).resolve().parents[1] / "data" / "formats" / "fruit40.splat"
    r = splat_cli("compress", src, "-o", tmp_path / "f.pgms", "--ratio", "3", *FAST)
    assert r.returncode == 0, r.stderr
    r = splat_cli("render", tmp_path / "f.pgms", "-o", tmp_path / "views", "--views", "1", "--width", "24",
                  "--height", "16", "-q")
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "views").iterdir()] == ["view_000.png"]
    one_error_line(splat_cli("render", tmp_path / "f.pgms", "-o", tmp_path / "views", "--views", "1", "--width", "24",
                             "--height", "16"), "overwrite")
