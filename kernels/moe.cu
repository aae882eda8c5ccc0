// Mixture-of-Experts kernels (kernels/reference.py: moe_compute_offsets, moe_permute,
// moe_unpermute, moe_unpermute_backward, moe_router, moe_router_backward, grouped_gemm,
// grouped_gemm_weight_grad).
//
// Index tensors are int32: indices [N, top_k] (the router's), offsets [E + 1], scatter
// indices [N * top_k]. Every expert index must lie in [0, E) (the router gives no other);
// the kernels skip one that does not (they do not raise as the reference does).
// Every kernel is deterministic: counts and ranks come from block scans in a fixed
// order (no atomics), sums run in a fixed order, in fp32.
//
// Launches (kernels/cuda.py):
// - counting and ranking kernels: one block of 256 threads per expert (or per offset);
// - row kernels (permute gather, unpermute backward, router): block (32, 8, 1), one warp
//   per row, grid-stride over rows;
// - elementwise kernels (unpermute): block (256, 1, 1), grid-stride;
// - the GEMM tiles: block (16, 16, 1), one 16 x 16 output tile per block, fp32 accumulation.
#include "common.cuh"

using namespace mdsl;

namespace {

constexpr int kScanThreads = 256;  // threads of the counting / ranking blocks
constexpr int kTile = 16;          // the GEMM tile (kTile x kTile outputs, kTile deep)

// Sum of an int64 over the kScanThreads threads of a 1-D block; every thread gets it.
__device__ __forceinline__ i64 block_sum_i64(i64 v) {
  __shared__ i64 buf[kScanThreads];
  __syncthreads();  // a previous call may still read buf
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kScanThreads / 2; s > 0; s >>= 1) {
    if ((int) threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  return buf[0];
}

// Inclusive prefix sum of flag over the kScanThreads threads of a 1-D block (thread order);
// total gets the block's sum.
__device__ __forceinline__ int block_scan(int flag, int& total) {
  __shared__ int scan[2][kScanThreads];
  const int tid = threadIdx.x;
  int cur = 0;
  __syncthreads();
  scan[0][tid] = flag;
  __syncthreads();
  for (int offset = 1; offset < kScanThreads; offset <<= 1) {
    const int next = cur ^ 1;
    scan[next][tid] = scan[cur][tid] + (tid >= offset ? scan[cur][tid - offset] : 0);
    cur = next;
    __syncthreads();
  }
  total = scan[cur][kScanThreads - 1];
  return scan[cur][tid];
}

// ---------------------------------------------------------------------------
// Offsets and permutation
// ---------------------------------------------------------------------------

// offsets[e] = the number of assignments to experts below e, for e = blockIdx.x (grid E + 1).
__device__ void compute_offsets(const int* indices, int* offsets, i64 assignments, i64 experts) {
  for (i64 e = blockIdx.x; e <= experts; e += gridDim.x) {
    i64 count = 0;
    for (i64 a = threadIdx.x; a < assignments; a += kScanThreads) {
      const int idx = indices[a];
      count += (idx >= 0 && idx < e) ? 1 : 0;
    }
    count = block_sum_i64(count);
    if (threadIdx.x == 0) offsets[e] = (int) count;
  }
}

// scatter[a] = offsets[e] + (the rank of a among the assignments to e, in a order) for the
// assignments a to expert e = blockIdx.x (grid E): the block walks them in order.
__device__ void permute_scatter(const int* indices, const int* offsets, int* scatter, i64 assignments,
                                i64 experts) {
  for (i64 e = blockIdx.x; e < experts; e += gridDim.x) {
    i64 base = offsets[e];
    for (i64 start = 0; start < assignments; start += kScanThreads) {
      const i64 a = start + threadIdx.x;
      const int flag = (a < assignments && indices[a] == e) ? 1 : 0;
      int total;
      const int rank = block_scan(flag, total);
      if (flag) scatter[a] = (int) (base + rank - 1);
      base += total;
    }
  }
}

// permuted[scatter[a]] = x[a / top_k]: one warp per assignment.
template <typename T>
__device__ void permute_gather(const T* x, const int* scatter, T* permuted, i64 assignments, i64 C, i64 top_k) {
  for (i64 a = (i64) blockIdx.x * blockDim.y + threadIdx.y; a < assignments; a += (i64) gridDim.x * blockDim.y) {
    const i64 row = scatter[a];
    if (row < 0 || row >= assignments) continue;
    const T* src = x + (a / top_k) * C;
    T* dst = permuted + row * C;
    for (i64 c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
  }
}

// combined[n, c] = sum_k weights[n, k] * expert_outputs[scatter[n * top_k + k], c].
template <typename T>
__device__ void unpermute(const T* eo, const T* weights, const int* scatter, T* combined, i64 tokens, i64 C,
                          i64 top_k) {
  const i64 n_total = tokens * C;
  for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < n_total; i += (i64) gridDim.x * blockDim.x) {
    const i64 n = i / C, c = i % C;
    float acc = 0.f;
    for (i64 k = 0; k < top_k; ++k) {
      const i64 row = scatter[n * top_k + k];
      if (row < 0 || row >= tokens * top_k) continue;  // not moe_permute's: skipped
      acc += to_f32(weights[n * top_k + k]) * to_f32(eo[row * C + c]);
    }
    combined[i] = from_f32<T>(acc);
  }
}

// d_eo[s(n,k)] = weights[n,k] d_combined[n]; d_weights[n,k] = <d_combined[n], eo[s(n,k)]>:
// one warp per assignment (n, k).
template <typename T>
__device__ void unpermute_bwd(const T* d_combined, const T* eo, const T* weights, const int* scatter, T* d_eo,
                              T* d_weights, i64 assignments, i64 C, i64 top_k) {
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < assignments; base += (i64) gridDim.x * blockDim.y) {
    const i64 a = base + threadIdx.y;  // warps are independent: the shuffle stays in the warp
    if (a >= assignments) continue;
    const i64 row = scatter[a];
    if (row < 0 || row >= assignments) continue;  // not moe_permute's: skipped (the warp alone)
    const float w = to_f32(weights[a]);
    const T* dc = d_combined + (a / top_k) * C;
    const T* src = eo + row * C;
    T* dst = d_eo + row * C;
    float dot = 0.f;
    for (i64 c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = to_f32(dc[c]);
      dst[c] = from_f32<T>(w * g);
      dot += g * to_f32(src[c]);
    }
    dot = group_sum(dot);
    if (threadIdx.x == 0) d_weights[a] = from_f32<T>(dot);
  }
}

// ---------------------------------------------------------------------------
// GEMM tiles: C(i, j) = sum_r A(i, r) B(r, j) with strided A, B and C
// ---------------------------------------------------------------------------

// The tile of rows [m0, m0 + kTile) n [m0, m_end) and columns [n0, n0 + kTile) n [n0, n_end),
// summed over r in [r0, r_end) in kTile steps (a fixed order). Block (kTile, kTile, 1);
// block-uniform (every thread reaches every __syncthreads()).
template <typename TA, typename TB, typename TC>
__device__ void gemm_tile(const TA* a, i64 sai, i64 sar, const TB* b, i64 sbr, i64 sbj, TC* c, i64 sci, i64 scj,
                          i64 m0, i64 m_end, i64 n0, i64 n_end, i64 r0, i64 r_end) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 i = m0 + ty, j = n0 + tx;
  float acc = 0.f;
  for (i64 r = r0; r < r_end; r += kTile) {
    const i64 ra = r + tx, rb = r + ty;
    __syncthreads();  // the previous step may still read the tiles
    as[ty][tx] = (i < m_end && ra < r_end) ? to_f32(a[i * sai + ra * sar]) : 0.f;
    bs[ty][tx] = (rb < r_end && j < n_end) ? to_f32(b[rb * sbr + j * sbj]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kTile; ++q) acc += as[ty][q] * bs[q][tx];
  }
  if (i < m_end && j < n_end) c[i * sci + j * scj] = from_f32<TC>(acc);
}

