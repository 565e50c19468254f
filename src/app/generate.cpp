// `mpiformer generate`: translation (seq2seq) and continuation (lm) with a
// checkpoint, many sentences at a time (src/model/decoding.h). Under mpirun
// the ranks share the sentences and rank 0 writes every line in input order.
// With --data it translates the source side of a split of a shard set, and
// writes the split's targets beside the output as references. The
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
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/app/profile_table.h"
#include "src/core/error.h"
#include "src/data/tokenizer.h"
#include "src/io/atomic_file.h"
#include "src/io/checkpoint.h"
#include "src/io/shard.h"
#include "src/io/stop_cleanup.h"
#include "src/model/decoding.h"
#include "src/model/model.h"
#include "src/parallel/agreement.h"
#include "src/parallel/rank_device.h"
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

// Reads a shard of --data: its faults are the user's input (exit 2).
template <class Read>
auto data_shard(Read read) {
  try {
    return read();
  } catch (const ShardError& e) {
    usage_error("--data", e.what());
  }
}

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
    const ShardHeader header = data_shard([&] { return read_shard_header(file); });
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
    const Shard shard = data_shard([&] { return read_shard(file); });
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

// What every rank holds to decode: the model, its inputs and how they read.
struct Setup {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<ProfiledOps> profiled;  // --profile: the model's ops, timed by family
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::vector<int32_t>> inputs;
  SplitInputs split;  // with --data: its references and origin
  Layout layout;
  DecodeOptions options;
  bool lm = false;
  std::vector<size_t> order;  // input indices, shortest inputs first
};

// Orders the inputs shortest first and returns the capacity that decodes
// them: the largest of the groups, taken in that order, whose key/value
// cache fits --max-tokens rows (a sentence larger than that alone).
// Decoding streams through it: a sentence joins as another leaves.
ModelCapacity plan_capacity(const GenerateConfig& cfg, const ModelConfig& model, Setup& setup) {
  DecodePlan plan = plan_decoding(model, setup.inputs, setup.layout, setup.options, cfg.max_tokens);
  setup.order = std::move(plan.order);
  return plan.capacity;
}

// The backend and the model of `room` with the checkpoint's weights, its
// memory checked first (refused naming the flag that lowers it).
void load_model(const GenerateConfig& cfg, const TrainConfig& run,
                const std::vector<CheckpointTensor>& tensors, const ModelCapacity& room,
                const Communicator& comm, Setup& setup) {
  // make_ops on the CPU compares the ranks' BLAS kernels, a collective that
  // a rank refusing its inputs here would leave the others waiting in. A
  // GPU's device line goes to stderr: stdout may carry the outputs.
  const int threads = cfg.threads > 0 ? cfg.threads : comm.cores_per_local_rank();
  setup.ops = cfg.device == DeviceKind::kCpu ? make_cpu_ops(threads)
                                             : make_ops(cfg.device, threads, comm, false, stderr);
  if (cfg.profile) setup.profiled = std::make_unique<ProfiledOps>(*setup.ops);
  Ops& ops = setup.profiled ? *setup.profiled : *setup.ops;
  const DType compute = compute_dtype(cfg.precision);
  // The sentences decoding together stay within --max-tokens; a cache
  // larger than that holds one sentence whose beams alone are too many.
  const bool one_sentence = room.cache_rows > cfg.max_tokens;
  const std::string flag = one_sentence ? "--beam" : "--max-tokens";
  const std::string shortfall = memory_shortfall(
      estimate_memory(ops, run.model, room, compute), ops, comm.local_size(),
      one_sentence ? "--beam (each beam holds up to max-len " + std::to_string(run.model.max_len) +
                         " tokens)"
                   : "--max-tokens (the key/value cache of the sentences decoding together: " +
                         std::to_string(room.cache_rows) + " rows of max-len " +
                         std::to_string(run.model.max_len) + " and --beam " +
                         std::to_string(cfg.beam) + ")");
  if (!shortfall.empty()) usage_error(flag, "decoding " + shortfall);
  setup.model = std::make_unique<Model>(ops, run.model, room, compute);
  Model& model = *setup.model;
  model.init_parameters(run.seed);  // allocates; the checkpoint's values replace these
  std::vector<float> host(model.parameters().count());  // (count)
  unpack_checkpoint_tensors(cfg.checkpoint, tensors, model.parameters(), host.data());
  ops.device().copy_to_device(model.parameters().params(), host.data(),
                              host.size() * sizeof(float));
  model.parameters().refresh_compute();  // the bf16/fp16 copy (none in fp32)
}

