#!/usr/bin/env python
"""What a PILA adapter's lower flow-matching loss measures: a calibration-only control.

    python scripts/flow_calibration.py fit  --cache W/cache --out W/calibration.pt
    python scripts/flow_calibration.py loss --heldout W/heldout --calibration W/calibration.pt \\
        --adapter pila=W/pila_eb/s3/adapter --transformer finetune=W/finetune_eb/transformer
    python scripts/flow_calibration.py eval --calibration W/calibration.pt --seed-sets 530000 --num 96 --out W/cal_eval

``fit``: the least-squares corrector ``dv = a x_t + b v + c``, one ``(a, b, c)`` per latent
channel and per noise band of width 1/``--bands``, on ``--clips`` training clips of a latent
cache (the frozen toy-world model's conditional velocity; noise levels drawn with shift 6).
``loss``: the flow-matching loss on held-out clips (a cache of ``--heldout-clips`` simulator
clips of ``--heldout-seed``, built on first use), the same noise for every arm, per noise band:
the base, the calibration, adapters (each added to the conditional velocity) and fine-tuned
transformers. ``eval``: the guarded toy-world evaluation of the calibration alone, applied to
each guidance branch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

BANDS = {"all": (0.0, 1.01), "sigma < 0.3": (0.0, 0.3), "0.3-0.7": (0.3, 0.7), "> 0.7": (0.7, 1.01)}


def _config(cache: str):
    from visionmoe.video.training.config import TrainConfig

    return TrainConfig(stage=3, output_dir="unused", cache_dir=cache, max_sequence_length=512, sigma_shift=6.0)


def _noised_batches(pipe, cache: str, n: int, seed: int, batch: int = 8):
    """(x_t, conditional velocity, flow target, sigma, text) of the first ``n`` clips, fixed noise."""
    from visionmoe.video.data.cache import LatentCache, collate
    from visionmoe.video.training.backbone import backbone_velocity
    from visionmoe.video.training.sampling import sample_sigmas

    ds, cfg = LatentCache(cache), _config(cache)
    n = min(n, len(ds))
    gen = torch.Generator().manual_seed(seed)
    for i in range(0, n, batch):
        b = collate([ds[j] for j in range(i, min(i + batch, n))], 512)
        x0, text = b["latents"].float(), b["text"]
        eps = torch.randn(x0.shape, generator=gen)
        sigma = sample_sigmas(torch.rand(len(x0), generator=gen), cfg)
        s = sigma.view(-1, 1, 1, 1, 1)
        x_t = (1 - s) * x0 + s * eps
        with torch.no_grad():
            v = backbone_velocity(pipe, x_t, sigma, text).float()
        yield x_t, v, eps - x0, sigma, text


def _features(x_t, v):
    """[B, C, N, 3] per-element features (x_t, v, 1)."""
    B, C = x_t.shape[:2]
    return torch.stack([x_t, v, torch.ones_like(v)], -1).reshape(B, C, -1, 3).double()


def calibrate(W: torch.Tensor, x_t, v, sigma) -> torch.Tensor:
    """The calibration's correction ``dv`` for a batch (``W``: [bands, C, 3])."""
    band = (sigma.float() * W.shape[0]).long().clamp(0, W.shape[0] - 1)
    w = W[band].to(v.dtype)[..., None, None, None, :]  # [B, C, 1, 1, 1, 3]
    return w[..., 0] * x_t + w[..., 1] * v + w[..., 2]


def fit(a) -> None:
    from visionmoe.video.models.toy_world import TOY_WORLD_PATH
    from visionmoe.video.training.backbone import load_backbone

    pipe = load_backbone(str(TOY_WORLD_PATH))
    A = B = None
    for x_t, v, target, sigma, _ in _noised_batches(pipe, a.cache, a.clips, a.seed):
        f, r = _features(x_t, v), (target - v).reshape(*v.shape[:2], -1).double()
        if A is None:
            A = torch.zeros(a.bands, v.shape[1], 3, 3, dtype=torch.float64)
            B = torch.zeros(a.bands, v.shape[1], 3, dtype=torch.float64)
        for k, bi in enumerate((sigma * a.bands).long().clamp(0, a.bands - 1).tolist()):
            A[bi] += f[k].transpose(1, 2) @ f[k]
            B[bi] += (f[k].transpose(1, 2) @ r[k][..., None])[..., 0]
    W = torch.linalg.solve(A + 1e-3 * torch.eye(3, dtype=torch.float64), B).float()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    torch.save(W, a.out)
    print(f"calibration: {a.bands} noise bands x {W.shape[1]} channels x 3 = {W.numel()} numbers -> {a.out}")


def _named(pairs):
    out = []
    for p in pairs:
        if "=" not in p:
            raise SystemExit(f"expected NAME=FOLDER, got {p!r}")
        out.append(tuple(p.split("=", 1)))
    return out


