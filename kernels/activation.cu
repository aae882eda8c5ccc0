// Activations, forward and backward (kernels/reference.py: swiglu, geglu, silu,
// relu, relu2, gelu and their *_backward), and exp, log, tanh, sigmoid, rsqrt (forward
// only), elementwise over n elements.
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

// Packed gate/up (fused_split_*): gate_up is [rows, 2F], gate then up along each row; out and
// d_out are [rows, F], d_gate_up is packed as gate_up. Element (r, j) of a half is gate_up[r * 2F + j]
// (gate) and gate_up[r * 2F + F + j] (up). Vectors of V elements when F % V == 0 and every pointer
// is aligned (a vector never crosses a row), else one element at a time. Each thread reads its
// gate and up elements before writing their gradients at the same places (d_gate_up may alias gate_up).
template <typename T, int V, typename F>
__device__ __forceinline__ void map_packed(const T* d_out, const T* gate_up, T* out, T* d_gate_up, i64 rows, i64 width,
                                           F f) {
  const i64 per_row = width / V;
  const i64 stride = (i64) gridDim.x * blockDim.x;
  for (i64 u = (i64) blockIdx.x * blockDim.x + threadIdx.x; u < rows * per_row; u += stride) {
    const i64 r = u / per_row, j = (u - r * per_row) * V;
    const i64 g = r * 2 * width + j, h = r * width + j;
    float gate[V], up[V], d[V], y0[V], y1[V];
    load<T, V>(gate_up + g, gate);
    load<T, V>(gate_up + g + width, up);
    if (d_out != nullptr) load<T, V>(d_out + h, d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float a[3] = {d_out != nullptr ? d[k] : 0.f, gate[k], up[k]};
      float y[2];
      f(a, y);
      y0[k] = y[0];
      y1[k] = y[1];
    }
    if (d_out == nullptr) {
      store<T, V>(out + h, y0);
    } else {
      store<T, V>(d_gate_up + g, y0);
      store<T, V>(d_gate_up + g + width, y1);
    }
  }
}

// f(a = {d_out, gate, up}, y): the forward writes y[0]; the backward y[0] = d_gate, y[1] = d_up.
template <typename T, typename F>
__device__ void packed_gated(const T* d_out, const T* gate_up, T* out, T* d_gate_up, i64 rows, i64 width, F f) {
  constexpr int V = kVec<T>;
  const bool vec = width % V == 0 && aligned16(gate_up) && aligned16(d_out != nullptr ? (const void*) d_out : out) &&
                   (d_gate_up == nullptr || aligned16(d_gate_up));
  if (vec) map_packed<T, V>(d_out, gate_up, out, d_gate_up, rows, width, f);
  else map_packed<T, 1>(d_out, gate_up, out, d_gate_up, rows, width, f);
}

template <typename T> __device__ void split_swiglu_fwd(const T* gate_up, T* out, i64 rows, i64 width) {
  packed_gated<T>(nullptr, gate_up, out, nullptr, rows, width, [](const float* a, float* y) {
    y[0] = silu(a[1]) * a[2];
    y[1] = 0.f;
  });
}
template <typename T> __device__ void split_swiglu_bwd(const T* d_out, const T* gate_up, T* d_gate_up, i64 rows, i64 width) {
  packed_gated<T>(d_out, gate_up, nullptr, d_gate_up, rows, width, [](const float* a, float* y) {
    y[0] = a[0] * a[2] * silu_grad(a[1]);
    y[1] = a[0] * silu(a[1]);
  });
}
template <typename T> __device__ void split_geglu_fwd(const T* gate_up, T* out, i64 rows, i64 width) {
  packed_gated<T>(nullptr, gate_up, out, nullptr, rows, width, [](const float* a, float* y) {
    y[0] = gelu(a[1], 0) * a[2];
    y[1] = 0.f;
  });
}
template <typename T> __device__ void split_geglu_bwd(const T* d_out, const T* gate_up, T* d_gate_up, i64 rows, i64 width) {
  packed_gated<T>(d_out, gate_up, nullptr, d_gate_up, rows, width, [](const float* a, float* y) {
    y[0] = a[0] * a[2] * gelu_grad(a[1], 0);
    y[1] = a[0] * gelu(a[1], 0);
  });
}

}  // namespace

