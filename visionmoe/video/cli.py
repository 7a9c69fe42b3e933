"""``visionmoe-video``: generate physics-aware videos with PILA, evaluate and train adapters.

    visionmoe-video generate                       # the shipped toy world + its adapter -> toy_world.mp4
    visionmoe-video generate --prompt "a blue ball is dropped and falls straight down" -o fall.mp4
    visionmoe-video generate --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --adapter path/to/pila \\
        --prompt "water pours into a glass" --physics liquid --offload -o pour.mp4
    visionmoe-video eval --num 32                  # base vs PILA vs scale-0 control on the toy world
    visionmoe-video train --data manifest.jsonl --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --stage 1 ...

Every argument is checked before a model is loaded: a bad one is one ``error:`` line on
stderr and exit status 2. This module is a thin layer over the library
(:mod:`visionmoe.video.pipeline`, :mod:`visionmoe.video.evaluation`, :mod:`visionmoe.video.train`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

PROG = "visionmoe-video"

#: Wan 2.1 / 2.2 defaults for a model other than the toy world
WAN_DEFAULTS = dict(num_frames=81, height=480, width=832, num_inference_steps=50, guidance_scale=5.0)
_SPATIAL_DEFAULT, _TEMPORAL_DEFAULT = 16, 4  # Wan: VAE 8x spatial x patch 2, VAE 4x temporal


class UsageError(Exception):
    """A bad argument or input: printed as one ``error:`` line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (``PROG CMD: error: ...``), exit 2."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ----------------------------------------------------------------------------- argument checks

def _finite(name: str, value: float, lo: float | None = None, *, strict: bool = False) -> None:
    if not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number, got {value}")
    if lo is not None and (value <= lo if strict else value < lo):
        raise UsageError(f"{name} must be {'>' if strict else '>='} {lo:g}, got {value:g}")


def check_sizes(frames: int, height: int, width: int, steps: int, spatial: int, temporal: int) -> None:
    """Wan sizes: height/width multiples of ``spatial`` (VAE x patch), frames ``temporal``k+1, steps >= 1."""
    for name, v in (("height", height), ("width", width)):
        if v <= 0 or v % spatial:
            ok = max(spatial, round(v / spatial) * spatial)
            raise UsageError(f"--{name} {v} is impossible: it must be a positive multiple of {spatial} (e.g. {ok})")
    if frames < 1 or (frames - 1) % temporal:
        ok = temporal * max(0, round((frames - 1) / temporal)) + 1
        raise UsageError(f"--frames {frames} is impossible: it must be {temporal}k+1 (e.g. {ok})")
    if steps < 1:
        raise UsageError(f"--steps must be >= 1, got {steps}")


def _read_json(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a readable JSON config ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise UsageError(f"{path}: expected a JSON object")
    return d


def model_factors(model_dir: Path) -> tuple[int, int]:
    """(spatial multiple, temporal factor) of a local Wan diffusers folder, read from its configs."""
    vae = _read_json(model_dir / "vae" / "config.json") if (model_dir / "vae" / "config.json").is_file() else {}
    tr = (_read_json(model_dir / "transformer" / "config.json")
          if (model_dir / "transformer" / "config.json").is_file() else {})
    try:
        spatial = int(vae.get("scale_factor_spatial", 8)) * int((tr.get("patch_size") or [1, 2, 2])[1])
        temporal = int(vae.get("scale_factor_temporal", 4))
    except (TypeError, ValueError, IndexError):
        raise UsageError(f"--model {str(model_dir)!r}: unreadable vae/transformer configs") from None
    if spatial < 1 or temporal < 1:
        raise UsageError(f"--model {str(model_dir)!r}: bad scale factors in its configs")
    return spatial, temporal


def _looks_local(name: str) -> bool:
    return os.path.isabs(name) or name.startswith(".") or os.path.exists(name) or name.count("/") != 1


def check_out(out: str, overwrite: bool) -> Path:
    """The output .mp4: a regular file or nothing at a path in an existing, writable directory."""
    path = Path(out)
    if path.is_dir():
        raise UsageError(f"-o/--out {out!r} is a directory; name a file in it, e.g. {str(path / 'video.mp4')!r}")
    if path.suffix.lower() != ".mp4":
        raise UsageError(f"-o/--out must name an .mp4 file, got {out!r}")
    if os.path.lexists(path):
        if not path.is_file() or path.is_symlink():
            raise UsageError(f"-o/--out {out!r} exists and is not a regular file; refusing to replace it")
        if not overwrite:
            raise UsageError(f"-o/--out {out!r} exists; pass -w/--overwrite to replace it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"-o/--out {out!r}: directory {str(parent)!r} does not exist")
    try:  # the only reliable test (root ignores mode bits; read-only mounts do not)
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.stem}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"-o/--out {out!r}: cannot write in {str(parent)!r} ({e.strerror})") from None
    return path


