"""The one place that loads visionmoe._C and picks a device's kernels."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

BUILD_HINT = (
    "build it with `make build` (or `pip install --no-build-isolation -e .`) from the "
    "repository root; VISIONMOE_WITH_CUDA=1 forces the CUDA kernels"
)


class ExtensionNotBuiltError(ImportError):
    """The compiled extension visionmoe._C is missing or lacks the requested device."""


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any | None, str | None]:
    # torch must be imported first: _C links against libc10 from the torch wheel.
    try:
        return importlib.import_module("visionmoe._C"), None
    except ImportError as exc:  # not built, or built against another torch
        return None, str(exc)


def extension():
    module, error = _load()
    if module is None:
        raise ExtensionNotBuiltError(f"visionmoe._C is not available ({error}); {BUILD_HINT}")
    return module


def kernels(device: torch.device):
    """The kernel namespace (``_C.cpu`` or ``_C.cuda``) for tensors on ``device``."""
    module = extension()
    if device.type == "cpu":
        return module.cpu
    if device.type == "cuda":
        if not hasattr(module, "cuda"):
            raise ExtensionNotBuiltError(
                "got CUDA tensors but visionmoe._C was built without CUDA kernels; rebuild on a "
                f"machine with nvcc and a CUDA build of torch: {BUILD_HINT}"
            )
        return module.cuda
    raise NotImplementedError(f"visionmoe ops support cpu and cuda tensors, got device {device}")


def build_info() -> dict:
    """What the compiled extension contains: cpu, cuda, CUDA archs, OpenMP threads.

    Never raises: without an extension it reports ``compiled=False`` and why.
    """
    module, error = _load()
    if module is None:
        return {"compiled": False, "cpu": False, "cuda": False, "error": error, "hint": BUILD_HINT}
    info = dict(module.build_info())
    info["compiled"] = True
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
    info["gpu_available"] = torch.cuda.is_available()
    return info
