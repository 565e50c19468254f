// dump_step CHECKPOINT OUT.h5 [--device cpu|cuda] [--precision fp32|bf16|fp16] [--logits]
//           [--attention auto|cudnn|plain]:
// one forward and backward pass of a checkpoint's lm or seq2seq model on a
// fixed ragged batch (random ids, every third target pad) in that compute
// precision, written for analysis/torch_reference.py:
//   /batch/{tokens, offsets, positions, targets}  int32 (decoder side)
//   /batch/{src_tokens, src_offsets, src_positions}  int32 (seq2seq)
//   /grads/<tensor>                               float32, flattened
//   attributes loss_sum, tokens, correct: the loss sums of the batch; the
//   gradients are those of the mean loss (grad_scale 1/tokens)
// With --logits, also the logits the model gives at every decoder position
// of the batch (dropout off), for tests/e2e/export_hf.sh:
//   /logits                                       float32 (decoder tokens, vocab)
// row r belongs to the decoder token in row r of /batch/tokens: the scores
// of the token that follows the sequence up to and including it. They come
// from Model::last_logits on a batch of every prefix of every sequence
// (seq2seq: each prefix with its whole source).
#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/app/options.h"
#include "src/io/checkpoint.h"
#include "src/io/dataset_checksum.h"
#include "src/io/hdf5_file.h"
#include "src/model/model.h"
#include "tests/test_batches.h"

