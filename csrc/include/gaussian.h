// Per-Gaussian math shared by the CPU (raster_cpu.cpp) and CUDA (raster.cu) rasterisers:
// quaternion -> rotation, EWA projection with the 0.3 px low-pass, real spherical harmonics
// up to degree 3, and their hand-written vector-Jacobian products (v_<name> = dL/d<name>).
// Semantics follow gsplat 1.5 `_torch_impl.py` (`_fully_fused_projection`, pinhole camera,
// `_spherical_harmonics`) so that the two can be compared; see visionmoe/ops/_torch_ref.py.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define VM_HD __host__ __device__ __forceinline__
#else
#define VM_HD inline
#endif

namespace visionmoe {
namespace gs {

#if !defined(__CUDACC__)
// Host code: float overloads (the C functions found otherwise would compute in double).
using std::ceil;
using std::exp;
using std::floor;
using std::log;
using std::sqrt;
#endif

constexpr int kTile = 16;            // tile edge in pixels
constexpr double kAlphaMin = 1.0 / 255.0;  // alpha below this is skipped
constexpr double kAlphaMax = 0.99;         // alpha cap
constexpr double kTransmittanceMin = 1e-4; // stop compositing below this transmittance
constexpr double kEps2d = 0.3;             // screen-space low-pass added to the 2D covariance
constexpr double kRadiusSigma = 3.33;      // per-axis extent in standard deviations (gsplat 1.5)
constexpr double kDetMin = 1e-10;

template <typename T>
struct Vec3 {
  T x, y, z;
};

template <typename T>
struct Mat3 {  // row-major
  T m[3][3];
};

template <typename T>
VM_HD bool finite(T v) {
  return v - v == T(0);  // false for NaN and +-Inf, fast-math safe
}

template <typename T>
VM_HD Mat3<T> quat_to_rotmat(T w, T x, T y, T z) {
  Mat3<T> R;
  R.m[0][0] = 1 - 2 * (y * y + z * z);
  R.m[0][1] = 2 * (x * y - w * z);
  R.m[0][2] = 2 * (x * z + w * y);
  R.m[1][0] = 2 * (x * y + w * z);
  R.m[1][1] = 1 - 2 * (x * x + z * z);
  R.m[1][2] = 2 * (y * z - w * x);
  R.m[2][0] = 2 * (x * z - w * y);
  R.m[2][1] = 2 * (y * z + w * x);
  R.m[2][2] = 1 - 2 * (x * x + y * y);
  return R;
}

// v_q (of the normalised quaternion w,x,y,z) from v_R.
template <typename T>
VM_HD void quat_to_rotmat_vjp(T w, T x, T y, T z, const Mat3<T>& v, T out[4]) {
  const auto& g = v.m;
  out[0] = 2 * (x * (g[2][1] - g[1][2]) + y * (g[0][2] - g[2][0]) + z * (g[1][0] - g[0][1]));
  out[1] = 2 * (-2 * x * (g[1][1] + g[2][2]) + y * (g[1][0] + g[0][1]) + z * (g[2][0] + g[0][2]) +
                w * (g[2][1] - g[1][2]));
  out[2] = 2 * (x * (g[1][0] + g[0][1]) - 2 * y * (g[0][0] + g[2][2]) + z * (g[2][1] + g[1][2]) +
                w * (g[0][2] - g[2][0]));
  out[3] = 2 * (x * (g[2][0] + g[0][2]) + y * (g[2][1] + g[1][2]) - 2 * z * (g[0][0] + g[1][1]) +
                w * (g[1][0] - g[0][1]));
}

// Camera and image of one view.
template <typename T>
struct Camera {
  T R[3][3];  // world-to-camera rotation (OpenCV: x right, y down, z forward)
  T t[3];
  T fx, fy, cx, cy;
  int width, height;
};

template <typename T>
VM_HD Camera<T> load_camera(const T* viewmat /* [4,4] */, const T* K /* [3,3] */, int width, int height) {
  Camera<T> c;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) c.R[i][j] = viewmat[i * 4 + j];
    c.t[i] = viewmat[i * 4 + 3];
  }
  c.fx = K[0];
  c.cx = K[2];
  c.fy = K[4];
  c.cy = K[5];
  c.width = width;
  c.height = height;
  return c;
}

