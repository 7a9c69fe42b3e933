"""Stage: the rung search. Which preset (geometry rung, appearance rung) codes the tree at the
target: a hill climb on the allocator's contribution-weighted proxy, then a shortlist encoded
at the target and render-checked (the lowest real error within the rate window wins), then the
winner's cut tuned on full encodes."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..pgms.decode import decode_coded
from .allocator import APPEARANCE_LADDER, CLIMB_START_GEOMETRY, GEOMETRY_LADDER, geometry_rung, make_preset, plan_cut
from .cut import CutTuner, Encoding
from .rung import CodebookCache, Rung, TreeMemo, estimate_rung, quantize_tree, sample_nodes
from .stages import Progress, StageTimes
from .tree import Tree

logger = logging.getLogger("visionmoe.splat.encoder.rung_search")

# A finer geometry rung (+2, +4, +6 over the proxy's best) is not render-checked when the proxy
# rates it this much worse: on the shared scenes at 5-50x the checked ones that won were at most
# 2.6x worse by the proxy (fruit 20x: (11, 5) 2.6x, rendering 13x closer), the ones above 4x all
# lost (2.3-100x worse rendered: guitar, plant, statue at 10x, playbot 20x, statue 5x), each
# check costing a quantisation, an encode and 4 renders (3.4 s on playbot).
_FINER_GEOMETRY_MAX_PROXY = 4.0
KEEPS_ALL_SHARE = 0.9  # a cut with at least this share of the leaves as primitives "keeps every leaf"
# A winner that keeps every leaf below FILL_BELOW of the target moves to finer geometry rungs
# while every leaf still fits on real bytes, then to a fractional rung toward the next one (at
# the finest geometry rung, toward the next per-primitive SH rung: allocator.appearance_rung).
# Next to it a ladder rung would have to merge, and the byte gap between two rungs (9.6% between
# rungs 13 and 14 on a 20k-Gaussian float scene) was rate the file could not spend, often below
# the 5% window. Real bytes, not the proxy's estimates: the proxy put every leaf of that scene
# within 287 kB at rung 14, which took 294 kB.
# The fractional rung is aimed at FILL_AIM of the target by interpolating the log of the size
# between the two rungs measured (to 1/FILL_GRID of a rung), at most FILL_STEPS times, until the
# file fills FILL_BELOW. Three bisections (1/8 of a rung, the former rule) behind a 97% threshold
# left SOG's size short; now (held-out PSNR): guitar fast 99.6% -> 99.9% (64.85 -> 65.65 dB),
# fruit_drops_minimal fast 93.6% -> 99.6% at (17, 12.53) (59.43 -> 60.90 dB). The size can jump
# between two neighbouring fractional rungs. Where a bit depth rounds up (guitar default at SOG's
# size, rotations 8 -> 9 bits at 11.5: the file 97.9% -> 100.7% of the target) the fill goes on
# with the lower rung's bit depths and finer steps (allocator.geometry_rung's ``bits_from``):
# 99.7%, held-out 64.78 -> 65.29 dB. Where a palette turns on (statue_st_peter fast, lossless
# colours from 8.64: +5.5%, 96.4%) the target stays short: a merged cut at the finer rung
# rendered 15 dB worse, and dropping the faintest 2.2% to fit it (judged on the rung check's 4
# views) 0.42 dB worse on held-out views.
# The shortlist's next rung is quantised ahead on a second thread up to this many leaves; above,
# one rung at a time: 3M SH3 Gaussians (tiled ertz_couch_sh3, 1.9M kept) at 20x peaked at
# 17.11-17.66 GB with it, 10.38-13.48 GB without (two runs alone each way), the same bytes, in
# 129-148 s against 132-136 s.
QUANTIZE_AHEAD_MAX_LEAVES = 1_000_000
FILL_BELOW = 0.99
FILL_AIM = 0.995
FILL_STEPS = 4
FILL_GRID = 64


@dataclass(frozen=True)
class RenderCheck:
    """Render-verified rung choice: the best ``count`` rungs by the proxy are encoded and
    ``error(decoded scene)`` (render MSE against the original) picks among them."""

    count: int
    error: Callable


@dataclass
class RungEval:
    """The proxy's verdict on one rung: ``key`` ranks it ((0, distortion) if its best cut fits
    the target, else (1, estimated bytes)); ``k`` is that cut."""

    key: tuple
    k: int
    rung: Rung

    @property
    def fits(self) -> bool:
        return self.key[0] == 0

    @property
    def every_split(self) -> bool:
        return self.k >= len(self.rung.plan.order_level)

    @property
    def distortion(self) -> float:
        return float(self.rung.plan.distortion[self.k])


@dataclass
class PinnedSeeds:
    """What a base run whose cut keeps (nearly) every leaf leaves for the pruning search's pinned
    variants: the estimated size of every leaf at each rung evaluated, the chosen rung's finer
    neighbours' estimates on this tree, and the codebooks and quantisation memo made here."""

    rates: dict  # rung -> estimated bytes with every leaf
    estimates: dict  # rung -> Rung (finer neighbours of the chosen one)
    books: CodebookCache
    memo: TreeMemo


