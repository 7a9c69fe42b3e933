"""The rasteriser's kernels of ``visionmoe._C`` in pure PyTorch (csrc/raster/raster.h: same names,
arguments and results), tile by tile: what :mod:`visionmoe.ops._backend` hands out when the
extension cannot load. Memory stays per tile (256 pixels x the Gaussians listed there), so
scenes of real size render, seconds per view where the compiled kernel takes milliseconds.

Each forward follows the semantics of :mod:`visionmoe.ops.raster` (the dense
``_torch_ref`` written out tile by tile); each backward recomputes its forward under autograd
(per tile for compositing) and returns the gradients the compiled backward returns."""

from __future__ import annotations

import torch

from .sh import sh_basis

TILE = 16
ALPHA_MIN, ALPHA_MAX, T_MIN = 1.0 / 255.0, 0.99, 1e-4


# --------------------------------------------------------------------------- projection


def _rotmat(quats: torch.Tensor) -> torch.Tensor:
    w, x, y, z = (quats / quats.norm(dim=-1, keepdim=True)).unbind(-1)
    R = torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                     2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                     2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], dim=-1)
    return R.reshape(*quats.shape[:-1], 3, 3)


def _project(means, quats, log_scales, viewmats, Ks, width, height):
    """EWA projection (the same formulas as ``_torch_ref.project``) -> means2d, conics, depths,
    per-axis radii (float) and whether each is on screen, before the finiteness/depth culling."""
    M = _rotmat(quats) * log_scales.exp()[:, None, :]
    covars = M @ M.transpose(-1, -2)
    Rv, tv = viewmats[:, :3, :3], viewmats[:, :3, 3]
    pc = torch.einsum("cij,nj->cni", Rv, means) + tv[:, None, :]
    sc = torch.einsum("cij,njk,clk->cnil", Rv, covars, Rv)
    x, y, z = pc.unbind(-1)
    fx, fy, cx, cy = Ks[:, 0, 0, None], Ks[:, 1, 1, None], Ks[:, 0, 2, None], Ks[:, 1, 2, None]
    lim_x, lim_y = 0.3 * 0.5 * width / fx, 0.3 * 0.5 * height / fy
    tx = z * torch.clamp(x / z, min=-(cx / fx + lim_x), max=(width - cx) / fx + lim_x)
    ty = z * torch.clamp(y / z, min=-(cy / fy + lim_y), max=(height - cy) / fy + lim_y)
    O = torch.zeros_like(z)
    J = torch.stack([fx / z, O, -fx * tx / z**2, O, fy / z, -fy * ty / z**2], dim=-1).reshape(*z.shape, 2, 3)
    cov2d = J @ sc @ J.transpose(-1, -2)
    a, c = cov2d[..., 0, 0] + 0.3, cov2d[..., 1, 1] + 0.3
    b = 0.5 * (cov2d[..., 0, 1] + cov2d[..., 1, 0])
    det = (a * c - b * b).clamp(min=1e-10)
    conics = torch.stack([c / det, -b / det, a / det], dim=-1)
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)
    radius = torch.stack([torch.ceil(3.33 * a.sqrt()), torch.ceil(3.33 * c.sqrt())], dim=-1)
    return means2d, conics, z, radius


def _finite_rows(*tensors) -> torch.Tensor:
    ok = None
    for t in tensors:
        row = torch.isfinite(t.reshape(t.shape[0], int(t[0].numel()) if t.shape[0] else 0)).all(dim=1)
        ok = row if ok is None else ok & row
    return ok


def _safe(means, quats, log_scales, valid):
    """Harmless values where a Gaussian is excluded, so no NaN reaches outputs or gradients."""
    v = valid[:, None]
    return (torch.where(v, means, torch.zeros_like(means)),
            torch.where(v, quats, quats.new_tensor([1.0, 0.0, 0.0, 0.0]).expand_as(quats)),
            torch.where(v, log_scales, torch.zeros_like(log_scales)))


def project_fwd(means, quats, log_scales, opacities, features, viewmats, Ks, width, height, near, far):
    valid = _finite_rows(means, quats, log_scales, opacities, features) & (quats.norm(dim=-1) > 0)
    means2d, conics, depths, radius = _project(*_safe(means, quats, log_scales, valid), viewmats, Ks, width, height)
    ok = valid[None] & (depths > near) & (depths < far) & torch.isfinite(radius).all(-1)
    ok &= torch.isfinite(means2d).all(-1) & torch.isfinite(conics).all(-1)
    ok &= (means2d[..., 0] + radius[..., 0] > 0) & (means2d[..., 0] - radius[..., 0] < width)
    ok &= (means2d[..., 1] + radius[..., 1] > 0) & (means2d[..., 1] - radius[..., 1] < height)
    radii = torch.where(ok[..., None], radius.clamp(max=2.0**30), torch.zeros_like(radius)).int()
    bad = ~valid[None].expand_as(ok)  # non-finite Gaussians: zeros, as the kernel gives them
    return (means2d.masked_fill(bad[..., None], 0), conics.masked_fill(bad[..., None], 0), depths.masked_fill(bad, 0),
            radii)


