// The CUDA backend's set-up (its library handles on the device's stream)
// and the scratch its ops share.
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_flash.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"

namespace mpiformer {

namespace cuda {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS error in ") + what + ": status " +
                             std::to_string(static_cast<int>(status)));
  }
}

}  // namespace cuda

// ---- set-up ---------------------------------------------------------------

CudaOps::CudaOps(std::unique_ptr<CudaDevice> device, bool tf32)
    : Ops(*device),
      gpu_(std::move(device)),
      stream_(gpu_->stream()),
      plain_attention_(cuda::plain_attention_from_environment()) {
  gemm_ = std::make_unique<cuda::Gemm>(*this, tf32);
  set_kernel_switches(kernel_switches_from_environment());
  int optin = 0;
  cuda::check(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, gpu_->ordinal()),
      "cudaDeviceGetAttribute (shared memory per block)");
  shared_per_block_optin_ = static_cast<size_t>(optin);
  cuda::check(
      cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, gpu_->ordinal()),
      "cudaDeviceGetAttribute (multiprocessors)");
  try {
    flash_ = cuda::FlashAttention::create(*this, &no_cudnn_reason_);
  } catch (const std::exception& e) {
    // cuDNN missing or broken on this machine: attention still runs, and
    // the start line says why on the plain kernels.
    no_cudnn_reason_ = e.what();
  }
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(stream_);
  if (side_stream_) cudaStreamSynchronize(side_stream_);
  flash_.reset();
  gemm_.reset();  // its cuBLAS handle may still name the side stream
  if (side_stream_) {
    cudaStreamDestroy(side_stream_);
    cudaEventDestroy(fork_);
    cudaEventDestroy(join_);
  }
  for (void* p : scratch_)
    if (p) cudaFree(p);
}

void CudaOps::set_kernel_switches(const KernelSwitches& switches) {
  switches_ = switches;
  gemm_->set_timed_search(switches.gemm == KernelSwitches::Gemm::kTimed);
}

void CudaOps::set_deterministic(bool deterministic) {
  deterministic_ = deterministic;
  gemm_->set_deterministic(deterministic);
}

std::string CudaOps::gemm_search() const {
  return gemm_->timed_search_summary();
}

std::string CudaOps::attention_search() const {
  return flash_ ? flash_->search_summary() : "";
}

std::string CudaOps::gemm_unfused() const {
  return gemm_->unfused_summary();
}

void* CudaOps::scratch(Slot slot, size_t bytes) {
  if (scratch_bytes_[slot] < bytes) {
    if (scratch_[slot]) {
      // On the side stream (dweight_stream=side) this also waits for the
      // main stream's work before the fork; until the join the main
      // stream's work (the dx GEMM's) uses slots of its own, kPreBiasGrad
      // and kPreColumnSums (matmul.cu's SideStream).
      cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      cuda::check(cudaFree(scratch_[slot]), "cudaFree");
      gpu_->uncount_workspace(scratch_bytes_[slot]);
    }
    scratch_[slot] = nullptr;
    scratch_bytes_[slot] = 0;
    cuda::check(cudaMalloc(&scratch_[slot], bytes), "cudaMalloc (scratch)");
    scratch_bytes_[slot] = bytes;
    count_workspace(bytes);
  }
  return scratch_[slot];
}

}  // namespace mpiformer
