#!/usr/bin/env python
"""PILA and a plain adapter of about the same size, each with the same physics loss, trained on
the lawful set of the deficit world (issue #49, step 4; training seeds with ``--seed``).

    python scripts/deficit_arms_pila.py clips --work W --per-scenario 128
    python scripts/deficit_arms_pila.py train --work W --world WORLD --arm pila --steps 2400 [--seed 1]
    python scripts/deficit_arms_pila.py train --work W --world WORLD --arm plain --steps 2400 [--seed 1]
    python scripts/eval_deficit.py --world WORLD --seed-start 930000000 --num 24 \
        --adapter pila=W/pila/s3/adapter --adapter plain=W/plain/s3/adapter

Data: the lawful clips of :mod:`visionmoe.video.data.law_variants` (simulation seeds 300 000 000
on: neither the deficit world's training mix nor the evaluation's seeds), labelled with their
scenario's category (projectile and sliding: rigid; bounce: elastic; stream: liquid), written as
near-lossless mp4 with a manifest and cached through the world's VAE and text encoder.

Arms, at equal optimiser steps, batch, data, learning rate and seed (float32, one thread), both
correcting each transformer call (``apply_to="each_branch"``, 10% empty prompts, as the shipped
adapter) with the same stage-3 losses: flow matching through the frozen world plus
``--w-law`` x each labelled category's own laws on the corrected clean estimate
(:mod:`visionmoe.video.pila.law_residuals`) and the default trajectory term:

- ``pila``: the toy world's adapter size; stages 1 / 2 / 3 on S/6, S/6, 2S/3 steps.
- ``plain``: no fields, experts, routing or bank residuals, about the same parameter count; S
  stage-3 steps.

Controls (each in its own folder, ``<arm>[_shuffled][_flow_only][_law_shiftK][_track][_seedN]``):
``--labels shuffled`` (the labels permuted across clips), ``--w-law 0`` (flow matching only),
``--law-shift K`` (each label held to the laws of the category K places on in the taxonomy: the
wrong-law residual). ``deficit_lora_arm.py`` trains the LoRA arm on the same cache.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from visionmoe.video.data.law_variants import LAW_SCENARIOS, generate_law_clip

ADAPTER = {"hidden_dim": 64, "slot_dim": 16, "expert_hidden": 64}
ARMS = {"pila": {"hidden_dim": 64, "slot_dim": 16, "expert_hidden": 64},
        "plain": {"structure": "plain", "hidden_dim": 96, "plain_blocks": 4}}
SEED_BASE = 300_000_000


def write_clips(a):
    from visionmoe.video.data.synthetic import write_video

    root = os.path.join(a.work, "clips")
    os.makedirs(os.path.join(root, "videos"), exist_ok=True)
    lines = []
    for i in range(a.per_scenario):
        for sc in LAW_SCENARIOS:
            seed = SEED_BASE + i
            c = generate_law_clip(sc, seed, True)
            name = f"{sc}_{seed}"
            write_video(os.path.join(root, "videos", name + ".mp4"), c.frames, 8)
            lines.append(json.dumps({"video": f"videos/{name}.mp4", "caption": c.caption,
                                     "labels": [LAW_SCENARIOS[sc]], "scenario": sc, "seed": seed}))
    with open(os.path.join(root, "manifest.jsonl"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} lawful clips to {root}")


def manifest_and_cache(a):
    """The manifest and latent cache of --labels: the clips' own, or the same clips with their
    labels permuted across clips (a seeded shuffle: the labels then say nothing about the clip)."""
    root = os.path.join(a.work, "clips")
    if a.labels == "true":
        return os.path.join(root, "manifest.jsonl"), os.path.join(a.work, "cache")
    path = os.path.join(root, "manifest_shuffled.jsonl")
    if not os.path.exists(path):
        with open(os.path.join(root, "manifest.jsonl")) as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(SEED_BASE)).tolist()
        labels = [rows[i]["labels"] for i in order]
        with open(path, "w") as fh:
            fh.write("".join(json.dumps({**r, "labels": lab}) + "\n" for r, lab in zip(rows, labels)))
    return path, os.path.join(a.work, "cache_shuffled")


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


def train_arm(a):
    from visionmoe.video.pila.adapter import PILAAdapter
    from visionmoe.video.training.backbone import load_backbone
    from visionmoe.video.training.config import TrainConfig
    from visionmoe.video.training.loop import train

    from eval_deficit import trained_sequence_length

    pipe = load_backbone(a.world)
    name = (a.arm + ("_shuffled" if a.labels == "shuffled" else "") + ("_flow_only" if a.w_law == 0 else "")
            + (f"_law_shift{a.law_shift}" if a.law_shift else "") + ("_track" if a.laws == "track" else "")
            + (f"_seed{a.seed}" if a.seed else ""))
    out = os.path.join(a.work, name)
    os.makedirs(out, exist_ok=True)
    manifest, cache = manifest_and_cache(a)
    base = dict(model=a.world, cache_dir=cache, batch_size=a.batch,
                max_sequence_length=trained_sequence_length({"world": a.world}),
                log_every=10, checkpoint_every=10**6, save_dtype="float32", flow_guidance=1.0, sigma_shift=6.0,
                learning_rate=a.lr, seed=a.seed, apply_to="each_branch", w_law=a.w_law,
                law_tolerance=a.law_tolerance, law_shift=a.law_shift, law_kind=a.laws)
    if not os.path.isdir(base["cache_dir"]):
        base["data"] = manifest
    S = a.steps
    spec = ARMS[a.arm]
    stages = [(3, S)] if spec.get("structure") == "plain" else [(1, S // 6), (2, S // 6), (3, S - 2 * (S // 6))]
    t0, prev, hist = time.time(), None, []
    for stage, steps in stages:
        cfg = TrainConfig(stage=stage, output_dir=os.path.join(out, f"s{stage}"), init_adapter=prev, max_steps=steps,
                          adapter=spec, **base)
        res = train(cfg, pipe=pipe)
        base.pop("data", None)
        prev = res.adapter_dir
        hist.append({"stage": stage, "last": res.history[-1] if res.history else {}})
    ad = PILAAdapter.from_pretrained(prev)
    info = dict(arm=a.arm, labels=a.labels, law_shift=a.law_shift, laws=a.laws, adapter_dir=prev, params=n_params(ad),
                stages=stages, batch=a.batch, lr=a.lr, seed=a.seed,
                w_law=a.w_law, wall_min=round((time.time() - t0) / 60, 2), history=hist,
                threads=torch.get_num_threads())
    write_budget(out, info)


def write_budget(out: str, info: dict) -> None:
    """An arm's ``budget.json`` (its size, steps, data and time), also printed."""
    with open(os.path.join(out, "budget.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(json.dumps(info))


def add_training_arguments(p) -> None:
    """The optimisation every arm shares (``deficit_lora_arm.py`` reads the same)."""
    p.add_argument("--steps", type=int, default=2400)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--w-law", type=float, default=1.0)
    p.add_argument("--law-tolerance", type=float, default=0.0)
    p.add_argument("--laws", choices=["field", "track"], default="field",
                   help="the law loss: field laws (law_residuals) or track laws (track_laws)")
    p.add_argument("--threads", type=int, default=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["clips", "train"])
    p.add_argument("--work", default="out/pila_deficit/arms")
    p.add_argument("--world", default="out/pila_deficit/world")
    p.add_argument("--arm", choices=sorted(ARMS))
    p.add_argument("--per-scenario", type=int, default=128)
    add_training_arguments(p)
    p.add_argument("--law-shift", type=int, default=0,
                   help="the wrong-law control: each label held to the laws of the category this many places on")
    p.add_argument("--labels", choices=["true", "shuffled"], default="true",
                   help="the clips' category labels, or the same labels permuted across clips (a control)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.what == "clips":
        write_clips(a)
    else:
        if a.arm is None:
            p.error("train needs --arm")
        train_arm(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
