// Every CUDA op against the CPU reference, in fp32, bf16 and fp16 (label
// gpu), then whole models: one training step of lm, seq2seq and mlm on both
// backends. Without a GPU every test is skipped with a message.
//
// Inputs are drawn in fp32 and rounded to the precision under test, so both
// backends see the same values; the CPU backend computes in fp32 and rounds
// what it stores, as the GPU kernels do, so outputs differ only by the
// order of sums and by roundings inside fused kernels. Tolerances, relative
// to the largest reference magnitude (at least 1):
// - fp32: 1e-5 elementwise, 1e-4 for reductions (GEMM, attention, norms).
// - bf16 stores 8 significant bits (ulp 2^-8 = 3.9e-3 relative): an output
//   whose fp32 value differs in the last bits may round one ulp apart, so
//   elementwise ops get 8e-3 (two ulps). Reductions also round inside
//   (cuDNN's flash attention keeps P in bf16 for P V, a folded log-length
//   scale rounds q once more, a fused epilogue rounds its pre-activation):
//   2.5e-2.
// - fp16 stores 11 significant bits (ulp 4.9e-4): 1e-3 and 5e-3.
// - fp32 results (parameter gradients, statistics, sums) from identical
//   inputs: 1e-4 in every precision, except where they are sums over
//   intermediates the GPU rounds (attention statistics: the reduction
//   tolerance of the precision).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/gemm_search.h"
#include "kernels/kernel_switches.h"
#include "kernels/ops.h"
#include "src/model/model.h"
#include "tests/test_batches.h"

namespace mpiformer {
namespace {

double elementwise_tolerance(DType t) {
  return t == DType::kF32 ? 1e-5 : t == DType::kBF16 ? 8e-3 : 1e-3;
}
double reduction_tolerance(DType t) {
  return t == DType::kF32 ? 1e-4 : t == DType::kBF16 ? 2.5e-2 : 5e-3;
}
constexpr double kFp32Tolerance = 1e-4;

std::string dtype_name(const ::testing::TestParamInfo<DType>& info) {
  return to_string(info.param);
}

bool gpu_present() {
  return cuda_device_count() > 0;
}

// The same data on both backends.
struct Pair {
  Act gpu, cpu;
};
struct FloatPair {
  float* gpu;
  float* cpu;
};
struct IntPair {
  int32_t* gpu;
  int32_t* cpu;
};

// The CUDA backend (behind a CheckedOps with MPIFORMER_CUDA_CHECK=1,
// scripts/gpu-check's rerun: a fault names its op), and *cuda its CudaOps,
// for the switches only tests turn.
std::unique_ptr<Ops> cuda_backend(CudaOps** cuda) {
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  *cuda = dynamic_cast<CudaOps*>(ops.get());
  return checked_if_asked(std::move(ops));
}

const char* to_string(PlainAttention p) {
  return p == PlainAttention::kFlash ? "flash" : "naive";
}

class Backends {
 public:
  Backends() : gpu(cuda_backend(&cuda)), cpu(make_cpu_ops(1)) {}
  ~Backends() {
    for (void* p : gpu_owned_) gpu->device().release(p);
    for (void* p : cpu_owned_) cpu->device().release(p);
  }

  // values rounded to t, on both backends.  values: host (n)
  Pair acts(const std::vector<float>& values, DType t) {
    std::vector<unsigned char> stored(std::max<size_t>(values.size(), 1) * dtype_bytes(t));
    narrow(stored.data(), t, values.data(), values.size());
    void* g = gpu->device().allocate(stored.size());
    void* c = cpu->device().allocate(stored.size());
    gpu->device().copy_to_device(g, stored.data(), stored.size());
    cpu->device().copy_to_device(c, stored.data(), stored.size());
    gpu_owned_.push_back(g);
    cpu_owned_.push_back(c);
    return Pair{Act(g, t), Act(c, t)};
  }
  FloatPair floats(const std::vector<float>& values) {
    const Pair p = acts(values, DType::kF32);
    return FloatPair{static_cast<float*>(p.gpu.data), static_cast<float*>(p.cpu.data)};
  }
  IntPair ints(const std::vector<int32_t>& values) {
    const size_t bytes = std::max<size_t>(values.size(), 1) * sizeof(int32_t);
    void* g = gpu->device().allocate(bytes);
    void* c = cpu->device().allocate(bytes);
    gpu->device().copy_to_device(g, values.data(), values.size() * sizeof(int32_t));
    cpu->device().copy_to_device(c, values.data(), values.size() * sizeof(int32_t));
    gpu_owned_.push_back(g);
    cpu_owned_.push_back(c);
    return IntPair{static_cast<int32_t*>(g), static_cast<int32_t*>(c)};
  }
  // Both sides read back, widened.
  std::vector<float> read_gpu(Act a, size_t n) { return read(*gpu, a, n); }
  std::vector<float> read_cpu(Act a, size_t n) { return read(*cpu, a, n); }

  CudaOps* cuda = nullptr;  // gpu's, set before gpu
  std::unique_ptr<Ops> gpu, cpu;

 private:
  static std::vector<float> read(Ops& ops, Act a, size_t n) {
    std::vector<unsigned char> stored(n * dtype_bytes(a.dtype));
    ops.device().copy_to_host(stored.data(), a.data, stored.size());
    std::vector<float> out(n);
    widen(out.data(), stored.data(), a.dtype, n);
    return out;
  }
  std::vector<void*> gpu_owned_, cpu_owned_;
};

// The n elements of a, as the backend stores them.
std::vector<unsigned char> stored_bytes(Ops& ops, Act a, size_t n) {
  std::vector<unsigned char> bytes(n * dtype_bytes(a.dtype));
  ops.device().copy_to_host(bytes.data(), a.data, bytes.size());
  return bytes;
}

// max |got - want| <= rel * max(1, max |want|), reported at the worst element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 1.0, worst = 0.0;
  size_t at = 0;
  for (float w : want) largest = std::max(largest, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) worst = d, at = i;  // NaN counts as worst
  }
  EXPECT_LE(worst, rel * largest) << what << ": worst at " << at << ": " << got[at] << " vs "
                                  << want[at] << " (largest |want| " << largest << ")";
}

// A precision and the kernel switches (kernels/kernel_switches.h) the ops
// run under: every op test runs on the defaults, on every newer path
// (candidates) and on the older paths that defaults replaced.
struct OpsCase {
  DType dtype;
  const char* switches;  // MPIFORMER_KERNELS's syntax; "" the defaults
  const char* name;      // the test name's suffix
};

// The older paths of the families whose default is their newer one and
// whose ops these tests call (exact=buffered is the gradient reducer's:
// scripts/gpu-check determinism compares its bits).
constexpr const char* kOlderPaths = "layernorm=block,adamw=ranged";

void PrintTo(const OpsCase& c, std::ostream* os) {
  *os << to_string(c.dtype) << (*c.switches ? std::string(", ") + c.switches : "");
}

std::string ops_case_name(const ::testing::TestParamInfo<OpsCase>& info) {
  const std::string name = info.param.name;
  return std::string(to_string(info.param.dtype)) + (name.empty() ? "" : "_" + name);
}

class CudaOpsTest : public ::testing::TestWithParam<OpsCase> {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no GPU visible: the CUDA op tests are skipped";
    b_ = std::make_unique<Backends>();
    b_->cuda->set_kernel_switches(parse_kernel_switches(GetParam().switches));
  }
  DType t() const { return GetParam().dtype; }
  std::vector<float> random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng_);
    return x;
  }
  std::vector<float> read_gpu(Act a, size_t n) { return b_->read_gpu(a, n); }
  std::vector<float> read_cpu(Act a, size_t n) { return b_->read_cpu(a, n); }
  void compare(Pair p, size_t n, double rel, const std::string& what) {
    expect_close(read_gpu(p.gpu, n), read_cpu(p.cpu, n), rel, what);
  }
  void compare(FloatPair p, size_t n, double rel, const std::string& what) {
    compare(Pair{Act::f32(p.gpu), Act::f32(p.cpu)}, n, rel, what);
  }

  void layernorm_case(int N, int C);

  // Self-attention over a fused QKV tensor (and dQKV gradient), or
  // cross-attention over separate q and kv tensors.
  void attention_case(int H, int D, const std::vector<int32_t>& q_offsets,
                      const std::vector<int32_t>& k_offsets, bool cross, bool causal,
                      AttentionScale scale) {
    Backends& b = *b_;
    const DType t = this->t();
    const int C = H * D, B = static_cast<int>(q_offsets.size()) - 1;
    const int Nq = q_offsets.back(), Nk = k_offsets.back();
    auto ragged = [&](const std::vector<int32_t>& offsets, const int32_t* device) {
      Ragged r{offsets.data(), device, B, offsets.back(), 0};
      for (int i = 0; i < B; ++i) r.max_len = std::max(r.max_len, offsets[i + 1] - offsets[i]);
      return r;
    };
    const IntPair q_off = b.ints(q_offsets), k_off = b.ints(k_offsets);
    const Ragged qs_gpu = ragged(q_offsets, q_off.gpu), qs_cpu = ragged(q_offsets, q_off.cpu);
    const Ragged ks_gpu = ragged(k_offsets, k_off.gpu), ks_cpu = ragged(k_offsets, k_off.cpu);
    const int q_stride = cross ? C : 3 * C, kv_stride = cross ? 2 * C : 3 * C;
    const Pair q = b.acts(random(static_cast<size_t>(Nq) * q_stride), t);
    const Pair kv = cross ? b.acts(random(static_cast<size_t>(Nk) * kv_stride), t) : q;
    const Act k_gpu = cross ? kv.gpu : q.gpu + C, k_cpu = cross ? kv.cpu : q.cpu + C;
    const Act v_gpu = k_gpu + C, v_cpu = k_cpu + C;
    const AttentionConfig cfg{H, D, causal, scale, 64.0f};
    const std::string what = std::string(cross ? "cross" : "self") + (causal ? " causal" : "") +
                             (scale == AttentionScale::kLogLength ? " log-length" : "") + " H" +
                             std::to_string(H) + " D" + std::to_string(D);

    const Pair out = b.acts(std::vector<float>(static_cast<size_t>(Nq) * C), t);
    const FloatPair stats = b.floats(std::vector<float>(static_cast<size_t>(Nq) * H));
    b.gpu->attention_forward(out.gpu, stats.gpu, q.gpu, q_stride, k_gpu, v_gpu, kv_stride, qs_gpu,
                             ks_gpu, cfg);
    b.cpu->attention_forward(out.cpu, stats.cpu, q.cpu, q_stride, k_cpu, v_cpu, kv_stride, qs_cpu,
                             ks_cpu, cfg);
    compare(out, static_cast<size_t>(Nq) * C, reduction_tolerance(t), "attention_forward " + what);
    compare(Pair{Act::f32(stats.gpu), Act::f32(stats.cpu)}, static_cast<size_t>(Nq) * H,
            t == DType::kF32 ? kFp32Tolerance : reduction_tolerance(t), "attention stats " + what);

    const Pair dout = b.acts(random(static_cast<size_t>(Nq) * C), t);
    const Pair dq = b.acts(std::vector<float>(static_cast<size_t>(Nq) * q_stride), t);
    const Pair dkv =
        cross ? b.acts(std::vector<float>(static_cast<size_t>(Nk) * kv_stride), t) : dq;
    const Act dk_gpu = cross ? dkv.gpu : dq.gpu + C, dk_cpu = cross ? dkv.cpu : dq.cpu + C;
    b.gpu->attention_backward(dq.gpu, dk_gpu, dk_gpu + C, dout.gpu, out.gpu, stats.gpu, q.gpu,
                              q_stride, k_gpu, v_gpu, kv_stride, qs_gpu, ks_gpu, cfg);
    b.cpu->attention_backward(dq.cpu, dk_cpu, dk_cpu + C, dout.cpu, out.cpu, stats.cpu, q.cpu,
                              q_stride, k_cpu, v_cpu, kv_stride, qs_cpu, ks_cpu, cfg);
    compare(dq, static_cast<size_t>(Nq) * q_stride, reduction_tolerance(t),
            "attention_backward " + std::string(cross ? "dq " : "dq, dk, dv ") + what);
    if (cross) {
      compare(dkv, static_cast<size_t>(Nk) * kv_stride, reduction_tolerance(t),
              "attention_backward dk, dv " + what);
    }
  }

  std::mt19937 rng_{7};
  std::unique_ptr<Backends> b_;
};

INSTANTIATE_TEST_SUITE_P(Precisions, CudaOpsTest,
                         ::testing::Values(OpsCase{DType::kF32, "", ""},
                                           OpsCase{DType::kF32, "candidates", "candidates"},
                                           OpsCase{DType::kF32, kOlderPaths, "older"},
                                           OpsCase{DType::kBF16, "", ""},
                                           OpsCase{DType::kBF16, "candidates", "candidates"},
                                           OpsCase{DType::kBF16, kOlderPaths, "older"},
                                           OpsCase{DType::kF16, "", ""},
                                           OpsCase{DType::kF16, "candidates", "candidates"},
                                           OpsCase{DType::kF16, kOlderPaths, "older"}),
                         ops_case_name);

TEST_P(CudaOpsTest, ConvertDropoutAndActivations) {
  const size_t n = 10007;
  const std::vector<float> master = random(n);
  const Pair converted = b_->acts(std::vector<float>(n), t());
  const FloatPair src = b_->floats(master);
  b_->gpu->convert(converted.gpu, src.gpu, n);
  b_->cpu->convert(converted.cpu, src.cpu, n);
  compare(converted, n, 0.0, "convert: the same rounding bit for bit");

  const Pair x = b_->acts(random(n), t()), out = b_->acts(std::vector<float>(n), t());
  const Dropout d{0.3f, 42, 9};
  b_->gpu->dropout(out.gpu, x.gpu, n, d);
  b_->cpu->dropout(out.cpu, x.cpu, n, d);
  compare(out, n, elementwise_tolerance(t()), "dropout: the same mask on both backends");
  b_->gpu->dropout(x.gpu, x.gpu, n, d);  // in place
  b_->cpu->dropout(x.cpu, x.cpu, n, d);
  compare(x, n, elementwise_tolerance(t()), "dropout in place");

  for (Activation act : {Activation::kGelu, Activation::kRelu}) {
    const Pair pre = b_->acts(random(n, 2.0f), t()), dout = b_->acts(random(n), t());
    const Pair dx = b_->acts(std::vector<float>(n), t());
    b_->gpu->activation_backward(dx.gpu, dout.gpu, pre.gpu, n, act);
    b_->cpu->activation_backward(dx.cpu, dout.cpu, pre.cpu, n, act);
    compare(dx, n, elementwise_tolerance(t()),
            std::string("activation_backward ") + to_string(act));
    const Pair out = b_->acts(std::vector<float>(n), t());
    b_->gpu->activation_forward(out.gpu, pre.gpu, n, act);
    b_->cpu->activation_forward(out.cpu, pre.cpu, n, act);
    compare(out, n, elementwise_tolerance(t()),
            std::string("activation_forward ") + to_string(act));
  }
}

TEST_P(CudaOpsTest, UploadsAreStreamOrderedAndStaged) {
  // Far more staged bytes than the ring holds, each host buffer overwritten
  // right after its upload: every device copy must hold what was uploaded.
  b_->gpu->device().reserve_uploads(1 << 12);
  const int copies = 64, n = 300;
  std::vector<int32_t*> dst;
  for (int c = 0; c < copies; ++c) dst.push_back(b_->ints(std::vector<int32_t>(n)).gpu);
  std::vector<int32_t> host(n);
  for (int c = 0; c < copies; ++c) {
    for (int i = 0; i < n; ++i) host[i] = c * 1000 + i;
    b_->gpu->device().upload(dst[c], host.data(), n * sizeof(int32_t));
    std::fill(host.begin(), host.end(), -1);
  }
  for (int c = 0; c < copies; ++c) {
    std::vector<int32_t> got(n);
    b_->gpu->device().copy_to_host(got.data(), dst[c], n * sizeof(int32_t));
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], c * 1000 + i) << "copy " << c << " element " << i;
  }
}

TEST_P(CudaOpsTest, EmbeddingsWithoutAtomics) {
  const int N = 97, C = 48, V = 29, L = 40;
  std::vector<int32_t> ids(N), pos(N);
  for (int i = 0; i < N; ++i) {
    ids[i] = std::uniform_int_distribution<int>(0, V - 1)(rng_);
    pos[i] = i % 17;  // repeated positions, as in a batch of sequences
  }
  const IntPair ids_d = b_->ints(ids), pos_d = b_->ints(pos);
  const Pair tokens = b_->acts(random(static_cast<size_t>(V) * C), t());
  const Pair positions = b_->acts(random(static_cast<size_t>(L) * C), t());
  const Pair out = b_->acts(std::vector<float>(static_cast<size_t>(N) * C), t());
  b_->gpu->embedding_forward(out.gpu, ids_d.gpu, tokens.gpu, pos_d.gpu, positions.gpu, N, C, 2.0f);
  b_->cpu->embedding_forward(out.cpu, ids_d.cpu, tokens.cpu, pos_d.cpu, positions.cpu, N, C, 2.0f);
  compare(out, static_cast<size_t>(N) * C, elementwise_tolerance(t()), "embedding_forward");

  // Row groups as the model builds them: on the host, uploaded.
  std::vector<int32_t> keys, starts, rows;
  auto groups = [&](const std::vector<int32_t>& by) {
    const int g = group_rows_by_key(by.data(), N, &keys, &starts, &rows);
    const IntPair k = b_->ints(keys), s = b_->ints(starts), r = b_->ints(rows);
    return std::pair<RowGroups, RowGroups>{RowGroups{k.gpu, s.gpu, r.gpu, g},
                                           RowGroups{k.cpu, s.cpu, r.cpu, g}};
  };
  const auto [by_id_gpu, by_id_cpu] = groups(ids);
  const auto [by_pos_gpu, by_pos_cpu] = groups(pos);
  const Pair dout = b_->acts(random(static_cast<size_t>(N) * C), t());
  const FloatPair dtokens = b_->floats(random(static_cast<size_t>(V) * C, 0.1f));
  const FloatPair dpositions = b_->floats(random(static_cast<size_t>(L) * C, 0.1f));
  b_->gpu->embedding_backward(dtokens.gpu, dpositions.gpu, dout.gpu, by_id_gpu, by_pos_gpu, N, C,
                              2.0f);
  b_->cpu->embedding_backward(dtokens.cpu, dpositions.cpu, dout.cpu, by_id_cpu, by_pos_cpu, N, C,
                              2.0f);
  compare(dtokens, static_cast<size_t>(V) * C, kFp32Tolerance, "embedding_backward tokens (+=)");
  compare(dpositions, static_cast<size_t>(L) * C, kFp32Tolerance,
          "embedding_backward positions (+=)");
  // Deterministic: a second run from the same state gives the same bits.
  const std::vector<float> once = read_gpu(Act::f32(dtokens.gpu), static_cast<size_t>(V) * C);
  const FloatPair again = b_->floats(std::vector<float>(static_cast<size_t>(V) * C));
  const FloatPair twice = b_->floats(std::vector<float>(static_cast<size_t>(V) * C));
  b_->gpu->embedding_backward(again.gpu, nullptr, dout.gpu, by_id_gpu, by_pos_gpu, N, C, 2.0f);
  b_->gpu->embedding_backward(twice.gpu, nullptr, dout.gpu, by_id_gpu, by_pos_gpu, N, C, 2.0f);
  EXPECT_EQ(read_gpu(Act::f32(again.gpu), once.size()), read_gpu(Act::f32(twice.gpu), once.size()))
      << "embedding_backward is not deterministic";
}

