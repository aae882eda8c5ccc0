// Rotary position embedding and per-head RMSNorm of q and k, forward and backward
// (kernels/reference.py: rope, rope_backward, qk_norm, qk_norm_backward).
//
// q: [B, Hq, T, D], k: [B, Hk, T, D] (rows_q = B * Hq * T, rows_k = B * Hk * T rows
// of D), freqs: [T, D / 2, 2] fp32 (cos, sin) per position and pair. One launch
// handles q and k. Rope also takes layout "bthd" (q: [B, T, Hq, D], k: [B, T, Hk, D]):
// the position of row r is (r / heads) % T, heads_q = Hq and heads_k = Hk there, 1 in bhtd.
#include "norm.cuh"

using namespace mdsl;

namespace {

// Rotates the pairs of one unit of a row: P pairs, either (x[i], x[i + D/2]) or,
// interleaved, (x[2i], x[2i + 1]): (a, b) -> (a cos - b sin, b cos + a sin), with
// sin multiplied by `sign` (+1 forward; -1 backward, the inverse rotation).
// VEC: 16-byte vectors (P = 8 bf16 or 4 fp32 pairs; interleaved P / 2) or scalars.
template <typename T, int P, bool INTERLEAVED>
__device__ __forceinline__ void rotate_unit(const T* x, T* out, const float* f, i64 c, i64 D, float sign) {
  float cs[2 * P];
  constexpr int FV = (2 * P) % 4 == 0 ? 4 : 1;
#pragma unroll
  for (int j = 0; j < 2 * P; j += FV) load<float, FV>(f + 2 * c * P + j, cs + j);
  float a[P], b[P];
  if constexpr (INTERLEAVED) {
    float ab[2 * P];
    if constexpr (2 * P * sizeof(T) <= 16 && P > 1) {
      load<T, 2 * P>(x + 2 * c * P, ab);
    } else {
#pragma unroll
      for (int j = 0; j < 2 * P; ++j) load<T, 1>(x + 2 * c * P + j, ab + j);
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
      a[j] = ab[2 * j];
      b[j] = ab[2 * j + 1];
    }
  } else {
    load<T, P>(x + c * P, a);
    load<T, P>(x + D / 2 + c * P, b);
  }
  float ra[P], rb[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const float cos = cs[2 * j], sin = sign * cs[2 * j + 1];
    ra[j] = a[j] * cos - b[j] * sin;
    rb[j] = b[j] * cos + a[j] * sin;
  }
  if constexpr (INTERLEAVED) {
    float ab[2 * P];
#pragma unroll
    for (int j = 0; j < P; ++j) {
      ab[2 * j] = ra[j];
      ab[2 * j + 1] = rb[j];
    }
    if constexpr (2 * P * sizeof(T) <= 16 && P > 1) {
      store<T, 2 * P>(out + 2 * c * P, ab);
    } else {
#pragma unroll
      for (int j = 0; j < 2 * P; ++j) store<T, 1>(out + 2 * c * P + j, ab + j);
    }
  } else {
    store<T, P>(out + c * P, ra);
    store<T, P>(out + D / 2 + c * P, rb);
  }
}

template <typename T, int P, bool INTERLEAVED>
__device__ void rope_units(const T* q, const T* k, const float* freqs, T* q_out, T* k_out, i64 rows_q, i64 rows_k,
                           i64 T_, i64 D, i64 heads_q, i64 heads_k, float sign) {
  const i64 per_row = D / 2 / P;
  const i64 units_q = rows_q * per_row, total = units_q + rows_k * per_row;
  for (i64 u = (i64) blockIdx.x * blockDim.x + threadIdx.x; u < total; u += (i64) gridDim.x * blockDim.x) {
    const bool is_q = u < units_q;
    const i64 local = is_q ? u : u - units_q;
    const i64 row = local / per_row, c = local % per_row;
    const T* x = (is_q ? q : k) + row * D;
    T* out = (is_q ? q_out : k_out) + row * D;
    const i64 position = (row / (is_q ? heads_q : heads_k)) % T_;
    rotate_unit<T, P, INTERLEAVED>(x, out, freqs + position * D, c, D, sign);
  }
}

template <typename T>
__device__ void rope(const T* q, const T* k, const float* freqs, T* q_out, T* k_out, i64 rows_q, i64 rows_k, i64 T_,
                     i64 D, int interleaved, i64 heads_q, i64 heads_k, float sign) {
  constexpr int V = kVec<T>;
  const bool vec = aligned16(q) && aligned16(k) && aligned16(q_out) && aligned16(k_out) && aligned16(freqs);
  if (interleaved) {
    if (vec && D % V == 0) rope_units<T, V / 2, true>(q, k, freqs, q_out, k_out, rows_q, rows_k, T_, D,
                                  heads_q, heads_k, sign);
    else rope_units<T, 1, true>(q, k, freqs, q_out, k_out, rows_q, rows_k, T_, D,
                                  heads_q, heads_k, sign);
  } else {
    if (vec && (D / 2) % V == 0) rope_units<T, V, false>(q, k, freqs, q_out, k_out, rows_q, rows_k, T_, D,
                                  heads_q, heads_k, sign);
    else rope_units<T, 1, false>(q, k, freqs, q_out, k_out, rows_q, rows_k, T_, D,
                                  heads_q, heads_k, sign);
  }
}

}  // namespace

