// cuDNN fused attention (attention_cudnn.h): the graphs built, cached and
// run. Compiled by the host compiler with the cuDNN frontend's headers when
// the build found them (they take a minute to compile); what a key's graph
// is (its layout and masks) lives in attention_cudnn_graph.cpp. A graph is
// static in its batch slots and longest sequence: both are rounded up
// (slots past the batch are empty sequences) so that a few graphs serve
// every batch of a run; they are built on first use and cached.
#include "kernels/cuda/attention_cudnn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/attention_search.h"
#include "kernels/cuda/attention_cudnn_graph.h"
#include "kernels/cuda/attention_cudnn_keys.h"
#include "kernels/cuda/gemm.h"  // spans_digest
#include "kernels/cuda/ops.h"

namespace mpiformer::cuda {

#if !defined(MPIFORMER_HAVE_CUDNN_FRONTEND)

std::unique_ptr<FlashAttention> FlashAttention::create(CudaOps&, std::string* why_not) {
  *why_not = "this build has no cuDNN frontend (scripts/setup fetches its headers)";
  return nullptr;
}

bool FlashAttention::built() {
  return false;
}

bool FlashAttention::takes_dense_layout() {
  return false;
}

#else

namespace {

namespace fe = cudnn_frontend;

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN does not support the key
  int64_t workspace = 0;
  std::string why;        // without a graph: what cuDNN said
  bool prepared = false;  // a class's graph, kept for the run
  // attention_plan=timed (kernels/attention_search.h): the calls so far;
  // whether its plans were searched; the plan it runs since and its
  // workspace (-1: the frontend's, the first that built in the heuristic's
  // order, untimed); the heuristic's plan, whose bits the chosen one's
  // must equal, and when they are checked again.
  int calls = 0;
  bool searched = false;
  int64_t plan = -1, plan_workspace = 0, heuristic_plan = -1;
  attention_search::BitsChecks checks;
};

// Graphs of unprepared calls kept at most; past it they are dropped and
// built again when next needed (a graph holds host memory and a compiled
// kernel).
constexpr size_t kUnpreparedGraphs = 64;

// The batch metadata of one (batch, layout) pair, kept for every layer of
// a micro-batch (Ragged::version says when the batch changed).
struct MetaEntry {
  const int32_t* q_offsets = nullptr;
  const int32_t* k_offsets = nullptr;
  uint64_t q_version = 0, k_version = 0;
  int64_t slots = 0, q_stride = 0, kv_stride = 0, o_stride = 0, stats_stride = 0;
  void* buffer = nullptr;
  size_t bytes = 0;
};

class CudnnAttention final : public FlashAttention {
 public:
  explicit CudnnAttention(CudaOps& ops) : ops_(ops) {
    if (cudnnCreate(&handle_) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cudnnCreate failed: cuDNN could not start on this GPU");
    if (cudnnSetStream(handle_, ops_.stream()) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cudnnSetStream failed");
    cudaDeviceProp props{};
    check(cudaGetDeviceProperties(&props, ops_.cuda_device().ordinal()), "cudaGetDeviceProperties");
    sm_ = props.major * 10 + props.minor;
  }
  ~CudnnAttention() override {
    for (MetaEntry& m : metas_)
      if (m.buffer) cudaFree(m.buffer);
    if (digest_total_) cudaFree(digest_total_);
    graphs_.clear();
    if (handle_) cudnnDestroy(handle_);
  }

  bool forward(Act out, float* stats, Act q, int q_stride, Act k, Act v, int kv_stride,
               const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg) override {
    refusal_ = unsupported(qs, ks, cfg);
    if (!refusal_.empty()) return false;
    const GraphKey key = call_key(false, out.dtype, q_stride, kv_stride, qs, ks, cfg);
    Entry* entry = usable_graph(key, qs, ks);
    if (!entry) return false;
    const Act q_used = fold_queries(q, q_stride, qs, ks, cfg);
    const size_t C = static_cast<size_t>(cfg.heads) * cfg.head_dim;
    std::vector<DigestSpan> outputs;
    if (plans_timed()) {
      outputs = {{out.data, static_cast<size_t>(qs.total) * C * dtype_bytes(out.dtype), 0},
                 {stats, static_cast<size_t>(qs.total) * cfg.heads * sizeof(float),
                  gemm_search::kOutputStride}};
    }
    run(*entry, pack_of(q_used, k, v, out, stats, qs, ks, key), "forward", outputs,
        batch_lengths(qs, ks));
    return true;
  }

  bool backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats, Act q, int q_stride,
                Act k, Act v, int kv_stride, const Ragged& qs, const Ragged& ks,
                const AttentionConfig& cfg) override {
    refusal_ = unsupported(qs, ks, cfg);
    if (!refusal_.empty()) return false;
    const GraphKey key = call_key(true, dout.dtype, q_stride, kv_stride, qs, ks, cfg);
    Entry* entry = usable_graph(key, qs, ks);
    if (!entry) return false;
    // The forward's q (with the folded factor), and dq at it when folded.
    const Act q_used = fold_queries(q, q_stride, qs, ks, cfg);
    const bool folded = q_used.data != q.data;
    const int C = cfg.heads * cfg.head_dim;
    const Act dq_used =
        folded ? Act(ops_.scratch(CudaOps::kAttentionQueryGrad,
                                  static_cast<size_t>(qs.total) * C * dtype_bytes(dq.dtype)),
                     dq.dtype)
               : dq;
    const float* stats_used = key.dense ? packed_stats(stats, qs, cfg.heads) : stats;
    Pack pack = pack_of(q_used, k, v, out, stats_used, qs, ks, key);
    pack.insert({{kDO, dout.data}, {kDQ, dq_used.data}, {kDK, dk.data}, {kDV, dv.data}});
    const size_t bytes = dtype_bytes(dq.dtype);
    std::vector<DigestSpan> outputs;
    if (plans_timed()) {
      outputs = {
          {dq_used.data, rows_span(qs.total, folded ? C : q_stride, C) * bytes, 0},
          {dk.data, rows_span(ks.total, kv_stride, C) * bytes, gemm_search::kOutputStride},
          {dv.data, rows_span(ks.total, kv_stride, C) * bytes, 2 * gemm_search::kOutputStride}};
    }
    run(*entry, std::move(pack), "backward", outputs, batch_lengths(qs, ks));
    // dL/dq = f * dL/dq' into the caller's q layout.
    if (folded) launch_scale_queries(dq, q_stride, dq_used, C, qs, ks, cfg, ops_.stream());
    return true;
  }

  const std::string& refusal() const override { return refusal_; }
  std::string search_summary() const override { return searches_.describe(); }
  int64_t graphs() const override { return static_cast<int64_t>(graphs_.size()); }

  AttentionPreparation prepare(const std::vector<AttentionCase>& cases, DType dtype,
                               bool backward) override {
    const auto start = std::chrono::steady_clock::now();
    const bool dense = dense_switched() && takes_dense_layout();
    for (const AttentionCase& c : cases) {
      if (!unsupported_config(c.cfg).empty()) continue;
      const GraphLayout layout = layout_of(c.cfg, c.q_stride, c.kv_stride);
      planned_.add(layout, c.q, c.k);
      if (dense) planned_.add_uniform(layout, c.q, c.k);
    }
    prepared_run_ = true;
    AttentionPreparation done;
    done.cases = static_cast<int>(planned_.entries().size());
    std::vector<size_t> workspaces;
    // Forward and, training, backward graphs of a shape. A dense graph
    // cuDNN refuses is not counted: its batch takes the ragged layout.
    const auto build_passes = [&](bool dense, const auto& key_of_pass) {
      for (const bool pass : {false, true}) {
        if (pass && !backward) continue;
        const Entry* entry = graph_for(key_of_pass(pass), GraphUse::kPrepared);
        if (entry->graph) {
          ++done.graphs;
          workspaces.push_back(static_cast<size_t>(entry->workspace));
        } else if (!dense) {
          ++done.graphs;
          if (done.refused++ == 0) done.first_refusal = entry->why;
        }
      }
    };
    int64_t most_slots = 0;
    for (const PlannedShapes::Entry& e : planned_.entries()) {
      most_slots = std::max(most_slots, e.shape.slots);
      build_passes(false, [&](bool pass) {
        return key_of(pass, dtype, e.layout, e.shape, ops_.deterministic());
      });
    }
    // attention=dense: the uniform classes' own shapes in the dense layout
    // too, so that no step builds one.
    for (const PlannedShapes::Uniform& u : planned_.uniform()) {
      build_passes(true, [&](bool pass) {
        return dense_key_of(pass, dtype, u.layout, u.shape, ops_.deterministic());
      });
    }
    reserve(reserved_workspace(workspaces), most_slots);
    done.workspace_bytes = reserved_;
    done.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return done;
  }

  std::string version() const override {
    const size_t v = cudnnGetVersion();  // major * 10000 + minor * 100 + patch since 9
    const int f = CUDNN_FRONTEND_VERSION;
    return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100) + ", frontend " + std::to_string(f / 10000) + "." +
           std::to_string(f / 100 % 100) + "." + std::to_string(f % 100);
  }