TEST_P(CudaOpsTest, LayerNormFusedWithTheResidual) {
  // C 96: every row in 16-byte vectors; 100: in bf16/fp16 some rows start
  // unaligned, and fp16's rows end in a tail; 102: no vectors at all. The
  // warp kernels (layernorm=warp) take 96, 768 and 1024 (3 and 4 vectors a
  // lane in bf16, 6 and 8 in fp32; 70 rows: a last block of 6) and leave
  // 1040 to the block kernels.
  for (const auto& [N, C] : {std::pair{77, 96}, std::pair{45, 100}, std::pair{31, 102},
                             std::pair{70, 768}, std::pair{40, 1024}, std::pair{9, 1040}}) {
    SCOPED_TRACE("N " + std::to_string(N) + ", C " + std::to_string(C));
    layernorm_case(N, C);
  }
  // Where asked for, the warp kernels ran each call of C 96, 768 and 1024
  // (2 forward and 4 backward a case) and left 1040's to the block kernels.
  const CandidateCalls& calls = b_->cuda->candidate_counts();
  const KernelSwitches& switches = b_->cuda->kernel_switches();
  constexpr auto kWarp = KernelSwitches::LayerNorm::kWarp;
  for (const auto& [warp, family] :
       {std::pair{switches.layernorm == kWarp, CandidateCalls::kLayerNorm},
        std::pair{switches.layernorm_backward == kWarp, CandidateCalls::kLayerNormBackward}}) {
    if (!warp) continue;
    EXPECT_GE(calls.ran[family], 6) << "family " << family;
    EXPECT_GE(calls.asked[family] - calls.ran[family], 2) << "family " << family;
  }
}

void CudaOpsTest::layernorm_case(int N, int C) {
  const size_t n = static_cast<size_t>(N) * C;
  const Pair x = b_->acts(random(n, 3.0f), t()), y = b_->acts(random(n), t());
  const Pair gamma = b_->acts(random(C), t()), beta = b_->acts(random(C), t());
  const Pair out = b_->acts(std::vector<float>(n), t()), sum = b_->acts(std::vector<float>(n), t());
  const FloatPair mean = b_->floats(std::vector<float>(N)),
                  rstd = b_->floats(std::vector<float>(N));
  b_->gpu->layernorm_forward(out.gpu, mean.gpu, rstd.gpu, x.gpu, gamma.gpu, beta.gpu, N, C, 1e-5f);
  b_->cpu->layernorm_forward(out.cpu, mean.cpu, rstd.cpu, x.cpu, gamma.cpu, beta.cpu, N, C, 1e-5f);
  compare(out, n, reduction_tolerance(t()), "layernorm_forward");
  compare(mean, N, kFp32Tolerance, "layernorm mean");
  compare(rstd, N, kFp32Tolerance, "layernorm rstd");

  const Dropout d{0.2f, 5, 77};
  b_->gpu->residual_layernorm_forward(sum.gpu, out.gpu, mean.gpu, rstd.gpu, x.gpu, y.gpu, d,
                                      gamma.gpu, beta.gpu, N, C, 1e-5f);
  b_->cpu->residual_layernorm_forward(sum.cpu, out.cpu, mean.cpu, rstd.cpu, x.cpu, y.cpu, d,
                                      gamma.cpu, beta.cpu, N, C, 1e-5f);
  compare(sum, n, elementwise_tolerance(t()), "residual_layernorm_forward sum");
  compare(out, n, reduction_tolerance(t()), "residual_layernorm_forward out");

  // dx = and +=, each without and with dx_sums: with +=, the sums of dx as
  // it came; with =, left alone (nothing came)
  for (const auto& [accumulate, with_sums] : {std::pair{false, false}, std::pair{false, true},
                                              std::pair{true, false}, std::pair{true, true}}) {
    const std::vector<float> dx0 = random(n);
    const Pair dout = b_->acts(random(n), t()), dx = b_->acts(dx0, t());
    const FloatPair dgamma = b_->floats(random(C)), dbeta = b_->floats(random(C)),
                    dx_sums = b_->floats(random(C));
    b_->gpu->layernorm_backward(dx.gpu, dgamma.gpu, dbeta.gpu, dout.gpu, sum.gpu, gamma.gpu,
                                mean.gpu, rstd.gpu, N, C, accumulate,
                                with_sums ? dx_sums.gpu : nullptr);
    b_->cpu->layernorm_backward(dx.cpu, dgamma.cpu, dbeta.cpu, dout.cpu, sum.cpu, gamma.cpu,
                                mean.cpu, rstd.cpu, N, C, accumulate,
                                with_sums ? dx_sums.cpu : nullptr);
    const std::string how =
        std::string(accumulate ? " (+=" : " (=") + (with_sums ? ", dx_sums)" : ")");
    compare(dx, n, reduction_tolerance(t()), "layernorm_backward dx" + how);
    compare(dgamma, C, kFp32Tolerance, "layernorm_backward dgamma" + how);
    compare(dbeta, C, kFp32Tolerance, "layernorm_backward dbeta" + how);
    compare(dx_sums, C, kFp32Tolerance, "layernorm_backward dx_sums" + how);
  }
}

TEST_P(CudaOpsTest, MatmulWithEpilogues) {
  // N not a multiple of 8, a padded output stride, the fused activations.
  const int N = 37, IC = 64, OC = 96, stride = 128;
  const Pair x = b_->acts(random(static_cast<size_t>(N) * IC), t());
  const Pair w = b_->acts(random(static_cast<size_t>(OC) * IC, 0.2f), t());
  const Pair bias = b_->acts(random(OC), t());
  const Pair out = b_->acts(std::vector<float>(static_cast<size_t>(N) * stride), t());
  b_->gpu->matmul_forward(out.gpu, x.gpu, w.gpu, bias.gpu, N, IC, OC, {}, stride);
  b_->cpu->matmul_forward(out.cpu, x.cpu, w.cpu, bias.cpu, N, IC, OC, {}, stride);
  // Compare the OC columns of each row (the padding is never written).
  const std::vector<float> got = read_gpu(out.gpu, static_cast<size_t>(N) * stride);
  const std::vector<float> want = read_cpu(out.cpu, static_cast<size_t>(N) * stride);
  std::vector<float> got_cols, want_cols;
  for (int r = 0; r < N; ++r) {
    got_cols.insert(got_cols.end(), got.begin() + r * stride, got.begin() + r * stride + OC);
    want_cols.insert(want_cols.end(), want.begin() + r * stride, want.begin() + r * stride + OC);
  }
  expect_close(got_cols, want_cols, reduction_tolerance(t()), "matmul_forward + bias, stride");

  for (Activation act : {Activation::kGelu, Activation::kRelu}) {
    const std::string name = to_string(act);
    const size_t no = static_cast<size_t>(N) * OC;
    const Pair y = b_->acts(std::vector<float>(no), t()),
               pre = b_->acts(std::vector<float>(no), t());
    b_->gpu->matmul_forward(y.gpu, x.gpu, w.gpu, bias.gpu, N, IC, OC, {act, pre.gpu});
    b_->cpu->matmul_forward(y.cpu, x.cpu, w.cpu, bias.cpu, N, IC, OC, {act, pre.cpu});
    compare(pre, no, reduction_tolerance(t()), "matmul_forward pre-activation, " + name);
    compare(y, no, reduction_tolerance(t()), "matmul_forward fused " + name);

    // The activation into a padded stride: ReLU takes the unfused path.
    const Pair ys = b_->acts(std::vector<float>(static_cast<size_t>(N) * stride, 7.0f), t());
    b_->gpu->matmul_forward(ys.gpu, x.gpu, w.gpu, bias.gpu, N, IC, OC, {act, pre.gpu}, stride);
    b_->cpu->matmul_forward(ys.cpu, x.cpu, w.cpu, bias.cpu, N, IC, OC, {act, pre.cpu}, stride);
    compare(ys, static_cast<size_t>(N) * stride, reduction_tolerance(t()),
            "matmul_forward fused " + name + " into a padded stride (pad columns kept)");

    // Backward through the activation: the previous layer's view, IC = OC here.
    // Both backends start from the CPU's y and pre: in bf16/fp16 the two
    // forwards may round an element a unit apart, which would move dweight
    // by far more than the fp32 accumulation it checks.
    const std::vector<unsigned char> y_cpu = stored_bytes(*b_->cpu, y.cpu, no),
                                     pre_cpu = stored_bytes(*b_->cpu, pre.cpu, no);
    b_->gpu->device().copy_to_device(y.gpu.data, y_cpu.data(), y_cpu.size());
    b_->gpu->device().copy_to_device(pre.gpu.data, pre_cpu.data(), pre_cpu.size());
    const Pair dout = b_->acts(random(static_cast<size_t>(N) * IC), t());
    const Pair w2 = b_->acts(random(static_cast<size_t>(IC) * OC, 0.2f), t());
    const Pair dx = b_->acts(std::vector<float>(no), t());
    const FloatPair dw = b_->floats(random(static_cast<size_t>(IC) * OC, 0.1f));
    const FloatPair db = b_->floats(random(IC, 0.1f));
    b_->gpu->matmul_backward(dx.gpu, dw.gpu, db.gpu, dout.gpu, y.gpu, w2.gpu, N, OC, IC, false,
                             {act, pre.gpu});
    b_->cpu->matmul_backward(dx.cpu, dw.cpu, db.cpu, dout.cpu, y.cpu, w2.cpu, N, OC, IC, false,
                             {act, pre.cpu});
    compare(dx, no, reduction_tolerance(t()), "matmul_backward through " + name);
    compare(dw, static_cast<size_t>(IC) * OC, kFp32Tolerance, "matmul_backward dweight, " + name);
    compare(db, IC, kFp32Tolerance, "matmul_backward dbias, " + name);

    // With the pre-activation's bias gradient (dbias_in=dgelu): GELU's from
    // cuBLASLt's DGELU_BGRAD where it has it (fp32 sums of dx before it is
    // rounded: the CPU sums it as stored), ReLU's from a pass over dx.
    const CandidateCalls before = b_->cuda->candidate_counts();
    const FloatPair pre_sums = b_->floats(random(OC, 0.1f));
    b_->gpu->matmul_backward(dx.gpu, dw.gpu, db.gpu, dout.gpu, y.gpu, w2.gpu, N, OC, IC, false,
                             {act, pre.gpu, pre_sums.gpu});
    b_->cpu->matmul_backward(dx.cpu, dw.cpu, db.cpu, dout.cpu, y.cpu, w2.cpu, N, OC, IC, false,
                             {act, pre.cpu, pre_sums.cpu});
    compare(dx, no, reduction_tolerance(t()), "matmul_backward through " + name + ", summed");
    compare(pre_sums, OC, reduction_tolerance(t()), "pre_bias_grad through " + name);
    const CandidateCalls& after = b_->cuda->candidate_counts();
    EXPECT_EQ(after.asked[CandidateCalls::kDBiasIn] - before.asked[CandidateCalls::kDBiasIn], 1);
    const long long fused =
        after.ran[CandidateCalls::kDBiasIn] - before.ran[CandidateCalls::kDBiasIn];
    if (act == Activation::kRelu) {
      EXPECT_EQ(fused, 0) << "no epilogue sums through a ReLU";
    }
    std::printf("pre_bias_grad through %s (%s): %s\n", name.c_str(), to_string(t()),
                fused ? "DGELU_BGRAD" : "a column pass");
  }

  // Plain backward with accumulation into dx, and dout with a padded stride.
  const Pair dout = b_->acts(random(static_cast<size_t>(N) * stride), t());
  const Pair dx = b_->acts(random(static_cast<size_t>(N) * IC), t());
  const FloatPair dw = b_->floats(random(static_cast<size_t>(OC) * IC, 0.25f));
  const FloatPair db = b_->floats(random(OC, 0.125f));
  b_->gpu->matmul_backward(dx.gpu, dw.gpu, db.gpu, dout.gpu, x.gpu, w.gpu, N, IC, OC, true, {},
                           stride);
  b_->cpu->matmul_backward(dx.cpu, dw.cpu, db.cpu, dout.cpu, x.cpu, w.cpu, N, IC, OC, true, {},
                           stride);
  compare(dx, static_cast<size_t>(N) * IC, reduction_tolerance(t()), "matmul_backward dx (+=)");
  compare(dw, static_cast<size_t>(OC) * IC, kFp32Tolerance, "matmul_backward dweight (+=)");
  compare(db, OC, kFp32Tolerance, "matmul_backward dbias (+=)");

  // One row: the shape cuBLASLt's heuristics may refuse.
  const Pair one = b_->acts(std::vector<float>(OC), t());
  b_->gpu->matmul_forward(one.gpu, x.gpu, w.gpu, bias.gpu, 1, IC, OC);
  b_->cpu->matmul_forward(one.cpu, x.cpu, w.cpu, bias.cpu, 1, IC, OC);
  compare(one, OC, reduction_tolerance(t()), "matmul_forward, one row");

  // A wide odd OC (a vocabulary of 301 into rows of 320): the backend may
  // split the features into an aligned part and a tail.
  const int V = 301, ldv = 320;
  const Pair wv = b_->acts(random(static_cast<size_t>(V) * IC, 0.2f), t());
  const Pair bv = b_->acts(random(V), t());
  const Pair logits = b_->acts(std::vector<float>(static_cast<size_t>(N) * ldv), t());
  b_->gpu->matmul_forward(logits.gpu, x.gpu, wv.gpu, bv.gpu, N, IC, V, {}, ldv);
  b_->cpu->matmul_forward(logits.cpu, x.cpu, wv.cpu, bv.cpu, N, IC, V, {}, ldv);
  compare(logits, static_cast<size_t>(N) * ldv, reduction_tolerance(t()),
          "matmul_forward, OC 301 into a stride of 320");
  const Pair dlogits = b_->acts(random(static_cast<size_t>(N) * ldv), t());
  const Pair dxv = b_->acts(random(static_cast<size_t>(N) * IC), t());
  const FloatPair dwv = b_->floats(random(static_cast<size_t>(V) * IC, 0.25f));
  const FloatPair dbv = b_->floats(random(V, 0.125f));
  for (bool accumulate : {false, true}) {
    b_->gpu->matmul_backward(dxv.gpu, dwv.gpu, dbv.gpu, dlogits.gpu, x.gpu, wv.gpu, N, IC, V,
                             accumulate, {}, ldv);
    b_->cpu->matmul_backward(dxv.cpu, dwv.cpu, dbv.cpu, dlogits.cpu, x.cpu, wv.cpu, N, IC, V,
                             accumulate, {}, ldv);
    const std::string how = accumulate ? " (+=)" : "";
    compare(dxv, static_cast<size_t>(N) * IC, reduction_tolerance(t()), "OC 301: dx" + how);
    compare(dwv, static_cast<size_t>(V) * IC, kFp32Tolerance, "OC 301: dweight" + how);
    compare(dbv, V, kFp32Tolerance, "OC 301: dbias" + how);
  }
}

