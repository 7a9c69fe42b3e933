"""Everything that attaches to a diffusers Wan pipeline, one module each, in the shape of
``diffusers/hooks/*`` (a config dataclass, the hook, ``apply_*`` / ``remove_*``):

- :mod:`.pila`: the PILA adapter's velocity correction (``apply_pila`` / ``remove_pila``, and
  the user API ``attach_pila`` / ``detach_pila``);
- :mod:`.trajectory_guidance`: trajectory-law guidance of the clean-latent estimate;
- :mod:`.trajectory_projection`: rigid-body projection of the output onto a law;
- :mod:`._common`: the Wan VAE's latent normalisation and the one attach/detach mechanism
  (diffusers ``HookRegistry`` hooks, and the documented method wrappers where no module's
  ``forward`` sees what a hook needs).

Importing this package imports none of them (nor diffusers) until a name is used.
"""

from importlib import import_module

_EXPORTS = {
    "PILASettings": "pila", "PILAController": "pila", "PILAHook": "pila", "apply_pila": "pila", "remove_pila": "pila",
    "attach_pila": "pila", "detach_pila": "pila", "is_attached": "pila",
    "TrajectoryGuidance": "trajectory_guidance", "TrajectoryGuidanceConfig": "trajectory_guidance",
    "apply_trajectory_guidance": "trajectory_guidance", "remove_trajectory_guidance": "trajectory_guidance",
    "attach_trajectory_guidance": "trajectory_guidance", "detach_trajectory_guidance": "trajectory_guidance",
    "TrajectoryProjection": "trajectory_projection", "TrajectoryProjectionConfig": "trajectory_projection",
    "apply_trajectory_projection": "trajectory_projection", "remove_trajectory_projection": "trajectory_projection",
    "attach_trajectory_projection": "trajectory_projection", "detach_trajectory_projection": "trajectory_projection",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
