"""Decoding training videos (:func:`decode_video`): imageio (ffmpeg), optional trim and fps
resampling, the first ``num_frames`` frames (Wan's 4k+1 rule), shorter-side resize and centre
crop; :func:`frames_to_tensor` makes the Wan VAE's input of them."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .manifest import check_num_frames

__all__ = ["VideoDecodeError", "decode_video", "frames_to_tensor"]


class VideoDecodeError(RuntimeError):
    """A video that cannot be decoded, or is too short for the requested frames."""


def _resize_crop(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    import cv2

    h, w = frame.shape[:2]
    s = max(height / h, width / w)
    nh, nw = max(height, round(h * s)), max(width, round(w * s))
    interp = cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC
    frame = cv2.resize(frame, (nw, nh), interpolation=interp)
    y0, x0 = (nh - height) // 2, (nw - width) // 2
    return frame[y0:y0 + height, x0:x0 + width]


def decode_video(path: str, num_frames: int, height: int, width: int, *, fps: Optional[float] = None,
                 start: Optional[float] = None, end: Optional[float] = None) -> np.ndarray:
    """Decode ``num_frames`` frames (uint8 ``[F, H, W, 3]``) of a video, trimmed, resampled to
    ``fps`` (if given), resized on the shorter side and centre-cropped to ``height x width``.
    Raises :class:`VideoDecodeError` for unreadable or too short videos."""
    import imageio.v2 as imageio

    check_num_frames(num_frames)
    try:
        reader = imageio.get_reader(path, format="FFMPEG")
        try:
            src_fps = float(reader.get_meta_data().get("fps") or 0) or None
            frames = [np.asarray(f) for f in reader]
        finally:
            reader.close()
    except Exception as e:
        first = next((l.strip() for l in str(e).splitlines() if l.strip()), "")  # not ffmpeg's whole log
        raise VideoDecodeError(f"cannot decode {path}: {type(e).__name__}: {first}") from None
    if not frames:
        raise VideoDecodeError(f"cannot decode {path}: no frames")
    if (start is not None or end is not None or fps is not None) and src_fps is None:
        raise VideoDecodeError(f"{path}: no frame rate in the file, cannot apply start/end/fps")
    times = np.arange(len(frames)) / (src_fps or 1.0)
    idx = np.arange(len(frames))
    if start is not None or end is not None:
        lo, hi = start or 0.0, end if end is not None else np.inf
        idx = idx[(times >= lo - 1e-6) & (times < hi - 1e-6)]
    if fps is not None and src_fps is not None and len(idx):
        t0 = times[idx[0]]
        want = t0 + np.arange(int(np.floor((times[idx[-1]] - t0) * fps + 1e-6)) + 1) / fps
        idx = np.clip(np.searchsorted(times, want - 0.5 / src_fps), idx[0], idx[-1])
    if len(idx) < num_frames:
        raise VideoDecodeError(f"{path}: {len(idx)} frames after trim/resampling, need {num_frames}")
    out = []
    for i in idx[:num_frames]:
        f = frames[i]
        if f.ndim == 2:
            f = np.repeat(f[..., None], 3, -1)
        out.append(_resize_crop(f[..., :3], height, width))
    return np.stack(out)


def frames_to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 [F, H, W, 3] -> float [3, F, H, W] in [-1, 1] (the Wan VAE input)."""
    return torch.from_numpy(frames).permute(3, 0, 1, 2).float().div(127.5).sub(1.0)