 private:
  // The key of a call: its class's prepared shape, or its own rounded up;
  // with attention=dense, a batch of equal lengths its own dense graph
  // where it has one (dense_graph_ready).
  GraphKey call_key(bool backward, DType dtype, int q_stride, int kv_stride, const Ragged& qs,
                    const Ragged& ks, const AttentionConfig& cfg) {
    const GraphLayout layout = layout_of(cfg, q_stride, kv_stride);
    if (dense_switched()) {
      const GraphKey dense =
          dense_key_of(backward, dtype, layout, dense_shape(qs, ks), ops_.deterministic());
      const bool ready =
          takes_dense_layout() && equal_lengths(qs, ks) && dense_graph_ready(dense, layout, qs, ks);
      ops_.count_candidate(CandidateCalls::kAttention, ready);
      if (ready) return dense;
    }
    const PlannedShapes::Entry* planned = planned_.covering(layout, qs, ks);
    const GraphShape shape = planned ? planned->shape : rounded_shape(qs, ks, cfg.causal);
    return key_of(backward, dtype, layout, shape, ops_.deterministic());
  }

  bool dense_switched() const {
    return ops_.kernel_switches().attention == KernelSwitches::Attention::kDense;
  }

  // Whether a batch of equal lengths runs its dense graph. A run that
  // prepared its classes runs those it prepared, a uniform class's (a
  // bucket's batches vary in count, so no step builds one); another builds
  // it on first use, and runs it where its workspace may be taken. Where
  // cuDNN does not take it, the ragged layout runs the call.
  bool dense_graph_ready(const GraphKey& key, const GraphLayout& layout, const Ragged& qs,
                         const Ragged& ks) {
    if (prepared_run_) {
      if (!planned_.holds_uniform(layout, dense_shape(qs, ks))) return false;
      const auto it = graphs_.find(key.text());
      return it != graphs_.end() && it->second.graph != nullptr;  // its workspace reserved
    }
    const Entry* entry = graph_for(key, GraphUse::kTrial);
    return entry->graph != nullptr && workspace_allowed(*entry, qs, ks, key.heads);
  }

