#!/usr/bin/env python
"""Train a PILA adapter on a frozen Wan backbone, one stage per run (see visionmoe.video.train).

One process (CPU or one GPU):

    python scripts/train_pila.py --data manifest.jsonl --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers \\
        --stage 1 --output-dir runs/s1 --max-steps 2000 --mixed-precision bf16
    python scripts/train_pila.py --cache-dir runs/s1/cache --stage 2 --init-adapter runs/s1/adapter --output-dir runs/s2 ...
    python scripts/train_pila.py --cache-dir runs/s1/cache --stage 3 --init-adapter runs/s2/adapter --output-dir runs/s3 ...

Several GPUs or machines: the same command under ``accelerate launch --num_processes N``
(``--cpu`` for CPU processes with gloo). A YAML file (``--config``) can hold any TrainConfig
key; flags override it; ``--set key=value`` sets any other key (value parsed as YAML).
Runs resume from the latest checkpoint in the output folder unless ``--resume none``.
"""

import argparse
import logging
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FLAGS = {  # flag -> (TrainConfig key, type)
    "--stage": ("stage", int), "--data": ("data", str), "--cache-dir": ("cache_dir", str),
    "--output-dir": ("output_dir", str), "--model": ("model", str), "--init-adapter": ("init_adapter", str),
    "--max-steps": ("max_steps", int), "--batch-size": ("batch_size", int),
    "--gradient-accumulation-steps": ("gradient_accumulation_steps", int), "--learning-rate": ("learning_rate", float),
    "--mixed-precision": ("mixed_precision", str), "--num-frames": ("num_frames", int), "--height": ("height", int),
    "--width": ("width", int), "--checkpoint-every": ("checkpoint_every", int), "--log-every": ("log_every", int),
    "--seed": ("seed", int), "--resume": ("resume", str), "--report-to": ("report_to", str),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML file of TrainConfig keys")
    for flag, (key, typ) in FLAGS.items():
        p.add_argument(flag, dest=key, type=typ, default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other TrainConfig key")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)

    import yaml

    from visionmoe.video.data import ManifestError
    from visionmoe.video.train import TrainConfig, train

    overrides = {key: getattr(a, key) for key, _ in FLAGS.values() if getattr(a, key) is not None}
    if overrides.get("resume") in ("none", "None", ""):
        overrides["resume"] = None
        a.resume_none = True
    for kv in a.set:
        if "=" not in kv:
            p.error(f"--set expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        overrides[k.strip()] = yaml.safe_load(v)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("accelerate", "diffusers", "transformers", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if a.config:
            cfg = TrainConfig.from_yaml(a.config, **overrides)
            if getattr(a, "resume_none", False):
                cfg.resume = None
        else:
            cfg = TrainConfig.from_dict(overrides)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))

    def show(logs):
        keys = [k for k in logs if k not in ("step", "lr", "sec_per_step")]
        print(f"stage {cfg.stage} step {logs['step']}: " + " ".join(f"{k}={logs[k]:.4g}" for k in keys)
              + f" ({logs['sec_per_step']:.3f} s/step)", flush=True)

    try:
        res = train(cfg, progress=not a.quiet, log_callback=show)
    except (ManifestError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        if res.skipped_videos:
            print(f"{res.skipped_videos} unreadable video(s) skipped (see {cfg.cache_dir}/cache.json)")
        print(f"stage {cfg.stage}: {res.steps} steps, {res.seconds_per_step:.3f} s/step; adapter: {res.adapter_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
