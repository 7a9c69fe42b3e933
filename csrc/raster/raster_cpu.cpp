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
// as soon as every pixel is saturated (transmittance < 1e-4). With several threads a flush
// goes to the tile entry's own slot and the slots are summed afterwards in the order one
// thread would add them: no atomics, and results that do not depend on the thread count.
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#define VM_HAVE_X86_SIMD 1
#include <immintrin.h>
#endif
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

// Scratch vectors kept by the calling thread between renders: a fresh allocation of the tens of
// MB a 4-view 512-px render needs page-faults at every first touch (a tenth of a refinement
// step's backward). A buffer that grew past kScratchKeep is freed after its call.
constexpr size_t kScratchKeep = size_t(64) << 20;

template <typename V, int Tag>
V& scratch() {
  thread_local V v;
  return v;
}

template <typename V>
struct ScratchRelease {  // frees a large scratch vector at the end of the call
  V& v;
  ~ScratchRelease() {
    if (v.capacity() * sizeof(typename V::value_type) > kScratchKeep) V().swap(v);
  }
};

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

// Per (tile, Gaussian) partial sums. One thread adds them straight into the outputs; several
// write them to the tile entry's slot (its index k in the tile lists, so no two threads share
// one) and reduce_*_slots adds the slots in the order one thread would have: the results are
// bit-identical for every thread count (atomic adds would sum in a varying order).
template <typename T>
inline void flush_fwd(T csum, int ccount, int64_t k, int64_t cg, T* cslots, int* nslots, T* contrib, int* counts) {
  if (cslots != nullptr) {
    cslots[k] = csum;
    nslots[k] = ccount;
  } else {
    contrib[cg] += csum;
    counts[cg] += ccount;
  }
}

// Backward partials, in slot order: colour (3), conic (3), 2D mean (2), depth, opacity.
constexpr int kBwdSlot = 10;

template <typename T>
inline void add_bwd(const T* v, int64_t cg, int64_t g, T* gm2, T* gcn, T* gcol, T* gop, T* gdp) {
  for (int i = 0; i < 3; ++i) gcol[cg * 3 + i] += v[i];
  for (int i = 0; i < 3; ++i) gcn[cg * 3 + i] += v[3 + i];
  gm2[cg * 2] += v[6];
  gm2[cg * 2 + 1] += v[7];
  gdp[cg] += v[8];
  gop[g] += v[9];
}

template <typename T>
inline void flush_bwd(const T* v, int64_t k, int64_t cg, int64_t g, T* slots, T* gm2, T* gcn, T* gcol, T* gop,
                      T* gdp) {
  if (slots != nullptr) {
    std::copy(v, v + kBwdSlot, slots + k * kBwdSlot);
  } else {
    add_bwd(v, cg, g, gm2, gcn, gcol, gop, gdp);
  }
}

// One thread visits a tile's entries front to back in the forward pass, back to front in the
// backward pass; slots of entries it would skip hold zeros, and x + 0 == x.
template <typename T>
void reduce_fwd_slots(const std::vector<T>& cslots, const std::vector<int>& nslots, const int64_t* offs,
                      const int32_t* ids, int64_t C, int64_t N, int64_t TT, T* contrib, int* counts) {
  for (int64_t job = 0; job < C * TT; ++job) {
    const int64_t c = job / TT;
    for (int64_t k = offs[job]; k < offs[job + 1]; ++k) {
      const int64_t cg = c * N + ids[k];
      contrib[cg] += cslots[k];
      counts[cg] += nslots[k];
    }
  }
}

// Camera c's rows of the per-(camera, Gaussian) gradients are its own, so cameras reduce in
// parallel; the opacity gradient, shared by every camera, is summed after them in one thread's
// order. Each sum keeps the order of the serial loop (the same bits).
template <typename T>
void reduce_bwd_slots(const T* slots, const int64_t* offs, const int32_t* ids, int64_t C, int64_t N, int64_t TT,
                      T* gm2, T* gcn, T* gcol, T* gop, T* gdp, int nthreads) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (C > 1)
  for (int64_t c = 0; c < C; ++c)
    for (int64_t job = c * TT; job < (c + 1) * TT; ++job)
      for (int64_t k = offs[job + 1] - 1; k >= offs[job]; --k) {
        const T* v = slots + k * kBwdSlot;
        const int64_t cg = c * N + ids[k];
        for (int i = 0; i < 3; ++i) gcol[cg * 3 + i] += v[i];
        for (int i = 0; i < 3; ++i) gcn[cg * 3 + i] += v[3 + i];
        gm2[cg * 2] += v[6];
        gm2[cg * 2 + 1] += v[7];
        gdp[cg] += v[8];
      }
  for (int64_t job = 0; job < C * TT; ++job)
    for (int64_t k = offs[job + 1] - 1; k >= offs[job]; --k) gop[ids[k]] += slots[k * kBwdSlot + 9];
}

