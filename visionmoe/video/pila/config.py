"""Validation of PILA adapter configurations before anything is built or loaded.

A ``config.json`` of a PILA adapter (or the ``adapter`` options of a training config) is
checked for types, ranges and a parameter budget, so that ``hidden_dim: -5``,
``slot_dim: "96"``, ``hidden_dim: 1e9`` or ``experts_per_category: 1e6`` give one
:class:`AdapterConfigError` line instead of a traceback, or an attempt to allocate hundreds
of gigabytes. The parameter count is exact: the adapter is built on the ``meta`` device
(shapes only, no memory), after the per-key ranges have bounded the work that takes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ADAPTER_KEYS",
    "AdapterConfigError",
    "MAX_ADAPTER_PARAMETERS",
    "adapter_parameter_count",
    "read_adapter_config",
    "validate_adapter_config",
]

#: the largest adapter accepted (float32: 0.8 GB); Wan2.1-1.3B's transformer has 1.42G parameters,
#: the shipped toy-world adapter 0.19M
MAX_ADAPTER_PARAMETERS = 200_000_000


class AdapterConfigError(ValueError):
    """An adapter configuration that cannot be built; the message is one line."""


@dataclass(frozen=True)
class _Rule:
    kind: type  # int, float, bool or str
    lo: float = 0
    hi: float = 0
    lo_open: bool = False  # lo excluded (floats)
    optional: bool = False  # None allowed
    odd: bool = False
    choices: tuple = ()  # str values allowed

    def describe(self) -> str:
        if self.kind is bool:
            return "true or false"
        if self.kind is str:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        what = "an odd integer" if self.odd else ("an integer" if self.kind is int else "a number")
        lo = f"({self.lo:g}" if self.lo_open else f"[{self.lo:g}"
        rng = f"{lo}, {self.hi:g}]"
        return f"{what} in {rng}" + (" or null" if self.optional else "")


#: PILAAdapter.__init__ keys and what each accepts (top_k is further bounded by the number of experts)
ADAPTER_KEYS: dict[str, _Rule] = {
    "latent_channels": _Rule(int, 1, 1024),
    "patch_size": _Rule(int, 1, 16),
    "hidden_dim": _Rule(int, 1, 16384),
    "slot_dim": _Rule(int, 1, 4096),
    "expert_hidden": _Rule(int, 1, 65536),
    "experts_per_category": _Rule(int, 1, 64),
    "top_k": _Rule(int, 1, 384),
    "text_dim": _Rule(int, 1, 65536, optional=True),
    "flow_window": _Rule(int, 1, 31, odd=True),
    "flow_reg": _Rule(float, 0, 1e6, lo_open=True),
    "kappa": _Rule(float, 0, 1e6, lo_open=True),
    "structure": _Rule(str, choices=("physics", "plain")),
    "anchor": _Rule(bool),
    "single_expert": _Rule(bool),
    "plain_blocks": _Rule(int, 1, 64),
    "apply_to": _Rule(str, choices=("guided", "each_branch")),
    "context_blocks": _Rule(int, 1, 64),
    "clip_context": _Rule(bool),
}


def _adapter_signature() -> list[str]:
    """The keyword arguments of ``PILAAdapter.__init__``."""
    import inspect

    from .adapter import PILAAdapter

    return [p for p in inspect.signature(PILAAdapter.__init__).parameters if p != "self"]


def _check_value(key: str, value: Any, rule: _Rule) -> str | None:
    if value is None:
        return None if rule.optional else f"{key} must be {rule.describe()}, got null"
    if rule.kind is bool:
        return None if isinstance(value, bool) else f"{key} must be true or false, got {value!r}"
    if rule.kind is str:
        return None if value in rule.choices else f"{key} must be {rule.describe()}, got {value!r}"
    if isinstance(value, bool):
        return f"{key} must be {rule.describe()}, got {value!r} (a boolean)"
    if rule.kind is int:
        if not isinstance(value, int):
            return f"{key} must be {rule.describe()}, got {value!r} (a {type(value).__name__})"
    elif not isinstance(value, (int, float)):
        return f"{key} must be {rule.describe()}, got {value!r} (a {type(value).__name__})"
    elif not math.isfinite(value):
        return f"{key} must be {rule.describe()}, got {value!r}"
    below = value <= rule.lo if rule.lo_open else value < rule.lo
    if below or value > rule.hi or (rule.odd and value % 2 == 0):
        return f"{key} must be {rule.describe()}, got {value!r}"
    return None


def adapter_parameter_count(config: Mapping[str, Any]) -> int:
    """Exact parameter count of ``PILAAdapter(**config)``, built on the meta device (no memory).

    ``config`` must already have passed the per-key checks of :func:`validate_adapter_config`.
    """
    import torch

    from .adapter import PILAAdapter

    with torch.device("meta"):
        model = PILAAdapter(**dict(config))
    return sum(p.numel() for p in model.parameters())


def validate_adapter_config(
    config: Any, *, source: str = "adapter config", max_parameters: int = MAX_ADAPTER_PARAMETERS,
) -> dict[str, Any]:
    """Check an adapter configuration; return its ``PILAAdapter`` keyword arguments.

    Args:
        config: the parsed ``config.json`` (keys starting with ``_`` are diffusers metadata
            and are skipped) or the ``adapter`` options of a training config (keys left out
            take ``PILAAdapter``'s defaults).
        source: how the message names the configuration (e.g. its path).
        max_parameters: the parameter budget.

    Raises:
        AdapterConfigError: one line naming every bad key (type, range), an unknown key, or a
            parameter count over the budget.
    """
    if not isinstance(config, Mapping):
        raise AdapterConfigError(f"{source}: expected a JSON object of PILAAdapter options, got {type(config).__name__}")
    cls = config.get("_class_name")
    if cls is not None and cls != "PILAAdapter":
        raise AdapterConfigError(f"{source}: _class_name is {cls!r}, not 'PILAAdapter' (is this a PILA adapter folder?)")
    kwargs = {k: v for k, v in config.items() if not str(k).startswith("_")}
    errors = []
    known = _adapter_signature()
    unknown = sorted(str(k) for k in kwargs if k not in known)
    if unknown:
        errors.append(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    for key, value in kwargs.items():  # options PILAAdapter gained after these rules: plain values only
        if key in known and key not in ADAPTER_KEYS and not isinstance(value, (bool, int, float, str, type(None))):
            errors.append(f"{key} must be a plain value, got {type(value).__name__}")
    for key, value in kwargs.items():
        if key in ADAPTER_KEYS:
            msg = _check_value(key, value, ADAPTER_KEYS[key])
            if msg:
                errors.append(msg)
    if not errors:
        from .taxonomy import NUM_CATEGORIES

        experts = NUM_CATEGORIES * kwargs.get("experts_per_category", 1)
        top_k = kwargs.get("top_k", 2)
        if top_k > experts:
            errors.append(f"top_k must be at most the number of experts ({experts}), got {top_k}")
    if errors:
        raise AdapterConfigError(f"{source}: " + "; ".join(errors))
    count = adapter_parameter_count(kwargs)
    if count > max_parameters:
        raise AdapterConfigError(
            f"{source}: this adapter would have {count:,} parameters ({4 * count / 2**30:.1f} GiB in float32), "
            f"over the budget of {max_parameters:,}; lower hidden_dim, expert_hidden, slot_dim or experts_per_category")
    return kwargs


def read_adapter_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate ``PATH/config.json`` of an adapter folder (see :func:`validate_adapter_config`)."""
    folder = Path(path)
    cfg_path = folder / "config.json"
    if not folder.is_dir():
        raise AdapterConfigError(f"adapter {str(folder)!r}: no such directory")
    if not cfg_path.is_file():
        raise AdapterConfigError(f"adapter {str(folder)!r} has no config.json (not a PILAAdapter.save_pretrained folder)")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise AdapterConfigError(f"{cfg_path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise AdapterConfigError(f"{cfg_path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    return validate_adapter_config(config, source=str(cfg_path))
