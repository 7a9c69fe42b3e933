#!/usr/bin/env python
"""Generate a video with a Wan pipeline corrected by a PILA physics adapter.

    python scripts/generate_video.py --prompt "a rubber ball bounces on the floor" --out ball.mp4
    python scripts/generate_video.py --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --adapter path/to/pila \
        --prompt "water pours into a glass" --physics liquid --scale 1.0 --offload --out pour.mp4

With no --model it runs the embedded tiny Wan of assets/tiny_wan (random weights drawn from
a seed, offline, seconds on a CPU): a smoke test of the whole path, not a content model.
With no --adapter the adapter is untrained (an exact no-op) and the video is the base model's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TINY_DEFAULTS = dict(steps=8, frames=17, height=64, width=64, guidance=5.0)
WAN_DEFAULTS = dict(steps=50, frames=81, height=480, width=832, guidance=5.0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="local directory or hub id of a Wan diffusers checkpoint (default: embedded tiny Wan)")
    p.add_argument("--tiny-version", choices=["2.1", "2.2"], default="2.1", help="layout of the embedded tiny Wan (2.2: two transformers)")
    p.add_argument("--adapter", help="PILA adapter directory or hub id (default: untrained adapter = no-op)")
    p.add_argument("--prompt", default="a rubber ball falls and bounces on the floor")
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--physics", default="auto", help="'auto' (classify the prompt) or comma-separated categories, e.g. liquid,thermal")
    p.add_argument("--scale", type=float, default=1.0, help="PILA strength s in v' = v + s dv (0 = base model)")
    p.add_argument("--start", type=float, default=0.0, help="first fraction of the steps with the correction")
    p.add_argument("--end", type=float, default=1.0, help="fraction of the steps where the correction stops")
    p.add_argument("--residual-guidance", type=float, default=0.0,
                   help="extra gradient step (relative size, ~0.01) lowering the physics residuals; 0 = off")
    p.add_argument("--steps", type=int)
    p.add_argument("--frames", type=int, help="number of frames, 4k+1")
    p.add_argument("--height", type=int, help="multiple of 16")
    p.add_argument("--width", type=int, help="multiple of 16")
    p.add_argument("--guidance", type=float, help="classifier-free guidance scale (<= 1 disables CFG)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--offload", action="store_true", help="enable_model_cpu_offload() (needs an accelerator)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    p.add_argument("--fps", type=int, default=16)
    p.add_argument("--out", default="out.mp4", help="output .mp4")
    return p.parse_args(argv)


class UsageError(Exception):
    pass


def check_sizes(a, spatial_multiple: int, temporal: int):
    for name in ("height", "width"):
        v = getattr(a, name)
        if v <= 0 or v % spatial_multiple:
            lo = max(spatial_multiple, v // spatial_multiple * spatial_multiple)
            raise UsageError(f"--{name} {v} is impossible: it must be a positive multiple of {spatial_multiple} (e.g. {lo})")
    if a.frames < 1 or (a.frames - 1) % temporal:
        k = max(0, round((a.frames - 1) / temporal))
        raise UsageError(f"--frames {a.frames} is impossible: it must be {temporal}k+1 (e.g. {temporal * k + 1})")
    if a.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {a.steps}")
    if not 0 <= a.start <= a.end <= 1:
        raise UsageError(f"need 0 <= --start <= --end <= 1, got {a.start}, {a.end}")


def check_device(device: str) -> None:
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a device name (cpu, cuda, cuda:N, ...)") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise UsageError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA GPU(s); use --device cpu")


def main(argv=None) -> int:
    a = parse_args(argv)
    defaults = TINY_DEFAULTS if a.model is None else WAN_DEFAULTS
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if not a.out.lower().endswith(".mp4"):
        raise UsageError(f"--out must name an .mp4 file, got {a.out!r}")
    if a.model is not None:
        local = os.path.isabs(a.model) or a.model.startswith(".") or os.path.exists(a.model) or a.model.count("/") != 1
        if local and not os.path.isdir(a.model):
            raise UsageError(f"--model {a.model!r}: no such directory (and not a hub id of the form owner/name)")
        if local and not os.path.isfile(os.path.join(a.model, "model_index.json")):
            raise UsageError(f"--model {a.model!r} is not a diffusers checkpoint (no model_index.json)")
    if a.adapter is not None and not os.path.isdir(a.adapter) and a.adapter.count("/") != 1:
        raise UsageError(f"--adapter {a.adapter!r}: no such directory (and not a hub id of the form owner/name)")

    import imageio.v2 as imageio
    import numpy as np
    import torch

    from visionmoe.video import PILAAdapter, WanPILAPipeline
    from visionmoe.video.tiny import load_tiny_wan

    categories = "auto" if a.physics == "auto" else [c for c in a.physics.split(",") if c.strip()]
    if categories != "auto":
        from visionmoe.video.labels import prior_from_labels

        try:
            prior_from_labels(categories)
        except ValueError as e:
            raise UsageError(f"--physics {a.physics!r}: {e}") from None

    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    check_device(device)
    dtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32}.get(a.dtype) or getattr(torch, a.dtype)
    if a.model is None:
        dtype = torch.float32
    t0 = time.perf_counter()
    try:
        if a.model is None:
            base = load_tiny_wan(a.tiny_version)
            pipe = WanPILAPipeline.from_pipe(base)
            print(f"model: embedded tiny Wan {a.tiny_version} (random weights, seed 0)")
        else:
            from diffusers import AutoencoderKLWan

            vae = AutoencoderKLWan.from_pretrained(a.model, subfolder="vae", torch_dtype=torch.float32)
            pipe = WanPILAPipeline.from_pretrained(a.model, vae=vae, torch_dtype=dtype)
            print(f"model: {a.model}")
    except (OSError, ValueError) as e:
        raise UsageError(f"could not load --model {a.model!r}: {str(e).splitlines()[0]}") from None
    spatial = pipe.vae_scale_factor_spatial * pipe.transformer.config.patch_size[1]
    check_sizes(a, spatial, pipe.vae_scale_factor_temporal)

    text_dim = pipe.transformer.config.text_dim
    if a.adapter is None:
        adapter = PILAAdapter(text_dim=text_dim)
        print("adapter: untrained (exact no-op; pass --adapter for a trained one)")
    else:
        try:
            adapter = PILAAdapter.from_pretrained(a.adapter)
        except (OSError, ValueError) as e:
            raise UsageError(f"could not load --adapter {a.adapter!r}: {str(e).splitlines()[0]}") from None
        print(f"adapter: {a.adapter}")
    if a.offload:
        pipe.enable_model_cpu_offload(device=None if device == "cpu" else device)
    elif device != "cpu":
        pipe.to(device)
    adapter.to(device)
    try:
        controller = pipe.load_pila(
            adapter, scale=a.scale, start=a.start, end=a.end, categories=categories, residual_guidance=a.residual_guidance
        )
    except ValueError as e:  # e.g. an adapter for other latent channels or text width
        raise UsageError(str(e)) from None
    pipe.set_progress_bar_config(disable=False, desc="denoising")
    print(f"generating {a.frames}x{a.height}x{a.width}, {a.steps} steps, guidance {a.guidance}, PILA scale {a.scale} on {device}")
    out = pipe(
        prompt=a.prompt,
        negative_prompt=a.negative_prompt,
        height=a.height,
        width=a.width,
        num_frames=a.frames,
        num_inference_steps=a.steps,
        guidance_scale=a.guidance,
        generator=torch.Generator(device="cpu").manual_seed(a.seed),
        output_type="np",
    )
    prior = controller.priors[0] if controller.priors else None
    if prior is not None:
        print(f"physics categories ({prior.source}): {', '.join(prior.categories)}")
    frames = (np.clip(out.frames[0], 0, 1) * 255).round().astype(np.uint8)
    out_path = Path(a.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.stem + ".partial.mp4")
    imageio.mimwrite(tmp, list(frames), fps=a.fps, codec="libx264", quality=8, macro_block_size=1)
    os.replace(tmp, out_path)
    print(f"wrote {out_path} ({frames.shape[0]} frames {frames.shape[2]}x{frames.shape[1]}) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as e:
        if "accelerator" in str(e):
            print(f"error: --offload: {e}", file=sys.stderr)
            sys.exit(2)
        raise
