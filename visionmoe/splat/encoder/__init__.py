"""The PGMS encoder, one module per stage in the order data flows (``codec.compress`` runs them).

    tree.py       pruned scene -> mixture pyramid + scene metadata (:class:`Tree`)
    quantized.py  a quality rung on a tree: codebooks, RD estimate, closed-loop symbols (:class:`Rung`)
    rungs.py      rung search: proxy hill climb, render-verified shortlist -> :class:`Allocation`
    cut.py        cut tuning against real encoded bytes -> :class:`Encoding` (the .pgms bytes)
    prune.py      pruning search: variants that drop faint Gaussians instead of merging, render-checked
    refine.py     compositing-aware refinement of the chosen cut, kept only if it renders closer
    psnr.py       PSNR target: bisection on the size
    views.py      the render checks' views and the original scene's renders of them
    stages.py     progress reporting and per-stage timings (logged)

Every stage takes and returns dataclasses; options travel as arguments, never through module state.
"""