bool cpu_has_avx2_fma();

// The AVX2 float32 compositing kernels run when the CPU has AVX2+FMA, unless the environment
// variable VISIONMOE_NO_SIMD is set to a non-zero value (forces the scalar path; tests use it).
inline bool simd_enabled() {
#ifdef VM_HAVE_X86_SIMD
  return cpu_has_avx2_fma();
#else
  return false;
#endif
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
      // Blocks of Gaussians: the world covariance once per Gaussian (it does not depend on the
      // camera), then camera by camera so each camera's outputs are written contiguously.
      constexpr int64_t kBlock = 64;
      T sigma[kBlock][3][3], qnorm[kBlock];
      bool ok[kBlock];
      for (int64_t b0 = begin; b0 < end; b0 += kBlock) {
        const int64_t nb = std::min(kBlock, end - b0);
        for (int64_t j = 0; j < nb; ++j) {
          const int64_t n = b0 + j;
          bool fin = gs::finite(op[n]);
          for (int i = 0; i < 3; ++i) fin = fin && gs::finite(mp[n * 3 + i]) && gs::finite(sp[n * 3 + i]);
          for (int i = 0; i < 4; ++i) fin = fin && gs::finite(qp[n * 4 + i]);
          for (int64_t f = 0; f < F && fin; ++f) fin = gs::finite(fp[n * F + f]);
          ok[j] = fin;  // non-finite: excluded (zeros, radius 0)
          if (!fin) continue;
          T qn[4], s[3];
          gs::Mat3<T> R;
          gs::covariance3d(qp + n * 4, sp + n * 3, sigma[j], &R, qn, &qnorm[j], s);
        }
        for (int64_t c = 0; c < C; ++c)
          for (int64_t j = 0; j < nb; ++j) {
            if (!ok[j]) continue;
            const int64_t n = b0 + j;
            const auto p = gs::project_from_covariance(cams[c], mp + n * 3, sigma[j], qnorm[j], T(near_plane),
                                                       T(far_plane));
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
      for (int64_t n = begin; n < end; ++n) {
        // the world covariance once per Gaussian, not once per camera (the same arithmetic)
        bool have_cov = false;
        T sigma[3][3], qn[4], qnorm, s[3];
        gs::Mat3<T> R;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t cn_ = c * N + n;
          if (rp[cn_ * 2] <= 0 || rp[cn_ * 2 + 1] <= 0) continue;
          // no gradient reached this projection (hidden, or behind saturated pixels): it adds zeros
          const T* g2 = vm2 + cn_ * 2;
          const T* gc = vcn + cn_ * 3;
          if (g2[0] == 0 && g2[1] == 0 && gc[0] == 0 && gc[1] == 0 && gc[2] == 0 && vdp[cn_] == 0) continue;
          if (!have_cov) {
            gs::covariance3d(qp + n * 4, sp + n * 3, sigma, &R, qn, &qnorm, s);
            have_cov = true;
          }
          gs::project_vjp_cov(cams[c], mp + n * 3, sigma, R, qn, qnorm, s, vm2 + cn_ * 2, vcn + cn_ * 3, vdp[cn_],
                              gm + n * 3, gq + n * 4, gs_ + n * 3);
        }
      }
    });
  });
  return {v_means, v_quats, v_log_scales};
}

// ----------------------------------------------------------------------------- SH