TEST_P(CudaOpsTest, RaggedAttention) {
  // Small heads and a length-0 sequence.
  const std::vector<int32_t> small = {0, 5, 6, 19, 19, 27};
  // Heads cuDNN takes (D 64), sequences across its 64- and 128-row tiles.
  const std::vector<int32_t> large = {0, 1, 70, 200, 263, 391};
  // Cross-attention: other lengths on the key side.
  const std::vector<int32_t> sources = {0, 9, 40, 41, 170, 300};
  // Equal lengths on each side: what cuDNN runs in the dense layout under
  // attention=dense (the candidates' instantiation).
  const std::vector<int32_t> equal = {0, 128, 256, 384, 512};
  const std::vector<int32_t> equal_sources = {0, 96, 192, 288, 384};
  // Both plain kernels for every precision; bf16 and fp16 again on cuDNN,
  // where a case it refuses is an error and every call must be its.
  struct Run {
    AttentionPath path;
    PlainAttention plain;
  };
  std::vector<Run> runs = {{AttentionPath::kPlain, PlainAttention::kNaive},
                           {AttentionPath::kPlain, PlainAttention::kFlash}};
  if (t() != DType::kF32) {
    if (cuda::FlashAttention::built())
      runs.push_back({AttentionPath::kCudnn, PlainAttention::kFlash});
    else
      std::printf("note: this build has no cuDNN frontend; cuDNN attention not tested\n");
  }
  for (const Run& run : runs) {
    const AttentionPath path = run.path;
    SCOPED_TRACE(std::string("--attention ") + to_string(path) + ", " + to_string(run.plain));
    b_->cuda->set_plain_attention(run.plain);
    // D 8 on --attention auto: cuDNN may take it or leave it to the plain kernels.
    b_->gpu->set_attention_path(path == AttentionPath::kPlain ? path : AttentionPath::kAuto);
    for (bool causal : {false, true}) {
      for (AttentionScale scale : {AttentionScale::kStandard, AttentionScale::kLogLength})
        attention_case(3, 8, small, small, false, causal, scale);
    }
    b_->gpu->set_attention_path(path);
    const AttentionCalls before = b_->gpu->attention_calls();
    int calls = 0;
    for (bool causal : {false, true}) {
      for (AttentionScale scale : {AttentionScale::kStandard, AttentionScale::kLogLength}) {
        attention_case(2, 64, large, large, false, causal, scale);
        calls += 2;
      }
    }
    for (AttentionScale scale : {AttentionScale::kStandard, AttentionScale::kLogLength}) {
      attention_case(2, 64, large, sources, true, false, scale);
      calls += 2;
    }
    const long long dense_before = b_->cuda->candidate_counts().ran[CandidateCalls::kAttention];
    for (bool causal : {false, true}) {
      attention_case(2, 64, equal, equal, false, causal, AttentionScale::kStandard);
      calls += 2;
    }
    // The log-length scale folded into a dense copy of q, on each side.
    attention_case(2, 64, equal, equal, false, true, AttentionScale::kLogLength);
    attention_case(2, 64, equal, equal_sources, true, false, AttentionScale::kLogLength);
    calls += 4;
    const AttentionCalls after = b_->gpu->attention_calls();
    const bool cudnn = path == AttentionPath::kCudnn;
    const bool dense = b_->cuda->kernel_switches().attention == KernelSwitches::Attention::kDense &&
                       cuda::FlashAttention::takes_dense_layout();
    EXPECT_EQ(b_->cuda->candidate_counts().ran[CandidateCalls::kAttention] - dense_before,
              cudnn && dense ? 8 : 0)
        << "the equal-length calls on cuDNN's dense graphs";
    EXPECT_EQ(after.library - before.library, cudnn ? calls : 0);
    EXPECT_EQ(after.plain - before.plain, cudnn ? 0 : calls);
    EXPECT_EQ(after.fallbacks, before.fallbacks);
  }
  b_->gpu->set_attention_path(AttentionPath::kAuto);
  b_->cuda->set_plain_attention(PlainAttention::kFlash);
}

// attention=dense in a run that prepared its classes: the dense graphs of
// a uniform class (a benchmark's one batch) are built before the first
// step, and an equal-length batch of another count takes its bucket
// class's ragged graph. No call builds a graph.
TEST_P(CudaOpsTest, PreparedDenseAttentionBuildsNoGraphInAStep) {
  if (t() == DType::kF32 || !cuda::FlashAttention::built() ||
      !cuda::FlashAttention::takes_dense_layout())
    GTEST_SKIP() << "cuDNN's dense layout runs in bf16 and fp16, from cuDNN 9.12";
  KernelSwitches switches = b_->cuda->kernel_switches();
  switches.attention = KernelSwitches::Attention::kDense;
  b_->cuda->set_kernel_switches(switches);
  b_->gpu->set_attention_path(AttentionPath::kCudnn);
  const int H = 2, D = 64, C = H * D;
  const AttentionConfig cfg{H, D, true, AttentionScale::kStandard, 64.0f};
  const SideBound one_batch{4, 128, 4 * 128, 128}, bucket{8, 128, 8 * 128};
  const AttentionPreparation done =
      b_->gpu->prepare_attention({AttentionCase{cfg, 3 * C, 3 * C, one_batch, one_batch},
                                  AttentionCase{cfg, 3 * C, 3 * C, bucket, bucket}},
                                 t(), true);
  EXPECT_EQ(done.refused, 0) << done.first_refusal;
  EXPECT_EQ(done.graphs, 4) << "the class's ragged graphs and the uniform one's dense graphs";
  const AttentionCalls before = b_->gpu->attention_calls();
  const CandidateCalls asked = b_->cuda->candidate_counts();
  attention_case(H, D, {0, 128, 256, 384, 512}, {0, 128, 256, 384, 512}, false, true,
                 AttentionScale::kStandard);
  const CandidateCalls ran = b_->cuda->candidate_counts();
  attention_case(H, D, {0, 128, 256, 384}, {0, 128, 256, 384}, false, true,
                 AttentionScale::kStandard);
  const CandidateCalls after = b_->cuda->candidate_counts();
  const int a = CandidateCalls::kAttention;
  EXPECT_EQ(ran.ran[a] - asked.ran[a], 2) << "the uniform class's batch on its dense graphs";
  EXPECT_EQ(after.asked[a] - ran.asked[a], 2);
  EXPECT_EQ(after.ran[a], ran.ran[a]) << "3 sequences: the bucket class's ragged graphs";
  const AttentionCalls calls = b_->gpu->attention_calls();
  EXPECT_EQ(calls.graphs, before.graphs) << "a call built a graph";
  EXPECT_EQ(calls.library - before.library, 4);
  EXPECT_EQ(calls.fallbacks, before.fallbacks);
}

// Offsets of sequences of these lengths.
std::vector<int32_t> offsets_of(const std::vector<int>& lengths) {
  std::vector<int32_t> offsets = {0};
  for (int n : lengths) offsets.push_back(offsets.back() + n);
  return offsets;
}

// The shapes the flash kernels tile differently, on both plain kernels:
// lengths around the 64-row tiles, heads of 8, 64 and 128 (one instantiation
// each), cross-attention with a sequence that has no keys.
TEST_P(CudaOpsTest, PlainAttentionShapes) {
  const std::vector<int32_t> ragged =
      offsets_of({1, 2, 63, 64, 65, 127, 128, 129, 200, 7, 31, 100, 150, 199, 3});
  const std::vector<int32_t> one_to_13 = offsets_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  const std::vector<int32_t> targets = offsets_of({1, 200, 64, 33, 5});
  const std::vector<int32_t> sources = offsets_of({130, 1, 65, 200, 0});
  b_->gpu->set_attention_path(AttentionPath::kPlain);
  for (PlainAttention plain : {PlainAttention::kNaive, PlainAttention::kFlash}) {
    SCOPED_TRACE(to_string(plain));
    b_->cuda->set_plain_attention(plain);
    attention_case(2, 64, ragged, ragged, false, true, AttentionScale::kStandard);
    attention_case(2, 64, ragged, ragged, false, true, AttentionScale::kLogLength);
    attention_case(3, 8, one_to_13, one_to_13, false, true, AttentionScale::kStandard);
    attention_case(3, 8, one_to_13, one_to_13, false, false, AttentionScale::kLogLength);
    for (AttentionScale scale : {AttentionScale::kStandard, AttentionScale::kLogLength})
      attention_case(2, 64, targets, sources, true, false, scale);
    attention_case(2, 128, offsets_of({100, 28, 129}), offsets_of({100, 28, 129}), false, true,
                   AttentionScale::kStandard);
    attention_case(1, 128, targets, sources, true, false, AttentionScale::kStandard);
    attention_case(4, 16, offsets_of({17, 17, 17}), offsets_of({17, 17, 17}), false, false,
                   AttentionScale::kStandard);
  }
  b_->gpu->set_attention_path(AttentionPath::kAuto);
  b_->cuda->set_plain_attention(PlainAttention::kFlash);
}

// Decoding attention: each row against its listed keys (a cache's rows in
// any order, lists of 0 to 12,050 keys: the longest is taken in two chunks
// of shared memory), as the CPU reference computes it.
TEST_P(CudaOpsTest, ListedAttention) {
  const int H = 4, D = 32, C = H * D, P = 12100;
  const std::vector<int> lengths = {1, 0, 7, 300, 64, 2, 12050};
  const int R = static_cast<int>(lengths.size());
  std::vector<int32_t> starts{0}, listed;
  int longest = 0;
  for (int n : lengths) {
    for (int j = 0; j < n; ++j) listed.push_back((j * 37 + n) % P);
    starts.push_back(static_cast<int32_t>(listed.size()));
    longest = std::max(longest, n);
  }
  const IntPair st = b_->ints(starts), ls = b_->ints(listed);
  const KeyLists keys_gpu{starts.data(), st.gpu, listed.data(), ls.gpu, R, P, longest};
  const KeyLists keys_cpu{starts.data(), st.cpu, listed.data(), ls.cpu, R, P, longest};
  const Pair q = b_->acts(random(static_cast<size_t>(R) * 3 * C), t());
  const Pair kv = b_->acts(random(static_cast<size_t>(P) * 2 * C), t());
  for (AttentionScale scale : {AttentionScale::kStandard, AttentionScale::kLogLength}) {
    AttentionConfig cfg;
    cfg.heads = H;
    cfg.head_dim = D;
    cfg.scale = scale;
    const Pair out = b_->acts(random(static_cast<size_t>(R) * C), t());  // overwritten
    b_->gpu->attention_listed(out.gpu, q.gpu, 3 * C, kv.gpu, kv.gpu + C, 2 * C, keys_gpu, cfg);
    b_->cpu->attention_listed(out.cpu, q.cpu, 3 * C, kv.cpu, kv.cpu + C, 2 * C, keys_cpu, cfg);
    compare(out, static_cast<size_t>(R) * C, reduction_tolerance(t()), "attention_listed");
  }
}

TEST_P(CudaOpsTest, ScatterRows) {
  // A step's QKV rows into scattered rows of a cache; the others keep theirs.
  const int width = 96, src_stride = 100, dst_stride = 96, P = 50;
  const std::vector<int32_t> rows = {17, 0, 49, 3, 22, 8, 31};
  const int n = static_cast<int>(rows.size());
  const IntPair r = b_->ints(rows);
  const Pair src = b_->acts(random(static_cast<size_t>(n) * src_stride), t());
  const Pair dst = b_->acts(random(static_cast<size_t>(P) * dst_stride), t());
  b_->gpu->scatter_rows(dst.gpu, dst_stride, src.gpu, src_stride, r.gpu, n, width);
  b_->cpu->scatter_rows(dst.cpu, dst_stride, src.cpu, src_stride, r.cpu, n, width);
  compare(dst, static_cast<size_t>(P) * dst_stride, 0.0, "scatter_rows");
}

TEST_P(CudaOpsTest, CrossEntropyAdamWAndNorm) {
  const int N = 23, V = 517, stride = 576;
  std::vector<float> logits = random(static_cast<size_t>(N) * stride, 2.0f);
  std::vector<int32_t> targets(N);
  for (int32_t& target : targets) target = std::uniform_int_distribution<int>(0, V - 1)(rng_);
  targets[3] = targets[11] = 0;  // pad rows
  const Pair x = b_->acts(logits, t());
  const IntPair tg = b_->ints(targets);
  const Pair sums = b_->acts(std::vector<float>(8), DType::kF32);  // room for a LossSums
  auto* sums_gpu = static_cast<LossSums*>(sums.gpu.data);
  auto* sums_cpu = static_cast<LossSums*>(sums.cpu.data);
  for (int pass = 0; pass < 2; ++pass) {  // sums accumulate; the second pass has no gradient
    b_->gpu->cross_entropy(x.gpu, tg.gpu, N, V, 0.1f, 0, 0.01f, pass == 0, sums_gpu, stride);
    b_->cpu->cross_entropy(x.cpu, tg.cpu, N, V, 0.1f, 0, 0.01f, pass == 0, sums_cpu, stride);
  }
  LossSums got, want;
  b_->gpu->device().copy_to_host(&got, sums_gpu, sizeof got);
  b_->cpu->device().copy_to_host(&want, sums_cpu, sizeof want);
  EXPECT_NEAR(got.loss, want.loss, reduction_tolerance(t()) * std::abs(want.loss));
  EXPECT_EQ(got.tokens, want.tokens);
  if (t() == DType::kF32) {
    EXPECT_EQ(got.correct, want.correct);
  }
  compare(x, static_cast<size_t>(N) * stride, elementwise_tolerance(t()),
          "cross_entropy gradient in place");
  {
    // Rows V apart: in bf16/fp16 most start unaligned (no 16-byte loads).
    logits.resize(static_cast<size_t>(N) * V);
    const Pair packed = b_->acts(logits, t());
    const Pair fresh = b_->acts(std::vector<float>(8), DType::kF32);
    auto* fresh_gpu = static_cast<LossSums*>(fresh.gpu.data);
    auto* fresh_cpu = static_cast<LossSums*>(fresh.cpu.data);
    b_->gpu->cross_entropy(packed.gpu, tg.gpu, N, V, 0.1f, 0, 0.01f, true, fresh_gpu, V);
    b_->cpu->cross_entropy(packed.cpu, tg.cpu, N, V, 0.1f, 0, 0.01f, true, fresh_cpu, V);
    b_->gpu->device().copy_to_host(&got, fresh_gpu, sizeof got);
    b_->cpu->device().copy_to_host(&want, fresh_cpu, sizeof want);
    EXPECT_NEAR(got.loss, want.loss, reduction_tolerance(t()) * std::abs(want.loss));
    EXPECT_EQ(got.tokens, want.tokens);
    compare(packed, static_cast<size_t>(N) * V, elementwise_tolerance(t()),
            "cross_entropy gradient in place, rows V apart");
  }

  // AdamW over ranges with different decays, clipped on the device, with a
  // loss scale to remove; the compute copy in the precision under test.
  const size_t n = 70001;
  std::vector<float> g = random(n), m0 = random(n, 0.1f), v0(n);
  for (size_t i = 0; i < n; ++i) v0[i] = std::abs(m0[i]) * 0.5f;
  const FloatPair params = b_->floats(random(n)), grads = b_->floats(g), m = b_->floats(m0),
                  v = b_->floats(v0);
  const Pair compute = b_->acts(std::vector<float>(n), t());
  // Ends inside a float4 (adamw=vector's head and tail), one range shorter
  // than a float4.
  const std::vector<AdamWRange> ranges = {
      {0, 1001, 0.01f}, {1001, 1003, 0.0f}, {1003, 1302, 0.0f}, {1302, n, 0.1f}};
  const Pair range_bytes =
      b_->acts(std::vector<float>(ranges.size() * sizeof(AdamWRange) / 4), DType::kF32);
  b_->gpu->device().copy_to_device(range_bytes.gpu.data, ranges.data(),
                                   ranges.size() * sizeof(AdamWRange));
  b_->cpu->device().copy_to_device(range_bytes.cpu.data, ranges.data(),
                                   ranges.size() * sizeof(AdamWRange));
  const Pair norm = b_->acts(std::vector<float>(2), DType::kF32);  // one double
  b_->gpu->sum_squares(static_cast<double*>(norm.gpu.data), grads.gpu, n);
  b_->cpu->sum_squares(static_cast<double*>(norm.cpu.data), grads.cpu, n);
  double norm_gpu = 0, norm_cpu = 0;
  b_->gpu->device().copy_to_host(&norm_gpu, norm.gpu.data, sizeof norm_gpu);
  b_->cpu->device().copy_to_host(&norm_cpu, norm.cpu.data, sizeof norm_cpu);
  EXPECT_NEAR(norm_gpu, norm_cpu, 1e-12 * norm_cpu);
  AdamWConfig cfg;
  cfg.lr = 1e-3f, cfg.beta1 = 0.9f, cfg.beta2 = 0.999f, cfg.eps = 1e-8f, cfg.step = 3;
  cfg.inv_loss_scale = 0.5f, cfg.max_norm = 10.0f;  // the norm is ~264 / 2: clipped
  const Act compute_gpu = t() == DType::kF32 ? Act() : compute.gpu;
  const Act compute_cpu = t() == DType::kF32 ? Act() : compute.cpu;
  const int R = static_cast<int>(ranges.size());
  b_->gpu->adamw_update(params.gpu, grads.gpu, m.gpu, v.gpu, compute_gpu, n,
                        static_cast<AdamWRange*>(range_bytes.gpu.data), R, cfg,
                        static_cast<double*>(norm.gpu.data));
  b_->cpu->adamw_update(params.cpu, grads.cpu, m.cpu, v.cpu, compute_cpu, n,
                        static_cast<AdamWRange*>(range_bytes.cpu.data), R, cfg,
                        static_cast<double*>(norm.cpu.data));
  compare(params, n, 1e-5, "adamw params");
  compare(m, n, 1e-5, "adamw m");
  compare(v, n, 1e-5, "adamw v");
  if (compute_gpu) compare(compute, n, elementwise_tolerance(t()), "adamw compute copy");
}

// The gradient norm's block partials on the GPU: close to the CPU
// reference, and bitwise the same over a block-aligned slice as over the
// whole buffer (what keeps a sharded optimizer's norm the unsharded one's).
TEST_P(CudaOpsTest, SumSquaresBlocksMatchCpuAndSlices) {
  const size_t n = 5 * kNormBlockFloats + 123, blocks = norm_blocks(n);
  const FloatPair x = b_->floats(random(n));
  const Pair whole = b_->acts(std::vector<float>(2 * blocks), DType::kF32);   // (blocks) doubles
  const Pair sliced = b_->acts(std::vector<float>(2 * blocks), DType::kF32);  // (blocks) doubles
  const Pair total = b_->acts(std::vector<float>(2), DType::kF32);            // one double
  b_->gpu->sum_squares_blocks(static_cast<double*>(whole.gpu.data), x.gpu, n);
  b_->cpu->sum_squares_blocks(static_cast<double*>(whole.cpu.data), x.cpu, n);
  b_->gpu->sum_squares_blocks(static_cast<double*>(sliced.gpu.data), x.gpu, 3 * kNormBlockFloats);
  b_->gpu->sum_squares_blocks(static_cast<double*>(sliced.gpu.data) + 3,
                              x.gpu + 3 * kNormBlockFloats, n - 3 * kNormBlockFloats);
  std::vector<double> gpu(blocks), cpu(blocks), gpu_sliced(blocks);
  b_->gpu->device().copy_to_host(gpu.data(), whole.gpu.data, blocks * sizeof(double));
  b_->cpu->device().copy_to_host(cpu.data(), whole.cpu.data, blocks * sizeof(double));
  b_->gpu->device().copy_to_host(gpu_sliced.data(), sliced.gpu.data, blocks * sizeof(double));
  for (size_t b = 0; b < blocks; ++b) {
    EXPECT_NEAR(gpu[b], cpu[b], 1e-12 * cpu[b]) << "block " << b;
    EXPECT_EQ(gpu_sliced[b], gpu[b]) << "block " << b;
  }
  b_->gpu->sum_doubles(static_cast<double*>(total.gpu.data), static_cast<double*>(whole.gpu.data),
                       blocks);
  b_->cpu->sum_doubles(static_cast<double*>(total.cpu.data), static_cast<double*>(whole.cpu.data),
                       blocks);
  double total_gpu = 0, total_cpu = 0;
  b_->gpu->device().copy_to_host(&total_gpu, total.gpu.data, sizeof total_gpu);
  b_->cpu->device().copy_to_host(&total_cpu, total.cpu.data, sizeof total_cpu);
  EXPECT_NEAR(total_gpu, total_cpu, 1e-12 * total_cpu);
}

