// The warp-per-row layer norm (the forward's default, layernorm=warp; the
// backward's under layernorm_backward=warp): each row read once into
// registers with 16-byte loads (the backward's as stored, the next row's
// loads started while one is worked on), for rows of up to 1024 elements
// (kernels/layernorm_rows.h); layernorm.cu keeps the block-per-row kernels
// for the rest and as the other path.
#pragma once

#include <cuda_runtime.h>

#include "kernels/layernorm_rows.h"
#include "kernels/ops.h"

namespace mpiformer::cuda {

// Whether the warp kernels take rows of C elements of `dtype` that start at
// these buffers (every row 16-byte aligned).
bool layernorm_warp_takes(DType dtype, int C, std::initializer_list<const void*> buffers);

// out = LN(x) of each row; with y: sum = s + dropout(y), stored rounded,
// and out = LN of the stored sum (the block kernels' contract); without y
// (null) x is s and sum is not written.
// sum, out, s, y: (N, C); mean, rstd: (N); gamma, beta: (C)
void layernorm_warp_forward(cudaStream_t stream, Act sum, Act out, float* mean, float* rstd, Act s,
                            Act y, const Dropout& d, Act gamma, Act beta, int N, int C, float eps);

// dx (= or +=) of each row, and the column sums added to: each block's
// sums in `partial` (layernorm_rows::backward_blocks(N) blocks), then
// added by layernorm_param_grads below, 16 loads in flight.
// dx, dout, x: (N, C); partial: (blocks, sums.count(), C) (layernorm_rows::Sums)
void layernorm_warp_backward(cudaStream_t stream, Act dx, const layernorm_rows::Sums& sums,
                             float* partial, Act dout, Act x, Act gamma, const float* mean,
                             const float* rstd, int N, int C, bool accumulate);

// The column sums += the sums over blocks of either backward's partials,
// in one fixed order (layernorm_warp_kernels.cuh's param_grads_kernel),
// each thread keeping loads_in_flight (1 or 16) loads of partials in
// flight: the same bits either way.  partial: (blocks, sums.count(), C)
void layernorm_param_grads(cudaStream_t stream, const layernorm_rows::Sums& sums,
                           const float* partial, int blocks, int C, int loads_in_flight);

}  // namespace mpiformer::cuda