// rope(q, k, freqs; interleaved) -> (q_rot, k_rot); rope_backward(d_q_rot, d_k_rot, freqs) -> (d_q, d_k).
// Launch (kernels/cuda.py: rope_config): block (256, 1, 1), grid (min(ceil(units / 256), 65536), 1, 1)
// with units = (rows_q + rows_k) * D / 2 / P, P the pairs of one 16-byte vector
// (8 bf16 or 4 fp32; interleaved 4 or 2). The outputs may alias the inputs.
extern "C" __global__ void mdsl_rope_fwd_bf16(const bf16* q, const bf16* k, const float* freqs, bf16* q_rot, bf16* k_rot,
                                              i64 rows_q, i64 rows_k, i64 T, i64 D, int interleaved,
                                              i64 heads_q, i64 heads_k) {
  rope(q, k, freqs, q_rot, k_rot, rows_q, rows_k, T, D, interleaved, heads_q, heads_k, 1.f);
}
extern "C" __global__ void mdsl_rope_fwd_f32(const float* q, const float* k, const float* freqs, float* q_rot,
                                             float* k_rot, i64 rows_q, i64 rows_k, i64 T, i64 D, int interleaved,
                                             i64 heads_q, i64 heads_k) {
  rope(q, k, freqs, q_rot, k_rot, rows_q, rows_k, T, D, interleaved, heads_q, heads_k, 1.f);
}
extern "C" __global__ void mdsl_rope_bwd_bf16(const bf16* d_q_rot, const bf16* d_k_rot, const float* freqs, bf16* d_q,
                                              bf16* d_k, i64 rows_q, i64 rows_k, i64 T, i64 D, int interleaved,
                                              i64 heads_q, i64 heads_k) {
  rope(d_q_rot, d_k_rot, freqs, d_q, d_k, rows_q, rows_k, T, D, interleaved, heads_q, heads_k, -1.f);
}
extern "C" __global__ void mdsl_rope_bwd_f32(const float* d_q_rot, const float* d_k_rot, const float* freqs, float* d_q,
                                             float* d_k, i64 rows_q, i64 rows_k, i64 T, i64 D, int interleaved,
                                             i64 heads_q, i64 heads_k) {
  rope(d_q_rot, d_k_rot, freqs, d_q, d_k, rows_q, rows_k, T, D, interleaved, heads_q, heads_k, -1.f);
}