// Camera centre in world coordinates: -R^T t.
template <typename T>
VM_HD Vec3<T> camera_center(const Camera<T>& c) {
  Vec3<T> o;
  o.x = -(c.R[0][0] * c.t[0] + c.R[1][0] * c.t[1] + c.R[2][0] * c.t[2]);
  o.y = -(c.R[0][1] * c.t[0] + c.R[1][1] * c.t[1] + c.R[2][1] * c.t[2]);
  o.z = -(c.R[0][2] * c.t[0] + c.R[1][2] * c.t[1] + c.R[2][2] * c.t[2]);
  return o;
}

// Intermediate values of one projection, kept for the backward pass.
template <typename T>
struct Projection {
  bool valid;
  T mean2d[2];
  T conic[3];  // inverse of the low-passed 2D covariance: a, b (off-diagonal), c
  T depth;
  int radius[2];
};

// 3D covariance world: Sigma = M M^T with M = R(q) diag(exp(log_scales)).
template <typename T>
VM_HD void covariance3d(const T* quat, const T* log_scale, T sigma[3][3], Mat3<T>* Rout, T qn[4], T* qnorm,
                        T s[3]) {
  const T n = sqrt(quat[0] * quat[0] + quat[1] * quat[1] + quat[2] * quat[2] + quat[3] * quat[3]);
  *qnorm = n;
  for (int i = 0; i < 4; ++i) qn[i] = quat[i] / n;
  const Mat3<T> R = quat_to_rotmat(qn[0], qn[1], qn[2], qn[3]);
  for (int i = 0; i < 3; ++i) s[i] = exp(log_scale[i]);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += R.m[i][k] * s[k] * s[k] * R.m[j][k];
      sigma[i][j] = acc;
    }
  *Rout = R;
}

// Camera-space mean and covariance, the pinhole Jacobian (gsplat `_persp_proj`), and the
// low-passed 2D covariance. Returns the pieces the backward pass needs.
template <typename T>
struct ProjectionCtx {
  T pc[3];          // camera-space mean
  T sc[3][3];       // camera-space covariance
  T J[2][3];        // Jacobian of the projection
  bool clamp_x, clamp_y;
  T lim_x, lim_y;   // the active clamp limit of x/z, y/z (only used when clamped)
  T cov2d[3];       // low-passed 2D covariance xx, xy, yy
  T det;
};

template <typename T>
VM_HD void project_core(const Camera<T>& cam, const T* mean, const T sigma[3][3], ProjectionCtx<T>& ctx) {
  for (int i = 0; i < 3; ++i)
    ctx.pc[i] = cam.R[i][0] * mean[0] + cam.R[i][1] * mean[1] + cam.R[i][2] * mean[2] + cam.t[i];
  T tmp[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += cam.R[i][k] * sigma[k][j];
      tmp[i][j] = acc;
    }
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += tmp[i][k] * cam.R[j][k];
      ctx.sc[i][j] = acc;
    }
  const T x = ctx.pc[0], y = ctx.pc[1], z = ctx.pc[2];
  const T tan_fovx = T(0.5) * cam.width / cam.fx, tan_fovy = T(0.5) * cam.height / cam.fy;
  const T lim_x_pos = (cam.width - cam.cx) / cam.fx + T(0.3) * tan_fovx;
  const T lim_x_neg = cam.cx / cam.fx + T(0.3) * tan_fovx;
  const T lim_y_pos = (cam.height - cam.cy) / cam.fy + T(0.3) * tan_fovy;
  const T lim_y_neg = cam.cy / cam.fy + T(0.3) * tan_fovy;
  T rx = x / z, ry = y / z;
  ctx.clamp_x = false;
  ctx.clamp_y = false;
  if (rx > lim_x_pos) { rx = lim_x_pos; ctx.clamp_x = true; }
  else if (rx < -lim_x_neg) { rx = -lim_x_neg; ctx.clamp_x = true; }
  if (ry > lim_y_pos) { ry = lim_y_pos; ctx.clamp_y = true; }
  else if (ry < -lim_y_neg) { ry = -lim_y_neg; ctx.clamp_y = true; }
  ctx.lim_x = rx;
  ctx.lim_y = ry;
  const T tx = z * rx, ty = z * ry, z2 = z * z;
  ctx.J[0][0] = cam.fx / z; ctx.J[0][1] = 0; ctx.J[0][2] = -cam.fx * tx / z2;
  ctx.J[1][0] = 0; ctx.J[1][1] = cam.fy / z; ctx.J[1][2] = -cam.fy * ty / z2;
  T JS[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += ctx.J[i][k] * ctx.sc[k][j];
      JS[i][j] = acc;
    }
  T c2[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += JS[i][k] * ctx.J[j][k];
      c2[i][j] = acc;
    }
  ctx.cov2d[0] = c2[0][0] + T(kEps2d);
  ctx.cov2d[1] = T(0.5) * (c2[0][1] + c2[1][0]);
  ctx.cov2d[2] = c2[1][1] + T(kEps2d);
  T det = ctx.cov2d[0] * ctx.cov2d[2] - ctx.cov2d[1] * ctx.cov2d[1];
  ctx.det = det < T(kDetMin) ? T(kDetMin) : det;
}

