// The CUDA backend's dense layers on cuBLASLt (gemm.h), with the row-major
// to column-major mapping of every GEMM, and the kernels that stand in for
// an epilogue cuBLASLt cannot fuse.
//
// Row-major x (N, IC) is column-major IC x N (ld IC), W (OC, IC) is IC x OC
// (ld IC), out (N, OC) is OC x N (ld OC, or the padded stride). So
//   out^T (OC x N) = W^T x^T:   A = W (transposed), B = x,      m OC, n N, k IC
//   dx^T  (IC x N) = W dout^T:  A = W,              B = dout,   m IC, n N, k OC
//   dW^T  (IC x OC) += x^T dout: A = x,             B = dout^T, m IC, n OC, k N
// and the bias gradient of the dW GEMM (BGRADB) sums B over k: over tokens.
#include "kernels/cuda/column_sums_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dweight_split_kernels.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::load;
using cuda::store;
using cuda::typed;

constexpr int kThreads = 256;

// out[r, c] += bias[c] (rows `ld` apart).  out: (N, OC), bias: (OC)
template <typename T>
__global__ void add_bias_kernel(T* out, const T* bias, int N, int OC, int ld) {
  MPIFORMER_FOR_EACH(i, static_cast<size_t>(N) * OC) {
    const size_t r = i / OC, c = i % OC;
    store(out, r * ld + c, load(out, r * ld + c) + load(bias, c));
  }
}

// out = act(pre).  pre: (N, OC) dense, out: (N, OC) rows ldo apart
template <typename T>
__global__ void activation_kernel(T* out, const T* pre, int N, int OC, int ldo, bool gelu) {
  MPIFORMER_FOR_EACH(i, static_cast<size_t>(N) * OC) {
    const float x = load(pre, i);
    const size_t r = i / OC, c = i % OC;
    store(out, r * ldo + c, gelu ? cuda::gelu(x) : fmaxf(x, 0.0f));
  }
}

// dx = act'(pre) * dx in place.  dx, pre: (n)
template <typename T>
__global__ void activation_grad_kernel(T* dx, const T* pre, size_t n, bool gelu) {
  MPIFORMER_FOR_EACH(i, n) {
    const float x = load(pre, i);
    store(dx, i, (gelu ? cuda::gelu_grad(x) : (x > 0.0f ? 1.0f : 0.0f)) * load(dx, i));
  }
}

// dst += src.  dst, src: (n)
__global__ void add_kernel(float* dst, const float* src, size_t n) {
  MPIFORMER_FOR_EACH(i, n) dst[i] += src[i];
}

// The output features of a wide layer whose count is not a multiple of 8
// run as an aligned part and a tail of fewer than 8: with an odd OC (GPT-2's
// 50257 tokens) every contiguous extent of the logits and of their
// gradient is odd, and cuBLASLt then picks kernels 3 to 7 times slower on
// an H100 than for 50256 (the vocabulary GEMMs ran at 93 and 197 TFLOP/s).
// returns: the aligned part's OC (OC itself when no split pays)
int aligned_features(int OC) {
  constexpr int kSplitFrom = 256;
  return OC >= kSplitFrom && OC % 8 != 0 ? OC / 8 * 8 : OC;
}

}  // namespace

void CudaOps::add_column_sums(float* dst, Act src, int N, int C, int stride, Slot partials) {
  if (N == 0 || C == 0) return;
  namespace sums = cuda::column_sums;
  const int blocks = (N + sums::kRowBlock - 1) / sums::kRowBlock;
  auto* partial =
      static_cast<float*>(scratch(partials, sizeof(float) * static_cast<size_t>(blocks) * C));
  cuda::dispatch(src.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = cuda::kVecSize<T>;
    if (sums::vectorizable(typed<T>(src), C, stride)) {
      const sums::Launch l = sums::partial_launch(N, C, kVec);
      sums::partial_kernel<T, kVec>
          <<<l.grid, l.threads, 0, stream_>>>(partial, typed<T>(src), N, C, stride);
    } else {
      const sums::Launch l = sums::partial_launch(N, C, 1);
      sums::partial_kernel<T, 1>
          <<<l.grid, l.threads, 0, stream_>>>(partial, typed<T>(src), N, C, stride);
    }
  });
  const sums::Launch total = sums::total_launch(C);
  sums::total_kernel<<<total.grid, total.threads, 0, stream_>>>(dst, partial, blocks, C);
  cuda::check(cudaGetLastError(), "column sums");
}

