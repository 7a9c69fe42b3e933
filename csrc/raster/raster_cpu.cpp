// CPU (OpenMP) kernels of the Gaussian rasteriser. One translation unit for all of them
// (each file including ATen costs ~30-45 s to compile on 2 cores).
//
// Forward: project (parallel over Gaussians) -> SH colours (parallel over Gaussians) ->
// per camera: a stable LSD radix sort of the visible Gaussians by depth, then per-tile lists
// filled in depth order (threads own disjoint tile rows, so lists come out sorted and the
// result is deterministic) -> compositing, parallel over tiles with dynamic scheduling. The
// compositing loop is Gaussian-outer / pixel-inner: each Gaussian only visits the pixels of
// its alpha bounding box inside the tile, per-Gaussian sums (contribution, pixel count,
// gradients) stay in registers and are flushed once per (tile, Gaussian), and a tile stops
// as soon as every pixel is saturated (transmittance < 1e-4).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../include/checks.h"
#include "../include/gaussian.h"
#include "raster.h"

namespace visionmoe {
namespace cpu {

namespace {

constexpr int kT = gs::kTile;
constexpr int64_t kGrain = 4096;
// Below this many tile entries the work is not worth waking a thread team (each parallel
// region costs a barrier; on a busy machine a descheduled thread stalls it for milliseconds).
constexpr int64_t kParallelMin = 16384;

#define VM_RASTER_DISPATCH(TYPE, NAME, ...) AT_DISPATCH_FLOATING_TYPES(TYPE, NAME, __VA_ARGS__)

template <typename T>
std::vector<gs::Camera<T>> load_cameras(const at::Tensor& viewmats, const at::Tensor& Ks, int64_t W, int64_t H) {
  const int64_t C = viewmats.size(0);
  std::vector<gs::Camera<T>> cams(C);
  const T* vp = viewmats.data_ptr<T>();
  const T* kp = Ks.data_ptr<T>();
  for (int64_t c = 0; c < C; ++c) cams[c] = gs::load_camera(vp + c * 16, kp + c * 9, int(W), int(H));
  return cams;
}

template <typename T>
inline void atomic_add(T* addr, T v) {
#pragma omp atomic
  *addr += v;
}

// Stable LSD radix sort of ids by 32-bit keys (4 passes of 8 bits).
void radix_sort_by_key(std::vector<uint32_t>& keys, std::vector<int32_t>& ids) {
  const size_t n = keys.size();
  std::vector<uint32_t> k2(n);
  std::vector<int32_t> i2(n);
  for (int shift = 0; shift < 32; shift += 8) {
    size_t count[257] = {0};
    for (size_t i = 0; i < n; ++i) ++count[((keys[i] >> shift) & 0xFF) + 1];
    if (count[1] == n) continue;  // every key shares this digit
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (size_t i = 0; i < n; ++i) {
      const size_t dst = count[(keys[i] >> shift) & 0xFF]++;
      k2[dst] = keys[i];
      i2[dst] = ids[i];
    }
    keys.swap(k2);
    ids.swap(i2);
  }
}

void check_inputs_common(const at::Tensor& t, const char* name) {
  TORCH_CHECK(!t.is_cuda(), name, " must be a CPU tensor");
}

}  // namespace

// ----------------------------------------------------------------------------- projection

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> project_fwd(
    const at::Tensor& means_in, const at::Tensor& quats_in, const at::Tensor& log_scales_in,
    const at::Tensor& opacities_in, const at::Tensor& features_in, const at::Tensor& viewmats_in,
    const at::Tensor& Ks_in, int64_t width, int64_t height, double near_plane, double far_plane) {
  check_inputs_common(means_in, "means");
  const auto means = means_in.contiguous(), quats = quats_in.contiguous(), log_scales = log_scales_in.contiguous();
  const auto opacities = opacities_in.contiguous(), viewmats = viewmats_in.contiguous(), Ks = Ks_in.contiguous();
  const auto features = features_in.flatten(1).contiguous();
  const int64_t N = means.size(0), C = viewmats.size(0), F = features.size(1);
  auto means2d = at::zeros({C, N, 2}, means.options());
  auto conics = at::zeros({C, N, 3}, means.options());
  auto depths = at::zeros({C, N}, means.options());
  auto radii = at::zeros({C, N, 2}, means.options().dtype(at::kInt));
  VM_RASTER_DISPATCH(means.scalar_type(), "project_fwd", [&] {
    using T = scalar_t;
    const auto cams = load_cameras<T>(viewmats, Ks, width, height);
    const T* mp = means.data_ptr<T>();
    const T* qp = quats.data_ptr<T>();
    const T* sp = log_scales.data_ptr<T>();
    const T* op = opacities.data_ptr<T>();
    const T* fp = features.data_ptr<T>();
    T* m2 = means2d.data_ptr<T>();
    T* cn = conics.data_ptr<T>();
    T* dp = depths.data_ptr<T>();
    int* rp = radii.data_ptr<int>();
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        bool ok = gs::finite(op[n]);
        for (int i = 0; i < 3; ++i) ok = ok && gs::finite(mp[n * 3 + i]) && gs::finite(sp[n * 3 + i]);
        for (int i = 0; i < 4; ++i) ok = ok && gs::finite(qp[n * 4 + i]);
        for (int64_t f = 0; f < F && ok; ++f) ok = gs::finite(fp[n * F + f]);
        if (!ok) continue;  // excluded: zeros, radius 0
        for (int64_t c = 0; c < C; ++c) {
          const auto p = gs::project(cams[c], mp + n * 3, qp + n * 4, sp + n * 3, T(near_plane), T(far_plane));
          const int64_t cn_ = c * N + n;
          m2[cn_ * 2] = p.mean2d[0];
          m2[cn_ * 2 + 1] = p.mean2d[1];
          for (int i = 0; i < 3; ++i) cn[cn_ * 3 + i] = p.conic[i];
          dp[cn_] = p.depth;
          rp[cn_ * 2] = p.valid ? p.radius[0] : 0;
          rp[cn_ * 2 + 1] = p.valid ? p.radius[1] : 0;
        }
      }
    });
  });
  return {means2d, conics, depths, radii};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_bwd(
    const at::Tensor& means_in, const at::Tensor& quats_in, const at::Tensor& log_scales_in,
    const at::Tensor& viewmats_in, const at::Tensor& Ks_in, int64_t width, int64_t height,
    const at::Tensor& radii_in, const at::Tensor& v_means2d_in, const at::Tensor& v_conics_in,
    const at::Tensor& v_depths_in) {
  check_inputs_common(means_in, "means");
  const auto means = means_in.contiguous(), quats = quats_in.contiguous(), log_scales = log_scales_in.contiguous();
  const auto viewmats = viewmats_in.contiguous(), Ks = Ks_in.contiguous(), radii = radii_in.contiguous();
  const auto v_means2d = v_means2d_in.contiguous(), v_conics = v_conics_in.contiguous();
  const auto v_depths = v_depths_in.contiguous();
  const int64_t N = means.size(0), C = viewmats.size(0);
  auto v_means = at::zeros_like(means);
  auto v_quats = at::zeros_like(quats);
  auto v_log_scales = at::zeros_like(log_scales);
  VM_RASTER_DISPATCH(means.scalar_type(), "project_bwd", [&] {
    using T = scalar_t;
    const auto cams = load_cameras<T>(viewmats, Ks, width, height);
    const T* mp = means.data_ptr<T>();
    const T* qp = quats.data_ptr<T>();
    const T* sp = log_scales.data_ptr<T>();
    const int* rp = radii.data_ptr<int>();
    const T* vm2 = v_means2d.data_ptr<T>();
    const T* vcn = v_conics.data_ptr<T>();
    const T* vdp = v_depths.data_ptr<T>();
    T* gm = v_means.data_ptr<T>();
    T* gq = v_quats.data_ptr<T>();
    T* gs_ = v_log_scales.data_ptr<T>();
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t cn_ = c * N + n;
          if (rp[cn_ * 2] <= 0 || rp[cn_ * 2 + 1] <= 0) continue;
          gs::project_vjp(cams[c], mp + n * 3, qp + n * 4, sp + n * 3, vm2 + cn_ * 2, vcn + cn_ * 3, vdp[cn_],
                          gm + n * 3, gq + n * 4, gs_ + n * 3);
        }
    });
  });
  return {v_means, v_quats, v_log_scales};
}

