#include "src/train/start_lines.h"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/kernel_switches.h"
#include "src/core/run_log.h"
#include "src/parallel/data_parallel.h"

namespace mpiformer {

namespace {

// The batching flags of this run that differ from the checkpoint's run
// ("--max-tokens 512 (was 256)"), "" when none does or its config is unreadable.
std::string changed_batching(const TrainConfig& cfg, const ConfigText& config_text,
                             const std::string& checkpoint_ini) {
  TrainConfig old;
  try {
    old = config_text.read(checkpoint_ini, "the checkpoint's config");
  } catch (const std::exception&) {
    return "";
  }
  const auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(x);
    }
    return s.empty() ? std::string("default") : s;
  };
  std::string changed;
  const auto note = [&](const char* flag, const std::string& now, const std::string& was) {
    if (now == was) return;
    changed += std::string(changed.empty() ? "" : ", ") + flag + " " + now + " (was " + was + ")";
  };
  note("--max-tokens", std::to_string(cfg.max_tokens), std::to_string(old.max_tokens));
  note("--max-sentences", std::to_string(cfg.max_sentences), std::to_string(old.max_sentences));
  note("--buckets", list(cfg.buckets), list(old.buckets));
  return changed;
}

// On a GPU: which attention kernels run, the cuDNN graphs built for the
// run's batch shapes, and the kernel switches MPIFORMER_KERNELS set other
// than the defaults.
void print_attention(const Ops& ops, const StartNotes& notes) {
  say(stdout, "  attention: %s\n", ops.attention_kernels().c_str());
  const std::string prepared = describe_preparation(notes.attention);
  if (!prepared.empty()) say(stdout, "  attention: %s\n", prepared.c_str());
  const std::string switches = ops.kernel_choices();
  if (!switches.empty() && switches != describe(KernelSwitches{}))
    say(stdout, "  kernels: %s (MPIFORMER_KERNELS)\n", switches.c_str());
}

// The first start line: the model, the data, the ranks and their device.
void print_what_runs(const TrainingRun& run, const Communicator& comm, const StartNotes& notes) {
  const TrainConfig& cfg = run.cfg;
  const std::string device =
      run.ops->device().name() + (cfg.device_choice.empty() ? "" : "; " + cfg.device_choice);
  say(stdout, "mpiformer train: %s on %s (%s), %d rank(s) x %d thread(s) on %s, %zu parameters\n",
      to_string(cfg.model.kind),
      cfg.data_dir.empty() ? to_string(cfg.synthetic) : cfg.data_dir.c_str(), device.c_str(),
      comm.size(), notes.threads, comm.describe_nodes().c_str(), run.model->parameters().count());
}

// The model's shape and the tokens of a step.
void print_shape(const TrainConfig& cfg, int world) {
  // An encoder-decoder names both stacks: "2+2 layers" is not "4 layers".
  const std::string layers = cfg.model.kind == ModelKind::kSeq2seq
                                 ? std::to_string(cfg.model.enc_layers) + " encoder + " +
                                       std::to_string(cfg.model.dec_layers) + " decoder layer(s)"
                                 : std::to_string(cfg.model.layers) + " layer(s)";
  say(stdout,
      "  %s, d-model %d, %d heads, d-ff %d, vocab %d, max-len %d; "
      "max-tokens %d x %d micro-batch(es) x %d rank(s) per step\n",
      layers.c_str(), cfg.model.d_model, cfg.model.heads, cfg.model.d_ff, cfg.model.vocab,
      cfg.model.max_len, cfg.max_tokens, cfg.accum_steps, world);
}

// Memory and arithmetic: the kernels a step runs on, and in what precision.
void print_arithmetic(const TrainingRun& run, const StartNotes& notes) {
  const TrainConfig& cfg = run.cfg;
  say(stdout, "  memory: about %s per rank\n", notes.memory.describe().c_str());
  if (cfg.device == DeviceKind::kCpu) say(stdout, "  BLAS: %s\n", describe_blas_kernels().c_str());
  if (cfg.device == DeviceKind::kCuda) print_attention(*run.ops, notes);
  if (cfg.precision != Precision::kFp32)
    say(stdout,
        "  precision %s: activations and GEMM inputs; fp32 master weights, Adam state "
        "and loss%s\n",
        to_string(cfg.precision), run.scaler->dynamic() ? ", with dynamic loss scaling" : "");
}

// How the ranks sum the gradient, when there is a reducer.
void print_gradient_sum(const TrainConfig& cfg, GradientReducer& reducer, const StartNotes& notes) {
  say(stdout, "  gradient sum: %s; %.1f MiB per step in %zu bucket(s) of >= %g MiB over %s, %s\n",
      to_string(cfg.grad_sum), reducer.bytes_per_step() / double(1 << 20), reducer.buckets().size(),
      bucket_mb_for(cfg.bucket_mb, notes.transport), reducer.transport().name().c_str(),
      cfg.overlap ? "overlapped with backward" : "after backward");
}

