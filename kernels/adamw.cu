// AdamW update (kernels/reference.py: adamw), one tensor or many in one launch.
//
// fp32 parameters (the master weights) and fp32 moments, updated in place; the
// gradient is fp32 (variant f32) or bf16 (variant bf16); an optional bf16 copy of
// the updated weights is written when param_copy is not null. The step's runtime
// values are read from device memory: lr (fp32 [1], the scheduled rate, times the
// tensor's lr_scale), step (int64 [1], 1-based) and grad_scale (fp32 [1], the
// clipping factor; null for none). The order of operations is torch.optim.AdamW's
// single-tensor update, as the reference, with every fp32 operation rounded on its
// own (no fused multiply-add), so the fp32 results follow the reference bit for bit
// up to the last-bit differences of pow() in the bias corrections.
#include "common.cuh"

using namespace mdsl;

namespace {

// The per-step scalars, computed in double and rounded to fp32 as the reference does.
struct Step {
  float decay, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, step_size, grad_scale;
};

// What every tensor of a step shares: the rate before lr_scale and the bias corrections.
struct Shared {
  double rate, bc1;
  Step base;
};

__device__ Shared shared_scalars(const float* lr, const i64* step, const float* grad_scale, double beta1, double beta2,
                                 double eps) {
  const double t = (double) step[0];
  Shared sh;
  sh.rate = (double) lr[0];
  sh.bc1 = 1.0 - pow(beta1, t);
  sh.base.one_minus_beta1 = (float) (1.0 - beta1);
  sh.base.beta2 = (float) beta2;
  sh.base.one_minus_beta2 = (float) (1.0 - beta2);
  sh.base.bc2_sqrt = (float) sqrt(1.0 - pow(beta2, t));
  sh.base.eps = (float) eps;
  sh.base.grad_scale = grad_scale ? grad_scale[0] : 1.f;
  return sh;
}

__device__ Step tensor_scalars(const Shared& sh, double weight_decay, double lr_scale) {
  const double rate = sh.rate * lr_scale;
  Step s = sh.base;
  s.decay = (float) (1.0 - rate * weight_decay);
  s.step_size = (float) (rate / sh.bc1);
  return s;
}

// One element: p, m, v updated from the gradient g.
__device__ __forceinline__ void update(float& p, float& m, float& v, float g, const Step& s) {
  g = __fmul_rn(g, s.grad_scale);
  p = __fmul_rn(p, s.decay);
  m = __fadd_rn(m, __fmul_rn(__fsub_rn(g, m), s.one_minus_beta1));
  v = __fmul_rn(v, s.beta2);
  v = __fadd_rn(v, __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  p = __fsub_rn(p, __fmul_rn(__fdiv_rn(m, denom), s.step_size));
}

// Updates n elements with a grid-stride loop: 4 at a time when the pointers allow.
template <typename G>
__device__ void adamw_tensor(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, bf16* param_copy, i64 n,
                             const Step& s) {
  constexpr int V = 4;
  const bool vec = aligned16(param) && aligned16(exp_avg) && aligned16(exp_avg_sq) && aligned(grad, V * sizeof(G)) &&
                   (param_copy == nullptr || aligned(param_copy, V * sizeof(bf16)));
  const i64 tid = (i64) blockIdx.x * blockDim.x + threadIdx.x, stride = (i64) gridDim.x * blockDim.x;
  const i64 nvec = vec ? n / V : 0;
  for (i64 i = tid; i < nvec; i += stride) {
    float p[V], g[V], m[V], v[V];
    load<float, V>(param + i * V, p);
    load<G, V>(grad + i * V, g);
    load<float, V>(exp_avg + i * V, m);
    load<float, V>(exp_avg_sq + i * V, v);
#pragma unroll
    for (int j = 0; j < V; ++j) update(p[j], m[j], v[j], g[j], s);
    store<float, V>(param + i * V, p);
    store<float, V>(exp_avg + i * V, m);
    store<float, V>(exp_avg_sq + i * V, v);
    if (param_copy) store<bf16, V>(param_copy + i * V, p);
  }
  for (i64 e = nvec * V + tid; e < n; e += stride) {
    float p = param[e], m = exp_avg[e], v = exp_avg_sq[e];
    update(p, m, v, to_f32(grad[e]), s);
    param[e] = p;
    exp_avg[e] = m;
    exp_avg_sq[e] = v;
    if (param_copy) param_copy[e] = from_f32<bf16>(p);
  }
}

template <typename G>
__device__ void adamw(float* param, const G* grad, float* exp_avg, float* exp_avg_sq, bf16* param_copy, const float* lr,
                      const i64* step, const float* grad_scale, i64 n, double beta1, double beta2, double eps,
                      double weight_decay, double lr_scale) {
  const Step s = tensor_scalars(shared_scalars(lr, step, grad_scale, beta1, beta2, eps), weight_decay, lr_scale);
  adamw_tensor(param, grad, exp_avg, exp_avg_sq, param_copy, n, s);
}

// One entry of the multi-tensor table (64 bytes; kernels/cuda.py: adamw_table packs it).
struct AdamWTensor {
  float* param;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  bf16* param_copy;  // null: no bf16 copy
  i64 n;
  double lr_scale;
  double weight_decay;
};

template <typename G>
__device__ void adamw_multi(const AdamWTensor* tensors, i64 count, const float* lr, const i64* step,
                            const float* grad_scale, double beta1, double beta2, double eps) {
  const Shared sh = shared_scalars(lr, step, grad_scale, beta1, beta2, eps);
  for (i64 t = 0; t < count; ++t) {
    const AdamWTensor e = tensors[t];
    const Step s = tensor_scalars(sh, e.weight_decay, e.lr_scale);
    adamw_tensor(e.param, static_cast<const G*>(e.grad), e.exp_avg, e.exp_avg_sq, e.param_copy, e.n, s);
  }
}

}  // namespace

// One tensor. Launch (kernels/cuda.py: elementwise_config with 4 elements per thread):
// block (256, 1, 1), grid (min(ceil(n / 1024), 65536), 1, 1).
extern "C" __global__ void mdsl_adamw_f32(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                                          bf16* param_copy, const float* lr, const i64* step, const float* grad_scale,
                                          i64 n, double beta1, double beta2, double eps, double weight_decay,
                                          double lr_scale) {
  adamw(param, grad, exp_avg, exp_avg_sq, param_copy, lr, step, grad_scale, n, beta1, beta2, eps, weight_decay, lr_scale);
}
extern "C" __global__ void mdsl_adamw_bf16(float* param, const bf16* grad, float* exp_avg, float* exp_avg_sq,
                                           bf16* param_copy, const float* lr, const i64* step, const float* grad_scale,
                                           i64 n, double beta1, double beta2, double eps, double weight_decay,
                                           double lr_scale) {
  adamw(param, grad, exp_avg, exp_avg_sq, param_copy, lr, step, grad_scale, n, beta1, beta2, eps, weight_decay, lr_scale);
}

// Many tensors in one launch: every block walks every table entry with the grid-stride
// loop (so small and large tensors share the grid). Launch: block (256, 1, 1), grid
// (min(ceil(total / 1024), 4096), 1, 1) with total the summed sizes.
extern "C" __global__ void mdsl_adamw_multi_f32(const AdamWTensor* tensors, i64 count, const float* lr, const i64* step,
                                                const float* grad_scale, double beta1, double beta2, double eps) {
  adamw_multi<float>(tensors, count, lr, step, grad_scale, beta1, beta2, eps);
}
extern "C" __global__ void mdsl_adamw_multi_bf16(const AdamWTensor* tensors, i64 count, const float* lr, const i64* step,
                                                 const float* grad_scale, double beta1, double beta2, double eps) {
  adamw_multi<bf16>(tensors, count, lr, step, grad_scale, beta1, beta2, eps);
}