// Forward projection of one Gaussian into one camera from its world covariance ``sigma`` and
// quaternion norm (computed once per Gaussian when it is projected into several cameras).
template <typename T>
VM_HD Projection<T> project_from_covariance(const Camera<T>& cam, const T* mean, const T sigma[3][3], T qnorm,
                                            T near_plane, T far_plane) {
  Projection<T> p;
  p.valid = false;
  p.radius[0] = p.radius[1] = 0;
  ProjectionCtx<T> ctx;
  project_core(cam, mean, sigma, ctx);
  const T z = ctx.pc[2];
  p.depth = z;
  p.mean2d[0] = cam.fx * ctx.pc[0] / z + cam.cx;
  p.mean2d[1] = cam.fy * ctx.pc[1] / z + cam.cy;
  p.conic[0] = ctx.cov2d[2] / ctx.det;
  p.conic[1] = -ctx.cov2d[1] / ctx.det;
  p.conic[2] = ctx.cov2d[0] / ctx.det;
  if (!(z > near_plane && z < far_plane)) return p;
  const T rx = ceil(T(kRadiusSigma) * sqrt(ctx.cov2d[0]));
  const T ry = ceil(T(kRadiusSigma) * sqrt(ctx.cov2d[2]));
  if (!(finite(rx) && finite(ry) && finite(p.mean2d[0]) && finite(p.mean2d[1]) && finite(p.conic[0]) &&
        finite(p.conic[1]) && finite(p.conic[2]) && finite(qnorm) && qnorm > T(0)))
    return p;
  if (!(p.mean2d[0] + rx > 0 && p.mean2d[0] - rx < cam.width && p.mean2d[1] + ry > 0 &&
        p.mean2d[1] - ry < cam.height))
    return p;
  // Radii beyond 2^30 px only mean "covers the image"; keep them in int range.
  p.radius[0] = rx > T(1 << 30) ? (1 << 30) : int(rx);
  p.radius[1] = ry > T(1 << 30) ? (1 << 30) : int(ry);
  p.valid = p.radius[0] > 0 && p.radius[1] > 0;
  return p;
}

// Forward projection of one Gaussian into one camera (gsplat `_fully_fused_projection`).
template <typename T>
VM_HD Projection<T> project(const Camera<T>& cam, const T* mean, const T* quat, const T* log_scale, T near_plane,
                            T far_plane) {
  T sigma[3][3], qn[4], qnorm, s[3];
  Mat3<T> R;
  covariance3d(quat, log_scale, sigma, &R, qn, &qnorm, s);
  return project_from_covariance(cam, mean, sigma, qnorm, near_plane, far_plane);
}