// qk_norm(q, k, q_weight, k_weight; eps) -> (q_norm, k_norm, q_rstd, k_rstd): RMSNorm over D.
// Launch (kernels/cuda.py: row_config): block (G, R, 1) as rmsnorm.cu, grid
// (min(ceil(max(rows_q, rows_k) / R), cap), 2, 1): blockIdx.y 0 normalizes q, 1 k.
template <typename T>
__device__ void qk_norm_fwd(const T* q, const T* k, const T* q_weight, const T* k_weight, T* q_norm, T* k_norm,
                            float* q_rstd, float* k_rstd, i64 rows_q, i64 rows_k, i64 D, float eps) {
  if (blockIdx.y == 0) rmsnorm_fwd<T, false>(q, nullptr, q_weight, nullptr, q_norm, q_rstd, rows_q, D, eps);
  else rmsnorm_fwd<T, false>(k, nullptr, k_weight, nullptr, k_norm, k_rstd, rows_k, D, eps);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_qk_norm_fwd_bf16(const bf16* q, const bf16* k, const bf16* q_weight, const bf16* k_weight, bf16* q_norm,
                      bf16* k_norm, float* q_rstd, float* k_rstd, i64 rows_q, i64 rows_k, i64 D, float eps) {
  qk_norm_fwd(q, k, q_weight, k_weight, q_norm, k_norm, q_rstd, k_rstd, rows_q, rows_k, D, eps);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_qk_norm_fwd_f32(const float* q, const float* k, const float* q_weight, const float* k_weight, float* q_norm,
                     float* k_norm, float* q_rstd, float* k_rstd, i64 rows_q, i64 rows_k, i64 D, float eps) {
  qk_norm_fwd(q, k, q_weight, k_weight, q_norm, k_norm, q_rstd, k_rstd, rows_q, rows_k, D, eps);
}

// qk_norm_backward(d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd) -> (d_q, d_k, and the
// d_q_weight / d_k_weight partials, fp32 [gridDim.x, D] each). Launch as mdsl_qk_norm_fwd_*
// (grid.x capped: it sizes the partials); then mdsl_qk_norm_dw_reduce_*.
template <typename T>
__device__ void qk_norm_bwd(const T* d_q_norm, const T* d_k_norm, const T* q, const T* k, const T* q_weight,
                            const T* k_weight, const float* q_rstd, const float* k_rstd, T* d_q, T* d_k,
                            float* dw_partial_q, float* dw_partial_k, i64 rows_q, i64 rows_k, i64 D) {
  if (blockIdx.y == 0) rmsnorm_bwd<T, false>(d_q_norm, nullptr, q, q_weight, q_rstd, d_q, nullptr, dw_partial_q, rows_q, D);
  else rmsnorm_bwd<T, false>(d_k_norm, nullptr, k, k_weight, k_rstd, d_k, nullptr, dw_partial_k, rows_k, D);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_qk_norm_bwd_bf16(const bf16* d_q_norm, const bf16* d_k_norm, const bf16* q, const bf16* k, const bf16* q_weight,
                      const bf16* k_weight, const float* q_rstd, const float* k_rstd, bf16* d_q, bf16* d_k,
                      float* dw_partial_q, float* dw_partial_k, i64 rows_q, i64 rows_k, i64 D) {
  qk_norm_bwd(d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd, d_q, d_k, dw_partial_q, dw_partial_k,
              rows_q, rows_k, D);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_qk_norm_bwd_f32(const float* d_q_norm, const float* d_k_norm, const float* q, const float* k,
                     const float* q_weight, const float* k_weight, const float* q_rstd, const float* k_rstd,
                     float* d_q, float* d_k, float* dw_partial_q, float* dw_partial_k, i64 rows_q, i64 rows_k,
                     i64 D) {
  qk_norm_bwd(d_q_norm, d_k_norm, q, k, q_weight, k_weight, q_rstd, k_rstd, d_q, d_k, dw_partial_q, dw_partial_k,
              rows_q, rows_k, D);
}

// d_q_weight / d_k_weight = column sums of the partials. Launch: block (32, 8, 1),
// grid (ceil(D / 32), 1, 2): blockIdx.z 0 reduces q's partials, 1 k's.
extern "C" __global__ void mdsl_qk_norm_dw_reduce_bf16(const float* dw_partial_q, const float* dw_partial_k,
                                                       bf16* d_q_weight, bf16* d_k_weight, i64 parts, i64 D) {
  if (blockIdx.z == 0) column_sum<float, bf16>(dw_partial_q, d_q_weight, 1, parts, D, 1.f);
  else column_sum<float, bf16>(dw_partial_k, d_k_weight, 1, parts, D, 1.f);
}
extern "C" __global__ void mdsl_qk_norm_dw_reduce_f32(const float* dw_partial_q, const float* dw_partial_k,
                                                      float* d_q_weight, float* d_k_weight, i64 parts, i64 D) {
  if (blockIdx.z == 0) column_sum<float, float>(dw_partial_q, d_q_weight, 1, parts, D, 1.f);
  else column_sum<float, float>(dw_partial_k, d_k_weight, 1, parts, D, 1.f);
}

// ----------------------------------------------------------------------------
// fused_qk_norm_rope: qk_norm then rope in one pass (mdsl-fuse pattern qk_norm_rope; reference:
// fused_qk_norm_rope, fused_qk_norm_rope_backward). A row of D is normed and rotated in registers.
// Launch (kernels/cuda.py: _qk_norm_rope_block): block (G, R, 1), G the smallest power of two with
// ceil(D / 2 / G) <= kRopePairs (at most 512), R = max(1, 256 / G) rows per block; grid
// (min(ceil(max(rows_q, rows_k) / R), cap), 2, 1): blockIdx.y 0 works on q, 1 on k. Lane l of a row
// holds the pairs l + j G (j < kRopePairs): (x[i], x[i + D/2]) or, interleaved, (x[2i], x[2i + 1]).
// Positions as rope's: (row / heads) % T, heads = H in bthd, 1 in bhtd.
// ----------------------------------------------------------------------------

namespace {

constexpr int kRopePairs = 4;

struct PairAt {
  i64 a, b;  // offsets of the pair's two elements in the row
};

__device__ __forceinline__ PairAt pair_at(i64 p, i64 D, int interleaved) {
  return interleaved ? PairAt{2 * p, 2 * p + 1} : PairAt{p, p + D / 2};
}

template <typename T>
__device__ void qk_norm_rope_fwd_rows(const T* x, const T* w, const float* freqs, T* out, float* rstd, i64 rows,
                                      i64 T_, i64 D, int interleaved, i64 heads, float eps) {
  const int G = blockDim.x, lane = threadIdx.x;
  const i64 pairs = D / 2;
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < rows; base += (i64) gridDim.x * blockDim.y) {
    const i64 row = base + threadIdx.y;
    const bool valid = row < rows;
    const T* xr = x + row * D;
    float ca[kRopePairs], cb[kRopePairs];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kRopePairs; ++j) {
      const i64 p = lane + (i64) j * G;
      ca[j] = cb[j] = 0.f;
      if (valid && p < pairs) {
        const PairAt at = pair_at(p, D, interleaved);
        ca[j] = to_f32(xr[at.a]);
        cb[j] = to_f32(xr[at.b]);
        ss += ca[j] * ca[j] + cb[j] * cb[j];
      }
    }
    ss = group_sum(ss);
    const float r = 1.f / sqrtf(ss / (float) D + eps);
    if (!valid) continue;
    if (lane == 0) rstd[row] = r;
    const float* f = freqs + ((row / heads) % T_) * D;
#pragma unroll
    for (int j = 0; j < kRopePairs; ++j) {
      const i64 p = lane + (i64) j * G;
      if (p < pairs) {
        const PairAt at = pair_at(p, D, interleaved);
        const float a = ca[j] * r * to_f32(w[at.a]), b = cb[j] * r * to_f32(w[at.b]);
        const float cos = f[2 * p], sin = f[2 * p + 1];
        out[row * D + at.a] = from_f32<T>(a * cos - b * sin);
        out[row * D + at.b] = from_f32<T>(b * cos + a * sin);
      }
    }
  }
}

// d_norm = the inverse rotation of d_rot; then rmsnorm's backward: d_x = r (d_norm w) - x r^3 mean(d_norm w x),
// per-block partials of d_w = sum_rows(d_norm x r) in partial[blockIdx.x, :] (a column sum reduces them).
template <typename T>
__device__ void qk_norm_rope_bwd_rows(const T* d_rot, const T* x, const T* w, const float* rstd, const float* freqs,
                                      T* dx, float* partial, i64 rows, i64 T_, i64 D, int interleaved, i64 heads) {
  const int G = blockDim.x, lane = threadIdx.x;
  const i64 pairs = D / 2;
  float dwa[kRopePairs], dwb[kRopePairs];
#pragma unroll
  for (int j = 0; j < kRopePairs; ++j) dwa[j] = dwb[j] = 0.f;
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < rows; base += (i64) gridDim.x * blockDim.y) {
    const i64 row = base + threadIdx.y;
    const bool valid = row < rows;
    const float r = valid ? rstd[row] : 0.f;
    const float* f = freqs + (valid ? ((row / heads) % T_) * D : 0);
    float na[kRopePairs], nb[kRopePairs], xa[kRopePairs], xb[kRopePairs];
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kRopePairs; ++j) {
      const i64 p = lane + (i64) j * G;
      na[j] = nb[j] = xa[j] = xb[j] = 0.f;
      if (valid && p < pairs) {
        const PairAt at = pair_at(p, D, interleaved);
        const float da = to_f32(d_rot[row * D + at.a]), db = to_f32(d_rot[row * D + at.b]);
        const float cos = f[2 * p], sin = -f[2 * p + 1];
        na[j] = da * cos - db * sin;
        nb[j] = db * cos + da * sin;
        xa[j] = to_f32(x[row * D + at.a]);
        xb[j] = to_f32(x[row * D + at.b]);
        dot += na[j] * to_f32(w[at.a]) * xa[j] + nb[j] * to_f32(w[at.b]) * xb[j];
      }
    }
    dot = group_sum(dot);
    if (!valid) continue;
    const float mean = dot / (float) D, r3 = r * r * r;
#pragma unroll
    for (int j = 0; j < kRopePairs; ++j) {
      const i64 p = lane + (i64) j * G;
      if (p < pairs) {
        const PairAt at = pair_at(p, D, interleaved);
        dx[row * D + at.a] = from_f32<T>(r * (na[j] * to_f32(w[at.a])) - xa[j] * r3 * mean);
        dx[row * D + at.b] = from_f32<T>(r * (nb[j] * to_f32(w[at.b])) - xb[j] * r3 * mean);
        dwa[j] += na[j] * xa[j] * r;
        dwb[j] += nb[j] * xb[j] * r;
      }
    }
  }
  // The R row groups of the block add their register sums into the partial row in turn (deterministic).
  float* part = partial + (i64) blockIdx.x * D;
  for (int g = 0; g < (int) blockDim.y; ++g) {
    if ((int) threadIdx.y == g) {
#pragma unroll
      for (int j = 0; j < kRopePairs; ++j) {
        const i64 p = lane + (i64) j * G;
        if (p < pairs) {
          const PairAt at = pair_at(p, D, interleaved);
          part[at.a] = (g == 0 ? 0.f : part[at.a]) + dwa[j];
          part[at.b] = (g == 0 ? 0.f : part[at.b]) + dwb[j];
        }
      }
    }
    __syncthreads();
  }
}

}  // namespace

