"""PGMS compress: the public Python API of the encoder, and its stages in order.

``compress``: contributions (rendered views, ``contribution``) -> pruning -> mixture pyramid
(``tree``) -> rung search and cut tuning (``rung_search``, ``cut``) -> pruning search
(``prune``) -> refinement (``refine``) -> .pgms bytes (``visionmoe.splat.pgms``). Each stage
takes and returns dataclasses; its time lands in ``CompressResult.timings`` and in an INFO log
line. The way back, ``decompress``, is :func:`visionmoe.splat.pgms.decode.decompress`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ...common.files import atomic_write_bytes
from ..io import GaussianScene, read_ply
from ..memory import check_encode_memory
from ..pgms.decode import decode_budget, memory_needed
from . import prune, refine, rung_search
from .allocator import Preset
from .check_views import SEARCH_VIEWS, References, search_views, view_indices
from .cut import Encoding
from .guards import GuardedScene, guard_input
from .options import EncodeOptions
from .psnr import search_psnr
from .stages import Progress, ProgressFn, StageTimes
from .tree import Tree, build_tree

logger = logging.getLogger(__name__)

__all__ = ["compress", "CompressResult", "reference_ply_bytes"]


def reference_ply_bytes(num_gaussians: int, sh_degree: int) -> int:
    """Size of the native-degree binary float32 INRIA .ply (header + payload): the ratio's baseline."""
    k = 3 * ((sh_degree + 1) ** 2 - 1)
    names = (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"] + [f"f_rest_{i}" for i in range(k)]
             + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])
    header = (f"ply\nformat binary_little_endian 1.0\nelement vertex {num_gaussians}\n"
              + "".join(f"property float {n}\n" for n in names) + "end_header\n")
    return len(header) + 4 * len(names) * num_gaussians