// Backward of `project` for one valid (Gaussian, camera) pair from the camera-independent world
// covariance and its factors (covariance3d's outputs, computed once per Gaussian by a caller
// that loops over its cameras): accumulates into v_mean [3], v_quat [4] (of the raw,
// unnormalised quaternion) and v_log_scale [3].
template <typename T>
VM_HD void project_vjp_cov(const Camera<T>& cam, const T* mean, const T sigma[3][3], const Mat3<T>& R, const T qn[4],
                           T qnorm, const T s[3], const T* v_mean2d /* [2] */, const T* v_conic /* [3] */, T v_depth,
                           T* v_mean, T* v_quat, T* v_log_scale) {
  ProjectionCtx<T> ctx;
  project_core(cam, mean, sigma, ctx);
  const T x = ctx.pc[0], y = ctx.pc[1], z = ctx.pc[2];

  // conic = inverse(cov2d) with the stored off-diagonal b counted once: as a symmetric matrix
  // V = [[va, vb/2], [vb/2, vc]], v_cov = -Conic V Conic. The det clamp is inactive in
  // practice (cov2d >= 0.3 I); its gradient is taken as the unclamped inverse.
  const T a = ctx.cov2d[2] / ctx.det, b = -ctx.cov2d[1] / ctx.det, c = ctx.cov2d[0] / ctx.det;
  const T Va = v_conic[0], Vb = T(0.5) * v_conic[1], Vc = v_conic[2];
  // X = Conic V
  const T X00 = a * Va + b * Vb, X01 = a * Vb + b * Vc, X10 = b * Va + c * Vb, X11 = b * Vb + c * Vc;
  // G = -X Conic (symmetric gradient of the 2x2 covariance)
  T G[2][2];
  G[0][0] = -(X00 * a + X01 * b);
  G[0][1] = -(X00 * b + X01 * c);
  G[1][0] = -(X10 * a + X11 * b);
  G[1][1] = -(X10 * b + X11 * c);
  const T Gs01 = T(0.5) * (G[0][1] + G[1][0]);
  G[0][1] = G[1][0] = Gs01;

  // cov2d = J Sc J^T: v_Sc = J^T G J, v_J = 2 G J Sc
  T v_sc[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 2; ++k)
        for (int l = 0; l < 2; ++l) acc += ctx.J[k][i] * G[k][l] * ctx.J[l][j];
      v_sc[i][j] = acc;
    }
  T GJ[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) GJ[i][j] = G[i][0] * ctx.J[0][j] + G[i][1] * ctx.J[1][j];
  T v_J[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += GJ[i][k] * ctx.sc[k][j];
      v_J[i][j] = 2 * acc;
    }

  // Camera-space mean gradient: mean2d, depth and the Jacobian.
  T v_pc[3] = {0, 0, 0};
  const T z2 = z * z, z3 = z2 * z;
  v_pc[0] += cam.fx / z * v_mean2d[0];
  v_pc[1] += cam.fy / z * v_mean2d[1];
  v_pc[2] += -cam.fx * x / z2 * v_mean2d[0] - cam.fy * y / z2 * v_mean2d[1];
  v_pc[2] += v_depth;
  // J00 = fx/z, J11 = fy/z
  v_pc[2] += -cam.fx / z2 * v_J[0][0] - cam.fy / z2 * v_J[1][1];
  // J02 = -fx tx / z^2 with tx = x (unclamped) or z*lim (clamped) -> -fx*lim/z
  if (ctx.clamp_x) {
    v_pc[2] += cam.fx * ctx.lim_x / z2 * v_J[0][2];
  } else {
    v_pc[0] += -cam.fx / z2 * v_J[0][2];
    v_pc[2] += 2 * cam.fx * x / z3 * v_J[0][2];
  }
  if (ctx.clamp_y) {
    v_pc[2] += cam.fy * ctx.lim_y / z2 * v_J[1][2];
  } else {
    v_pc[1] += -cam.fy / z2 * v_J[1][2];
    v_pc[2] += 2 * cam.fy * y / z3 * v_J[1][2];
  }
  // pc = R mean + t
  for (int j = 0; j < 3; ++j) v_mean[j] += cam.R[0][j] * v_pc[0] + cam.R[1][j] * v_pc[1] + cam.R[2][j] * v_pc[2];

  // Sc = Rv Sigma Rv^T: v_Sigma = Rv^T v_Sc Rv
  T t1[3][3], v_sigma[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += cam.R[k][i] * v_sc[k][j];
      t1[i][j] = acc;
    }
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += t1[i][k] * cam.R[k][j];
      v_sigma[i][j] = acc;
    }
  // Sigma = M M^T, M = R S: v_M = (v_Sigma + v_Sigma^T) M
  T M[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) M[i][j] = R.m[i][j] * s[j];
  T v_M[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      T acc = 0;
      for (int k = 0; k < 3; ++k) acc += (v_sigma[i][k] + v_sigma[k][i]) * M[k][j];
      v_M[i][j] = acc;
    }
  Mat3<T> v_R;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) v_R.m[i][j] = v_M[i][j] * s[j];
  for (int j = 0; j < 3; ++j) {
    T acc = 0;
    for (int i = 0; i < 3; ++i) acc += R.m[i][j] * v_M[i][j];
    v_log_scale[j] += acc * s[j];
  }
  T v_qn[4];
  quat_to_rotmat_vjp(qn[0], qn[1], qn[2], qn[3], v_R, v_qn);
  const T dot = qn[0] * v_qn[0] + qn[1] * v_qn[1] + qn[2] * v_qn[2] + qn[3] * v_qn[3];
  for (int i = 0; i < 4; ++i) v_quat[i] += (v_qn[i] - qn[i] * dot) / qnorm;
}

