"""Guarded evaluation of physics in generated clips (the toy world and any one-object clips).

Three headline scores per arm, each read next to its guards:

- ``gravity_residual`` (px, lower is better): RMS residual of piecewise parabolas with one
  shared acceleration fitted to the object's height (:func:`metrics.gravity_fit`) on the
  contrast-independent track of :func:`metrics.guarded_track`.
- ``jerk_rel`` (1/frame^2, lower is better): the scale-free jerk of that track
  (:func:`metrics.scale_free_jerk`).
- ``trajectory_distance`` (lower is better): the energy distance between the arm's tracks
  (the whole ``[F, 2]`` track relative to its start, in frame heights; frames without the
  object a frame height away) and the simulator's: a distance to the distribution of
  physical trajectories, not a lower-is-better score a still or faint object could game.

**Failures are never dropped.** A clip fails when its object is lost (found in fewer than
``min_tracked`` of the frames), does not move (vertical range under 3 px), stalls
(4 consecutive frame steps slower than 0.25 px/frame), a headline is undefined, or it has
fewer frames than the base arm's clip of the same prompt and seed. Every arm reports its failure rate; a failed clip scores the worst value observed
for that headline over all arms and clips of the evaluation (and the descriptor of a still,
absent object in the distance), so a vanished ball costs the arm instead of leaving the
comparison.

Guards (reported with every headline; the goal is "within 5% of the base"): ``fg_area``
(px), ``contrast`` (peak deviation from the background, [0, 1]), ``frames_tracked``,
``objects_per_frame``, ``flicker`` and ``color_ok`` (the moving object has the captioned
colour). The VAE round-trip error is not a quality claim (it rewards small faint blobs: the
simulator's own clips score worse on it than generated ones) and is not computed.

:func:`evaluate_toy_world` generates the arms on the shipped toy world model and returns a
:class:`ToyWorldEvaluation` (markdown table, JSON); :func:`score_clip` and :func:`summarize`
serve any set of clips (``scripts/eval_physics.py``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import metrics as M

logger = logging.getLogger(__name__)

#: (key, label, direction): the headline scores
HEADLINES: Tuple[Tuple[str, str, str], ...] = (
    ("gravity_residual", "gravity-fit residual (px)", "lower"),
    ("jerk_rel", "scale-free jerk (1/f^2)", "lower"),
)
#: distribution-level headline (one value per arm)
DISTANCE = ("trajectory_distance", "distance to simulator trajectories", "lower")
#: (key, label): guards, reported next to every headline
GUARDS: Tuple[Tuple[str, str], ...] = (
    ("fg_area", "foreground area (px)"),
    ("contrast", "object contrast"),
    ("frames_tracked", "frames tracked"),
    ("objects_per_frame", "objects per frame"),
    ("flicker", "flicker"),
    ("color_ok", "captioned colour (share)"),
)
SHARES = ("color_ok", "failed")


@dataclass
class EvalSettings:
    """What a clip must show to count (validated)."""

    min_tracked: float = 0.8  # fraction of frames in which the object must be found
    min_vertical_range: float = 3.0  # px: a falling object moves at least this much
    stall_frames: int = 4  # consecutive frame steps ...
    stall_speed: float = 0.25  # ... slower than this (px/frame): a frozen object
    n_boot: int = 2000
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.min_tracked <= 1.0:
            raise ValueError(f"min_tracked must lie in (0, 1], got {self.min_tracked}")
        if self.min_vertical_range < 0 or self.n_boot < 10:
            raise ValueError(f"need min_vertical_range >= 0 and n_boot >= 10, got {self.min_vertical_range}, {self.n_boot}")


# ---------------------------------------------------------------------------------------
# one clip


def object_color(frames: np.ndarray) -> Optional[str]:
    """Palette name of the moving object: per-pixel vote of the nearest palette hue among the
    saturated pixels that differ from the clip's temporal median (None: nothing moves)."""
    from .synthetic import COLORS

    names = [n for n in COLORS if n != "white"]
    pal = np.asarray([COLORS[n] for n in names], np.float32)
    f = frames.astype(np.float32)
    px = f[np.abs(f - np.median(f, axis=0)).max(-1) > 40]
    px = px[px.max(1) - px.min(1) > 50] if len(px) >= 10 else px[:0]
    if len(px) < 5:
        return None
    a = px - px.min(1, keepdims=True)
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    q = pal - pal.min(1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return names[int(np.bincount((a @ q.T).argmax(1), minlength=len(names)).argmax())]


def track_shape(positions: np.ndarray, height: int) -> List[float]:
    """The trajectory as the distance compares it: ``[F, 2]`` positions relative to the first
    frame the object is found in, in frame heights, flattened; frames without the object are
    NaN (:func:`trajectory_distance` puts them a frame height away)."""
    p = np.asarray(positions, np.float64)
    found = ~np.isnan(p).any(1)
    if not found.any():
        return [float("nan")] * p.size
    return ((p - p[int(np.argmax(found))]) / float(height)).reshape(-1).tolist()


def score_clip(frames, color: Optional[str] = None, settings: Optional[EvalSettings] = None) -> Dict[str, Any]:
    """Headlines, guards, trajectory descriptor and failure of one clip (``[F, H, W, 3]`` uint8).

    ``failed`` is 1.0 when the object is lost, does not move or a headline is undefined; the
    headline values of such a clip are kept as measured (possibly NaN) and replaced only in
    :func:`summarize`.
    """
    st = settings or EvalSettings()
    frames = M._check(frames)
    tr = M.guarded_track(frames)
    row: Dict[str, Any] = dict(tr.guards())
    F = frames.shape[0]
    row["flicker"] = M.flow_warp_error(frames)["flicker"]
    row["color_ok"] = float(object_color(frames) == color) if color is not None else float("nan")
    fit = M.gravity_fit(track=tr.positions)
    row["gravity_residual"] = float(fit.residual_quadratic)
    row["jerk_rel"] = M.scale_free_jerk(tr.positions)
    y = tr.positions[tr.found, 1]
    vrange = float(y.max() - y.min()) if len(y) else 0.0
    v = np.diff(tr.positions, axis=0)
    speed = np.linalg.norm(v[~np.isnan(v).any(1)], axis=1)
    row.update(gravity_accel=float(fit.accel), vertical_range=vrange,
               mean_speed=float(speed.mean()) if len(speed) else 0.0, num_segments=float(fit.num_segments))
    row["num_frames"] = float(F)
    row["track"] = track_shape(tr.positions, frames.shape[1])
    reasons = []
    if _stalled(tr.positions, st):
        reasons.append("stalled")
    if tr.frames_tracked < st.min_tracked * F:
        reasons.append("lost")
    if vrange < st.min_vertical_range:
        reasons.append("static")
    if any(not np.isfinite(row[k]) for k, _, _ in HEADLINES):
        reasons.append("undefined")
    row["failed"] = float(bool(reasons))
    row["failure"] = ",".join(reasons)
    return row


def _stalled(track: np.ndarray, st: "EvalSettings") -> bool:
    """The object stops: ``st.stall_frames`` consecutive frame steps slower than ``st.stall_speed``
    px/frame (a falling or bouncing ball under gravity passes through zero speed within a frame
    or two; the simulator's clips never stall)."""
    ok = ~np.isnan(track).any(1)
    run = 0
    for t in range(1, len(track)):
        slow = ok[t] and ok[t - 1] and np.linalg.norm(track[t] - track[t - 1]) < st.stall_speed
        run = run + 1 if slow else 0
        if run >= st.stall_frames:
            return True
    return False


# ---------------------------------------------------------------------------------------
# aggregation


@dataclass
class Stat:
    mean: float
    lo: float
    hi: float
    n: int

    def cell(self, fmt: str = "{:.3g}") -> str:
        return f"{fmt.format(self.mean)} [{fmt.format(self.lo)}, {fmt.format(self.hi)}]"


@dataclass
class Change:
    rel: float  # relative change of the mean (shares: difference in points, as a fraction)
    lo: float
    hi: float
    absolute: bool

    def cell(self) -> str:
        u = " pp" if self.absolute else "%"
        return f"{100 * self.rel:+.1f}{u} [{100 * self.lo:+.1f}, {100 * self.hi:+.1f}]"


@dataclass
class ArmSummary:
    name: str
    n: int
    failure_rate: Stat
    headlines: Dict[str, Stat]  # failures scored at the worst observed value
    headlines_ok: Dict[str, Stat]  # on the arm's own successful clips only (context, never the headline)
    guards: Dict[str, Stat]
    distance: Optional[Stat]
    failures: Dict[str, int]  # reason -> clips


def _boot_mean(v: np.ndarray, rng, n_boot: int) -> Stat:
    v = np.asarray(v, np.float64)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return Stat(float("nan"), float("nan"), float("nan"), 0)
    means = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(1)
    return Stat(float(v.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)), len(v))


