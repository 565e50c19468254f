// Backend selection: the CPU reference backend always; the CUDA backend when
// the build has one and a GPU is present.
#pragma once

#include <memory>
#include <string>

#include "kernels/ops.h"

namespace mpiformer {

// Each backend is a Device and the Ops on it; the Ops returned own their
// Device (ops->device()).

// The CPU backend: a CpuDevice and the CpuOps on it. threads: CPU threads
// for the kernels and BLAS (0: OpenMP's default).
std::unique_ptr<Ops> make_cpu_ops(int threads);

// The CUDA backend on GPU `device`: a CudaDevice (cudaSetDevice, its
// stream) and the CudaOps on it. tf32: fp32 GEMMs on TF32 tensor cores.
// Throws std::runtime_error without a CUDA build or on a CUDA error.
std::unique_ptr<Ops> make_cuda_ops(int device, bool tf32 = false);

// ops, or with MPIFORMER_CUDA_CHECK=1 in the environment ops behind a
// CheckedOps (kernels/checked_ops.h): the device waited for and checked
// after every op, so that a fault names its op. *checking: whether it is.
std::unique_ptr<Ops> checked_if_asked(std::unique_ptr<Ops> ops, bool* checking = nullptr);

// GPUs visible to this process (0 without a CUDA build).
int cuda_device_count();
// "OpenBLAS 0.3.21 ..." as the library describes its build.
std::string blas_version();
// The device's name ("NVIDIA H100 80GB HBM3"), "" without a CUDA build or on error.
std::string cuda_device_name(int device);
// The device's PCI address, one GPU's name under any numbering; "" without
// a CUDA build or on error.
std::string cuda_pci_address(int device);
bool cuda_backend_built();
// "" where this build's kernels run on every visible GPU; otherwise one
// line naming the first that they do not, its capability and what to build
// (kernels/cuda_architectures.h).
std::string cuda_architectures_problem();

}  // namespace mpiformer
