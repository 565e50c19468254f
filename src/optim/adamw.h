// AdamW over a ParameterSet: fp32 moments laid out like the parameters,
// decoupled weight decay on the tensors marked `decay` (matrices) unless
// decay_all, and global-norm gradient clipping. The norm, the clip and the
// update all run on the backend, so a step waits for nothing.
//
// Sharded (ZeRO-1, with a ShardLink): the moments exist only for
// this rank's slice of the buffer (src/core/shard_plan.h), only the slice is
// updated, and the updated weights then go to every rank (the link's
// all-gather, started at the end of step() and finished by
// await_weights()). The norm is the global one with the same bits as
// unsharded: per-block partials (Ops::sum_squares_blocks), summed over ranks
// and added in a fixed order. In fp32 the masters are the weights the
// forward reads, whole on every rank, and the gather sends them; with a
// bf16/fp16 compute copy each rank keeps the fp32 masters of its slice
// only (ParameterSet::keep_masters_of) and the gather sends the compute copy.
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/config.h"
#include "src/core/parameters.h"
#include "src/optim/shard_link.h"

namespace mpiformer {

class AdamW {
 public:
  // shards: null for the whole buffer; else this rank's slice and the ranks.
  AdamW(ParameterSet& params, const OptimConfig& config, ShardLink* shards = nullptr);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // Takes the global squared norm of the current gradients on the backend
  // (queued; nothing waits). step() clips with it.
  void measure_gradients();
  // sqrt of the measured squared norm, loss scale included; copied to the
  // host, so it waits for the device.
  double measured_norm();
  // One update with learning rate `lr`, after measure_gradients():
  // gradients are multiplied by inv_loss_scale (they carry the loss scale)
  // and clipped to config.clip_norm. Advances the step counter and refreshes
  // the weights' compute copy (sharded: starts the weights' all-gather).
  void step(float lr, float inv_loss_scale = 1.0f);
  // Sharded: after step(), before anything reads the weights (the next
  // forward, a check, a checkpoint): the gather is complete and every
  // rank's weights are whole. Nothing to do otherwise, or twice.
  void await_weights();
  // After the masters of this rank were written other than by step() (a
  // checkpoint restored): the compute copy follows them, and sharded with
  // sliced masters, every rank's slice is gathered.
  void refresh_weights();

  // The first of "params", "optimizer/m", "optimizer/v" holding a NaN or an
  // infinity in what this rank owns (sharded: its slice; the caller agrees
  // over ranks); null when all are finite. Waits for the device.
  const char* non_finite_state();

  int64_t steps_taken() const { return step_; }
  // Resuming: the moments come from a checkpoint (through m() and v()) and
  // the step counter with them, for the bias correction.
  void set_steps_taken(int64_t steps) { step_ = steps; }
  float* m() { return m_; }  // (shard_end() - shard_begin())
  float* v() { return v_; }  // (shard_end() - shard_begin())
  // The slice of the flat buffer this rank updates: all of it unsharded.
  bool sharded() const { return shards_ != nullptr; }
  size_t shard_begin() const { return begin_; }
  size_t shard_end() const { return end_; }

 private:
  ParameterSet& params_;
  OptimConfig config_;
  int64_t step_ = 0;
  // Sends this rank's updated slice to every rank (await_weights() ends it).
  void start_gather();
  ShardLink* shards_;           // null: unsharded
  size_t begin_ = 0, end_ = 0;  // this rank's slice
  bool gather_pending_ = false;
  float* m_ = nullptr;  // backend (end_ - begin_)
  float* v_ = nullptr;  // backend (end_ - begin_)
  // Runs of neighbouring tensors with one weight decay within the slice: the
  // update's ranges, relative to begin_.
  std::vector<AdamWRange> host_ranges_;
  AdamWRange* ranges_ = nullptr;  // backend (host_ranges_.size())
  double* partials_ = nullptr;    // backend (norm_blocks(params.count())), the norm's
  double* norm_sq_ = nullptr;     // backend (1)
  double* check_sq_ = nullptr;    // backend (1), non_finite_state's sums
};

}  // namespace mpiformer
