// Encoding prepare's splits into shards (shards.h): each block of sequences
// through the tokenizer (with classify's labels), the training shards in
// rounds over the ranks, the held-out shards on rank 0, and the figures that
// make the progress lines and the summary.
#include "src/app/prepare/shards.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>
#include <vector>

namespace mpiformer::prepare {
namespace {

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

ShardHeader header_of(const PrepareConfig& cfg, const Tokenizer& tokenizer,
                      const std::string& model_bytes, const LabelVocabulary& vocabulary) {
  ShardHeader header;
  header.kind = cfg.kind;
  header.vocab_size = tokenizer.vocab_size();
  // header.special: the reserved ids the tokenizer was checked to have
  header.tokenizer = model_bytes;
  header.label_names = vocabulary.names();
  return header;
}

}  // namespace

Encoding::Encoding(const PrepareConfig& cfg, const Corpus& corpus, const Tokenizer& tokenizer,
                   const std::string& model_bytes, const LabelVocabulary& vocabulary,
                   const Communicator& comm, Say say)
    : cfg_(cfg),
      corpus_(corpus),
      tokenizer_(tokenizer),
      vocabulary_(vocabulary),
      comm_(comm),
      say_(std::move(say)),
      header_(header_of(cfg, tokenizer, model_bytes, vocabulary)) {
  say_("encoding " + grouped(static_cast<int64_t>(corpus.train_count())) +
       " training sequences into " + std::to_string(cfg.shards) + " shard(s) on " +
       std::to_string(comm.size()) + " rank(s), writing each when done ...");
}

std::function<void(size_t)> Encoding::count_encoded(const std::string& name, size_t sequences) {
  return [this, name, sequences](size_t done) {
    if (!throttle_.due()) return;
    say_("  " + name + ": " + grouped(static_cast<int64_t>(done)) + " of " +
         grouped(static_cast<int64_t>(sequences)) + " sequences encoded (" +
         format_seconds(seconds_since(start_)) + ")");
  };
}

ShardFigures Encoding::write_training_shard(int64_t first, OutputDir* out) {
  const int64_t shards = cfg_.shards, mine = first + comm_.rank();
  const size_t train_sequences = corpus_.train_count();
  ShardFigures figures;
  if (mine >= shards) return figures;
  const Span block{&corpus_.main, static_cast<size_t>(mine * train_sequences / shards),
                   static_cast<size_t>((mine + 1) * train_sequences / shards)};
  const std::string name = shard_name(kTrainPrefix, mine);
  ShardHeader train_header = header_;
  train_header.split = kTrainPrefix;
  // Rank 0's running count stands for the round: the ranks' blocks are of
  // one size.
  const Shard shard = encode_block(block, tokenizer_, train_header, vocabulary_, &figures,
                                   comm_.is_root() ? count_encoded(name, block.size()) : nullptr);
  out->write_shard(name, shard);
  return figures;
}

void Encoding::add_round(int64_t first, const ShardFigures& mine) {
  const int W = comm_.size();
  // Every rank's figures for this round, so rank 0 can report each shard.
  constexpr int kFigures = 6;
  std::vector<double> round(kFigures * static_cast<size_t>(W), 0.0);
  double* own = &round[kFigures * comm_.rank()];
  own[0] = static_cast<double>(mine.sequences);
  own[1] = static_cast<double>(mine.tokens);
  own[2] = static_cast<double>(mine.skipped);
  own[3] = static_cast<double>(mine.unknown);
  own[4] = static_cast<double>(mine.labels);
  own[5] = static_cast<double>(mine.unknown_labels);
  comm_.allreduce_sum(round.data(), static_cast<int>(round.size()));
  for (int r = 0; r < W && first + r < cfg_.shards; ++r) {
    const double* of_r = &round[kFigures * r];
    const auto sequences = static_cast<int64_t>(of_r[0]);
    const auto tokens = static_cast<int64_t>(of_r[1]);
    total_.sequences += sequences;
    total_.tokens += tokens;
    total_.skipped += static_cast<int64_t>(of_r[2]);
    total_.unknown += static_cast<int64_t>(of_r[3]);
    total_.labels += static_cast<int64_t>(of_r[4]);
    total_.unknown_labels += static_cast<int64_t>(of_r[5]);
    say_("  " + shard_name(kTrainPrefix, first + r) + ": " + grouped(sequences) + " sequences, " +
         grouped(tokens) + " tokens (" + format_seconds(seconds_since(start_)) + ")");
  }
}

void Encoding::write_held_out(OutputDir* out) {
  const std::pair<const char*, Span> splits[] = {{kValidPrefix, corpus_.valid()},
                                                 {kTestPrefix, corpus_.test()}};
  for (int k = 0; k < 2; ++k) {
    const auto& [prefix, span] = splits[k];
    if (!span.text) continue;
    ShardHeader split_header = header_;
    split_header.split = prefix;
    const std::string name = shard_name(prefix, 0);
    const Shard shard = encode_block(span, tokenizer_, split_header, vocabulary_, &held_out_[k],
                                     count_encoded(name, span.size()));
    out->write_shard(name, shard);
    say_("  " + name + ": " + grouped(held_out_[k].sequences) + " sequences, " +
         grouped(held_out_[k].tokens) + " tokens (" + format_seconds(seconds_since(start_)) + ")");
    if (k == 1) test_sequences_ = held_out_[k].sequences;
  }
}

void Encoding::print_summary(Clock::time_point start) const {
  const ShardFigures& valid = held_out_[0];
  const ShardFigures& test = held_out_[1];
  const double encode_seconds = seconds_since(start_);
  const int64_t tokens = total_.tokens + valid.tokens + test.tokens;
  size_t lines = corpus_.main.input.size(), blank = corpus_.main.blank;
  for (const Text* t : {&corpus_.valid_file, &corpus_.test_file}) {
    lines += t->input.size();
    blank += t->blank;
  }
  const int64_t skipped =
      static_cast<int64_t>(blank) + total_.skipped + valid.skipped + test.skipped;
  const std::string test_part =
      test_sequences_ < 0 ? "" : ", " + grouped(test_sequences_) + " test";
  std::printf(
      "prepared %s: %s training sequences in %lld shard(s), %s validation%s; %s tokens "
      "(%s unknown; as stored: train counts one more per sequence%s, its end marker), "
      "vocabulary %d\n",
      cfg_.out_dir.c_str(), grouped(total_.sequences).c_str(), static_cast<long long>(cfg_.shards),
      grouped(valid.sequences).c_str(), test_part.c_str(), grouped(tokens).c_str(),
      grouped(total_.unknown + valid.unknown + test.unknown).c_str(),
      cfg_.kind == "seq2seq" ? " and side" : "", header_.vocab_size);
  std::printf(
      "  %s %s read, %s skipped (blank or encoding to nothing); %.1f s in all, "
      "encoding %.1f s (%s tokens/s)\n",
      grouped(static_cast<int64_t>(lines)).c_str(), cfg_.kind == "seq2seq" ? "line pairs" : "lines",
      grouped(skipped).c_str(), seconds_since(start), encode_seconds,
      grouped(static_cast<int64_t>(tokens / std::max(encode_seconds, 1e-9))).c_str());
  if (cfg_.kind == "classify") {
    const int64_t dropped = valid.unknown_labels + test.unknown_labels;
    std::printf("  %zu labels (the training lines'), %.2f per training example%s\n",
                header_.label_names.size(),
                static_cast<double>(total_.labels) / std::max<int64_t>(total_.sequences, 1),
                dropped > 0 ? (", " + grouped(dropped) +
                               " held-out label(s) the training lines never had were dropped")
                                  .c_str()
                            : "");
  }
  std::fflush(stdout);
}

}  // namespace mpiformer::prepare
