"""When visionmoe._C cannot load (built for another torch, or CUDA libraries missing): one logged
warning naming the cause and the torch to install; the routing ops and the rasteriser run on the
pure-PyTorch kernels with the compiled kernels' results and gradients; the rANS coder reports
itself unavailable (its numpy loops take over); a kernel with no pure-PyTorch path would raise
one line naming the torch the extension was built for and the pip command. The load failure is
simulated."""

from __future__ import annotations

import logging

import pytest
import torch

from visionmoe import ops
from visionmoe.ops import _backend
from visionmoe.ops import rans as compiled_rans

CAUSE = "libc10_cuda.so: cannot open shared object file: No such file or directory"
BUILT_FOR, _CUDA = _backend.built_for(_backend._extension_file())


def compiled_available() -> bool:
    return _backend._load()[0] is not None


needs_compiled = pytest.mark.skipif(not compiled_available(), reason="compares with the compiled extension")


@pytest.fixture()
def no_extension(monkeypatch):
    """visionmoe._C fails to load as it does under a torch it was not built for."""
    def fail():
        raise ImportError(CAUSE)

    monkeypatch.setattr(_backend, "_import_extension", fail)
    _backend._load.cache_clear()
    _backend.warn_fallback.cache_clear()
    try:
        yield
    finally:
        monkeypatch.undo()
        _backend._load.cache_clear()
        _backend.warn_fallback.cache_clear()


def backend_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == _backend.logger.name and r.levelno == logging.WARNING]


def routing_case(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    T, E, D, k = 37, 6, 5, 2
    logits = torch.randn(T, E, generator=g, dtype=dtype)
    mask = torch.rand(T, E, generator=g) > 0.3
    mask[torch.arange(T), torch.randint(0, E, (T,), generator=g)] = True
    mask[3] = False
    mask[3, 1] = True  # a token with one allowed expert: its second slot is empty (-1)
    x = torch.randn(T, D, generator=g, dtype=dtype)
    return logits, mask, x, k, E


def routed_layer(logits, mask, x, k, E, normalize=True):
    """topk_route -> dispatch -> experts -> combine, with the router losses, as PILA uses them."""
    logits, x = logits.clone().requires_grad_(), x.clone().requires_grad_()
    r = ops.topk_route(logits, k, mask, normalize=normalize)
    scales = torch.arange(1, E + 1, dtype=x.dtype)
    out = ops.moe_apply(x, r.weights, r.indices, [lambda t, s=s: t * s for s in scales])
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=x.dtype).view_as(out)).sum() + r.aux_loss + 0.1 * r.z_loss
    loss.backward()
    return r.weights.detach(), r.indices, out.detach(), logits.grad, x.grad


def test_one_warning_names_the_cause_and_the_torch_to_install(no_extension, caplog):
    caplog.set_level(logging.WARNING, logger=_backend.logger.name)
    logits, mask, x, k, E = routing_case()
    for _ in range(3):
        routed_layer(logits, mask, x, k, E)
    assert compiled_rans.available() is False
    assert ops.build_info()["compiled"] is False
    (line,) = backend_warnings(caplog)
    assert "\n" not in line and CAUSE in line and f"torch {torch.__version__}" in line
    assert "pure-PyTorch" in line and "make build" not in line
    if BUILT_FOR is not None:
        assert f"pip install torch=={BUILT_FOR}" in line


