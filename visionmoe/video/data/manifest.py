"""Training data sources for PILA (:func:`load_records`):

- a JSONL manifest, one object per line::

      {"video": "clips/0001.mp4", "caption": "a ball falls and bounces",
       "labels": ["rigid", "elastic"], "fps": 16, "start": 0.5, "end": 3.0}

  ``video`` (alias ``path``) is resolved relative to the manifest's folder; ``caption``
  (alias ``prompt``/``text``) is required; ``labels`` (a list or a comma-separated string
  of our categories or WISA / PhyGenBench / VideoPhy-2 names) is optional (missing labels
  come from the caption's lexicon classifier); ``fps`` resamples the clip in time,
  ``start``/``end`` (seconds) trim it.
- a folder of videos with a caption file of the same stem (``clip.mp4`` + ``clip.txt``),
  and optionally ``clip.labels`` (comma-separated labels).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

__all__ = ["ManifestError", "VIDEO_EXTENSIONS", "VideoRecord", "check_num_frames", "label_mask", "load_records",
           "normalize_labels", "read_manifest", "scan_folder", "wan_num_frames"]


VIDEO_EXTENSIONS = (".mp4", ".webm", ".avi", ".mov", ".mkv", ".gif")


class ManifestError(ValueError):
    """A dataset manifest or folder that cannot be used (says where and what to fix)."""


@dataclass
class VideoRecord:
    video: str  # absolute path
    caption: str
    labels: List[str] = field(default_factory=list)  # our category names (empty: classify the caption)
    fps: Optional[float] = None
    start: Optional[float] = None
    end: Optional[float] = None
    extra: Dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.video}|{self.start}|{self.end}|{self.fps}"


def wan_num_frames(n: int) -> int:
    """Largest 4k+1 frame count not above ``n`` (Wan's temporal VAE rule); 0 if ``n < 1``."""
    return 0 if n < 1 else ((n - 1) // 4) * 4 + 1


def check_num_frames(n: int) -> None:
    if n < 1 or (n - 1) % 4 != 0:
        raise ValueError(f"num_frames must be 4k+1 (Wan's temporal VAE rule), e.g. 17, 33, 81; got {n}")


def normalize_labels(labels, where: str = "") -> List[str]:
    """Labels (list or comma string; ours or benchmark names) -> sorted unique category names."""
    from ..pila.taxonomy import map_external

    if labels is None:
        return []
    if isinstance(labels, str):
        labels = [s for s in labels.replace("+", ",").split(",") if s.strip()]
    if not isinstance(labels, (list, tuple)):
        raise ManifestError(f"{where}labels must be a list or a comma-separated string, got {type(labels).__name__}")
    out = set()
    for lab in labels:
        try:
            out.update(map_external(str(lab)))
        except ValueError as e:
            raise ManifestError(f"{where}{e}") from None
    return sorted(out)


def label_mask(labels: Sequence[str], caption: str) -> torch.Tensor:
    """Multi-hot [num_categories] of the labels, or of the caption's lexicon prior when no labels."""
    from ..pila.labels import classify_prompt
    from ..pila.taxonomy import CATEGORY_NAMES

    if labels:
        return torch.tensor([float(n in labels) for n in CATEGORY_NAMES])
    return classify_prompt(caption).mask.float()


def _opt_float(rec, key, where):
    v = rec.get(key)
    if v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise ManifestError(f"{where}'{key}' must be a number, got {v!r}") from None
    if v < 0 or (key == "fps" and v == 0):
        raise ManifestError(f"{where}'{key}' must be positive, got {v}")
    return v


def read_manifest(path: str, *, check_files: bool = True) -> List[VideoRecord]:
    """Read a JSONL manifest (see the module docstring). Raises :class:`ManifestError` naming the
    line for malformed entries and, with ``check_files``, ``FileNotFoundError`` listing missing videos."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"manifest not found: {path}")
    root = os.path.dirname(os.path.abspath(path))
    records, missing = [], []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{i}: "
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ManifestError(f"{where}not valid JSON ({e.msg}); each line must be one JSON object") from None
            if not isinstance(rec, dict):
                raise ManifestError(f"{where}expected a JSON object, got {type(rec).__name__}")
            video = rec.get("video", rec.get("path"))
            if not video or not isinstance(video, str):
                raise ManifestError(f"{where}missing 'video' (path of the clip); fields present: {sorted(rec)}")
            caption = rec.get("caption", rec.get("prompt", rec.get("text")))
            if caption is not None and not isinstance(caption, str):
                raise ManifestError(f"{where}'caption' must be text, got {type(caption).__name__} {caption!r}")
            if not caption or not caption.strip():
                raise ManifestError(f"{where}missing 'caption' (non-empty text); fields present: {sorted(rec)}")
            vpath = video if os.path.isabs(video) else os.path.join(root, video)
            start, end = _opt_float(rec, "start", where), _opt_float(rec, "end", where)
            if start is not None and end is not None and end <= start:
                raise ManifestError(f"{where}'end' ({end}) must be after 'start' ({start})")
            records.append(VideoRecord(
                video=os.path.normpath(vpath), caption=caption.strip(),
                labels=normalize_labels(rec.get("labels"), where), fps=_opt_float(rec, "fps", where),
                start=start, end=end,
                extra={k: v for k, v in rec.items() if k not in ("video", "path", "caption", "prompt", "text", "labels", "fps", "start", "end")},
            ))
            if check_files and not os.path.isfile(vpath):
                missing.append(f"line {i}: {video}")
    if not records:
        raise ManifestError(f"{path}: the manifest lists no videos")
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise FileNotFoundError(f"{len(missing)} video(s) of {path} not found: {'; '.join(missing[:5])}{more}")
    return records


def scan_folder(folder: str) -> List[VideoRecord]:
    """Videos of a folder with same-stem ``.txt`` captions (and optional ``.labels``)."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"dataset folder not found: {folder}")
    names = sorted(f for f in os.listdir(folder) if f.lower().endswith(VIDEO_EXTENSIONS))
    if not names:
        raise ManifestError(f"{folder}: no videos ({', '.join(VIDEO_EXTENSIONS)})")
    records, uncaptioned = [], []
    for name in names:
        stem = os.path.splitext(os.path.join(folder, name))[0]
        if not os.path.isfile(stem + ".txt"):
            uncaptioned.append(name)
            continue
        caption = open(stem + ".txt", encoding="utf-8").read().strip()
        if not caption:
            uncaptioned.append(name)
            continue
        labels = open(stem + ".labels", encoding="utf-8").read().strip() if os.path.isfile(stem + ".labels") else None
        records.append(VideoRecord(os.path.abspath(os.path.join(folder, name)), caption,
                                   normalize_labels(labels, f"{stem}.labels: ")))
    if uncaptioned:
        raise ManifestError(f"{folder}: {len(uncaptioned)} video(s) without a caption file (same name, .txt): "
                            f"{', '.join(uncaptioned[:5])}")
    return records


def load_records(source: str) -> List[VideoRecord]:
    """A manifest (``.jsonl``/``.json`` file) or a folder of captioned videos."""
    if os.path.isdir(source):
        return scan_folder(source)
    return read_manifest(source)
