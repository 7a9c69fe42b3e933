"""An independent judge of lawful motion for the deficit world (issue #49, step 5): a small
classifier of the captioned object's track, trained on the simulator's lawful and unlawful clips
(:mod:`visionmoe.video.data.law_variants`) and never used in training or guidance.

The headline of :mod:`.law_params` fits each category's law parameter to the track and compares
it with the simulator's truth. The judge reads the same colour-mask track (the evaluation's
measurement, shared with nothing in PILA or the trajectory tools) but fits no law: a 1-D
convolutional network over the frames says how likely the motion is lawful, learnt from examples
only. Its training clips use their own seeds (:data:`JUDGE_SEED_BASE`), apart from the adapters'
data (300 000 000+) and the evaluations' (900 000 000+), and their tracks are jittered, thinned
and spiked so that noisy generated clips are not out of its domain. A clip whose object is found
in fewer than ``min_frames`` frames is judged unlawful (probability 0), as the headline scores a
failure at its worst value.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..data.law_variants import LAW_SCENARIOS, generate_law_clip
from .law_params import caption_color, color_track

__all__ = ["JUDGE_SEED_BASE", "LawJudge", "judge_clips", "load_judge", "save_judge", "simulator_tracks",
           "track_features", "train_law_judge"]

JUDGE_SEED_BASE = 700_000_000
_SCENARIOS = tuple(LAW_SCENARIOS)
_CHANNELS = 5 + len(_SCENARIOS)  # x, y, dx, dy, found + the scenario's one-hot


def _fill(pos: np.ndarray, found: np.ndarray) -> np.ndarray:
    """[N, F, 2] positions with the frames where nothing was found linearly interpolated (held at the ends)."""
    out = pos.copy()
    t = np.arange(pos.shape[1])
    for i in range(len(pos)):
        f = found[i]
        if not f.any():
            out[i] = 0.0
            continue
        for c in range(2):
            out[i, :, c] = np.interp(t, t[f], pos[i, f, c])
    return out


def track_features(pos: np.ndarray, found: np.ndarray, scenarios: Sequence[str], size: tuple) -> torch.Tensor:
    """Tracks ([N, F, 2] pixels, NaN-free where ``found``) -> the judge's input [N, C, F]."""
    h, w = size
    filled = _fill(np.nan_to_num(pos), found)
    xy = (filled / np.array([w, h], np.float64) - 0.5) * 2.0
    d = np.diff(xy, axis=1, prepend=xy[:, :1]) * 10.0  # per-frame motion, a few tenths of the frame
    onehot = np.zeros((len(pos), len(_SCENARIOS)))
    onehot[np.arange(len(pos)), [_SCENARIOS.index(s) for s in scenarios]] = 1.0
    per_frame = np.concatenate([xy, d, found[..., None].astype(np.float64)], -1)  # [N, F, 5]
    scen = np.broadcast_to(onehot[:, None, :], (len(pos), pos.shape[1], len(_SCENARIOS)))
    return torch.from_numpy(np.concatenate([per_frame, scen], -1).transpose(0, 2, 1).astype(np.float32))


