// Shared device helpers of the modeldsl CUDA kernels (kernels/*.cu).
//
// Conventions every kernel follows (kernels/cuda.py describes each launch):
// - Storage types T are float (fp32), __nv_bfloat16 (bf16) and __half (fp16);
//   arithmetic is fp32, statistics (rstd, lse, norms) are stored as fp32.
// - Sizes are int64 (`i64`); index tensors are int32 or int64, chosen by an
//   `int idx64` parameter (0: int32, 1: int64).
// - Vector paths move 16 bytes per load/store (8 bf16 or 4 fp32 values). A
//   kernel takes them only when the pointers are 16-byte aligned and the row
//   length is a multiple of the vector width; otherwise it runs the same code
//   one element at a time (the scalar path), so ragged sizes are always right.
// - Row kernels use a 2-D block: blockDim.x = G threads share one row (G a
//   power of two, 1..1024), blockDim.y = R rows per block; G * R is a multiple
//   of 32. Rows are visited with a block-uniform grid-stride loop, so every
//   thread reaches every __syncthreads().
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace mdsl {

using i64 = long long;
using bf16 = __nv_bfloat16;
using f16 = __half;

constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(f16 v) { return __half2float(v); }

// Round to nearest even, as ml_dtypes and PyTorch do.
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) { return __float2half_rn(v); }

// ---------------------------------------------------------------------------
// Vector loads and stores
// ---------------------------------------------------------------------------

// Elements of T in one 16-byte vector.
template <typename T> constexpr int kVec = 16 / sizeof(T);

template <int Bytes> struct RawOf;
template <> struct RawOf<16> { using type = uint4; };
template <> struct RawOf<8> { using type = uint2; };
template <> struct RawOf<4> { using type = unsigned int; };
template <> struct RawOf<2> { using type = unsigned short; };

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (uintptr_t)(bytes - 1)) == 0;
}

__device__ __forceinline__ bool aligned16(const void* p) { return aligned(p, 16); }