namespace mpiformer {
namespace {

// Every prefix of every decoder sequence of `batch`, shortest first, each
// with its sequence's whole source (seq2seq): the last position of prefix
// i + 1 of sequence b is row offsets[b] + i of `batch`.
Batch prefix_batch(const Batch& batch) {
  Batch prefixes;
  for (int b = 0; b < batch.decoder.batch(); ++b) {
    const int32_t* ids = batch.decoder.tokens.data() + batch.decoder.offsets[b];
    for (int n = 1; n <= batch.decoder.length(b); ++n) {
      if (batch.encoder.batch() > 0) {
        prefixes.encoder.append(batch.encoder.tokens.data() + batch.encoder.offsets[b],
                                batch.encoder.length(b));
      }
      prefixes.decoder.append(ids, n);
    }
  }
  return prefixes;
}

// A 2-D float32 dataset `name` of (rows, cols), contiguous.
// data: host (rows, cols)
void write_matrix(hid_t loc, const char* name, const float* data, hsize_t rows, hsize_t cols,
                  const hdf5::Faults& faults) {
  const std::string what = std::string("dataset /") + name;
  const hsize_t dims[2] = {rows, cols};
  hdf5::Hid space = faults.checked(H5Screate_simple(2, dims, nullptr), H5Sclose, what);
  hdf5::Hid dset = faults.checked(
      H5Dcreate2(loc, name, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      H5Dclose, what);
  faults.check(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), what);
}

int dump(const std::string& checkpoint, const std::string& out, bool cuda, DType precision,
         bool with_logits, AttentionPath attention) {
  const CheckpointState state = read_checkpoint_state(checkpoint);
  TrainConfig run = train_config_from_ini(state.config_ini, checkpoint);
  run.model.vocab = state.vocab_size;
  run.model.special = state.special;
  if (run.model.kind == ModelKind::kMlm || run.model.dropout != 0.0f) {
    std::cerr << "dump_step: " << checkpoint
              << ": an lm or seq2seq model trained with --dropout 0 is needed\n";
    return 2;
  }
  std::unique_ptr<Ops> ops = checked_if_asked(cuda ? make_cuda_ops(0) : make_cpu_ops(1));
  ops->set_attention_path(attention);
  const Batch batch = testing::random_batch(run.model, {7, 1, 12, 5}, {3, 9, 6, 1}, 11);
  const Batch prefixes = with_logits ? prefix_batch(batch) : Batch{};
  int rows = std::max(batch.decoder.total(), batch.encoder.total());
  if (with_logits) {
    rows = std::max({rows, prefixes.decoder.total(), prefixes.encoder.total()});
  }
  Model model(*ops, run.model, ModelCapacity{rows, run.model.max_len}, precision);
  model.init_parameters(1);
  ParameterSet& params = model.parameters();
  std::vector<float> host(params.count());  // (count)
  unpack_checkpoint_tensors(checkpoint, read_checkpoint_tensors(checkpoint, "params"), params,
                            host.data());
  ops->device().copy_to_device(params.params(), host.data(), host.size() * sizeof(float));
  params.refresh_compute();
  params.zero_grads();
  const int64_t N = batch.target_tokens(run.model.special.pad);
  // fp16 runs with a loss scale, as training does (small gradients would
  // vanish below fp16's range otherwise), divided out of what is written.
  const float loss_scale = precision == DType::kF16 ? 1024.0f : 1.0f;
  model.forward_backward(batch, run.label_smoothing, loss_scale / static_cast<float>(N),
                         PassId{1, 1, 0});
  const LossSums sums = model.take_train_sums();
  ops->device().copy_to_host(host.data(), params.grads(), host.size() * sizeof(float));
  for (float& g : host) g /= loss_scale;
  const int V = run.model.vocab;
  std::vector<float> logits;  // (batch.decoder.total(), V)
  if (with_logits) {
    logits.resize(static_cast<size_t>(prefixes.decoder.batch()) * V);
    model.last_logits(prefixes, logits.data());
  }

  const hdf5::Faults faults = hdf5::Faults::of<std::runtime_error>(out);
  hdf5::Session session;
  hdf5::Hid file = faults.checked(H5Fcreate(out.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                                  H5Fclose, "the file");
  const hid_t root = file.get();
  const auto ints = [&](const char* name, const std::vector<int32_t>& v) {
    hdf5::write_vector_dataset(root, name, H5T_STD_I32LE, H5T_NATIVE_INT32, v.data(), v.size(),
                               4096, faults);
  };
  ints("batch/tokens", batch.decoder.tokens);
  ints("batch/offsets", batch.decoder.offsets);
  ints("batch/positions", batch.decoder.positions);
  ints("batch/targets", batch.targets);
  if (run.model.kind == ModelKind::kSeq2seq) {
    ints("batch/src_tokens", batch.encoder.tokens);
    ints("batch/src_offsets", batch.encoder.offsets);
    ints("batch/src_positions", batch.encoder.positions);
  }
  for (const ParamInfo& info : params.info()) {
    hdf5::write_vector_dataset(root, "grads/" + info.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                               host.data() + info.offset, info.size, 1 << 20, faults);
  }
  if (with_logits) {
    write_matrix(root, "logits", logits.data(), static_cast<hsize_t>(batch.decoder.total()),
                 static_cast<hsize_t>(V), faults);
  }
  hdf5::write_double_attr(root, "loss_sum", sums.loss, faults);
  hdf5::write_int_attr(root, "tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, &sums.tokens, faults);
  hdf5::write_int_attr(root, "correct", H5T_STD_I64LE, H5T_NATIVE_INT64, &sums.correct, faults);
  faults.check(file.close(), "the file");
  std::printf("dump_step: %s (%s, %s): loss %.6f over %lld tokens -> %s; attention: %s\n",
              checkpoint.c_str(), ops->device().name().c_str(), to_string(precision),
              sums.loss / static_cast<double>(sums.tokens), static_cast<long long>(sums.tokens),
              out.c_str(), attention_summary(ops->attention_calls()).c_str());
  return 0;
}

}  // namespace
}  // namespace mpiformer

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  bool cuda = false, logits = false, usage = args.size() < 2;
  mpiformer::DType precision = mpiformer::DType::kF32;
  mpiformer::AttentionPath attention = mpiformer::AttentionPath::kAuto;
  for (size_t i = 2; !usage && i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--logits") {
      logits = true;
      continue;
    }
    if (i + 1 >= args.size()) {
      usage = true;
      break;
    }
    const std::string& value = args[++i];
    if (flag == "--device" && (value == "cpu" || value == "cuda")) {
      cuda = value == "cuda";
    } else if (flag == "--precision" && value == "fp32") {
      precision = mpiformer::DType::kF32;
    } else if (flag == "--precision" && value == "bf16") {
      precision = mpiformer::DType::kBF16;
    } else if (flag == "--precision" && value == "fp16") {
      precision = mpiformer::DType::kF16;
    } else if (flag == "--attention" && value == "auto") {
      attention = mpiformer::AttentionPath::kAuto;
    } else if (flag == "--attention" && value == "cudnn") {
      attention = mpiformer::AttentionPath::kCudnn;
    } else if (flag == "--attention" && value == "plain") {
      attention = mpiformer::AttentionPath::kPlain;
    } else {
      usage = true;
    }
  }
  if (usage) {
    std::cerr << "usage: dump_step CHECKPOINT OUT.h5 [--device cpu|cuda] "
                 "[--precision fp32|bf16|fp16] [--logits] [--attention auto|cudnn|plain]\n";
    return 2;
  }
  try {
    return mpiformer::dump(args[0], args[1], cuda, precision, logits, attention);
  } catch (const std::exception& e) {
    std::cerr << "dump_step: " << e.what() << "\n";
    return 1;
  }
}
