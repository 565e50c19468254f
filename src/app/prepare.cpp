// mpiformer prepare: raw text (or a line-aligned parallel pair) to HDF5 token
// shards, over MPI ranks.
//
//   1. rank 0 validates the inputs; every rank agrees on the verdict before
//      any work (exit 2, one line naming the file and the fault);
//   2. every rank reads the text (rank 0 also the --valid and --test files)
//      and cuts it into splits: training lines first, then the validation
//      lines, then the test lines (unless those come from files); rank 0
//      creates the output directory and locks it (DIR/.lock) until the end,
//      so a second prepare into it is refused; rank 0 trains the
//      SentencePiece model on the training lines alone (or loads
//      --tokenizer) and broadcasts its bytes;
//   3. shard s holds the s-th contiguous block of the training sequences;
//      in round k rank r encodes and writes shard k*W + r, and rank 0 reports
//      the round; then rank 0 writes the validation and test shards and
//      tokenizer.model;
//   4. everything is written under temporary names and renamed only when
//      every rank has succeeded; on any failure every rank removes what it
//      wrote, so the output directory never holds a partial shard set.
//
// Rank 0 reports each phase on stdout, and every kProgressSeconds within a
// long one (tokenizer training, encoding), so a large corpus is never silent
// for long while a small one gets only the phase lines.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/app/commands.h"
#include "src/app/prepare/corpus.h"
#include "src/app/prepare/inputs.h"
#include "src/app/prepare/output.h"
#include "src/app/prepare/progress.h"
#include "src/core/error.h"
#include "src/data/labels.h"
#include "src/data/tokenizer.h"
#include "src/io/array_file.h"
#include "src/io/shard.h"
#include "src/parallel/agreement.h"

namespace mpiformer {
namespace {

namespace fs = std::filesystem;
using namespace prepare;

// ---- encoding ----------------------------------------------------------------

struct ShardFigures {
  int64_t sequences = 0;
  int64_t tokens = 0;          // source and target
  int64_t skipped = 0;         // non-blank lines that encode to no token at all
  int64_t unknown = 0;         // unk tokens: characters the tokenizer lacks
  int64_t labels = 0;          // classify: labels kept
  int64_t unknown_labels = 0;  // classify: labels the training lines never had, dropped
};

// Encodes a span of a text into one shard. `progress`, when given, is
// called every few hundred sequences with the number done so far.
Shard encode_block(const Span& span, const Tokenizer& tokenizer, const ShardHeader& header,
                   const LabelVocabulary& vocabulary, ShardFigures* figures,
                   const std::function<void(size_t)>& progress = nullptr) {
  const Text& c = *span.text;
  const bool seq2seq = c.seq2seq();
  const auto encode = [&](const std::string& file, const std::vector<std::string>& lines,
                          size_t line) {
    try {
      return tokenizer.encode(lines[line]);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(file + ":" + std::to_string(line + 1) + ": " + e.what());
    }
  };
  Shard shard;
  shard.header = header;
  shard.header.origin = span.origin();
  for (size_t s = span.begin; s < span.end; ++s) {
    if (progress && (s - span.begin) % 256 == 255) progress(s - span.begin + 1);
    const size_t line = c.sequences[s];
    const std::vector<int> target =
        encode(seq2seq ? c.target_path : c.input_path, seq2seq ? c.target : c.input, line);
    std::vector<int> source;
    if (seq2seq) source = encode(c.input_path, c.input, line);
    // A line of, say, only control characters normalises to nothing; an
    // empty sequence teaches nothing, so it is counted and left out.
    if (target.empty() || (seq2seq && source.empty())) {
      ++figures->skipped;
      continue;
    }
    static_assert(sizeof(int) == sizeof(int32_t));
    shard.target.append(reinterpret_cast<const int32_t*>(target.data()), target.size());
    if (seq2seq) {
      shard.source.append(reinterpret_cast<const int32_t*>(source.data()), source.size());
    }
    if (!c.labels_path.empty()) {
      std::vector<int32_t> ids;
      std::vector<float> weights;
      for (const LabelWeight& label : parse_label_line(c.labels[line])) {
        const int id = vocabulary.id(label.name);
        if (id < 0) {
          ++figures->unknown_labels;  // not in the training lines: nothing learnt it
          continue;
        }
        ids.push_back(id);
        weights.push_back(label.weight);
      }
      shard.labels.append(ids.data(), weights.data(), ids.size());
      figures->labels += static_cast<int64_t>(ids.size());
    }
    ++figures->sequences;
    figures->tokens += static_cast<int64_t>(target.size() + source.size());
    const int unk = header.special.unk;
    figures->unknown += std::count(target.begin(), target.end(), unk) +
                        std::count(source.begin(), source.end(), unk);
  }
  if (figures->sequences == 0) {
    throw std::runtime_error(c.input_path + ": lines " +
                             std::to_string(c.sequences[span.begin] + 1) + " to " +
                             std::to_string(c.sequences[span.end - 1] + 1) +
                             " all encode to nothing, so their shard would be empty");
  }
  return shard;
}

// The training lines alone, for SentencePiece, when held-out lines were cut
// from the input (it reads files): written beside the shards under
// temporary names and removed once the tokenizer is trained or has failed.
class TrainingText {
 public:
  // Writing the copy failed: the message names the copy, not the input.
  struct WriteError : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  TrainingText(const fs::path& dir, const Span& train) {
    const Text& t = *train.text;
    try {
      add(dir / "tokenizer-input.txt", t.input_path, t.input, train);
      if (t.seq2seq()) add(dir / "tokenizer-target.txt", t.target_path, t.target, train);
    } catch (...) {
      remove_all();
      throw;
    }
  }
  ~TrainingText() { remove_all(); }
  TrainingText(const TrainingText&) = delete;
  TrainingText& operator=(const TrainingText&) = delete;

