"""Procedural physics clips with ground-truth state, for tests, demos and training data.

Each scenario simulates a small physical system in pixel units (one time unit = one frame,
integrated with sub-steps) and renders it with anti-aliased primitives into uint8 frames
``[F, H, W, 3]``. Every clip carries a caption, physics category labels and its
ground-truth state (trajectories, parameters), and is a pure function of its seed.

Scenarios: ``free_fall``, ``bounce``, ``projectile``, ``collision``, ``sliding``,
``pendulum``, ``pouring`` (particle liquid), ``smoke`` (grid advection-diffusion),
``melting`` (heat diffusion with a phase change, molten cells flow into a puddle).

Image coordinates: x to the right, y downwards; gravity is ``+y``. Units are pixels and
frames, so an acceleration ``g`` is in px/frame^2.

CLI::

    python -m visionmoe.video.data.synthetic --out DIR --num 64 [--seed 0] [--size 64] [--frames 17]

writes ``DIR/videos/*.mp4``, ``DIR/ground_truth/*.npz`` and ``DIR/manifest.jsonl`` (the
manifest format that :mod:`visionmoe.video.data.manifest` reads).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from ...common.files import atomic_path, atomic_write_text
from .scenes import _GENERATORS, COLORS

logger = logging.getLogger(__name__)

SCENARIOS = (
    "free_fall",
    "bounce",
    "projectile",
    "collision",
    "sliding",
    "pendulum",
    "pouring",
    "smoke",
    "melting",
)

# Physics categories of each scenario, in the names of the adapter's taxonomy
# (``visionmoe.video.pila.taxonomy.CATEGORY_NAMES``: rigid, elastic, liquid, gas, thermal, optics).
_SCENARIO_CATEGORIES: Dict[str, tuple] = {
    "free_fall": ("rigid",),
    "bounce": ("rigid", "elastic"),
    "projectile": ("rigid",),
    "collision": ("rigid",),
    "sliding": ("rigid",),
    "pendulum": ("rigid",),
    "pouring": ("liquid",),
    "smoke": ("gas",),
    "melting": ("thermal", "liquid"),
}


def scenario_labels(scenario: str) -> List[str]:
    """Physics category labels of a scenario (names of :mod:`visionmoe.video.pila.taxonomy`)."""
    if scenario not in _SCENARIO_CATEGORIES:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    return list(_SCENARIO_CATEGORIES[scenario])


@dataclass
class Clip:
    """One procedural clip.

    Attributes:
        frames: uint8 ``[F, H, W, 3]``.
        caption: text description.
        scenario: scenario name.
        labels: physics category labels.
        params: scalar simulation parameters (gravity ``g`` in px/frame^2, restitution...).
        trajectories: ground-truth state arrays, first axis = frame (object positions
            ``[F, n, 2]`` as (x, y) pixel centres, velocities, fields' summaries...).
        seed: the seed that reproduces the clip.
        fps: nominal frame rate for writing videos.
    """

    frames: np.ndarray
    caption: str
    scenario: str
    labels: List[str]
    params: Dict[str, float]
    trajectories: Dict[str, np.ndarray]
    seed: int
    fps: int = 8


# ---------------------------------------------------------------------------------------
# rendering helpers


# ---------------------------------------------------------------------------------------
# rigid-body scenarios


# ---------------------------------------------------------------------------------------
# continuum scenarios


def check_num_frames(num_frames: int) -> None:
    """Wan's temporal VAE compresses 4 frames to one latent frame after the first: 4k+1."""
    if num_frames < 5 or (num_frames - 1) % 4 != 0:
        raise ValueError(f"num_frames must be 4k+1 and >= 5 (Wan's frame rule); got {num_frames}")


def generate_clip(scenario: str, seed: int, *, height: int = 64, width: int = 64, num_frames: int = 17) -> Clip:
    """Simulate and render one clip. Deterministic: the same arguments give the same clip."""
    if scenario not in _GENERATORS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    check_num_frames(num_frames)
    if height < 32 or width < 32:
        raise ValueError(f"height and width must be >= 32; got {height}x{width}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), SCENARIOS.index(scenario)]))
    frames, caption, params, traj = _GENERATORS[scenario](rng, height, width, num_frames)
    assert frames.shape == (num_frames, height, width, 3) and frames.dtype == np.uint8
    return Clip(frames=frames, caption=caption, scenario=scenario, labels=scenario_labels(scenario),
                params={k: float(v) for k, v in params.items()},
                trajectories={k: np.asarray(v) for k, v in traj.items()}, seed=int(seed))


def generate_dataset(num: int, seed: int = 0, scenarios: Optional[Sequence[str]] = None, **kw) -> List[Clip]:
    """``num`` clips cycling through ``scenarios`` (default: all), clip ``i`` seeded by (seed, i)."""
    scenarios = list(scenarios or SCENARIOS)
    return [generate_clip(scenarios[i % len(scenarios)], seed * 1_000_003 + i, **kw) for i in range(num)]


def write_video(path: str, frames: np.ndarray, fps: int = 8) -> None:
    """Write uint8 frames ``[F, H, W, 3]`` to an mp4 (H.264, near-lossless) with imageio-ffmpeg."""
    import imageio.v2 as imageio

    with atomic_path(path, suffix=".mp4") as tmp, \
            imageio.get_writer(str(tmp), fps=fps, codec="libx264", macro_block_size=1, pixelformat="yuv444p",
                               ffmpeg_params=["-crf", "10"], format="FFMPEG") as wr:
        for fr in frames:
            wr.append_data(np.ascontiguousarray(fr))


def write_dataset(out_dir: str, num: int, seed: int = 0, scenarios: Optional[Sequence[str]] = None,
                  progress: bool = False, **kw) -> str:
    """Write ``num`` clips as mp4 + ground-truth npz + ``manifest.jsonl``; returns the manifest path."""
    scenarios = list(scenarios or SCENARIOS)
    for s in scenarios:
        if s not in _GENERATORS:
            raise ValueError(f"unknown scenario {s!r}; expected one of {SCENARIOS}")
    os.makedirs(os.path.join(out_dir, "videos"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "ground_truth"), exist_ok=True)
    manifest = os.path.join(out_dir, "manifest.jsonl")
    it = range(num)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="clips", unit="clip")
    lines = []
    for i in it:
        clip = generate_clip(scenarios[i % len(scenarios)], seed * 1_000_003 + i, **kw)
        name = f"{i:06d}_{clip.scenario}"
        write_video(os.path.join(out_dir, "videos", name + ".mp4"), clip.frames, clip.fps)
        np.savez_compressed(os.path.join(out_dir, "ground_truth", name + ".npz"), **clip.trajectories)
        rec = {"video": f"videos/{name}.mp4", "caption": clip.caption, "labels": clip.labels,
               "scenario": clip.scenario, "seed": clip.seed, "fps": clip.fps,
               "num_frames": int(clip.frames.shape[0]), "params": clip.params,
               "ground_truth": f"ground_truth/{name}.npz"}
        lines.append(json.dumps(rec) + "\n")
    atomic_write_text(manifest, "".join(lines))
    logger.info("wrote %d clips to %s", num, out_dir)
    return manifest


def frame_strip(frames: np.ndarray, every: int = 1) -> np.ndarray:
    """Concatenate frames side by side (for looking at a clip as one image)."""
    return np.concatenate(list(frames[::every]), axis=1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m visionmoe.video.data.synthetic",
                                description="Write a dataset of procedural physics clips with a JSONL manifest.")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--num", type=int, default=64, help="number of clips")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset of: " + ",".join(SCENARIOS))
    p.add_argument("--size", type=int, default=64, help="frame height and width")
    p.add_argument("--frames", type=int, default=17, help="frames per clip (4k+1)")
    a = p.parse_args(argv)
    try:
        check_num_frames(a.frames)
        path = write_dataset(a.out, a.num, a.seed, [s.strip() for s in a.scenarios.split(",") if s.strip()],
                             progress=True, height=a.size, width=a.size, num_frames=a.frames)
    except ValueError as e:
        p.error(str(e))
    print(f"wrote {a.num} clips; manifest: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
