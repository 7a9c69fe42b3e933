"""Attach a :class:`~visionmoe.video.pila.adapter.PILAAdapter` to a diffusers Wan pipeline without forking it.

``attach_pila(pipe, adapter, ...)`` (or ``apply_pila(pipe, adapter, PILASettings(...))``)
registers a ``diffusers.hooks.ModelHook`` named ``"pila"`` on ``pipe.transformer`` and, for
Wan 2.2, on ``pipe.transformer_2``, and wraps ``pipe.encode_prompt`` on the instance to read
the prompt text for the category prior (the pipeline is not an ``nn.Module``: see
:mod:`._common`). ``detach_pila(pipe)`` (= ``remove_pila``) removes both and restores the
pipeline exactly.

Guidance algebra
----------------
The hook runs after each transformer call. Wan calls the model for the conditional branch
(cache context ``"cond"``) and then, with classifier-free guidance, for the unconditional
branch (``"uncond"``) on the same latents, and combines ``v = v_u + g (v_c - v_u)``.
On the conditional call the adapter computes ``dv = A(x_t, v_c, sigma, text_c; prior)``
from the conditional velocity and the prompt's category prior; the unconditional call of
the same step reuses that same ``dv``. Both branches get ``+ s(t) dv``, so

    v' = (v_u + s dv) + g ((v_c + s dv) - (v_u + s dv)) = v_cfg + s(t) dv

for any guidance scale g, and ``v' = v_c + s(t) dv`` without guidance: the correction is
neither amplified by g nor cancelled, and costs one adapter call per step. This is
``apply_to="guided"``, for adapters trained on the guided velocity (``flow_guidance=g``).

With ``apply_to="each_branch"`` the adapter is part of the model: every transformer call is
corrected from its own velocity and text, ``dv_c`` from the conditional call with the
prompt's prior, ``dv_u`` from the unconditional call with every category allowed, so

    v' = (v_u + s dv_u) + g ((v_c + s dv_c) - (v_u + s dv_u)) = v_cfg + s (dv_u + g (dv_c - dv_u))

at two adapter calls per guided step. Such an adapter is trained on the conditional velocity
with the prompt dropped to the empty one for a share of the samples (``uncond_prob``), as the
base model was. Why it exists: a correction fitted by mean squared error to the *guided*
velocity learns to undo part of the guidance (the conditional flow target does not contain
it), which fades and shrinks what guidance sharpens. The adapter's config records which way
it was trained and ``attach_pila`` applies it that way unless told otherwise.
With ``residual_guidance = eta > 0`` the step's correction becomes ``s dv + dv_g``, where
``dv_g`` is a normalised gradient step of size ``eta * rms(v)`` that lowers the residual
energy of the bank built from ``(x_t, v_c + s dv)``; it is shared by both branches the same way.

Image-to-video: ``WanImageToVideoPipeline`` (Wan 2.1 I2V, Wan 2.2 I2V-A14B) feeds the
transformer ``cat([latents, condition])`` (16 + 20 = 36 channels) and gets 16 back; the hook
hands the adapter the first ``out_channels`` channels of the input (the noisy latents; the
condition is not part of the state the velocity moves). Wan 2.2 TI2V-5B uses a different,
48-channel VAE (``AutoencoderKLWan`` with ``z_dim=48``); attaching a 16-channel adapter to it
raises a one-line error that names that VAE.

Schedule: ``s(t) = scale * per-step window``, where the window is 1 when the denoising
progress ``p`` lies in ``[start, end)`` and 0 otherwise; ``p = step_index /
num_inference_steps`` from the pipeline's cache context (``1 - sigma`` when a pipeline
provides none). ``per_category_scale`` multiplies each category's expert refinement.
Wherever ``s(t) == 0`` the transformer's output is returned untouched (the adapter does not
run), so ``scale=0`` reproduces the base pipeline bit for bit.

The hook composes with ``enable_model_cpu_offload()`` (accelerate hooks, in either order),
group offloading (diffusers hooks on sub-modules), LoRA adapters (peft layers inside the
transformer) and VAE tiling (the adapter never sees pixels). The adapter follows the
device of the transformer's output on its first call.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers.hooks import ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

from ..pila.adapter import APPLY_TO, PILAAdapter
from ..pila.labels import CategoryPrior, resolve_prior
from ..pila.taxonomy import CATEGORY_NAMES, category_index
from ._common import (add_model_hook, denoisers, num_train_timesteps, pop_attachment, remove_model_hook,
                      set_attachment, unwrap_methods, wrap_method)

logger = logging.getLogger(__name__)

HOOK_NAME = "pila"
ATTRIBUTE = "_pila_controller"  # where the pipeline keeps the controller

__all__ = ["PILAController", "PILAHook", "PILASettings", "apply_pila", "attach_pila", "detach_pila", "is_attached",
           "remove_pila"]


@dataclass
class PILASettings:
    """Attach-time settings (validated)."""

    scale: float = 1.0
    start: float = 0.0
    end: float = 1.0
    categories: str | Sequence[str] = "auto"
    per_category_scale: Mapping[str, float] | None = None
    num_train_timesteps: int = 1000
    residual_guidance: float = 0.0
    apply_to: str = "guided"
    category_scale: torch.Tensor = field(init=False)

    def __post_init__(self):
        self.scale = float(self.scale)
        if self.apply_to not in APPLY_TO:
            raise ValueError(f"apply_to must be one of {APPLY_TO}, got {self.apply_to!r}")
        if self.apply_to == "each_branch" and self.residual_guidance > 0:
            raise ValueError("residual_guidance works with apply_to='guided' only (one correction per step)")
        if self.residual_guidance < 0:
            raise ValueError(f"residual_guidance must be >= 0, got {self.residual_guidance}")
        if not 0.0 <= self.start <= self.end <= 1.0:
            raise ValueError(f"need 0 <= start <= end <= 1 (fractions of the denoising steps), got start={self.start}, end={self.end}")
        if isinstance(self.categories, str) and self.categories != "auto":
            self.categories = [c.strip() for c in self.categories.split(",") if c.strip()]
        if self.categories != "auto":
            resolve_prior(self.categories)  # validates the names now, not at the first step
        scale = torch.ones(len(CATEGORY_NAMES))
        for name, value in (self.per_category_scale or {}).items():
            scale[category_index(name)] = float(value)
        self.category_scale = scale

    def window(self, progress: float) -> float:
        return self.scale if self.start <= progress < self.end or (progress >= 1.0 and self.end >= 1.0) else 0.0


class _NoState(BaseState):
    def reset(self, *args, **kwargs):
        pass


class PILAController:
    """State shared by the hooks of one pipeline: settings, current prompt prior, dv cache."""

    def __init__(self, adapter: PILAAdapter, settings: PILASettings):
        self.adapter = adapter
        self.settings = settings
        self.prompts: list[str | None] = [None]
        self.priors: list[CategoryPrior] | None = None
        self._cache: tuple[Any, ...] | None = None
        self.calls = 0  # adapter evaluations (for tests and logging)
        self.last_energy: float | None = None  # residual energy of the last guided step
        self._wrappers: list = []  # methods wrapped on the pipeline (hooks._common.wrap_method)

    def set_prompt(self, prompt):
        if isinstance(prompt, str) or prompt is None:
            prompt = [prompt]
        self.prompts = list(prompt)
        self.priors = None
        self._cache = None

    def category_mask(self, batch: int, text: torch.Tensor | None, device) -> torch.Tensor:
        """[B, num_categories] bool prior for the current call."""
        if self.priors is None:
            logits = self.adapter.classify_text(text) if text is not None else None
            trained = self.adapter.text_classifier is not None and bool(self.adapter.text_classifier.trained)
            priors = []
            for i, prompt in enumerate(self.prompts):
                row = None
                if logits is not None and logits.shape[0] >= len(self.prompts):
                    row = logits[i * (logits.shape[0] // len(self.prompts))]
                priors.append(resolve_prior(self.settings.categories, prompt, learned_logits=row, learned_trained=trained))
            self.priors = priors
            logger.info("PILA category prior: %s", [(p.source, p.categories) for p in priors])
        masks = torch.stack([p.mask for p in self.priors])
        if batch % masks.shape[0] == 0:
            masks = masks.repeat_interleave(batch // masks.shape[0], 0)
        else:  # unexpected batch layout: allow the union for every sample
            masks = masks.any(0, keepdim=True).expand(batch, -1)
        return masks.to(device)


class PILAHook(ModelHook):
    """Adds ``s(t) * dv`` to a Wan transformer's velocity output (see the module docstring)."""

    _is_stateful = True  # so diffusers hands us the pipeline's cache context (cond/uncond, step, sigma)

    def __init__(self, controller: PILAController):
        super().__init__()
        self.controller = controller
        self.state_manager = StateManager(_NoState)
        self._inputs: tuple | None = None

    def reset_state(self, module):
        self.state_manager.reset()
        self.controller._cache = None
        return module

    def pre_forward(self, module, *args, **kwargs):
        names = ("hidden_states", "timestep", "encoder_hidden_states")
        vals = [kwargs.get(n, args[i] if len(args) > i else None) for i, n in enumerate(names)]
        self._inputs = tuple(vals)
        return args, kwargs

    def _sigma_progress(self, timestep: torch.Tensor, batch: int, device) -> tuple[torch.Tensor, float]:
        ctx = self.state_manager._context
        if ctx is not None and ctx.sigma is not None:
            sigma = torch.full((batch,), float(ctx.sigma), device=device)
        else:
            t = torch.as_tensor(timestep, device=device).float()
            if t.dim() == 2:  # per-token timesteps (expand_timesteps): the sample's noise level is the max
                t = t.amax(dim=1)
            sigma = (t.reshape(-1) / self.controller.settings.num_train_timesteps).expand(batch)
        if ctx is not None and ctx.step_index is not None and ctx.num_inference_steps:
            progress = ctx.step_index / ctx.num_inference_steps
        else:
            progress = 1.0 - float(sigma.max())
        return sigma, progress

    def post_forward(self, module, output):
        hidden_states, timestep, text = self._inputs
        self._inputs = None
        c = self.controller
        sample = output[0] if isinstance(output, tuple) else output.sample
        sigma, progress = self._sigma_progress(timestep, sample.shape[0], sample.device)
        scale = c.settings.window(progress)
        if scale == 0.0:
            return output
        if hidden_states.shape[1] != sample.shape[1]:
            # image-to-video: the input is cat([latents, condition]); the state is the latents
            hidden_states = hidden_states[:, : sample.shape[1]]
        ctx = self.state_manager._context
        branch = ctx.name if ctx is not None else "cond"
        each_branch = c.settings.apply_to == "each_branch"
        cached = c._cache
        if (
            not each_branch
            and branch != "cond"
            and cached is not None
            and cached[2] == progress
            and cached[3].shape == sample.shape
            and _same_tensor(cached[0], cached[1], hidden_states)
        ):
            dv = cached[3]
        else:
            adapter = c.adapter
            if adapter.device != sample.device:
                adapter.to(sample.device)
            with torch.no_grad():
                if each_branch and branch == "uncond":  # the empty prompt: no category prior
                    mask = torch.ones(sample.shape[0], len(CATEGORY_NAMES), dtype=torch.bool, device=sample.device)
                else:
                    mask = c.category_mask(sample.shape[0], text, sample.device)
                out = adapter(
                    hidden_states,
                    sample,
                    sigma,
                    encoder_hidden_states=text if adapter.text_classifier is not None else None,
                    category_mask=mask,
                    category_scale=c.settings.category_scale.to(sample.device),
                    compute_residuals=False,
                )
            dv = out.dv.to(sample.dtype)
            if c.settings.residual_guidance > 0:
                dv_g, energy = adapter.residual_guidance(
                    hidden_states,
                    sample + scale * dv,
                    sigma,
                    c.settings.residual_guidance / scale,
                    encoder_hidden_states=text if adapter.text_classifier is not None else None,
                    category_mask=mask,
                    category_scale=c.settings.category_scale.to(sample.device),
                )
                c.last_energy = float(energy)
                dv = dv + dv_g.to(sample.dtype)
            c.calls += 1
            c._cache = None if each_branch else (hidden_states, hidden_states._version, progress, dv)
        corrected = sample + scale * dv
        if isinstance(output, tuple):
            return (corrected, *output[1:])
        output.sample = corrected
        return output