  std::vector<std::string> paths() const {
    std::vector<std::string> paths;
    for (const File& f : files_) paths.push_back(f.temporary);
    return paths;
  }

  // A message about the temporary files, naming the user's instead.
  std::string as_given(std::string message) const {
    for (const File& f : files_) {
      for (size_t at; (at = message.find(f.temporary)) != std::string::npos;) {
        message.replace(at, f.temporary.size(), f.given);
      }
    }
    return message;
  }

 private:
  struct File {
    std::string temporary, given;
  };

  void add(fs::path path, const std::string& given, const std::vector<std::string>& lines,
           const Span& train) {
    path += ".tmp-" + std::to_string(::getpid());
    files_.push_back({path.string(), given});
    errno = 0;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    for (size_t s = train.begin; s < train.end && out; ++s) {
      out << lines[train.text->sequences[s]] << '\n';
    }
    out.close();
    if (!out) {
      throw WriteError(path.string() + ": cannot write" +
                       (errno != 0 ? " (" + std::string(std::strerror(errno)) + ")" : ""));
    }
  }

  void remove_all() {
    for (const File& f : files_) {
      std::error_code ec;
      fs::remove(f.temporary, ec);
    }
  }

  std::vector<File> files_;
};

// ---- images --------------------------------------------------------------------

// The images of --kind image: (N, H, W) or (N, H, W, C) uint8 and N integer
// labels, with optional label names, read on rank 0.
struct ImageSet {
  ShardHeader header;           // kind, size and label names
  std::vector<uint8_t> pixels;  // (N, H, W, C)
  std::vector<int32_t> labels;  // (N)
  size_t count() const { return labels.size(); }
};

ImageSet read_image_set(const std::string& path) {
  const auto arrays =
      read_arrays(path, {{"images"}, {"labels"}, {"label_names", /*required=*/false}});
  const ArrayData& images = arrays[0].second;
  const ArrayData& labels = arrays[1].second;
  if (images.kind != 'u' || images.itemsize != 1) {
    usage_error("--input", path + ": 'images' must hold uint8 pixels; got " +
                               std::string(1, images.kind) + std::to_string(images.itemsize));
  }
  if (images.shape.size() != 3 && images.shape.size() != 4) {
    usage_error("--input", path + ": 'images' must be (N, H, W) or (N, H, W, C); it has " +
                               std::to_string(images.shape.size()) + " dimensions");
  }
  ImageSet set;
  ShardHeader& h = set.header;
  h.kind = "image";
  h.vocab_size = SpecialTokens::kCount;  // no tokens: only the reserved ids
  h.image_height = static_cast<int>(images.shape[1]);
  h.image_width = static_cast<int>(images.shape[2]);
  h.image_channels = images.shape.size() == 4 ? static_cast<int>(images.shape[3]) : 1;
  const int64_t n = images.shape[0];
  if (labels.shape.size() != 1 || labels.shape[0] != n) {
    usage_error("--input", path + ": 'labels' must be (N) with N = " + std::to_string(n) +
                               " (one integer label per image)");
  }
  int64_t most = -1;
  for (int64_t label : labels.integers(path + ": 'labels'")) {
    if (label < 0)
      usage_error("--input", path + ": label " + std::to_string(label) + " is negative");
    most = std::max(most, label);
    set.labels.push_back(static_cast<int32_t>(label));
  }
  if (arrays.size() > 2) {
    h.label_names = arrays[2].second.strings(path + ": 'label_names'");
    if (static_cast<int64_t>(h.label_names.size()) <= most) {
      usage_error("--input", path + ": label " + std::to_string(most) + " has no name in the " +
                                 std::to_string(h.label_names.size()) + " 'label_names'");
    }
  } else {
    for (int64_t k = 0; k <= most; ++k) h.label_names.push_back(std::to_string(k));
  }
  set.pixels = images.bytes;
  return set;
}

// Images [begin, end) of the set as one shard.
Shard image_shard(const ImageSet& set, size_t begin, size_t end, const char* split,
                  const std::string& origin) {
  Shard shard;
  shard.header = set.header;
  shard.header.split = split;
  shard.header.origin = origin + " images " + std::to_string(begin + 1) + "-" + std::to_string(end);
  const size_t bytes = set.header.image_bytes();
  shard.images.assign(set.pixels.begin() + static_cast<std::ptrdiff_t>(begin * bytes),
                      set.pixels.begin() + static_cast<std::ptrdiff_t>(end * bytes));
  const float hard = 1.0f;
  for (size_t i = begin; i < end; ++i) shard.labels.append(&set.labels[i], &hard, 1);
  return shard;
}

// prepare --kind image: small enough for rank 0 alone; the other ranks only
// agree on the outcome. Held-out images come from the end of the set.
int run_prepare_images(const PrepareConfig& cfg, Communicator& comm) {
  const auto start = Clock::now();
  if (agree_on_root(
          comm, [&] { check_image_inputs(cfg); }, Faults::kOfInput, "prepare") != 0) {
    return kExitUsage;
  }
  ImageSet set;
  size_t valid = 0, test = 0, train = 0;
  if (agree_on_root(
          comm,
          [&] {
            set = read_image_set(cfg.input);
            const size_t most = set.count() / kHoldOut;
            valid = std::min(static_cast<size_t>(cfg.valid_lines), most);
            test = std::min(static_cast<size_t>(cfg.test_lines), most);
            train = set.count() - valid - test;
            if (valid == 0) {
              usage_error("--input", cfg.input + " has " + std::to_string(set.count()) +
                                         " images; at least " + std::to_string(kHoldOut) +
                                         " are needed to hold one out for validation");
            }
            if (static_cast<size_t>(cfg.shards) > train) {
              usage_error("--shards", std::to_string(cfg.shards) + " shards but only " +
                                          std::to_string(train) + " training images");
            }
          },
          Faults::kOfInput, "prepare") != 0) {
    return kExitUsage;
  }
  OutputDir out(cfg.out_dir);
  const bool ok = agreed(comm, [&] {
    if (!comm.is_root()) return;
    out.create();
    const std::string refused = out.lock();
    if (!refused.empty()) throw std::runtime_error(refused);
    const std::string origin = fs::path(cfg.input).filename().string();
    for (int64_t k = 0; k < cfg.shards; ++k) {
      out.write_shard(
          shard_name(kTrainPrefix, k),
          image_shard(set, static_cast<size_t>(k) * train / cfg.shards,
                      static_cast<size_t>(k + 1) * train / cfg.shards, kTrainPrefix, origin));
    }
    out.write_shard(shard_name(kValidPrefix, 0),
                    image_shard(set, train, train + valid, kValidPrefix, origin));
    if (test > 0) {
      out.write_shard(shard_name(kTestPrefix, 0),
                      image_shard(set, train + valid, train + valid + test, kTestPrefix, origin));
    }
    out.commit();
  });
  if (!ok) {
    out.remove_written();
    out.let_go();
    return kExitFailure;
  }
  if (comm.is_root()) {
    const ShardHeader& h = set.header;
    std::printf(
        "prepared %s: %s training images in %d shard(s), %s validation, %s test; %d x %d x %d "
        "pixels, %zu labels; %.1f s\n",
        cfg.out_dir.c_str(), grouped(static_cast<int64_t>(train)).c_str(), cfg.shards,
        grouped(static_cast<int64_t>(valid)).c_str(), grouped(static_cast<int64_t>(test)).c_str(),
        h.image_height, h.image_width, h.image_channels, h.label_names.size(),
        seconds_since(start));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int run_prepare(const PrepareConfig& cfg, Communicator& comm) {
  if (cfg.kind == "image") return run_prepare_images(cfg, comm);
  const auto start = Clock::now();
  const bool seq2seq = cfg.kind == "seq2seq";
  const int W = comm.size(), rank = comm.rank();
  // Rank 0's report: one line at a time, on stdout, flushed at once.
  const auto say = [&](const std::string& line) {
    if (comm.is_root()) std::cout << line << std::endl;
  };

  // 1. The files, the output directory and --tokenizer, before any work.
  std::string model_bytes;
  if (agree_on_root(
          comm, [&] { model_bytes = check_text_inputs(cfg); }, Faults::kOfInput, "prepare") != 0) {
    return kExitUsage;
  }

  // 2. Every rank reads the text (it is small next to its tokens) and finds
  // the same splits; only rank 0 writes the held-out shards, so only it
  // reads --valid and --test. Rank 0 judges it all.
  Corpus corpus = corpus_of(cfg);
  if (!agreed(comm, [&] { read_corpus(cfg, comm.is_root(), &corpus); })) return kExitFailure;
  std::vector<std::string> warnings;
  if (agree_on_root(
          comm, [&] { warnings = validate_corpus(cfg, corpus); }, Faults::kOfInput, "prepare") != 0)
    return kExitUsage;
  LabelVocabulary vocabulary;
  if (cfg.kind == "classify") {
    vocabulary = training_labels(corpus);
    if (agree_on_root(
            comm, [&] { require_training_labels(cfg, vocabulary); }, Faults::kOfInput, "prepare") !=
        0) {
      return kExitUsage;
    }
  }
  if (comm.is_root()) {
    for (const std::string& w : warnings) std::cerr << "mpiformer prepare: " << w << std::endl;
    report_corpus(corpus, start, say);
  }

  // The output directory: created by rank 0 now that the inputs are known
  // good, and locked until the end, so a second prepare into it is refused
  // rather than mixing its files with ours. Step 1 saw it free of shards
  // before the lock; only a check under the lock can be trusted.
  OutputDir out(cfg.out_dir);
  // Every rank removes what it wrote; then rank 0 lets the directory go,
  // removing it if it made it (only if empty: never another's files).
  const auto give_up = [&](int code) {
    out.remove_written();
    comm.barrier();
    out.let_go();
    return code;
  };
  if (!agreed(comm, [&] {
        if (comm.is_root()) out.create();
      })) {
    return kExitFailure;
  }
  if (agree_on_root(
          comm,
          [&] {
            const std::string refused = out.lock();
            if (!refused.empty()) usage_error("--out", refused);
            require_fresh_output(cfg.out_dir);
          },
          Faults::kOfInput, "prepare") != 0) {
    return give_up(kExitUsage);
  }

  // 3. The tokenizer: trained on rank 0 on the training lines alone, so the
  // held-out splits stay unseen (one vocabulary for both sides of a pair),
  // or the one given; every rank gets its bytes.
  const auto tokenizer_start = Clock::now();
  if (cfg.tokenizer.empty()) {
    std::string failure;
    if (comm.is_root()) {
      const Span train = corpus.train();
      say("training a " + cfg.model_type + " tokenizer of " + std::to_string(cfg.vocab_size) +
          " pieces on the " + grouped(static_cast<int64_t>(train.size())) + " training " +
          corpus.main.units(train.size()) + " of " + corpus.main.name() + " ...");
      if (const size_t too_long = too_long_to_train(train); too_long > 0) {
        say("  " + std::to_string(too_long) + " line(s) longer than " +
            std::to_string(kLongestTrainedLine) +
            " bytes are left out of the tokenizer's training (they are still encoded)");
      }
      TokenizerTrainOptions options;
      options.vocab_size = cfg.vocab_size;
      options.model_type = cfg.model_type;
      options.seed = cfg.seed;
      std::unique_ptr<TrainingText> text;
      try {
        std::vector<std::string> files{cfg.input};
        if (seq2seq) files.push_back(cfg.target);
        if (corpus.carved()) {
          text = std::make_unique<TrainingText>(out.path(), train);
          files = text->paths();
        }
        const Heartbeat heartbeat([&](double seconds) {
          say("  training the tokenizer (" + format_seconds(seconds) + ")");
        });
        model_bytes = Tokenizer::train(files, options);
      } catch (const TrainingText::WriteError& e) {
        failure = e.what();
      } catch (const std::exception& e) {
        failure = text ? text->as_given(e.what()) : e.what();
      }
    }
    comm.barrier_without_spinning();
    // More pieces than the text can fill, or fewer than its characters, is
    // a bad --vocab-size (exit 2); SentencePiece's message says which.
    const bool bad_vocab_size = failure.find("Vocabulary size") != std::string::npos;
    if (agree_on_root(
            comm,
            [&] {
              if (bad_vocab_size) usage_error("--vocab-size", failure);
              if (!failure.empty()) throw std::runtime_error(failure);
            },
            Faults::kOfInput, "prepare") != 0) {
      return give_up(comm.any(bad_vocab_size) ? kExitUsage : kExitFailure);
    }
  }
  comm.broadcast(&model_bytes, 0);
  std::unique_ptr<Tokenizer> tokenizer;
  if (!agreed(comm, [&] { tokenizer = Tokenizer::from_bytes(model_bytes); })) {
    return give_up(kExitFailure);
  }
  const double tokenizer_seconds = seconds_since(tokenizer_start);
  if (cfg.tokenizer.empty()) {
    say("tokenizer: " + std::to_string(tokenizer->vocab_size()) + " pieces in " +
        format_seconds(tokenizer_seconds));
  }

  ShardHeader header;
  header.kind = cfg.kind;
  header.vocab_size = tokenizer->vocab_size();
  // header.special: the reserved ids the tokenizer was checked to have
  header.tokenizer = model_bytes;
  header.label_names = vocabulary.names();

  // 4. Shards, in rounds of W: rank r writes shard k*W + r of round k.
  const auto encode_start = Clock::now();
  const int64_t shards = cfg.shards;
  const size_t train_sequences = corpus.train_count();
  say("encoding " + grouped(static_cast<int64_t>(train_sequences)) + " training sequences into " +
      std::to_string(shards) + " shard(s) on " + std::to_string(W) +
      " rank(s), writing each when done ...");
  // Rank 0's running count within the shard it encodes, every
  // kProgressSeconds.
  Throttle throttle;
  const auto count_encoded = [&](const std::string& name, size_t sequences) {
    return std::function<void(size_t)>([&, name, sequences](size_t done) {
      if (!throttle.due()) return;
      say("  " + name + ": " + grouped(static_cast<int64_t>(done)) + " of " +
          grouped(static_cast<int64_t>(sequences)) + " sequences encoded (" +
          format_seconds(seconds_since(encode_start)) + ")");
    });
  };
  ShardFigures total;
  bool ok = true;
  for (int64_t first = 0; first < shards && ok; first += W) {
    const int64_t mine = first + rank;
    ShardFigures figures;
    ok = agreed(comm, [&] {
      if (mine >= shards) return;
      const Span block{&corpus.main, static_cast<size_t>(mine * train_sequences / shards),
                       static_cast<size_t>((mine + 1) * train_sequences / shards)};
      const std::string name = shard_name(kTrainPrefix, mine);
      ShardHeader train_header = header;
      train_header.split = kTrainPrefix;
      // Rank 0's running count stands for the round: the ranks' blocks
      // are of one size.
      const Shard shard =
          encode_block(block, *tokenizer, train_header, vocabulary, &figures,
                       comm.is_root() ? count_encoded(name, block.size()) : nullptr);
      out.write_shard(name, shard);
    });
    if (!ok) break;
    // Every rank's figures for this round, so rank 0 can report each shard.
    constexpr int kFigures = 6;
    std::vector<double> round(kFigures * static_cast<size_t>(W), 0.0);
    double* own = &round[kFigures * rank];
    own[0] = static_cast<double>(figures.sequences);
    own[1] = static_cast<double>(figures.tokens);
    own[2] = static_cast<double>(figures.skipped);
    own[3] = static_cast<double>(figures.unknown);
    own[4] = static_cast<double>(figures.labels);
    own[5] = static_cast<double>(figures.unknown_labels);
    comm.allreduce_sum(round.data(), static_cast<int>(round.size()));
    for (int r = 0; r < W && first + r < shards; ++r) {
      const double* of_r = &round[kFigures * r];
      const auto sequences = static_cast<int64_t>(of_r[0]);
      const auto tokens = static_cast<int64_t>(of_r[1]);
      total.sequences += sequences;
      total.tokens += tokens;
      total.skipped += static_cast<int64_t>(of_r[2]);
      total.unknown += static_cast<int64_t>(of_r[3]);
      total.labels += static_cast<int64_t>(of_r[4]);
      total.unknown_labels += static_cast<int64_t>(of_r[5]);
      say("  " + shard_name(kTrainPrefix, first + r) + ": " + grouped(sequences) + " sequences, " +
          grouped(tokens) + " tokens (" + format_seconds(seconds_since(encode_start)) + ")");
    }
  }

  // The held-out shards and the tokenizer, from rank 0.
  ShardFigures held_out[2];     // valid, test
  int64_t test_sequences = -1;  // -1: no test split
  if (ok) {
    ok = agreed(comm, [&] {
      if (!comm.is_root()) return;
      const std::pair<const char*, Span> splits[] = {{kValidPrefix, corpus.valid()},
                                                     {kTestPrefix, corpus.test()}};
      for (int k = 0; k < 2; ++k) {
        const auto& [prefix, span] = splits[k];
        if (!span.text) continue;
        ShardHeader split_header = header;
        split_header.split = prefix;
        const std::string name = shard_name(prefix, 0);
        const Shard shard = encode_block(span, *tokenizer, split_header, vocabulary, &held_out[k],
                                         count_encoded(name, span.size()));
        out.write_shard(name, shard);
        say("  " + name + ": " + grouped(held_out[k].sequences) + " sequences, " +
            grouped(held_out[k].tokens) + " tokens (" +
            format_seconds(seconds_since(encode_start)) + ")");
        if (k == 1) test_sequences = held_out[k].sequences;
      }
      out.write_bytes(kTokenizerFile, model_bytes);
    });
  }

  // 5. All or nothing: rename only when every rank succeeded.
  if (ok) ok = agreed(comm, [&] { out.commit(); });
  if (!ok) return give_up(kExitFailure);

  if (comm.is_root()) {
    const ShardFigures& valid = held_out[0];
    const ShardFigures& test = held_out[1];
    const double encode_seconds = seconds_since(encode_start);
    const int64_t tokens = total.tokens + valid.tokens + test.tokens;
    size_t lines = corpus.main.input.size(), blank = corpus.main.blank;
    for (const Text* t : {&corpus.valid_file, &corpus.test_file}) {
      lines += t->input.size();
      blank += t->blank;
    }
    const int64_t skipped =
        static_cast<int64_t>(blank) + total.skipped + valid.skipped + test.skipped;
    const std::string test_part =
        test_sequences < 0 ? "" : ", " + grouped(test_sequences) + " test";
    std::printf(
        "prepared %s: %s training sequences in %lld shard(s), %s validation%s; %s tokens "
        "(%s unknown), vocabulary %d\n",
        cfg.out_dir.c_str(), grouped(total.sequences).c_str(), static_cast<long long>(shards),
        grouped(valid.sequences).c_str(), test_part.c_str(), grouped(tokens).c_str(),
        grouped(total.unknown + valid.unknown + test.unknown).c_str(), header.vocab_size);
    std::printf(
        "  %s %s read, %s skipped (blank or encoding to nothing); %.1f s in all, "
        "encoding %.1f s (%s tokens/s)\n",
        grouped(static_cast<int64_t>(lines)).c_str(), seq2seq ? "line pairs" : "lines",
        grouped(skipped).c_str(), seconds_since(start), encode_seconds,
        grouped(static_cast<int64_t>(tokens / std::max(encode_seconds, 1e-9))).c_str());
    if (cfg.kind == "classify") {
      const int64_t dropped = valid.unknown_labels + test.unknown_labels;
      std::printf("  %zu labels (the training lines'), %.2f per training example%s\n",
                  header.label_names.size(),
                  static_cast<double>(total.labels) / std::max<int64_t>(total.sequences, 1),
                  dropped > 0 ? (", " + grouped(dropped) +
                                 " held-out label(s) the training lines never had were dropped")
                                    .c_str()
                              : "");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace mpiformer
