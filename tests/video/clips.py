"""Synthetic clips for the trajectory tools' domain: one ball falling on a parabola (their
assumption) and clips outside it (several balls, a panning photo, a textured static scene with
mild noise, nothing moving). Each is a pure function of its seed; uint8 ``[F, H, W, 3]``."""

import numpy as np

from visionmoe.video.data.synthetic import generate_clip

RED, GREEN = np.array([0.9, 0.2, 0.15]), np.array([0.3, 1.0, 0.3])


def textured_image(seed, height, width):
    """A photo-like texture: smooth colour blobs over fine grain, in [0, 1]."""
    import cv2

    rng = np.random.default_rng(seed)
    coarse = cv2.resize(rng.random((height // 8 + 1, width // 8 + 1, 3)).astype(np.float32), (width, height),
                        interpolation=cv2.INTER_CUBIC)
    fine = rng.normal(0, 0.05, (height, width, 1)).astype(np.float32)
    return np.clip(0.15 + 0.7 * coarse + fine, 0, 1)


def draw_disc(img, y, x, r, color):
    yy, xx = np.mgrid[0:img.shape[0], 0:img.shape[1]].astype(np.float64)
    a = np.clip(r + 0.5 - np.sqrt((yy - y) ** 2 + (xx - x) ** 2), 0, 1)[..., None]
    return img * (1 - a) + color * a


def to_u8(img):
    return np.clip(np.rint(np.asarray(img) * 255), 0, 255).astype(np.uint8)


def simulator_background(seed):
    return np.median(generate_clip("free_fall", seed).frames, 0).astype(np.float64) / 255


def falling_balls(seed=0, balls=1, frames=17, size=64, jitter=0.0, background=None):
    """``balls`` discs falling on parabolas (one every 20 px across), centres jittered by
    ``jitter`` px per frame; the truth ``(y, x)`` [balls, F] before the jitter."""
    rng = np.random.default_rng(seed)
    bg = simulator_background(seed) if background is None else background
    t = np.arange(frames, dtype=np.float64)
    ys, xs, out = [], [], []
    for k in range(balls):
        ys.append(6 + rng.uniform(0, 6) + rng.uniform(0.2, 0.5) * t + 0.5 * rng.uniform(0.12, 0.2) * t * t)
        xs.append(12 + 20 * k + rng.uniform(-0.3, 0.3) * t)
    ys, xs = np.array(ys), np.array(xs)
    jy, jx = rng.normal(0, jitter, ys.shape), rng.normal(0, jitter, xs.shape)
    for i in range(frames):
        img = bg.copy()
        for k in range(balls):
            img = draw_disc(img, ys[k, i] + jy[k, i], xs[k, i] + jx[k, i], 4.5, RED if k % 2 == 0 else GREEN)
        out.append(img)
    return to_u8(np.stack(out)), (ys, xs)


def panning_photo(seed=0, frames=17, size=64, speed=1.5):
    """A textured photo seen by a camera that pans ``speed`` px per frame."""
    big = textured_image(seed, size, size + int(np.ceil(speed * frames)) + 2)
    import cv2

    out = [cv2.warpAffine(big, np.float32([[1, 0, -speed * i], [0, 1, 0]]), (size, size), flags=cv2.INTER_LINEAR)
           for i in range(frames)]
    return to_u8(np.stack(out))


def noisy_static(seed=0, frames=17, size=64, sigma=3.0):
    """A textured static scene with sensor noise of ``sigma`` grey levels."""
    rng = np.random.default_rng(seed)
    img = textured_image(seed, size, size)
    return to_u8(img[None] + rng.normal(0, sigma / 255, (frames, size, size, 3)))


def still(seed=0, frames=17, size=64):
    """Nothing moves: the same textured frame repeated."""
    return to_u8(np.repeat(textured_image(seed, size, size)[None], frames, 0))
