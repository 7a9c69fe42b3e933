"""PILA, the adapter itself: the physics taxonomy (:mod:`.taxonomy`), category priors from
prompts and labels (:mod:`.labels`), anchored field estimation and the attribute bank
(:mod:`.fields`), the operator experts and masked routing (:mod:`.experts`), the physical-law
residuals (:mod:`.residuals`), the ``PILAAdapter`` model (:mod:`.adapter`) and the validation of
its configuration (:mod:`.config`). It reads and writes Wan VAE latents and velocities only;
attaching it to a pipeline is :mod:`visionmoe.video.hooks`."""
