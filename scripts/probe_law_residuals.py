#!/usr/bin/env python
"""Do PILA's law residuals tell a lawful clip from an unlawful one, and what else satisfies them?

Reads the deficit base's training cache (simulator clips encoded by its VAE, each lawful or not
by construction) and scores every clip's **labelled category's** laws
(:func:`visionmoe.video.pila.law_residuals.category_law_residuals`, the stage-3 law loss before
weighting) on the clean latent as it is, and on three edits of the lawful clips that no law
should prefer: every frame frozen to the first (nothing moves), the object faded halfway toward
each frame's mean (a fainter object), and time reversed. Per scenario: the mean residual of each
set, and the AUC, the chance that a lawful clip scores below an unlawful one (0.5: no signal).
``--laws track`` scores the track laws (:mod:`visionmoe.video.pila.track_laws`) instead.

    python scripts/probe_law_residuals.py --cache out/pila_deficit/train_vae_fg_seq32/cache.pt \
        --out out/pila_deficit/law_probe

Writes table.md and summary.json.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from visionmoe.video.data.law_variants import LAW_SCENARIOS
from visionmoe.video.pila.taxonomy import CATEGORY_NAMES
from visionmoe.video.training.losses import LAW_KINDS as LAWS


def frozen(x: torch.Tensor) -> torch.Tensor:
    return x[:, :, :1].expand_as(x).clone()


def faded(x: torch.Tensor, keep: float = 0.5) -> torch.Tensor:
    mean = x.mean(dim=(3, 4), keepdim=True)
    return mean + keep * (x - mean)


def reversed_in_time(x: torch.Tensor) -> torch.Tensor:
    return x.flip(2)


def labelled_residual(x: torch.Tensor, category: str, laws: str = "field", batch: int = 64) -> torch.Tensor:
    """[N] the sum of ``category``'s hinged laws (``laws``: the field laws or the track laws) on
    each clean latent of ``x`` [N, C, F, H, W]."""
    k = CATEGORY_NAMES.index(category)
    return torch.cat([LAWS[laws](x[i:i + batch]).per_category()[:, k] for i in range(0, len(x), batch)])


def auc_lower(lawful: torch.Tensor, unlawful: torch.Tensor) -> float:
    """P(a lawful clip's residual < an unlawful one's), ties counted half."""
    d = lawful.view(-1, 1) - unlawful.view(1, -1)
    return float(((d < 0).float() + 0.5 * (d == 0).float()).mean())


def probe(cache: dict, per_set: int, laws: str = "field") -> dict:
    out = {}
    for scenario, category in LAW_SCENARIOS.items():
        sets = {lawful: [i for i, s in enumerate(cache["specs"]) if s[0] == "law" and s[1] == scenario and s[3] == lawful]
                for lawful in (True, False)}
        if not sets[True] or not sets[False]:
            continue
        lawful = cache["latents"][sets[True][:per_set]].float()
        unlawful = cache["latents"][sets[False][:per_set]].float()
        r = {name: labelled_residual(fn(lawful), category, laws) for name, fn in
             (("lawful", lambda x: x), ("frozen", frozen), ("faded", faded), ("reversed", reversed_in_time))}
        r["unlawful"] = labelled_residual(unlawful, category, laws)
        out[scenario] = dict(category=category, n_lawful=len(lawful), n_unlawful=len(unlawful),
                             auc=auc_lower(r["lawful"], r["unlawful"]),
                             **{f"mean_{k}": float(v.mean()) for k, v in r.items()})
    return out


def table(rows: dict) -> str:
    lines = ["| scenario (label) | lawful | unlawful | AUC lawful < unlawful | frozen | faded 50% | reversed |",
             "|---|---|---|---|---|---|---|"]
    for scen, r in rows.items():
        lines.append(f"| {scen} ({r['category']}) | {r['mean_lawful']:.3f} | {r['mean_unlawful']:.3f} | {r['auc']:.2f} | "
                     f"{r['mean_frozen']:.4f} | {r['mean_faded']:.3f} | {r['mean_reversed']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", default="out/pila_deficit/train_vae_fg_seq32/cache.pt",
                   help="a train_deficit_world.py cache (latents and the clips' specs)")
    p.add_argument("--out", default="out/pila_deficit/law_probe")
    p.add_argument("--per-set", type=int, default=1000, help="at most this many clips per scenario and set")
    p.add_argument("--laws", choices=sorted(LAWS), default="field",
                   help="the field laws (law_residuals, the stage-3 law loss) or the track laws (track_laws)")
    a = p.parse_args(argv)
    if not os.path.isfile(a.cache):
        p.error(f"no cache at {a.cache}: run train_deficit_world.py --phase cache first")
    cache = torch.load(a.cache, weights_only=False)
    rows = probe(cache, a.per_set, a.laws)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
