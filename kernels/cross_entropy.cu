// Softmax cross-entropy over the vocabulary, forward and backward, one pass over the
// logits each (kernels/reference.py: cross_entropy, cross_entropy_backward).
//
// logits: [N, V] (bf16 or fp32), labels: [N] int32 (idx64 = 0) or int64 (idx64 = 1),
// lse: [N] fp32. Rows whose label is ignore_index count for nothing: loss 0, d_logits 0.
// reduction: 0 none, 1 sum, 2 mean (over the counted rows; NaN when there are none).
#include "common.cuh"

using namespace mdsl;

namespace {

// (m, s) <- the running max and the sum of exp(x - m) with the values x[0:V] added.
template <int V>
__device__ __forceinline__ void online_update(float& m, float& s, const float* x) {
  float vm = x[0];
#pragma unroll
  for (int j = 1; j < V; ++j) vm = fmaxf(vm, x[j]);
  const float nm = fmaxf(m, vm);
  if (nm == -INFINITY) return;  // everything so far is -inf: nothing to add
  s = (m == -INFINITY ? 0.f : s * expf(m - nm));
#pragma unroll
  for (int j = 0; j < V; ++j) s += expf(x[j] - nm);
  m = nm;
}

// Per-row loss and lse: each thread runs an online max/sum over its chunks of the
// row, the block combines them. loss_rows[r] = lse - logits[r, label] (0 when ignored).
template <typename T, int V>
__device__ void ce_fwd_rows(const T* logits, const void* labels, float* loss_rows, float* lse, i64 rows, i64 vocab,
                            i64 ignore_index, int idx64) {
  const i64 nv = vocab / V;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = logits + row * vocab;
    float m = -INFINITY, s = 0.f;
    for (i64 v = threadIdx.x; v < nv; v += blockDim.x) {
      float t[V];
      load<T, V>(x + v * V, t);
      online_update<V>(m, s, t);
    }
    const float bm = block_max(m);  // then the sum of s rescaled to the block's max
    const float scaled = (m == -INFINITY || bm == -INFINITY) ? 0.f : s * expf(m - bm);
    const float total = block_sum(scaled);
    if (threadIdx.x == 0) {
      const float l = isinf(bm) ? bm : bm + logf(total);
      lse[row] = l;
      const i64 label = load_index(labels, row, idx64);
      float loss = 0.f;
      if (label != ignore_index) loss = (label >= 0 && label < vocab) ? l - to_f32(x[label]) : NAN;
      loss_rows[row] = loss;
    }
  }
}

// d_logits[r, j] = (exp(logits[r, j] - lse[r]) - (j == label)) * scale_r with scale_r =
// d_scale[r] when per_row (reduction none) else d_scale[0]; an ignored row gets 0 * scale_r,
// which is 0 except where the reference's (d_loss * valid) / count is NaN too (mean over no
// counted row: 0 / 0).
template <typename T, int V>
__device__ void ce_bwd_rows(const float* d_scale, const T* logits, const void* labels, const float* lse, T* d_logits,
                            i64 rows, i64 vocab, i64 ignore_index, int idx64, int per_row) {
  const i64 nv = vocab / V;
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const i64 label = load_index(labels, row, idx64);
    const bool valid = label != ignore_index;
    const float given = d_scale[per_row ? row : 0];
    const float scale = valid ? given : 0.f * given;
    const i64 hot = valid ? label : -1;
    const float l = lse[row];
    const T* x = logits + row * vocab;
    T* d = d_logits + row * vocab;
    for (i64 v = threadIdx.x; v < nv; v += blockDim.x) {
      float t[V];
      load<T, V>(x + v * V, t);
#pragma unroll
      for (int j = 0; j < V; ++j) t[j] = (expf(t[j] - l) - (v * V + j == hot ? 1.f : 0.f)) * scale;
      store<T, V>(d + v * V, t);
    }
  }
}

template <typename T>
__device__ void ce_fwd(const T* logits, const void* labels, float* loss_rows, float* lse, i64 rows, i64 vocab,
                       i64 ignore_index, int idx64) {
  constexpr int V = kVec<T>;
  if (vocab % V == 0 && aligned16(logits)) ce_fwd_rows<T, V>(logits, labels, loss_rows, lse, rows, vocab, ignore_index, idx64);
  else ce_fwd_rows<T, 1>(logits, labels, loss_rows, lse, rows, vocab, ignore_index, idx64);
}

