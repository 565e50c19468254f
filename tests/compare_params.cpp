// Test helper for the end-to-end checkpoint tests (not installed): compares
// /params (or --group optimizer/m, optimizer/v) of two checkpoints tensor by
// tensor.
//
//   compare_params A.h5 B.h5 [--group G] [--max-rel X | --bitwise]
//
// Prints one line per tensor, "name  max_abs_diff  rel", where rel is
// max|a - b| / max(max|a|, 1e-30) over the tensor (a from A), then
// "max relative difference R over N tensors". Exit 0 when the tensor sets
// and shapes agree and every rel <= X (default 1e-5), or with --bitwise
// every byte agrees; 1 otherwise or when a file cannot be read (one line on
// stderr says why); 2 for a usage error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "src/io/checkpoint.h"

namespace {

using namespace mpiformer;

constexpr const char* kUsage =
    "usage: compare_params A.h5 B.h5 [--group params|optimizer/m|optimizer/v] "
    "[--max-rel X | --bitwise]\n";

int usage_error(const std::string& what) {
  std::fprintf(stderr, "compare_params: %s\n%s", what.c_str(), kUsage);
  return 2;
}

std::string shape_string(const std::vector<int>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

struct Difference {
  double max_abs =
      0.0;           // max |a - b|; infinite where exactly one side is NaN or they differ by inf
  double rel = 0.0;  // max_abs / max(max |a|, 1e-30); infinite when undefined
};

// a, b: host (n)
Difference compare(const float* a, const float* b, size_t n) {
  Difference d;
  double max_a = 0.0;
  for (size_t i = 0; i < n; ++i) {
    max_a = std::max(max_a, std::fabs(static_cast<double>(a[i])));
    // Identical bits are no difference, even for NaN and infinities.
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    double diff = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(diff)) diff = INFINITY;
    d.max_abs = std::max(d.max_abs, diff);
  }
  d.rel = d.max_abs == 0.0 ? 0.0 : d.max_abs / std::max(max_a, 1e-30);
  if (std::isnan(d.rel)) d.rel = INFINITY;
  return d;
}

int run(const std::string& path_a, const std::string& path_b, const std::string& group,
        double max_rel, bool bitwise) {
  const std::vector<CheckpointTensor> a = read_checkpoint_tensors(path_a, group);
  const std::vector<CheckpointTensor> b = read_checkpoint_tensors(path_b, group);
  std::map<std::string, const CheckpointTensor*> by_name;
  for (const CheckpointTensor& t : b) by_name[t.name] = &t;

  bool ok = true;
  size_t width = 0;
  for (const CheckpointTensor& t : a) width = std::max(width, t.name.size());
  double worst = 0.0;
  size_t compared = 0;
  for (const CheckpointTensor& ta : a) {
    const auto it = by_name.find(ta.name);
    if (it == by_name.end()) {
      std::fprintf(stderr, "compare_params: %s is only in %s\n", ta.name.c_str(), path_a.c_str());
      ok = false;
      continue;
    }
    const CheckpointTensor& tb = *it->second;
    by_name.erase(it);
    if (ta.shape != tb.shape) {
      std::fprintf(stderr, "compare_params: %s has shape %s in %s but %s in %s\n", ta.name.c_str(),
                   shape_string(ta.shape).c_str(), path_a.c_str(), shape_string(tb.shape).c_str(),
                   path_b.c_str());
      ok = false;
      continue;
    }
    const Difference d = compare(ta.data.data(), tb.data.data(), ta.data.size());
    ++compared;
    worst = std::max(worst, d.rel);
    std::printf("%-*s  %.6e  %.6e\n", static_cast<int>(width), ta.name.c_str(), d.max_abs, d.rel);
    if (bitwise && std::memcmp(ta.data.data(), tb.data.data(), ta.data.size() * sizeof(float))) {
      std::fprintf(stderr, "compare_params: %s differs bitwise\n", ta.name.c_str());
      ok = false;
    } else if (!bitwise && !(d.rel <= max_rel)) {
      std::fprintf(stderr, "compare_params: %s differs by %.6e relative (limit %.6e)\n",
                   ta.name.c_str(), d.rel, max_rel);
      ok = false;
    }
  }
  for (const auto& [name, t] : by_name) {
    std::fprintf(stderr, "compare_params: %s is only in %s\n", name.c_str(), path_b.c_str());
    ok = false;
  }
  std::printf("max relative difference %.6e over %zu tensors\n", worst, compared);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  double max_rel = 1e-5;
  bool have_max_rel = false;
  bool bitwise = false;
  std::string group = "params";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--bitwise") {
      bitwise = true;
    } else if (arg == "--group") {
      if (i + 1 >= argc) return usage_error("--group needs a value");
      group = argv[++i];
    } else if (arg == "--max-rel") {
      if (i + 1 >= argc) return usage_error("--max-rel needs a value");
      const char* value = argv[++i];
      char* end = nullptr;
      max_rel = std::strtod(value, &end);
      if (end == value || *end != '\0' || !std::isfinite(max_rel) || max_rel < 0.0) {
        return usage_error(std::string("--max-rel '") + value + "' is not a non-negative number");
      }
      have_max_rel = true;
    } else if (arg.size() > 1 && arg[0] == '-') {
      return usage_error("unknown option '" + arg + "'");
    } else {
      files.push_back(arg);
    }
  }
  if (files.size() != 2) return usage_error("expected two checkpoint files");
  if (bitwise && have_max_rel) return usage_error("--max-rel and --bitwise exclude each other");
  try {
    return run(files[0], files[1], group, max_rel, bitwise);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "compare_params: %s\n", e.what());
    return 1;
  }
}
