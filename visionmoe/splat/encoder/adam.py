"""Adam for the refinement: ``torch.optim.Adam(fused=True)``'s update, without ``torch.optim``.

The first ``torch.optim`` optimizer of a process imports ``torch._dynamo`` (its ``add_param_group``
is wrapped to disable compilation): 1.7 s of a 25 s `default` encode on two cores, paid by every
``compress`` call that refines. The refinement needs one tensor per group and no closure, so it
calls the kernel ``torch.optim.Adam(fused=True)`` calls, ``torch._fused_adam_``, with the same
state, and takes the same steps bit for bit (``tests/splat/encoder/test_adam.py``). Where that
kernel is missing (another torch) or the parameters are not float32 on CPU/CUDA,
``torch.optim.Adam`` runs instead.
"""

from __future__ import annotations

import torch

BETAS, EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults


class FusedAdam:
    """Adam over ``groups`` [(tensor, lr)], one tensor per group; ``param_groups[i]["lr"]`` may
    change between steps (the refinement's cosine schedule), as in ``torch.optim``."""

    def __init__(self, groups: list[tuple[torch.Tensor, float]]):
        self.param_groups = [{"params": [p], "lr": float(lr)} for p, lr in groups]
        # torch.optim.Adam(fused=True)'s lazy state: a float32 step on the parameter's device
        self.state = [(torch.zeros((), dtype=torch.float32, device=p.device),
                       torch.zeros_like(p, memory_format=torch.preserve_format),
                       torch.zeros_like(p, memory_format=torch.preserve_format)) for p, _ in groups]

    @staticmethod
    def supports(params: list[torch.Tensor]) -> bool:
        return hasattr(torch, "_fused_adam_") and _fusable(params)

    def zero_grad(self) -> None:
        for g in self.param_groups:
            g["params"][0].grad = None

    @torch.no_grad()
    def step(self) -> None:
        for g, (step, exp_avg, exp_avg_sq) in zip(self.param_groups, self.state):
            p = g["params"][0]
            if p.grad is None:  # as torch.optim: a parameter without a gradient keeps its state
                continue
            torch._foreach_add_([step], 1)
            torch._fused_adam_([p], [p.grad], [exp_avg], [exp_avg_sq], [], [step], lr=g["lr"], beta1=BETAS[0],
                               beta2=BETAS[1], weight_decay=0.0, eps=EPS, amsgrad=False, maximize=False,
                               grad_scale=None, found_inf=None)


def make_adam(groups: list[tuple[torch.Tensor, float]]):
    """:class:`FusedAdam` where it runs, else ``torch.optim.Adam`` (fused where torch allows)."""
    params = [p for p, _ in groups]
    if FusedAdam.supports(params):
        return FusedAdam(groups)
    return torch.optim.Adam([{"params": [p], "lr": lr} for p, lr in groups], fused=_fusable(params) or None)


def _fusable(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused Adam takes these parameters (float32, on CPU or CUDA)."""
    return all(p.dtype == torch.float32 and p.device.type in ("cpu", "cuda") for p in params)
