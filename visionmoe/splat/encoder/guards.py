"""The encoder's input rules for degenerate scenes (issue 31): what is clamped, what is refused.

Every rule is one line here and one line in docs/ROBUSTNESS.md; nothing degenerate reaches the
rate search, so every encode ends (a result or one error):

* NaN/Inf anywhere: refused (``io.read_ply(nonfinite="drop")`` / ``--drop-nonfinite`` skip them).
* A coordinate beyond ``MAX_COORDINATE`` (1e7 scene units, float32 still resolves 1 unit there):
  refused with the count and the largest value; PGMS quantises positions relative to the scene's
  extent, and one point at 1e15 or 3e38 leaves no precision (or no float32 range) for the rest.
* A DC colour coefficient beyond ``MAX_ABS_DC`` (``pgms.quantize.MAX_ABS_DC_TABLE``, 1e37): refused
  with the count and the largest value; the decoders refuse DC tables past that bound (FORMAT.md,
  "Finite values"), so the encoder must never write one.
* Log-scales outside ``[MIN_LOG_SCALE, MAX_LOG_SCALE]`` = [-30, 30] (sizes 9e-14 to 1e13): clamped,
  counted in ``CompressResult.clamped_log_scales``. Below, a Gaussian is a point at any camera
  resolution (the rasteriser's 0.3 px low-pass sets its footprint); above, its covariance
  overflows float32 (exp(2 x 44) > 3.4e38) and the estimates turn NaN.
* A byte target below the smallest file the encoder can write (:func:`smallest_file_bytes`):
  refused before any work (:func:`check_target`), naming that size. Every .pgms holds the
  preamble, HEAD, XFRM (``frame="scene"``), the shape codebook, one LEVL section per pyramid
  level with its stream headers, and END0; each term is sized by the writer's own structures
  (``pgms.bitstream``). Before the pyramid is built the encoder may still prune all but a few
  Gaussians, so the check assumes the one-level pyramid: a lower bound, exact to the streams'
  coded bytes (what a constant stream costs), measured against a real encode in the tests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from ..io import GaussianScene, SceneError
from ..pgms import bitstream as bs
from ..pgms.file_transform import XFRM
from ..pgms.quantize import MAX_ABS_DC_TABLE as MAX_ABS_DC

logger = logging.getLogger(__name__)

MAX_COORDINATE = 1e7
MIN_LOG_SCALE, MAX_LOG_SCALE = -30.0, 30.0


@dataclass
class GuardedScene:
    scene: GaussianScene
    clamped_log_scales: int  # Gaussians whose log-scales were clamped into range


def guard_input(scene: GaussianScene) -> GuardedScene:
    """Apply the input rules above -> the scene to encode (or raise ``SceneError``, one line)."""
    n = scene.num_gaussians
    if n == 0:
        raise SceneError("the scene holds no Gaussians; nothing to compress")
    for name in ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest"):
        bad = ~torch.isfinite(getattr(scene, name).reshape(n, -1)).all(1)
        if bool(bad.any()):
            raise SceneError(f"{int(bad.sum())} of {n} Gaussians have NaN/Inf values in {name} "
                             f"(drop them first: read_ply(..., nonfinite='drop'))")
    far = scene.means.abs().amax(1) > MAX_COORDINATE
    if bool(far.any()):
        raise SceneError(f"{int(far.sum())} of {n} Gaussians lie beyond {MAX_COORDINATE:g} scene units from the "
                         f"origin (largest position coordinate {float(scene.means.abs().max()):.3g}); PGMS codes "
                         f"positions within +-{MAX_COORDINATE:g}: remove or crop them")
    bright = scene.sh_dc.reshape(n, -1).abs().amax(1) > MAX_ABS_DC
    if bool(bright.any()):
        raise SceneError(f"{int(bright.sum())} of {n} Gaussians have DC colour coefficients beyond {MAX_ABS_DC:g} "
                         f"(largest {float(scene.sh_dc.abs().max()):.3g}); .pgms codes colours within "
                         f"+-{MAX_ABS_DC:g}: remove them")
    qn = scene.quats.norm(dim=1)
    if bool((qn < 1e-12).any()):
        raise SceneError(f"{int((qn < 1e-12).sum())} of {n} Gaussians have a zero rotation quaternion")
    out_of_range = ((scene.log_scales < MIN_LOG_SCALE) | (scene.log_scales > MAX_LOG_SCALE)).any(1)
    clamped = int(out_of_range.sum())
    if clamped:
        logger.info("%d of %d Gaussians have log-scales outside [%g, %g]; clamped", clamped, n, MIN_LOG_SCALE,
                       MAX_LOG_SCALE)
        scene = replace(scene, log_scales=scene.log_scales.clamp(MIN_LOG_SCALE, MAX_LOG_SCALE))
    return GuardedScene(scene, clamped)


# streams per LEVL section (``bitstream.write_level``): a coarse level codes shape, pos x3, dc x3,
# op and child_count; the fine tier ls x3, rot_i, rot x3, pos x3, dc x3 and op (+ SH flags and
# indices when it has SH prototypes, which the smallest file does not)
_COARSE_STREAMS, _FINE_STREAMS = 9, 14
_SECTION = bs.SECTION_HEADER.size + 4  # header and crc32


def smallest_file_bytes(sh_degree: int, frame: str = "scene", num_levels: int = 1) -> int:
    """A lower bound of the size of any .pgms the encoder writes for a scene of ``sh_degree``
    with a pyramid of ``num_levels`` levels: the bytes every file carries whatever its content
    (sections, their headers, the fixed-size HEAD and XFRM payloads, one stream header per
    stream). The coded stream contents come on top."""
    if num_levels < 1:
        raise ValueError(f"num_levels must be >= 1, got {num_levels}")
    xfrm = XFRM.size + 4 * sum((2 * l + 1) ** 2 for l in range(1, sh_degree + 1)) if frame == "scene" else None
    size = len(bs.pack_preamble()) + _SECTION + bs.HEAD.size
    size += 0 if xfrm is None else _SECTION + xfrm
    size += _SECTION + bs.STREAM_HEAD.size  # CBSR: the shape codebook's float stream
    size += (num_levels - 1) * (_SECTION + _COARSE_STREAMS * bs.STREAM_HEAD.size)
    size += _SECTION + _FINE_STREAMS * bs.STREAM_HEAD.size
    return size + _SECTION  # END0


def check_target(target_bytes: int | None, sh_degree: int, frame: str = "scene", num_levels: int = 1) -> None:
    """Refuse a byte target no file can meet (:func:`smallest_file_bytes`) with one line that
    names the smallest reachable size; ``None`` (a PSNR target) passes."""
    if target_bytes is None:
        return
    least = smallest_file_bytes(sh_degree, frame, num_levels)
    if target_bytes < least:
        raise SceneError(f"a target of {target_bytes} bytes is below the smallest .pgms of this scene: every file "
                         f"holds at least {least} bytes (header, frame, codebook, the top level's streams); "
                         f"ask for a size of at least {least} bytes")
