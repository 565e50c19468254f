// The CUDA runtime's view of the GPUs, for a host that may have none.
// Plain C++ (no CUDA headers), so the CPU build can include it.
#pragma once

#include <string>

namespace mpiformer::cuda {

// GPUs visible to this process; 0 on any CUDA runtime error (no driver, no
// device, CUDA_VISIBLE_DEVICES empty).
int device_count();

// The device's marketing name ("NVIDIA H100 80GB HBM3"), or "" on error.
std::string device_name(int device);

// The device's PCI address ("0000:3B:00.0"): the same GPU under any
// CUDA_VISIBLE_DEVICES numbering; "" on error.
std::string pci_address(int device);

// The device's compute capability; false on error.
bool compute_capability(int device, int* major, int* minor);

}  // namespace mpiformer::cuda
