// Memory a command will hold, estimated from its flags before anything is
// allocated, and checked against what this rank may use: a run that cannot
// fit is refused with one line naming the flags that size it, instead of
// dying in an allocation (or being killed by the kernel) minutes later.
//
// Counted per rank, by kind: the weights' compute copy (fp32: the master
// weights themselves), separate fp32 masters (bf16, fp16), the AdamW
// moments, the gradients, the model's activation buffers at its capacity
// (--max-tokens, or --beam x max-len for generate; what --recompute keeps),
// and buffers: the attention ops' scratch (the scores of the longest
// sequence), the exact sum's fixed-point buffer and the reducer's host
// staging. --shard-optimizer keeps the moments of the rank's slice only,
// and beside a bf16/fp16 compute copy its fp32 masters too. Not counted:
// the data set in memory and library workspaces (cuBLAS, cuDNN), so the
// estimate is a floor.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/core/config.h"
#include "src/data/batch_source.h"
#include "src/model/model.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

// What a command keeps besides the model's weights and activations.
struct MemoryPlan {
  bool training = false;           // gradients and AdamW moments
  int world = 1;                   // ranks of the run
  bool shard_optimizer = false;    // the moments of 1/world of the parameters
  bool reducer_exact_sum = false;  // the fixed-point sum: 8 bytes a float, backend memory
  bool reducer_staged = false;     // host staging for a transport that wants host memory
};

struct MemoryEstimate {
  size_t parameters = 0;
  size_t owned_parameters = 0;  // those whose moments this rank keeps
  size_t weight_bytes = 0;      // the compute copy (fp32: the master weights themselves)
  size_t master_bytes = 0;      // fp32 masters beside a bf16 or fp16 compute copy
  size_t moment_bytes = 0;      // AdamW m and v
  size_t gradient_bytes = 0;    // fp32 gradients
  size_t activation_bytes = 0;  // the model's buffers, uploads included
  size_t buffer_bytes = 0;      // attention scratch and the exact sum (backend memory)
  size_t attention_bytes = 0;   // the attention scratch, of buffer_bytes
  size_t host_bytes = 0;        // host-only buffers (the reducer's staging)
  size_t checkpoint_bytes = 0;  // host: writing a checkpoint (within host_bytes)
  bool device_is_host = true;   // CPU backend: everything is host memory

  size_t device_total() const {
    return weight_bytes + master_bytes + moment_bytes + gradient_bytes + activation_bytes +
           buffer_bytes;
  }
  size_t host_total() const { return host_bytes + (device_is_host ? device_total() : 0); }
  // "1.2 GiB (19232 parameters: weights 75.1 KiB, moments 150.2 KiB,
  // gradients 75.1 KiB, activations 1.0 GiB, buffers 0.2 MiB (attention
  // scratch 0.1 MiB))"
  std::string describe() const;
};

// Counts the attention workspace a run reserved before its first step
// (Ops::prepare_attention) in place of the estimate's attention scratch,
// where it is larger.
void count_attention_workspace(MemoryEstimate* estimate, size_t workspace);

// Prepares `ops`' attention for every batch shape `source` can make with
// `model` (Ops::prepare_attention) and counts the reserved workspace in
// *estimate. A workspace the device cannot hold is a UsageError naming
// `sized_by`, the flags that shrink it.
AttentionPreparation prepare_attention(Ops& ops, const ModelConfig& model,
                                       const std::vector<BatchSource::BucketBound>& bounds,
                                       DType compute, bool training, MemoryEstimate* estimate,
                                       const std::string& sized_by);

// "cuDNN graphs for 8 batch classes (16 graphs) built in 2.1 s; workspace
// 114.0 MiB reserved", or "" when nothing was prepared.
std::string describe_preparation(const AttentionPreparation& done);

MemoryEstimate estimate_memory(Ops& ops, const ModelConfig& model, const ModelCapacity& capacity,
                               DType compute, const MemoryPlan& plan = {});

// For a run whose estimate under `plan` and `capacity` falls short: the
// first of --shard-optimizer true (on more than one rank), --recompute
// activation, both, --recompute layer, and sharding with it, that would make
// it fit, e.g. "--shard-optimizer true (about 1.1 GiB per rank, which
// fits)"; "" when none would. A recompute mode no deeper than the run's own
// is no hint.
std::string fitting_flags(Ops& ops, const ModelConfig& model, const ModelCapacity& capacity,
                          DType compute, const MemoryPlan& plan, int local_ranks);

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

}  // namespace mpiformer
