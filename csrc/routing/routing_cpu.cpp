// CPU (OpenMP via at::parallel_for) kernels of the routing ops. All routing ops live in
// one translation unit: each file that includes ATen costs ~30 s to compile on 2 cores.
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "../include/checks.h"
#include "routing.h"

namespace visionmoe {
namespace cpu {

namespace {
constexpr int64_t kGrain = 256;

// Strided read of a possibly broadcast [T, E] bool mask.
struct MaskView {
  const bool* data;
  int64_t s0, s1;
  bool operator()(int64_t t, int64_t e) const { return data[t * s0 + e * s1]; }
};
}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> topk_route_fwd(
    const at::Tensor& logits_in, const at::Tensor& mask, int64_t k, bool normalize) {
  VM_CHECK_CPU(logits_in);
  VM_CHECK_DIM(logits_in, 2);
  TORCH_CHECK(mask.scalar_type() == at::kBool, "prior_mask must be bool");
  TORCH_CHECK(mask.sizes() == logits_in.sizes(), "prior_mask must broadcast to logits");
  const auto logits = logits_in.contiguous();
  const int64_t T = logits.size(0), E = logits.size(1);
  TORCH_CHECK(k >= 1 && k <= E, "k must be in [1, ", E, "], got ", k);

  auto weights = at::zeros({T, k}, logits.options());
  auto indices = at::full({T, k}, -1, logits.options().dtype(at::kLong));
  auto probs = at::zeros({T, E}, logits.options());
  auto lse = at::empty({T}, logits.options());
  const MaskView mv{mask.data_ptr<bool>(), mask.stride(0), mask.stride(1)};
  std::atomic<int64_t> bad_row{-1};

  VM_DISPATCH_FLOATING(logits.scalar_type(), "topk_route_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* lp = logits.data_ptr<scalar_t>();
    scalar_t* wp = weights.data_ptr<scalar_t>();
    int64_t* ip = indices.data_ptr<int64_t>();
    scalar_t* pp = probs.data_ptr<scalar_t>();
    scalar_t* sp = lse.data_ptr<scalar_t>();
    at::parallel_for(0, T, kGrain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> p(E);
      std::vector<char> taken(E);
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* row = lp + t * E;
        acc_t mx = -std::numeric_limits<acc_t>::infinity();
        for (int64_t e = 0; e < E; ++e)
          if (mv(t, e)) mx = std::max(mx, static_cast<acc_t>(row[e]));
        if (mx == -std::numeric_limits<acc_t>::infinity()) {
          int64_t expected = -1;
          bad_row.compare_exchange_strong(expected, t);
          continue;
        }
        acc_t sum = 0;
        for (int64_t e = 0; e < E; ++e) {
          p[e] = mv(t, e) ? std::exp(static_cast<acc_t>(row[e]) - mx) : acc_t(0);
          sum += p[e];
        }
        sp[t] = static_cast<scalar_t>(mx + std::log(sum));
        for (int64_t e = 0; e < E; ++e) {
          p[e] /= sum;
          pp[t * E + e] = static_cast<scalar_t>(p[e]);
          taken[e] = !mv(t, e);  // masked experts can never be picked
        }
        // Selection by repeated arg-max: k is small; ties go to the lower index.
        acc_t picked = 0;
        for (int64_t j = 0; j < k; ++j) {
          int64_t best = -1;
          for (int64_t e = 0; e < E; ++e)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
          if (best < 0) break;  // fewer allowed experts than k: slot stays -1 / weight 0
          taken[best] = 1;
          ip[t * k + j] = best;
          picked += p[best];
        }
        for (int64_t j = 0; j < k; ++j) {
          const int64_t e = ip[t * k + j];
          if (e >= 0) wp[t * k + j] = static_cast<scalar_t>(normalize ? p[e] / picked : p[e]);
        }
      }
    });
  });
  TORCH_CHECK(bad_row.load() < 0, "prior_mask masks every expert of token ", bad_row.load());
  return {weights, indices, probs, lse};
}