  // Whether a call may take a graph's workspace: the reserved one, or
  // unplanned_workspace_budget.
  bool workspace_allowed(const Entry& entry, const Ragged& qs, const Ragged& ks, int heads) const {
    const size_t need = static_cast<size_t>(entry.workspace);
    return need <= reserved_ ||
           need <= unplanned_workspace_budget(qs, ks, heads, reserved_,
                                              ops_.device().device_memory_free());
  }

  // Reserves the workspace every call shares, and metadata buffers for
  // `slots`, before the first step. Throws when the device cannot hold it.
  void reserve(size_t workspace, int64_t slots) {
    const size_t free = ops_.device().device_memory_free();
    if (!workspace_fits(workspace, reserved_, free)) {
      throw std::runtime_error(
          "cuDNN attention needs a workspace of " + mib(static_cast<int64_t>(workspace)) +
          " for the largest batch of the run, more than the " + mib(static_cast<int64_t>(free)) +
          " free on the GPU (less " + mib(static_cast<int64_t>(kWorkspaceHeadroom)) +
          " kept for the libraries)");
    }
    reserved_ = std::max(reserved_, workspace);
    if (reserved_ > 0) ops_.scratch(CudaOps::kAttentionScores, reserved_ + 16);
    const size_t bytes = attention_meta_bytes(static_cast<int>(std::max<int64_t>(slots, 8)));
    for (MetaEntry& m : metas_) grow_meta(m, bytes);
  }

