// Mamba kernels (kernels/reference.py: mamba_conv1d, mamba_conv1d_backward,
// mamba_selective_scan, mamba_selective_scan_backward, and the decoding steps mamba_conv1d_step,
// mamba_selective_scan_step).
//
// Layouts: x, u, delta, y [B, D, T]; conv weight [D, 1, K], bias [D], conv state [B, D, K - 1];
// a_log [D, N]; b_proj, c_proj [B, G, N, T] (channel d reads group d / (D / G)); d_skip,
// dt_bias [D]; ssm state [B, D, N]. Arithmetic and recurrent states are fp32; the outputs
// are stored in the variant's type. Every sum runs in a fixed order (deterministic).
//
// Launches (kernels/cuda.py):
// - conv forward: block (256, 1, 1), grid-stride over the outputs (y, then the state);
// - conv backward: one block of 256 threads per channel (grid-stride over channels), the
//   weight and bias gradients reduced in the block; kernel_size <= kMaxConv;
// - scan forward and backward: block (32, 8, 1), one warp per row, each lane holding the
//   states n = lane + 32 s (s < kMaxStates, so N <= 256), sequential over time. The backward's
//   warp owns a batch, a group and a partition of its channels: it runs their channels one
//   after another (their states over time recomputed into scratch), summing the b_proj and
//   c_proj gradients of the partition in fp32 scratch; a last kernel adds the partitions,
//   and the batch partials of d_a_log, d_d_skip and d_dt_bias.
// - decoding steps: the run's start position and count of real steps are element 0 of two
//   index tensors in device memory (int32, or int64 with idx64), read by every thread (no host
//   sync). Position <= 0 starts a sequence: the carried state reads as zeros (whatever the buffer
//   holds). The state buffer is updated in place to the state after the run's first `valid`
//   steps (the steps after them pad a shape bucket: they get outputs, but leave no trace). Where
//   the reference raises (valid outside [1, T]), y and the state are NaN instead.
//   The conv step: block (32, 8, 1), a warp per (b, d), its lanes over the steps, d grid-stride
//   along the grid's x and b along its y; the warp reads its channel's old state before a block
//   barrier and writes the new one after it. The scan step: as the scan forward, each lane
//   writing its own states (which it alone read, at the start) after step valid - 1.
#include "common.cuh"

using namespace mdsl;

namespace {

constexpr int kMaxConv = 8;    // largest kernel_size of the conv backward (its per-thread sums)
constexpr int kMaxStates = 8;  // states per lane of the scan: N <= 32 * kMaxStates

__device__ __forceinline__ float sigmoid(float x) {  // the reference's overflow-free form
  const float e = expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}
__device__ __forceinline__ float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.f + x * (1.f - s));
}
__device__ __forceinline__ float softplus(float x) {  // log(1 + exp(x)) without overflow
  return fmaxf(x, 0.f) + log1pf(expf(-fabsf(x)));
}

// One step t of a row's scan over this lane's states: h <- exp(dt A) h + (dt u) B[t]; returns the
// lane's part of C[t] . h (the row's y[t] is its group_sum).
template <typename T>
__device__ __forceinline__ float scan_advance(float (&h)[kMaxStates], const float (&a)[kMaxStates], float dt, float du,
                                              const T* bp, const T* cp, i64 t, i64 steps, int lane, i64 N) {
  float part = 0.f;
#pragma unroll
  for (int s = 0; s < kMaxStates; ++s) {
    const i64 n = lane + 32 * s;
    if (n < N) {
      h[s] = expf(dt * a[s]) * h[s] + du * to_f32(bp[n * steps + t]);
      part += to_f32(cp[n * steps + t]) * h[s];
    }
  }
  return part;
}

// ---------------------------------------------------------------------------
// Causal depthwise conv
// ---------------------------------------------------------------------------