@dataclass
class CompressResult:
    data: bytes
    reference_bytes: int  # native-degree float32 .ply size of the input
    target_bytes: int | None
    preset_index: tuple  # (geometry rung, appearance rung[, bits_from]), fractional where between two
    preset: Preset
    primitives: int  # terminal primitives in the full decode
    primitives_per_level: list[int]
    coded_per_level: list[int]
    input_gaussians: int
    pruned: int
    proxy_psnr: float  # PSNR predicted by the allocator's contribution-weighted distortion
    timings: dict[str, float] = field(default_factory=dict)
    stream_stats: list = field(default_factory=list)
    clamped_log_scales: int = 0  # Gaussians whose log-scales were clamped into [-30, 30] (encoder.guards)
    decode_bytes: int = 0  # the decoder's peak estimate (decode.memory_needed); see decode_budget_met
    target_note: str = ""  # why the file is outside [0.95, 1.0] x the byte target ("" when it is inside)

    @property
    def decode_budget_met(self) -> bool:
        """Whether ``decompress`` takes the file without a raised ``max_memory``."""
        return self.decode_bytes <= decode_budget(len(self.data))

    @property
    def target_met(self) -> bool:
        """Whether the file landed within [0.95, 1.0] x the byte target (None target: True)."""
        return self.target_bytes is None or 0.95 * self.target_bytes <= len(self.data) <= self.target_bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def ratio(self) -> float:
        return self.reference_bytes / max(len(self.data), 1)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the file atomically (:func:`visionmoe.common.files.atomic_write_bytes`)."""
        return atomic_write_bytes(path, self.data)

    def summary(self) -> dict:
        return {
            "bytes": self.nbytes, "ratio": round(self.ratio, 3), "target_bytes": self.target_bytes,
            "target_met": self.target_met, "target_note": self.target_note, "preset": self.preset_index, "primitives": self.primitives, "input_gaussians": self.input_gaussians,
            "pruned": self.pruned, "per_level_terminal": self.primitives_per_level,
            "per_level_coded": self.coded_per_level, "proxy_psnr": round(self.proxy_psnr, 2),
            "sh_fraction": self.preset.sh_fraction, "sh_degree": self.preset.sh_degree,
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
        }


# --------------------------------------------------------------------------- API


def _load(scene_or_path) -> GaussianScene:
    if isinstance(scene_or_path, GaussianScene):
        return scene_or_path.to("cpu")
    if isinstance(scene_or_path, (str, os.PathLike)):
        return read_ply(scene_or_path)
    raise TypeError(f"expected a GaussianScene or a .ply path, got {type(scene_or_path).__name__}")


def compress(
    scene_or_path,
    *,
    ratio: float | None = None,
    size: int | None = None,
    psnr: float | None = None,
    cameras=None,
    device: str | torch.device | None = None,
    contributions: torch.Tensor | None = None,
    num_views: int | None = None,
    view_size: int = 256,
    coverage_views: int | None = None,
    up="-y",
    frame: str = "scene",
    preset: tuple[float, int] | None = None,
    refine_steps: int | None = None,
    prune_threshold: float = 1 / 255,
    verify_views: int = 4,
    verify_candidates: int = 3,
    prune_search: int | None = None,
    progress: bool | ProgressFn = False,
    seed: int = 0,
    effort: str = "default",
    max_memory: int | None = None,
) -> CompressResult:
    """Compress a 3DGS scene to .pgms bytes under one target.

    Targets (give at most one; default ``ratio=20``): ``ratio`` (against the native-degree
    float32 .ply), ``size`` (bytes), or ``psnr`` (dB, render vs render on the contribution
    views; found by bisection on the size). ``cameras``: a ``Cameras`` for contributions (and
    the PSNR search), default ``num_views`` (None: the effort's, 16, 8 at fast) orbit views of
    ``view_size`` px at 20 degrees of elevation plus half as many at 45 and at 0, orbiting ``up``
    (a 3-vector or ``"+z"``-style axis; default ``-y``, the INRIA/COLMAP convention).
    ``frame``: ``"scene"`` (default) codes the scene in its canonical frame (centred, in units of
    its size, ``up`` along +y, the principal axis across up along +x; ``similarity``) and
    writes the way back to the file (section XFRM, format 5), so a turned, moved or rescaled
    scene (``up`` turned with it) is coded alike; ``"world"`` codes it as given, without XFRM
    (docs/EVALUATION.md). With the default views,
    ``coverage_views`` more views from every direction (alternately at the orbit distance and
    half of it; ``contribution.coverage_views``; None: the effort's) add to the contributions, so
    nothing a viewer sees from below, from a steep angle or closer up is pruned; 0: none.
    ``device``: where every render of the encode runs (contributions, checks, pruning search,
    refinement); None picks CUDA when torch sees a GPU. The codec itself runs on the CPU. On
    CUDA the bytes are reproducible only to rounding (float atomics); the CPU is bit-exact.
    ``contributions`` [N] skips rendering (precomputed per-Gaussian image-space contribution).
    ``preset`` pins the allocator's quality rungs ``(geometry, appearance)`` (geometry may be fractional,
    between two ladder rungs: ``allocator.geometry_rung``). ``refine_steps``: Adam
    steps of the render-vs-original-render refinement of the chosen primitives, kept only if
    the re-encoded result renders closer to the original on the contribution views; None
    (default) runs the effort's steps (80, rates decaying to 3%; none at ``fast``) for
    ratio/size targets on cuts of at most 150k primitives that render below 48 dB, 0 turns it off. The allocator's best
    ``verify_candidates`` presets (by its contribution-weighted proxy) are encoded at the target
    and the one with the lowest render error on ``verify_views`` of the views is kept (0: trust
    the proxy). ``prune_search`` > 0: unless the cut keeps every leaf at the finest rungs, up to that
    many variants that drop the lowest-contribution Gaussians instead (fewer, unmerged
    primitives when the cut merges more than a tenth of the leaves; when it keeps them all,
    the finer neighbouring rungs with as many Gaussians as they fit, and on scenes of at most
    150k leaves a fresh rung search without the faintest tenth) are encoded at the same target
    and rendered on every contribution view; the lowest error within the rate window wins
    (needs ``verify_views`` > 0; not used with ``psnr=`` or ``preset=``); None: the effort's.
    ``effort``: ``"fast"``, ``"default"`` or ``"max"``, what the searches spend
    (``options.EFFORTS``): ``max`` runs every search at its full count (80 refinement steps of
    8 views of 512 px), ``default`` the same steps on 4 views, ``fast`` neither the pruning search nor
    the refinement. ``progress``: True shows a tqdm bar; a callable receives ``(stage, done,
    total)`` with ``total`` the whole encode's steps, fixed before the first call, and ``done``
    growing to it (``stages.Progress``). ``max_memory`` (bytes): refuse a scene whose estimated
    peak is above it before encoding (``memory.EncodeMemoryError``); None checks nothing."""
    opts = EncodeOptions(ratio=ratio, size=size, psnr=psnr, cameras=cameras, device=device,
                         contributions=contributions, num_views=num_views, view_size=view_size,
                         coverage_views=coverage_views, up=up, frame=frame, preset=preset,
                         refine_steps=refine_steps, prune_threshold=prune_threshold, verify_views=verify_views,
                         verify_candidates=verify_candidates, prune_search=prune_search, seed=seed, effort=effort,
                         max_memory=max_memory)
    prog = Progress(progress)
    try:
        guarded = _guarded(scene_or_path, opts.max_memory)
        del scene_or_path  # a scene read from a path is then held by _encode alone (below)
        return replace(_encode(guarded, opts, prog), clamped_log_scales=guarded.clamped_log_scales)
    finally:
        prog.close()


def _guarded(scene_or_path, max_memory):
    """The input scene, read and guarded (``guards.guard_input``), refused if it cannot fit."""
    guarded = guard_input(_load(scene_or_path))
    if max_memory is not None:
        check_encode_memory(guarded.scene.num_gaussians, guarded.scene.sh_degree, max_memory)
    return guarded


@dataclass
class _Inputs:
    """What the stages after the contribution pass share."""

    scene: GaussianScene
    opts: EncodeOptions
    cameras: object  # the check views; None only with given contributions and no render check
    refs: References | None  # the original's renders of the check views, then of the coverage views
    ref_bytes: int
    prog: Progress
    times: StageTimes
    check: rung_search.RenderCheck | None = None  # the rung choice's render check


def _contributions(scene: GaussianScene, opts: EncodeOptions, prog: Progress):
    """Stage 1: cameras and image-space contributions -> (contributions, cameras, known renders,
    how many leading cameras are the check views).

    Without given cameras the encoder's views are the orbit rings followed by the coverage views
    (``contribution.coverage_views``). The contributions and the pruning search use all of them;
    the rung check, the refinement and the PSNR search keep to the rings (docs/EVALUATION.md,
    "The pruning search on the coverage views")."""
    cameras = opts.cameras
    if cameras is None and _renders_views(opts):
        from ..cameras import Cameras
        from .contribution import coverage_views, default_cameras

        cameras = default_cameras(scene, num_views=opts.num_views, size=opts.view_size, up=opts.up)
        rings = len(cameras)
        if opts.coverage_views > 0:
            cover = coverage_views(scene, num_views=opts.coverage_views, size=opts.view_size, up=opts.up)
            cameras = Cameras.concat([cameras, cover])
    else:
        rings = None if cameras is None else len(cameras)
    known = {}
    contributions = opts.contributions
    if contributions is None:
        # the scene's own renders on the check and search views, taken from the contribution renders
        from .contribution import image_contributions

        prog("contributions", 0, 1)
        checked = opts.verify_views if opts.preset is None else 0  # views the rung choice renders
        refined = SEARCH_VIEWS if _may_refine(opts) else 0  # the refinement's check
        pruned_on = search_views(scene.num_gaussians) if opts.prune_search > 0 else 0
        keep = sorted(set(view_indices(rings, checked)) | set(view_indices(rings, refined))
                      | set(view_indices(len(cameras), pruned_on)))
        contributions, colors = image_contributions(scene, cameras, device=opts.device, keep_colors=keep)
        known = dict(zip(keep, colors)) if keep else {}  # no view to keep: no renders come back
    prog.finish("contributions")
    contributions = contributions.detach().float().cpu()
    n_in = scene.num_gaussians
    if contributions.shape != (n_in,):
        raise ValueError(f"contributions must have shape ({n_in},), got {tuple(contributions.shape)}")
    if not torch.isfinite(contributions).all():
        raise ValueError("contributions hold NaN/Inf")
    return contributions, cameras, known, rings


def _renders_views(opts: EncodeOptions) -> bool:
    """Whether the encode renders views of its own (given contributions and no render check: none)."""
    return opts.contributions is None or opts.psnr is not None or opts.verify_views > 0 or _may_refine(opts)


def _may_refine(opts: EncodeOptions) -> bool:
    """Whether the refinement can run (auto at an effort without one: never)."""
    return opts.refine_steps != 0 and not (opts.refine_steps is None and opts.budget.refine_steps == 0)


def _progress_plan(opts: EncodeOptions) -> list[tuple[str, int]]:
    """Each stage's share of the encode's progress steps, known before it starts: the
    refinement's Adam steps one step each, the other stages weighted by their usual cost."""
    views = opts.cameras is not None or _renders_views(opts)
    steps = opts.refine_steps if opts.refine_steps is not None else opts.budget.refine_steps
    refine_steps = steps if (views and _may_refine(opts) and (opts.psnr is None or opts.refine_steps)) else 0
    if opts.psnr is not None:
        search = [("psnr search", 7 * _SEARCH_STEPS)]
    else:
        pruned = opts.prune_search > 0 and opts.render_checked and views
        search = [("allocate", _SEARCH_STEPS), ("encode", _SEARCH_STEPS),
                  ("prune search", _SEARCH_STEPS * (opts.prune_search + 2) if pruned else 0)]
    return [("contributions", 2 * _SEARCH_STEPS if opts.contributions is None else 0), ("pyramid", 2), *search,
            ("refine", refine_steps)]


_SEARCH_STEPS = 4  # progress steps of one rung search (about the time of 4 refinement steps)


def _to_canonical(scene: GaussianScene, opts: EncodeOptions):
    """``frame="scene"``: -> (the scene in its canonical frame, the options moved with it, the
    file's way back). Every choice the encoder makes (views, grouping grid, quantisation grids,
    SH codebooks) is then made in a frame derived from the scene alone, so a turned, moved or
    rescaled copy of a scene (its up turned with it) is coded alike up to float rounding."""
    if opts.frame == "world":
        return scene, opts, None
    from ..cameras import transform_cameras
    from ..similarity import canonical_similarity, file_transform, transform_scene

    R, t, s = canonical_similarity(scene, opts.up)
    canon = transform_scene(scene, R, t, s)
    back = file_transform(R.T, -(R.T @ t) / s, 1.0 / s, scene.sh_degree)
    cameras = None if opts.cameras is None else transform_cameras(opts.cameras, R, t, s)
    return canon, replace(opts, cameras=cameras, up=(0.0, 1.0, 0.0)), back


def _encode(guarded: GuardedScene, opts: EncodeOptions, prog: Progress) -> CompressResult:
    times = StageTimes()
    t0 = time.perf_counter()
    prog.plan(_progress_plan(opts))
    # the input scene goes once its canonical copy exists (unless the caller holds it): a 6M SH3
    # scene is 1.4 GB
    scene, guarded.scene = guarded.scene, None
    scene, opts, transform = _to_canonical(scene, opts)
    n_in = scene.num_gaussians
    ref_bytes = reference_ply_bytes(n_in, scene.sh_degree)
    with times.stage("contributions"):
        contributions, every_view, known, rings = _contributions(scene, opts, prog)
    # the references cover every view; the check views (``cameras``) are the leading ``rings``
    refs = References(scene, every_view, opts.device, known) if every_view is not None else None
    cameras = None if every_view is None else every_view[:rings]
    inp = _Inputs(scene, opts, cameras, refs, ref_bytes, prog, times)
    inp.check = _render_check(inp)
    from .contribution import prune_mask

    with times.stage("pyramid", lambda: f"{tree.kept.num_gaussians} of {n_in} Gaussians kept, "
                                        f"{tree.pyramid.num_levels} levels"):
        coded, w_all, counts = _coded_rows(scene, contributions)
        keep = prune_mask(w_all, opts.prune_threshold)
        prog("pyramid", 0, 1)
        tree = build_tree(coded.subset(keep), w_all[keep], scene.sh_degree, n_in, ref_bytes, transform,
                          None if counts is None else counts[keep])
        del coded, w_all
        prog.finish("pyramid")
    if opts.psnr is None:
        target = opts.target_bytes(ref_bytes)
        tree, enc = _encode_at_target(inp, tree, target)
    else:
        quiet = prog.quiet()  # each bisection step's rung search reports as the PSNR search
        found = search_psnr(scene, opts.psnr, cameras, opts.device, ref_bytes,
                            lambda t: _allocate(inp, tree, t, prog=quiet).encoding, prog)
        enc, target = found.encoding, found.target_bytes
    tree, enc = _refine(inp, tree, enc, target)
    prog.finish("refine")
    prog.end()
    times.set("total", time.perf_counter() - t0)
    target_note = _warn_target(opts, enc, target)
    pixels = float(_num_pixels(cameras)) if cameras is not None else None
    dist = float(enc.rung.plan.distortion[enc.k])
    proxy = 10 * math.log10(pixels / max(dist, 1e-12)) if pixels else float("nan")
    return CompressResult(
        data=enc.data, reference_bytes=ref_bytes, target_bytes=target, preset_index=enc.rung.index,
        preset=enc.rung.preset, primitives=sum(enc.terminal), primitives_per_level=enc.terminal,
        coded_per_level=enc.coded, input_gaussians=n_in, pruned=n_in - _source_rows(tree), proxy_psnr=proxy,
        timings=times.seconds, stream_stats=enc.stats, decode_bytes=_check_decode_memory(enc.data),
        target_note=target_note,
    )


def _coded_rows(scene: GaussianScene, contributions: torch.Tensor):
    """-> (the rows to code, their contributions, how many identical source rows each stands for
    or None): one row per group of bitwise-identical Gaussians (``encoder.copies``), its
    contribution the group's sum."""
    from .copies import find_copies

    copies = find_copies(scene)
    if copies is None:
        return scene, contributions, None
    logger.info("%d of %d Gaussians are exact copies of another: coded once, with a copy count",
                scene.num_gaussians - len(copies.rows), scene.num_gaussians)
    return scene.subset(copies.rows), copies.sum_per_entry(contributions), copies.count


def _source_rows(tree: Tree) -> int:
    """The source Gaussians the tree's kept rows stand for."""
    return tree.kept.num_gaussians if tree.copies is None else int(tree.copies.sum())


def _render_check(inp: _Inputs) -> rung_search.RenderCheck | None:
    opts = inp.opts
    if not (opts.render_checked and inp.cameras is not None):
        return None
    views = view_indices(len(inp.cameras), opts.verify_views)
    return rung_search.RenderCheck(opts.verify_candidates, inp.refs.error_on(views))


def _allocate(inp: _Inputs, tree: Tree, target: int, *, times: StageTimes | None = None, pin=None, start=None,
              want_seeds: bool = False, fill: bool = True, prog: Progress | None = None) -> rung_search.Allocation:
    """Rung search, cut tuning and the final encode of ``tree`` at ``target`` bytes."""
    return rung_search.allocate_and_encode(tree, target, seed=inp.opts.seed, prog=inp.prog if prog is None else prog,
                                     times=inp.times if times is None else times, check=inp.check,
                                     pin=inp.opts.preset if pin is None else pin, start=start, want_seeds=want_seeds,
                                     fill=fill)


def _encode_at_target(inp: _Inputs, tree: Tree, target: int) -> tuple[Tree, Encoding]:
    """Stages 3-4: the rung search and cut tuning, then the pruning search (where enabled)."""
    opts = inp.opts
    base = _allocate(inp, tree, target, want_seeds=True)
    enc = base.encoding
    inp.prog.finish("encode")
    logger.info("rung %s: %d bytes (target %d), %d primitives", enc.rung.index, enc.nbytes, target, sum(enc.terminal))
    if opts.prune_search == 0 or inp.check is None:
        return tree, enc
    with inp.times.stage("prune search", lambda: f"{best.tree.kept.num_gaussians} of {tree.kept.num_gaussians} "
                                                 f"Gaussians kept, rung {best.encoding.rung.index}, "
                                                 f"{best.encoding.nbytes} bytes"):
        # judged on 16 views (8 on large scenes) spread over the rings and the coverage views: 4
        # views missed the damage of pruning, and the rings alone kept statue_st_peter at SOG's
        # size on a rung 0.47 dB worse on held-out views (docs/EVALUATION.md)
        error = inp.refs.error_on(view_indices(len(inp.refs.cameras), search_views(inp.scene.num_gaussians)))
        quiet = inp.times.disabled()
        # each variant is coded with the base's seed and render check, its stage times not logged
        # (``quiet``); the pruning search only runs without a pinned preset
        job = prune.PruneJob(target, inp.scene.sh_degree, inp.scene.num_gaussians, inp.ref_bytes, error,
                             opts.prune_search, opts.seed, inp.check, quiet, refined=_will_refine(inp),
                             top_up=opts.budget.top_up)
        best = prune.search_pruning(prune.Variant(float("nan"), enc, tree), base.seeds, job, inp.prog)
    inp.prog.finish("prune search")
    return best.tree, best.encoding


def _refine_steps(inp: _Inputs, primitives: int) -> int:
    """The refinement's Adam steps for a cut of ``primitives`` (auto: where it stays affordable)."""
    opts = inp.opts
    if inp.cameras is None:
        return 0
    if opts.refine_steps is not None:
        return opts.refine_steps
    auto = opts.psnr is None and primitives <= refine.AUTO_REFINE_MAX_PRIMITIVES
    return opts.budget.refine_steps if auto else 0


def _will_refine(inp: _Inputs):
    """-> ``refined(variant)``: whether :func:`_refine` will refine a pruning variant's cut. The
    auto refinement skips cuts rendering above ``AUTO_REFINE_BELOW_DB`` on its own views; judged
    here on the search views."""
    below = 10 ** (-refine.AUTO_REFINE_BELOW_DB / 10)

    def refined(v: prune.Variant) -> bool:
        if not _refine_steps(inp, sum(v.encoding.terminal)):
            return False
        return inp.opts.refine_steps is not None or v.error > below

    return refined


def _refine(inp: _Inputs, tree: Tree, enc: Encoding, target: int) -> tuple[Tree, Encoding]:
    """Stage 5: the refinement (auto: where it pays and stays affordable), re-encoded within the
    encode's ``target`` bytes."""
    opts, steps = inp.opts, _refine_steps(inp, sum(enc.terminal))
    if not steps:
        return tree, enc
    job = refine.RefineJob(inp.scene, inp.cameras, steps, opts.device, target,
                           skip_above_db=refine.AUTO_REFINE_BELOW_DB if opts.refine_steps is None else None,
                           views=opts.budget.refine_views)
    with inp.times.stage("refine", lambda: f"{'kept' if out is not enc else 'not kept'}, {out.nbytes} bytes"):
        out = refine.refine_checked(tree, enc, job, inp.refs, inp.prog)
    return tree, out


def _check_decode_memory(data: bytes) -> int:
    need = memory_needed(data)
    if need > decode_budget(len(data)):  # never seen on real scenes (docs/ROBUSTNESS.md); said if it happens
        logger.warning("decoding this file needs about %d MiB, above the default decode budget for its size: "
                       "decompress it with max_memory (--max-memory)", need >> 20)
    return need


def _warn_target(opts: EncodeOptions, enc: Encoding, target: int) -> str:
    """Log (and return) why the file missed the [0.95, 1.0] x target window; "" when it did not."""
    n = enc.nbytes
    if opts.psnr is not None or 0.95 * target <= n <= target:
        return ""
    if n > target:
        why = "even the coarsest rungs exceed it"
    elif enc.k >= len(enc.rung.plan.order_level):  # every primitive of the chosen rung is stored
        why = ("the chosen rung stores every primitive; a rung that fills the budget is either not "
               "available or renders worse")
    else:
        why = "no rung checked landed inside the window; the best-rendering one under the target is kept"
    logger.warning("target %d bytes not met within 5%%: wrote %d bytes (%s)", target, n, why)
    return why


def _num_pixels(cameras) -> int:
    c = cameras.viewmats.shape[0]
    return int(c * cameras.width * cameras.height)