// ----------------------------------------------------------------------------- SH

at::Tensor sh_fwd(const at::Tensor& sh_in, const at::Tensor& means_in, const at::Tensor& viewmats_in,
                  const at::Tensor& radii_in, int64_t degree) {
  check_inputs_common(sh_in, "sh");
  const auto sh = sh_in.contiguous(), means = means_in.contiguous(), viewmats = viewmats_in.contiguous();
  const auto radii = radii_in.contiguous();
  const int64_t N = sh.size(0), K = sh.size(1), C = viewmats.size(0);
  TORCH_CHECK(degree >= 0 && degree <= 3 && (degree + 1) * (degree + 1) <= K, "sh degree ", degree,
              " needs at least ", (degree + 1) * (degree + 1), " coefficients, got ", K);
  auto colors = at::zeros({C, N, 3}, sh.options());
  VM_RASTER_DISPATCH(sh.scalar_type(), "sh_fwd", [&] {
    using T = scalar_t;
    std::vector<gs::Vec3<T>> centres(C);
    const T* vp = viewmats.data_ptr<T>();
    const T zeroK[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    for (int64_t c = 0; c < C; ++c) centres[c] = gs::camera_center(gs::load_camera(vp + c * 16, zeroK, 1, 1));
    const T* shp = sh.data_ptr<T>();
    const T* mp = means.data_ptr<T>();
    const int* rp = radii.data_ptr<int>();
    T* out = colors.data_ptr<T>();
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t cn_ = c * N + n;
          if (rp[cn_ * 2] <= 0 || rp[cn_ * 2 + 1] <= 0) continue;
          gs::sh_color(int(degree), int(K), shp + n * K * 3, mp + n * 3, centres[c], out + cn_ * 3);
        }
    });
  });
  return colors;
}