at::Tensor topk_route_bwd(const std::optional<at::Tensor>& v_weights,
                          const std::optional<at::Tensor>& v_probs,
                          const std::optional<at::Tensor>& v_lse, const at::Tensor& probs_in,
                          const at::Tensor& weights_in, const at::Tensor& indices_in,
                          bool normalize) {
  const auto probs = probs_in.contiguous();
  const auto weights = weights_in.contiguous();
  const auto indices = indices_in.contiguous();
  const int64_t T = probs.size(0), E = probs.size(1), k = indices.size(1);
  auto v_logits = at::zeros_like(probs);
  const at::Tensor gw = v_weights.has_value() ? v_weights->contiguous() : at::Tensor();
  const at::Tensor gp = v_probs.has_value() ? v_probs->contiguous() : at::Tensor();
  const at::Tensor gl = v_lse.has_value() ? v_lse->contiguous() : at::Tensor();

  VM_DISPATCH_FLOATING(probs.scalar_type(), "topk_route_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* pp = probs.data_ptr<scalar_t>();
    const scalar_t* wp = weights.data_ptr<scalar_t>();
    const int64_t* ip = indices.data_ptr<int64_t>();
    const scalar_t* gwp = gw.defined() ? gw.data_ptr<scalar_t>() : nullptr;
    const scalar_t* gpp = gp.defined() ? gp.data_ptr<scalar_t>() : nullptr;
    const scalar_t* glp = gl.defined() ? gl.data_ptr<scalar_t>() : nullptr;
    scalar_t* out = v_logits.data_ptr<scalar_t>();
    at::parallel_for(0, T, kGrain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> g(E);
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* p = pp + t * E;
        std::fill(g.begin(), g.end(), acc_t(0));
        if (gwp) {
          // normalize: w = softmax over the selected logits; else w_j = p[i_j].
          acc_t s = 0;
          for (int64_t j = 0; j < k; ++j)
            if (ip[t * k + j] >= 0) s += acc_t(wp[t * k + j]) * acc_t(gwp[t * k + j]);
          for (int64_t j = 0; j < k; ++j) {
            const int64_t e = ip[t * k + j];
            if (e < 0) continue;
            const acc_t w = wp[t * k + j], gj = gwp[t * k + j];
            g[e] += normalize ? w * (gj - s) : w * gj;
          }
          if (!normalize)
            for (int64_t e = 0; e < E; ++e) g[e] -= acc_t(p[e]) * s;
        }
        if (gpp) {
          acc_t s = 0;
          for (int64_t e = 0; e < E; ++e) s += acc_t(p[e]) * acc_t(gpp[t * E + e]);
          for (int64_t e = 0; e < E; ++e) g[e] += acc_t(p[e]) * (acc_t(gpp[t * E + e]) - s);
        }
        if (glp)
          for (int64_t e = 0; e < E; ++e) g[e] += acc_t(glp[t]) * acc_t(p[e]);
        for (int64_t e = 0; e < E; ++e) out[t * E + e] = static_cast<scalar_t>(g[e]);
      }
    });
  });
  return v_logits;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> routing_plan(const at::Tensor& indices_in,
                                                            int64_t num_experts) {
  VM_CHECK_CPU(indices_in);
  VM_CHECK_LONG(indices_in);
  const auto flat = indices_in.contiguous().view(-1);
  const int64_t A = flat.numel(), E = num_experts;
  const int64_t* ip = flat.data_ptr<int64_t>();
  auto offsets = at::zeros({E + 1}, flat.options());
  int64_t* op = offsets.data_ptr<int64_t>();
  // Counting sort: histogram, exclusive cumsum, stable scatter. O(A), no comparison sort.
  for (int64_t a = 0; a < A; ++a) {
    const int64_t e = ip[a];
    TORCH_CHECK(e >= -1 && e < E, "indices must be in [-1, ", E, "), got ", e);
    if (e >= 0) ++op[e + 1];
  }
  for (int64_t e = 0; e < E; ++e) op[e + 1] += op[e];
  const int64_t M = op[E];
  auto order = at::empty({M}, flat.options());
  auto position = at::empty({A}, flat.options());
  int64_t* orp = order.data_ptr<int64_t>();
  int64_t* pop = position.data_ptr<int64_t>();
  std::vector<int64_t> cursor(op, op + E);
  for (int64_t a = 0; a < A; ++a) {
    const int64_t e = ip[a];
    if (e < 0) {
      pop[a] = -1;
      continue;
    }
    const int64_t r = cursor[e]++;
    orp[r] = a;
    pop[a] = r;
  }
  return {order, position, offsets};
}

