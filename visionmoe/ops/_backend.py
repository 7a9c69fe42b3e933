"""The one place that loads visionmoe._C and picks a device's kernels.

The extension is loaded lazily, once. It links against the torch it was built with (torch's
C++ ABI changes between releases; a CUDA build also needs ``libc10_cuda.so``), so under another
torch it may not load. Then every op runs on pure PyTorch (the routing kernels of
:mod:`visionmoe.ops._torch_kernels`, the rasteriser's of :mod:`visionmoe.ops._torch_raster`) and
the rANS coder on its numpy loops, slower, after one logged warning that names the cause and the
torch to install.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import re
from pathlib import Path
from typing import Any

import torch

from . import _torch_kernels, _torch_raster

logger = logging.getLogger(__name__)

BUILD_HINT = (
    "in a source checkout build it with `make build` (or `pip install --no-build-isolation -e .`); "
    "VISIONMOE_WITH_CUDA=1 forces the CUDA kernels"
)
# build_info() of the extension keeps the torch version it was compiled with beside this key
_VERSION_KEY = re.compile(rb"\x00(\d+\.\d+\.\d+[0-9A-Za-z.+]*)\x00torch_abi_version\x00")


class ExtensionNotBuiltError(ImportError):
    """The compiled extension visionmoe._C is missing, cannot load, or lacks the requested device."""


def _import_extension():
    # torch must be imported first: _C links against libc10 from the torch wheel.
    return importlib.import_module("visionmoe._C")


def _extension_file() -> Path | None:
    try:
        spec = importlib.util.find_spec("visionmoe._C")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def built_for(path: Path | None) -> tuple[str | None, bool]:
    """(torch version, CUDA build?) that the extension file at ``path`` was compiled against, read
    from its bytes without loading it; (None, False) when unknown."""
    try:
        data = path.read_bytes() if path is not None else b""
    except OSError:
        return None, False
    found = _VERSION_KEY.search(data)
    return (found.group(1).decode() if found else None), b"libc10_cuda.so\x00" in data


def explain(error: str) -> str:
    """Why visionmoe._C is unavailable and what to do, in one line."""
    path = _extension_file()
    if path is None:
        return f"visionmoe._C is not built; {BUILD_HINT}"
    version, cuda = built_for(path)
    cause = error.strip().splitlines()[0] if error.strip() else "unknown error"
    if version is None:
        return (f"visionmoe._C does not load under torch {torch.__version__} ({cause}); install the torch this "
                "visionmoe was built with (see `pip show visionmoe`)")
    build = "a CUDA build; it also runs on CPUs" if cuda else "a CPU build"
    return (f"visionmoe._C does not load under torch {torch.__version__} ({cause}): it was built for torch {version} "
            f"({build}); install it with `pip install torch=={version}`")


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any | None, str | None]:
    try:
        return _import_extension(), None
    except ImportError as exc:  # not built, or built against another torch
        return None, str(exc)


@functools.lru_cache(maxsize=1)
def warn_fallback() -> None:
    """Log, once, that an op runs on its pure-PyTorch/numpy path because the extension cannot load
    (only when a fallback is used: an op that has none raises the same advice as its error line)."""
    logger.warning("%s. Until then every op runs on its pure-PyTorch or numpy path: rendering and "
                   "compression are many times slower", explain(_load()[1] or ""))


def has_cpu_op(name: str) -> bool:
    """Whether the extension loads and its CPU kernels include ``name`` (an extension built before
    the op existed loads without it)."""
    module, _ = _load()
    return module is not None and hasattr(module.cpu, name)


def use_cpu_op(name: str, compiled: bool | None) -> bool:
    """An op's choice between its compiled kernel and its reference: ``compiled`` as given, or
    (None) the kernel when the extension has it, after the one ``warn_fallback`` when it cannot
    load."""
    if compiled is not None:
        return compiled
    if _load()[0] is None:
        warn_fallback()
    return has_cpu_op(name)


def extension():
    module, error = _load()
    if module is None:
        raise ExtensionNotBuiltError(explain(error or ""))
    return module


class _PyTorchKernels:
    """The kernel namespace while the extension cannot load: the kernels of :mod:`._torch_kernels`
    (routing) and :mod:`._torch_raster` (rasterisation); a name neither has raises with the advice."""

    def __init__(self, error: str):
        self.error = error

    def __getattr__(self, name: str):
        kernel = None
        if not name.startswith("_"):
            kernel = getattr(_torch_kernels, name, None) or getattr(_torch_raster, name, None)
        if kernel is None:
            raise ExtensionNotBuiltError(f"{name} has no pure-PyTorch path and needs the compiled extension: "
                                         f"{explain(self.error)}")
        warn_fallback()
        return kernel


def kernels(device: torch.device):
    """The kernel namespace (``_C.cpu`` or ``_C.cuda``) for tensors on ``device``; the pure-PyTorch
    kernels when the extension cannot load."""
    module, error = _load()
    if module is None:
        return _PyTorchKernels(error or "")
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

    Never raises: without an extension it reports ``compiled=False``, why and what to do.
    """
    module, error = _load()
    if module is None:
        return {"compiled": False, "cpu": False, "cuda": False, "error": error, "hint": explain(error or "")}
    info = dict(module.build_info())
    info["compiled"] = True
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
    info["gpu_available"] = torch.cuda.is_available()
    return info