// y = act(bias + sum_k w[k] xp[t + k]) with xp = [state (or zeros), x] along time; then the
// state out, the last K - 1 steps of xp.
template <typename T>
__device__ void conv_fwd(const T* x, const T* weight, const T* bias, const T* state, T* y, T* state_out, i64 B, i64 D,
                         i64 steps, i64 K, int silu) {
  const i64 ny = B * D * steps, ns = state_out ? B * D * (K - 1) : 0;
  const i64 pad = K - 1;
  for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < ny + ns; i += (i64) gridDim.x * blockDim.x) {
    if (i < ny) {
      const i64 row = i / steps, t = i % steps, d = row % D;
      const T* xr = x + row * steps;
      const T* sr = state ? state + row * pad : nullptr;
      float acc = 0.f;
      for (i64 k = 0; k < K; ++k) {
        const i64 j = t + k;  // in xp
        const float v = j >= pad ? to_f32(xr[j - pad]) : (sr ? to_f32(sr[j]) : 0.f);
        acc += to_f32(weight[d * K + k]) * v;
      }
      if (bias) acc += to_f32(bias[d]);
      y[i] = from_f32<T>(silu ? acc * sigmoid(acc) : acc);
    } else {
      const i64 s = i - ny, row = s / pad, j = steps + s % pad;  // xp index of state_out[row, s % pad]
      const float v = j >= pad ? to_f32(x[row * steps + j - pad]) : (state ? to_f32(state[row * pad + j]) : 0.f);
      state_out[s] = from_f32<T>(v);
    }
  }
}

// d_x, d_weight, d_bias with a zero initial state: one block per channel.
template <typename T>
__device__ void conv_bwd(const T* d_y, const T* x, const T* weight, const T* bias, T* d_x, T* d_weight, T* d_bias,
                         i64 B, i64 D, i64 steps, i64 K, int silu) {
  const i64 pad = K - 1;
  for (i64 d = blockIdx.x; d < D; d += gridDim.x) {  // block-uniform
    float w[kMaxConv], dw[kMaxConv];
#pragma unroll
    for (int k = 0; k < kMaxConv; ++k) {
      w[k] = k < K ? to_f32(weight[d * K + k]) : 0.f;
      dw[k] = 0.f;
    }
    const float b0 = bias ? to_f32(bias[d]) : 0.f;
    float db = 0.f;
    for (i64 i = threadIdx.x; i < B * steps; i += blockDim.x) {
      const i64 row = (i / steps) * D + d, t = i % steps;
      const T* xr = x + row * steps;
      const T* gr = d_y + row * steps;
      // d_pre at step t + q for q < K (those the d_x of step t and the weight sums need)
      float dpre[kMaxConv];
#pragma unroll
      for (int q = 0; q < kMaxConv; ++q) {
        dpre[q] = 0.f;
        const i64 tq = t + q;
        if (q < K && tq < steps) {
          float acc = 0.f;
#pragma unroll
          for (int k = 0; k < kMaxConv; ++k) {
            const i64 j = tq + k;
            if (k < K && j >= pad) acc += w[k] * to_f32(xr[j - pad]);
          }
          acc += b0;
          dpre[q] = to_f32(gr[tq]) * (silu ? silu_grad(acc) : 1.f);
        }
      }
      // d_x[t] = d_xp[t + K - 1] = sum_k w[k] d_pre[t + K - 1 - k]
      float dx = 0.f;
#pragma unroll
      for (int k = 0; k < kMaxConv; ++k) {
        const int q = (int) pad - k;
        if (k < K && q >= 0) {
#pragma unroll
          for (int qq = 0; qq < kMaxConv; ++qq)
            if (qq == q) dx += w[k] * dpre[qq];
        }
      }
      d_x[row * steps + t] = from_f32<T>(dx);
#pragma unroll
      for (int k = 0; k < kMaxConv; ++k) {
        const i64 j = t + k;
        if (k < K && j >= pad) dw[k] += dpre[0] * to_f32(xr[j - pad]);
      }
      db += dpre[0];
    }
#pragma unroll
    for (int k = 0; k < kMaxConv; ++k) {
      if (k < K) {
        const float total = block_sum(dw[k]);
        if (threadIdx.x == 0) d_weight[d * K + k] = from_f32<T>(total);
      }
    }
    const float total = block_sum(db);
    if (d_bias && threadIdx.x == 0) d_bias[d] = from_f32<T>(total);
  }
}

// ---------------------------------------------------------------------------
// Selective scan
// ---------------------------------------------------------------------------

