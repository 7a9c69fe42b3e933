"""The scenarios of the procedural physics clips (:mod:`.synthetic`), each simulated in pixel units
and drawn with anti-aliased primitives on a :class:`_Canvas`: free fall, bounce, projectile,
collision, sliding, pendulum, pouring (particle liquid), smoke (grid advection-diffusion) and
melting (heat diffusion with a phase change). ``_GENERATORS`` maps a scenario's name to its
function ``(rng, height, width, num_frames) -> (frames, caption, params, trajectories)``."""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np

COLORS: Dict[str, tuple] = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 90, 230),
    "yellow": (235, 210, 40),
    "orange": (240, 130, 30),
    "purple": (150, 60, 200),
    "white": (235, 235, 235),
}


class _Canvas:
    def __init__(self, h: int, w: int, rng: np.random.Generator, top=(28, 32, 44), bottom=(52, 56, 66)):
        self.h, self.w = h, w
        ys = (np.arange(h, dtype=np.float32) + 0.5)[:, None]
        xs = (np.arange(w, dtype=np.float32) + 0.5)[None, :]
        self.yy = np.broadcast_to(ys, (h, w))
        self.xx = np.broadcast_to(xs, (h, w))
        t = (ys / h)[..., None]
        bg = (1 - t) * np.asarray(top, np.float32) + t * np.asarray(bottom, np.float32)
        bg = np.broadcast_to(bg, (h, w, 3)).copy()
        bg += rng.normal(0.0, 2.5, size=(h, w, 1)).astype(np.float32)  # static texture
        self.background = bg

    def new(self) -> np.ndarray:
        return self.background.copy()

    @staticmethod
    def blend(img, cover, color):
        cover = np.clip(cover, 0.0, 1.0)[..., None]
        img *= 1.0 - cover
        img += cover * np.asarray(color, np.float32)

    def rect(self, img, x0, y0, x1, y1, color, alpha=1.0):
        cx = np.clip(np.minimum(self.xx - x0 + 0.5, x1 - self.xx + 0.5), 0, 1)
        cy = np.clip(np.minimum(self.yy - y0 + 0.5, y1 - self.yy + 0.5), 0, 1)
        self.blend(img, cx * cy * alpha, color)

    def ball(self, img, cx, cy, r, color, band=True):
        d = np.sqrt((self.xx - cx) ** 2 + (self.yy - cy) ** 2)
        cover = np.clip(r - d + 0.5, 0.0, 1.0)
        col = np.asarray(color, np.float32)
        # shading: brighter towards the upper-left, and a lighter band as a trackable mark
        shade = 1.0 - 0.35 * np.clip(((self.xx - cx + 0.35 * r) ** 2 + (self.yy - cy + 0.35 * r) ** 2) / (r * r), 0, 1.5)
        pix = col[None, None, :] * shade[..., None]
        if band:
            inband = (np.abs(self.xx - cx) < 0.3 * r).astype(np.float32)
            pix = pix * (1 - 0.45 * inband[..., None]) + 0.45 * inband[..., None] * 255.0
        cover = cover[..., None]
        img *= 1.0 - cover
        img += cover * pix

    def box(self, img, x0, y0, size, color):
        x1, y1 = x0 + size, y0 + size
        self.rect(img, x0, y0, x1, y1, color)
        # a darker cross as a trackable texture
        dark = tuple(0.45 * c for c in color)
        m = size / 2
        self.rect(img, x0 + m - 1, y0 + 1.5, x0 + m + 1, y1 - 1.5, dark)
        self.rect(img, x0 + 1.5, y0 + m - 1, x1 - 1.5, y0 + m + 1, dark)

    def line(self, img, x0, y0, x1, y1, color, width=1.0):
        px, py = self.xx - x0, self.yy - y0
        dx, dy = x1 - x0, y1 - y0
        ll = max(dx * dx + dy * dy, 1e-9)
        t = np.clip((px * dx + py * dy) / ll, 0, 1)
        d = np.sqrt((px - t * dx) ** 2 + (py - t * dy) ** 2)
        self.blend(img, width / 2 + 0.5 - d, color)

    def floor(self, img, y, color=(95, 85, 75)):
        self.rect(img, -1, y, self.w + 1, self.h + 1, color)


