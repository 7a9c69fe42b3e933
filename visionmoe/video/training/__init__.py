"""Staged training of the PILA adapter on a frozen Wan backbone, on ``accelerate``.

Stages (``TrainConfig.stage``); each run trains one stage, starting from the adapter of the
previous one (``init_adapter``) or from scratch:

1. **Field estimation** (trains ``adapter.fields``). A cached clean latent ``x0`` is noised
   to ``x_t = (1 - sigma) x0 + sigma * eps``; the frozen backbone gives ``v``; the field
   estimator sees ``(x_t, v, sigma)`` only. Kinematic-anchor losses: its velocity,
   acceleration and density proxies must match the anchors measured on the *clean* latent
   (latent Lucas-Kanade flow, its time derivative, latent contrast), plus the kinematic
   residual ``a = dv/dt`` on its proxies.
2. **Experts and router** (trains ``adapter.experts``, the learned text-embedding category
   classifier and its router bias, and the heat diffusivity). Category labels supervise the
   routing mass per category (cross-entropy) and the text classifier (binary cross-entropy);
   the Switch load-balance loss and the router z-loss keep routing healthy; the
   category-weighted operational residuals regularise the refined proxies, and an anchor
   term keeps them near the observable motion. The routing is masked by the labels for a
   fraction ``label_mask_prob`` of the samples (label-prior masked routing) and left free
   otherwise, so the router also learns the categories from the latents.
3. **Joint** (trains the whole adapter). The flow-matching loss through the frozen
   backbone: ``|| v + scale * dv - (eps - x0) ||^2``, with the backbone's velocity ``v``
   and the adapter's correction ``dv``, plus the residual regularisers and router losses.
   ``w_motion`` adds the same error's first and second differences along time (a velocity
   error that changes from one latent frame to the next is a wrong motion, one that is
   constant over time a wrong appearance): it weights the flow loss towards motion.
   ``rollout_steps = k > 0`` trains on the sampler's own states (exposure bias): for a
   fraction ``rollout_prob`` of the samples, ``x0`` is noised at a level ``k`` inference steps
   above ``sigma`` (steps uniform before the inference shift ``rollout_shift``, ``du`` apart)
   and brought down to ``sigma`` by ``k`` Euler steps of the frozen backbone with guidance
   ``rollout_guidance`` plus the current adapter (no gradient), as the pipeline would. The
   target there is the straight path from the reached state to ``x0``: ``(x_t - x0) / sigma``
   (``eps - x0`` on the noising path itself).
   ``apply_to`` says where the pipeline will add the correction (:mod:`visionmoe.video.hooks.pila`):
   ``"guided"`` (to the guided velocity ``v_u + g (v_c - v_u)``, ``g = flow_guidance``) or
   ``"each_branch"`` (to every transformer call: the conditional velocity here, with the
   prompt replaced by the empty one and the category prior lifted for a share
   ``uncond_prob`` of the samples, as the base model was trained for guidance). The trained
   adapter's config records it.

The backbone (transformer(s), VAE, text encoder) is frozen: ``requires_grad_(False)``,
``eval()``, never passed to the optimiser, run under ``torch.no_grad()``. Data comes from
the latent cache of :mod:`visionmoe.video.data.cache` (built on the main process on first use).

Batches, noise and sigmas are pure functions of ``(seed, micro-step, process index)``, so
a run resumed from a checkpoint (``accelerator.save_state``: adapter, optimiser, LR
schedule, grad scaler) continues exactly where it stopped, and ``accelerate launch
--num_processes N`` shards each global batch across processes.

Modules: :mod:`.config` (``TrainConfig``, ``TrainResult``), :mod:`.backbone` (the frozen Wan
pipeline and its velocity), :mod:`.sampling` (batches and noise levels as pure functions of the
seed), :mod:`.losses` (every loss term of a stage), :mod:`.loop` (``train``).
"""

from .config import TrainConfig, TrainResult
from .loop import prepare_cache, train

__all__ = ["TrainConfig", "TrainResult", "prepare_cache", "train"]
