#!/usr/bin/env python
"""The independent law judge (issue #49, step 5) on the clips an ``eval_deficit.py`` run saved:

    python scripts/judge_deficit.py --judge out/pila_deficit/judge --eval out/pila_deficit/arms_seq32/eval_s93

The judge (:mod:`visionmoe.video.evaluation.law_judge`) is trained once on simulator clips of
its own seeds and saved in ``--judge`` (reused when there). It is checked on held-out simulator
clips, then every arm's clips (``frames_<arm>.npz`` in each ``--eval`` folder) get a
probability of lawful motion; a clip whose object is found in fewer than 8 frames gets 0.
Per arm and category: the mean probability with a 95% bootstrap interval (2000 resamples over
clips, seeded) and, for each arm other than ``base``, the paired change against ``base`` in
points beside the paired change of the headline's law error (``per_clip.json``): the judge
agrees with the headline when a lower law error comes with a higher probability. Writes
``judge_table.md`` and ``judge_summary.json`` into each ``--eval`` folder.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from eval_deficit import boot, paired

from visionmoe.video.data.law_variants import LAW_SCENARIOS, generate_law_clip
from visionmoe.video.evaluation.law_judge import (JUDGE_SEED_BASE, judge_clips, load_judge, save_judge,
                                                  train_law_judge)

SCENARIOS = tuple(LAW_SCENARIOS)
HELD_OUT_SEEDS = JUDGE_SEED_BASE + 10_000_000


def get_judge(a):
    if os.path.exists(os.path.join(a.judge, "judge.json")):
        return load_judge(a.judge)
    t0 = time.time()
    judge = train_law_judge(num_per_scenario=a.train_per_scenario, steps=a.train_steps, seed=a.seed)
    acc = held_out_accuracy(judge, a.check_per_scenario)
    save_judge(judge, a.judge, train_per_scenario=a.train_per_scenario, train_steps=a.train_steps, seed=a.seed,
               train_seeds=JUDGE_SEED_BASE, held_out_seeds=HELD_OUT_SEEDS, held_out_accuracy=acc,
               minutes=round((time.time() - t0) / 60, 2))
    print(f"judge trained in {time.time() - t0:.0f} s; held-out simulator accuracy {acc}")
    return judge


def held_out_accuracy(judge, num):
    """Accuracy (probability on the right side of 0.5) per scenario on held-out simulator clips."""
    out = {}
    for sc in SCENARIOS:
        clips = [generate_law_clip(sc, HELD_OUT_SEEDS + i, ok) for i in range(num) for ok in (True, False)]
        p = judge_clips(judge, [c.frames for c in clips], [sc] * len(clips), [c.caption for c in clips])
        truth = np.array([c.params["lawful"] for c in clips])
        out[sc] = float(np.mean((p > 0.5) == (truth > 0.5)))
    return out


def judge_eval_dir(judge, folder):
    arms = sorted(f[len("frames_"):-len(".npz")] for f in os.listdir(folder)
                  if f.startswith("frames_") and f.endswith(".npz"))
    if "base" not in arms:
        raise SystemExit(f"{folder}: no frames_base.npz (run eval_deficit.py there first)")
    arms.remove("base")
    arms.insert(0, "base")
    errors = {}
    per_clip = os.path.join(folder, "per_clip.json")
    if os.path.exists(per_clip):
        with open(per_clip) as fh:
            errors = {arm: {f"{r['scenario']}_{r['seed']}": r["error"] for r in rows} for arm, rows in json.load(fh).items()}
    keys = list(np.load(os.path.join(folder, "frames_base.npz")).files)
    lawful = {k: generate_law_clip(k.rsplit("_", 1)[0], int(k.rsplit("_", 1)[1]), True) for k in keys}
    unlawful = {k: generate_law_clip(k.rsplit("_", 1)[0], int(k.rsplit("_", 1)[1]), False) for k in keys}
    scen = [k.rsplit("_", 1)[0] for k in keys]
    caps = [lawful[k].caption for k in keys]
    probs = {"simulator lawful": judge_clips(judge, [lawful[k].frames for k in keys], scen, caps),
             "simulator unlawful": judge_clips(judge, [unlawful[k].frames for k in keys], scen, caps)}
    for arm in arms:
        fr = np.load(os.path.join(folder, f"frames_{arm}.npz"))
        missing = [k for k in keys if k not in fr.files]
        if missing:
            raise SystemExit(f"{folder}: frames_{arm}.npz lacks {len(missing)} of the base's clips")
        probs[arm] = judge_clips(judge, [fr[k] for k in keys], scen, caps)
    return keys, scen, probs, errors, arms


def report(folder, keys, scen, probs, errors, arms):
    scen = np.array(scen)
    lines = ["| arm | category | P(lawful), judge |", "|---|---|---|"]
    summary = {}
    for arm, p in probs.items():
        for sc in SCENARIOS + ("all",):
            m = np.ones(len(p), bool) if sc == "all" else scen == sc
            s = boot(p[m], np.random.default_rng(0))
            summary[f"{arm}/{sc}"] = s
            lines.append(f"| {arm} | {sc} (n={int(m.sum())}) | {100 * s[0]:.0f}% [{100 * s[1]:.0f}, {100 * s[2]:.0f}] |")
    lines += ["", "Paired against `base` (same seeds): the judge's change in points, the headline's law error change",
              "", "| arm | category | judge, points | law error (headline) |", "|---|---|---|---|"]
    for arm in arms[1:]:
        for sc in SCENARIOS + ("all",):
            m = np.ones(len(keys), bool) if sc == "all" else scen == sc
            j = paired(probs["base"][m], probs[arm][m], np.random.default_rng(1), False)
            summary[f"{arm}-vs-base/{sc}"] = {"judge": j}
            head = ""
            if "base" in errors and arm in errors:
                e0 = np.array([errors["base"][k] for k, mm in zip(keys, m) if mm])
                e1 = np.array([errors[arm][k] for k, mm in zip(keys, m) if mm])
                h = paired(e0, e1, np.random.default_rng(1), True)
                summary[f"{arm}-vs-base/{sc}"]["law_error"] = h
                head = f"{100 * h[0]:+.1f}% [{100 * h[1]:+.1f}, {100 * h[2]:+.1f}]"
            lines.append(f"| {arm} | {sc} | {100 * j[0]:+.1f} [{100 * j[1]:+.1f}, {100 * j[2]:+.1f}] | {head} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(folder, "judge_table.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(folder, "judge_summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judge", default="out/pila_deficit/judge", help="the judge's folder (trained there if empty)")
    p.add_argument("--eval", action="append", default=[], help="an eval_deficit.py output folder (repeatable)")
    p.add_argument("--train-per-scenario", type=int, default=400)
    p.add_argument("--train-steps", type=int, default=1500)
    p.add_argument("--check-per-scenario", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    for folder in a.eval:
        if not os.path.isdir(folder):
            p.error(f"not an eval folder: {folder}")
    judge = get_judge(a)
    for folder in a.eval:
        print(f"## {folder}\n")
        print(report(folder, *judge_eval_dir(judge, folder)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
