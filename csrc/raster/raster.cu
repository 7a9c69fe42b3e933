// CUDA kernels of the Gaussian rasteriser (same semantics as raster_cpu.cpp; per-Gaussian
// math in include/gaussian.h). Binning follows gsplat/INRIA: one 64-bit key per
// (camera, tile, Gaussian) = (camera * tiles + tile) << 32 | depth bits, a stable radix sort
// (ATen/cub) and per-tile ranges by binary search. Compositing: one 16x16 thread block per
// tile, one thread per pixel, Gaussians staged through shared memory in batches of 256.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../include/checks.h"
#include "../include/gaussian.h"
#include "raster.h"

namespace visionmoe {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kT = gs::kTile;
constexpr int kBatch = kT * kT;

inline unsigned int blocks_for(int64_t n) {
  return static_cast<unsigned int>(std::max<int64_t>(1, (n + kThreads - 1) / kThreads));
}

#define VM_CUDA_RASTER_DISPATCH(TYPE, NAME, ...) AT_DISPATCH_FLOATING_TYPES(TYPE, NAME, __VA_ARGS__)

template <typename T>
__global__ void project_fwd_kernel(int64_t C, int64_t N, int64_t F, const T* __restrict__ means,
                                   const T* __restrict__ quats, const T* __restrict__ log_scales,
                                   const T* __restrict__ opac, const T* __restrict__ feats,
                                   const T* __restrict__ viewmats, const T* __restrict__ Ks, int W, int H, T near_plane,
                                   T far_plane, T* m2, T* conics, T* depths, int* radii) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= C * N) return;
  const int64_t c = i / N, n = i % N;
  bool ok = gs::finite(opac[n]);
  for (int k = 0; k < 3; ++k) ok = ok && gs::finite(means[n * 3 + k]) && gs::finite(log_scales[n * 3 + k]);
  for (int k = 0; k < 4; ++k) ok = ok && gs::finite(quats[n * 4 + k]);
  for (int64_t f = 0; f < F && ok; ++f) ok = gs::finite(feats[n * F + f]);
  if (!ok) return;  // outputs stay zero, radius 0
  const auto cam = gs::load_camera(viewmats + c * 16, Ks + c * 9, W, H);
  const auto p = gs::project(cam, means + n * 3, quats + n * 4, log_scales + n * 3, near_plane, far_plane);
  m2[i * 2] = p.mean2d[0];
  m2[i * 2 + 1] = p.mean2d[1];
  for (int k = 0; k < 3; ++k) conics[i * 3 + k] = p.conic[k];
  depths[i] = p.depth;
  radii[i * 2] = p.valid ? p.radius[0] : 0;
  radii[i * 2 + 1] = p.valid ? p.radius[1] : 0;
}

template <typename T>
__global__ void project_bwd_kernel(int64_t C, int64_t N, const T* __restrict__ means, const T* __restrict__ quats,
                                   const T* __restrict__ log_scales, const T* __restrict__ viewmats,
                                   const T* __restrict__ Ks, int W, int H, const int* __restrict__ radii,
                                   const T* __restrict__ v_m2, const T* __restrict__ v_conics,
                                   const T* __restrict__ v_depths, T* v_means, T* v_quats, T* v_log_scales) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  for (int64_t c = 0; c < C; ++c) {
    const int64_t i = c * N + n;
    if (radii[i * 2] <= 0 || radii[i * 2 + 1] <= 0) continue;
    const auto cam = gs::load_camera(viewmats + c * 16, Ks + c * 9, W, H);
    gs::project_vjp(cam, means + n * 3, quats + n * 4, log_scales + n * 3, v_m2 + i * 2, v_conics + i * 3,
                    v_depths[i], v_means + n * 3, v_quats + n * 4, v_log_scales + n * 3);
  }
}

template <typename T>
__device__ gs::Vec3<T> centre_of(const T* viewmat) {
  const T K[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  return gs::camera_center(gs::load_camera(viewmat, K, 1, 1));
}

template <typename T>
__global__ void sh_fwd_kernel(int64_t C, int64_t N, int64_t K, int degree, const T* __restrict__ sh,
                              const T* __restrict__ means, const T* __restrict__ viewmats,
                              const int* __restrict__ radii, T* colors) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= C * N) return;
  const int64_t c = i / N, n = i % N;
  if (radii[i * 2] <= 0 || radii[i * 2 + 1] <= 0) return;
  gs::sh_color(degree, int(K), sh + n * K * 3, means + n * 3, centre_of(viewmats + c * 16), colors + i * 3);
}

