"""``visionmoe-video eval``: the guarded evaluation on the toy world (base vs each adapter vs the
scale-0 control; :func:`visionmoe.video.evaluation.evaluate_toy_world`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ...common.cli import CLIError
from ...common.validators import check_finite
from .common import check_device, check_out_dir, quiet_libraries


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval", help="measure PILA on the toy world: base vs PILA vs the scale-0 control",
        description="Generate the same clips with the base toy world model, with each adapter and with the "
                    "scale-0 control, score them with the CPU physics proxies (guarded: lost objects count as "
                    "failures) and write table.md and results.json into --out "
                    "(visionmoe.video.evaluation.evaluate_toy_world).")
    p.add_argument("--model", help="toy world folder (default: the shipped one)")
    p.add_argument("--adapter", action="append", metavar="[NAME=]DIR",
                   help="PILA adapter folder, repeatable (default: the shipped adapter)")
    p.add_argument("--num", type=int, default=32, help="clips per seed set and arm (>= 1)")
    p.add_argument("--seed-sets", type=int, nargs="+", default=[900_000], help="noise-seed bases (held out from training)")
    p.add_argument("--steps", type=int, help="denoising steps (default: the toy world's)")
    p.add_argument("--guidance", type=float, help="guidance scale (default: the toy world's)")
    p.add_argument("--scale", type=float, default=1.0, help="PILA scale of the adapter arms (>= 0)")
    p.add_argument("--residual-guidance", type=float, default=0.0)
    p.add_argument("--trajectory-guidance", type=float, default=0.0,
                   help="also score the base model with trajectory-law guidance of this strength (0: no such arm)")
    p.add_argument("--trajectory-projection", action="append", choices=["gravity", "lines"], default=[],
                   help="also score the base model with rigid-body trajectory projection under this law "
                        "(repeatable; lines: the wrong-law control)")
    p.add_argument("--projection-space", choices=["latent", "pixels"], default="pixels",
                   help="where the projection arms act: the decoded video (default) or the last step's clean latent")
    p.add_argument("--window", type=float, nargs=2, default=(0.0, 1.0), metavar=("START", "END"),
                   help="fractions of the steps with the correction")
    p.add_argument("--no-control", action="store_true", help="skip the scale-0 control arm")
    p.add_argument("--batch", type=int, default=8, help="clips per generation batch (>= 1)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (the noise is drawn on the CPU either way)")
    p.add_argument("-o", "--out", default="toy_world_eval", help="output folder (created; default: toy_world_eval)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=cmd_eval)


def cmd_eval(a) -> int:
    from ..models.toy_world import TOY_WORLD_DEFAULTS, TOY_WORLD_PATH
    from ..pila.config import AdapterConfigError, read_adapter_config

    steps = a.steps if a.steps is not None else TOY_WORLD_DEFAULTS["num_inference_steps"]
    guidance = a.guidance if a.guidance is not None else TOY_WORLD_DEFAULTS["guidance_scale"]
    for name, v in (("--num", a.num), ("--steps", steps), ("--batch", a.batch)) + (
            (("--threads", a.threads),) if a.threads is not None else ()):
        if v < 1:
            raise CLIError(f"{name} must be >= 1, got {v}")
    check_finite("--scale", a.scale, 0.0)
    check_finite("--guidance", guidance, 0.0)
    check_finite("--residual-guidance", a.residual_guidance, 0.0)
    check_finite("--trajectory-guidance", a.trajectory_guidance, 0.0)
    start, end = a.window
    check_finite("--window", start)
    check_finite("--window", end)
    if not 0 <= start <= end <= 1:
        raise CLIError(f"need 0 <= START <= END <= 1 for --window, got {start:g} {end:g}")
    if any(s < 0 for s in a.seed_sets):
        raise CLIError(f"--seed-sets must be >= 0, got {a.seed_sets}")
    model = Path(a.model) if a.model is not None else TOY_WORLD_PATH
    if not (model / "model_index.json").is_file():
        raise CLIError(f"--model {str(model)!r} is not a diffusers checkpoint folder (no model_index.json)")
    specs = a.adapter if a.adapter is not None else (
        [str(model / "pila")] if (model / "pila" / "config.json").is_file() else [])
    adapters = []
    for spec in specs:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        try:
            read_adapter_config(path)
        except AdapterConfigError as e:
            raise CLIError(f"--adapter: {e}") from None
        adapters.append((name or (f"PILA (scale {a.scale:g})" if len(specs) == 1 else Path(path).name), path))
    names = [n for n, _ in adapters]
    if len(set(names)) != len(names) or "base" in names:
        raise CLIError(f"--adapter names must be distinct and not 'base', got {names}")
    device = check_device(a.device)
    out = check_out_dir(a.out)

    import torch

    from .. import evaluation as E

    quiet_libraries()
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    arms = [E.Arm(n, adapter=p, scale=a.scale, residual_guidance=a.residual_guidance, window=(start, end))
            for n, p in adapters]
    if a.trajectory_guidance > 0:
        arms.append(E.Arm(f"trajectory guidance {a.trajectory_guidance:g}", trajectory_guidance=a.trajectory_guidance))
    for law in dict.fromkeys(a.trajectory_projection):
        suffix = ", pixels" if a.projection_space == "pixels" else ""
        arms.append(E.Arm(f"trajectory projection ({law}{suffix})", trajectory_projection=law,
                          projection_space=a.projection_space))
    t0 = time.time()
    progress = None if a.quiet else (
        lambda n, d, t: print(f"{n}: {d}/{t} clips ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True))
    ev = E.evaluate_toy_world(arms, model=str(model), num=a.num, seed_sets=a.seed_sets, steps=steps,
                              guidance=guidance, batch=a.batch, device=device, control=not a.no_control and bool(arms),
                              progress=progress)
    table = ev.markdown()
    if ev.control_bit_identical is not None:
        table += f"\n\nscale-0 control bit-identical to the base: {ev.control_bit_identical}"
    out.mkdir(parents=False, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(ev.to_json(), indent=1, default=float) + "\n")
    print(table)
    print(f"wrote {(out / 'table.md').resolve()} and results.json in {time.time() - t0:.0f} s")
    return 0
