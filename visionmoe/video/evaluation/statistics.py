"""Arms of an evaluation against the base and the simulator (:func:`summarize`): failed clips at
the worst value observed, bootstrap means and paired changes with intervals, and the energy
distance of the arms' trajectories to the simulator's (:func:`trajectory_distance`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .scoring import DISTANCE, GUARDS, HEADLINES, SHARES, EvalSettings

__all__ = ["ArmSummary", "Change", "Stat", "Summary", "energy_distance", "paired_change", "summarize",
           "trajectory_distance", "worst_values"]


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
