#!/usr/bin/env python
"""Measure PILA on the shipped toy world model: base vs base+PILA vs scale-0 control.

    python scripts/eval_toy_world.py [--num 32] [--steps 20] [--scale 1.0] [--window 0 1]
        [--out out/toy_world_eval]

Each arm generates the same ``--num`` clips (prompts cycle through the 6 colours x {fall,
bounce} captions of the training world; noise seeds ``--seed-base + i`` were never used in
training) and scores them with the CPU physics proxies of ``visionmoe.video.metrics``:

- gravity fit of the ball's height track: RMS residual of the best parabola (px; lower =
  closer to constant-acceleration free fall between bounces), fraction judged physical;
- acceleration inconsistency (mean |jerk| of KLT tracks, px/frame^3; lower = smoother);
- frame quality: flicker of static pixels and the VAE round-trip error (MSE between a clip
  and its encode-decode through the model's own VAE: off-manifold frames score higher);
- colour: the share of clips whose moving object has the captioned colour.

A reference row scores the simulator's own clips (held-out simulation seeds). Means with
bootstrap 95% intervals (clips resampled), and paired relative changes vs the base arm.
Writes ``table.md``, ``results.json``, ``strip.png`` (rows: base / PILA per prompt, every
second frame) and ``side_by_side.mp4`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from visionmoe.video import metrics as M  # noqa: E402
from visionmoe.video.synthetic import COLORS, generate_clip, write_video  # noqa: E402
from visionmoe.video.toy_world import (TOY_WORLD_COLORS, TOY_WORLD_DEFAULTS, TOY_WORLD_PATH,  # noqa: E402
                                       load_toy_world, toy_world_prompt)

HEADLINE = [("gravity_residual_quadratic", "gravity-fit residual (px)", "lower"),
            ("accel_inconsistency", "accel. inconsistency (px/f^3)", "lower"),
            ("accel_inconsistency_klt", "of which KLT tracks", "lower"),
            ("accel_inconsistency_object", "of which object centroid", "lower"),
            ("gravity_physical", "judged physical (share)", "higher"),
            ("flicker", "flicker", "lower"),
            ("vae_roundtrip_mse", "VAE round-trip MSE", "lower"),
            ("color_ok", "captioned colour (share)", "higher"),
            ("motion", "motion (px/frame)", "context")]


def prompts_and_seeds(num: int, seed_base: int):
    out = []
    for i in range(num):
        color = TOY_WORLD_COLORS[i % len(TOY_WORLD_COLORS)]
        motion = ("bounce", "fall")[(i // len(TOY_WORLD_COLORS)) % 2]
        out.append((toy_world_prompt(color, motion), color, motion, seed_base + i))
    return out


def object_color(frames: np.ndarray) -> str | None:
    """Palette name of the moving object: per-pixel vote of the nearest palette hue among the
    saturated pixels that differ from the clip's temporal median (None: nothing moves)."""
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


def vae_roundtrip_mse(pipe, frames: np.ndarray) -> float:
    x = torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float().div(127.5).sub(1).to(pipe.vae.device)
    with torch.no_grad():
        rec = pipe.vae.decode(pipe.vae.encode(x).latent_dist.mean).sample
    return float((rec - x).pow(2).mean())


def score(pipe, frames: np.ndarray, color: str) -> dict:
    s = M.score_video(frames)
    s["vae_roundtrip_mse"] = vae_roundtrip_mse(pipe, frames)
    s["color_ok"] = float(object_color(frames) == color)
    s["gravity_physical"] = float(bool(s.get("gravity_physical", False)))
    return s


def bootstrap(values, n=2000, seed=0):
    v = np.asarray([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], np.float64)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan"), 0
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n, len(v)))].mean(1)
    return float(v.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)), len(v)


SHARES = ("gravity_physical", "color_ok")  # shares: changes in percentage points, not relative


def paired_change(base, arm, n=2000, seed=0, absolute=False):
    """Relative change of the mean (arm/base - 1), or the difference of the means when
    ``absolute``, with a paired bootstrap 95% interval."""
    pairs = np.asarray([(b, a) for b, a in zip(base, arm) if not (math.isnan(b) or math.isnan(a))], np.float64)
    if len(pairs) == 0 or (not absolute and abs(pairs[:, 0].mean()) < 1e-12):
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pairs), size=(n, len(pairs)))
    if absolute:
        d = pairs[idx, 1].mean(1) - pairs[idx, 0].mean(1)
        return float(pairs[:, 1].mean() - pairs[:, 0].mean()), float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))
    rel = pairs[idx, 1].mean(1) / np.maximum(np.abs(pairs[idx, 0].mean(1)), 1e-12) - 1
    return float(pairs[:, 1].mean() / pairs[:, 0].mean() - 1), float(np.percentile(rel, 2.5)), float(np.percentile(rel, 97.5))