def worst_values(per_clip: Dict[str, List[Dict]]) -> Dict[str, float]:
    """The worst finite value of each headline over every clip of every arm (the failure score)."""
    out = {}
    for key, _, direction in HEADLINES:
        vals = [r[key] for rows in per_clip.values() for r in rows if np.isfinite(r.get(key, np.nan))]
        out[key] = (max(vals) if direction == "lower" else min(vals)) if vals else float("nan")
    return out


def guarded_values(rows: List[Dict], key: str, worst: float) -> np.ndarray:
    """Headline values of an arm with every failed clip at ``worst``."""
    return np.asarray([worst if r["failed"] or not np.isfinite(r[key]) else r[key] for r in rows], np.float64)


def _descriptors(rows: List[Dict], length: int) -> np.ndarray:
    """[clips, length]: each clip's :func:`track_shape`; a frame without the object (lost, or
    missing from a shorter clip) counts a frame height away from the start."""
    d = np.ones((len(rows), length), np.float64)
    for i, r in enumerate(rows):
        if "track" not in r:
            raise ValueError("a clip row without 'track' comes from an older evaluation: score the clips again")
        t = np.asarray(r["track"], np.float64)[:length]
        d[i, : len(t)] = np.nan_to_num(t, nan=1.0)
    return d