template <typename T>
__global__ void sh_bwd_kernel(int64_t C, int64_t N, int64_t K, int degree, const T* __restrict__ sh,
                              const T* __restrict__ means, const T* __restrict__ viewmats,
                              const int* __restrict__ radii, const T* __restrict__ v_colors, T* v_sh, T* v_means) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  for (int64_t c = 0; c < C; ++c) {
    const int64_t i = c * N + n;
    if (radii[i * 2] <= 0 || radii[i * 2 + 1] <= 0) continue;
    gs::sh_color_vjp(degree, int(K), sh + n * K * 3, means + n * 3, centre_of(viewmats + c * 16), v_colors + i * 3,
                     v_sh + n * K * 3, v_means + n * 3);
  }
}

template <typename T>
__global__ void rect_kernel(int64_t C, int64_t N, const T* __restrict__ m2, const T* __restrict__ conics,
                            const T* __restrict__ opac, const int* __restrict__ radii, int W, int H, int4* rects,
                            int64_t* counts) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= C * N) return;
  int4 r;
  gs::tile_rect(m2 + i * 2, radii + i * 2, conics + i * 3, opac[i % N], W, H, &r.x, &r.y, &r.z, &r.w);
  rects[i] = r;
  counts[i] = int64_t(r.y - r.x) * (r.w - r.z);
}

template <typename T>
__global__ void fill_keys_kernel(int64_t C, int64_t N, int tiles_x, int64_t TT, const int4* __restrict__ rects,
                                 const int64_t* __restrict__ ends, const T* __restrict__ depths, int64_t* keys,
                                 int32_t* vals) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= C * N) return;
  const int4 r = rects[i];
  const int64_t c = i / N;
  int64_t pos = i == 0 ? 0 : ends[i - 1];
  const int64_t dkey = int64_t(gs::depth_key(float(depths[i])));
  for (int y = r.z; y < r.w; ++y)
    for (int x = r.x; x < r.y; ++x) {
      keys[pos] = ((c * TT + int64_t(y) * tiles_x + x) << 32) | dkey;
      vals[pos] = int32_t(i % N);
      ++pos;
    }
}

