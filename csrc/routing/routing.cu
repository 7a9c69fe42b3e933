// CUDA kernels of the routing ops (same semantics as routing_cpu.cpp). Sorting and GEMM
// go through ATen (cub/cuBLAS underneath); the custom kernels fuse what ATen cannot.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAGuard.h>

#include "../include/checks.h"
#include "routing.h"

namespace visionmoe {
namespace cuda {

namespace {
constexpr int kThreads = 256;
inline int64_t blocks_for(int64_t n) { return std::max<int64_t>(1, (n + kThreads - 1) / kThreads); }

template <typename scalar_t>
__global__ void topk_route_fwd_kernel(const scalar_t* __restrict__ logits, const bool* __restrict__ mask,
                                      int64_t ms0, int64_t ms1, int64_t T, int64_t E, int64_t k,
                                      bool normalize, scalar_t* weights, int64_t* indices,
                                      scalar_t* probs, scalar_t* lse, int* bad) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (t >= T) return;
  const scalar_t* row = logits + t * E;
  acc_t mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e)
    if (mask[t * ms0 + e * ms1]) mx = max(mx, acc_t(row[e]));
  if (mx == -INFINITY) {
    atomicExch(bad, 1);
    return;
  }
  acc_t sum = 0;
  for (int64_t e = 0; e < E; ++e)
    if (mask[t * ms0 + e * ms1]) sum += exp(acc_t(row[e]) - mx);
  lse[t] = scalar_t(mx + log(sum));
  for (int64_t e = 0; e < E; ++e)
    probs[t * E + e] = mask[t * ms0 + e * ms1] ? scalar_t(exp(acc_t(row[e]) - mx) / sum) : scalar_t(0);
  acc_t picked = 0;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    acc_t best_p = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (!mask[t * ms0 + e * ms1]) continue;
      bool taken = false;
      for (int64_t q = 0; q < j; ++q) taken |= (indices[t * k + q] == e);
      const acc_t p = probs[t * E + e];
      if (!taken && (best < 0 || p > best_p)) {
        best = e;
        best_p = p;
      }
    }
    if (best < 0) break;
    indices[t * k + j] = best;
    weights[t * k + j] = scalar_t(best_p);
    picked += best_p;
  }
  if (normalize)
    for (int64_t j = 0; j < k; ++j)
      if (indices[t * k + j] >= 0) weights[t * k + j] = scalar_t(acc_t(weights[t * k + j]) / picked);
}

template <typename scalar_t>
__global__ void topk_route_bwd_kernel(const scalar_t* gw, const scalar_t* gp, const scalar_t* gl,
                                      const scalar_t* probs, const scalar_t* weights,
                                      const int64_t* indices, int64_t T, int64_t E, int64_t k,
                                      bool normalize, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (t >= T) return;
  const scalar_t* p = probs + t * E;
  acc_t s_w = 0, s_p = 0;
  if (gw)
    for (int64_t j = 0; j < k; ++j)
      if (indices[t * k + j] >= 0) s_w += acc_t(weights[t * k + j]) * acc_t(gw[t * k + j]);
  if (gp)
    for (int64_t e = 0; e < E; ++e) s_p += acc_t(p[e]) * acc_t(gp[t * E + e]);
  for (int64_t e = 0; e < E; ++e) {
    acc_t g = 0;
    if (gw) {
      for (int64_t j = 0; j < k; ++j)
        if (indices[t * k + j] == e) {
          const acc_t w = weights[t * k + j], gj = gw[t * k + j];
          g += normalize ? w * (gj - s_w) : w * gj;
        }
      if (!normalize) g -= acc_t(p[e]) * s_w;
    }
    if (gp) g += acc_t(p[e]) * (acc_t(gp[t * E + e]) - s_p);
    if (gl) g += acc_t(gl[t]) * acc_t(p[e]);
    out[t * E + e] = scalar_t(g);
  }
}

template <typename scalar_t>
__global__ void dispatch_kernel(const scalar_t* x, const int64_t* order, const scalar_t* scale,
                                int64_t M, int64_t D, int64_t k, scalar_t* out) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= M * D) return;
  const int64_t r = i / D, d = i % D, a = order[r];
  const scalar_t v = x[(a / k) * D + d];
  out[i] = scale ? scalar_t(scale[a] * v) : v;
}