std::tuple<at::Tensor, at::Tensor> sh_bwd(const at::Tensor& sh_in, const at::Tensor& means_in,
                                          const at::Tensor& viewmats_in, const at::Tensor& radii_in, int64_t degree,
                                          const at::Tensor& v_colors_in) {
  check_inputs_common(sh_in, "sh");
  const auto sh = sh_in.contiguous(), means = means_in.contiguous(), viewmats = viewmats_in.contiguous();
  const auto radii = radii_in.contiguous(), v_colors = v_colors_in.contiguous();
  const int64_t N = sh.size(0), K = sh.size(1), C = viewmats.size(0);
  auto v_sh = at::zeros_like(sh);
  auto v_means = at::zeros_like(means);
  VM_RASTER_DISPATCH(sh.scalar_type(), "sh_bwd", [&] {
    using T = scalar_t;
    std::vector<gs::Vec3<T>> centres(C);
    const T* vp = viewmats.data_ptr<T>();
    const T zeroK[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    for (int64_t c = 0; c < C; ++c) centres[c] = gs::camera_center(gs::load_camera(vp + c * 16, zeroK, 1, 1));
    const T* shp = sh.data_ptr<T>();
    const T* mp = means.data_ptr<T>();
    const int* rp = radii.data_ptr<int>();
    const T* vc = v_colors.data_ptr<T>();
    T* gsh = v_sh.data_ptr<T>();
    T* gm = v_means.data_ptr<T>();
    at::parallel_for(0, N, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t cn_ = c * N + n;
          if (rp[cn_ * 2] <= 0 || rp[cn_ * 2 + 1] <= 0) continue;
          gs::sh_color_vjp(int(degree), int(K), shp + n * K * 3, mp + n * 3, centres[c], vc + cn_ * 3,
                           gsh + n * K * 3, gm + n * 3);
        }
    });
  });
  return {v_sh, v_means};
}

