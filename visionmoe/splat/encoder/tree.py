"""Stage: the pruned scene -> its mixture pyramid and the encoder's scene-level metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..io import GaussianScene
from ..pgms import bitstream as bs
from ..pgms.quantize import Palettes, Quantizer
from .palettes import detect_palettes
from .pyramid import Pyramid, build_pyramid


@dataclass(frozen=True)
class SceneMeta:
    """What every encoding of one tree shares (and ``bs.FileMeta`` writes to HEAD)."""

    origin: np.ndarray  # [3] float64, position of the level-0 nodes' virtual parent
    min_step: float  # smallest position step (scene units)
    sh_degree: int  # the source's SH degree
    source_gaussians: int  # Gaussians of the input scene
    reference_bytes: int  # native-degree float32 .ply size of the input
    palettes: Palettes | None  # value tables of the fine tier (the rungs use a subset)
    transform: bs.FileTransform | None = None  # the coded (canonical) frame -> the scene's

    def quantizer(self, preset) -> Quantizer:
        return Quantizer(preset.pos_rel, preset.dc_step, preset.ls_step, self.min_step, preset.op_bits, preset.rot_bits)

    def file_meta(self, quant: Quantizer, palettes: Palettes | None) -> bs.FileMeta:
        return bs.FileMeta(sh_degree=self.sh_degree, origin=self.origin, quant=quant,
                           source_gaussians=self.source_gaussians, reference_bytes=self.reference_bytes,
                           palettes=palettes, transform=self.transform)


@dataclass
class Tree:
    """The Gaussians kept for coding, their weights (image-space contribution), their pyramid."""

    kept: GaussianScene
    weights: torch.Tensor  # [N]
    pyramid: Pyramid
    meta: SceneMeta
    copies: torch.Tensor | None = None  # [N] int64, the identical source rows each kept row stands for


def build_tree(kept: GaussianScene, w: torch.Tensor, sh_degree: int, n_in: int, ref_bytes: int,
               transform: bs.FileTransform | None = None, copies: torch.Tensor | None = None) -> Tree:
    """The pyramid over the kept Gaussians and the encoder's scene-level metadata (``transform``:
    the way from the coded frame back to the scene's, written to the file; ``copies``: how many
    identical source rows each kept row stands for, ``encoder.copies``)."""
    pyr = build_pyramid(kept, w)
    if copies is not None:
        pyr.copies = copies[pyr.leaf_order]
    lo, hi = kept.means.min(0).values, kept.means.max(0).values
    extent = float((hi - lo).max().clamp_min(1e-6))
    leaves = pyr.levels[-1]
    parent_dc = pyr.levels[-2].sh_dc[pyr.parent[-1]].numpy() if pyr.num_levels > 1 else None
    meta = SceneMeta(origin=((lo + hi) / 2).double().numpy(), min_step=extent * 2.0**-20, sh_degree=sh_degree,
                     source_gaussians=n_in, reference_bytes=ref_bytes, palettes=detect_palettes(leaves, parent_dc),
                     transform=transform)
    return Tree(kept, w, pyr, meta, copies)