// project_vjp_cov with the covariance computed here (one camera).
template <typename T>
VM_HD void project_vjp(const Camera<T>& cam, const T* mean, const T* quat, const T* log_scale,
                       const T* v_mean2d /* [2] */, const T* v_conic /* [3] */, T v_depth, T* v_mean, T* v_quat,
                       T* v_log_scale) {
  T sigma[3][3], qn[4], qnorm, s[3];
  Mat3<T> R;
  covariance3d(quat, log_scale, sigma, &R, qn, &qnorm, s);
  project_vjp_cov(cam, mean, sigma, R, qn, qnorm, s, v_mean2d, v_conic, v_depth, v_mean, v_quat, v_log_scale);
}

// ----------------------------------------------------------------------------- SH

constexpr double kC0 = 0.28209479177387814;
constexpr double kC1 = 0.4886025119029199;
constexpr double kC2_0 = 1.0925484305920792, kC2_1 = -1.0925484305920792, kC2_2 = 0.31539156525252005,
                 kC2_3 = -1.0925484305920792, kC2_4 = 0.5462742152960396;
constexpr double kC3_0 = -0.5900435899266435, kC3_1 = 2.890611442640554, kC3_2 = -0.4570457994644658,
                 kC3_3 = 0.3731763325901154, kC3_4 = -0.4570457994644658, kC3_5 = 1.445305721320277,
                 kC3_6 = -0.5900435899266435;

// Real SH basis at the unit direction (x, y, z), first (degree+1)^2 entries.
template <typename T>
VM_HD void sh_basis(int degree, T x, T y, T z, T* b) {
  b[0] = T(kC0);
  if (degree < 1) return;
  b[1] = -T(kC1) * y;
  b[2] = T(kC1) * z;
  b[3] = -T(kC1) * x;
  if (degree < 2) return;
  const T xx = x * x, yy = y * y, zz = z * z, xy = x * y, yz = y * z, xz = x * z;
  b[4] = T(kC2_0) * xy;
  b[5] = T(kC2_1) * yz;
  b[6] = T(kC2_2) * (2 * zz - xx - yy);
  b[7] = T(kC2_3) * xz;
  b[8] = T(kC2_4) * (xx - yy);
  if (degree < 3) return;
  b[9] = T(kC3_0) * y * (3 * xx - yy);
  b[10] = T(kC3_1) * xy * z;
  b[11] = T(kC3_2) * y * (4 * zz - xx - yy);
  b[12] = T(kC3_3) * z * (2 * zz - 3 * xx - 3 * yy);
  b[13] = T(kC3_4) * x * (4 * zz - xx - yy);
  b[14] = T(kC3_5) * z * (xx - yy);
  b[15] = T(kC3_6) * x * (xx - 3 * yy);
}

