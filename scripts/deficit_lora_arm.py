#!/usr/bin/env python
"""A LoRA on the deficit world's transformer, of about PILA's parameter count, trained with the
same stage-3 losses, data, batch, steps, learning rate and noise as the adapter arms of
``deficit_arms_pila.py`` (issue #49, step 4's LoRA arm), and exported as a world to evaluate:

    python scripts/deficit_lora_arm.py --work out/pila_deficit/arms_seq32 \
        --world out/pila_deficit/world_vae_fg_seq32 --steps 2400
    python scripts/eval_deficit.py --world out/pila_deficit/world_vae_fg_seq32 \
        --arm lora=out/pila_deficit/arms_seq32/lora/world

The LoRA (peft, rank chosen to match ``--params``) sits on every linear layer of the
transformer's blocks: self- and cross-attention projections and the feed-forward. Each step
draws the same clips, noise levels, noise and empty prompts (10%) as an adapter run of the same
seed, and minimises flow matching plus ``--w-law`` x each labelled category's laws on the
clean estimate the LoRA's velocity implies (:func:`visionmoe.video.training.losses.law_loss`).
The LoRA is merged into the weights and the world saved beside it (a plain ``WanPipeline``
folder). Needs the latent cache an adapter arm built in ``--work``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def train_lora(a):
    from diffusers.optimization import get_scheduler
    from eval_deficit import trained_sequence_length
    from peft import LoraConfig, get_peft_model

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
    names = lora_targets(pipe.transformer)
    rank = rank_for(pipe.transformer, names, a.params)
    model = get_peft_model(pipe.transformer, LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0,
                                                        target_modules=names))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    sched = get_scheduler("constant_with_warmup", opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=a.steps)
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
        law = law_loss(x_t, pred, sigma, labels, a.law_tolerance)
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
    out = os.path.join(a.work, "lora" + (f"_seed{a.seed}" if a.seed else ""))
    world = os.path.join(out, "world")
    if os.path.isdir(world):
        shutil.rmtree(world)
    shutil.copytree(a.world, world)
    merged = model.merge_and_unload().eval()
    shutil.rmtree(os.path.join(world, "transformer"))
    merged.save_pretrained(os.path.join(world, "transformer"))
    info = dict(arm="lora", world=world, rank=rank, params=sum(p.numel() for p in params), targets=len(names),
                steps=a.steps, batch=a.batch, lr=a.lr, seed=a.seed, w_law=a.w_law,
                wall_min=round((time.time() - t0) / 60, 2), last=log[-1] if log else {},
                threads=torch.get_num_threads())
    write_budget(out, info)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="out/pila_deficit/arms_seq32")
    p.add_argument("--world", default="out/pila_deficit/world_vae_fg_seq32")
    p.add_argument("--params", type=int, default=185_004, help="the parameter count to match (PILA's)")
    add_training_arguments(p)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if not os.path.isdir(os.path.join(a.work, "cache")):
        p.error(f"no latent cache in {a.work}: train an adapter arm there first (deficit_arms_pila.py train)")
    train_lora(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
