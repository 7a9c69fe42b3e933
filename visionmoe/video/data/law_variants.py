"""Lawful and unlawful clips under the same captions: the data of a toy world whose base can get
physics wrong, in four categories with different laws, mapped onto the adapter's taxonomy.

========== ============ ========================================== ===========================================
scenario   category     law (lawful)                               unlawful variants (same caption)
========== ============ ========================================== ===========================================
projectile rigid        one downward acceleration g > 0             g of the wrong sign, or 0-30% of it
bounce     elastic      g > 0, restitution e in [0.55, 0.85]        e in [1.1, 1.4]: each bounce higher
sliding    rigid        constant deceleration mu g > 0, then rest   no friction, or speeding up
stream     liquid       particles leave a spout and fall under g    particles drift up or float
========== ============ ========================================== ===========================================

Every clip is a :class:`visionmoe.video.data.synthetic.Clip` whose ``params`` hold the law's
parameters (``g``, ``restitution``, ``friction_decel``) and ``lawful`` (1.0 or 0.0); a clip is
a pure function of ``(scenario, seed, lawful)``, and the lawful and unlawful clips of one seed
share the object, its colour, its start and the caption. Units: pixels and frames, +y down.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from .scenes import COLORS, _a, _ballistic, _Canvas, _pick_color, _render_balls, _to_u8
from .synthetic import Clip, check_num_frames

__all__ = ["LAW_SCENARIOS", "generate_law_clip"]

#: scenario -> the taxonomy's category of its law
LAW_SCENARIOS: Dict[str, str] = {"projectile": "rigid", "bounce": "elastic", "sliding": "rigid", "stream": "liquid"}


def _wrong_gravity(rng, g: float) -> float:
    return g * (rng.uniform(-1.0, -0.4) if rng.random() < 0.5 else rng.uniform(0.0, 0.3))


def _projectile(rng, bad, h, w, F):
    canvas, r, color = _Canvas(h, w, rng), rng.uniform(3.0, 4.5), _pick_color(rng)
    g = rng.uniform(0.3, 0.5)
    floor_y = h - 5.0
    x0, y0 = rng.uniform(r + 2, 0.25 * w), rng.uniform(0.45, 0.6) * h
    vx, vy = rng.uniform(1.2, 2.0), -0.5 * g * rng.uniform(0.7, 1.0) * (F - 1)
    g_used = _wrong_gravity(rng, g) if bad else g
    pos, vel, contacts = _ballistic(rng, h, w, F, x=x0, y=y0, vx=vx, vy=vy, g=g_used, r=r, e=0.5, floor_y=floor_y)
    frames = _render_balls(canvas, pos[:, None], [r], [color], floor_y)
    return frames, f"{_a(color)} ball is thrown and flies through the air in a parabolic arc", \
        {"g": g_used}, {"positions": pos[:, None], "velocities": vel[:, None], "contacts": contacts}


def _bounce(rng, bad, h, w, F):
    canvas, r, color = _Canvas(h, w, rng), rng.uniform(3.5, 5.5), _pick_color(rng)
    g, floor_y = rng.uniform(0.5, 0.8), h - 6.0
    e = rng.uniform(1.1, 1.4) if bad else rng.uniform(0.55, 0.85)
    x0, y0 = rng.uniform(r + 6, w - r - 6), rng.uniform(0.35, 0.55) * h
    pos, vel, contacts = _ballistic(rng, h, w, F, x=x0, y=y0, vx=rng.uniform(-0.4, 0.4), vy=0.0, g=g, r=r, e=e,
                                    floor_y=floor_y)
    pos[:, 1] = np.maximum(pos[:, 1], r + 1)  # an unlawful ball may leave the top: keep it in view
    frames = _render_balls(canvas, pos[:, None], [r], [color], floor_y)
    return frames, f"{_a(color)} ball falls and bounces on the floor, each bounce lower than the last", \
        {"g": g, "restitution": e}, {"positions": pos[:, None], "velocities": vel[:, None], "contacts": contacts}


def _sliding(rng, bad, h, w, F):
    canvas, size, color = _Canvas(h, w, rng), rng.uniform(9.0, 12.0), _pick_color(rng)
    floor_y, v0 = h - 10.0, rng.uniform(2.4, 3.2)
    a = v0 / (rng.uniform(0.6, 0.9) * (F - 1))  # friction: stops within the clip
    x = rng.uniform(1.0, 3.0)
    if bad:
        a = -rng.uniform(0.0, 0.08) if rng.random() < 0.5 else 0.0  # speeding up, or no friction
        v0 = 0.6 * v0
    v = v0
    pos = np.zeros((F, 1, 2))
    frames = []
    for f in range(F):
        pos[f, 0] = (x + size / 2, floor_y - size / 2)
        img = canvas.new()
        canvas.floor(img, floor_y)
        canvas.box(img, x, floor_y - size, size, COLORS[color])
        frames.append(_to_u8(img))
        v_new = max(v - a, 0.0)
        x, v = x + 0.5 * (v + v_new), v_new
    return np.stack(frames), f"{_a(color)} box slides across the floor and slows to a stop because of friction", \
        {"friction_decel": a}, {"positions": pos}


def _stream(rng, bad, h, w, F):
    canvas, color = _Canvas(h, w, rng), (60, 130, 235)
    g = rng.uniform(0.25, 0.4)
    spout = np.array([rng.uniform(0.15, 0.3) * w, 0.35 * h])
    rate, n = int(rng.integers(3, 5)), 0
    spread = rng.normal(0, 0.4, (rate * F, 2)), rng.uniform(1.0, 1.6, rate * F), rng.uniform(-0.3, 0.3, rate * F)
    g_used = _wrong_gravity(rng, g) if bad else g
    pos = np.full((rate * F, 2), np.nan)
    vel = np.zeros((rate * F, 2))
    out = np.full((F, rate * F, 2), np.nan)
    frames = []
    for f in range(F):
        for _ in range(rate):  # new particles leave the spout with a small spread
            pos[n] = spout + spread[0][n]
            vel[n] = (spread[1][n], spread[2][n])
            n += 1
        out[f] = pos
        img = canvas.new()
        canvas.rect(img, spout[0] - 8, spout[1] - 2, spout[0], spout[1] + 2, (170, 170, 180))
        for p in pos[:n]:
            if 0 <= p[0] < w and 0 <= p[1] < h:
                canvas.ball(img, p[0], p[1], 1.4, color, band=False)
        frames.append(_to_u8(img))
        vel[:n, 1] += g_used
        pos[:n] += vel[:n] - np.array([0.0, 0.5 * g_used])
    return np.stack(frames), "water pours from a spout in a stream", {"g": g_used}, {"particles": out.astype(np.float32)}


_LAW_GENERATORS = {"projectile": _projectile, "bounce": _bounce, "sliding": _sliding, "stream": _stream}


def generate_law_clip(scenario: str, seed: int, lawful: bool = True, *, height: int = 64, width: int = 64,
                      num_frames: int = 17) -> Clip:
    """The lawful or an unlawful clip of ``scenario`` (:data:`LAW_SCENARIOS`) for ``seed``: both
    share the object, its start and the caption (see the module docstring)."""
    if scenario not in _LAW_GENERATORS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {sorted(_LAW_GENERATORS)}")
    check_num_frames(num_frames)
    rng = np.random.default_rng([seed, 7])  # the same draws for both variants up to the law
    frames, caption, params, traj = _LAW_GENERATORS[scenario](rng, not lawful, height, width, num_frames)
    params = {**params, "lawful": float(lawful)}
    return Clip(frames, caption, scenario, [LAW_SCENARIOS[scenario]], params, traj, seed)


def law_pair(scenario: str, seed: int, **kw) -> Tuple[Clip, Clip]:
    """(lawful, unlawful) clips of one seed."""
    return generate_law_clip(scenario, seed, True, **kw), generate_law_clip(scenario, seed, False, **kw)
