#!/usr/bin/env python
"""Generation time of the toy world with rigid-body trajectory projection (on the last step's
clean latent, and on the decoded video) against the base model (the named baseline), in one
process: the same clips, prompts and seeds, the arms' runs alternating, median over repeats,
and the ratio of the medians.

    python scripts/bench_trajectory_projection.py [--num 48] [--repeats 3] [--seed 660000]
        [--threads 1] [--guidance-arm]

``--guidance-arm`` also times trajectory-law guidance (0.05), about 7x the base: slow.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread(s)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num", type=int, default=48, help="clips per timed run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=660_000, help="noise-seed base of the clips")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--guidance-arm", action="store_true", help="also time trajectory-law guidance 0.05")
    a = p.parse_args(argv)
    if a.num < 1 or a.repeats < 1 or a.threads < 1:
        p.error("--num, --repeats and --threads must be >= 1")
    torch.set_num_threads(a.threads)

    from visionmoe.video import evaluation as E
    from visionmoe.video.models.toy_world import load_toy_world
    from visionmoe.video.hooks.trajectory_guidance import attach_trajectory_guidance, detach_trajectory_guidance
    from visionmoe.video.hooks.trajectory_projection import attach_trajectory_projection, detach_trajectory_projection

    pipe = load_toy_world()
    items = E.toy_world_items(a.num, a.seed)
    E.generate_clips(pipe, items[:min(8, a.num)])  # warm-up, not timed
    arms = {"base": (lambda: None, lambda: None),
            "trajectory projection (gravity)": (lambda: attach_trajectory_projection(pipe, 1, "gravity"),
                                                lambda: detach_trajectory_projection(pipe)),
            "trajectory projection (gravity, pixels)": (
                lambda: attach_trajectory_projection(pipe, 1, "gravity", space="pixels"),
                lambda: detach_trajectory_projection(pipe))}
    if a.guidance_arm:
        arms["trajectory guidance 0.05"] = (lambda: attach_trajectory_guidance(pipe, 0.05),
                                            lambda: detach_trajectory_guidance(pipe))
    times = {name: [] for name in arms}
    for _ in range(a.repeats):
        for name, (attach, detach) in arms.items():
            attach()
            try:
                t0 = time.perf_counter()
                E.generate_clips(pipe, items)
                times[name].append(time.perf_counter() - t0)
            finally:
                detach()
    base = statistics.median(times["base"])
    print(f"toy world, {a.num} clips per run (seeds {a.seed}+), 20 steps, guidance 3, {a.repeats} repeats; {machine()}")
    print("| arm | median s | runs (s) | x base |")
    print("|---|---:|---|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.1f} | {', '.join(f'{t:.1f}' for t in ts)} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
