#!/usr/bin/env python
"""Guarded evaluation of PILA on the shipped toy world model (a thin wrapper of
``visionmoe.video.evaluation.evaluate_toy_world``).

    python scripts/eval_toy_world.py [--num 32] [--seed-sets 900000] [--steps 20] [--scale 1.0]
        [--adapter DIR ...] [--transformer NAME=DIR ...] [--trajectory-guidance S]
        [--projection LAW[:STRENGTH[:STEPS]][@SPACE] ...] [--out out/toy_world_eval]

Arms: the base model, a scale-0 control (must be bit-identical to the base), every
``--adapter`` (default: the shipped one; ``--no-adapter``: none) at ``--scale``, every
``--transformer`` (a fine-tuned transformer folder), trajectory guidance, every ``--projection``,
and the simulator's own clips as the reference. Headlines (gravity-fit residual, scale-free
jerk, distance to the simulator's trajectories) score clips whose object is lost as failures at
the worst observed value; the failure rate and the guards (foreground area, contrast, frames
tracked, objects per frame, flicker, captioned colour) sit next to them. ``--controls`` also
scores faded / shrunk / hidden / frame-dropped / frozen copies of the base clips: none may
improve a headline. Writes ``table.md`` and
``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


from visionmoe.video import evaluation as E  # noqa: E402
from visionmoe.video.evaluation import controls as C  # noqa: E402
from visionmoe.video.evaluation import metrics as M  # noqa: E402
from visionmoe.video.models.toy_world import TOY_WORLD_DEFAULTS, toy_world_adapter_path  # noqa: E402

CONTROLS = {"fade 0.7": lambda f: C.fade_object(f, 0.7), "shrink 1 px": C.shrink_object,
            "hide 4 frames": lambda f: C.hide_object(f, (6, 7, 8, 9)), "drop 2 frames": C.drop_frames,
            "skip 2 frames": C.skip_frames,
            "freeze at 9": lambda f: C.freeze_motion(f, 9)}


def write_media(ev, out: str, rows: int = 4) -> None:
    """strip.png (rows: each arm per prompt, every second frame), side_by_side.mp4, base_0.mp4, pila_0.mp4."""
    import imageio.v2 as imageio
    import numpy as np

    from visionmoe.video.data.synthetic import write_video

    show = [n for n in ev.clips if not n.startswith("simulator")]
    n = min(rows, len(ev.items))
    strip = []
    for i in range(n):
        for name in show:
            strip.append(np.concatenate(list(ev.clips[name][i][::2]), axis=1))
        strip.append(np.full((3, strip[-1].shape[1], 3), 255, np.uint8))
    imageio.imwrite(os.path.join(out, "strip.png"), np.concatenate(strip[:-1], axis=0))
    frames = [np.concatenate([np.concatenate([ev.clips[m][i][f] for m in show], axis=1) for i in range(n)], axis=0)
              for f in range(17)]
    write_video(os.path.join(out, "side_by_side.mp4"), np.stack(frames), fps=8)
    write_video(os.path.join(out, "base_0.mp4"), ev.clips["base"][0], fps=8)
    if len(show) > 1:
        write_video(os.path.join(out, "pila_0.mp4"), ev.clips[show[1]][0], fps=8)


def projection_arm(spec: str) -> E.Arm:
    """``LAW[:STRENGTH[:STEPS]][@SPACE]`` -> an arm of :mod:`visionmoe.video.hooks.trajectory_projection`."""
    from visionmoe.video.hooks.trajectory_projection import SPACES
    from visionmoe.video.physics.laws import LAWS

    spec, _, space = spec.partition("@")
    space = space or "latent"
    parts = spec.split(":")
    if len(parts) > 3 or parts[0] not in LAWS or space not in SPACES:
        raise ValueError(f"expected LAW[:STRENGTH[:STEPS]][@SPACE] with LAW one of {LAWS} and SPACE one of {SPACES}")
    strength = float(parts[1]) if len(parts) > 1 else 1.0
    steps = int(parts[2]) if len(parts) > 2 else 1
    if not 0.0 <= strength <= 1.0 or steps < 1 or (space == "pixels" and steps != 1):
        raise ValueError("STRENGTH must lie in [0, 1] and STEPS be >= 1 (1 with @pixels)")
    name = f"trajectory projection ({parts[0]}" + (f", strength {strength:g}" if strength != 1 else "") \
        + (f", last {steps} steps" if steps != 1 else "") + (", pixels" if space == "pixels" else "") + ")"
    return E.Arm(name, trajectory_projection=parts[0], projection_strength=strength, projection_steps=steps,
                 projection_space=space)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="toy world folder (default: the shipped one)")
    p.add_argument("--adapter", action="append", default=None, metavar="[NAME=]DIR",
                   help="PILA adapter folder (repeatable; default: the shipped adapter)")
    p.add_argument("--no-adapter", action="store_true", help="no adapter arm (and no scale-0 control)")
    p.add_argument("--transformer", action="append", default=[], metavar="NAME=DIR",
                   help="a fine-tuned transformer folder as an extra arm (repeatable)")
    p.add_argument("--num", type=int, default=32, help="clips per seed set and arm")
    p.add_argument("--seed-sets", type=int, nargs="+", default=[900_000], help="noise-seed bases (held out)")
    p.add_argument("--steps", type=int, default=TOY_WORLD_DEFAULTS["num_inference_steps"])
    p.add_argument("--guidance", type=float, default=TOY_WORLD_DEFAULTS["guidance_scale"])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--residual-guidance", type=float, default=0.0)
    p.add_argument("--trajectory-guidance", type=float, default=0.0,
                   help="also score the base model with trajectory-law guidance of this strength (0: no such arm)")
    p.add_argument("--projection", action="append", default=[], metavar="LAW[:STRENGTH[:STEPS]][@SPACE]",
                   help="also score the base model with rigid-body trajectory projection (repeatable): LAW gravity "
                        "or lines (the wrong-law control), STRENGTH in [0, 1] (0: rigid shape only; default 1), "
                        "STEPS the last denoising steps projected (default 1), SPACE latent (default) or pixels "
                        "(the decoded video)")
    p.add_argument("--window", type=float, nargs=2, default=(0.0, 1.0), metavar=("START", "END"))
    p.add_argument("--no-control", action="store_true", help="skip the scale-0 control arm")
    p.add_argument("--controls", action="store_true", help="also score negative controls of the base clips")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="out/toy_world_eval")
    a = p.parse_args(argv)
    try:
        device = torch.device(a.device)
    except RuntimeError:
        p.error(f"--device {a.device!r} is not a device name (cpu, cuda, cuda:N, ...)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        p.error(f"--device {a.device}: torch sees {torch.cuda.device_count()} CUDA GPU(s); use --device cpu")
    torch.set_num_threads(a.threads)
    arms = []
    adapters = [] if a.no_adapter else a.adapter if a.adapter is not None else ([str(toy_world_adapter_path(a.model))]
                                                        if toy_world_adapter_path(a.model) else [])
    for spec in adapters:
        name, _, path = spec.rpartition("=")
        if not os.path.isfile(os.path.join(path, "config.json")):
            p.error(f"--adapter {path}: no PILA adapter there (config.json missing)")
        arms.append(E.Arm(name or f"PILA (scale {a.scale:g})", adapter=path, scale=a.scale,
                          residual_guidance=a.residual_guidance, window=tuple(a.window)))
    if a.trajectory_guidance < 0:
        p.error(f"--trajectory-guidance must be >= 0, got {a.trajectory_guidance:g}")
    if a.trajectory_guidance > 0:
        arms.append(E.Arm(f"trajectory guidance {a.trajectory_guidance:g}", trajectory_guidance=a.trajectory_guidance))
    for spec in a.projection:
        try:
            arms.append(projection_arm(spec))
        except ValueError as e:
            p.error(f"--projection {spec}: {e}")
    for spec in a.transformer:
        name, _, path = spec.rpartition("=")
        if not os.path.isdir(path):
            p.error(f"--transformer {path}: not a folder")
        arms.append(E.Arm(name or os.path.basename(path), transformer=path))
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    ev = E.evaluate_toy_world(arms, model=a.model, num=a.num, seed_sets=a.seed_sets, steps=a.steps,
                              guidance=a.guidance, batch=a.batch, device=a.device, control=not a.no_control,
                              keep_clips=True,
                              progress=lambda n, d, t: print(f"{n}: {d}/{t} clips ({time.time() - t0:.0f} s)", flush=True))
    table = ev.markdown()
    if ev.control_bit_identical is not None:
        table += f"\n\nscale-0 control bit-identical to the base: {ev.control_bit_identical}"
    out = ev.to_json()
    if a.controls:
        rows = {"base": ev.per_clip["base"]}
        for name, fn in CONTROLS.items():
            rows[name] = [E.score_clip(fn(fr), it[1]) for fr, it in zip(ev.clips["base"], ev.items)]
        rows["simulator (reference)"] = ev.per_clip["simulator (reference)"]
        cs = E.summarize(rows)
        table += "\n\nNegative controls of the base clips (none may improve a headline):\n\n" + cs.markdown()
        out["controls"] = cs.to_json()
    with open(os.path.join(a.out, "table.md"), "w") as fh:
        fh.write(table + "\n")
    with open(os.path.join(a.out, "results.json"), "w") as fh:
        json.dump(out, fh, indent=1, default=float)
    write_media(ev, a.out)
    print(table)
    print(f"wrote {a.out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
