// Attention, forward and backward: a plain CUDA flash attention (kernels/reference.py:
// flash_attention without ALiBi, flash_attention_backward; logit softcapping included). It is the
// executor's fallback where cuDNN's SDPA does not run (fp32, no cuDNN, softcap); no tensor cores:
// fp32 FMAs on tiles in shared memory.
//
// Tensors: q, out, d_out, d_q are [B, H, T, D] and k, v, d_k, d_v are [B, Hkv, S, D] in the
// "bhtd" layout, or [B, T, H, D] / [B, S, Hkv, D] in "bthd" (mdsl.sched.attention's layouts): the
// kernels take element strides (q_sb, q_sh, q_st) for batch, head and token of the first group and
// (k_sb, k_sh, k_st) of the second; D is contiguous (stride 1), 1 <= D <= 256. lse and the
// backward's delta are fp32 [B, H, T] (contiguous in both layouts). Storage bf16 or fp32; every
// product, sum and exponential is fp32.
//
// Semantics (as the reference): query i sits at position pos = i + S - T; key j is seen when
// causal: j <= pos; window w > 0: causal pos - j < w, else |pos - j| < w (w = 0: no window).
// Scores are scale * q.k (scale defaults to 1/sqrt(D) in kernels/cuda.py), softcapped to
// c * tanh(s / c) before the mask where softcap c > 0 (Gemma 2's attn_logit_softcapping; c = 0:
// none, and the kernels do exactly what they do without it). GQA: query head h reads kv head
// h / (H / Hkv). A query that sees no key (causal or windowed with T > S) gets lse = -inf
// and out = NaN, as the reference; the backward is not planned for such shapes.
//
// Packed rows: the kernels named *_seg_* (mdsl_attention_fwd_seg_f32, ..._bwd_dq_d256_seg_bf16) take
// one more parameter, segments ([B, S] int32 example ids), and see key j only where its id is that of
// the query's position: a block-diagonal mask on top of the others (the key tiles visited stay those
// of the causal and window masks). A block keeps the ids of its query and key tiles in shared memory
// after its tiles (kSegInts more ints): the forward masks the scores of other examples to -inf, the
// backward's d_k/d_v and d_q zero their P and dS. They are the same device code instantiated apart
// (SEG = true, launch bounds (128, 1): registers up to ~210, no spills), so the kernels without ids
// are what they were, their registers and shared memory included.
//
// Threads: every kernel runs blocks of 128 threads, seen as 16 row groups x 8 column groups
// (rg = tid / 8, cg = tid % 8; the 8 threads of a row group are adjacent lanes of one warp, so a
// row's max and sum are three xor shuffles). A thread owns tile rows rg + 16 i, score columns
// cg + 8 j, and the head dims 32 c + 4 cg + e (e < 4) of its rows. Tiles sit in shared memory as
// fp32 rows of DMAX + 4 floats (16-byte aligned, conflict-free float4 reads), DMAX = 64 when
// D <= 64, 128 when D <= 128, else 256; dims D..DMAX are zero. Global loads and stores move 4
// elements at a time when D, the strides and the pointer allow it, else one element at a time
// (any D, any alignment). Static shared memory only, at most 48 KiB per block; no dynamic shared
// memory. D <= 128 runs mdsl_attention_{fwd,bwd_dkdv,bwd_dq}_* (DMAX 64 or 128, a branch on D at
// the top); D > 128 runs kernels of their own, mdsl_attention_{fwd,bwd_dkdv,bwd_dq}_d256_*
// (DMAX = 256, the same device code on smaller tiles), so that neither's registers or shared
// memory are the other's. Four tiles of 256 dims do not fit 48 KiB: where d_k/d_v and d_q hold
// four, two of them take turns in one buffer at DMAX = 256 (below).
//
// Forward, mdsl_attention_fwd_{,d256_}{bf16,f32}: block (128, 1, 1), grid (ceil(T / BQ), H, B)
// with BQ = 64 query rows when D <= 64, 32 when D <= 128, else 16 (kernels/cuda.py:
// attention_tiles); the last query tile runs first (blockIdx.x reversed: causal tiles with the
// most keys start early). The block keeps its query tile (pre-multiplied by scale * log2(e)) in
// shared memory and walks key tiles of BK = 32 (16 when D > 128): K into shared memory, scores in
// registers, softcapped (in base 2: c log2(e) tanh(s / (c log2(e))) of the base-2 score s),
// masked (-inf), online softmax in base 2 (running max m and sum l per row, the accumulator
// rescaled), P into shared memory, then V into the same buffer and acc += P V. Only the key tiles
// some query of the block may see are visited (causal: none past the tile's last position;
// window: none before its first position - w + 1, nor, non-causal, past its last + w - 1); masks
// inside a tile are per element. Writes out = acc / l and lse = ln 2 * (m + log2 l).
//
// Backward (the standard recomputation from the saved lse; no atomics, deterministic), three
// launches:
//   1. mdsl_attention_bwd_pre_* (any D): delta[b, h, t] = sum_d d_out * out (fp32 scratch). Block
//      (128, 1, 1), a warp per row, grid (min(ceil(B H T / 4), 65536), 1, 1), grid-stride.
//   2. mdsl_attention_bwd_dkdv_{,d256_}*: block (128, 1, 1), grid (ceil(S / BK), Hkv, B): one
//      block per BK = 32 keys (16 when D > 128) of one kv head. K (pre-multiplied by scale *
//      log2(e)) and V stay in shared memory; the block walks every query head of the kv group and
//      every query tile (BQ = 32 rows when D <= 64 else 8) that may see its keys: Q, d_out, lse,
//      delta into shared memory (D > 128: Q and d_out take turns in one buffer, Q loaded twice: Q
//      for K Q^T, then d_out for V d_out^T and d_v, then Q again for d_k);
//      P^T = exp2(K Q^T - lse log2 e) and dP^T = V d_out^T in registers; dS = P (dP - delta)
//      (softcapped: P from the capped scores S = c tanh(s / c), and dS times 1 - (S / c)^2);
//      P^T and dS^T into shared memory; d_v += P^T d_out and d_k += dS^T Q in registers (so the
//      GQA sum over the group's heads is in the block). Writes d_k = scale * acc_k, d_v.
//   3. mdsl_attention_bwd_dq_{,d256_}*: block (128, 1, 1), grid (ceil(T / BQ), H, B): one block
//      per BQ = 32 query rows (16 when D > 128) of one head, Q and d_out in shared memory, walking
//      key tiles (BK = 32 when D <= 64 else 8; D > 128: V then K take turns in one buffer, each
//      loaded once): recomputes P and dP (and the softcap), dS into shared memory, d_q += dS K;
//      writes d_q = scale * acc in the storage type.
#include "common.cuh"

