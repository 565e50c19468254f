// Device discovery through the CUDA runtime. Every error (no driver, no GPU)
// is reported as "no device": the CPU backend then runs instead.
#include <cuda_runtime.h>

#include "kernels/cuda/discovery.h"

namespace mpiformer::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // reset the (non-sticky) error so later calls start clean
    return 0;
  }
  return count;
}

std::string device_name(int device) {
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return props.name;
}

std::string pci_address(int device) {
  char address[32] = {};
  if (cudaDeviceGetPCIBusId(address, sizeof address, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return address;
}

bool compute_capability(int device, int* major, int* minor) {
  if (cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace mpiformer::cuda
