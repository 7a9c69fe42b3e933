"""The output-file rules every writer of the project follows: never replace a special file
(FIFO, symbolic link, device, folder), probe that a folder accepts a new file before long work,
and write atomically (a temporary file in the same folder, renamed over the target, given mode
0o666 less the user's umask just before the rename, as any new file gets: also when the writer
that filled it replaced it with a file of its own, created 0600 by ``tempfile``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path


class OutputPathError(ValueError):
    """An output path that cannot or must not be written; the message says why."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def check_output_path(path: str | os.PathLike) -> Path:
    """Refuse an output path that exists and is not a regular file: a rename would replace a
    FIFO, a symbolic link or a device node (as root, ``/dev/null`` itself)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (or a file where a folder should be)
        return path
    if not stat.S_ISREG(st.st_mode):
        raise OutputPathError(f"{path} exists and is not a regular file ({_kind(st.st_mode)}); refusing to replace it")
    return path


def probe_folder(folder: str | os.PathLike, name: str = "") -> None:
    """Raise ``OSError`` unless a new file can be created in ``folder``: the only reliable test
    (root ignores permission bits; a read-only mount does not)."""
    fd, probe = tempfile.mkstemp(prefix=f".{name}.", suffix=".probe", dir=folder)
    os.close(fd)
    os.unlink(probe)


def check_writable(path: str | os.PathLike) -> Path:
    """Check, before any long work, that ``path`` can be written: not a special file
    (:func:`check_output_path`), in a folder that exists and accepts a new file."""
    path = check_output_path(path)
    parent = path.parent
    if not parent.is_dir():
        raise OutputPathError(f"cannot write {path}: folder {parent} does not exist")
    try:
        probe_folder(parent, path.name)
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows (Linux 4.7+:
    ``/proc/self/status``); elsewhere set and restored at once under a lock (``os.umask`` is the
    only portable way to read it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _publish(tmp: Path, path: Path) -> None:
    """Give the finished temporary file a new file's permissions, then rename it over ``path``."""
    os.chmod(tmp, 0o666 & ~current_umask())
    os.replace(tmp, path)


def _new_temporary(path: Path, suffix: str) -> tuple[int, Path]:
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}{suffix}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """For writers that take a file name (ffmpeg, safetensors): yields a new temporary path in
    ``path``'s folder (ending in ``suffix``, which some writers read the format from) and renames
    it over ``path`` when the block ends without error; on any error or signal the temporary
    file is removed and ``path`` is left as it was. The folder is created if missing."""
    path = check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temporary(path, suffix)
    os.close(fd)
    try:
        yield tmp
        _publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, write: Callable) -> Path:
    """Write a file through ``write(binary file object)`` so that ``path`` is never half-written:
    into a new temporary file in the same folder, flushed to disk, then renamed over ``path``.
    The folder is created if missing; on any error the temporary file is removed and ``path``
    is left as it was."""
    path = check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temporary(path, ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))
