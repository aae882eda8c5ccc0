// Reductions (kernels/reference.py: reduce_sum, reduce_mean, reduce_max, global_norm,
// clip_factor).
//
// reduce_sum / reduce_mean / reduce_max view x as [outer, R, inner] with R the
// product of the reduced dims, which must be consecutive (reducing non-adjacent
// dims is not covered): "rows" kernels for inner == 1 (the last dims), "cols"
// kernels for inner > 1. reduce_max_backward is not covered.
#include "common.cuh"

using namespace mdsl;

namespace {

// Sum of each row of [rows, R], divided by `divisor` (1: sum, R: mean).
template <typename T, int V>
__device__ void sum_rows(const T* x, T* out, i64 rows, i64 R, float divisor) {
  const i64 nv = R / V;
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < rows; base += (i64) gridDim.x * blockDim.y) {
    const i64 row = base + threadIdx.y;
    const bool valid = row < rows;
    float s = 0.f;
    for (i64 v = threadIdx.x; valid && v < nv; v += blockDim.x) {
      float t[V];
      load<T, V>(x + row * R + v * V, t);
#pragma unroll
      for (int j = 0; j < V; ++j) s += t[j];
    }
    s = group_sum(s);
    if (valid && threadIdx.x == 0) out[row] = from_f32<T>(s / divisor);
  }
}

// Is (v, i) the better maximum than (bv, bi)? NaN beats everything (numpy's max and
// argmax propagate it); among equal values the first index wins.
__device__ __forceinline__ bool better(float v, i64 i, float bv, i64 bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  return v > bv || (v == bv && i < bi);
}

constexpr i64 kNoIndex = 0x7fffffffffffffffLL;

// (max, first index of the max) of each row of [rows, R].
template <typename T, int V>
__device__ void max_rows(const T* x, T* values, void* indices, i64 rows, i64 R, int idx64) {
  __shared__ float sv[32];
  __shared__ i64 si[32];
  const int G = blockDim.x;
  const i64 nv = R / V;
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < rows; base += (i64) gridDim.x * blockDim.y) {
    const i64 row = base + threadIdx.y;
    const bool valid = row < rows;
    float bv = -INFINITY;
    i64 bi = kNoIndex;
    for (i64 v = threadIdx.x; valid && v < nv; v += G) {
      float t[V];
      load<T, V>(x + row * R + v * V, t);
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (better(t[j], v * V + j, bv, bi)) bv = t[j], bi = v * V + j;
    }
    for (int o = (G < 32 ? G : 32) >> 1; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFullMask, bv, o);
      const i64 oi = __shfl_xor_sync(kFullMask, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (G > 32) {  // combine the warps of a row group through shared memory
      const int tid = threadIdx.y * G + threadIdx.x, warp = tid >> 5, per_group = G >> 5;
      const int first = (warp / per_group) * per_group;
      __syncthreads();
      if ((tid & 31) == 0) sv[warp] = bv, si[warp] = bi;
      __syncthreads();
      for (int w = first; w < first + per_group; ++w)
        if (better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
    }
    if (valid && threadIdx.x == 0) {
      values[row] = from_f32<T>(bv);
      store_index(indices, row, bi == kNoIndex ? 0 : bi, idx64);
    }
  }
}

// (max, first index) over the middle dim of [outer, R, inner]. Block (32, 8): x walks
// inner, y splits R; grid (ceil(inner / 32), min(outer, 65535)), blockIdx.y loops outer.
template <typename T>
__device__ void max_cols(const T* x, T* values, void* indices, i64 outer, i64 R, i64 inner, int idx64) {
  __shared__ float sv[8][33];
  __shared__ i64 si[8][33];
  const i64 j = (i64) blockIdx.x * 32 + threadIdx.x;
  for (i64 o = blockIdx.y; o < outer; o += gridDim.y) {
    float bv = -INFINITY;
    i64 bi = kNoIndex;
    if (j < inner)
      for (i64 r = threadIdx.y; r < R; r += blockDim.y) {
        const float t = to_f32(x[(o * R + r) * inner + j]);
        if (better(t, r, bv, bi)) bv = t, bi = r;
      }
    __syncthreads();
    sv[threadIdx.y][threadIdx.x] = bv;
    si[threadIdx.y][threadIdx.x] = bi;
    __syncthreads();
    if (threadIdx.y == 0 && j < inner) {
      for (int y = 1; y < (int) blockDim.y; ++y)
        if (better(sv[y][threadIdx.x], si[y][threadIdx.x], bv, bi)) bv = sv[y][threadIdx.x], bi = si[y][threadIdx.x];
      values[o * inner + j] = from_f32<T>(bv);
      store_index(indices, o * inner + j, bi == kNoIndex ? 0 : bi, idx64);
    }
  }
}

template <typename T> __device__ void reduce_sum_rows(const T* x, T* out, i64 rows, i64 R, float divisor) {
  constexpr int V = kVec<T>;
  if (R % V == 0 && aligned16(x)) sum_rows<T, V>(x, out, rows, R, divisor);
  else sum_rows<T, 1>(x, out, rows, R, divisor);
}
template <typename T> __device__ void reduce_max_rows(const T* x, T* values, void* indices, i64 rows, i64 R, int idx64) {
  constexpr int V = kVec<T>;
  if (R % V == 0 && aligned16(x)) max_rows<T, V>(x, values, indices, rows, R, idx64);
  else max_rows<T, 1>(x, values, indices, rows, R, idx64);
}

}  // namespace

