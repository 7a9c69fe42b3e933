#!/usr/bin/env python
"""Two arms that train the deficit world's transformer itself, with the same data, batch, steps,
noise levels and noise as the adapter arms of ``deficit_arms_pila.py`` (issue #49, step 4), each
exported as a world to evaluate:

- ``--arm lora``: a LoRA of about PILA's parameter count, with the adapters' stage-3 losses and
  learning rate;
- ``--arm finetune``: the base fine-tuned with its own recipe: every transformer weight, plain
  flow matching (no law loss), the base's optimiser (AdamW, betas 0.9/0.99, weight decay 0.01,
  learning rate 4e-4 after a 100-step warm-up). No EMA: no arm keeps one.

    python scripts/deficit_lora_arm.py --work out/pila_deficit/arms_seq32 \
        --world out/pila_deficit/world_vae_fg_seq32 --steps 2400
    python scripts/deficit_lora_arm.py --arm finetune --work out/pila_deficit/arms_seq32 \
        --world out/pila_deficit/world_vae_fg_seq32 --steps 2400
    python scripts/eval_deficit.py --world out/pila_deficit/world_vae_fg_seq32 \
        --arm lora=out/pila_deficit/arms_seq32/lora/world \
        --arm finetune=out/pila_deficit/arms_seq32/finetune/world

The LoRA (peft, rank chosen to match ``--params``) sits on every linear layer of the
transformer's blocks: self- and cross-attention projections and the feed-forward. Each step
draws the same clips, noise levels, noise and empty prompts (10%) as an adapter run of the same
seed, and minimises flow matching plus ``--w-law`` x each labelled category's laws on the
clean estimate the model's velocity implies (:func:`visionmoe.video.training.losses.law_loss`).
A LoRA is merged into the weights; the world is saved beside the run (a plain ``WanPipeline``
folder). Needs the latent cache an adapter arm built in ``--work``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F
from deficit_arms_pila import add_training_arguments, write_budget


def lora_targets(transformer) -> list:
    """The names of the linear layers inside the transformer's blocks."""
    return [n for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("blocks.")]


def rank_for(transformer, names: list, params: int) -> int:
    """The LoRA rank whose A and B matrices over ``names`` hold about ``params`` parameters."""
    mods = dict(transformer.named_modules())
    per_rank = sum(mods[n].in_features + mods[n].out_features for n in names)
    return max(1, round(params / per_rank))


# the base's own optimiser (scripts/train_toy_world.py fit_dit)
FINETUNE_LR, FINETUNE_BETAS, FINETUNE_WEIGHT_DECAY, FINETUNE_WARMUP = 4e-4, (0.9, 0.99), 0.01, 100


def trainable(a, transformer):
    """The module to train, its trainable parameters, its optimiser and a description."""
    if a.arm == "finetune":
        transformer.requires_grad_(True)
        params = list(transformer.parameters())
        opt = torch.optim.AdamW(params, lr=FINETUNE_LR, betas=FINETUNE_BETAS, weight_decay=FINETUNE_WEIGHT_DECAY)
        return transformer, params, opt, dict(lr=FINETUNE_LR, warmup=FINETUNE_WARMUP)
    from peft import LoraConfig, get_peft_model

    names = lora_targets(transformer)
    rank = rank_for(transformer, names, a.params)
    model = get_peft_model(transformer, LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=names))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)  # the adapters' (TrainConfig)
    return model, params, opt, dict(lr=a.lr, rank=rank, targets=len(names))