template <typename scalar_t>
__global__ void combine_kernel(const scalar_t* y, const int64_t* position, const scalar_t* w,
                               int64_t T, int64_t D, int64_t k, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t t = i / D, d = i % D;
  acc_t acc = 0;
  for (int64_t s = 0; s < k; ++s) {
    const int64_t r = position[t * k + s];
    if (r >= 0) acc += (w ? acc_t(w[t * k + s]) : acc_t(1)) * acc_t(y[r * D + d]);
  }
  out[i] = scalar_t(acc);
}

template <typename scalar_t>
__global__ void combine_weight_grad_kernel(const scalar_t* g, const scalar_t* y, const int64_t* position,
                                           int64_t T, int64_t D, int64_t k, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t a = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (a >= T * k) return;
  const int64_t r = position[a], t = a / k;
  acc_t dot = 0;
  if (r >= 0)
    for (int64_t d = 0; d < D; ++d) dot += acc_t(g[t * D + d]) * acc_t(y[r * D + d]);
  out[a] = scalar_t(dot);
}

// One warp per row of the score matrix: the lanes read the row coalesced (a thread per row read
// it with a stride of C and ran 5x slower than torch.cdist + argmin on an H200), then a shuffle
// reduction keeps the smallest score, ties to the lowest index (the CPU kernel's rule).
template <typename scalar_t>
__global__ void argmin_rows_kernel(const scalar_t* dots, const scalar_t* cn, const scalar_t* points,
                                   const scalar_t* centers, int64_t n, int64_t C, int64_t D,
                                   int64_t* index, scalar_t* sqdist) {
  const int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= n) return;  // r is the same for every lane of a warp: whole warps leave
  const scalar_t* row = dots + r * C;
  int64_t best = -1;
  scalar_t best_v = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const scalar_t v = cn[c] - 2 * row[c];
    if (best < 0 || v < best_v) {
      best_v = v;
      best = c;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const scalar_t other_v = __shfl_down_sync(0xffffffffu, best_v, offset);
    const int64_t other = __shfl_down_sync(0xffffffffu, best, offset);
    if (other >= 0 && (best < 0 || other_v < best_v || (other_v == best_v && other < best))) {
      best_v = other_v;
      best = other;
    }
  }
  best = __shfl_sync(0xffffffffu, best, 0);
  scalar_t d2 = 0;  // the winner's exact squared distance, lanes splitting the features
  for (int64_t d = lane; d < D; d += 32) {
    const scalar_t diff = points[r * D + d] - centers[best * D + d];
    d2 += diff * diff;
  }
  for (int offset = 16; offset > 0; offset >>= 1) d2 += __shfl_down_sync(0xffffffffu, d2, offset);
  if (lane == 0) {
    index[r] = best;
    sqdist[r] = d2;
  }
}

template <typename scalar_t>
__global__ void segment_moments_kernel(const scalar_t* x, const scalar_t* w, const int64_t* order,
                                       const int64_t* offsets, int64_t S, int64_t D,
                                       scalar_t* wsum, scalar_t* mean, scalar_t* cov) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t s = blockIdx.x;
  if (s >= S) return;
  const int64_t lo = offsets[s], hi = offsets[s + 1];
  acc_t W = 0;
  for (int64_t m = lo; m < hi; ++m) W += acc_t(w[order[m]]);
  if (threadIdx.x == 0) wsum[s] = scalar_t(W);
  if (W <= 0) return;
  // Threads stride over the D means, then over the D*D covariance entries.
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    acc_t mu = 0;
    for (int64_t m = lo; m < hi; ++m) mu += acc_t(w[order[m]]) * acc_t(x[order[m] * D + d]);
    mean[s * D + d] = scalar_t(mu / W);
  }
  __syncthreads();
  for (int64_t ab = threadIdx.x; ab < D * D; ab += blockDim.x) {
    const int64_t a = ab / D, b = ab % D;
    const acc_t ma = mean[s * D + a], mb = mean[s * D + b];
    acc_t c = 0;
    for (int64_t m = lo; m < hi; ++m) {
      const int64_t i = order[m];
      c += acc_t(w[i]) * (acc_t(x[i * D + a]) - ma) * (acc_t(x[i * D + b]) - mb);
    }
    cov[s * D * D + ab] = scalar_t(c / W);
  }
}

