"""PILA: physics mixture-of-experts latent adapter for Wan pipelines (visionmoe.video)."""