  // Grows a metadata buffer to `bytes`; it then holds no batch.
  void grow_meta(MetaEntry& m, size_t bytes) {
    if (m.bytes >= bytes) return;
    if (m.buffer) {
      check(cudaStreamSynchronize(ops_.stream()), "cudaStreamSynchronize");
      check(cudaFree(m.buffer), "cudaFree");
      m.buffer = nullptr;
    }
    check(cudaMalloc(&m.buffer, bytes), "cudaMalloc (attention metadata)");
    ops_.count_workspace(bytes - m.bytes);
    m.bytes = bytes;
    m.q_offsets = m.k_offsets = nullptr;
  }

  // The graph of a key when it exists and its workspace fits: a prepared
  // class's always does (its workspace is reserved); another call's must fit
  // unplanned_workspace_budget. Else null, with refusal_ saying why.
  Entry* usable_graph(const GraphKey& key, const Ragged& qs, const Ragged& ks) {
    Entry* entry = graph_for(key, GraphUse::kCall);
    if (!entry->graph) {
      refusal_ = entry->why;
      return nullptr;
    }
    const size_t need = static_cast<size_t>(entry->workspace);
    if (need <= reserved_) return entry;
    const size_t budget = unplanned_workspace_budget(qs, ks, key.heads, reserved_,
                                                     ops_.device().device_memory_free());
    if (need <= budget) {
      // run() grows the shared workspace to it: later calls need not ask the
      // device's free memory again (no driver query per call in the step).
      reserved_ = need;
      return entry;
    }
    refusal_ = describe_key(key) + " needs " + mib(entry->workspace) + " of workspace, over " +
               mib(static_cast<int64_t>(budget)) +
               " (a quarter of the GPU's free memory, or the reserved workspace)";
    if (!workspace_note_said_) {
      workspace_note_said_ = true;
      std::fprintf(stderr,
                   "mpiformer: cuDNN attention: %s; the plain CUDA kernels take such "
                   "batches (counted in the attention calls)\n",
                   refusal_.c_str());
      std::fflush(stderr);
    }
    return nullptr;
  }

  // The stats as cuDNN's dense backward reads them (launch_pack_stats).
  const float* packed_stats(const float* stats, const Ragged& qs, int heads) {
    auto* packed = static_cast<float*>(ops_.scratch(
        CudaOps::kAttentionStats, sizeof(float) * static_cast<size_t>(qs.total) * heads));
    launch_pack_stats(packed, stats, qs.batch, qs.max_len, heads, ops_.stream());
    return packed;
  }

  // q, or q' = f * q (dense) when the scale depends on the query.
  Act fold_queries(Act q, int q_stride, const Ragged& qs, const Ragged& ks,
                   const AttentionConfig& cfg) {
    if (cfg.scale != AttentionScale::kLogLength) return q;
    const int C = cfg.heads * cfg.head_dim;
    const Act folded(ops_.scratch(CudaOps::kAttentionQuery,
                                  static_cast<size_t>(qs.total) * C * dtype_bytes(q.dtype)),
                     q.dtype);
    launch_scale_queries(folded, C, q, q_stride, qs, ks, cfg, ops_.stream());
    return folded;
  }

  // What a graph is built for: a prepared class (kept for the run); a call
  // (said once on stderr when cuDNN does not take it; a prepared class is
  // told on the start line instead); a trial of the dense layout, which
  // falls back to the ragged one unsaid.
  enum class GraphUse { kPrepared, kCall, kTrial };