// fused_qk_norm_rope(q, k, q_weight, k_weight, freqs; eps, interleaved, layout) -> (q_rot, k_rot, q_rstd, k_rstd)
template <typename T>
__device__ void qk_norm_rope_fwd(const T* q, const T* k, const T* q_weight, const T* k_weight, const float* freqs,
                                 T* q_rot, T* k_rot, float* q_rstd, float* k_rstd, i64 rows_q, i64 rows_k, i64 T_,
                                 i64 D, int interleaved, i64 heads_q, i64 heads_k, float eps) {
  if (blockIdx.y == 0) qk_norm_rope_fwd_rows<T>(q, q_weight, freqs, q_rot, q_rstd, rows_q, T_, D, interleaved, heads_q, eps);
  else qk_norm_rope_fwd_rows<T>(k, k_weight, freqs, k_rot, k_rstd, rows_k, T_, D, interleaved, heads_k, eps);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_qk_norm_rope_fwd_bf16(const bf16* q, const bf16* k, const bf16* q_weight, const bf16* k_weight,
                           const float* freqs, bf16* q_rot, bf16* k_rot, float* q_rstd, float* k_rstd, i64 rows_q,
                           i64 rows_k, i64 T, i64 D, int interleaved, i64 heads_q, i64 heads_k, float eps) {
  qk_norm_rope_fwd(q, k, q_weight, k_weight, freqs, q_rot, k_rot, q_rstd, k_rstd, rows_q, rows_k, T, D, interleaved,
                   heads_q, heads_k, eps);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_qk_norm_rope_fwd_f32(const float* q, const float* k, const float* q_weight, const float* k_weight,
                          const float* freqs, float* q_rot, float* k_rot, float* q_rstd, float* k_rstd, i64 rows_q,
                          i64 rows_k, i64 T, i64 D, int interleaved, i64 heads_q, i64 heads_k, float eps) {
  qk_norm_rope_fwd(q, k, q_weight, k_weight, freqs, q_rot, k_rot, q_rstd, k_rstd, rows_q, rows_k, T, D, interleaved,
                   heads_q, heads_k, eps);
}

// fused_qk_norm_rope_backward(d_q_rot, d_k_rot, q, k, q_weight, k_weight, q_rstd, k_rstd, freqs) -> (d_q, d_k,
// and the d_q_weight / d_k_weight partials, fp32 [gridDim.x, D] each); then mdsl_qk_norm_dw_reduce_*.
template <typename T>
__device__ void qk_norm_rope_bwd(const T* d_q_rot, const T* d_k_rot, const T* q, const T* k, const T* q_weight,
                                 const T* k_weight, const float* q_rstd, const float* k_rstd, const float* freqs,
                                 T* d_q, T* d_k, float* dw_partial_q, float* dw_partial_k, i64 rows_q, i64 rows_k,
                                 i64 T_, i64 D, int interleaved, i64 heads_q, i64 heads_k) {
  if (blockIdx.y == 0) qk_norm_rope_bwd_rows<T>(d_q_rot, q, q_weight, q_rstd, freqs, d_q, dw_partial_q, rows_q, T_, D,
                                                interleaved, heads_q);
  else qk_norm_rope_bwd_rows<T>(d_k_rot, k, k_weight, k_rstd, freqs, d_k, dw_partial_k, rows_k, T_, D, interleaved,
                                heads_k);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_qk_norm_rope_bwd_bf16(const bf16* d_q_rot, const bf16* d_k_rot, const bf16* q, const bf16* k,
                           const bf16* q_weight, const bf16* k_weight, const float* q_rstd, const float* k_rstd,
                           const float* freqs, bf16* d_q, bf16* d_k, float* dw_partial_q, float* dw_partial_k,
                           i64 rows_q, i64 rows_k, i64 T, i64 D, int interleaved, i64 heads_q, i64 heads_k) {
  qk_norm_rope_bwd(d_q_rot, d_k_rot, q, k, q_weight, k_weight, q_rstd, k_rstd, freqs, d_q, d_k, dw_partial_q,
                   dw_partial_k, rows_q, rows_k, T, D, interleaved, heads_q, heads_k);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_qk_norm_rope_bwd_f32(const float* d_q_rot, const float* d_k_rot, const float* q, const float* k,
                          const float* q_weight, const float* k_weight, const float* q_rstd, const float* k_rstd,
                          const float* freqs, float* d_q, float* d_k, float* dw_partial_q, float* dw_partial_k,
                          i64 rows_q, i64 rows_k, i64 T, i64 D, int interleaved, i64 heads_q, i64 heads_k) {
  qk_norm_rope_bwd(d_q_rot, d_k_rot, q, k, q_weight, k_weight, q_rstd, k_rstd, freqs, d_q, d_k, dw_partial_q,
                   dw_partial_k, rows_q, rows_k, T, D, interleaved, heads_q, heads_k);
}