def project_bwd(means, quats, log_scales, viewmats, Ks, width, height, radii, v_means2d, v_conics, v_depths):
    visible = (radii > 0).all(-1)
    valid = visible.any(dim=0)
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (means, quats, log_scales)]
        m2, con, z, _ = _project(*_safe(*leaves, valid), viewmats, Ks, width, height)
        outs = [m2, con, z]
        cots = [torch.where(visible[..., None], v_means2d, 0), torch.where(visible[..., None], v_conics, 0),
                torch.where(visible, v_depths, 0)]
        grads = torch.autograd.grad(outs, leaves, cots, allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else torch.nan_to_num(g) for g, t in zip(grads, leaves))


# --------------------------------------------------------------------------- spherical harmonics


def _sh_colors(sh, means, viewmats, degree):
    Rv, tv = viewmats[:, :3, :3], viewmats[:, :3, 3]
    dirs = means[None] - (-torch.einsum("cji,cj->ci", Rv, tv))[:, None]
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    nb = (degree + 1) ** 2
    return (torch.einsum("cnk,nkd->cnd", sh_basis(degree, dirs), sh[:, :nb]) + 0.5).clamp(min=0)


def sh_fwd(sh, means, viewmats, radii, degree):
    visible = (radii > 0).all(-1)
    safe_means = torch.where(visible.any(0)[:, None], means, torch.zeros_like(means))
    colors = _sh_colors(torch.nan_to_num(sh), safe_means, viewmats, degree)
    return torch.where(visible[..., None], colors, torch.zeros_like(colors))


def sh_bwd(sh, means, viewmats, radii, degree, v_colors):
    visible = (radii > 0).all(-1)
    with torch.enable_grad():
        s, m = sh.detach().requires_grad_(), means.detach().requires_grad_()
        colors = _sh_colors(s, m, viewmats, degree)
        v_sh, v_means = torch.autograd.grad(colors, (s, m), torch.where(visible[..., None], v_colors, 0),
                                            allow_unused=True)  # degree 0 does not depend on the means
    return torch.nan_to_num(v_sh), (torch.zeros_like(means) if v_means is None else torch.nan_to_num(v_means))


# --------------------------------------------------------------------------- compositing