def _same_tensor(ref: torch.Tensor, version: int, t: torch.Tensor) -> bool:
    """Same latents as the cached call: the same tensor unmodified, or an equal copy (offload hooks copy inputs)."""
    if t is ref:
        return t._version == version
    return t.shape == ref.shape and t.dtype == ref.dtype and t.device == ref.device and torch.equal(t, ref)


def _latent_channels(pipe) -> int:
    for _, model in denoisers(pipe):
        return int(model.config.out_channels)
    vae = getattr(pipe, "vae", None)
    if vae is not None and hasattr(vae.config, "z_dim"):
        return int(vae.config.z_dim)
    raise ValueError("the pipeline has neither `transformer` nor `transformer_2`; PILA attaches to Wan transformers")


def _text_dim(pipe) -> int | None:
    for _, model in denoisers(pipe):
        if hasattr(model.config, "text_dim"):
            return int(model.config.text_dim)
    return None


def _check_pipeline(pipe, adapter: PILAAdapter) -> None:
    """The adapter fits the pipeline: a PILAAdapter, Wan transformer(s), the same latents and text."""
    if not isinstance(adapter, PILAAdapter):
        raise TypeError(f"adapter must be a PILAAdapter, got {type(adapter).__name__}")
    if not denoisers(pipe):
        raise ValueError(f"{type(pipe).__name__} has no `transformer` or `transformer_2` to attach PILA to")
    channels = _latent_channels(pipe)
    if channels != adapter.config.latent_channels:
        vae = getattr(pipe, "vae", None)
        z = getattr(getattr(vae, "config", None), "z_dim", None)
        raise ValueError(
            f"{type(pipe).__name__} works in {channels}-channel latents ({type(vae).__name__} z_dim={z}"
            f"{', the Wan 2.2 TI2V-5B VAE' if channels == 48 else ''}) but this PILA adapter reads "
            f"{adapter.config.latent_channels}-channel latents (the Wan 2.1 VAE, shared by Wan 2.1 and Wan 2.2 A14B); "
            f"use an adapter trained with latent_channels={channels}"
        )
    adapter.check_compatible(latent_channels=channels, text_dim=_text_dim(pipe), where=type(pipe).__name__)