@dataclass
class Allocation:
    encoding: Encoding
    seeds: PinnedSeeds | None = None


class RungSearch:
    """The proxy's evaluations of the rungs of one tree at one target (cached)."""

    def __init__(self, tree: Tree, target: int, seed: int, prog: Progress):
        self.tree, self.target, self.seed, self.prog = tree, target, seed, prog
        self.cache: dict[tuple, RungEval] = {}
        self.books, self.memo = CodebookCache(), TreeMemo()
        self.samples = sample_nodes(tree.pyramid, 16384, seed)
        self.sample_cache: dict = {}  # estimate_rung's per-level sample rows
        self.n_app = len(APPEARANCE_LADDER) if tree.meta.sh_degree > 0 else 1

    def evaluate(self, pi: tuple) -> tuple:
        """The rung's ranking key (unfit rungs rank after every fitting one, smallest estimate first)."""
        if pi not in self.cache:
            pyr = self.tree.pyramid
            rung = estimate_rung(pyr, make_preset(*pi), self.tree.meta, self.samples, self.seed, self.books, self.memo,
                                 self.sample_cache)
            rung.plan = plan_cut(pyr.child_count, pyr.parent, rung.cost, rung.node_bytes)
            # the per-node estimates only feed the plan; kept for every rung the climb visits,
            # they were 1.3 GB of a 3M SH3 encode's peak (two float64 per node, ~40 rungs)
            rung.cost, rung.node_bytes = [], []
            k = rung.plan.best_within(self.target - rung.fixed_bytes)
            fits = rung.plan.rate[k] + rung.fixed_bytes <= self.target
            d = float(rung.plan.distortion[k])
            rate = float(rung.plan.rate[k] + rung.fixed_bytes)
            # a NaN estimate ranks last (NaN compares false both ways: the climb never stopped on it)
            key = (0, d) if fits and math.isfinite(d) else (1, rate) if math.isfinite(rate) else (2, 0.0)
            self.cache[pi] = RungEval(key, k, rung)
            logger.debug("preset %s: k=%d of %d splits, rate~%.0f distortion %.4g fits=%s", pi, k,
                         len(rung.plan.order_level), rung.plan.rate[k] + rung.fixed_bytes, d, fits)
            self.prog("allocate", len(self.cache), len(self.cache) + 1)
        return self.cache[pi].key

    def climb(self, start: tuple | None) -> tuple:
        """Coordinate-wise hill climbing from geometry rung ``CLIMB_START_GEOMETRY`` and the middle
        of the appearance ladder (RD is unimodal in practice) or from a known good pair (a
        pruned variant of an allocated scene)."""
        best = tuple(start) if start is not None else (CLIMB_START_GEOMETRY, self.n_app // 2)
        improved, tried_jumps = True, False
        rounds = len(GEOMETRY_LADDER) * self.n_app  # each round moves to a strictly better rung: a bound
        while improved and rounds > 0:
            improved, rounds = False, rounds - 1
            for axis, size in ((0, len(GEOMETRY_LADDER)), (1, self.n_app)):
                for step in (-1, 1):
                    while True:
                        nxt = list(best[:2])  # a neighbour takes its own bit depths (no ``bits_from``)
                        nxt[axis] += step
                        nxt = tuple(nxt)
                        if not 0 <= nxt[axis] <= size - 1 or self.evaluate(nxt) >= self.evaluate(best):
                            break
                        best, improved = nxt, True
            if not improved and not tried_jumps and self.n_app > 5:
                # the per-primitive SH rungs sit beyond the codebook rungs: a local climb along the
                # appearance ladder can stall before them, so try them directly once
                tried_jumps = True
                for a in range(self.n_app - 4, self.n_app):
                    if self.evaluate((best[0], a)) < self.evaluate(best):
                        best, improved = (best[0], a), True
        return best

    def ranked(self) -> list:
        return sorted(self.cache, key=lambda pi: self.cache[pi].key)

    def _all_leaves(self, pi) -> bool:
        self.evaluate(pi)
        return self.cache[pi].fits and self.cache[pi].every_split

    def finest_full_rungs(self, a0: int) -> list:
        """Per appearance rung (the proxy's and the per-primitive SH ones), the finest geometry
        rung whose every leaf fits the budget; the best two by the proxy."""
        full = []
        apps = [a0] + [a for a in range(self.n_app - 4, self.n_app)
                       if self.n_app > 5 and a != a0 and APPEARANCE_LADDER[a][2] == 0]
        for a in apps:
            lo, hi = -1, len(GEOMETRY_LADDER)  # all_leaves holds at lo (or nowhere), fails at hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self._all_leaves((mid, a)) else (lo, mid)
            if lo >= 0:
                full.append((lo, a))
        return sorted(full, key=lambda pi: self.cache[pi].key)[:2]


@dataclass
class Shortlist:
    """The rungs to encode and render-check, in order, and how they relate."""

    rungs: list  # rung indices, in check order
    proxy_best: tuple  # the hill climb's rung
    steps_up: dict  # finer geometry candidate -> the rung one step below it on the same ladder
    every_leaf: set  # rungs checked with every leaf: they cannot spend more bytes without merging
    count: int  # how many the render check covers


def make_shortlist(search: RungSearch, check: RenderCheck | None, pinned: bool) -> Shortlist:
    ranked = search.ranked()
    proxy_best = ranked[0]
    every_leaf, steps_up = set(), {}
    cache = search.cache
    count = check.count if check else 1
    if check and not pinned:
        # The proxy under-rates geometry precision on some scenes: besides its best rung, verify
        # finer geometry rungs (+2, +4, +6: the ladder is dense at its coarse end) with the same
        # appearance rung.
        g0, a0 = ranked[0][:2]
        cands = [(g0 + dg, a0) for dg in (2, 4, 6) if g0 + dg <= len(GEOMETRY_LADDER) - 1]
        steps_up = {(g0 + dg, a0): (g0 + dg - 2, a0) for dg in (2, 4, 6)}
        for pi in cands:
            search.evaluate(pi)
        # Merged primitives cost far more render error than the proxy charges (and carry no
        # view-dependent SH), while coarser quantisation degrades gracefully: also verify the
        # finest rungs that keep every leaf.
        full = search.finest_full_rungs(a0)
        every_leaf = set(full)
        ranked = search.ranked()
        extra = list(dict.fromkeys(pi for pi in full + cands if cache[pi].fits))
        fitting = [ranked[0]] + [pi for pi in extra if pi != ranked[0]]
        fitting += [pi for pi in ranked[1:] if cache[pi].fits and pi not in fitting]
        count = max(count, 1 + len(full) + min(len(cands), 2))
    else:
        fitting = [pi for pi in ranked if cache[pi].fits]
    shortlist = (fitting or ranked)[: max(1, count if check else 1)]
    if len(fitting) > len(shortlist) and not all(not cache[pi].every_split for pi in shortlist):
        # a rung that cannot fill the budget even with every leaf misses the rate target:
        # add the best rung that can, so the contract can be kept
        fill = [pi for pi in fitting[len(shortlist):] if not cache[pi].every_split]
        shortlist += fill[:1]
    return Shortlist(shortlist, proxy_best, steps_up, every_leaf, count)


@dataclass
class Checked:
    """A shortlisted rung after its render check: ``rank`` = (misses the rate window, error)."""

    rank: tuple
    pi: tuple
    tuner: CutTuner
    k: int


class _Verifier:
    """Encodes the shortlisted rungs at the target (probe encodes, one full encode calibrates the
    probe sizes), render-checks them and keeps the best."""

    def __init__(self, search: RungSearch, short: Shortlist, check: RenderCheck | None, times: StageTimes):
        self.search, self.short, self.check, self.times = search, short, check, times
        self.scale = None  # full / probe size, measured once on the first (proxy-best) rung
        self.errors, self.skipped = {}, set()  # render error of each verified rung; candidates not verified
        self.best: Checked | None = None

    def proxy_ratio(self, pi) -> float:
        c = self.search.cache
        return c[pi].distortion / max(c[self.short.proxy_best].distortion, 1e-30)

    def skip(self, pi) -> bool:
        steps_up = self.short.steps_up
        below = steps_up.get(pi)
        c = self.search.cache
        if pi in steps_up and c[pi].distortion > _FINER_GEOMETRY_MAX_PROXY * c[self.short.proxy_best].distortion:
            self.skipped.add(pi)  # the rungs beyond it are skipped with it (below)
            logger.debug("verify preset %s skipped: proxy distortion %.1fx the proxy's best", pi, self.proxy_ratio(pi))
            return True
        if below in steps_up and (below in self.skipped or (below in self.errors and steps_up[below] in self.errors
                                                            and self.errors[below] > self.errors[steps_up[below]])):
            # Each finer geometry rung merges more primitives. Along +2, +4, +6 the render error on
            # the shared scenes at 5-50x never fell again once it had risen (playbot 20x: +2 was
            # 18x worse than the proxy's rung, +4 and +6 as bad): stop at the first rise.
            self.skipped.add(pi)
            logger.debug("verify preset %s skipped: finer geometry already rendered worse", pi)
            return True
        return False

    def measure(self, pi, tuner: CutTuner, k: int) -> tuple[int, float, float]:
        """Encode the rung at the target: -> (k, size, render error)."""
        target, multi = self.search.target, self.check is not None and len(self.short.rungs) > 1
        if not multi:
            with self.times.step("encode"):
                k, size = tuner.finish(k)
            return k, size, 0.0
        with self.times.step("encode"):
            k, size, probe_data = tuner.probe(k, self.scale)
            if self.scale is None:  # one full encode calibrates the probe sizes for every rung
                self.scale = tuner.full_size(k) / max(size, 1)
                if not 0.97 * target <= tuner.full_size(k) <= target:
                    k, size, probe_data = tuner.probe(k, self.scale)
            size = tuner.full_size(k) if k in tuner.full else self.scale * size
        with self.times.step("verify"):
            err = self.check.error(decode_coded(probe_data))
        logger.debug("verify preset %s: ~%d bytes, render MSE %.3g", pi, size, err)
        return k, size, err

    def miss(self, pi, size) -> bool:
        # rate contract first (never over the target, at most 5% under), then the real error; a
        # rung holding every leaf may land further under (the finer rung would have to merge)
        target = self.search.target
        return size > target or (size < 0.95 * target and pi not in self.short.every_leaf)

    def run_one(self, pi, tuner: CutTuner, k: int) -> None:
        k, size, err = self.measure(pi, tuner, k)
        miss = self.miss(pi, size)
        multi = self.check is not None and len(self.short.rungs) > 1
        if multi and miss and size < self.search.target and (self.best is None or err < self.best.rank[1]):
            # short on the probe's estimate (calibrated on another rung) yet rendering best so
            # far: tune it on real bytes before ruling it out (fruit at 20x: a rung estimated
            # 7.5% short rendered 13x closer than every rung in the window)
            with self.times.step("encode"):
                k, size = tuner.finish(k)
            err = self.check.error(decode_coded(tuner.full[k].data))
            if k >= tuner.kmax:  # it holds every leaf after all
                self.short.every_leaf.add(pi)
            miss = self.miss(pi, size)
            logger.debug("verify preset %s tuned on real bytes: %d bytes (%s), render MSE %.3g", pi, size,
                         "every leaf" if k >= tuner.kmax else f"{k} of {tuner.kmax} splits", err)
        self.errors[pi] = err
        if self.best is None or (miss, err) < self.best.rank:
            if self.best is not None:
                self.best.tuner.release()
            self.best = Checked((miss, err), pi, tuner, k)
        else:
            tuner.release()


def _verify_shortlist(search: RungSearch, short: Shortlist, check: RenderCheck | None, times: StageTimes) -> Checked:
    """Each shortlisted rung is quantised and its cut tuned on fast probe encodes (raw/rANS
    only); the probe file decodes like any other, so the render check runs on it. Only the
    winner gets the full (every coder) encode and the final rate tuning (by the caller)."""
    tree, cache = search.tree, search.cache
    v = _Verifier(search, short, check, times)
    # While a rung is probed and rendered, the next rung sure to be checked is quantised on a
    # second thread (quantisation is mostly single-threaded numpy): one ahead at most (two
    # quantisations at once only contend; playbot 20x: no gain). Not above QUANTIZE_AHEAD_MAX_LEAVES
    # leaves, where a third rung's symbols beside the best's and the current one's set the peak.
    certain = [pi for pi in short.rungs if pi not in short.steps_up or (
        short.steps_up[pi] not in short.steps_up
        and cache[pi].distortion <= _FINER_GEOMETRY_MAX_PROXY * cache[short.proxy_best].distortion)]
    few_leaves = tree.pyramid.levels[-1].num_gaussians <= QUANTIZE_AHEAD_MAX_LEAVES
    ahead = ThreadPoolExecutor(max_workers=1) if check and len(certain) > 1 and few_leaves else None
    quantized = {}  # rung -> future of its quantisation
    try:
        for pi in short.rungs:
            if v.skip(pi):
                continue
            ev = cache[pi]
            with times.step("quantize"):
                if pi in quantized:
                    quantized.pop(pi).result()
                else:
                    quantize_tree(tree.pyramid, ev.rung, tree.meta, search.memo)
                if ahead is not None and pi in certain:  # overlaps this rung's encodes and renders
                    nxt = certain[certain.index(pi) + 1:][:1]
                    if nxt and nxt[0] not in quantized:
                        quantized[nxt[0]] = ahead.submit(quantize_tree, tree.pyramid, cache[nxt[0]].rung, tree.meta,
                                                         search.memo)
            search.prog("encode", 0, 1)
            v.run_one(pi, CutTuner(tree.pyramid, ev.rung, tree.meta, search.target), ev.k)
    finally:
        if ahead is not None:
            ahead.shutdown(wait=True, cancel_futures=True)
    return v.best


def _every_leaf(search: RungSearch, pi: tuple) -> Encoding:
    """The file of every leaf at rung ``pi`` (over the target or not; over it, the rung's
    symbols are dropped)."""
    tree = search.tree
    search.evaluate(pi)
    rung = search.cache[pi].rung
    quantize_tree(tree.pyramid, rung, tree.meta, search.memo)
    tuner = CutTuner(tree.pyramid, rung, tree.meta, search.target)
    tuner.full_size(tuner.kmax)
    enc = tuner.full[tuner.kmax]
    if enc.nbytes > search.target:
        rung.symbols = []
    return enc


def _fill_point(lo: float, hi: float, lo_bytes: int, hi_bytes: int, target: int) -> float | None:
    """The rung between ``lo`` and ``hi`` (on a 1/FILL_GRID grid) whose every leaf should take
    FILL_AIM of the target, the log of the size taken as linear in between; None: no grid
    point lies strictly between them."""
    t = math.log(FILL_AIM * target / lo_bytes) / math.log(max(hi_bytes, lo_bytes + 1) / lo_bytes)
    x = lo + min(max(t, 1 / 16), 15 / 16) * (hi - lo)
    x = round(x * FILL_GRID) / FILL_GRID
    x = min(max(x, math.floor(lo * FILL_GRID + 1) / FILL_GRID), math.ceil(hi * FILL_GRID - 1) / FILL_GRID)
    return x if lo < x < hi else None


def _fill_axis(search: RungSearch, enc: Encoding, axis: int, top: float, hold: tuple = ()) -> Encoding:
    """Along one axis of the rung (0: geometry, 1: appearance) up to ``top``: whole rungs while
    every leaf fits, then fractional ones toward the first that does not (``hold``: the rest of
    each rung's index, :func:`make_preset`'s ``bits_from`` and ``palettes_from``)."""
    target = search.target
    at = list(enc.rung.index[:2])

    def rung(x):
        at[axis] = x
        return tuple(at) + hold

    lo, hi = enc.rung.index[axis], math.floor(enc.rung.index[axis]) + 1
    over = None  # the file at ``hi``, over the target
    while hi <= top and enc.nbytes < FILL_BELOW * target:
        found = _every_leaf(search, rung(hi))
        logger.debug("every leaf at rung %s: %d bytes of %d", rung(hi), found.nbytes, target)
        if found.nbytes > target:
            over = found
            break
        lo, hi, enc = hi, hi + 1, found
    if over is None:
        return enc
    enc, lo = _bisect_fill(search, enc, over, lo, hi, rung)
    if axis == 0 and not hold and enc.nbytes < FILL_BELOW * target:
        enc = _fill_with_bits_held(search, enc, lo)
    if axis == 0 and not hold and enc.nbytes < FILL_BELOW * target:
        enc = _fill_with_palettes_held(search, enc, over, top)
    return enc


def _bisect_fill(search: RungSearch, enc: Encoding, over: Encoding, lo: float, hi: float, rung):
    """Fractional rungs ``rung(x)`` between ``lo`` (``enc``, fits) and ``hi`` (``over``, does
    not), at most FILL_STEPS, until the file fills FILL_BELOW: -> (the best that fits, its x)."""
    target = search.target
    for _ in range(FILL_STEPS):
        x = _fill_point(lo, hi, enc.nbytes, over.nbytes, target)
        if enc.nbytes >= FILL_BELOW * target or x is None:
            break
        found = _every_leaf(search, rung(x))
        logger.debug("every leaf at rung %s: %d bytes of %d", rung(x), found.nbytes, target)
        if found.nbytes <= target:
            lo, enc = x, found
        else:
            hi, over = x, found
    return enc, lo


def _fill_with_bits_held(search: RungSearch, enc: Encoding, lo: float) -> Encoding:
    """The fill stopped short below a rounding jump of the bit depths (allocator.geometry_rung):
    the same bit depths as rung floor(lo), steps moving on toward the next rung."""
    g, a = math.floor(lo), enc.rung.index[1]
    if lo == g or geometry_rung(lo)[3:5] != GEOMETRY_LADDER[g][3:5]:
        return enc  # not below a jump out of rung g's bits
    top = g + (FILL_GRID - 1) / FILL_GRID
    far = _every_leaf(search, (top, a, g))
    logger.debug("every leaf at rung %s: %d bytes of %d", (top, a, g), far.nbytes, search.target)
    if far.nbytes <= search.target:
        return far if far.nbytes > enc.nbytes else enc
    return _bisect_fill(search, enc, far, lo, top, lambda x: (x, a, g))[0]


def _palette_channels(enc: Encoding) -> tuple:
    pal = enc.rung.tables.palettes
    return () if pal is None else tuple(sorted(pal.values))


def _fill_with_palettes_held(search: RungSearch, enc: Encoding, over: Encoding, top: float) -> Encoding:
    """The fill stopped short below a rung that turns on more of the source's value tables (a
    lossless table costs more than the uniform step it replaces: statue_st_peter's colours +5.5%
    of the file at once): the geometry fill again, every rung using ``enc``'s tables."""
    if _palette_channels(over) == _palette_channels(enc):
        return enc
    p = enc.rung.preset
    held = _fill_axis(search, enc, 0, top, hold=(None, p.geometry if p.palettes_from is None else p.palettes_from))
    logger.debug("every leaf at rung %s (palettes held): %d bytes of %d", held.rung.index, held.nbytes, search.target)
    return held if held.nbytes > enc.nbytes else enc


def _fill_between_rungs(search: RungSearch, enc: Encoding) -> Encoding:
    """Every leaf at rung (g, a) leaves the budget short: the finest rung at or above it whose
    every leaf fits the target on real bytes, fractional between two ladder rungs (geometry
    first; at the finest geometry rung, appearance between two per-primitive SH rungs)."""
    top_g, ladder = len(GEOMETRY_LADDER) - 1, APPEARANCE_LADDER
    enc = _fill_axis(search, enc, 0, top_g)
    g, a = enc.rung.index[:2]
    if g == top_g and len(ladder[int(a)]) == 4 and enc.nbytes < FILL_BELOW * search.target:
        enc = _fill_axis(search, enc, 1, len(ladder) - 1)
    logger.debug("every leaf at rung %s: %d bytes of %d", enc.rung.index, enc.nbytes, search.target)
    return enc


def fill_every_leaf(tree: Tree, enc: Encoding, target: int, *, seed: int, prog: Progress) -> Encoding:
    """A file of every leaf of ``tree`` below FILL_BELOW of the target, moved to the finest rung
    whose every leaf fits (:func:`_fill_between_rungs`); otherwise ``enc`` as it is."""
    if enc.k < len(enc.rung.plan.order_level) or enc.nbytes >= FILL_BELOW * target:
        return enc
    return _fill_between_rungs(RungSearch(tree, target, seed, prog), enc)


def allocate_and_encode(tree: Tree, target: int, *, seed: int, prog: Progress, times: StageTimes,
                        check: RenderCheck | None = None, pin: tuple | None = None, start: tuple | None = None,
                        want_seeds: bool = False, fill: bool = True) -> Allocation:
    """Rung choice (proxy hill climb, render-verified shortlist), cut tuning and the final encode.
    ``pin``: code at that rung (no search). ``start``: climb from that rung. ``want_seeds``: if
    the cut keeps (nearly) every leaf, also return what the pruning search's pinned variants
    reuse (:class:`PinnedSeeds`). ``fill``: a winner that keeps every leaf short of the target
    moves to a finer fractional rung (:func:`_fill_between_rungs`; never with ``pin``)."""
    search = RungSearch(tree, target, seed, prog)
    with times.stage("allocate", lambda: f"{len(search.cache)} rungs estimated, proxy's best {search.ranked()[0]}"):
        if pin is not None:
            search.evaluate(tuple(pin))
        else:
            search.climb(start)
        prog("allocate", len(search.cache), len(search.cache))
    short = make_shortlist(search, check, pinned=pin is not None)
    best = _verify_shortlist(search, short, check, times)
    with times.step("encode"):
        k, size = best.tuner.finish(best.k)
        enc = best.tuner.full[k]
        if fill and pin is None and k >= best.tuner.kmax and size < FILL_BELOW * target:
            enc = _fill_between_rungs(search, enc)
    prog("encode", 1, 1)
    seeds = None
    if want_seeds and sum(enc.terminal) >= KEEPS_ALL_SHARE * tree.pyramid.levels[-1].num_gaussians:
        # only a cut that keeps (nearly) every leaf has its finer neighbours searched
        pi = enc.rung.index
        nbrs = [nxt for nxt in ((pi[0] + 1, pi[1]), (pi[0], pi[1] + 1), (pi[0] + 2, pi[1]))
                if nxt[0] <= len(GEOMETRY_LADDER) - 1 and nxt[1] <= search.n_app - 1]
        for nxt in nbrs:
            search.evaluate(nxt)
        seeds = PinnedSeeds(rates={p: float(c.rung.plan.rate[-1] + c.rung.fixed_bytes) for p, c in search.cache.items()},
                            estimates={p: search.cache[p].rung for p in nbrs}, books=search.books, memo=search.memo)
    return Allocation(enc, seeds)