// The classifier's ops: pooling over ragged rows (an empty sequence, one
// longer than a block), and the ZLPR loss with soft targets, scores of
// +-1e4 and a padded row stride. Sums and counts are computed in double
// and integers from the same inputs on both sides: the counts are equal,
// the loss agrees to rounding, and a second GPU run gives the same bits.
TEST_P(CudaOpsTest, ClassifierPoolingAndZlpr) {
  const std::vector<int32_t> offsets = {0, 3, 4, 4, 304, 309};
  const int B = 5, N = offsets.back(), C = 40;
  const IntPair off = b_->ints(offsets);
  const Ragged rows_gpu{offsets.data(), off.gpu, B, N, 300};
  const Ragged rows_cpu{offsets.data(), off.cpu, B, N, 300};
  const Pair x = b_->acts(random(static_cast<size_t>(N) * C), t());
  for (PoolKind kind : {PoolKind::kCls, PoolKind::kMean}) {
    const std::string name = kind == PoolKind::kCls ? "cls" : "mean";
    const Pair out = b_->acts(random(static_cast<size_t>(B) * C), t());  // overwritten
    b_->gpu->pool_forward(out.gpu, x.gpu, rows_gpu, C, kind);
    b_->cpu->pool_forward(out.cpu, x.cpu, rows_cpu, C, kind);
    compare(out, static_cast<size_t>(B) * C,
            kind == PoolKind::kCls ? 0.0 : reduction_tolerance(t()), "pool_forward " + name);
    const Pair dout = b_->acts(random(static_cast<size_t>(B) * C), t());
    const Pair dx = b_->acts(random(static_cast<size_t>(N) * C), t());  // overwritten
    b_->gpu->pool_backward(dx.gpu, dout.gpu, rows_gpu, C, kind);
    b_->cpu->pool_backward(dx.cpu, dout.cpu, rows_cpu, C, kind);
    compare(dx, static_cast<size_t>(N) * C, elementwise_tolerance(t()), "pool_backward " + name);
  }

  const int rows = 37, K = 29, stride = 32;
  std::vector<float> scores = random(static_cast<size_t>(rows) * stride, 3.0f);
  std::vector<float> targets(static_cast<size_t>(rows) * K);
  for (size_t i = 0; i < targets.size(); ++i) {
    const int level = std::uniform_int_distribution<int>(0, 3)(rng_);
    targets[i] = level == 0 ? 0.0f : level == 1 ? 1.0f : level == 2 ? 0.5f : 0.3f;
  }
  for (int i = 0; i < K; ++i) {  // row 5 right by 1e4, row 6 wrong by 1e4
    const bool truth = targets[5 * K + i] >= 0.5f;
    scores[5 * stride + i] = truth ? 1e4f : -1e4f;
    scores[6 * stride + i] = truth ? -1e4f : 1e4f;
  }
  const FloatPair tg = b_->floats(targets);
  const size_t n = static_cast<size_t>(rows) * stride;
  std::vector<LossSums> got(2);
  for (int run = 0; run < 2; ++run) {
    const Pair s = b_->acts(scores, t());
    const Pair sums = b_->acts(std::vector<float>(8), DType::kF32);  // room for a LossSums
    const Pair counts = b_->acts(std::vector<float>(2 * 3 * K), DType::kF32);  // 3 K int64
    auto* sums_gpu = static_cast<LossSums*>(sums.gpu.data);
    auto* sums_cpu = static_cast<LossSums*>(sums.cpu.data);
    auto* counts_gpu = static_cast<int64_t*>(counts.gpu.data);
    auto* counts_cpu = static_cast<int64_t*>(counts.cpu.data);
    for (bool grad : {false, true}) {  // sums and counts accumulate
      b_->gpu->zlpr_loss(s.gpu, tg.gpu, rows, K, 0.25f, grad, sums_gpu, counts_gpu, stride);
      b_->cpu->zlpr_loss(s.cpu, tg.cpu, rows, K, 0.25f, grad, sums_cpu, counts_cpu, stride);
    }
    LossSums want;
    b_->gpu->device().copy_to_host(&got[run], sums_gpu, sizeof(LossSums));
    b_->cpu->device().copy_to_host(&want, sums_cpu, sizeof want);
    EXPECT_TRUE(std::isfinite(got[run].loss));
    EXPECT_NEAR(got[run].loss, want.loss, 1e-9 * std::abs(want.loss));
    EXPECT_NEAR(got[run].nll, want.nll, 1e-9 * std::abs(want.nll));
    EXPECT_EQ(got[run].tokens, want.tokens);
    EXPECT_EQ(got[run].correct, want.correct);
    std::vector<int64_t> counted_gpu(3 * K), counted_cpu(3 * K);
    b_->gpu->device().copy_to_host(counted_gpu.data(), counts_gpu, 3 * K * sizeof(int64_t));
    b_->cpu->device().copy_to_host(counted_cpu.data(), counts_cpu, 3 * K * sizeof(int64_t));
    EXPECT_EQ(counted_gpu, counted_cpu) << "zlpr label counts";
    compare(s, n, elementwise_tolerance(t()), "zlpr gradient in place (padding kept)");
  }
  EXPECT_EQ(got[0].loss, got[1].loss) << "zlpr_loss sums are not deterministic";
}

// The exact sum's conversions: bitwise the CPU's, rounding ties to even,
// over several accumulations (grid-stride loops and the integer count of
// elements out of range), then NaN everywhere once one is out of range.
TEST(CudaFixedPoint, BitwiseTheCpuReference) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU";
  Backends b;
  const size_t n = 300007;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  auto* fixed_gpu = static_cast<int64_t*>(b.gpu->device().allocate((n + 1) * sizeof(int64_t)));
  auto* fixed_cpu = static_cast<int64_t*>(b.cpu->device().allocate((n + 1) * sizeof(int64_t)));
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<float> g(n);
    for (float& x : g) x = normal(rng);
    g[5] = std::ldexp(3.0f, -41);  // a tie: 1.5 units, rounds to 2
    g[6] = std::ldexp(5.0f, -41);  // 2.5 units, rounds to 2
    if (pass == 2) g[n - 1] = std::ldexp(1.0f, 20);
    const FloatPair grads = b.floats(g);
    b.gpu->fixed_point_accumulate(fixed_gpu + 1, fixed_gpu, grads.gpu, n, 40, 20);
    b.cpu->fixed_point_accumulate(fixed_cpu + 1, fixed_cpu, grads.cpu, n, 40, 20);
    std::vector<int64_t> got(n + 1), want(n + 1);
    b.gpu->device().copy_to_host(got.data(), fixed_gpu, got.size() * sizeof(int64_t));
    b.cpu->device().copy_to_host(want.data(), fixed_cpu, want.size() * sizeof(int64_t));
    EXPECT_TRUE(got == want) << "pass " << pass;
    EXPECT_EQ(got[0], pass == 2 ? 1 : 0);
    const FloatPair out = b.floats(std::vector<float>(n, 7.0f));
    b.gpu->fixed_point_to_float(out.gpu, fixed_gpu + 1, fixed_gpu, n, 40);
    b.cpu->fixed_point_to_float(out.cpu, fixed_cpu + 1, fixed_cpu, n, 40);
    std::vector<float> out_gpu(n), out_cpu(n);
    b.gpu->device().copy_to_host(out_gpu.data(), out.gpu, n * sizeof(float));
    b.cpu->device().copy_to_host(out_cpu.data(), out.cpu, n * sizeof(float));
    EXPECT_EQ(std::memcmp(out_gpu.data(), out_cpu.data(), n * sizeof(float)), 0) << "pass " << pass;
    if (pass == 2) {
      EXPECT_TRUE(std::isnan(out_gpu[0]));
    }
  }
  b.gpu->device().release(fixed_gpu);
  b.cpu->device().release(fixed_cpu);
}

// The direct exact sum's ops (the default, exact=direct): the first
// accumulation written over a buffer of leftovers, rounding in place and
// the poison, bitwise the CPU's, with and without elements out of range.
TEST(CudaFixedPoint, DirectWaysBitwiseTheCpuReference) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU";
  Backends b;
  const size_t n = 300007;
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<int64_t> leftovers(n + 1, -777);
  leftovers[0] = 0;
  auto* fixed_gpu = static_cast<int64_t*>(b.gpu->device().allocate((n + 1) * sizeof(int64_t)));
  auto* fixed_cpu = static_cast<int64_t*>(b.cpu->device().allocate((n + 1) * sizeof(int64_t)));
  for (bool spoiled : {false, true}) {
    SCOPED_TRACE(spoiled ? "an element out of range" : "all in range");
    std::vector<float> g(n);
    for (float& x : g) x = normal(rng);
    g[5] = std::ldexp(3.0f, -41);  // ties: 1.5 and 2.5 units, both round to 2
    g[6] = std::ldexp(5.0f, -41);
    if (spoiled) g[n - 1] = std::nanf("");
    const size_t bytes = (n + 1) * sizeof(int64_t);
    b.gpu->device().copy_to_device(fixed_gpu, leftovers.data(), bytes);
    b.cpu->device().copy_to_device(fixed_cpu, leftovers.data(), bytes);
    const FloatPair grads = b.floats(g);
    b.gpu->fixed_point_accumulate(fixed_gpu + 1, fixed_gpu, grads.gpu, n, 40, 20, true);
    b.cpu->fixed_point_accumulate(fixed_cpu + 1, fixed_cpu, grads.cpu, n, 40, 20, true);
    std::vector<int64_t> got(n + 1), want(n + 1);
    b.gpu->device().copy_to_host(got.data(), fixed_gpu, bytes);
    b.cpu->device().copy_to_host(want.data(), fixed_cpu, bytes);
    EXPECT_TRUE(got == want) << "the first accumulation";
    EXPECT_EQ(got[0], spoiled ? 1 : 0);

    // Rounded in place, counted into a zeroed count, then poisoned.
    b.gpu->device().copy_to_device(fixed_gpu, leftovers.data(), sizeof(int64_t));
    b.cpu->device().copy_to_device(fixed_cpu, leftovers.data(), sizeof(int64_t));
    b.gpu->fixed_point_round(grads.gpu, fixed_gpu, n, 40, 20);
    b.cpu->fixed_point_round(grads.cpu, fixed_cpu, n, 40, 20);
    b.gpu->fixed_point_poison(grads.gpu, fixed_gpu, n);
    b.cpu->fixed_point_poison(grads.cpu, fixed_cpu, n);
    std::vector<float> out_gpu(n), out_cpu(n);
    b.gpu->device().copy_to_host(out_gpu.data(), grads.gpu, n * sizeof(float));
    b.cpu->device().copy_to_host(out_cpu.data(), grads.cpu, n * sizeof(float));
    EXPECT_EQ(std::memcmp(out_gpu.data(), out_cpu.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::isnan(out_gpu[0]), spoiled);
    if (!spoiled) {
      EXPECT_EQ(out_gpu[5], std::ldexp(2.0f, -40));
    }
  }
  b.gpu->device().release(fixed_gpu);
  b.cpu->device().release(fixed_cpu);
}

// ---- kernel switches -------------------------------------------------------

// The cross entropy's results and gradient under `loss` (set on `cuda`):
// the gradient's bytes, written over `stored` (with compute_grad; else the
// logits as they are left), and the loss sums.
std::pair<std::vector<unsigned char>, LossSums> cross_entropy_outcome(
    CudaOps& cuda, KernelSwitches::Loss loss, const std::vector<unsigned char>& stored, DType t,
    const int32_t* target_ids, int N, int V, int stride, bool compute_grad = true) {
  KernelSwitches switches;
  switches.loss = loss;
  cuda.set_kernel_switches(switches);
  Device& dev = cuda.device();
  void* x = dev.allocate(stored.size());
  auto* sum = static_cast<LossSums*>(dev.allocate(sizeof(LossSums)));
  dev.copy_to_device(x, stored.data(), stored.size());
  const LossSums zero{};
  dev.copy_to_device(sum, &zero, sizeof zero);
  cuda.cross_entropy(Act(x, t), target_ids, N, V, 0.1f, 0, 0.5f, compute_grad, sum, stride);
  std::pair<std::vector<unsigned char>, LossSums> got{std::vector<unsigned char>(stored.size()),
                                                      {}};
  dev.copy_to_host(got.first.data(), x, stored.size());
  dev.copy_to_host(&got.second, sum, sizeof(LossSums));
  dev.release(x);
  dev.release(sum);
  return got;
}

// The pipelined cross entropy (loss=pipelined) sums in its own order, so it
// agrees with the reread kernel to rounding, and gives the same bits twice:
// on GPT-2's vocabulary (two bf16 rows are 196 KiB of shared memory; fp32's
// do not fit and take the reread kernel), fewer rows than SMs and more (a
// block works through several, each copied while the one before is worked
// on), rows with a tail of fewer than a vector, and rows that start
// unaligned (the reread kernel); and without the gradient (eval), the same
// results, the logits left as they were.
TEST(CudaKernelSwitches, PipelinedCrossEntropyAgreesWithRereadAndRepeatsItsBits) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  Device& dev = ops->device();
  std::mt19937 rng(11);
  constexpr auto kReread = KernelSwitches::Loss::kReread;
  constexpr auto kPipelined = KernelSwitches::Loss::kPipelined;
  int optin = 0;
  cuda::check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
              "cudaDeviceGetAttribute");
  int expected_ran = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [N, V, stride] : {std::tuple{6, 50257, 50304}, std::tuple{300, 50257, 50304},
                                       std::tuple{300, 1003, 1008}, std::tuple{9, 517, 517}}) {
      SCOPED_TRACE(std::string(to_string(t)) + " N " + std::to_string(N) + " V " +
                   std::to_string(V));
      std::vector<float> logits(static_cast<size_t>(N) * stride);
      std::normal_distribution<float> normal(0.0f, 2.0f);
      for (float& x : logits) x = normal(rng);
      std::vector<int32_t> targets(N);
      for (int32_t& target : targets) target = std::uniform_int_distribution<int>(1, V - 1)(rng);
      targets[2] = 0;              // a pad row
      logits[targets[0]] = 20.0f;  // row 0's largest logit is its target (correct counts it)
      std::vector<unsigned char> stored(logits.size() * dtype_bytes(t));
      narrow(stored.data(), t, logits.data(), logits.size());
      auto* target_ids = static_cast<int32_t*>(dev.allocate(sizeof(int32_t) * N));
      dev.copy_to_device(target_ids, targets.data(), sizeof(int32_t) * N);
      // The pipelined kernel takes rows that start 16-byte aligned, two of
      // which fit in a block's shared memory (with 1 KiB of its own).
      const size_t e = dtype_bytes(t), span = (V * e + 15) / 16 * 16;
      if (stride * e % 16 == 0 && 2 * span + 1024 <= static_cast<size_t>(optin)) expected_ran += 3;
      const auto reread =
          cross_entropy_outcome(*cuda, kReread, stored, t, target_ids, N, V, stride);
      const auto pipelined =
          cross_entropy_outcome(*cuda, kPipelined, stored, t, target_ids, N, V, stride);
      const auto again =
          cross_entropy_outcome(*cuda, kPipelined, stored, t, target_ids, N, V, stride);
      const auto eval =
          cross_entropy_outcome(*cuda, kPipelined, stored, t, target_ids, N, V, stride, false);
      dev.release(target_ids);
      EXPECT_TRUE(eval.first == stored) << "eval wrote over the logits";
      EXPECT_EQ(eval.second.loss, pipelined.second.loss) << "eval's loss, against training's";
      EXPECT_EQ(eval.second.correct, pipelined.second.correct);
      EXPECT_TRUE(pipelined.first == again.first) << "the pipelined gradient changed";
      EXPECT_EQ(pipelined.second.loss, again.second.loss);
      std::vector<float> a(logits.size()), b(logits.size());
      widen(a.data(), pipelined.first.data(), t, a.size());
      widen(b.data(), reread.first.data(), t, b.size());
      // A unit of rounding of the stored gradient apart, at most.
      expect_close(a, b, t == DType::kF32 ? 1e-5 : 1e-2, "the gradient, pipelined against reread");
      EXPECT_NEAR(pipelined.second.loss, reread.second.loss, 1e-5 * std::abs(reread.second.loss));
      EXPECT_NEAR(pipelined.second.nll, reread.second.nll, 1e-5 * std::abs(reread.second.nll));
      EXPECT_EQ(pipelined.second.tokens, reread.second.tokens);
      EXPECT_EQ(pipelined.second.correct, reread.second.correct);
      EXPECT_GE(pipelined.second.correct, 1) << "row 0's largest logit is its target";
    }
  }
  // Three calls each of 3 precisions and 4 shapes; on an H100 or H200
  // fp32's GPT-2 rows and the unaligned rows took the reread kernel.
  EXPECT_EQ(cuda->candidate_counts().asked[CandidateCalls::kLoss], 36);
  EXPECT_EQ(cuda->candidate_counts().ran[CandidateCalls::kLoss], expected_ran);
  EXPECT_GT(expected_ran, 0);
}