using namespace mdsl;

namespace {

constexpr int kThreads = 128;
constexpr int kRowGroups = 16;
constexpr int kColGroups = 8;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kSharedFloats = 48 * 1024 / 4;
constexpr int kSegInts = 96;  // the *_seg_* kernels' ids of a query tile and a key tile (at most 64 + 32)

// A P-tile row stride of at least n floats that is 8 mod 32: the four row groups of a warp write
// and read different banks.
__host__ __device__ constexpr int pad8(int n) { return n + ((8 - n % 32) + 32) % 32; }
__host__ __device__ constexpr int row_floats(int dmax) { return dmax + 4; }

// Tile shapes, by DMAX (kernels/cuda.py: attention_tiles mirrors the grid-defining ones). Rows of
// a tile split among the 16 row groups (multiples of 16) or the 8 column groups (multiples of 8).
__host__ __device__ constexpr int fwd_bq(int dmax) { return dmax == 64 ? 64 : dmax == 128 ? 32 : 16; }
__host__ __device__ constexpr int fwd_bk(int dmax) { return dmax == 256 ? 16 : 32; }
__host__ __device__ constexpr int dkdv_bk(int dmax) { return dmax == 256 ? 16 : 32; }
__host__ __device__ constexpr int dkdv_bq(int dmax) { return dmax == 64 ? 32 : 8; }
__host__ __device__ constexpr int dq_bq(int dmax) { return dmax == 256 ? 16 : 32; }
__host__ __device__ constexpr int dq_bk(int dmax) { return dmax == 64 ? 32 : 8; }
// Two tiles take turns in one buffer (d_k/d_v: Q and d_out; d_q: K and V) where four would not fit.
__host__ __device__ constexpr bool one_buffer(int dmax) { return dmax == 256; }

__host__ __device__ constexpr int fwd_floats(int dmax) {
  return (fwd_bq(dmax) + fwd_bk(dmax)) * row_floats(dmax) + fwd_bq(dmax) * pad8(fwd_bk(dmax));
}
__host__ __device__ constexpr int dkdv_floats(int dmax) {
  return (2 * dkdv_bk(dmax) + (one_buffer(dmax) ? 1 : 2) * dkdv_bq(dmax)) * row_floats(dmax) +
         2 * dkdv_bk(dmax) * pad8(dkdv_bq(dmax)) + 2 * dkdv_bq(dmax);
}
__host__ __device__ constexpr int dq_floats(int dmax) {
  return (2 * dq_bq(dmax) + (one_buffer(dmax) ? 1 : 2) * dq_bk(dmax)) * row_floats(dmax) +
         dq_bq(dmax) * pad8(dq_bk(dmax));
}
__host__ __device__ constexpr int max2(int a, int b) { return a > b ? a : b; }
constexpr int kFwdShared = max2(fwd_floats(64), fwd_floats(128));
constexpr int kDkdvShared = max2(dkdv_floats(64), dkdv_floats(128));
constexpr int kDqShared = max2(dq_floats(64), dq_floats(128));
static_assert(kFwdShared <= kSharedFloats && kDkdvShared <= kSharedFloats && kDqShared <= kSharedFloats,
              "attention tiles exceed 48 KiB of shared memory");
static_assert(fwd_floats(256) <= kSharedFloats && dkdv_floats(256) <= kSharedFloats && dq_floats(256) <= kSharedFloats,
              "the DMAX = 256 attention tiles exceed 48 KiB of shared memory");
static_assert(kFwdShared + kSegInts <= kSharedFloats && kDkdvShared + kSegInts <= kSharedFloats &&
                  kDqShared + kSegInts <= kSharedFloats && dkdv_floats(256) + kSegInts <= kSharedFloats &&
                  dq_floats(256) + kSegInts <= kSharedFloats && fwd_floats(256) + kSegInts <= kSharedFloats,
              "the packed rows' ids exceed 48 KiB of shared memory");

__device__ __forceinline__ i64 imin(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 imax(i64 a, i64 b) { return a > b ? a : b; }

struct Geometry {
  i64 B, H, Hkv, Tq, Tk, D;
  i64 q_sb, q_sh, q_st;  // q, out, d_out, d_q
  i64 k_sb, k_sh, k_st;  // k, v, d_k, d_v
  float scale;
  int causal;
  i64 window;      // 0: none
  float cap2;      // softcap c in base 2, c * log2(e) (the tiles' scores are base 2); 0: none
  float inv_cap2;  // 1 / cap2 (0: none)
  const int* seg = nullptr;  // packed rows' example ids [B, Tk] (the *_seg_* kernels'; null: none)

  // ids[r] = the id of query (as_keys: key) first + r of batch row b for r < n (-1 / -2 past end, which
  // no id equals), by the block's threads: the *_seg_* kernels' tiles of ids in shared memory.
  __device__ __forceinline__ void load_ids(int* ids, i64 b, i64 first, int n, i64 end, bool as_keys) const {
    const int* row = seg + b * Tk + (as_keys ? 0 : Tk - Tq);
    for (int r = threadIdx.x; r < n; r += blockDim.x) ids[r] = first + r < end ? row[first + r] : (as_keys ? -2 : -1);
  }

  // The softcapped base-2 score cap2 * tanh(s / cap2) of a base-2 score s (call only where cap2 > 0);
  // slope = 1 - tanh^2 = 1 - (S / c)^2, its derivative, which dS is multiplied by.
  __device__ __forceinline__ float capped(float s, float& slope) const {
    const float t = tanhf(s * inv_cap2);
    slope = 1.f - t * t;
    return cap2 * t;
  }

  // May query i see key j?
  __device__ __forceinline__ bool allowed(i64 i, i64 j) const {
    const i64 pos = i + Tk - Tq;
    if (causal && j > pos) return false;
    if (window > 0) {
      const i64 dist = pos >= j ? pos - j : j - pos;
      if (dist >= window) return false;
    }
    return true;
  }

  // The keys [lo, hi) that some query of [q0, q1) may see (hi <= lo: none).
  __device__ __forceinline__ void keys_of(i64 q0, i64 q1, i64& lo, i64& hi) const {
    const i64 first = q0 + Tk - Tq, last = q1 - 1 + Tk - Tq;
    lo = 0;
    hi = Tk;
    if (causal) hi = imin(hi, last + 1);
    if (window > 0) {
      lo = imax(lo, first - window + 1);
      if (!causal) hi = imin(hi, last + window);
    }
  }

  // The queries [lo, hi) that may see some key of [k0, k1).
  __device__ __forceinline__ void queries_of(i64 k0, i64 k1, i64& lo, i64& hi) const {
    const i64 shift = Tk - Tq;  // position - index
    lo = 0;
    hi = Tq;
    if (causal) lo = imax(lo, k0 - shift);
    if (window > 0) {
      hi = imin(hi, k1 - 1 + window - shift);
      if (!causal) lo = imax(lo, k0 - window + 1 - shift);
    }
  }
};

// body(Capped<true>()) where the geometry softcaps, else body(Capped<false>()): a score loop compiled
// twice, apart. d_q's loop takes it (a branch per score there makes ptxas spill on sm_90a); the
// forward and d_k/d_v branch per score (their loops compiled twice spill on sm_80).
template <bool B>
struct Capped {
  static constexpr bool value = B;
};
template <typename F>
__device__ __forceinline__ void with_softcap(const Geometry& g, F&& body) {
  if (g.cap2 > 0.f) body(Capped<true>());
  else body(Capped<false>());
}

template <typename T>
__device__ __forceinline__ bool vectorizable(const void* p, i64 D, i64 sb, i64 sh, i64 st) {
  return D % 4 == 0 && sb % 4 == 0 && sh % 4 == 0 && st % 4 == 0 && aligned(p, 4 * (int) sizeof(T));
}

// R rows of an fp32 shared tile (row stride LD floats) from `rows` global rows (row r at
// src + r * stride, D contiguous elements), times mul; zero past D (up to DMAX) and past `rows`.
template <typename T, int R, int DMAX>
__device__ __forceinline__ void load_tile(float* dst, const T* src, i64 stride, i64 rows, int D, bool vec, float mul) {
  constexpr int LD = row_floats(DMAX), C4 = DMAX / 4;
  for (int idx = threadIdx.x; idx < R * C4; idx += kThreads) {
    const int r = idx / C4, c = (idx % C4) * 4;
    float x[4] = {0.f, 0.f, 0.f, 0.f};
    if (r < rows && c < D) {
      const T* p = src + r * stride + c;
      if (vec) {
        load<T, 4>(p, x);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (c + e < D) x[e] = to_f32(p[e]);
      }
    }
    *reinterpret_cast<float4*>(dst + r * LD + c) = make_float4(x[0] * mul, x[1] * mul, x[2] * mul, x[3] * mul);
  }
}

// Stores the `valid` (<= 4 used) leading values of x at p.
template <typename T>
__device__ __forceinline__ void store4(T* p, const float* x, i64 valid, bool vec) {
  if (vec && valid >= 4) {
    store<T, 4>(p, x);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (e < valid) p[e] = from_f32<T>(x[e]);
  }
}

// s[i][j] = sum over the first 4 * D4 dims of A[rg + 16 i] . Bm[cg + 8 j] (shared tiles, row stride LD).
template <int RS, int CS, int LD>
__device__ __forceinline__ void dot_tile(float (&s)[RS][CS], const float* A, const float* Bm, int D4) {
  const int rg = threadIdx.x / kColGroups, cg = threadIdx.x % kColGroups;
#pragma unroll
  for (int i = 0; i < RS; ++i)
#pragma unroll
    for (int j = 0; j < CS; ++j) s[i][j] = 0.f;
#pragma unroll 2
  for (int d4 = 0; d4 < D4; ++d4) {
    float4 a[RS], b[CS];
#pragma unroll
    for (int i = 0; i < RS; ++i) a[i] = *reinterpret_cast<const float4*>(A + (rg + kRowGroups * i) * LD + 4 * d4);
#pragma unroll
    for (int j = 0; j < CS; ++j) b[j] = *reinterpret_cast<const float4*>(Bm + (cg + kColGroups * j) * LD + 4 * d4);
#pragma unroll
    for (int i = 0; i < RS; ++i)
#pragma unroll
      for (int j = 0; j < CS; ++j) {
        float t = s[i][j];
        t = fmaf(a[i].x, b[j].x, t);
        t = fmaf(a[i].y, b[j].y, t);
        t = fmaf(a[i].z, b[j].z, t);
        t = fmaf(a[i].w, b[j].w, t);
        s[i][j] = t;
      }
  }
}

// acc[i][4 c + e] += sum_{k < N} P[(rg + 16 i) * PLD + k] * M[k * LD + 32 c + 4 cg + e]
// (P a score tile in shared memory, M a shared tile of rows of head dims); chunks of 32 dims
// past D are skipped. UNROLL: the k loop's unrolling (d_k/d_v at DMAX = 256 takes 1: two
// accumulators of 256 dims and four k steps of loads in flight spill).
template <int RA, int NC, int LD, int PLD, int N, int UNROLL = 4>
__device__ __forceinline__ void pm_tile(float (&acc)[RA][4 * NC], const float* P, const float* M, int D) {
  const int rg = threadIdx.x / kColGroups, cg = threadIdx.x % kColGroups;
#pragma unroll UNROLL
  for (int k = 0; k < N; ++k) {
    float p[RA];
#pragma unroll
    for (int i = 0; i < RA; ++i) p[i] = P[(rg + kRowGroups * i) * PLD + k];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (32 * c >= D) continue;
      const float4 m = *reinterpret_cast<const float4*>(M + k * LD + 32 * c + 4 * cg);
#pragma unroll
      for (int i = 0; i < RA; ++i) {
        acc[i][4 * c + 0] = fmaf(p[i], m.x, acc[i][4 * c + 0]);
        acc[i][4 * c + 1] = fmaf(p[i], m.y, acc[i][4 * c + 1]);
        acc[i][4 * c + 2] = fmaf(p[i], m.z, acc[i][4 * c + 2]);
        acc[i][4 * c + 3] = fmaf(p[i], m.w, acc[i][4 * c + 3]);
      }
    }
  }
}

// Writes rows rg + 16 i (those below `rows`) of acc * mul, at dst + row * stride.
template <typename T, int RA, int NC>
__device__ __forceinline__ void store_rows(T* dst, i64 stride, i64 rows, const float (&acc)[RA][4 * NC],
                                           const float* mul, int D, bool vec) {
  const int rg = threadIdx.x / kColGroups, cg = threadIdx.x % kColGroups;
#pragma unroll
  for (int i = 0; i < RA; ++i) {
    const i64 r = rg + kRowGroups * i;
    if (r >= rows) continue;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d0 = 32 * c + 4 * cg;
      if (d0 >= D) continue;
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = acc[i][4 * c + e] * mul[i];
      store4<T>(dst + r * stride + d0, x, D - d0, vec);
    }
  }
}

