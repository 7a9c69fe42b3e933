"""Benchmark exports (PhyGenBench, VideoPhy-2): the layouts their evaluators read, and prompt
files in any of the formats they ship (:func:`read_prompts`)."""

from __future__ import annotations

import csv
import json
import os
import shutil
from typing import Dict, List, Optional

__all__ = ["export_phygenbench", "export_videophy2", "read_prompts"]


def read_prompts(path: str, field_name: Optional[str] = None) -> List[Dict]:
    """Read a prompt file: JSON list (of strings or objects), JSONL, CSV or plain text.

    Returns a list of dicts with at least ``caption``. For objects the caption is taken from
    ``field_name`` or the first of ``caption``, ``prompt``, ``text``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt file not found: {path}")
    ext = os.path.splitext(path)[1].lower()
    with open(path, newline="", encoding="utf-8") as fh:
        if ext == ".json":
            data = json.load(fh)
            if isinstance(data, dict):
                data = next((v for v in data.values() if isinstance(v, list)), None)
                if data is None:
                    raise ValueError(f"{path}: expected a JSON list of prompts (or an object holding one)")
        elif ext == ".jsonl":
            data = [json.loads(l) for l in fh if l.strip()]
        elif ext == ".csv":
            data = list(csv.DictReader(fh))
        else:
            data = [l.strip() for l in fh if l.strip()]
    out = []
    for i, d in enumerate(data):
        if isinstance(d, str):
            out.append({"caption": d})
            continue
        keys = [field_name] if field_name else ["caption", "prompt", "text"]
        cap = next((d[k] for k in keys if k in d and d[k]), None)
        if cap is None:
            raise ValueError(f"{path}: prompt {i} has none of the fields {keys}; fields are {sorted(d)}")
        out.append({**d, "caption": cap})
    return out


def _place(src: str, dst: str, copy: bool):
    if os.path.lexists(dst):
        os.remove(dst)
    if copy:
        shutil.copyfile(src, dst)
    else:
        os.symlink(os.path.abspath(src), dst)


def export_phygenbench(prompts_path: str, videos: Dict[int, str], out_dir: str, *, copy: bool = True) -> str:
    """PhyGenBench layout: ``out_dir/output_video_{i}.mp4`` for prompt ``i`` (1-based, the
    order of its ``prompts.json``), plus ``out_dir/prompts.json`` next to them.

    ``videos`` maps the 0-based prompt index to a video file. Returns ``out_dir``.
    """
    prompts = read_prompts(prompts_path)
    os.makedirs(out_dir, exist_ok=True)
    for i, path in sorted(videos.items()):
        if not 0 <= i < len(prompts):
            raise ValueError(f"prompt index {i} outside the {len(prompts)} prompts of {prompts_path}")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"video for prompt {i} not found: {path}")
        _place(path, os.path.join(out_dir, f"output_video_{i + 1}.mp4"), copy)
    shutil.copyfile(prompts_path, os.path.join(out_dir, "prompts.json")) if prompts_path.endswith(".json") else None
    return out_dir


def export_videophy2(prompts_path: str, videos: Dict[int, str], out_dir: str, *, copy: bool = True,
                     caption_field: Optional[str] = None) -> str:
    """VideoPhy-2 AutoEval layout: ``out_dir/videos/{i:04d}.mp4`` and ``out_dir/videophy2_input.csv``
    with the columns ``videopath,caption`` its inference script reads. Returns the csv path."""
    prompts = read_prompts(prompts_path, caption_field)
    os.makedirs(os.path.join(out_dir, "videos"), exist_ok=True)
    rows = []
    for i, path in sorted(videos.items()):
        if not 0 <= i < len(prompts):
            raise ValueError(f"prompt index {i} outside the {len(prompts)} prompts of {prompts_path}")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"video for prompt {i} not found: {path}")
        dst = os.path.join(out_dir, "videos", f"{i:04d}.mp4")
        _place(path, dst, copy)
        rows.append({"videopath": os.path.abspath(dst), "caption": prompts[i]["caption"]})
    csv_path = os.path.join(out_dir, "videophy2_input.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["videopath", "caption"])
        w.writeheader()
        w.writerows(rows)
    return csv_path