// The vector AdamW (adamw=vector) updates each element as the ranged
// kernel does: the same parameters, moments and compute copy, bit for bit,
// on ranges that end inside a float4, and on buffers that are not 16-byte
// aligned (a sharded optimizer's slice), which the ranged kernel takes.
TEST(CudaKernelSwitches, VectorAdamWGivesTheRangedBits) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  Device& dev = ops->device();
  const size_t n = 100003;
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> start(4 * (n + 1));  // params, grads, m, v, one spare float each
  for (float& x : start) x = normal(rng);
  for (size_t i = 3 * (n + 1); i < start.size(); ++i) start[i] = std::abs(start[i]) * 0.01f;
  const std::vector<AdamWRange> ranges = {{0, 5, 0.0f}, {5, 70001, 0.1f}, {70001, n, 0.01f}};
  auto* device_ranges = static_cast<AdamWRange*>(dev.allocate(sizeof(AdamWRange) * 3));
  dev.copy_to_device(device_ranges, ranges.data(), sizeof(AdamWRange) * 3);
  auto* norm = static_cast<double*>(dev.allocate(sizeof(double)));
  const double norm_sq = 1e4;  // clipped
  dev.copy_to_device(norm, &norm_sq, sizeof norm_sq);
  AdamWConfig cfg;
  cfg.lr = 1e-3f, cfg.step = 5, cfg.max_norm = 1.0f;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (size_t shift : {0, 1}) {  // 1: every buffer 4 bytes past 16-byte alignment
      SCOPED_TRACE(std::string(to_string(t)) + (shift ? ", unaligned" : ", aligned"));
      std::vector<float> after[2];
      std::vector<unsigned char> copies[2];
      for (int vector = 0; vector < 2; ++vector) {
        KernelSwitches switches;
        switches.adamw = vector ? KernelSwitches::AdamW::kVector : KernelSwitches::AdamW::kRanged;
        cuda->set_kernel_switches(switches);
        auto* buffers = static_cast<float*>(dev.allocate(sizeof(float) * start.size()));
        dev.copy_to_device(buffers, start.data(), sizeof(float) * start.size());
        float* b[4];
        for (int k = 0; k < 4; ++k) b[k] = buffers + k * (n + 1) + shift;
        const size_t copy_bytes = n * dtype_bytes(t);
        void* compute = t == DType::kF32 ? nullptr : dev.allocate(copy_bytes);
        ops->adamw_update(b[0], b[1], b[2], b[3], compute ? Act(compute, t) : Act(), n,
                          device_ranges, 3, cfg, norm);
        after[vector].resize(start.size());
        dev.copy_to_host(after[vector].data(), buffers, sizeof(float) * start.size());
        copies[vector].resize(compute ? copy_bytes : 0);
        if (compute) dev.copy_to_host(copies[vector].data(), compute, copy_bytes);
        dev.release(buffers);
        dev.release(compute);
      }
      EXPECT_EQ(std::memcmp(after[0].data(), after[1].data(), sizeof(float) * start.size()), 0);
      EXPECT_TRUE(copies[0] == copies[1]) << "the compute copies differ";
      EXPECT_NE(after[0][shift + 7], start[shift + 7]) << "nothing was updated";
    }
  }
  // The vector kernel ran on the aligned buffers alone.
  EXPECT_EQ(cuda->candidate_counts().ran[CandidateCalls::kAdamW], 3);
  EXPECT_EQ(cuda->candidate_counts().asked[CandidateCalls::kAdamW], 6);
  dev.release(device_ranges);
  dev.release(norm);
}

// The device's digest (kernels/cuda/digest_kernels.cuh) adds what the CPU's
// sums (kernels/gemm_search.h), on sizes that leave a partial block and
// more units than the grid's threads.
TEST(CudaKernelSwitches, DeviceDigestAddsTheCpusDigest) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  Device& dev = ops->device();
  std::mt19937 rng(14);
  for (size_t bytes : {size_t{2}, size_t{1002}, size_t{6} << 20}) {
    std::vector<unsigned char> data(bytes);
    for (unsigned char& b : data) b = static_cast<unsigned char>(rng());
    void* device_data = dev.allocate(bytes);
    auto* total = static_cast<unsigned long long*>(dev.allocate(sizeof(unsigned long long)));
    dev.copy_to_device(device_data, data.data(), bytes);
    const unsigned long long start = 99;
    dev.copy_to_device(total, &start, sizeof start);
    cuda::add_bits_digest(device_data, bytes, gemm_search::kOutputStride, total, cuda->stream());
    unsigned long long got = 0;
    dev.copy_to_host(&got, total, sizeof got);
    EXPECT_EQ(got, start + gemm_search::bits_digest(data.data(), bytes, gemm_search::kOutputStride))
        << bytes << " bytes";
    dev.release(device_data);
    dev.release(total);
  }
}

// Bytes of n random values of type t.
std::vector<unsigned char> random_stored(std::mt19937& rng, DType t, size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  std::vector<unsigned char> stored(n * dtype_bytes(t));
  narrow(stored.data(), t, x.data(), n);
  return stored;
}

// A linear layer's forward and backward on `ops` from the given inputs, the
// GEMMs as a model runs them: the forward with its bias (and GELU, where
// gelu), the backward's dx (through a GELU, where gelu), dweight (+=) and
// the bias gradient. Returns every output's bytes, one after another.
struct LayerInputs {
  DType t;
  int N, IC, OC, stride;  // stride: the rows of out and dout (0: OC)
  bool gelu;
  std::vector<unsigned char> x, w, bias, dout, pre_in;  // pre_in: (N, IC), x's pre-activation
  std::vector<float> dweight;                           // its start (the backward adds to it)
};
LayerInputs random_layer(std::mt19937& rng, DType t, int N, int IC, int OC, int stride, bool gelu,
                         float dweight_start) {
  LayerInputs in{t, N, IC, OC, stride, gelu, {}, {}, {}, {}, {}, {}};
  in.x = random_stored(rng, t, size_t(N) * IC, 1.0f);
  in.w = random_stored(rng, t, size_t(OC) * IC, 0.05f);
  in.bias = random_stored(rng, t, OC, 0.1f);
  in.dout = random_stored(rng, t, size_t(N) * (stride ? stride : OC), 0.01f);
  in.pre_in = random_stored(rng, t, size_t(N) * IC, 1.0f);
  in.dweight.assign(size_t(OC) * IC, dweight_start);
  return in;
}
std::vector<unsigned char> layer_outputs(Ops& ops, const LayerInputs& in) {
  Device& dev = ops.device();
  std::vector<void*> owned;
  const auto upload = [&](const void* data, size_t bytes) {
    owned.push_back(dev.allocate(bytes));
    if (data) dev.copy_to_device(owned.back(), data, bytes);
    return owned.back();
  };
  const size_t e = dtype_bytes(in.t), ld = in.stride ? in.stride : in.OC;
  const size_t out_bytes = in.N * ld * e, pre_bytes = in.N * size_t(in.OC) * e,
               dx_bytes = in.N * size_t(in.IC) * e;
  const Act out(upload(nullptr, out_bytes), in.t), pre(upload(nullptr, pre_bytes), in.t),
      dx(upload(nullptr, dx_bytes), in.t);
  const Act x(upload(in.x.data(), in.x.size()), in.t), w(upload(in.w.data(), in.w.size()), in.t),
      bias(upload(in.bias.data(), in.bias.size()), in.t),
      dout(upload(in.dout.data(), in.dout.size()), in.t),
      pre_in(upload(in.pre_in.data(), in.pre_in.size()), in.t);
  auto* dweight = static_cast<float*>(upload(in.dweight.data(), sizeof(float) * in.dweight.size()));
  auto* dbias = static_cast<float*>(upload(nullptr, sizeof(float) * in.OC));
  dev.copy_to_device(dbias, std::vector<float>(in.OC).data(), sizeof(float) * in.OC);
  const FusedActivation forward_act =
      in.gelu ? FusedActivation{Activation::kGelu, pre} : FusedActivation{};
  const FusedActivation backward_act =
      in.gelu ? FusedActivation{Activation::kGelu, pre_in} : FusedActivation{};
  ops.matmul_forward(out, x, w, bias, in.N, in.IC, in.OC, forward_act, in.stride);
  ops.matmul_backward(dx, dweight, dbias, dout, x, w, in.N, in.IC, in.OC, false, backward_act,
                      in.stride);
  std::vector<unsigned char> bytes;
  const auto download = [&](const void* p, size_t n) {
    bytes.resize(bytes.size() + n);
    dev.copy_to_host(bytes.data() + bytes.size() - n, p, n);
  };
  // The rows' padding (stride > OC) is never written: only OC of each row.
  for (int r = 0; r < in.N; ++r)
    download(static_cast<const unsigned char*>(out.data) + r * ld * e, in.OC * e);
  if (in.gelu) download(pre.data, pre_bytes);
  download(dx.data, dx_bytes);
  download(dweight, sizeof(float) * in.dweight.size());
  download(dbias, sizeof(float) * in.OC);
  for (void* p : owned) dev.release(p);
  return bytes;
}

// The GEMMs' timed search (gemm=timed) in a deterministic run keeps the
// bits of cuBLASLt's first suggestion, bit for bit, on GPT-2's MLP widths
// (GELU and its gradient fused) and on an LM head's padded rows; with
// --deterministic false any suggestion may win, reported as such.
TEST(CudaKernelSwitches, TimedGemmSearchKeepsTheFirstChoicesBits) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  std::mt19937 rng(15);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [N, IC, OC, stride, gelu] :
         {std::tuple{4096, 768, 3072, 0, true}, std::tuple{2000, 768, 50257, 50304, false}}) {
      SCOPED_TRACE(std::string(to_string(t)) + ", OC " + std::to_string(OC));
      const LayerInputs in = random_layer(rng, t, N, IC, OC, stride, gelu, 0.25f);
      // Timed: a shape is searched on its second call, so twice.
      std::vector<unsigned char> got[3];
      for (int run = 0; run < 3; ++run) {
        KernelSwitches switches;
        switches.gemm = run ? KernelSwitches::Gemm::kTimed : KernelSwitches::Gemm::kHeuristic;
        if (run < 2) cuda->set_kernel_switches(switches);
        got[run] = layer_outputs(*ops, in);
      }
      EXPECT_TRUE(got[0] == got[1]) << "timed, before its search: other bits";
      EXPECT_TRUE(got[0] == got[2]) << "the timed search changed the bits";
    }
  }
  const std::string kept = ops->gemm_search();
  EXPECT_NE(kept.find("keeping the bits"), std::string::npos) << kept;
  std::printf("GEMM search, deterministic: %s\n", kept.c_str());

  // Any bits: the search runs (and the layer still computes, within rounding).
  ops->set_deterministic(false);
  const LayerInputs in = random_layer(rng, DType::kBF16, 4096, 768, 3072, 0, true, 0.0f);
  layer_outputs(*ops, in);  // the shapes' first calls: the second searches
  const std::vector<unsigned char> any = layer_outputs(*ops, in);
  EXPECT_NE(ops->gemm_search().find("any bits"), std::string::npos) << ops->gemm_search();
  KernelSwitches heuristic;
  cuda->set_kernel_switches(heuristic);
  const std::vector<unsigned char> first = layer_outputs(*ops, in);
  // The dweight block (fp32, after the bf16 outputs) within fp32 rounding of a long sum.
  const size_t e = 2, n = size_t(in.N) * in.OC * e * 2 + size_t(in.N) * in.IC * e;
  const size_t floats = size_t(in.OC) * in.IC;
  std::vector<float> a(floats), b(floats);
  std::memcpy(a.data(), any.data() + n, sizeof(float) * floats);
  std::memcpy(b.data(), first.data() + n, sizeof(float) * floats);
  expect_close(a, b, 1e-4, "dweight, any bits against the first choice");
  ops->set_deterministic(true);
}

// One matmul_backward of `in` (no activation) under `switches`: dx's
// bytes, then dW and the bias gradient (empty without one), each started
// from in.dweight and -0.5.
struct WeightGradients {
  std::vector<unsigned char> dx;
  std::vector<float> dweight, dbias;
};
WeightGradients weight_gradients(Ops& ops, const LayerInputs& in, const KernelSwitches& switches,
                                 bool with_bias) {
  dynamic_cast<CudaOps&>(ops).set_kernel_switches(switches);
  Device& dev = ops.device();
  const DType t = in.t;
  std::vector<void*> owned;
  const auto upload = [&](const void* data, size_t bytes) {
    owned.push_back(dev.allocate(bytes));
    dev.copy_to_device(owned.back(), data, bytes);
    return owned.back();
  };
  const size_t weights = size_t(in.OC) * in.IC;
  const Act x(upload(in.x.data(), in.x.size()), t), w(upload(in.w.data(), in.w.size()), t),
      dx(upload(in.x.data(), in.x.size()), t);
  // dout lands by a copy still queued on the device's stream when the op
  // starts, so that work on another stream that does not wait for it
  // reads what was there before (bytes of 0x7f: huge values).
  const void* staged_dout = upload(in.dout.data(), in.dout.size());
  const std::vector<unsigned char> before(in.dout.size(), 0x7f);
  const Act dout(upload(before.data(), before.size()), t);
  cuda::check(cudaMemcpyAsync(dout.data, staged_dout, in.dout.size(), cudaMemcpyDeviceToDevice,
                              dynamic_cast<CudaOps&>(ops).stream()),
              "cudaMemcpyAsync (dout)");
  auto* dw = static_cast<float*>(upload(in.dweight.data(), sizeof(float) * weights));
  const std::vector<float> bias_start(with_bias ? in.OC : 0, -0.5f);
  auto* db =
      with_bias ? static_cast<float*>(upload(bias_start.data(), sizeof(float) * in.OC)) : nullptr;
  ops.matmul_backward(dx, dw, db, dout, x, w, in.N, in.IC, in.OC, false);
  WeightGradients got{std::vector<unsigned char>(in.x.size()), std::vector<float>(weights),
                      std::vector<float>(bias_start.size())};
  dev.copy_to_host(got.dx.data(), dx.data, in.x.size());
  dev.copy_to_host(got.dweight.data(), dw, sizeof(float) * weights);
  if (with_bias) dev.copy_to_host(got.dbias.data(), db, sizeof(float) * in.OC);
  for (void* p : owned) dev.release(p);
  return got;
}

// The weight gradient split along the tokens (dweight=split) against the
// whole GEMM: dweight and dbias within fp32 rounding of another order of
// summing, dx untouched (the same bits), and the same bits run to run and
// under the timed search (gemm=timed, deterministic). Shapes that split
// into 4 parts; with a tail of 3 tokens (cuBLASLt's) and of 1 (a plain
// GEMM); wider; without a bias; and with a feature tail of 3, whose parts'
// bias gradients would lie 12 bytes apart unpadded.
TEST(CudaKernelSwitches, SplitWeightGradientAgreesWithTheWholeGemm) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  const auto& cuda = dynamic_cast<const CudaOps&>(*ops);
  std::mt19937 rng(16);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [N, IC, OC, bias] :
         {std::tuple{8192, 768, 768, true}, std::tuple{8197, 768, 768, true},
          std::tuple{8203, 768, 768, true}, std::tuple{8192, 768, 3072, true},
          std::tuple{8192, 768, 768, false}, std::tuple{8192, 768, 1283, true}}) {
      SCOPED_TRACE(std::string(to_string(t)) + ", N " + std::to_string(N) + ", OC " +
                   std::to_string(OC) + (bias ? "" : ", no bias"));
      const LayerInputs in = random_layer(rng, t, N, IC, OC, 0, false, 0.25f);
      const long long split_before = cuda.candidate_counts().ran[CandidateCalls::kDWeight];
      KernelSwitches whole, split, timed;
      split.dweight = timed.dweight = KernelSwitches::DWeight::kSplit;
      timed.gemm = KernelSwitches::Gemm::kTimed;
      // Timed: a shape is searched on its second call, so twice.
      const WeightGradients got[] = {
          weight_gradients(*ops, in, whole, bias), weight_gradients(*ops, in, split, bias),
          weight_gradients(*ops, in, split, bias), weight_gradients(*ops, in, timed, bias),
          weight_gradients(*ops, in, timed, bias)};
      EXPECT_TRUE(got[0].dx == got[1].dx) << "dx changed";
      // fp32 sums of 8,192 products in another order: an H200 differed by
      // 1.0e-5 of the largest (fp16, OC 1283); one token lost or doubled
      // (the tail of 1) errs by about 1e-3 of it, a token range by more.
      expect_close(got[1].dweight, got[0].dweight, 5e-5, "dweight, split against whole");
      expect_close(got[1].dbias, got[0].dbias, 5e-5, "dbias, split against whole");
      for (int run = 2; run < 5; ++run) {
        EXPECT_TRUE(got[1].dweight == got[run].dweight && got[1].dbias == got[run].dbias)
            << "split, run " << run << (run > 2 ? " (timed)" : "") << ": other bits";
      }
      EXPECT_NE(got[1].dweight[7], 0.25f) << "nothing was added";
      EXPECT_GE(cuda.candidate_counts().ran[CandidateCalls::kDWeight] - split_before, 4)
          << "the split did not run";
    }
  }
  std::printf("GEMM search over the split: %s; %s\n", ops->gemm_search().c_str(),
              ops->candidate_calls().c_str());
}

