"""What the ``visionmoe-video`` commands share: the checks of their arguments (Wan sizes, model
folders, devices, output paths), quiet libraries, and the atomic mp4 writer. Every check raises
:class:`~visionmoe.common.cli.CLIError` with one line that names the flag."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...common.cli import CLIError
from ...common.files import OutputPathError, atomic_path, check_output_path, probe_folder

#: Wan 2.1 / 2.2 defaults for a model other than the toy world
WAN_DEFAULTS = dict(num_frames=81, height=480, width=832, num_inference_steps=50, guidance_scale=5.0)
SPATIAL_DEFAULT, TEMPORAL_DEFAULT = 16, 4  # Wan: VAE 8x spatial x patch 2, VAE 4x temporal


def check_sizes(frames: int, height: int, width: int, steps: int, spatial: int, temporal: int) -> None:
    """Wan sizes: height/width multiples of ``spatial`` (VAE x patch), frames ``temporal``k+1, steps >= 1."""
    for name, v in (("height", height), ("width", width)):
        if v <= 0 or v % spatial:
            ok = max(spatial, round(v / spatial) * spatial)
            raise CLIError(f"--{name} {v} is impossible: it must be a positive multiple of {spatial} (e.g. {ok})")
    if frames < 1 or (frames - 1) % temporal:
        ok = temporal * max(0, round((frames - 1) / temporal)) + 1
        raise CLIError(f"--frames {frames} is impossible: it must be {temporal}k+1 (e.g. {ok})")
    if steps < 1:
        raise CLIError(f"--steps must be >= 1, got {steps}")


def _read_json(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CLIError(f"{path}: not a readable JSON config ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise CLIError(f"{path}: expected a JSON object")
    return d


def model_factors(model_dir: Path) -> tuple[int, int]:
    """(spatial multiple, temporal factor) of a local Wan diffusers folder, read from its configs."""
    vae = _read_json(model_dir / "vae" / "config.json") if (model_dir / "vae" / "config.json").is_file() else {}
    tr = (_read_json(model_dir / "transformer" / "config.json")
          if (model_dir / "transformer" / "config.json").is_file() else {})
    try:
        spatial = int(vae.get("scale_factor_spatial", 8)) * int((tr.get("patch_size") or [1, 2, 2])[1])
        temporal = int(vae.get("scale_factor_temporal", 4))
    except (TypeError, ValueError, IndexError):
        raise CLIError(f"--model {str(model_dir)!r}: unreadable vae/transformer configs") from None
    if spatial < 1 or temporal < 1:
        raise CLIError(f"--model {str(model_dir)!r}: bad scale factors in its configs")
    return spatial, temporal


def looks_local(name: str) -> bool:
    """A local path rather than a hub id (``owner/name``)."""
    return os.path.isabs(name) or name.startswith(".") or os.path.exists(name) or name.count("/") != 1


def check_out(out: str, overwrite: bool) -> Path:
    """The output .mp4: a regular file or nothing at a path in an existing, writable directory."""
    path = Path(out)
    if path.is_dir():
        raise CLIError(f"-o/--out {out!r} is a directory; name a file in it, e.g. {str(path / 'video.mp4')!r}")
    if path.suffix.lower() != ".mp4":
        raise CLIError(f"-o/--out must name an .mp4 file, got {out!r}")
    if os.path.lexists(path):
        try:
            check_output_path(path)
        except OutputPathError as e:
            raise CLIError(f"-o/--out: {e}") from None
        if not overwrite:
            raise CLIError(f"-o/--out {out!r} exists; pass -w/--overwrite to replace it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CLIError(f"-o/--out {out!r}: directory {str(parent)!r} does not exist")
    try:
        probe_folder(parent, path.stem)
    except OSError as e:
        raise CLIError(f"-o/--out {out!r}: cannot write in {str(parent)!r} ({e.strerror})") from None
    return path


def check_out_dir(out: str) -> Path:
    """An output folder: an existing writable folder, or a new one in an existing folder."""
    path = Path(out)
    if os.path.lexists(path) and not path.is_dir():
        raise CLIError(f"-o/--out {out!r} exists and is not a directory")
    probe_in = path if path.is_dir() else (path.parent if str(path.parent) else Path("."))
    if not probe_in.is_dir():
        raise CLIError(f"-o/--out {out!r}: directory {str(probe_in)!r} does not exist")
    try:
        probe_folder(probe_in, "visionmoe")
    except OSError as e:
        raise CLIError(f"-o/--out {out!r}: cannot write in {str(probe_in)!r} ({e.strerror})") from None
    return path


def check_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise CLIError(f"--device {device!r} is not a device name (auto, cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise CLIError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA GPU(s); use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise CLIError(f"--device {device!r}: only cpu and cuda devices are supported")
    return device


def quiet_libraries() -> None:
    """No loading bars and no spurious warnings from diffusers / transformers."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    from diffusers.utils import logging as dlog

    dlog.disable_progress_bar()
    dlog.set_verbosity_error()  # e.g. "modules ... should be kept in float32" when the dtype is set at load
    try:
        from transformers.utils import logging as tlog

        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is part of the video extra
        pass


def write_mp4(frames, path: Path, fps: float) -> None:
    """Write uint8 frames [F, H, W, 3] to ``path`` atomically (:func:`visionmoe.common.files.atomic_path`):
    the file gets the user's umask permissions; the temporary file is removed on any failure,
    Ctrl-C or SIGTERM."""
    import imageio.v2 as imageio

    with atomic_path(path, suffix=".mp4") as tmp:
        imageio.mimwrite(str(tmp), list(frames), fps=fps, codec="libx264", quality=8, macro_block_size=1)