// Every rank: the checkpoint, the inputs (each parsed before any decodes:
// a bad line is found at once), their order and the model.
std::unique_ptr<Setup> prepare_setup(const GenerateConfig& cfg, const Communicator& comm) {
  auto setup = std::make_unique<Setup>();
  const ModelCheckpoint checkpoint = read_model_checkpoint(
      cfg.checkpoint, "--checkpoint",
      [&](const std::string& ini) { train_config_from_ini(ini, cfg.checkpoint); });
  const CheckpointState& state = checkpoint.state;
  const std::vector<CheckpointTensor>& tensors = checkpoint.params;
  TrainConfig run = train_config_from_ini(state.config_ini, cfg.checkpoint);
  run.model.vocab = state.vocab_size;
  run.model.special = state.special;
  if (run.model.kind == ModelKind::kMlm) {
    usage_error("--checkpoint", cfg.checkpoint +
                                    " holds an mlm, which fills masks rather than generating; "
                                    "use an lm or seq2seq");
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
  setup->lm = lm;
  if (cfg.top_k > 0 && !lm) {
    throw UsageError("--top-k: top-k sampling is for lm checkpoints; " + cfg.checkpoint +
                     " holds a seq2seq, which decodes greedily or by --beam");
  }
  if (!state.tokenizer.empty()) setup->tokenizer = Tokenizer::from_bytes(state.tokenizer);
  // Shard data frames sequences with EOS (source) and BOS (lm); the
  // synthetic tasks do not.
  const bool synthetic = run.synthetic != SyntheticTask::kNone;
  setup->layout = Layout{!synthetic, !synthetic};

  std::vector<std::string> lines;
  if (!cfg.data_dir.empty()) {
    setup->split = read_split(cfg, state, lm, synthetic, setup->tokenizer.get());
  } else if (!cfg.prompt.empty()) {
    lines.push_back(cfg.prompt);
  } else {
    std::ifstream in(cfg.input);
    if (!in) throw std::runtime_error(cfg.input + ": cannot read");
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  std::vector<std::vector<int32_t>>& inputs = setup->inputs;
  inputs = std::move(setup->split.sources);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = cfg.prompt.empty()
                                  ? "--input: " + cfg.input + " line " + std::to_string(i + 1)
                                  : std::string("--prompt");
    inputs.push_back(to_ids(setup->tokenizer.get(), lines[i], run.model.vocab, where));
    // An lm continues its prompt inside the positions table: BOS, the prompt
    // and at least one new token must fit. (A seq2seq source is cut to fit,
    // as in training.)
    const int most = run.model.max_len - (setup->layout.lm_bos ? 1 : 0) - 1;
    const auto n = static_cast<int64_t>(inputs.back().size());
    if (lm && n > most) {
      throw UsageError(where + ": " + std::to_string(n) +
                       " tokens, more than the model's max-len " +
                       std::to_string(run.model.max_len) + " leaves for a prompt (at most " +
                       std::to_string(most) + " beside " +
                       (setup->layout.lm_bos ? "BOS and " : "") + "one new token)");
    }
  }

  DecodeOptions& options = setup->options;
  options.beam = cfg.beam;
  options.length_alpha = cfg.length_alpha;
  options.max_new_tokens = cfg.max_new_tokens;
  options.min_new_tokens = cfg.min_new_tokens;
  options.top_k = cfg.top_k;
  options.temperature = cfg.temperature;
  options.cache = cfg.cache;
  // Every beam of one sentence at full length must be countable in rows.
  const int64_t longest = static_cast<int64_t>(cfg.beam) * run.model.max_len;
  if (longest > std::numeric_limits<int32_t>::max()) {
    usage_error("--beam", std::to_string(cfg.beam) + " beams of max-len " +
                              std::to_string(run.model.max_len) + " are " +
                              std::to_string(longest) + " tokens, more than 2^31 - 1");
  }
  const ModelCapacity room = plan_capacity(cfg, run.model, *setup);

  load_model(cfg, run, tensors, room, comm, *setup);
  return setup;
}

// Rank 0's outputs: the lines in input order as they become known, under
// temporary names until every line is done; a fault of one names it and
// says what was kept.
class Outputs {
 public:
  Outputs(const GenerateConfig& cfg, const Setup& setup) : cfg_(cfg) {
    texts_.resize(setup.inputs.size());
    known_.assign(setup.inputs.size(), false);
    // The references whole, at once: they are known. Both files are renamed
    // into place together at the end, so they always pair up.
    to_files([&] {
      if (!cfg.output.empty()) file_ = std::make_unique<StagedTextFile>(cfg.output);
      if (!cfg.references.empty()) {
        references_ = std::make_unique<StagedTextFile>(cfg.references);
        std::string text;
        for (const std::string& line : setup.split.references) text += line + "\n";
        references_->write(text);
      }
    });
  }

  void set(size_t index, std::string text) {
    texts_[index] = std::move(text);
    known_[index] = true;
  }

  // Writes the lines known from the next unwritten one on.
  void write_ready() {
    for (; written_ < texts_.size() && known_[written_]; ++written_) {
      const std::string line = texts_[written_] + "\n";
      if (file_) {
        to_files([&] { file_->write(line); });
      } else {
        // A full disk or a closed pipe shows only as a failed stream, after
        // the write or at the flush: each line is checked once flushed.
        errno = 0;
        std::cout << line << std::flush;
        if (!std::cout) {
          const int err = errno;
          throw OutputError(std::string("stdout") +
                            (err != 0 ? std::string(": ") + std::strerror(err) : ""));
        }
      }
      texts_[written_].clear();
    }
  }

  void commit() {
    to_files([&] {
      if (references_) references_->commit();
      if (file_) file_->commit();
    });
  }

 private:
  template <typename Fn>
  void to_files(Fn&& write) {
    try {
      write();
    } catch (const std::runtime_error& e) {
      throw CommandError(std::string("generate: ") + e.what() + "; " + what_is_kept(cfg_));
    }
  }

  const GenerateConfig& cfg_;
  std::unique_ptr<StagedTextFile> file_, references_;
  std::vector<std::string> texts_;
  std::vector<bool> known_;
  size_t written_ = 0;
};

// The sentences this rank decodes: every W-th of the shortest-first order
// from its rank on, so the ranks' shares are alike. Each finished line goes
// to `done(index, text)`.
template <typename Done>
void decode_share(const GenerateConfig& cfg, Setup& setup, const Communicator& comm,
                  DecodeStats& stats, Done&& done) {
  using Clock = std::chrono::steady_clock;
  constexpr double kProgressSeconds = 5.0;
  std::vector<size_t> share;
  std::vector<std::vector<int32_t>> inputs;
  std::vector<uint64_t> seeds;
  for (size_t k = comm.rank(); k < setup.order.size(); k += comm.size()) {
    const size_t i = setup.order[k];
    share.push_back(i);
    inputs.push_back(setup.inputs[i]);
    seeds.push_back(cfg.seed + i);  // each line its own stream, the same in any company
  }
  const auto start = Clock::now();
  auto last_report = start;
  size_t finished = 0;
  const size_t mine = share.size();
  const auto finished_line = [&](size_t k, Hypothesis h) {
    done(share[k], to_text(setup.tokenizer.get(), h.ids));
    ++finished;
    // Progress on stderr, never among the outputs: every kProgressSeconds,
    // so a long input reports and a short one does not. Rank 0 speaks.
    const auto now = Clock::now();
    if (comm.is_root() &&
        std::chrono::duration<double>(now - last_report).count() >= kProgressSeconds &&
        finished < mine) {
      last_report = now;
      const double seconds = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "generate: %zu/%zu lines%s (%.0f%%), %.1f s, %.2f lines/s\n", finished,
                   mine, comm.size() > 1 ? " of rank 0's share" : "",
                   100.0 * static_cast<double>(finished) / mine, seconds,
                   static_cast<double>(finished) / seconds);
      std::fflush(stderr);
    }
  };
  decode(*setup.model, inputs, seeds, setup.layout, setup.options, finished_line, &stats);
}

