// `mpiformer bench`: times full training steps (forward, backward, clipping,
// AdamW) after warm-up steps, and prints one JSON line. It reports; it
// asserts nothing. The steps run on one synthetic batch of a shape, the same
// every step, or with --data on the trainer's own batches: the model built
// from the flags and the shards as train builds it, each step's
// micro-batches drawn from the shards in training order. Under mpirun every
// rank runs its own batch (with --data its share of the step) and gradients
// go through the bucketed all-reduce, so the line also says what the
// reduction cost.
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/dropout_mask.h"
#include "kernels/profiled_ops.h"
#include "src/app/commands.h"
#include "src/app/profile_table.h"
#include "src/data/make_source.h"
#include "src/model/model.h"
#include "src/optim/adamw.h"
#include "src/parallel/agreement.h"
#include "src/parallel/data_parallel.h"
#include "src/parallel/rank_device.h"
#include "src/train/memory_budget.h"
#include "src/train/shard_config.h"
#include "src/train/startup.h"
#include "src/train/step.h"

namespace mpiformer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Uniform integer in [lo, hi] from a counter-based stream.
int draw(uint64_t seed, uint64_t counter, int lo, int hi) {
  return lo + static_cast<int>(mix64(seed ^ mix64(counter)) % static_cast<uint64_t>(hi - lo + 1));
}

// A batch of random data symbols: B sequences of length seq (or drawn from
// [min_seq, seq]); targets are every next token (lm), 15% of positions (mlm)
// or the target side (seq2seq).
Batch make_bench_batch(const BenchConfig& cfg, int rank) {
  const ModelConfig& m = cfg.run.model;
  const uint64_t seed = cfg.run.seed;
  const int lo_sym = SpecialTokens::kCount, hi_sym = m.vocab - 1;
  uint64_t counter = static_cast<uint64_t>(rank) << 40;  // each rank its own symbols
  auto length = [&](int longest) {
    return cfg.min_seq > 0 ? draw(seed, counter++, std::min(cfg.min_seq, longest), longest)
                           : longest;
  };
  Batch batch;
  std::vector<int32_t> ids;
  for (int b = 0; b < cfg.batch; ++b) {
    if (m.kind == ModelKind::kSeq2seq) {
      ids.resize(length(cfg.src_seq > 0 ? cfg.src_seq : cfg.seq));
      for (int32_t& t : ids) t = draw(seed, counter++, lo_sym, hi_sym);
      batch.encoder.append(ids.data(), static_cast<int>(ids.size()));
    }
    ids.resize(length(cfg.seq));
    for (int32_t& t : ids) t = draw(seed, counter++, lo_sym, hi_sym);
    batch.decoder.append(ids.data(), static_cast<int>(ids.size()));
    for (size_t i = 0; i < ids.size(); ++i) {
      int32_t target = draw(seed, counter++, lo_sym, hi_sym);
      if (m.kind == ModelKind::kMlm && draw(seed, counter++, 0, 99) >= 15) target = m.special.pad;
      batch.targets.push_back(target);
    }
  }
  return batch;
}

// Dense fp32 peak of the CPU cores we run on: AVX2 with two FMA units does
// 32 flops per cycle per core (2 units x 8 lanes x 2).
double estimated_cpu_peak_flops(int threads) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  double mhz = 0.0;
  while (std::getline(cpuinfo, line))
    if (line.rfind("cpu MHz", 0) == 0) {
      mhz = std::stod(line.substr(line.find(':') + 1));
      break;
    }
  if (mhz <= 0.0) mhz = 2000.0;
  return threads * mhz * 1e6 * 32.0;
}

// Dense peak of an H100 SXM (docs/DESIGN.md section 10) for the GEMMs' precision:
// bf16/fp16 tensor cores, TF32 tensor cores, or fp32 CUDA cores.
double h100_peak_flops(Precision precision, bool tf32) {
  if (precision != Precision::kFp32) return 989e12;
  return tf32 ? 494.7e12 : 66.9e12;
}

size_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<size_t>(usage.ru_maxrss) * 1024;
}

// `, "NAME": "TEXT"`, or nothing where TEXT is empty.
std::string text_field(const char* name, const std::string& text) {
  return text.empty() ? "" : ", \"" + std::string(name) + "\": \"" + text + "\"";
}