// World-space centre of each camera (SH view directions need only the pose, not intrinsics).
template <typename T>
std::vector<gs::Vec3<T>> camera_centres(const at::Tensor& viewmats, int64_t C) {
  std::vector<gs::Vec3<T>> centres(C);
  const T* vp = viewmats.data_ptr<T>();
  const T identityK[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  for (int64_t c = 0; c < C; ++c) centres[c] = gs::camera_center(gs::load_camera(vp + c * 16, identityK, 1, 1));
  return centres;
}

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
    const auto centres = camera_centres<T>(viewmats, C);
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
    const auto centres = camera_centres<T>(viewmats, C);
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
  // Camera c's listed Gaussians, depth-sorted (one thread per camera).
  auto sort_camera = [&](int64_t c) {
    std::vector<uint32_t> keys;
    std::vector<int32_t>& ids = order[c];
    keys.reserve(size_t(N));
    ids.reserve(size_t(N));
    for (int64_t n = 0; n < N; ++n) {
      const int32_t* r = &rects[(c * N + n) * 4];
      if (r[0] < r[1] && r[2] < r[3]) {
        keys.push_back(gs::depth_key(float(dp[c * N + n])));
        ids.push_back(int32_t(n));
      }
    }
    radix_sort_by_key(keys, ids);
  };
  // Entries per tile of camera c in tile rows [row0, row1), then the ids written in depth order.
  auto count_rows = [&](int64_t c, int row0, int row1) {
    int64_t* cnt = offsets.data() + c * TT + 1;
    for (int32_t n : order[c]) {
      const int32_t* r = &rects[(c * N + n) * 4];
      const int y0 = std::max(r[2], row0), y1 = std::min(r[3], row1);
      for (int y = y0; y < y1; ++y)
        for (int x = r[0]; x < r[1]; ++x) ++cnt[int64_t(y) * tiles_x + x];
    }
  };
  int32_t* out = nullptr;
  auto scatter_rows = [&](int64_t c, int row0, int row1) {
    std::vector<int64_t> cursor(size_t(std::max(0, row1 - row0)) * tiles_x);
    for (int y = row0; y < row1; ++y)
      for (int x = 0; x < tiles_x; ++x)
        cursor[size_t(y - row0) * tiles_x + x] = offsets[c * TT + int64_t(y) * tiles_x + x];
    for (int32_t n : order[c]) {
      const int32_t* r = &rects[(c * N + n) * 4];
      const int y0 = std::max(r[2], row0), y1 = std::min(r[3], row1);
      for (int y = y0; y < y1; ++y)
        for (int x = r[0]; x < r[1]; ++x) out[cursor[size_t(y - row0) * tiles_x + x]++] = n;
    }
  };
  // Several cameras: one thread per camera, so the sorts run in parallel too (16 views of a
  // 500k-Gaussian scene: the serial sorts were a quarter of a render). One camera: its tile
  // rows are split between the threads. Either way each camera's lists are the same.
  const bool by_camera = nthreads > 1 && C > 1 && C * N > kParallelMin;
  const auto row_split = [&](int64_t c, auto&& body) {
#pragma omp parallel num_threads(nthreads) if (int64_t(order[c].size()) > kParallelMin)
    {
#ifdef _OPENMP
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
      const int tid = 0, nt = 1;
#endif
      body(c, int(int64_t(tiles_y) * tid / nt), int(int64_t(tiles_y) * (tid + 1) / nt));
    }
  };
  if (by_camera) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t c = 0; c < C; ++c) {
      sort_camera(c);
      count_rows(c, 0, tiles_y);
    }
  } else {
    for (int64_t c = 0; c < C; ++c) {
      sort_camera(c);
      row_split(c, count_rows);
    }
  }
  for (int64_t i = 0; i < C * TT; ++i) offsets[i + 1] += offsets[i];
  const int64_t E = offsets[C * TT];
  tile_offsets = at::from_blob(offsets.data(), {C * TT + 1}, at::TensorOptions().dtype(at::kLong)).clone();
  tile_ids = at::empty({E}, at::TensorOptions().dtype(at::kInt));
  out = tile_ids.data_ptr<int32_t>();
  if (by_camera) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t c = 0; c < C; ++c) scatter_rows(c, 0, tiles_y);
  } else {
    for (int64_t c = 0; c < C; ++c) row_split(c, scatter_rows);
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

// ----------------------------------------------------------------------------- AVX2 compositing
//
// float32 tile kernels for x86-64 CPUs with AVX2+FMA (picked at run time; the scalar templates
// stay the fallback and the float64 path). Same per-pixel semantics as the scalar loops: a
// Gaussian's row span inside the tile is covered by the tile row's two aligned 8-pixel blocks,
// lanes outside the span or already finished are masked, and per-pixel state lives in
// structure-of-arrays tile buffers. exp is a Cody-Waite range reduction + degree-6 polynomial
// (Cephes expf, ~1-2 ulp) on the argument range [-5.6, 0] the span test allows.
#if defined(__x86_64__) || defined(__i386__)
namespace {

bool cpu_has_avx2_fma() {
  static const bool ok = [] {
    __builtin_cpu_init();
    if (const char* e = std::getenv("VISIONMOE_NO_SIMD")) {
      if (e[0] != '\0' && e[0] != '0') return false;
    }
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return ok;
}

#define VM_AVX2 __attribute__((target("avx2,fma")))

VM_AVX2 inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

VM_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lanes [lo, hi) of the 8-pixel block starting at tile column bx.
VM_AVX2 inline __m256i span_mask(int bx, int lo, int hi) {
  const __m256i lx = _mm256_add_epi32(_mm256_set1_epi32(bx), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_and_si256(_mm256_cmpgt_epi32(lx, _mm256_set1_epi32(lo - 1)),
                          _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), lx));
}

struct TileCtx {
  int64_t c, N;
  int ox, oy, tw, th;
  int64_t start, end;
};

// Per (camera, Gaussian) record read by the AVX2 tile kernels: one 64-byte line instead of five
// scattered arrays (means2d, conics, colours, opacities/depths, boxes) per tile entry.
struct alignas(64) GRec {
  float mx, my, ca, cb, cc, o, r, g, b, depth, pskip, pad;
  int32_t x0, x1, y0, y1;  // alpha >= 1/255 pixel box
};

void prepare_records(const float* m2, const float* cn, const float* col, const float* op, const float* dp,
                     int64_t C, int64_t N, int64_t W, int64_t H, std::vector<GRec>& recs) {
  recs.resize(C * N);
  at::parallel_for(0, C * N, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      GRec& r = recs[i];
      const float o = op[i % N];
      gs::alpha_bbox(m2 + i * 2, cn + i * 3, o, int(W), int(H), &r.x0, &r.x1, &r.y0, &r.y1);
      r.mx = m2[i * 2];
      r.my = m2[i * 2 + 1];
      r.ca = cn[i * 3];
      r.cb = cn[i * 3 + 1];
      r.cc = cn[i * 3 + 2];
      r.o = o;
      r.r = col[i * 3];
      r.g = col[i * 3 + 1];
      r.b = col[i * 3 + 2];
      r.depth = dp[i];
      r.pskip = -0.5f * gs::span_radius2(o);
      r.pad = 0.f;
    }
  });
}

