"""Fit a fresh float 3DGS to renders of a given scene: un-quantised test scenes on demand.

Most shared scenes were decoded from lossy formats (their attributes sit on quantisation
grids); a codec tuned on them can lean on that grid. This script makes float-trained scenes
from any scene with visionmoe's own differentiable rasteriser (``visionmoe.ops.rasterize``,
through ``visionmoe.splat.render``):

1. initialisation: ``--gaussians`` points drawn at random pixels of the source's renders from
   views over the whole sphere, lifted to 3D by the rendered depth (as SfM points would be), with
   a few percent drawn uniformly in the scene's bounding sphere; colours from those pixels,
   scales from the distances to the 3 nearest points, random rotations, opacity 0.1;
2. training: Adam on L1 against the source's renders from fresh random cameras every step,
   directions over the whole sphere, distances 0.6-1.4x the orbit distance (the views never
   repeat; the second half at twice the size); Gaussians that went transparent are moved onto
   opaque ones (MCMC-style relocation) at a few points, so the fixed count is used;
3. output: a float32 INRIA .ply (values on no grid), its PSNR against the source on 16
   held-out views (``visionmoe.splat.evaluation.heldout_cameras``), and with ``--png`` a strip of
   source/fitted renders to look at.

    python scripts/make_float_scenes.py /tmp/scenes/plant.ply --out /tmp/float_scenes/plant_float.ply
    python scripts/make_float_scenes.py a.ply --gaussians 40000 --steps 1200 --size 160 --png
    python scripts/make_float_scenes.py a.ply --out b.ply --elevations=-30,60   # views in a capture's band only

CPU: about 0.3 s per step at 30k Gaussians, 2 views of 128 px, on 2 cores.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch


from visionmoe.splat.cameras import Cameras, frame_cameras, scene_frame, sphere_directions  # noqa: E402
from visionmoe.splat.evaluation import heldout_cameras, render_views, score_views  # noqa: E402
from visionmoe.splat.io import GaussianScene, read_ply, write_ply  # noqa: E402
from visionmoe.splat.render import render  # noqa: E402

SH_C0 = 0.28209479177387814
# Adam rates per parameter (3DGS's, raised for a short schedule; means per unit of scene size)
RATES = {"means": 1e-3, "quats": 2e-3, "log_scales": 1e-2, "opacity_logits": 5e-2, "sh_dc": 5e-3, "sh_rest": 5e-3 / 20}
SEED_OFFSET = 0x3DF17  # the cameras of this script never coincide with the evaluation's seeded ones


def random_cameras(frame, num: int, size: int, gen: torch.Generator, dist=(0.6, 1.4), elevations=(-90.0, 90.0)
                   ) -> Cameras:
    """``num`` cameras from uniformly random directions (area-uniform) over the band of
    ``elevations`` above the plane perpendicular to ``frame.up`` (the whole sphere by default)."""
    lo, hi = (math.sin(math.radians(e)) for e in elevations)
    h = lo + (hi - lo) * torch.rand(num, generator=gen, dtype=torch.float64)
    az = 2 * math.pi * torch.rand(num, generator=gen, dtype=torch.float64)
    e1 = frame.azimuth_origin - (frame.azimuth_origin @ frame.up) * frame.up
    e1 = e1 / e1.norm()
    e2 = torch.linalg.cross(frame.up, e1)
    r = (1 - h * h).clamp_min(0).sqrt()
    d = (r * az.cos())[:, None] * e1 + (r * az.sin())[:, None] * e2 + h[:, None] * frame.up
    k = dist[0] + (dist[1] - dist[0]) * torch.rand(num, generator=gen, dtype=torch.float64)
    return frame_cameras(frame, d, k, size, size)


def backproject(out, cams: Cameras, mask: torch.Tensor) -> torch.Tensor:
    """[M, 3] world points of the masked pixels of a render (expected depth)."""
    C, H, W = mask.shape
    v, u = torch.meshgrid(torch.arange(H, dtype=torch.float64) + 0.5, torch.arange(W, dtype=torch.float64) + 0.5,
                          indexing="ij")
    pts = []
    for c in range(C):
        m = mask[c]
        z = out.depth[c].double()[m]
        K = cams.Ks[c].double()
        xc = torch.stack([(u[m] - K[0, 2]) / K[0, 0] * z, (v[m] - K[1, 2]) / K[1, 1] * z, z], -1)
        V = cams.viewmats[c].double()
        pts.append((xc - V[:3, 3]) @ V[:3, :3])  # R^T (x - t), row form
    return torch.cat(pts)


def initialise(src: GaussianScene, frame, n: int, sh_degree: int, gen: torch.Generator, size: int = 128,
               uniform_share: float = 0.05) -> GaussianScene:
    import faiss  # a runtime dependency already (exact k-NN; scipy is not one)

    dirs = sphere_directions(48, seed=int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    cams = frame_cameras(frame, dirs, 1.0, size, size)
    pts, cols = [], []
    with torch.no_grad():
        for i in range(0, len(cams), 8):
            c = cams[list(range(i, min(i + 8, len(cams))))]
            out = render(src, c)
            mask = out.alpha > 0.5
            pts.append(backproject(out, c, mask))
            cols.append(out.colors.double()[mask])
    pts, cols = torch.cat(pts), torch.cat(cols)
    n_uni = int(round(n * uniform_share))
    pick = torch.randint(0, pts.shape[0], (n - n_uni,), generator=gen)
    means = pts[pick]
    rgb = cols[pick]
    u = torch.randn(n_uni, 3, generator=gen, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True) * torch.rand(n_uni, 1, generator=gen, dtype=torch.float64) ** (1 / 3)
    means = torch.cat([means, frame.centre + 1.5 * frame.size * u])
    rgb = torch.cat([rgb, torch.rand(n_uni, 3, generator=gen, dtype=torch.float64)])
    # jitter by about a pixel footprint at the init distance, so points off one pixel ray differ
    pix = frame.orbit_distance() / cams.Ks[0, 0, 0].item()
    means = means + torch.randn(means.shape, generator=gen, dtype=torch.float64) * pix
    x = np.ascontiguousarray(means.numpy(), dtype=np.float32)
    index = faiss.IndexFlatL2(3)
    index.add(x)
    d2, _ = index.search(x, 4)  # squared distances to the point itself and its 3 nearest neighbours
    nn = torch.from_numpy(np.sqrt(np.maximum(d2[:, 1:], 0.0)).astype(np.float64)).mean(1).clamp_min(1e-4 * frame.size)
    k = (sh_degree + 1) ** 2 - 1
    return GaussianScene(
        means=means.float(), quats=torch.randn(n, 4, generator=gen).float(),
        log_scales=nn.log().float()[:, None].repeat(1, 3),
        opacity_logits=torch.full((n,), math.log(0.1 / 0.9)),
        sh_dc=((rgb.clamp(0.02, 0.98) - 0.5) / SH_C0).float(), sh_rest=torch.zeros(n, k, 3),
    )


def relocate(params: dict, gen: torch.Generator, frame, threshold: float = 0.005) -> int:
    """Move Gaussians with opacity below ``threshold`` onto opaque ones (sampled by opacity),
    splitting the opacity of the source between the two (MCMC-3DGS style). Returns the count."""
    with torch.no_grad():
        op = torch.sigmoid(params["opacity_logits"])
        dead = op < threshold
        nd = int(dead.sum())
        if nd == 0 or nd == op.numel():
            return 0
        alive = (~dead).nonzero().squeeze(1)
        src = alive[torch.multinomial(op[alive], nd, replacement=True, generator=gen)]
        dst = dead.nonzero().squeeze(1)
        for k in params:
            params[k][dst] = params[k][src]
        # both halves: 1 - (1 - a')^2 = a  ->  a' = 1 - sqrt(1 - a)
        a = op[src].clamp(max=0.99)
        new = (1 - (1 - a).sqrt()).clamp(1e-4, 0.99)
        logit = torch.log(new / (1 - new))
        params["opacity_logits"][dst] = logit
        params["opacity_logits"][src] = logit
        params["log_scales"][dst] -= 0.1
        params["log_scales"][src] -= 0.1
        step = torch.exp(params["log_scales"][dst]).mean(-1, keepdim=True)
        params["means"][dst] += torch.randn(step.shape[0], 3, generator=gen) * step
    return nd


def make_optimizer(params: dict, size: float, lr_mult: float = 1.0):
    return torch.optim.Adam([{"params": [params[k]], "lr": r * lr_mult * (size if k == "means" else 1.0), "name": k}
                             for k, r in RATES.items()], eps=1e-15)


def fit(src: GaussianScene, *, gaussians: int, steps: int, size: int, views_per_step: int, sh_degree: int,
        seed: int, log_every: int = 50, history: list | None = None, elevations=(-90.0, 90.0)) -> GaussianScene:
    """The fitted scene; ``history`` (if given) receives the loss of every step. ``elevations``:
    the band of the training views (the whole sphere by default; a capture's band, e.g. -30..60,
    leaves what no view sees as loosely fitted as a real capture does)."""
    gen = torch.Generator().manual_seed(seed + SEED_OFFSET)
    frame = scene_frame(src)
    init = initialise(src, frame, gaussians, sh_degree, gen, size=size)
    params = {k: getattr(init, k).clone().requires_grad_(True) for k in RATES}
    opt = make_optimizer(params, frame.size)
    relocate_at = {int(steps * f) for f in (0.2, 0.4, 0.6)}
    src_sh = src.with_sh_degree(min(src.sh_degree, 3))
    t0 = time.perf_counter()
    running = None
    for step in range(steps):
        decay = 0.01 ** (step / max(1, steps - 1))  # means: exponential to 1% (3DGS)
        for g in opt.param_groups:
            base = RATES[g["name"]] * (frame.size if g["name"] == "means" else 1.0)
            g["lr"] = base * (decay if g["name"] == "means" else 0.3 + 0.7 * (1 - step / steps))
        # the second half at twice the size, one view per step (same pixel count): sharp detail
        late = step >= steps // 2
        num = max(1, views_per_step // 2) if late else views_per_step
        cams = random_cameras(frame, num, 2 * size if late else size, gen, elevations=elevations)
        with torch.no_grad():
            target = render(src_sh, cams).colors
        out = render(GaussianScene(**params), cams).colors
        loss = (out - target).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        lv = float(loss.detach())
        if history is not None:
            history.append(lv)
        running = lv if running is None else 0.95 * running + 0.05 * lv
        if step in relocate_at:
            moved = relocate(params, gen, frame)
            opt = make_optimizer(params, frame.size)
            if log_every:
                print(f"  step {step}: relocated {moved} transparent Gaussians")
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"  step {step:5d}/{steps}: L1 {running:.4f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    with torch.no_grad():
        q = params["quats"].detach()
        q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return GaussianScene(means=params["means"].detach().clone(), quats=q,
                             log_scales=params["log_scales"].detach().clone(),
                             opacity_logits=params["opacity_logits"].detach().clone(),
                             sh_dc=params["sh_dc"].detach().clone(), sh_rest=params["sh_rest"].detach().clone())


def save_png(path: Path, top: torch.Tensor, bottom: torch.Tensor) -> None:
    from PIL import Image

    row = lambda imgs: torch.cat(list(imgs), dim=1)  # noqa: E731
    grid = torch.cat([row(top), row(bottom)], dim=0).clamp(0, 1)
    Image.fromarray((grid.numpy() * 255 + 0.5).astype(np.uint8)).save(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="scene to imitate (INRIA-layout .ply)")
    ap.add_argument("--out", required=True, help="output .ply (float32)")
    ap.add_argument("--gaussians", type=int, default=30000, help="Gaussian count of the new scene (default 30000)")
    ap.add_argument("--steps", type=int, default=600, help="optimiser steps (default 600)")
    ap.add_argument("--size", type=int, default=128, help="training view size in pixels (default 128)")
    ap.add_argument("--views-per-step", type=int, default=2)
    ap.add_argument("--sh-degree", type=int, default=0, choices=range(4), help="SH degree of the new scene")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--elevations", default="-90,90",
                    help="band of training view elevations in degrees about the scene's up (-y), e.g. "
                         "--elevations=-30,60 to fit like a capture (default -90,90: the whole sphere)")
    ap.add_argument("--png", action="store_true", help="also write OUT.png: source (top) vs fitted (bottom)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    try:
        elevations = tuple(float(v) for v in args.elevations.split(","))
        if len(elevations) != 2 or not -90 <= elevations[0] < elevations[1] <= 90:
            raise ValueError
    except ValueError:
        print(f"error: --elevations must be LOW,HIGH with -90 <= LOW < HIGH <= 90, got {args.elevations!r}",
              file=sys.stderr)
        return 2
    src = read_ply(args.source, nonfinite="drop")
    print(f"{args.source}: {src.num_gaussians} Gaussians, SH{src.sh_degree}; fitting {args.gaussians} "
          f"(SH{args.sh_degree}) for {args.steps} steps of {args.views_per_step} views at {args.size} px")
    t = time.perf_counter()
    fitted = fit(src, gaussians=args.gaussians, steps=args.steps, size=args.size, views_per_step=args.views_per_step,
                 sh_degree=args.sh_degree, seed=args.seed, elevations=elevations)
    fit_s = time.perf_counter() - t
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_ply(fitted, out)
    cams = heldout_cameras(src, num_views=16, size=256)
    ref, img = render_views(src, cams), render_views(fitted, cams)
    sc = score_views(ref, img, "16 held-out views at 256 px")
    print(f"wrote {out}: {fitted.num_gaussians} Gaussians in {fit_s:.0f} s; vs source on {sc.label}: "
          f"PSNR {sc.psnr:.2f} dB, SSIM {sc.ssim:.4f}")
    if args.png:
        png = out.with_suffix(".png")
        save_png(png, ref[::4], img[::4])
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
