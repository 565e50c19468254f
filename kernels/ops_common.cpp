// Backend-independent helpers declared in kernels/ops.h and kernels/device.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/ops.h"

namespace mpiformer {

void* Device::allocate_host(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = std::malloc(bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void Device::release_host(void* ptr) {
  std::free(ptr);
}

HostBuffer::HostBuffer(Device& device) : device_(device) {
  const char* pageable = std::getenv("MPIFORMER_HOST_PAGEABLE");
  pinned_ = !(pageable && std::string(pageable) == "1");
}

HostBuffer::~HostBuffer() {
  release();
}

void HostBuffer::release() {
  if (pinned_)
    device_.release_host(data_);
  else
    std::free(data_);
}

void* HostBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return data_;
  void* grown = pinned_ ? device_.allocate_host(bytes) : std::malloc(bytes);
  if (grown == nullptr) throw std::bad_alloc();
  release();
  data_ = grown;
  bytes_ = bytes;
  return data_;
}

void Ops::set_attention_path(AttentionPath path) {
  if (path == AttentionPath::kCudnn)
    throw std::runtime_error("--attention cudnn: the " + device().name() +
                             " backend has no cuDNN (it needs --device cuda)");
}

const char* to_string(AttentionPath p) {
  switch (p) {
    case AttentionPath::kAuto:
      return "auto";
    case AttentionPath::kCudnn:
      return "cudnn";
    case AttentionPath::kPlain:
      return "plain";
  }
  return "?";
}

std::string attention_summary(const AttentionCalls& calls) {
  const auto count = [](int64_t n) { return std::to_string(n) + (n == 1 ? " call" : " calls"); };
  std::string text =
      count(calls.library) + " on cuDNN, " + count(calls.plain) + " on the plain kernels";
  if (calls.fallbacks > 0) text += " (" + std::to_string(calls.fallbacks) + " cuDNN did not take)";
  return text;
}

AttentionCalls calls_since(const AttentionCalls& now, const AttentionCalls& since) {
  AttentionCalls window;
  window.library = now.library - since.library;
  window.plain = now.plain - since.plain;
  window.fallbacks = now.fallbacks - since.fallbacks;
  window.graphs = now.graphs;
  return window;
}

double label_smoothing_constant(float smoothing, int V) {
  // x ln x with the limit 0 ln 0 = 0.
  const auto x_log_y = [](double x, double y) { return x > 0.0 ? x * std::log(y) : 0.0; };
  const double e = smoothing;
  if (V < 2) return 0.0;  // one class: the target distribution is a point mass
  return -(x_log_y(1.0 - e, 1.0 - e) + x_log_y(e, e / (V - 1)));
}

const char* to_string(OpFamily f) {
  switch (f) {
    case OpFamily::kGemm:
      return "gemm";
    case OpFamily::kAttention:
      return "attention";
    case OpFamily::kNorm:
      return "layernorm";
    case OpFamily::kElementwise:
      return "elementwise";
    case OpFamily::kEmbedding:
      return "embedding";
    case OpFamily::kLoss:
      return "loss";
    case OpFamily::kOptimizer:
      return "optimizer";
    case OpFamily::kCount:
      break;
  }
  return "?";
}

int group_rows_by_key(const int32_t* keys, int N, std::vector<int32_t>* out_keys,
                      std::vector<int32_t>* out_starts, std::vector<int32_t>* out_rows) {
  // A counting sort: stable, so each group lists its rows in ascending order.
  int32_t largest = -1;
  for (int i = 0; i < N; ++i) {
    if (keys[i] < 0) throw std::invalid_argument("group_rows_by_key: negative key");
    largest = std::max(largest, keys[i]);
  }
  std::vector<int32_t> count(static_cast<size_t>(largest) + 2, 0);  // (K+1), then start of each key
  for (int i = 0; i < N; ++i) ++count[keys[i] + 1];
  out_keys->clear();
  out_starts->assign(1, 0);
  for (int32_t k = 0; k <= largest; ++k) {
    if (count[k + 1] == 0) continue;
    out_keys->push_back(k);
    out_starts->push_back(out_starts->back() + count[k + 1]);
  }
  for (int32_t k = 0; k <= largest; ++k) count[k + 1] += count[k];  // start of key k's rows
  out_rows->resize(N);
  for (int i = 0; i < N; ++i) (*out_rows)[count[keys[i]]++] = i;
  return static_cast<int>(out_keys->size());
}

}  // namespace mpiformer