// d basis / d (x, y, z) contracted with per-basis weights g[k]: returns v_dir.
template <typename T>
VM_HD void sh_basis_vjp(int degree, T x, T y, T z, const T* g, T* v) {
  v[0] = v[1] = v[2] = 0;
  if (degree < 1) return;
  v[1] += -T(kC1) * g[1];
  v[2] += T(kC1) * g[2];
  v[0] += -T(kC1) * g[3];
  if (degree < 2) return;
  const T xx = x * x, yy = y * y, zz = z * z;
  v[0] += T(kC2_0) * y * g[4];
  v[1] += T(kC2_0) * x * g[4];
  v[1] += T(kC2_1) * z * g[5];
  v[2] += T(kC2_1) * y * g[5];
  v[0] += -2 * T(kC2_2) * x * g[6];
  v[1] += -2 * T(kC2_2) * y * g[6];
  v[2] += 4 * T(kC2_2) * z * g[6];
  v[0] += T(kC2_3) * z * g[7];
  v[2] += T(kC2_3) * x * g[7];
  v[0] += 2 * T(kC2_4) * x * g[8];
  v[1] += -2 * T(kC2_4) * y * g[8];
  if (degree < 3) return;
  v[0] += 6 * T(kC3_0) * x * y * g[9];
  v[1] += T(kC3_0) * (3 * xx - 3 * yy) * g[9];
  v[0] += T(kC3_1) * y * z * g[10];
  v[1] += T(kC3_1) * x * z * g[10];
  v[2] += T(kC3_1) * x * y * g[10];
  v[0] += -2 * T(kC3_2) * x * y * g[11];
  v[1] += T(kC3_2) * (4 * zz - xx - 3 * yy) * g[11];
  v[2] += 8 * T(kC3_2) * y * z * g[11];
  v[0] += -6 * T(kC3_3) * x * z * g[12];
  v[1] += -6 * T(kC3_3) * y * z * g[12];
  v[2] += T(kC3_3) * (6 * zz - 3 * xx - 3 * yy) * g[12];
  v[0] += T(kC3_4) * (4 * zz - 3 * xx - yy) * g[13];
  v[1] += -2 * T(kC3_4) * x * y * g[13];
  v[2] += 8 * T(kC3_4) * x * z * g[13];
  v[0] += 2 * T(kC3_5) * x * z * g[14];
  v[1] += -2 * T(kC3_5) * y * z * g[14];
  v[2] += T(kC3_5) * (xx - yy) * g[14];
  v[0] += T(kC3_6) * (3 * xx - 3 * yy) * g[15];
  v[1] += -6 * T(kC3_6) * x * y * g[15];
}

// colour = max(sum_k basis_k sh_k + 0.5, 0) for the direction mean - campos.
template <typename T>
VM_HD void sh_color(int degree, int K, const T* sh /* [K,3] */, const T* mean, const Vec3<T>& campos, T* rgb) {
  T d[3] = {mean[0] - campos.x, mean[1] - campos.y, mean[2] - campos.z};
  const T n = sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
  const T inv = n > T(0) ? T(1) / n : T(0);
  T b[16];
  sh_basis(degree, d[0] * inv, d[1] * inv, d[2] * inv, b);
  const int nb = (degree + 1) * (degree + 1);
  for (int ch = 0; ch < 3; ++ch) {
    T acc = 0;
    for (int k = 0; k < nb; ++k) acc += b[k] * sh[k * 3 + ch];
    acc += T(0.5);
    rgb[ch] = acc > T(0) ? acc : T(0);
  }
}