// The row tiles of a grouped GEMM: tiles[0] = their count, then (group, first row, end row) per
// tile, kTile rows each (the last of a group fewer), clamped to [0, tokens); groups in order. One thread.
__device__ void grouped_tiles(const int* offsets, int* tiles, i64 groups, i64 tokens, i64 max_tiles) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  i64 count = 0;
  for (i64 g = 0; g < groups; ++g) {
    const i64 lo = offsets[g] < 0 ? 0 : offsets[g];
    const i64 hi = offsets[g + 1] > tokens ? tokens : offsets[g + 1];
    for (i64 r = lo; r < hi && count < max_tiles; r += kTile) {
      tiles[1 + 3 * count] = (int) g;
      tiles[2 + 3 * count] = (int) r;
      tiles[3 + 3 * count] = (int) (r + kTile < hi ? r + kTile : hi);
      ++count;
    }
  }
  tiles[0] = (int) count;
}

// out[t, n] = sum_k x(t, k) w_g(k, n) for the rows t of tile blockIdx.x (grid (max_tiles,
// ceil(N / kTile))); x(t, k) = x[t * x_st + k * x_sk], w_g(k, n) = w[g * K * N + k * w_sk + n * w_sn].
template <typename T>
__device__ void grouped_gemm(const T* x, const T* w, const int* tiles, T* out, i64 K, i64 N, i64 x_st, i64 x_sk,
                             i64 w_sk, i64 w_sn) {
  const i64 tile = blockIdx.x;
  if (tile >= tiles[0]) return;  // block-uniform
  const i64 g = tiles[1 + 3 * tile], r0 = tiles[2 + 3 * tile], r_end = tiles[3 + 3 * tile];
  gemm_tile<T, T, T>(x, x_st, x_sk, w + g * K * N, w_sk, w_sn, out, N, 1, r0, r_end, (i64) blockIdx.y * kTile, N, 0,
                     K);
}

