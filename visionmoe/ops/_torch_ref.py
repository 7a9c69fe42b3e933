"""Pure-PyTorch references of the compiled ops: same signatures, same semantics, slow.

Tests compare every kernel against these (forward values and autograd gradients). They
are written for clarity, not speed, and use plain autograd for their gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .routing import RouterOutput, RoutingPlan, SegmentMoments, expand_prior_mask


def topk_route(logits, k, prior_mask=None, *, normalize=True) -> RouterOutput:
    T, E = logits.shape
    mask = expand_prior_mask(prior_mask, logits)
    masked = logits.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(masked, dim=1)
    probs = torch.softmax(masked, dim=1) if T else logits.new_zeros(0, E)
    # Masked experts get -1 so that they rank below every allowed one (probabilities >= 0).
    vals, idx = torch.topk(probs.masked_fill(~mask, -1.0), k, dim=1)
    valid = vals >= 0
    idx = torch.where(valid, idx, torch.full_like(idx, -1))
    vals = torch.where(valid, vals, torch.zeros_like(vals))
    weights = vals / vals.sum(dim=1, keepdim=True) if normalize else vals
    if T == 0:
        zero = logits.sum() * 0
        return RouterOutput(weights, idx, zero, zero, probs)
    one_hot = torch.nn.functional.one_hot(idx.clamp(min=0), E) * valid.unsqueeze(-1)
    acc = torch.promote_types(logits.dtype, torch.float32)
    fraction = one_hot.sum(dim=(0, 1)).to(acc) / valid.sum().clamp(min=1)
    aux = E * (fraction * probs.to(acc).mean(dim=0)).sum()
    z = lse.to(acc).pow(2).mean()
    return RouterOutput(weights, idx, aux.to(logits.dtype), z.to(logits.dtype), probs)


def routing_plan(indices, num_experts) -> RoutingPlan:
    flat = indices.reshape(-1)
    key = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)
    order = torch.sort(key, stable=True).indices
    valid = int((flat >= 0).sum())
    order = order[:valid]
    position = torch.full_like(flat, -1)
    position[order] = torch.arange(valid, device=flat.device)
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return RoutingPlan(order, position, offsets, int(indices.shape[1]))


def dispatch(x, indices, num_experts=None, *, plan=None):
    plan = plan or routing_plan(indices, num_experts)
    return x[plan.order // plan.top_k], plan


def combine(y, weights, indices, num_experts=None, *, plan=None):
    plan = plan or routing_plan(indices, num_experts)
    w = weights.reshape(-1)[plan.order].unsqueeze(1)
    out = y.new_zeros(weights.shape[0], y.shape[1])
    return out.index_add(0, plan.order // plan.top_k, y * w)


def moe_apply(x, weights, indices, experts: Sequence[Callable[[torch.Tensor], torch.Tensor]]):
    buffer, plan = dispatch(x, indices, len(experts))
    outputs = [e(c) for e, c in zip(experts, buffer.split(plan.counts.tolist()))]
    return combine(torch.cat(outputs), weights, None, plan=plan)


def nearest_center(points, centers, *, chunk=None):
    chunk = chunk or 4096
    index, dist = [], []
    for block in points.split(chunk):
        d2 = (block.unsqueeze(1) - centers.unsqueeze(0)).pow(2).sum(-1)  # exact differences
        best = d2.min(dim=1)
        index.append(best.indices)
        dist.append(best.values)
    if not index:
        return points.new_zeros(0, dtype=torch.int64), points.new_zeros(0)
    return torch.cat(index), torch.cat(dist)


def segment_moments(x, weights, segment_ids, num_segments) -> SegmentMoments:
    D = x.shape[1]
    wsum = x.new_zeros(num_segments).index_add(0, segment_ids, weights)
    safe = torch.where(wsum > 0, wsum, torch.ones_like(wsum))
    mean = x.new_zeros(num_segments, D).index_add(0, segment_ids, weights[:, None] * x) / safe[:, None]
    mean = mean * (wsum > 0)[:, None]
    d = x - mean[segment_ids]
    outer = weights[:, None, None] * d[:, :, None] * d[:, None, :]
    cov = x.new_zeros(num_segments, D, D).index_add(0, segment_ids, outer) / safe[:, None, None]
    return SegmentMoments(wsum, mean, cov)


# --------------------------------------------------------------------------- rasterisation
# Dense reference of visionmoe.ops.rasterize: every pixel against every Gaussian (memory
# O(H W N) per camera), autograd for gradients. Same semantics as the kernels; see the
# docstring of visionmoe/ops/raster.py.

from .raster import RasterOutput, finish, validate_raster_args  # noqa: E402
from .sh import sh_basis  # noqa: E402 (the SH basis the library uses)


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    """[N, 4] w,x,y,z (any norm) -> [N, 3, 3]."""
    w, x, y, z = (quats / quats.norm(dim=-1, keepdim=True)).unbind(-1)
    R = torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    )
    return R.reshape(*quats.shape[:-1], 3, 3)


def project(means, quats, log_scales, viewmats, Ks, width, height, near=0.01, far=1e10):
    """EWA projection -> means2d [C,N,2], conics [C,N,3], depths [C,N], radii [C,N,2] int32."""
    R = quat_to_rotmat(quats)
    M = R * log_scales.exp()[:, None, :]
    covars = M @ M.transpose(-1, -2)  # [N, 3, 3]
    Rv, tv = viewmats[:, :3, :3], viewmats[:, :3, 3]
    pc = torch.einsum("cij,nj->cni", Rv, means) + tv[:, None, :]  # [C, N, 3]
    sc = torch.einsum("cij,njk,clk->cnil", Rv, covars, Rv)
    x, y, z = pc.unbind(-1)
    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]
    cx, cy = Ks[:, 0, 2, None], Ks[:, 1, 2, None]
    tan_fovx, tan_fovy = 0.5 * width / fx, 0.5 * height / fy
    tx = z * torch.clamp(x / z, min=-(cx / fx + 0.3 * tan_fovx), max=(width - cx) / fx + 0.3 * tan_fovx)
    ty = z * torch.clamp(y / z, min=-(cy / fy + 0.3 * tan_fovy), max=(height - cy) / fy + 0.3 * tan_fovy)
    O = torch.zeros_like(z)
    J = torch.stack([fx / z, O, -fx * tx / z**2, O, fy / z, -fy * ty / z**2], dim=-1).reshape(*z.shape, 2, 3)
    cov2d = J @ sc @ J.transpose(-1, -2)
    a = cov2d[..., 0, 0] + 0.3
    b = 0.5 * (cov2d[..., 0, 1] + cov2d[..., 1, 0])
    c = cov2d[..., 1, 1] + 0.3
    det = (a * c - b * b).clamp(min=1e-10)
    conics = torch.stack([c / det, -b / det, a / det], dim=-1)
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)
    radius = torch.stack([torch.ceil(3.33 * a.sqrt()), torch.ceil(3.33 * c.sqrt())], dim=-1)
    ok = (z > near) & (z < far) & torch.isfinite(radius).all(-1) & torch.isfinite(means2d).all(-1)
    ok &= torch.isfinite(conics).all(-1)
    ok &= (means2d[..., 0] + radius[..., 0] > 0) & (means2d[..., 0] - radius[..., 0] < width)
    ok &= (means2d[..., 1] + radius[..., 1] > 0) & (means2d[..., 1] - radius[..., 1] < height)
    radii = torch.where(ok[..., None], radius.clamp(max=2.0**30), torch.zeros_like(radius)).int()
    return means2d, conics, z, radii


def sh_colors(sh, means, viewmats, degree):
    """[N, K, 3] SH -> [C, N, 3] colours max(SH(dir) + 0.5, 0), dir = mean - camera centre."""
    Rv, tv = viewmats[:, :3, :3], viewmats[:, :3, 3]
    centres = -torch.einsum("cji,cj->ci", Rv, tv)  # -R^T t
    dirs = means[None] - centres[:, None]
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    basis = sh_basis(degree, dirs)  # [C, N, nb]
    nb = (degree + 1) ** 2
    return (torch.einsum("cnk,nkd->cnd", basis, sh[:, :nb]) + 0.5).clamp(min=0)


def rasterize(
    means, quats, log_scales, opacity_logits, colors_or_sh, viewmats, Ks, width, height, *,
    sh_degree=None, near=0.01, far=1e10, background=None, return_contributions=False,
) -> RasterOutput:
    a = validate_raster_args(
        means, quats, log_scales, opacity_logits, colors_or_sh, viewmats, Ks, width, height, sh_degree, near, far,
        background,
    )
    N, C, W, H = a.means.shape[0], a.viewmats.shape[0], a.width, a.height
    feats = a.features.flatten(1)
    valid = (
        torch.isfinite(a.means).all(-1) & torch.isfinite(a.quats).all(-1) & torch.isfinite(a.log_scales).all(-1)
        & torch.isfinite(a.opacity_logits) & torch.isfinite(feats).all(-1) & (a.quats.norm(dim=-1) > 0)
    )
    # Replace excluded Gaussians by harmless values so that no NaN reaches outputs or gradients.
    v1 = valid[:, None]
    means_s = torch.where(v1, a.means, torch.zeros_like(a.means))
    quats_s = torch.where(v1, a.quats, a.quats.new_tensor([1.0, 0.0, 0.0, 0.0]).expand(N, 4))
    scales_s = torch.where(v1, a.log_scales, torch.zeros_like(a.log_scales))
    logits_s = torch.where(valid, a.opacity_logits, torch.zeros_like(a.opacity_logits))
    feats_s = torch.where(valid.view(N, *([1] * (a.features.dim() - 1))), a.features, torch.zeros_like(a.features))
    opac = torch.sigmoid(logits_s)
    means2d, conics, depths, radii = project(means_s, quats_s, scales_s, a.viewmats, a.Ks, W, H, a.near, a.far)
    radii = radii * valid[None, :, None]
    if a.sh_degree is None:
        colors = feats_s.unsqueeze(0).expand(C, N, 3)
    else:
        colors = sh_colors(feats_s, means_s, a.viewmats, a.sh_degree)
    ys, xs = torch.meshgrid(torch.arange(H, device=means.device), torch.arange(W, device=means.device), indexing="ij")
    px = (xs.reshape(-1) + 0.5).to(means.dtype)
    py = (ys.reshape(-1) + 0.5).to(means.dtype)
    tile_x, tile_y = xs.reshape(-1) // 16, ys.reshape(-1) // 16
    out_color, out_trans, out_depth, contribs, counts = [], [], [], [], []
    for c in range(C):
        order = torch.sort(depths[c].detach(), stable=True).indices
        m2, con, r = means2d[c, order], conics[c, order], radii[c, order]
        col, dep, op = colors[c, order], depths[c, order], opac[order]
        # Tile rectangle of every Gaussian (gsplat `_isect_tiles`): [floor((m-r)/16), ceil((m+r)/16)).
        rf = r.to(means.dtype)
        t0 = torch.floor((m2.detach() - rf) / 16)
        t1 = torch.ceil((m2.detach() + rf) / 16)
        in_rect = (
            (tile_x[:, None] >= t0[None, :, 0]) & (tile_x[:, None] < t1[None, :, 0])
            & (tile_y[:, None] >= t0[None, :, 1]) & (tile_y[:, None] < t1[None, :, 1])
            & (r > 0).all(-1)[None, :]
        )  # [P, N]
        dx = m2[None, :, 0] - px[:, None]
        dy = m2[None, :, 1] - py[:, None]
        power = -0.5 * (con[None, :, 0] * dx * dx + con[None, :, 2] * dy * dy) - con[None, :, 1] * dx * dy
        alpha = torch.clamp(op[None, :] * torch.exp(torch.where(in_rect, power, torch.zeros_like(power))), max=0.99)
        keep = in_rect & (power <= 0) & (alpha >= 1.0 / 255.0)
        alpha = torch.where(keep, alpha, torch.zeros_like(alpha))
        # Compositing stops at the first Gaussian that would push the transmittance below 1e-4;
        # the running product is monotone, so "still above" marks exactly the included ones.
        included = keep & (torch.cumprod(1 - alpha.detach(), dim=1) >= 1e-4)
        alpha = torch.where(included, alpha, torch.zeros_like(alpha))
        one_minus = 1 - alpha
        T_before = torch.cat([torch.ones_like(one_minus[:, :1]), torch.cumprod(one_minus, dim=1)[:, :-1]], dim=1)
        w = alpha * T_before  # [P, N]
        out_color.append((w @ col).reshape(H, W, 3))
        out_trans.append(torch.prod(one_minus, dim=1).reshape(H, W))
        out_depth.append((w @ dep).reshape(H, W))
        inv = torch.empty_like(order)
        inv[order] = torch.arange(N, device=order.device)
        contribs.append(w.sum(0)[inv])
        counts.append(included.sum(0)[inv].to(torch.int32))
    color = torch.stack(out_color) if C else means.new_zeros(0, H, W, 3)
    trans = torch.stack(out_trans) if C else means.new_zeros(0, H, W)
    depth_acc = torch.stack(out_depth) if C else means.new_zeros(0, H, W)
    colors_out, alpha_out, depth = finish(color, trans, depth_acc, a.background)
    if not return_contributions:
        return RasterOutput(colors_out, alpha_out, depth, None, None)
    contrib = torch.stack(contribs).detach() if C else means.new_zeros(0, N)
    count = torch.stack(counts) if C else torch.zeros(0, N, dtype=torch.int32)
    return RasterOutput(colors_out, alpha_out, depth, contrib, count)
