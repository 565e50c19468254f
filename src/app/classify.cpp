// `mpiformer classify`: the best labels of text lines with a classifier
// checkpoint. Rank 0 scores; other ranks of an mpirun job only wait.
// --output is written under a temporary name and renamed into place when
// every line is scored: a fault or a stop signal leaves it as it was.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/core/error.h"
#include "src/data/tokenizer.h"
#include "src/io/atomic_file.h"
#include "src/io/checkpoint.h"
#include "src/io/stop_cleanup.h"
#include "src/model/model.h"
#include "src/parallel/agreement.h"
#include "src/train/memory_budget.h"

namespace mpiformer {
namespace {

// One input line as the model saw its training text: [BOS as CLS] pieces,
// cut to max-len as training cuts (--too-long truncate).
std::vector<int32_t> encode_line(const Tokenizer& tokenizer, const std::string& line,
                                 const ModelConfig& m) {
  std::vector<int32_t> ids;
  const bool cls = m.pool == PoolKind::kCls;
  if (cls) ids.push_back(m.special.bos);
  for (int id : tokenizer.encode(line)) ids.push_back(id);
  if (static_cast<int>(ids.size()) > m.max_len) ids.resize(m.max_len);
  // A mean over no rows is nothing: an empty line is scored as unknown.
  if (ids.empty()) ids.push_back(m.special.unk);
  return ids;
}

// "name:0.9123 name:0.0512 ...": the K best of one row of scores; softmax
// scores become probabilities.
std::string describe(const float* scores, const ModelConfig& m,
                     const std::vector<std::string>& names, int top) {
  const int K = m.num_labels;
  std::vector<double> value(scores, scores + K);
  if (m.loss == ClassifyLoss::kSoftmax) {
    const double most = *std::max_element(value.begin(), value.end());
    double total = 0;
    for (double& v : value) total += (v = std::exp(v - most));
    for (double& v : value) v /= total;
  }
  std::vector<int> order(K);
  std::iota(order.begin(), order.end(), 0);
  const int shown = std::min(top, K);
  std::partial_sort(order.begin(), order.begin() + shown, order.end(), [&](int a, int b) {
    return value[a] > value[b] || (value[a] == value[b] && a < b);
  });
  std::string line;
  char buf[32];
  for (int i = 0; i < shown; ++i) {
    std::snprintf(buf, sizeof buf, ":%.4f", value[order[i]]);
    line += (i ? " " : "") + names[order[i]] + buf;
  }
  return line;
}

// What a fault or a stop leaves of the output: "labels.txt was left
// unchanged" (or "was not written").
std::string what_is_kept(const ClassifyConfig& cfg) {
  if (cfg.output.empty()) return "stdout holds the lines scored so far";
  std::error_code ec;
  return cfg.output +
         (std::filesystem::exists(cfg.output, ec) ? " was left unchanged" : " was not written");
}

// Lines scored at once: --batch (no more than there are), its memory
// estimated before anything is allocated and refused, naming the --batch
// that fits, when this process may not take it. Says so on stderr.
int lines_at_a_time(const ClassifyConfig& cfg, Ops& ops, const ModelConfig& m, DType compute,
                    size_t lines) {
  const int lines_at_once =
      static_cast<int>(std::min<size_t>(cfg.batch, std::max<size_t>(lines, 1)));
  if (static_cast<int64_t>(lines_at_once) * m.max_len > std::numeric_limits<int32_t>::max()) {
    usage_error("--batch", std::to_string(lines_at_once) + " lines of max-len " +
                               std::to_string(m.max_len) + " are more than 2^31 - 1 tokens");
  }
  const auto room_for = [&](int b) { return ModelCapacity{b * m.max_len, m.max_len, b}; };
  const auto need = [&](int b) { return estimate_memory(ops, m, room_for(b), compute); };
  const auto fits = [&](int b) { return memory_shortfall(need(b), ops, 1, "").empty(); };
  const MemoryEstimate estimate = need(lines_at_once);
  if (!fits(lines_at_once)) {
    int most = 0;  // the largest batch that fits: fits(most) (or 0), !fits(above)
    for (int above = lines_at_once; above - most > 1;) {
      const int mid = most + (above - most) / 2;
      (fits(mid) ? most : above) = mid;
    }
    usage_error("--batch",
                "scoring " + std::to_string(lines_at_once) + " lines at a time " +
                    memory_shortfall(estimate, ops, 1,
                                     most > 0 ? "--batch (" + std::to_string(most) + " fits)"
                                              : "--batch (not even 1 fits)"));
  }
  std::cerr << "mpiformer classify: " << lines << " line(s), " << lines_at_once << " at a time ("
            << ops.device().name()
            << (compute != DType::kF32 ? std::string(", ") + to_string(compute) : "")
            << (cfg.device_choice.empty() ? "" : "; " + cfg.device_choice) << "): memory about "
            << estimate.describe() << std::endl;
  return lines_at_once;
}

// The run recorded in the checkpoint, with the vocabulary and reserved ids
// of its tokenizer (the ini does not hold them).
TrainConfig run_of_checkpoint(const ClassifyConfig& cfg, const CheckpointState& state) {
  TrainConfig run = train_config_from_ini(state.config_ini, cfg.checkpoint);
  run.model.vocab = state.vocab_size;
  run.model.special = state.special;
  return run;
}

// Only a text classifier that carries its tokenizer and label names can
// score lines.
void require_text_classifier(const ClassifyConfig& cfg, const CheckpointState& state,
                             const ModelConfig& m) {
  if (m.kind != ModelKind::kClassify) {
    usage_error("--checkpoint", cfg.checkpoint + " holds " + to_string(m.kind) +
                                    ", not a classifier (train --model classify)");
  }
  if (m.images()) {
    usage_error("--checkpoint", cfg.checkpoint +
                                    " classifies images; score image shards with `mpiformer eval "
                                    "--data DIR`");
  }
  if (state.tokenizer.empty() || static_cast<int>(state.label_names.size()) != m.num_labels) {
    usage_error("--checkpoint", cfg.checkpoint + " lacks its tokenizer or label names");
  }
}

// --text as one line, or every line of --input.
std::vector<std::string> read_lines(const ClassifyConfig& cfg) {
  std::vector<std::string> lines;
  if (!cfg.text.empty()) {
    lines.push_back(cfg.text);
    return lines;
  }
  std::ifstream in(cfg.input);
  if (!in) throw std::runtime_error(cfg.input + ": cannot read");
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The checkpoint's values in place of the model's initial ones.
void load_checkpoint_weights(const ClassifyConfig& cfg,
                             const std::vector<CheckpointTensor>& tensors, Ops& ops, Model& model) {
  std::vector<float> host(model.parameters().count());  // (count)
  unpack_checkpoint_tensors(cfg.checkpoint, tensors, model.parameters(), host.data());
  ops.device().copy_to_device(model.parameters().params(), host.data(),
                              host.size() * sizeof(float));
  model.parameters().refresh_compute();  // the bf16/fp16 copy (none in fp32)
}

// A fault of --output names it and says what was kept.
template <typename Write>
void write_output_file(const ClassifyConfig& cfg, Write&& write) {
  try {
    write();
  } catch (const std::runtime_error& e) {
    throw CommandError(std::string("classify: ") + e.what() + "; " + what_is_kept(cfg));
  }
}

void write_stdout(const std::string& text) {
  errno = 0;
  std::cout << text << std::flush;
  if (!std::cout) {
    const int err = errno;
    throw CommandError(std::string("classify: cannot write the output (stdout") +
                       (err != 0 ? std::string(": ") + std::strerror(err) : "") + ")");
  }
}

// Scores lines block by block, reusing one batch and one buffer of scores.
class LineScorer {
 public:
  LineScorer(Model& model, const Tokenizer& tokenizer, const ModelConfig& m,
             const std::vector<std::string>& label_names, int top)
      : model_(model), tokenizer_(tokenizer), m_(m), label_names_(label_names), top_(top) {
    batch_.per_sequence = true;
  }

  // The described labels of lines [first, last), one output line each.
  std::string score(const std::vector<std::string>& lines, size_t first, size_t last) {
    batch_.clear();
    for (size_t i = first; i < last; ++i) {
      const std::vector<int32_t> ids = encode_line(tokenizer_, lines[i], m_);
      batch_.decoder.append(ids.data(), static_cast<int>(ids.size()));
    }
    scores_.resize((last - first) * static_cast<size_t>(m_.num_labels));
    model_.classify_scores(batch_, scores_.data());
    std::string text;
    for (size_t i = first; i < last; ++i) {
      text += describe(scores_.data() + (i - first) * m_.num_labels, m_, label_names_, top_);
      text += "\n";
    }
    return text;
  }

 private:
  Model& model_;
  const Tokenizer& tokenizer_;
  const ModelConfig& m_;
  const std::vector<std::string>& label_names_;
  const int top_;
  Batch batch_;
  std::vector<float> scores_;  // (B, K)
};

int classify_on_root(const ClassifyConfig& cfg) {
  const ModelCheckpoint checkpoint = read_model_checkpoint(
      cfg.checkpoint, "--checkpoint",
      [&](const std::string& ini) { train_config_from_ini(ini, cfg.checkpoint); });
  const CheckpointState& state = checkpoint.state;
  const TrainConfig run = run_of_checkpoint(cfg, state);
  const ModelConfig& m = run.model;
  require_text_classifier(cfg, state, m);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_bytes(state.tokenizer);
  const std::vector<std::string> lines = read_lines(cfg);

  // On a GPU in the run's precision and attention path, as eval; on the CPU in fp32.
  const bool on_gpu = cfg.device == DeviceKind::kCuda;
  std::unique_ptr<Ops> ops = on_gpu ? make_cuda_ops(0) : make_cpu_ops(cfg.threads);
  const DType compute = on_gpu ? compute_dtype(run.precision) : DType::kF32;
  if (on_gpu) ops->set_attention_path(run.attention);
  const int lines_at_once = lines_at_a_time(cfg, *ops, m, compute, lines.size());
  const ModelCapacity room{lines_at_once * m.max_len, m.max_len, lines_at_once};
  Model model(*ops, m, room, compute);
  model.init_parameters(run.seed);  // allocates; the checkpoint's values replace these
  load_checkpoint_weights(cfg, checkpoint.params, *ops, model);

  std::unique_ptr<StagedTextFile> file;
  if (!cfg.output.empty()) {
    write_output_file(cfg, [&] { file = std::make_unique<StagedTextFile>(cfg.output); });
  }
  LineScorer scorer(model, *tokenizer, m, state.label_names, cfg.top);
  for (size_t first = 0; first < lines.size(); first += lines_at_once) {
    const size_t last = std::min(lines.size(), first + static_cast<size_t>(lines_at_once));
    const std::string text = scorer.score(lines, first, last);
    if (file) {
      write_output_file(cfg, [&] { file->write(text); });
    } else {
      write_stdout(text);
    }
  }
  // Every line is scored: a stop now would only lose them.
  ExitOnStop::finish();
  if (file) write_output_file(cfg, [&] { file->commit(); });
  return 0;
}

}  // namespace

int run_classify(const ClassifyConfig& cfg, Communicator& comm) {
  // Rank 0 speaks for the job; the other ranks only wait.
  const ExitOnStop stop(comm.is_root() ? "mpiformer classify: stopped by " : "",
                        comm.is_root() ? "; " + what_is_kept(cfg) : "");
  return agree_on(
      comm, [&] { return classify_on_root(cfg); }, Speaker::kRoot, Blame::kByType, "classify");
}

}  // namespace mpiformer
