// Casts between fp32, bf16 and fp16 (kernels/reference.py: cast), rounding to
// nearest even as ml_dtypes and PyTorch do; and dequantize (kernels/reference.py:
// dequantize): fp8 e4m3 / e5m2 values (decoded bit by bit, exactly) times their
// row's fp32 scale, one float32 multiply, stored as fp32 or rounded once to bf16.
// Its launch: block (256, 1, 1), grid (min(ceil(n / 256), 65536), 1, 1), one
// element per thread per step of a grid-stride loop.
//
// Launch (kernels/cuda.py: cast_config): block (256, 1, 1), grid
// (min(ceil(n / (256 * 8)), 65536), 1, 1) with a grid-stride loop over chunks of
// 8 elements (16-byte loads of 16-bit types, two of fp32); no dynamic shared
// memory. A scalar tail handles n % 8 and unaligned pointers.
#include "common.cuh"

using namespace mdsl;

namespace {

template <typename S, typename D>
__device__ void cast(const S* x, D* out, i64 n) {
  constexpr int C = 8;  // elements per chunk
  constexpr int VS = kVec<S> < C ? kVec<S> : C, VD = kVec<D> < C ? kVec<D> : C;
  const i64 tid = (i64) blockIdx.x * blockDim.x + threadIdx.x, stride = (i64) gridDim.x * blockDim.x;
  const i64 chunks = (aligned16(x) && aligned16(out)) ? n / C : 0;
  for (i64 i = tid; i < chunks; i += stride) {
    float t[C];
#pragma unroll
    for (int j = 0; j < C; j += VS) load<S, VS>(x + i * C + j, t + j);
#pragma unroll
    for (int j = 0; j < C; j += VD) store<D, VD>(out + i * C + j, t + j);
  }
  for (i64 e = chunks * C + tid; e < n; e += stride) out[e] = from_f32<D>(to_f32(x[e]));
}

// The float value of an fp8 code: e4m3fn (bias 7, no infinities, S.1111.111 NaN) or e5m2 (bias
// 15, IEEE-like). Normal values are built from their bits, subnormals as m * 2^-9 (2^-16): exact.
__device__ __forceinline__ float e4m3_to_f32(unsigned char v) {
  const unsigned s = v >> 7, e = (v >> 3) & 15u, m = v & 7u;
  float mag;
  if (e == 15u && m == 7u) mag = __int_as_float(0x7fc00000);
  else mag = e == 0u ? (float) m * 0.001953125f : __int_as_float((int) (((e + 120u) << 23) | (m << 20)));
  return s ? -mag : mag;
}

__device__ __forceinline__ float e5m2_to_f32(unsigned char v) {
  const unsigned s = v >> 7, e = (v >> 2) & 31u, m = v & 3u;
  float mag;
  if (e == 31u) mag = __int_as_float(m ? 0x7fc00000 : 0x7f800000);
  else mag = e == 0u ? (float) m * 0.0000152587890625f : __int_as_float((int) (((e + 112u) << 23) | (m << 21)));
  return s ? -mag : mag;
}

template <float (*Decode)(unsigned char), typename D>
__device__ void dequantize(const unsigned char* q, const float* scale, D* out, i64 n, i64 cols) {
  const i64 stride = (i64) gridDim.x * blockDim.x;
  for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f32<D>(Decode(q[i]) * scale[i / cols]);
}

}  // namespace

extern "C" __global__ void mdsl_dequantize_e4m3_to_f32(const unsigned char* q, const float* scale, float* out, i64 n,
                                                        i64 cols) {
  dequantize<e4m3_to_f32>(q, scale, out, n, cols);
}
extern "C" __global__ void mdsl_dequantize_e4m3_to_bf16(const unsigned char* q, const float* scale, bf16* out, i64 n,
                                                         i64 cols) {
  dequantize<e4m3_to_f32>(q, scale, out, n, cols);
}
extern "C" __global__ void mdsl_dequantize_e5m2_to_f32(const unsigned char* q, const float* scale, float* out, i64 n,
                                                        i64 cols) {
  dequantize<e5m2_to_f32>(q, scale, out, n, cols);
}
extern "C" __global__ void mdsl_dequantize_e5m2_to_bf16(const unsigned char* q, const float* scale, bf16* out, i64 n,
                                                         i64 cols) {
  dequantize<e5m2_to_f32>(q, scale, out, n, cols);
}

extern "C" __global__ void mdsl_cast_f32_to_bf16(const float* x, bf16* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_bf16_to_f32(const bf16* x, float* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_f32_to_f16(const float* x, f16* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_f16_to_f32(const f16* x, float* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_bf16_to_f16(const bf16* x, f16* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_f16_to_bf16(const f16* x, bf16* out, i64 n) { cast(x, out, n); }
