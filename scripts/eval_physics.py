#!/usr/bin/env python
"""Score a folder of videos with the CPU physics proxies and write a table.

    python scripts/eval_physics.py VIDEOS_DIR [--out table.md] [--csv table.csv] [--controls]

Columns: warp error / unexplained change / flicker next to motion magnitude, acceleration
inconsistency (KLT jerk), gravity fit (acceleration, parabola vs line residuals,
restitution, physical). ``--controls`` also scores each video's negative controls
(shuffled, time-reversed, two dropped frames). A mean row closes the table.

Benchmark exports (nothing is downloaded; give the benchmark's own prompt file):

    --phygenbench-prompts prompts.json --export-dir out/   # out/phygenbench/output_video_{i}.mp4
    --videophy2-prompts test.csv       --export-dir out/   # out/videophy2/{videos/, videophy2_input.csv}

Videos map to prompts by the first integer in their file name (0-based), else by sorted order.
"""

import argparse
import csv
import math
import os
import re
import sys

import numpy as np

from visionmoe.video.evaluation import benchmarks as B
from visionmoe.video.evaluation import controls as C
from visionmoe.video.evaluation import metrics as M

COLUMNS = ["warp_error", "warp_unexplained", "flicker", "motion", "accel_inconsistency", "tangential_accel",
           "gravity_accel", "gravity_residual_quadratic", "gravity_residual_linear", "gravity_restitution",
           "gravity_falling", "gravity_physical"]
VIDEO_EXT = (".mp4", ".webm", ".avi", ".mov", ".mkv", ".gif")


def read_frames(path):
    import imageio.v3 as iio

    frames = np.asarray(iio.imread(path))
    if frames.ndim == 3:
        frames = frames[..., None].repeat(3, -1)
    return frames[..., :3]


def fmt(v):
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def _check_output(parser, flag, path):
    """Fail before the scoring work, not after it, when an output cannot be written."""
    if path is None:
        return
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        parser.error(f"{flag}: {path} is a directory; give a file path")
    if not os.path.isdir(parent):
        parser.error(f"{flag}: the folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        parser.error(f"{flag}: the folder {parent} is not writable")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("videos", help="folder of videos")
    p.add_argument("--out", help="markdown table path (default: print)")
    p.add_argument("--csv", help="CSV table path")
    p.add_argument("--controls", action="store_true", help="also score shuffled / reversed / dropped-frame controls")
    p.add_argument("--phygenbench-prompts")
    p.add_argument("--videophy2-prompts")
    p.add_argument("--export-dir")
    a = p.parse_args(argv)
    if not os.path.isdir(a.videos):
        p.error(f"not a folder: {a.videos}")
    for flag, path in (("--out", a.out), ("--csv", a.csv)):
        _check_output(p, flag, path)
    names = sorted(f for f in os.listdir(a.videos) if f.lower().endswith(VIDEO_EXT))
    if not names:
        p.error(f"no videos ({', '.join(VIDEO_EXT)}) in {a.videos}")
    rows, failed, readable = [], 0, []
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = lambda x, **k: x  # noqa: E731
    for name in tqdm(names, desc="scoring", unit="video"):
        try:
            frames = read_frames(os.path.join(a.videos, name))
            variants = [("", frames)]
            if a.controls:
                variants += [(" [shuffled]", C.shuffle_frames(frames)), (" [reversed]", C.reverse_frames(frames)),
                             (" [dropped]", C.drop_frames(frames))]
            for tag, fr in variants:
                rows.append({"video": name + tag, **M.score_video(fr)})
            readable.append(name)
        except Exception as e:  # a bad file is reported, never stops the table
            failed += 1
            print(f"skipped {name}: {e}", file=sys.stderr)
    if not rows:
        print("no video could be scored", file=sys.stderr)
        return 1
    groups = {}
    for r in rows:
        tag = r["video"][r["video"].rfind(" ["):] if r["video"].endswith("]") else ""
        groups.setdefault(tag, []).append(r)
    means = []
    for tag, rs in groups.items():
        m = {"video": f"mean{tag} (n={len(rs)})"}
        for c in COLUMNS:
            vals = [float(r[c]) for r in rs if c in r and not (isinstance(r[c], float) and math.isnan(r[c]))]
            m[c] = float(np.mean(vals)) if vals else float("nan")
        means.append(m)
    lines = ["| video | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for r in rows + means:
        lines.append("| " + r["video"] + " | " + " | ".join(fmt(r.get(c, float("nan"))) for c in COLUMNS) + " |")
    table = "\n".join(lines)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(table + "\n")
        print(f"wrote {a.out}")
    else:
        print(table)
    if a.csv:
        with open(a.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["video"] + COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows + means)
        print(f"wrote {a.csv}")
    if failed:
        print(f"{failed} video(s) could not be read and were skipped", file=sys.stderr)
    if a.phygenbench_prompts or a.videophy2_prompts:
        if not a.export_dir:
            p.error("--export-dir is needed with --phygenbench-prompts / --videophy2-prompts")
        mapping = {}
        for i, name in enumerate(names):
            if name not in readable:  # unreadable videos are not exported
                continue
            m = re.search(r"\d+", name)
            mapping[int(m.group()) if m else i] = os.path.join(a.videos, name)
        if a.phygenbench_prompts:
            out = B.export_phygenbench(a.phygenbench_prompts, mapping, os.path.join(a.export_dir, "phygenbench"))
            print(f"PhyGenBench layout: {out}")
        if a.videophy2_prompts:
            out = B.export_videophy2(a.videophy2_prompts, mapping, os.path.join(a.export_dir, "videophy2"))
            print(f"VideoPhy-2 input csv: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