template <typename scalar_t>
__global__ void segment_moments_bwd_kernel(const scalar_t* gW, const scalar_t* gM, const scalar_t* gC,
                                           const scalar_t* x, const scalar_t* w, const int64_t* seg,
                                           const scalar_t* wsum, const scalar_t* mean,
                                           const scalar_t* cov, int64_t N, int64_t D,
                                           scalar_t* vx, scalar_t* vw) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= N) return;
  const int64_t s = seg[i];
  const acc_t W = wsum[s];
  acc_t gw = gW ? acc_t(gW[s]) : acc_t(0);
  if (W > 0) {
    const acc_t wi = w[i];
    acc_t extra = 0;
    for (int64_t a = 0; a < D; ++a) {
      const acc_t da = acc_t(x[i * D + a]) - acc_t(mean[s * D + a]);
      acc_t gx = gM ? acc_t(gM[s * D + a]) : acc_t(0);
      if (gM) extra += gx * da;
      if (gC)
        for (int64_t b = 0; b < D; ++b) {
          const acc_t db = acc_t(x[i * D + b]) - acc_t(mean[s * D + b]);
          const acc_t g_ab = gC[s * D * D + a * D + b], g_ba = gC[s * D * D + b * D + a];
          gx += (g_ab + g_ba) * db;
          extra += g_ab * (da * db - acc_t(cov[s * D * D + a * D + b]));
        }
      vx[i * D + a] = scalar_t(wi / W * gx);
    }
    gw += extra / W;
  }
  vw[i] = scalar_t(gw);
}