at::Tensor dispatch_fwd(const at::Tensor& x_in, const at::Tensor& order, int64_t k,
                        const std::optional<at::Tensor>& scale_in) {
  VM_CHECK_CPU(x_in);
  const auto x = x_in.contiguous();
  const int64_t M = order.numel(), D = x.size(1);
  auto out = at::empty({M, D}, x.options());
  const at::Tensor scale = scale_in.has_value() ? scale_in->contiguous() : at::Tensor();
  VM_DISPATCH_FLOATING(x.scalar_type(), "dispatch_fwd", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const int64_t* orp = order.data_ptr<int64_t>();
    const scalar_t* sp = scale.defined() ? scale.data_ptr<scalar_t>() : nullptr;
    scalar_t* yp = out.data_ptr<scalar_t>();
    at::parallel_for(0, M, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t a = orp[r];
        const scalar_t* src = xp + (a / k) * D;
        scalar_t* dst = yp + r * D;
        if (sp) {
          const scalar_t s = sp[a];
          for (int64_t d = 0; d < D; ++d) dst[d] = s * src[d];
        } else {
          std::copy(src, src + D, dst);
        }
      }
    });
  });
  return out;
}

at::Tensor combine_fwd(const at::Tensor& y_in, const at::Tensor& position, int64_t k,
                       const std::optional<at::Tensor>& weights_in) {
  VM_CHECK_CPU(y_in);
  const auto y = y_in.contiguous();
  const int64_t T = position.numel() / k, D = y.size(1);
  auto out = at::empty({T, D}, y.options());
  const at::Tensor w = weights_in.has_value() ? weights_in->contiguous() : at::Tensor();
  VM_DISPATCH_FLOATING(y.scalar_type(), "combine_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* yp = y.data_ptr<scalar_t>();
    const int64_t* pp = position.data_ptr<int64_t>();
    const scalar_t* wp = w.defined() ? w.data_ptr<scalar_t>() : nullptr;
    scalar_t* op = out.data_ptr<scalar_t>();
    // One token per iteration: each output row is written by one thread, no atomics,
    // and the sum order is fixed, so results are deterministic.
    at::parallel_for(0, T, kGrain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> acc(D);
      for (int64_t t = begin; t < end; ++t) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t s = 0; s < k; ++s) {
          const int64_t r = pp[t * k + s];
          if (r < 0) continue;
          const acc_t ws = wp ? acc_t(wp[t * k + s]) : acc_t(1);
          const scalar_t* src = yp + r * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += ws * acc_t(src[d]);
        }
        for (int64_t d = 0; d < D; ++d) op[t * D + d] = static_cast<scalar_t>(acc[d]);
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> combine_bwd(const at::Tensor& v_out_in, const at::Tensor& y_in,
                                               const at::Tensor& weights_in,
                                               const at::Tensor& order,
                                               const at::Tensor& position, int64_t k) {
  const auto v_out = v_out_in.contiguous();
  const auto y = y_in.contiguous();
  const auto weights = weights_in.contiguous();
  // Adjoint of combine w.r.t. y is dispatch scaled by the routing weights.
  auto v_y = dispatch_fwd(v_out, order, k, weights.view(-1));
  auto v_w = at::zeros_like(weights);
  const int64_t T = weights.size(0), D = y.size(1);
  VM_DISPATCH_FLOATING(y.scalar_type(), "combine_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gp = v_out.data_ptr<scalar_t>();
    const scalar_t* yp = y.data_ptr<scalar_t>();
    const int64_t* pp = position.data_ptr<int64_t>();
    scalar_t* vwp = v_w.data_ptr<scalar_t>();
    at::parallel_for(0, T, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t s = 0; s < k; ++s) {
          const int64_t r = pp[t * k + s];
          if (r < 0) continue;
          acc_t dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += acc_t(gp[t * D + d]) * acc_t(yp[r * D + d]);
          vwp[t * k + s] = static_cast<scalar_t>(dot);
        }
    });
  });
  return {v_y, v_w};
}