// Backward of sh_color: accumulates v_sh [K,3] and v_mean [3] (through the view direction).
template <typename T>
VM_HD void sh_color_vjp(int degree, int K, const T* sh, const T* mean, const Vec3<T>& campos, const T* v_rgb_in,
                        T* v_sh, T* v_mean) {
  T d[3] = {mean[0] - campos.x, mean[1] - campos.y, mean[2] - campos.z};
  const T n = sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
  if (!(n > T(0))) return;
  const T inv = T(1) / n;
  const T u[3] = {d[0] * inv, d[1] * inv, d[2] * inv};
  T b[16];
  sh_basis(degree, u[0], u[1], u[2], b);
  const int nb = (degree + 1) * (degree + 1);
  T v_rgb[3];
  for (int ch = 0; ch < 3; ++ch) {
    T acc = 0;
    for (int k = 0; k < nb; ++k) acc += b[k] * sh[k * 3 + ch];
    v_rgb[ch] = acc + T(0.5) > T(0) ? v_rgb_in[ch] : T(0);
  }
  T g[16];
  for (int k = 0; k < nb; ++k) {
    g[k] = sh[k * 3] * v_rgb[0] + sh[k * 3 + 1] * v_rgb[1] + sh[k * 3 + 2] * v_rgb[2];
    for (int ch = 0; ch < 3; ++ch) v_sh[k * 3 + ch] += b[k] * v_rgb[ch];
  }
  if (degree < 1) return;
  T v_u[3];
  sh_basis_vjp(degree, u[0], u[1], u[2], g, v_u);
  // u = d / |d|: v_d = (v_u - u (u . v_u)) / |d|
  const T dot = u[0] * v_u[0] + u[1] * v_u[1] + u[2] * v_u[2];
  for (int i = 0; i < 3; ++i) v_mean[i] += (v_u[i] - u[i] * dot) * inv;
}

// ----------------------------------------------------------------------------- compositing

// Pixel range [x0, x1) x [y0, y1) outside which a Gaussian's alpha is below 1/255 (so it is
// skipped there anyway): the bounding box of the ellipse d^T conic d <= 2 ln(255 opacity),
// padded by one pixel. Empty (x0 >= x1) when the opacity alone is below 1/255.
template <typename T>
VM_HD void alpha_bbox(const T* mean2d, const T* conic, T opacity, int width, int height, int* x0, int* x1, int* y0,
                      int* y1) {
  const T t = 2 * log(opacity * T(255));
  const T det = conic[0] * conic[2] - conic[1] * conic[1];
  if (!(t > 0) || !(det > 0)) {
    *x0 = *x1 = *y0 = *y1 = 0;
    return;
  }
  const T ex = sqrt(t * conic[2] / det) + 1, ey = sqrt(t * conic[0] / det) + 1;
  // pixel i has centre i + 0.5
  T fx0 = floor(mean2d[0] - ex - T(0.5)), fx1 = ceil(mean2d[0] + ex - T(0.5)) + 1;
  T fy0 = floor(mean2d[1] - ey - T(0.5)), fy1 = ceil(mean2d[1] + ey - T(0.5)) + 1;
  fx0 = fx0 < 0 ? T(0) : fx0;
  fy0 = fy0 < 0 ? T(0) : fy0;
  fx1 = fx1 > T(width) ? T(width) : fx1;
  fy1 = fy1 > T(height) ? T(height) : fy1;
  *x0 = int(fx0);
  *x1 = fx1 < fx0 ? int(fx0) : int(fx1);
  *y0 = int(fy0);
  *y1 = fy1 < fy0 ? int(fy0) : int(fy1);
}

// Squared Mahalanobis radius t inside which alpha >= 1/255 (d^T conic d <= t), inflated a
// little so that spans computed from it are conservative; the exact alpha test decides.
template <typename T>
VM_HD T span_radius2(T opacity) {
  const T t = 2 * log(opacity * T(255));
  return t > 0 ? t * T(1.01) + T(0.05) : T(-1);
}