// The weight gradient on the side stream (dweight_stream=side), beside the
// dx GEMM, gives the main stream's bits: dx, dweight and dbias, alone and
// under dweight=split; on shapes with and without a bias, and on the LM
// head's odd vocabulary (an aligned part and a tail, each forked). dout
// arrives by a copy still queued on the device's stream (weight_gradients),
// so a side stream that did not wait for it would read other values, and
// the results are read back on the device's stream, which must wait for
// the side stream's.
TEST(CudaKernelSwitches, SideStreamWeightGradientGivesTheMainStreamsBits) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  const auto& cuda = dynamic_cast<const CudaOps&>(*ops);
  std::mt19937 rng(17);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [N, IC, OC, bias] :
         {std::tuple{8192, 768, 768, true}, std::tuple{8192, 768, 3072, true},
          std::tuple{8192, 3072, 768, false}, std::tuple{2048, 768, 50257, true}}) {
      SCOPED_TRACE(std::string(to_string(t)) + ", N " + std::to_string(N) + ", IC " +
                   std::to_string(IC) + ", OC " + std::to_string(OC));
      const LayerInputs in = random_layer(rng, t, N, IC, OC, 0, false, 0.25f);
      const long long before = cuda.candidate_counts().ran[CandidateCalls::kDWeightStream];
      for (const auto dweight :
           {KernelSwitches::DWeight::kWhole, KernelSwitches::DWeight::kSplit}) {
        KernelSwitches main, side;
        main.dweight = side.dweight = dweight;
        side.dweight_stream = KernelSwitches::DWeightStream::kSide;
        const WeightGradients want = weight_gradients(*ops, in, main, bias);
        const WeightGradients got = weight_gradients(*ops, in, side, bias);
        const char* which = dweight == KernelSwitches::DWeight::kSplit ? " (split)" : "";
        EXPECT_TRUE(got.dx == want.dx) << "dx" << which;
        EXPECT_TRUE(got.dweight == want.dweight) << "dweight" << which;
        EXPECT_TRUE(got.dbias == want.dbias) << "dbias" << which;
      }
      EXPECT_GE(cuda.candidate_counts().ran[CandidateCalls::kDWeightStream] - before, 2)
          << "the side stream was not used";
    }
  }
}

// A causal self-attention's forward and backward on a fused QKV tensor
// (host bytes of type t), on cuDNN: what each writes, read back.
struct AttentionWrites {
  std::vector<unsigned char> out, stats, dqkv;
};
AttentionWrites cudnn_attention_writes(Ops& ops, DType t, const std::vector<int32_t>& offsets,
                                       int H, int D, const std::vector<unsigned char>& qkv_bytes,
                                       const std::vector<unsigned char>& dout_bytes) {
  Device& dev = ops.device();
  std::vector<void*> owned;
  const auto upload = [&](const void* data, size_t bytes) {
    owned.push_back(dev.allocate(bytes));
    dev.copy_to_device(owned.back(), data, bytes);
    return owned.back();
  };
  const int B = static_cast<int>(offsets.size()) - 1, N = offsets.back(), C = H * D;
  int longest = 0;
  for (int b = 0; b < B; ++b) longest = std::max(longest, offsets[b + 1] - offsets[b]);
  const auto* device_offsets =
      static_cast<const int32_t*>(upload(offsets.data(), sizeof(int32_t) * offsets.size()));
  const Ragged rows{offsets.data(), device_offsets, B, N, longest};
  AttentionWrites got{std::vector<unsigned char>(dout_bytes.size()),
                      std::vector<unsigned char>(sizeof(float) * N * H),
                      std::vector<unsigned char>(qkv_bytes.size())};
  const Act qkv(upload(qkv_bytes.data(), qkv_bytes.size()), t),
      dout(upload(dout_bytes.data(), dout_bytes.size()), t),
      out(upload(got.out.data(), got.out.size()), t),
      dqkv(upload(got.dqkv.data(), got.dqkv.size()), t);
  auto* stats = static_cast<float*>(upload(got.stats.data(), got.stats.size()));
  const AttentionConfig cfg{H, D, true, AttentionScale::kStandard, 512.0f};
  ops.attention_forward(out, stats, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, rows, rows, cfg);
  ops.attention_backward(dqkv, dqkv + C, dqkv + 2 * C, dout, out, stats, qkv, 3 * C, qkv + C,
                         qkv + 2 * C, 3 * C, rows, rows, cfg);
  dev.copy_to_host(got.out.data(), out.data, got.out.size());
  dev.copy_to_host(got.stats.data(), stats, got.stats.size());
  dev.copy_to_host(got.dqkv.data(), dqkv.data, got.dqkv.size());
  for (void* p : owned) dev.release(p);
  return got;
}

// start + the column sums of dout (N, OC) in column_sums_kernels.cuh's
// order: each column's rows in order within blocks of kRowBlock, the
// blocks in order.
std::vector<float> ordered_column_sums(const LayerInputs& in, float start) {
  std::vector<float> dout(static_cast<size_t>(in.N) * in.OC), sums(in.OC, start);
  widen(dout.data(), in.dout.data(), in.t, dout.size());
  constexpr int kRows = 64;  // column_sums::kRowBlock (the header is device code)
  for (int c = 0; c < in.OC; ++c) {
    float total = 0.0f;
    for (int r0 = 0; r0 < in.N; r0 += kRows) {
      float block = 0.0f;
      for (int r = r0; r < std::min(in.N, r0 + kRows); ++r)
        block += dout[static_cast<size_t>(r) * in.OC + c];
      total += block;
    }
    sums[c] += total;
  }
  return sums;
}

// dbias=columns: the bias gradient from column sums of dout after the GEMM
// alone, not from cuBLASLt's BGRADB; each column's tokens in order, so the
// bits of that order on the host, on every call (and under dweight=split,
// whose parts then carry no bias gradient). dx is untouched; dW comes from
// the GEMM without its epilogue, which cuBLASLt may run another way (close,
// not equal).
TEST(CudaKernelSwitches, ColumnSumBiasGradientsAgreeWithTheEpilogues) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  const auto& cuda = dynamic_cast<const CudaOps&>(*ops);
  std::mt19937 rng(41);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    // 16-byte rows (768, 3072: vector loads), rows of 1283 (one element a
    // load, and a tail of 3 columns after the aligned 1280).
    for (const auto& [N, IC, OC] :
         {std::tuple{8192, 768, 768}, std::tuple{4097, 768, 3072}, std::tuple{8192, 768, 1283}}) {
      SCOPED_TRACE(std::string(to_string(t)) + ", N " + std::to_string(N) + ", OC " +
                   std::to_string(OC));
      const LayerInputs in = random_layer(rng, t, N, IC, OC, 0, false, 0.25f);
      const long long before = cuda.candidate_counts().ran[CandidateCalls::kDBias];
      KernelSwitches epilogue, columns, split;
      columns.dbias = split.dbias = KernelSwitches::DBias::kColumns;
      split.dweight = KernelSwitches::DWeight::kSplit;
      const WeightGradients got[] = {
          weight_gradients(*ops, in, epilogue, true), weight_gradients(*ops, in, columns, true),
          weight_gradients(*ops, in, columns, true), weight_gradients(*ops, in, split, true)};
      EXPECT_TRUE(got[1].dx == got[0].dx) << "dx changed";
      EXPECT_TRUE(got[1].dbias == ordered_column_sums(in, -0.5f))
          << "dbias: not the column sums' bits (did they run?)";
      expect_close(got[1].dbias, got[0].dbias, 5e-5, "dbias, columns against the epilogue");
      expect_close(got[1].dweight, got[0].dweight, 5e-5, "dweight, columns against the epilogue");
      EXPECT_TRUE(got[1].dbias == got[2].dbias && got[1].dweight == got[2].dweight)
          << "columns, a second call: other bits";
      EXPECT_TRUE(got[3].dbias == got[1].dbias) << "columns under dweight=split: other bits";
      EXPECT_NE(got[1].dbias[0], -0.5f) << "nothing was added";
      // 3 calls, each of OC 1283 as its aligned 1280 and its tail of 3.
      EXPECT_EQ(cuda.candidate_counts().ran[CandidateCalls::kDBias] - before, OC == 1283 ? 6 : 3)
          << "the column sums did not run";
    }
  }
}

// attention_plan=timed: each cuDNN graph's plans are timed on its second
// call, and from then on it runs the fastest of those that gave its first
// plan's bits, checked again on the first batch of other lengths and on
// longer ones. So a run gives the heuristic plan's bits at every call,
// before its search, at it, at the checks and after (bf16 and fp16, ragged
// lengths across cuDNN's tiles, three batches of one graph, forward and
// backward), and bench is told what was timed.
TEST(CudaKernelSwitches, TimedAttentionPlansGiveTheHeuristicPlansBits) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  if (!cuda::FlashAttention::built()) GTEST_SKIP() << "this build has no cuDNN frontend";
  std::mt19937 rng(29);
  const int H = 4, D = 64;
  const size_t C = H * D;
  // Three batches of one graph (8 slots, longest up to 512, 1024 rows):
  // the search's, one of other lengths, one longer than both.
  const std::vector<std::vector<int32_t>> batches = {offsets_of({300, 1, 129, 200, 64}),
                                                     offsets_of({290, 3, 129, 200, 64}),
                                                     offsets_of({512, 1, 129, 64, 64})};
  for (DType t : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(to_string(t));
    std::unique_ptr<Ops> heuristic = make_cuda_ops(0), timed = make_cuda_ops(0);
    auto& searching = dynamic_cast<CudaOps&>(*timed);
    KernelSwitches switches;
    dynamic_cast<CudaOps&>(*heuristic).set_kernel_switches(switches);
    switches.attention_plan = KernelSwitches::AttentionPlan::kTimed;
    searching.set_kernel_switches(switches);
    heuristic->set_attention_path(AttentionPath::kCudnn);
    timed->set_attention_path(AttentionPath::kCudnn);
    std::vector<std::vector<unsigned char>> qkv, dout;
    std::vector<AttentionWrites> want;
    for (const std::vector<int32_t>& offsets : batches) {
      const size_t N = static_cast<size_t>(offsets.back());
      qkv.push_back(random_stored(rng, t, N * 3 * C, 1.0f));
      dout.push_back(random_stored(rng, t, N * C, 0.1f));
      want.push_back(cudnn_attention_writes(*heuristic, t, offsets, H, D, qkv.back(), dout.back()));
    }
    // Calls 1 and 2 (the search) on the first batch, 3 (a check: other
    // lengths) on the second, 4 (a check: longer) and 5 on the third.
    const size_t batch_of_call[] = {0, 0, 0, 1, 2, 2};
    for (int call = 1; call <= 5; ++call) {
      const size_t b = batch_of_call[call];
      const AttentionWrites got =
          cudnn_attention_writes(*timed, t, batches[b], H, D, qkv[b], dout[b]);
      EXPECT_TRUE(got.out == want[b].out) << "out, call " << call;
      EXPECT_TRUE(got.stats == want[b].stats) << "stats, call " << call;
      EXPECT_TRUE(got.dqkv == want[b].dqkv) << "dq, dk, dv, call " << call;
    }
    const CandidateCalls calls = searching.candidate_counts();
    EXPECT_EQ(calls.asked[CandidateCalls::kAttentionPlan], 10) << "5 forward and 5 backward calls";
    EXPECT_EQ(calls.ran[CandidateCalls::kAttentionPlan], 8) << "each graph's calls from its search";
    EXPECT_EQ(heuristic->attention_search(), "") << "nothing searched without the switch";
    const std::string found = timed->attention_search();
    EXPECT_NE(found, "") << "the search told nothing";
    std::printf("cuDNN attention plan search (%s): %s\n", to_string(t), found.c_str());
  }
}

// Milliseconds per call of `call` on `ops` (a warm-up first), timed over
// `reps` calls between two synchronizations.
template <typename Call>
double milliseconds_per_call(Ops& ops, int reps, Call call) {
  call();
  ops.device().synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) call();
  ops.device().synchronize();
  const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
  return took.count() / reps;
}

// Device buffers of `bytes` each, zeroed, released with the timer.
class TimingBuffers {
 public:
  explicit TimingBuffers(Ops& ops) : ops_(ops) {}
  ~TimingBuffers() {
    for (void* p : owned_) ops_.device().release(p);
  }
  void* zeros(size_t bytes) {
    owned_.push_back(ops_.device().allocate(bytes));
    const std::vector<unsigned char> zero(bytes);
    ops_.device().copy_to_device(owned_.back(), zero.data(), bytes);
    return owned_.back();
  }
  // `elements` random bf16 values of about `scale`: one random block
  // repeated (the values, not their order, set what the kernels do).
  void* random_bf16(size_t elements, float scale) {
    constexpr size_t kBlock = size_t{1} << 20;
    std::mt19937 rng(7);
    const std::vector<unsigned char> block = random_stored(rng, DType::kBF16, kBlock, scale);
    auto* data = static_cast<unsigned char*>(zeros(2 * elements));
    for (size_t at = 0; at < elements; at += kBlock)
      ops_.device().copy_to_device(data + 2 * at, block.data(),
                                   2 * std::min(kBlock, elements - at));
    return data;
  }

 private:
  Ops& ops_;
  std::vector<void*> owned_;
};

// Layer norm on GPT-2 small's B32 rows (32768 x 768, bf16), block against
// warp kernels: time per call and effective bandwidth (the bytes the op
// must move once). A report, not an assertion.
TEST(KernelTiming, LayerNormBlockAgainstWarp) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  constexpr int N = 32768, C = 768;
  const DType t = DType::kBF16;
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  TimingBuffers buffers(*ops);
  const size_t row_bytes = static_cast<size_t>(N) * C * 2;
  const Act s(buffers.zeros(row_bytes), t), y(buffers.zeros(row_bytes), t),
      sum(buffers.zeros(row_bytes), t), out(buffers.zeros(row_bytes), t),
      dout(buffers.zeros(row_bytes), t), dx(buffers.zeros(row_bytes), t);
  const Act gamma(buffers.zeros(C * 2), t), beta(buffers.zeros(C * 2), t);
  auto* stats = static_cast<float*>(buffers.zeros(sizeof(float) * 2 * N));
  auto* grads = static_cast<float*>(buffers.zeros(sizeof(float) * 3 * C));
  double forward[2], backward[2], with_sums[2];
  for (int warp = 0; warp < 2; ++warp) {
    KernelSwitches switches;
    switches.layernorm = switches.layernorm_backward =
        warp ? KernelSwitches::LayerNorm::kWarp : KernelSwitches::LayerNorm::kBlock;
    cuda->set_kernel_switches(switches);
    forward[warp] = milliseconds_per_call(*ops, 50, [&] {
      ops->residual_layernorm_forward(sum, out, stats, stats + N, s, y, Dropout{}, gamma, beta, N,
                                      C, 1e-5f);
    });
    backward[warp] = milliseconds_per_call(*ops, 50, [&] {
      ops->layernorm_backward(dx, grads, grads + C, dout, sum, gamma, stats, stats + N, N, C, true);
    });
    // dbias_out=norm's: the sums of dx as it came, too
    with_sums[warp] = milliseconds_per_call(*ops, 50, [&] {
      ops->layernorm_backward(dx, grads, grads + C, dout, sum, gamma, stats, stats + N, N, C, true,
                              grads + 2 * C);
    });
  }
  // forward: s, y read, sum, out written; backward (+=): dout, x, dx read, dx written
  const double moved = 4.0 * row_bytes, tb = 1e-9;
  std::printf(
      "kernel timing: layer norm (bf16, N %d, C %d): residual + forward block %.4f ms "
      "(%.2f TB/s), warp %.4f ms (%.2f TB/s), warp/block %.2f; backward (+=) block %.4f ms "
      "(%.2f TB/s), warp %.4f ms (%.2f TB/s), warp/block %.2f (target 2.5 TB/s)\n",
      N, C, forward[0], moved / forward[0] * tb, forward[1], moved / forward[1] * tb,
      forward[1] / forward[0], backward[0], moved / backward[0] * tb, backward[1],
      moved / backward[1] * tb, backward[1] / backward[0]);
  std::printf(
      "kernel timing: layer norm backward (+=) with dx_sums (dbias_out=norm; bf16, N %d, C %d): "
      "block %.4f ms (%.2f TB/s, %.2f of without), warp %.4f ms (%.2f TB/s, %.2f of without)\n",
      N, C, with_sums[0], moved / with_sums[0] * tb, with_sums[0] / backward[0], with_sums[1],
      moved / with_sums[1] * tb, with_sums[1] / backward[1]);
}

// The fused cross entropy on GPT-2 small's B32 logits chunk (10672 x 50257
// rows 50304 apart, bf16, with the gradient), reread against pipelined:
// time per call, effective bandwidth (one read and one write of the
// logits) and the B32 step's rows at this rate against the 1.5 ms target.
// A report.
TEST(KernelTiming, CrossEntropyRereadAgainstPipelined) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  constexpr int N = 10672, V = 50257, stride = 50304;
  const DType t = DType::kBF16;
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  TimingBuffers buffers(*ops);
  const Act logits(buffers.random_bf16(static_cast<size_t>(N) * stride, 2.0f), t);
  std::vector<int32_t> targets(N);
  for (int r = 0; r < N; ++r) targets[r] = 1 + r % (V - 1);
  auto* target_ids = static_cast<int32_t*>(buffers.zeros(sizeof(int32_t) * N));
  ops->device().copy_to_device(target_ids, targets.data(), sizeof(int32_t) * N);
  auto* sums = static_cast<LossSums*>(buffers.zeros(sizeof(LossSums)));
  double ms[2];
  for (int pipelined = 0; pipelined < 2; ++pipelined) {
    KernelSwitches switches;
    switches.loss = pipelined ? KernelSwitches::Loss::kPipelined : KernelSwitches::Loss::kReread;
    cuda->set_kernel_switches(switches);
    // The gradient overwrites the logits: every call after the first reads
    // a gradient, which costs what logits cost.
    ms[pipelined] = milliseconds_per_call(*ops, 10, [&] {
      ops->cross_entropy(logits, target_ids, N, V, 0.1f, 0, 1.0f, true, sums, stride);
    });
  }
  EXPECT_EQ(cuda->candidate_counts().ran[CandidateCalls::kLoss],
            cuda->candidate_counts().asked[CandidateCalls::kLoss])
      << "the pipelined kernel did not run: the timing measured reread twice";
  const double moved = 2.0 * N * V * 2, tb = 1e-9;
  std::printf(
      "kernel timing: cross entropy (bf16, N %d, V %d, gradient in place): reread %.3f ms "
      "(%.2f TB/s), pipelined %.3f ms (%.2f TB/s), pipelined/reread %.2f; a B32 step's 3 calls: "
      "reread %.2f ms, pipelined %.2f ms (target 1.5 ms)\n",
      N, V, ms[0], moved / ms[0] * tb, ms[1], moved / ms[1] * tb, ms[1] / ms[0],
      ms[0] * 32768.0 / N, ms[1] * 32768.0 / N);
}