def energy_distance(x: np.ndarray, y: np.ndarray) -> float:
    """Energy distance 2E|X-Y| - E|X-X'| - E|Y-Y'| between two samples of vectors (rows)."""
    def md(a, b):
        return float(np.linalg.norm(a[:, None, :] - b[None, :, :], axis=-1).mean())

    return 2 * md(x, y) - md(x, x) - md(y, y)


def _pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a[:, None, :] - b[None, :, :], axis=-1)


class _EnergyBootstrap:
    """The energy distance of resampled clips (rows of ``x``, drawn with replacement) to a fixed
    ``ref``, from pairwise distances computed once: a bootstrap draw only indexes them."""

    def __init__(self, x: np.ndarray, ref: np.ndarray):
        self.xr = _pairwise(x, ref).mean(1)
        self.xx = _pairwise(x, x)
        self.rr = float(_pairwise(ref, ref).mean())

    def __call__(self, i: np.ndarray) -> float:
        return float(2 * self.xr[i].mean() - self.xx[np.ix_(i, i)].mean() - self.rr)


def _track_descriptors(rows: List[Dict], reference: List[Dict]) -> Tuple[np.ndarray, np.ndarray]:
    length = max(len(r.get("track", ())) for r in list(rows) + list(reference))
    return _descriptors(rows, length), _descriptors(reference, length)


def trajectory_distance(rows: List[Dict], reference: List[Dict], rng=None, n_boot: int = 0) -> Stat:
    """Energy distance between the arm's trajectories (:func:`track_shape`: the whole track, in
    frame heights from its start) and the reference (simulator) clips'; bootstrap over the arm's
    clips when ``n_boot``. Whole tracks, not summary statistics: with four per-clip statistics
    (fitted acceleration, vertical range, mean speed, segments) fading, shrinking or skipping
    frames moved the generator's clips 7-9% closer to the simulator; with tracks none does."""
    x, ref = _track_descriptors(rows, reference)
    d = energy_distance(x, ref)
    if not n_boot:
        return Stat(d, d, d, len(rows))
    rng = rng or np.random.default_rng(0)
    boot = _EnergyBootstrap(x, ref)
    bs = [boot(rng.integers(0, len(x), len(x))) for _ in range(n_boot)]
    return Stat(d, float(np.percentile(bs, 2.5)), float(np.percentile(bs, 97.5)), len(rows))


