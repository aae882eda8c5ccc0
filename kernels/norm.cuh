// Row-wise RMSNorm device code, shared by rmsnorm.cu (rmsnorm, fused_residual_rmsnorm)
// and rope.cu (qk_norm: RMSNorm of every q and k head vector).
//
// Launch: block (G, R) with G threads per row (power of two) and R = max(1, 256 / G)
// rows per block; grid (blocks, ...) with a grid-stride loop over rows. G is
// chosen so that a thread holds at most kItems vectors of its row in registers
// (kernels/cuda.py: row_config); longer rows re-read the rest from memory.
#pragma once

#include "common.cuh"

namespace mdsl {

// Vectors of a row one thread keeps in registers (kernels/cuda.py mirrors these:
// the launch's G is the smallest power of two with ceil(vectors / G) <= items).
constexpr int kFwdItems = 4;
constexpr int kBwdItems = 2;

// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); with RES, x = a + b is also
// written to res_out (fused_residual_rmsnorm) and the statistics use the fp32 sum.
template <typename T, int V, bool RES, int kItems = kFwdItems>
__device__ void rmsnorm_fwd_rows(const T* a, const T* b, const T* w, T* res_out, T* y, float* rstd,
                                 i64 rows, i64 D, float eps) {
  const int G = blockDim.x, lane = threadIdx.x;
  const i64 nv = D / V;
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < rows; base += (i64) gridDim.x * blockDim.y) {
    const i64 row = base + threadIdx.y;
    const bool valid = row < rows;
    const i64 off = row * D;
    float cache[kItems][V];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const i64 v = lane + (i64) k * G;
      if (valid && v < nv) {
        load<T, V>(a + off + v * V, cache[k]);
        if constexpr (RES) {
          float t[V];
          load<T, V>(b + off + v * V, t);
#pragma unroll
          for (int j = 0; j < V; ++j) cache[k][j] += t[j];
          store<T, V>(res_out + off + v * V, cache[k]);
        }
#pragma unroll
        for (int j = 0; j < V; ++j) ss += cache[k][j] * cache[k][j];
      }
    }
    for (i64 v = lane + (i64) kItems * G; valid && v < nv; v += G) {
      float t[V];
      load<T, V>(a + off + v * V, t);
      if constexpr (RES) {
        float u[V];
        load<T, V>(b + off + v * V, u);
#pragma unroll
        for (int j = 0; j < V; ++j) t[j] += u[j];
        store<T, V>(res_out + off + v * V, t);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) ss += t[j] * t[j];
    }
    ss = group_sum(ss);
    const float r = 1.f / sqrtf(ss / (float) D + eps);
    if (!valid) continue;
    if (lane == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const i64 v = lane + (i64) k * G;
      if (v < nv) {
        float wv[V], out[V];
        load<T, V>(w + v * V, wv);
#pragma unroll
        for (int j = 0; j < V; ++j) out[j] = cache[k][j] * r * wv[j];
        store<T, V>(y + off + v * V, out);
      }
    }
    for (i64 v = lane + (i64) kItems * G; v < nv; v += G) {
      float t[V], wv[V];
      load<T, V>(a + off + v * V, t);
      if constexpr (RES) {
        float u[V];
        load<T, V>(b + off + v * V, u);
#pragma unroll
        for (int j = 0; j < V; ++j) t[j] += u[j];
      }
      load<T, V>(w + v * V, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) t[j] = t[j] * r * wv[j];
      store<T, V>(y + off + v * V, t);
    }
  }
}

template <typename T, bool RES>
__device__ void rmsnorm_fwd(const T* a, const T* b, const T* w, T* res_out, T* y, float* rstd, i64 rows, i64 D,
                            float eps) {
  constexpr int V = kVec<T>;
  const bool vec = D % V == 0 && aligned16(a) && aligned16(w) && aligned16(y) &&
                   (!RES || (aligned16(b) && aligned16(res_out)));
  if (vec) rmsnorm_fwd_rows<T, V, RES>(a, b, w, res_out, y, rstd, rows, D, eps);
  else rmsnorm_fwd_rows<T, 1, RES>(a, b, w, res_out, y, rstd, rows, D, eps);
}

