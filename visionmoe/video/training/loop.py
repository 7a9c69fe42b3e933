"""The training loop of one PILA stage on ``accelerate`` (:func:`train`): the accelerator, the
frozen backbone and the latent cache, the adapter and its optimiser, resuming from the latest
checkpoint, the steps, checkpoints and the saved adapter. What a stage trains and its losses:
:mod:`visionmoe.video.training` and :mod:`.losses`."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
import shutil
import time
from typing import Callable, Dict, List, Optional

import torch

from .backbone import empty_prompt_embedding, load_backbone, trainable_parameters
from .config import _SAVE_DTYPES, TrainConfig, TrainResult
from .losses import stage_losses
from .sampling import _mix, batch_indices

logger = logging.getLogger(__name__)

__all__ = ["prepare_cache", "train"]


def _latest_checkpoint(output_dir: str) -> Optional[str]:
    root = os.path.join(output_dir, "checkpoints")
    if not os.path.isdir(root):
        return None
    steps = [(int(m.group(1)), d) for d in os.listdir(root) if (m := re.fullmatch(r"checkpoint-(\d+)", d))
             and os.path.isfile(os.path.join(root, d, "trainer_state.json"))]
    return os.path.join(root, max(steps)[1]) if steps else None


def _reset_accelerate_state():
    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    if not (dist.is_available() and dist.is_initialized()):
        AcceleratorState._reset_state(reset_partial_state=True)


def prepare_cache(cfg: TrainConfig, pipe, accelerator=None, progress: bool = True):
    """Build (or reuse) the latent cache of ``cfg.data`` in ``cfg.cache_dir`` on the main process."""
    from ..data.cache import CacheConfig, build_cache
    from ..data.manifest import load_records

    report = None
    is_main = accelerator is None or accelerator.is_main_process
    if cfg.data is not None and is_main:
        records = load_records(cfg.data)
        cc = CacheConfig(cfg.num_frames, cfg.height, cfg.width, cfg.max_sequence_length, cfg.model)
        report = build_cache(records, pipe, cfg.cache_dir, cc, shard_size=cfg.shard_size,
                             batch_size=cfg.cache_batch_size, progress=progress)
        logger.info("latent cache: %d new, %d reused, %d skipped", report.cached, report.already_cached, report.skipped)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return report


def _make_accelerator(cfg: TrainConfig):
    """The run's ``Accelerator`` (its state reset first), seeded with ``cfg.seed``."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration, set_seed

    if cfg.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise ValueError("mixed_precision='fp16' needs a CUDA GPU; use 'bf16' or 'no' on CPU")
    _reset_accelerate_state()
    # Several processes without CUDA (``accelerate launch --multi_gpu`` / ``torchrun`` on a CPU
    # machine): without cpu=True accelerate would run them as independent single processes.
    cpu = cfg.cpu or (not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1)
    # Mixed precision = the frozen backbone's weights and compute in bf16/fp16 (nearly all the
    # FLOPs); the adapter (a few % of them) keeps float32 weights, compute and gradients, so
    # no loss scaling is needed and accelerate's autocast wrapping is not used.
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision="no",
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        log_with=None if cfg.report_to == "none" else cfg.report_to,
        project_config=ProjectConfiguration(project_dir=cfg.output_dir, logging_dir=os.path.join(cfg.output_dir, "logs")),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False)],
    )
    set_seed(cfg.seed)
    return accelerator


def _prepare_backbone(cfg: TrainConfig, pipe, accelerator, progress: bool):
    """The frozen backbone on its devices, the latent cache built, the empty prompt's embedding
    when guided training needs it: ``(pipe, cache report, uncond)``."""
    device = accelerator.device
    if accelerator.is_main_process:
        os.makedirs(cfg.output_dir, exist_ok=True)
        cfg.to_yaml(os.path.join(cfg.output_dir, f"config_stage{cfg.stage}.yaml"))
    weight_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mixed_precision, torch.float32)
    if pipe is None:
        pipe = load_backbone(cfg.model, weight_dtype)
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        m = getattr(pipe, name, None)
        if m is not None:
            m.requires_grad_(False).eval()
    # the VAE and text encoder are needed only to build the cache; training needs the transformer(s)
    encoders = [m for m in (getattr(pipe, "vae", None), getattr(pipe, "text_encoder", None)) if m is not None]
    if cfg.data is not None and accelerator.is_main_process:
        for m in encoders:
            m.to(device)
    report = prepare_cache(cfg, pipe, accelerator, progress=progress and accelerator.is_main_process)
    uncond = None
    if cfg.stage == 3 and ((cfg.rollout_steps > 0 and cfg.rollout_guidance != 1.0) or cfg.flow_guidance != 1.0
                           or (cfg.apply_to == "each_branch" and cfg.uncond_prob > 0)):
        if getattr(pipe, "text_encoder", None) is None:
            raise ValueError("guided training (rollouts, flow_guidance or each_branch's empty prompts) needs the "
                             "pipeline's text encoder (for the empty prompt)")
        uncond = empty_prompt_embedding(pipe, cfg.max_sequence_length).to(device)
    if device.type != "cpu":
        for m in encoders:
            m.to("cpu")
    for name in ("transformer", "transformer_2"):
        if getattr(pipe, name, None) is not None:
            getattr(pipe, name).to(device)
    return pipe, report, uncond