// `, "profile_ms": {"gemm": 1.234, ..., "other": 0.5}` (per step; other:
// outside_ops_ms), or "" without --profile.
std::string profile_json(const std::vector<double>& ms, double step_ms) {
  if (ms.empty()) return "";
  std::string out = ", \"profile_ms\": {";
  char buf[64];
  for (int f = 0; f < static_cast<int>(OpFamily::kCount); ++f) {
    std::snprintf(buf, sizeof buf, "%s\"%s\": %.3f", f ? ", " : "",
                  to_string(static_cast<OpFamily>(f)), ms[f]);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, ", \"other\": %.3f}", outside_ops_ms(ms, step_ms));
  return out + buf;
}

// This rank's micro-batches of each step: one synthetic batch, the same
// every step; or with --data train's own. Global micro-batch g is batch
// g % M of epoch g / M of the shards' shuffled epochs (M batches each;
// src/data/shard_source.h), so the steps run on from one epoch into the
// next, and rank r takes micro-batches r, r + W, ... of each step's W K
// (DataCursor, as a fresh train run sets it).
class StepBatches {
 public:
  explicit StepBatches(Batch synthetic) : micro_(1, std::move(synthetic)) {}
  StepBatches(std::unique_ptr<BatchSource> source, int accum, const Communicator& comm)
      : source_(std::move(source)), micro_(accum) {
    const bool global = source_->global_indices();  // --sharding file: this rank's own
    cursor_.accum = accum;
    cursor_.batches_per_step = global ? static_cast<int64_t>(comm.size()) * accum : accum;
    cursor_.first = global ? comm.rank() : 0;
    cursor_.stride = global ? comm.size() : 1;
  }

  // The loader thread starts building batches ahead, as the training loop
  // has it do before its first step.
  void start() {
    if (source_) source_->prefetch(cursor_.first, cursor_.stride);
  }
  const std::vector<Batch>& of_step(int64_t step) {
    if (source_) {
      for (int k = 0; k < cursor_.accum; ++k)
        source_->make_batch(BatchSource::kTrain, cursor_.index(step, k), &micro_[k]);
    }
    return micro_;
  }
  // What the model must hold: with --data what train sizes it for, else
  // the synthetic batch.
  ModelCapacity capacity(const TrainConfig& run) const {
    if (source_) {
      return ModelCapacity{run.max_tokens, run.model.max_len, source_->max_batch_sequences(),
                           run.recompute};
    }
    const Batch& b = micro_[0];
    return ModelCapacity{std::max(b.decoder.total(), b.encoder.total()),
                         std::max(b.decoder.max_len(), b.encoder.max_len()), 0, run.recompute};
  }
  // The largest batch of each bucket, for the attention to prepare: the
  // synthetic batch is its own, every step's (uniform where its lengths
  // are equal).
  std::vector<BatchSource::BucketBound> bucket_bounds() const {
    if (source_) return source_->bucket_bounds();
    const auto side = [](const PackedSequences& p) {
      const bool uniform = p.total() == int64_t{p.batch()} * p.max_len();
      return SideBound{p.batch(), p.max_len(), p.total(), uniform ? p.max_len() : 0};
    };
    const Batch& b = micro_[0];
    return {BatchSource::BucketBound{side(b.decoder), side(b.encoder)}};
  }
  // The source's summary for the start line ("" for the synthetic batch).
  std::string describe() const { return source_ ? source_->describe() : ""; }
  bool from_data() const { return source_ != nullptr; }

 private:
  std::unique_ptr<BatchSource> source_;  // null: the synthetic batch
  DataCursor cursor_;
  std::vector<Batch> micro_;  // (K) this rank's micro-batches of the step
};

// What the timed steps' batches held, counted as train's progress window
// counts them (ProgressWindow::add_batch): real tokens are the sequences'
// own tokens, both sides (Batch::real_tokens: what train's tok/s counts);
// padded tokens the slots of the batches' shapes, each side's sequences
// times its longest (Batch::padded_tokens: train's pad-eff is real over
// padded); target tokens the loss's weight, a classifier's examples
// (Batch::target_tokens: train's `tokens`).
struct BatchTally {
  int64_t real = 0, padded = 0, targets = 0, sequences = 0;
  int longest = 0;     // the longest sequence of either side
  double flops = 0.0;  // Model::training_flops
  // A batch's shape: (encoder sequences, its longest, decoder sequences, its longest).
  std::set<std::array<int, 4>> shapes;

  void add(const Batch& b, const Model& model) {
    real += b.real_tokens();
    padded += b.padded_tokens();
    targets += b.target_tokens(model.config().special.pad);
    sequences += b.decoder.batch();
    longest = std::max({longest, b.encoder.max_len(), b.decoder.max_len()});
    flops += model.training_flops(b);
    // An empty micro-batch (a rank without shards under --sharding file) runs nothing.
    if (b.decoder.batch() > 0)
      shapes.insert(
          {b.encoder.batch(), b.encoder.max_len(), b.decoder.batch(), b.decoder.max_len()});
  }