// AdamW over GPT-2 small's 124M parameters in ranges of kAdamWRangeFloats
// (bf16 compute copy), ranged against vector: time per call and effective
// bandwidth (params, grads, m, v read; params, m, v and the copy written).
// A report, not an assertion.
TEST(KernelTiming, AdamWRangedAgainstVector) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  constexpr size_t n = 124490065;
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  TimingBuffers buffers(*ops);
  float* b[4];
  for (float*& x : b) x = static_cast<float*>(buffers.zeros(sizeof(float) * n));
  const Act compute(buffers.zeros(2 * n), DType::kBF16);
  std::vector<AdamWRange> ranges;
  for (size_t begin = 0; begin < n; begin += kAdamWRangeFloats)
    ranges.push_back({begin, std::min(n, begin + kAdamWRangeFloats), 0.1f});
  auto* device_ranges = static_cast<AdamWRange*>(buffers.zeros(sizeof(AdamWRange) * ranges.size()));
  ops->device().copy_to_device(device_ranges, ranges.data(), sizeof(AdamWRange) * ranges.size());
  auto* norm = static_cast<double*>(buffers.zeros(sizeof(double)));
  AdamWConfig cfg;
  double ms[2];
  for (int vector = 0; vector < 2; ++vector) {
    KernelSwitches switches;
    switches.adamw = vector ? KernelSwitches::AdamW::kVector : KernelSwitches::AdamW::kRanged;
    cuda->set_kernel_switches(switches);
    ms[vector] = milliseconds_per_call(*ops, 10, [&] {
      ops->adamw_update(b[0], b[1], b[2], b[3], compute, n, device_ranges,
                        static_cast<int>(ranges.size()), cfg, norm);
    });
  }
  const double moved = (7.0 * 4 + 2) * n, tb = 1e-9;
  std::printf(
      "kernel timing: AdamW (%zu parameters, %zu ranges, bf16 copy): ranged %.3f ms (%.2f TB/s), "
      "vector %.3f ms (%.2f TB/s), vector/ranged %.2f\n",
      n, ranges.size(), ms[0], moved / ms[0] * tb, ms[1], moved / ms[1] * tb, ms[1] / ms[0]);
}

// GPT-2 small's B32 weight gradients with their bias gradients (each
// layer's dW shape; the LM head's chunk, dout rows 50304 apart) under
// dbias=epilogue and dbias=columns, the whole op: ms per call and per step
// (12 layers; the head's 32768 rows at the chunk's rate). A report.
TEST(KernelTiming, BiasGradientEpilogueAgainstColumns) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  TimingBuffers buffers(*ops);
  const DType t = DType::kBF16;
  struct Shape {
    const char* name;
    int N, IC, OC, ldd;
    double per_step;  // calls a B32 step makes, or their share of rows (the head's chunks)
  };
  const Shape shapes[] = {{"qkv", 32768, 768, 2304, 2304, 12},
                          {"projection", 32768, 768, 768, 768, 12},
                          {"fc1", 32768, 768, 3072, 3072, 12},
                          {"fc2", 32768, 3072, 768, 768, 12},
                          {"LM head chunk", 10672, 768, 50257, 50304, 32768.0 / 10672}};
  const Act x(buffers.zeros(size_t{32768} * 3072 * 2), t);
  const Act dout(buffers.zeros(size_t{10672} * 50304 * 2), t);
  auto* dw = static_cast<float*>(buffers.zeros(sizeof(float) * 50257 * 768));
  auto* db = static_cast<float*>(buffers.zeros(sizeof(float) * 50304));
  double step_ms[2] = {};
  std::printf("kernel timing: weight and bias gradients (bf16):");
  for (const Shape& s : shapes) {
    double ms[2];
    for (int columns = 0; columns < 2; ++columns) {
      KernelSwitches switches;
      if (columns) switches.dbias = KernelSwitches::DBias::kColumns;
      cuda->set_kernel_switches(switches);
      ms[columns] = milliseconds_per_call(*ops, 10, [&] {
        ops->matmul_backward(Act(), dw, db, dout, x, x, s.N, s.IC, s.OC, true, {}, s.ldd);
      });
      step_ms[columns] += ms[columns] * s.per_step;
    }
    std::printf(" %s epilogue %.3f ms, columns %.3f ms;", s.name, ms[0], ms[1]);
  }
  std::printf(" a B32 step: epilogue %.2f ms, columns %.2f ms (%.3f)\n", step_ms[0], step_ms[1],
              step_ms[1] / step_ms[0]);
}

// GPT-2 small's B32 attention batch (32 x 1024, 12 heads of 64, causal,
// bf16, fused QKV) in device buffers, for the cuDNN timings below.
class Gpt2AttentionBatch {
 public:
  static constexpr int B = 32, L = 1024, H = 12, D = 64, C = H * D, N = B * L;
  static constexpr double kForwardFlops = 4.0 * B * H * double(L) * L * D / 2.0;

  explicit Gpt2AttentionBatch(Ops& ops) : ops_(ops), buffers_(ops), offsets_(B + 1) {
    for (int b = 0; b <= B; ++b) offsets_[b] = b * L;
    auto* device_offsets = static_cast<int32_t*>(buffers_.zeros(sizeof(int32_t) * (B + 1)));
    ops.device().copy_to_device(device_offsets, offsets_.data(), sizeof(int32_t) * (B + 1));
    rows_ = Ragged{offsets_.data(), device_offsets, B, N, L};
    // Random q, k, v and dout: a plan whose bits differ shows on them.
    const DType t = DType::kBF16;
    std::mt19937 rng(31);
    const auto random_act = [&](size_t elements, float scale) {
      const std::vector<unsigned char> host = random_stored(rng, t, elements, scale);
      void* data = buffers_.zeros(host.size());
      ops.device().copy_to_device(data, host.data(), host.size());
      return Act(data, t);
    };
    qkv_ = random_act(static_cast<size_t>(N) * 3 * C, 1.0f);
    dout_ = random_act(static_cast<size_t>(N) * C, 0.1f);
    const size_t row_bytes = static_cast<size_t>(N) * C * 2;
    out_ = Act(buffers_.zeros(row_bytes), t);
    dqkv_ = Act(buffers_.zeros(3 * row_bytes), t);
    stats_ = static_cast<float*>(buffers_.zeros(sizeof(float) * N * H));
  }
  void forward() {
    ops_.attention_forward(out_, stats_, qkv_, 3 * C, qkv_ + C, qkv_ + 2 * C, 3 * C, rows_, rows_,
                           cfg_);
  }
  void backward() {
    ops_.attention_backward(dqkv_, dqkv_ + C, dqkv_ + 2 * C, dout_, out_, stats_, qkv_, 3 * C,
                            qkv_ + C, qkv_ + 2 * C, 3 * C, rows_, rows_, cfg_);
  }

 private:
  Ops& ops_;
  TimingBuffers buffers_;
  std::vector<int32_t> offsets_;  // host (B+1)
  Ragged rows_;
  Act qkv_, out_, dout_, dqkv_;
  float* stats_ = nullptr;
  const AttentionConfig cfg_{H, D, true, AttentionScale::kStandard, 512.0f};
};

// cuDNN's attention on GPT-2 small's B32 batch, forward and backward timed
// apart, in the ragged layout every batch takes and the dense one
// attention=dense gives a batch of equal lengths, with the deterministic
// backward and without: TFLOP/s against the targets (forward 350,
// backward 280). A report.
TEST(KernelTiming, CudnnAttentionLayoutsOnGpt2B32) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  if (!cuda::FlashAttention::built()) GTEST_SKIP() << "this build has no cuDNN frontend";
  using Batch = Gpt2AttentionBatch;
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  auto* cuda = dynamic_cast<CudaOps*>(ops.get());
  ops->set_attention_path(AttentionPath::kCudnn);
  Batch batch(*ops);
  const double tera = 1e-9;
  std::printf("kernel timing: cuDNN attention (bf16, B %d, L %d, %d heads of %d, causal):",
              Batch::B, Batch::L, Batch::H, Batch::D);
  for (const bool dense : {false, true}) try {
      KernelSwitches switches;
      switches.attention =
          dense ? KernelSwitches::Attention::kDense : KernelSwitches::Attention::kRagged;
      cuda->set_kernel_switches(switches);
      const long long ran = cuda->candidate_counts().ran[CandidateCalls::kAttention];
      const double forward_ms = milliseconds_per_call(*ops, 10, [&] { batch.forward(); });
      if (dense && cuda->candidate_counts().ran[CandidateCalls::kAttention] == ran) {
        std::printf("; dense did not run (cuDNN refused it: the ragged layout ran)");
        continue;
      }
      std::printf("%s %s forward %.3f ms (%.0f TFLOP/s, target 350)", dense ? ";" : "",
                  dense ? "dense" : "ragged", forward_ms, Batch::kForwardFlops / forward_ms * tera);
      for (const bool deterministic : {true, false}) {
        ops->set_deterministic(deterministic);
        const long long ran_before = cuda->candidate_counts().ran[CandidateCalls::kAttention];
        const double backward_ms = milliseconds_per_call(*ops, 10, [&] { batch.backward(); });
        const bool refused =
            dense && cuda->candidate_counts().ran[CandidateCalls::kAttention] == ran_before;
        std::printf(", backward%s %.3f ms (%.0f TFLOP/s, target 280)%s",
                    deterministic ? "" : " (--deterministic false)", backward_ms,
                    2.5 * Batch::kForwardFlops / backward_ms * tera,
                    refused ? " (dense refused: the ragged layout ran)" : "");
      }
      ops->set_deterministic(true);
    } catch (const std::exception& e) {  // cuDNN refused a case: a figure missing, said so
      std::printf("; %s did not run: %s", dense ? "dense" : "ragged", e.what());
      ops->set_deterministic(true);
    }
  std::printf("\n");
}

// The same batch in the ragged layout, on the heuristic's plan and on the
// fastest of the plans that keep its bits (attention_plan=timed; each
// graph searched on its second call, before the timed calls): a report.
TEST(KernelTiming, CudnnAttentionPlansOnGpt2B32) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  if (!cuda::FlashAttention::built()) GTEST_SKIP() << "this build has no cuDNN frontend";
  using Batch = Gpt2AttentionBatch;
  const double tera = 1e-9;
  std::printf("kernel timing: cuDNN attention plans (bf16, B %d, L %d, %d heads of %d, causal):",
              Batch::B, Batch::L, Batch::H, Batch::D);
  double ms[2][2] = {};  // [timed][backward]
  std::string found;
  for (const bool timed : {false, true}) try {
      std::unique_ptr<Ops> ops = make_cuda_ops(0);
      KernelSwitches switches;
      if (timed) switches.attention_plan = KernelSwitches::AttentionPlan::kTimed;
      dynamic_cast<CudaOps&>(*ops).set_kernel_switches(switches);
      ops->set_attention_path(AttentionPath::kCudnn);
      Batch batch(*ops);
      batch.forward();  // the first call; milliseconds_per_call's warm-up is the second, the search
      batch.backward();
      ms[timed][0] = milliseconds_per_call(*ops, 10, [&] { batch.forward(); });
      ms[timed][1] = milliseconds_per_call(*ops, 10, [&] { batch.backward(); });
      if (timed) found = ops->attention_search();
      std::printf("%s %s forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s)",
                  timed ? ";" : "", timed ? "timed" : "heuristic", ms[timed][0],
                  Batch::kForwardFlops / ms[timed][0] * tera, ms[timed][1],
                  2.5 * Batch::kForwardFlops / ms[timed][1] * tera);
    } catch (const std::exception& e) {  // cuDNN refused a case: a figure missing, said so
      std::printf("; %s did not run: %s", timed ? "timed" : "heuristic", e.what());
    }
  if (ms[0][0] > 0 && ms[1][0] > 0) {
    std::printf("; timed/heuristic forward %.3f, backward %.3f", ms[1][0] / ms[0][0],
                ms[1][1] / ms[0][1]);
  }
  std::printf("; search: %s\n", found.empty() ? "none" : found.c_str());
}

// GPT-2 small's B32 GEMMs as matmul.cu hands them to cuBLASLt (random bf16
// operands, cuBLASLt's first suggestion), each under the epilogue it takes
// and the others it could: what a fused epilogue costs over the GEMM
// alone, so that a GPU run tells whether taking the bias gradients or
// GELU out of cuBLASLt (or GELU's gradient together with fc1's bias
// gradient, DGELU_BGRAD) could pay. A report.
class Gpt2Gemms {
 public:
  // kVocab is GPT-2's vocabulary, as the model runs it (rows of logits
  // kLogitsStride apart); kLogitsStride also stands for that vocabulary
  // padded to a multiple of 64, to tell what its odd size costs the GEMMs.
  static constexpr int N = 32768, C = 768, F = 3072, kHeadRows = 10672, kVocab = 50257,
                       kLogitsStride = 50304;

  explicit Gpt2Gemms(CudaOps& cuda) : cuda_(cuda), buffers_(cuda), gemm_(cuda, false) {
    const size_t logits = static_cast<size_t>(kHeadRows) * kLogitsStride;
    const size_t widest = static_cast<size_t>(N) * F;
    a_ = random_buffer(std::max(widest, static_cast<size_t>(kLogitsStride) * C));
    b_ = random_buffer(logits);
    aux_ = random_buffer(widest);
    bias_ = random_buffer(kLogitsStride);
    d_ = buffers_.zeros(2 * logits);
    bias_grad_ = buffers_.zeros(sizeof(float) * kLogitsStride);
  }

  // out^T (OC x rows) = W^T x^T, matmul_forward's call.
  cuda::GemmCall forward(int rows, int IC, int OC, int ldo) const {
    cuda::GemmCall c = common();
    c.trans_a = true;
    c.m = OC, c.n = rows, c.k = IC;
    c.lda = IC, c.ldb = IC, c.ldd = ldo;
    c.aux_ld = OC;
    return c;
  }
  // dx^T (IC x rows) = W dout^T, input_gradient's call.
  cuda::GemmCall input_gradient(int rows, int IC, int OC, int ldd) const {
    cuda::GemmCall c = common();
    c.m = IC, c.n = rows, c.k = OC;
    c.lda = IC, c.ldb = ldd, c.ldd = IC;
    c.aux_ld = IC;
    return c;
  }
  // dW^T (IC x OC) += x^T dout in fp32, weight_gradient's call.
  cuda::GemmCall weight_gradient(int rows, int IC, int OC, int ldd) const {
    cuda::GemmCall c = common();
    c.trans_b = true;
    c.m = IC, c.n = OC, c.k = rows;
    c.lda = IC, c.ldb = ldd, c.ldd = IC;
    c.d_type = CUDA_R_32F;
    c.beta = 1.0f;
    return c;
  }

  // "GELU_AUX_BIAS 0.312 ms (620 TFLOP/s)": the call under `epilogue`
  // (with its bias, or its gradient, in fp32 where fp32_bias), or
  // "BIAS refused" where cuBLASLt has no algorithm for it.
  std::string time(cuda::GemmCall c, cublasLtEpilogue_t epilogue, bool fp32_bias = false) {
    c.epilogue = epilogue;
    c.fp32_bias = fp32_bias;
    const bool grad =
        epilogue == CUBLASLT_EPILOGUE_BGRADB || epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT && epilogue != CUBLASLT_EPILOGUE_DGELU &&
        epilogue != CUBLASLT_EPILOGUE_GELU_AUX)
      c.bias = grad ? bias_grad_ : bias_;
    const bool aux = epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                     epilogue == CUBLASLT_EPILOGUE_DGELU ||
                     epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    if (!aux) c.aux = nullptr, c.aux_ld = 0;
    std::string name = epilogue == CUBLASLT_EPILOGUE_DEFAULT ? "none" : epilogue_label(epilogue);
    if (fp32_bias) name += " (fp32 bias)";
    bool ran = true;
    const double ms = milliseconds_per_call(cuda_, 20, [&] { ran = ran && gemm_.fused(c); });
    if (!ran) return name + " refused";
    char text[160];
    std::snprintf(text, sizeof text, "%s %.3f ms (%.0f TFLOP/s)", name.c_str(), ms,
                  2.0 * c.m * double(c.n) * c.k / ms * 1e-9);
    return text;
  }

 private:
  static const char* epilogue_label(cublasLtEpilogue_t e) {
    switch (e) {
      case CUBLASLT_EPILOGUE_BIAS:
        return "BIAS";
      case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        return "GELU_AUX_BIAS";
      case CUBLASLT_EPILOGUE_DGELU:
        return "DGELU";
      case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        return "DGELU_BGRAD";
      case CUBLASLT_EPILOGUE_BGRADB:
        return "BGRADB";
      default:
        return "other";
    }
  }
  cuda::GemmCall common() const {
    cuda::GemmCall c;
    c.a = a_, c.b = b_, c.d = d_, c.aux = aux_;
    c.ab_type = c.d_type = CUDA_R_16BF;
    return c;
  }
  // A bf16 buffer of `elements` random values (the tensor cores' power
  // depends on the values).
  void* random_buffer(size_t elements) { return buffers_.random_bf16(elements, 1.0f); }

  CudaOps& cuda_;
  TimingBuffers buffers_;
  cuda::Gemm gemm_;
  void* a_ = nullptr;  // W or x
  void* b_ = nullptr;  // x or dout, up to a logits chunk
  void* d_ = nullptr;  // out, dx or dW
  void* aux_ = nullptr;
  void* bias_ = nullptr;
  void* bias_grad_ = nullptr;  // fp32
};