  // The graph of a key, built on first use.
  Entry* graph_for(const GraphKey& key, GraphUse use) {
    const std::string text = key.text();
    const bool prepared = use == GraphUse::kPrepared;
    if (const auto it = graphs_.find(text); it != graphs_.end()) {
      if (prepared && !it->second.prepared) {  // built by a call before: kept from now on
        it->second.prepared = true;
        ++prepared_graphs_;
      }
      return &it->second;
    }
    if (prepared) ++prepared_graphs_;
    if (graphs_.size() >= prepared_graphs_ + kUnpreparedGraphs) {
      std::erase_if(graphs_, [](const auto& item) { return !item.second.prepared; });
    }
    Entry& entry = graphs_[text];
    entry.prepared = prepared;
    try {
      entry.graph = build(key, &entry.workspace, &entry.why);
    } catch (const std::exception& e) {
      entry.why = e.what();
    }
    if (!entry.graph) {
      entry.why = "cuDNN does not take " + describe_key(key) + ": " + entry.why;
      // Once per shape class: the calls are counted (CudaOps::attention_calls).
      if (use == GraphUse::kCall && ops_.attention_path() == AttentionPath::kAuto) {
        std::fprintf(stderr, "mpiformer: %s; the plain CUDA kernels run it\n", entry.why.c_str());
        std::fflush(stderr);
      }
    }
    return &entry;
  }

  std::shared_ptr<fe::graph::Graph> build(const GraphKey& key, int64_t* workspace,
                                          std::string* why) {
    std::shared_ptr<fe::graph::Graph> g = build_with(key, {fe::HeurMode_t::A}, workspace, why);
    // attention_plan=timed: where heuristic A takes the key, the plans of
    // A and B, more to time (A's first, so its first that builds leads, as
    // in A's alone); otherwise A's.
    if (!g || !plans_timed()) return g;
    try {
      std::string unused;
      int64_t wider_workspace = 0;
      if (auto wider =
              build_with(key, {fe::HeurMode_t::A, fe::HeurMode_t::B}, &wider_workspace, &unused)) {
        *workspace = wider_workspace;
        return wider;
      }
    } catch (const std::exception&) {  // A's graph, which built, serves the key
    }
    return g;
  }

  // The graph of a key, its heuristics' first plan that builds built;
  // null, with *why, where none does.
  std::shared_ptr<fe::graph::Graph> build_with(const GraphKey& key,
                                               const std::vector<fe::HeurMode_t>& modes,
                                               int64_t* workspace, std::string* why) {
    std::shared_ptr<fe::graph::Graph> g = describe(key, sm_);
    const auto ok = [&](fe::error_t status, const char* step) {
      if (status.is_bad()) *why = std::string(step) + ": " + status.get_message();
      return !status.is_bad();
    };
    if (!ok(g->validate(), "validate") ||
        !ok(g->build_operation_graph(handle_), "operation graph") ||
        !ok(g->create_execution_plans(modes), "execution plans") ||
        !ok(g->check_support(handle_), "support") || !ok(g->build_plans(), "plans") ||
        !ok(g->get_workspace_size(*workspace), "workspace size")) {
      return nullptr;
    }
    return g;
  }

  // The metadata of this batch for this graph's slots and layout.
  AttentionMeta meta_for(const Ragged& qs, const Ragged& ks, const GraphKey& key) {
    const int64_t C = static_cast<int64_t>(key.heads) * key.head_dim;
    MetaEntry wanted;
    wanted.q_offsets = qs.device_offsets;
    wanted.k_offsets = ks.device_offsets;
    wanted.q_version = qs.version;
    wanted.k_version = ks.version;
    wanted.slots = key.slots;
    wanted.q_stride = key.q_stride;
    wanted.kv_stride = key.kv_stride;
    wanted.o_stride = C;
    wanted.stats_stride = key.heads;
    const auto same = [&](const MetaEntry& m) {
      return m.buffer && m.q_offsets == wanted.q_offsets && m.k_offsets == wanted.k_offsets &&
             m.q_version == wanted.q_version && m.k_version == wanted.k_version &&
             m.slots == wanted.slots && m.q_stride == wanted.q_stride &&
             m.kv_stride == wanted.kv_stride && m.o_stride == wanted.o_stride &&
             m.stats_stride == wanted.stats_stride;
    };
    // Version 0 means unknown offsets: derive them anew.
    if (qs.version != 0 && ks.version != 0) {
      for (MetaEntry& m : metas_)
        if (same(m)) return attention_meta(m.buffer, static_cast<int>(m.slots));
    }
    // Replace the oldest entry (stream order keeps earlier readers safe).
    MetaEntry& m = metas_[next_meta_];
    next_meta_ = (next_meta_ + 1) % kMetaEntries;
    grow_meta(m, attention_meta_bytes(static_cast<int>(wanted.slots)));
    wanted.buffer = m.buffer;
    wanted.bytes = m.bytes;
    m = wanted;
    const AttentionMeta meta = attention_meta(m.buffer, static_cast<int>(m.slots));
    launch_attention_meta(meta, qs.device_offsets, ks.device_offsets, qs.batch,
                          static_cast<int>(m.slots), m.q_stride, m.kv_stride, m.o_stride,
                          m.stats_stride, ops_.stream());
    return meta;
  }