void CudaOps::matmul_forward(Act out, Act x, Act weight, Act bias, int N, int IC, int OC,
                             const FusedActivation& fused, int out_stride) {
  if (N == 0 || OC == 0) return;
  const int ldo = out_stride > 0 ? out_stride : OC;
  if (const int head = aligned_features(OC); head < OC && !fused.pre) {
    matmul_forward(out, x, weight, bias, N, IC, head, {}, ldo);
    matmul_forward(out + head, x, weight + static_cast<size_t>(head) * IC,
                   bias ? bias + head : bias, N, IC, OC - head, {}, ldo);
    return;
  }
  const cudaDataType_t type = cuda::cuda_type(out.dtype);
  // out^T (OC x N) = W^T x^T
  cuda::GemmCall call;
  call.trans_a = true;
  call.m = OC, call.n = N, call.k = IC;
  call.a = weight.data, call.lda = IC;
  call.b = x.data, call.ldb = IC;
  call.ab_type = call.d_type = type;
  const bool gelu = fused.pre && fused.act == Activation::kGelu;
  if (gelu) {
    // act(x W^T + b) into out, x W^T + b into pre (ld OC)
    call.d = out.data, call.ldd = ldo;
    call.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    call.bias = bias.data;
    call.aux = fused.pre.data, call.aux_ld = OC;
    if (gemm_->fused(call)) return;
  } else if (!fused.pre) {
    call.d = out.data, call.ldd = ldo;
    if (bias) {
      call.epilogue = CUBLASLT_EPILOGUE_BIAS;
      call.bias = bias.data;
    }
    if (gemm_->fused(call)) return;
  }
  // Unfused: the GEMM into pre (or out), then the bias and the activation.
  const Act target = fused.pre ? fused.pre : out;
  const int ld = fused.pre ? OC : ldo;
  call.d = target.data, call.ldd = ld;
  gemm_->plain(call);
  cuda::dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    if (bias) {
      add_bias_kernel<<<cuda::blocks_for(static_cast<size_t>(N) * OC), kThreads, 0, stream_>>>(
          typed<T>(target), typed<T>(bias), N, OC, ld);
    }
    if (fused.pre) {
      const size_t n = static_cast<size_t>(N) * OC;
      activation_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(
          typed<T>(out), typed<T>(fused.pre), N, OC, ldo, fused.act == Activation::kGelu);
    }
  });
  cuda::check(cudaGetLastError(), "matmul_forward (epilogue)");
}

void CudaOps::matmul_backward(Act dx, float* dweight, float* dbias, Act dout, Act x, Act weight,
                              int N, int IC, int OC, bool accumulate, const FusedActivation& fused,
                              int dout_stride) {
  if (N == 0) return;
  const int ldd = dout_stride > 0 ? dout_stride : OC;
  if (const int head = aligned_features(OC); head < OC && !fused.pre) {
    // dx sums over the features: the tail's share is added to the head's.
    matmul_backward(dx, dweight, dbias, dout, x, weight, N, IC, head, accumulate, {}, ldd);
    matmul_backward(dx, dweight + static_cast<size_t>(head) * IC, dbias ? dbias + head : nullptr,
                    dout + head, x, weight + static_cast<size_t>(head) * IC, N, IC, OC - head, true,
                    {}, ldd);
    return;
  }
  const bool weights = OC > 0 && IC > 0;
  if (switches_.dweight_stream == KernelSwitches::DWeightStream::kSide) {
    count_candidate(CandidateCalls::kDWeightStream, dx && weights);
    if (dx && weights) {
      // The weight gradient first, on the side stream, so that it holds
      // its SMs before the dx GEMM takes the rest; the device's stream
      // waits for it before the op returns (the gradient buckets' events
      // follow the op).
      SideStream side(*this);
      weight_gradient(dweight, dbias, dout, x, N, IC, OC, ldd);
      side.to_main();
      input_gradient(dx, dout, weight, N, IC, OC, accumulate, fused, ldd);
      return;
    }
  }
  if (dx) input_gradient(dx, dout, weight, N, IC, OC, accumulate, fused, ldd);
  if (weights) weight_gradient(dweight, dbias, dout, x, N, IC, OC, ldd);
}