@needs_compiled
@pytest.mark.parametrize("normalize", [True, False])
def test_routing_ops_match_the_compiled_kernels(normalize, monkeypatch):
    logits, mask, x, k, E = routing_case(torch.float64, seed=1)
    compiled = routed_layer(logits, mask, x, k, E, normalize)
    g = torch.Generator().manual_seed(2)
    pts, ctr = torch.randn(500, 7, generator=g), torch.randn(40, 7, generator=g)
    w, seg = torch.rand(500, generator=g, dtype=torch.float64), torch.randint(0, 9, (500,), generator=g)
    feats = torch.randn(500, 3, generator=g, dtype=torch.float64)
    near = ops.nearest_center(pts, ctr)
    mom = ops.segment_moments(feats, w, seg, 11)  # segments 9 and 10 are empty
    _backend._load.cache_clear()
    _backend.warn_fallback.cache_clear()
    monkeypatch.setattr(_backend, "_import_extension", lambda: (_ for _ in ()).throw(ImportError(CAUSE)))
    try:
        assert isinstance(_backend.kernels(torch.device("cpu")), _backend._PyTorchKernels)
        fallback = routed_layer(logits, mask, x, k, E, normalize)
        near_f = ops.nearest_center(pts, ctr, chunk=64)
        mom_f = ops.segment_moments(feats, w, seg, 11)
    finally:
        monkeypatch.undo()
        _backend._load.cache_clear()
        _backend.warn_fallback.cache_clear()
    for a, b in zip(compiled, fallback):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    assert torch.equal(near[0], near_f[0])
    torch.testing.assert_close(near[1], near_f[1], atol=1e-5, rtol=1e-5)
    for a, b in zip(mom, mom_f):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_fallback_gradients_pass_gradcheck(no_extension):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    for normalize in (True, False):
        def route(lg, normalize=normalize):
            r = ops.topk_route(lg, 2, mask, normalize=normalize)
            return r.weights, r.probs, r.aux_loss, r.z_loss

        assert torch.autograd.gradcheck(route, (logits,))
    x = torch.randn(8, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(8, generator=g, dtype=torch.float64) + 0.1).requires_grad_()
    seg = torch.tensor([0, 0, 1, 1, 1, 3, 3, 3])
    assert torch.autograd.gradcheck(lambda a, b: tuple(ops.segment_moments(a, b, seg, 4)), (x, w))
    idx = torch.tensor([[0, 2], [1, -1], [2, 0], [1, 2]])
    y = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    cw = torch.rand(4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ops.combine(a, b, idx, 3), (y, cw))
    assert torch.autograd.gradcheck(lambda a: ops.dispatch(a, idx, 3)[0], (x[:4].detach().requires_grad_(),))


def test_fallback_edge_cases(no_extension):
    with pytest.raises(ValueError, match="every expert of token 1"):
        ops.topk_route(torch.randn(3, 4), 1, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool))
    r = ops.topk_route(torch.zeros(0, 4), 2)
    assert r.weights.shape == (0, 2) and r.probs.shape == (0, 4)
    buf, plan = ops.dispatch(torch.randn(3, 2), torch.full((3, 1), -1), 2)  # every token dropped
    assert buf.shape == (0, 2) and ops.combine(buf, torch.ones(3, 1), None, plan=plan).abs().sum() == 0
    index, dist = ops.nearest_center(torch.zeros(0, 3), torch.randn(4, 3))
    assert index.shape == (0,) and dist.shape == (0,)


def raster_scene(n=120, degree=1, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(n, 3, generator=g) * 0.6, torch.randn(n, 4, generator=g),
              torch.randn(n, 3, generator=g) * 0.3 - 2.3, torch.randn(n, generator=g),
              torch.randn(n, (degree + 1) ** 2, 3, generator=g) * 0.3 if degree is not None else torch.rand(n, 3, generator=g)]
    params[0][:3] = torch.tensor([[0.0, 0.0, -5.0], [float("nan"), 0.0, 0.0], [9.0, 9.0, 0.0]])  # behind, NaN, off screen
    view = torch.eye(4).repeat(2, 1, 1)
    view[:, 2, 3] = 3.0
    view[1, 0, 3] = 0.4
    K = torch.tensor([[40.0, 0, 24], [0, 40.0, 17], [0, 0, 1]]).repeat(2, 1, 1)
    return [p.to(dtype) for p in params], view.to(dtype), K.to(dtype)


def render_with_grads(params, view, K, degree, width=48, height=35):
    leaves = [p.clone().requires_grad_() for p in params]
    out = ops.rasterize(*leaves, view, K, width, height, sh_degree=degree, return_contributions=True,
                        background=torch.tensor([0.1, 0.2, 0.3], dtype=view.dtype))
    cot = torch.randn(out.colors.shape, generator=torch.Generator().manual_seed(5), dtype=view.dtype)
    ((out.colors * cot).sum() + out.alpha.sum() + 0.1 * out.depth.sum()).backward()
    return out, [torch.nan_to_num(p.grad) for p in leaves]


