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
from .allocator import APPEARANCE_LADDER, CLIMB_START_GEOMETRY, GEOMETRY_LADDER, make_preset, plan_cut
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
# while every leaf still fits on real bytes, then toward the next rung by bisection, to 1/8 of a
# rung (allocator.geometry_rung: fractional rungs). Next to it a ladder rung would have to merge,
# and the byte gap between two rungs (9.6% between rungs 13 and 14 on a 20k-Gaussian float
# scene) was rate the file could not spend, often below the 5% window. Real bytes, not the
# proxy's estimates: the proxy put every leaf of that scene within 287 kB at rung 14, which
# took 294 kB.
FILL_BELOW = 0.97
FILL_BISECTIONS = 3


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
        self.n_app = len(APPEARANCE_LADDER) if tree.meta.sh_degree > 0 else 1

    def evaluate(self, pi: tuple) -> tuple:
        """The rung's ranking key (unfit rungs rank after every fitting one, smallest estimate first)."""
        if pi not in self.cache:
            pyr = self.tree.pyramid
            rung = estimate_rung(pyr, make_preset(*pi), self.tree.meta, self.samples, self.seed, self.books, self.memo)
            rung.plan = plan_cut(pyr.child_count, pyr.parent, rung.cost, rung.node_bytes)
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
                        nxt = list(best)
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
        g0, a0 = ranked[0]
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
    # quantisations at once only contend; playbot 20x: no gain).
    certain = [pi for pi in short.rungs if pi not in short.steps_up or (
        short.steps_up[pi] not in short.steps_up
        and cache[pi].distortion <= _FINER_GEOMETRY_MAX_PROXY * cache[short.proxy_best].distortion)]
    ahead = ThreadPoolExecutor(max_workers=1) if check and len(certain) > 1 else None
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


def _fill_between_rungs(search: RungSearch, enc: Encoding) -> Encoding:
    """Every leaf at rung g leaves the budget short: the finest geometry rung at or above g,
    fractional between two ladder rungs, whose every leaf fits the target on real bytes (whole
    ladder rungs first, then a bisection toward the next one)."""
    tree, target = search.tree, search.target
    g, a = enc.rung.index
    top = len(GEOMETRY_LADDER) - 1

    def every_leaf(geometry) -> Encoding | None:
        search.evaluate((geometry, a))
        rung = search.cache[(geometry, a)].rung
        quantize_tree(tree.pyramid, rung, tree.meta, search.memo)
        tuner = CutTuner(tree.pyramid, rung, tree.meta, target)
        if tuner.full_size(tuner.kmax) <= target:
            return tuner.full[tuner.kmax]
        rung.symbols = []
        return None

    lo, hi = g, math.floor(g) + 1
    while hi <= top and (found := every_leaf(hi)) is not None:
        lo, hi, enc = hi, hi + 1, found
    if hi <= top:
        for _ in range(FILL_BISECTIONS):
            mid = (lo + hi) / 2
            if (found := every_leaf(mid)) is not None:
                lo, enc = mid, found
            else:
                hi = mid
    logger.debug("every leaf at rung %s: %d bytes of %d", (lo, a), enc.nbytes, target)
    return enc


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
                if nxt[0] <= len(GEOMETRY_LADDER) - 1 and nxt[1] < search.n_app]
        for nxt in nbrs:
            search.evaluate(nxt)
        seeds = PinnedSeeds(rates={p: float(c.rung.plan.rate[-1] + c.rung.fixed_bytes) for p, c in search.cache.items()},
                            estimates={p: search.cache[p].rung for p in nbrs}, books=search.books, memo=search.memo)
    return Allocation(enc, seeds)
