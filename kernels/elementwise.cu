// Elementwise arithmetic (kernels/reference.py: add, mul, sub, div, scale, add_scalar, add3, bias_add, dropout,
// causal_mask) and
// the in-place add that accumulates gradients (acc += x).
//
// Launch (kernels/cuda.py: elementwise_config): block (256, 1, 1), grid
// (min(ceil(n / (256 * vector width)), 65536), 1, 1) with a grid-stride loop; no
// dynamic shared memory. n is the element count of the output. Outputs may alias
// the first input (in place).
#include "common.cuh"

using namespace mdsl;

namespace {

// out[i] = f(a[i], b[(i / b_inner) % b_n]): b is a's shape or broadcast along it
// (b_n = n, b_inner = 1: the same shape; b_inner = 1: b repeats along the leading
// dims, as a bias; b_inner > 1: each b value covers b_inner consecutive elements,
// as a [.., 1] operand). 16-byte vectors when the pointers are aligned and b's
// pattern keeps whole vectors together, else one element at a time.
template <typename T, typename F>
__device__ void binary(const T* a, const T* b, T* out, i64 n, i64 b_n, i64 b_inner, F f) {
  constexpr int V = kVec<T>;
  const bool same = b_n == n && b_inner == 1;
  const bool vec = aligned16(a) && aligned16(b) && aligned16(out) && (b_inner == 1 ? b_n % V == 0 : b_inner % V == 0);
  const i64 tid = (i64) blockIdx.x * blockDim.x + threadIdx.x, stride = (i64) gridDim.x * blockDim.x;
  const i64 nvec = vec ? n / V : 0;
  for (i64 i = tid; i < nvec; i += stride) {
    const i64 e = i * V;
    float x[V], y[V];
    load<T, V>(a + e, x);
    if (same) {
      load<T, V>(b + e, y);
    } else if (b_inner == 1) {
      load<T, V>(b + e % b_n, y);
    } else {
      const float s = to_f32(b[(e / b_inner) % b_n]);
#pragma unroll
      for (int j = 0; j < V; ++j) y[j] = s;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] = f(x[j], y[j]);
    store<T, V>(out + e, x);
  }
  for (i64 e = nvec * V + tid; e < n; e += stride)
    out[e] = from_f32<T>(f(to_f32(a[e]), to_f32(b[same ? e : (e / b_inner) % b_n])));
}

struct Add {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct Mul {
  __device__ float operator()(float x, float y) const { return x * y; }
};
struct Sub {
  __device__ float operator()(float x, float y) const { return x - y; }
};
struct Div {
  __device__ float operator()(float x, float y) const { return x / y; }
};

template <typename T> __device__ void scale(const T* x, T* out, i64 n, float factor) {
  map_elements<T, 1, 1>(n, {x}, {out}, [=](const float* a, float* y) { y[0] = a[0] * factor; });
}
template <typename T> __device__ void add_scalar(const T* x, T* out, i64 n, float value) {
  map_elements<T, 1, 1>(n, {x}, {out}, [=](const float* a, float* y) { y[0] = a[0] + value; });
}
// Element e of scores [*, Tq, Tk] is key j = e % Tk of query i = (e / Tk) % Tq: masked (set to fill)
// where j > i + offset, or with a window (window > 0) where j <= i + offset - window.
template <typename T>
__device__ void causal_mask(const T* x, T* out, i64 n, i64 Tq, i64 Tk, i64 offset, i64 window, float fill) {
  const i64 tid = (i64) blockIdx.x * blockDim.x + threadIdx.x, stride = (i64) gridDim.x * blockDim.x;
  for (i64 e = tid; e < n; e += stride) {
    const i64 j = e % Tk, last = (e / Tk) % Tq + offset;
    const bool masked = j > last || (window > 0 && j <= last - window);
    out[e] = masked ? from_f32<T>(fill) : x[e];
  }
}
// Dropout (kernels/dropout_mask.py): element e is kept where the top 24 bits of
// mix32(e ^ key) reach threshold, and scaled; the mask is drawn again wherever it is needed. The
// launch's key (seed, offset, layers) comes folded; the step counter (element 0 of step, an int64
// in device memory: none, 0) is folded in here, low half then high half.
__device__ __forceinline__ unsigned mix32(unsigned x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}
__device__ __forceinline__ unsigned fold32(unsigned h, unsigned v) { return mix32(h ^ mix32(v ^ 0x9E3779B9u)); }
template <typename T>
__device__ void dropout(const T* x, const i64* step, T* out, i64 n, int key, int threshold, float scale) {
  const unsigned long long s = step != nullptr ? (unsigned long long) step[0] : 0ull;
  const unsigned k = fold32(fold32((unsigned) key, (unsigned) s), (unsigned) (s >> 32));
  const i64 tid = (i64) blockIdx.x * blockDim.x + threadIdx.x, stride = (i64) gridDim.x * blockDim.x;
  for (i64 e = tid; e < n; e += stride) {
    const unsigned draw = mix32((unsigned) e ^ k) >> 8;
    out[e] = draw >= (unsigned) threshold ? from_f32<T>(to_f32(x[e]) * scale) : from_f32<T>(0.0f);
  }
}
template <typename T> __device__ void add3(const T* a, const T* b, const T* c, T* out, i64 n) {
  map_elements<T, 3, 1>(n, {a, b, c}, {out}, [](const float* x, float* y) { y[0] = x[0] + x[1] + x[2]; });
}

// acc[i] += x[i] for an accumulator of type A and an addend of type X.
template <typename A, typename X>
__device__ void add_inplace(A* acc, const X* x, i64 n) {
  constexpr int V = 4;  // 4 elements: 16 bytes of fp32, 8 of bf16
  const bool vec = aligned(acc, V * sizeof(A)) && aligned(x, V * sizeof(X));
  const i64 tid = (i64) blockIdx.x * blockDim.x + threadIdx.x, stride = (i64) gridDim.x * blockDim.x;
  const i64 nvec = vec ? n / V : 0;
  for (i64 i = tid; i < nvec; i += stride) {
    float s[V], t[V];
    load<A, V>(acc + i * V, s);
    load<X, V>(x + i * V, t);
#pragma unroll
    for (int j = 0; j < V; ++j) s[j] += t[j];
    store<A, V>(acc + i * V, s);
  }
  for (i64 e = nvec * V + tid; e < n; e += stride) acc[e] = from_f32<A>(to_f32(acc[e]) + to_f32(x[e]));
}

}  // namespace

// out = a + b, out = a * b (b the same shape as a or broadcast along it: see binary())
extern "C" __global__ void mdsl_add_bf16(const bf16* a, const bf16* b, bf16* out, i64 n, i64 b_n, i64 b_inner) {
  binary(a, b, out, n, b_n, b_inner, Add());
}
extern "C" __global__ void mdsl_add_f32(const float* a, const float* b, float* out, i64 n, i64 b_n, i64 b_inner) {
  binary(a, b, out, n, b_n, b_inner, Add());
}
extern "C" __global__ void mdsl_mul_bf16(const bf16* a, const bf16* b, bf16* out, i64 n, i64 b_n, i64 b_inner) {
  binary(a, b, out, n, b_n, b_inner, Mul());
}
extern "C" __global__ void mdsl_mul_f32(const float* a, const float* b, float* out, i64 n, i64 b_n, i64 b_inner) {
  binary(a, b, out, n, b_n, b_inner, Mul());
}
// out = a - b, out = a / b (b the same shape as a or broadcast along it; a never broadcast)
extern "C" __global__ void mdsl_sub_bf16(const bf16* a, const bf16* b, bf16* out, i64 n, i64 b_n, i64 b_inner) {
  binary(a, b, out, n, b_n, b_inner, Sub());
}
extern "C" __global__ void mdsl_sub_f32(const float* a, const float* b, float* out, i64 n, i64 b_n, i64 b_inner) {
  binary(a, b, out, n, b_n, b_inner, Sub());
}
extern "C" __global__ void mdsl_div_bf16(const bf16* a, const bf16* b, bf16* out, i64 n, i64 b_n, i64 b_inner) {
  binary(a, b, out, n, b_n, b_inner, Div());
}
extern "C" __global__ void mdsl_div_f32(const float* a, const float* b, float* out, i64 n, i64 b_n, i64 b_inner) {
  binary(a, b, out, n, b_n, b_inner, Div());
}
// out = x + bias[i % N] (bias: [N] along the last dim of x)
extern "C" __global__ void mdsl_bias_add_bf16(const bf16* x, const bf16* bias, bf16* out, i64 n, i64 N) {
  binary(x, bias, out, n, N, 1, Add());
}
extern "C" __global__ void mdsl_bias_add_f32(const float* x, const float* bias, float* out, i64 n, i64 N) {
  binary(x, bias, out, n, N, 1, Add());
}
// out = x * factor
extern "C" __global__ void mdsl_scale_bf16(const bf16* x, bf16* out, i64 n, float factor) { scale(x, out, n, factor); }
extern "C" __global__ void mdsl_scale_f32(const float* x, float* out, i64 n, float factor) { scale(x, out, n, factor); }
// out = x + value
extern "C" __global__ void mdsl_add_scalar_bf16(const bf16* x, bf16* out, i64 n, float value) {
  add_scalar(x, out, n, value);
}
extern "C" __global__ void mdsl_add_scalar_f32(const float* x, float* out, i64 n, float value) {
  add_scalar(x, out, n, value);
}
// out = x with the masked scores of causal attention set to fill (-inf, or 0 for the gradient)
extern "C" __global__ void mdsl_causal_mask_bf16(const bf16* x, bf16* out, i64 n, i64 Tq, i64 Tk, i64 offset,
                                                 i64 window, float fill) {
  causal_mask(x, out, n, Tq, Tk, offset, window, fill);
}
extern "C" __global__ void mdsl_causal_mask_f32(const float* x, float* out, i64 n, i64 Tq, i64 Tk, i64 offset,
                                                i64 window, float fill) {
  causal_mask(x, out, n, Tq, Tk, offset, window, fill);
}
// out = x * mask / (1 - p) with the counter-based mask of (key, the step counter, element index)
extern "C" __global__ void mdsl_dropout_bf16(const bf16* x, const i64* step, bf16* out, i64 n, int key,
                                             int threshold, float scale) {
  dropout(x, step, out, n, key, threshold, scale);
}
extern "C" __global__ void mdsl_dropout_f32(const float* x, const i64* step, float* out, i64 n, int key,
                                            int threshold, float scale) {
  dropout(x, step, out, n, key, threshold, scale);
}
// out = a + b + c (same shapes)
extern "C" __global__ void mdsl_add3_bf16(const bf16* a, const bf16* b, const bf16* c, bf16* out, i64 n) {
  add3(a, b, c, out, n);
}
extern "C" __global__ void mdsl_add3_f32(const float* a, const float* b, const float* c, float* out, i64 n) {
  add3(a, b, c, out, n);
}
// acc += x (gradient accumulation): bf16 += bf16, fp32 += fp32, fp32 += bf16
extern "C" __global__ void mdsl_add_inplace_bf16(bf16* acc, const bf16* x, i64 n) { add_inplace(acc, x, n); }
extern "C" __global__ void mdsl_add_inplace_f32(float* acc, const float* x, i64 n) { add_inplace(acc, x, n); }
extern "C" __global__ void mdsl_add_inplace_f32_bf16(float* acc, const bf16* x, i64 n) { add_inplace(acc, x, n); }
