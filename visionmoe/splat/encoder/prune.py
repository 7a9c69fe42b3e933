"""Stage: the pruning search. Variants that drop the lowest-contribution Gaussians instead of
merging them (or that afford a finer rung by dropping the faintest few) are encoded at the same
target and render-checked on the search views; the lowest error within the rate window wins."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..pgms.decode import decode_coded
from ..pgms.quantize import ShGrid
from . import rung_search
from .allocator import APPEARANCE_LADDER, GEOMETRY_LADDER, plan_cut
from .cut import Encoding, tune_cut
from .pyramid import Pyramid, drop_leaves
from .rung import estimate_rung, quantize_tree, sample_nodes
from .rung_search import KEEPS_ALL_SHARE, PinnedSeeds, RenderCheck
from .stages import Progress, StageTimes
from .tree import Tree, build_tree

logger = logging.getLogger("visionmoe.splat.encoder.prune")

# Keep counts tried by the pruning search. When the cut merges, as multiples of its primitive
# count: measured on the shared scenes at 20x and 50x, the best pruned variant kept 1.0-1.6x as
# many Gaussians as the merged cut had primitives (still merging where it pays).
_PRUNE_KEEP_MERGED = (1.25, 1.6, 1.0)
# When the cut keeps (nearly) every leaf, dropping the faintest few lets a finer rung fit
# (playbot at 20x: 39.8 -> 40.5 dB). Each of the rungs one step finer than the base's (in
# geometry, in appearance) and two steps finer in geometry (playbot at 10x: 46.9 dB there, 45.6
# one step up) is encoded with the keep count that fits its every leaf in the target
# (from the base run's size estimate of that rung, calibrated by the base's real bytes), pinned
# there: no rung search or rung render checks (a quarter of an unpinned variant's cost on
# playbot). Counts below this share of the leaves are not tried.
_PRUNE_KEEP_ALL_MIN = 0.7
# On scenes of at most this many leaves, the faintest tenth is also dropped with the rungs
# searched afresh (and render-checked): on the pruned pyramid the search can land far from the
# base (the test scene at 20x on 8 views of 128 px: base rung (4, 5), every leaf, 32.1 dB; the
# pinned neighbours render worse; the free search picks (11, 5), merging, 35.6 dB). On playbot
# (446k leaves) that search cost 28 of its 80 s.
_PRUNE_FREE_MAX_LEAVES = 150_000
# On scenes of more leaves than this, a pinned variant drops its leaves from the base's own tree
# (``encode_pinned_variant``: playbot at 20x 4.3 s per variant instead of 8.3, 40.42 dB instead
# of 40.44; at 10x 47.02 instead of 46.97) and the independent ones run on two threads. Smaller
# scenes build a tree over the kept Gaussians, fitted to them: there the reused tree rendered
# up to 11% further on the search views (plant 10x, (5, 0) at 103k leaves: 1.80e-5 vs 1.62e-5)
# and a close call flipped to a variant 4 dB worse at 512 px (45.1 -> 41.3 dB).
_PRUNE_REUSE_TREE_ABOVE = 150_000
# Above this many leaves, or this many of the leaves' floats (14 per Gaussian plus 3 per SH
# coefficient beyond the base colour), those independent variants run one at a time: each holds
# a pyramid without some leaves, its symbols and its encodes, and renders beside the other.
# Tiled ertz_couch_sh3 at 20x (docs/SCALING.md), the same bytes either way: 1M Gaussians (753k
# leaves, 44M floats) peaked at 6.01 GB two at a time and 4.40 GB one at a time, the pruning
# search 23.1 s against 31.7 s (one thread each, beside a busy core); 300k (243k leaves, 14M
# floats) 2.09 GB two at a time. SH0 at 1M (14M floats) peaked at 2.96 GB two at a time.
_PRUNE_PARALLEL_MAX_LEAVES = 1_000_000
_PRUNE_PARALLEL_MAX_FLOATS = 20_000_000
# Above this many leaves a pinned rung's symbols on the base's tree are dropped once its variant
# is coded (quantised again if a refill or top-up pins it again): each is an [N, 45] grid and
# more at SH3, and up to three pinned rungs were held beside the variants' own trees.
_PRUNE_KEEP_PINNED_SYMBOLS_MAX_LEAVES = 1_000_000
_PRUNE_FREE_KEEP = 0.9
# Nor is a cut that keeps every leaf searched once it renders above this on the search views:
# there the faintest Gaussians at the views' 256 px are the small ones that show at higher
# resolution. Plant at 5x (65 dB): the finer rung without the faintest 1.7% rendered 24% closer
# at 256 px but 2.2x further at 512 px (64.1 -> 62.4 dB on the benchmark views, 63.5 -> 58.4 on
# the other poses). Statue at 5x (56 dB) gains 1 dB at 512 px from it.
_PRUNE_KEEP_ALL_BELOW_DB = 60.0
# The search runs at every quality: the render check keeps the base where dropping costs more
# than the finer rung gains (plant, tarot and guitar at 5x), and at 5x on statue and fruit the
# variant wins by 3.4 and 3.2 dB (56.4 -> 59.8, 55.0 -> 58.2; a former 45 dB cut-off skipped it).
# A cut that keeps every leaf at the finest rungs has no finer rung to afford: no search.
# The best-rendering pruned variant below this share of the target is refilled once, inside
# the rate window too (statue at 20x: the winner used 95.1% of the budget; refilled to 98.2%,
# 34.98 -> 35.02 dB; playbot at 20x: the variant kept every leaf at 93.5%, outside the window).
# The refill keeps the variant's rungs (more Gaussians at the same precision is what the keep
# count was scaled for): no rung search and no render checks, a quarter of a full allocation.
_PRUNE_REFILL_BELOW = 0.97
# A pinned variant's keep count comes from the base run's size estimate of its rung; where the
# estimate is short, the cut merges to fit and the variant loses what it was for (fruit at 20x:
# at (7.98, 4) 4208 kept, 4042 primitives, MSE 3.8e-4 against the base's 2.0e-4). One that keeps
# fewer than this share of its Gaussians as primitives is tried again keeping as many Gaussians
# as its cut had primitives (there 9.8e-5, and it wins).
_PRUNE_RETRY_MERGED_BELOW = 0.99
# Then the winner, where it keeps every one of its Gaussians (so its bytes grow with them),
# leaves more than 1% of the budget unused and will not be refined, is topped up once the same
# way, aiming at 99.5%, and kept if it renders closer on the search views (statue_st_peter at
# SOG's size: 98.9% -> 99.5%, 690 more Gaussians, 55.97 -> 56.38 dB held-out, SOG 55.98;
# playbot_lod0 at SPZ's size 46.56 -> 46.72). A refined cut codes to a little more than the cut
# it refines and needs that headroom: topped up, statue_st_peter and ertz_couch at 20x lost 0.6
# and 0.3 dB. Widening the refill itself to every variant 1% short instead lost fruit_drops at
# 5x 2.1 dB: another variant was refilled, and rendered worse (docs/EVALUATION.md, "PGMS: tried,
# not kept").
_TOP_UP_BELOW = 0.99
_TOP_UP_AIM = 0.995
# Last, a winning variant that keeps every one of its Gaussians below rung_search.FILL_BELOW of
# the target, and will not be refined, moves to a finer fractional rung as the base does
# (``rung_search.fill_every_leaf``; variants are coded with ``fill=False``), kept if it renders
# no further on the search views. ertz_couch_sh3 at SOG's size: the winner (12,083 of 13,426
# Gaussians, every one at (17, 11)) took 96.8%, its refill and top-up (more Gaussians) rendered
# further; at (17, 11.22) 99.7%, search-view MSE 3.62e-6 -> 3.11e-6, held-out 55.34 -> 56.07 dB.


@dataclass
class Variant:
    """A candidate of the search: its render error on the search views, its file, its tree."""

    error: float
    encoding: Encoding
    tree: Tree


@dataclass(frozen=True)
class PruneJob:
    """What the search needs besides the base: ``error(scene)`` is the render MSE against the
    original on every search view; a variant's tree is coded at the target by
    :func:`.rung_search.allocate_and_encode` with ``seed``, the rung choice's render ``check``
    and its stage times in ``times`` (rung search from the base's rungs unless pinned);
    ``refined(variant)``: whether the refinement stage will refine that variant's cut (then it
    is not topped up); ``top_up``: whether the winner may be topped up at all (the effort's)."""

    target: int
    sh_degree: int
    n_in: int
    ref_bytes: int
    error: Callable
    tries: int
    seed: int
    check: RenderCheck | None
    times: StageTimes
    refined: Callable[[Variant], bool] = lambda v: False  # whether the refinement stage will refine it
    top_up: bool = True


def _variants(base: Variant, seeds: PinnedSeeds | None, job: PruneJob, keeps_all: bool) -> list:
    """The (keep count, pinned rung or None) pairs to try, mildest pruning first."""
    enc, n = base.encoding, base.tree.kept.num_gaussians
    terminal = sum(enc.terminal)
    if not keeps_all:
        return [(int(min(f * terminal, 0.9 * n)), None) for f in _PRUNE_KEEP_MERGED]
    rates = seeds.rates if seeds is not None else {}
    calib = enc.nbytes / max(float(enc.rung.plan.rate[enc.k]) + enc.rung.fixed_bytes, 1.0)
    g, a = enc.rung.index[:2]
    variants = []
    for pi in ((g + 1, a), (g, a + 1), (g + 2, a)):
        if pi in rates:
            m = int(n * 0.985 * job.target / max(calib * rates[pi], 1.0))
            if _PRUNE_KEEP_ALL_MIN * n <= m < n:
                variants.append((m, pi))
    variants.sort(reverse=True)  # the mildest pruning first
    if n <= _PRUNE_FREE_MAX_LEAVES and job.tries > 0:
        variants = variants[: job.tries - 1] + [(int(_PRUNE_FREE_KEEP * n), None)]
    return variants


class _Attempts:
    """Encodes and render-checks one variant (``attempt``), on the base's tree where seeds allow."""

    def __init__(self, base: Variant, seeds: PinnedSeeds | None, job: PruneJob, prog: Progress):
        self.base, self.seeds, self.job, self.prog = base, seeds, job, prog
        n = base.tree.kept.num_gaussians
        self.estimates = seeds.estimates if (seeds is not None and n > _PRUNE_REUSE_TREE_ABOVE) else {}
        self.order = torch.argsort(base.tree.weights, descending=True, stable=True)
        self.start = base.encoding.rung.index

    def __call__(self, m: int, pin=None) -> Variant:
        tree, job = self.base.tree, self.job
        idx = torch.sort(self.order[:m]).values
        copies = None if tree.copies is None else tree.copies[idx]
        if pin is not None and pin in self.estimates:
            enc, sub = encode_pinned_variant(tree, self.seeds, pin, torch.isin(tree.pyramid.leaf_order, idx),
                                             job.target, job.seed)
            if tree.kept.num_gaussians > _PRUNE_KEEP_PINNED_SYMBOLS_MAX_LEAVES:
                self.estimates[pin].symbols = []
            return Variant(job.error(decode_coded(enc.data)), enc, Tree(tree.kept.subset(idx), tree.weights[idx], sub,
                                                                       tree.meta, copies))
        new = build_tree(tree.kept.subset(idx), tree.weights[idx], job.sh_degree, job.n_in, job.ref_bytes,
                         tree.meta.transform, copies)
        # a variant short of the target is refilled with more of its Gaussians (``_refill``), not
        # moved to a finer fractional rung (``fill=False``)
        # the variant's rung search reports nothing: the pruning search reports per variant
        enc = rung_search.allocate_and_encode(new, job.target, seed=job.seed, prog=self.prog.quiet(), times=job.times,
                                              check=job.check, pin=pin, start=self.start, fill=False).encoding
        return Variant(job.error(decode_coded(enc.data)), enc, new)


def search_pruning(base: Variant, seeds: PinnedSeeds | None, job: PruneJob, prog) -> Variant:
    """Pruning instead of merging, render-checked: -> the best of the base and its variants.

    A merged primitive covers pixels its members never did (a visible blob), while dropping a
    low-contribution Gaussian only loses its own small share. So variants that keep only the
    top Gaussians by contribution (merging less, or affording a finer rung) are encoded at the
    same target, starting the allocator from the base's rungs, and the lowest render error on
    the search views wins among those within the rate window (the best-rendering variant that
    uses less than ``_PRUNE_REFILL_BELOW`` of the target is refilled once at its rungs: keep
    count scaled by target / size). ``seeds``: what the base run left for pinned variants."""
    n = base.tree.kept.num_gaussians
    start = base.encoding.rung.index
    keeps_all = sum(base.encoding.terminal) >= KEEPS_ALL_SHARE * n
    n_app = len(APPEARANCE_LADDER) if job.sh_degree > 0 else 1
    if keeps_all and start == (len(GEOMETRY_LADDER) - 1, n_app - 1):
        return base
    variants = [v for v in _variants(base, seeds, job, keeps_all) if v[0] >= 16][: job.tries]
    attempt = _Attempts(base, seeds, job, prog)
    # On the base's tree, the pinned variants one step finer (in geometry, in appearance) do not
    # depend on each other's outcome: they are encoded and render-checked on two threads (most of
    # an encode is single-threaded numpy and entropy coding, which overlaps the other's renders),
    # each on its own copy of the base's search memo; the results are those of a serial run.
    # (Starting them while the base renders gained nothing measurable: 8.4 vs 8.7 s of search on
    # playbot 20x, both cores already busy.)
    independent = list(dict.fromkeys(v for v in variants if v[1] is not None and v[1][0] != start[0] + 2
                                     and v[1] in attempt.estimates))
    floats = n * (14 + 3 * ((job.sh_degree + 1) ** 2 - 1))
    parallel = n <= _PRUNE_PARALLEL_MAX_LEAVES and floats <= _PRUNE_PARALLEL_MAX_FLOATS
    pool = ThreadPoolExecutor(max_workers=2) if 1 < len(independent) and parallel else None
    try:
        base = Variant(job.error(decode_coded(base.encoding.data)), base.encoding, base.tree)
        logger.debug("prune search: cut of %d primitives over %d leaves, %d bytes, verify MSE %.3g",
                     sum(base.encoding.terminal), n, base.encoding.nbytes, base.error)
        if keeps_all and base.error < 10 ** (-_PRUNE_KEEP_ALL_BELOW_DB / 10):
            logger.debug("prune search skipped: every leaf kept at %.1f dB", -10 * math.log10(max(base.error, 1e-30)))
            return base
        futures = {} if pool is None else {v: pool.submit(attempt, *v) for v in independent}
        best, short, tried = _try_variants(base, variants, futures, attempt, job, prog)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    prog("prune search", len(variants), len(variants) + 2)
    best = _refill(best, base, short, tried, attempt, job)
    prog("prune search", len(variants) + 1, len(variants) + 2)
    best = _top_up(best, base, tried, attempt, job)
    return _fill(best, base, job, prog)


def _rank(job: PruneJob, base: Variant):
    """Rate contract first, as in the rung choice: a pruned variant must land in [0.95, 1] x
    target to replace the base (whose own shortfall, if any, the rung choice accepted)."""
    def key(c: Variant):
        return (0 if c is base or 0.95 * job.target <= c.encoding.nbytes <= job.target else 1, c.error)
    return key


def _try_variants(base: Variant, variants: list, futures: dict, attempt: _Attempts, job: PruneJob, prog):
    """-> (the best variant, the best-rendering one that leaves budget unused, the variants tried)."""
    key = _rank(job, base)
    start = base.encoding.rung.index
    best, short = base, None
    tried, won = set(), set()  # won: pinned rungs whose variant was the best so far when tried
    for i, (m, pin) in enumerate(variants):
        if (m, pin) in tried:
            continue
        if pin is not None and pin[0] == start[0] + 2 and (start[0] + 1, pin[1]) not in won:
            # two geometry steps up only where one step up won (as the rung checks stop at the
            # first rise): playbot 20x, (6, 8) lost to (5, 9) and (7, 8) would cost 20 s
            logger.debug("prune search: %s skipped, one geometry step finer did not win", pin)
            continue
        tried.add((m, pin))
        prog("prune search", i, len(variants) + 2)  # + the refill and the top-up
        cand = futures.pop((m, pin)).result() if (m, pin) in futures else attempt(m, pin)
        logger.debug("prune search: keep %d at %s -> %d bytes, verify MSE %.3g", m, pin or "any rung",
                     cand.encoding.nbytes, cand.error)
        if pin is not None:
            cand = _retry_merged(cand, m, pin, tried, attempt, key)
        if pin is not None and key(cand) < key(best):
            won.add(pin)
        # only the leaders stay referenced: a variant holds a whole pyramid and its symbols
        if (cand.encoding.nbytes < _PRUNE_REFILL_BELOW * job.target and cand.error < base.error
                and (short is None or cand.error < short.error)):
            short = cand
        best = min(best, cand, key=key)
    return best, short, tried


def _retry_merged(cand: Variant, m: int, pin: tuple, tried: set, attempt: _Attempts, key) -> Variant:
    """A pinned variant whose cut merged, tried again keeping as many Gaussians as the cut had
    primitives: -> the better of the two."""
    t = sum(cand.encoding.terminal)
    if t >= _PRUNE_RETRY_MERGED_BELOW * m or t < 16 or (t, pin) in tried:
        return cand
    tried.add((t, pin))
    again = attempt(t, pin)
    logger.debug("prune search: merged, keep %d at %s -> %d bytes, verify MSE %.3g", t, pin, again.encoding.nbytes,
                 again.error)
    return min(cand, again, key=key)


def _refill(best: Variant, base: Variant, short: Variant | None, tried: set, attempt: _Attempts,
            job: PruneJob, aim: float = 0.985, what: str = "refill") -> Variant:
    """The best-rendering variant that left budget unused (``short``), refilled once at its own
    rungs with its keep count scaled to ``aim`` x the target: -> the better of it and ``best``."""
    if short is None:
        return best
    n = base.tree.kept.num_gaussians
    m = short.tree.kept.num_gaussians
    m2 = int(min(n, m * aim * job.target / max(short.encoding.nbytes, 1)))
    pin = short.encoding.rung.index
    if m < m2 and (m2, pin) not in tried and not (m2 == n and pin == attempt.start):  # that one is the base
        tried.add((m2, pin))
        cand = attempt(m2, pin)
        logger.debug("prune search: %s keep %d -> %d bytes, verify MSE %.3g", what, m2, cand.encoding.nbytes, cand.error)
        best = min(best, cand, key=_rank(job, base))
    return best


def _top_up(best: Variant, base: Variant, tried: set, attempt: _Attempts, job: PruneJob) -> Variant:
    """The winning variant, where it keeps every one of its Gaussians, leaves more than ``1 -
    _TOP_UP_BELOW`` of the target unused and will not be refined, refilled once more toward
    ``_TOP_UP_AIM``."""
    keeps_all = sum(best.encoding.terminal) >= KEEPS_ALL_SHARE * best.tree.kept.num_gaussians
    if not job.top_up or best is base or not keeps_all or best.encoding.nbytes >= _TOP_UP_BELOW * job.target or job.refined(best):
        return best
    return _refill(best, base, best, tried, attempt, job, aim=_TOP_UP_AIM, what="top-up")


def _fill(best: Variant, base: Variant, job: PruneJob, prog: Progress) -> Variant:
    """The winning variant, where every one of its Gaussians is a primitive below
    ``rung_search.FILL_BELOW`` of the target and it will not be refined, moved to the finest
    (fractional) rung whose every leaf fits (the base was, by its own rung search), kept if it
    renders no further on the search views."""
    enc = best.encoding
    if best is base or job.refined(best):
        return best
    filled = rung_search.fill_every_leaf(best.tree, enc, job.target, seed=job.seed, prog=prog.quiet())
    if filled is enc:
        return best
    cand = Variant(job.error(decode_coded(filled.data)), filled, best.tree)
    logger.debug("prune search: fill at %s -> %d bytes, verify MSE %.3g", filled.rung.index, filled.nbytes, cand.error)
    return cand if cand.error <= best.error else best


def encode_pinned_variant(tree: Tree, seeds: PinnedSeeds, pin: tuple, leaf_keep: torch.Tensor, target: int,
                          seed: int) -> tuple[Encoding, Pyramid]:
    """A pinned pruning variant on the base's own tree: the pyramid without the leaves outside
    ``leaf_keep`` (:func:`drop_leaves`), coded at rung ``pin`` with the base's codebooks, so
    every surviving node's symbols are the base's (the decoded parents do not change) and only
    the cut is tuned afresh: -> (encoding, pyramid). Building a new tree over the kept
    Gaussians and quantising it anew cost playbot at 20x 8.3 s per variant."""
    pyr, meta = tree.pyramid, tree.meta
    qb = seeds.estimates[pin]
    if not qb.symbols:
        quantize_tree(pyr, qb, meta, seeds.memo.copy())  # a copy per thread
    sub, index = drop_leaves(pyr, leaf_keep)
    rung = estimate_rung(sub, qb.preset, meta, sample_nodes(sub, 16384, seed), seed, seeds.books.codebooks_only())
    rung.plan = plan_cut(sub.child_count, sub.parent, rung.cost, rung.node_bytes)
    fine_base = None if qb.tables.sh_keep is None else qb.tables.sh_keep[index[-1].numpy()]
    a, b = rung.tables, qb.tables
    same_books = (np.array_equal(a.shape_codebook, b.shape_codebook) and type(a.sh_codebook) is type(b.sh_codebook)
                  and (a.sh_codebook == b.sh_codebook if isinstance(a.sh_codebook, ShGrid)
                       else np.array_equal(a.sh_codebook, b.sh_codebook)))
    if same_books and (a.sh_keep is None) == (fine_base is None) and (a.sh_keep is None or not (a.sh_keep & ~fine_base).any()):
        rung.symbols = restrict_symbols(qb.symbols, index, a.sh_keep)
    else:  # a codebook retrained on the smaller tree, or a leaf newly given SH: quantise afresh
        quantize_tree(sub, rung, meta)
    k = rung.plan.best_within(target - rung.fixed_bytes)
    return tune_cut(sub, rung, k, meta, target), sub


def restrict_symbols(symbols: list[dict], index: list[torch.Tensor], sh_keep: np.ndarray | None) -> list[dict]:
    """Per-level symbols of the kept nodes (``index``: kept node indices per level); the leaves
    outside ``sh_keep`` (a subset of the base's) lose their view-dependent SH."""
    out = [{name: v[idx.numpy()] for name, v in sym.items()} for sym, idx in zip(symbols, index)]
    fine = out[-1]
    if "sh_flag" in fine and sh_keep is not None:
        fine["sh_flag"] = sh_keep.astype(np.int64)
        for name in ("sh_idx", "sh_q"):
            if name in fine:
                fine[name][~sh_keep] = 0
    return out
