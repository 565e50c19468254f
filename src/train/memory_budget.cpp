#include "src/train/memory_budget.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "src/core/error.h"
#include "src/core/run_log.h"
#include "src/core/shard_plan.h"
#include "src/parallel/agreement.h"

namespace mpiformer {

namespace {

constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();

// MemAvailable of /proc/meminfo in bytes (kUnlimited when unreadable).
size_t meminfo_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return kUnlimited;
}

// A number from a cgroup file; kUnlimited for "max" or when unreadable.
size_t read_cgroup_value(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return kUnlimited;
  try {
    return static_cast<size_t>(std::stoull(text));
  } catch (const std::exception&) {
    return kUnlimited;
  }
}

// What this process's cgroup (v2, or v1's memory controller) still allows.
size_t cgroup_available() {
  std::ifstream in("/proc/self/cgroup");
  size_t best = kUnlimited;
  for (std::string line; std::getline(in, line);) {
    // "0::/path" (v2) or "N:memory:/path" (v1)
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string limit_file, usage_file;
    if (controllers.empty()) {
      limit_file = "/sys/fs/cgroup" + path + "/memory.max";
      usage_file = "/sys/fs/cgroup" + path + "/memory.current";
    } else if (controllers.find("memory") != std::string::npos) {
      limit_file = "/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes";
      usage_file = "/sys/fs/cgroup/memory" + path + "/memory.usage_in_bytes";
    } else {
      continue;
    }
    const size_t limit = read_cgroup_value(limit_file);
    if (limit == kUnlimited || limit > (size_t{1} << 60)) continue;  // v1 "unlimited"
    const size_t usage = read_cgroup_value(usage_file);
    best = std::min(best, usage == kUnlimited ? limit : limit - std::min(limit, usage));
  }
  return best;
}

// Each CPU thread past the first maps an OpenBLAS buffer (32 to 128 MiB, by
// build) and a malloc arena (128 MiB reserved while it is made) the first
// time it multiplies, and OpenBLAS retries a refused buffer for ever: under
// an address-space limit that room is kept aside, not left to hang a run.
constexpr size_t kWorkerThreadMap = size_t{256} << 20;

size_t worker_threads() {
  return static_cast<size_t>(std::max(omp_get_max_threads(), 1)) - 1;
}

// What RLIMIT_AS (ulimit -v, a batch system's address-space limit) leaves
// this process: the limit less the address space it maps already and what
// its CPU threads will map.
size_t address_space_left() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kUnlimited;
  std::ifstream in("/proc/self/statm");
  size_t pages = 0;  // the first field: the whole address space, in pages
  if (!(in >> pages)) pages = 0;
  const size_t used =
      pages * static_cast<size_t>(sysconf(_SC_PAGESIZE)) + worker_threads() * kWorkerThreadMap;
  return limit.rlim_cur > used ? static_cast<size_t>(limit.rlim_cur) - used : 0;
}

}  // namespace

int refuse_on_shortfall(const Communicator& comm, const std::string& shortfall,
                        const std::string& prefix) {
  Verdict mine;
  if (!shortfall.empty()) {
    mine.code = kExitUsage;
    // One line a node: its ranks share the memory that falls short.
    if (comm.local_rank() == 0) {
      const std::string rank = comm.size() > 1 ? "[rank " + std::to_string(comm.rank()) + "] " : "";
      mine.message = rank + prefix + "the model " + shortfall;
    }
  }
  return agree(comm, mine);
}