def loss(a) -> None:
    from diffusers import WanTransformer3DModel

    from visionmoe.video.pila.adapter import PILAAdapter
    from visionmoe.video.data.synthetic import write_dataset
    from visionmoe.video.models.toy_world import TOY_WORLD_PATH
    from visionmoe.video.training.backbone import load_backbone
    from visionmoe.video.training.config import TrainConfig
    from visionmoe.video.training.loop import prepare_cache

    pipe = load_backbone(str(TOY_WORLD_PATH))
    cache = a.cache or os.path.join(a.heldout, "cache")  # --cache: score training clips instead
    if not os.path.isdir(cache):
        manifest = write_dataset(os.path.join(a.heldout, "clips"), a.heldout_clips, seed=a.heldout_seed,
                                 scenarios=["free_fall", "bounce"])
        prepare_cache(TrainConfig(stage=3, output_dir=a.heldout, data=manifest, cache_dir=cache,
                                  max_sequence_length=512), pipe)
    base = {k: t.clone() for k, t in pipe.transformer.state_dict().items()}
    W = torch.load(a.calibration) if a.calibration else None
    arms = [("base", None, None)] + ([("calibration", "cal", None)] if W is not None else [])
    arms += [(n, "adapter", PILAAdapter.from_pretrained(p).eval()) for n, p in _named(a.adapter)]
    arms += [(n, "transformer", p) for n, p in _named(a.transformer)]
    table = {}
    for name, kind, obj in arms:
        pipe.transformer.load_state_dict(WanTransformer3DModel.from_pretrained(obj).state_dict()
                                         if kind == "transformer" else base)
        errs = []
        for x_t, v, target, sigma, text in _noised_batches(pipe, cache, a.heldout_clips, a.seed):
            with torch.no_grad():
                if kind == "cal":
                    v = v + calibrate(W, x_t, v, sigma)
                elif kind == "adapter":
                    text_in = text if obj.text_classifier is not None else None
                    v = v + obj(x_t, v, sigma, encoder_hidden_states=text_in, compute_residuals=False).dv.float()
            errs += list(zip((v - target).pow(2).mean(dim=(1, 2, 3, 4)).tolist(), sigma.tolist()))
        table[name] = {band: sum(e for e, s in errs if lo <= s < hi) / max(1, sum(lo <= s < hi for _, s in errs))
                       for band, (lo, hi) in BANDS.items()}
        print(name, {k: round(x, 4) for k, x in table[name].items()}, flush=True)
    pipe.transformer.load_state_dict(base)
    os.makedirs(a.heldout, exist_ok=True)
    with open(os.path.join(a.heldout, "flow_loss_train.json" if a.cache else "flow_loss.json"), "w") as fh:
        json.dump(table, fh, indent=1)


def evaluate(a) -> None:
    from visionmoe.video import evaluation as E
    from visionmoe.video.pila.adapter import PILAAdapter, PILAOutput

    W = torch.load(a.calibration)

    class Calibration(PILAAdapter):
        """The calibration as an adapter (``structure='plain'`` only for its tiny unused body)."""

        def forward(self, latents, velocity, sigma, encoder_hidden_states=None, category_mask=None,
                    category_scale=None, compute_residuals=True):
            s = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1).expand(latents.shape[0])
            return PILAOutput(calibrate(W, latents.float(), velocity.float(), s).to(velocity.dtype))

    cal = Calibration(structure="plain", hidden_dim=8, plain_blocks=1, apply_to="each_branch").eval()
    ev = E.evaluate_toy_world([E.Arm("calibration (each branch)", adapter=cal)], num=a.num, seed_sets=a.seed_sets,
                              control=False)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as fh:
        json.dump(ev.to_json(), fh, default=float)
    with open(os.path.join(a.out, "table.md"), "w") as fh:
        fh.write(ev.markdown() + "\n")
    print(ev.markdown())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["fit", "loss", "eval"])
    p.add_argument("--cache", help="fit: the training latent cache (ablate_pila.py's WORK/cache); "
                                   "loss: score the first --heldout-clips clips of this cache instead")
    p.add_argument("--clips", type=int, default=512, help="fit: training clips used")
    p.add_argument("--bands", type=int, default=20, help="fit: noise bands")
    p.add_argument("--out", help="fit: the calibration file (.pt); eval: the output folder")
    p.add_argument("--calibration", help="loss / eval: a file written by fit")
    p.add_argument("--heldout", default="out/flow_calibration", help="loss: folder of the held-out clips and cache")
    p.add_argument("--heldout-clips", type=int, default=128)
    p.add_argument("--heldout-seed", type=int, default=7)
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=FOLDER", help="loss: an adapter arm")
    p.add_argument("--transformer", action="append", default=[], metavar="NAME=FOLDER",
                   help="loss: a fine-tuned WanTransformer3DModel arm")
    p.add_argument("--seed", type=int, default=123, help="noise seed (fit uses its own run of it)")
    p.add_argument("--seed-sets", type=int, nargs="+", default=[530_000, 570_000])
    p.add_argument("--num", type=int, default=96)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.what == "fit":
        if not (a.cache and a.out):
            p.error("fit needs --cache and --out")
        fit(a)
    elif a.what == "loss":
        loss(a)
    else:
        if not (a.calibration and a.out):
            p.error("eval needs --calibration and --out")
        evaluate(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