def paired_change(base: np.ndarray, arm: np.ndarray, rng, n_boot: int, absolute: bool = False) -> Change:
    """Relative change of the mean (``arm / base - 1``; shares: the difference), paired bootstrap."""
    ok = np.isfinite(base) & np.isfinite(arm)
    b, a = base[ok], arm[ok]
    if len(b) == 0 or (not absolute and abs(b.mean()) < 1e-12):
        return Change(float("nan"), float("nan"), float("nan"), absolute)
    idx = rng.integers(0, len(b), size=(n_boot, len(b)))
    if absolute:
        d = a[idx].mean(1) - b[idx].mean(1)
        return Change(float(a.mean() - b.mean()), float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5)), True)
    r = a[idx].mean(1) / np.maximum(np.abs(b[idx].mean(1)), 1e-12) - 1
    return Change(float(a.mean() / b.mean() - 1), float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5)), False)


@dataclass
class Summary:
    """Per-arm statistics and paired changes against ``base`` (see :func:`summarize`)."""

    arms: Dict[str, ArmSummary]
    changes: Dict[str, Dict[str, Change]]  # arm -> metric -> change vs base (paired, same prompt and seed)
    distance_changes: Dict[str, Change]  # arm -> change of the trajectory distance vs base (bootstrap)
    worst: Dict[str, float]
    base: str
    reference: Optional[str]

    def markdown(self) -> str:
        hd = [lbl for _, lbl, _ in HEADLINES] + [DISTANCE[1], "failure rate"] + [lbl for _, lbl in GUARDS]
        lines = ["| arm | " + " | ".join(hd) + " |", "|---|" + "---|" * len(hd)]
        for name, a in self.arms.items():
            cells = [a.headlines[k].cell() for k, _, _ in HEADLINES]
            cells.append(a.distance.cell() if a.distance is not None else "0 (reference)")
            cells.append(a.failure_rate.cell("{:.3f}"))
            cells += [a.guards[k].cell() for k, _ in GUARDS]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        for name, ch in self.changes.items():
            cells = [ch[k].cell() for k, _, _ in HEADLINES]
            cells.append(self.distance_changes[name].cell() if name in self.distance_changes else "")
            cells.append(ch["failed"].cell())
            cells += [ch[k].cell() for k, _ in GUARDS]
            lines.append(f"| change of {name} vs {self.base} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def summarize(per_clip: Dict[str, List[Dict]], base: str = "base", reference: Optional[str] = "simulator (reference)",
              settings: Optional[EvalSettings] = None) -> Summary:
    """Aggregate :func:`score_clip` rows of several arms (same prompts and seeds, same order).

    Headline means score failed clips at the worst value observed over all arms; changes are
    paired relative changes of those means (guards and failure rate too), with bootstrap 95%
    intervals; the trajectory distance is measured against ``reference``'s clips.
    """
    st = settings or EvalSettings()
    if base not in per_clip:
        raise ValueError(f"base arm {base!r} not among the arms {sorted(per_clip)}")
    per_clip = _mark_missing_frames(per_clip, base)
    rng = np.random.default_rng(st.seed)
    worst = worst_values(per_clip)
    ref = per_clip.get(reference) if reference else None
    arms = {}
    for name, rows in per_clip.items():
        fails: Dict[str, int] = {}
        for r in rows:
            for why in filter(None, r["failure"].split(",")):
                fails[why] = fails.get(why, 0) + 1
        ok = [r for r in rows if not r["failed"]]
        dist = None
        if ref is not None and name != reference:
            dist = trajectory_distance(rows, ref, rng, min(st.n_boot, 500))
        arms[name] = ArmSummary(
            name, len(rows), _boot_mean(np.asarray([r["failed"] for r in rows]), rng, st.n_boot),
            {k: _boot_mean(guarded_values(rows, k, worst[k]), rng, st.n_boot) for k, _, _ in HEADLINES},
            {k: _boot_mean(np.asarray([r[k] for r in ok], np.float64), rng, st.n_boot) for k, _, _ in HEADLINES},
            {k: _boot_mean(np.asarray([r[k] for r in rows], np.float64), rng, st.n_boot) for k, _ in GUARDS},
            dist, fails)
    changes, dchanges = {}, {}
    b = per_clip[base]
    for name, rows in per_clip.items():
        if name in (base, reference):
            continue
        if len(rows) != len(b):
            raise ValueError(f"arm {name!r} has {len(rows)} clips, the base {len(b)}: arms must share prompts and seeds")
        ch = {k: paired_change(guarded_values(b, k, worst[k]), guarded_values(rows, k, worst[k]), rng, st.n_boot)
              for k, _, _ in HEADLINES}
        for k, _ in GUARDS + (("failed", ""),):
            ch[k] = paired_change(np.asarray([r[k] for r in b], np.float64), np.asarray([r[k] for r in rows], np.float64),
                                  rng, st.n_boot, absolute=k in SHARES)
        changes[name] = ch
        if ref is not None:
            dchanges[name] = _distance_change(b, rows, ref, rng, min(st.n_boot, 500))
    return Summary(arms, changes, dchanges, worst, base, reference)