  // Every rank's figures, on every rank: sums, the longest, the union of
  // the shapes (each rank's set broadcast in turn). Collective.
  void make_global(const Communicator& comm) {
    int64_t counts[4] = {real, padded, targets, sequences};
    comm.allreduce_sum(counts, 4);
    real = counts[0], padded = counts[1], targets = counts[2], sequences = counts[3];
    longest = comm.max(longest);
    flops = comm.allreduce_sum(flops);
    std::set<std::array<int, 4>> all;
    for (int r = 0; r < comm.size(); ++r) {
      std::string text;
      if (r == comm.rank()) {
        for (const auto& s : shapes)
          text += std::to_string(s[0]) + " " + std::to_string(s[1]) + " " + std::to_string(s[2]) +
                  " " + std::to_string(s[3]) + "\n";
      }
      comm.broadcast(&text, r);
      std::istringstream in(text);
      std::array<int, 4> s{};
      while (in >> s[0] >> s[1] >> s[2] >> s[3]) all.insert(s);
    }
    shapes = std::move(all);
  }
};

// One bench run: its parts, built as train builds them, the steps timed,
// and the JSON line.
class Bench {
 public:
  Bench(const BenchConfig& cfg, Communicator& comm)
      : cfg_(cfg), run_(cfg.run), comm_(comm), start_(Clock::now()) {}

  // Returns the exit code.
  int run() {
    if (!run_.data_dir.empty()) {
      if (const int code = open_shards()) return code;
    }
    if (const int code = build()) return code;
    time_steps();
    report();
    return 0;
  }

 private:
  int open_shards();
  int build();
  int prepare_attention_shapes();
  void print_start() const;
  void step(int64_t step, BatchTally* tally);
  void time_steps();
  // Collective: the global figures, printed by rank 0.
  void report();
  std::string kernels_json() const;

  const BenchConfig& cfg_;
  TrainConfig run_;  // cfg.run, with --data as the shards resolve it
  Communicator& comm_;
  const Clock::time_point start_;  // the command's start
  int threads_ = 1;
  // Released from the last up: the model before the backend its memory is of.
  std::unique_ptr<Ops> backend_;
  std::unique_ptr<ProfiledOps> profiled_;  // --profile: times each op family
  Ops* ops_ = nullptr;                     // what the model runs on
  std::unique_ptr<StepBatches> batches_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradientReducer> reducer_;
  float loss_scale_ = 1.0f;
  ReduceTiming reduce_;        // of the timed steps
  AttentionCalls warm_calls_;  // the attention calls before them
  BatchTally tally_;           // of the timed steps
  double startup_s_ = 0.0, seconds_ = 0.0;
};

// --data: the shards decide what the flags left open (the vocabulary, the
// special ids, a classifier's labels), then this rank's source reads them,
// as train's start-up does; a refusal is every rank's exit 2.
int Bench::open_shards() {
  std::unique_ptr<BatchSource> source;
  const int code = agree_on(
      comm_,
      [&] {
        resolve_data_config(&run_);
        source = make_batch_source(run_, comm_.rank(), comm_.size());
      },
      Speaker::kFirstRefusal, Blame::kByType, "bench");
  if (code) return code;
  batches_ = std::make_unique<StepBatches>(std::move(source), run_.accum_steps, comm_);
  return 0;
}

int Bench::build() {
  threads_ = run_.threads > 0 ? run_.threads : comm_.cores_per_local_rank();
  // Each set-up fault is agreed by every rank (src/parallel/agreement.h).
  if (agree_on(comm_, [&] { backend_ = make_ops(run_.device, threads_, comm_, run_.tf32); }) != 0) {
    return kExitFailure;
  }
  note_shared_gpus(run_.device, comm_);
  if (cfg_.profile) profiled_ = std::make_unique<ProfiledOps>(*backend_);
  ops_ = profiled_ ? profiled_.get() : backend_.get();
  print_start();
  if (!batches_) batches_ = std::make_unique<StepBatches>(make_bench_batch(cfg_, comm_.rank()));
  model_ = std::make_unique<Model>(*ops_, run_.model, batches_->capacity(run_),
                                   compute_dtype(run_.precision));
  model_->init_parameters(run_.seed);
  optimizer_ = std::make_unique<AdamW>(model_->parameters(), run_.optim);
  // On a GPU the MPI transport stages gradients through host buffers; NCCL
  // reads them in place.
  backend_->set_deterministic(run_.deterministic);
  if (agree_on(comm_, [&] { backend_->set_attention_path(run_.attention); }) != 0)
    return kExitUsage;
  Transport transport = Transport::kMpi;
  if (agree_on(comm_, [&] { transport = choose_transport(run_.transport, *backend_, comm_); }) !=
      0) {
    return kExitFailure;
  }
  if (const int code = prepare_attention_shapes()) return code;
  reducer_ = make_reducer(model_->parameters(), run_.bucket_mb, run_.overlap, run_.grad_sum,
                          transport, comm_);
  // fp16 runs with a loss scale: a fixed one here, as the bench never overflows.
  loss_scale_ = run_.precision == Precision::kFp16 ? 1024.0f : 1.0f;
  return 0;
}

