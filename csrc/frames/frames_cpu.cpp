// The relabelling of frames.h, one row per iteration (rows are independent: any thread count
// gives the same bits).
// No fused multiply-adds in this file (a target with FMA would otherwise contract a * b + c and
// round once where numpy rounds twice). Set here, not in setup.py: the rasteriser's AVX2+FMA
// kernels are tuned, and their bytes pinned, with contraction.
#pragma GCC optimize("fp-contract=off")
#include <cmath>
#include <vector>

#include "../include/checks.h"
#include "frames.h"

namespace visionmoe {
namespace cpu {

namespace {

// numpy's _unit: q / |q|, the identity where |q| <= 1e-12 (or is NaN).
void unit(const double* q, double* out) {
  const double n = std::sqrt(((q[0] * q[0] + q[1] * q[1]) + q[2] * q[2]) + q[3] * q[3]);
  if (n > 1e-12) {
    for (int i = 0; i < 4; ++i) out[i] = q[i] / n;
  } else {
    out[0] = 1.0, out[1] = out[2] = out[3] = 0.0;
  }
}

// numpy's rotmat: rotation matrix of a quaternion (normalised first), row-major.
void rotmat(const double* q, double* R) {
  double u[4];
  unit(q, u);
  const double w = u[0], x = u[1], y = u[2], z = u[3];
  R[0] = 1 - 2 * (y * y + z * z), R[1] = 2 * (x * y - w * z), R[2] = 2 * (x * z + w * y);
  R[3] = 2 * (x * y + w * z), R[4] = 1 - 2 * (x * x + z * z), R[5] = 2 * (y * z - w * x);
  R[6] = 2 * (x * z - w * y), R[7] = 2 * (y * z + w * x), R[8] = 1 - 2 * (x * x + y * y);
}

// numpy's _matmul: ((a0 b0 + a1 b1) + a2 b2) per entry. A is read through (row, col) strides so
// a transpose needs no copy.
void matmul(const double* A, int64_t ar, int64_t ac, const double* B, double* out) {
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      out[3 * i + j] = (A[i * ar] * B[j] + A[i * ar + ac] * B[3 + j]) + A[i * ar + 2 * ac] * B[6 + j];
}

// numpy's rotmat_to_quat: the best-conditioned of four candidates, normalised, w >= 0.
void to_quat(const double* m, double* out) {
  const double c[4] = {(m[0] + m[4]) + m[8], m[0], m[4], m[8]};
  int best = 0;
  for (int k = 1; k < 4; ++k)
    if (c[k] > c[best]) best = k;
  double q[4];
  switch (best) {
    case 0: q[0] = 1 + m[0] + m[4] + m[8], q[1] = m[7] - m[5], q[2] = m[2] - m[6], q[3] = m[3] - m[1]; break;
    case 1: q[0] = m[7] - m[5], q[1] = 1 + m[0] - m[4] - m[8], q[2] = m[1] + m[3], q[3] = m[2] + m[6]; break;
    case 2: q[0] = m[2] - m[6], q[1] = m[1] + m[3], q[2] = 1 - m[0] + m[4] - m[8], q[3] = m[5] + m[7]; break;
    default: q[0] = m[3] - m[1], q[1] = m[2] + m[6], q[2] = m[5] + m[7], q[3] = 1 - m[0] - m[4] + m[8]; break;
  }
  unit(q, out);
  if (out[0] < 0)
    for (int i = 0; i < 4; ++i) out[i] = -out[i];
}

// numpy's quat_mul: the Hamilton product a * b, each component summed left to right.
void quat_mul(const double* a, const double* b, double* o) {
  o[0] = ((a[0] * b[0] - a[1] * b[1]) - a[2] * b[2]) - a[3] * b[3];
  o[1] = ((a[0] * b[1] + a[1] * b[0]) + a[2] * b[3]) - a[3] * b[2];
  o[2] = ((a[0] * b[2] - a[1] * b[3]) + a[2] * b[0]) + a[3] * b[1];
  o[3] = ((a[0] * b[3] + a[1] * b[2]) - a[2] * b[1]) + a[3] * b[0];
}

void check_rows(const at::Tensor& t, int64_t cols, const char* name) {
  VM_CHECK_CPU(t);
  TORCH_CHECK(t.scalar_type() == at::kDouble, name, ": float64 expected");
  TORCH_CHECK(t.dim() == 2 && t.size(1) == cols, name, ": [N, ", cols, "] expected");
}

}  // namespace

at::Tensor compose_quats(const at::Tensor& parent_quats, const at::Tensor& relative_quats) {
  check_rows(parent_quats, 4, "compose_quats: parent_quats");
  check_rows(relative_quats, 4, "compose_quats: relative_quats");
  TORCH_CHECK(parent_quats.size(0) == relative_quats.size(0), "compose_quats: row counts differ");
  const at::Tensor p = parent_quats.contiguous(), q = relative_quats.contiguous();
  const int64_t n = p.size(0);
  at::Tensor out = at::empty({n, 4}, p.options());
  const double* pp = p.data_ptr<double>();
  const double* qq = q.data_ptr<double>();
  double* oo = out.data_ptr<double>();
#pragma omp parallel for schedule(static) if (n > 4096)
  for (int64_t r = 0; r < n; ++r) {
    double up[4], uq[4], m[4];
    unit(pp + 4 * r, up);
    unit(qq + 4 * r, uq);
    quat_mul(up, uq, m);
    unit(m, oo + 4 * r);
  }
  return out;
}

at::Tensor rotate_by_quats(const at::Tensor& quats, const at::Tensor& vectors, bool transpose) {
  check_rows(quats, 4, "rotate_by_quats: quats");
  check_rows(vectors, 3, "rotate_by_quats: vectors");
  TORCH_CHECK(quats.size(0) == vectors.size(0), "rotate_by_quats: row counts differ");
  const at::Tensor q = quats.contiguous(), v = vectors.contiguous();
  const int64_t n = q.size(0);
  at::Tensor out = at::empty({n, 3}, q.options());
  const double* qq = q.data_ptr<double>();
  const double* vv = v.data_ptr<double>();
  double* oo = out.data_ptr<double>();
  // numpy's to_parent_frame / from_parent_frame: out += R[:, k, :] * v[:, k] (or R[:, :, k]) for
  // k = 0, 1, 2, in that order
  const int64_t row = transpose ? 3 : 1, col = transpose ? 1 : 3;
#pragma omp parallel for schedule(static) if (n > 4096)
  for (int64_t r = 0; r < n; ++r) {
    double R[9];
    rotmat(qq + 4 * r, R);
    const double* x = vv + 3 * r;
    for (int i = 0; i < 3; ++i)
      oo[3 * r + i] = (R[i * col] * x[0] + R[i * col + row] * x[1]) + R[i * col + 2 * row] * x[2];
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> relabel_to_parent(const at::Tensor& parent_quats, const at::Tensor& quats,
                                                     const at::Tensor& perms) {
  VM_CHECK_CPU(parent_quats);
  VM_CHECK_CPU(quats);
  VM_CHECK_CPU(perms);
  TORCH_CHECK(parent_quats.scalar_type() == at::kDouble && quats.scalar_type() == at::kDouble &&
                  perms.scalar_type() == at::kDouble,
              "relabel_to_parent: float64 inputs expected");
  TORCH_CHECK(parent_quats.dim() == 2 && parent_quats.size(1) == 4 && quats.sizes() == parent_quats.sizes(),
              "relabel_to_parent: parent_quats and quats must both be [N, 4]");
  TORCH_CHECK(perms.dim() == 3 && perms.size(1) == 3 && perms.size(2) == 3 && perms.size(0) > 0,
              "relabel_to_parent: perms must be [P, 3, 3]");
  const at::Tensor pq = parent_quats.contiguous(), q = quats.contiguous(), P = perms.contiguous();
  const int64_t n = pq.size(0), np_ = P.size(0);
  at::Tensor rel = at::empty({n, 4}, pq.options());
  at::Tensor src = at::empty({n, 3}, pq.options().dtype(at::kLong));
  const double* pp = pq.data_ptr<double>();
  const double* qq = q.data_ptr<double>();
  const double* perm = P.data_ptr<double>();
  double* rr = rel.data_ptr<double>();
  int64_t* ss = src.data_ptr<int64_t>();
  // each permutation's non-zero row in column i (the reference's argmax of |P| down the column:
  // the first largest) and its sign
  std::vector<int64_t> rows(3 * np_);
  std::vector<double> signs(3 * np_);
  for (int64_t p = 0; p < np_; ++p)
    for (int i = 0; i < 3; ++i) {
      int k_best = 0;
      for (int k = 1; k < 3; ++k)
        if (std::abs(perm[9 * p + 3 * k + i]) > std::abs(perm[9 * p + 3 * k_best + i])) k_best = k;
      rows[3 * p + i] = k_best;
      signs[3 * p + i] = perm[9 * p + 3 * k_best + i];
    }
#pragma omp parallel for schedule(static) if (n > 4096)
  for (int64_t r = 0; r < n; ++r) {
    double Rp[9], Rc[9], M[9], Rel[9];  // row-major
    rotmat(pp + 4 * r, Rp);
    rotmat(qq + 4 * r, Rc);
    matmul(Rp, 1, 3, Rc, M);  // Rp^T Rc
    // trace(M P): the reference's einsum adds the nine products in (i, k) order; the six zero
    // ones leave the sum's bits alone, so each permutation's three are added in i order
    int64_t best = 0;
    double best_trace = 0;
    for (int64_t p = 0; p < np_; ++p) {
      const int64_t* k = rows.data() + 3 * p;
      const double* s = signs.data() + 3 * p;
      const double t = (M[k[0]] * s[0] + M[3 + k[1]] * s[1]) + M[6 + k[2]] * s[2];
      if (p == 0 || t > best_trace) best = p, best_trace = t;
    }
    matmul(M, 3, 1, perm + 9 * best, Rel);
    to_quat(Rel, rr + 4 * r);
    for (int i = 0; i < 3; ++i) ss[3 * r + i] = rows[3 * best + i];
  }
  return {rel, src};
}

}  // namespace cpu
}  // namespace visionmoe