std::string MemoryEstimate::describe() const {
  const auto part = [](size_t bytes) { return format_bytes(static_cast<double>(bytes)); };
  std::ostringstream s;
  s << part(device_is_host ? host_total() : device_total())
    << (device_is_host ? "" : " of device memory") << " (" << parameters << " parameters";
  if (owned_parameters != parameters) s << ", " << owned_parameters << " in this rank's slice";
  s << ": weights " << part(weight_bytes);
  if (master_bytes > 0) s << ", masters " << part(master_bytes);
  if (moment_bytes > 0) s << ", moments " << part(moment_bytes);
  if (gradient_bytes > 0) s << ", gradients " << part(gradient_bytes);
  s << ", activations " << part(activation_bytes);
  if (buffer_bytes > 0) {
    s << ", buffers " << part(buffer_bytes);
    // The scores of the longest sequence can dwarf the rest: named apart.
    if (attention_bytes > 0) s << " (attention scratch " << part(attention_bytes) << ")";
  }
  if (host_bytes > checkpoint_bytes) {
    s << (device_is_host ? ", " : "; host: ") << "gradient staging "
      << part(host_bytes - checkpoint_bytes);
  }
  if (checkpoint_bytes > 0) {
    s << (device_is_host || host_bytes > checkpoint_bytes ? ", " : "; host: ")
      << "checkpoint writing " << part(checkpoint_bytes);
  }
  s << ")";
  return s.str();
}

MemoryEstimate estimate_memory(Ops& ops, const ModelConfig& model, const ModelCapacity& capacity,
                               DType compute, const MemoryPlan& plan) {
  const ModelMemory m = Model::measure(ops, model, capacity, compute);
  MemoryEstimate e;
  const size_t P = m.parameters;
  const size_t W = static_cast<size_t>(std::max(plan.world, 1));
  e.parameters = P;
  // Sharded, the largest slice of the plan (whole norm blocks).
  e.owned_parameters =
      plan.training && plan.shard_optimizer ? plan_shards(P, static_cast<int>(W)).largest() : P;
  const bool separate_copy = compute != DType::kF32;
  e.weight_bytes = P * (separate_copy ? dtype_bytes(compute) : sizeof(float));
  // Beside a compute copy, a sharded rank keeps the masters of its slice.
  if (separate_copy) e.master_bytes = e.owned_parameters * sizeof(float);
  e.activation_bytes = m.activation_bytes + m.upload_bytes;
  AttentionConfig attention;
  attention.heads = model.heads;
  attention.head_dim = model.d_model / std::max(model.heads, 1);
  const size_t longest = static_cast<size_t>(std::min(capacity.max_len, capacity.max_tokens));
  e.attention_bytes = ops.attention_scratch_bytes(compute, static_cast<size_t>(capacity.max_tokens),
                                                  longest, attention, plan.training);
  e.buffer_bytes = e.attention_bytes;
  if (plan.training) {
    e.moment_bytes = 2 * e.owned_parameters * sizeof(float);
    e.gradient_bytes = P * sizeof(float);
    const size_t exact_sum = plan.reducer_exact_sum ? (P + 1) * sizeof(int64_t) : 0;
    e.buffer_bytes += exact_sum;
    if (plan.reducer_staged) e.host_bytes = plan.reducer_exact_sum ? exact_sum : P * sizeof(float);
    // A checkpoint stages a tensor on the host; HDF5 checksums and converts
    // a chunk (4 MiB) at a time, and MPI-IO gathers up to 16 MiB per write.
    constexpr size_t kCheckpointLibraryBytes = size_t{32} << 20;
    e.checkpoint_bytes = m.largest_tensor * sizeof(float) + kCheckpointLibraryBytes;
    e.host_bytes += e.checkpoint_bytes;
  }
  e.device_is_host = ops.device().host_accessible();
  return e;
}

void count_attention_workspace(MemoryEstimate* e, size_t workspace) {
  if (workspace <= e->attention_bytes) return;
  e->buffer_bytes += workspace - e->attention_bytes;
  e->attention_bytes = workspace;
}

AttentionPreparation prepare_attention(Ops& ops, const ModelConfig& model,
                                       const std::vector<BatchSource::BucketBound>& bounds,
                                       DType compute, bool training, MemoryEstimate* estimate,
                                       const std::string& sized_by) {
  AttentionPreparation done;
  try {
    done = ops.prepare_attention(Model::attention_cases(model, bounds), compute, training);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string(e.what()) + "; lower " + sized_by);
  }
  count_attention_workspace(estimate, done.workspace_bytes);
  return done;
}