// d_w[g, n, k] = sum_{t in group g} d_out[t, n] x[t, k]: grid (ceil(N / kTile), ceil(K / kTile), G).
template <typename T>
__device__ void grouped_gemm_wgrad(const T* x, const T* d_out, const int* offsets, T* d_w, i64 tokens, i64 K, i64 N) {
  const i64 g = blockIdx.z;
  i64 lo = offsets[g], hi = offsets[g + 1];
  lo = lo < 0 ? 0 : lo;
  hi = hi > tokens ? tokens : hi;
  gemm_tile<T, T, T>(d_out, 1, N, x, K, 1, d_w + g * N * K, K, 1, (i64) blockIdx.x * kTile, N,
                     (i64) blockIdx.y * kTile, K, lo, hi > lo ? hi : lo);
}

// ---------------------------------------------------------------------------
// Router
// ---------------------------------------------------------------------------

__device__ __forceinline__ float sigmoid(float x) {  // the reference's overflow-free form
  const float e = expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

// Lane 0 of the row's warp gets scores[0:E] = softmax (or sigmoid) of x[row] . gate[e].
// Warp-uniform (every lane calls it).
template <typename T>
__device__ void router_scores(const T* x, const T* gate, float* scores, i64 E, i64 C, int use_sigmoid) {
  for (i64 e = 0; e < E; ++e) {
    float dot = 0.f;
    for (i64 c = threadIdx.x; c < C; c += blockDim.x) dot += to_f32(x[c]) * to_f32(gate[e * C + c]);
    dot = group_sum(dot);
    if (threadIdx.x == 0) scores[e] = dot;
  }
  if (threadIdx.x != 0) return;
  if (use_sigmoid) {
    for (i64 e = 0; e < E; ++e) scores[e] = sigmoid(scores[e]);
    return;
  }
  float m = -INFINITY;
  for (i64 e = 0; e < E; ++e) m = fmaxf(m, scores[e]);
  float s = 0.f;
  for (i64 e = 0; e < E; ++e) s += expf(scores[e] - m);
  for (i64 e = 0; e < E; ++e) scores[e] = expf(scores[e] - m) / s;
}

// The k-th pick of a top-k in (score descending, index ascending) order, after (prev, pv).
__device__ __forceinline__ i64 next_pick(const float* scores, i64 E, i64 prev, float pv) {
  i64 best = -1;
  float bv = 0.f;
  for (i64 e = 0; e < E; ++e) {
    const float v = scores[e];
    const bool after = prev < 0 || v < pv || (v == pv && e > prev);
    if (after && (best < 0 || v > bv)) best = e, bv = v;
  }
  return best;
}

// One warp per token: weights, indices, and probs (the routing distribution, for the aux loss).
template <typename T>
__device__ void router_fwd(const T* x, const T* gate, T* weights, int* indices, float* probs, i64 N, i64 E, i64 C,
                           i64 top_k, int normalize, int use_sigmoid) {
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < N; base += (i64) gridDim.x * blockDim.y) {
    const i64 n = base + threadIdx.y;
    if (n >= N) continue;  // the warp alone: its lanes agree
    float* p = probs + n * E;
    router_scores(x + n * C, gate, p, E, C, use_sigmoid);
    if (threadIdx.x != 0) continue;
    i64 prev = -1;
    float pv = 0.f, total = 0.f;
    for (i64 k = 0; k < top_k; ++k) {
      prev = next_pick(p, E, prev, pv);
      pv = prev < 0 ? NAN : p[prev];
      indices[n * top_k + k] = (int) prev;
      total += pv;
    }
    for (i64 k = 0; k < top_k; ++k) {
      const i64 e = indices[n * top_k + k];
      const float v = e < 0 ? NAN : p[e];
      weights[n * top_k + k] = from_f32<T>(normalize ? v / total : v);
    }
    if (use_sigmoid) {  // the distribution: sigmoid scores renormalized over the experts
      float s = 0.f;
      for (i64 e = 0; e < E; ++e) s += p[e];
      for (i64 e = 0; e < E; ++e) p[e] = p[e] / s;
    }
  }
}