def _to_u8(img: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _pick_color(rng, exclude=()):
    names = [c for c in COLORS if c not in exclude and c != "white"]
    return names[int(rng.integers(len(names)))]


_SUB = 16  # integration sub-steps per frame


def _ballistic(rng, h, w, F, *, x, y, vx, vy, g, r, e, floor_y, walls=True):
    """Point-mass ball with gravity, floor restitution ``e`` and elastic side walls."""
    pos = np.zeros((F, 2), np.float64)
    vel = np.zeros((F, 2), np.float64)
    contacts = []
    dt = 1.0 / _SUB
    for f in range(F):
        pos[f] = (x, y)
        vel[f] = (vx, vy)
        for s in range(_SUB):
            vy_new = vy + g * dt
            y += 0.5 * (vy + vy_new) * dt
            vy = vy_new
            x += vx * dt
            if y + r > floor_y and vy > 0:
                y = 2 * (floor_y - r) - y
                vy = -e * vy
                contacts.append(f + (s + 1) / _SUB)
            if walls:
                if x - r < 0 and vx < 0:
                    x, vx = 2 * r - x, -vx
                if x + r > w and vx > 0:
                    x, vx = 2 * (w - r) - x, -vx
    return pos, vel, np.asarray(contacts, np.float64)


def _render_balls(canvas, positions, radii, colors, floor_y=None):
    frames = []
    for f in range(positions.shape[0]):
        img = canvas.new()
        if floor_y is not None:
            canvas.floor(img, floor_y)
        for k in range(positions.shape[1]):
            canvas.ball(img, positions[f, k, 0], positions[f, k, 1], radii[k], COLORS[colors[k]])
        frames.append(_to_u8(img))
    return np.stack(frames)


def _free_fall(rng, h, w, F):
    canvas = _Canvas(h, w, rng)
    r = rng.uniform(3.5, 5.5)
    floor_y = h - 4.0
    y0 = rng.uniform(r + 2, r + 6)
    # the ball must not reach the floor within the clip: pure free fall
    g_max = 2 * (floor_y - r - y0 - 1) / (F - 1) ** 2
    g = rng.uniform(0.55, 0.95) * g_max
    x0 = rng.uniform(r + 6, w - r - 6)
    pos, vel, contacts = _ballistic(rng, h, w, F, x=x0, y=y0, vx=rng.uniform(-0.15, 0.15), vy=0.0,
                                    g=g, r=r, e=0.0, floor_y=floor_y)
    color = _pick_color(rng)
    frames = _render_balls(canvas, pos[:, None], [r], [color], floor_y)
    cap = f"{_a(color)} ball is dropped and falls straight down"
    return frames, cap, {"g": g, "radius": r}, {"positions": pos[:, None], "velocities": vel[:, None],
                                                   "contacts": contacts}


def _bounce(rng, h, w, F):
    canvas = _Canvas(h, w, rng)
    r = rng.uniform(3.5, 6.0)
    floor_y = h - 6.0
    y0 = rng.uniform(r + 2, 0.3 * h)
    g = rng.uniform(0.5, 0.8)
    e = rng.uniform(0.55, 0.85)
    x0 = rng.uniform(r + 6, w - r - 6)
    pos, vel, contacts = _ballistic(rng, h, w, F, x=x0, y=y0, vx=rng.uniform(-0.4, 0.4), vy=rng.uniform(0, 0.5),
                                    g=g, r=r, e=e, floor_y=floor_y)
    color = _pick_color(rng)
    frames = _render_balls(canvas, pos[:, None], [r], [color], floor_y)
    cap = f"{_a(color)} ball falls and bounces on the floor, each bounce lower than the last"
    return frames, cap, {"g": g, "restitution": e, "radius": r, "floor_y": floor_y}, {
        "positions": pos[:, None], "velocities": vel[:, None], "contacts": contacts}


def _projectile(rng, h, w, F):
    canvas = _Canvas(h, w, rng)
    r = rng.uniform(3.0, 4.5)
    floor_y = h - 5.0
    g = rng.uniform(0.45, 0.6)
    # flight time ~ the clip length: a high arc that may land near the end
    t_flight = rng.uniform(0.9, 1.3) * (F - 1)
    vy = -0.5 * g * t_flight
    x0 = rng.uniform(r + 2, 0.25 * w)
    vx = rng.uniform(0.6, 0.9) * (w - 2 * r - x0) / (F - 1)
    y0 = floor_y - r - 0.5
    pos, vel, contacts = _ballistic(rng, h, w, F, x=x0, y=y0, vx=vx, vy=vy, g=g, r=r, e=0.5,
                                    floor_y=floor_y)
    color = _pick_color(rng)
    frames = _render_balls(canvas, pos[:, None], [r], [color], floor_y)
    cap = f"{_a(color)} ball is thrown and flies through the air in a parabolic arc"
    return frames, cap, {"g": g, "radius": r, "vx": vx, "vy0": vy}, {
        "positions": pos[:, None], "velocities": vel[:, None], "contacts": contacts}


def _collision(rng, h, w, F):
    canvas = _Canvas(h, w, rng)
    ra, rb = rng.uniform(3.5, 6.0), rng.uniform(3.5, 6.0)
    floor_y = h - 10.0
    ya, yb = floor_y - ra, floor_y - rb
    xa, xb = rng.uniform(ra + 1, 0.3 * w), rng.uniform(0.55 * w, w - rb - 2)
    gap = xb - xa - ra - rb
    va = rng.uniform(1.0, 1.4) * gap / (0.5 * (F - 1))
    vb = rng.uniform(-0.6, 0.2)
    e = rng.uniform(0.6, 1.0)
    ma, mb = ra**2, rb**2
    pos = np.zeros((F, 2, 2))
    vel = np.zeros((F, 2, 2))
    contacts = []
    dt = 1.0 / _SUB
    for f in range(F):
        pos[f] = [(xa, ya), (xb, yb)]
        vel[f] = [(va, 0), (vb, 0)]
        for s in range(_SUB):
            xa += va * dt
            xb += vb * dt
            if xb - xa < ra + rb and va > vb:
                # 1-D collision with restitution e, momentum conserved
                p = ma * va + mb * vb
                va, vb = (p - mb * e * (va - vb)) / (ma + mb), (p + ma * e * (va - vb)) / (ma + mb)
                contacts.append(f + (s + 1) / _SUB)
            for which in (0, 1):
                x, v, r = (xa, va, ra) if which == 0 else (xb, vb, rb)
                if (x - r < 0 and v < 0) or (x + r > w and v > 0):
                    v = -v
                if which == 0:
                    va = v
                else:
                    vb = v
    ca = _pick_color(rng)
    cb = _pick_color(rng, exclude=(ca,))
    frames = _render_balls(canvas, pos, [ra, rb], [ca, cb], floor_y)
    cap = f"{_a(ca)} ball rolls into {_a(cb)} ball and they collide"
    return frames, cap, {"restitution": e, "mass_a": ma, "mass_b": mb}, {
        "positions": pos, "velocities": vel, "contacts": np.asarray(contacts), "momentum": ma * vel[:, 0, 0] + mb * vel[:, 1, 0]}


def _sliding(rng, h, w, F):
    canvas = _Canvas(h, w, rng)
    size = rng.uniform(9.0, 13.0)
    floor_y = h - 10.0
    v0 = rng.uniform(2.6, 3.6)
    # deceleration mu*g: stops within the clip
    stop_t = rng.uniform(0.6, 0.9) * (F - 1)
    a = v0 / stop_t
    x0 = rng.uniform(1.0, 4.0)
    x, v = x0, v0
    pos = np.zeros((F, 1, 2))
    vel = np.zeros((F, 1, 2))
    dt = 1.0 / _SUB
    for f in range(F):
        pos[f, 0] = (x + size / 2, floor_y - size / 2)
        vel[f, 0] = (v, 0)
        for _ in range(_SUB):
            v_new = max(v - a * dt, 0.0)
            x += 0.5 * (v + v_new) * dt
            v = v_new
    color = _pick_color(rng)
    frames = []
    for f in range(F):
        img = canvas.new()
        canvas.floor(img, floor_y)
        canvas.box(img, pos[f, 0, 0] - size / 2, floor_y - size, size, COLORS[color])
        frames.append(_to_u8(img))
    cap = f"{_a(color)} box slides across the floor and slows to a stop because of friction"
    return np.stack(frames), cap, {"friction_decel": a, "v0": v0, "size": size}, {
        "positions": pos, "velocities": vel}


def _pendulum(rng, h, w, F):
    canvas = _Canvas(h, w, rng)
    px, py = w / 2 + rng.uniform(-4, 4), 4.0
    L = rng.uniform(0.45, 0.7) * h
    period = rng.uniform(16.0, 26.0)
    k = (2 * np.pi / period) ** 2  # g / L
    th, om = rng.uniform(0.5, 0.9) * rng.choice([-1, 1]), 0.0
    r = rng.uniform(3.5, 5.0)
    pos = np.zeros((F, 1, 2))
    angle = np.zeros(F)
    dt = 1.0 / _SUB

    def acc(t):
        return -k * np.sin(t)

    for f in range(F):
        angle[f] = th
        pos[f, 0] = (px + L * np.sin(th), py + L * np.cos(th))
        for _ in range(_SUB):  # RK4
            k1t, k1o = om, acc(th)
            k2t, k2o = om + 0.5 * dt * k1o, acc(th + 0.5 * dt * k1t)
            k3t, k3o = om + 0.5 * dt * k2o, acc(th + 0.5 * dt * k2t)
            k4t, k4o = om + dt * k3o, acc(th + dt * k3t)
            th += dt / 6 * (k1t + 2 * k2t + 2 * k3t + k4t)
            om += dt / 6 * (k1o + 2 * k2o + 2 * k3o + k4o)
    color = _pick_color(rng)
    frames = []
    for f in range(F):
        img = canvas.new()
        canvas.rect(img, px - 6, 0, px + 6, py, (120, 120, 130))
        canvas.line(img, px, py, pos[f, 0, 0], pos[f, 0, 1], (200, 200, 200), 1.0)
        canvas.ball(img, pos[f, 0, 0], pos[f, 0, 1], r, COLORS[color])
        frames.append(_to_u8(img))
    cap = f"{_a(color)} pendulum swings back and forth on a string"
    return np.stack(frames), cap, {"g_over_l": k, "length": L, "period": period}, {
        "positions": pos, "angle": angle}


def _pouring(rng, h, w, F):
    canvas = _Canvas(h, w, rng)
    g = 0.4
    cx0, cx1 = 0.35 * w, 0.9 * w  # container walls
    floor_y = h - 4.0
    spout = np.array([0.2 * w, 0.2 * h])
    rate = int(rng.integers(6, 9))  # particles per frame
    n_max = rate * F
    pos = np.full((n_max, 2), np.nan)
    vel = np.zeros((n_max, 2))
    hrad = 1.6  # interaction radius
    out = np.full((F, n_max, 2), np.nan, np.float32)
    n = 0
    sub = 6
    dt = 1.0 / sub
    color = (60, 130, 235)
    frames = []
    for f in range(F):
        out[f] = pos
        img = canvas.new()
        canvas.rect(img, cx0 - 1.5, 0.45 * h, cx0, floor_y, (170, 170, 180))
        canvas.rect(img, cx1, 0.45 * h, cx1 + 1.5, floor_y, (170, 170, 180))
        canvas.rect(img, cx0 - 1.5, floor_y, cx1 + 1.5, floor_y + 1.5, (170, 170, 180))
        canvas.rect(img, spout[0] - 8, spout[1] - 2, spout[0] + 1, spout[1] + 2, (170, 170, 180))
        live = pos[:n]
        if n:
            cover = np.zeros((h, w), np.float32)
            for p in live:
                d2 = (canvas.xx - p[0]) ** 2 + (canvas.yy - p[1]) ** 2
                cover = np.maximum(cover, np.clip(1.5 - np.sqrt(d2) + 0.5, 0, 1))
            canvas.blend(img, cover, color)
        frames.append(_to_u8(img))
        # emit new particles at the spout
        k = min(rate, n_max - n)
        # a jet: the frame's particles spread along one frame of travel
        vx = rng.uniform(1.8, 2.1, k)
        u = (np.arange(k) + rng.uniform(0, 1, k)) / k
        pos[n:n + k] = spout + np.stack([vx * u, 0.5 * g * u**2 + rng.uniform(-0.4, 0.4, k)], 1)
        vel[n:n + k] = np.stack([vx, g * u], 1)
        n += k
        for _ in range(sub):
            p, v = pos[:n], vel[:n]
            v[:, 1] += g * dt
            # pairwise contact (pressure proxy): approaching neighbours lose their relative
            # normal velocity, deep overlaps are pushed apart, so the pile stays incompressible
            d = p[:, None, :] - p[None, :, :]
            dist = np.sqrt((d**2).sum(-1)) + np.eye(n) * 1e3
            nrm = d / dist[..., None]
            near = dist < hrad
            vn = ((v[:, None, :] - v[None, :, :]) * nrm).sum(-1)
            imp = np.where(near & (vn < 0), vn, 0.0)
            cnt = np.maximum(near.sum(1, keepdims=True), 1)
            v -= 0.5 * (imp[..., None] * nrm).sum(1) / cnt
            deep = np.clip(0.8 * hrad - dist, 0, None)
            v += 0.3 * dt * (deep[..., None] * nrm).sum(1)
            v *= 0.995
            p += v * dt
            # container walls and floor, inelastic
            inside = p[:, 0] > cx0 - 2
            hit = inside & (p[:, 1] > floor_y - 1)
            p[hit, 1] = floor_y - 1
            v[hit, 1] *= -0.1
            v[hit, 0] *= 0.8
            wl = (p[:, 1] > 0.45 * h) & (p[:, 0] < cx0 + 1) & (p[:, 0] > cx0 - 3)
            p[wl, 0] = cx0 + 1
            v[wl, 0] = np.abs(v[wl, 0]) * 0.3
            wr = (p[:, 1] > 0.45 * h) & (p[:, 0] > cx1 - 1)
            p[wr, 0] = cx1 - 1
            v[wr, 0] = -np.abs(v[wr, 0]) * 0.3
            lo = p[:, 1] > floor_y - 1
            p[lo, 1] = floor_y - 1
            v[lo, 1] = np.minimum(v[lo, 1], 0)
    inside = (out[..., 0] > cx0) & (out[..., 1] > 0.45 * h)
    fill = np.nan_to_num(inside).sum(1).astype(np.float32)
    cap = "blue water is poured from a spout into a glass container and fills it up"
    return np.stack(frames), cap, {"g": g, "rate": rate}, {"particles": out, "fill_count": fill}


def _advect(field, u, v):
    import cv2

    h, w = field.shape
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    return cv2.remap(field.astype(np.float32), (xs - u).astype(np.float32), (ys - v).astype(np.float32), cv2.INTER_LINEAR,
                     borderMode=cv2.BORDER_CONSTANT, borderValue=0)


def _smoke(rng, h, w, F):
    canvas = _Canvas(h, w, rng, top=(24, 22, 30), bottom=(40, 34, 34))
    rise = rng.uniform(0.9, 1.6)
    kappa = rng.uniform(0.12, 0.22)
    # divergence-free swirl from a stream function psi(x, y)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    amp = rng.uniform(0.3, 0.7)
    kx, ky = rng.uniform(1.0, 2.5) * 2 * np.pi / w, rng.uniform(1.0, 2.0) * 2 * np.pi / h
    ph = rng.uniform(0, 2 * np.pi)
    # u = dpsi/dy, v = -dpsi/dx with psi = amp/(k) sin(kx x + ph) sin(ky y)
    u = amp * np.sin(kx * xs + ph) * np.cos(ky * ys) * (ky / np.hypot(kx, ky))
    v = -amp * np.cos(kx * xs + ph) * np.sin(ky * ys) * (kx / np.hypot(kx, ky)) - rise
    sx = rng.uniform(0.35, 0.65) * w
    src = np.exp(-(((xs - sx) / 4.0) ** 2 + ((ys - (h - 6)) / 2.0) ** 2)).astype(np.float32)
    rho = np.zeros((h, w), np.float32)
    shade = np.asarray((215, 215, 220), np.float32) * rng.uniform(0.8, 1.0)
    frames, mass, cen = [], [], []
    sub = 2
    for f in range(F):
        img = canvas.new()
        canvas.rect(img, sx - 5, h - 4, sx + 5, h, (230, 110, 30))  # the source
        canvas.blend(img, np.clip(rho, 0, 1) * 0.9, shade)
        frames.append(_to_u8(img))
        m = rho.sum()
        mass.append(m)
        cen.append(((rho * xs).sum() / max(m, 1e-6), (rho * ys).sum() / max(m, 1e-6)))
        for _ in range(sub):
            rho = _advect(rho, u / sub, v / sub)
            lap = (np.roll(rho, 1, 0) + np.roll(rho, -1, 0) + np.roll(rho, 1, 1) + np.roll(rho, -1, 1) - 4 * rho)
            rho = rho + kappa / sub * lap
            rho = rho + 0.5 / sub * src
            rho[0, :] = rho[-1, :] = 0
            rho[:, 0] = rho[:, -1] = 0
    cap = "gray smoke rises from a small fire and spreads as it drifts upward"
    return np.stack(frames), cap, {"rise_speed": rise, "diffusivity": kappa, "swirl": amp}, {
        "mass": np.asarray(mass, np.float32), "centroid": np.asarray(cen, np.float32)}


_MATERIALS = {"ice": ((200, 235, 250), (70, 130, 230)), "butter": ((245, 225, 120), (215, 160, 40)),
              "wax": ((240, 240, 230), (200, 150, 110)), "chocolate": ((125, 75, 40), (70, 35, 15))}


def _melting(rng, h, w, F):
    canvas = _Canvas(h, w, rng)
    material = list(_MATERIALS)[int(rng.integers(len(_MATERIALS)))]
    solid_col, liquid_col = _MATERIALS[material]
    plate_y = h - 8
    bw, bh = int(rng.integers(14, 22)), int(rng.integers(12, 18))
    bx = int(rng.integers(w // 2 - bw // 2 - 6, w // 2 - bw // 2 + 6))
    solid = np.zeros((h, w), bool)
    solid[plate_y - bh:plate_y, bx:bx + bw] = True
    liquid = np.zeros((h, w), bool)
    T = np.where(solid, -1.0, 0.6).astype(np.float32)  # melting point 0
    latent = np.zeros((h, w), np.float32)
    L = rng.uniform(0.6, 1.0)  # latent heat per cell
    alpha = 0.2
    T_hot = rng.uniform(4.0, 6.0)
    frames, solid_frac, liq_area, t_mean = [], [], [], []
    n0 = solid.sum()
    for f in range(F):
        img = canvas.new()
        canvas.rect(img, 0, plate_y, w, h, (180, 70, 40))
        canvas.blend(img, liquid.astype(np.float32) * 0.85, liquid_col)
        canvas.blend(img, solid.astype(np.float32), solid_col)
        frames.append(_to_u8(img))
        solid_frac.append(solid.sum() / n0)
        liq_area.append(liquid.sum())
        t_mean.append(float(T[solid].mean()) if solid.any() else 0.0)
        for _ in range(6):
            # heat equation, plate row held hot, air warm
            T[plate_y:, :] = T_hot
            lap = np.roll(T, 1, 0) + np.roll(T, -1, 0) + np.roll(T, 1, 1) + np.roll(T, -1, 1) - 4 * T
            T = T + alpha * lap
            air = ~(solid | liquid)
            air[plate_y:] = False
            T[air] = 0.8 * T[air] + 0.2 * 1.5
            # phase change: a solid cell above melting point absorbs latent heat, then melts
            warm = solid & (T > 0)
            latent[warm] += T[warm]
            T[warm] = 0.0
            melt = solid & (latent >= L)
            solid &= ~melt
            liquid |= melt
        # molten cells flow: fall, else spread sideways (cellular automaton on the plate)
        for _ in range(2):
            occ = solid | liquid
            ys, xs = np.nonzero(liquid)
            order = np.argsort(-ys)
            for y, x in zip(ys[order], xs[order]):
                if y + 1 < plate_y and not occ[y + 1, x]:
                    liquid[y, x], liquid[y + 1, x] = False, True
                    occ[y, x], occ[y + 1, x] = False, True
                    continue
                for dx in (rng.choice([-1, 1]),) * 1:
                    for d in (dx, -dx):
                        nx = x + d
                        if 0 <= nx < w and y + 1 < plate_y and not occ[y + 1, nx]:
                            liquid[y, x], liquid[y + 1, nx] = False, True
                            occ[y, x], occ[y + 1, nx] = False, True
                            break
                        if 0 <= nx < w and y + 1 >= plate_y and not occ[y, nx] and rng.random() < 0.5:
                            liquid[y, x], liquid[y, nx] = False, True
                            occ[y, x], occ[y, nx] = False, True
                            break
    cap = f"a block of {material} melts on a hot plate into a spreading puddle"
    return np.stack(frames), cap, {"latent_heat": L, "plate_temperature": T_hot, "material_id": float(list(_MATERIALS).index(material))}, {
        "solid_fraction": np.asarray(solid_frac, np.float32), "liquid_area": np.asarray(liq_area, np.float32),
        "solid_temperature": np.asarray(t_mean, np.float32)}


_GENERATORS: Dict[str, Callable] = {
    "free_fall": _free_fall,
    "bounce": _bounce,
    "projectile": _projectile,
    "collision": _collision,
    "sliding": _sliding,
    "pendulum": _pendulum,
    "pouring": _pouring,
    "smoke": _smoke,
    "melting": _melting,
}
