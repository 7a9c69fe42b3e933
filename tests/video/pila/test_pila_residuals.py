"""Each residual: exactly zero on an analytic field obeying its law, clearly larger on one that does not."""

import pytest
import torch

from visionmoe.video.pila import residuals as R

B, Fr, H, W = 2, 6, 9, 11


def grid():
    t = torch.arange(Fr, dtype=torch.float64).view(1, 1, Fr, 1, 1)
    y = torch.arange(H, dtype=torch.float64).view(1, 1, 1, H, 1) - H / 2
    x = torch.arange(W, dtype=torch.float64).view(1, 1, 1, 1, W) - W / 2
    return t, y, x


def full(f):
    return f.expand(B, 1, Fr, H, W).clone()


def vec(u, w):
    return torch.cat([full(u), full(w)], dim=1)


def zero():
    return torch.zeros(1, 1, 1, 1, 1, dtype=torch.float64)


def test_kinematic():
    t, y, x = grid()
    a = (0.3, -0.7)
    vel = vec(0.5 + a[0] * t + 0 * x, 0.1 * y + a[1] * t)
    good = R.kinematic(vel, vec(zero() + a[0], zero() + a[1]))
    bad = R.kinematic(vel, vec(zero(), zero()))
    assert good.abs() < 1e-20 and bad > 0.1


def test_advection():
    t, y, x = grid()
    u, w = 0.6, -0.4
    xi, eta = x - u * t, y - w * t  # transported quadratic pattern
    q = torch.cat([full(0.05 * xi**2 + 0.3 * eta), full(0.02 * xi * eta - eta)], dim=1)
    vel = vec(zero() + u, zero() + w)
    assert R.advection(q, vel).abs() < 1e-20
    assert R.advection(q, vec(zero() - u, zero() + w)) > 0.05


def test_continuity():
    t, y, x = grid()
    u, w = 0.5, 0.25
    rho = full(1.0 + 0.01 * (x - u * t) ** 2 + 0.1 * (y - w * t))
    vel = vec(zero() + u, zero() + w)
    assert R.continuity(rho, vel).abs() < 1e-20
    growing = full(1.0 + 0.5 * t + 0 * x)  # mass appears from nowhere, no flow
    assert R.continuity(growing, vec(zero(), zero())) > 0.1
    assert R.continuity(rho, vec(0.1 * x + 0 * t, zero())) > 1e-3  # compressing flow moves no mass here


def test_incompressibility():
    t, y, x = grid()
    rot = vec(-0.3 * y + 0 * t, 0.3 * x)
    shear = vec(0.2 * y + 0 * t, zero())
    expand = vec(0.3 * x + 0 * t, 0.3 * y)
    assert R.incompressibility(rot).abs() < 1e-20 and R.incompressibility(shear).abs() < 1e-20
    assert R.incompressibility(expand) > 0.1


def test_rigidity_and_strain():
    t, y, x = grid()
    rigid = vec(1.0 - 0.2 * y + 0.1 * t, -0.5 + 0.2 * x)  # translation + rotation
    shear = vec(0.4 * y + 0 * t, zero())
    assert R.rigidity(rigid).abs() < 1e-20
    assert R.rigidity(shear) > 0.01
    e = R.strain_rate(shear)
    assert torch.allclose(e[:, 2], torch.full_like(e[:, 2], 0.2))


def test_gravity():
    t, y, x = grid()
    g = vec(zero(), zero() + 0.5)
    assert R.gravity(g).abs() < 1e-20
    assert R.gravity(g, g=torch.tensor([0.0, 0.5])).abs() < 1e-20
    assert R.gravity(g, g=torch.tensor([0.0, -0.5])) > 0.4
    varying = vec(0.1 * x + 0 * t, 0.5 + 0.2 * t)
    assert R.gravity(varying) > 0.1


def test_heat():
    t, y, x = grid()
    kappa = 0.2
    T = full(x**2 + y**2 + 4 * kappa * t)  # lap = 4, dT/dt = 4 kappa
    assert R.heat(T, kappa).abs() < 1e-20
    assert R.heat(full(x**2 + y**2 + 0 * t), kappa) > 0.5


def test_weights_reduction_and_errors():
    t, y, x = grid()
    expand = vec(0.3 * x + 0 * t, 0.3 * y)
    per = R.incompressibility(expand, reduction="none")
    assert per.shape == (B,)
    w = torch.zeros(B, 1, Fr, H, W, dtype=torch.float64)
    w[..., 3:5, 3:5] = 1
    assert torch.allclose(R.incompressibility(expand, weight=w), per.mean())
    with pytest.raises(ValueError, match="2 channels"):
        R.rigidity(full(x))
    with pytest.raises(ValueError, match="reduction"):
        R.rigidity(expand, reduction="sum")


def test_bank_residuals_all_names():
    t, y, x = grid()
    p = {
        "velocity": vec(zero() + 0.5, zero()),
        "acceleration": vec(zero(), zero()),
        "density": full(1 + 0.1 * (x - 0.5 * t)),
        "temperature": full(0 * x + 1.0 + 0 * t),
        "latent": full(0.1 * (x - 0.5 * t)),
    }
    out = R.bank_residuals(p)
    assert set(out) == set(R.RESIDUALS)
    for name, v in out.items():
        assert v.shape == (B,) and v.abs().max() < 1e-20, name
