"""Routing ops vs their pure-PyTorch references: values, gradients, edge cases, errors."""

import pytest
import torch

from visionmoe import ops
from visionmoe.ops import _torch_ref as ref

TOL = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def tie_free_logits(T, E, dtype, device):
    """Logits whose per-row values are distinct and exact in every dtype (no top-k ties)."""
    rows = [torch.randperm(E) for _ in range(T)]
    base = (torch.stack(rows) if rows else torch.zeros(0, E)).to(torch.float32) * 0.25 - E / 8
    return base.to(dtype=dtype, device=device)


def random_mask(T, E, device, kind):
    if kind == "none":
        return None
    if kind == "vector":
        mask = torch.rand(E) > 0.4
        mask[E // 2] = True
        return mask.to(device)
    mask = torch.rand(T, E) > 0.5
    mask[torch.arange(T), torch.randint(0, E, (T,))] = True  # every token keeps one expert
    return mask.to(device)


# ----------------------------------------------------------------------------- topk_route


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,E,k", [(0, 4, 2), (1, 1, 1), (37, 4, 1), (37, 8, 2), (130, 8, 8), (65, 16, 3)])
@pytest.mark.parametrize("mask_kind", ["none", "vector", "matrix"])
@pytest.mark.parametrize("normalize", [True, False])
def test_topk_route_matches_reference(device, dtype, T, E, k, mask_kind, normalize):
    logits = tie_free_logits(T, E, dtype, device)
    mask = random_mask(T, E, device, mask_kind)
    got = ops.topk_route(logits, k, mask, normalize=normalize)
    want = ref.topk_route(logits, k, mask, normalize=normalize)
    assert torch.equal(got.indices, want.indices)
    torch.testing.assert_close(got.weights, want.weights, **TOL[dtype])
    torch.testing.assert_close(got.probs, want.probs, **TOL[dtype])
    torch.testing.assert_close(got.aux_loss, want.aux_loss, **TOL[dtype])
    torch.testing.assert_close(got.z_loss, want.z_loss, **TOL[dtype])


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_topk_route_backward_matches_reference(device, dtype, normalize):
    T, E, k = 53, 8, 3
    logits = tie_free_logits(T, E, dtype, device) + 0.01 * torch.randn(T, E, dtype=dtype, device=device)
    mask = random_mask(T, E, device, "matrix")
    cot_w = torch.randn(T, k, dtype=dtype, device=device)
    grads = []
    for impl in (ops, ref):
        x = logits.clone().requires_grad_(True)
        out = impl.topk_route(x, k, mask, normalize=normalize)
        loss = (out.weights * cot_w).sum() + 0.3 * out.aux_loss + 0.7 * out.z_loss
        (g,) = torch.autograd.grad(loss, x)
        grads.append(g)
    torch.testing.assert_close(grads[0], grads[1], **TOL[dtype])


@pytest.mark.parametrize("normalize", [True, False])
def test_topk_route_gradcheck(device, normalize):
    logits = torch.randn(6, 5, dtype=torch.float64, device=device, requires_grad=True)
    mask = torch.tensor([True, True, False, True, True], device=device)
    cot = torch.randn(6, 2, dtype=torch.float64, device=device)

    def f(x):
        out = ops.topk_route(x, 2, mask, normalize=normalize)
        return (out.weights * cot).sum() + out.aux_loss + out.z_loss, out.probs

    assert torch.autograd.gradcheck(f, (logits,))


def test_masked_expert_never_selected(device):
    T, E = 500, 6
    logits = torch.randn(T, E, device=device) * 5
    mask = random_mask(T, E, device, "matrix")
    out = ops.topk_route(logits, 3, mask)
    valid = out.indices >= 0
    picked_allowed = mask.gather(1, out.indices.clamp(min=0))
    assert bool(picked_allowed[valid].all())
    assert bool((out.probs[~mask] == 0).all())
    # Slots beyond a token's allowed experts are empty: index -1, weight 0.
    allowed = mask.sum(1)
    assert torch.equal(valid.sum(1), allowed.clamp(max=3))
    assert bool((out.weights[~valid] == 0).all())
    torch.testing.assert_close(out.weights.sum(1), torch.ones(T, device=device))


def test_all_masked_token_is_an_error(device):
    logits = torch.randn(4, 3, device=device)
    mask = torch.ones(4, 3, dtype=torch.bool, device=device)
    mask[2] = False
    with pytest.raises(ValueError, match="token 2"):
        ops.topk_route(logits, 1, mask)
    with pytest.raises(ValueError, match="every expert"):
        ops.topk_route(logits, 1, torch.zeros(3, dtype=torch.bool, device=device))


def test_topk_route_non_contiguous_logits(device):
    logits = torch.randn(8, 31, device=device).t()  # [31, 8] view, not contiguous
    assert not logits.is_contiguous()
    got = ops.topk_route(logits, 2)
    want = ref.topk_route(logits.contiguous(), 2)
    assert torch.equal(got.indices, want.indices)
    torch.testing.assert_close(got.weights, want.weights)


def test_balanced_routing_has_unit_aux_loss():
    # Each expert gets the same share of tokens and of probability: E * sum f P = 1.
    logits = torch.eye(4).repeat(25, 1) * 10
    out = ops.topk_route(logits, 1)
    torch.testing.assert_close(out.aux_loss, torch.tensor(1.0))


@pytest.mark.parametrize(
    "call,exc,pattern",
    [
        (lambda: ops.topk_route(torch.randn(5), 1), ValueError, r"logits must have 2 dimensions, got shape \(5,\)"),
        (lambda: ops.topk_route(torch.randint(0, 3, (4, 3)), 1), TypeError, "logits must have dtype"),
        (lambda: ops.topk_route(torch.randn(4, 3), 0), ValueError, r"k must be an int in \[1, 3\]"),
        (lambda: ops.topk_route(torch.randn(4, 3), 4), ValueError, r"k must be an int in \[1, 3\]"),
        (lambda: ops.topk_route(torch.randn(4, 0), 1), ValueError, "at least one expert"),
        (lambda: ops.topk_route(torch.randn(4, 3), 1, torch.ones(5, dtype=torch.bool)), ValueError,
         r"prior_mask must have shape \(3,\) or \(4, 3\), got \(5,\)"),
        (lambda: ops.topk_route(torch.randn(4, 3), 1, torch.ones(3)), TypeError, "prior_mask must have dtype in \\(bool\\)"),
        (lambda: ops.topk_route([[1.0]], 1), TypeError, "logits must be a torch.Tensor"),
        (lambda: ops.topk_route(torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), 1), ValueError, "logits contain NaN .*token 1"),
    ],
)
def test_topk_route_bad_arguments(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# ----------------------------------------------------------------------------- dispatch / combine


def random_indices(T, E, k, device, drop=0.1):
    idx = torch.stack([torch.randperm(E)[:k] for _ in range(T)]) if T else torch.zeros(0, k, dtype=torch.long)
    idx[torch.rand(idx.shape) < drop] = -1
    return idx.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,E,k,D", [(0, 3, 2, 4), (1, 1, 1, 1), (41, 1, 1, 7), (64, 8, 2, 16), (100, 5, 5, 3)])
def test_dispatch_combine_match_reference(device, dtype, T, E, k, D):
    x = torch.randn(T, D, device=device).to(dtype)
    idx = random_indices(T, E, k, device)
    w = torch.rand(T, k, device=device).to(dtype)
    buf, plan = ops.dispatch(x, idx, E)
    buf_ref, plan_ref = ref.dispatch(x, idx, E)
    assert torch.equal(plan.order, plan_ref.order)
    assert torch.equal(plan.position, plan_ref.position)
    assert torch.equal(plan.offsets, plan_ref.offsets)
    assert torch.equal(buf, buf_ref)
    y = torch.randn(buf.shape, device=device).to(dtype)
    torch.testing.assert_close(ops.combine(y, w, idx, E), ref.combine(y, w, idx, E), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dispatch_combine_backward_matches_reference(device, dtype):
    T, E, k, D = 70, 6, 2, 9
    idx = random_indices(T, E, k, device)
    x0 = torch.randn(T, D, dtype=dtype, device=device)
    w0 = torch.rand(T, k, dtype=dtype, device=device)
    cot = torch.randn(T, D, dtype=dtype, device=device)
    lin = torch.randn(D, D, dtype=dtype, device=device)
    grads = []
    for impl in (ops, ref):
        x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        buf, _ = impl.dispatch(x, idx, E)
        out = impl.combine(torch.tanh(buf @ lin), w, idx, E)
        grads.append(torch.autograd.grad((out * cot).sum(), (x, w)))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **TOL[dtype])


def test_dispatch_and_combine_are_adjoint(device):
    T, E, k, D = 50, 4, 2, 5
    idx = random_indices(T, E, k, device)
    x = torch.randn(T, D, dtype=torch.float64, device=device)
    buf, plan = ops.dispatch(x, idx, E)
    y = torch.randn_like(buf)
    ones = torch.ones(T, k, dtype=torch.float64, device=device)
    lhs = (buf * y).sum()
    rhs = (x * ops.combine(y, ones, None, plan=plan)).sum()
    torch.testing.assert_close(lhs, rhs)


def test_dispatch_combine_gradcheck(device):
    T, E, k, D = 7, 3, 2, 3
    idx = random_indices(T, E, k, device, drop=0.2)
    x = torch.randn(T, D, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.rand(T, k, dtype=torch.float64, device=device, requires_grad=True)

    def f(x, w):
        buf, plan = ops.dispatch(x, idx, E)
        return ops.combine(buf.sin(), w, None, plan=plan)

    assert torch.autograd.gradcheck(f, (x, w))


def test_moe_apply_matches_reference_and_plan_reuse(device):
    T, E, D = 90, 4, 6
    x = torch.randn(T, D, device=device)
    route = ops.topk_route(torch.randn(T, E, device=device), 2)
    experts = [torch.nn.Linear(D, D).to(device) for _ in range(E)]
    got = ops.moe_apply(x, route.weights, route.indices, experts)
    want = ref.moe_apply(x, route.weights, route.indices, experts)
    torch.testing.assert_close(got, want)
    assert torch.equal(ops.routing_plan(route.indices, E).counts, torch.bincount(route.indices.flatten(), minlength=E))


def test_dispatch_non_contiguous_input(device):
    x = torch.randn(6, 20, device=device).t()  # [20, 6] non-contiguous
    idx = random_indices(20, 3, 2, device)
    torch.testing.assert_close(ops.dispatch(x, idx, 3)[0], ref.dispatch(x, idx, 3)[0])


@pytest.mark.parametrize(
    "call,exc,pattern",
    [
        (lambda: ops.dispatch(torch.randn(4, 2), torch.tensor([[0], [1], [5], [0]]), 3), ValueError,
         r"indices must lie in \[-1, 2\]"),
        (lambda: ops.dispatch(torch.randn(4, 2), torch.tensor([[0.0]] * 4), 3), TypeError, "indices must have dtype in \\(int64\\)"),
        (lambda: ops.dispatch(torch.randn(3, 2), torch.tensor([[0], [1], [2], [0]]), 3), ValueError,
         "the routing has 4 tokens but the input has 3 rows"),
        (lambda: ops.dispatch(torch.randn(4), torch.tensor([[0]] * 4), 3), ValueError, "x must have 2 dimensions"),
        (lambda: ops.combine(torch.randn(3, 2), torch.ones(4, 1), torch.tensor([[0], [1], [2], [0]]), 3), ValueError,
         "y must have 4 rows"),
        (lambda: ops.combine(torch.randn(4, 2), torch.ones(4, 2), torch.tensor([[0], [1], [2], [0]]), 3), ValueError,
         r"weights must have shape \(4, 1\)"),
        (lambda: ops.combine(torch.randn(4, 2), torch.ones(4, 1, dtype=torch.float64), torch.tensor([[0], [1], [2], [0]]), 3),
         TypeError, "must share one dtype"),
        (lambda: ops.dispatch(torch.randn(4, 2), torch.tensor([[0]] * 4), 0), ValueError, "num_experts must be a positive int"),
    ],
)
def test_dispatch_combine_bad_arguments(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# ----------------------------------------------------------------------------- nearest_center


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("N,C,D,chunk", [(0, 3, 2, None), (1, 1, 1, None), (500, 17, 5, 64), (333, 64, 45, None)])
def test_nearest_center_matches_reference(device, dtype, N, C, D, chunk):
    points = torch.randn(N, D, device=device).to(dtype)
    centers = torch.randn(C, D, device=device).to(dtype)
    index, dist = ops.nearest_center(points, centers, chunk=chunk)
    want_index, want_dist = ref.nearest_center(points.double(), centers.double())
    assert index.dtype == torch.int64 and dist.dtype == dtype
    # The chosen centre is a nearest one (indices may differ only on exact/near ties).
    chosen = (points.double() - centers.double()[index]).pow(2).sum(-1)
    torch.testing.assert_close(chosen, want_dist, atol=1e-4, rtol=1e-4)
    agree = (index == want_index).float().mean() if N else torch.tensor(1.0)
    assert agree > 0.99
    torch.testing.assert_close(dist.double(), want_dist, **{**TOL[dtype], "atol": max(TOL[dtype]["atol"], 1e-4)})


def test_nearest_center_non_contiguous(device):
    points = torch.randn(7, 200, device=device).t()
    centers = torch.randn(7, 9, device=device).t()
    got = ops.nearest_center(points, centers)
    want = ref.nearest_center(points, centers)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


@pytest.mark.parametrize(
    "call,exc,pattern",
    [
        (lambda: ops.nearest_center(torch.randn(5, 3), torch.randn(4, 2)), ValueError, "share the feature dimension"),
        (lambda: ops.nearest_center(torch.randn(5, 3), torch.randn(0, 3)), ValueError, "at least one centre"),
        (lambda: ops.nearest_center(torch.randn(5, 3), torch.randn(2, 3).double()), TypeError, "must share one dtype"),
        (lambda: ops.nearest_center(torch.randn(5), torch.randn(2, 3)), ValueError, "points must have 2 dimensions"),
    ],
)
def test_nearest_center_bad_arguments(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# ----------------------------------------------------------------------------- segment_moments


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("N,D,S", [(0, 3, 4), (1, 1, 1), (200, 3, 17), (300, 7, 50)])
def test_segment_moments_match_reference(device, dtype, N, D, S):
    x = torch.randn(N, D, dtype=dtype, device=device) + 3
    w = torch.rand(N, dtype=dtype, device=device)
    seg = torch.randint(0, S, (N,), device=device)
    if N > 2:
        w[seg == seg[0]] = 0  # a zero-weight segment
    got = ops.segment_moments(x, w, seg, S)
    want = ref.segment_moments(x, w, seg, S)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, **TOL[dtype])


def test_segment_moments_recover_gaussian_mixture_merge():
    # Moment matching: the merge of samples drawn around a known mean/cov recovers them.
    gen = torch.Generator().manual_seed(1)
    L = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.7, 0.0], [0.1, -0.3, 0.4]], dtype=torch.float64)
    x = torch.randn(20000, 3, generator=gen, dtype=torch.float64) @ L.T + torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    out = ops.segment_moments(x, torch.ones(20000, dtype=torch.float64), torch.zeros(20000, dtype=torch.long), 1)
    torch.testing.assert_close(out.mean[0], torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), atol=0.03, rtol=0)
    torch.testing.assert_close(out.cov[0], L @ L.T, atol=0.03, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_segment_moments_backward_matches_reference(device, dtype):
    N, D, S = 120, 4, 9
    seg = torch.randint(0, S, (N,), device=device)
    x0 = torch.randn(N, D, dtype=dtype, device=device)
    w0 = torch.rand(N, dtype=dtype, device=device)
    cots = [torch.randn(S, dtype=dtype, device=device), torch.randn(S, D, dtype=dtype, device=device),
            torch.randn(S, D, D, dtype=dtype, device=device)]
    grads = []
    for impl in (ops, ref):
        x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        out = impl.segment_moments(x, w, seg, S)
        loss = sum((o * c).sum() for o, c in zip(out, cots))
        grads.append(torch.autograd.grad(loss, (x, w)))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **TOL[dtype])


