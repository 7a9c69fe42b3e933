"""The PGMS encoder, one module per stage in the order data flows (``compress.compress`` runs
them); the bytes it writes are the format of :mod:`visionmoe.splat.pgms`.

    compress.py      the public ``compress``: options -> the stages below -> :class:`CompressResult`
    options.py       the options of one encode, validated (:class:`EncodeOptions`), and the effort levels
    guards.py        input guards (log-scales clamped into range)
    contribution.py  views and image-space contributions; pruning of the negligible Gaussians
    check_views.py   the render checks' views and the original scene's renders of them
    pyramid.py       the mixture pyramid: contribution-weighted moment-matched merges
    update.py        compositing-aware update: merges (closed form) and render-vs-render refinement
    tree.py          pruned scene -> mixture pyramid + scene metadata (:class:`Tree`)
    palettes.py      value tables of attributes that sit on a grid (section PALT)
    allocator.py     the rate ladders, presets and the cut plan of a rung
    kmeans.py        codebook training (contribution-weighted k-means)
    rung.py          a quality rung on a tree: codebooks, RD estimate, closed-loop symbols (:class:`Rung`)
    rung_search.py   rung search: proxy hill climb, render-verified shortlist -> :class:`Allocation`
    cut.py           cut tuning against real encoded bytes -> :class:`Encoding` (the .pgms bytes)
    prune.py         pruning search: variants that drop faint Gaussians instead of merging, render-checked
    refine.py        compositing-aware refinement of the chosen cut, kept only if it renders closer
    psnr.py          PSNR target: bisection on the size
    stages.py        progress reporting and per-stage timings (logged)

Every stage takes and returns dataclasses; options travel as arguments, never through module state.
"""
