"""Standard-library scaffolding shared by both plug-ins and both command lines: the output
file rules (:mod:`.files`), exit codes and signals (:mod:`.cli`), argument validators
(:mod:`.validators`). Imports nothing of ``ops``, ``splat`` or ``video``, nor torch or numpy."""
