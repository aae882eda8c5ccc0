// Embedding forward (gather rows) and backward (scatter-add rows)
// (kernels/reference.py: embedding, embedding_backward).
//
// indices: [rows] int32 (idx64 = 0) or int64 (idx64 = 1); weight: [V, D].
// Launch (kernels/cuda.py: row_config with 4 vectors per thread): block (G, R, 1)
// with G threads per row and R = max(1, 256 / G) rows per block, grid
// (min(ceil(rows / R), cap), 1, 1); no dynamic shared memory.
#include "common.cuh"

using namespace mdsl;

// out[r, :] = weight[indices[r], :]. A negative index counts from the end (as
// numpy); an index outside [-V, V) gives a row of NaN.
template <typename T, int V>
__device__ void gather_rows(const void* indices, const T* weight, T* out, i64 rows, i64 D, i64 vocab, int idx64) {
  const i64 nv = D / V;
  for (i64 row = (i64) blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += (i64) gridDim.x * blockDim.y) {
    i64 idx = load_index(indices, row, idx64);
    if (idx < 0) idx += vocab;
    const bool ok = idx >= 0 && idx < vocab;
    for (i64 v = threadIdx.x; v < nv; v += blockDim.x) {
      float t[V];
      if (ok) {
        load<T, V>(weight + idx * D + v * V, t);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) t[j] = NAN;
      }
      store<T, V>(out + row * D + v * V, t);
    }
  }
}

template <typename T>
__device__ void embedding_fwd(const void* indices, const T* weight, T* out, i64 rows, i64 D, i64 vocab, int idx64) {
  constexpr int V = kVec<T>;
  if (D % V == 0 && aligned16(weight) && aligned16(out)) gather_rows<T, V>(indices, weight, out, rows, D, vocab, idx64);
  else gather_rows<T, 1>(indices, weight, out, rows, D, vocab, idx64);
}

extern "C" __global__ void mdsl_embedding_fwd_bf16(const void* indices, const bf16* weight, bf16* out, i64 rows,
                                                   i64 D, i64 vocab, int idx64) {
  embedding_fwd(indices, weight, out, rows, D, vocab, idx64);
}
extern "C" __global__ void mdsl_embedding_fwd_f32(const void* indices, const float* weight, float* out, i64 rows,
                                                  i64 D, i64 vocab, int idx64) {
  embedding_fwd(indices, weight, out, rows, D, vocab, idx64);
}

// dst[0:V] += t[0:V]: 16-byte vector atomics on sm_90 and later, one float at a time before.
template <int V>
__device__ __forceinline__ void atomic_add_vec(float* dst, const float* t) {
#if __CUDA_ARCH__ >= 900
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4)
      atomicAdd(reinterpret_cast<float4*>(dst + j), make_float4(t[j], t[j + 1], t[j + 2], t[j + 3]));
    return;
  } else
#endif
  {
#pragma unroll
    for (int j = 0; j < V; ++j) atomicAdd(dst + j, t[j]);
  }
}

// d_weight[indices[r], :] += d_out[r, :] with fp32 atomics (d_weight is fp32 and
// zeroed before the launch; the summation order, and so the last bits, vary
// from run to run). Rows whose index is outside [-V, V) are skipped.
template <typename T, int V>
__device__ void scatter_add_rows(const T* d_out, const void* indices, float* d_weight, i64 rows, i64 D, i64 vocab,
                                 int idx64) {
  const i64 nv = D / V;
  for (i64 row = (i64) blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += (i64) gridDim.x * blockDim.y) {
    i64 idx = load_index(indices, row, idx64);
    if (idx < 0) idx += vocab;
    if (idx < 0 || idx >= vocab) continue;
    for (i64 v = threadIdx.x; v < nv; v += blockDim.x) {
      float t[V];
      load<T, V>(d_out + row * D + v * V, t);
      atomic_add_vec<V>(d_weight + idx * D + v * V, t);
    }
  }
}

template <typename T>
__device__ void embedding_bwd(const T* d_out, const void* indices, float* d_weight, i64 rows, i64 D, i64 vocab,
                              int idx64) {
  constexpr int V = kVec<T>;
  if (D % V == 0 && aligned16(d_out) && aligned16(d_weight))
    scatter_add_rows<T, V>(d_out, indices, d_weight, rows, D, vocab, idx64);
  else
    scatter_add_rows<T, 1>(d_out, indices, d_weight, rows, D, vocab, idx64);
}

extern "C" __global__ void mdsl_embedding_bwd_bf16(const bf16* d_out, const void* indices, float* d_weight, i64 rows,
                                                   i64 D, i64 vocab, int idx64) {
  embedding_bwd(d_out, indices, d_weight, rows, D, vocab, idx64);
}
extern "C" __global__ void mdsl_embedding_bwd_f32(const float* d_out, const void* indices, float* d_weight, i64 rows,
                                                  i64 D, i64 vocab, int idx64) {
  embedding_bwd(d_out, indices, d_weight, rows, D, vocab, idx64);
}
