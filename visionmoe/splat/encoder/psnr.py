"""Stage (``psnr=`` targets): bisection on the size until the decoded scene renders at the target PSNR."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..pgms.decode import decode_coded
from .cut import Encoding

logger = logging.getLogger("visionmoe.splat.encoder.psnr")


@dataclass
class PsnrResult:
    encoding: Encoding
    target_bytes: int


def search_psnr(scene, target_psnr: float, cameras, device, ref_bytes: int, encode_at: Callable, prog) -> PsnrResult:
    """The smallest encoding found (7 bisection steps on log size) that renders at ``target_psnr``
    dB or better on ``cameras``; ``encode_at(target bytes) -> Encoding``."""
    from ..metrics import psnr as psnr_fn
    from ..render import render

    with torch.no_grad():
        ref = render(scene.to(device), cameras).colors.cpu()
    lo, hi = math.log(ref_bytes / 400), math.log(ref_bytes / 1.5)
    best = None
    for it in range(7):
        mid = (lo + hi) / 2
        target = int(math.exp(mid))
        enc = encode_at(target)
        dec = decode_coded(enc.data)
        with torch.no_grad():
            got = float(psnr_fn(render(dec.to(device), cameras).colors.cpu(), ref))
        prog("psnr search", it + 1, 7)
        logger.debug("psnr search: %d bytes -> %.2f dB", enc.nbytes, got)
        if got >= target_psnr:
            hi = mid
            if best is None or enc.nbytes < best.encoding.nbytes:
                best = PsnrResult(enc, target)
        else:
            lo = mid
    return best if best is not None else PsnrResult(enc, target)