def test_segment_moments_gradcheck(device):
    seg = torch.tensor([0, 0, 1, 1, 1, 3], device=device)
    x = torch.randn(6, 2, dtype=torch.float64, device=device, requires_grad=True)
    w = (torch.rand(6, dtype=torch.float64, device=device) + 0.1).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, w: tuple(ops.segment_moments(x, w, seg, 4)), (x, w))


@pytest.mark.parametrize(
    "call,exc,pattern",
    [
        (lambda: ops.segment_moments(torch.randn(4, 2), -torch.ones(4), torch.zeros(4, dtype=torch.long), 1), ValueError,
         "non-negative"),
        (lambda: ops.segment_moments(torch.randn(4, 2), torch.ones(4), torch.tensor([0, 1, 2, 3]), 3), ValueError,
         r"segment_ids must lie in \[0, 2\]"),
        (lambda: ops.segment_moments(torch.randn(4, 2), torch.ones(3), torch.zeros(4, dtype=torch.long), 1), ValueError,
         r"weights must have shape \(4,\), got \(3,\)"),
        (lambda: ops.segment_moments(torch.randn(4, 2), torch.ones(4), torch.zeros(4), 1), TypeError,
         "segment_ids must have dtype in \\(int64\\)"),
    ],
)
def test_segment_moments_bad_arguments(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# ----------------------------------------------------------------------------- extension loading
# (without the extension: test_backend_fallback.py)


def test_build_info_reports_compiled_parts():
    info = ops.build_info()
    assert info["compiled"] and info["cpu"] and info["openmp"]
    assert isinstance(info["cuda"], bool) and info["openmp_threads"] >= 1
    if info["cuda"]:
        assert info["cuda_archs"]