// One warp per row (b, d): h[t] = exp(dt A) h[t-1] + (dt u) B[t], y[t] = C[t] . h[t] + D u[t].
template <typename T>
__device__ void scan_fwd(const T* u, const T* delta, const T* a_log, const T* b_proj, const T* c_proj, const T* d_skip,
                         const T* dt_bias, const T* ssm_state, T* y, T* state_out, i64 B, i64 D, i64 G, i64 N,
                         i64 steps) {
  const i64 per_group = D / G;
  const int lane = threadIdx.x;
  for (i64 row = (i64) blockIdx.x * blockDim.y + threadIdx.y; row < B * D; row += (i64) gridDim.x * blockDim.y) {
    const i64 b = row / D, d = row % D, g = d / per_group;
    float h[kMaxStates], a[kMaxStates];
#pragma unroll
    for (int s = 0; s < kMaxStates; ++s) {
      const i64 n = lane + 32 * s;
      h[s] = (n < N && ssm_state) ? to_f32(ssm_state[row * N + n]) : 0.f;
      a[s] = n < N ? -expf(to_f32(a_log[d * N + n])) : 0.f;
    }
    const float dskip = to_f32(d_skip[d]), dtb = to_f32(dt_bias[d]);
    const T* bp = b_proj + (b * G + g) * N * steps;
    const T* cp = c_proj + (b * G + g) * N * steps;
    for (i64 t = 0; t < steps; ++t) {
      const float ut = to_f32(u[row * steps + t]);
      const float dt = softplus(to_f32(delta[row * steps + t]) + dtb);
      const float du = dt * ut;
      const float total = group_sum(scan_advance(h, a, dt, du, bp, cp, t, steps, lane, N));
      if (lane == 0) y[row * steps + t] = from_f32<T>(total + dskip * ut);
    }
#pragma unroll
    for (int s = 0; s < kMaxStates; ++s) {
      const i64 n = lane + 32 * s;
      if (n < N) state_out[row * N + n] = from_f32<T>(h[s]);
    }
  }
}