// Max and sum over the 8 threads of a row group (adjacent lanes).
__device__ __forceinline__ float row_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 4));
}
__device__ __forceinline__ float row_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  v += __shfl_xor_sync(kFullMask, v, 2);
  return v + __shfl_xor_sync(kFullMask, v, 4);
}

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

template <typename T, int DMAX, bool SEG = false>
__device__ void attention_fwd(const Geometry& g, const T* q, const T* k, const T* v, T* out, float* lse, float* smem) {
  constexpr int BQ = fwd_bq(DMAX), BK = fwd_bk(DMAX), LD = row_floats(DMAX), PLD = pad8(BK);
  constexpr int RQ = BQ / kRowGroups, CK = BK / kColGroups, NC = DMAX / 32;
  float* Qs = smem;
  float* KVs = Qs + BQ * LD;
  float* Ps = KVs + BK * LD;
  int* qids = reinterpret_cast<int*>(Ps + BQ * PLD);  // SEG: BQ query ids, then BK key ids
  int* kids = qids + BQ;
  const int rg = threadIdx.x / kColGroups, cg = threadIdx.x % kColGroups;
  const int D = (int) g.D, D4 = (D + 3) / 4;
  const i64 b = blockIdx.z, h = blockIdx.y, kvh = h / (g.H / g.Hkv);
  const i64 q0 = (i64) (gridDim.x - 1 - blockIdx.x) * BQ, q1 = imin(q0 + BQ, g.Tq);
  const T* qb = q + b * g.q_sb + h * g.q_sh;
  const T* kb = k + b * g.k_sb + kvh * g.k_sh;
  const T* vb = v + b * g.k_sb + kvh * g.k_sh;
  T* ob = out + b * g.q_sb + h * g.q_sh;
  const bool vq = vectorizable<T>(q, g.D, g.q_sb, g.q_sh, g.q_st);
  const bool vk = vectorizable<T>(k, g.D, g.k_sb, g.k_sh, g.k_st) && vectorizable<T>(v, g.D, g.k_sb, g.k_sh, g.k_st);
  const bool vo = vectorizable<T>(out, g.D, g.q_sb, g.q_sh, g.q_st);

  load_tile<T, BQ, DMAX>(Qs, qb + q0 * g.q_st, g.q_st, q1 - q0, D, vq, g.scale * kLog2e);
  if constexpr (SEG) g.load_ids(qids, b, q0, BQ, g.Tq, false);
  float m[RQ], l[RQ], acc[RQ][4 * NC];
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < 4 * NC; ++c) acc[i][c] = 0.f;
  }
  i64 lo, hi;
  g.keys_of(q0, q1, lo, hi);
  for (i64 k0 = lo / BK * BK; k0 < hi; k0 += BK) {
    const i64 k1 = imin(k0 + BK, g.Tk);
    __syncthreads();  // the previous tile's P V is done with KVs and Ps
    load_tile<T, BK, DMAX>(KVs, kb + k0 * g.k_st, g.k_st, k1 - k0, D, vk, 1.f);
    if constexpr (SEG) g.load_ids(kids, b, k0, BK, k1, true);
    __syncthreads();
    float s[RQ][CK];
    dot_tile<RQ, CK, LD>(s, Qs, KVs, D4);
    if constexpr (SEG) {  // the keys of other examples: -inf, which the cap below leaves so
#pragma unroll
      for (int i = 0; i < RQ; ++i) {
        const int id = qids[rg + kRowGroups * i];
#pragma unroll
        for (int j = 0; j < CK; ++j)
          if (kids[cg + kColGroups * j] != id) s[i][j] = -INFINITY;
      }
    }
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const i64 qi = q0 + rg + kRowGroups * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < CK; ++j) {
        const i64 kj = k0 + cg + kColGroups * j;
        if (qi >= g.Tq || kj >= k1 || !g.allowed(qi, kj)) {
          s[i][j] = -INFINITY;
        } else if (g.cap2 > 0.f && (!SEG || s[i][j] != -INFINITY)) {  // softcapped before the mask
          float slope;
          s[i][j] = g.capped(s[i][j], slope);
        }
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], row_max(mx));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: every p is 0
      const float alpha = exp2f(m[i] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < CK; ++j) {
        const float p = exp2f(s[i][j] - m_use);
        sum += p;
        Ps[(rg + kRowGroups * i) * PLD + cg + kColGroups * j] = p;
      }
      l[i] = l[i] * alpha + row_sum(sum);
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < 4 * NC; ++c) acc[i][c] *= alpha;
    }
    __syncthreads();  // every thread is done with K
    load_tile<T, BK, DMAX>(KVs, vb + k0 * g.k_st, g.k_st, k1 - k0, D, vk, 1.f);
    __syncthreads();
    pm_tile<RQ, NC, LD, PLD, BK>(acc, Ps, KVs, D);
  }
  float inv[RQ];