// ----------------------------------------------------------------------------- binning

namespace {

// Per-camera tile lists: offsets [C*T+1] and Gaussian ids, depth-sorted within each tile
// (ties by Gaussian index).
template <typename T>
void bin_gaussians(const T* m2, const T* cn, const T* op, const T* dp, const int* rp, int64_t C, int64_t N,
                   int64_t W, int64_t H, at::Tensor& tile_offsets, at::Tensor& tile_ids) {
  const int tiles_x = int((W + kT - 1) / kT), tiles_y = int((H + kT - 1) / kT);
  const int64_t TT = int64_t(tiles_x) * tiles_y;
  std::vector<int32_t> rects(C * N * 4);
  at::parallel_for(0, C * N, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i % N;
      gs::tile_rect(m2 + i * 2, rp + i * 2, cn + i * 3, op[n], int(W), int(H), &rects[i * 4], &rects[i * 4 + 1],
                    &rects[i * 4 + 2], &rects[i * 4 + 3]);
    }
  });
  std::vector<int64_t> offsets(C * TT + 1, 0);
  std::vector<std::vector<int32_t>> order(C);
  const int nthreads = std::max(1, at::get_num_threads());
  for (int64_t c = 0; c < C; ++c) {
    std::vector<uint32_t> keys;
    std::vector<int32_t>& ids = order[c];
    for (int64_t n = 0; n < N; ++n) {
      const int32_t* r = &rects[(c * N + n) * 4];
      if (r[0] < r[1] && r[2] < r[3]) {
        keys.push_back(gs::depth_key(float(dp[c * N + n])));
        ids.push_back(int32_t(n));
      }
    }
    radix_sort_by_key(keys, ids);
    int64_t* cnt = offsets.data() + c * TT + 1;
#pragma omp parallel num_threads(nthreads) if (int64_t(ids.size()) > kParallelMin)
    {
#ifdef _OPENMP
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
      const int tid = 0, nt = 1;
#endif
      const int row0 = int(int64_t(tiles_y) * tid / nt), row1 = int(int64_t(tiles_y) * (tid + 1) / nt);
      for (int32_t n : ids) {
        const int32_t* r = &rects[(c * N + n) * 4];
        const int y0 = std::max(r[2], row0), y1 = std::min(r[3], row1);
        for (int y = y0; y < y1; ++y)
          for (int x = r[0]; x < r[1]; ++x) ++cnt[int64_t(y) * tiles_x + x];
      }
    }
  }
  for (int64_t i = 0; i < C * TT; ++i) offsets[i + 1] += offsets[i];
  const int64_t E = offsets[C * TT];
  tile_offsets = at::from_blob(offsets.data(), {C * TT + 1}, at::TensorOptions().dtype(at::kLong)).clone();
  tile_ids = at::empty({E}, at::TensorOptions().dtype(at::kInt));
  int32_t* out = tile_ids.data_ptr<int32_t>();
  for (int64_t c = 0; c < C; ++c) {
    const std::vector<int32_t>& ids = order[c];
#pragma omp parallel num_threads(nthreads) if (int64_t(ids.size()) > kParallelMin)
    {
#ifdef _OPENMP
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
      const int tid = 0, nt = 1;
#endif
      const int row0 = int(int64_t(tiles_y) * tid / nt), row1 = int(int64_t(tiles_y) * (tid + 1) / nt);
      std::vector<int64_t> cursor(size_t(std::max(0, row1 - row0)) * tiles_x);
      for (int y = row0; y < row1; ++y)
        for (int x = 0; x < tiles_x; ++x)
          cursor[size_t(y - row0) * tiles_x + x] = offsets[c * TT + int64_t(y) * tiles_x + x];
      for (int32_t n : ids) {
        const int32_t* r = &rects[(c * N + n) * 4];
        const int y0 = std::max(r[2], row0), y1 = std::min(r[3], row1);
        for (int y = y0; y < y1; ++y)
          for (int x = r[0]; x < r[1]; ++x) out[cursor[size_t(y - row0) * tiles_x + x]++] = n;
      }
    }
  }
}

}  // namespace

