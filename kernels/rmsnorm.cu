// RMSNorm and fused residual + RMSNorm, forward and backward (kernels/reference.py:
// rmsnorm, rmsnorm_backward, fused_residual_rmsnorm, fused_residual_rmsnorm_backward).
//
// Rows are the last dim D of x: rows = numel / D. Storage T is bf16 or fp32; rstd
// and the d_weight partial sums are fp32.
//
// Launch (kernels/cuda.py: row_config): block (G, R, 1) with G threads per row
// (a power of two, at most 512) and R = max(1, 256 / G) rows per block; grid
// (min(ceil(rows / R), cap), 1, 1); no dynamic shared memory. The backward
// kernels write per-block d_weight partial sums (fp32 [gridDim.x, D], scratch)
// that mdsl_rmsnorm_dw_reduce_* sums into d_weight in a fixed order
// (deterministic): block (32, 8, 1), grid (ceil(D / 32), 1, 1).
#include "norm.cuh"

using namespace mdsl;

// (y, rstd) = rmsnorm(x, weight; eps)
extern "C" __global__ void __launch_bounds__(512)
mdsl_rmsnorm_fwd_bf16(const bf16* x, const bf16* weight, bf16* y, float* rstd, i64 rows, i64 D, float eps) {
  rmsnorm_fwd<bf16, false>(x, nullptr, weight, nullptr, y, rstd, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_rmsnorm_fwd_f32(const float* x, const float* weight, float* y, float* rstd, i64 rows, i64 D, float eps) {
  rmsnorm_fwd<float, false>(x, nullptr, weight, nullptr, y, rstd, rows, D, eps);
}

// (residual_out, y, rstd) = fused_residual_rmsnorm(residual, input, weight; eps)
extern "C" __global__ void __launch_bounds__(512)
mdsl_fused_residual_rmsnorm_fwd_bf16(const bf16* residual, const bf16* input, const bf16* weight,
                                     bf16* residual_out, bf16* y, float* rstd, i64 rows, i64 D, float eps) {
  rmsnorm_fwd<bf16, true>(residual, input, weight, residual_out, y, rstd, rows, D, eps);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_fused_residual_rmsnorm_fwd_f32(const float* residual, const float* input, const float* weight,
                                    float* residual_out, float* y, float* rstd, i64 rows, i64 D, float eps) {
  rmsnorm_fwd<float, true>(residual, input, weight, residual_out, y, rstd, rows, D, eps);
}

// d_x and the d_weight partials of rmsnorm_backward(d_y, x, weight, rstd)
extern "C" __global__ void __launch_bounds__(512)
mdsl_rmsnorm_bwd_bf16(const bf16* d_y, const bf16* x, const bf16* weight, const float* rstd, bf16* d_x,
                      float* dw_partial, i64 rows, i64 D) {
  rmsnorm_bwd<bf16, false>(d_y, nullptr, x, weight, rstd, d_x, nullptr, dw_partial, rows, D);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_rmsnorm_bwd_f32(const float* d_y, const float* x, const float* weight, const float* rstd, float* d_x,
                     float* dw_partial, i64 rows, i64 D) {
  rmsnorm_bwd<float, false>(d_y, nullptr, x, weight, rstd, d_x, nullptr, dw_partial, rows, D);
}

// d_residual = d_input = d_residual_next + d_x, and the d_weight partials, of
// fused_residual_rmsnorm_backward(d_y, d_residual_next, residual_out, weight, rstd)
extern "C" __global__ void __launch_bounds__(512)
mdsl_fused_residual_rmsnorm_bwd_bf16(const bf16* d_y, const bf16* d_residual_next, const bf16* residual_out,
                                     const bf16* weight, const float* rstd, bf16* d_residual, bf16* d_input,
                                     float* dw_partial, i64 rows, i64 D) {
  rmsnorm_bwd<bf16, true>(d_y, d_residual_next, residual_out, weight, rstd, d_residual, d_input, dw_partial,
                          rows, D);
}
extern "C" __global__ void __launch_bounds__(512)
mdsl_fused_residual_rmsnorm_bwd_f32(const float* d_y, const float* d_residual_next, const float* residual_out,
                                    const float* weight, const float* rstd, float* d_residual, float* d_input,
                                    float* dw_partial, i64 rows, i64 D) {
  rmsnorm_bwd<float, true>(d_y, d_residual_next, residual_out, weight, rstd, d_residual, d_input, dw_partial,
                           rows, D);
}

// d_weight[j] = sum_p dw_partial[p, j]: the second stage of every backward above
extern "C" __global__ void mdsl_rmsnorm_dw_reduce_bf16(const float* dw_partial, bf16* d_weight, i64 parts, i64 D) {
  column_sum<float, bf16>(dw_partial, d_weight, 1, parts, D, 1.f);
}
extern "C" __global__ void mdsl_rmsnorm_dw_reduce_f32(const float* dw_partial, float* d_weight, i64 parts, i64 D) {
  column_sum<float, float>(dw_partial, d_weight, 1, parts, D, 1.f);
}