void CudaOps::input_gradient(Act dx, Act dout, Act weight, int N, int IC, int OC, bool accumulate,
                             const FusedActivation& fused, int ldd) {
  // dx^T (IC x N) = W dout^T
  cuda::GemmCall call;
  call.m = IC, call.n = N, call.k = OC;
  call.a = weight.data, call.lda = IC;
  call.b = dout.data, call.ldb = ldd;
  call.d = dx.data, call.ldd = IC;
  call.ab_type = call.d_type = cuda::cuda_type(dout.dtype);
  call.beta = accumulate ? 1.0f : 0.0f;
  const bool gelu = fused.pre && fused.act == Activation::kGelu && !accumulate;
  if (gelu) {
    call.epilogue = CUBLASLT_EPILOGUE_DGELU;
    call.aux = fused.pre.data, call.aux_ld = IC;
  }
  bool summed = false;
  if (gelu && fused.pre_bias_grad) {
    // DGELU_BGRAD also writes (=) the sums over tokens of the gradient it
    // makes, in fp32 before dx is rounded: to scratch, then added.
    cuda::GemmCall with_sums = call;
    with_sums.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    with_sums.bias = scratch(kPreBiasGrad, sizeof(float) * IC);
    with_sums.fp32_bias = true;
    summed = gemm_->fused(with_sums);
    if (summed) {
      add_kernel<<<cuda::blocks_for(IC), kThreads, 0, stream_>>>(
          fused.pre_bias_grad, static_cast<const float*>(with_sums.bias), IC);
      cuda::check(cudaGetLastError(), "matmul_backward (the pre-activation's bias gradient)");
    }
  }
  if (fused.pre_bias_grad) count_candidate(CandidateCalls::kDBiasIn, summed);
  if (summed) return;
  const bool fusable = gelu || !fused.pre;  // an epilogue cuBLASLt has, or none
  if (!fusable || !gemm_->fused(call)) plain_input_gradient(dx, call, fused);
  // Where no epilogue summed it: a pass over dx as stored, on scratch of
  // its own (a side stream's weight gradient may be summing its dout).
  if (fused.pre_bias_grad) add_column_sums(fused.pre_bias_grad, dx, N, IC, IC, kPreColumnSums);
}

void CudaOps::plain_input_gradient(Act dx, const cuda::GemmCall& call,
                                   const FusedActivation& fused) {
  gemm_->plain(call);
  if (!fused.pre) return;
  const size_t n = static_cast<size_t>(call.n) * call.m;
  cuda::dispatch(dx.dtype, [&](auto t) {
    using T = decltype(t);
    activation_grad_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(
        typed<T>(dx), typed<T>(fused.pre), n, fused.act == Activation::kGelu);
  });
  cuda::check(cudaGetLastError(), "matmul_backward (activation)");
}

void CudaOps::make_side_stream() {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaError_t status = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (status == cudaSuccess) status = cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  if (status == cudaSuccess) status = cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  if (status != cudaSuccess) {
    if (fork) cudaEventDestroy(fork);
    if (stream) cudaStreamDestroy(stream);
    cuda::check(status, "the side stream (dweight_stream=side)");
  }
  side_stream_ = stream, fork_ = fork, join_ = join;
}

void CudaOps::finish_side_stream() {
  if (side_stream_) cuda::check(cudaStreamSynchronize(side_stream_), "cudaStreamSynchronize");
}

CudaOps::SideStream::SideStream(CudaOps& ops) : ops_(ops), main_(ops.stream_) {
  if (!ops_.side_stream_) ops_.make_side_stream();
  cuda::check(cudaEventRecord(ops_.fork_, main_), "cudaEventRecord (fork)");
  cuda::check(cudaStreamWaitEvent(ops_.side_stream_, ops_.fork_, 0), "cudaStreamWaitEvent (fork)");
  ops_.stream_ = ops_.side_stream_;
}

void CudaOps::SideStream::to_main() {
  if (!on_side_) return;
  on_side_ = false;
  ops_.stream_ = main_;
  // Where the mark fails, the side stream is drained instead, so that the
  // wait below cannot pass on an older mark.
  if (cudaEventRecord(ops_.join_, ops_.side_stream_) != cudaSuccess)
    cudaStreamSynchronize(ops_.side_stream_);
}

CudaOps::SideStream::~SideStream() {
  to_main();
  if (cudaStreamWaitEvent(main_, ops_.join_, 0) != cudaSuccess)
    cudaStreamSynchronize(ops_.side_stream_);
}

namespace {

// dW^T (IC x OC) = x^T dout over N tokens into d (fp32), as cuBLASLt sees it.
cuda::GemmCall weight_gradient_call(Act dout, Act x, int N, int IC, int OC, int ldd, float* d) {
  cuda::GemmCall call;
  call.trans_b = true;
  call.m = IC, call.n = OC, call.k = N;
  call.a = x.data, call.lda = IC;
  call.b = dout.data, call.ldb = ldd;
  call.d = d, call.ldd = IC;
  call.ab_type = cuda::cuda_type(dout.dtype);
  call.d_type = CUDA_R_32F;
  return call;
}

}  // namespace

