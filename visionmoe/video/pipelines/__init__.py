"""Pipelines with PILA built in: :class:`~.wan_pila.WanPILAPipeline` (a diffusers ``WanPipeline``
whose loading attaches an adapter through :mod:`visionmoe.video.hooks`)."""
