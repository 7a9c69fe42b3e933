#!/usr/bin/env python
"""Distil trajectory-law guidance into an adapter on the toy world: the correction that
guidance computes with a VAE decode and a backward pass at every step, predicted by a forward
pass of an adapter instead.

    python scripts/distill_trajectory_guidance.py record --work out/distill/rec_300000 --num 256 --seed-base 300000
    python scripts/distill_trajectory_guidance.py record --work out/distill/rec_310000 --num 256 --seed-base 310000
    python scripts/distill_trajectory_guidance.py train  --work out/distill --arm pila --steps 4000 --batch 8
    python scripts/distill_trajectory_guidance.py train  --work out/distill --arm plain --steps 4000 --batch 8
    python scripts/distill_trajectory_guidance.py train  --work out/distill --arm pila_large --steps 4000 --batch 8
    python scripts/distill_trajectory_guidance.py train  --work out/distill --arm plain_large --steps 4000 --batch 8
    python scripts/distill_trajectory_guidance.py eval   --work out/distill --num 96 --seed-sets 410000 --out out/distill/eval_410000
    python scripts/distill_trajectory_guidance.py eval   --work out/distill --num 96 --seed-sets 450000 --out out/distill/eval_450000
    python scripts/ablate_pila.py merge --results out/distill/eval_410000/results.json out/distill/eval_450000/results.json --out out/distill/merged
    python scripts/distill_trajectory_guidance.py eval   --work out/distill --arms pila_large_tgd plain_large_tgd --strength 0 \
        --num 96 --seed-sets 410000 450000 --out out/distill/eval_large

(``train`` pools every recording under ``--work``; these are the model card's runs.)

``record`` samples the toy world with guidance attached (strength 0.05 above sigma 0.4, as
shipped) and keeps, for every conditional transformer call, the latents, the conditional
velocity, the noise level, the prompt and the correction guidance added (zero below
``min_sigma``). ``train`` fits an adapter from scratch to those corrections (relative mean
squared error) for ``--steps`` batches; both arms (``pila``: the physics structure at the
ablations' size; ``plain``: the same inputs and about the same size, no fields, experts or
routing) see the same batches. ``eval`` scores the base, guidance itself and the trained arms
on the guarded toy-world evaluation. The adapter is applied like guidance: one correction added to
the guided velocity (``apply_to="guided"``), so the pipeline needs no VAE at inference.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

ARMS = {
    "pila": {"hidden_dim": 64, "slot_dim": 16, "expert_hidden": 64},
    "plain": {"structure": "plain", "hidden_dim": 96, "plain_blocks": 4},
    # the adapter's default width (PILAAdapter's own defaults) and a plain one of about its size
    "pila_large": {"hidden_dim": 256, "slot_dim": 32, "expert_hidden": 256},
    "plain_large": {"structure": "plain", "hidden_dim": 300, "plain_blocks": 4},
}


class _Recorder:
    """A transformer hook that adds trajectory guidance's correction, as the shipped hook does
    (the conditional call computes it, the unconditional call of the same step reuses it), and
    records each conditional call."""

    def __init__(self, guidance):
        from diffusers.hooks import ModelHook

        rec = self

        class Hook(ModelHook):
            def pre_forward(self, module, *args, **kwargs):
                names = ("hidden_states", "timestep", "encoder_hidden_states")
                rec.inputs = [kwargs.get(n, args[i] if len(args) > i else None) for i, n in enumerate(names)]
                return args, kwargs

            def post_forward(self, module, output):
                v = output[0] if isinstance(output, tuple) else output.sample
                v2 = rec.apply(*rec.inputs, v)
                if isinstance(output, tuple):
                    return (v2, *output[1:])
                output.sample = v2
                return output

        self.hook, self.guidance = Hook(), guidance
        self.rows, self.last_x, self.dv = [], None, None

    def apply(self, x_t, timestep, text, v):
        sigma = float(torch.as_tensor(timestep).reshape(-1)[0]) / self.guidance.num_train_timesteps
        if self.last_x is not None and self.last_x.shape == x_t.shape and torch.equal(self.last_x, x_t):
            return v + self.dv  # the unconditional call of the step
        if sigma > self.guidance.min_sigma:
            dv = self.guidance.correction(x_t, v, sigma)
        else:
            dv = torch.zeros_like(v)
        self.last_x, self.dv = x_t.detach().clone(), dv
        self.rows.append((x_t.detach().float().cpu(), v.detach().float().cpu(), dv.detach().float().cpu(), sigma,
                          text.detach().float().cpu()))
        return v + dv


def record(a):
    from diffusers.hooks import HookRegistry

    from visionmoe.video.evaluation.toy_world import generate_clips, toy_world_items
    from visionmoe.video.pila.labels import resolve_prior
    from visionmoe.video.models.toy_world import load_toy_world
    from visionmoe.video.hooks.trajectory_guidance import TrajectoryGuidance

    torch.set_num_threads(a.threads)
    pipe = load_toy_world()
    items = toy_world_items(a.num, a.seed_base)
    rec = _Recorder(TrajectoryGuidance(pipe.vae, a.strength, a.min_sigma))
    HookRegistry.check_if_exists_or_initialize(pipe.transformer).register_hook(rec.hook, "distill_recorder")
    t0 = time.time()
    clips = generate_clips(pipe, items, steps=a.sample_steps, guidance=3.0, batch=8,
                           progress=lambda d, n: print(f"recorded {d}/{n} clips ({time.time() - t0:.0f} s)", flush=True))
    # rows come batch by batch, step by step: each row holds one batch of up to 8 clips
    x = torch.cat([r[0] for r in rec.rows])
    batch = _batch_ids(rec.rows)
    first = [batch.index(b) for b in range(batch[-1] + 1)]
    out = dict(x_t=x.half(), v=torch.cat([r[1] for r in rec.rows]).half(), dv=torch.cat([r[2] for r in rec.rows]),
               sigma=torch.cat([torch.full((r[0].shape[0],), r[3]) for r in rec.rows]),
               text=torch.cat([rec.rows[i][4] for i in first]).half(),  # per clip
               mask=torch.stack([resolve_prior(None, it[0]).mask for it in items]),
               clip=torch.cat([torch.arange(r[0].shape[0]) + 8 * b for b, r in zip(batch, rec.rows)]),
               strength=a.strength, min_sigma=a.min_sigma, seed_base=a.seed_base, num=a.num)
    os.makedirs(a.work, exist_ok=True)
    torch.save(out, os.path.join(a.work, "tg_corrections.pt"))
    print(json.dumps(dict(rows=int(x.shape[0]), clips=a.num, wall_min=round((time.time() - t0) / 60, 2))))
    return clips


def _batch_ids(rows):
    """The generation batch of each recorded row (a new batch starts when sigma jumps back up)."""
    b, prev, ids = -1, None, []
    for r in rows:
        if prev is None or r[3] > prev:
            b += 1
        prev = r[3]
        ids.append(b)
    return ids


def load_records(work: str) -> dict:
    """Every ``tg_corrections.pt`` in ``work`` and its sub-folders, pooled (clip ids offset)."""
    paths = sorted(os.path.join(r, f) for r, _, fs in os.walk(work) for f in fs if f == "tg_corrections.pt")
    if not paths:
        raise SystemExit(f"error: no tg_corrections.pt under {work} (run record first)")
    parts = [torch.load(p) for p in paths]
    out, offset, clips = {}, 0, []
    for d in parts:
        clips.append(d["clip"] + offset)
        offset += d["mask"].shape[0]
    for k in ("x_t", "v", "dv", "sigma", "text", "mask"):
        out[k] = torch.cat([d[k] for d in parts])
    out["clip"] = torch.cat(clips)
    return out


def train(a):
    from visionmoe.video.pila.adapter import PILAAdapter

    torch.set_num_threads(a.threads)
    d = load_records(a.work)
    n = d["x_t"].shape[0]
    torch.manual_seed(0)
    ad = PILAAdapter(latent_channels=d["x_t"].shape[1], text_dim=d["text"].shape[-1], **ARMS[a.arm])
    ad.register_to_config(apply_to="guided")
    ad.train()
    opt = torch.optim.AdamW(ad.parameters(), lr=a.lr)
    scale = float(d["dv"].pow(2).mean())
    g = torch.Generator().manual_seed(1)
    t0 = time.time()
    for step in range(a.steps):
        idx = torch.randint(0, n, (a.batch,), generator=g)
        mask = d["mask"][d["clip"][idx]]
        out = ad(d["x_t"][idx].float(), d["v"][idx].float(), d["sigma"][idx],
                 encoder_hidden_states=d["text"][d["clip"][idx]].float() if ad.text_classifier is not None else None,
                 category_mask=mask, compute_residuals=False)
        loss = (out.dv.float() - d["dv"][idx]).pow(2).mean() / scale
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ad.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"{a.arm} step {step} relative MSE {loss.item():.4f}", flush=True)
    ad.eval()
    out_dir = os.path.join(a.work, f"{a.arm}_tgd")
    ad.save_pretrained(os.path.join(out_dir, "adapter"))
    info = dict(adapter_dir=os.path.join(out_dir, "adapter"), arm=a.arm, params=sum(p.numel() for p in ad.parameters()),
                optimiser_steps=a.steps, batch=a.batch, lr=a.lr, wall_min=round((time.time() - t0) / 60, 2),
                final_relative_mse=float(loss.detach()))
    with open(os.path.join(out_dir, "budget.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(json.dumps(info))


def evaluate(a):
    from visionmoe.video import evaluation as E

    torch.set_num_threads(a.threads)
    arms = [E.Arm(f"trajectory guidance {a.strength:g}", trajectory_guidance=a.strength)] if a.strength > 0 else []
    for name in a.arms:
        b = json.load(open(os.path.join(a.work, name, "budget.json")))
        arms.append(E.Arm(name, adapter=b["adapter_dir"]))
    t0 = time.time()
    ev = E.evaluate_toy_world(arms, num=a.num, seed_sets=a.seed_sets, control=False,
                              progress=lambda n, d, t: print(f"{n}: {d}/{t} ({time.time() - t0:.0f} s)", flush=True))
    ev.save(a.out)
    print(ev.markdown())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=("record", "train", "eval"))
    p.add_argument("--work", default="out/distill")
    p.add_argument("--num", type=int, default=512, help="record: clips")
    p.add_argument("--seed-base", type=int, default=300000, help="record: noise seeds base + i")
    p.add_argument("--sample-steps", type=int, default=20, help="record: inference steps per clip")
    p.add_argument("--strength", type=float, default=0.05)
    p.add_argument("--min-sigma", type=float, default=0.4)
    p.add_argument("--arm", choices=sorted(ARMS), default="pila")
    p.add_argument("--steps", type=int, default=2400)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--arms", nargs="*", default=["pila_tgd", "plain_tgd"], help="eval: trained arms under --work")
    p.add_argument("--seed-sets", type=int, nargs="+", default=[410000], help="eval: noise seed bases")
    p.add_argument("--out", default="out/distill/eval", help="eval: output folder")
    a = p.parse_args(argv)
    for k in ("num", "steps", "batch", "threads", "sample_steps"):
        if getattr(a, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be >= 1")
    {"record": record, "train": train, "eval": evaluate}[a.cmd](a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
