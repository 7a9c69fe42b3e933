"""PILA: physics mixture-of-experts latent adapter for Wan pipelines (visionmoe.video).

Public API::

    from visionmoe.video import PILAAdapter, attach_pila, detach_pila, WanPILAPipeline

Modules: ``taxonomy`` (categories, benchmark mappings), ``labels`` (category priors),
``fields`` (anchored field estimation, attribute bank), ``experts`` (operator experts,
masked routing), ``residuals`` (physical-law residuals, pure functions), ``adapter``
(``PILAAdapter``), ``attach`` (diffusers hooks), ``pipeline`` (``WanPILAPipeline``), ``tiny``
(the embedded offline Wan used by tests and the demo).
"""

from importlib import import_module

_EXPORTS = {
    "PILAAdapter": "adapter",
    "PILAOutput": "adapter",
    "AttributeBank": "fields",
    "attach_pila": "attach",
    "detach_pila": "attach",
    "is_attached": "attach",
    "WanPILAPipeline": "pipeline",
    "load_adapter": "pipeline",
    "load_tiny_wan": "tiny",
    "classify_prompt": "labels",
    "CATEGORY_NAMES": "taxonomy",
    "SLOTS": "taxonomy",
    "evaluate_toy_world": "evaluation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):  # lazy: importing visionmoe.video does not import diffusers
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
