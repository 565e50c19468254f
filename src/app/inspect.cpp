#include "src/app/inspect.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/core/escape.h"
#include "src/io/checkpoint.h"
#include "src/io/hdf5_file.h"
#include "src/io/metrics.h"
#include "src/io/shard.h"
#include "src/parallel/agreement.h"

namespace mpiformer {

namespace {

constexpr int kBarWidth = 40;

std::string human_bytes(uintmax_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// Bin of a length: 0 holds length 0, bin k >= 1 holds [2^(k-1), 2^k).
int length_bin(uint64_t n) {
  int k = 0;
  while (n > 0) {
    n >>= 1;
    ++k;
  }
  return k;
}

std::string bin_label(int k) {
  if (k == 0) return "0";
  const uint64_t lo = uint64_t{1} << (k - 1);
  const uint64_t hi = (uint64_t{1} << k) - 1;
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
}

// Length statistics and a power-of-two histogram of one side.
void print_lengths(std::ostream& os, const std::string& title, const TokenSequences& seq) {
  const size_t n = seq.count();
  uint64_t lo = UINT64_MAX, hi = 0;
  std::vector<uint64_t> bins(65, 0);  // (65) bins for lengths up to 2^64
  for (size_t i = 0; i < n; ++i) {
    const uint64_t len = seq.length(i);
    lo = std::min(lo, len);
    hi = std::max(hi, len);
    ++bins[length_bin(len)];
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-12s min %llu, mean %.2f, max %llu\n", title.c_str(),
                static_cast<unsigned long long>(lo),
                static_cast<double>(seq.tokens.size()) / static_cast<double>(n),
                static_cast<unsigned long long>(hi));
  os << buf;
  std::snprintf(buf, sizeof buf, "  %13s %10s %6s\n", "tokens", "sequences", "share");
  os << buf;
  const uint64_t peak = *std::max_element(bins.begin(), bins.end());
  for (int k = length_bin(lo); k <= length_bin(hi); ++k) {
    // Non-empty bins get at least one mark so they stay visible.
    const int width =
        bins[k] == 0 ? 0 : std::max<int>(1, static_cast<int>(kBarWidth * bins[k] / peak));
    std::snprintf(buf, sizeof buf, "  %13s %10llu %5.1f%% |%s\n", bin_label(k).c_str(),
                  static_cast<unsigned long long>(bins[k]), 100.0 * bins[k] / n,
                  std::string(width, '#').c_str());
    os << buf;
  }
}

// How often each label occurs, the most frequent first (at most kTopLabels
// lines), with the examples' label counts and soft labels.
constexpr size_t kTopLabels = 20;
void print_labels(std::ostream& os, const ShardHeader& h, const ShardLabels& labels) {
  const size_t n = labels.count(), K = h.label_names.size();
  std::vector<uint64_t> examples(K, 0);
  size_t soft = 0;
  for (size_t i = 0; i < labels.ids.size(); ++i) {
    ++examples[static_cast<size_t>(labels.ids[i])];
    if (labels.weights[i] < 1.0f) ++soft;
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "labels       %zu names; %zu labels on %zu examples (%.2f each)",
                K, labels.ids.size(), n,
                static_cast<double>(labels.ids.size()) / static_cast<double>(n));
  os << buf << (soft ? ", " + std::to_string(soft) + " soft (weight < 1)" : std::string()) << "\n";
  std::vector<size_t> order(K);
  for (size_t k = 0; k < K; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return examples[a] > examples[b]; });
  const size_t shown = std::min(K, kTopLabels);
  int width = 5;  // "label"
  for (size_t i = 0; i < shown; ++i)
    width = std::max(width, static_cast<int>(escaped(h.label_names[order[i]]).size()));
  os << "  label" << std::string(width - 5, ' ') << "   examples  share\n";
  const uint64_t peak = std::max<uint64_t>(1, examples[order[0]]);
  for (size_t i = 0; i < shown; ++i) {
    const size_t k = order[i];
    const int bar =
        examples[k] == 0 ? 0 : std::max<int>(1, static_cast<int>(kBarWidth * examples[k] / peak));
    const std::string name = escaped(h.label_names[k]);
    os << "  " << name << std::string(width - name.size(), ' ');
    std::snprintf(buf, sizeof buf, " %10llu %5.1f%% |%s\n",
                  static_cast<unsigned long long>(examples[k]), 100.0 * examples[k] / n,
                  std::string(bar, '#').c_str());
    os << buf;
  }
  if (K > kTopLabels) os << "  ... and " << K - kTopLabels << " more\n";
}

void print_summary(std::ostream& os, const std::string& path, const Shard& s) {
  const ShardHeader& h = s.header;
  const bool seq2seq = h.kind == "seq2seq", image = h.kind == "image";
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  os << "file         " << path;
  if (!ec) os << " (" << human_bytes(bytes) << ")";
  os << "\nformat       mpiformer-shard, version " << h.version << "\nkind         "
     << escaped(h.kind) << "\n";
  if (!h.split.empty() || !h.origin.empty()) {
    os << "split        " << (h.split.empty() ? "-" : escaped(h.split))
       << (h.origin.empty() ? "" : " (" + escaped(h.origin) + ")") << "\n";
  }
  if (image) {
    // No tokens: an image shard's vocabulary is the reserved ids alone.
    os << "images       " << s.count() << ", " << h.image_height << " x " << h.image_width
       << " pixels, " << h.image_channels << (h.image_channels == 1 ? " channel" : " channels")
       << " (uint8, " << human_bytes(s.images.size()) << ")\n";
    print_labels(os, h, s.labels);
    return;
  }
  os << "vocab        " << h.vocab_size << " ids; pad " << h.special.pad << ", bos "
     << h.special.bos << ", eos " << h.special.eos << ", unk " << h.special.unk << ", mask "
     << h.special.mask << ", sep " << h.special.sep << "\ntokenizer    " << h.tokenizer.size()
     << " bytes\nsequences    " << s.target.count() << (seq2seq ? " pairs" : "")
     << "\ntokens       ";
  if (seq2seq) {
    os << s.source.tokens.size() + s.target.tokens.size() << " (source " << s.source.tokens.size()
       << ", target " << s.target.tokens.size() << ")";
  } else {
    os << s.target.tokens.size();
  }
  os << ", stored without bos/eos\n";
  if (seq2seq) {
    print_lengths(os, "src length", s.source);
    print_lengths(os, "tgt length", s.target);
  } else {
    print_lengths(os, "length", s.target);
  }
  if (h.has_labels()) print_labels(os, h, s.labels);
}

std::string shape_string(const std::vector<int>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// Root attributes, one line per tensor of /params (shape and RMS), then the
// configuration the run was started with.
void print_checkpoint(std::ostream& os, const std::string& path) {
  const CheckpointState state = read_checkpoint_state(path);
  const std::vector<CheckpointTensor> tensors = read_checkpoint_tensors(path, "params");
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  size_t count = 0, name_width = 6, shape_width = 5;
  for (const CheckpointTensor& t : tensors) {
    count += t.data.size();
    name_width = std::max(name_width, escaped(t.name).size());
    shape_width = std::max(shape_width, shape_string(t.shape).size());
  }
  os << "file         " << path;
  if (!ec) os << " (" << human_bytes(bytes) << ")";
  os << "\nformat       mpiformer-checkpoint, version " << kCheckpointVersion << "\nstep         "
     << state.step << "\nworld size   " << state.world_size << "\nupdates      "
     << state.optimizer_steps << " (AdamW)\ndata cursor  micro-batch " << state.next_batch
     << " (epoch " << state.epoch << "), " << state.batches_per_step << " per step, sharding "
     << escaped(state.sharding) << "\nseed         " << state.seed << "\nloss scale   "
     << state.loss_scale << "\nvocabulary   " << state.vocab_size << " ids, tokenizer "
     << (state.tokenizer.empty() ? std::string("none (synthetic data)")
                                 : human_bytes(state.tokenizer.size()))
     << "\nparameters   " << count << " in " << tensors.size() << " tensors\n";
  if (!state.averaged_from.empty()) {
    // One input a line, as the attribute lists them.
    std::istringstream inputs(state.averaged_from);
    std::string input;
    for (bool first = true; std::getline(inputs, input); first = false) {
      os << (first ? "averaged     " : "             ") << escaped(input) << "\n";
    }
  }
  // Names and shapes left-aligned in columns, RMS right-aligned.
  auto pad = [](const std::string& s, size_t width) {
    return s + std::string(width - s.size(), ' ');
  };
  os << "  " << pad("tensor", name_width) << "  " << pad("shape", shape_width) << "         rms\n";
  char rms_text[32];
  for (const CheckpointTensor& t : tensors) {
    double sum = 0.0;
    for (float x : t.data) sum += static_cast<double>(x) * x;
    const double rms = t.data.empty() ? 0.0 : std::sqrt(sum / static_cast<double>(t.data.size()));
    std::snprintf(rms_text, sizeof rms_text, "%10.4e", rms);
    os << "  " << pad(escaped(t.name), name_width) << "  "
       << pad(shape_string(t.shape), shape_width) << "  " << rms_text << "\n";
  }
  os << "config\n";
  std::istringstream config(state.config_ini);
  for (std::string line; std::getline(config, line);) os << "  " << escaped(line) << "\n";
}

// The shortest text that reads back as the same double: exact and short.
std::string exact(double v) {
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

// Attributes, then every row of /train and /eval, values exact.
void print_metrics(std::ostream& os, const std::string& path) {
  const MetricsTable t = read_metrics(path);
  os << "file         " << path << "\nformat       mpiformer-metrics\nmodel        "
     << escaped(t.attrs.model) << "\nworld size   " << t.attrs.world_size << "\ndevices      "
     << escaped(t.attrs.devices) << "\nversions     " << escaped(t.attrs.versions)
     << "\ngit commit   " << escaped(t.attrs.git_commit) << "\n";
  if (!t.resumed_at_steps.empty()) {
    os << "resumed at  ";
    for (int64_t step : t.resumed_at_steps) os << " " << step;
    os << "\n";
  }
  const auto table = [&os](const char* name, const std::vector<std::string>& columns,
                           const std::vector<std::vector<double>>& rows) {
    os << name << " (" << rows.size() << " rows)\n ";
    for (const std::string& c : columns) os << " " << escaped(c);
    os << "\n";
    for (const std::vector<double>& row : rows) {
      os << " ";
      for (double v : row) os << " " << exact(v);
      os << "\n";
    }
  };
  table("/train", t.train_columns, t.train_rows);
  table("/eval", t.eval_columns, t.eval_rows);
}

}  // namespace

int run_inspect(const std::string& path, Communicator& comm) {
  // Build the text first so a fault never leaves half a summary on stdout.
  std::ostringstream out;
  const int code = agree_on(
      comm,
      [&] {
        // One plain open tells the kinds apart (a metrics file may be open
        // for SWMR writing) and names a file that is none of them.
        const std::string format = hdf5::file_format(hdf5::Faults::of<std::runtime_error>(path),
                                                     "shard, checkpoint or metrics file",
                                                     /*beside_writer=*/true);
        if (format == kCheckpointFormat) {
          print_checkpoint(out, path);
        } else if (format == kMetricsFormat) {
          print_metrics(out, path);
        } else {
          print_summary(out, path, read_shard(path));  // says what a shard would need
        }
      },
      Speaker::kRoot, Blame::kOfInput, "inspect");
  if (code == 0 && comm.is_root()) std::cout << out.str() << std::flush;
  return code;
}

}  // namespace mpiformer
