"""The embedded tiny Wan pipeline (configs shipped in the package, ``visionmoe/video/models/assets/tiny_wan``).

Built offline from configs with weights drawn deterministically from a seed (the RNG of the
caller is left untouched). Wan 2.1 layout: one transformer. Wan 2.2 layout: a high-noise
``transformer`` and a low-noise ``transformer_2`` (different seeds) switched at
``boundary_ratio``. A test fixture: its videos are structured noise, not content.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import torch

#: the configs ship as package data (installed with the wheel, found from any directory)
DEFAULT_ASSETS = Path(str(files("visionmoe.video.models").joinpath("assets", "tiny_wan")))


def _read(path: Path) -> dict:
    cfg = json.loads(path.read_text())
    return {k: v for k, v in cfg.items() if not k.startswith("_") and k != "architectures"}


def tiny_wan_components(
    version: str = "2.1", seed: int = 0, path: str | Path | None = None, boundary_ratio: float = 0.875
) -> dict:
    """Components dict for ``diffusers.WanPipeline(**components)``."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    if version not in ("2.1", "2.2"):
        raise ValueError(f"version must be '2.1' (one transformer) or '2.2' (two transformers), got {version!r}")
    root = Path(path) if path is not None else DEFAULT_ASSETS
    if not (root / "transformer" / "config.json").is_file():
        raise FileNotFoundError(f"tiny Wan configs not found under {root} (expected transformer/config.json)")

    def seeded(k: int, build):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1000 + k)
            return build().eval()

    tcfg = _read(root / "transformer" / "config.json")
    tcfg["patch_size"] = tuple(tcfg["patch_size"])
    components = {
        "transformer": seeded(1, lambda: WanTransformer3DModel(**tcfg)),
        "vae": seeded(2, lambda: AutoencoderKLWan(**_read(root / "vae" / "config.json"))),
        "text_encoder": seeded(3, lambda: UMT5EncoderModel(UMT5Config(**_read(root / "text_encoder" / "config.json")))),
        "tokenizer": PreTrainedTokenizerFast(
            tokenizer_file=str(root / "tokenizer" / "tokenizer.json"),
            pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=512,
        ),
        "scheduler": UniPCMultistepScheduler(**_read(root / "scheduler" / "scheduler_config.json")),
    }
    if version == "2.2":
        components["transformer_2"] = seeded(4, lambda: WanTransformer3DModel(**tcfg))
        components["boundary_ratio"] = boundary_ratio
    return components


def load_tiny_wan(version: str = "2.1", seed: int = 0, path: str | Path | None = None, boundary_ratio: float = 0.875):
    """A ``diffusers.WanPipeline`` with tiny deterministic random weights (CPU, float32)."""
    from diffusers import WanPipeline

    pipe = WanPipeline(**tiny_wan_components(version, seed, path, boundary_ratio))
    pipe.set_progress_bar_config(disable=True)
    return pipe
