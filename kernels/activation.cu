// Activations, forward and backward (kernels/reference.py: swiglu, geglu, silu,
// relu, relu2, gelu and their *_backward), elementwise over n elements.
//
// Launch (kernels/cuda.py: elementwise_config): block (256, 1, 1), grid
// (min(ceil(n / (256 * vector width)), 65536), 1, 1) with a grid-stride loop;
// no dynamic shared memory. 16-byte vectors when every pointer is aligned,
// then a scalar tail. Outputs may alias inputs (in place).
#include "common.cuh"

using namespace mdsl;

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK = 0.044715f;
constexpr float kSqrt2 = 1.4142135623730951f;
constexpr float kSqrt2Pi = 2.5066282746310002f;  // sqrt(2 pi)

__device__ __forceinline__ float sigmoid(float x) {  // the reference's overflow-free form
  const float e = expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}
__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }
__device__ __forceinline__ float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.f + x * (1.f - s));
}
__device__ __forceinline__ float gelu(float x, int approximate) {
  if (approximate) return 0.5f * x * (1.f + tanhf(kGeluC * (x + kGeluK * (x * x * x))));
  return 0.5f * x * (1.f + erff(x / kSqrt2));
}
__device__ __forceinline__ float gelu_grad(float x, int approximate) {
  if (approximate) {
    const float t = tanhf(kGeluC * (x + kGeluK * (x * x * x)));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluK * x * x);
  }
  const float cdf = 0.5f * (1.f + erff(x / kSqrt2));
  return cdf + x * expf(-0.5f * x * x) / kSqrt2Pi;
}
__device__ __forceinline__ float relu(float x) { return (x > 0.f || x != x) ? x : 0.f; }  // NaN stays NaN

template <typename T> __device__ void swiglu_fwd(const T* gate, const T* up, T* out, i64 n) {
  map_elements<T, 2, 1>(n, {gate, up}, {out}, [](const float* a, float* y) { y[0] = silu(a[0]) * a[1]; });
}
template <typename T> __device__ void swiglu_bwd(const T* d_out, const T* gate, const T* up, T* d_gate, T* d_up, i64 n) {
  map_elements<T, 3, 2>(n, {d_out, gate, up}, {d_gate, d_up}, [](const float* a, float* y) {
    y[0] = a[0] * a[2] * silu_grad(a[1]);
    y[1] = a[0] * silu(a[1]);
  });
}
template <typename T> __device__ void geglu_fwd(const T* gate, const T* up, T* out, i64 n, int approximate) {
  map_elements<T, 2, 1>(n, {gate, up}, {out},
                        [=](const float* a, float* y) { y[0] = gelu(a[0], approximate) * a[1]; });
}
template <typename T>
__device__ void geglu_bwd(const T* d_out, const T* gate, const T* up, T* d_gate, T* d_up, i64 n, int approximate) {
  map_elements<T, 3, 2>(n, {d_out, gate, up}, {d_gate, d_up}, [=](const float* a, float* y) {
    y[0] = a[0] * a[2] * gelu_grad(a[1], approximate);
    y[1] = a[0] * gelu(a[1], approximate);
  });
}

}  // namespace

// out = silu(gate) * up
extern "C" __global__ void mdsl_swiglu_fwd_bf16(const bf16* gate, const bf16* up, bf16* out, i64 n) { swiglu_fwd(gate, up, out, n); }
extern "C" __global__ void mdsl_swiglu_fwd_f32(const float* gate, const float* up, float* out, i64 n) { swiglu_fwd(gate, up, out, n); }
// d_gate = d_out * up * silu'(gate), d_up = d_out * silu(gate)
extern "C" __global__ void mdsl_swiglu_bwd_bf16(const bf16* d_out, const bf16* gate, const bf16* up, bf16* d_gate, bf16* d_up, i64 n) {
  swiglu_bwd(d_out, gate, up, d_gate, d_up, n);
}
extern "C" __global__ void mdsl_swiglu_bwd_f32(const float* d_out, const float* gate, const float* up, float* d_gate, float* d_up, i64 n) {
  swiglu_bwd(d_out, gate, up, d_gate, d_up, n);
}
// out = gelu(gate) * up (tanh approximation when approximate != 0, else erf)
extern "C" __global__ void mdsl_geglu_fwd_bf16(const bf16* gate, const bf16* up, bf16* out, i64 n, int approximate) {
  geglu_fwd(gate, up, out, n, approximate);
}
extern "C" __global__ void mdsl_geglu_fwd_f32(const float* gate, const float* up, float* out, i64 n, int approximate) {
  geglu_fwd(gate, up, out, n, approximate);
}
// d_gate = d_out * up * gelu'(gate), d_up = d_out * gelu(gate)
extern "C" __global__ void mdsl_geglu_bwd_bf16(const bf16* d_out, const bf16* gate, const bf16* up, bf16* d_gate, bf16* d_up, i64 n,
                                               int approximate) {
  geglu_bwd(d_out, gate, up, d_gate, d_up, n, approximate);
}
extern "C" __global__ void mdsl_geglu_bwd_f32(const float* d_out, const float* gate, const float* up, float* d_gate, float* d_up,
                                              i64 n, int approximate) {
  geglu_bwd(d_out, gate, up, d_gate, d_up, n, approximate);
}