// The (one or two) aligned 8-pixel blocks of a tile row covering the columns [lo, hi) of a
// Gaussian's box: lane masks and the per-lane dx = mx - pixel centre. The exact per-pixel
// alpha test decides, so visiting the box (not the ellipse's row span) changes no result.
struct Blocks {
  int n, bx[2];
  __m256i m[2];
  __m256 dx[2], adx2[2];
};

VM_AVX2 inline void make_blocks(const GRec& g, int ox, int lo, int hi, Blocks& B) {
  const __m256 half_iota = _mm256_setr_ps(0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f);
  const __m256 vmx = _mm256_set1_ps(g.mx), vca = _mm256_set1_ps(g.ca);
  const int b0 = lo & ~7;
  B.n = (b0 + 8 < hi) ? 2 : 1;
  for (int j = 0; j < 2; ++j) {
    const int bx = b0 + 8 * j;
    B.bx[j] = bx;
    B.m[j] = span_mask(bx, lo, hi);
    B.dx[j] = _mm256_sub_ps(vmx, _mm256_add_ps(_mm256_set1_ps(float(ox + bx)), half_iota));
    B.adx2[j] = _mm256_mul_ps(_mm256_mul_ps(vca, B.dx[j]), B.dx[j]);
  }
}

// Forward of one tile. Writes colour (no background), transmittance, depth and last index.
VM_AVX2 void fwd_tile_avx2(const TileCtx& t, const int32_t* ids, const GRec* recs, float* contrib, int* counts,
                           float* cslots, int* nslots, int64_t W, int64_t H, float* oc, float* ot, float* od,
                           int* ol) {
  constexpr int P = kT * kT;
  alignas(32) float Tr[P], aR[P], aG[P], aB[P], aD[P];
  alignas(32) int32_t last[P], done[P];
  for (int p = 0; p < P; ++p) {
    Tr[p] = 1.f;
    aR[p] = aG[p] = aB[p] = aD[p] = 0.f;
    last[p] = 0;
    done[p] = 0;
  }
  int remaining = t.tw * t.th;
  const __m256 v_amax = _mm256_set1_ps(float(gs::kAlphaMax)), v_amin = _mm256_set1_ps(float(gs::kAlphaMin));
  const __m256 v_tmin = _mm256_set1_ps(float(gs::kTransmittanceMin)), v_one = _mm256_set1_ps(1.f);
  const __m256 v_mhalf = _mm256_set1_ps(-0.5f), v_zero = _mm256_setzero_ps();
  const GRec* cr = recs + t.c * t.N;
  Blocks B;
  for (int64_t k = t.start; k < t.end && remaining > 0; ++k) {
    if (k + 4 < t.end) _mm_prefetch(reinterpret_cast<const char*>(cr + ids[k + 4]), _MM_HINT_T0);
    const int64_t g = ids[k], cg = t.c * t.N + g;
    const GRec& R = cr[g];
    const int x0 = std::max(R.x0, t.ox), x1 = std::min(R.x1, t.ox + t.tw);
    const int y0 = std::max(R.y0, t.oy), y1 = std::min(R.y1, t.oy + t.th);
    if (x0 >= x1 || y0 >= y1) continue;
    make_blocks(R, t.ox, x0 - t.ox, x1 - t.ox, B);
    const __m256 vr = _mm256_set1_ps(R.r), vg = _mm256_set1_ps(R.g), vb = _mm256_set1_ps(R.b);
    const __m256 vdepth = _mm256_set1_ps(R.depth), vo = _mm256_set1_ps(R.o), vpskip = _mm256_set1_ps(R.pskip);
    const __m256 vk = _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(k - t.start + 1)));
    __m256 vcsum = v_zero;
    int ccount = 0;
    for (int y = y0; y < y1; ++y) {
      const float dy = R.my - (float(y) + 0.5f);
      const __m256 vcdy2 = _mm256_set1_ps(R.cc * dy * dy), vbdy = _mm256_set1_ps(R.cb * dy);
      const int row = (y - t.oy) * kT;
      for (int j = 0; j < B.n; ++j) {
        const int p = row + B.bx[j];
        const __m256i dn = _mm256_load_si256(reinterpret_cast<const __m256i*>(done + p));
        const __m256i live = _mm256_andnot_si256(dn, B.m[j]);
        if (_mm256_testz_si256(live, live)) continue;
        const __m256 power = _mm256_sub_ps(_mm256_mul_ps(v_mhalf, _mm256_add_ps(B.adx2[j], vcdy2)),
                                           _mm256_mul_ps(vbdy, B.dx[j]));
        __m256 valid = _mm256_and_ps(_mm256_castsi256_ps(live),
                                     _mm256_and_ps(_mm256_cmp_ps(power, v_zero, _CMP_LE_OQ),
                                                   _mm256_cmp_ps(power, vpskip, _CMP_GE_OQ)));
        if (_mm256_testz_ps(valid, valid)) continue;
        const __m256 alpha = _mm256_min_ps(v_amax, _mm256_mul_ps(vo, exp_avx2(power)));
        valid = _mm256_and_ps(valid, _mm256_cmp_ps(alpha, v_amin, _CMP_GE_OQ));
        if (_mm256_testz_ps(valid, valid)) continue;
        const __m256 trv = _mm256_load_ps(Tr + p);
        const __m256 next = _mm256_mul_ps(trv, _mm256_sub_ps(v_one, alpha));
        const __m256 term = _mm256_and_ps(valid, _mm256_cmp_ps(next, v_tmin, _CMP_LT_OQ));
        const int tm = _mm256_movemask_ps(term);
        if (tm) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(done + p), _mm256_or_si256(dn, _mm256_castps_si256(term)));
          remaining -= __builtin_popcount(unsigned(tm));
        }
        const __m256 acc = _mm256_andnot_ps(term, valid);
        const int am = _mm256_movemask_ps(acc);
        if (!am) continue;
        const __m256 w = _mm256_and_ps(_mm256_mul_ps(alpha, trv), acc);
        _mm256_store_ps(aR + p, _mm256_add_ps(_mm256_load_ps(aR + p), _mm256_mul_ps(w, vr)));
        _mm256_store_ps(aG + p, _mm256_add_ps(_mm256_load_ps(aG + p), _mm256_mul_ps(w, vg)));
        _mm256_store_ps(aB + p, _mm256_add_ps(_mm256_load_ps(aB + p), _mm256_mul_ps(w, vb)));
        _mm256_store_ps(aD + p, _mm256_add_ps(_mm256_load_ps(aD + p), _mm256_mul_ps(w, vdepth)));
        _mm256_store_ps(Tr + p, _mm256_blendv_ps(trv, next, acc));
        _mm256_store_ps(reinterpret_cast<float*>(last + p),
                        _mm256_blendv_ps(_mm256_load_ps(reinterpret_cast<const float*>(last + p)), vk, acc));
        vcsum = _mm256_add_ps(vcsum, w);
        ccount += __builtin_popcount(unsigned(am));
      }
    }
    if (contrib != nullptr && ccount > 0) flush_fwd(hsum_avx2(vcsum), ccount, k, cg, cslots, nslots, contrib, counts);
  }
  for (int y = 0; y < t.th; ++y)
    for (int x = 0; x < t.tw; ++x) {
      const int p = y * kT + x;
      const int64_t pix = (t.c * H + t.oy + y) * W + t.ox + x;
      oc[pix * 3] = aR[p];
      oc[pix * 3 + 1] = aG[p];
      oc[pix * 3 + 2] = aB[p];
      ot[pix] = Tr[p];
      od[pix] = aD[p];
      ol[pix] = last[p];
    }
}