template <typename T>
__global__ void raster_fwd_kernel(int64_t N, int W, int H, int tiles_x, int64_t TT, const T* __restrict__ m2,
                                  const T* __restrict__ conics, const T* __restrict__ colors,
                                  const T* __restrict__ opac, const T* __restrict__ depths,
                                  const int64_t* __restrict__ offsets, const int32_t* __restrict__ ids, T* out_color,
                                  T* out_trans, T* out_depth, int* out_last, T* contrib, int* counts) {
  const int64_t c = blockIdx.z;
  const int tile = blockIdx.y * tiles_x + blockIdx.x;
  const int x = blockIdx.x * kT + threadIdx.x, y = blockIdx.y * kT + threadIdx.y;
  const bool inside = x < W && y < H;
  const int tid = threadIdx.y * kT + threadIdx.x;
  const int64_t start = offsets[c * TT + tile], end = offsets[c * TT + tile + 1];
  __shared__ int32_t s_id[kBatch];
  __shared__ T s_m[kBatch][2];
  __shared__ T s_con[kBatch][3];
  __shared__ T s_op[kBatch];
  const T px = T(x) + T(0.5), py = T(y) + T(0.5);
  const T alpha_min = T(gs::kAlphaMin), alpha_max = T(gs::kAlphaMax), t_min = T(gs::kTransmittanceMin);
  T Tr = 1, acc[3] = {0, 0, 0}, dacc = 0;
  int last = 0;
  bool done = !inside;
  for (int64_t b = start; b < end; b += kBatch) {
    if (__syncthreads_count(done) == kBatch) break;
    const int64_t k = b + tid;
    if (k < end) {
      const int32_t g = ids[k];
      const int64_t cg = c * N + g;
      s_id[tid] = g;
      s_m[tid][0] = m2[cg * 2];
      s_m[tid][1] = m2[cg * 2 + 1];
      for (int q = 0; q < 3; ++q) s_con[tid][q] = conics[cg * 3 + q];
      s_op[tid] = opac[g];
    }
    __syncthreads();
    const int nb = int(end - b < int64_t(kBatch) ? end - b : int64_t(kBatch));
    for (int j = 0; j < nb && !done; ++j) {
      const T dx = s_m[j][0] - px, dy = s_m[j][1] - py;
      const T power = T(-0.5) * (s_con[j][0] * dx * dx + s_con[j][2] * dy * dy) - s_con[j][1] * dx * dy;
      if (power > 0) continue;
      const T alpha = min(alpha_max, s_op[j] * exp(power));
      if (alpha < alpha_min) continue;
      const T next = Tr * (1 - alpha);
      if (next < t_min) {
        done = true;
        break;
      }
      const T w = alpha * Tr;
      const int64_t cg = c * N + s_id[j];
      for (int q = 0; q < 3; ++q) acc[q] += w * colors[cg * 3 + q];
      dacc += w * depths[cg];
      Tr = next;
      last = int(b - start) + j + 1;
      if (contrib != nullptr) {
        atomicAdd(contrib + cg, w);
        atomicAdd(counts + cg, 1);
      }
    }
    __syncthreads();
  }
  if (!inside) return;
  const int64_t pix = (c * H + y) * W + x;
  for (int q = 0; q < 3; ++q) out_color[pix * 3 + q] = acc[q];
  out_trans[pix] = Tr;
  out_depth[pix] = dacc;
  out_last[pix] = last;
}

template <typename T>
__global__ void raster_bwd_kernel(int64_t N, int W, int H, int tiles_x, int64_t TT, const T* __restrict__ m2,
                                  const T* __restrict__ conics, const T* __restrict__ colors,
                                  const T* __restrict__ opac, const T* __restrict__ depths,
                                  const int64_t* __restrict__ offsets, const int32_t* __restrict__ ids,
                                  const T* __restrict__ trans, const int* __restrict__ lasts,
                                  const T* __restrict__ v_color, const T* __restrict__ v_trans,
                                  const T* __restrict__ v_depth, T* g_m2, T* g_con, T* g_col, T* g_op, T* g_dep) {
  const int64_t c = blockIdx.z;
  const int tile = blockIdx.y * tiles_x + blockIdx.x;
  const int x = blockIdx.x * kT + threadIdx.x, y = blockIdx.y * kT + threadIdx.y;
  const bool inside = x < W && y < H;
  const int tid = threadIdx.y * kT + threadIdx.x;
  const int64_t start = offsets[c * TT + tile], end = offsets[c * TT + tile + 1];
  __shared__ int32_t s_id[kBatch];
  __shared__ T s_m[kBatch][2];
  __shared__ T s_con[kBatch][3];
  __shared__ T s_op[kBatch];
  const T px = T(x) + T(0.5), py = T(y) + T(0.5);
  const T alpha_min = T(gs::kAlphaMin), alpha_max = T(gs::kAlphaMax);
  const int64_t pix = inside ? (c * H + y) * W + x : 0;
  const T Tfin = inside ? trans[pix] : T(1);
  T Tr = Tfin;
  const int last = inside ? lasts[pix] : 0;
  T gC[3] = {0, 0, 0}, gT = 0, gD = 0, Bc[3] = {0, 0, 0}, Bd = 0;
  if (inside) {
    for (int q = 0; q < 3; ++q) gC[q] = v_color[pix * 3 + q];
    gT = v_trans[pix];
    gD = v_depth[pix];
  }
  // Batches from the back of the list to the front.
  for (int64_t bend = end; bend > start; bend -= kBatch) {
    const int64_t b = max(start, bend - kBatch);
    __syncthreads();
    const int64_t k = b + tid;
    if (k < bend) {
      const int32_t g = ids[k];
      const int64_t cg = c * N + g;
      s_id[tid] = g;
      s_m[tid][0] = m2[cg * 2];
      s_m[tid][1] = m2[cg * 2 + 1];
      for (int q = 0; q < 3; ++q) s_con[tid][q] = conics[cg * 3 + q];
      s_op[tid] = opac[g];
    }
    __syncthreads();
    for (int j = int(bend - b) - 1; j >= 0; --j) {
      const int local = int(b - start) + j;
      if (local >= last) continue;
      const T dx = s_m[j][0] - px, dy = s_m[j][1] - py;
      const T ca = s_con[j][0], cb = s_con[j][1], cc = s_con[j][2];
      const T power = T(-0.5) * (ca * dx * dx + cc * dy * dy) - cb * dx * dy;
      if (power > 0) continue;
      const T G = exp(power);
      const T a0 = s_op[j] * G;
      const T alpha = min(alpha_max, a0);
      if (alpha < alpha_min) continue;
      const int64_t cg = c * N + s_id[j];
      const T one_m = 1 - alpha;
      const T Ti = Tr / one_m;
      const T w = alpha * Ti;
      T v_alpha = 0;
      for (int q = 0; q < 3; ++q) {
        const T col = colors[cg * 3 + q];
        atomicAdd(g_col + cg * 3 + q, w * gC[q]);
        v_alpha += (col - Bc[q]) * gC[q];
        Bc[q] = alpha * col + one_m * Bc[q];
      }
      const T dep = depths[cg];
      atomicAdd(g_dep + cg, w * gD);
      v_alpha += (dep - Bd) * gD;
      v_alpha *= Ti;
      v_alpha -= gT * Tfin / one_m;
      Bd = alpha * dep + one_m * Bd;
      Tr = Ti;
      if (a0 > alpha_max) continue;
      atomicAdd(g_op + s_id[j], G * v_alpha);
      const T v_power = a0 * v_alpha;
      atomicAdd(g_con + cg * 3, T(-0.5) * dx * dx * v_power);
      atomicAdd(g_con + cg * 3 + 1, -dx * dy * v_power);
      atomicAdd(g_con + cg * 3 + 2, T(-0.5) * dy * dy * v_power);
      atomicAdd(g_m2 + cg * 2, -(ca * dx + cb * dy) * v_power);
      atomicAdd(g_m2 + cg * 2 + 1, -(cc * dy + cb * dx) * v_power);
    }
  }
}