  // A graph's tensors by uid.
  using Pack = std::unordered_map<int64_t, void*>;
  // What forward and backward both read: q, k, v, out, stats, and in the
  // ragged layout the batch's metadata.
  Pack pack_of(Act q, Act k, Act v, Act out, const float* stats, const Ragged& qs, const Ragged& ks,
               const GraphKey& key) {
    Pack pack{{kQ, q.data},
              {kK, k.data},
              {kV, v.data},
              {kO, out.data},
              {kStats, const_cast<float*>(stats)}};
    if (key.dense) return pack;
    const AttentionMeta meta = meta_for(qs, ks, key);
    pack.insert({{kSeqQ, meta.seq_q},
                 {kSeqKv, meta.seq_kv},
                 {kRoQ, meta.ro_q},
                 {kRoKv, meta.ro_kv},
                 {kRoO, meta.ro_o},
                 {kRoStats, meta.ro_stats}});
    return pack;
  }

  // Elements from the first row's start to the last row's end: `rows` rows
  // of `width` elements, `stride` apart.
  static size_t rows_span(int64_t rows, int64_t stride, int64_t width) {
    return rows > 0 ? static_cast<size_t>((rows - 1) * stride + width) : 0;
  }

  // Runs the graph's plan: the frontend's, or the one its search chose.
  // attention_plan=timed: the graph's kSearchOnCall-th call searches
  // first, and later calls check the chosen plan's bits against the
  // heuristic's again where entry.checks says. outputs: what the call
  // writes (given under attention_plan=timed alone); lengths: the call's
  // batch_lengths.
  void run(Entry& entry, Pack pack, const char* what, const std::vector<DigestSpan>& outputs,
           const attention_search::BatchLengths& lengths) {
    if (plans_timed()) {
      if (!entry.searched && ++entry.calls >= attention_search::kSearchOnCall)
        search(entry, pack, outputs, lengths);
      else if (entry.plan != entry.heuristic_plan && entry.checks.due(lengths))
        verify(entry, pack, outputs, lengths);
      ops_.count_candidate(CandidateCalls::kAttentionPlan, entry.plan >= 0);
    }
    void* workspace = ops_.scratch(CudaOps::kAttentionScores,
                                   std::max(entry.workspace, entry.plan_workspace) + 16);
    fe::error_t status =
        entry.plan >= 0 ? entry.graph->execute_plan_at_index(handle_, pack, workspace, entry.plan)
                        : entry.graph->execute(handle_, pack, workspace);
    if (status.is_bad()) {
      throw std::runtime_error(std::string("cuDNN attention ") + what + ": " +
                               status.get_message());
    }
  }

  bool plans_timed() const {
    return ops_.kernel_switches().attention_plan == KernelSwitches::AttentionPlan::kTimed;
  }

  // What tells one batch's lengths from another's for the checks of a
  // chosen plan's bits.
  static attention_search::BatchLengths batch_lengths(const Ragged& qs, const Ragged& ks) {
    uint64_t h = 0;
    for (const int64_t n : {int64_t{qs.batch}, int64_t{qs.total}, int64_t{qs.max_len},
                            int64_t{ks.total}, int64_t{ks.max_len}})
      h = h * 0x100000001b3ull ^ static_cast<uint64_t>(n);
    return {h, std::max(qs.max_len, ks.max_len)};
  }