def _open_cache(cfg: TrainConfig):
    """The latent cache, checked against the config's sizes."""
    from ..data.cache import LatentCache

    dataset = LatentCache(cfg.cache_dir)
    cc = dataset.config
    if (cc["num_frames"], cc["height"], cc["width"]) != (cfg.num_frames, cfg.height, cfg.width):
        raise ValueError(f"the cache in {cfg.cache_dir} holds {cc['num_frames']} frames at {cc['height']}x{cc['width']}, "
                         f"the config asks for {cfg.num_frames} at {cfg.height}x{cfg.width}")
    return dataset


def _make_adapter(cfg: TrainConfig, dataset, device):
    """The adapter to train (``init_adapter`` or a new one sized by the cache), in training mode."""
    from ..pila.adapter import PILAAdapter

    sample = dataset[0]
    text_dim = int(sample["text"].shape[-1])
    latent_channels = int(sample["latents"].shape[0])

    if cfg.init_adapter:
        if not os.path.isdir(cfg.init_adapter):
            raise FileNotFoundError(f"init_adapter folder not found: {cfg.init_adapter}")
        adapter = PILAAdapter.from_pretrained(cfg.init_adapter)
        adapter.check_compatible(latent_channels=latent_channels, text_dim=text_dim, where="latent cache")
    else:
        adapter = PILAAdapter(latent_channels=latent_channels, text_dim=text_dim, **cfg.adapter)
    if cfg.stage == 3:
        adapter.register_to_config(apply_to=cfg.apply_to)  # how the pipeline is to apply what this stage trains
    adapter.to(device).train()
    return adapter


def _resume(cfg: TrainConfig, accelerator) -> tuple:
    """``(step, checkpoint)`` to continue from (``(0, None)`` for a new run)."""
    step, resumed = 0, None
    ckpt = _latest_checkpoint(cfg.output_dir) if cfg.resume == "auto" else cfg.resume
    if ckpt:
        if not os.path.isfile(os.path.join(ckpt, "trainer_state.json")):
            raise FileNotFoundError(f"not a training checkpoint (no trainer_state.json): {ckpt}")
        state = json.load(open(os.path.join(ckpt, "trainer_state.json")))
        if state["stage"] != cfg.stage:
            raise ValueError(f"checkpoint {ckpt} is from stage {state['stage']}, this run trains stage {cfg.stage}; "
                             f"use init_adapter with the previous stage's adapter and a new output_dir")
        accelerator.load_state(ckpt)
        step, resumed = int(state["step"]), ckpt
        logger.info("resumed from %s at step %d", ckpt, step)
    return step, resumed


def _optimiser_step(run: dict, step: int) -> Dict[str, float]:
    """One optimiser step of ``gradient_accumulation_steps`` micro-batches; the mean loss terms."""
    from ..data.cache import collate

    cfg, accelerator, model, params = run["cfg"], run["accelerator"], run["model"], run["params"]
    optimizer, lr_scheduler, dataset = run["optimizer"], run["lr_scheduler"], run["dataset"]
    rank, world = accelerator.process_index, accelerator.num_processes
    acc: Dict[str, float] = {}
    for a in range(cfg.gradient_accumulation_steps):
        micro = step * cfg.gradient_accumulation_steps + a
        items = [dataset[i] for i in batch_indices(micro, cfg.batch_size, len(dataset), cfg.seed, rank, world)]
        batch = collate(items, cfg.max_sequence_length)
        gen = torch.Generator().manual_seed(_mix(cfg.seed, 7, micro, rank))
        with accelerator.accumulate(model):
            L = stage_losses(model, run["raw"], run["pipe"], batch, cfg, gen, accelerator.device, run["uncond"])
            # experts that no token chose this step still take part (zero gradient), so
            # DistributedDataParallel sees every trainable parameter in every step
            touch = sum(p_.sum() for p_ in params) * 0.0
            accelerator.backward(L["total"] + touch)
            if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        for k, v in L.items():
            acc[k] = acc.get(k, 0.0) + float(v.detach()) / cfg.gradient_accumulation_steps
    return acc