def _mark_missing_frames(per_clip: Dict[str, List[Dict]], base: str) -> Dict[str, List[Dict]]:
    """A clip with fewer frames than the base's clip of the same prompt and seed fails
    ("frames missing"): the generator was asked for the same number of frames, and a track
    two frames shorter fitted a parabola 8% better on the base clips' own frames."""
    b = per_clip[base]
    out = {}
    for name, rows in per_clip.items():
        if name == base or len(rows) != len(b):
            out[name] = rows
            continue
        new_rows = []
        for r, rb in zip(rows, b):
            if r.get("num_frames", 0) < rb.get("num_frames", 0) and "frames missing" not in r["failure"]:
                r = dict(r, failed=1.0, failure=",".join(filter(None, [r["failure"], "frames missing"])))
            new_rows.append(r)
        out[name] = new_rows
    return out


def _distance_change(base_rows, rows, ref, rng, n_boot) -> Change:
    xb, rb = _track_descriptors(base_rows, ref)
    xa, ra = _track_descriptors(rows, ref)
    d0, d1 = energy_distance(xb, rb), energy_distance(xa, ra)
    if not abs(d0) > 1e-12:
        return Change(float("nan"), float("nan"), float("nan"), False)
    n = len(rows)
    bb, ba = _EnergyBootstrap(xb, rb), _EnergyBootstrap(xa, ra)
    rs = []
    for _ in range(n_boot):  # paired: the same clips of both arms
        i = rng.integers(0, n, n)
        rs.append(ba(i) / max(abs(bb(i)), 1e-12) - 1)
    return Change(d1 / d0 - 1, float(np.percentile(rs, 2.5)), float(np.percentile(rs, 97.5)), False)


# ---------------------------------------------------------------------------------------
# the toy world


@dataclass
class Arm:
    """One way of generating: the base model, an adapter, or a fine-tuned transformer.

    ``adapter``: a PILAAdapter or its folder (None: no adapter); ``transformer``: a state
    dict or a ``WanTransformer3DModel`` folder replacing the base transformer's weights;
    ``trajectory_guidance``: the strength of :mod:`.trajectory_guidance` (0: off);
    ``trajectory_projection``: the law of :mod:`.trajectory_projection` (``""``: off), with
    ``projection_strength``, ``projection_steps`` and ``projection_space``.
    """

    name: str
    adapter: Any = None
    scale: float = 1.0
    residual_guidance: float = 0.0
    window: Tuple[float, float] = (0.0, 1.0)
    transformer: Any = None
    trajectory_guidance: float = 0.0
    trajectory_projection: str = ""
    projection_strength: float = 1.0
    projection_steps: int = 1
    projection_space: str = "latent"