// V consecutive elements at p (aligned to V * sizeof(T) bytes) as floats.
template <typename T, int V>
__device__ __forceinline__ void load(const T* p, float* out) {
  if constexpr (V == 1) {
    out[0] = to_f32(*p);
  } else {
    using Raw = typename RawOf<sizeof(T) * V>::type;
    Raw raw = *reinterpret_cast<const Raw*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_f32(e[i]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store(T* p, const float* in) {
  if constexpr (V == 1) {
    *p = from_f32<T>(in[0]);
  } else {
    using Raw = typename RawOf<sizeof(T) * V>::type;
    Raw raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = from_f32<T>(in[i]);
    *reinterpret_cast<Raw*>(p) = raw;
  }
}

// ---------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over all threads of a 1-D block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the total. Every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading partial[]
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += partial[w];
  return total;
}

// Max over all threads of a 1-D block, as block_sum.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float total = -INFINITY;
  for (int w = 0; w < warps; ++w) total = fmaxf(total, partial[w]);
  return total;
}

// Sum over the G = blockDim.x threads that share one row (see the file comment);
// every thread of the row group gets the total. Every thread of the block must call it.
__device__ __forceinline__ float group_sum(float v) {
  const int G = blockDim.x;
  for (int o = (G < 32 ? G : 32) >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  if (G <= 32) return v;
  __shared__ float partial[32];
  const int tid = threadIdx.y * G + threadIdx.x;
  const int warp = tid >> 5, per_group = G >> 5, first = (warp / per_group) * per_group;
  __syncthreads();
  if ((tid & 31) == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < per_group; ++w) total += partial[first + w];
  return total;
}

__device__ __forceinline__ float group_max(float v) {
  const int G = blockDim.x;
  for (int o = (G < 32 ? G : 32) >> 1; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  if (G <= 32) return v;
  __shared__ float partial[32];
  const int tid = threadIdx.y * G + threadIdx.x;
  const int warp = tid >> 5, per_group = G >> 5, first = (warp / per_group) * per_group;
  __syncthreads();
  if ((tid & 31) == 0) partial[warp] = v;
  __syncthreads();
  float total = -INFINITY;
  for (int w = 0; w < per_group; ++w) total = fmaxf(total, partial[first + w]);
  return total;
}

// ---------------------------------------------------------------------------
// Index tensors
// ---------------------------------------------------------------------------

__device__ __forceinline__ i64 load_index(const void* indices, i64 i, int idx64) {
  return idx64 ? static_cast<const long long*>(indices)[i] : (i64) static_cast<const int*>(indices)[i];
}

__device__ __forceinline__ void store_index(void* indices, i64 i, i64 value, int idx64) {
  if (idx64) static_cast<long long*>(indices)[i] = value;
  else static_cast<int*>(indices)[i] = (int) value;
}

// ---------------------------------------------------------------------------
// Elementwise maps: out[k][i] = f(in[0][i], ..., in[NI-1][i]) for i < n
// ---------------------------------------------------------------------------

template <typename T, int NI, int NO, int V, typename F>
__device__ __forceinline__ void map_range(i64 begin, i64 end, i64 step, const T* const* in, T* const* out, F f) {
  for (i64 i = begin; i < end; i += step) {
    float a[NI][V], r[NO][V];
#pragma unroll
    for (int k = 0; k < NI; ++k) load<T, V>(in[k] + i * V, a[k]);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float x[NI], y[NO];
#pragma unroll
      for (int k = 0; k < NI; ++k) x[k] = a[k][j];
      f(x, y);
#pragma unroll
      for (int k = 0; k < NO; ++k) r[k][j] = y[k];
    }
#pragma unroll
    for (int k = 0; k < NO; ++k) store<T, V>(out[k] + i * V, r[k]);
  }
}

// Runs f over n elements with a grid-stride loop: 16-byte vectors when every
// pointer is aligned, then a scalar tail (or all scalar when one is not).
// f(const float* x, float* y) reads NI inputs and writes NO outputs of one element.
// Each element is read before it is written by the same thread, so an output
// may alias an input (in-place kernels).
template <typename T, int NI, int NO, typename F>
__device__ __forceinline__ void map_elements(i64 n, const T* const (&in)[NI], T* const (&out)[NO], F f) {
  constexpr int V = kVec<T>;
  bool vec = true;
#pragma unroll
  for (int k = 0; k < NI; ++k) vec = vec && aligned16(in[k]);
#pragma unroll
  for (int k = 0; k < NO; ++k) vec = vec && aligned16(out[k]);
  const i64 tid = (i64) blockIdx.x * blockDim.x + threadIdx.x;
  const i64 stride = (i64) gridDim.x * blockDim.x;
  const i64 nvec = vec ? n / V : 0;
  map_range<T, NI, NO, V>(tid, nvec, stride, in, out, f);
  // the tail (or everything): element offsets from nvec * V
  const T* tin[NI];
  T* tout[NO];
#pragma unroll
  for (int k = 0; k < NI; ++k) tin[k] = in[k] + nvec * V;
#pragma unroll
  for (int k = 0; k < NO; ++k) tout[k] = out[k] + nvec * V;
  map_range<T, NI, NO, 1>(tid, n - nvec * V, stride, tin, tout, f);
}

// ---------------------------------------------------------------------------
// Column sums: out[o, j] = sum_r in[o, r, j] / divisor over an [outer, R, inner] fp32/T array
// ---------------------------------------------------------------------------

// Block (32, 8): threadIdx.x walks inner (coalesced), threadIdx.y splits R; the
// eight partial sums are combined in shared memory in a fixed order (deterministic).
// Grid (ceil(inner / 32), min(outer, 65535)); blockIdx.y loops over outer.
template <typename S, typename T>
__device__ __forceinline__ void column_sum(const S* in, T* out, i64 outer, i64 R, i64 inner, float divisor) {
  __shared__ float partial[8][33];
  const i64 j = (i64) blockIdx.x * 32 + threadIdx.x;
  for (i64 o = blockIdx.y; o < outer; o += gridDim.y) {
    float acc = 0.f;
    if (j < inner)
      for (i64 r = threadIdx.y; r < R; r += blockDim.y) acc += to_f32(in[(o * R + r) * inner + j]);
    __syncthreads();
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < inner) {
      float total = 0.f;
      for (int y = 0; y < (int) blockDim.y; ++y) total += partial[y][threadIdx.x];
      out[o * inner + j] = from_f32<T>(total / divisor);
    }
  }
}

}  // namespace mdsl