#pragma unroll
  for (int i = 0; i < RQ; ++i) inv[i] = 1.f / l[i];  // l = 0 (no key seen): NaN, as the reference
  store_rows<T, RQ, NC>(ob + q0 * g.q_st, g.q_st, q1 - q0, acc, inv, D, vo);
  if (cg == 0) {
#pragma unroll
    for (int i = 0; i < RQ; ++i) {
      const i64 qi = q0 + rg + kRowGroups * i;
      if (qi < g.Tq) lse[(b * g.H + h) * g.Tq + qi] = l[i] > 0.f ? (m[i] + log2f(l[i])) * kLn2 : -INFINITY;
    }
  }
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

// delta[row] = sum_d d_out[row, d] * out[row, d] over the rows (b, h, t) of [B, H, T]: a warp per row.
template <typename T>
__device__ void attention_delta(const T* d_out, const T* out, float* delta, i64 B, i64 H, i64 Tq, i64 D, i64 sb,
                                i64 sh, i64 st) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 rows = B * H * Tq;
  for (i64 base = (i64) blockIdx.x * kWarps; base < rows; base += (i64) gridDim.x * kWarps) {
    const i64 row = base + warp;
    float s = 0.f;
    if (row < rows) {
      const i64 t = row % Tq, bh = row / Tq;
      const i64 off = (bh / H) * sb + (bh % H) * sh + t * st;
      for (i64 d = lane; d < D; d += 32) s = fmaf(to_f32(d_out[off + d]), to_f32(out[off + d]), s);
    }
    s = warp_sum(s);
    if (row < rows && lane == 0) delta[row] = s;
  }
}