// Attention for every batch shape of the shards (or for the synthetic
// batch) before the first step, as train prepares it (cuDNN's graphs and
// workspace), so that no step builds a graph; a workspace the device cannot
// hold is exit 2.
int Bench::prepare_attention_shapes() {
  AttentionPreparation done;
  MemoryEstimate unused;  // bench keeps no estimate
  const int code = agree_on(
      comm_,
      [&] {
        done = prepare_attention(*backend_, run_.model, batches_->bucket_bounds(),
                                 compute_dtype(run_.precision), /*training=*/true, &unused,
                                 "--max-tokens or --max-len");
      },
      Speaker::kFirstRefusal, Blame::kByType, "bench");
  const std::string prepared = describe_preparation(done);
  if (code == 0 && comm_.is_root() && !prepared.empty())
    std::fprintf(stderr, "  attention: %s\n", prepared.c_str());
  return code;
}

// The start line goes to stderr: stdout keeps its one JSON line.
void Bench::print_start() const {
  if (!comm_.is_root()) return;
  const bool on_cpu = run_.device == DeviceKind::kCpu;
  std::fprintf(stderr, "mpiformer bench: %s on %s, %d rank(s) x %d thread(s) on %s; %s: %s\n",
               to_string(run_.model.kind), backend_->device().name().c_str(), comm_.size(),
               threads_, comm_.describe_nodes().c_str(), on_cpu ? "BLAS" : "attention",
               on_cpu ? describe_blas_kernels().c_str() : backend_->attention_kernels().c_str());
  const std::string data = batches_ ? batches_->describe() : "";
  if (!data.empty()) std::fprintf(stderr, "%s\n", data.c_str());
  std::fflush(stderr);
}

void Bench::step(int64_t step, BatchTally* tally) {
  const std::vector<Batch>& micro = batches_->of_step(step);
  if (tally) {
    for (const Batch& b : micro) tally->add(b, *model_);
  }
  const StepGradients g = step_gradients(*model_, micro, run_.seed, step, run_.label_smoothing,
                                         comm_, reducer_.get(), loss_scale_);
  reduce_ += g.reduce;
  if (g.skipped) return;  // no target token on any rank: train skips such a step too
  optimizer_->measure_gradients();
  optimizer_->step(run_.optim.lr, 1.0f / loss_scale_);
}

// Steps 1.. warm up, then the timed ones follow: the step numbers (and so
// the batches and dropout masks) are a train run's.
void Bench::time_steps() {
  batches_->start();
  comm_.barrier();  // every rank is ready: the first step starts now
  startup_s_ = seconds_since(start_);
  for (int s = 0; s < cfg_.warmup_steps; ++s) step(s + 1, nullptr);
  ops_->device().synchronize();
  model_->take_train_sums();
  if (profiled_) profiled_->reset();
  reduce_ = ReduceTiming{};
  warm_calls_ = backend_->attention_calls();
  comm_.barrier();
  const Clock::time_point t0 = Clock::now();
  for (int s = 0; s < cfg_.steps; ++s) step(cfg_.warmup_steps + s + 1, &tally_);
  ops_->device().synchronize();
  comm_.barrier();
  seconds_ = seconds_since(t0);
}

// What ran, so bench lines of two machines can be told apart, and no
// attention fallback passes unseen.
std::string Bench::kernels_json() const {
  if (run_.device == DeviceKind::kCpu)
    return ", \"blas\": \"" + blas_library() + "\", \"blas_core\": \"" + blas_core() + "\"";
  // Those of the timed steps.
  const AttentionCalls calls = calls_since(backend_->attention_calls(), warm_calls_);
  const char* attention = calls.library == 0 ? "plain" : calls.plain == 0 ? "cudnn" : "cudnn+plain";
  return ", \"attention\": \"" + std::string(attention) +
         "\", \"attention_calls_cudnn\": " + std::to_string(calls.library) +
         ", \"attention_calls_plain\": " + std::to_string(calls.plain) +
         ", \"attention_fallbacks\": " + std::to_string(calls.fallbacks) +
         ", \"attention_graphs\": " + std::to_string(calls.graphs) + ", \"kernel_switches\": \"" +
         backend_->kernel_choices() + "\"" + text_field("gemm_search", backend_->gemm_search()) +
         text_field("attention_search", backend_->attention_search()) +
         text_field("gemm_unfused", backend_->gemm_unfused()) +
         text_field("candidate_calls", backend_->candidate_calls());
}