def _tile_lists(means2d, radii, depths, width, height):
    """Per camera, the Gaussians of every tile, front to back (ties by index) -> offsets
    [C*T+1], ids [E] (Gaussian index), the count of tiles per row."""
    C, N = depths.shape
    tx_n, ty_n = -(-width // TILE), -(-height // TILE)
    T = tx_n * ty_n
    ids, offs = [], [torch.zeros(1, dtype=torch.int64, device=depths.device)]
    for c in range(C):
        vis = (radii[c] > 0).all(-1).nonzero().squeeze(1)
        m, r = means2d[c, vis].detach(), radii[c, vis].to(means2d.dtype)
        t0 = torch.floor((m - r) / TILE).clamp(min=0)
        t1 = torch.minimum(torch.ceil((m + r) / TILE), m.new_tensor([tx_n, ty_n]))
        nx, ny = (t1[:, 0] - t0[:, 0]).clamp(min=0).long(), (t1[:, 1] - t0[:, 1]).clamp(min=0).long()
        count = nx * ny
        g = vis.repeat_interleave(count)
        k = torch.arange(int(count.sum()), device=depths.device) - (count.cumsum(0) - count).repeat_interleave(count)
        rows = torch.arange(len(vis), device=depths.device).repeat_interleave(count)
        tile = (t0[rows, 1].long() + k // nx[rows]) * tx_n + t0[rows, 0].long() + k % nx[rows]
        order = torch.argsort(depths[c, g].detach(), stable=True)  # g ascends: ties keep index order
        order = order[torch.argsort(tile[order], stable=True)]
        ids.append(g[order])
        offs.append(torch.bincount(tile, minlength=T).cumsum(0) + offs[-1][-1])
    ids = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64, device=depths.device)
    return torch.cat(offs), ids.int(), tx_n


def _tile_pixels(t: int, tx_n: int, width: int, height: int, dtype, device):
    x0, y0 = (t % tx_n) * TILE, (t // tx_n) * TILE
    ys, xs = torch.meshgrid(torch.arange(y0, min(y0 + TILE, height), device=device),
                            torch.arange(x0, min(x0 + TILE, width), device=device), indexing="ij")
    return ys.reshape(-1), xs.reshape(-1), (xs.reshape(-1) + 0.5).to(dtype), (ys.reshape(-1) + 0.5).to(dtype)


def _composite(m2, con, col, op, dep, px, py):
    """One tile: [n] Gaussians front to back over [P] pixels -> colour [P,3], transmittance [P],
    depth sum [P], weights [P,n], included [P,n]."""
    dx, dy = m2[None, :, 0] - px[:, None], m2[None, :, 1] - py[:, None]
    power = -0.5 * (con[None, :, 0] * dx * dx + con[None, :, 2] * dy * dy) - con[None, :, 1] * dx * dy
    alpha = torch.clamp(op[None, :] * torch.exp(torch.clamp(power, max=0.0)), max=ALPHA_MAX)
    keep = (power <= 0) & (alpha >= ALPHA_MIN)
    alpha = torch.where(keep, alpha, torch.zeros_like(alpha))
    included = keep & (torch.cumprod(1 - alpha.detach(), dim=1) >= T_MIN)
    alpha = torch.where(included, alpha, torch.zeros_like(alpha))
    one_minus = 1 - alpha
    before = torch.cat([torch.ones_like(one_minus[:, :1]), torch.cumprod(one_minus, dim=1)[:, :-1]], dim=1)
    w = alpha * before
    return w @ col, torch.prod(one_minus, dim=1), w @ dep, w, included


def _tiles(offsets, ids, c, T):
    base = c * T
    for t in (offsets[base + 1: base + T + 1] > offsets[base: base + T]).nonzero().squeeze(1).tolist():
        yield t, ids[int(offsets[base + t]): int(offsets[base + t + 1])].long()


def rasterize_fwd(means2d, conics, colors, opacities, depths, radii, width, height, want_contributions):
    C, N = depths.shape
    dtype, dev = means2d.dtype, means2d.device
    color, trans = means2d.new_zeros(C, height, width, 3), means2d.new_ones(C, height, width)
    depth_acc = means2d.new_zeros(C, height, width)
    contrib = means2d.new_zeros(C, N) if want_contributions else means2d.new_zeros(0)
    counts = torch.zeros(C, N, dtype=torch.int32, device=dev) if want_contributions else torch.zeros(0, dtype=torch.int32)
    offsets, ids, tx_n = _tile_lists(means2d, radii, depths, width, height)
    T = tx_n * -(-height // TILE)
    with torch.no_grad():
        for c in range(C):
            for t, g in _tiles(offsets, ids, c, T):
                ys, xs, px, py = _tile_pixels(t, tx_n, width, height, dtype, dev)
                col, tr, dsum, w, inc = _composite(means2d[c, g], conics[c, g], colors[c, g], opacities[g],
                                                   depths[c, g], px, py)
                color[c, ys, xs], trans[c, ys, xs], depth_acc[c, ys, xs] = col, tr, dsum
                if want_contributions:
                    contrib[c].index_add_(0, g, w.sum(0))
                    counts[c].index_add_(0, g, inc.sum(0).int())
    last = torch.zeros(C, height, width, dtype=torch.int32, device=dev)  # unused by this backward
    return color, trans, depth_acc, last, offsets, ids, contrib, counts


def rasterize_bwd(means2d, conics, colors, opacities, depths, width, height, tile_offsets, tile_ids, trans, last,
                  v_color, v_trans, v_depth):
    del trans, last  # recomputed per tile
    C = depths.shape[0]
    tx_n = -(-width // TILE)
    T = tx_n * -(-height // TILE)
    grads = [torch.zeros_like(t) for t in (means2d, conics, colors, opacities, depths)]
    for c in range(C):
        for t, g in _tiles(tile_offsets, tile_ids, c, T):
            ys, xs, px, py = _tile_pixels(t, tx_n, width, height, means2d.dtype, means2d.device)
            with torch.enable_grad():
                leaves = [x.detach().requires_grad_() for x in
                          (means2d[c, g], conics[c, g], colors[c, g], opacities[g], depths[c, g])]
                col, tr, dsum, _, _ = _composite(*leaves, px, py)
                parts = torch.autograd.grad((col, tr, dsum), leaves,
                                            (v_color[c, ys, xs], v_trans[c, ys, xs], v_depth[c, ys, xs]))
            for i, part in enumerate(parts):
                (grads[i] if i == 3 else grads[i][c]).index_add_(0, g, part)
    return tuple(grads)