// Backward of one tile (reverse order from each pixel's last index).
VM_AVX2 void bwd_tile_avx2(const TileCtx& t, const int32_t* ids, const GRec* recs, const float* tr, const int* lst,
                           const float* vC, const float* vT, const float* vD, float* slots, int64_t W, int64_t H,
                           float* gm2, float* gcn, float* gcol, float* gop, float* gdp) {
  constexpr int P = kT * kT;
  alignas(32) float Tr[P], Tf[P], BR[P], BG[P], BB[P], Bd[P], gR[P], gG[P], gB[P], gT[P], gD[P];
  alignas(32) int32_t last[P];
  for (int p = 0; p < P; ++p) {
    Tr[p] = Tf[p] = 1.f;
    BR[p] = BG[p] = BB[p] = Bd[p] = gR[p] = gG[p] = gB[p] = gT[p] = gD[p] = 0.f;
    last[p] = 0;
  }
  int kmax = 0;
  for (int y = 0; y < t.th; ++y)
    for (int x = 0; x < t.tw; ++x) {
      const int p = y * kT + x;
      const int64_t pix = (t.c * H + t.oy + y) * W + t.ox + x;
      Tr[p] = tr[pix];
      // gT * T_final / (1 - alpha) is the transmittance term of v_alpha; keep gT * T_final.
      Tf[p] = vT[pix] * tr[pix];
      last[p] = lst[pix];
      kmax = std::max(kmax, last[p]);
      gR[p] = vC[pix * 3];
      gG[p] = vC[pix * 3 + 1];
      gB[p] = vC[pix * 3 + 2];
      gD[p] = vD[pix];
    }
  (void)gT;
  const __m256 v_amax = _mm256_set1_ps(float(gs::kAlphaMax)), v_amin = _mm256_set1_ps(float(gs::kAlphaMin));
  const __m256 v_one = _mm256_set1_ps(1.f), v_mhalf = _mm256_set1_ps(-0.5f), v_zero = _mm256_setzero_ps();
  const GRec* cr = recs + t.c * t.N;
  Blocks B;
  for (int k = kmax - 1; k >= 0; --k) {
    if (k >= 4) _mm_prefetch(reinterpret_cast<const char*>(cr + ids[t.start + k - 4]), _MM_HINT_T0);
    const int64_t g = ids[t.start + k], cg = t.c * t.N + g;
    const GRec& R = cr[g];
    const int x0 = std::max(R.x0, t.ox), x1 = std::min(R.x1, t.ox + t.tw);
    const int y0 = std::max(R.y0, t.oy), y1 = std::min(R.y1, t.oy + t.th);
    if (x0 >= x1 || y0 >= y1) continue;
    make_blocks(R, t.ox, x0 - t.ox, x1 - t.ox, B);
    const __m256 vr = _mm256_set1_ps(R.r), vg = _mm256_set1_ps(R.g), vb = _mm256_set1_ps(R.b);
    const __m256 vdepth = _mm256_set1_ps(R.depth), vo = _mm256_set1_ps(R.o), vpskip = _mm256_set1_ps(R.pskip);
    const __m256 vca = _mm256_set1_ps(R.ca), vcb = _mm256_set1_ps(R.cb), vcc = _mm256_set1_ps(R.cc);
    const __m256i vkk = _mm256_set1_epi32(k);
    __m256 a_r = v_zero, a_g = v_zero, a_b = v_zero, a_o = v_zero, a_m0 = v_zero, a_m1 = v_zero;
    __m256 a_c0 = v_zero, a_c1 = v_zero, a_c2 = v_zero, a_d = v_zero;
    bool touched = false;
    for (int y = y0; y < y1; ++y) {
      const float dy = R.my - (float(y) + 0.5f);
      const int row = (y - t.oy) * kT;
      const __m256 vdy = _mm256_set1_ps(dy);
      const __m256 vcdy2 = _mm256_set1_ps(R.cc * dy * dy), vbdy = _mm256_set1_ps(R.cb * dy);
      for (int j = 0; j < B.n; ++j) {
        const int p = row + B.bx[j];
        const __m256i lv = _mm256_load_si256(reinterpret_cast<const __m256i*>(last + p));
        const __m256i live = _mm256_and_si256(_mm256_cmpgt_epi32(lv, vkk), B.m[j]);
        if (_mm256_testz_si256(live, live)) continue;
        const __m256 dx = B.dx[j];
        const __m256 power = _mm256_sub_ps(_mm256_mul_ps(v_mhalf, _mm256_add_ps(B.adx2[j], vcdy2)),
                                           _mm256_mul_ps(vbdy, dx));
        __m256 valid = _mm256_and_ps(_mm256_castsi256_ps(live),
                                     _mm256_and_ps(_mm256_cmp_ps(power, v_zero, _CMP_LE_OQ),
                                                   _mm256_cmp_ps(power, vpskip, _CMP_GE_OQ)));
        if (_mm256_testz_ps(valid, valid)) continue;
        const __m256 G = exp_avx2(power);
        const __m256 a0 = _mm256_mul_ps(vo, G);
        const __m256 alpha = _mm256_min_ps(v_amax, a0);
        valid = _mm256_and_ps(valid, _mm256_cmp_ps(alpha, v_amin, _CMP_GE_OQ));
        if (_mm256_testz_ps(valid, valid)) continue;
        touched = true;
        const __m256 one_m = _mm256_sub_ps(v_one, alpha);
        const __m256 inv = _mm256_div_ps(v_one, one_m);
        const __m256 trv = _mm256_load_ps(Tr + p);
        const __m256 Ti = _mm256_mul_ps(trv, inv);
        const __m256 w = _mm256_and_ps(_mm256_mul_ps(alpha, Ti), valid);
        const __m256 gr = _mm256_load_ps(gR + p), gg = _mm256_load_ps(gG + p), gb = _mm256_load_ps(gB + p);
        const __m256 gd = _mm256_load_ps(gD + p);
        const __m256 br = _mm256_load_ps(BR + p), bg = _mm256_load_ps(BG + p), bbv = _mm256_load_ps(BB + p);
        const __m256 bd = _mm256_load_ps(Bd + p);
        a_r = _mm256_add_ps(a_r, _mm256_mul_ps(w, gr));
        a_g = _mm256_add_ps(a_g, _mm256_mul_ps(w, gg));
        a_b = _mm256_add_ps(a_b, _mm256_mul_ps(w, gb));
        a_d = _mm256_add_ps(a_d, _mm256_mul_ps(w, gd));
        __m256 v_alpha = _mm256_mul_ps(_mm256_sub_ps(vr, br), gr);
        v_alpha = _mm256_add_ps(v_alpha, _mm256_mul_ps(_mm256_sub_ps(vg, bg), gg));
        v_alpha = _mm256_add_ps(v_alpha, _mm256_mul_ps(_mm256_sub_ps(vb, bbv), gb));
        v_alpha = _mm256_add_ps(v_alpha, _mm256_mul_ps(_mm256_sub_ps(vdepth, bd), gd));
        v_alpha = _mm256_mul_ps(v_alpha, Ti);
        v_alpha = _mm256_sub_ps(v_alpha, _mm256_mul_ps(_mm256_load_ps(Tf + p), inv));
        _mm256_store_ps(BR + p, _mm256_blendv_ps(br, _mm256_add_ps(_mm256_mul_ps(alpha, vr), _mm256_mul_ps(one_m, br)), valid));
        _mm256_store_ps(BG + p, _mm256_blendv_ps(bg, _mm256_add_ps(_mm256_mul_ps(alpha, vg), _mm256_mul_ps(one_m, bg)), valid));
        _mm256_store_ps(BB + p, _mm256_blendv_ps(bbv, _mm256_add_ps(_mm256_mul_ps(alpha, vb), _mm256_mul_ps(one_m, bbv)), valid));
        _mm256_store_ps(Bd + p, _mm256_blendv_ps(bd, _mm256_add_ps(_mm256_mul_ps(alpha, vdepth), _mm256_mul_ps(one_m, bd)), valid));
        _mm256_store_ps(Tr + p, _mm256_blendv_ps(trv, Ti, valid));
        // clamped alpha: no gradient to opacity or shape
        const __m256 gm = _mm256_and_ps(valid, _mm256_cmp_ps(a0, v_amax, _CMP_LE_OQ));
        if (_mm256_testz_ps(gm, gm)) continue;
        const __m256 v_power = _mm256_and_ps(_mm256_mul_ps(a0, v_alpha), gm);
        a_o = _mm256_add_ps(a_o, _mm256_and_ps(_mm256_mul_ps(G, v_alpha), gm));
        const __m256 dxp = _mm256_mul_ps(dx, v_power);
        a_c0 = _mm256_add_ps(a_c0, _mm256_mul_ps(dx, dxp));                       // * -0.5 at flush
        a_c1 = _mm256_add_ps(a_c1, _mm256_mul_ps(dxp, vdy));                      // * -1 at flush
        a_c2 = _mm256_add_ps(a_c2, _mm256_mul_ps(_mm256_mul_ps(vdy, vdy), v_power));  // * -0.5 at flush
        a_m0 = _mm256_add_ps(a_m0, _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(vca, dx), _mm256_mul_ps(vcb, vdy)), v_power));
        a_m1 = _mm256_add_ps(a_m1, _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(vcc, vdy), _mm256_mul_ps(vcb, dx)), v_power));
      }
    }
    if (!touched) continue;
    const float v[kBwdSlot] = {hsum_avx2(a_r), hsum_avx2(a_g), hsum_avx2(a_b), -0.5f * hsum_avx2(a_c0),
                               -hsum_avx2(a_c1), -0.5f * hsum_avx2(a_c2), -hsum_avx2(a_m0), -hsum_avx2(a_m1),
                               hsum_avx2(a_d), hsum_avx2(a_o)};
    flush_bwd(v, t.start + k, cg, g, slots, gm2, gcn, gcol, gop, gdp);
  }
}

}  // namespace
#endif  // VM_HAVE_X86_SIMD

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
  const bool use_simd = simd_enabled() && std::is_same_v<T, float>;
