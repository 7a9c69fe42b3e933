"""PILA: physics mixture-of-experts latent adapter for Wan pipelines (visionmoe.video).

Public API::

    from visionmoe.video import PILAAdapter, attach_pila, detach_pila, WanPILAPipeline

Rooms, one job each: ``pila`` (the adapter: taxonomy, category priors, fields, experts,
residuals, ``PILAAdapter``, config validation), ``hooks`` (everything that attaches to a
diffusers pipeline: PILA, trajectory guidance, trajectory projection), ``pipelines``
(``WanPILAPipeline``), ``physics`` (tracking and law fits shared by hooks and evaluation),
``models`` (the shipped toy world and the tiny test Wan), ``data`` (manifests, decoding, the
latent cache, procedural clips), ``training`` (staged training), ``evaluation`` (CPU physics
proxies, the guarded toy-world evaluation) and ``cli`` (``visionmoe-video``; nothing imports it).
"""

from importlib import import_module

_EXPORTS = {
    "PILAAdapter": "pila.adapter",
    "PILAOutput": "pila.adapter",
    "AttributeBank": "pila.fields",
    "attach_pila": "hooks.pila",
    "detach_pila": "hooks.pila",
    "is_attached": "hooks.pila",
    "attach_trajectory_guidance": "hooks.trajectory_guidance",
    "detach_trajectory_guidance": "hooks.trajectory_guidance",
    "attach_trajectory_projection": "hooks.trajectory_projection",
    "detach_trajectory_projection": "hooks.trajectory_projection",
    "WanPILAPipeline": "pipelines.wan_pila",
    "load_adapter": "pipelines.wan_pila",
    "load_tiny_wan": "models.tiny",
    "load_toy_world": "models.toy_world",
    "classify_prompt": "pila.labels",
    "CATEGORY_NAMES": "pila.taxonomy",
    "SLOTS": "pila.taxonomy",
    "evaluate_toy_world": "evaluation.toy_world",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):  # lazy: importing visionmoe.video does not import diffusers
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