// The backward's main pass: one warp per (b, g, p) over the channels of partition p of group g.
// states: fp32 [warps, T, N] (the warp's own); part_bc: fp32 [2, B, G, P, N, T] (b_proj's, then
// c_proj's gradient sums of the partition); part_a: fp32 [B, D, N]; part_d: fp32 [2, B, D]
// (d_skip's, then dt_bias's per batch).
template <typename T>
__device__ void scan_bwd(const T* d_y, const T* u, const T* delta, const T* a_log, const T* b_proj, const T* c_proj,
                         const T* d_skip, const T* dt_bias, const T* ssm_state, T* d_u, T* d_delta, float* states,
                         float* part_bc, float* part_a, float* part_d, i64 B, i64 D, i64 G, i64 N, i64 steps, i64 P,
                         i64 cpp) {
  const i64 per_group = D / G, warps = B * G * P;
  const int lane = threadIdx.x;
  const i64 part_size = B * G * P * N * steps;
  for (i64 w = (i64) blockIdx.x * blockDim.y + threadIdx.y; w < warps; w += (i64) gridDim.x * blockDim.y) {
    const i64 b = w / (G * P), g = (w / P) % G, p = w % P;
    float* st = states + w * steps * N;
    float* pb = part_bc + w * N * steps;  // [N, T] of (b, g, p)
    float* pc = pb + part_size;
    const T* bp = b_proj + (b * G + g) * N * steps;
    const T* cp = c_proj + (b * G + g) * N * steps;
    for (i64 j = 0; j < cpp && p * cpp + j < per_group; ++j) {
      const i64 d = g * per_group + p * cpp + j, row = b * D + d;
      const bool first = j == 0;
      float h0[kMaxStates], a[kMaxStates], h[kMaxStates], dh[kMaxStates], da[kMaxStates];
#pragma unroll
      for (int s = 0; s < kMaxStates; ++s) {
        const i64 n = lane + 32 * s;
        h0[s] = (n < N && ssm_state) ? to_f32(ssm_state[row * N + n]) : 0.f;
        a[s] = n < N ? -expf(to_f32(a_log[d * N + n])) : 0.f;
        h[s] = h0[s];
        dh[s] = 0.f;
        da[s] = 0.f;
      }
      const float dskip = to_f32(d_skip[d]), dtb = to_f32(dt_bias[d]);
      // the states of every step, as the forward computes them
      for (i64 t = 0; t < steps; ++t) {
        const float ut = to_f32(u[row * steps + t]);
        const float dt = softplus(to_f32(delta[row * steps + t]) + dtb);
        const float du = dt * ut;
#pragma unroll
        for (int s = 0; s < kMaxStates; ++s) {
          const i64 n = lane + 32 * s;
          if (n < N) {
            h[s] = expf(dt * a[s]) * h[s] + du * to_f32(bp[n * steps + t]);
            st[t * N + n] = h[s];
          }
        }
      }
      float sum_skip = 0.f, sum_dtb = 0.f;
      for (i64 t = steps - 1; t >= 0; --t) {
        const float ut = to_f32(u[row * steps + t]);
        const float pre = to_f32(delta[row * steps + t]) + dtb;
        const float dt = softplus(pre);
        const float dy = to_f32(d_y[row * steps + t]);
        float part_b = 0.f, part_e = 0.f;
        float decay[kMaxStates];
#pragma unroll
        for (int s = 0; s < kMaxStates; ++s) {
          const i64 n = lane + 32 * s;
          decay[s] = 1.f;
          if (n < N) {
            const float ht = st[t * N + n];
            const float hp = t > 0 ? st[(t - 1) * N + n] : h0[s];
            const float cd = to_f32(cp[n * steps + t]), bd = to_f32(bp[n * steps + t]);
            const float gc = dy * ht;
            pc[n * steps + t] = first ? gc : pc[n * steps + t] + gc;
            dh[s] += dy * cd;
            decay[s] = expf(dt * a[s]);
            const float d_exp = dh[s] * hp * decay[s];
            part_b += dh[s] * bd;
            part_e += d_exp * a[s];
            da[s] += d_exp * dt;
            const float gb = dh[s] * (dt * ut);
            pb[n * steps + t] = first ? gb : pb[n * steps + t] + gb;
          }
        }
        const float dh_b = group_sum(part_b);
        const float sum_ea = group_sum(part_e);
#pragma unroll
        for (int s = 0; s < kMaxStates; ++s) dh[s] *= decay[s];
        const float d_dt = sum_ea + dh_b * ut;
        const float d_pre = d_dt * sigmoid(pre);
        if (lane == 0) {
          d_u[row * steps + t] = from_f32<T>(dy * dskip + dh_b * dt);
          d_delta[row * steps + t] = from_f32<T>(d_pre);
        }
        sum_skip += dy * ut;
        sum_dtb += d_pre;
      }
#pragma unroll
      for (int s = 0; s < kMaxStates; ++s) {
        const i64 n = lane + 32 * s;
        if (n < N) part_a[row * N + n] = da[s];
      }
      if (lane == 0) {
        part_d[row] = sum_skip;
        part_d[B * D + row] = sum_dtb;
      }
    }
  }
}

// d_b_proj, d_c_proj (the partitions added), d_a_log = (sum_b part_a) A, d_d_skip and d_dt_bias
// (the batches added): grid-stride over all their elements.
template <typename T>
__device__ void scan_bwd_reduce(const float* part_bc, const float* part_a, const float* part_d, const T* a_log,
                                T* d_a_log, T* d_b_proj, T* d_c_proj, T* d_d_skip, T* d_dt_bias, i64 B, i64 D, i64 G,
                                i64 N, i64 steps, i64 P) {
  const i64 nbc = B * G * N * steps, na = D * N;
  const i64 total = 2 * nbc + na + 2 * D;
  for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64) gridDim.x * blockDim.x) {
    if (i < 2 * nbc) {
      const i64 which = i / nbc, e = i % nbc;  // e = ((b G + g) N + n) T + t
      const i64 bg = e / (N * steps), rest = e % (N * steps);
      const float* src = part_bc + which * (nbc * P) + bg * P * N * steps + rest;
      float acc = 0.f;
      for (i64 p = 0; p < P; ++p) acc += src[p * N * steps];
      (which ? d_c_proj : d_b_proj)[e] = from_f32<T>(acc);
    } else if (i < 2 * nbc + na) {
      const i64 e = i - 2 * nbc;  // d N + n
      float acc = 0.f;
      for (i64 b = 0; b < B; ++b) acc += part_a[b * na + e];
      d_a_log[e] = from_f32<T>(acc * -expf(to_f32(a_log[e])));
    } else {
      const i64 e = i - 2 * nbc - na, which = e / D, d = e % D;
      float acc = 0.f;
      for (i64 b = 0; b < B; ++b) acc += part_d[which * B * D + b * D + d];
      (which ? d_dt_bias : d_d_skip)[d] = from_f32<T>(acc);
    }
  }
}