// Rank r's lines to every rank: [index u64, length u64, bytes] each.
std::string pack_lines(const std::vector<std::pair<size_t, std::string>>& lines) {
  std::string packed;
  for (const auto& [index, text] : lines) {
    const uint64_t head[2] = {index, text.size()};
    packed.append(reinterpret_cast<const char*>(head), sizeof head);
    packed += text;
  }
  return packed;
}

void unpack_lines(const std::string& packed, Outputs& outputs) {
  for (size_t at = 0; at + 16 <= packed.size();) {
    uint64_t head[2];
    std::memcpy(head, packed.data() + at, sizeof head);
    at += sizeof head;
    outputs.set(head[0], packed.substr(at, head[1]));
    at += head[1];
  }
}

// " (S s of decoding, L lines/s, T tokens/s; rank 0's model calls M s,
// its choice of tokens C s, R rows a step)": the rate, and where rank 0's
// time went.
std::string describe_rate(size_t lines, int64_t tokens, double seconds, const DecodeStats& own,
                          int ranks) {
  const auto per_second = [&](double n) { return seconds > 0 ? n / seconds : 0.0; };
  char text[256];
  std::snprintf(text, sizeof text,
                " (%.2f s of decoding, %.1f lines/s, %.0f tokens/s; %smodel calls %.3f s, "
                "choice of tokens %.3f s, %.1f rows a step)",
                seconds, per_second(static_cast<double>(lines)),
                per_second(static_cast<double>(tokens)), ranks > 1 ? "rank 0's " : "",
                own.model_seconds, own.choose_seconds,
                own.steps > 0 ? static_cast<double>(own.rows) / own.steps : 0.0);
  return text;
}

