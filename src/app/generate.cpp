// `mpiformer generate`: translation (seq2seq) and continuation (lm) with a
// checkpoint. Rank 0 decodes; other ranks of an mpirun job only wait. With
// --data it translates the source side of a split of a shard set, in order,
// and writes the split's targets beside the output as references. The
// output files are written under temporary names and renamed into place
// when every line is done: a fault or a stop signal leaves them as they were.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/core/error.h"
#include "src/data/tokenizer.h"
#include "src/io/atomic_file.h"
#include "src/io/checkpoint.h"
#include "src/io/shard.h"
#include "src/io/stop_cleanup.h"
#include "src/model/decoding.h"
#include "src/model/model.h"
#include "src/parallel/agreement.h"
#include "src/train/memory_budget.h"

namespace mpiformer {

namespace {

// The output could not be written: "generate: cannot write the output
// (WHERE: reason)", exit 1.
class OutputError : public CommandError {
 public:
  explicit OutputError(const std::string& detail)
      : CommandError("generate: cannot write the output (" + detail + ")") {}
};

// Text to ids through the tokenizer, or, for a checkpoint of a synthetic
// task (no tokenizer), space-separated ids checked against the vocabulary.
std::vector<int32_t> to_ids(const Tokenizer* tokenizer, const std::string& line, int vocab,
                            const std::string& where) {
  std::vector<int32_t> ids;
  if (tokenizer) {
    for (int id : tokenizer->encode(line)) ids.push_back(id);
    return ids;
  }
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    int id = -1;
    try {
      id = std::stoi(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || id < 0 || id >= vocab) {
      throw UsageError(where + ": '" + word + "' is not a token id in [0, " +
                       std::to_string(vocab) +
                       ") (the checkpoint has no tokenizer: a synthetic task reads token ids)");
    }
    ids.push_back(id);
  }
  return ids;
}

std::string to_text(const Tokenizer* tokenizer, const std::vector<int32_t>& ids) {
  if (tokenizer) return tokenizer->decode(std::vector<int>(ids.begin(), ids.end()));
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) text += ' ';
    text += std::to_string(ids[i]);
  }
  return text;
}

// The source sequences of a split of --data, in order, and the detokenised
// targets beside them. The shards must be of a seq2seq set made with the
// checkpoint's own tokenizer, or their ids mean something else.
struct SplitInputs {
  std::vector<std::vector<int32_t>> sources;
  std::vector<std::string> references;
  std::string origin;  // where the split came from, when the shards say
};

SplitInputs read_split(const GenerateConfig& cfg, const CheckpointState& state, bool lm,
                       bool synthetic, const Tokenizer* tokenizer) {
  if (lm) {
    throw UsageError("--data: " + cfg.checkpoint +
                     " holds an lm, and the lines of a split are whole sequences, not sources "
                     "to translate; score an lm with `mpiformer eval --split`, or give it "
                     "prompts with --input");
  }
  if (!tokenizer) {
    throw UsageError("--data: " + cfg.checkpoint +
                     (synthetic ? " was trained on a synthetic task, whose ids are not those of " +
                                      cfg.data_dir + "'s shards"
                                : " has no tokenizer to read " + cfg.data_dir + "'s shards"));
  }
  const std::vector<std::string> files = list_shards(cfg.data_dir, cfg.split);
  if (files.empty()) {
    throw UsageError("--split: " + cfg.data_dir + " has no " + cfg.split + " split (no " +
                     cfg.split + "-NNNNN.h5)" +
                     (cfg.split == "test"
                          ? "; `mpiformer prepare` writes one with --test or --test-lines"
                          : ""));
  }
  SplitInputs split;
  for (const std::string& file : files) {
    const ShardHeader header = read_shard_header(file);
    if (header.kind != "seq2seq") {
      throw UsageError("--data: " + file + " is a shard of kind " + header.kind +
                       "; a seq2seq checkpoint translates the sources of a seq2seq set");
    }
    if (header.vocab_size != state.vocab_size || header.special != state.special ||
        header.tokenizer != state.tokenizer) {
      throw UsageError("--data: the shards of " + cfg.data_dir + " have " +
                       std::to_string(header.vocab_size) +
                       " ids and their own tokenizer; the checkpoint was trained on " +
                       std::to_string(state.vocab_size) + " ids with another tokenizer");
    }
    const Shard shard = read_shard(file);
    for (size_t i = 0; i < shard.source.count(); ++i) {
      const auto ids = [&](const TokenSequences& side) {
        const auto* first = side.tokens.data() + side.offsets[i];
        return std::vector<int32_t>(first, first + side.length(i));
      };
      split.sources.push_back(ids(shard.source));
      const std::vector<int32_t> target = ids(shard.target);
      split.references.push_back(tokenizer->decode(std::vector<int>(target.begin(), target.end())));
    }
    if (!header.origin.empty()) split.origin += (split.origin.empty() ? "" : "; ") + header.origin;
  }
  return split;
}

