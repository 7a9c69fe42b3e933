"""``visionmoe-video train``: one stage of PILA training (:func:`visionmoe.video.training.train`),
configured by a YAML file, flags and ``--set key=value``."""

from __future__ import annotations

import logging
import os

from ...common.cli import CLIError


#: flag -> (TrainConfig key, type)
TRAIN_FLAGS = {
    "--stage": ("stage", int), "--data": ("data", str), "--cache-dir": ("cache_dir", str),
    "--output-dir": ("output_dir", str), "--model": ("model", str), "--init-adapter": ("init_adapter", str),
    "--max-steps": ("max_steps", int), "--batch-size": ("batch_size", int),
    "--gradient-accumulation-steps": ("gradient_accumulation_steps", int), "--learning-rate": ("learning_rate", float),
    "--mixed-precision": ("mixed_precision", str), "--num-frames": ("num_frames", int), "--height": ("height", int),
    "--width": ("width", int), "--checkpoint-every": ("checkpoint_every", int), "--log-every": ("log_every", int),
    "--seed": ("seed", int), "--resume": ("resume", str), "--report-to": ("report_to", str),
}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="train a PILA adapter on a frozen Wan backbone, one stage per run",
        description="Train a PILA adapter (visionmoe.video.training), one stage per run. Several GPUs or machines: "
                    "the same command under `accelerate launch --num_processes N`. A YAML --config can hold any "
                    "TrainConfig key; flags override it; --set key=value sets any other key (value parsed as YAML). "
                    "A run resumes from the latest checkpoint in --output-dir unless --resume none.")
    p.add_argument("--config", help="YAML file of TrainConfig keys")
    for flag, (key, typ) in TRAIN_FLAGS.items():
        p.add_argument(flag, dest=key, type=typ, default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other TrainConfig key")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=cmd_train)


def cmd_train(a) -> int:
    import yaml

    from ..data.manifest import ManifestError
    from ..pila.config import AdapterConfigError, validate_adapter_config
    from ..training import TrainConfig, train

    overrides = {key: getattr(a, key) for key, _ in TRAIN_FLAGS.values() if getattr(a, key) is not None}
    resume_none = overrides.get("resume") in ("none", "None", "")
    if resume_none:
        overrides["resume"] = None
    for kv in a.set:
        if "=" not in kv:
            raise CLIError(f"--set expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        try:
            overrides[k.strip()] = yaml.safe_load(v)
        except yaml.YAMLError as e:
            raise CLIError(f"--set {kv!r}: the value is not YAML ({str(e).splitlines()[0]})") from None
    try:
        if a.config:
            cfg = TrainConfig.from_yaml(a.config, **overrides)
            if resume_none:
                cfg.resume = None
        else:
            cfg = TrainConfig.from_dict(overrides)
        validate_adapter_config(cfg.adapter, source="adapter options")
    except (AdapterConfigError, ValueError, FileNotFoundError, TypeError, yaml.YAMLError) as e:
        raise CLIError(str(e).strip().splitlines()[0]) from None
    # visionmoe's log lines: the command line's handler (INFO, nothing with -q); the backbone's: warnings only
    for noisy in ("accelerate", "diffusers", "transformers", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    def show(logs):
        keys = [k for k in logs if k not in ("step", "lr", "sec_per_step")]
        print(f"stage {cfg.stage} step {logs['step']}: " + " ".join(f"{k}={logs[k]:.4g}" for k in keys)
              + f" ({logs['sec_per_step']:.3f} s/step)", flush=True)

    try:
        res = train(cfg, progress=not a.quiet, log_callback=show)
    except (ManifestError, FileNotFoundError, ValueError) as e:
        raise CLIError(str(e).strip().splitlines()[0]) from None
    if int(os.environ.get("RANK", "0")) == 0:
        if res.skipped_videos:
            print(f"{res.skipped_videos} unreadable video(s) skipped (see {cfg.cache_dir}/cache.json)")
        print(f"stage {cfg.stage}: {res.steps} steps, {res.seconds_per_step:.3f} s/step; adapter: {res.adapter_dir}")
    return 0
