"""``visionmoe-video generate``: one video from a Wan pipeline with PILA (default: the shipped toy
world and its trained adapter). Every argument is checked before a model is loaded."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ...common.cli import CLIError
from ...common.validators import check_finite
from .common import (SPATIAL_DEFAULT, TEMPORAL_DEFAULT, WAN_DEFAULTS, check_device, check_out, check_sizes,
                     looks_local, model_factors, quiet_libraries, write_mp4)


@dataclass
class GenerateJob:
    """The checked request: model, sizes, prompt, adapter, categories, device and output."""

    toy: bool
    model: str
    local: bool
    frames: int
    height: int
    width: int
    steps: int
    guidance: float
    prompt: str
    adapter: str | None = None
    categories: object = "auto"
    device: str = "cpu"
    out: Path | None = None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate a video (default: the shipped toy world with its trained adapter)",
        description="Generate a video with a Wan pipeline corrected by a PILA adapter. With no --model: the "
                    "toy world model shipped in the package, with its trained adapter, at the size it was "
                    "trained for (17x64x64, 20 steps).")
    p.add_argument("--model", help="local folder or hub id of a Wan diffusers checkpoint (default: the shipped toy world)")
    p.add_argument("--adapter", help="PILA adapter folder or hub id; 'none' = the base model alone "
                                     "(default: MODEL/pila when it exists, else none)")
    p.add_argument("--prompt", help="text prompt (default: a red ball bouncing, in the toy world's captions)")
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--physics", default="auto",
                   help="'auto' (classify the prompt) or comma-separated categories, e.g. liquid,thermal")
    p.add_argument("--scale", type=float, default=1.0, help="PILA strength s in v' = v + s dv, >= 0 (0 = base model)")
    p.add_argument("--start", type=float, default=0.0, help="fraction of the steps where the correction starts")
    p.add_argument("--end", type=float, default=1.0, help="fraction of the steps where the correction stops")
    p.add_argument("--residual-guidance", type=float, default=0.0,
                   help="extra gradient step lowering the physics residuals (relative size, ~0.01); 0 = off")
    p.add_argument("--trajectory-guidance", type=float, default=0.0,
                   help="trajectory-law guidance strength (0.05 measured on the toy world; one VAE decode "
                        "and backward per step while sigma > 0.4); 0 = off")
    p.add_argument("--trajectory-projection", choices=["off", "gravity", "lines"], default="off",
                   help="re-draw the moving object as a rigid body on the law's track (gravity: parabolas cut "
                        "at bounces; lines: no acceleration); suits one object on a static background")
    p.add_argument("--projection-space", choices=["latent", "pixels"], default="pixels",
                   help="where --trajectory-projection acts: the decoded video (pixels, the default; no VAE "
                        "passes of its own) or the last step's clean latent (latent: one VAE decode and two "
                        "encodes, through which the toy world's VAE loses part of the gain)")
    p.add_argument("--steps", type=int, help="denoising steps (default: the model's)")
    p.add_argument("--frames", type=int, help="number of frames, 4k+1 (default: the model's)")
    p.add_argument("--height", type=int, help="a multiple of the model's VAE x patch size (default: the model's)")
    p.add_argument("--width", type=int, help="a multiple of the model's VAE x patch size (default: the model's)")
    p.add_argument("--guidance", type=float, help="classifier-free guidance scale, <= 1 disables CFG (default: the model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="transformer dtype (auto: bfloat16 on CUDA, else float32; the toy world is float32)")
    p.add_argument("--offload", action="store_true", help="enable_model_cpu_offload() (needs an accelerator)")
    p.add_argument("--fps", type=float, default=16.0, help="frames per second of the mp4 (> 0)")
    p.add_argument("-o", "--out", help="output .mp4 (default: toy_world.mp4 or video.mp4 in the current directory)")
    p.add_argument("-w", "--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=cmd_generate)




def _check_numbers(a, guidance: float, prompt: str) -> None:
    check_finite("--scale", a.scale, 0.0)
    check_finite("--fps", a.fps, 0.0, strict=True)
    check_finite("--guidance", guidance, 0.0)
    check_finite("--residual-guidance", a.residual_guidance, 0.0)
    check_finite("--trajectory-guidance", a.trajectory_guidance, 0.0)
    check_finite("--start", a.start)
    check_finite("--end", a.end)
    if not 0 <= a.start <= a.end <= 1:
        raise CLIError(f"need 0 <= --start <= --end <= 1, got {a.start:g}, {a.end:g}")
    if not 0 <= a.seed < 2**63:
        raise CLIError(f"--seed must lie in [0, 2^63), got {a.seed}")
    if not prompt.strip():
        raise CLIError("--prompt is empty")


def _check_model(model: str) -> tuple[bool, int, int]:
    """(local, spatial multiple, temporal factor): the model folder (a hub id is checked when it loads)."""
    local = looks_local(model)
    if local:
        mdir = Path(model)
        if not mdir.is_dir():
            raise CLIError(f"--model {model!r}: no such directory (and not a hub id of the form owner/name)")
        if not (mdir / "model_index.json").is_file():
            raise CLIError(f"--model {model!r} is not a diffusers checkpoint (no model_index.json)")
        spatial, temporal = model_factors(mdir)
    else:
        spatial, temporal = SPATIAL_DEFAULT, TEMPORAL_DEFAULT
    return local, spatial, temporal


def _check_adapter(a, model: str, local: bool) -> str | None:
    """The adapter folder or hub id (its config validated: types, ranges, parameter budget), or None."""
    from ..pila.config import AdapterConfigError, read_adapter_config

    adapter = a.adapter
    if adapter is None and local and (Path(model) / "pila" / "config.json").is_file():
        adapter = str(Path(model) / "pila")
    if adapter is not None and adapter.lower() == "none":
        adapter = None
    if adapter is not None and looks_local(adapter):
        try:
            read_adapter_config(adapter)
        except AdapterConfigError as e:
            raise CLIError(f"--adapter: {e}") from None
    return adapter


def _check_categories(a):
    categories = "auto" if a.physics == "auto" else [c.strip() for c in a.physics.split(",") if c.strip()]
    if categories != "auto":
        from ..pila.labels import prior_from_labels

        try:
            prior_from_labels(categories)
        except ValueError as e:
            raise CLIError(f"--physics {a.physics!r}: {e}") from None
    return categories


def check_generate(a) -> GenerateJob:
    """Every argument of ``generate``, checked before anything is loaded."""
    from ..models.toy_world import TOY_WORLD_DEFAULTS, TOY_WORLD_PATH, toy_world_prompt

    toy = a.model is None
    model = str(TOY_WORLD_PATH) if toy else a.model
    defaults = TOY_WORLD_DEFAULTS if toy else WAN_DEFAULTS
    frames = a.frames if a.frames is not None else defaults["num_frames"]
    height = a.height if a.height is not None else defaults["height"]
    width = a.width if a.width is not None else defaults["width"]
    steps = a.steps if a.steps is not None else defaults["num_inference_steps"]
    guidance = a.guidance if a.guidance is not None else defaults["guidance_scale"]
    prompt = a.prompt if a.prompt is not None else toy_world_prompt("red", "bounce")
    # 1. numbers
    _check_numbers(a, guidance, prompt)
    # 2. the model folder (a hub id is checked when it loads) and its sizes
    local, spatial, temporal = _check_model(model)
    check_sizes(frames, height, width, steps, spatial, temporal)
    job = GenerateJob(toy, model, local, frames, height, width, steps, guidance, prompt)
    # 3. the adapter (its config validated: types, ranges, parameter budget)
    job.adapter = _check_adapter(a, model, local)
    # 4. physics categories, device, output
    job.categories = _check_categories(a)
    job.out = check_out(a.out or ("toy_world.mp4" if toy else "video.mp4"), a.overwrite)
    job.device = check_device(a.device)
    return job


def _load_pipeline(job: GenerateJob, a, say):
    """The Wan pipeline in eval mode on its device (sizes of a hub model checked once it is loaded)."""
    import torch

    from ..pipelines.wan_pila import WanPILAPipeline

    model, local, device = job.model, job.local, job.device
    if job.toy or a.dtype == "float32":
        dtype = torch.float32
    elif a.dtype == "auto":
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    else:
        dtype = getattr(torch, a.dtype)
    try:
        if dtype == torch.float32:
            pipe = WanPILAPipeline.from_pretrained(model, dtype=torch.float32, local_files_only=local)
        else:  # the Wan VAE stays in float32
            from diffusers import AutoencoderKLWan

            vae = AutoencoderKLWan.from_pretrained(model, subfolder="vae", dtype=torch.float32, local_files_only=local)
            pipe = WanPILAPipeline.from_pretrained(model, vae=vae, dtype=dtype, local_files_only=local)
    except (OSError, ValueError, RuntimeError) as e:
        raise CLIError(f"could not load --model {model!r}: {str(e).strip().splitlines()[0]}") from None
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        if getattr(pipe, name, None) is not None:
            getattr(pipe, name).eval()
    if not local:  # a hub model: its sizes are known now
        check_sizes(job.frames, job.height, job.width, job.steps,
                    pipe.vae_scale_factor_spatial * pipe.transformer.config.patch_size[1], pipe.vae_scale_factor_temporal)
    say(f"model: {'the shipped toy world' if job.toy else model}")
    if a.offload:
        try:
            pipe.enable_model_cpu_offload(device=None if device == "cpu" else device)
        except RuntimeError as e:
            raise CLIError(f"--offload: {str(e).splitlines()[0]}") from None
    elif device != "cpu":
        pipe.to(device)
    return pipe


def _attach(pipe, job: GenerateJob, a, say) -> None:
    """PILA, trajectory guidance and trajectory projection, in that order (:mod:`visionmoe.video.hooks`)."""
    adapter = job.adapter
    if adapter is not None:
        try:
            pipe.load_pila(adapter, scale=a.scale, start=a.start, end=a.end, categories=job.categories,
                           residual_guidance=a.residual_guidance)
        except (OSError, ValueError, RuntimeError) as e:  # e.g. weights that do not fit the config, other latents
            raise CLIError(f"could not use --adapter {adapter!r}: {str(e).strip().splitlines()[0]}") from None
        say(f"adapter: {adapter}")
    else:
        say("adapter: none (the base model alone)")
    if a.trajectory_guidance > 0:
        from ..hooks.trajectory_guidance import attach_trajectory_guidance

        attach_trajectory_guidance(pipe, a.trajectory_guidance)
        say(f"trajectory guidance: strength {a.trajectory_guidance:g}")
    if a.trajectory_projection != "off":
        from ..hooks.trajectory_projection import attach_trajectory_projection

        try:
            attach_trajectory_projection(pipe, law=a.trajectory_projection, space=a.projection_space)
        except ValueError as e:  # e.g. a scheduler that does not predict the flow
            raise CLIError(f"--trajectory-projection: {e}") from None
        where = "last step" if a.projection_space == "latent" else "decoded video"
        say(f"trajectory projection: {a.trajectory_projection} law, {where}")


def cmd_generate(a) -> int:
    say = (lambda *_: None) if a.quiet else (lambda msg: print(msg, flush=True))
    job = check_generate(a)

    # load and run
    import numpy as np
    import torch

    quiet_libraries()
    t0 = time.perf_counter()
    pipe = _load_pipeline(job, a, say)
    _attach(pipe, job, a, say)
    pipe.set_progress_bar_config(disable=a.quiet, desc="denoising")
    say(f"generating {job.frames}x{job.height}x{job.width}, {job.steps} steps, guidance {job.guidance:g}, "
        f"PILA scale {a.scale:g} on {job.device}")
    result = pipe(
        prompt=job.prompt, negative_prompt=a.negative_prompt, height=job.height, width=job.width,
        num_frames=job.frames, num_inference_steps=job.steps, guidance_scale=job.guidance,
        generator=torch.Generator(device="cpu").manual_seed(a.seed), output_type="np",
    )
    if pipe.pila is not None and pipe.pila.priors and pipe.pila.priors[0] is not None:
        prior = pipe.pila.priors[0]
        say(f"physics categories ({prior.source}): {', '.join(prior.categories)}")
    video = (np.clip(result.frames[0], 0, 1) * 255).round().astype(np.uint8)
    write_mp4(video, job.out, a.fps)
    say(f"{video.shape[0]} frames {video.shape[2]}x{video.shape[1]} in {time.perf_counter() - t0:.1f} s")
    print(f"wrote {job.out.resolve()}")
    return 0
