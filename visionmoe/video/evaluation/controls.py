"""Negative controls: clips edited so that their physics is worse (shuffled, reversed, dropped
or skipped frames, a frozen object) or their object harder to see (faded, shrunk, hidden); none
of them may improve a headline of :mod:`visionmoe.video.evaluation`."""

from __future__ import annotations

import numpy as np

from ..physics.tracking import background, check_frames, opencv

__all__ = ["drop_frames", "fade_object", "freeze_motion", "hide_object", "reverse_frames", "shrink_object",
           "shuffle_frames", "skip_frames"]


def shuffle_frames(frames: np.ndarray, seed: int = 0) -> np.ndarray:
    """Frames in a random order (never the identity permutation)."""
    rng = np.random.default_rng(seed)
    perm = np.arange(len(frames))
    while np.all(perm == np.arange(len(frames))):
        perm = rng.permutation(len(frames))
    return frames[perm]


def reverse_frames(frames: np.ndarray) -> np.ndarray:
    return frames[::-1].copy()


def drop_frames(frames: np.ndarray, num: int = 2, seed: int = 0) -> np.ndarray:
    """Remove ``num`` random interior frames (a time jump the motion cannot explain)."""
    rng = np.random.default_rng(seed)
    idx = rng.choice(np.arange(2, len(frames) - 2), size=num, replace=False)
    keep = np.setdiff1d(np.arange(len(frames)), idx)
    return frames[keep]


def skip_frames(frames: np.ndarray, num: int = 2, seed: int = 0) -> np.ndarray:
    """:func:`drop_frames` with the length kept: the motion jumps over ``num`` random interior
    frames and the last frame is held ``num`` more times (what a generator that loses time
    would output when asked for a fixed number of frames)."""
    kept = drop_frames(frames, num, seed)
    return np.concatenate([kept, np.repeat(kept[-1:], len(frames) - len(kept), axis=0)])


def _object_masks(frames: np.ndarray, rel_threshold: float = 0.5, min_threshold: float = 8.0) -> np.ndarray:
    """[F, H, W] bool: pixels whose deviation from the temporal median exceeds
    ``max(min_threshold, rel_threshold * peak deviation of the frame)``."""
    dev = np.abs(frames.astype(np.float32) - background(frames)).max(-1)
    peak = dev.reshape(len(frames), -1).max(1)
    thr = np.maximum(min_threshold, rel_threshold * peak)
    return dev > thr[:, None, None]


def fade_object(frames, factor: float = 0.7) -> np.ndarray:
    """Lower the contrast of everything that differs from the background (temporal median) to
    ``factor`` of it: the motion is untouched."""
    frames = check_frames(frames)
    bg = background(frames)
    return np.clip(np.rint(bg + factor * (frames.astype(np.float32) - bg)), 0, 255).astype(np.uint8)


def shrink_object(frames, pixels: int = 1) -> np.ndarray:
    """Erode the moving object by ``pixels`` (its rim becomes background): a smaller object on
    the same path."""
    cv2 = opencv()
    frames = check_frames(frames)
    bg = background(frames)
    masks = _object_masks(frames, rel_threshold=0.15)
    kernel = np.ones((2 * pixels + 1, 2 * pixels + 1), np.uint8)
    out = frames.copy()
    for t, m in enumerate(masks):
        rim = m & ~cv2.erode(m.astype(np.uint8), kernel).astype(bool)
        out[t][rim] = np.rint(bg[rim]).astype(np.uint8)
    return out


def hide_object(frames, hidden=(5, 6, 7, 8, 9)) -> np.ndarray:
    """The object vanishes (becomes background) in the frames ``hidden``."""
    frames = check_frames(frames)
    bg = background(frames)
    masks = _object_masks(frames, rel_threshold=0.1, min_threshold=4.0)
    out = frames.copy()
    for t in hidden:
        m = masks[t]
        out[t][m] = np.rint(bg[m]).astype(np.uint8)
    return out


def freeze_motion(frames, start: int = 8) -> np.ndarray:
    """Every frame from ``start`` on repeats frame ``start``: the object stops mid-motion."""
    frames = check_frames(frames).copy()
    frames[start:] = frames[start]
    return frames
