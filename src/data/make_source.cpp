#include "src/data/make_source.h"

#include <stdexcept>

#include "src/data/synthetic.h"

namespace mpiformer {

std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& cfg, int rank, int world_size) {
  if (cfg.synthetic != SyntheticTask::kNone)
    return std::make_unique<SyntheticSource>(cfg.synthetic, cfg.model, cfg.max_tokens,
                                             cfg.max_sentences, cfg.min_len, cfg.mlm_probability,
                                             cfg.seed);
  throw std::runtime_error("--data: HDF5 shards are not supported by this build yet");
}

}  // namespace mpiformer