  // The timed search of a graph's plans on this call's operands (each run
  // writes the outputs; the call's own run follows and writes them again):
  // the heuristic's plan first, then every other plan its heuristics offer
  // that builds, whose workspace fits in what is reserved, and whose name
  // no earlier one had. From here on the graph runs a plan by its index
  // (building another makes it the frontend's choice): the heuristic's
  // where the search fails.
  void search(Entry& entry, Pack& pack, const std::vector<DigestSpan>& outputs,
              const attention_search::BatchLengths& lengths) {
    entry.searched = true;
    if (searches_.searches() >= attention_search::kMostSearches) {
      ++searches_.past_most;
      return;
    }
    ops_.finish_side_stream();  // nothing else on the GPU while it times
    fe::graph::Graph& g = *entry.graph;
    const int64_t first = built_plan(g);  // the frontend's: the one plan built so far
    if (first < 0) return;
    entry.plan = entry.heuristic_plan = first;
    entry.plan_workspace = entry.workspace;
    const size_t limit = std::max(reserved_, static_cast<size_t>(entry.workspace));
    const bool same_bits = ops_.deterministic();
    int not_built = 0;
    const std::vector<int64_t> plans = plans_to_try(g, first, limit, same_bits, &not_built);
    void* workspace = ops_.scratch(CudaOps::kAttentionScores, limit + 16);
    const std::vector<attention_search::Trial> trials =
        time_plans(g, plans, pack, workspace, same_bits ? &outputs : nullptr);
    const int winner = gemm_search::winner(trials, same_bits);
    searches_.add(trials, winner, same_bits, not_built);
    if (attention_search::search_failed(trials, winner)) return;
    entry.plan = attention_search::chosen_plan(plans, winner);
    entry.checks.searched(lengths, same_bits);
    if (g.get_workspace_size_plan_at_index(entry.plan, entry.plan_workspace).is_bad())
      entry.plan_workspace = static_cast<int64_t>(limit);  // it ran within the limit
  }

  // The index of the first built plan of g, or -1.
  static int64_t built_plan(const fe::graph::Graph& g) {
    for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
      int64_t bytes = 0;
      if (g.get_workspace_size_plan_at_index(i, bytes).is_good()) return i;
    }
    return -1;
  }

