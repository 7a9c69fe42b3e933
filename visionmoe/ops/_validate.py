"""Argument checks with messages that name the argument, what was expected and what was found."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def check_tensor(
    name: str,
    value,
    *,
    dim: int | None = None,
    shape: Sequence[int | None] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
) -> torch.Tensor:
    """Check type, rank, shape (None = any size) and dtype of a tensor argument."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(value.shape)}")
    if shape is not None:
        expected = tuple("*" if s is None else s for s in shape)
        if value.dim() != len(shape) or any(s is not None and s != v for s, v in zip(shape, value.shape)):
            raise ValueError(f"{name} must have shape {expected}, got {tuple(value.shape)}")
    if dtypes is not None and value.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(value.dtype).replace('torch.', '')}")
    return value


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        found = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {found}")
    return first


def check_same_dtype(**tensors: torch.Tensor) -> torch.dtype:
    dtypes = {name: t.dtype for name, t in tensors.items() if t is not None}
    first = next(iter(dtypes.values()))
    if any(d != first for d in dtypes.values()):
        found = ", ".join(f"{n} is {str(d).replace('torch.', '')}" for n, d in dtypes.items())
        raise TypeError(f"floating tensors must share one dtype, got {found}")
    return first
