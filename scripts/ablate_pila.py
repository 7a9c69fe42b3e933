#!/usr/bin/env python
"""PILA ablations at an equal, reduced budget on the toy world, scored on the same held-out seeds.

    python scripts/ablate_pila.py train --work out/ablate --arm pila [--steps 120 --batch 4]
    python scripts/ablate_pila.py eval  --work out/ablate --num 96 --seed-sets 990000
    python scripts/ablate_pila.py merge --results out/ablate/eval_990000/results.json out/ablate/eval_880000/results.json

Arms (each trained on the same clips, same batches, same number of optimiser steps, float32,
one thread): ``pila`` (stages 1, 2, 3: S/6, S/6, 2S/3 steps; stage 3 with the physics term and
the guided velocity), ``no_residual`` (w_residual = w_physics = 0), ``no_anchor`` (anchors read
as zeros), ``one_expert`` (one expert refining every slot, expert width x6: same size),
``plain`` (same inputs and about the same size, no fields / experts / routing / residuals;
S stage-3 steps), ``finetune`` (the base transformer itself fine-tuned with the flow-matching
loss for S steps). Budgets and wall times go to ``WORK/<arm>/budget.json``.

``--apply-to each_branch`` trains the adapter arms to correct every transformer call (the
conditional velocity with 10% empty prompts, no guided target; see ``visionmoe.video.hooks.pila``)
into ``WORK/<arm>_eb``; evaluate them with ``--arms pila_eb plain_eb ...``. ``--rollout-steps k``
trains stage 3 on the sampler's own states (suffix ``_rk``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


ADAPTER = {"hidden_dim": 64, "slot_dim": 16, "expert_hidden": 64}
ARMS = {
    "pila": dict(adapter=ADAPTER),
    "no_residual": dict(adapter=ADAPTER, w_residual=0.0, w_physics=0.0),
    "no_anchor": dict(adapter={**ADAPTER, "anchor": False}),
    "one_expert": dict(adapter={**ADAPTER, "single_expert": True, "expert_hidden": 6 * 64}),
    "plain": dict(adapter={"structure": "plain", "hidden_dim": 96, "plain_blocks": 4}),
    "finetune": dict(),
}


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


def arm_dir(a) -> str:
    return a.arm + ("_eb" if a.apply_to == "each_branch" else "") + (f"_r{a.rollout_steps}" if a.rollout_steps else "")


def common(a, pipe_dir):
    guidance = a.guidance if a.apply_to == "guided" else 1.0  # each_branch trains on each branch's own velocity
    return dict(model=pipe_dir, cache_dir=os.path.join(a.work, "cache"), batch_size=a.batch, max_sequence_length=512,
                log_every=10, checkpoint_every=10**6, save_dtype="float32", flow_guidance=guidance, sigma_shift=6.0,
                learning_rate=a.lr, seed=0, apply_to=a.apply_to, rollout_steps=a.rollout_steps,
                rollout_guidance=a.guidance)


def train_arm(a):
    from visionmoe.video.training.backbone import load_backbone
    from visionmoe.video.training.config import TrainConfig
    from visionmoe.video.training.loop import train
    from visionmoe.video.models.toy_world import TOY_WORLD_PATH

    pipe_dir = str(TOY_WORLD_PATH)
    pipe = load_backbone(pipe_dir)
    out = os.path.join(a.work, arm_dir(a))
    os.makedirs(out, exist_ok=True)
    S = a.steps
    t0 = time.time()
    base = common(a, pipe_dir)
    if not os.path.isdir(base["cache_dir"]):
        base["data"] = os.path.join(a.work, "clips", "manifest.jsonl")
    if a.arm == "finetune":
        info = finetune(a, pipe, base)
    else:
        spec = dict(ARMS[a.arm])
        stages = [(3, S)] if spec["adapter"].get("structure") == "plain" else [(1, S // 6), (2, S // 6), (3, S - 2 * (S // 6))]
        prev = None
        for stage, steps in stages:
            cfg = TrainConfig(stage=stage, output_dir=os.path.join(out, f"s{stage}"), init_adapter=prev, max_steps=steps,
                              **{**base, **spec})
            res = train(cfg, pipe=pipe)
            base.pop("data", None)
            prev = res.adapter_dir
        from visionmoe.video.pila.adapter import PILAAdapter

        ad = PILAAdapter.from_pretrained(prev)
        info = dict(adapter_dir=prev, params=n_params(ad), stages=stages)
    info.update(arm=a.arm, apply_to=a.apply_to, optimiser_steps=S, batch=a.batch, wall_min=round((time.time() - t0) / 60, 2),
                base_params=n_params(pipe.transformer), threads=torch.get_num_threads())
    with open(os.path.join(out, "budget.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(json.dumps(info))


def finetune(a, pipe, base):
    """Ablation (b): the base transformer fine-tuned with the flow-matching loss on its own
    (conditional) velocity, same clips, batches, steps; with ``--apply-to each_branch`` also the
    base's own recipe for guidance (10% empty prompts) and ``--finetune-lr``."""
    import torch.nn.functional as F

    from visionmoe.video.data.cache import LatentCache, collate
    from visionmoe.video.training.backbone import empty_prompt_embedding
    from visionmoe.video.training.config import TrainConfig
    from visionmoe.video.training.loop import prepare_cache
    from visionmoe.video.training.sampling import _mix, batch_indices, sample_sigmas

    base = {k: v for k, v in base.items() if k != "apply_to"}
    if a.rollout_steps:
        raise SystemExit("--rollout-steps concerns the adapter arms")
    out = os.path.join(a.work, arm_dir(a))
    cfg = TrainConfig(stage=3, output_dir=out, max_steps=a.steps, **base)
    prepare_cache(cfg, pipe)
    ds = LatentCache(cfg.cache_dir)
    tr = pipe.transformer
    tr.requires_grad_(True).train()
    lr = a.finetune_lr or a.lr
    opt = torch.optim.AdamW(tr.parameters(), lr=lr)
    drop_p = 0.1 if a.apply_to == "each_branch" else 0.0
    uncond = empty_prompt_embedding(pipe, 512)
    for step in range(a.steps):
        batch = collate([ds[i] for i in batch_indices(step, a.batch, len(ds), 0, 0, 1)], 512)
        gen = torch.Generator().manual_seed(_mix(0, 7, step, 0))
        x0, text = batch["latents"].float(), batch["text"]
        eps = torch.randn(x0.shape, generator=gen)
        sigma = sample_sigmas(torch.rand(len(x0), generator=gen), cfg)
        if drop_p > 0:
            drop = torch.rand(len(x0), generator=gen) < drop_p
            text = torch.where(drop.view(-1, 1, 1), uncond.to(text.dtype).expand(len(x0), -1, -1), text)
        s = sigma.view(-1, 1, 1, 1, 1)
        v = tr(hidden_states=(1 - s) * x0 + s * eps, timestep=sigma * 1000, encoder_hidden_states=text,
               return_dict=False)[0]
        loss = F.mse_loss(v, eps - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            print(f"finetune step {step} loss {loss.item():.4f}", flush=True)
    tr.eval().requires_grad_(False)
    d = os.path.join(out, "transformer")
    tr.save_pretrained(d)
    return dict(transformer_dir=d, params=n_params(tr), learning_rate=lr, uncond_prob=drop_p)


def eval_arms(a):
    from visionmoe.video import evaluation as E

    arms = []
    for name in a.arms:
        b = json.load(open(os.path.join(a.work, name, "budget.json")))
        if name.startswith("finetune"):
            arms.append(E.Arm(name, transformer=b["transformer_dir"]))
        else:
            arms.append(E.Arm(name, adapter=b["adapter_dir"]))
    t0 = time.time()
    ev = E.evaluate_toy_world(arms, num=a.num, seed_sets=a.seed_sets, control=False,
                              progress=lambda n, d, t: print(f"{n}: {d}/{t} ({time.time() - t0:.0f} s)", flush=True))
    ev.save(a.out)
    print(ev.markdown())


def merge(a):
    """Pool the per-clip rows of several ``eval`` runs (different seed sets) and summarise them."""
    from visionmoe.video import evaluation as E

    per = {}
    for path in a.results:
        for name, rows in json.load(open(path))["per_clip"].items():
            per.setdefault(name, []).extend(rows)
    s = E.summarize(per)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "table.md"), "w") as fh:
        fh.write(s.markdown() + "\n")
    print(s.markdown())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["clips", "train", "eval", "merge"])
    p.add_argument("--results", nargs="+", default=[], help="merge: results.json files of eval runs")
    p.add_argument("--work", default="out/ablate")
    p.add_argument("--arm", choices=sorted(ARMS))
    p.add_argument("--arms", nargs="+", default=list(ARMS))
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--finetune-lr", type=float, default=None, help="learning rate of the fine-tuned base (default: --lr)")
    p.add_argument("--guidance", type=float, default=3.0, help="flow_guidance of the adapters' stage 3 (guided)")
    p.add_argument("--apply-to", choices=["guided", "each_branch"], default="guided",
                   help="where the adapter arms' correction is applied (and so trained)")
    p.add_argument("--rollout-steps", type=int, default=0,
                   help="adapter arms: stage 3 on the sampler's own states (TrainConfig.rollout_steps) -> WORK/<arm>..._rN")
    p.add_argument("--num-clips", type=int, default=256)
    p.add_argument("--num", type=int, default=48)
    p.add_argument("--seed-sets", type=int, nargs="+", default=[990_000, 880_000])
    p.add_argument("--out", default=None)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.what == "clips":
        from visionmoe.video.data.synthetic import write_dataset

        write_dataset(os.path.join(a.work, "clips"), a.num_clips, seed=1, scenarios=["free_fall", "bounce"])
    elif a.what == "train":
        if a.arm is None:
            p.error("train needs --arm")
        train_arm(a)
    elif a.what == "merge":
        a.out = a.out or os.path.join(a.work, "eval_pooled")
        merge(a)
    else:
        a.out = a.out or os.path.join(a.work, "eval_" + "_".join(map(str, a.seed_sets)))
        eval_arms(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
