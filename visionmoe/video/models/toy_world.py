"""The toy physics world model shipped in the package (``visionmoe/video/models/assets/toy_world``).

A real diffusers Wan 2.1 pipeline (``AutoencoderKLWan``, ``WanTransformer3DModel``, a small
``UMT5EncoderModel`` and a word-level tokenizer, ``UniPCMultistepScheduler``) trained here
from scratch by ``scripts/train_toy_world.py`` on procedural clips of
:mod:`visionmoe.video.data.synthetic` (64x64, 17 frames, one ball falling or bouncing, captioned
with its colour). See ``visionmoe/video/models/assets/toy_world/MODEL_CARD.md`` for how it was made and what it can
and cannot do. It loads offline in about a second and generates a clip in seconds on a CPU.

Its PILA adapter (if shipped) lives in its ``pila`` folder.
"""

from __future__ import annotations

import logging
from importlib.resources import files
from pathlib import Path
from typing import Optional, Union

import torch

logger = logging.getLogger(__name__)

#: package data: installed with the wheel, so the loader works from any directory
TOY_WORLD_PATH = Path(str(files("visionmoe.video.models").joinpath("assets", "toy_world")))

#: generation defaults the model was trained for
TOY_WORLD_DEFAULTS = dict(height=64, width=64, num_frames=17, num_inference_steps=20, guidance_scale=3.0)

#: the colours and motions the training captions contain
TOY_WORLD_COLORS = ("red", "green", "blue", "yellow", "orange", "purple")


def toy_world_prompt(color: str = "red", motion: str = "bounce") -> str:
    """A caption in the training distribution: ``motion`` is ``"bounce"`` or ``"fall"``."""
    art = "an" if color[0] in "aeiou" else "a"
    if motion == "bounce":
        return f"{art} {color} ball falls and bounces on the floor, each bounce lower than the last"
    if motion == "fall":
        return f"{art} {color} ball is dropped and falls straight down"
    raise ValueError(f"motion must be 'bounce' or 'fall', got {motion!r}")


def load_toy_world(path: Optional[Union[str, Path]] = None, device: Union[str, torch.device] = "cpu",
                   dtype: torch.dtype = torch.float32):
    """Load the shipped toy world model as a ``diffusers.WanPipeline`` (offline, eval mode).

    Args:
        path: a folder in the ``WanPipeline.save_pretrained`` layout (default: the shipped
            ``visionmoe/video/models/assets/toy_world``).
        device, dtype: where to put it.
    """
    from diffusers import WanPipeline

    root = Path(path) if path is not None else TOY_WORLD_PATH
    if not (root / "model_index.json").is_file():
        raise FileNotFoundError(
            f"toy world model not found: expected {root / 'model_index.json'} (a WanPipeline.save_pretrained "
            "folder); train one with scripts/train_toy_world.py or pass path=")
    pipe = WanPipeline.from_pretrained(str(root), dtype=dtype, local_files_only=True)
    for name in ("transformer", "vae", "text_encoder"):
        getattr(pipe, name).eval()
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    logger.info("loaded toy world model from %s", root)
    return pipe


def toy_world_adapter_path(path: Optional[Union[str, Path]] = None) -> Optional[Path]:
    """The shipped PILA adapter folder of the toy world model, or ``None`` when absent."""
    root = (Path(path) if path is not None else TOY_WORLD_PATH) / "pila"
    return root if (root / "config.json").is_file() else None
