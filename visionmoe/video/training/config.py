"""The configuration of a PILA training run (:class:`TrainConfig`, readable from YAML) and its
result (:class:`TrainResult`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

__all__ = ["STAGES", "TrainConfig", "TrainResult"]


STAGES = (1, 2, 3)


_SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


_ADAPTER_KEYS = {"patch_size", "hidden_dim", "slot_dim", "expert_hidden", "experts_per_category", "top_k",
                 "flow_window", "flow_reg", "kappa", "structure", "anchor", "single_expert", "plain_blocks",
                 "context_blocks", "clip_context"}


@dataclass
class TrainConfig:
    """Training configuration (also readable from YAML, see :meth:`from_yaml`).

    Data: ``data`` is a JSONL manifest or a folder of captioned videos; it is encoded once
    into ``cache_dir`` (default ``<output_dir>/cache``). With ``data`` unset, an existing
    ``cache_dir`` is used as is.
    Model: ``model`` is ``"tiny"`` / ``"tiny-2.2"`` (the embedded offline tiny Wan 2.1 / 2.2)
    or a local path / hub id of a diffusers Wan checkpoint.
    """

    stage: int = 1
    output_dir: str = "pila-out"
    data: Optional[str] = None
    cache_dir: Optional[str] = None
    model: str = "tiny"
    init_adapter: Optional[str] = None
    adapter: Dict[str, Any] = field(default_factory=lambda: {"hidden_dim": 64, "slot_dim": 16, "expert_hidden": 64})
    # video / text
    num_frames: int = 17
    height: int = 64
    width: int = 64
    max_sequence_length: int = 512  # WanPipeline pads prompts to 512 tokens: train as inference runs
    # optimisation
    max_steps: int = 1000
    batch_size: int = 4
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    mixed_precision: str = "no"  # frozen backbone in "bf16" / "fp16" (CUDA) / float32 ("no"); the adapter trains in float32
    cpu: bool = False  # force CPU (also automatic for several processes on a machine without CUDA)
    seed: int = 0
    # noise levels: sigma = shift * u / (1 + (shift - 1) * u), u ~ U(0, 1) or logit-normal
    sigma_sampling: str = "uniform"  # "uniform" or "logit_normal"
    sigma_shift: float = 3.0
    pila_scale: float = 1.0
    label_mask_prob: float = 0.5
    # loss weights
    w_anchor: float = 1.0
    w_kinematic: float = 0.0  # stage 1: a = dv/dt on the proxies (zero on the anchors by construction; off)
    w_category: float = 1.0
    w_classifier: float = 1.0
    w_balance: float = 0.01
    w_z: float = 0.001
    w_residual: float = 0.1
    w_flow: float = 1.0
    w_motion: float = 0.0  # stage 3: temporal 1st/2nd differences of the flow error (see module doc)
    w_physics: float = 1.0  # stage 3: trajectory law on the corrected clean-latent estimate, through dv
    # stage 3: each labelled category's own laws on the corrected estimate, through dv, hinged at
    # law_tolerance (visionmoe.video.pila.law_residuals; 0 = off)
    w_law: float = 0.0
    law_tolerance: float = 0.0
    # a control: each labelled category is held to the laws of the category law_shift places on
    # in the taxonomy (3: rigid to gas's, elastic to thermal's, liquid to optics'); 0 = its own
    law_shift: int = 0
    # which laws: "field" (law_residuals: the estimate's flow and contrast) or "track" (track_laws:
    # inequalities on the moving object's centroid track)
    law_kind: str = "field"
    # stage 3: the velocity the correction is added to, as the pipeline applies it:
    # v_u + g (v_c - v_u) with g = flow_guidance (1 = the conditional velocity only)
    flow_guidance: float = 1.0
    # stage 3: "guided" (one dv added to the guided velocity) or "each_branch" (the adapter
    # corrects each transformer call; trained on the conditional velocity, see the module doc)
    apply_to: str = "guided"
    uncond_prob: float = 0.1  # each_branch: share of samples trained with the empty prompt
    # stage 3: train on states reached by the sampler (see module doc); 0 steps = off
    rollout_steps: int = 0
    rollout_prob: float = 1.0
    rollout_du: float = 0.05  # one inference step before the shift (1 / num_inference_steps)
    rollout_shift: float = 3.0  # the inference scheduler's flow_shift
    rollout_guidance: float = 3.0  # the inference guidance scale (1 = conditional only)
    # bookkeeping
    checkpoint_every: int = 500
    checkpoints_total_limit: Optional[int] = 3
    resume: Optional[str] = "auto"  # "auto" (latest in output_dir), a checkpoint dir, or None
    log_every: int = 10
    report_to: str = "none"  # "none", "tensorboard", "wandb", ... (accelerate trackers)
    num_workers: int = 0
    cache_batch_size: int = 1
    shard_size: int = 64
    save_dtype: str = "float32"  # dtype of the saved adapter weights; "float16" halves the file

    def __post_init__(self):
        errs = []
        if self.stage not in STAGES:
            errs.append(f"stage must be 1, 2 or 3, got {self.stage!r}")
        if self.num_frames < 5 or (self.num_frames - 1) % 4:
            errs.append(f"num_frames must be 4k+1 (Wan), e.g. 17 or 81, got {self.num_frames}")
        if self.height % 16 or self.width % 16 or self.height <= 0 or self.width <= 0:
            errs.append(f"height and width must be positive multiples of 16, got {self.height}x{self.width}")
        for k in ("max_steps", "batch_size", "gradient_accumulation_steps", "checkpoint_every", "log_every",
                  "max_sequence_length", "cache_batch_size", "shard_size"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1:
                errs.append(f"{k} must be an integer >= 1, got {getattr(self, k)!r}")
        if not self.learning_rate > 0:
            errs.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            errs.append(f"mixed_precision must be 'no', 'bf16' or 'fp16', got {self.mixed_precision!r}")
        if self.save_dtype not in _SAVE_DTYPES:
            errs.append(f"save_dtype must be one of {sorted(_SAVE_DTYPES)}, got {self.save_dtype!r}")
        if self.sigma_sampling not in ("uniform", "logit_normal"):
            errs.append(f"sigma_sampling must be 'uniform' or 'logit_normal', got {self.sigma_sampling!r}")
        if not self.sigma_shift > 0:
            errs.append(f"sigma_shift must be > 0, got {self.sigma_shift}")
        if not 0.0 <= self.label_mask_prob <= 1.0:
            errs.append(f"label_mask_prob must lie in [0, 1], got {self.label_mask_prob}")
        if not isinstance(self.rollout_steps, int) or self.rollout_steps < 0:
            errs.append(f"rollout_steps must be an integer >= 0, got {self.rollout_steps!r}")
        if not 0.0 <= self.rollout_prob <= 1.0:
            errs.append(f"rollout_prob must lie in [0, 1], got {self.rollout_prob}")
        if not self.flow_guidance >= 0:
            errs.append(f"flow_guidance must be >= 0, got {self.flow_guidance}")
        if not self.law_tolerance >= 0:
            errs.append(f"law_tolerance must be >= 0, got {self.law_tolerance}")
        if not isinstance(self.law_shift, int) or self.law_shift < 0:
            errs.append(f"law_shift must be an integer >= 0, got {self.law_shift!r}")
        if self.law_kind not in ("field", "track"):
            errs.append(f"law_kind must be 'field' or 'track', got {self.law_kind!r}")
        if self.apply_to not in ("guided", "each_branch"):
            errs.append(f"apply_to must be 'guided' or 'each_branch', got {self.apply_to!r}")
        elif self.apply_to == "each_branch" and self.flow_guidance != 1.0:
            errs.append("apply_to='each_branch' trains on each branch's own velocity: flow_guidance must be 1")
        if not 0.0 <= self.uncond_prob <= 1.0:
            errs.append(f"uncond_prob must lie in [0, 1], got {self.uncond_prob}")
        if not (self.rollout_du > 0 and self.rollout_shift > 0 and self.rollout_guidance >= 0):
            errs.append("rollout_du and rollout_shift must be > 0 and rollout_guidance >= 0")
        for f_ in dataclasses.fields(self):
            if f_.name.startswith("w_") and getattr(self, f_.name) < 0:
                errs.append(f"{f_.name} must be >= 0, got {getattr(self, f_.name)}")
        unknown = set(self.adapter) - _ADAPTER_KEYS
        if unknown:
            errs.append(f"unknown adapter option(s) {sorted(unknown)}; allowed: {sorted(_ADAPTER_KEYS)}")
        if self.data is None and self.cache_dir is None:
            errs.append("give data (a manifest or a folder of captioned videos) or cache_dir (an existing latent cache)")
        if errs:
            raise ValueError("invalid TrainConfig: " + "; ".join(errs))
        if self.cache_dir is None:
            self.cache_dir = os.path.join(self.output_dir, "cache")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown config key(s) {sorted(unknown)}; valid keys: {sorted(names)}")
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str, **overrides) -> "TrainConfig":
        import yaml

        if not os.path.isfile(path):
            raise FileNotFoundError(f"config file not found: {path}")
        with open(path) as fh:
            d = yaml.safe_load(fh) or {}
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a mapping of config keys, got {type(d).__name__}")
        d.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(d)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str) -> None:
        import yaml

        with open(path, "w") as fh:
            yaml.safe_dump(self.to_dict(), fh, sort_keys=False)


@dataclass
class TrainResult:
    steps: int  # optimiser steps done in total (including before a resume)
    history: List[Dict[str, float]]  # one entry per logged step of this run
    seconds_per_step: float  # mean wall time per optimiser step of this run
    adapter_dir: str
    resumed_from: Optional[str]
    skipped_videos: int