template <typename T, int DMAX, bool SEG = false>
__device__ void attention_dkdv(const Geometry& g, const T* d_out, const T* q, const T* k, const T* v, const float* lse,
                               const float* delta, T* d_k, T* d_v, float* smem) {
  constexpr int BK = dkdv_bk(DMAX), BQ = dkdv_bq(DMAX), LD = row_floats(DMAX), PLD = pad8(BQ);
  constexpr int RK = BK / kRowGroups, CQ = BQ / kColGroups, NC = DMAX / 32;
  constexpr bool ONE = one_buffer(DMAX);  // Q and d_out take turns in Qs
  constexpr int UNROLL = DMAX == 256 ? 1 : 4;  // pm_tile's
  float* Ks = smem;
  float* Vs = Ks + BK * LD;
  float* Qs = Vs + BK * LD;
  float* dOs = ONE ? Qs : Qs + BQ * LD;
  float* Pt = dOs + BQ * LD;
  float* dSt = Pt + BK * PLD;
  float* lse2 = dSt + BK * PLD;
  float* dl = lse2 + BQ;
  int* kids = reinterpret_cast<int*>(dl + BQ);  // SEG: BK key ids, then BQ query ids
  int* qids = kids + BK;
  const int rg = threadIdx.x / kColGroups, cg = threadIdx.x % kColGroups;
  const int D = (int) g.D, D4 = (D + 3) / 4;
  const i64 b = blockIdx.z, kvh = blockIdx.y, group = g.H / g.Hkv;
  const i64 k0 = (i64) blockIdx.x * BK, k1 = imin(k0 + BK, g.Tk);
  const i64 kv_off = b * g.k_sb + kvh * g.k_sh + k0 * g.k_st;
  const bool vq = vectorizable<T>(q, g.D, g.q_sb, g.q_sh, g.q_st) &&
                  vectorizable<T>(d_out, g.D, g.q_sb, g.q_sh, g.q_st);
  const bool vk = vectorizable<T>(k, g.D, g.k_sb, g.k_sh, g.k_st) && vectorizable<T>(v, g.D, g.k_sb, g.k_sh, g.k_st);
  const bool vd = vectorizable<T>(d_k, g.D, g.k_sb, g.k_sh, g.k_st) &&
                  vectorizable<T>(d_v, g.D, g.k_sb, g.k_sh, g.k_st);

  load_tile<T, BK, DMAX>(Ks, k + kv_off, g.k_st, k1 - k0, D, vk, g.scale * kLog2e);
  load_tile<T, BK, DMAX>(Vs, v + kv_off, g.k_st, k1 - k0, D, vk, 1.f);
  if constexpr (SEG) g.load_ids(kids, b, k0, BK, k1, true);
  float acc_k[RK][4 * NC], acc_v[RK][4 * NC];
#pragma unroll
  for (int i = 0; i < RK; ++i)
#pragma unroll
    for (int c = 0; c < 4 * NC; ++c) acc_k[i][c] = acc_v[i][c] = 0.f;
  i64 lo, hi;
  g.queries_of(k0, k1, lo, hi);
  for (i64 h = kvh * group; h < (kvh + 1) * group; ++h) {
    const i64 q_off = b * g.q_sb + h * g.q_sh;
    const float* lse_h = lse + (b * g.H + h) * g.Tq;
    const float* delta_h = delta + (b * g.H + h) * g.Tq;
    const int* seg_h = SEG ? g.seg + b * g.Tk + (g.Tk - g.Tq) : nullptr;  // the queries' ids (packed rows)
    for (i64 t0 = lo / BQ * BQ; t0 < hi; t0 += BQ) {
      const i64 rows = imin(BQ, g.Tq - t0);
      __syncthreads();  // the previous tile's products are done with Qs, dOs, Pt, dSt
      load_tile<T, BQ, DMAX>(Qs, q + q_off + t0 * g.q_st, g.q_st, rows, D, vq, 1.f);
      if constexpr (!ONE) load_tile<T, BQ, DMAX>(dOs, d_out + q_off + t0 * g.q_st, g.q_st, rows, D, vq, 1.f);
      for (int r = threadIdx.x; r < BQ; r += kThreads) {
        lse2[r] = r < rows ? lse_h[t0 + r] * kLog2e : 0.f;
        dl[r] = r < rows ? delta_h[t0 + r] : 0.f;
        if constexpr (SEG) qids[r] = r < rows ? seg_h[t0 + r] : -1;
      }
      __syncthreads();
      float st[RK][CQ], dpt[RK][CQ];
      dot_tile<RK, CQ, LD>(st, Ks, Qs, D4);
      if constexpr (ONE) {
        __syncthreads();  // every thread is done with Q
        load_tile<T, BQ, DMAX>(dOs, d_out + q_off + t0 * g.q_st, g.q_st, rows, D, vq, 1.f);
        __syncthreads();
      }
      dot_tile<RK, CQ, LD>(dpt, Vs, dOs, D4);
#pragma unroll
      for (int i = 0; i < RK; ++i) {
        const i64 kj = k0 + rg + kRowGroups * i;
#pragma unroll
        for (int j = 0; j < CQ; ++j) {
          const int r = cg + kColGroups * j;
          const i64 qi = t0 + r;
          float p = 0.f, ds = 0.f;
          if (kj < k1 && qi < g.Tq && g.allowed(qi, kj)) {
            if (g.cap2 > 0.f) {
              float slope;
              p = exp2f(g.capped(st[i][j], slope) - lse2[r]);
              ds = p * (dpt[i][j] - dl[r]) * slope;
            } else {
              p = exp2f(st[i][j] - lse2[r]);
              ds = p * (dpt[i][j] - dl[r]);
            }
          }
          Pt[(rg + kRowGroups * i) * PLD + r] = p;
          dSt[(rg + kRowGroups * i) * PLD + r] = ds;
        }
      }
      if constexpr (SEG) {  // the queries of other examples: nothing (each thread its own entries)
#pragma unroll 1
        for (int i = 0; i < RK; ++i) {
          const int id = kids[rg + kRowGroups * i];
          float* pt = Pt + (rg + kRowGroups * i) * PLD;
          float* dst = dSt + (rg + kRowGroups * i) * PLD;
#pragma unroll 1
          for (int r = cg; r < BQ; r += kColGroups)
            if (qids[r] != id) pt[r] = dst[r] = 0.f;
        }
      }
      __syncthreads();
      pm_tile<RK, NC, LD, PLD, BQ, UNROLL>(acc_v, Pt, dOs, D);
      if constexpr (ONE) {
        __syncthreads();  // every thread is done with d_out: Q again
        load_tile<T, BQ, DMAX>(Qs, q + q_off + t0 * g.q_st, g.q_st, rows, D, vq, 1.f);
        __syncthreads();
      }
      pm_tile<RK, NC, LD, PLD, BQ, UNROLL>(acc_k, dSt, Qs, D);
    }
  }
  float scale[RK], one[RK];
#pragma unroll
  for (int i = 0; i < RK; ++i) {
    scale[i] = g.scale;
    one[i] = 1.f;
  }
  store_rows<T, RK, NC>(d_k + kv_off, g.k_st, k1 - k0, acc_k, scale, D, vd);
  store_rows<T, RK, NC>(d_v + kv_off, g.k_st, k1 - k0, acc_v, one, D, vd);
}