// d_x = rstd * g - x * rstd^3 * mean(g * x) with g = d_y * w (plus d_next with RES,
// written to d_x and d_x2); per-block partial sums of d_w = sum_rows(d_y * x * rstd)
// go to partial[blockIdx.x, :] (fp32 [gridDim.x, D]), which a column sum reduces.
template <typename T, int V, bool RES, int kItems = kBwdItems>
__device__ void rmsnorm_bwd_rows(const T* dy, const T* d_next, const T* x, const T* w, const float* rstd, T* dx,
                                 T* dx2, float* partial, i64 rows, i64 D) {
  const int G = blockDim.x, lane = threadIdx.x;
  const i64 nv = D / V;
  float* part = partial + (i64) blockIdx.x * D;
  // Columns past the register-held ones (very long rows, or the scalar path with a
  // G chosen for vectors) accumulate with atomics into a zeroed partial row.
  const bool overflow = nv > (i64) kItems * G;
  if (overflow) {
    const int tid = threadIdx.y * G + threadIdx.x, threads = G * blockDim.y;
    for (i64 c = (i64) kItems * G * V + tid; c < D; c += threads) part[c] = 0.f;
    __syncthreads();
  }
  float dw[kItems][V];
#pragma unroll
  for (int k = 0; k < kItems; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) dw[k][j] = 0.f;

  for (i64 base = (i64) blockIdx.x * blockDim.y; base < rows; base += (i64) gridDim.x * blockDim.y) {
    const i64 row = base + threadIdx.y;
    const bool valid = row < rows;
    const i64 off = row * D;
    const float r = valid ? rstd[row] : 0.f;
    float cx[kItems][V], cdy[kItems][V];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const i64 v = lane + (i64) k * G;
      if (valid && v < nv) {
        float wv[V];
        load<T, V>(dy + off + v * V, cdy[k]);
        load<T, V>(x + off + v * V, cx[k]);
        load<T, V>(w + v * V, wv);
#pragma unroll
        for (int j = 0; j < V; ++j) dot += cdy[k][j] * wv[j] * cx[k][j];
      }
    }
    for (i64 v = lane + (i64) kItems * G; valid && v < nv; v += G) {
      float d[V], xv[V], wv[V];
      load<T, V>(dy + off + v * V, d);
      load<T, V>(x + off + v * V, xv);
      load<T, V>(w + v * V, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) dot += d[j] * wv[j] * xv[j];
    }
    dot = group_sum(dot);
    if (!valid) continue;
    const float mean = dot / (float) D, r3 = r * r * r;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const i64 v = lane + (i64) k * G;
      if (v < nv) {
        float wv[V], out[V];
        load<T, V>(w + v * V, wv);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          out[j] = r * (cdy[k][j] * wv[j]) - cx[k][j] * r3 * mean;
          dw[k][j] += cdy[k][j] * cx[k][j] * r;
        }
        if constexpr (RES) {
          float n[V];
          load<T, V>(d_next + off + v * V, n);
#pragma unroll
          for (int j = 0; j < V; ++j) out[j] += n[j];
          store<T, V>(dx2 + off + v * V, out);
        }
        store<T, V>(dx + off + v * V, out);
      }
    }
    for (i64 v = lane + (i64) kItems * G; v < nv; v += G) {
      float d[V], xv[V], wv[V], out[V];
      load<T, V>(dy + off + v * V, d);
      load<T, V>(x + off + v * V, xv);
      load<T, V>(w + v * V, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        out[j] = r * (d[j] * wv[j]) - xv[j] * r3 * mean;
        atomicAdd(part + v * V + j, d[j] * xv[j] * r);
      }
      if constexpr (RES) {
        float n[V];
        load<T, V>(d_next + off + v * V, n);
#pragma unroll
        for (int j = 0; j < V; ++j) out[j] += n[j];
        store<T, V>(dx2 + off + v * V, out);
      }
      store<T, V>(dx + off + v * V, out);
    }
  }
  // The R row groups of the block add their register sums into the partial row in
  // turn (a fixed order: deterministic).
  for (int g = 0; g < (int) blockDim.y; ++g) {
    if ((int) threadIdx.y == g) {
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const i64 v = lane + (i64) k * G;
        if (v < nv)
#pragma unroll
          for (int j = 0; j < V; ++j) part[v * V + j] = (g == 0 ? 0.f : part[v * V + j]) + dw[k][j];
      }
    }
    __syncthreads();
  }
}

template <typename T, bool RES>
__device__ void rmsnorm_bwd(const T* dy, const T* d_next, const T* x, const T* w, const float* rstd, T* dx, T* dx2,
                            float* partial, i64 rows, i64 D) {
  constexpr int V = kVec<T>;
  const bool vec = D % V == 0 && aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx) &&
                   (!RES || (aligned16(d_next) && aligned16(dx2)));
  if (vec) rmsnorm_bwd_rows<T, V, RES>(dy, d_next, x, w, rstd, dx, dx2, partial, rows, D);
  else rmsnorm_bwd_rows<T, 1, RES>(dy, d_next, x, w, rstd, dx, dx2, partial, rows, D);
}

}  // namespace mdsl