@dataclass
class ToyWorldEvaluation:
    settings: Dict[str, Any]
    items: List[Tuple[str, str, str, int]]  # (prompt, colour, motion, noise seed)
    per_clip: Dict[str, List[Dict]]
    summary: Summary
    control_bit_identical: Optional[bool] = None
    clips: Dict[str, List[np.ndarray]] = field(default_factory=dict)  # when keep_clips

    def markdown(self) -> str:
        s = self.settings
        note = (f"\n\n{len(self.items)} clips per arm (noise seeds {s['seed_sets']}), {s['steps']} steps, guidance "
                f"{s['guidance']}. Headlines: failed clips (object lost in more than {100 * (1 - s['min_tracked']):.0f}% "
                "of the frames, still, or undefined) score the worst value observed; means with bootstrap 95% intervals; "
                "changes are paired (same prompt and seed), relative for scores and in points for shares.")
        return self.summary.markdown() + note

    def to_json(self) -> Dict[str, Any]:
        return {"settings": self.settings, "items": self.items, "control_bit_identical": self.control_bit_identical,
                "summary": self.summary.to_json(),
                "per_clip": {k: [{kk: (vv.item() if isinstance(vv, np.generic) else vv) for kk, vv in r.items()}
                                 for r in rows] for k, rows in self.per_clip.items()}}

    def save(self, out_dir: str) -> None:
        """Write ``table.md`` (:meth:`markdown`) and ``results.json`` (:meth:`to_json`, which
        ``ablate_pila.py merge`` pools across seed sets) into ``out_dir``."""
        import json
        import os

        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "table.md"), "w") as fh:
            fh.write(self.markdown() + "\n")
        with open(os.path.join(out_dir, "results.json"), "w") as fh:
            json.dump(self.to_json(), fh, default=float)