// ----------------------------------------------------------------------------- compositing

namespace {

// Per (camera, Gaussian): pixel bounding box of alpha >= 1/255 and the span radius^2, computed
// once instead of once per tile the Gaussian is listed in.
template <typename T>
void prepare_spans(const T* m2, const T* cn, const T* op, int64_t C, int64_t N, int64_t W, int64_t H,
                   std::vector<int32_t>& bbox, std::vector<T>& t2) {
  bbox.resize(C * N * 4);
  t2.resize(C * N);
  at::parallel_for(0, C * N, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T o = op[i % N];
      gs::alpha_bbox(m2 + i * 2, cn + i * 3, o, int(W), int(H), &bbox[i * 4], &bbox[i * 4 + 1], &bbox[i * 4 + 2],
                     &bbox[i * 4 + 3]);
      t2[i] = gs::span_radius2(o);
    }
  });
}

}  // namespace

namespace {

template <typename T>
void rasterize_fwd_impl(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                        const at::Tensor& opacities, const at::Tensor& depths, const at::Tensor& radii, int64_t C,
                        int64_t N, int64_t W, int64_t H, int tiles_x, int64_t TT, bool want_contributions,
                        at::Tensor& out_color, at::Tensor& out_trans, at::Tensor& out_depth, at::Tensor& out_last,
                        at::Tensor& contributions, at::Tensor& pixel_counts, at::Tensor& tile_offsets,
                        at::Tensor& tile_ids) {
    const T* m2 = means2d.data_ptr<T>();
  const T* cn = conics.data_ptr<T>();
  const T* col = colors.data_ptr<T>();
  const T* op = opacities.data_ptr<T>();
  const T* dp = depths.data_ptr<T>();
  bin_gaussians<T>(m2, cn, op, dp, radii.data_ptr<int>(), C, N, W, H, tile_offsets, tile_ids);
  std::vector<int32_t> bbox;
  std::vector<T> t2s;
  prepare_spans<T>(m2, cn, op, C, N, W, H, bbox, t2s);
  const int64_t* offs = tile_offsets.data_ptr<int64_t>();
  const int32_t* ids = tile_ids.data_ptr<int32_t>();
  T* oc = out_color.data_ptr<T>();
  T* ot = out_trans.data_ptr<T>();
  T* od = out_depth.data_ptr<T>();
  int* ol = out_last.data_ptr<int>();
  T* contrib = want_contributions ? contributions.data_ptr<T>() : nullptr;
  int* counts = want_contributions ? pixel_counts.data_ptr<int>() : nullptr;
  const T alpha_min = T(gs::kAlphaMin), alpha_max = T(gs::kAlphaMax), t_min = T(gs::kTransmittanceMin);
  const int nthreads = std::max(1, at::get_num_threads());
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (offs[C * TT] > kParallelMin)
  for (int64_t job = 0; job < C * TT; ++job) {
    const int64_t c = job / TT, tile = job % TT;
    const int ox = int(tile % tiles_x) * kT, oy = int(tile / tiles_x) * kT;
    const int tw = std::min<int>(kT, int(W) - ox), th = std::min<int>(kT, int(H) - oy);
    T Tr[kT * kT], acc[kT * kT][3], dacc[kT * kT];
    int last[kT * kT];
    bool done[kT * kT];
    for (int p = 0; p < kT * kT; ++p) {
      Tr[p] = 1;
      acc[p][0] = acc[p][1] = acc[p][2] = 0;
      dacc[p] = 0;
      last[p] = 0;
      done[p] = false;
    }
    int remaining = tw * th;
    const int64_t start = offs[c * TT + tile], end = offs[c * TT + tile + 1];
    for (int64_t k = start; k < end && remaining > 0; ++k) {
      const int64_t g = ids[k], cg = c * N + g;
      const T mx = m2[cg * 2], my = m2[cg * 2 + 1];
      const T ca = cn[cg * 3], cb = cn[cg * 3 + 1], cc = cn[cg * 3 + 2];
      const T o = op[g], depth = dp[cg];
      const T r = col[cg * 3], gg = col[cg * 3 + 1], bb = col[cg * 3 + 2];
      const int32_t* bb_ = &bbox[cg * 4];
      const int x0 = std::max(bb_[0], ox), x1 = std::min(bb_[1], ox + tw);
      const int y0 = std::max(bb_[2], oy), y1 = std::min(bb_[3], oy + th);
      T csum = 0;
      int ccount = 0;
      const T t2 = t2s[cg], pskip = T(-0.5) * t2;
      for (int y = y0; y < y1; ++y) {
        const T dy = my - (T(y) + T(0.5));
        int xa, xb;
        gs::row_span(mx, dy, cn + cg * 3, t2, x0, x1, &xa, &xb);
        const int rowbase = (y - oy) * kT - ox;
        const T cdy2 = cc * dy * dy, bdy = cb * dy;
        for (int x = xa; x < xb; ++x) {
          const int p = rowbase + x;
          if (done[p]) continue;
          const T dx = mx - (T(x) + T(0.5));
          const T power = T(-0.5) * (ca * dx * dx + cdy2) - bdy * dx;
          if (power > 0 || power < pskip) continue;
          const T alpha = std::min(alpha_max, o * std::exp(power));
          if (alpha < alpha_min) continue;
          const T next = Tr[p] * (1 - alpha);
          if (next < t_min) {
            done[p] = true;
            --remaining;
            continue;
          }
          const T w = alpha * Tr[p];
          acc[p][0] += w * r;
          acc[p][1] += w * gg;
          acc[p][2] += w * bb;
          dacc[p] += w * depth;
          Tr[p] = next;
          last[p] = int(k - start + 1);
          csum += w;
          ++ccount;
        }
      }
      if (contrib != nullptr && ccount > 0) {
        atomic_add(contrib + cg, csum);
atomic_add(counts + cg, ccount);
      }
    }
    for (int y = 0; y < th; ++y)
      for (int x = 0; x < tw; ++x) {
        const int p = y * kT + x;
        const int64_t pix = (c * H + oy + y) * W + ox + x;
        for (int ch = 0; ch < 3; ++ch) oc[pix * 3 + ch] = acc[p][ch];
        ot[pix] = Tr[p];
        od[pix] = dacc[p];
        ol[pix] = last[p];
      }
  }
}

template <typename T>
void rasterize_bwd_impl(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                        const at::Tensor& opacities, const at::Tensor& depths, int64_t C, int64_t N, int64_t W,
                        int64_t H, int tiles_x, int64_t TT, const at::Tensor& tile_offsets,
                        const at::Tensor& tile_ids, const at::Tensor& trans, const at::Tensor& last_t,
                        const at::Tensor& v_color, const at::Tensor& v_trans, const at::Tensor& v_depth,
                        at::Tensor& v_means2d, at::Tensor& v_conics, at::Tensor& v_colors, at::Tensor& v_opacities,
                        at::Tensor& v_depths) {
    const T* m2 = means2d.data_ptr<T>();
  const T* cn = conics.data_ptr<T>();
  const T* col = colors.data_ptr<T>();
  const T* op = opacities.data_ptr<T>();
  const T* dp = depths.data_ptr<T>();
  const int64_t* offs = tile_offsets.data_ptr<int64_t>();
  const int32_t* ids = tile_ids.data_ptr<int32_t>();
  const T* tr = trans.data_ptr<T>();
  const int* lst = last_t.data_ptr<int>();
  const T* vC = v_color.data_ptr<T>();
  const T* vT = v_trans.data_ptr<T>();
  const T* vD = v_depth.data_ptr<T>();
  T* gm2 = v_means2d.data_ptr<T>();
  T* gcn = v_conics.data_ptr<T>();
  T* gcol = v_colors.data_ptr<T>();
  T* gop = v_opacities.data_ptr<T>();
  T* gdp = v_depths.data_ptr<T>();
  std::vector<int32_t> bbox;
  std::vector<T> t2s;
  prepare_spans<T>(m2, cn, op, C, N, W, H, bbox, t2s);
  const T alpha_min = T(gs::kAlphaMin), alpha_max = T(gs::kAlphaMax);
  const int nthreads = std::max(1, at::get_num_threads());
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (offs[C * TT] > kParallelMin)
  for (int64_t job = 0; job < C * TT; ++job) {
    const int64_t c = job / TT, tile = job % TT;
    const int ox = int(tile % tiles_x) * kT, oy = int(tile / tiles_x) * kT;
    const int tw = std::min<int>(kT, int(W) - ox), th = std::min<int>(kT, int(H) - oy);
    T Tr[kT * kT], Tfin[kT * kT], Bc[kT * kT][3], Bd[kT * kT], gC[kT * kT][3], gT[kT * kT], gD[kT * kT];
    int last[kT * kT];
    int kmax = 0;
    for (int p = 0; p < kT * kT; ++p) last[p] = 0;
    for (int y = 0; y < th; ++y)
      for (int x = 0; x < tw; ++x) {
        const int p = y * kT + x;
        const int64_t pix = (c * H + oy + y) * W + ox + x;
        Tr[p] = Tfin[p] = tr[pix];
        last[p] = lst[pix];
        kmax = std::max(kmax, last[p]);
        for (int ch = 0; ch < 3; ++ch) {
          Bc[p][ch] = 0;
          gC[p][ch] = vC[pix * 3 + ch];
        }
        Bd[p] = 0;
        gT[p] = vT[pix];
        gD[p] = vD[pix];
      }
    const int64_t start = offs[c * TT + tile];
    for (int k = kmax - 1; k >= 0; --k) {
      const int64_t g = ids[start + k], cg = c * N + g;
      const T mx = m2[cg * 2], my = m2[cg * 2 + 1];
      const T ca = cn[cg * 3], cb = cn[cg * 3 + 1], cc = cn[cg * 3 + 2];
      const T o = op[g], depth = dp[cg];
      const T rgb[3] = {col[cg * 3], col[cg * 3 + 1], col[cg * 3 + 2]};
      const int32_t* bb_ = &bbox[cg * 4];
      const int x0 = std::max(bb_[0], ox), x1 = std::min(bb_[1], ox + tw);
      const int y0 = std::max(bb_[2], oy), y1 = std::min(bb_[3], oy + th);
      T v_rgb[3] = {0, 0, 0}, v_o = 0, v_m[2] = {0, 0}, v_c[3] = {0, 0, 0}, v_d = 0;
      bool touched = false;
      const T t2 = t2s[cg], pskip = T(-0.5) * t2;
      for (int y = y0; y < y1; ++y) {
        const T dy = my - (T(y) + T(0.5));
        int xa, xb;
        gs::row_span(mx, dy, cn + cg * 3, t2, x0, x1, &xa, &xb);
        const int rowbase = (y - oy) * kT - ox;
        const T cdy2 = cc * dy * dy, bdy = cb * dy;
        for (int x = xa; x < xb; ++x) {
          const int p = rowbase + x;
          if (k >= last[p]) continue;
          const T dx = mx - (T(x) + T(0.5));
          const T power = T(-0.5) * (ca * dx * dx + cdy2) - bdy * dx;
          if (power > 0 || power < pskip) continue;
          const T G = std::exp(power);
          const T a0 = o * G;
          const T alpha = std::min(alpha_max, a0);
          if (alpha < alpha_min) continue;
          touched = true;
          const T one_m = 1 - alpha;
          const T Ti = Tr[p] / one_m;
          const T w = alpha * Ti;
          T v_alpha = 0;
          for (int ch = 0; ch < 3; ++ch) {
            v_rgb[ch] += w * gC[p][ch];
            v_alpha += (rgb[ch] - Bc[p][ch]) * gC[p][ch];
            Bc[p][ch] = alpha * rgb[ch] + one_m * Bc[p][ch];
          }
          v_d += w * gD[p];
          v_alpha += (depth - Bd[p]) * gD[p];
          v_alpha *= Ti;
          v_alpha -= gT[p] * Tfin[p] / one_m;
          Bd[p] = alpha * depth + one_m * Bd[p];
          Tr[p] = Ti;
          if (a0 > alpha_max) continue;  // alpha is clamped: no gradient to opacity or shape
          v_o += G * v_alpha;
          const T v_power = a0 * v_alpha;
          v_c[0] += T(-0.5) * dx * dx * v_power;
          v_c[1] += -dx * dy * v_power;
          v_c[2] += T(-0.5) * dy * dy * v_power;
          v_m[0] += -(ca * dx + cb * dy) * v_power;
          v_m[1] += -(cc * dy + cb * dx) * v_power;
        }
      }
      if (!touched) continue;
      for (int ch = 0; ch < 3; ++ch) atomic_add(gcol + cg * 3 + ch, v_rgb[ch]);
      for (int i = 0; i < 3; ++i) atomic_add(gcn + cg * 3 + i, v_c[i]);
      atomic_add(gm2 + cg * 2, v_m[0]);
      atomic_add(gm2 + cg * 2 + 1, v_m[1]);
      atomic_add(gdp + cg, v_d);
      atomic_add(gop + g, v_o);
    }
  }
}

}  // namespace