template <typename T, int DMAX, bool SEG = false>
__device__ void attention_dq(const Geometry& g, const T* d_out, const T* q, const T* k, const T* v, const float* lse,
                             const float* delta, T* d_q, float* smem) {
  constexpr int BQ = dq_bq(DMAX), BK = dq_bk(DMAX), LD = row_floats(DMAX), PLD = pad8(BK);
  constexpr int RQ = BQ / kRowGroups, CK = BK / kColGroups, NC = DMAX / 32;
  constexpr bool ONE = one_buffer(DMAX);  // V and K take turns in Ks
  float* Qs = smem;
  float* dOs = Qs + BQ * LD;
  float* Ks = dOs + BQ * LD;
  float* Vs = ONE ? Ks : Ks + BK * LD;
  float* dS = Vs + BK * LD;
  int* qids = reinterpret_cast<int*>(dS + BQ * PLD);  // SEG: BQ query ids, then BK key ids
  int* kids = qids + BQ;
  const int rg = threadIdx.x / kColGroups, cg = threadIdx.x % kColGroups;
  const int D = (int) g.D, D4 = (D + 3) / 4;
  const i64 b = blockIdx.z, h = blockIdx.y, kvh = h / (g.H / g.Hkv);
  const i64 q0 = (i64) (gridDim.x - 1 - blockIdx.x) * BQ, q1 = imin(q0 + BQ, g.Tq);
  const i64 q_off = b * g.q_sb + h * g.q_sh + q0 * g.q_st;
  const T* kb = k + b * g.k_sb + kvh * g.k_sh;
  const T* vb = v + b * g.k_sb + kvh * g.k_sh;
  const bool vq = vectorizable<T>(q, g.D, g.q_sb, g.q_sh, g.q_st) &&
                  vectorizable<T>(d_out, g.D, g.q_sb, g.q_sh, g.q_st);
  const bool vk = vectorizable<T>(k, g.D, g.k_sb, g.k_sh, g.k_st) && vectorizable<T>(v, g.D, g.k_sb, g.k_sh, g.k_st);
  const bool vd = vectorizable<T>(d_q, g.D, g.q_sb, g.q_sh, g.q_st);

  load_tile<T, BQ, DMAX>(Qs, q + q_off, g.q_st, q1 - q0, D, vq, g.scale * kLog2e);
  load_tile<T, BQ, DMAX>(dOs, d_out + q_off, g.q_st, q1 - q0, D, vq, 1.f);
  if constexpr (SEG) g.load_ids(qids, b, q0, BQ, g.Tq, false);
  float lse2[RQ], dl[RQ], acc[RQ][4 * NC];
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const i64 qi = q0 + rg + kRowGroups * i;
    const i64 at = (b * g.H + h) * g.Tq + qi;
    lse2[i] = qi < g.Tq ? lse[at] * kLog2e : 0.f;
    dl[i] = qi < g.Tq ? delta[at] : 0.f;
#pragma unroll
    for (int c = 0; c < 4 * NC; ++c) acc[i][c] = 0.f;
  }
  i64 lo, hi;
  g.keys_of(q0, q1, lo, hi);
  for (i64 k0 = lo / BK * BK; k0 < hi; k0 += BK) {
    const i64 k1 = imin(k0 + BK, g.Tk);
    __syncthreads();  // the previous tile's dS K is done with Ks and dS
    if constexpr (!ONE) load_tile<T, BK, DMAX>(Ks, kb + k0 * g.k_st, g.k_st, k1 - k0, D, vk, 1.f);
    if constexpr (SEG) g.load_ids(kids, b, k0, BK, k1, true);
    load_tile<T, BK, DMAX>(Vs, vb + k0 * g.k_st, g.k_st, k1 - k0, D, vk, 1.f);
    __syncthreads();
    float s[RQ][CK], dp[RQ][CK];
    if constexpr (ONE) {
      dot_tile<RQ, CK, LD>(dp, dOs, Vs, D4);
      __syncthreads();  // every thread is done with V
      load_tile<T, BK, DMAX>(Ks, kb + k0 * g.k_st, g.k_st, k1 - k0, D, vk, 1.f);
      __syncthreads();
      dot_tile<RQ, CK, LD>(s, Qs, Ks, D4);
    } else {
      dot_tile<RQ, CK, LD>(s, Qs, Ks, D4);
      dot_tile<RQ, CK, LD>(dp, dOs, Vs, D4);
    }
    with_softcap(g, [&](auto capped) {
#pragma unroll
      for (int i = 0; i < RQ; ++i) {
        const i64 qi = q0 + rg + kRowGroups * i;
#pragma unroll
        for (int j = 0; j < CK; ++j) {
          const i64 kj = k0 + cg + kColGroups * j;
          float ds = 0.f;
          if (qi < g.Tq && kj < k1 && g.allowed(qi, kj)) {
            float x = s[i][j], slope;
            if constexpr (decltype(capped)::value) x = g.capped(x, slope);
            ds = exp2f(x - lse2[i]) * (dp[i][j] - dl[i]);
            if constexpr (decltype(capped)::value) ds *= slope;
          }
          dS[(rg + kRowGroups * i) * PLD + cg + kColGroups * j] = ds;
        }
      }
    });
    if constexpr (SEG) {  // the keys of other examples: nothing (each thread its own entries)
#pragma unroll
      for (int i = 0; i < RQ; ++i) {
        const int id = qids[rg + kRowGroups * i];
#pragma unroll
        for (int j = 0; j < CK; ++j)
          if (kids[cg + kColGroups * j] != id) dS[(rg + kRowGroups * i) * PLD + cg + kColGroups * j] = 0.f;
      }
    }
    __syncthreads();
    pm_tile<RQ, NC, LD, PLD, BK>(acc, dS, Ks, D);
  }
  float scale[RQ];