template <typename T>
__device__ void ce_bwd(const float* d_scale, const T* logits, const void* labels, const float* lse, T* d_logits, i64 rows,
                       i64 vocab, i64 ignore_index, int idx64, int per_row) {
  constexpr int V = kVec<T>;
  if (vocab % V == 0 && aligned16(logits) && aligned16(d_logits))
    ce_bwd_rows<T, V>(d_scale, logits, labels, lse, d_logits, rows, vocab, ignore_index, idx64, per_row);
  else
    ce_bwd_rows<T, 1>(d_scale, logits, labels, lse, d_logits, rows, vocab, ignore_index, idx64, per_row);
}

// The number of counted rows (labels != ignore_index), summed by one block.
__device__ float count_valid(const void* labels, i64 rows, i64 ignore_index, int idx64) {
  float count = 0.f;
  for (i64 r = threadIdx.x; r < rows; r += blockDim.x) count += load_index(labels, r, idx64) != ignore_index ? 1.f : 0.f;
  return block_sum(count);
}

}  // namespace

// Forward: loss_rows (the per-row losses: the loss output itself for reduction none,
// else scratch fp32 [N]) and lse. Launch (kernels/cuda.py: ce_config): block
// (B, 1, 1) with B = min(512, a multiple of 32 covering V / vector width), grid
// (min(N, 2^31 - 1), 1, 1): one block per row.
extern "C" __global__ void __launch_bounds__(512)
mdsl_cross_entropy_fwd_bf16(const bf16* logits, const void* labels, float* loss_rows, float* lse, i64 rows, i64 vocab,
                            i64 ignore_index, int idx64) {
  ce_fwd(logits, labels, loss_rows, lse, rows, vocab, ignore_index, idx64);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_cross_entropy_fwd_f32(const float* logits, const void* labels, float* loss_rows, float* lse, i64 rows, i64 vocab,
                           i64 ignore_index, int idx64) {
  ce_fwd(logits, labels, loss_rows, lse, rows, vocab, ignore_index, idx64);
}

// loss[0] = sum(loss_rows) (reduction sum) or that sum / the counted rows (mean):
// the second step of the forward unless reduction is none. Launch: block (1024, 1, 1),
// grid (1, 1, 1). Fixed summation order (deterministic).
extern "C" __global__ void __launch_bounds__(1024)
mdsl_cross_entropy_reduce_f32(const float* loss_rows, const void* labels, float* loss, i64 rows, i64 ignore_index,
                              int idx64, int mean) {
  float sum = 0.f;
  for (i64 r = threadIdx.x; r < rows; r += blockDim.x) sum += loss_rows[r];
  sum = block_sum(sum);
  const float count = count_valid(labels, rows, ignore_index, idx64);
  if (threadIdx.x == 0) loss[0] = mean ? sum / count : sum;
}

// d_scale[0] = d_loss[0] / the counted rows: the first step of the backward for
// reduction mean. Launch: block (1024, 1, 1), grid (1, 1, 1).
extern "C" __global__ void __launch_bounds__(1024)
mdsl_cross_entropy_mean_scale_f32(const float* d_loss, const void* labels, float* d_scale, i64 rows, i64 ignore_index,
                                  int idx64) {
  const float count = count_valid(labels, rows, ignore_index, idx64);
  if (threadIdx.x == 0) d_scale[0] = d_loss[0] / count;
}

// Backward: d_logits in one pass over the logits from the saved lse. d_scale is
// d_loss (reduction none: per_row = 1; sum: per_row = 0) or the mean scale above.
// Launch as the forward: one block per row. d_logits may alias logits.
extern "C" __global__ void __launch_bounds__(512)
mdsl_cross_entropy_bwd_bf16(const float* d_scale, const bf16* logits, const void* labels, const float* lse,
                            bf16* d_logits, i64 rows, i64 vocab, i64 ignore_index, int idx64, int per_row) {
  ce_bwd(d_scale, logits, labels, lse, d_logits, rows, vocab, ignore_index, idx64, per_row);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_cross_entropy_bwd_f32(const float* d_scale, const float* logits, const void* labels, const float* lse,
                           float* d_logits, i64 rows, i64 vocab, i64 ignore_index, int idx64, int per_row) {
  ce_bwd(d_scale, logits, labels, lse, d_logits, rows, vocab, ignore_index, idx64, per_row);
}