// Pixels [*xa, *xb) of the row whose centres lie at vertical offset dy = mean_y - (y + 0.5)
// from the mean and inside the ellipse d^T conic d <= t2, clipped to [lo, hi).
template <typename T>
VM_HD void row_span(T mx, T dy, const T* conic, T t2, int lo, int hi, int* xa, int* xb) {
  const T a = conic[0], b = conic[1], c = conic[2];
  const T disc = b * b * dy * dy - a * (c * dy * dy - t2);
  *xa = *xb = lo;
  if (!(disc >= 0) || !(a > 0)) return;
  const T sq = sqrt(disc);
  const T dlo = (-b * dy - sq) / a, dhi = (-b * dy + sq) / a;  // dx = mx - px in [dlo, dhi]
  // integer x with centre x + 0.5 in [mx - dhi, mx - dlo]; t2 is inflated, so no extra pad.
  // Clamped to [lo - 1, hi + 1] first, then ceil/floor by truncation (no libm call).
  T f0 = mx - dhi - T(0.5), f1 = mx - dlo - T(0.5);
  f0 = f0 < T(lo - 1) ? T(lo - 1) : (f0 > T(hi + 1) ? T(hi + 1) : f0);
  f1 = f1 < T(lo - 1) ? T(lo - 1) : (f1 > T(hi + 1) ? T(hi + 1) : f1);
  int i0 = int(f0), i1 = int(f1);  // truncation toward zero
  if (T(i0) < f0) ++i0;            // ceil
  if (T(i1) > f1) --i1;            // floor
  ++i1;
  i0 = i0 < lo ? lo : i0;
  i1 = i1 > hi ? hi : i1;
  if (i0 >= i1) return;
  *xa = i0;
  *xb = i1;
}

// Tile range [tx0, tx1) x [ty0, ty1) of a projected Gaussian: the tiles its radius rectangle
// touches (gsplat `_isect_tiles`), intersected with the tiles of its alpha bounding box.
template <typename T>
VM_HD void tile_rect(const T* mean2d, const int* radius, const T* conic, T opacity, int width, int height, int* tx0,
                     int* tx1, int* ty0, int* ty1) {
  const int tiles_x = (width + kTile - 1) / kTile, tiles_y = (height + kTile - 1) / kTile;
  *tx0 = *tx1 = *ty0 = *ty1 = 0;
  if (radius[0] <= 0 || radius[1] <= 0) return;
  T a0 = floor((mean2d[0] - T(radius[0])) / T(kTile)), a1 = ceil((mean2d[0] + T(radius[0])) / T(kTile));
  T b0 = floor((mean2d[1] - T(radius[1])) / T(kTile)), b1 = ceil((mean2d[1] + T(radius[1])) / T(kTile));
  int px0, px1, py0, py1;
  alpha_bbox(mean2d, conic, opacity, width, height, &px0, &px1, &py0, &py1);
  if (px0 >= px1 || py0 >= py1) return;
  const T c0 = T(px0 / kTile), c1 = T((px1 + kTile - 1) / kTile);
  const T d0 = T(py0 / kTile), d1 = T((py1 + kTile - 1) / kTile);
  a0 = a0 > c0 ? a0 : c0;
  a1 = a1 < c1 ? a1 : c1;
  b0 = b0 > d0 ? b0 : d0;
  b1 = b1 < d1 ? b1 : d1;
  a0 = a0 < 0 ? T(0) : a0;
  b0 = b0 < 0 ? T(0) : b0;
  a1 = a1 > T(tiles_x) ? T(tiles_x) : a1;
  b1 = b1 > T(tiles_y) ? T(tiles_y) : b1;
  if (!(a0 < a1 && b0 < b1)) return;
  *tx0 = int(a0);
  *tx1 = int(a1);
  *ty0 = int(b0);
  *ty1 = int(b1);
}

// Sortable 32-bit key of a positive depth (IEEE bits are monotone for positive floats).
VM_HD uint32_t depth_key(float depth) {
  union {
    float f;
    uint32_t u;
  } v;
  v.f = depth;
  return v.u;
}

}  // namespace gs
}  // namespace visionmoe