// With others: every rank's lines to rank 0's outputs. Collective.
void gather_lines(const Communicator& comm, std::vector<std::pair<size_t, std::string>>& mine,
                  Outputs& outputs) {
  for (int r = 1; r < comm.size(); ++r) {
    std::string packed = comm.rank() == r ? pack_lines(mine) : std::string();
    comm.broadcast(&packed, r);
    if (comm.is_root()) unpack_lines(packed, outputs);
  }
  if (comm.is_root()) {
    for (auto& [index, text] : mine) outputs.set(index, std::move(text));
  }
}

// --profile: rank 0's decoding steps, each op family's device time per
// step, and the step's time outside every op (the choice of tokens, the
// logits' copy to the host, the host's work between steps).
void print_decoding_profile(ProfiledOps& profiled, const DecodeStats& own, double seconds,
                            int ranks) {
  const long long steps = std::max<long long>(own.steps, 1);
  std::vector<double> ms = profiled.milliseconds();
  for (double& m : ms) m /= static_cast<double>(steps);
  std::fprintf(stderr, "generate --profile: %s%lld decoding steps of %.1f rows in %.3f s\n",
               ranks > 1 ? "rank 0's " : "", static_cast<long long>(own.steps),
               own.steps > 0 ? static_cast<double>(own.rows) / own.steps : 0.0, seconds);
  print_profile(ms, profiled.call_totals(), steps, 1000.0 * seconds / steps,
                "the choice of tokens, the logits' copy to the host, the host's work");
}

}  // namespace

int run_generate(const GenerateConfig& cfg, Communicator& comm) {
  // Rank 0 speaks for the job.
  const ExitOnStop stop(comm.is_root() ? "mpiformer generate: stopped by " : "",
                        comm.is_root() ? "; " + what_is_kept(cfg) : "");
  std::unique_ptr<Setup> setup;
  // Every rank reads the same checkpoint and inputs, so they refuse alike.
  int code = agree_on(
      comm, [&] { setup = prepare_setup(cfg, comm); }, Speaker::kFirstRefusal, Blame::kByType,
      "generate");
  if (code != 0) return code;
  note_shared_gpus(cfg.device, comm, stderr);
  std::unique_ptr<Outputs> outputs;
  code = agree_on(
      comm, [&] { outputs = std::make_unique<Outputs>(cfg, *setup); }, Speaker::kRoot,
      Blame::kByType, "generate");
  if (code != 0) return code;
  if (comm.is_root() && !cfg.data_dir.empty()) {
    std::cerr << "mpiformer generate: translating the " << setup->inputs.size()
              << " source sentence(s) of the " << cfg.split << " split of " << cfg.data_dir
              << (setup->split.origin.empty() ? "" : " (" + setup->split.origin + ")")
              << ", shortest first, as many at a time as a key/value cache of "
              << setup->model->capacity().cache_rows << " rows holds"
              << (comm.size() > 1 ? ", over " + std::to_string(comm.size()) + " ranks" : "")
              << std::endl;
  }
  // Alone, rank 0 writes the lines as they come (in input order); with
  // others, it writes once every rank has sent its own.
  std::vector<std::pair<size_t, std::string>> mine;
  DecodeStats stats;                              // this rank's
  if (setup->profiled) setup->profiled->reset();  // decoding's ops alone
  const auto decoding_start = std::chrono::steady_clock::now();
  code =
      agree(comm, attempt(
                      comm,
                      [&] {
                        decode_share(cfg, *setup, comm, stats, [&](size_t index, std::string text) {
                          if (comm.size() == 1) {
                            outputs->set(index, std::move(text));
                            outputs->write_ready();
                          } else {
                            mine.emplace_back(index, std::move(text));
                          }
                        });
                      },
                      Blame::kByType, "generate"));
  if (code != 0) return code;
  if (setup->profiled && comm.is_root()) {
    const double own_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - decoding_start).count();
    print_decoding_profile(*setup->profiled, stats, own_seconds, comm.size());
  }
  if (comm.size() > 1) gather_lines(comm, mine, *outputs);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - decoding_start).count();
  const int64_t tokens = comm.allreduce_sum(stats.tokens);
  return agree_on(
      comm,
      [&] {
        outputs->write_ready();
        // Every line is done: a stop now would only lose them.
        ExitOnStop::finish();
        outputs->commit();
        if (!cfg.output.empty()) {
          std::cerr << "mpiformer generate: " << setup->inputs.size() << " line(s) to "
                    << cfg.output
                    << (cfg.references.empty() ? "" : ", their references to " + cfg.references)
                    << describe_rate(setup->inputs.size(), tokens, seconds, stats, comm.size())
                    << std::endl;
        }
        return 0;
      },
      Speaker::kRoot, Blame::kByType, "generate");
}

}  // namespace mpiformer