TEST(KernelTiming, CublasLtEpiloguesOnGpt2B32) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  using G = Gpt2Gemms;
  std::unique_ptr<Ops> ops = make_cuda_ops(0);
  G gemms(dynamic_cast<CudaOps&>(*ops));
  const auto report = [](const char* name, const cuda::GemmCall& c,
                         const std::vector<std::string>& timings) {
    std::printf("kernel timing: GEMM %s (bf16, m %d n %d k %d):", name, c.m, c.n, c.k);
    const char* separator = " ";
    for (const std::string& t : timings)
      std::printf("%s%s", separator, t.c_str()), separator = ", ";
    std::printf("\n");
  };
  const cublasLtEpilogue_t kNone = CUBLASLT_EPILOGUE_DEFAULT, kBias = CUBLASLT_EPILOGUE_BIAS,
                           kBiasGrad = CUBLASLT_EPILOGUE_BGRADB;
  struct Linear {
    const char* name;
    int rows, IC, OC, stride;
  };
  const Linear layers[] = {
      {"qkv", G::N, G::C, 3 * G::C, 3 * G::C},
      {"attention projection", G::N, G::C, G::C, G::C},
      {"fc1", G::N, G::C, G::F, G::F},
      {"fc2", G::N, G::F, G::C, G::C},
      {"LM head chunk", G::kHeadRows, G::C, G::kVocab, G::kLogitsStride},
      {"LM head chunk, vocabulary padded", G::kHeadRows, G::C, G::kLogitsStride, G::kLogitsStride}};
  for (const Linear& l : layers) {
    const std::string name(l.name);
    const cuda::GemmCall f = gemms.forward(l.rows, l.IC, l.OC, l.stride);
    if (name == "fc1")
      report("fc1 forward", f,
             {gemms.time(f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS), gemms.time(f, kBias),
              gemms.time(f, kNone)});
    else
      report((name + " forward").c_str(), f, {gemms.time(f, kBias), gemms.time(f, kNone)});
    const cuda::GemmCall dx = gemms.input_gradient(l.rows, l.IC, l.OC, l.stride);
    if (name == "fc2")
      report("fc2 dx", dx,
             {gemms.time(dx, CUBLASLT_EPILOGUE_DGELU), gemms.time(dx, kNone),
              gemms.time(dx, CUBLASLT_EPILOGUE_DGELU_BGRAD),
              gemms.time(dx, CUBLASLT_EPILOGUE_DGELU_BGRAD, true)});
    else
      report((name + " dx").c_str(), dx, {gemms.time(dx, kNone)});
    const cuda::GemmCall dw = gemms.weight_gradient(l.rows, l.IC, l.OC, l.stride);
    report((name + " dW").c_str(), dw, {gemms.time(dw, kBiasGrad), gemms.time(dw, kNone)});
  }
}

// ---- attention timing -----------------------------------------------------

// Milliseconds of one forward and backward of causal self-attention on the
// GPU-2 shape (256 sequences of 128, 12 heads of 64, bf16) on each kernel:
// a report, not an assertion (timings belong to the machine).
class AttentionTimer {
 public:
  static constexpr int B = 256, L = 128, H = 12, D = 64, C = H * D, N = B * L;

  AttentionTimer() : ops_(make_cuda_ops(0)), cuda_(dynamic_cast<CudaOps*>(ops_.get())) {
    Device& dev = ops_->device();
    std::vector<int32_t> offsets(B + 1);
    for (int b = 0; b <= B; ++b) offsets[b] = b * L;
    host_offsets_ = offsets;
    offsets_ = dev.allocate(sizeof(int32_t) * (B + 1));
    dev.copy_to_device(offsets_, offsets.data(), sizeof(int32_t) * (B + 1));
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t n : {size_t{3} * C, size_t{C}, size_t{C}, size_t{3} * C}) {  // qkv, out, dout, dqkv
      std::vector<float> values(static_cast<size_t>(N) * n);
      for (float& x : values) x = normal(rng);
      std::vector<unsigned char> stored(values.size() * 2);
      narrow(stored.data(), DType::kBF16, values.data(), values.size());
      buffers_.push_back(dev.allocate(stored.size()));
      dev.copy_to_device(buffers_.back(), stored.data(), stored.size());
    }
    stats_ = static_cast<float*>(dev.allocate(sizeof(float) * N * H));
  }
  ~AttentionTimer() {
    for (void* p : buffers_) ops_->device().release(p);
    ops_->device().release(offsets_);
    ops_->device().release(stats_);
  }

  // Milliseconds per forward + backward on `path` (plain: on `plain`), or a
  // negative number when the path cannot run here or refuses the case.
  double milliseconds(AttentionPath path, PlainAttention plain, int reps) {
    try {
      ops_->set_attention_path(path);
      cuda_->set_plain_attention(plain);
      step();  // warm-up: plans, scratch
      ops_->device().synchronize();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) step();
      ops_->device().synchronize();
      const std::chrono::duration<double, std::milli> took =
          std::chrono::steady_clock::now() - start;
      return took.count() / reps;
    } catch (const std::exception& e) {
      std::printf("note: --attention %s did not run: %s\n", to_string(path), e.what());
      return -1.0;
    }
  }

  // Forward and backward FLOPs counted as FlashAttention-2 counts them (the
  // causal half of 4 B H L^2 D, backward 2.5 times forward).
  static double flops() { return 3.5 * 4.0 * B * H * double(L) * L * D / 2.0; }

 private:
  void step() {
    const Ragged rows{host_offsets_.data(), static_cast<int32_t*>(offsets_), B, N, L};
    const AttentionConfig cfg{H, D, true, AttentionScale::kStandard, 512.0f};
    const Act qkv(buffers_[0], DType::kBF16), out(buffers_[1], DType::kBF16),
        dout(buffers_[2], DType::kBF16), dqkv(buffers_[3], DType::kBF16);
    ops_->attention_forward(out, stats_, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, rows, rows, cfg);
    ops_->attention_backward(dqkv, dqkv + C, dqkv + 2 * C, dout, out, stats_, qkv, 3 * C, qkv + C,
                             qkv + 2 * C, 3 * C, rows, rows, cfg);
  }

  std::unique_ptr<Ops> ops_;
  CudaOps* cuda_;
  std::vector<int32_t> host_offsets_;
  void* offsets_ = nullptr;
  std::vector<void*> buffers_;
  float* stats_ = nullptr;
};

TEST(AttentionTiming, NaiveFlashAndCudnnOnGpt2Shape) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU visible";
  AttentionTimer timer;
  const double naive = timer.milliseconds(AttentionPath::kPlain, PlainAttention::kNaive, 3);
  const double flash = timer.milliseconds(AttentionPath::kPlain, PlainAttention::kFlash, 10);
  const double cudnn = timer.milliseconds(AttentionPath::kCudnn, PlainAttention::kFlash, 10);
  const double tflops = AttentionTimer::flops() / (flash * 1e-3) / 1e12;
  std::printf(
      "attention timing: B=256 L=128 H=12 D=64 causal bf16, forward+backward: naive %.3f ms, "
      "flash %.3f ms (%.1f TFLOP/s), ",
      naive, flash, tflops);
  if (cudnn > 0)
    std::printf("cuDNN %.3f ms, flash/cuDNN %.2f, naive/flash %.1f\n", cudnn, flash / cudnn,
                naive / flash);
  else
    std::printf("cuDNN not available, naive/flash %.1f\n", naive / flash);
}

// ---- whole models ---------------------------------------------------------

class CudaModelTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no GPU visible: the CUDA model tests are skipped";
  }
};

INSTANTIATE_TEST_SUITE_P(Precisions, CudaModelTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16), dtype_name);

// One training step (two micro-batches) of the same model and batch on both
// backends: the loss sums and every parameter gradient agree. In fp32 the
// GPU's gradients match the CPU's to 1e-4 of each tensor's largest. bf16 and
// fp16 round every activation, and a unit of rounding can flip a ReLU or a
// dropout-scaled element, so there the yardstick is the CPU's own error in
// that precision: measured against the CPU in fp32, the GPU may be at most
// 3 times as far off as the CPU is (plus 1e-3 of the largest gradient), a
// bound that an error of the op itself (a wrong index, a missing term)
// exceeds by orders of magnitude.
std::vector<float> step_gradients(Ops& ops, const ModelConfig& m, DType t, const Batch& a,
                                  const Batch& b, LossSums* sums) {
  Model model(ops, m, ModelCapacity{400, m.max_len}, t);
  model.init_parameters(3);
  const float scale = 1.0f / static_cast<float>(a.target_tokens(0) + b.target_tokens(0));
  model.parameters().zero_grads();
  model.forward_backward(a, 0.1f, scale, PassId{1, 1, 0});
  model.forward_backward(b, 0.1f, scale, PassId{1, 1, 1});
  *sums = model.take_train_sums();
  std::vector<float> grads(model.parameters().count());
  ops.device().copy_to_host(grads.data(), model.parameters().grads(), grads.size() * sizeof(float));
  return grads;
}

// Under `switches` (MPIFORMER_KERNELS's syntax; "": as the environment
// says). Returns how often the GPU's newer paths ran.
CandidateCalls check_model(ModelConfig m, DType t, const char* switches = "") {
  m.d_model = 128, m.heads = 2, m.d_ff = 256, m.max_len = 160, m.vocab = 200;
  CudaOps* cuda = nullptr;
  std::unique_ptr<Ops> gpu = cuda_backend(&cuda), cpu = make_cpu_ops(2);
  if (*switches) cuda->set_kernel_switches(parse_kernel_switches(switches));
  const std::vector<int> lengths = {3, 150, 64, 1, 77};
  const std::vector<int> src_lengths = {10, 120, 64, 5, 1};
  const Batch a = testing::random_batch(m, lengths, src_lengths, 5);
  const Batch b = testing::random_batch(m, {40, 9}, {12, 33}, 6);
  LossSums got, want, exact;
  const std::vector<float> grads_gpu = step_gradients(*gpu, m, t, a, b, &got);
  const std::vector<float> grads_cpu = step_gradients(*cpu, m, t, a, b, &want);
  const std::vector<float> grads_fp32 =
      t == DType::kF32 ? grads_cpu : step_gradients(*cpu, m, DType::kF32, a, b, &exact);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_NEAR(got.loss, want.loss, (t == DType::kF32 ? 1e-5 : 1e-2) * want.loss)
      << to_string(m.kind);
  Model shapes(*cpu, m, ModelCapacity{1, m.max_len}, DType::kF32);
  for (const ParamInfo& info : shapes.parameters().info()) {
    double largest = 0.0, gpu_off = 0.0, cpu_off = 0.0;
    for (size_t i = info.offset; i < info.offset + info.size; ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(grads_fp32[i])));
      gpu_off = std::max(gpu_off, std::abs(static_cast<double>(grads_gpu[i]) - grads_fp32[i]));
      cpu_off = std::max(cpu_off, std::abs(static_cast<double>(grads_cpu[i]) - grads_fp32[i]));
    }
    // Gradients that are zero up to rounding (the key bias: softmax ignores it).
    if (largest < 1e-6) continue;
    const std::string what = std::string(to_string(m.kind)) + " " + info.name;
    if (t == DType::kF32) {
      EXPECT_LE(gpu_off, 1e-4 * largest) << what;
    } else {
      EXPECT_LE(gpu_off, 3.0 * cpu_off + 1e-3 * largest)
          << what << ": the CPU in " << to_string(t) << " is " << cpu_off / largest
          << " of the largest gradient off fp32";
    }
  }
  return cuda->candidate_counts();
}

TEST_P(CudaModelTest, LmStep) {
  check_model(testing::tiny(ModelKind::kLm), GetParam());
}

// The bias gradients moved out of the weight gradients' GEMMs: the output
// projections' from the layer norm backward after them (dbias_out=norm),
// the MLPs' first layers' from the second layers' dx GEMMs
// (dbias_in=dgelu): the step against the CPU as LmStep, each asked for on
// every sub-layer it takes (lm of 2 layers, 2 micro-batches), and whether
// DGELU_BGRAD ran (where cuBLASLt has no algorithm, a column pass sums).
TEST_P(CudaModelTest, LmStepWithTheBiasGradientsMoved) {
  const CandidateCalls calls =
      check_model(testing::tiny(ModelKind::kLm), GetParam(), "dbias_out=norm,dbias_in=dgelu");
  EXPECT_EQ(calls.asked[CandidateCalls::kDBiasIn], 2 * 2);
  EXPECT_EQ(calls.ran[CandidateCalls::kDBiasOut], 2 * 2 * 2);
  std::printf("%s (%s)\n", describe(calls).c_str(), to_string(GetParam()));
}

TEST_P(CudaModelTest, Seq2seqStepLogLengthPostNorm) {
  ModelConfig m = testing::tiny(ModelKind::kSeq2seq);
  m.attention_scale = AttentionScale::kLogLength;
  m.pre_norm = false;
  m.positions = PositionKind::kSinusoidal;
  check_model(m, GetParam());
}

TEST_P(CudaModelTest, MlmStepWithDropout) {
  ModelConfig m = testing::tiny(ModelKind::kMlm);
  m.dropout = 0.1f;
  m.activation = Activation::kRelu;
  check_model(m, GetParam());
}

// The recompute tests' model of `kind`: 3 layers of d-model 128 with
// dropout, and its batch of ragged lengths up to 150.
ModelConfig recompute_model(ModelKind kind) {
  ModelConfig m = testing::tiny(kind);
  m.d_model = 128, m.heads = 2, m.d_ff = 256, m.max_len = 160, m.vocab = 200;
  m.layers = m.enc_layers = m.dec_layers = 3;
  m.dropout = 0.1f;
  return m;
}

// The parameters' gradients after one forward and backward of `batch` on
// the GPU under `recompute`, and what each parameter is.
struct GpuGradients {
  std::vector<float> grads;
  std::vector<ParamInfo> info;
};
GpuGradients gpu_gradients(Ops& gpu, const ModelConfig& m, const Batch& batch, Recompute recompute,
                           DType compute) {
  Model model(gpu, m, ModelCapacity{400, m.max_len, 0, recompute}, compute);
  model.init_parameters(3);
  model.parameters().zero_grads();
  model.forward_backward(batch, 0.1f, 1e-3f, PassId{1, 1, 0});
  GpuGradients g{std::vector<float>(model.parameters().count()), model.parameters().info()};
  gpu.device().copy_to_host(g.grads.data(), model.parameters().grads(),
                            g.grads.size() * sizeof(float));
  return g;
}

// `check(none, other)` on the gradients of --recompute none and `mode` on
// the GPU, for an lm and a seq2seq model, on the defaults, on every newer
// path and on the older ones (each layer norm forward must also normalise
// the stored sum as its fused residual add did).
template <typename Check>
void compare_recompute(Recompute mode, DType compute, Check check) {
  CudaOps* cuda = nullptr;
  std::unique_ptr<Ops> gpu = cuda_backend(&cuda);
  for (const char* switches : {"", "candidates", kOlderPaths}) {
    cuda->set_kernel_switches(parse_kernel_switches(switches));
    for (ModelKind kind : {ModelKind::kLm, ModelKind::kSeq2seq}) {
      SCOPED_TRACE(std::string(to_string(kind)) + (*switches ? ", " : "") + switches);
      const ModelConfig m = recompute_model(kind);
      const Batch batch = testing::random_batch(m, {3, 150, 64}, {10, 120, 64}, 7);
      const GpuGradients none = gpu_gradients(*gpu, m, batch, Recompute::kNone, compute);
      const GpuGradients other = gpu_gradients(*gpu, m, batch, mode, compute);
      ASSERT_EQ(none.grads.size(), other.grads.size());
      check(none, other);
    }
  }
}

// Every gradient of `b` bitwise `a`'s but the MLPs' proj weights', which
// are within rounding (1e-4 of the largest in fp32, 2% in bf16 and fp16).
void expect_only_projection_weights_differ(const GpuGradients& a, const GpuGradients& b,
                                           DType compute) {
  for (const ParamInfo& p : a.info) {
    const float* x = a.grads.data() + p.offset;
    const float* y = b.grads.data() + p.offset;
    if (p.name.find(".mlp.proj.weight") == std::string::npos) {
      EXPECT_EQ(std::memcmp(x, y, p.size * sizeof(float)), 0) << p.name;
      continue;
    }
    double largest = 0.0, diff = 0.0;
    for (size_t i = 0; i < p.size; ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(x[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    }
    EXPECT_LE(diff, (compute == DType::kF32 ? 1e-4 : 0.02) * largest) << p.name;
  }
}

// --recompute layer on the GPU: a layer's rerun queues the ops of its first
// run on the same inputs (the standalone layer norm at a layer's start
// normalises the stored sum as the fused residual kernel did), so the
// gradients are --recompute none's, bit for bit, dropout included.
TEST_P(CudaModelTest, RecomputeLayerGivesTheSameBits) {
  compare_recompute(Recompute::kLayer, GetParam(), [](const auto& none, const auto& layer) {
    EXPECT_EQ(std::memcmp(none.grads.data(), layer.grads.data(), none.grads.size() * sizeof(float)),
              0)
        << "--recompute layer changed the gradients";
  });
}

// --recompute activation on the GPU: the MLP's activation is made again
// from its kept (rounded) pre-activation by the elementwise kernel, where
// forward took it from cuBLASLt's GELU epilogue on the unrounded value. Only
// the gradients that read it, the MLPs' proj weights, may differ, by
// rounding; every other gradient reads the same pre-activation, and the
// pre-LN input norms made again from the stored stream are the same bits
// (layernorm_forward normalises a row as the fused residual add did).
TEST_P(CudaModelTest, RecomputeActivationChangesOnlyTheProjectionWeightGradients) {
  const DType compute = GetParam();
  compare_recompute(Recompute::kActivation, compute, [&](const auto& none, const auto& act) {
    expect_only_projection_weights_differ(none, act, compute);
  });
}

}  // namespace
}  // namespace mpiformer
