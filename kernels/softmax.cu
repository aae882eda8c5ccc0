// Softmax over the last dim, forward and backward (kernels/reference.py: softmax,
// softmax_backward with dim = -1; other dims are not covered).
//
// Rows are the last dim C: rows = numel / C. Launch (kernels/cuda.py: row_config):
// block (G, R, 1) with G threads per row (a power of two, at most 512) and
// R = max(1, 256 / G) rows per block; grid (min(ceil(rows / R), cap), 1, 1); no
// dynamic shared memory. A thread keeps up to kItems vectors of its row in
// registers; the rest of a longer row is read again. Outputs may alias inputs.
#include "common.cuh"

using namespace mdsl;

namespace {

constexpr int kFwdItems = 4;
constexpr int kBwdItems = 2;

// out = exp(x - max) / sum(exp(x - max))
template <typename T, int V>
__device__ void softmax_rows(const T* x, T* out, i64 rows, i64 C) {
  constexpr int K = kFwdItems;
  const int G = blockDim.x, lane = threadIdx.x;
  const i64 nv = C / V;
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < rows; base += (i64) gridDim.x * blockDim.y) {
    const i64 row = base + threadIdx.y;
    const bool valid = row < rows;
    const T* xr = x + row * C;
    T* yr = out + row * C;
    float cache[K][V];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const i64 v = lane + (i64) k * G;
      if (valid && v < nv) {
        load<T, V>(xr + v * V, cache[k]);
#pragma unroll
        for (int j = 0; j < V; ++j) m = fmaxf(m, cache[k][j]);
      }
    }
    for (i64 v = lane + (i64) K * G; valid && v < nv; v += G) {
      float t[V];
      load<T, V>(xr + v * V, t);
#pragma unroll
      for (int j = 0; j < V; ++j) m = fmaxf(m, t[j]);
    }
    m = group_max(m);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const i64 v = lane + (i64) k * G;
      if (valid && v < nv) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          cache[k][j] = expf(cache[k][j] - m);
          s += cache[k][j];
        }
      }
    }
    for (i64 v = lane + (i64) K * G; valid && v < nv; v += G) {
      float t[V];
      load<T, V>(xr + v * V, t);
#pragma unroll
      for (int j = 0; j < V; ++j) s += expf(t[j] - m);
    }
    s = group_sum(s);
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const i64 v = lane + (i64) k * G;
      if (v < nv) {
#pragma unroll
        for (int j = 0; j < V; ++j) cache[k][j] = cache[k][j] / s;
        store<T, V>(yr + v * V, cache[k]);
      }
    }
    for (i64 v = lane + (i64) K * G; v < nv; v += G) {
      float t[V];
      load<T, V>(xr + v * V, t);
#pragma unroll
      for (int j = 0; j < V; ++j) t[j] = expf(t[j] - m) / s;
      store<T, V>(yr + v * V, t);
    }
  }
}

// d_x = out * (d_out - sum(d_out * out))
template <typename T, int V>
__device__ void softmax_bwd_rows(const T* d_out, const T* out, T* d_x, i64 rows, i64 C) {
  constexpr int K = kBwdItems;
  const int G = blockDim.x, lane = threadIdx.x;
  const i64 nv = C / V;
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < rows; base += (i64) gridDim.x * blockDim.y) {
    const i64 row = base + threadIdx.y;
    const bool valid = row < rows;
    const i64 off = row * C;
    float cd[K][V], co[K][V];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const i64 v = lane + (i64) k * G;
      if (valid && v < nv) {
        load<T, V>(d_out + off + v * V, cd[k]);
        load<T, V>(out + off + v * V, co[k]);
#pragma unroll
        for (int j = 0; j < V; ++j) dot += cd[k][j] * co[k][j];
      }
    }
    for (i64 v = lane + (i64) K * G; valid && v < nv; v += G) {
      float d[V], o[V];
      load<T, V>(d_out + off + v * V, d);
      load<T, V>(out + off + v * V, o);
#pragma unroll
      for (int j = 0; j < V; ++j) dot += d[j] * o[j];
    }
    dot = group_sum(dot);
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const i64 v = lane + (i64) k * G;
      if (v < nv) {
        float r[V];
#pragma unroll
        for (int j = 0; j < V; ++j) r[j] = co[k][j] * (cd[k][j] - dot);
        store<T, V>(d_x + off + v * V, r);
      }
    }
    for (i64 v = lane + (i64) K * G; v < nv; v += G) {
      float d[V], o[V];
      load<T, V>(d_out + off + v * V, d);
      load<T, V>(out + off + v * V, o);
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = o[j] * (d[j] - dot);
      store<T, V>(d_x + off + v * V, o);
    }
  }
}

template <typename T> __device__ void softmax_fwd(const T* x, T* out, i64 rows, i64 C) {
  constexpr int V = kVec<T>;
  if (C % V == 0 && aligned16(x) && aligned16(out)) softmax_rows<T, V>(x, out, rows, C);
  else softmax_rows<T, 1>(x, out, rows, C);
}
template <typename T> __device__ void softmax_bwd(const T* d_out, const T* out, T* d_x, i64 rows, i64 C) {
  constexpr int V = kVec<T>;
  if (C % V == 0 && aligned16(d_out) && aligned16(out) && aligned16(d_x)) softmax_bwd_rows<T, V>(d_out, out, d_x, rows, C);
  else softmax_bwd_rows<T, 1>(d_out, out, d_x, rows, C);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512) mdsl_softmax_fwd_bf16(const bf16* x, bf16* out, i64 rows, i64 C) {
  softmax_fwd(x, out, rows, C);
}
extern "C" __global__ void __launch_bounds__(512) mdsl_softmax_fwd_f32(const float* x, float* out, i64 rows, i64 C) {
  softmax_fwd(x, out, rows, C);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_softmax_bwd_bf16(const bf16* d_out, const bf16* out, bf16* d_x, i64 rows, i64 C) {
  softmax_bwd(d_out, out, d_x, rows, C);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_softmax_bwd_f32(const float* d_out, const float* out, float* d_x, i64 rows, i64 C) {
  softmax_bwd(d_out, out, d_x, rows, C);
}
