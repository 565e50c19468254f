// Memory a command will hold, estimated from its flags before anything is
// allocated, and checked against what this rank may use: a run that cannot
// fit is refused with one line naming the flags that size it, instead of
// dying in an allocation (or being killed by the kernel) minutes later.
//
// Counted: the parameters (fp32 master, gradients, the compute copy), the
// AdamW moments, the model's activation buffers at its capacity (--max-tokens,
// or --beam x max-len for generate), the attention ops' scratch (the scores
// of the longest sequence), the upload staging and the gradient reducer's
// host buffers. Not counted: the data set in memory and library
// workspaces (cuBLAS, cuDNN), so the estimate is a floor.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/ops.h"
#include "src/core/config.h"
#include "src/model/model.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

struct MemoryEstimate {
  size_t parameters = 0;
  size_t weight_bytes = 0;      // master weights, gradients, compute copy
  size_t optimizer_bytes = 0;   // AdamW m and v
  size_t activation_bytes = 0;  // the model's buffers, uploads included
  size_t attention_bytes = 0;   // the attention ops' scratch
  size_t reducer_bytes = 0;     // the exact sum's fixed-point buffer (backend memory)
  size_t host_bytes = 0;        // host-only buffers (the reducer's staging)
  bool device_is_host = true;   // CPU backend: everything is host memory

  size_t device_total() const {
    return weight_bytes + optimizer_bytes + activation_bytes + attention_bytes + reducer_bytes;
  }
  size_t host_total() const { return host_bytes + (device_is_host ? device_total() : 0); }
  // "1.2 GiB (19232 parameters: weights 0.2 MiB, AdamW 0.1 MiB, activations 1.0 GiB)"
  std::string describe() const;
};

// training: AdamW moments and gradient reducer buffers are counted.
// exact_sum / staged: the reducer's fixed-point sum (8 bytes a float, in
// the backend's memory) and its host staging for a transport that wants
// host memory (the sum's 8 bytes, or 4 for the float sum).
MemoryEstimate estimate_memory(Ops& ops, const ModelConfig& model, const ModelCapacity& capacity,
                               DType compute, bool training, bool reducer_exact_sum = false,
                               bool reducer_staged = false);

// Bytes this process may still take on the host: the smaller of the node's
// MemAvailable and what its cgroup (a SLURM job's --mem) has left, shared
// evenly by the `local_ranks` processes of the node, and of what its own
// address-space limit (ulimit -v) leaves.
size_t host_memory_available(int local_ranks);

// "" when the estimate fits; otherwise the reason, e.g. "needs about 48.2
// GiB (...) per rank, more than the 12.0 GiB of host memory available to
// each of 2 rank(s) on this node; lower SIZED_BY".
std::string memory_shortfall(const MemoryEstimate& estimate, const Ops& ops, int local_ranks,
                             const std::string& sized_by);

// Collective: when any rank's `shortfall` is not "", the first rank of each
// node that has one prints "[rank r] PREFIXthe model SHORTFALL" (no rank on
// one rank) and every rank returns kExitUsage; 0 otherwise.
int refuse_on_shortfall(const Communicator& comm, const std::string& shortfall,
                        const std::string& prefix);

// "12.3 GiB", "456.0 MiB"
std::string format_bytes(double bytes);

}  // namespace mpiformer
