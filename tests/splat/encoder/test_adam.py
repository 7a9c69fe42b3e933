"""The refinement's Adam (encoder.adam) takes torch.optim.Adam(fused=True)'s steps bit for bit,
with the learning rates changed between steps as the refinement's schedule does, and leaves a
parameter without a gradient alone; it imports no torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from visionmoe.splat.encoder.adam import FusedAdam, make_adam

pytestmark = pytest.mark.skipif(not hasattr(torch, "_fused_adam_"), reason="this torch has no fused Adam kernel")


def _run(make, steps: int = 12):
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(257, 3, generator=g).requires_grad_(True), torch.randn(257, generator=g).requires_grad_(True),
              torch.randn(4, generator=g).requires_grad_(True)]
    opt = make([(p, lr) for p, lr in zip(params, (1e-3, 5e-2, 0.3))])
    base = [grp["lr"] for grp in opt.param_groups]
    for step in range(steps):
        for grp, lr in zip(opt.param_groups, base):
            grp["lr"] = lr * (1.0 - step / (2 * steps))
        opt.zero_grad()
        loss = (params[0] ** 2).sum() * params[1].sin().sum() + params[1].pow(3).mean()  # params[2]: no grad
        loss.backward()
        opt.step()
    return [p.detach() for p in params]


def test_the_steps_of_torch_fused_adam_bit_for_bit():
    ours = _run(FusedAdam)
    ref = _run(lambda groups: torch.optim.Adam([{"params": [p], "lr": lr} for p, lr in groups], fused=True))
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    assert torch.equal(ours[2], _run(FusedAdam, steps=0)[2])  # never had a gradient: unchanged


def test_other_dtypes_fall_back_to_torch_optim():
    p = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    assert isinstance(make_adam([(p, 0.1)]), torch.optim.Adam)
    assert isinstance(make_adam([(p.detach().float().requires_grad_(True), 0.1)]), FusedAdam)


def test_no_dynamo_import():
    code = ("import sys, torch; from visionmoe.splat.encoder.adam import make_adam; "
            "p = torch.zeros(3, requires_grad=True); o = make_adam([(p, 0.1)]); p.sum().backward(); o.step(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
