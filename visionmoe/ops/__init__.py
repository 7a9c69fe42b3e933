"""Shared compiled ops: routing (this module), Gaussian rasterisation and the strict zstd
literals check.

Each op is a public function validating its arguments, a private autograd Function, a C++
(OpenMP) and a CUDA kernel in ``visionmoe._C``, and a pure-PyTorch reference of the same
signature in ``visionmoe.ops._torch_ref`` used by the tests.
"""

from ._backend import ExtensionNotBuiltError, build_info
from .raster import RasterOutput, rasterize
from .routing import (
    RouterOutput,
    RoutingPlan,
    combine,
    dispatch,
    moe_apply,
    nearest_center,
    routing_plan,
    segment_moments,
    topk_route,
)
from .zstd_literals import ZstdLiteralsError, zstd_literals_check

__all__ = [
    "ExtensionNotBuiltError",
    "RasterOutput",
    "RouterOutput",
    "RoutingPlan",
    "ZstdLiteralsError",
    "build_info",
    "combine",
    "dispatch",
    "moe_apply",
    "nearest_center",
    "rasterize",
    "routing_plan",
    "segment_moments",
    "topk_route",
    "zstd_literals_check",
]
