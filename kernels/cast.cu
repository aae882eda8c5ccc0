// Casts between fp32, bf16 and fp16 (kernels/reference.py: cast), rounding to
// nearest even as ml_dtypes and PyTorch do.
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

}  // namespace

extern "C" __global__ void mdsl_cast_f32_to_bf16(const float* x, bf16* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_bf16_to_f32(const bf16* x, float* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_f32_to_f16(const float* x, f16* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_f16_to_f32(const f16* x, float* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_bf16_to_f16(const bf16* x, f16* out, i64 n) { cast(x, out, n); }
extern "C" __global__ void mdsl_cast_f16_to_bf16(const f16* x, bf16* out, i64 n) { cast(x, out, n); }