// ---------------------------------------------------------------------------
// Decoding steps
// ---------------------------------------------------------------------------

// (start position, real steps) of a run of `steps`; ok: 0 < count <= steps (the reference raises otherwise).
struct DecodeRun {
  bool fresh;  // position <= 0: the carried state reads as zeros
  bool ok;
  i64 count;
};

__device__ __forceinline__ DecodeRun decode_run(const void* position, const void* valid, i64 steps, int idx64) {
  const i64 start = load_index(position, 0, idx64), count = load_index(valid, 0, idx64);
  return DecodeRun{start <= 0, count > 0 && count <= steps, count};
}

// The conv of the steps of a run over the carried conv state, the state updated in place to the
// last K - 1 inputs of [state, x[:count]]: one warp per channel (b, d), its lanes over the steps.
// The channel's lanes read the old state (for y of the first K - 1 steps, and lanes j < K - 1 for
// element count + j of xp = [state, x], the new state's element j) before a block barrier, and
// lanes j < K - 1 write the new state after it. The loops are block-uniform (the barrier).
template <typename T>
__device__ void conv_step(const T* x, const T* weight, const T* bias, T* state, const void* position,
                          const void* valid, T* y, i64 B, i64 D, i64 steps, i64 K, int silu, int idx64) {
  const DecodeRun run = decode_run(position, valid, steps, idx64);
  const i64 pad = K - 1;
  const int lane = threadIdx.x;
  const float nan = NAN;
  for (i64 b = blockIdx.y; b < B; b += gridDim.y) {
    for (i64 d0 = (i64) blockIdx.x * blockDim.y; d0 < D; d0 += (i64) gridDim.x * blockDim.y) {
      const i64 d = d0 + threadIdx.y, row = b * D + d;
      const bool active = d < D;
      float next = nan;  // lane j < K - 1: element j of the new state
      if (active) {
        const T* xr = x + row * steps;
        const T* sr = state + row * pad;
#pragma unroll 1  // not unrolled: ptxas would spill around sigmoid's division (its slow-path call)
        for (i64 t = lane; t < steps; t += 32) {
          float acc = 0.f;
          for (i64 k = 0; k < K; ++k) {
            const i64 j = t + k;  // in xp = [old state (zeros when fresh), x]
            const float v = j >= pad ? to_f32(xr[j - pad]) : (run.fresh ? 0.f : to_f32(sr[j]));
            acc += to_f32(weight[d * K + k]) * v;
          }
          if (bias) acc += to_f32(bias[d]);
          y[row * steps + t] = from_f32<T>(run.ok ? (silu ? acc * sigmoid(acc) : acc) : nan);
        }
        if (lane < pad && run.ok) {
          const i64 at = run.count + lane;  // < count + K - 1: xp[at] is a real step or the old state
          next = at >= pad ? to_f32(xr[at - pad]) : (run.fresh ? 0.f : to_f32(sr[at]));
        }
      }
      __syncthreads();  // every read of the old state before any write
      if (active && lane < pad) state[row * pad + lane] = from_f32<T>(next);
    }
  }
}