#pragma unroll
  for (int i = 0; i < RQ; ++i) scale[i] = g.scale;
  store_rows<T, RQ, NC>(d_q + q_off, g.q_st, q1 - q0, acc, scale, D, vd);
}

template <typename T, bool SEG = false>
__device__ void fwd(const Geometry& g, const T* q, const T* k, const T* v, T* out, float* lse, float* smem) {
  if (g.D <= 64) attention_fwd<T, 64, SEG>(g, q, k, v, out, lse, smem);
  else attention_fwd<T, 128, SEG>(g, q, k, v, out, lse, smem);
}

template <typename T, bool SEG = false>
__device__ void dkdv(const Geometry& g, const T* d_out, const T* q, const T* k, const T* v, const float* lse,
                     const float* delta, T* d_k, T* d_v, float* smem) {
  if (g.D <= 64) attention_dkdv<T, 64, SEG>(g, d_out, q, k, v, lse, delta, d_k, d_v, smem);
  else attention_dkdv<T, 128, SEG>(g, d_out, q, k, v, lse, delta, d_k, d_v, smem);
}

template <typename T, bool SEG = false>
__device__ void dq(const Geometry& g, const T* d_out, const T* q, const T* k, const T* v, const float* lse,
                   const float* delta, T* d_q, float* smem) {
  if (g.D <= 64) attention_dq<T, 64, SEG>(g, d_out, q, k, v, lse, delta, d_q, smem);
  else attention_dq<T, 128, SEG>(g, d_out, q, k, v, lse, delta, d_q, smem);
}

}  // namespace

// The geometry parameters of every attention kernel but the delta one, in order (kernels/cuda.py):
// i64 B, H, Hkv, T, S, D, q_sb, q_sh, q_st, k_sb, k_sh, k_st; f32 scale; i32 causal; i64 window;
// f32 softcap (c > 0, or 0: none).
#define MDSL_GEOMETRY                                                                                  \
  Geometry{B, H, Hkv, T, S, D, q_sb, q_sh, q_st, k_sb, k_sh, k_st, scale, causal, window,               \
           softcap > 0.f ? softcap * kLog2e : 0.f, softcap > 0.f ? 1.f / (softcap * kLog2e) : 0.f}
// The *_seg_* kernels' geometry: the same, then ptr segments.
#define MDSL_SEG_GEOMETRY                                                                              \
  Geometry{B, H, Hkv, T, S, D, q_sb, q_sh, q_st, k_sb, k_sh, k_st, scale, causal, window,               \
           softcap > 0.f ? softcap * kLog2e : 0.f, softcap > 0.f ? 1.f / (softcap * kLog2e) : 0.f,     \
           segments}

extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_fwd_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, i64 B, i64 H, i64 Hkv,
                        i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale,
                        int causal, i64 window, float softcap) {
  __shared__ float4 smem[kFwdShared / 4];
  fwd(MDSL_GEOMETRY, q, k, v, out, lse, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_fwd_f32(const float* q, const float* k, const float* v, float* out, float* lse, i64 B, i64 H, i64 Hkv,
                       i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale,
                       int causal, i64 window, float softcap) {
  __shared__ float4 smem[kFwdShared / 4];
  fwd(MDSL_GEOMETRY, q, k, v, out, lse, reinterpret_cast<float*>(smem));
}

extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_pre_bf16(const bf16* d_out, const bf16* out, float* delta, i64 B, i64 H, i64 T, i64 D, i64 q_sb,
                            i64 q_sh, i64 q_st) {
  attention_delta(d_out, out, delta, B, H, T, D, q_sb, q_sh, q_st);
}
extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_pre_f32(const float* d_out, const float* out, float* delta, i64 B, i64 H, i64 T, i64 D, i64 q_sb,
                           i64 q_sh, i64 q_st) {
  attention_delta(d_out, out, delta, B, H, T, D, q_sb, q_sh, q_st);
}

extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_dkdv_bf16(const bf16* d_out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                             const float* delta, bf16* d_k, bf16* d_v, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D,
                             i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal,
                             i64 window, float softcap) {
  __shared__ float4 smem[kDkdvShared / 4];
  dkdv(MDSL_GEOMETRY, d_out, q, k, v, lse, delta, d_k, d_v, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_dkdv_f32(const float* d_out, const float* q, const float* k, const float* v, const float* lse,
                            const float* delta, float* d_k, float* d_v, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D,
                            i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal,
                            i64 window, float softcap) {
  __shared__ float4 smem[kDkdvShared / 4];
  dkdv(MDSL_GEOMETRY, d_out, q, k, v, lse, delta, d_k, d_v, reinterpret_cast<float*>(smem));
}

extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_dq_bf16(const bf16* d_out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                           const float* delta, bf16* d_q, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb,
                           i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal, i64 window,
                           float softcap) {
  __shared__ float4 smem[kDqShared / 4];
  dq(MDSL_GEOMETRY, d_out, q, k, v, lse, delta, d_q, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_dq_f32(const float* d_out, const float* q, const float* k, const float* v, const float* lse,
                          const float* delta, float* d_q, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb,
                          i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal, i64 window,
                           float softcap) {
  __shared__ float4 smem[kDqShared / 4];
  dq(MDSL_GEOMETRY, d_out, q, k, v, lse, delta, d_q, reinterpret_cast<float*>(smem));
}

// D > 128 (DMAX = 256): the same parameters.
extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_fwd_d256_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, i64 B, i64 H,
                             i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh,
                             i64 k_st, float scale, int causal, i64 window, float softcap) {
  __shared__ float4 smem[fwd_floats(256) / 4];
  attention_fwd<bf16, 256>(MDSL_GEOMETRY, q, k, v, out, lse, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_fwd_d256_f32(const float* q, const float* k, const float* v, float* out, float* lse, i64 B, i64 H,
                            i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh,
                            i64 k_st, float scale, int causal, i64 window, float softcap) {
  __shared__ float4 smem[fwd_floats(256) / 4];
  attention_fwd<float, 256>(MDSL_GEOMETRY, q, k, v, out, lse, reinterpret_cast<float*>(smem));
}

extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_dkdv_d256_bf16(const bf16* d_out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                  const float* delta, bf16* d_k, bf16* d_v, i64 B, i64 H, i64 Hkv, i64 T, i64 S,
                                  i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale,
                                  int causal, i64 window, float softcap) {
  __shared__ float4 smem[dkdv_floats(256) / 4];
  attention_dkdv<bf16, 256>(MDSL_GEOMETRY, d_out, q, k, v, lse, delta, d_k, d_v, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_dkdv_d256_f32(const float* d_out, const float* q, const float* k, const float* v,
                                 const float* lse, const float* delta, float* d_k, float* d_v, i64 B, i64 H, i64 Hkv,
                                 i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st,
                                 float scale, int causal, i64 window, float softcap) {
  __shared__ float4 smem[dkdv_floats(256) / 4];
  attention_dkdv<float, 256>(MDSL_GEOMETRY, d_out, q, k, v, lse, delta, d_k, d_v, reinterpret_cast<float*>(smem));
}

extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_dq_d256_bf16(const bf16* d_out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                const float* delta, bf16* d_q, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb,
                                i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal,
                                i64 window, float softcap) {
  __shared__ float4 smem[dq_floats(256) / 4];
  attention_dq<bf16, 256>(MDSL_GEOMETRY, d_out, q, k, v, lse, delta, d_q, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128)
mdsl_attention_bwd_dq_d256_f32(const float* d_out, const float* q, const float* k, const float* v, const float* lse,
                               const float* delta, float* d_q, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb,
                               i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal,
                               i64 window, float softcap) {
  __shared__ float4 smem[dq_floats(256) / 4];
  attention_dq<float, 256>(MDSL_GEOMETRY, d_out, q, k, v, lse, delta, d_q, reinterpret_cast<float*>(smem));
}


// Packed rows (segment ids): the kernels above with SEG = true, the ids after their parameters and
// in shared memory after the tiles. At least one block per SM (launch bounds 128, 1): ptxas may then
// give the id tests the registers they need instead of spilling.
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_fwd_seg_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, i64 B, i64 H, i64 Hkv,
                            i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st,
                            float scale, int causal, i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(kFwdShared + kSegInts) / 4];
  fwd<bf16, true>(MDSL_SEG_GEOMETRY, q, k, v, out, lse, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_fwd_seg_f32(const float* q, const float* k, const float* v, float* out, float* lse, i64 B, i64 H,
                           i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st,
                           float scale, int causal, i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(kFwdShared + kSegInts) / 4];
  fwd<float, true>(MDSL_SEG_GEOMETRY, q, k, v, out, lse, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_bwd_dkdv_seg_bf16(const bf16* d_out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                 const float* delta, bf16* d_k, bf16* d_v, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D,
                                 i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal,
                                 i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(kDkdvShared + kSegInts) / 4];
  dkdv<bf16, true>(MDSL_SEG_GEOMETRY, d_out, q, k, v, lse, delta, d_k, d_v, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_bwd_dkdv_seg_f32(const float* d_out, const float* q, const float* k, const float* v, const float* lse,
                                const float* delta, float* d_k, float* d_v, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D,
                                i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal,
                                i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(kDkdvShared + kSegInts) / 4];
  dkdv<float, true>(MDSL_SEG_GEOMETRY, d_out, q, k, v, lse, delta, d_k, d_v, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_bwd_dq_seg_bf16(const bf16* d_out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                               const float* delta, bf16* d_q, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb,
                               i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal, i64 window,
                               float softcap, const int* segments) {
  __shared__ float4 smem[(kDqShared + kSegInts) / 4];
  dq<bf16, true>(MDSL_SEG_GEOMETRY, d_out, q, k, v, lse, delta, d_q, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_bwd_dq_seg_f32(const float* d_out, const float* q, const float* k, const float* v, const float* lse,
                              const float* delta, float* d_q, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb,
                              i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal, i64 window,
                              float softcap, const int* segments) {
  __shared__ float4 smem[(kDqShared + kSegInts) / 4];
  dq<float, true>(MDSL_SEG_GEOMETRY, d_out, q, k, v, lse, delta, d_q, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_fwd_d256_seg_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse, i64 B, i64 H,
                                 i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh,
                                 i64 k_st, float scale, int causal, i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(fwd_floats(256) + kSegInts) / 4];
  attention_fwd<bf16, 256, true>(MDSL_SEG_GEOMETRY, q, k, v, out, lse, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_fwd_d256_seg_f32(const float* q, const float* k, const float* v, float* out, float* lse, i64 B, i64 H,
                                i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh,
                                i64 k_st, float scale, int causal, i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(fwd_floats(256) + kSegInts) / 4];
  attention_fwd<float, 256, true>(MDSL_SEG_GEOMETRY, q, k, v, out, lse, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_bwd_dkdv_d256_seg_bf16(const bf16* d_out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                      const float* delta, bf16* d_k, bf16* d_v, i64 B, i64 H, i64 Hkv, i64 T, i64 S,
                                      i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale,
                                      int causal, i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(dkdv_floats(256) + kSegInts) / 4];
  attention_dkdv<bf16, 256, true>(MDSL_SEG_GEOMETRY, d_out, q, k, v, lse, delta, d_k, d_v,
                                  reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_bwd_dkdv_d256_seg_f32(const float* d_out, const float* q, const float* k, const float* v,
                                     const float* lse, const float* delta, float* d_k, float* d_v, i64 B, i64 H,
                                     i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb, i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh,
                                     i64 k_st, float scale, int causal, i64 window, float softcap,
                                     const int* segments) {
  __shared__ float4 smem[(dkdv_floats(256) + kSegInts) / 4];
  attention_dkdv<float, 256, true>(MDSL_SEG_GEOMETRY, d_out, q, k, v, lse, delta, d_k, d_v,
                                   reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_bwd_dq_d256_seg_bf16(const bf16* d_out, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                                    const float* delta, bf16* d_q, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb,
                                    i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal,
                                    i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(dq_floats(256) + kSegInts) / 4];
  attention_dq<bf16, 256, true>(MDSL_SEG_GEOMETRY, d_out, q, k, v, lse, delta, d_q, reinterpret_cast<float*>(smem));
}
extern "C" __global__ void __launch_bounds__(128, 1)
mdsl_attention_bwd_dq_d256_seg_f32(const float* d_out, const float* q, const float* k, const float* v, const float* lse,
                                   const float* delta, float* d_q, i64 B, i64 H, i64 Hkv, i64 T, i64 S, i64 D, i64 q_sb,
                                   i64 q_sh, i64 q_st, i64 k_sb, i64 k_sh, i64 k_st, float scale, int causal,
                                   i64 window, float softcap, const int* segments) {
  __shared__ float4 smem[(dq_floats(256) + kSegInts) / 4];
  attention_dq<float, 256, true>(MDSL_SEG_GEOMETRY, d_out, q, k, v, lse, delta, d_q, reinterpret_cast<float*>(smem));
}

#undef MDSL_SEG_GEOMETRY
#undef MDSL_GEOMETRY