def apply_pila(pipe, adapter: PILAAdapter, settings: PILASettings) -> PILAController:
    """Attach ``adapter`` to a Wan pipeline with ``settings`` (diffusers' ``apply_*`` shape); see
    :func:`attach_pila`, which builds the settings from keyword arguments."""
    _check_pipeline(pipe, adapter)
    if is_attached(pipe):
        remove_pila(pipe)
    adapter.eval()
    controller = PILAController(adapter, settings)
    for _, model in denoisers(pipe):
        add_model_hook(model, PILAHook(controller), HOOK_NAME)

    if hasattr(pipe, "encode_prompt"):  # the prompt's text, for the category prior (see hooks._common)
        original = pipe.encode_prompt

        @functools.wraps(original)
        def encode_prompt(*args, **kwargs):
            controller.set_prompt(kwargs["prompt"] if "prompt" in kwargs else (args[0] if args else None))
            return original(*args, **kwargs)

        wrap_method(pipe, "encode_prompt", encode_prompt, controller._wrappers)
    set_attachment(pipe, ATTRIBUTE, controller)
    return controller


def attach_pila(
    pipe,
    adapter: PILAAdapter,
    scale: float = 1.0,
    start: float = 0.0,
    end: float = 1.0,
    categories: str | Sequence[str] = "auto",
    per_category_scale: Mapping[str, float] | None = None,
    residual_guidance: float = 0.0,
    apply_to: str | None = None,
) -> PILAController:
    """Attach ``adapter`` to a Wan pipeline (2.1: ``transformer``; 2.2: also ``transformer_2``).

    Args:
        pipe: a diffusers Wan pipeline (``WanPipeline`` and relatives with a Wan transformer).
        adapter: the PILA adapter; its ``latent_channels`` must equal the transformer's.
        scale: guidance strength s (``v' = v + s dv``); 0 reproduces the base pipeline exactly.
        start, end: fractions of the denoising steps in which the correction is applied.
        categories: ``"auto"`` (learned text classifier when trained, else the prompt lexicon)
            or a list / comma-separated string of categories (ours or WISA / PhyGenBench names).
        per_category_scale: e.g. ``{"liquid": 0.5}``; scales that category's expert refinements.
        residual_guidance: size (relative to the velocity's RMS) of an extra gradient step that
            lowers the routed categories' residuals (:meth:`PILAAdapter.residual_guidance`);
            0 (default) disables it. Costs one adapter forward and backward per step.
        apply_to: ``"guided"`` or ``"each_branch"`` (module docstring); default: the way the
            adapter was trained (its config's ``apply_to``).

    Returns the :class:`PILAController` (settings can be changed between calls). Attaching
    twice replaces the previous attachment.
    """
    _check_pipeline(pipe, adapter)
    settings = PILASettings(scale, start, end, categories, per_category_scale, num_train_timesteps(pipe),
                            residual_guidance, apply_to or getattr(adapter.config, "apply_to", "guided"))
    return apply_pila(pipe, adapter, settings)


def is_attached(pipe) -> bool:
    return getattr(pipe, ATTRIBUTE, None) is not None


def remove_pila(pipe) -> None:
    """Remove PILA from ``pipe``; afterwards the pipeline is the base pipeline again."""
    for _, model in denoisers(pipe):
        remove_model_hook(model, HOOK_NAME)
    controller = pop_attachment(pipe, ATTRIBUTE)
    if controller is not None:
        unwrap_methods(controller._wrappers)


#: the names of :func:`apply_pila` and :func:`remove_pila` that the user API has always had
detach_pila = remove_pila
