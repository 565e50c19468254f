// `mpiformer bench`: times full training steps (forward, backward, clipping,
// AdamW) of one model shape on one fixed batch after warm-up steps, and
// prints one JSON line. It reports; it asserts nothing. Under mpirun every
// rank runs its own batch of the shape and gradients go through the
// bucketed all-reduce, so the line also says what the reduction cost.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/dropout_mask.h"
#include "kernels/profiled_ops.h"
#include "src/app/commands.h"
#include "src/model/model.h"
#include "src/optim/adamw.h"
#include "src/parallel/agreement.h"
#include "src/parallel/data_parallel.h"
#include "src/parallel/rank_device.h"
#include "src/train/step.h"

namespace mpiformer {

namespace {

// Uniform integer in [lo, hi] from a counter-based stream.
int draw(uint64_t seed, uint64_t counter, int lo, int hi) {
  return lo + static_cast<int>(mix64(seed ^ mix64(counter)) % static_cast<uint64_t>(hi - lo + 1));
}

// A batch of random data symbols: B sequences of length seq (or drawn from
// [min_seq, seq]); targets are every next token (lm), 15% of positions (mlm)
// or the target side (seq2seq).
Batch make_bench_batch(const BenchConfig& cfg, int rank) {
  const ModelConfig& m = cfg.model;
  const int lo_sym = SpecialTokens::kCount, hi_sym = m.vocab - 1;
  uint64_t counter = static_cast<uint64_t>(rank) << 40;  // each rank its own symbols
  auto length = [&](int longest) {
    return cfg.min_seq > 0 ? draw(cfg.seed, counter++, std::min(cfg.min_seq, longest), longest)
                           : longest;
  };
  Batch batch;
  std::vector<int32_t> ids;
  for (int b = 0; b < cfg.batch; ++b) {
    if (m.kind == ModelKind::kSeq2seq) {
      ids.resize(length(cfg.src_seq > 0 ? cfg.src_seq : cfg.seq));
      for (int32_t& t : ids) t = draw(cfg.seed, counter++, lo_sym, hi_sym);
      batch.encoder.append(ids.data(), static_cast<int>(ids.size()));
    }
    ids.resize(length(cfg.seq));
    for (int32_t& t : ids) t = draw(cfg.seed, counter++, lo_sym, hi_sym);
    batch.decoder.append(ids.data(), static_cast<int>(ids.size()));
    for (size_t i = 0; i < ids.size(); ++i) {
      int32_t target = draw(cfg.seed, counter++, lo_sym, hi_sym);
      if (m.kind == ModelKind::kMlm && draw(cfg.seed, counter++, 0, 99) >= 15)
        target = m.special.pad;
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

// `, "profile_ms": {"gemm": 1.234, ...}` (per step), or "" without --profile.
std::string profile_json(const std::vector<double>& ms) {
  if (ms.empty()) return "";
  std::string out = ", \"profile_ms\": {";
  char buf[64];
  for (int f = 0; f < static_cast<int>(OpFamily::kCount); ++f) {
    std::snprintf(buf, sizeof buf, "%s\"%s\": %.3f", f ? ", " : "",
                  to_string(static_cast<OpFamily>(f)), ms[f]);
    out += buf;
  }
  return out + "}";
}

// A table of the step's time by op family on stderr (stdout keeps its one
// JSON line).
void print_profile(const std::vector<double>& ms, const std::vector<ProfiledOps::CallTotal>& calls,
                   int steps, double step_ms) {
  double ops_ms = 0.0;
  for (double m : ms) ops_ms += m;
  std::fprintf(stderr, "time per step by op family (device time, %.2f ms per step):\n", step_ms);
  for (int f = 0; f < static_cast<int>(OpFamily::kCount); ++f) {
    std::fprintf(stderr, "  %-12s %9.3f ms  %5.1f%%\n", to_string(static_cast<OpFamily>(f)), ms[f],
                 step_ms > 0 ? 100.0 * ms[f] / step_ms : 0.0);
  }
  std::fprintf(stderr, "  %-12s %9.3f ms  %5.1f%%  (host work, waits, all-reduce)\n", "other",
               step_ms - ops_ms, step_ms > 0 ? 100.0 * (step_ms - ops_ms) / step_ms : 0.0);
  // Where a family's time goes: its costliest calls by sizes.
  constexpr size_t kTopCalls = 16;
  std::fprintf(stderr, "costliest op calls (per step: ms, calls, share):\n");
  for (size_t i = 0; i < calls.size() && i < kTopCalls; ++i) {
    const double per_step = calls[i].ms / steps;
    std::fprintf(stderr, "  %9.3f ms %4lld  %5.1f%%  %s\n", per_step, calls[i].count / steps,
                 step_ms > 0 ? 100.0 * per_step / step_ms : 0.0, calls[i].call.c_str());
  }
}

}  // namespace

int run_bench(const BenchConfig& cfg, Communicator& comm) {
  const int threads = cfg.threads > 0 ? cfg.threads : comm.cores_per_local_rank();
  // Each set-up fault is agreed by every rank (src/parallel/agreement.h).
  std::unique_ptr<Ops> backend;
  if (!agreed(comm, [&] { backend = make_ops(cfg.device, threads, comm, cfg.tf32); })) {
    return kExitFailure;
  }
  // --profile: the model runs on a wrapper that times each op family.
  std::unique_ptr<ProfiledOps> profiled;
  if (cfg.profile) profiled = std::make_unique<ProfiledOps>(*backend);
  Ops* ops = profiled ? profiled.get() : backend.get();
  // The start line goes to stderr: stdout keeps its one JSON line.
  const bool on_cpu = cfg.device == DeviceKind::kCpu;
  if (comm.is_root()) {
    std::fprintf(stderr, "mpiformer bench: %s on %s, %d rank(s) x %d thread(s) on %s; %s: %s\n",
                 to_string(cfg.model.kind), backend->device().name().c_str(), comm.size(), threads,
                 comm.describe_nodes().c_str(), on_cpu ? "BLAS" : "attention",
                 on_cpu ? describe_blas_kernels().c_str() : backend->attention_kernels().c_str());
    std::fflush(stderr);
  }
  std::vector<Batch> batch(1, make_bench_batch(cfg, comm.rank()));
  const int longest = std::max(batch[0].decoder.max_len(), batch[0].encoder.max_len());
  const int rows = std::max(batch[0].decoder.total(), batch[0].encoder.total());
  Model model(*ops, cfg.model, ModelCapacity{rows, longest, 0, cfg.recompute},
              compute_dtype(cfg.precision));
  model.init_parameters(cfg.seed);
  AdamW optimizer(model.parameters(), cfg.optim);
  // On a GPU the MPI transport stages gradients through host buffers; NCCL
  // reads them in place.
  backend->set_deterministic(cfg.deterministic);
  if (!agreed(comm, [&] { backend->set_attention_path(cfg.attention); })) return kExitUsage;
  Transport transport = Transport::kMpi;
  if (!agreed(comm, [&] { transport = choose_transport(cfg.transport, *backend, comm); })) {
    return kExitFailure;
  }
  std::unique_ptr<GradientReducer> reducer =
      make_reducer(model.parameters(), cfg.bucket_mb, cfg.overlap, cfg.grad_sum, transport, comm);
  // fp16 runs with a loss scale: a fixed one here, as the bench never overflows.
  const float loss_scale = cfg.precision == Precision::kFp16 ? 1024.0f : 1.0f;

  ReduceTiming reduce;
  auto train_step = [&](int64_t step) {
    const StepGradients g = step_gradients(model, batch, cfg.seed, step, cfg.label_smoothing, comm,
                                           reducer.get(), loss_scale);
    reduce += g.reduce;
    optimizer.measure_gradients();
    optimizer.step(cfg.optim.lr, 1.0f / loss_scale);
  };
  for (int s = 0; s < cfg.warmup_steps; ++s) train_step(s + 1);
  ops->device().synchronize();
  model.take_train_sums();
  if (profiled) profiled->reset();
  reduce = ReduceTiming{};
  comm.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < cfg.steps; ++s) train_step(cfg.warmup_steps + s + 1);
  ops->device().synchronize();
  comm.barrier();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const int W = comm.size();
  const double step_s = seconds / cfg.steps;
  const double tokens = static_cast<double>(comm.allreduce_sum(batch[0].real_tokens()));
  // GPU: an H100 SXM's dense peak for the precision unless --peak-tflops
  // names the device's.
  const double peak = cfg.peak_tflops > 0               ? cfg.peak_tflops * 1e12
                      : cfg.device == DeviceKind::kCuda ? h100_peak_flops(cfg.precision, cfg.tf32)
                                                        : estimated_cpu_peak_flops(threads);
  // Per step and family, and what the step spent outside every op (the
  // device idle, waiting for the host or the all-reduce).
  std::vector<double> profile_ms;
  std::vector<ProfiledOps::CallTotal> top_calls;
  if (profiled) {
    profile_ms = profiled->milliseconds();
    for (double& ms : profile_ms) ms /= cfg.steps;
    top_calls = profiled->call_totals();
  }
  const double mfu = model.training_flops(batch[0]) / step_s / peak;  // per rank
  // One rank moves nothing; its exact sum's conversions are in step_ms.
  if (W == 1) reduce = ReduceTiming{};
  double reduce_sums[3] = {reduce.wait_s, reduce.in_flight_s, reduce.hidden_s};
  comm.allreduce_sum(reduce_sums, 3);
  // What ran, so bench lines of two machines can be told apart, and no
  // attention fallback passes unseen.
  std::string kernels;
  if (on_cpu) {
    kernels = ", \"blas\": \"" + blas_library() + "\", \"blas_core\": \"" + blas_core() + "\"";
  } else {
    const AttentionCalls calls = backend->attention_calls();
    const char* attention = calls.library == 0 ? "plain"
                            : calls.plain == 0 ? "cudnn"
                                               : "cudnn+plain";
    kernels = ", \"attention\": \"" + std::string(attention) +
              "\", \"attention_calls_cudnn\": " + std::to_string(calls.library) +
              ", \"attention_calls_plain\": " + std::to_string(calls.plain) +
              ", \"attention_fallbacks\": " + std::to_string(calls.fallbacks);
  }
  if (comm.is_root()) {
    std::printf(
        "{\"model\": \"%s\", \"device\": \"%s\", \"ranks\": %d, \"threads\": %d, "
        "\"batch\": %d, \"seq\": %d, \"real_tokens\": %.0f, \"padded_tokens\": %lld, "
        "\"precision\": \"%s\", \"recompute\": \"%s\", \"parameters\": %zu, \"tokens_per_s\": "
        "%.1f, \"step_ms\": %.2f, "
        "\"mfu\": %.4f, \"peak_flops\": %.4g, \"peak_mem_bytes\": %zu, \"allocated_bytes\": %zu, "
        "\"allreduce_bytes\": %zu, \"buckets\": %zu, \"comm_wait_ms\": %.3f, "
        "\"comm_in_flight_ms\": %.3f, \"hidden_share\": %.3f, \"transport\": \"%s\"%s%s}\n",
        to_string(cfg.model.kind), backend->device().name().c_str(), W, threads, cfg.batch, cfg.seq,
        tokens, static_cast<long long>(batch[0].padded_tokens()) * W, to_string(cfg.precision),
        to_string(cfg.recompute), model.parameters().count(), tokens / step_s, 1000.0 * step_s, mfu,
        peak, peak_rss_bytes(), backend->device().peak_allocated_bytes(),
        W > 1 && reducer ? reducer->bytes_per_step() : 0,
        W > 1 && reducer ? reducer->buckets().size() : 0, 1000.0 * reduce_sums[0] / (W * cfg.steps),
        1000.0 * reduce_sums[1] / (W * cfg.steps),
        reduce_sums[1] > 0 ? reduce_sums[2] / reduce_sums[1] : 0.0,
        reducer ? reducer->transport().name().c_str() : "none", kernels.c_str(),
        profile_json(profile_ms).c_str());
    std::fflush(stdout);
    if (profiled) print_profile(profile_ms, top_calls, cfg.steps, 1000.0 * step_s);
  }
  return 0;
}

}  // namespace mpiformer
