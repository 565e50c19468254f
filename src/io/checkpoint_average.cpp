// Checkpoint averaging: check every input against the newest, then stream
// the tensors one name at a time into OUT.tmp and rename it.
#include "src/io/checkpoint_average.h"

#include <hdf5.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <utility>

#include "src/io/atomic_file.h"
#include "src/io/checkpoint_layout.h"
#include "src/io/hdf5_file.h"
#include "src/io/label_names.h"
#include "src/io/stop_cleanup.h"

namespace mpiformer {

namespace {

namespace fs = std::filesystem;

using hdf5::Faults;
using hdf5::Hid;

std::string shape_text(const std::vector<int>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

std::string special_text(const SpecialTokens& s) {
  return "pad " + std::to_string(s.pad) + ", bos " + std::to_string(s.bos) + ", eos " +
         std::to_string(s.eos) + ", unk " + std::to_string(s.unk) + ", mask " +
         std::to_string(s.mask) + ", sep " + std::to_string(s.sep);
}

// The first way `input` is not the model of `newest` ("" when it is): its
// flags, vocabulary, tokenizer, label names, then its tensors by name and
// shape. Values are this input's, then the newest's in parentheses.
std::string model_mismatch(const LoadedCheckpoint& input, const LoadedCheckpoint& newest,
                           const ModelDifference& model_difference) {
  const CheckpointState &a = input.state, &b = newest.state;
  if (model_difference) {
    const std::string flags = model_difference(input.path, a.config_ini, newest.path, b.config_ini);
    if (!flags.empty()) return flags;
  }
  if (a.vocab_size != b.vocab_size) {
    return "a vocabulary of " + std::to_string(a.vocab_size) + " ids (not " +
           std::to_string(b.vocab_size) + ")";
  }
  if (a.special != b.special) {
    return "special ids " + special_text(a.special) + " (not " + special_text(b.special) + ")";
  }
  if (a.tokenizer != b.tokenizer) {
    if (a.tokenizer.empty()) return "no tokenizer (a synthetic task's ids)";
    if (b.tokenizer.empty()) return "a tokenizer (the newest is of a synthetic task)";
    return "another tokenizer (its /tokenizer bytes differ)";
  }
  const std::string labels =
      label_set_difference(b.label_names, "the newest", a.label_names, "this one");
  if (!labels.empty()) return "other label names: " + labels;
  std::map<std::string, const CheckpointTensor*> mine;
  for (const CheckpointTensor& t : input.params) mine[t.name] = &t;
  for (const CheckpointTensor& t : newest.params) {
    const auto it = mine.find(t.name);
    if (it == mine.end()) {
      return "no tensor '" + t.name + "' (the newest has one of shape " + shape_text(t.shape) + ")";
    }
    if (it->second->shape != t.shape) {
      return "tensor '" + t.name + "' of shape " + shape_text(it->second->shape) + " (not " +
             shape_text(t.shape) + ")";
    }
    mine.erase(it);
  }
  if (!mine.empty()) return "tensor '" + mine.begin()->first + "', which the newest has not";
  return "";
}

// An input open for the streaming reads: its faults are AverageInputErrors.
struct OpenInput {
  Faults faults;
  Hid file;
};

OpenInput open_input(const std::string& path) {
  OpenInput in{Faults::of<AverageInputError>(path), Hid()};
  in.file = hdf5::open_for_reading(in.faults, "checkpoint file");
  check_checkpoint_format(in.file.get(), in.faults);
  return in;
}

Hid open_group(const OpenInput& in, const std::string& where) {
  Hid group(H5Gopen2(in.file.get(), where.c_str(), H5P_DEFAULT), H5Gclose);
  if (!group.ok()) in.faults.fail_corrupt("open " + where);
  return group;
}

// Tensor `name` of an open group of an input, its values all finite.
CheckpointTensor read_finite(const OpenInput& in, hid_t group, const std::string& where,
                             const std::string& name) {
  CheckpointTensor t = read_checkpoint_tensor(group, name, where + "/" + name, in.faults, true);
  for (const float x : t.data) {
    if (!std::isfinite(x)) in.faults.fail(non_finite_fault(where.substr(1), name, x));
  }
  return t;
}

// The whole output at `tmp`: attributes and vocabulary, the mean of /params,
// the newest input's moments.
void write_average(const std::string& tmp, const Faults& faults,
                   const std::vector<std::string>& inputs, const LoadedCheckpoint& newest,
                   size_t newest_index, const CheckpointState& state, CheckpointAverage* result) {
  hdf5::Session session;
  std::vector<OpenInput> open;
  std::vector<Hid> params_of;  // each input's /params
  for (const std::string& path : inputs) {
    open.push_back(open_input(path));
    params_of.push_back(open_group(open.back(), "/params"));
  }

  Hid file = create_checkpoint_file(tmp, faults);
  const hid_t root = file.get();
  write_checkpoint_header(root, state, faults);

  Hid params_group = create_checkpoint_group(root, "params", faults);
  const double count = static_cast<double>(inputs.size());
  std::vector<double> sum;  // (elements of the tensor)
  std::vector<float> mean;  // (elements of the tensor)
  for (const CheckpointTensor& layout : newest.params) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const CheckpointTensor t = read_finite(open[i], params_of[i].get(), "/params", layout.name);
      if (t.shape != layout.shape) {
        open[i].faults.fail("tensor '" + layout.name + "' changed its shape while being read");
      }
      if (i == 0) sum.assign(t.data.size(), 0.0);
      for (size_t j = 0; j < t.data.size(); ++j) sum[j] += static_cast<double>(t.data[j]);
    }
    mean.resize(sum.size());
    for (size_t j = 0; j < sum.size(); ++j) mean[j] = static_cast<float>(sum[j] / count);
    write_checkpoint_tensor(params_group.get(), layout.name, layout.shape, mean.data(), faults,
                            "dataset /params/" + layout.name);
    result->parameters += mean.size();
  }
  params_group.close();

