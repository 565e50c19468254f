// Backend selection (kernels/backend.h).
#include "kernels/backend.h"

#include <cblas.h>
#include <omp.h>

#include "kernels/checked_ops.h"
#include "kernels/cpu/device.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda_architectures.h"

#ifdef MPIFORMER_HAVE_CUDA
#include "kernels/cuda/device.h"
#include "kernels/cuda/discovery.h"
#include "kernels/cuda/ops.h"
#endif

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

namespace mpiformer {

std::unique_ptr<Ops> make_cpu_ops(int threads) {
  const int pool = threads > 0 ? threads : omp_get_max_threads();
  // BLAS runs on the calling thread and our loops split the work in fixed
  // tiles (kernels/cpu/gemm.cpp), so results do not depend on the thread
  // count. The OpenMP build of OpenBLAS also sets OpenMP's pool here, so
  // ours is set after it.
  openblas_set_num_threads(1);
  omp_set_num_threads(pool);
  return std::make_unique<CpuOps>(std::make_unique<CpuDevice>());
}

std::unique_ptr<Ops> make_cuda_ops(int device, bool tf32) {
#ifdef MPIFORMER_HAVE_CUDA
  return std::make_unique<CudaOps>(std::make_unique<CudaDevice>(device), tf32);
#else
  (void)device, (void)tf32;
  throw std::runtime_error("this build has no CUDA backend (nvcc was not found at configure time)");
#endif
}

std::unique_ptr<Ops> checked_if_asked(std::unique_ptr<Ops> ops, bool* checking) {
  const char* check = std::getenv("MPIFORMER_CUDA_CHECK");
  const bool asked = check && std::string(check) == "1";
  if (checking) *checking = asked;
  if (!asked) return ops;
  return std::make_unique<CheckedOps>(std::move(ops));
}

std::string cuda_device_name(int device) {
#ifdef MPIFORMER_HAVE_CUDA
  return cuda::device_name(device);
#else
  (void)device;
  return "";
#endif
}

std::string cuda_pci_address(int device) {
#ifdef MPIFORMER_HAVE_CUDA
  return cuda::pci_address(device);
#else
  (void)device;
  return "";
#endif
}

int cuda_device_count() {
#ifdef MPIFORMER_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string blas_version() {
  const char* config = openblas_get_config();
  return config ? config : "OpenBLAS (unknown build)";
}

std::string cuda_architectures_problem() {
#ifdef MPIFORMER_HAVE_CUDA
  const int count = cuda::device_count();
  for (int device = 0; device < count; ++device) {
    int major = 0, minor = 0;
    if (!cuda::compute_capability(device, &major, &minor)) continue;
    const std::string problem = architectures_problem(
        MPIFORMER_CUDA_ARCHITECTURES, major, minor,
        "GPU " + std::to_string(device) + " (" + cuda::device_name(device) + ")");
    if (!problem.empty()) return problem;
  }
#endif
  return "";
}

bool cuda_backend_built() {
#ifdef MPIFORMER_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace mpiformer