@needs_compiled
@pytest.mark.parametrize("degree", [None, 0, 1, 3])
def test_rasterize_matches_the_compiled_kernels(degree, monkeypatch):
    params, view, K = raster_scene(degree=degree, seed=degree or 0)
    compiled, compiled_grads = render_with_grads(params, view, K, degree)
    _backend._load.cache_clear()
    _backend.warn_fallback.cache_clear()
    monkeypatch.setattr(_backend, "_import_extension", lambda: (_ for _ in ()).throw(ImportError(CAUSE)))
    try:
        assert isinstance(_backend.kernels(torch.device("cpu")), _backend._PyTorchKernels)
        fallback, fallback_grads = render_with_grads(params, view, K, degree)
    finally:
        monkeypatch.undo()
        _backend._load.cache_clear()
        _backend.warn_fallback.cache_clear()
    for name in ("colors", "alpha", "depth", "contributions"):
        torch.testing.assert_close(getattr(fallback, name), getattr(compiled, name), atol=2e-4, rtol=1e-4)
    assert torch.equal(fallback.pixel_counts, compiled.pixel_counts)
    for a, b in zip(fallback_grads, compiled_grads):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


def test_rasterize_fallback_on_empty_scenes_and_views(no_extension):
    # gradients: test_rasterize_matches_the_compiled_kernels (the compiled ones pass gradcheck in test_raster)
    _params, view, K = raster_scene()
    empty = ops.rasterize(torch.zeros(0, 3), torch.zeros(0, 4), torch.zeros(0, 3), torch.zeros(0), torch.zeros(0, 3),
                          view[:1], K[:1], 20, 16, return_contributions=True)
    assert empty.colors.abs().sum() == 0 and empty.alpha.abs().sum() == 0 and empty.contributions.shape == (1, 0)
    params, _view, _K = raster_scene(n=5, degree=None)
    none = ops.rasterize(*params, view[:0], K[:0], 20, 16, return_contributions=True)
    assert none.colors.shape == (0, 16, 20, 3) and none.contributions.shape == (0, 5)


def test_a_kernel_without_a_pure_pytorch_path_is_one_line_naming_torch_and_pip(no_extension, caplog):
    caplog.set_level(logging.WARNING, logger=_backend.logger.name)
    with pytest.raises(ops.ExtensionNotBuiltError) as err:
        _backend.kernels(torch.device("cpu")).no_such_kernel
    msg = str(err.value)
    assert "\n" not in msg and "no_such_kernel has no pure-PyTorch path" in msg and CAUSE in msg
    if BUILT_FOR is not None:
        assert f"built for torch {BUILT_FOR}" in msg and f"pip install torch=={BUILT_FOR}" in msg
    assert backend_warnings(caplog) == []  # the error line says it all: no warning before it
    with pytest.raises(ops.ExtensionNotBuiltError, match="pip install torch=="):
        compiled_rans.rans_encode(torch.zeros(3, dtype=torch.int64).numpy(), torch.tensor([4]).numpy(), 2, 1)


def test_an_unbuilt_checkout_is_told_to_build(no_extension, monkeypatch):
    monkeypatch.setattr(_backend, "_extension_file", lambda: None)
    info = ops.build_info()
    assert info["compiled"] is False and "not built" in info["hint"] and "make build" in info["hint"]


def test_the_build_torch_is_read_from_the_extension_file(tmp_path):
    f = tmp_path / "_C.so"
    f.write_bytes(b"\x7fELF...\x00libc10.so\x00" + b"\x002.13.0+cpu\x00torch_abi_version\x00more")
    assert _backend.built_for(f) == ("2.13.0+cpu", False)
    f.write_bytes(b"\x00libc10_cuda.so\x00\x002.14.1\x00torch_abi_version\x00")
    assert _backend.built_for(f) == ("2.14.1", True)
    f.write_bytes(b"stripped")
    assert _backend.built_for(f) == (None, False)
    assert _backend.built_for(tmp_path / "missing.so") == (None, False)


def test_the_kernel_namespace_has_every_kernel(no_extension):
    space = _backend.kernels(torch.device("cpu"))
    for name in ("topk_route_fwd", "topk_route_bwd", "routing_plan", "dispatch_fwd", "combine_fwd", "combine_bwd",
                 "nearest_center_fwd", "segment_moments_fwd", "segment_moments_bwd", "project_fwd", "project_bwd",
                 "sh_fwd", "sh_bwd", "rasterize_fwd", "rasterize_bwd"):
        assert callable(getattr(space, name)), name
