"""Stage: compositing-aware refinement of the chosen cut. Adam steps on the cut's primitives
against the original scene's renders (quantisation-aware), written back into the pyramid and
re-encoded; kept only if the new file renders closer to the original."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..io import GaussianScene
from ..pgms import _frames
from ..pgms.decode import decode_coded
from ..pgms.quantize import quantize_level
from .check_views import SEARCH_VIEWS, References, view_indices
from .cut import CutTuner, Encoding, coded_masks, split_masks
from .pyramid import Pyramid
from .rung import quantize_tree
from .tree import Tree

logger = logging.getLogger("visionmoe.splat.encoder.refine")

# Refinement by default: Adam at the 3DGS training rates, quantisation-aware (30 steps, render
# MSE on the 16 search views, before -> after: plant at 20x 3.4e-4 -> 1.3e-4, tarot at 20x
# 7.3e-4 -> 2.8e-4, guitar at 20x 2.35e-5 -> 1.46e-5), on cuts of at most 150k primitives
# (about 2 s per step per 60k primitives on one CPU thread; playbot at 50x, 181k: +0.3 dB for
# 145 s) that render below 48 dB on those views: above, Adam's first steps (each parameter
# moves by about its rate) cost more than the rest recover (guitar at 10x, 52.8 dB, and fruit
# at 20x, 45 dB, rendered no closer after 10 steps, where the check stops them). Twice the
# rates lost 0.13 dB.
# 60 steps whose rates follow a cosine down to a tenth (16 benchmark views of 512 px): tarot at
# 20x 33.82 -> 34.79 dB, plant at 50x 28.41 -> 28.84, statue at 20x 36.46 -> 37.04, for about
# 1.5x the encode time (tarot 20x 63 -> 93 s). 60 steps at constant rates gave tarot 34.29; the
# decay over 30 steps lost plant at 50x 1.8 dB (its merged cut needs the full rates for longer).
# 80 steps down to 3% then gained again: tarot 20x 34.79 -> 35.19, statue 20x 37.04 -> 37.20,
# plant 50x 28.84 -> 29.52, for a third more refinement time (80 steps to 5%: tarot 35.01; 60
# to 3%: 34.99, but plant 50x 28.71). Those 80 steps are effort max's (options.EFFORTS).
_REFINE_LR_FINAL = 0.03
AUTO_REFINE_BELOW_DB = 48.0
AUTO_REFINE_MAX_PRIMITIVES = 150_000
# The refinement's re-encoding is judged once after 10 steps too, and stopped there if it renders
# no closer: on statue at 20x it was worse after 10 steps (render MSE 2.34e-4 -> 2.91e-4) and
# after 30 (2.83e-4, thrown away), 40 s spent for nothing; where it pays (plant and tarot at 20x,
# tarot at 10x) it was already better after 10 (3.38e-4 -> 2.35e-4, 7.3e-4 -> 5.1e-4,
# 1.2e-4 -> 8.8e-5) and ends where it did before, for one more encode.
_REFINE_CHECK_AT = 10
# A refined encoding is kept only if it renders at least this much closer (MSE) on the views it
# was fitted to: statue at 10x went 4.35e-5 -> 4.12e-5 there (5%) yet 42.78 -> 42.02 dB on the
# 16 benchmark views at twice the resolution; where it pays it gains 38-62% (guitar, tarot and
# plant at 20x).
_REFINE_MIN_GAIN = 0.1


# The refinement (and the render checks that judge it) renders the contribution views at twice
# their size, up to 512 px (never below their own size): at 256 px it fits what the pixels
# average away.
# Tarot at 20x, L1 loss (16 benchmark views of 512 px, then held-out poses at 32 and 8 degrees of
# elevation and closer in): views of 256 px 32.57 dB (32.45 / 32.65 / 28.92), 384 px 33.33,
# 512 px 33.53 (33.32 / 33.45 / 30.37), 768 px with 4 views a step 32.95. Each step renders at
# most ``views`` x 512 x 512 pixels (effort max: 8 views of 512 px; 16 a step gave 33.62 for
# 1.7x the time).
_REFINE_SCALE = 2.0
_REFINE_MAX_SIZE = 512
_REFINE_VIEWS = 8


def refinement_views(cameras, views: int = _REFINE_VIEWS):
    """-> (the refinement's cameras: the contribution views rescaled, views per step: as many as
    ``views`` views of 512 px hold in pixels, 1-16)."""
    factor = min(_REFINE_SCALE, max(1.0, _REFINE_MAX_SIZE / max(cameras.width, cameras.height)))
    if factor > 1:
        cameras = cameras.scaled(factor)
    return cameras, max(1, min(16, views * _REFINE_MAX_SIZE**2 // (cameras.width * cameras.height)))


@dataclass(frozen=True)
class RefineJob:
    """The refinement's inputs besides the base encoding: the original scene, the contribution
    cameras, Adam steps, the render device, ``target_bytes`` (the encode's byte budget),
    ``skip_above_db`` (auto: no refinement of a cut that already renders above it) and
    ``views`` (the pixels a step renders, in views of 512 px: ``refinement_views``)."""

    scene: GaussianScene
    cameras: object
    steps: int
    device: object
    target_bytes: int
    skip_above_db: float | None = None
    views: int = _REFINE_VIEWS


def refine_checked(tree: Tree, base: Encoding, job: RefineJob, refs: References, prog) -> Encoding:
    """Refine the chosen cut against the original scene's renders and keep the refined encoding
    only if it renders closer to the original on the contribution views (up to 16, at the
    refinement's resolution), by at least ``_REFINE_MIN_GAIN`` of the error (after the check's
    10 steps and at the end)."""
    from ..render import render

    idx = view_indices(len(job.cameras), SEARCH_VIEWS)
    rcams, per_step = refinement_views(job.cameras, job.views)
    views = rcams[idx]
    if rcams is job.cameras:
        ref = refs.get(idx)
    else:
        with torch.no_grad():
            ref = render(job.scene.to(job.device), views).colors

    def error(blob):
        with torch.no_grad():
            return float((render(decode_coded(blob).to(job.device), views).colors - ref).pow(2).mean())

    before = error(base.data)
    if job.skip_above_db is not None and before < 10 ** (-job.skip_above_db / 10):
        logger.info("refinement skipped: %.1f dB on the contribution views already", -10 * math.log10(max(before, 1e-30)))
        return base
    goal = (1 - _REFINE_MIN_GAIN) * before
    target = max(job.target_bytes, base.nbytes)  # a base over its target keeps its own size as the bound
    refined = refine_and_encode(tree, job.scene, base, rcams, job.steps, target, prog,
                                check=lambda blob: error(blob) < goal, views_per_step=per_step, device=job.device)
    if refined is None:
        logger.info("refinement stopped after %d of %d steps: it rendered less than %d%% closer", _REFINE_CHECK_AT,
                    job.steps, round(100 * _REFINE_MIN_GAIN))
        return base
    after = error(refined.data)
    logger.info("refinement (%d steps): render MSE %.3g -> %.3g", job.steps, before, after)
    return refined if after < goal else base


_PARAMS = ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")


def cut_primitives(pyr: Pyramid, enc: Encoding) -> tuple[list[torch.Tensor], GaussianScene]:
    """The cut's terminal nodes: their indices per level and their parameters (level by level)."""
    split = split_masks(pyr, enc.rung, enc.k)
    coded = coded_masks(pyr, split)
    terms = [torch.from_numpy(np.nonzero(coded[lv] & ~split[lv])[0]) for lv in range(pyr.num_levels)]
    prim = GaussianScene(**{n: torch.cat([getattr(pyr.levels[lv], n)[terms[lv]] for lv in range(pyr.num_levels)])
                            for n in _PARAMS})
    return terms, prim


def refine_and_encode(tree: Tree, dense: GaussianScene, base: Encoding, cameras, steps: int, target: int, prog,
                      check=None, views_per_step: int = 16, device="cpu") -> Encoding | None:
    """Optional compositing-aware refinement: a few render-vs-dense-render steps on the chosen
    cut's primitives (continuous parameters), written back into the pyramid, then re-encoded:
    the same cut where it fits in ``target`` bytes, else the cut tuned down to fit (dropping
    splits replaces refined primitives by their unrefined parents: the refinement is fitted
    to this cut). The renders and the optimiser run on ``device``; the pyramid and the codec
    stay on the CPU.
    ``check(encoded bytes) -> bool`` judges the encoding after ``_REFINE_CHECK_AT`` steps; False
    stops there and returns None (the pyramid then holds that partial refinement)."""
    from .update import refine

    pyr, meta, rung, k = tree.pyramid, tree.meta, base.rung, base.k
    terms, prim = cut_primitives(pyr, base)

    def encode(refined: GaussianScene) -> Encoding:
        start = 0
        for lv, idx in enumerate(terms):
            for n in _PARAMS:
                dst = getattr(pyr.levels[lv], n)
                dst[idx] = getattr(refined, n)[start: start + len(idx)].to(device=dst.device, dtype=dst.dtype)
            start += len(idx)
        quantize_tree(pyr, rung, meta)
        tuner = CutTuner(pyr, rung, meta, target)
        if tuner.full_size(k) <= target:
            return tuner.full[k]
        kk = tuner.finish(k)[0]
        logger.info("the refined cut takes %d bytes, over the target's %d: %d of its %d splits kept", tuner.full_size(k),
                    target, kk, k)
        return tuner.full[kk]

    refined = refine(prim.to(device), dense.to(device), cameras, steps=steps, views_per_step=views_per_step,
                     lr_final=_REFINE_LR_FINAL, progress=lambda i, n: prog("refine", i, n),
                     check=None if check is None else (lambda partial: check(encode(partial).data)),
                     check_at=_REFINE_CHECK_AT, quantize=terminal_quantizer(tree, base, terms), keep_best=True,
                     repeat=copies_index(pyr, terms, device))
    if refined is None:
        return None
    return encode(refined)


def copies_index(pyr: Pyramid, terms: list[torch.Tensor], device="cpu") -> torch.Tensor | None:
    """The cut's primitives as the decoder emits them: each fine-tier leaf as many times as the
    identical source rows it stands for (None: once each)."""
    if pyr.copies is None:
        return None
    counts = torch.cat([torch.ones(len(t), dtype=torch.int64) for t in terms[:-1]] + [pyr.copies[terms[-1]]])
    if bool((counts == 1).all()):
        return None
    return torch.repeat_interleave(torch.arange(len(counts)), counts).to(device)


# Parameters the refinement sees decoded (straight-through). Measured on tarot at 20x (render MSE
# on the 16 search views): the refined cut rendered 6.6e-5 unquantised but 4.6e-4 once coded;
# coding only its positions, opacities or colours (the rest unquantised) gave 2.6e-4, 2.0e-4,
# 1.6e-4. The codec relabels a primitive's axes (to its parent's, or to a shape prototype's), so
# decoded rotations and log-scales are mapped back to the parameter's own axis order first:
# otherwise a decoded value's gradient would update another axis.
_REFINE_DECODED = ("means", "quats", "log_scales", "opacity_logits", "sh_dc")


def terminal_quantizer(tree: Tree, base: Encoding, terms: list[torch.Tensor]):
    """The codec's decoded positions, rotations, log-scales, opacity logits and DC of the cut's
    primitives (concatenated level by level as ``terms``), for quantisation-aware refinement:
    interior nodes are not refined, so each primitive's decoded parent is fixed and quantised
    once here."""
    pyr, rung = tree.pyramid, base.rung
    parents = []
    quantize_tree(pyr, rung, tree.meta, parents_out=parents)
    L = pyr.num_levels
    tables = rung.tables
    # per level, what every step shares: the terminals' decoded parents and their tables
    fixed = []
    for lv, idx in enumerate(terms):
        fine, ix = lv == L - 1, idx.numpy()
        lt = tables if not fine or tables.sh_keep is None else dataclasses.replace(tables, sh_keep=tables.sh_keep[ix])
        fixed.append((fine, parents[lv].take(ix) if len(ix) else None, lt))

    def quantize(scene: GaussianScene) -> dict:
        out = {k: [] for k in _REFINE_DECODED}
        start = 0
        for lv, idx in enumerate(terms):
            m = len(idx)
            if m == 0:
                continue
            fine, level_parents, lt = fixed[lv]
            nodes = GaussianScene(**{k: getattr(scene, k)[start: start + m] for k in _PARAMS})
            start += m
            # the SH bands are refined unquantised (not in _REFINE_DECODED): their prototype
            # search is skipped
            _, dec = quantize_level(nodes, level_parents, fine, rung.quant, lt, sh=False)
            alpha = np.clip(dec.alpha.astype(np.float64), 1e-7, 1 - 1e-7)
            logit = dec.op_logit if dec.op_logit is not None else np.log(alpha / (1 - alpha))
            q_own = _frames.unit(nodes.quats.numpy())
            rel, ls = _frames.relabel_to_parent(q_own, dec.quats, dec.log_scales)
            q = _frames.compose(q_own, rel)
            q = np.where((q * q_own).sum(1, keepdims=True) < 0, -q, q)  # the parameter's sign
            out["quats"].append(torch.from_numpy(q.astype(np.float32)))
            out["log_scales"].append(torch.from_numpy(np.asarray(ls, np.float32)))
            out["means"].append(torch.from_numpy(np.asarray(dec.means, np.float32)))
            out["opacity_logits"].append(torch.from_numpy(np.asarray(logit, np.float32)))
            out["sh_dc"].append(torch.from_numpy(np.asarray(dec.dc, np.float32)))
        return {k: torch.cat(v) for k, v in out.items()}

    return quantize