// The scan of the steps of a run from the carried ssm state, one warp per row (b, d) as scan_fwd;
// each lane writes its states after step count - 1 into the state buffer (which it alone read, before).
template <typename T>
__device__ void scan_step(const T* u, const T* delta, const T* a_log, const T* b_proj, const T* c_proj,
                          const T* d_skip, const T* dt_bias, T* ssm_state, const void* position, const void* valid,
                          T* y, i64 B, i64 D, i64 G, i64 N, i64 steps, int idx64) {
  const DecodeRun run = decode_run(position, valid, steps, idx64);
  const i64 per_group = D / G;
  const int lane = threadIdx.x;
  const float nan = NAN;
  for (i64 row = (i64) blockIdx.x * blockDim.y + threadIdx.y; row < B * D; row += (i64) gridDim.x * blockDim.y) {
    const i64 b = row / D, d = row % D, g = d / per_group;
    float h[kMaxStates], a[kMaxStates];
#pragma unroll
    for (int s = 0; s < kMaxStates; ++s) {
      const i64 n = lane + 32 * s;
      h[s] = (n < N && !run.fresh) ? to_f32(ssm_state[row * N + n]) : 0.f;
      a[s] = n < N ? -expf(to_f32(a_log[d * N + n])) : 0.f;
    }
    const float dskip = to_f32(d_skip[d]), dtb = to_f32(dt_bias[d]);
    const T* bp = b_proj + (b * G + g) * N * steps;
    const T* cp = c_proj + (b * G + g) * N * steps;
    for (i64 t = 0; t < steps; ++t) {
      const float ut = to_f32(u[row * steps + t]);
      const float dt = softplus(to_f32(delta[row * steps + t]) + dtb);
      const float du = dt * ut;
      const float total = group_sum(scan_advance(h, a, dt, du, bp, cp, t, steps, lane, N));
      if (lane == 0) y[row * steps + t] = from_f32<T>(run.ok ? total + dskip * ut : nan);
      if (t == run.count - 1) {  // warp-uniform
#pragma unroll
        for (int s = 0; s < kMaxStates; ++s) {
          const i64 n = lane + 32 * s;
          if (n < N) ssm_state[row * N + n] = from_f32<T>(h[s]);
        }
      }
    }
    if (!run.ok) {
#pragma unroll
      for (int s = 0; s < kMaxStates; ++s) {
        const i64 n = lane + 32 * s;
        if (n < N) ssm_state[row * N + n] = from_f32<T>(nan);
      }
    }
  }
}

}  // namespace