std::string describe_preparation(const AttentionPreparation& done) {
  if (done.graphs == 0) return "";
  char text[160];
  std::snprintf(text, sizeof text,
                "cuDNN graphs for %d batch class(es) (%d graphs) built in %.1f s; workspace %s "
                "reserved",
                done.cases, done.graphs, done.seconds,
                format_bytes(static_cast<double>(done.workspace_bytes)).c_str());
  std::string line = text;
  if (done.refused > 0)
    line +=
        "; " + std::to_string(done.refused) + " the plain kernels run (" + done.first_refusal + ")";
  return line;
}

std::string fitting_flags(Ops& ops, const ModelConfig& model, const ModelCapacity& capacity,
                          DType compute, const MemoryPlan& plan, int local_ranks) {
  struct Option {
    bool shard;
    Recompute recompute;
    const char* flags;
  };
  const Option options[] = {
      {true, Recompute::kNone, "--shard-optimizer true"},
      {false, Recompute::kActivation, "--recompute activation"},
      {true, Recompute::kActivation, "--shard-optimizer true with --recompute activation"},
      {false, Recompute::kLayer, "--recompute layer"},
      {true, Recompute::kLayer, "--shard-optimizer true with --recompute layer"}};
  for (const Option& o : options) {
    // Sharding needs ranks to share with; a flag already given is no hint.
    // The modes are in the order of what they save: none, activation, layer.
    if ((o.shard && (plan.shard_optimizer || plan.world < 2)) ||
        (o.recompute != Recompute::kNone && o.recompute <= capacity.recompute))
      continue;
    MemoryPlan p = plan;
    p.shard_optimizer = plan.shard_optimizer || o.shard;
    ModelCapacity c = capacity;
    c.recompute = std::max(o.recompute, capacity.recompute);
    const MemoryEstimate e = estimate_memory(ops, model, c, compute, p);
    if (memory_shortfall(e, ops, local_ranks, "").empty()) {
      return std::string(o.flags) + " (about " +
             format_bytes(
                 static_cast<double>(e.device_is_host ? e.host_total() : e.device_total())) +
             " per rank, which fits)";
    }
  }
  return "";
}

namespace {

// This rank's share of what the node (and its cgroup) has available.
size_t node_share(int local_ranks) {
  const size_t available = std::min(meminfo_available(), cgroup_available());
  if (available == kUnlimited) return kUnlimited;
  return available / static_cast<size_t>(std::max(local_ranks, 1));
}

// ", after 256 MiB for each of its 3 other CPU threads (--threads)" when
// address space was set aside for them.
std::string threads_aside() {
  const size_t workers = worker_threads();
  if (workers == 0) return "";
  return ", after " + format_bytes(static_cast<double>(kWorkerThreadMap)) + " for each of its " +
         std::to_string(workers) + " other CPU thread(s) (--threads)";
}

}  // namespace

size_t host_memory_available(int local_ranks) {
  return std::min(node_share(local_ranks), address_space_left());
}

std::string memory_shortfall(const MemoryEstimate& e, const Ops& ops, int local_ranks,
                             const std::string& sized_by) {
  const size_t share = node_share(local_ranks), address_space = address_space_left();
  const size_t host_free = std::min(share, address_space);
  if (e.host_total() > host_free) {
    return "needs about " + e.describe() + " per rank, more than the " +
           format_bytes(static_cast<double>(host_free)) +
           (address_space < share
                ? " that the address-space limit (ulimit -v) leaves this process" + threads_aside()
                : " of host memory available to each of " +
                      std::to_string(std::max(local_ranks, 1)) + " rank(s) on this node") +
           "; lower " + sized_by;
  }
  if (!e.device_is_host) {
    const size_t device_free = ops.device().device_memory_free();
    if (e.device_total() > device_free) {
      return "needs about " + e.describe() + ", more than the " +
             format_bytes(static_cast<double>(device_free)) + " free on " + ops.device().name() +
             "; lower " + sized_by;
    }
  }
  return "";
}

}  // namespace mpiformer
