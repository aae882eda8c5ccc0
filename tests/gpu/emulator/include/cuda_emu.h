// A small CPU stand-in for the CUDA device runtime, so the kernels of kernels/*.cu can be
// compiled with g++ and run on the CPU (tests/gpu/emulator/emulator.py). Each block runs
// its threads as real threads (so __syncthreads and warp shuffles behave), one block at
// a time, which makes `__shared__` (here: static) variables per block. Slow; for
// checking kernel logic where no GPU is at hand, not for timing.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

using std::isinf;
using std::isnan;

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

namespace emu {
void sync_block();
void exchange(const void* value, void* out, int bytes, int lane_mask);
}  // namespace emu

inline void __syncthreads() { emu::sync_block(); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T value, int lane_mask, int = 32) {
  T out;
  emu::exchange(&value, &out, sizeof(T), lane_mask);
  return out;
}

inline float atomicAdd(float* address, float value) { return std::atomic_ref<float>(*address).fetch_add(value); }

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
}
inline int __float_as_int(float f) {
  int i;
  memcpy(&i, &f, sizeof i);
  return i;
}

// bf16 and fp16 storage, converted with round to nearest even
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t) h.bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t) ((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(uint16_t) (u >> 16)};
}
struct __half {
  _Float16 value;
};
inline float __half2float(__half h) { return (float) h.value; }
inline __half __float2half_rn(float f) { return {(_Float16) f}; }