void Bench::report() {
  tally_.make_global(comm_);
  const int W = comm_.size();
  const double step_s = seconds_ / cfg_.steps;
  // GPU: an H100 SXM's dense peak for the precision unless --peak-tflops
  // names the device's.
  const double peak = cfg_.peak_tflops > 0 ? cfg_.peak_tflops * 1e12
                      : run_.device == DeviceKind::kCuda
                          ? h100_peak_flops(run_.precision, run_.tf32)
                          : estimated_cpu_peak_flops(threads_);
  // Per step and family, and what the step spent outside every op (the
  // device idle, waiting for the host or the all-reduce).
  std::vector<double> profile_ms;
  std::vector<ProfiledOps::CallTotal> top_calls;
  if (profiled_) {
    profile_ms = profiled_->milliseconds();
    for (double& ms : profile_ms) ms /= cfg_.steps;
    top_calls = profiled_->call_totals();
  }
  const double mfu = tally_.flops / W / seconds_ / peak;  // a rank's mean
  // One rank moves nothing; its exact sum's conversions are in step_ms.
  if (W == 1) reduce_ = ReduceTiming{};
  double reduce_sums[3] = {reduce_.wait_s, reduce_.in_flight_s, reduce_.hidden_s};
  comm_.allreduce_sum(reduce_sums, 3);
  const std::string kernels = kernels_json();
  if (!comm_.is_root()) return;
  // With --data: the mean sequences of a rank's step and the longest
  // sequence seen; else the synthetic shape.
  const bool data = batches_->from_data();
  const double batch = data ? static_cast<double>(tally_.sequences) / (W * cfg_.steps) : cfg_.batch;
  std::printf(
      "{\"model\": \"%s\", \"device\": \"%s\", \"ranks\": %d, \"threads\": %d, "
      "\"batches\": \"%s\", \"batch\": %.6g, \"seq\": %d, \"real_tokens\": %lld, "
      "\"padded_tokens\": %lld, \"target_tokens\": %lld, \"batch_shapes\": %zu, "
      "\"startup_seconds\": %.3f, \"precision\": \"%s\", \"recompute\": \"%s\", "
      "\"parameters\": %zu, \"tokens_per_s\": %.1f, \"step_ms\": %.2f, \"mfu\": %.4f, "
      "\"peak_flops\": %.4g, \"peak_mem_bytes\": %zu, \"allocated_bytes\": %zu, "
      "\"allreduce_bytes\": %zu, \"buckets\": %zu, \"comm_wait_ms\": %.3f, "
      "\"comm_in_flight_ms\": %.3f, \"hidden_share\": %.3f, \"transport\": \"%s\"%s%s}\n",
      to_string(run_.model.kind), backend_->device().name().c_str(), W, threads_,
      data ? "data" : "synthetic", batch, data ? tally_.longest : cfg_.seq,
      static_cast<long long>(tally_.real), static_cast<long long>(tally_.padded),
      static_cast<long long>(tally_.targets), tally_.shapes.size(), startup_s_,
      to_string(run_.precision), to_string(run_.recompute), model_->parameters().count(),
      tally_.real / seconds_, 1000.0 * step_s, mfu, peak, peak_rss_bytes(),
      backend_->device().peak_allocated_bytes(), W > 1 && reducer_ ? reducer_->bytes_per_step() : 0,
      W > 1 && reducer_ ? reducer_->buckets().size() : 0,
      1000.0 * reduce_sums[0] / (W * cfg_.steps), 1000.0 * reduce_sums[1] / (W * cfg_.steps),
      reduce_sums[1] > 0 ? reduce_sums[2] / reduce_sums[1] : 0.0,
      reducer_ ? reducer_->transport().name().c_str() : "none", kernels.c_str(),
      profile_json(profile_ms, 1000.0 * step_s).c_str());
  std::fflush(stdout);
  if (profiled_) {
    print_profile(profile_ms, top_calls, cfg_.steps, 1000.0 * step_s,
                  "host work, waits, all-reduce");
  }
}

}  // namespace

int run_bench(const BenchConfig& cfg, Communicator& comm) {
  return Bench(cfg, comm).run();
}

}  // namespace mpiformer