void CudaOps::weight_gradient(float* dweight, float* dbias, Act dout, Act x, int N, int IC, int OC,
                              int ldd) {
  if (dbias && bias_grad_apart()) count_candidate(CandidateCalls::kDBias, true);
  if (switches_.dweight == KernelSwitches::DWeight::kSplit) {
    const bool split = split_weight_gradient(dweight, dbias, dout, x, N, IC, OC, ldd);
    count_candidate(CandidateCalls::kDWeight, split);
    if (split) return;
  }
  // dW^T (IC x OC) += x^T dout, fp32, with the bias gradient (a sum over
  // tokens of dout) from the same pass when cuBLASLt can fuse it, unless
  // dbias=columns takes it from a pass of its own.
  cuda::GemmCall call = weight_gradient_call(dout, x, N, IC, OC, ldd, dweight);
  call.beta = 1.0f;
  if (dbias && !bias_grad_apart()) {
    // BGRADB writes (=) the bias gradient: to scratch, then added.
    auto* grad = static_cast<float*>(scratch(kBiasGrad, sizeof(float) * OC));
    call.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    call.bias = grad;
    if (gemm_->fused(call)) {
      add_kernel<<<cuda::blocks_for(OC), kThreads, 0, stream_>>>(dbias, grad, OC);
      cuda::check(cudaGetLastError(), "matmul_backward (bias gradient)");
      return;
    }
  }
  gemm_->plain(call);
  if (dbias) add_column_sums(dbias, dout, N, OC, ldd);
}

bool CudaOps::split_weight_gradient(float* dweight, float* dbias, Act dout, Act x, int N, int IC,
                                    int OC, int ldd) {
  const dweight_split::Split split = dweight_split::split_for(N, IC, OC, ldd);
  if (split.parts == 1) return false;
  const size_t count = static_cast<size_t>(IC) * OC;
  // The parts' dW (parts, IC x OC), then their bias gradients (parts, bias_stride) from 256
  // bytes on.
  const size_t weight_floats = (count * split.parts + 63) / 64 * 64;
  const size_t bias_stride = dweight_split::bias_stride(OC);
  auto* partial = static_cast<float*>(
      scratch(kWeightGradParts, sizeof(float) * (weight_floats + bias_stride * split.parts)));
  float* bias_parts = partial + weight_floats;
  // Part p: partial[p]^T (IC x OC) = x^T dout over tokens [p * rows, (p + 1) * rows),
  // and its bias gradient into bias_parts[p] where cuBLASLt fuses it.
  cuda::GemmCall call = weight_gradient_call(dout, x, split.rows, IC, OC, ldd, partial);
  call.batch = split.parts;
  call.stride_a = split.rows * IC, call.stride_b = split.rows * ldd;
  call.stride_d = static_cast<int>(count);
  bool bias_fused = false;
  if (dbias && !bias_grad_apart()) {
    cuda::GemmCall with_bias = call;
    with_bias.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    with_bias.bias = bias_parts, with_bias.bias_stride = static_cast<int>(bias_stride);
    bias_fused = gemm_->fused(with_bias);
  }
  if (!bias_fused && !gemm_->fused(call)) return false;
  if (const int rest = N - split.parts * split.rows; rest > 0) {
    // The last tokens, fewer than the parts, into part 0 after its own.
    const size_t first = static_cast<size_t>(split.parts) * split.rows;
    cuda::GemmCall tail = call;
    tail.batch = 1, tail.stride_a = tail.stride_b = tail.stride_d = 0;
    tail.k = rest;
    tail.a = (x + first * IC).data;
    tail.b = (dout + first * ldd).data;
    tail.beta = 1.0f;
    gemm_->plain(tail);
    if (bias_fused) add_column_sums(bias_parts, dout + first * ldd, rest, OC, ldd);
  }
  add_split_parts(dweight, partial, count, count, split.parts);
  if (bias_fused) add_split_parts(dbias, bias_parts, OC, bias_stride, split.parts);
  if (dbias && !bias_fused) add_column_sums(dbias, dout, N, OC, ldd);
  return true;
}

void CudaOps::add_split_parts(float* sum, const float* partial, size_t count, size_t stride,
                              int parts) {
  cuda::add_split_parts_kernel<<<cuda::blocks_for(count), kThreads, 0, stream_>>>(
      sum, partial, count, stride, parts);
  cuda::check(cudaGetLastError(), "matmul_backward (the split's parts)");
}

}  // namespace mpiformer
