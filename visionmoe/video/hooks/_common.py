"""What the hooks of this room share: the Wan VAE's latent normalisation, the denoisers a hook
attaches to, and the one attach/detach mechanism.

Attach and detach
-----------------
Everything that runs inside a pipeline attaches in one of two ways, both kept here:

1. **A diffusers** ``ModelHook`` registered in a module's ``HookRegistry`` under the hook's
   name (:func:`add_model_hook`, :func:`remove_model_hook`), in the shape of
   ``diffusers/hooks/*``. It runs around the module's ``forward``: PILA and trajectory guidance
   on the Wan transformer(s). It composes with diffusers' other hooks (group offloading) and
   with accelerate's (``enable_model_cpu_offload``, in either order: when accelerate wrapped
   the hooked forward after the hook was added, removing the hook unhooks beneath
   accelerate's wrapper and points the wrapper at the restored forward).
2. **A method wrapper** set as an instance attribute over the class's method
   (:func:`wrap_method`, :func:`unwrap_methods`), where diffusers' hooks cannot reach:
   ``HookRegistry`` wraps an ``nn.Module``'s ``forward`` and nothing else, and

   - the scheduler is not an ``nn.Module``: ``scheduler.step`` is the only place that sees
     the velocity after classifier-free guidance (trajectory projection, ``"latent"``);
   - the pipeline is not one either: ``pipe.encode_prompt`` is the only place that sees the
     prompt's text (PILA's category prior);
   - the pipeline calls ``vae.decode``, never the VAE's ``forward``, and the Wan VAE decodes
     frame by frame through its decoder, so no module's ``forward`` sees the decoded video
     whole (trajectory projection, ``"pixels"``).

   Each wrapper is recorded with its owner; removing it (only while it is still the one
   set) brings the class's method back.

The state an ``apply_*`` function returns is kept on the pipeline (:func:`set_attachment`,
e.g. ``pipe._pila_controller``), where ``remove_*`` finds it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers.hooks import HookRegistry, ModelHook

__all__ = ["TRANSFORMERS", "add_model_hook", "denoisers", "from_wan_latents", "num_train_timesteps", "pop_attachment",
           "remove_model_hook", "set_attachment", "unwrap_methods", "wan_latent_stats", "wrap_method"]

#: the denoisers of Wan pipelines: Wan 2.1 has ``transformer``; Wan 2.2 A14B also ``transformer_2``
TRANSFORMERS = ("transformer", "transformer_2")


def wan_latent_stats(vae) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, std)`` [1, C, 1, 1, 1] of a Wan VAE's latent normalisation: the pipeline's latents
    are ``(z - mean) / std`` of the VAE's latents ``z`` (zeros and ones when the config has none)."""
    cfg = vae.config
    mean = getattr(cfg, "latents_mean", None)
    std = getattr(cfg, "latents_std", None)
    mean = torch.tensor(mean).view(1, -1, 1, 1, 1) if mean is not None else torch.zeros(1, cfg.z_dim, 1, 1, 1)
    std = torch.tensor(std).view(1, -1, 1, 1, 1) if std is not None else torch.ones(1, cfg.z_dim, 1, 1, 1)
    return mean, std


def from_wan_latents(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The VAE's latents of the pipeline's normalised latents ``x`` (:func:`wan_latent_stats`)."""
    return x * std + mean


def denoisers(pipe) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of the pipeline's Wan transformers that exist (:data:`TRANSFORMERS`)."""
    return [(n, m) for n, m in ((n, getattr(pipe, n, None)) for n in TRANSFORMERS) if m is not None]


def num_train_timesteps(pipe) -> int:
    """The scheduler's ``num_train_timesteps`` (timestep = sigma x this), 1000 when unknown."""
    sched = getattr(pipe, "scheduler", None)
    return int(getattr(getattr(sched, "config", None), "num_train_timesteps", 1000) or 1000)


def add_model_hook(module: torch.nn.Module, hook: ModelHook, name: str) -> None:
    """Register ``hook`` in ``module``'s ``HookRegistry`` under ``name``."""
    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, name)
    hook._wrapper = module.forward  # the hooked forward (to recognise wrappers added later)


def remove_model_hook(module: torch.nn.Module | None, name: str) -> bool:
    """Remove the hook ``name`` from ``module`` (module docstring); False when it has none."""
    registry = getattr(module, "_diffusers_hook", None) if module is not None else None
    if registry is None or registry.get_hook(name) is None:
        return False
    hook = registry.get_hook(name)
    wrapper = getattr(hook, "_wrapper", None)
    if wrapper is not None and getattr(module, "_old_forward", None) is wrapper:
        # accelerate (model CPU offload) wrapped our hooked forward after attach: unhook
        # beneath its wrapper and point the wrapper at the restored forward
        accel_forward = module.forward
        registry.remove_hook(name, recurse=False)
        module._old_forward = module.forward
        module.forward = accel_forward
    else:
        registry.remove_hook(name, recurse=False)
    return True


def wrap_method(owner, name: str, wrapper: Callable, record: list) -> None:
    """Set ``wrapper`` as ``owner.name`` (an instance attribute over the class's method) and note
    it in ``record`` for :func:`unwrap_methods`."""
    setattr(owner, name, wrapper)
    record.append((owner, name, wrapper))


def unwrap_methods(record: list) -> None:
    """Remove the wrappers noted in ``record`` that are still in place; the class methods are back."""
    for owner, name, wrapper in reversed(record):
        if vars(owner).get(name) is wrapper:
            delattr(owner, name)
    record.clear()


def set_attachment(pipe, attribute: str, state) -> None:
    """Keep an attachment's state on the pipeline (``pipe.<attribute>``)."""
    setattr(pipe, attribute, state)


def pop_attachment(pipe, attribute: str):
    """The attachment's state kept on the pipeline (None when absent), removed from it."""
    state = getattr(pipe, attribute, None)
    if hasattr(pipe, attribute):
        delattr(pipe, attribute)
    return state