// A sharded optimizer: the smallest and the largest slice.
void print_sharding(const ShardPlan& plan, int world) {
  size_t fewest = plan.largest();
  for (int r = 0; r < world; ++r) fewest = std::min(fewest, plan.size(r));
  say(stdout,
      "  optimizer sharded (ZeRO-1): each rank updates and keeps the AdamW moments of its "
      "slice, %zu to %zu parameters (at most %.1f MiB of m and v); weights all-gathered "
      "after each update\n",
      fewest, plan.largest(), 2.0 * sizeof(float) * plan.largest() / double(1 << 20));
}

// The learning rate's scaling, the gradient sum and the optimizer's
// sharding.
void print_optimization(const TrainingRun& run, int world, const StartNotes& notes) {
  const TrainConfig& cfg = run.cfg;
  if (cfg.lr_scaling != LrScaling::kNone)
    say(stdout, "  lr %.3e x %.4f (%s: %lld / %lld tokens per step) = %.3e\n", cfg.optim.lr,
        notes.lr_factor, to_string(cfg.lr_scaling), static_cast<long long>(notes.step_budget),
        static_cast<long long>(cfg.lr_reference_tokens), notes.lr);
  if (run.reducer) print_gradient_sum(cfg, *run.reducer, notes);
  if (run.shards) print_sharding(run.shards->plan(), world);
}

// What --deterministic false changes on this device.
void print_determinism(const TrainingRun& run) {
  if (run.cfg.deterministic) return;
  say(stdout, "  --deterministic false: %s\n",
      run.ops->device().host_accessible()
          ? "nothing changes on the CPU, whose results never depend on timing"
          : "cuDNN's attention backward may add with atomics; runs are not bitwise "
            "reproducible");
}

// Where --resume auto looks.
std::string checkpoints_dir(const TrainConfig& cfg) {
  return (std::filesystem::path(cfg.out_dir) / "checkpoints").string();
}

// A resumed run: from where, and what differs from the checkpoint's run.
void print_resumed(const TrainingRun& run, const ConfigText& config_text, const StartNotes& notes) {
  const TrainConfig& cfg = run.cfg;
  const CheckpointState& resumed = run.start.state;
  say(stdout, "resumed from %s: step %lld, micro-batch %llu (epoch %llu), written by %d rank(s)\n",
      cfg.resume == "auto" ? checkpoints_dir(cfg).c_str() : cfg.resume.c_str(),
      static_cast<long long>(resumed.step), static_cast<unsigned long long>(resumed.next_batch),
      static_cast<unsigned long long>(resumed.epoch), resumed.world_size);
  if (!resumed.run_id.empty() && resumed.run_id != run.run_dir->run_id()) {
    say(stdout, "  a checkpoint of run %s: it goes on here as run %s\n", resumed.run_id.c_str(),
        run.run_dir->run_id().c_str());
  }
  if (resumed.batches_per_step != run.cursor.batches_per_step) {
    say(stdout,
        "  a step now reads %lld micro-batches (the checkpoint's run read %lld): the "
        "micro-batch sequence continues, the global batch size changes\n",
        static_cast<long long>(run.cursor.batches_per_step),
        static_cast<long long>(resumed.batches_per_step));
  }
  const std::string changed = changed_batching(cfg, config_text, resumed.config_ini);
  if (!changed.empty()) {
    say(stdout,
        "  note: %s: batches are cut anew, so the examples from here on come in another order "
        "than the checkpoint's run would have read them\n",
        changed.c_str());
  }
  if (notes.flag_seed != cfg.seed) {
    say(stdout, "  seed %llu from the checkpoint (--seed %llu is for new runs)\n",
        static_cast<unsigned long long>(cfg.seed),
        static_cast<unsigned long long>(notes.flag_seed));
  }
}

}  // namespace

void print_start(const TrainingRun& run, const Communicator& comm, const ConfigText& config_text,
                 const StartNotes& notes) {
  if (!comm.is_root()) return;
  const TrainConfig& cfg = run.cfg;
  print_what_runs(run, comm, notes);
  print_shape(cfg, comm.size());
  if (!run.from_shards.empty()) say(stdout, "  from the shards: %s\n", run.from_shards.c_str());
  print_arithmetic(run, notes);
  print_optimization(run, comm.size(), notes);
  print_determinism(run);
  const std::string data_summary = run.source->describe();
  if (!data_summary.empty()) say(stdout, "%s\n", data_summary.c_str());
  if (run.start.resumed) {
    print_resumed(run, config_text, notes);
  } else if (cfg.resume == "auto") {
    say(stdout, "no checkpoint in %s: starting at step 1\n", checkpoints_dir(cfg).c_str());
  }
  std::fflush(stdout);
}

}  // namespace mpiformer
