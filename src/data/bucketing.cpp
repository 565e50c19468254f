#include "src/data/bucketing.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "src/core/error.h"
#include "src/data/mlm_masking.h"

namespace mpiformer {
namespace {

// The epoch order has its own key domain, apart from masking and dropout.
uint64_t order_key(uint64_t seed, uint64_t epoch, uint64_t salt) {
  constexpr uint64_t kOrderDomain = 0x0DE7B0C4E75EED01ull;
  return mix64(mix64(mix64(seed ^ kOrderDomain) ^ epoch) ^ salt);
}

// Fisher-Yates with our own uniform: the permutation is the same on every
// platform and standard library.
template <typename T>
void shuffle_keyed(T* items, uint64_t n, uint64_t key) {
  KeyedRng rng(key);
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = rng.below(i);
    std::swap(items[i - 1], items[j]);
  }
}

std::string join(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(values[i]);
  }
  return out;
}

}  // namespace

std::vector<int> bucket_boundaries(const std::vector<int>& requested, int max_len) {
  if (max_len < 1) usage_error("--max-len", "must be positive; got " + std::to_string(max_len));
  std::vector<int> boundaries;
  if (requested.empty()) {
    // floor(1.1 b) in integers: exact, where b * 1.1 in floating point may not be.
    for (int64_t b = 8; b < max_len; b = std::max(b + 1, b * 11 / 10)) {
      boundaries.push_back(static_cast<int>(b));
    }
    boundaries.push_back(max_len);
    return boundaries;
  }
  for (size_t i = 0; i < requested.size(); ++i) {
    if (requested[i] < 1)
      usage_error("--buckets", "boundaries must be positive; got " + join(requested));
    if (i > 0 && requested[i] <= requested[i - 1]) {
      usage_error("--buckets", "boundaries must be strictly increasing; got " + join(requested));
    }
  }
  if (requested.back() > max_len) {
    usage_error("--buckets", "boundary " + std::to_string(requested.back()) +
                                 " exceeds --max-len " + std::to_string(max_len));
  }
  boundaries = requested;
  if (boundaries.back() < max_len) boundaries.push_back(max_len);
  return boundaries;
}

int bucket_index(const std::vector<int>& boundaries, int length) {
  const auto it = std::lower_bound(boundaries.begin(), boundaries.end(), length);
  return it == boundaries.end() ? -1 : static_cast<int>(it - boundaries.begin());
}

BatchPlanner::BatchPlanner(const std::vector<uint32_t>& bucket_of,
                           const std::vector<int>& bucket_cost, int64_t max_tokens,
                           int max_sentences, std::vector<uint64_t> length_key, int sort_window)
    : length_key_(std::move(length_key)), sort_window_(length_key_.empty() ? 0 : sort_window) {
  const size_t buckets = bucket_cost.size();
  if (max_sentences < 0) throw std::invalid_argument("--max-sentences: must not be negative");
  if (!length_key_.empty() && length_key_.size() != bucket_of.size()) {
    throw std::invalid_argument("BatchPlanner: one length key per sequence");
  }

  // Counting sort by bucket keeps ids ascending within each bucket.
  bucket_start_.assign(buckets + 1, 0);
  for (uint32_t b : bucket_of) {
    if (b >= buckets) throw std::invalid_argument("BatchPlanner: bucket id out of range");
    ++bucket_start_[b + 1];
  }
  for (size_t b = 0; b < buckets; ++b) bucket_start_[b + 1] += bucket_start_[b];
  members_.resize(bucket_of.size());
  std::vector<uint64_t> fill(bucket_start_.begin(), bucket_start_.end() - 1);
  for (size_t id = 0; id < bucket_of.size(); ++id) {
    members_[fill[bucket_of[id]]++] = static_cast<uint32_t>(id);
  }

  capacity_.assign(buckets, 0);
  for (size_t b = 0; b < buckets; ++b) {
    const uint64_t members = bucket_start_[b + 1] - bucket_start_[b];
    const int64_t cost = std::max(1, bucket_cost[b]);
    int64_t fits = max_tokens / cost;
    if (max_sentences > 0) fits = std::min<int64_t>(fits, max_sentences);
    if (fits < 1 && members > 0) {
      throw std::invalid_argument("--max-tokens: must be at least " + std::to_string(cost) +
                                  ", the padded size of one sequence of bucket " +
                                  std::to_string(b) + "; got " + std::to_string(max_tokens));
    }
    capacity_[b] = static_cast<int>(std::min<int64_t>(fits, INT32_MAX));
    if (members > 0) batches_per_epoch_ += (members + capacity_[b] - 1) / capacity_[b];
  }
}

int BatchPlanner::buckets_used() const {
  int used = 0;
  for (size_t b = 0; b + 1 < bucket_start_.size(); ++b)
    used += bucket_start_[b + 1] > bucket_start_[b];
  return used;
}

void BatchPlanner::cut_bucket(int b, uint64_t start, uint64_t n, EpochPlan* plan) const {
  const uint64_t cap = static_cast<uint64_t>(capacity_[b]);
  for (uint64_t first = 0; first < n; first += cap) {
    plan->batches.push_back({start + first, static_cast<uint32_t>(std::min(cap, n - first))});
  }
}

EpochPlan BatchPlanner::shuffled(uint64_t seed, uint64_t epoch) const {
  EpochPlan plan;
  plan.order = members_;
  plan.batches.reserve(batches_per_epoch_);
  for (int b = 0; b < buckets(); ++b) {
    const uint64_t start = bucket_start_[b], n = bucket_start_[b + 1] - start;
    uint32_t* ids = plan.order.data() + start;
    shuffle_keyed(ids, n, order_key(seed, epoch, 1 + b));
    if (sort_window_ > 0) {
      // Whole batches per window, so the cut below (and M) does not change.
      const uint64_t window = static_cast<uint64_t>(capacity_[b]) * sort_window_;
      for (uint64_t first = 0; first < n; first += window) {
        // Stable: equal lengths keep their shuffled order.
        std::stable_sort(ids + first, ids + std::min(n, first + window),
                         [&](uint32_t x, uint32_t y) { return length_key_[x] < length_key_[y]; });
      }
    }
    cut_bucket(b, start, n, &plan);
  }
  shuffle_keyed(plan.batches.data(), plan.batches.size(), order_key(seed, epoch, 0));
  return plan;
}

EpochPlan BatchPlanner::in_order() const {
  EpochPlan plan;
  plan.order = members_;
  plan.batches.reserve(batches_per_epoch_);
  for (int b = 0; b < buckets(); ++b) {
    cut_bucket(b, bucket_start_[b], bucket_start_[b + 1] - bucket_start_[b], &plan);
  }
  std::sort(plan.batches.begin(), plan.batches.end(),
            [&](const EpochPlan::Span& x, const EpochPlan::Span& y) {
              return plan.order[x.begin] < plan.order[y.begin];
            });
  return plan;
}

}  // namespace mpiformer