#ifdef VM_HAVE_X86_SIMD
  auto& recs = scratch<std::vector<GRec>, 0>();
  const ScratchRelease<std::vector<GRec>> release_recs{recs};
  if constexpr (std::is_same_v<T, float>) {
    if (use_simd) prepare_records(m2, cn, col, op, dp, C, N, W, H, recs);
  }
#endif
  if (!use_simd) prepare_spans<T>(m2, cn, op, C, N, W, H, bbox, t2s);
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
  const bool parallel = nthreads > 1 && offs[C * TT] > kParallelMin;
  std::vector<T> cslots;
  std::vector<int> nslots;
  if (want_contributions && parallel) {
    cslots.assign(offs[C * TT], T(0));
    nslots.assign(offs[C * TT], 0);
  }
  T* cs = cslots.empty() ? nullptr : cslots.data();
  int* ns = nslots.empty() ? nullptr : nslots.data();
  (void)use_simd;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (parallel)
  for (int64_t job = 0; job < C * TT; ++job) {
    const int64_t c = job / TT, tile = job % TT;
    const int ox = int(tile % tiles_x) * kT, oy = int(tile / tiles_x) * kT;
    const int tw = std::min<int>(kT, int(W) - ox), th = std::min<int>(kT, int(H) - oy);
#ifdef VM_HAVE_X86_SIMD
    if constexpr (std::is_same_v<T, float>) {
      if (use_simd) {
        const TileCtx tc{c, N, ox, oy, tw, th, offs[c * TT + tile], offs[c * TT + tile + 1]};
        fwd_tile_avx2(tc, ids, recs.data(), contrib, counts, cs, ns, W, H, oc, ot, od, ol);
        continue;
      }
    }
#endif
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
      if (contrib != nullptr && ccount > 0) flush_fwd(csum, ccount, k, cg, cs, ns, contrib, counts);
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
  if (cs != nullptr) reduce_fwd_slots(cslots, nslots, offs, ids, C, N, TT, contrib, counts);
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
  const bool use_simd = simd_enabled() && std::is_same_v<T, float>;
#ifdef VM_HAVE_X86_SIMD
  auto& recs = scratch<std::vector<GRec>, 0>();
  const ScratchRelease<std::vector<GRec>> release_recs{recs};
  if constexpr (std::is_same_v<T, float>) {
    if (use_simd) prepare_records(m2, cn, col, op, dp, C, N, W, H, recs);
  }
#endif
  if (!use_simd) prepare_spans<T>(m2, cn, op, C, N, W, H, bbox, t2s);
  const T alpha_min = T(gs::kAlphaMin), alpha_max = T(gs::kAlphaMax);
  const int nthreads = std::max(1, at::get_num_threads());
  const bool parallel = nthreads > 1 && offs[C * TT] > kParallelMin;
  // Each tile job zeroes its own entries' slots first, in parallel (a serial fill of [E, 10] was a
  // sixth of a 4-view 512-px backward); the vector is the thread's scratch (no page faults).
  auto& slots = scratch<std::vector<T>, 1>();
  const ScratchRelease<std::vector<T>> release_slots{slots};
  if (parallel) slots.resize(size_t(offs[C * TT]) * kBwdSlot);
  T* sl = parallel ? slots.data() : nullptr;
  (void)use_simd;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (parallel)
  for (int64_t job = 0; job < C * TT; ++job) {
    const int64_t c = job / TT, tile = job % TT;
    const int ox = int(tile % tiles_x) * kT, oy = int(tile / tiles_x) * kT;
    const int tw = std::min<int>(kT, int(W) - ox), th = std::min<int>(kT, int(H) - oy);
    if (sl != nullptr) std::fill(sl + offs[job] * kBwdSlot, sl + offs[job + 1] * kBwdSlot, T(0));
#ifdef VM_HAVE_X86_SIMD
    if constexpr (std::is_same_v<T, float>) {
      if (use_simd) {
        const TileCtx tc{c, N, ox, oy, tw, th, offs[c * TT + tile], offs[c * TT + tile + 1]};
        bwd_tile_avx2(tc, ids, recs.data(), tr, lst, vC, vT, vD, sl, W, H, gm2, gcn, gcol, gop, gdp);
        continue;
      }
    }
#endif
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
      const T v[kBwdSlot] = {v_rgb[0], v_rgb[1], v_rgb[2], v_c[0], v_c[1], v_c[2], v_m[0], v_m[1], v_d, v_o};
      flush_bwd(v, start + k, cg, g, sl, gm2, gcn, gcol, gop, gdp);
    }
  }
  if (sl != nullptr) reduce_bwd_slots(sl, offs, ids, C, N, TT, gm2, gcn, gcol, gop, gdp, nthreads);
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