// reduce_sum (divisor 1) and reduce_mean (divisor R) over the last dims: out[r] = sum(x[r, :]) / divisor.
// Launch (kernels/cuda.py: row_config): block (G, R', 1), G threads per row, R' = max(1, 256 / G)
// rows per block; grid (min(ceil(rows / R'), cap), 1, 1).
extern "C" __global__ void mdsl_reduce_sum_rows_bf16(const bf16* x, bf16* out, i64 rows, i64 R, float divisor) {
  reduce_sum_rows(x, out, rows, R, divisor);
}
extern "C" __global__ void mdsl_reduce_sum_rows_f32(const float* x, float* out, i64 rows, i64 R, float divisor) {
  reduce_sum_rows(x, out, rows, R, divisor);
}
// The same over the middle dim of [outer, R, inner]. Launch: block (32, 8, 1),
// grid (ceil(inner / 32), min(outer, 65535), 1).
extern "C" __global__ void mdsl_reduce_sum_cols_bf16(const bf16* x, bf16* out, i64 outer, i64 R, i64 inner,
                                                     float divisor) {
  column_sum<bf16, bf16>(x, out, outer, R, inner, divisor);
}
extern "C" __global__ void mdsl_reduce_sum_cols_f32(const float* x, float* out, i64 outer, i64 R, i64 inner,
                                                    float divisor) {
  column_sum<float, float>(x, out, outer, R, inner, divisor);
}
// reduce_max over the last dim: values and int32/int64 indices. Launch as reduce_sum_rows.
extern "C" __global__ void mdsl_reduce_max_rows_bf16(const bf16* x, bf16* values, void* indices, i64 rows, i64 R,
                                                     int idx64) {
  reduce_max_rows(x, values, indices, rows, R, idx64);
}
extern "C" __global__ void mdsl_reduce_max_rows_f32(const float* x, float* values, void* indices, i64 rows, i64 R,
                                                    int idx64) {
  reduce_max_rows(x, values, indices, rows, R, idx64);
}
// reduce_max over the middle dim of [outer, R, inner]. Launch as reduce_sum_cols.
extern "C" __global__ void mdsl_reduce_max_cols_bf16(const bf16* x, bf16* values, void* indices, i64 outer, i64 R,
                                                     i64 inner, int idx64) {
  max_cols(x, values, indices, outer, R, inner, idx64);
}
extern "C" __global__ void mdsl_reduce_max_cols_f32(const float* x, float* values, void* indices, i64 outer, i64 R,
                                                    i64 inner, int idx64) {
  max_cols(x, values, indices, outer, R, inner, idx64);
}

// ---------------------------------------------------------------------------
// global_norm: sqrt(sum of squares of many tensors), fp32, in two stages
// ---------------------------------------------------------------------------

// One entry of the tensor table (16 bytes; kernels/cuda.py: tensor_table packs it).
struct TensorRef {
  const void* ptr;
  i64 n;
};

template <typename T>
__device__ float sum_squares(const T* x, i64 n) {
  constexpr int V = kVec<T>;
  const i64 tid = (i64) blockIdx.x * blockDim.x + threadIdx.x, stride = (i64) gridDim.x * blockDim.x;
  const i64 nvec = aligned16(x) ? n / V : 0;
  float s = 0.f;
  for (i64 i = tid; i < nvec; i += stride) {
    float t[V];
    load<T, V>(x + i * V, t);
#pragma unroll
    for (int j = 0; j < V; ++j) s += t[j] * t[j];
  }
  for (i64 e = nvec * V + tid; e < n; e += stride) {
    const float t = to_f32(x[e]);
    s += t * t;
  }
  return s;
}

// Stage 1: partial[b] = this block's share of the sum of squares over every tensor of the
// table (each block walks every tensor with the grid-stride loop). Launch: block (256, 1, 1),
// grid (P, 1, 1) with P from kernels/cuda.py (scratch: P floats).
template <typename T>
__device__ void global_norm_partial(const TensorRef* tensors, i64 count, float* partial) {
  float s = 0.f;
  for (i64 t = 0; t < count; ++t) s += sum_squares(static_cast<const T*>(tensors[t].ptr), tensors[t].n);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
extern "C" __global__ void mdsl_global_norm_partial_bf16(const TensorRef* tensors, i64 count, float* partial) {
  global_norm_partial<bf16>(tensors, count, partial);
}
extern "C" __global__ void mdsl_global_norm_partial_f32(const TensorRef* tensors, i64 count, float* partial) {
  global_norm_partial<float>(tensors, count, partial);
}

// Stage 2: norm[0] = sqrt(sum(partial[0:parts])). Launch: block (1024, 1, 1), grid (1, 1, 1).
extern "C" __global__ void __launch_bounds__(1024) mdsl_global_norm_finish_f32(const float* partial, i64 parts, float* norm) {
  float s = 0.f;
  for (i64 p = threadIdx.x; p < parts; p += blockDim.x) s += partial[p];
  s = block_sum(s);
  if (threadIdx.x == 0) norm[0] = sqrtf(s);
}

// factor[0] = min(1, max_norm / (norm[0] + 1e-6)) (torch.nn.utils.clip_grad_norm_).
// Launch: block (32, 1, 1), grid (1, 1, 1).
extern "C" __global__ void mdsl_clip_factor_f32(const float* norm, float* factor, float max_norm) {
  if (threadIdx.x == 0) {
    const float q = max_norm / (norm[0] + 1e-6f);
    factor[0] = (q < 1.f || q != q) ? q : 1.f;  // NaN stays NaN, as np.minimum
  }
}