// y [B, D, T] and, with a state, conv_state_out [B, D, K - 1]: block (256, 1, 1), grid-stride over
// B D T + B D (K - 1) elements.
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_conv1d_fwd_bf16(const bf16* x, const bf16* weight, const bf16* bias, const bf16* conv_state, bf16* y,
                           bf16* conv_state_out, i64 B, i64 D, i64 T, i64 K, int silu) {
  conv_fwd(x, weight, bias, conv_state, y, conv_state_out, B, D, T, K, silu);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_conv1d_fwd_f32(const float* x, const float* weight, const float* bias, const float* conv_state, float* y,
                          float* conv_state_out, i64 B, i64 D, i64 T, i64 K, int silu) {
  conv_fwd(x, weight, bias, conv_state, y, conv_state_out, B, D, T, K, silu);
}

// d_x, d_weight and (with a bias) d_bias: block (256, 1, 1), grid (min(D, 65536), 1, 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_conv1d_bwd_bf16(const bf16* d_y, const bf16* x, const bf16* weight, const bf16* bias, bf16* d_x,
                           bf16* d_weight, bf16* d_bias, i64 B, i64 D, i64 T, i64 K, int silu) {
  conv_bwd(d_y, x, weight, bias, d_x, d_weight, d_bias, B, D, T, K, silu);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_conv1d_bwd_f32(const float* d_y, const float* x, const float* weight, const float* bias, float* d_x,
                          float* d_weight, float* d_bias, i64 B, i64 D, i64 T, i64 K, int silu) {
  conv_bwd(d_y, x, weight, bias, d_x, d_weight, d_bias, B, D, T, K, silu);
}

// y and ssm_state_out: block (32, 8, 1), a warp per (b, d), grid-stride over B D rows.
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_scan_fwd_bf16(const bf16* u, const bf16* delta, const bf16* a_log, const bf16* b_proj, const bf16* c_proj,
                         const bf16* d_skip, const bf16* dt_bias, const bf16* ssm_state, bf16* y, bf16* ssm_state_out,
                         i64 B, i64 D, i64 G, i64 N, i64 T) {
  scan_fwd(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state, y, ssm_state_out, B, D, G, N, T);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_scan_fwd_f32(const float* u, const float* delta, const float* a_log, const float* b_proj,
                        const float* c_proj, const float* d_skip, const float* dt_bias, const float* ssm_state,
                        float* y, float* ssm_state_out, i64 B, i64 D, i64 G, i64 N, i64 T) {
  scan_fwd(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state, y, ssm_state_out, B, D, G, N, T);
}

// d_u, d_delta and the partial sums (scratch): block (32, 8, 1), a warp per (b, g, partition).
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_scan_bwd_bf16(const bf16* d_y, const bf16* u, const bf16* delta, const bf16* a_log, const bf16* b_proj,
                         const bf16* c_proj, const bf16* d_skip, const bf16* dt_bias, const bf16* ssm_state, bf16* d_u,
                         bf16* d_delta, float* states, float* part_bc, float* part_a, float* part_d, i64 B, i64 D,
                         i64 G, i64 N, i64 T, i64 P, i64 cpp) {
  scan_bwd(d_y, u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state, d_u, d_delta, states, part_bc, part_a,
           part_d, B, D, G, N, T, P, cpp);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_scan_bwd_f32(const float* d_y, const float* u, const float* delta, const float* a_log, const float* b_proj,
                        const float* c_proj, const float* d_skip, const float* dt_bias, const float* ssm_state,
                        float* d_u, float* d_delta, float* states, float* part_bc, float* part_a, float* part_d, i64 B,
                        i64 D, i64 G, i64 N, i64 T, i64 P, i64 cpp) {
  scan_bwd(d_y, u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state, d_u, d_delta, states, part_bc, part_a,
           part_d, B, D, G, N, T, P, cpp);
}

// d_a_log, d_b_proj, d_c_proj, d_d_skip, d_dt_bias from the partial sums: block (256, 1, 1), grid-stride.
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_scan_bwd_reduce_bf16(const float* part_bc, const float* part_a, const float* part_d, const bf16* a_log,
                                bf16* d_a_log, bf16* d_b_proj, bf16* d_c_proj, bf16* d_d_skip, bf16* d_dt_bias, i64 B,
                                i64 D, i64 G, i64 N, i64 T, i64 P) {
  scan_bwd_reduce(part_bc, part_a, part_d, a_log, d_a_log, d_b_proj, d_c_proj, d_d_skip, d_dt_bias, B, D, G, N, T, P);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_scan_bwd_reduce_f32(const float* part_bc, const float* part_a, const float* part_d, const float* a_log,
                               float* d_a_log, float* d_b_proj, float* d_c_proj, float* d_d_skip, float* d_dt_bias,
                               i64 B, i64 D, i64 G, i64 N, i64 T, i64 P) {
  scan_bwd_reduce(part_bc, part_a, part_d, a_log, d_a_log, d_b_proj, d_c_proj, d_d_skip, d_dt_bias, B, D, G, N, T, P);
}

// One decoding run of the conv: y [B, D, T], conv_state [B, D, K - 1] updated in place; position
// and valid: element 0 of int32 (idx64 = 0) or int64 (idx64 = 1) tensors. Block (32, 8, 1), grid
// (min(ceil(D / 8), 65536), min(B, 65535), 1).
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_conv1d_step_bf16(const bf16* x, const bf16* weight, const bf16* bias, bf16* conv_state,
                            const void* position, const void* valid, bf16* y, i64 B, i64 D, i64 T, i64 K, int silu,
                            int idx64) {
  conv_step(x, weight, bias, conv_state, position, valid, y, B, D, T, K, silu, idx64);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_conv1d_step_f32(const float* x, const float* weight, const float* bias, float* conv_state,
                           const void* position, const void* valid, float* y, i64 B, i64 D, i64 T, i64 K, int silu,
                           int idx64) {
  conv_step(x, weight, bias, conv_state, position, valid, y, B, D, T, K, silu, idx64);
}

// One decoding run of the scan: y [B, D, T], ssm_state [B, D, N] updated in place; position and
// valid as the conv step's. Block (32, 8, 1), a warp per (b, d), grid-stride over B D rows.
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_scan_step_bf16(const bf16* u, const bf16* delta, const bf16* a_log, const bf16* b_proj, const bf16* c_proj,
                          const bf16* d_skip, const bf16* dt_bias, bf16* ssm_state, const void* position,
                          const void* valid, bf16* y, i64 B, i64 D, i64 G, i64 N, i64 T, int idx64) {
  scan_step(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state, position, valid, y, B, D, G, N, T, idx64);
}
extern "C" __global__ void __launch_bounds__(256)
mdsl_mamba_scan_step_f32(const float* u, const float* delta, const float* a_log, const float* b_proj,
                         const float* c_proj, const float* d_skip, const float* dt_bias, float* ssm_state,
                         const void* position, const void* valid, float* y, i64 B, i64 D, i64 G, i64 N, i64 T,
                         int idx64) {
  scan_step(u, delta, a_log, b_proj, c_proj, d_skip, dt_bias, ssm_state, position, valid, y, B, D, G, N, T, idx64);
}
