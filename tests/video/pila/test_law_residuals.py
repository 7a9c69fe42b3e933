"""Each category's law on the corrected clean estimate: zero-ish on a latent blob that moves by
the law, larger where the estimate breaks it, different per category, and differentiable
through ``dv`` (its gradient reaches the correction and lowering along it lowers the law)."""

import pytest
import torch

from visionmoe.video.pila.law_residuals import (CATEGORY_LAWS, category_law_residuals, corrected_clean_latent,
                                                observable_proxies)
from visionmoe.video.pila.taxonomy import CATEGORY_NAMES


def blob_latent(path, F=7, H=16, W=16, C=4):
    """[1, C, F, H, W]: a Gaussian blob whose centre follows ``path(t) -> (y, x)`` in latent cells."""
    yy, xx = torch.meshgrid(torch.arange(H, dtype=torch.float64), torch.arange(W, dtype=torch.float64), indexing="ij")
    frames = []
    for t in range(F):
        y, x = path(t)
        frames.append(torch.exp(-((yy - y) ** 2 + (xx - x) ** 2) / (2 * 1.8 ** 2)))
    blob = torch.stack(frames)[None, None]
    return torch.cat([blob * (1 + 0.3 * c) for c in range(C)], 1)


LAWFUL = lambda t: (3 + 0.3 * t + 0.5 * 0.15 * t * t, 5 + 0.4 * t)  # noqa: E731  one shared acceleration
JERKY = lambda t: (3 + 0.3 * t + 0.5 * 0.15 * t * t + (1.2 if t % 2 else -1.2), 5 + 0.4 * t)  # noqa: E731


def rigid_weights(B=1):
    w = torch.zeros(B, len(CATEGORY_NAMES), dtype=torch.float64)
    w[:, CATEGORY_NAMES.index("rigid")] = 1
    return w


def test_the_law_tells_a_lawful_estimate_from_a_jerky_one():
    lawful = category_law_residuals(blob_latent(LAWFUL))
    jerky = category_law_residuals(blob_latent(JERKY))
    assert float(jerky["trajectory"]) > 10 * float(lawful["trajectory"])
    assert float(jerky.loss(rigid_weights())) > 3 * float(lawful.loss(rigid_weights()))


def test_each_category_has_its_own_laws():
    assert CATEGORY_LAWS["rigid"] != CATEGORY_LAWS["gas"] and "heat" in CATEGORY_LAWS["thermal"]
    res = category_law_residuals(blob_latent(JERKY))
    per = res.per_category()
    assert per.shape == (1, len(CATEGORY_NAMES)) and len(set(per[0].round(decimals=9).tolist())) >= 4
    gas = torch.zeros_like(rigid_weights())
    gas[:, CATEGORY_NAMES.index("gas")] = 1
    assert float(res.loss(gas)) != pytest.approx(float(res.loss(rigid_weights())))
    assert float(res.loss(rigid_weights(), tolerance=1e9)) == 0.0  # a hinge: nothing above the tolerance


def test_the_residual_is_on_the_corrected_estimate_and_its_gradient_reaches_dv():
    """A base whose estimate is jerky: the residual is non-zero with dv = 0, its gradient reaches
    dv, a step along it lowers the law, and the dv that makes the estimate lawful zeroes most of it."""
    sigma = 0.6
    good, bad = blob_latent(LAWFUL), blob_latent(JERKY)
    noise = torch.randn(bad.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x_t = (1 - sigma) * bad + sigma * noise
    v = noise - bad  # the base's velocity: its clean estimate is the jerky clip
    dv = torch.zeros_like(v, requires_grad=True)
    loss = category_law_residuals(corrected_clean_latent(x_t, v, dv, sigma)).loss(rigid_weights())
    loss.backward()
    assert float(loss.detach()) > 0 and dv.grad is not None and float(dv.grad.abs().max()) > 0
    step = -1e-2 * dv.grad / dv.grad.abs().max()
    lower = category_law_residuals(corrected_clean_latent(x_t, v, step, sigma)).loss(rigid_weights())
    assert float(lower) < float(loss.detach())
    fix = (bad - good) / sigma  # the correction to the lawful clip
    fixed = category_law_residuals(corrected_clean_latent(x_t, v, fix, sigma)).loss(rigid_weights())
    assert float(fixed) < 0.3 * float(loss.detach())


def test_observables_and_bad_input():
    p = observable_proxies(blob_latent(LAWFUL))
    assert p["velocity"].shape[1] == 2 and not p["occupancy"].requires_grad
    assert float(p["velocity"][0, 0, :-1].mean()) > 0.1  # the blob moves right
    with pytest.raises(ValueError, match="F, H, W >= 3"):
        category_law_residuals(torch.zeros(1, 4, 2, 16, 16))
    with pytest.raises(ValueError, match="one per category"):
        category_law_residuals(blob_latent(LAWFUL)).loss(torch.ones(1, 3))
