"""The options of one encode (``compress``'s keyword arguments), validated."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .allocator import make_preset


FRAMES = ("scene", "world")  # compress(frame=): code in the scene's canonical frame, or as given


@dataclass(frozen=True)
class Effort:
    """What one ``compress(effort=)`` level spends on the searches (docs/PGMS_ENCODER.md, "Effort").

    ``prune_search``: pruned variants tried (``compress(prune_search=None)``); ``top_up``: the
    pruning search's last refill toward 99.5% of the target; ``refine_steps``: the automatic
    refinement's Adam steps; ``refine_views``: views of 512 px rendered per refinement step
    (its pixel budget); ``views``, ``coverage_views``: the contribution views' defaults
    (``compress(num_views=None, coverage_views=None)``)."""

    name: str
    prune_search: int
    top_up: bool
    refine_steps: int
    refine_views: int
    views: int = 16
    coverage_views: int = 16


# ``max`` is the encoder's full search (every search at the counts tuned on the shared scenes).
# ``default`` renders half the refinement's pixels a step: on the tuning scenes at 20x (held-out
# PSNR, 16 views of 512 px) cg_jesus_standing_sh0 39.58 -> 39.77 dB; half the steps instead lost
# guitar 0.38 dB and, with half the pixels too, cg_jesus 1.2 dB. ``fast`` skips the pruning
# search and the refinement, and renders half the contribution views (8 orbit and 8 coverage
# views): on held-out views at 20x and at SOG's size, 10 of 12 scene-target pairs rendered as
# close or closer (-0.38 to +1.6 dB), for half the contribution time (docs/BENCHMARKS.md, "Effort").
EFFORTS = {
    "fast": Effort("fast", prune_search=0, top_up=False, refine_steps=0, refine_views=4, views=8, coverage_views=8),
    "default": Effort("default", prune_search=3, top_up=True, refine_steps=80, refine_views=4),
    "max": Effort("max", prune_search=3, top_up=True, refine_steps=80, refine_views=8),
}


@dataclass
class EncodeOptions:
    """See :func:`visionmoe.splat.encoder.compress.compress` for each field. ``ratio`` defaults to 20 when
    no target is given; ``device`` is resolved once (every render of the encode runs there)."""

    ratio: float | None = None
    size: int | None = None
    psnr: float | None = None
    cameras: object = None
    device: str | torch.device | None = None
    contributions: torch.Tensor | None = None
    num_views: int | None = None  # None: the effort's
    view_size: int = 256
    coverage_views: int | None = None  # None: the effort's
    up: object = "-y"
    frame: str = "scene"
    preset: tuple[float, int] | None = None
    refine_steps: int | None = None
    prune_threshold: float = 1 / 255
    verify_views: int = 4
    verify_candidates: int = 3
    prune_search: int | None = None  # None: the effort's
    seed: int = 0
    max_memory: int | None = None
    effort: str = "default"

    def __post_init__(self):
        m = self.max_memory
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"max_memory must be a positive number of bytes, got {m!r}")
        ratio, size, psnr = self.ratio, self.size, self.psnr
        if sum(t is not None for t in (ratio, size, psnr)) > 1:
            raise ValueError("give at most one of ratio=, size=, psnr=")
        if ratio is None and size is None and psnr is None:
            self.ratio = ratio = 20.0
        if ratio is not None and not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio >= 1):
            raise ValueError(f"ratio must be a finite number >= 1, got {ratio!r}")
        if size is not None and not (isinstance(size, int) and size > 0):
            raise ValueError(f"size must be a positive number of bytes, got {size!r}")
        if psnr is not None and not (isinstance(psnr, (int, float)) and 0 < psnr < 150):
            raise ValueError(f"psnr must be in (0, 150) dB, got {psnr!r}")
        if self.preset is not None:
            make_preset(*self.preset)  # validates the rungs
        if not (isinstance(self.effort, str) and self.effort in EFFORTS):
            raise ValueError(f"effort must be one of {tuple(EFFORTS)}, got {self.effort!r}")
        if self.prune_search is None:
            self.prune_search = EFFORTS[self.effort].prune_search
        if self.num_views is None:
            self.num_views = EFFORTS[self.effort].views
        if self.coverage_views is None:
            self.coverage_views = EFFORTS[self.effort].coverage_views
        if not (isinstance(self.num_views, int) and not isinstance(self.num_views, bool) and self.num_views >= 1):
            raise ValueError(f"num_views must be an int >= 1, got {self.num_views!r}")
        if not (isinstance(self.prune_search, int) and self.prune_search >= 0):
            raise ValueError(f"prune_search must be an int >= 0, got {self.prune_search!r}")
        if not (isinstance(self.coverage_views, int) and not isinstance(self.coverage_views, bool)
                and self.coverage_views >= 0):
            raise ValueError(f"coverage_views must be an int >= 0, got {self.coverage_views!r}")
        if self.refine_steps is not None and not (isinstance(self.refine_steps, int) and self.refine_steps >= 0):
            raise ValueError(f"refine_steps must be None (auto) or an int >= 0, got {self.refine_steps!r}")
        if self.frame not in FRAMES:
            raise ValueError(f"frame must be one of {FRAMES}, got {self.frame!r}")
        from ..cameras import CameraError, up_vector
        from ..render import resolve_device

        try:
            up_vector(self.up)
        except CameraError as exc:
            raise ValueError(str(exc)) from None

        self.device = resolve_device(self.device)

    @property
    def budget(self) -> Effort:
        """The effort level's search budget."""
        return EFFORTS[self.effort]

    def target_bytes(self, ref_bytes: int) -> int | None:
        """The byte target of a ratio or size target (None for a PSNR target)."""
        if self.psnr is not None:
            return None
        return int(self.size if self.size is not None else ref_bytes / self.ratio)

    @property
    def render_checked(self) -> bool:
        """Whether the rung choice render-checks its shortlist (and so the pruning search can run)."""
        return self.verify_views > 0 and self.preset is None