def generate(pipe, items, a):
    out = []
    for i in range(0, len(items), a.batch):
        chunk = items[i:i + a.batch]
        gens = [torch.Generator().manual_seed(s) for _, _, _, s in chunk]
        res = pipe(prompt=[p for p, _, _, _ in chunk], negative_prompt=[""] * len(chunk), height=64, width=64,
                   num_frames=17, num_inference_steps=a.steps, guidance_scale=a.guidance, generator=gens,
                   output_type="np").frames
        out.extend(np.clip(np.rint(np.asarray(r) * 255), 0, 255).astype(np.uint8) for r in res)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(TOY_WORLD_PATH))
    p.add_argument("--adapter", default=None, help="PILA adapter folder (default: MODEL/pila)")
    p.add_argument("--num", type=int, default=32, help="clips per arm")
    p.add_argument("--steps", type=int, default=TOY_WORLD_DEFAULTS["num_inference_steps"])
    p.add_argument("--guidance", type=float, default=TOY_WORLD_DEFAULTS["guidance_scale"])
    p.add_argument("--scale", type=float, default=1.0, help="PILA scale of the PILA arm")
    p.add_argument("--residual-guidance", type=float, default=0.0)
    p.add_argument("--window", type=float, nargs=2, default=(0.0, 1.0), metavar=("START", "END"),
                   help="denoising progress window in which PILA acts (attach_pila start/end)")
    p.add_argument("--seed-base", type=int, default=900_000, help="noise seeds (held out from training)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (noise is drawn on the CPU either way)")
    p.add_argument("--out", default="out/toy_world_eval")
    a = p.parse_args(argv)
    try:
        device = torch.device(a.device)
    except RuntimeError:
        p.error(f"--device {a.device!r} is not a device name (cpu, cuda, cuda:N, ...)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        p.error(f"--device {a.device}: torch sees {torch.cuda.device_count()} CUDA GPU(s); use --device cpu")
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    pipe = load_toy_world(a.model, device=a.device)
    items = prompts_and_seeds(a.num, a.seed_base)
    adapter_dir = a.adapter or os.path.join(a.model, "pila")
    arms = {}
    print(f"generating {a.num} clips per arm ({a.steps} steps, guidance {a.guidance})", flush=True)
    arms["base"] = generate(pipe, items, a)
    if os.path.isfile(os.path.join(adapter_dir, "config.json")):
        from visionmoe.video import attach_pila, detach_pila, load_adapter

        adapter = load_adapter(adapter_dir).eval()
        attach_pila(pipe, adapter, scale=0.0)
        arms["control (scale 0)"] = generate(pipe, items, a)
        attach_pila(pipe, adapter, scale=a.scale, residual_guidance=a.residual_guidance,
                    start=a.window[0], end=a.window[1])
        arms[f"PILA (scale {a.scale:g})"] = generate(pipe, items, a)
        detach_pila(pipe)
        same = all(np.array_equal(x, y) for x, y in zip(arms["base"], arms["control (scale 0)"]))
        print(f"control (scale 0) bit-identical to base: {same}", flush=True)
    else:
        same = None
        print(f"no PILA adapter at {adapter_dir}: scoring the base model only", flush=True)
    sim = [generate_clip("bounce" if m == "bounce" else "free_fall", 7_000_000 + i)
           for i, (_, _, m, _) in enumerate(items)]
    print(f"generated in {time.time() - t0:.0f} s; scoring", flush=True)
    scores = {name: [score(pipe, fr, c) for fr, (_, c, _, _) in zip(clips, items)] for name, clips in arms.items()}
    scores["simulator (reference)"] = [score(pipe, c.frames, c.caption.split()[1]) for c in sim]

    # table
    results = {"num_clips_per_arm": a.num, "steps": a.steps, "guidance": a.guidance, "scale": a.scale,
               "window": list(a.window), "control_bit_identical": same, "arms": {}, "changes_vs_base": {}}
    lines = ["| arm | " + " | ".join(lbl for _, lbl, _ in HEADLINE) + " |",
             "|---|" + "---|" * len(HEADLINE)]
    for name, rows in scores.items():
        cells, rec = [], {}
        for key, _, _ in HEADLINE:
            m, lo, hi, n = bootstrap([r.get(key, float("nan")) for r in rows])
            rec[key] = {"mean": m, "ci95": [lo, hi], "n": n}
            cells.append(f"{m:.3g} [{lo:.3g}, {hi:.3g}]" + ("" if n == len(rows) else f" (n={n})"))
        results["arms"][name] = rec
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    base = scores["base"]
    for name, rows in scores.items():
        if name in ("base", "simulator (reference)"):
            continue
        ch = {}
        for key, _, _ in HEADLINE:
            ch[key] = paired_change([r.get(key, float("nan")) for r in base], [r.get(key, float("nan")) for r in rows],
                                    absolute=key in SHARES)
        results["changes_vs_base"][name] = ch
        lines.append(f"| change of {name} vs base | " + " | ".join(
            f"{100 * c[0]:+.1f}{' pp' if k in SHARES else '%'} [{100 * c[1]:+.1f}, {100 * c[2]:+.1f}]"
            for k, c in ch.items()) + " |")
    results["per_clip"] = {name: [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()}
                                  for r in rows] for name, rows in scores.items()}
    table = "\n".join(lines)
    with open(os.path.join(a.out, "table.md"), "w") as fh:
        fh.write(table + "\n\nMeans over clips with bootstrap 95% intervals; changes are paired (same prompt and "
                 "seed) relative changes of the mean (shares: differences in percentage points) with paired "
                 "bootstrap intervals.\n")
    with open(os.path.join(a.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)

    # strip image and side-by-side video of a few prompts
    import imageio.v2 as imageio

    show = [n for n in arms if not n.startswith("control")]
    rows = []
    for i in range(min(4, a.num)):
        for n in show:
            rows.append(np.concatenate(list(arms[n][i][::2]), axis=1))
        rows.append(np.full((3, rows[-1].shape[1], 3), 255, np.uint8))
    imageio.imwrite(os.path.join(a.out, "strip.png"), np.concatenate(rows[:-1], axis=0))
    sbs = [np.concatenate([np.concatenate([arms[n][i][f] for n in show], axis=1) for i in range(min(4, a.num))], axis=0)
           for f in range(17)]
    write_video(os.path.join(a.out, "side_by_side.mp4"), np.stack(sbs), fps=8)
    for n in show:
        tag = "base" if n == "base" else "pila"
        write_video(os.path.join(a.out, f"{tag}_0.mp4"), arms[n][0], fps=8)
    print(table)
    print(f"rows of strip.png / columns of side_by_side.mp4: {show}; wrote {a.out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