def _run_steps(run: dict, step: int, progress: bool, log_callback) -> tuple:
    """Optimiser steps from ``step`` to ``max_steps`` with logs and checkpoints:
    ``(last step, history, times)``."""
    cfg, accelerator, lr_scheduler = run["cfg"], run["accelerator"], run["lr_scheduler"]
    device = accelerator.device
    history: List[Dict[str, float]] = []
    bar = None
    if progress and accelerator.is_main_process:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.max_steps, initial=step, desc=f"stage {cfg.stage}", unit="step")
    log_path = os.path.join(cfg.output_dir, "train_log.jsonl")
    times = []
    while step < cfg.max_steps:
        t0 = time.perf_counter()
        acc = _optimiser_step(run, step)
        step += 1
        times.append(time.perf_counter() - t0)
        if any(not math.isfinite(v) for v in acc.values()):
            raise FloatingPointError(f"non-finite loss at step {step}: {acc}; lower learning_rate or check the data")
        logs = {k: accelerator.reduce(torch.tensor(v, device=device), "mean").item() for k, v in sorted(acc.items())}
        logs.update(step=step, lr=lr_scheduler.get_last_lr()[0], sec_per_step=times[-1])
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            history.append(logs)
            if cfg.report_to != "none":
                accelerator.log(logs, step=step)
            if accelerator.is_main_process:
                with open(log_path, "a") as fh:
                    fh.write(json.dumps({"stage": cfg.stage, **logs}) + "\n")
                logger.info("stage %d step %d: %s", cfg.stage, step, {k: round(v, 5) for k, v in logs.items()})
                if log_callback is not None:
                    log_callback(logs)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{logs['total']:.4g}")
        if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
            _save_checkpoint(accelerator, cfg, step)
    if bar is not None:
        bar.close()
    return step, history, times


def _save_adapter(cfg: TrainConfig, accelerator, model) -> str:
    """Save the trained adapter (in ``save_dtype``) to ``output_dir/adapter``; returns that folder."""
    accelerator.wait_for_everyone()
    adapter_dir = os.path.join(cfg.output_dir, "adapter")
    if accelerator.is_main_process:
        final = accelerator.unwrap_model(model)
        if cfg.stage >= 2 and final.text_classifier is not None:
            final.text_classifier.trained.fill_(True)
        if cfg.save_dtype != "float32":  # a cast copy: the trained model stays as it is
            final = copy.deepcopy(final).to(_SAVE_DTYPES[cfg.save_dtype])
        final.save_pretrained(adapter_dir)
    accelerator.wait_for_everyone()
    return adapter_dir


def train(cfg: TrainConfig, *, progress: bool = False, log_callback: Optional[Callable[[Dict], None]] = None,
          pipe=None) -> TrainResult:
    """Run one training stage (see :mod:`visionmoe.video.training`). Returns a :class:`TrainResult`.

    ``pipe`` may pass an already loaded Wan pipeline (else ``cfg.model`` is loaded).
    """
    from diffusers.optimization import get_scheduler

    accelerator = _make_accelerator(cfg)
    device = accelerator.device
    pipe, report, uncond = _prepare_backbone(cfg, pipe, accelerator, progress)
    dataset = _open_cache(cfg)
    adapter = _make_adapter(cfg, dataset, device)
    params = trainable_parameters(adapter, cfg.stage)
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    lr_scheduler = get_scheduler("constant_with_warmup", optimizer, num_warmup_steps=cfg.warmup_steps * accelerator.num_processes,
                                 num_training_steps=cfg.max_steps * accelerator.num_processes)
    model, optimizer, lr_scheduler = accelerator.prepare(adapter, optimizer, lr_scheduler)
    raw = accelerator.unwrap_model(model)

    step, resumed = _resume(cfg, accelerator)
    if cfg.report_to != "none":
        accelerator.init_trackers("pila", config={k: v for k, v in cfg.to_dict().items() if not isinstance(v, dict)})
    run = dict(cfg=cfg, accelerator=accelerator, model=model, raw=raw, pipe=pipe, params=params, optimizer=optimizer,
               lr_scheduler=lr_scheduler, dataset=dataset, uncond=uncond)
    step, history, times = _run_steps(run, step, progress, log_callback)
    adapter_dir = _save_adapter(cfg, accelerator, model)
    if cfg.report_to != "none":
        accelerator.end_training()
    return TrainResult(step, history, float(sum(times) / max(len(times), 1)), adapter_dir, resumed,
                       report.skipped if report else 0)


def _save_checkpoint(accelerator, cfg: TrainConfig, step: int) -> None:
    root = os.path.join(cfg.output_dir, "checkpoints")
    path = os.path.join(root, f"checkpoint-{step}")
    accelerator.wait_for_everyone()
    accelerator.save_state(path)
    if accelerator.is_main_process:
        with open(os.path.join(path, "trainer_state.json"), "w") as fh:
            json.dump({"step": step, "stage": cfg.stage}, fh)
        if cfg.checkpoints_total_limit:
            old = sorted((int(d.split("-")[1]), d) for d in os.listdir(root) if re.fullmatch(r"checkpoint-\d+", d))
            for _, d in old[: max(len(old) - cfg.checkpoints_total_limit, 0)]:
                shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    accelerator.wait_for_everyone()