std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
rasterize_fwd(const at::Tensor& means2d_in, const at::Tensor& conics_in, const at::Tensor& colors_in,
              const at::Tensor& opacities_in, const at::Tensor& depths_in, const at::Tensor& radii_in,
              int64_t width, int64_t height, bool want_contributions) {
  check_inputs_common(means2d_in, "means2d");
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
  auto pixel_counts = want_contributions ? at::zeros({C, N}, opts.dtype(at::kInt)) : at::zeros({0}, opts.dtype(at::kInt));
  at::Tensor tile_offsets, tile_ids;
  VM_RASTER_DISPATCH(means2d.scalar_type(), "rasterize_fwd", [&] {
    rasterize_fwd_impl<scalar_t>(means2d, conics, colors, opacities, depths, radii, C, N, W, H, tiles_x, TT,
                                 want_contributions, out_color, out_trans, out_depth, out_last, contributions,
                                 pixel_counts, tile_offsets, tile_ids);
  });
  return {out_color, out_trans, out_depth, out_last, tile_offsets, tile_ids, contributions, pixel_counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rasterize_bwd(
    const at::Tensor& means2d_in, const at::Tensor& conics_in, const at::Tensor& colors_in,
    const at::Tensor& opacities_in, const at::Tensor& depths_in, int64_t width, int64_t height,
    const at::Tensor& tile_offsets, const at::Tensor& tile_ids, const at::Tensor& trans_in,
    const at::Tensor& last_in, const at::Tensor& v_color_in, const at::Tensor& v_trans_in,
    const at::Tensor& v_depth_in) {
  check_inputs_common(means2d_in, "means2d");
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
  VM_RASTER_DISPATCH(means2d.scalar_type(), "rasterize_bwd", [&] {
    rasterize_bwd_impl<scalar_t>(means2d, conics, colors, opacities, depths, C, N, W, H, tiles_x, TT, tile_offsets,
                                 tile_ids, trans, last_t, v_color, v_trans, v_depth, v_means2d, v_conics, v_colors,
                                 v_opacities, v_depths);
  });
  return {v_means2d, v_conics, v_colors, v_opacities, v_depths};
}

}  // namespace cpu
}  // namespace visionmoe