template <typename T>
const T* opt_ptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
at::Tensor opt_contig(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->contiguous() : at::Tensor();
}
}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> topk_route_fwd(const at::Tensor& logits_in,
                                                                          const at::Tensor& mask,
                                                                          int64_t k, bool normalize) {
  VM_CHECK_CUDA(logits_in);
  VM_CHECK_DIM(logits_in, 2);
  const c10::cuda::CUDAGuard guard(logits_in.device());
  const auto logits = logits_in.contiguous();
  const int64_t T = logits.size(0), E = logits.size(1);
  auto weights = at::zeros({T, k}, logits.options());
  auto indices = at::full({T, k}, -1, logits.options().dtype(at::kLong));
  auto probs = at::zeros({T, E}, logits.options());
  auto lse = at::zeros({T}, logits.options());
  auto bad = at::zeros({1}, logits.options().dtype(at::kInt));
  if (T > 0) {
    VM_DISPATCH_FLOATING(logits.scalar_type(), "topk_route_fwd_cuda", [&] {
      topk_route_fwd_kernel<scalar_t><<<blocks_for(T), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          logits.data_ptr<scalar_t>(), mask.data_ptr<bool>(), mask.stride(0), mask.stride(1), T, E, k,
          normalize, weights.data_ptr<scalar_t>(), indices.data_ptr<int64_t>(), probs.data_ptr<scalar_t>(),
          lse.data_ptr<scalar_t>(), bad.data_ptr<int>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  TORCH_CHECK(bad.item<int>() == 0, "prior_mask masks every expert of at least one token");
  return {weights, indices, probs, lse};
}

at::Tensor topk_route_bwd(const std::optional<at::Tensor>& v_weights, const std::optional<at::Tensor>& v_probs,
                          const std::optional<at::Tensor>& v_lse, const at::Tensor& probs_in,
                          const at::Tensor& weights_in, const at::Tensor& indices_in, bool normalize) {
  const c10::cuda::CUDAGuard guard(probs_in.device());
  const auto probs = probs_in.contiguous(), weights = weights_in.contiguous(), indices = indices_in.contiguous();
  const auto gw = opt_contig(v_weights), gp = opt_contig(v_probs), gl = opt_contig(v_lse);
  const int64_t T = probs.size(0), E = probs.size(1), k = indices.size(1);
  auto out = at::zeros_like(probs);
  if (T > 0) {
    VM_DISPATCH_FLOATING(probs.scalar_type(), "topk_route_bwd_cuda", [&] {
      topk_route_bwd_kernel<scalar_t><<<blocks_for(T), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          opt_ptr<scalar_t>(gw), opt_ptr<scalar_t>(gp), opt_ptr<scalar_t>(gl), probs.data_ptr<scalar_t>(),
          weights.data_ptr<scalar_t>(), indices.data_ptr<int64_t>(), T, E, k, normalize,
          out.data_ptr<scalar_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> routing_plan(const at::Tensor& indices, int64_t num_experts) {
  VM_CHECK_CUDA(indices);
  VM_CHECK_LONG(indices);
  const c10::cuda::CUDAGuard guard(indices.device());
  const auto flat = indices.contiguous().view(-1);
  const int64_t A = flat.numel(), E = num_experts;
  // Dropped slots (-1) sort last under key E; a stable sort keeps token order per expert.
  const auto key = at::where(flat < 0, at::full_like(flat, E), flat);
  const auto sorted = at::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const auto counts = at::bincount(key, /*weights=*/{}, /*minlength=*/E + 1).narrow(0, 0, E);
  auto offsets = at::zeros({E + 1}, flat.options());
  offsets.narrow(0, 1, E).copy_(counts.cumsum(0));
  const int64_t M = offsets[E].item<int64_t>();
  const auto order = std::get<1>(sorted).narrow(0, 0, M).contiguous();
  auto position = at::full({A}, -1, flat.options());
  position.index_put_({order}, at::arange(M, flat.options()));
  return {order, position, offsets};
}

at::Tensor dispatch_fwd(const at::Tensor& x_in, const at::Tensor& order, int64_t k,
                        const std::optional<at::Tensor>& scale_in) {
  VM_CHECK_CUDA(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous();
  const auto scale = opt_contig(scale_in);
  const int64_t M = order.numel(), D = x.size(1);
  auto out = at::empty({M, D}, x.options());
  if (M * D > 0) {
    VM_DISPATCH_FLOATING(x.scalar_type(), "dispatch_fwd_cuda", [&] {
      dispatch_kernel<scalar_t><<<blocks_for(M * D), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          x.data_ptr<scalar_t>(), order.data_ptr<int64_t>(), opt_ptr<scalar_t>(scale), M, D, k,
          out.data_ptr<scalar_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

at::Tensor combine_fwd(const at::Tensor& y_in, const at::Tensor& position, int64_t k,
                       const std::optional<at::Tensor>& weights_in) {
  VM_CHECK_CUDA(y_in);
  const c10::cuda::CUDAGuard guard(y_in.device());
  const auto y = y_in.contiguous();
  const auto w = opt_contig(weights_in);
  const int64_t T = position.numel() / k, D = y.size(1);
  auto out = at::empty({T, D}, y.options());
  if (T * D > 0) {
    VM_DISPATCH_FLOATING(y.scalar_type(), "combine_fwd_cuda", [&] {
      combine_kernel<scalar_t><<<blocks_for(T * D), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          y.data_ptr<scalar_t>(), position.data_ptr<int64_t>(), opt_ptr<scalar_t>(w), T, D, k,
          out.data_ptr<scalar_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> combine_bwd(const at::Tensor& v_out_in, const at::Tensor& y_in,
                                               const at::Tensor& weights_in, const at::Tensor& order,
                                               const at::Tensor& position, int64_t k) {
  const c10::cuda::CUDAGuard guard(y_in.device());
  const auto v_out = v_out_in.contiguous(), y = y_in.contiguous(), weights = weights_in.contiguous();
  auto v_y = dispatch_fwd(v_out, order, k, weights.view(-1));
  auto v_w = at::zeros_like(weights);
  const int64_t T = weights.size(0), D = y.size(1);
  if (T * k > 0) {
    VM_DISPATCH_FLOATING(y.scalar_type(), "combine_bwd_cuda", [&] {
      combine_weight_grad_kernel<scalar_t><<<blocks_for(T * k), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          v_out.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), position.data_ptr<int64_t>(), T, D, k,
          v_w.data_ptr<scalar_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {v_y, v_w};
}

std::tuple<at::Tensor, at::Tensor> nearest_center_fwd(const at::Tensor& points_in, const at::Tensor& centers_in,
                                                      int64_t chunk) {
  VM_CHECK_CUDA(points_in);
  const c10::cuda::CUDAGuard guard(points_in.device());
  const auto compute_type = points_in.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto points = points_in.to(compute_type).contiguous();
  const auto centers = centers_in.to(compute_type).contiguous();
  const int64_t N = points.size(0), C = centers.size(0), D = points.size(1);
  auto index = at::empty({N}, points.options().dtype(at::kLong));
  auto sqdist = at::empty({N}, points.options());
  const auto cn = centers.pow(2).sum(1).contiguous();
  chunk = std::max<int64_t>(1, chunk);
  for (int64_t start = 0; start < N; start += chunk) {
    const int64_t n = std::min(chunk, N - start);
    const auto block = points.narrow(0, start, n);
    const auto dots = at::mm(block, centers.t()).contiguous();
    AT_DISPATCH_FLOATING_TYPES(compute_type, "nearest_center_cuda", [&] {
      argmin_rows_kernel<scalar_t><<<blocks_for(n * 32), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          dots.data_ptr<scalar_t>(), cn.data_ptr<scalar_t>(), block.data_ptr<scalar_t>(),
          centers.data_ptr<scalar_t>(), n, C, D, index.data_ptr<int64_t>() + start,
          sqdist.data_ptr<scalar_t>() + start);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {index, sqdist.to(points_in.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> segment_moments_fwd(const at::Tensor& x_in, const at::Tensor& w_in,
                                                                   const at::Tensor& seg, int64_t S) {
  VM_CHECK_CUDA(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t D = x.size(1);
  auto plan = routing_plan(seg.reshape({-1, 1}), S);
  const auto& order = std::get<0>(plan);
  const auto& offsets = std::get<2>(plan);
  auto wsum = at::zeros({S}, x.options());
  auto mean = at::zeros({S, D}, x.options());
  auto cov = at::zeros({S, D, D}, x.options());
  if (S > 0) {
    VM_DISPATCH_FLOATING(x.scalar_type(), "segment_moments_cuda", [&] {
      segment_moments_kernel<scalar_t><<<S, 64, 0, at::cuda::getCurrentCUDAStream()>>>(
          x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), order.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(),
          S, D, wsum.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(), cov.data_ptr<scalar_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {wsum, mean, cov};
}

std::tuple<at::Tensor, at::Tensor> segment_moments_bwd(
    const std::optional<at::Tensor>& v_wsum, const std::optional<at::Tensor>& v_mean,
    const std::optional<at::Tensor>& v_cov, const at::Tensor& x_in, const at::Tensor& w_in,
    const at::Tensor& seg_in, const at::Tensor& wsum_in, const at::Tensor& mean_in, const at::Tensor& cov_in) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous(), w = w_in.contiguous(), seg = seg_in.contiguous();
  const auto wsum = wsum_in.contiguous(), mean = mean_in.contiguous(), cov = cov_in.contiguous();
  const auto gW = opt_contig(v_wsum), gM = opt_contig(v_mean), gC = opt_contig(v_cov);
  const int64_t N = x.size(0), D = x.size(1);
  auto vx = at::zeros_like(x);
  auto vw = at::zeros_like(w);
  if (N > 0) {
    VM_DISPATCH_FLOATING(x.scalar_type(), "segment_moments_bwd_cuda", [&] {
      segment_moments_bwd_kernel<scalar_t><<<blocks_for(N), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          opt_ptr<scalar_t>(gW), opt_ptr<scalar_t>(gM), opt_ptr<scalar_t>(gC), x.data_ptr<scalar_t>(),
          w.data_ptr<scalar_t>(), seg.data_ptr<int64_t>(), wsum.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(),
          cov.data_ptr<scalar_t>(), N, D, vx.data_ptr<scalar_t>(), vw.data_ptr<scalar_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {vx, vw};
}

}  // namespace cuda
}  // namespace visionmoe