  // The plans a search runs: `first` (built), then each other name the
  // heuristics offer once, built where it builds with at most `limit`
  // bytes of workspace and, where the bits must match, where cuDNN does
  // not call it nondeterministic (one that adds into dQ atomically can
  // agree with the first wherever each sum has one term); *not_built
  // counts the others.
  static std::vector<int64_t> plans_to_try(fe::graph::Graph& g, int64_t first, size_t limit,
                                           bool same_bits, int* not_built) {
    std::vector<int64_t> plans = {first};
    std::vector<std::string> names(1);
    if (g.get_plan_name_at_index(first, names[0]).is_bad()) return plans;
    g.deselect_workspace_greater_than(static_cast<int64_t>(limit));
    if (same_bits) g.deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
    for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
      std::string name;
      if (i == first || g.get_plan_name_at_index(i, name).is_bad() ||
          std::find(names.begin(), names.end(), name) != names.end())
        continue;
      names.push_back(name);
      int64_t bytes = 0;
      if (g.build_plan_at_index(i).is_good() &&
          g.get_workspace_size_plan_at_index(i, bytes).is_good() &&
          static_cast<size_t>(bytes) <= limit)
        plans.push_back(i);
      else
        ++*not_built;
    }
    return plans;
  }

  // One trial per plan of `plans`: a run (whose outputs' digest, where
  // `outputs` is given, must match the first's to be timed), then the
  // timed runs. A plan that fails is not run again.
  std::vector<attention_search::Trial> time_plans(fe::graph::Graph& g,
                                                  const std::vector<int64_t>& plans, Pack& pack,
                                                  void* workspace,
                                                  const std::vector<DigestSpan>* outputs) {
    const TimingEvents events;
    std::vector<attention_search::Trial> trials;
    for (const int64_t plan : plans) {
      attention_search::Trial trial;
      trial.ran = g.execute_plan_at_index(handle_, pack, workspace, plan).is_good();
      if (!trial.ran) cudaGetLastError();  // a plan that will not run is passed over
      if (trial.ran && outputs)
        trial.digest = spans_digest(*outputs, &digest_total_, ops_.stream());
      trials.push_back(trial);
      if (!trials[0].ran) break;  // the heuristic's plan failed: nothing to compare with
      const bool set_aside = outputs && gemm_search::other_bits(trials, trials.size() - 1);
      if (trial.ran && !set_aside)
        trials.back().ms = plan_ms(g, pack, workspace, plan, events.start, events.stop);
    }
    return trials;
  }

  // The check of a chosen plan's bits on a later batch (entry.checks):
  // the heuristic's plan, then the chosen one, each run and digested;
  // where they differ the graph goes back to the heuristic's plan (a plan
  // whose bits differ only where a sequence spans more tiles, say, than
  // the search's batch had).
  void verify(Entry& entry, Pack& pack, const std::vector<DigestSpan>& outputs,
              const attention_search::BatchLengths& lengths) {
    void* workspace = ops_.scratch(CudaOps::kAttentionScores,
                                   std::max(entry.workspace, entry.plan_workspace) + 16);
    uint64_t digests[2] = {};
    const int64_t plans[2] = {entry.heuristic_plan, entry.plan};
    for (int i = 0; i < 2; ++i) {
      if (entry.graph->execute_plan_at_index(handle_, pack, workspace, plans[i]).is_bad()) {
        cudaGetLastError();
        digests[i] = ~uint64_t{0} - i;  // not run: counts as other bits
        continue;
      }
      digests[i] = spans_digest(outputs, &digest_total_, ops_.stream());
    }
    if (digests[0] == digests[1]) {
      entry.checks.passed(lengths);
      return;
    }
    entry.checks.stop();
    entry.plan = entry.heuristic_plan;
    entry.plan_workspace = entry.workspace;
    ++searches_.rejected;
  }

  // Milliseconds of plan i's kTimedRuns runs; negative if one failed.
  float plan_ms(fe::graph::Graph& g, Pack& pack, void* workspace, int64_t i, cudaEvent_t start,
                cudaEvent_t stop) {
    check(cudaEventRecord(start, ops_.stream()), "cudaEventRecord");
    for (int r = 0; r < attention_search::kTimedRuns; ++r) {
      if (g.execute_plan_at_index(handle_, pack, workspace, i).is_bad()) {
        cudaGetLastError();
        check(cudaStreamSynchronize(ops_.stream()), "cudaStreamSynchronize");
        return -1.0f;
      }
    }
    check(cudaEventRecord(stop, ops_.stream()), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms;
  }

  // Batches in flight per micro-batch: decoder self-attention, encoder
  // self-attention and cross-attention, forward and backward.
  static constexpr int kMetaEntries = 8;
  CudaOps& ops_;
  int sm_ = 90;  // the GPU's compute capability
  cudnnHandle_t handle_ = nullptr;
  std::unordered_map<std::string, Entry> graphs_;
  PlannedShapes planned_;      // the run's classes (prepare)
  bool prepared_run_ = false;  // prepare ran: no dense graph is built on first use
  size_t prepared_graphs_ = 0;
  size_t reserved_ = 0;  // the workspace held: the classes' reserve, or grown by another call
  std::string refusal_;  // why the last call was refused
  bool workspace_note_said_ = false;  // the line about a workspace over budget, once
  MetaEntry metas_[kMetaEntries];
  int next_meta_ = 0;
  attention_search::Tally searches_;            // attention_plan=timed
  unsigned long long* digest_total_ = nullptr;  // device, made on the first digest
};

}  // namespace

bool FlashAttention::built() {
  return true;
}

bool FlashAttention::takes_dense_layout() {
  return cudnnGetVersion() >= 91200;
}

std::unique_ptr<FlashAttention> FlashAttention::create(CudaOps& ops, std::string* why_not) {
  // Ragged statistics and offsets for backward need cuDNN 9.6 or newer.
  const size_t version = cudnnGetVersion();
  if (version < 90600) {
    *why_not = "cuDNN " + std::to_string(version / 10000) + "." +
               std::to_string(version / 100 % 100) +
               " is older than 9.6, which ragged attention needs";
    return nullptr;
  }
  return std::make_unique<CudnnAttention>(ops);
}

#endif

}  // namespace mpiformer::cuda
