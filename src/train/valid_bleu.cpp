#include "src/train/valid_bleu.h"

#include <algorithm>
#include <array>
#include <stdexcept>

#include "src/io/shard.h"

namespace mpiformer {

namespace {

// Sentences decoding together: the key/value cache rows they may fill.
constexpr int64_t kDecodeRows = 8192;

}  // namespace

ValidationBleu::ValidationBleu(const TrainConfig& cfg, const std::string& tokenizer,
                               const Communicator& comm)
    : cfg_(cfg) {
  if (tokenizer.empty()) {
    throw std::runtime_error("--valid-bleu: the shards of " + cfg.data_dir +
                             " carry no tokenizer to turn translations into text");
  }
  tokenizer_ = Tokenizer::from_bytes(tokenizer);
  const std::vector<std::string> files = list_shards(cfg.data_dir, "valid");
  if (files.empty()) {
    throw std::runtime_error("--valid-bleu: " + cfg.data_dir +
                             " has no validation split to translate (valid-NNNNN.h5)");
  }
  // The source and its EOS within --max-len.
  const size_t longest_source = static_cast<size_t>(cfg.model.max_len) - 1;
  for (const std::string& file : files) {
    const Shard shard = read_shard(file);
    for (size_t i = 0; i < shard.source.count(); ++i, ++total_) {
      if (static_cast<int>(total_ % static_cast<size_t>(comm.size())) != comm.rank()) continue;
      const int32_t* source = shard.source.tokens.data() + shard.source.offsets[i];
      sources_.emplace_back(source, source + std::min(shard.source.length(i), longest_source));
      const int32_t* target = shard.target.tokens.data() + shard.target.offsets[i];
      references_.push_back(
          tokenizer_->decode(std::vector<int>(target, target + shard.target.length(i))));
    }
  }
}

ValidationBleu::~ValidationBleu() = default;

BleuCounts ValidationBleu::translate(Model& trained, Ops& ops) {
  BleuCounts counts;  // a rank without sentences (more ranks than sentences) adds zeros
  if (!sources_.empty()) {
    const Layout layout;  // shards' text: a source EOS
    const DecodeOptions greedy;
    if (!decoder_) {
      plan_ = plan_decoding(cfg_.model, sources_, layout, greedy, kDecodeRows);
      decoder_ = std::make_unique<Model>(ops, cfg_.model, plan_.capacity);
      decoder_->init_parameters(cfg_.seed);  // allocates; the trained weights replace these
      staging_.resize(decoder_->parameters().count());
    }
    // fp32 weights (the masters: whole, as --valid-bleu requires).
    ops.device().copy_to_host(staging_.data(), trained.parameters().params(),
                              staging_.size() * sizeof(float));
    ops.device().copy_to_device(decoder_->parameters().params(), staging_.data(),
                                staging_.size() * sizeof(float));
    std::vector<std::vector<int32_t>> ordered;
    ordered.reserve(sources_.size());
    for (size_t i : plan_.order) ordered.push_back(sources_[i]);
    const Model::DecodingSession session(*decoder_);
    decode(*decoder_, ordered, std::vector<uint64_t>(ordered.size(), 0), layout, greedy,
           [&](size_t k, Hypothesis hypothesis) {
             const std::vector<int> ids(hypothesis.ids.begin(), hypothesis.ids.end());
             counts += count_sentence(tokenizer_->decode(ids), references_[plan_.order[k]]);
           });
  }
  return counts;
}

double ValidationBleu::score(const BleuCounts& local, const Communicator& comm) {
  std::array<int64_t, kBleuCountFields> fields = local.fields();
  comm.allreduce_sum(fields.data(), kBleuCountFields);
  return bleu_score(BleuCounts::from_fields(fields));
}

}  // namespace mpiformer