// Single-input activations: out = f(x); backward d_x = d_out * f'(x).
#define MDSL_UNARY(NAME, FWD, BWD)                                                                             \
  template <typename T> __device__ void NAME##_fwd(const T* x, T* out, i64 n) {                                \
    map_elements<T, 1, 1>(n, {x}, {out}, [](const float* a, float* y) { const float x = a[0]; y[0] = (FWD); }); \
  }                                                                                                          \
  template <typename T> __device__ void NAME##_bwd(const T* d_out, const T* x, T* d_x, i64 n) {                \
    map_elements<T, 2, 1>(n, {d_out, x}, {d_x}, [](const float* a, float* y) {                                 \
      const float d = a[0], x = a[1];                                                                        \
      y[0] = (BWD);                                                                                          \
    });                                                                                                      \
  }

MDSL_UNARY(silu, silu(x), d * silu_grad(x))
MDSL_UNARY(relu, relu(x), x > 0.f ? d : 0.f)
MDSL_UNARY(relu2, relu(x) * relu(x), d * 2.f * relu(x))
#undef MDSL_UNARY

extern "C" __global__ void mdsl_silu_fwd_bf16(const bf16* x, bf16* out, i64 n) { silu_fwd(x, out, n); }
extern "C" __global__ void mdsl_silu_fwd_f32(const float* x, float* out, i64 n) { silu_fwd(x, out, n); }
extern "C" __global__ void mdsl_silu_bwd_bf16(const bf16* d_out, const bf16* x, bf16* d_x, i64 n) { silu_bwd(d_out, x, d_x, n); }
extern "C" __global__ void mdsl_silu_bwd_f32(const float* d_out, const float* x, float* d_x, i64 n) { silu_bwd(d_out, x, d_x, n); }
extern "C" __global__ void mdsl_relu_fwd_bf16(const bf16* x, bf16* out, i64 n) { relu_fwd(x, out, n); }
extern "C" __global__ void mdsl_relu_fwd_f32(const float* x, float* out, i64 n) { relu_fwd(x, out, n); }
extern "C" __global__ void mdsl_relu_bwd_bf16(const bf16* d_out, const bf16* x, bf16* d_x, i64 n) { relu_bwd(d_out, x, d_x, n); }
extern "C" __global__ void mdsl_relu_bwd_f32(const float* d_out, const float* x, float* d_x, i64 n) { relu_bwd(d_out, x, d_x, n); }
extern "C" __global__ void mdsl_relu2_fwd_bf16(const bf16* x, bf16* out, i64 n) { relu2_fwd(x, out, n); }
extern "C" __global__ void mdsl_relu2_fwd_f32(const float* x, float* out, i64 n) { relu2_fwd(x, out, n); }
extern "C" __global__ void mdsl_relu2_bwd_bf16(const bf16* d_out, const bf16* x, bf16* d_x, i64 n) { relu2_bwd(d_out, x, d_x, n); }
extern "C" __global__ void mdsl_relu2_bwd_f32(const float* d_out, const float* x, float* d_x, i64 n) { relu2_bwd(d_out, x, d_x, n); }

// gelu (tanh approximation when approximate != 0, else erf) and d_x = d_out * gelu'(x)
template <typename T> __device__ void gelu_fwd(const T* x, T* out, i64 n, int approximate) {
  map_elements<T, 1, 1>(n, {x}, {out}, [=](const float* a, float* y) { y[0] = gelu(a[0], approximate); });
}
template <typename T> __device__ void gelu_bwd(const T* d_out, const T* x, T* d_x, i64 n, int approximate) {
  map_elements<T, 2, 1>(n, {d_out, x}, {d_x}, [=](const float* a, float* y) { y[0] = a[0] * gelu_grad(a[1], approximate); });
}
extern "C" __global__ void mdsl_gelu_fwd_bf16(const bf16* x, bf16* out, i64 n, int approximate) { gelu_fwd(x, out, n, approximate); }
extern "C" __global__ void mdsl_gelu_fwd_f32(const float* x, float* out, i64 n, int approximate) { gelu_fwd(x, out, n, approximate); }
extern "C" __global__ void mdsl_gelu_bwd_bf16(const bf16* d_out, const bf16* x, bf16* d_x, i64 n, int approximate) {
  gelu_bwd(d_out, x, d_x, n, approximate);
}
extern "C" __global__ void mdsl_gelu_bwd_f32(const float* d_out, const float* x, float* d_x, i64 n, int approximate) {
  gelu_bwd(d_out, x, d_x, n, approximate);
}