// The number of assignments to expert e (a fixed-order loop over the indices).
__device__ __forceinline__ float expert_count(const int* indices, i64 assignments, i64 e) {
  i64 count = 0;
  for (i64 a = 0; a < assignments; ++a) count += indices[a] == e ? 1 : 0;
  return (float) count;
}

// aux = coef * E * sum_e (count_e / N) * mean_n probs[n, e]: one block, a thread per expert.
__device__ void router_aux(const int* indices, const float* probs, float* aux, i64 N, i64 E, i64 top_k, float coef) {
  float term = 0.f;
  for (i64 e = threadIdx.x; e < E; e += blockDim.x) {
    float p = 0.f;
    for (i64 n = 0; n < N; ++n) p += probs[n * E + e];
    term += (expert_count(indices, N * top_k, e) / (float) N) * (p / (float) N);
  }
  const float total = block_sum(term);
  if (threadIdx.x == 0) aux[0] = coef * (float) E * total;
}

// d_probs[e] = coef * E * (count_e / N) / N: the aux loss's gradient of every routing probability.
__device__ void router_bwd_counts(const int* indices, float* d_probs, i64 N, i64 E, i64 top_k, float coef) {
  for (i64 e = threadIdx.x; e < E; e += blockDim.x)
    d_probs[e] = coef * (float) E * (expert_count(indices, N * top_k, e) / (float) N) / (float) N;
}

