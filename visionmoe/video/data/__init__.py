"""Data for training and testing PILA: dataset manifests and captioned folders
(:mod:`.manifest`), video decoding (:mod:`.video`), the cache of VAE latents and text embeddings
(:mod:`.cache`), and the procedural physics clips with ground truth (:mod:`.synthetic`, whose
scenarios are simulated and drawn in :mod:`.scenes`)."""