  // The moments are the newest input's, copied through memory so their
  // checksums are verified on the way.
  Hid optimizer = create_checkpoint_group(root, "optimizer", faults);
  for (const char* moment : {"m", "v"}) {
    const std::string where = std::string("/optimizer/") + moment;
    Hid source = open_group(open[newest_index], where);
    Hid target = create_checkpoint_group(optimizer.get(), moment, faults);
    for (const CheckpointTensor& layout : newest.params) {
      const CheckpointTensor t = read_finite(open[newest_index], source.get(), where, layout.name);
      write_checkpoint_tensor(target.get(), layout.name, t.shape, t.data.data(), faults,
                              "dataset " + where + "/" + layout.name);
    }
  }
  optimizer.close();
  faults.check(H5Fflush(root, H5F_SCOPE_LOCAL), "the file");
  faults.check(file.close(), "the file");
}

}  // namespace

CheckpointAverage average_checkpoints(const std::vector<std::string>& inputs,
                                      const std::string& out,
                                      const ModelDifference& model_difference) {
  if (inputs.empty()) throw AverageInputError("no checkpoints to average");
  // 1. Attributes, names and shapes of every input: a refusal touches nothing.
  std::vector<LoadedCheckpoint> layouts;
  for (const std::string& path : inputs) {
    try {
      layouts.push_back(read_checkpoint_layout(path));
    } catch (const AverageInputError&) {
      throw;
    } catch (const CheckpointError& e) {
      throw AverageInputError(e.what());
    }
  }
  size_t newest = 0;
  for (size_t i = 1; i < layouts.size(); ++i) {
    if (layouts[i].state.step > layouts[newest].state.step) newest = i;
  }
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (i == newest) continue;
    const std::string mismatch = model_mismatch(layouts[i], layouts[newest], model_difference);
    if (!mismatch.empty()) {
      throw AverageInputError(inputs[i] + ": another model than " + inputs[newest] +
                              ", the newest input: " + mismatch);
    }
  }

  CheckpointAverage result;
  result.path = out;
  result.newest = inputs[newest];
  result.step = layouts[newest].state.step;
  for (const LoadedCheckpoint& c : layouts) result.steps.push_back(c.state.step);
  CheckpointState state = layouts[newest].state;
  state.averaged_from.clear();
  for (const std::string& path : inputs) state.averaged_from += path + "\n";
  state.averaged_from.pop_back();

  // 2. The tensors, one name at a time, into a temporary; then the rename.
  const Faults faults = checkpoint_faults(out);
  const std::string tmp = temporary_name(out);
  const RemovedOnStop removed_on_stop(tmp);
  try {
    write_average(tmp, faults, inputs, layouts[newest], newest, state, &result);
    durably([&] { fsync_file(tmp); });
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);  // leave no half-written file behind
    throw;
  }
  durably([&] { commit_file(tmp, out); });
  return result;
}

std::string describe_average(const CheckpointAverage& average) {
  std::string steps;
  for (const int64_t step : average.steps) {
    steps += (steps.empty() ? "" : ", ") + std::to_string(step);
  }
  return "the mean of " + std::to_string(average.steps.size()) + " checkpoint(s) (steps " + steps +
         "; " + std::to_string(average.parameters) + " parameters): " + average.path +
         "; its moments and attributes are step " + std::to_string(average.step) + "'s";
}

}  // namespace mpiformer
