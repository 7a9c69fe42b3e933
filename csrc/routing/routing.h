// Routing ops: top-k routing with a prior mask, dispatch/combine, nearest-centre
// assignment and per-segment weighted moments. One declaration set per device;
// ext.cpp binds both and visionmoe/ops/_backend.py picks by device.
#pragma once
#include <ATen/ATen.h>
#include <optional>
#include <tuple>

namespace visionmoe {

#define VM_ROUTING_DECLS                                                                     \
  /* -> weights [T,k], indices [T,k] (-1 = no allowed expert left), probs [T,E], lse [T] */ \
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> topk_route_fwd(                \
      const at::Tensor& logits, /* [T, E] */                                                \
      const at::Tensor& mask,   /* [T, E] bool, may be stride-0 broadcast */                \
      int64_t k, bool normalize);                                                            \
  /* -> v_logits [T, E] */                                                                   \
  at::Tensor topk_route_bwd(                                                                 \
      const std::optional<at::Tensor>& v_weights, /* [T, k] */                               \
      const std::optional<at::Tensor>& v_probs,   /* [T, E] */                               \
      const std::optional<at::Tensor>& v_lse,     /* [T] */                                  \
      const at::Tensor& probs,                    /* [T, E] */                               \
      const at::Tensor& weights,                  /* [T, k] */                               \
      const at::Tensor& indices,                  /* [T, k] */                               \
      bool normalize);                                                                       \
  /* counting sort of assignments by expert -> order [M], position [T*k], offsets [E+1] */  \
  std::tuple<at::Tensor, at::Tensor, at::Tensor> routing_plan(                               \
      const at::Tensor& indices, /* [T, k] int64 in [-1, E) */                               \
      int64_t num_experts);                                                                  \
  /* out[r] = scale[order[r]] * x[order[r] / k] -> [M, D] */                                 \
  at::Tensor dispatch_fwd(const at::Tensor& x, /* [T, D] */                                  \
                          const at::Tensor& order, /* [M] */                                 \
                          int64_t k,                                                         \
                          const std::optional<at::Tensor>& scale /* [T*k] */);               \
  /* out[t] = sum_s w[t,s] * y[position[t*k+s]] -> [T, D]; w == None means 1 */              \
  at::Tensor combine_fwd(const at::Tensor& y, /* [M, D] */                                   \
                         const at::Tensor& position, /* [T*k] */                             \
                         int64_t k,                                                          \
                         const std::optional<at::Tensor>& weights /* [T, k] */);             \
  /* -> v_y [M, D], v_weights [T, k] */                                                      \
  std::tuple<at::Tensor, at::Tensor> combine_bwd(                                            \
      const at::Tensor& v_out,    /* [T, D] */                                               \
      const at::Tensor& y,        /* [M, D] */                                               \
      const at::Tensor& weights,  /* [T, k] */                                               \
      const at::Tensor& order,    /* [M] */                                                  \
      const at::Tensor& position, /* [T*k] */                                                \
      int64_t k);                                                                            \
  /* -> index [N] int64, squared distance [N] */                                             \
  std::tuple<at::Tensor, at::Tensor> nearest_center_fwd(                                     \
      const at::Tensor& points,  /* [N, D] */                                                \
      const at::Tensor& centers, /* [C, D] */                                                \
      int64_t chunk);                                                                        \
  /* -> weight sums [S], means [S, D], covariances [S, D, D] */                              \
  std::tuple<at::Tensor, at::Tensor, at::Tensor> segment_moments_fwd(                        \
      const at::Tensor& x,           /* [N, D] */                                            \
      const at::Tensor& weights,     /* [N] */                                               \
      const at::Tensor& segment_ids, /* [N] int64 in [0, S) */                               \
      int64_t num_segments);                                                                 \
  /* -> v_x [N, D], v_weights [N] */                                                         \
  std::tuple<at::Tensor, at::Tensor> segment_moments_bwd(                                    \
      const std::optional<at::Tensor>& v_wsum, /* [S] */                                     \
      const std::optional<at::Tensor>& v_mean, /* [S, D] */                                  \
      const std::optional<at::Tensor>& v_cov,  /* [S, D, D] */                               \
      const at::Tensor& x, const at::Tensor& weights, const at::Tensor& segment_ids,         \
      const at::Tensor& wsum, const at::Tensor& mean, const at::Tensor& cov);

namespace cpu {
VM_ROUTING_DECLS
}  // namespace cpu

#ifdef WITH_CUDA
namespace cuda {
VM_ROUTING_DECLS
}  // namespace cuda
#endif

}  // namespace visionmoe
