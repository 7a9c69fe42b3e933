"""``WanPILAPipeline``: a diffusers ``WanPipeline`` with a PILA adapter attached.

A thin subclass: the denoising loop is diffusers' own; PILA enters only through the hooks of
:mod:`visionmoe.video.hooks.pila`. Loading::

    pipe = WanPILAPipeline.from_pretrained("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", adapter="path/to/pila",
                                           torch_dtype=torch.bfloat16)
    video = pipe("a ball falls and bounces", physics="auto", pila_scale=1.0).frames[0]

or wrap a pipeline already in memory with ``WanPILAPipeline.from_pipe(pipe, adapter=...)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
from diffusers import WanPipeline

from ..hooks.pila import PILAController, PILASettings, attach_pila, detach_pila
from ..pila.adapter import PILAAdapter

_SETTINGS = ("scale", "start", "end", "categories", "per_category_scale")


def load_adapter(adapter: str | os.PathLike | PILAAdapter, **kwargs) -> PILAAdapter:
    """A PILAAdapter instance from an instance, a local directory or a hub id (``from_pretrained``)."""
    if isinstance(adapter, PILAAdapter):
        return adapter
    if isinstance(adapter, (str, os.PathLike)):
        if os.path.sep in str(adapter) or str(adapter).startswith(".") or os.path.exists(adapter):
            if not os.path.isdir(adapter):
                raise FileNotFoundError(f"PILA adapter directory not found: {adapter}")
        return PILAAdapter.from_pretrained(adapter, **kwargs)
    raise TypeError(f"adapter must be a PILAAdapter or a path / hub id, got {type(adapter).__name__}")


class WanPILAPipeline(WanPipeline):
    """Wan text-to-video pipeline with a physics (PILA) velocity correction."""

    @property
    def pila(self) -> PILAController | None:
        return getattr(self, "_pila_controller", None)

    @property
    def adapter(self) -> PILAAdapter | None:
        return self.pila.adapter if self.pila is not None else None

    def load_pila(
        self,
        adapter: str | os.PathLike | PILAAdapter,
        scale: float = 1.0,
        start: float = 0.0,
        end: float = 1.0,
        categories: str | Sequence[str] = "auto",
        per_category_scale: Mapping[str, float] | None = None,
        residual_guidance: float = 0.0,
        apply_to: str | None = None,
        **load_kwargs,
    ) -> PILAController:
        adapter = load_adapter(adapter, **load_kwargs)
        device = next((m.device for m in (self.transformer, self.transformer_2) if m is not None), None)
        if device is not None and device.type != "meta":
            adapter.to(device)
        return attach_pila(self, adapter, scale, start, end, categories, per_category_scale, residual_guidance, apply_to)

    def unload_pila(self) -> None:
        detach_pila(self)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, adapter=None, *, pila_kwargs: dict | None = None, **kwargs):
        """Load a Wan diffusers checkpoint (local path or hub id) and attach ``adapter`` if given.

        ``pila_kwargs`` go to :meth:`load_pila` (scale, start, end, categories, per_category_scale,
        residual_guidance, apply_to).
        """
        if isinstance(pretrained_model_name_or_path, (str, os.PathLike)):
            p = str(pretrained_model_name_or_path)
            looks_local = os.path.isabs(p) or p.startswith(".") or os.path.exists(p) or p.count("/") != 1
            if looks_local and not os.path.isdir(p):
                raise FileNotFoundError(
                    f"Wan model not found: {p!r} is neither a local directory nor a hub id (owner/name)"
                )
        pipe = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        if adapter is not None:
            pipe.load_pila(adapter, **(pila_kwargs or {}))
        return pipe

    @classmethod
    def from_pipe(cls, pipeline, adapter=None, *, pila_kwargs: dict | None = None, **kwargs):
        """Share the components of a pipeline in memory and attach ``adapter`` if given."""
        pipe = super().from_pipe(pipeline, **kwargs)
        if adapter is not None:
            pipe.load_pila(adapter, **(pila_kwargs or {}))
        return pipe

    def __call__(self, *args, pila_scale: float | None = None, physics: str | Sequence[str] | None = None, **kwargs):
        """``WanPipeline.__call__`` plus per-call PILA overrides.

        pila_scale: overrides the attached scale for this call.
        physics: ``"auto"`` or categories, overriding the attached ``categories`` for this call.
        """
        c = self.pila
        if c is None or (pila_scale is None and physics is None):
            return super().__call__(*args, **kwargs)
        saved = c.settings
        try:
            c.settings = PILASettings(
                saved.scale if pila_scale is None else pila_scale,
                saved.start,
                saved.end,
                saved.categories if physics is None else physics,
                None,
                saved.num_train_timesteps,
                saved.residual_guidance,
                saved.apply_to,
            )
            c.settings.category_scale = saved.category_scale
            return super().__call__(*args, **kwargs)
        finally:
            c.settings = saved


__all__ = ["WanPILAPipeline", "load_adapter"]