std::tuple<at::Tensor, at::Tensor> nearest_center_fwd(const at::Tensor& points_in,
                                                      const at::Tensor& centers_in,
                                                      int64_t chunk) {
  VM_CHECK_CPU(points_in);
  // Half types are computed in float32: BLAS has no fast CPU half path.
  const auto compute_type =
      points_in.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto points = points_in.to(compute_type).contiguous();
  const auto centers = centers_in.to(compute_type).contiguous();
  const int64_t N = points.size(0), C = centers.size(0), D = points.size(1);
  auto index = at::empty({N}, points.options().dtype(at::kLong));
  auto sqdist = at::empty({N}, points.options());
  const auto center_norms = centers.pow(2).sum(1).contiguous();  // [C]
  const auto centers_t = centers.t();
  chunk = std::max<int64_t>(1, chunk);
  AT_DISPATCH_FLOATING_TYPES(compute_type, "nearest_center_fwd", [&] {
    const scalar_t* cn = center_norms.data_ptr<scalar_t>();
    const scalar_t* pp = points.data_ptr<scalar_t>();
    const scalar_t* cp = centers.data_ptr<scalar_t>();
    int64_t* ip = index.data_ptr<int64_t>();
    scalar_t* dp = sqdist.data_ptr<scalar_t>();
    for (int64_t start = 0; start < N; start += chunk) {
      const int64_t n = std::min(chunk, N - start);
      // ||p - c||^2 = ||p||^2 - 2 p.c + ||c||^2: the p.c block is one BLAS GEMM; the
      // fused arg-min below never materialises distances, then recomputes the winner exactly.
      const auto dots = at::mm(points.narrow(0, start, n), centers_t).contiguous();  // [n, C]
      const scalar_t* dotp = dots.data_ptr<scalar_t>();
      at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* row = dotp + r * C;
          int64_t best = 0;
          scalar_t best_v = cn[0] - 2 * row[0];
          for (int64_t c = 1; c < C; ++c) {
            const scalar_t v = cn[c] - 2 * row[c];
            if (v < best_v) {
              best_v = v;
              best = c;
            }
          }
          const scalar_t* p = pp + (start + r) * D;
          const scalar_t* q = cp + best * D;
          scalar_t d2 = 0;
          for (int64_t d = 0; d < D; ++d) d2 += (p[d] - q[d]) * (p[d] - q[d]);
          ip[start + r] = best;
          dp[start + r] = d2;
        }
      });
    }
  });
  return {index, sqdist.to(points_in.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> segment_moments_fwd(const at::Tensor& x_in,
                                                                   const at::Tensor& w_in,
                                                                   const at::Tensor& seg,
                                                                   int64_t S) {
  VM_CHECK_CPU(x_in);
  const auto x = x_in.contiguous();
  const auto w = w_in.contiguous();
  const int64_t D = x.size(1);
  // Group members by segment with the same counting sort as routing, then give each
  // segment to one thread: deterministic, no atomics, two-pass (centred) covariance.
  auto plan = routing_plan(seg.reshape({-1, 1}), S);
  const auto& order = std::get<0>(plan);
  const auto& offsets = std::get<2>(plan);
  auto wsum = at::zeros({S}, x.options());
  auto mean = at::zeros({S, D}, x.options());
  auto cov = at::zeros({S, D, D}, x.options());
  VM_DISPATCH_FLOATING(x.scalar_type(), "segment_moments_fwd", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    const int64_t* orp = order.data_ptr<int64_t>();
    const int64_t* ofp = offsets.data_ptr<int64_t>();
    scalar_t* wsp = wsum.data_ptr<scalar_t>();
    scalar_t* mp = mean.data_ptr<scalar_t>();
    scalar_t* cp = cov.data_ptr<scalar_t>();
    at::parallel_for(0, S, 16, [&](int64_t begin, int64_t end) {
      std::vector<double> mu(D), c(D * D), dlt(D);
      for (int64_t s = begin; s < end; ++s) {
        double W = 0;
        std::fill(mu.begin(), mu.end(), 0.0);
        for (int64_t m = ofp[s]; m < ofp[s + 1]; ++m) {
          const int64_t i = orp[m];
          const double wi = wp[i];
          W += wi;
          for (int64_t d = 0; d < D; ++d) mu[d] += wi * double(xp[i * D + d]);
        }
        wsp[s] = static_cast<scalar_t>(W);
        if (W <= 0) continue;  // empty or zero-weight segment: mean and covariance stay 0
        for (int64_t d = 0; d < D; ++d) mu[d] /= W;
        std::fill(c.begin(), c.end(), 0.0);
        for (int64_t m = ofp[s]; m < ofp[s + 1]; ++m) {
          const int64_t i = orp[m];
          const double wi = wp[i];
          for (int64_t d = 0; d < D; ++d) dlt[d] = double(xp[i * D + d]) - mu[d];
          for (int64_t a = 0; a < D; ++a)
            for (int64_t b = 0; b < D; ++b) c[a * D + b] += wi * dlt[a] * dlt[b];
        }
        for (int64_t d = 0; d < D; ++d) mp[s * D + d] = static_cast<scalar_t>(mu[d]);
        for (int64_t a = 0; a < D * D; ++a) cp[s * D * D + a] = static_cast<scalar_t>(c[a] / W);
      }
    });
  });
  return {wsum, mean, cov};
}

std::tuple<at::Tensor, at::Tensor> segment_moments_bwd(
    const std::optional<at::Tensor>& v_wsum, const std::optional<at::Tensor>& v_mean,
    const std::optional<at::Tensor>& v_cov, const at::Tensor& x_in, const at::Tensor& w_in,
    const at::Tensor& seg_in, const at::Tensor& wsum, const at::Tensor& mean_in,
    const at::Tensor& cov_in) {
  const auto x = x_in.contiguous();
  const auto w = w_in.contiguous();
  const auto seg = seg_in.contiguous();
  const auto mean = mean_in.contiguous();
  const auto cov = cov_in.contiguous();
  const int64_t N = x.size(0), D = x.size(1);
  auto v_x = at::zeros_like(x);
  auto v_w = at::zeros_like(w);
  const at::Tensor gW = v_wsum.has_value() ? v_wsum->contiguous() : at::Tensor();
  const at::Tensor gM = v_mean.has_value() ? v_mean->contiguous() : at::Tensor();
  const at::Tensor gC = v_cov.has_value() ? v_cov->contiguous() : at::Tensor();
  VM_DISPATCH_FLOATING(x.scalar_type(), "segment_moments_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    const int64_t* sp = seg.data_ptr<int64_t>();
    const scalar_t* Wp = wsum.data_ptr<scalar_t>();
    const scalar_t* mp = mean.data_ptr<scalar_t>();
    const scalar_t* cp = cov.data_ptr<scalar_t>();
    const scalar_t* gWp = gW.defined() ? gW.data_ptr<scalar_t>() : nullptr;
    const scalar_t* gMp = gM.defined() ? gM.data_ptr<scalar_t>() : nullptr;
    const scalar_t* gCp = gC.defined() ? gC.data_ptr<scalar_t>() : nullptr;
    scalar_t* vxp = v_x.data_ptr<scalar_t>();
    scalar_t* vwp = v_w.data_ptr<scalar_t>();
    // Per point, given its segment's statistics (sum_j w_j d_j = 0 removes the mean terms):
    //   v_x_i = w_i/W * (v_mean + (G + G^T) d_i)
    //   v_w_i = v_W + (v_mean . d_i + <G, d_i d_i^T - C>) / W,   d_i = x_i - mean.
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> dlt(D);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t s = sp[i];
        const acc_t W = Wp[s];
        acc_t gw = gWp ? acc_t(gWp[s]) : acc_t(0);
        if (W > 0) {
          const acc_t wi = wp[i];
          for (int64_t d = 0; d < D; ++d) dlt[d] = acc_t(xp[i * D + d]) - acc_t(mp[s * D + d]);
          acc_t extra = 0;
          for (int64_t a = 0; a < D; ++a) {
            acc_t gx = gMp ? acc_t(gMp[s * D + a]) : acc_t(0);
            if (gMp) extra += gx * dlt[a];
            if (gCp) {
              const scalar_t* G = gCp + s * D * D;
              for (int64_t b = 0; b < D; ++b) {
                gx += (acc_t(G[a * D + b]) + acc_t(G[b * D + a])) * dlt[b];
                extra += acc_t(G[a * D + b]) * (dlt[a] * dlt[b] - acc_t(cp[s * D * D + a * D + b]));
              }
            }
            vxp[i * D + a] = static_cast<scalar_t>(wi / W * gx);
          }
          gw += extra / W;
        }
        vwp[i] = static_cast<scalar_t>(gw);
      }
    });
  });
  return {v_x, v_w};
}

}  // namespace cpu
}  // namespace visionmoe
