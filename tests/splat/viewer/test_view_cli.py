"""``visionmoe-splat view --screenshot`` follows the output rules of every other command: the
output is checked before anything starts (a regular file or nothing, never the input, not
replaced without -w), written through the common atomic writer (so the umask applies), and a
missing Node or Chromium is one line saying what to install."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

import hostile as h
from visionmoe.splat.cli import main
from visionmoe.splat.viewer import server as viewer_server

REPO = Path(__file__).resolve().parents[3]
ERROR_LINE = re.compile(r"^visionmoe-splat view: error: \S")
WEB = REPO / "web"
HAS_BROWSER = (shutil.which("node") is not None and (WEB / "node_modules" / "puppeteer-core").is_dir()
               and (WEB / "node_modules" / "@sparkjsdev" / "spark").is_dir())


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture()
def view_cli(capsys):
    """Run ``visionmoe-splat view ARGS`` in this process -> (exit status, stdout, stderr)."""
    def run(*args):
        status = main(["view", *map(str, args)])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def one_error_line(result, match: str) -> str:
    status, _out, err = result
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and ERROR_LINE.match(lines[0]), (status, err[-2000:])
    assert re.search(match, lines[0], re.I), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def pgms(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("view") / "scene.pgms"
    path.write_bytes(h.valid_two_level(n0=40, child=2))  # a small valid file, written from FORMAT.md
    return path


def test_help_says_what_screenshots_need(capsys):
    with pytest.raises(SystemExit) as done:
        main(["view", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0
    assert "--screenshot" in text and "Node.js" in text and "Chromium" in text and "apt-get install chromium" in text
    assert "-w, --overwrite" in text


def test_special_files_are_refused_and_kept(view_cli, pgms, tmp_path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    target = tmp_path / "target.png"
    target.write_bytes(b"keep me")
    link = tmp_path / "link.png"
    link.symlink_to(target)
    for out, kind in (("/dev/null", "device"), (fifo, "FIFO"), (link, "symbolic link")):
        one_error_line(view_cli(pgms, "--screenshot", out, "-w"), rf"not a regular file \({'an?'} {kind}")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink() and target.read_bytes() == b"keep me"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.png", "pipe.png", "target.png"]  # no temporary left


def test_the_input_and_an_existing_file_are_not_replaced(view_cli, pgms, tmp_path):
    before = pgms.read_bytes()
    for flags in ([], ["-w"]):
        one_error_line(view_cli(pgms, "--screenshot", pgms, *flags), "is the input file")
    assert pgms.read_bytes() == before
    existing = tmp_path / "old.png"
    existing.write_bytes(b"an older picture")
    one_error_line(view_cli(pgms, "--screenshot", existing), r"exists; use -w/--overwrite")
    assert existing.read_bytes() == b"an older picture"
    one_error_line(view_cli(pgms, "--screenshot", tmp_path / "no" / "such" / "x.png"), "folder .* does not exist")


def test_no_chromium_is_one_line_naming_the_package(monkeypatch):
    monkeypatch.delenv("CHROMIUM", raising=False)
    monkeypatch.setattr(viewer_server, "CHROMIUM_PATHS", ())
    monkeypatch.setattr(viewer_server, "CHROMIUM_NAMES", ())
    with pytest.raises(viewer_server.ViewerError) as err:
        viewer_server.find_chromium()
    assert "\n" not in str(err.value) and "apt-get install chromium" in str(err.value)
    monkeypatch.setenv("CHROMIUM", "/no/such/chromium")
    with pytest.raises(viewer_server.ViewerError, match="apt-get install chromium"):
        viewer_server.find_chromium()


@pytest.mark.skipif(not HAS_BROWSER, reason="needs node and the npm packages of web/ (make web-deps)")
def test_no_chromium_from_the_command_line(view_cli, pgms, tmp_path, monkeypatch):
    monkeypatch.delenv("CHROMIUM", raising=False)
    monkeypatch.setattr(viewer_server, "CHROMIUM_PATHS", ())
    monkeypatch.setattr(viewer_server, "CHROMIUM_NAMES", ())
    one_error_line(view_cli(pgms, "--screenshot", tmp_path / "shot.png"), "apt-get install chromium")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(not HAS_BROWSER or not (os.environ.get("CHROMIUM") or any(
    Path(p).exists() for p in viewer_server.CHROMIUM_PATHS)), reason="needs node, web/node_modules and Chromium")
def test_screenshot_replaces_with_w_a_new_file_under_the_umask(view_cli, pgms, tmp_path):
    out = tmp_path / "shot.png"
    out.write_bytes(b"an older picture")
    out.chmod(0o600)
    old_inode = out.stat().st_ino
    with umask(0o027):
        status, stdout, err = view_cli(pgms, "--screenshot", out, "-w", "--width", "64", "--height", "48")
    assert status == 0, err[-2000:]
    assert stdout.startswith(f"wrote {out} (64x48, level 1 of 0-1")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a new file renamed over the old one (no temporary left), its mode from the umask
    assert out.stat().st_ino != old_inode and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shot.png"]


def test_a_failed_screenshot_leaves_the_output_as_it_was(view_cli, pgms, tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "viewer").mkdir(parents=True)
    (site / "viewer" / "index.html").write_text("<!doctype html>\n")
    seen = {}

    def half_written(cmd, shot, chromium, timeout, cwd):
        seen["shot"] = shot
        shot.write_bytes(b"\x89PNG half")
        raise viewer_server.ViewerError("screenshot failed: viewer: WebGL context lost")

    monkeypatch.setattr(viewer_server, "site_root", lambda: site)
    monkeypatch.setattr(viewer_server, "check_npm_root", lambda root: site)
    monkeypatch.setattr(viewer_server, "_node", lambda: "node")
    monkeypatch.setattr(viewer_server, "find_chromium", lambda: "chromium")
    monkeypatch.setattr(viewer_server, "_run_tool", half_written)
    out = tmp_path / "out" / "shot.png"
    out.parent.mkdir()
    out.write_bytes(b"the previous picture")
    one_error_line(view_cli(pgms, "--screenshot", out, "-w"), "WebGL context lost")
    # the tool wrote a temporary file beside the output, which is gone; the output is untouched
    assert seen["shot"].parent == out.parent and seen["shot"] != out
    assert out.read_bytes() == b"the previous picture" and sorted(p.name for p in out.parent.iterdir()) == ["shot.png"]