void check_cuda(const at::Tensor& t, const char* name) { TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor"); }

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> project_fwd(
    const at::Tensor& means_in, const at::Tensor& quats_in, const at::Tensor& log_scales_in,
    const at::Tensor& opacities_in, const at::Tensor& features_in, const at::Tensor& viewmats_in,
    const at::Tensor& Ks_in, int64_t width, int64_t height, double near_plane, double far_plane) {
  check_cuda(means_in, "means");
  const at::cuda::OptionalCUDAGuard guard(means_in.device());
  const auto means = means_in.contiguous(), quats = quats_in.contiguous(), log_scales = log_scales_in.contiguous();
  const auto opacities = opacities_in.contiguous(), viewmats = viewmats_in.contiguous(), Ks = Ks_in.contiguous();
  const auto features = features_in.flatten(1).contiguous();
  const int64_t N = means.size(0), C = viewmats.size(0), F = features.size(1);
  auto means2d = at::zeros({C, N, 2}, means.options());
  auto conics = at::zeros({C, N, 3}, means.options());
  auto depths = at::zeros({C, N}, means.options());
  auto radii = at::zeros({C, N, 2}, means.options().dtype(at::kInt));
  if (C * N == 0) return {means2d, conics, depths, radii};
  auto stream = at::cuda::getCurrentCUDAStream();
  VM_CUDA_RASTER_DISPATCH(means.scalar_type(), "project_fwd", [&] {
    project_fwd_kernel<scalar_t><<<blocks_for(C * N), kThreads, 0, stream>>>(
        C, N, F, means.data_ptr<scalar_t>(), quats.data_ptr<scalar_t>(), log_scales.data_ptr<scalar_t>(),
        opacities.data_ptr<scalar_t>(), features.data_ptr<scalar_t>(), viewmats.data_ptr<scalar_t>(),
        Ks.data_ptr<scalar_t>(), int(width), int(height), scalar_t(near_plane), scalar_t(far_plane),
        means2d.data_ptr<scalar_t>(), conics.data_ptr<scalar_t>(), depths.data_ptr<scalar_t>(), radii.data_ptr<int>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {means2d, conics, depths, radii};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_bwd(
    const at::Tensor& means_in, const at::Tensor& quats_in, const at::Tensor& log_scales_in,
    const at::Tensor& viewmats_in, const at::Tensor& Ks_in, int64_t width, int64_t height,
    const at::Tensor& radii_in, const at::Tensor& v_means2d_in, const at::Tensor& v_conics_in,
    const at::Tensor& v_depths_in) {
  check_cuda(means_in, "means");
  const at::cuda::OptionalCUDAGuard guard(means_in.device());
  const auto means = means_in.contiguous(), quats = quats_in.contiguous(), log_scales = log_scales_in.contiguous();
  const auto viewmats = viewmats_in.contiguous(), Ks = Ks_in.contiguous(), radii = radii_in.contiguous();
  const auto v_means2d = v_means2d_in.contiguous(), v_conics = v_conics_in.contiguous();
  const auto v_depths = v_depths_in.contiguous();
  const int64_t N = means.size(0), C = viewmats.size(0);
  auto v_means = at::zeros_like(means);
  auto v_quats = at::zeros_like(quats);
  auto v_log_scales = at::zeros_like(log_scales);
  if (C * N == 0) return {v_means, v_quats, v_log_scales};
  auto stream = at::cuda::getCurrentCUDAStream();
  VM_CUDA_RASTER_DISPATCH(means.scalar_type(), "project_bwd", [&] {
    project_bwd_kernel<scalar_t><<<blocks_for(N), kThreads, 0, stream>>>(
        C, N, means.data_ptr<scalar_t>(), quats.data_ptr<scalar_t>(), log_scales.data_ptr<scalar_t>(),
        viewmats.data_ptr<scalar_t>(), Ks.data_ptr<scalar_t>(), int(width), int(height), radii.data_ptr<int>(),
        v_means2d.data_ptr<scalar_t>(), v_conics.data_ptr<scalar_t>(), v_depths.data_ptr<scalar_t>(),
        v_means.data_ptr<scalar_t>(), v_quats.data_ptr<scalar_t>(), v_log_scales.data_ptr<scalar_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {v_means, v_quats, v_log_scales};
}

at::Tensor sh_fwd(const at::Tensor& sh_in, const at::Tensor& means_in, const at::Tensor& viewmats_in,
                  const at::Tensor& radii_in, int64_t degree) {
  check_cuda(sh_in, "sh");
  const at::cuda::OptionalCUDAGuard guard(sh_in.device());
  const auto sh = sh_in.contiguous(), means = means_in.contiguous(), viewmats = viewmats_in.contiguous();
  const auto radii = radii_in.contiguous();
  const int64_t N = sh.size(0), K = sh.size(1), C = viewmats.size(0);
  TORCH_CHECK(degree >= 0 && degree <= 3 && (degree + 1) * (degree + 1) <= K, "sh degree ", degree,
              " needs at least ", (degree + 1) * (degree + 1), " coefficients, got ", K);
  auto colors = at::zeros({C, N, 3}, sh.options());
  if (C * N == 0) return colors;
  auto stream = at::cuda::getCurrentCUDAStream();
  VM_CUDA_RASTER_DISPATCH(sh.scalar_type(), "sh_fwd", [&] {
    sh_fwd_kernel<scalar_t><<<blocks_for(C * N), kThreads, 0, stream>>>(
        C, N, K, int(degree), sh.data_ptr<scalar_t>(), means.data_ptr<scalar_t>(), viewmats.data_ptr<scalar_t>(),
        radii.data_ptr<int>(), colors.data_ptr<scalar_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return colors;
}

std::tuple<at::Tensor, at::Tensor> sh_bwd(const at::Tensor& sh_in, const at::Tensor& means_in,
                                          const at::Tensor& viewmats_in, const at::Tensor& radii_in, int64_t degree,
                                          const at::Tensor& v_colors_in) {
  check_cuda(sh_in, "sh");
  const at::cuda::OptionalCUDAGuard guard(sh_in.device());
  const auto sh = sh_in.contiguous(), means = means_in.contiguous(), viewmats = viewmats_in.contiguous();
  const auto radii = radii_in.contiguous(), v_colors = v_colors_in.contiguous();
  const int64_t N = sh.size(0), K = sh.size(1), C = viewmats.size(0);
  auto v_sh = at::zeros_like(sh);
  auto v_means = at::zeros_like(means);
  if (C * N == 0) return {v_sh, v_means};
  auto stream = at::cuda::getCurrentCUDAStream();
  VM_CUDA_RASTER_DISPATCH(sh.scalar_type(), "sh_bwd", [&] {
    sh_bwd_kernel<scalar_t><<<blocks_for(N), kThreads, 0, stream>>>(
        C, N, K, int(degree), sh.data_ptr<scalar_t>(), means.data_ptr<scalar_t>(), viewmats.data_ptr<scalar_t>(),
        radii.data_ptr<int>(), v_colors.data_ptr<scalar_t>(), v_sh.data_ptr<scalar_t>(), v_means.data_ptr<scalar_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {v_sh, v_means};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
rasterize_fwd(const at::Tensor& means2d_in, const at::Tensor& conics_in, const at::Tensor& colors_in,
              const at::Tensor& opacities_in, const at::Tensor& depths_in, const at::Tensor& radii_in,
              int64_t width, int64_t height, bool want_contributions) {
  check_cuda(means2d_in, "means2d");
  const at::cuda::OptionalCUDAGuard guard(means2d_in.device());
  const auto means2d = means2d_in.contiguous(), conics = conics_in.contiguous(), colors = colors_in.contiguous();
  const auto opacities = opacities_in.contiguous(), depths = depths_in.contiguous(), radii = radii_in.contiguous();
  const int64_t C = means2d.size(0), N = means2d.size(1), W = width, H = height;
  TORCH_CHECK(W > 0 && H > 0, "image size must be positive, got ", W, "x", H);
  const int tiles_x = int((W + kT - 1) / kT), tiles_y = int((H + kT - 1) / kT);
  const int64_t TT = int64_t(tiles_x) * tiles_y;
  auto opts = means2d.options();
  auto out_color = at::zeros({C, H, W, 3}, opts);
  auto out_trans = at::ones({C, H, W}, opts);
  auto out_depth = at::zeros({C, H, W}, opts);
  auto out_last = at::zeros({C, H, W}, opts.dtype(at::kInt));
  auto contributions = want_contributions ? at::zeros({C, N}, opts) : at::zeros({0}, opts);
  auto pixel_counts =
      want_contributions ? at::zeros({C, N}, opts.dtype(at::kInt)) : at::zeros({0}, opts.dtype(at::kInt));
  auto long_opts = opts.dtype(at::kLong);
  auto rects = at::empty({C * N, 4}, opts.dtype(at::kInt));
  auto counts = at::zeros({C * N}, long_opts);
  auto stream = at::cuda::getCurrentCUDAStream();
  at::Tensor tile_offsets, tile_ids;
  VM_CUDA_RASTER_DISPATCH(means2d.scalar_type(), "rasterize_fwd", [&] {
    using T = scalar_t;
    if (C * N > 0) {
      rect_kernel<T><<<blocks_for(C * N), kThreads, 0, stream>>>(
          C, N, means2d.data_ptr<T>(), conics.data_ptr<T>(), opacities.data_ptr<T>(), radii.data_ptr<int>(), int(W),
          int(H), reinterpret_cast<int4*>(rects.data_ptr<int>()), counts.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const auto ends = counts.cumsum(0);
    const int64_t E = C * N > 0 ? ends[-1].item<int64_t>() : 0;
    auto keys = at::empty({E}, long_opts);
    auto vals = at::empty({E}, opts.dtype(at::kInt));
    if (E > 0) {
      fill_keys_kernel<T><<<blocks_for(C * N), kThreads, 0, stream>>>(
          C, N, tiles_x, TT, reinterpret_cast<const int4*>(rects.data_ptr<int>()), ends.data_ptr<int64_t>(),
          depths.data_ptr<T>(), keys.data_ptr<int64_t>(), vals.data_ptr<int32_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const auto sorted = keys.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
    tile_ids = vals.index_select(0, std::get<1>(sorted)).contiguous();
    const auto tile_of = std::get<0>(sorted).bitwise_right_shift(32);
    tile_offsets = at::searchsorted(tile_of, at::arange(C * TT + 1, long_opts)).contiguous();
    if (C == 0) return;
    const dim3 grid(tiles_x, tiles_y, C), block(kT, kT);
    raster_fwd_kernel<T><<<grid, block, 0, stream>>>(
        N, int(W), int(H), tiles_x, TT, means2d.data_ptr<T>(), conics.data_ptr<T>(), colors.data_ptr<T>(),
        opacities.data_ptr<T>(), depths.data_ptr<T>(), tile_offsets.data_ptr<int64_t>(), tile_ids.data_ptr<int32_t>(),
        out_color.data_ptr<T>(), out_trans.data_ptr<T>(), out_depth.data_ptr<T>(), out_last.data_ptr<int>(),
        want_contributions ? contributions.data_ptr<T>() : nullptr,
        want_contributions ? pixel_counts.data_ptr<int>() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out_color, out_trans, out_depth, out_last, tile_offsets, tile_ids, contributions, pixel_counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_bwd(
    const at::Tensor& means2d_in, const at::Tensor& conics_in, const at::Tensor& colors_in,
    const at::Tensor& opacities_in, const at::Tensor& depths_in, int64_t width, int64_t height,
    const at::Tensor& tile_offsets, const at::Tensor& tile_ids, const at::Tensor& trans_in,
    const at::Tensor& last_in, const at::Tensor& v_color_in, const at::Tensor& v_trans_in,
    const at::Tensor& v_depth_in) {
  check_cuda(means2d_in, "means2d");
  const at::cuda::OptionalCUDAGuard guard(means2d_in.device());
  const auto means2d = means2d_in.contiguous(), conics = conics_in.contiguous(), colors = colors_in.contiguous();
  const auto opacities = opacities_in.contiguous(), depths = depths_in.contiguous();
  const auto trans = trans_in.contiguous(), last_t = last_in.contiguous();
  const auto v_color = v_color_in.contiguous(), v_trans = v_trans_in.contiguous(), v_depth = v_depth_in.contiguous();
  const int64_t C = means2d.size(0), N = means2d.size(1), W = width, H = height;
  const int tiles_x = int((W + kT - 1) / kT), tiles_y = int((H + kT - 1) / kT);
  const int64_t TT = int64_t(tiles_x) * tiles_y;
  auto v_means2d = at::zeros_like(means2d);
  auto v_conics = at::zeros_like(conics);
  auto v_colors = at::zeros_like(colors);
  auto v_opacities = at::zeros_like(opacities);
  auto v_depths = at::zeros_like(depths);
  if (C == 0 || N == 0) return {v_means2d, v_conics, v_colors, v_opacities, v_depths};
  auto stream = at::cuda::getCurrentCUDAStream();
  VM_CUDA_RASTER_DISPATCH(means2d.scalar_type(), "rasterize_bwd", [&] {
    using T = scalar_t;
    const dim3 grid(tiles_x, tiles_y, C), block(kT, kT);
    raster_bwd_kernel<T><<<grid, block, 0, stream>>>(
        N, int(W), int(H), tiles_x, TT, means2d.data_ptr<T>(), conics.data_ptr<T>(), colors.data_ptr<T>(),
        opacities.data_ptr<T>(), depths.data_ptr<T>(), tile_offsets.data_ptr<int64_t>(), tile_ids.data_ptr<int32_t>(),
        trans.data_ptr<T>(), last_t.data_ptr<int>(), v_color.data_ptr<T>(), v_trans.data_ptr<T>(),
        v_depth.data_ptr<T>(), v_means2d.data_ptr<T>(), v_conics.data_ptr<T>(), v_colors.data_ptr<T>(),
        v_opacities.data_ptr<T>(), v_depths.data_ptr<T>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {v_means2d, v_conics, v_colors, v_opacities, v_depths};
}

}  // namespace cuda
}  // namespace visionmoe