def train_arm(a):
    from diffusers.optimization import get_scheduler
    from eval_deficit import trained_sequence_length
    from visionmoe.video.data.cache import LatentCache, collate
    from visionmoe.video.training.backbone import empty_prompt_embedding, load_backbone
    from visionmoe.video.training.config import TrainConfig
    from visionmoe.video.training.losses import law_loss, sample_sigmas
    from visionmoe.video.training.sampling import _mix, batch_indices

    torch.manual_seed(a.seed)
    seq = trained_sequence_length({"world": a.world})
    cfg = TrainConfig(stage=3, model=a.world, cache_dir=os.path.join(a.work, "cache"), batch_size=a.batch,
                      max_sequence_length=seq, sigma_shift=6.0, learning_rate=a.lr, seed=a.seed,
                      apply_to="each_branch", w_law=a.w_law, output_dir=os.path.join(a.work, "lora"))
    pipe = load_backbone(a.world)
    dataset = LatentCache(cfg.cache_dir)
    uncond = empty_prompt_embedding(pipe, seq)
    model, params, opt, recipe = trainable(a, pipe.transformer)
    model.train()
    warmup = recipe.get("warmup", cfg.warmup_steps)
    sched = get_scheduler("constant_with_warmup", opt, num_warmup_steps=warmup, num_training_steps=a.steps)
    t0, log = time.time(), []
    for step in range(a.steps):
        batch = collate([dataset[i] for i in batch_indices(step, cfg.batch_size, len(dataset), cfg.seed, 0, 1)], seq)
        # the adapter arms' draws, in their order (losses.stage_losses): noise, levels, label
        # masks (unused: a LoRA has no routing), empty prompts
        gen = torch.Generator().manual_seed(_mix(cfg.seed, 7, step, 0))
        x0, text, labels = batch["latents"].float(), batch["text"], batch["labels"]
        B = x0.shape[0]
        eps = torch.randn(x0.shape, generator=gen)
        sigma = sample_sigmas(torch.rand(B, generator=gen), cfg)
        torch.rand(B, generator=gen)
        drop = torch.rand(B, generator=gen) < cfg.uncond_prob
        text = torch.where(drop.view(B, 1, 1), uncond.to(text.dtype).expand(B, -1, -1), text)
        s = sigma.view(B, 1, 1, 1, 1)
        x_t = (1 - s) * x0 + s * eps
        pred = model(hidden_states=x_t, timestep=sigma * 1000.0, encoder_hidden_states=text, return_dict=False)[0]
        flow = F.mse_loss(pred, eps - x0)
        law = law_loss(x_t, pred, sigma, labels, a.law_tolerance, kind=a.laws)
        total = cfg.w_flow * flow + a.w_law * law
        total.backward()
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % 100 == 0 or step + 1 == a.steps:
            log.append(dict(step=step + 1, flow=flow.item(), law=law.item()))
            print(json.dumps(log[-1]), flush=True)
    out = os.path.join(a.work, a.arm + ("_track" if a.laws == "track" else "") + (f"_seed{a.seed}" if a.seed else ""))
    world = os.path.join(out, "world")
    if os.path.isdir(world):
        shutil.rmtree(world)
    shutil.copytree(a.world, world)
    merged = (model if a.arm == "finetune" else model.merge_and_unload()).eval()
    shutil.rmtree(os.path.join(world, "transformer"))
    merged.save_pretrained(os.path.join(world, "transformer"))
    info = dict(arm=a.arm, world=world, params=sum(p.numel() for p in params), **recipe,
                steps=a.steps, batch=a.batch, seed=a.seed, w_law=a.w_law,
                wall_min=round((time.time() - t0) / 60, 2), last=log[-1] if log else {},
                threads=torch.get_num_threads())
    write_budget(out, info)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="out/pila_deficit/arms_seq32")
    p.add_argument("--world", default="out/pila_deficit/world_vae_fg_seq32")
    p.add_argument("--arm", choices=["lora", "finetune"], default="lora")
    p.add_argument("--params", type=int, default=185_004, help="the LoRA's parameter count to match (PILA's)")
    add_training_arguments(p)
    a = p.parse_args(argv)
    if a.arm == "finetune" and "--w-law" not in (sys.argv[1:] if argv is None else argv):
        a.w_law = 0.0  # the base's recipe is flow matching alone
    torch.set_num_threads(a.threads)
    if not os.path.isdir(os.path.join(a.work, "cache")):
        p.error(f"no latent cache in {a.work}: train an adapter arm there first (deficit_arms_pila.py train)")
    train_arm(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