// fused_split_swiglu / fused_split_geglu (exact GELU): out = act(gate) * up of gate_up's halves;
// their backwards write d_gate_up packed. width = F, the gated width (gate_up's last dim is 2F).
extern "C" __global__ void mdsl_split_swiglu_fwd_bf16(const bf16* gate_up, bf16* out, i64 rows, i64 width) {
  split_swiglu_fwd(gate_up, out, rows, width);
}
extern "C" __global__ void mdsl_split_swiglu_fwd_f32(const float* gate_up, float* out, i64 rows, i64 width) {
  split_swiglu_fwd(gate_up, out, rows, width);
}
extern "C" __global__ void mdsl_split_swiglu_bwd_bf16(const bf16* d_out, const bf16* gate_up, bf16* d_gate_up, i64 rows,
                                        i64 width) {
  split_swiglu_bwd(d_out, gate_up, d_gate_up, rows, width);
}
extern "C" __global__ void mdsl_split_swiglu_bwd_f32(const float* d_out, const float* gate_up, float* d_gate_up, i64 rows,
                                        i64 width) {
  split_swiglu_bwd(d_out, gate_up, d_gate_up, rows, width);
}
extern "C" __global__ void mdsl_split_geglu_fwd_bf16(const bf16* gate_up, bf16* out, i64 rows, i64 width) {
  split_geglu_fwd(gate_up, out, rows, width);
}
extern "C" __global__ void mdsl_split_geglu_fwd_f32(const float* gate_up, float* out, i64 rows, i64 width) {
  split_geglu_fwd(gate_up, out, rows, width);
}
extern "C" __global__ void mdsl_split_geglu_bwd_bf16(const bf16* d_out, const bf16* gate_up, bf16* d_gate_up, i64 rows,
                                        i64 width) {
  split_geglu_bwd(d_out, gate_up, d_gate_up, rows, width);
}
extern "C" __global__ void mdsl_split_geglu_bwd_f32(const float* d_out, const float* gate_up, float* d_gate_up, i64 rows,
                                        i64 width) {
  split_geglu_bwd(d_out, gate_up, d_gate_up, rows, width);
}

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

// The elementwise math of hand-written functions (forward only: their VJPs are other primitives).
#define MDSL_MATH(NAME, FWD)                                                                                 \
  template <typename T> __device__ void NAME##_fwd(const T* x, T* out, i64 n) {                                \
    map_elements<T, 1, 1>(n, {x}, {out}, [](const float* a, float* y) { const float x = a[0]; y[0] = (FWD); }); \
  }

MDSL_MATH(exp, expf(x))
MDSL_MATH(log, logf(x))
MDSL_MATH(tanh, tanhf(x))
MDSL_MATH(sigmoid, sigmoid(x))
MDSL_MATH(rsqrt, 1.f / sqrtf(x))  // as the reference (rsqrtf is an approximation on the device)
#undef MDSL_MATH

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
// out = exp(x), log(x), tanh(x), sigmoid(x), 1 / sqrt(x)
extern "C" __global__ void mdsl_exp_fwd_bf16(const bf16* x, bf16* out, i64 n) { exp_fwd(x, out, n); }
extern "C" __global__ void mdsl_exp_fwd_f32(const float* x, float* out, i64 n) { exp_fwd(x, out, n); }
extern "C" __global__ void mdsl_log_fwd_bf16(const bf16* x, bf16* out, i64 n) { log_fwd(x, out, n); }
extern "C" __global__ void mdsl_log_fwd_f32(const float* x, float* out, i64 n) { log_fwd(x, out, n); }
extern "C" __global__ void mdsl_tanh_fwd_bf16(const bf16* x, bf16* out, i64 n) { tanh_fwd(x, out, n); }
extern "C" __global__ void mdsl_tanh_fwd_f32(const float* x, float* out, i64 n) { tanh_fwd(x, out, n); }
extern "C" __global__ void mdsl_sigmoid_fwd_bf16(const bf16* x, bf16* out, i64 n) { sigmoid_fwd(x, out, n); }
extern "C" __global__ void mdsl_sigmoid_fwd_f32(const float* x, float* out, i64 n) { sigmoid_fwd(x, out, n); }
extern "C" __global__ void mdsl_rsqrt_fwd_bf16(const bf16* x, bf16* out, i64 n) { rsqrt_fwd(x, out, n); }
extern "C" __global__ void mdsl_rsqrt_fwd_f32(const float* x, float* out, i64 n) { rsqrt_fwd(x, out, n); }
