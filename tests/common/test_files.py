"""visionmoe.common.files: the one set of output-file rules every writer follows."""

import os
import stat

import pytest

from visionmoe.common.files import (
    OutputPathError, atomic_path, atomic_write, atomic_write_bytes, atomic_write_text, check_output_path,
    check_writable,
)


def test_new_files_get_umask_permissions_and_no_temporary_file_stays(tmp_path):
    old = os.umask(0o022)
    try:
        a = atomic_write_bytes(tmp_path / "a.bin", b"x")
        with atomic_path(tmp_path / "b.mp4", suffix=".mp4") as tmp:
            assert tmp.suffix == ".mp4" and tmp.parent == tmp_path and tmp.exists()
            tmp.write_bytes(b"frames")
        os.umask(0o077)
        c = atomic_write_text(tmp_path / "c.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(a.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.mp4").stat().st_mode) == 0o644
    assert stat.S_IMODE(c.stat().st_mode) == 0o600
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.bin", "b.mp4", "c.json"]
    assert (tmp_path / "b.mp4").read_bytes() == b"frames" and c.read_text() == "{}"


def test_an_error_keeps_the_old_file_and_removes_the_temporary_one(tmp_path):
    target = atomic_write_bytes(tmp_path / "a.bin", b"old")

    def fail(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, fail)
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"old" and [x.name for x in tmp_path.iterdir()] == ["a.bin"]


def test_missing_folders_are_created(tmp_path):
    assert atomic_write_bytes(tmp_path / "x" / "y.bin", b"1").read_bytes() == b"1"


@pytest.mark.parametrize("kind", ["folder", "symlink", "fifo"])
def test_special_files_are_never_replaced(tmp_path, kind):
    target = tmp_path / "t"
    if kind == "folder":
        target.mkdir()
    elif kind == "symlink":
        (tmp_path / "real").write_bytes(b"keep")
        target.symlink_to(tmp_path / "real")
    else:
        os.mkfifo(target)
    with pytest.raises(OutputPathError, match="not a regular file"):
        atomic_write_bytes(target, b"x")
    with pytest.raises(OutputPathError, match="not a regular file"):
        check_writable(target)
    with pytest.raises(OutputPathError, match="not a regular file"):
        with atomic_path(target):
            pass
    assert os.path.lexists(target)
    if kind == "symlink":
        assert (tmp_path / "real").read_bytes() == b"keep"


def test_check_writable_probes_the_folder(tmp_path):
    assert check_output_path(tmp_path / "new.bin") == tmp_path / "new.bin"
    assert check_writable(tmp_path / "new.bin") == tmp_path / "new.bin"
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing
    with pytest.raises(OutputPathError, match="does not exist"):
        check_writable(tmp_path / "missing" / "a.bin")
    if os.geteuid() != 0:  # root writes in a read-only folder: only a mount would refuse
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(OutputPathError, match="cannot write"):
            check_writable(ro / "a.bin")


def test_a_file_where_a_folder_should_be_is_a_clear_error(tmp_path):
    (tmp_path / "f").write_bytes(b"")
    assert check_output_path(tmp_path / "f" / "v.mp4") == tmp_path / "f" / "v.mp4"
    with pytest.raises(OutputPathError, match="does not exist"):
        check_writable(tmp_path / "f" / "v.mp4")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_a_writer_that_replaces_the_temporary_file_still_gets_the_umask(tmp_path, umask, mode):
    """Writers that write to a file of their own and rename it over the path they were given
    (tempfile's mkstemp: mode 0600) still publish a file with the umask's permissions."""
    import tempfile

    from visionmoe.common.files import current_umask

    old = os.umask(umask)
    try:
        assert current_umask() == umask
        with atomic_path(tmp_path / "shot.png", suffix=".png") as tmp:
            fd, own = tempfile.mkstemp(dir=tmp_path)
            os.write(fd, b"png")
            os.close(fd)
            os.replace(own, tmp)
            assert stat.S_IMODE(tmp.stat().st_mode) == 0o600
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shot.png").stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["shot.png"]