def check_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {device!r} is not a device name (auto, cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise UsageError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA GPU(s); use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r}: only cpu and cuda devices are supported")
    return device


def _quiet_libraries() -> None:
    """No loading bars and no spurious warnings from diffusers / transformers."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    from diffusers.utils import logging as dlog

    dlog.disable_progress_bar()
    dlog.set_verbosity_error()  # e.g. "modules ... should be kept in float32" when the dtype is set at load
    try:
        from transformers.utils import logging as tlog

        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is part of the video extra
        pass


class _Terminated(Exception):
    pass


def _raise_terminated(signum, frame):  # SIGTERM -> an exception, so `finally` removes temp files
    raise _Terminated()


def write_mp4(frames, path: Path, fps: float) -> None:
    """Write uint8 frames [F, H, W, 3] to ``path`` atomically (temp file in the same folder, rename).

    The file gets the user's umask permissions; the temp file is removed on any failure,
    Ctrl-C or SIGTERM.
    """
    import imageio.v2 as imageio

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".partial.mp4")
    os.close(fd)
    try:
        imageio.mimwrite(tmp, list(frames), fps=fps, codec="libx264", quality=8, macro_block_size=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ----------------------------------------------------------------------------- generate

def _add_generate(sub) -> None:
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
    p.add_argument("-q", "--quiet", action="store_true", help="print only the output path")
    p.set_defaults(func=cmd_generate)


def cmd_generate(a) -> int:
    from .toy_world import TOY_WORLD_DEFAULTS, TOY_WORLD_PATH, toy_world_prompt

    say = (lambda *_: None) if a.quiet else (lambda msg: print(msg, flush=True))
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
    _finite("--scale", a.scale, 0.0)
    _finite("--fps", a.fps, 0.0, strict=True)
    _finite("--guidance", guidance, 0.0)
    _finite("--residual-guidance", a.residual_guidance, 0.0)
    _finite("--trajectory-guidance", a.trajectory_guidance, 0.0)
    _finite("--start", a.start)
    _finite("--end", a.end)
    if not 0 <= a.start <= a.end <= 1:
        raise UsageError(f"need 0 <= --start <= --end <= 1, got {a.start:g}, {a.end:g}")
    if not 0 <= a.seed < 2**63:
        raise UsageError(f"--seed must lie in [0, 2^63), got {a.seed}")
    if not prompt.strip():
        raise UsageError("--prompt is empty")
    # 2. the model folder (a hub id is checked when it loads) and its sizes
    local = _looks_local(model)
    if local:
        mdir = Path(model)
        if not mdir.is_dir():
            raise UsageError(f"--model {model!r}: no such directory (and not a hub id of the form owner/name)")
        if not (mdir / "model_index.json").is_file():
            raise UsageError(f"--model {model!r} is not a diffusers checkpoint (no model_index.json)")
        spatial, temporal = model_factors(mdir)
    else:
        spatial, temporal = _SPATIAL_DEFAULT, _TEMPORAL_DEFAULT
    check_sizes(frames, height, width, steps, spatial, temporal)
    # 3. the adapter (its config validated: types, ranges, parameter budget)
    from .validation import AdapterConfigError, read_adapter_config

    adapter = a.adapter
    if adapter is None and local and (Path(model) / "pila" / "config.json").is_file():
        adapter = str(Path(model) / "pila")
    if adapter is not None and adapter.lower() == "none":
        adapter = None
    if adapter is not None and _looks_local(adapter):
        try:
            read_adapter_config(adapter)
        except AdapterConfigError as e:
            raise UsageError(f"--adapter: {e}") from None
    # 4. physics categories, device, output
    categories = "auto" if a.physics == "auto" else [c.strip() for c in a.physics.split(",") if c.strip()]
    if categories != "auto":
        from .labels import prior_from_labels

        try:
            prior_from_labels(categories)
        except ValueError as e:
            raise UsageError(f"--physics {a.physics!r}: {e}") from None
    out = check_out(a.out or ("toy_world.mp4" if toy else "video.mp4"), a.overwrite)
    device = check_device(a.device)

    # load and run
    import numpy as np
    import torch

    from .pipeline import WanPILAPipeline

    _quiet_libraries()
    if toy or a.dtype == "float32":
        dtype = torch.float32
    elif a.dtype == "auto":
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    else:
        dtype = getattr(torch, a.dtype)
    t0 = time.perf_counter()
    try:
        if dtype == torch.float32:
            pipe = WanPILAPipeline.from_pretrained(model, dtype=torch.float32, local_files_only=local)
        else:  # the Wan VAE stays in float32
            from diffusers import AutoencoderKLWan

            vae = AutoencoderKLWan.from_pretrained(model, subfolder="vae", dtype=torch.float32, local_files_only=local)
            pipe = WanPILAPipeline.from_pretrained(model, vae=vae, dtype=dtype, local_files_only=local)
    except (OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"could not load --model {model!r}: {str(e).strip().splitlines()[0]}") from None
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        if getattr(pipe, name, None) is not None:
            getattr(pipe, name).eval()
    if not local:  # a hub model: its sizes are known now
        check_sizes(frames, height, width, steps,
                    pipe.vae_scale_factor_spatial * pipe.transformer.config.patch_size[1], pipe.vae_scale_factor_temporal)
    say(f"model: {'the shipped toy world' if toy else model}")
    if a.offload:
        try:
            pipe.enable_model_cpu_offload(device=None if device == "cpu" else device)
        except RuntimeError as e:
            raise UsageError(f"--offload: {str(e).splitlines()[0]}") from None
    elif device != "cpu":
        pipe.to(device)
    if adapter is not None:
        try:
            pipe.load_pila(adapter, scale=a.scale, start=a.start, end=a.end, categories=categories,
                           residual_guidance=a.residual_guidance)
        except (OSError, ValueError, RuntimeError) as e:  # e.g. weights that do not fit the config, other latents
            raise UsageError(f"could not use --adapter {adapter!r}: {str(e).strip().splitlines()[0]}") from None
        say(f"adapter: {adapter}")
    else:
        say("adapter: none (the base model alone)")
    if a.trajectory_guidance > 0:
        from .trajectory_guidance import attach_trajectory_guidance

        attach_trajectory_guidance(pipe, a.trajectory_guidance)
        say(f"trajectory guidance: strength {a.trajectory_guidance:g}")
    if a.trajectory_projection != "off":
        from .trajectory_projection import attach_trajectory_projection

        try:
            attach_trajectory_projection(pipe, law=a.trajectory_projection, space=a.projection_space)
        except ValueError as e:  # e.g. a scheduler that does not predict the flow
            raise UsageError(f"--trajectory-projection: {e}") from None
        where = "last step" if a.projection_space == "latent" else "decoded video"
        say(f"trajectory projection: {a.trajectory_projection} law, {where}")
    pipe.set_progress_bar_config(disable=a.quiet, desc="denoising")
    say(f"generating {frames}x{height}x{width}, {steps} steps, guidance {guidance:g}, "
        f"PILA scale {a.scale:g} on {device}")
    result = pipe(
        prompt=prompt, negative_prompt=a.negative_prompt, height=height, width=width, num_frames=frames,
        num_inference_steps=steps, guidance_scale=guidance,
        generator=torch.Generator(device="cpu").manual_seed(a.seed), output_type="np",
    )
    if pipe.pila is not None and pipe.pila.priors and pipe.pila.priors[0] is not None:
        prior = pipe.pila.priors[0]
        say(f"physics categories ({prior.source}): {', '.join(prior.categories)}")
    video = (np.clip(result.frames[0], 0, 1) * 255).round().astype(np.uint8)
    write_mp4(video, out, a.fps)
    say(f"{video.shape[0]} frames {video.shape[2]}x{video.shape[1]} in {time.perf_counter() - t0:.1f} s")
    print(f"wrote {out.resolve()}")
    return 0


# ----------------------------------------------------------------------------- eval

def _add_eval(sub) -> None:
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
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_eval)


def check_out_dir(out: str) -> Path:
    """An output folder: an existing writable folder, or a new one in an existing folder."""
    path = Path(out)
    if os.path.lexists(path) and not path.is_dir():
        raise UsageError(f"-o/--out {out!r} exists and is not a directory")
    probe_in = path if path.is_dir() else (path.parent if str(path.parent) else Path("."))
    if not probe_in.is_dir():
        raise UsageError(f"-o/--out {out!r}: directory {str(probe_in)!r} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=probe_in, prefix=".visionmoe.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"-o/--out {out!r}: cannot write in {str(probe_in)!r} ({e.strerror})") from None
    return path


def cmd_eval(a) -> int:
    from .toy_world import TOY_WORLD_DEFAULTS, TOY_WORLD_PATH
    from .validation import AdapterConfigError, read_adapter_config

    steps = a.steps if a.steps is not None else TOY_WORLD_DEFAULTS["num_inference_steps"]
    guidance = a.guidance if a.guidance is not None else TOY_WORLD_DEFAULTS["guidance_scale"]
    for name, v in (("--num", a.num), ("--steps", steps), ("--batch", a.batch)) + (
            (("--threads", a.threads),) if a.threads is not None else ()):
        if v < 1:
            raise UsageError(f"{name} must be >= 1, got {v}")
    _finite("--scale", a.scale, 0.0)
    _finite("--guidance", guidance, 0.0)
    _finite("--residual-guidance", a.residual_guidance, 0.0)
    _finite("--trajectory-guidance", a.trajectory_guidance, 0.0)
    start, end = a.window
    _finite("--window", start)
    _finite("--window", end)
    if not 0 <= start <= end <= 1:
        raise UsageError(f"need 0 <= START <= END <= 1 for --window, got {start:g} {end:g}")
    if any(s < 0 for s in a.seed_sets):
        raise UsageError(f"--seed-sets must be >= 0, got {a.seed_sets}")
    model = Path(a.model) if a.model is not None else TOY_WORLD_PATH
    if not (model / "model_index.json").is_file():
        raise UsageError(f"--model {str(model)!r} is not a diffusers checkpoint folder (no model_index.json)")
    specs = a.adapter if a.adapter is not None else (
        [str(model / "pila")] if (model / "pila" / "config.json").is_file() else [])
    adapters = []
    for spec in specs:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        try:
            read_adapter_config(path)
        except AdapterConfigError as e:
            raise UsageError(f"--adapter: {e}") from None
        adapters.append((name or (f"PILA (scale {a.scale:g})" if len(specs) == 1 else Path(path).name), path))
    names = [n for n, _ in adapters]
    if len(set(names)) != len(names) or "base" in names:
        raise UsageError(f"--adapter names must be distinct and not 'base', got {names}")
    device = check_device(a.device)
    out = check_out_dir(a.out)

    import torch

    from . import evaluation as E

    _quiet_libraries()
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


# ----------------------------------------------------------------------------- train

#: flag -> (TrainConfig key, type)
TRAIN_FLAGS = {
    "--stage": ("stage", int), "--data": ("data", str), "--cache-dir": ("cache_dir", str),
    "--output-dir": ("output_dir", str), "--model": ("model", str), "--init-adapter": ("init_adapter", str),
    "--max-steps": ("max_steps", int), "--batch-size": ("batch_size", int),
    "--gradient-accumulation-steps": ("gradient_accumulation_steps", int), "--learning-rate": ("learning_rate", float),
    "--mixed-precision": ("mixed_precision", str), "--num-frames": ("num_frames", int), "--height": ("height", int),
    "--width": ("width", int), "--checkpoint-every": ("checkpoint_every", int), "--log-every": ("log_every", int),
    "--seed": ("seed", int), "--resume": ("resume", str), "--report-to": ("report_to", str),
}


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train", help="train a PILA adapter on a frozen Wan backbone, one stage per run",
        description="Train a PILA adapter (visionmoe.video.train), one stage per run. Several GPUs or machines: "
                    "the same command under `accelerate launch --num_processes N`. A YAML --config can hold any "
                    "TrainConfig key; flags override it; --set key=value sets any other key (value parsed as YAML). "
                    "A run resumes from the latest checkpoint in --output-dir unless --resume none.")
    p.add_argument("--config", help="YAML file of TrainConfig keys")
    for flag, (key, typ) in TRAIN_FLAGS.items():
        p.add_argument(flag, dest=key, type=typ, default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other TrainConfig key")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def cmd_train(a) -> int:
    import yaml

    from .data import ManifestError
    from .train import TrainConfig, train
    from .validation import AdapterConfigError, validate_adapter_config

    overrides = {key: getattr(a, key) for key, _ in TRAIN_FLAGS.values() if getattr(a, key) is not None}
    resume_none = overrides.get("resume") in ("none", "None", "")
    if resume_none:
        overrides["resume"] = None
    for kv in a.set:
        if "=" not in kv:
            raise UsageError(f"--set expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        try:
            overrides[k.strip()] = yaml.safe_load(v)
        except yaml.YAMLError as e:
            raise UsageError(f"--set {kv!r}: the value is not YAML ({str(e).splitlines()[0]})") from None
    try:
        if a.config:
            cfg = TrainConfig.from_yaml(a.config, **overrides)
            if resume_none:
                cfg.resume = None
        else:
            cfg = TrainConfig.from_dict(overrides)
        validate_adapter_config(cfg.adapter, source="adapter options")
    except (AdapterConfigError, ValueError, FileNotFoundError, TypeError, yaml.YAMLError) as e:
        raise UsageError(str(e).strip().splitlines()[0]) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("accelerate", "diffusers", "transformers", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    def show(logs):
        keys = [k for k in logs if k not in ("step", "lr", "sec_per_step")]
        print(f"stage {cfg.stage} step {logs['step']}: " + " ".join(f"{k}={logs[k]:.4g}" for k in keys)
              + f" ({logs['sec_per_step']:.3f} s/step)", flush=True)

    try:
        res = train(cfg, progress=not a.quiet, log_callback=show)
    except (ManifestError, FileNotFoundError, ValueError) as e:
        raise UsageError(str(e).strip().splitlines()[0]) from None
    if int(os.environ.get("RANK", "0")) == 0:
        if res.skipped_videos:
            print(f"{res.skipped_videos} unreadable video(s) skipped (see {cfg.cache_dir}/cache.json)")
        print(f"stage {cfg.stage}: {res.steps} steps, {res.seconds_per_step:.3f} s/step; adapter: {res.adapter_dir}")
    return 0


# ----------------------------------------------------------------------------- entry point

def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                epilog="Run `visionmoe-video COMMAND --help` for a command's options.")
    p.add_argument("--version", action="version", version=f"{PROG} (visionmoe) {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _add_generate(sub)
    _add_eval(sub)
    _add_train(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    a = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if _main_thread() else None
    try:
        return a.func(a)
    except UsageError as e:
        print(f"{PROG} {a.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG} {a.command}: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print(f"{PROG} {a.command}: terminated", file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
