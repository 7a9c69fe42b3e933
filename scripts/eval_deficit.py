#!/usr/bin/env python
"""Per-category physics deficit of a toy world against the simulator (issue #49, step 1).

For each law scenario (projectile, bounce, sliding, stream) and each of ``--num`` fresh seeds
(``--seed-start`` on; the deficit world's training mix uses seeds below 100 000 000), the
lawful simulator clip gives the caption and the truth. Every arm generates that caption with
``torch.Generator().manual_seed(seed)``; a colour-mask tracker that neither PILA nor the
trajectory tools use (:mod:`visionmoe.video.evaluation.law_params`) follows the captioned
colour in the decoded frames and the scenario's law parameter is fitted: projectile g, bounce
restitution, sliding deceleration, stream centroid acceleration (its truth is the same fit on
the lawful simulator clip). The headline is the relative error against the truth, capped at
2.0; clips whose object is found in fewer than 8 frames or whose law cannot be fitted score
2.0. Beside it: the share of clips whose fit lies in the lawful range, the frames where the
object is found, its area (relative to the simulator's clip of the same seed), the share of
vivid pixels in the captioned colour, and recognisability (object found in >= 75% of the
frames and >= 50% of the vivid pixels in the captioned colour). 95% bootstrap intervals over
clips (2000 resamples, seeded); arms against the first arm with paired bootstrap intervals.

Reference arms: ``simulator lawful`` (the fit's floor), ``simulator unlawful`` (the clip of
the same seed with the wrong law) and ``VAE round trip`` (the lawful clip encoded and decoded by
the base world's VAE: the ceiling of any transformer in that latent space). Deterministic (one
thread, seeded generators).

    python scripts/eval_deficit.py --world out/pila_deficit/world --num 16 --out out/pila_deficit/eval_base
    python scripts/eval_deficit.py --arm base=WORLD --arm shipped=toy_world ...
    python scripts/eval_deficit.py --world W --adapter pila=DIR --adapter plain=DIR ...
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from visionmoe.video.data.law_variants import LAW_SCENARIOS, generate_law_clip
from visionmoe.video.evaluation.law_params import (WORST_ERROR, caption_color, fit_law, law_error,
                                                   lawful_range)

TRUTH_KEY = {"projectile": "g", "bounce": "restitution", "sliding": "friction_decel", "stream": None}
SCENARIOS = tuple(LAW_SCENARIOS)
REFERENCE_ARMS = ("simulator lawful", "simulator unlawful", "VAE round trip")


def truth_of(scenario, lawful_clip):
    key = TRUTH_KEY[scenario]
    if key is not None:
        return float(lawful_clip.params[key])
    f = fit_law(lawful_clip.frames, scenario, caption_color(lawful_clip.caption))
    return float(f.value)


def score(frames, scenario, lawful_clip, truth, sim_area):
    fit = fit_law(frames, scenario, caption_color(lawful_clip.caption))
    err = law_error(fit, truth)
    return {"value": None if not np.isfinite(fit.value) else float(fit.value), "truth": truth, "error": err,
            "ok": bool(fit.ok), "reason": fit.reason, "lawful_range": bool(lawful_range(scenario, fit.value)),
            "found": fit.found_fraction, "area_rel": fit.area / max(sim_area, 1e-6),
            "color": fit.color_fraction,
            "recognisable": bool(fit.found_fraction >= 0.75 and fit.color_fraction >= 0.5)}


def boot(v, rng, n=2000):
    v = np.asarray(v, np.float64)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    idx = rng.integers(0, len(v), size=(n, len(v)))
    m = v[idx].mean(1)
    return float(v.mean()), float(np.percentile(m, 2.5)), float(np.percentile(m, 97.5))


def paired(a, b, rng, relative, n=2000):
    """Paired change b - a of the means over clips (relative to a's mean when ``relative``) with
    its 95% bootstrap interval."""
    idx = rng.integers(0, len(a), size=(n, len(a)))
    ma, mb = a[idx].mean(1), b[idx].mean(1)
    ch = (mb - ma) / np.maximum(ma, 1e-9) if relative else mb - ma
    c = (b.mean() - a.mean()) / max(a.mean(), 1e-9) if relative else b.mean() - a.mean()
    return float(c), float(np.percentile(ch, 2.5)), float(np.percentile(ch, 97.5))


def fmt(t, pct=False):
    m, lo, hi = t
    if pct:
        return f"{100 * m:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]"
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def load_arm(spec, steps, guidance):
    from visionmoe.video.models.toy_world import TOY_WORLD_PATH, load_toy_world

    world = spec.get("world") or str(TOY_WORLD_PATH)
    pipe = load_toy_world(world)
    if spec.get("adapter"):
        from visionmoe.video.hooks.pila import PILASettings, apply_pila
        from visionmoe.video.pila.adapter import PILAAdapter

        ad = PILAAdapter.from_pretrained(spec["adapter"]).eval()
        apply_pila(pipe, ad, PILASettings(scale=spec.get("scale", 1.0), apply_to=spec.get("apply_to", "each_branch")))
    return pipe


def trained_sequence_length(spec) -> int:
    """The text tokens the world's transformer was trained on (``training_info.json``, written by
    train_deficit_world.py --max-seq; 512, WanPipeline's default, where it is not recorded)."""
    from visionmoe.video.models.toy_world import TOY_WORLD_PATH

    path = os.path.join(spec.get("world") or str(TOY_WORLD_PATH), "training_info.json")
    if not os.path.exists(path):
        return 512
    with open(path) as fh:
        return int(json.load(fh).get("max_sequence_length", 512))


def load_vae(world):
    from visionmoe.video.models.toy_world import load_toy_world

    return load_toy_world(world).vae.eval()


def round_trip(vae, frames):
    """The clip encoded (posterior mean) and decoded by the world's VAE: what the best transformer in that
    latent space could draw."""
    x = torch.from_numpy(frames).float().div(127.5).sub(1.0).permute(3, 0, 1, 2)[None]
    with torch.no_grad():
        y = vae.decode(vae.encode(x).latent_dist.mean).sample[0]
    return ((y.permute(1, 2, 3, 0).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()


def generate(pipe, caption, seed, steps, guidance, max_sequence_length=512):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out = pipe(prompt=caption, height=64, width=64, num_frames=17, num_inference_steps=steps,
                   guidance_scale=guidance, generator=g, output_type="np",
                   max_sequence_length=max_sequence_length).frames[0]
    return np.clip(np.rint(np.asarray(out) * 255.0), 0, 255).astype(np.uint8)


def summarize(rows, arms, out):
    rng_seed = 0
    lines = ["| arm | category | law error (rel.) | error, fitted clips only | lawful-range | recognisable | "
             "frames found | area / sim | captioned colour | failures |", "|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for arm in arms:
        for sc in SCENARIOS + ("all",):
            rs = [r for r in rows[arm] if sc == "all" or r["scenario"] == sc]
            if not rs:
                continue
            rng = np.random.default_rng(rng_seed)
            s = {k: boot([float(r[k]) for r in rs], rng) for k in
                 ("error", "lawful_range", "recognisable", "found", "area_rel", "color")}
            s["error_fitted"] = boot([r["error"] for r in rs if r["ok"]], rng)
            s["failures"] = float(np.mean([not r["ok"] for r in rs]))
            s["n"] = len(rs)
            summary[f"{arm}/{sc}"] = s
            lines.append(f"| {arm} | {sc} (n={len(rs)}) | {fmt(s['error'])} | {fmt(s['error_fitted'])} | "
                         f"{fmt(s['lawful_range'], True)} | "
                         f"{fmt(s['recognisable'], True)} | {fmt(s['found'], True)} | {s['area_rel'][0]:.2f} | "
                         f"{fmt(s['color'], True)} | {100 * s['failures']:.0f}% |")
    gen = [a for a in arms if a not in REFERENCE_ARMS]
    if len(gen) > 1:
        lines += ["", f"Paired change of the law error against `{gen[0]}` (same seeds; relative to its mean):", "",
                  "| arm | category | change | 95% interval |", "|---|---|---|---|"]
        for arm in gen[1:]:
            for sc in SCENARIOS + ("all",):
                a = np.array([r["error"] for r in rows[gen[0]] if sc == "all" or r["scenario"] == sc])
                b = np.array([r["error"] for r in rows[arm] if sc == "all" or r["scenario"] == sc])
                if len(a) == 0:
                    continue
                c, lo, hi = paired(a, b, np.random.default_rng(1), relative=True)
                summary[f"{arm}-vs-{gen[0]}/{sc}"] = [c, lo, hi]
                lines.append(f"| {arm} | {sc} | {100 * c:+.1f}% | [{100 * lo:+.1f}, {100 * hi:+.1f}] |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "table.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    return text


def write_strips(clips, out, per_cat=3):
    import imageio.v2 as imageio

    for arm, by in clips.items():
        rows = []
        for sc in SCENARIOS:
            for fr in by.get(sc, [])[:per_cat]:
                rows.append(np.concatenate(list(fr[::2]), 1))
        if rows:
            img = np.concatenate(rows, 0)
            img = np.repeat(np.repeat(img, 2, 0), 2, 1)
            imageio.imwrite(os.path.join(out, f"strip_{arm.replace(' ', '_')}.png"), img)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", default="out/pila_deficit/world", help="the base toy world (a WanPipeline folder)")
    p.add_argument("--arm", action="append", default=[], help="NAME=WORLD_DIR: another world as an arm")
    p.add_argument("--adapter", action="append", default=[], help="NAME=ADAPTER_DIR on --world, at --scale")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--num", type=int, default=16, help="clips per category")
    p.add_argument("--seed-start", type=int, default=900_000_000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance", type=float, default=3.0)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--out", default="out/pila_deficit/eval")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    scen = [s for s in a.scenarios.split(",") if s]
    arms = {"base": {"world": a.world}}
    for s in a.arm:
        n, d = s.split("=", 1)
        arms[n] = {"world": d}
    for s in a.adapter:
        n, d = s.split("=", 1)
        arms[n] = {"world": a.world, "adapter": d, "scale": a.scale}
    names = list(REFERENCE_ARMS) + list(arms)
    vae = load_vae(arms["base"]["world"])
    rows = {n: [] for n in names}
    clips = {n: {} for n in names}
    items = []
    for sc in scen:
        for i in range(a.num):
            seed = a.seed_start + i
            L = generate_law_clip(sc, seed, True)
            U = generate_law_clip(sc, seed, False)
            truth = truth_of(sc, L)
            sim_area = fit_law(L.frames, sc, caption_color(L.caption)).area
            items.append((sc, seed, L, truth, sim_area))
            for n, fr in (("simulator lawful", L.frames), ("simulator unlawful", U.frames),
                          ("VAE round trip", round_trip(vae, L.frames))):
                rows[n].append({"scenario": sc, "seed": seed, **score(fr, sc, L, truth, sim_area)})
                clips[n].setdefault(sc, []).append(fr)
    for n, spec in arms.items():
        cache = os.path.join(a.out, f"frames_{n}.npz")
        cached = dict(np.load(cache)) if os.path.exists(cache) else {}
        pipe = None
        t0 = time.time()
        for sc, seed, L, truth, sim_area in items:
            key = f"{sc}_{seed}"
            if key not in cached:
                if pipe is None:
                    pipe = load_arm(spec, a.steps, a.guidance)
                cached[key] = generate(pipe, L.caption, seed, a.steps, a.guidance, trained_sequence_length(spec))
            fr = cached[key]
            rows[n].append({"scenario": sc, "seed": seed, **score(fr, sc, L, truth, sim_area)})
            clips[n].setdefault(sc, []).append(fr)
        np.savez_compressed(cache, **cached)
        print(f"{n}: {len(items)} clips in {time.time() - t0:.0f} s", flush=True)
    with open(os.path.join(a.out, "per_clip.json"), "w") as fh:
        json.dump(rows, fh, indent=0)
    write_strips(clips, a.out)
    print(summarize(rows, names, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
