// The warp-per-row layer norm's launches (kernels/cuda/layernorm_warp.h;
// the kernels are layernorm_warp_kernels.cuh's).
#include "kernels/cuda/layernorm_warp.h"
#include "kernels/cuda/layernorm_warp_kernels.cuh"
#include "kernels/cuda/ops.h"

namespace mpiformer::cuda {

namespace {

namespace rows = layernorm_rows;
using layernorm_warp::backward_kernel;
using layernorm_warp::forward_kernel;
using layernorm_warp::kThreads;
using layernorm_warp::with_slots;

int vector_elements(DType t) {
  return 16 / static_cast<int>(dtype_bytes(t));
}

}  // namespace

bool layernorm_warp_takes(DType dtype, int C, std::initializer_list<const void*> buffers) {
  if (!rows::fits(C, vector_elements(dtype))) return false;
  for (const void* p : buffers)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

void layernorm_warp_forward(cudaStream_t stream, Act sum, Act out, float* mean, float* rstd, Act s,
                            Act y, const Dropout& d, Act gamma, Act beta, int N, int C, float eps) {
  const unsigned blocks = (N + rows::kWarps - 1) / rows::kWarps;
  dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    with_slots(rows::lane_slots(C, kVecSize<T>), [&](auto slots) {
      forward_kernel<T, decltype(slots)::value><<<blocks, kThreads, 0, stream>>>(
          typed<T>(sum), typed<T>(out), mean, rstd, typed<T>(s), typed<T>(y), d, typed<T>(gamma),
          typed<T>(beta), N, C, eps);
    });
  });
  check(cudaGetLastError(),
        y.data ? "residual_layernorm_forward (warp)" : "layernorm_forward (warp)");
}

namespace {

// The backward's instance for rows of `slots` vectors a lane keeping
// `count` column sums (layernorm_rows::Sums), launched.
template <typename T, int kSlots, int kSums>
void launch_backward(cudaStream_t stream, Act dx, float* partial, Act dout, Act x, Act gamma,
                     const float* mean, const float* rstd, int N, int C, bool accumulate) {
  auto* kernel = backward_kernel<T, kSlots, kSums>;
  const size_t shared =
      sizeof(float) * rows::kWarps * kSums * layernorm_warp::sum_span<kSlots, kVecSize<T>>();
  if (shared > (size_t{48} << 10))
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared)),
          "cudaFuncSetAttribute (layernorm_backward, warp)");
  kernel<<<rows::backward_blocks(N), kThreads, shared, stream>>>(
      typed<T>(dx), partial, typed<T>(dout), typed<T>(x), typed<T>(gamma), mean, rstd, N, C,
      accumulate);
}

}  // namespace

void layernorm_warp_backward(cudaStream_t stream, Act dx, const rows::Sums& sums, float* partial,
                             Act dout, Act x, Act gamma, const float* mean, const float* rstd,
                             int N, int C, bool accumulate) {
  dispatch(dx.dtype, [&](auto t) {
    using T = decltype(t);
    with_slots(rows::lane_slots(C, kVecSize<T>), [&](auto slots) {
      constexpr int kSlots = decltype(slots)::value;
      if (sums.count() == 3)
        launch_backward<T, kSlots, 3>(stream, dx, partial, dout, x, gamma, mean, rstd, N, C,
                                      accumulate);
      else
        launch_backward<T, kSlots, 2>(stream, dx, partial, dout, x, gamma, mean, rstd, N, C,
                                      accumulate);
    });
  });
  check(cudaGetLastError(), "layernorm_backward (warp)");
  layernorm_param_grads(stream, sums, partial, rows::backward_blocks(N), C,
                        layernorm_warp::kParamLoadsInFlight);
}

void layernorm_param_grads(cudaStream_t stream, const rows::Sums& sums, const float* partial,
                           int blocks, int C, int loads_in_flight) {
  using layernorm_warp::kParamColumns;
  using layernorm_warp::kParamThreads;
  using layernorm_warp::param_grads_kernel;
  const unsigned column_blocks = (sums.count() * C + kParamColumns - 1) / kParamColumns;
  if (loads_in_flight == 1)
    param_grads_kernel<1><<<column_blocks, kParamThreads, 0, stream>>>(sums, partial, blocks, C);
  else
    param_grads_kernel<layernorm_warp::kParamLoadsInFlight>
        <<<column_blocks, kParamThreads, 0, stream>>>(sums, partial, blocks, C);
  check(cudaGetLastError(), "layernorm_backward (column sums)");
}

}  // namespace mpiformer::cuda