def toy_world_items(num: int, seed_base: int) -> List[Tuple[str, str, str, int]]:
    """(prompt, colour, motion, noise seed): prompts cycle through the 6 colours x {bounce, fall}."""
    from .toy_world import TOY_WORLD_COLORS, toy_world_prompt

    out = []
    for i in range(num):
        color = TOY_WORLD_COLORS[i % len(TOY_WORLD_COLORS)]
        motion = ("bounce", "fall")[(i // len(TOY_WORLD_COLORS)) % 2]
        out.append((toy_world_prompt(color, motion), color, motion, seed_base + i))
    return out


def generate_clips(pipe, items, *, steps: int = 20, guidance: float = 3.0, batch: int = 8,
                   progress: Optional[Callable[[int, int], None]] = None) -> List[np.ndarray]:
    """uint8 clips of ``pipe`` for (prompt, _, _, seed) items (noise drawn on the CPU)."""
    import torch

    out = []
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        gens = [torch.Generator().manual_seed(int(it[3])) for it in chunk]
        res = pipe(prompt=[it[0] for it in chunk], negative_prompt=[""] * len(chunk), height=64, width=64,
                   num_frames=17, num_inference_steps=steps, guidance_scale=guidance, generator=gens,
                   output_type="np").frames
        out.extend(np.clip(np.rint(np.asarray(r) * 255), 0, 255).astype(np.uint8) for r in res)
        if progress is not None:
            progress(len(out), len(items))
    return out


def simulator_clips(items) -> List[np.ndarray]:
    """The simulator's own clips for the items' motions (held-out simulation seeds 7000000+)."""
    from .synthetic import generate_clip

    return [generate_clip("bounce" if it[2] == "bounce" else "free_fall", 7_000_000 + i) for i, it in enumerate(items)]


def evaluate_toy_world(arms: Optional[Sequence[Arm]] = None, *, model=None, num: int = 32,
                       seed_sets: Sequence[int] = (900_000,), steps: int = 20, guidance: float = 3.0, batch: int = 8,
                       device: str = "cpu", control: bool = True, keep_clips: bool = False,
                       settings: Optional[EvalSettings] = None,
                       progress: Optional[Callable[[str, int, int], None]] = None) -> ToyWorldEvaluation:
    """Generate ``num`` clips per seed set and arm on the toy world model and score them (guarded).

    Args:
        arms: what to compare; default: the shipped PILA adapter at scale 1 (when present).
            The base model is always the first arm (``"base"``).
        model: a loaded toy world ``WanPipeline`` or its folder (default: the shipped one).
        seed_sets: noise-seed bases; ``num`` clips each (seeds ``base + i``), pooled.
        control: also run the first adapter arm at scale 0 and check it is bit-identical to the base.
        progress: ``progress(arm, done, total)`` after every batch.
    """
    from .attach import attach_pila, detach_pila
    from .pipeline import load_adapter
    from .trajectory_guidance import attach_trajectory_guidance, detach_trajectory_guidance
    from .trajectory_projection import attach_trajectory_projection, detach_trajectory_projection
    from .toy_world import load_toy_world, toy_world_adapter_path

    st = settings or EvalSettings()
    pipe = model if model is not None and not isinstance(model, (str,)) and hasattr(model, "transformer") \
        else load_toy_world(model, device=device)
    if arms is None:
        path = toy_world_adapter_path()
        arms = [Arm("PILA (scale 1)", adapter=path)] if path is not None else []
    names = [a.name for a in arms]
    if len(set(names)) != len(names) or "base" in names:
        raise ValueError(f"arm names must be distinct and not 'base', got {names}")
    items = [it for sb in seed_sets for it in toy_world_items(num, sb)]
    base_state = {k: v.detach().clone() for k, v in pipe.transformer.state_dict().items()}

    def cb(name):
        return (lambda d, t: progress(name, d, t)) if progress is not None else None

    gen = dict(steps=steps, guidance=guidance, batch=batch)
    clips = {"base": generate_clips(pipe, items, progress=cb("base"), **gen)}
    same = None
    for arm in arms:
        if arm.transformer is not None:
            sd = arm.transformer
            if isinstance(sd, str):
                from diffusers import WanTransformer3DModel

                sd = WanTransformer3DModel.from_pretrained(sd).state_dict()
            pipe.transformer.load_state_dict(sd)
        try:
            if arm.adapter is not None:
                adapter = load_adapter(arm.adapter).eval()
                if control and same is None:
                    attach_pila(pipe, adapter, scale=0.0)
                    ctl = generate_clips(pipe, items, progress=cb("control (scale 0)"), **gen)
                    same = all(np.array_equal(x, y) for x, y in zip(clips["base"], ctl))
                    logger.info("control (scale 0) bit-identical to the base: %s", same)
                attach_pila(pipe, adapter, scale=arm.scale, residual_guidance=arm.residual_guidance,
                            start=arm.window[0], end=arm.window[1])
            if arm.trajectory_guidance > 0:
                attach_trajectory_guidance(pipe, arm.trajectory_guidance)
            if arm.trajectory_projection:
                attach_trajectory_projection(pipe, arm.projection_steps, arm.trajectory_projection,
                                             arm.projection_strength, arm.projection_space)
            clips[arm.name] = generate_clips(pipe, items, progress=cb(arm.name), **gen)
        finally:
            detach_trajectory_guidance(pipe)
            detach_trajectory_projection(pipe)
            detach_pila(pipe)
            if arm.transformer is not None:
                pipe.transformer.load_state_dict(base_state)
    clips["simulator (reference)"] = [c.frames for c in simulator_clips(items)]
    per_clip = {name: [score_clip(fr, it[1], st) for fr, it in zip(cl, items)] for name, cl in clips.items()}
    summary = summarize(per_clip, "base", "simulator (reference)", st)
    def describe(v):
        return v if v is None or isinstance(v, str) else type(v).__name__

    sets = dict(num=num, seed_sets=list(seed_sets), steps=steps, guidance=guidance, min_tracked=st.min_tracked,
                arms=[dict(name=a.name, adapter=describe(a.adapter), scale=a.scale, residual_guidance=a.residual_guidance,
                           trajectory_guidance=a.trajectory_guidance,
                           window=list(a.window), transformer=describe(a.transformer)) for a in arms])
    return ToyWorldEvaluation(sets, items, per_clip, summary, same, clips if keep_clips else {})


__all__ = ["Arm", "ArmSummary", "Change", "EvalSettings", "GUARDS", "HEADLINES", "Stat", "Summary", "ToyWorldEvaluation",
           "energy_distance", "evaluate_toy_world", "generate_clips", "object_color", "score_clip", "simulator_clips",
           "summarize", "toy_world_items", "trajectory_distance", "worst_values"]