class LawJudge(nn.Module):
    """A 1-D convolutional network over a track's frames -> the logit of lawful motion."""

    def __init__(self, num_frames: int = 17, hidden: int = 32):
        super().__init__()
        self.num_frames = num_frames
        self.net = nn.Sequential(
            nn.Conv1d(_CHANNELS, hidden, 3, padding=1), nn.GELU(),
            nn.Conv1d(hidden, hidden, 3, padding=1), nn.GELU(),
            nn.Flatten(), nn.Linear(hidden * num_frames, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def config(self) -> dict:
        return {"num_frames": self.num_frames, "hidden": self.net[0].out_channels}

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        if feats.ndim != 3 or feats.shape[1] != _CHANNELS or feats.shape[2] != self.num_frames:
            raise ValueError(f"the judge reads [N, {_CHANNELS}, {self.num_frames}] features; got {tuple(feats.shape)}")
        return self.net(feats)[:, 0]


def simulator_tracks(num_per_scenario: int, seed_start: int = JUDGE_SEED_BASE):
    """Colour-mask tracks of the simulator's lawful and unlawful clips: (pos [N, F, 2], found
    [N, F], scenarios, lawful [N], frame size)."""
    pos, found, scen, lawful, size = [], [], [], [], None
    for sc in _SCENARIOS:
        for i in range(num_per_scenario):
            for ok in (True, False):
                c = generate_law_clip(sc, seed_start + i, ok)
                tr = color_track(c.frames, caption_color(c.caption))
                pos.append(tr.positions)
                found.append(tr.found)
                scen.append(sc)
                lawful.append(float(ok))
                size = c.frames.shape[1:3]
    return np.stack(pos), np.stack(found), scen, np.array(lawful, np.float32), size


def _augment(pos, found, size, rng):
    """Generated clips' track noise: jitter (0.8 px), 10% of frames lost, 5% on a stray blob."""
    n, f, _ = pos.shape
    pos = np.nan_to_num(pos) + rng.normal(0.0, 0.8, pos.shape)
    found = found & (rng.random((n, f)) >= 0.1)
    stray = rng.random((n, f)) < 0.05
    pos[stray] = rng.uniform(0, 1, (int(stray.sum()), 2)) * np.array([size[1], size[0]])
    return pos, found


def _perturb(pos, found, lawful, rng, share: float = 0.35):
    """A ``share`` of the lawful tracks made unlawful as the evaluation's negative controls make
    clips (:mod:`.controls`): the object frozen from a random frame on, the frames shuffled, or
    two to four interior frames skipped with the last one held. -> (pos, found, labels)."""
    pos, found, lawful = pos.copy(), found.copy(), lawful.copy()
    n, f, _ = pos.shape
    for i in np.where((lawful > 0.5) & (rng.random(n) < share))[0]:
        kind = rng.integers(3)
        if kind == 0:
            k = rng.integers(3, f - 3)
            pos[i, k:], found[i, k:] = pos[i, k], found[i, k]
        elif kind == 1:
            perm = rng.permutation(f)
            pos[i], found[i] = pos[i, perm], found[i, perm]
        else:
            drop = rng.choice(np.arange(2, f - 2), size=rng.integers(2, 5), replace=False)
            keep = np.setdiff1d(np.arange(f), drop)
            keep = np.concatenate([keep, np.full(f - len(keep), keep[-1])])
            pos[i], found[i] = pos[i, keep], found[i, keep]
        lawful[i] = 0.0
    return pos, found, lawful


def train_law_judge(num_per_scenario: int = 400, steps: int = 1500, seed: int = 0, lr: float = 2e-3,
                    data=None) -> LawJudge:
    """A judge trained on :func:`simulator_tracks` (or ``data``, the same tuple): the unlawful
    clips and perturbed lawful ones (:func:`_perturb`) against the other lawful ones, perturbed
    and augmented afresh each step (:func:`_augment`), deterministic for a seed."""
    pos, found, scen, lawful, size = data if data is not None else simulator_tracks(num_per_scenario)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    judge = LawJudge(pos.shape[1])
    opt = torch.optim.AdamW(judge.parameters(), lr=lr, weight_decay=1e-4)
    judge.train()
    for _ in range(steps):
        idx = rng.choice(len(pos), size=min(256, len(pos)), replace=False)
        p, f, y = _perturb(pos[idx], found[idx], lawful[idx], rng)
        p, f = _augment(p, f, size, rng)
        logits = judge(track_features(p, f, [scen[i] for i in idx], size))
        loss = nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return judge.eval()


@torch.no_grad()
def judge_clips(judge: LawJudge, clips: Sequence[np.ndarray], scenarios: Sequence[str], captions: Sequence[str],
                min_frames: int = 8) -> np.ndarray:
    """P(lawful) of each clip ([F, H, W, 3] uint8) of its scenario, tracked by its caption's colour."""
    tracks = [color_track(c, caption_color(cap)) for c, cap in zip(clips, captions)]
    pos = np.stack([t.positions for t in tracks])
    found = np.stack([t.found for t in tracks])
    p = torch.sigmoid(judge.eval()(track_features(pos, found, scenarios, np.asarray(clips[0]).shape[1:3]))).numpy()
    return np.where(found.sum(1) >= min_frames, p, 0.0)


def save_judge(judge: LawJudge, folder: str, **info) -> None:
    """``judge.safetensors`` and ``judge.json`` (its size and ``info``) in ``folder``."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in judge.state_dict().items()}, os.path.join(folder, "judge.safetensors"))
    with open(os.path.join(folder, "judge.json"), "w") as fh:
        json.dump({**judge.config(), **info}, fh, indent=1)


def load_judge(folder: str) -> LawJudge:
    """The judge :func:`save_judge` wrote to ``folder``, in eval mode."""
    from safetensors.torch import load_file

    path = os.path.join(folder, "judge.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no law judge in {folder} (judge.json missing)")
    with open(path) as fh:
        cfg = json.load(fh)
    judge = LawJudge(cfg["num_frames"], cfg["hidden"])
    judge.load_state_dict(load_file(os.path.join(folder, "judge.safetensors")))
    return judge.eval()
