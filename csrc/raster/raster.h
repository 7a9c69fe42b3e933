// Gaussian rasterisation: projection (EWA, 0.3 px low-pass), SH colours, 16x16 tile binning
// with per-tile depth-sorted lists, front-to-back compositing with per-Gaussian contributions,
// and the backward passes. One declaration set per device; ext.cpp binds both and
// visionmoe/ops/_backend.py picks by device. Math shared by both devices: include/gaussian.h.
#pragma once
#include <ATen/ATen.h>
#include <tuple>

namespace visionmoe {

#define VM_RASTER_DECLS                                                                           \
  /* -> means2d [C,N,2], conics [C,N,3], depths [C,N], radii [C,N,2] int32 (0 = culled) */      \
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> project_fwd(                         \
      const at::Tensor& means,      /* [N, 3] */                                                  \
      const at::Tensor& quats,      /* [N, 4] w,x,y,z, any norm */                                \
      const at::Tensor& log_scales, /* [N, 3] */                                                  \
      const at::Tensor& opacities,  /* [N] opacities or logits (finiteness check only) */         \
      const at::Tensor& features,   /* [N, F] colours or SH (finiteness check) */                 \
      const at::Tensor& viewmats,   /* [C, 4, 4] */                                               \
      const at::Tensor& Ks,         /* [C, 3, 3] */                                               \
      int64_t width, int64_t height, double near_plane, double far_plane);                        \
  /* -> v_means [N,3], v_quats [N,4], v_log_scales [N,3] */                                        \
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project_bwd(                                     \
      const at::Tensor& means, const at::Tensor& quats, const at::Tensor& log_scales,             \
      const at::Tensor& viewmats, const at::Tensor& Ks, int64_t width, int64_t height,            \
      const at::Tensor& radii,     /* [C, N, 2] */                                                \
      const at::Tensor& v_means2d, /* [C, N, 2] */                                                \
      const at::Tensor& v_conics,  /* [C, N, 3] */                                                \
      const at::Tensor& v_depths /* [C, N] */);                                                   \
  /* -> colours [C,N,3] = max(SH(dir) + 0.5, 0), dir = mean - camera centre */                    \
  at::Tensor sh_fwd(const at::Tensor& sh,       /* [N, K, 3] */                                   \
                    const at::Tensor& means,    /* [N, 3] */                                      \
                    const at::Tensor& viewmats, /* [C, 4, 4] */                                   \
                    const at::Tensor& radii,    /* [C, N, 2]: only visible ones are evaluated */  \
                    int64_t degree);                                                              \
  /* -> v_sh [N,K,3], v_means [N,3] */                                                             \
  std::tuple<at::Tensor, at::Tensor> sh_bwd(const at::Tensor& sh, const at::Tensor& means,        \
                                            const at::Tensor& viewmats, const at::Tensor& radii,  \
                                            int64_t degree, const at::Tensor& v_colors /* [C,N,3] */); \
  /* -> colour [C,H,W,3] (premultiplied, no background), transmittance [C,H,W], depth [C,H,W]  */ \
  /*    (alpha-weighted sum of depths), last [C,H,W] int32, tile_offsets [C*T+1] int64,       */ \
  /*    tile_ids [E] int32, contributions [C,N], pixel_counts [C,N] int32 (empty if !want)    */ \
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,  \
             at::Tensor>                                                                          \
  rasterize_fwd(const at::Tensor& means2d,   /* [C, N, 2] */                                      \
                const at::Tensor& conics,    /* [C, N, 3] */                                      \
                const at::Tensor& colors,    /* [C, N, 3] */                                      \
                const at::Tensor& opacities, /* [N] */                                            \
                const at::Tensor& depths,    /* [C, N] */                                         \
                const at::Tensor& radii,     /* [C, N, 2] int32 */                                \
                int64_t width, int64_t height, bool want_contributions);                          \
  /* -> v_means2d [C,N,2], v_conics [C,N,3], v_colors [C,N,3], v_opacities [N], v_depths [C,N] */ \
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_bwd(           \
      const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,              \
      const at::Tensor& opacities, const at::Tensor& depths, int64_t width, int64_t height,       \
      const at::Tensor& tile_offsets, const at::Tensor& tile_ids,                                 \
      const at::Tensor& trans, /* [C, H, W] final transmittance of the forward */                 \
      const at::Tensor& last,  /* [C, H, W] int32 */                                              \
      const at::Tensor& v_color, /* [C, H, W, 3] */                                               \
      const at::Tensor& v_trans, /* [C, H, W] */                                                  \
      const at::Tensor& v_depth /* [C, H, W] */);

namespace cpu {
VM_RASTER_DECLS
}  // namespace cpu

#ifdef WITH_CUDA
namespace cuda {
VM_RASTER_DECLS
}  // namespace cuda
#endif

}  // namespace visionmoe
