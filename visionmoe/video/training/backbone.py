"""The frozen Wan backbone of PILA training: loading it (:func:`load_backbone`), its velocity
(:func:`backbone_velocity`, Wan 2.2's two experts switched at the boundary), the empty prompt's
embedding, and which adapter parameters a stage trains (:func:`trainable_parameters`)."""

from __future__ import annotations

import os

import torch

__all__ = ["backbone_velocity", "empty_prompt_embedding", "load_backbone", "trainable_parameters"]


def load_backbone(model: str, dtype: torch.dtype = torch.float32):
    """A Wan pipeline (frozen parts only are used): ``"tiny"``, ``"tiny-2.2"`` or a diffusers checkpoint."""
    if model in ("tiny", "tiny-2.1", "tiny-2.2"):
        from ..models.tiny import load_tiny_wan

        pipe = load_tiny_wan("2.2" if model.endswith("2.2") else "2.1")
        for name in ("transformer", "transformer_2"):
            if getattr(pipe, name, None) is not None:
                getattr(pipe, name).to(dtype)
    else:
        from diffusers import WanPipeline

        if os.path.sep in model and not os.path.isdir(model):
            raise FileNotFoundError(f"Wan model folder not found: {model}")
        pipe = WanPipeline.from_pretrained(model, torch_dtype=dtype)
        pipe.vae.to(torch.float32)
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        m = getattr(pipe, name, None)
        if m is not None:
            m.requires_grad_(False)
            m.eval()
    return pipe


def backbone_velocity(pipe, x_t: torch.Tensor, sigma: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """The frozen model's velocity at ``x_t`` (Wan 2.2: ``transformer`` above the boundary,
    ``transformer_2`` below), timestep ``1000 * sigma``."""
    t = sigma * 1000.0
    models = [(pipe.transformer, torch.ones_like(t, dtype=torch.bool))]
    t2 = getattr(pipe, "transformer_2", None)
    if t2 is not None:
        ratio = getattr(pipe.config, "boundary_ratio", None) or 0.875
        high = t >= ratio * 1000.0
        models = [(pipe.transformer, high), (t2, ~high)]
    out = torch.zeros_like(x_t)
    with torch.no_grad():
        for m, sel in models:
            if not bool(sel.any()):
                continue
            dt = next(m.parameters()).dtype
            # timesteps stay float32 as in WanPipeline (bf16 cannot hold 999 exactly)
            v = m(hidden_states=x_t[sel].to(dt), timestep=t[sel].float(), encoder_hidden_states=text[sel].to(dt),
                  return_dict=False)[0]
            out[sel] = v.to(out.dtype)
    return out


def trainable_parameters(adapter, stage: int):
    """Set ``requires_grad`` by stage; returns the trainable parameters."""
    adapter.requires_grad_(False)
    if stage == 1:
        mods = [adapter.fields]
    elif stage == 2:
        mods = [adapter.experts] + ([adapter.text_classifier] if adapter.text_classifier is not None else [])
    else:
        mods = [adapter]
    for m in mods:
        m.requires_grad_(True)
    if stage == 2:
        if adapter.text_prior_weight is not None:
            adapter.text_prior_weight.requires_grad_(True)
        adapter.log_kappa.requires_grad_(True)
    return [p for p in adapter.parameters() if p.requires_grad]


def empty_prompt_embedding(pipe, max_sequence_length: int) -> torch.Tensor:
    """The empty prompt's text embedding [1, L, D], zero-padded to L tokens as WanPipeline pads it."""
    from ..data.cache import encode_captions

    e = encode_captions(pipe, [""], max_sequence_length)[0]
    return torch.cat([e, e.new_zeros(max_sequence_length - e.shape[0], e.shape[1])])[None]