// d_logits[n] of sum(d_weights * weights) + aux_loss: one warp per token (lane 0 works).
template <typename T>
__device__ void router_bwd_logits(const T* d_weights, const T* x, const T* gate, const int* indices,
                                  const float* d_probs, float* scores, float* d_logits, i64 N, i64 E, i64 C, i64 top_k,
                                  int normalize, int use_sigmoid) {
  for (i64 base = (i64) blockIdx.x * blockDim.y; base < N; base += (i64) gridDim.x * blockDim.y) {
    const i64 n = base + threadIdx.y;
    if (n >= N) continue;
    float* s = scores + n * E;
    router_scores(x + n * C, gate, s, E, C, use_sigmoid);
    if (threadIdx.x != 0) continue;
    float* d = d_logits + n * E;
    const int* idx = indices + n * top_k;
    const T* dw = d_weights + n * top_k;
    for (i64 e = 0; e < E; ++e) d[e] = 0.f;
    // (g_k - sum_j g_j sel_j / total) / total as sum_j (g_k - g_j) sel_j / total^2: exactly 0
    // where it cancels (top_k 1)
    bool valid = true;
    for (i64 k = 0; k < top_k; ++k) valid = valid && idx[k] >= 0 && idx[k] < E;
    if (!valid) {  // not the router's indices: NaN gradients
      for (i64 e = 0; e < E; ++e) d[e] = NAN;
      continue;
    }
    float total = 0.f;
    for (i64 k = 0; k < top_k; ++k) total += s[idx[k]];
    for (i64 k = 0; k < top_k; ++k) {
      const float g = to_f32(dw[k]);
      float acc = 0.f;
      for (i64 j = 0; normalize && j < top_k; ++j) acc += (g - to_f32(dw[j])) * s[idx[j]];
      d[idx[k]] = normalize ? acc / total / total : g;
    }
    if (use_sigmoid) {  // the same form for the renormalized probabilities
      float sum = 0.f;
      for (i64 e = 0; e < E; ++e) sum += s[e];
      for (i64 e = 0; e < E; ++e) {
        float acc = 0.f;
        for (i64 j = 0; j < E; ++j) acc += (d_probs[e] - d_probs[j]) * s[j];
        d[e] += acc / sum / sum;
      }
      for (i64 e = 0; e < E; ++e) d[e] = d[e] * s[e] * (1.f - s[e]);
    } else {
      for (i64 e = 0; e < E; ++e) d[e] += d_probs[e];
      float ds = 0.f;
      for (i64 e = 0; e < E; ++e) ds += d[e] * s[e];
      for (i64 e = 0; e < E; ++e) d[e] = s[e] * (d[e] - ds);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Exported kernels
// ---------------------------------------------------------------------------

// offsets [E + 1] of indices [assignments]: grid (E + 1, 1, 1), block (256, 1, 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_offsets_f32(const int* indices, int* offsets, i64 assignments, i64 experts) {
  compute_offsets(indices, offsets, assignments, experts);
}

// scatter [assignments] from indices and offsets: grid (E, 1, 1), block (256, 1, 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_permute_scatter_f32(const int* indices, const int* offsets, int* scatter, i64 assignments, i64 experts) {
  permute_scatter(indices, offsets, scatter, assignments, experts);
}

// permuted [assignments, C] from x [N, C] and scatter: block (32, 8, 1), grid-stride over assignments.
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_permute_gather_bf16(const bf16* x, const int* scatter, bf16* permuted, i64 assignments, i64 C, i64 top_k) {
  permute_gather(x, scatter, permuted, assignments, C, top_k);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_permute_gather_f32(const float* x, const int* scatter, float* permuted, i64 assignments, i64 C, i64 top_k) {
  permute_gather(x, scatter, permuted, assignments, C, top_k);
}

// combined [N, C]: block (256, 1, 1), grid-stride over N * C.
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_unpermute_bf16(const bf16* expert_outputs, const bf16* weights, const int* scatter, bf16* combined, i64 tokens,
                        i64 C, i64 top_k) {
  unpermute(expert_outputs, weights, scatter, combined, tokens, C, top_k);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_unpermute_f32(const float* expert_outputs, const float* weights, const int* scatter, float* combined,
                       i64 tokens, i64 C, i64 top_k) {
  unpermute(expert_outputs, weights, scatter, combined, tokens, C, top_k);
}

// d_expert_outputs [N * top_k, C] and d_weights [N, top_k]: block (32, 8, 1), a warp per assignment.
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_unpermute_bwd_bf16(const bf16* d_combined, const bf16* expert_outputs, const bf16* weights, const int* scatter,
                            bf16* d_expert_outputs, bf16* d_weights, i64 assignments, i64 C, i64 top_k) {
  unpermute_bwd(d_combined, expert_outputs, weights, scatter, d_expert_outputs, d_weights, assignments, C, top_k);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_unpermute_bwd_f32(const float* d_combined, const float* expert_outputs, const float* weights,
                           const int* scatter, float* d_expert_outputs, float* d_weights, i64 assignments, i64 C,
                           i64 top_k) {
  unpermute_bwd(d_combined, expert_outputs, weights, scatter, d_expert_outputs, d_weights, assignments, C, top_k);
}

// The row tiles of a grouped GEMM into tiles (int32 [1 + 3 * max_tiles]): grid (1, 1, 1), block (32, 1, 1).
extern "C" __global__ void __launch_bounds__(32)
mdsl_grouped_gemm_tiles_f32(const int* offsets, int* tiles, i64 groups, i64 tokens, i64 max_tiles) {
  grouped_tiles(offsets, tiles, groups, tokens, max_tiles);
}

// output [tokens, N] (rows of no group: zeroed before): grid (max_tiles, ceil(N / 16), 1), block (16, 16, 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_grouped_gemm_bf16(const bf16* input, const bf16* weights, const int* tiles, bf16* output,
                       i64 K, i64 N, i64 x_st, i64 x_sk, i64 w_sk, i64 w_sn) {
  grouped_gemm(input, weights, tiles, output, K, N, x_st, x_sk, w_sk, w_sn);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_grouped_gemm_f32(const float* input, const float* weights, const int* tiles, float* output,
                      i64 K, i64 N, i64 x_st, i64 x_sk, i64 w_sk, i64 w_sn) {
  grouped_gemm(input, weights, tiles, output, K, N, x_st, x_sk, w_sk, w_sn);
}

// d_weights [G, N, K]: grid (ceil(N / 16), ceil(K / 16), G), block (16, 16, 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_grouped_gemm_wgrad_bf16(const bf16* input, const bf16* d_output, const int* offsets, bf16* d_weights, i64 tokens,
                             i64 K, i64 N) {
  grouped_gemm_wgrad(input, d_output, offsets, d_weights, tokens, K, N);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_grouped_gemm_wgrad_f32(const float* input, const float* d_output, const int* offsets, float* d_weights,
                            i64 tokens, i64 K, i64 N) {
  grouped_gemm_wgrad(input, d_output, offsets, d_weights, tokens, K, N);
}

// weights, indices [N, top_k] and probs (fp32 scratch [N, E]): block (32, 8, 1), a warp per token.
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_router_fwd_bf16(const bf16* x, const bf16* gate, bf16* weights, int* indices, float* probs, i64 N, i64 E,
                         i64 C, i64 top_k, int normalize, int use_sigmoid) {
  router_fwd(x, gate, weights, indices, probs, N, E, C, top_k, normalize, use_sigmoid);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_router_fwd_f32(const float* x, const float* gate, float* weights, int* indices, float* probs, i64 N, i64 E,
                        i64 C, i64 top_k, int normalize, int use_sigmoid) {
  router_fwd(x, gate, weights, indices, probs, N, E, C, top_k, normalize, use_sigmoid);
}

// aux_loss (fp32 scalar): grid (1, 1, 1), block (256, 1, 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_router_aux_f32(const int* indices, const float* probs, float* aux_loss, i64 N, i64 E, i64 top_k, float coef) {
  router_aux(indices, probs, aux_loss, N, E, top_k, coef);
}

// d_probs (fp32 scratch [E]): grid (1, 1, 1), block (256, 1, 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_router_bwd_counts_f32(const int* indices, float* d_probs, i64 N, i64 E, i64 top_k, float coef) {
  router_bwd_counts(indices, d_probs, N, E, top_k, coef);
}

// d_logits (fp32 scratch [N, E]; scores: fp32 scratch [N, E]): block (32, 8, 1), a warp per token.
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_router_bwd_logits_bf16(const bf16* d_weights, const bf16* x, const bf16* gate, const int* indices,
                                const float* d_probs, float* scores, float* d_logits, i64 N, i64 E, i64 C, i64 top_k,
                                int normalize, int use_sigmoid) {
  router_bwd_logits(d_weights, x, gate, indices, d_probs, scores, d_logits, N, E, C, top_k, normalize, use_sigmoid);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_router_bwd_logits_f32(const float* d_weights, const float* x, const float* gate, const int* indices,
                               const float* d_probs, float* scores, float* d_logits, i64 N, i64 E, i64 C, i64 top_k,
                               int normalize, int use_sigmoid) {
  router_bwd_logits(d_weights, x, gate, indices, d_probs, scores, d_logits, N, E, C, top_k, normalize, use_sigmoid);
}

// out[i, j] = sum_r a(i, r) b(r, j), a fp32 (d_logits) at a[i * sai + r * sar], b at b[r * sbr + j * sbj],
// out [M, cols] row-major (d_x = d_logits gate, d_gate = d_logits^T x): grid (ceil(M / 16), ceil(cols / 16), 1),
// block (16, 16, 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_router_bwd_gemm_bf16(const float* a, const bf16* b, bf16* out, i64 M, i64 cols, i64 R, i64 sai, i64 sar,
                              i64 sbr, i64 sbj) {
  gemm_tile<float, bf16, bf16>(a, sai, sar, b, sbr, sbj, out, cols, 1, (i64) blockIdx.x * kTile, M,
                               (i64) blockIdx.y * kTile, cols, 0, R);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_moe_router_bwd_gemm_f32(const float* a, const float* b, float* out, i64 M, i64 cols, i64 R, i64 sai, i64 sar,
                             i64 sbr, i64 sbj) {
  gemm_tile<float, float, float>(a, sai, sar, b, sbr, sbj, out, cols, 1, (i64) blockIdx.x * kTile, M,
                                 (i64) blockIdx.y * kTile, cols, 0, R);
}