// What a fault or a stop leaves of the outputs: "hyp.txt was left
// unchanged, ref.txt was not written".
std::string what_is_kept(const GenerateConfig& cfg) {
  std::string kept;
  for (const std::string& path : {cfg.output, cfg.references}) {
    if (path.empty()) continue;
    std::error_code ec;
    kept += (kept.empty() ? "" : ", ") + path +
            (std::filesystem::exists(path, ec) ? " was left unchanged" : " was not written");
  }
  if (cfg.output.empty())
    kept += std::string(kept.empty() ? "" : ", ") + "stdout holds the lines done so far";
  return kept;
}

int generate_on_root(const GenerateConfig& cfg) {
  const ModelCheckpoint checkpoint = read_model_checkpoint(cfg.checkpoint, "--checkpoint");
  const CheckpointState& state = checkpoint.state;
  const std::vector<CheckpointTensor>& tensors = checkpoint.params;
  TrainConfig run = train_config_from_ini(state.config_ini, cfg.checkpoint + " (its config)");
  run.model.vocab = state.vocab_size;
  run.model.special = state.special;
  if (run.model.kind == ModelKind::kMlm) {
    std::cerr << "mpiformer generate: --checkpoint: " << cfg.checkpoint
              << " holds an mlm, which fills masks rather than generating; use an lm or seq2seq"
              << std::endl;
    return kExitUsage;
  }
  if (run.model.kind == ModelKind::kClassify) {
    usage_error("--checkpoint",
                cfg.checkpoint + " holds " +
                    (run.model.images() ? "an image classifier" : "a text classifier") +
                    ", which scores labels and cannot generate; " +
                    (run.model.images() ? "score image shards with `mpiformer eval --data DIR`"
                                        : "use `mpiformer classify`"));
  }
  const bool lm = run.model.kind == ModelKind::kLm;
  if (cfg.top_k > 0 && !lm) {
    throw UsageError("--top-k: top-k sampling is for lm checkpoints; " + cfg.checkpoint +
                     " holds a seq2seq, which decodes greedily or by --beam");
  }
  std::unique_ptr<Tokenizer> tokenizer;
  if (!state.tokenizer.empty()) tokenizer = Tokenizer::from_bytes(state.tokenizer);
  // Shard data frames sequences with EOS (source) and BOS (lm); the
  // synthetic tasks do not.
  const bool synthetic = run.synthetic != SyntheticTask::kNone;
  const Layout layout{!synthetic, !synthetic};

  std::vector<std::string> lines;
  SplitInputs split;
  if (!cfg.data_dir.empty()) {
    split = read_split(cfg, state, lm, synthetic, tokenizer.get());
  } else if (!cfg.prompt.empty()) {
    lines.push_back(cfg.prompt);
  } else {
    std::ifstream in(cfg.input);
    if (!in) throw std::runtime_error(cfg.input + ": cannot read");
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  // Parse every input before decoding any: a bad line is found at once.
  std::vector<std::vector<int32_t>> inputs = std::move(split.sources);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = cfg.prompt.empty()
                                  ? "--input: " + cfg.input + " line " + std::to_string(i + 1)
                                  : std::string("--prompt");
    inputs.push_back(to_ids(tokenizer.get(), lines[i], run.model.vocab, where));
    // An lm continues its prompt inside the positions table: BOS, the prompt
    // and at least one new token must fit. (A seq2seq source is cut to fit,
    // as in training.)
    const int most = run.model.max_len - (layout.lm_bos ? 1 : 0) - 1;
    const auto n = static_cast<int64_t>(inputs.back().size());
    if (lm && n > most) {
      throw UsageError(
          where + ": " + std::to_string(n) + " tokens, more than the model's max-len " +
          std::to_string(run.model.max_len) + " leaves for a prompt (at most " +
          std::to_string(most) + " beside " + (layout.lm_bos ? "BOS and " : "") + "one new token)");
    }
  }

  std::unique_ptr<Ops> ops = make_cpu_ops(cfg.threads);
  // Room for every beam at full length on both sides, if memory allows.
  const int64_t capacity = static_cast<int64_t>(cfg.beam) * run.model.max_len;
  if (capacity > std::numeric_limits<int32_t>::max()) {
    usage_error("--beam", std::to_string(cfg.beam) + " beams of max-len " +
                              std::to_string(run.model.max_len) + " are " +
                              std::to_string(capacity) + " tokens, more than 2^31 - 1");
  }
  const ModelCapacity room{static_cast<int>(capacity), run.model.max_len};
  const std::string shortfall = memory_shortfall(
      estimate_memory(*ops, run.model, room, DType::kF32), *ops, 1,
      "--beam (each beam holds max-len " + std::to_string(run.model.max_len) + " tokens)");
  if (!shortfall.empty()) usage_error("--beam", "decoding " + shortfall);
  Model model(*ops, run.model, room);
  model.init_parameters(run.seed);  // allocates; the checkpoint's values replace these
  std::vector<float> host(model.parameters().count());  // (count)
  unpack_checkpoint_tensors(cfg.checkpoint, tensors, model.parameters(), host.data());
  ops->device().copy_to_device(model.parameters().params(), host.data(),
                               host.size() * sizeof(float));

  DecodeOptions options;
  options.beam = cfg.beam;
  options.length_alpha = cfg.length_alpha;
  options.max_new_tokens = cfg.max_new_tokens;
  options.top_k = cfg.top_k;
  options.temperature = cfg.temperature;
  // The files under temporary names until every line is done; a fault of
  // one names it and says what was kept.
  std::unique_ptr<StagedTextFile> file, references;
  const auto to_files = [&](auto&& write) {
    try {
      write();
    } catch (const std::runtime_error& e) {
      throw CommandError(std::string("generate: ") + e.what() + "; " + what_is_kept(cfg));
    }
  };
  // A full disk or a closed pipe shows only as a failed stream, after the
  // write or at the flush: each line is checked once flushed.
  const auto check_stdout = [] {
    if (!std::cout) {
      const int err = errno;
      throw OutputError(std::string("stdout") +
                        (err != 0 ? std::string(": ") + std::strerror(err) : ""));
    }
  };
  // The references whole, at once: they are known. Both files are renamed
  // into place together at the end, so they always pair up.
  to_files([&] {
    if (!cfg.output.empty()) file = std::make_unique<StagedTextFile>(cfg.output);
    if (!cfg.references.empty()) {
      references = std::make_unique<StagedTextFile>(cfg.references);
      std::string text;
      for (const std::string& line : split.references) text += line + "\n";
      references->write(text);
    }
  });
  if (!cfg.data_dir.empty()) {
    std::cerr << "mpiformer generate: translating the " << inputs.size()
              << " source sentence(s) of the " << cfg.split << " split of " << cfg.data_dir
              << (split.origin.empty() ? "" : " (" + split.origin + ")") << std::endl;
  }
  // Progress on stderr, never among the outputs: every kProgressSeconds, so
  // a long input reports and a short one does not.
  using Clock = std::chrono::steady_clock;
  constexpr double kProgressSeconds = 5.0;
  const auto start = Clock::now();
  auto last_report = start;
  for (size_t i = 0; i < inputs.size(); ++i) {
    options.seed = cfg.seed + i;  // each line its own stream, the same for any line order
    const Hypothesis h = lm ? continue_text(model, inputs[i], layout, options)
                            : translate(model, inputs[i], layout, options);
    const std::string text = to_text(tokenizer.get(), h.ids);
    if (file) {
      to_files([&] { file->write(text + "\n"); });
    } else {
      errno = 0;
      std::cout << text << "\n" << std::flush;
      check_stdout();
    }
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - last_report).count() >= kProgressSeconds &&
        i + 1 < inputs.size()) {
      last_report = now;
      const double seconds = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "generate: %zu/%zu lines (%.0f%%), %.1f s, %.2f lines/s\n", i + 1,
                   inputs.size(), 100.0 * static_cast<double>(i + 1) / inputs.size(), seconds,
                   static_cast<double>(i + 1) / seconds);
      std::fflush(stderr);
    }
  }
  // Every line is done: a stop now would only lose them.
  ExitOnStop::finish();
  to_files([&] {
    if (references) references->commit();
    if (file) file->commit();
  });
  if (!cfg.output.empty()) {
    std::cerr << "mpiformer generate: " << inputs.size() << " line(s) to " << cfg.output
              << (cfg.references.empty() ? "" : ", their references to " + cfg.references)
              << std::endl;
  }
  return 0;
}

}  // namespace

int run_generate(const GenerateConfig& cfg, Communicator& comm) {
  // Rank 0 speaks for the job; the other ranks only wait.
  const ExitOnStop stop(comm.is_root() ? "mpiformer generate: stopped by " : "",
                        comm.is_root() ? "; " + what_is_kept(cfg) : "");
  return agree_on_root(
      comm, [&] { return generate_on_root(cfg); }, Faults::kByType, "generate");
}

}  // namespace mpiformer
