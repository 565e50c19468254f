// The CUDA flash attention kernels' device code (attention_flash_kernels.cuh
// and attention_flash_mma_kernels.cuh) run on the CPU, where no GPU is:
// tests/emulated_cuda comes first on this test's include path and stands in
// for the CUDA built-ins they use (threads, barriers, warp shuffles, mma.sync
// by the PTX ISA's fragment layout). The kernels are launched in the order
// and with the choices of attention_flash.cu (tensor cores for bf16 heads up
// to 64) and checked against attention in double precision: out, stats, dq,
// dk, dv, and the pad columns of fused strides untouched. Races show too:
// shared memory is NaN before each block and the threads really run
// concurrently. fp16 and the CUDA intrinsics themselves need a GPU
// (cuda_ops_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention_flash_kernels.cuh"
#include "kernels/cuda/attention_flash_mma_kernels.cuh"

namespace mpiformer::cuda::flash {
// The kernels' dynamic shared memory (a launch's, on a GPU).
alignas(16) float4 flash_shared[1 << 16];
}  // namespace mpiformer::cuda::flash

namespace mpiformer {
namespace {

using cuda::flash::Shape;

struct EmulationCase {
  std::string name;
  std::vector<int> q_lengths, k_lengths;  // no k_lengths: self-attention on fused QKV
  int heads, head_dim;
  bool causal;
  AttentionScale scale = AttentionScale::kStandard;
};

void PrintTo(const EmulationCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<int32_t> offsets_of(const std::vector<int>& lengths) {
  std::vector<int32_t> offsets = {0};
  for (int n : lengths) offsets.push_back(offsets.back() + n);
  return offsets;
}

using emulated::stored;
using emulated::widened;

// n values rounded to T, and their widened copies.
template <typename T>
void random_values(std::vector<T>& x, std::vector<float>& xf, size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  x.resize(n);
  xf.resize(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = stored<T>(u(rng));
    xf[i] = widened(x[i]);
  }
}

// A case's operands as stored (T) and widened: q, k, v column slices of one
// (N, 3C + 1) tensor (self-attention), or q (Nq, C + 1) and kv (Nk, 2C + 1);
// dout (Nq, C).
template <typename T>
struct Operands {
  explicit Operands(const EmulationCase& tc)
      : c(tc),
        q_offsets(offsets_of(tc.q_lengths)),
        k_offsets(offsets_of(cross() ? tc.k_lengths : tc.q_lengths)),
        C(tc.heads * tc.head_dim),
        q_stride(cross() ? C + 1 : 3 * C + 1),
        kv_stride(cross() ? 2 * C + 1 : q_stride) {
    std::mt19937 rng(5);
    random_values(q, qf, static_cast<size_t>(Nq()) * q_stride, rng);
    if (cross()) random_values(kv, kvf, static_cast<size_t>(Nk()) * kv_stride, rng);
    random_values(dout, doutf, static_cast<size_t>(Nq()) * C, rng);
  }
  bool cross() const { return !c.k_lengths.empty(); }
  int Nq() const { return q_offsets.back(); }
  int Nk() const { return k_offsets.back(); }
  const float* kf() const { return cross() ? kvf.data() : qf.data() + C; }
  const T* k() const { return cross() ? kv.data() : q.data() + C; }

  const EmulationCase& c;
  std::vector<int32_t> q_offsets, k_offsets;
  int C, q_stride, kv_stride;
  std::vector<T> q, kv, dout;         // kv empty for self-attention
  std::vector<float> qf, kvf, doutf;  // widened
};

// Attention in double: out, stats and the gradients for dout.
struct Reference {
  std::vector<double> out, stats, dq, dk, dv;  // (Nq, C), (Nq, H), (Nq, C), (Nk, C), (Nk, C)
};

// Query i of sequence b, head h, into the reference.
template <typename T>
void reference_row(Reference& r, const Operands<T>& o, int b, int i, int h) {
  const int D = o.c.head_dim, C = o.C, H = o.c.heads;
  const int lk = o.k_offsets[b + 1] - o.k_offsets[b];
  const int visible = o.c.causal ? std::min(i + 1, lk) : lk;
  if (visible == 0) return;
  const double scale = attention_scale(o.c.scale, D, 64.0f, visible);
  const size_t qi = o.q_offsets[b] + i;
  const float* q = o.qf.data() + qi * o.q_stride + h * D;
  const float* dout = o.doutf.data() + qi * C + h * D;
  const auto key = [&](int j) { return o.kf() + (o.k_offsets[b] + j) * o.kv_stride + h * D; };
  std::vector<double> s(visible), dp(visible);
  double top = -1e300, sum = 0.0, delta = 0.0;
  for (int j = 0; j < visible; ++j) {
    for (int d = 0; d < D; ++d) s[j] += static_cast<double>(q[d]) * key(j)[d] * scale;
    top = std::max(top, s[j]);
  }
  for (int j = 0; j < visible; ++j) sum += std::exp(s[j] - top);
  r.stats[qi * H + h] = top + std::log(sum);
  for (int j = 0; j < visible; ++j) {
    s[j] = std::exp(s[j] - top) / sum;  // P
    for (int d = 0; d < D; ++d) {
      r.out[qi * C + h * D + d] += s[j] * key(j)[C + d];
      dp[j] += static_cast<double>(dout[d]) * key(j)[C + d];
    }
    delta += s[j] * dp[j];
  }
  for (int j = 0; j < visible; ++j) {
    const double ds = s[j] * (dp[j] - delta) * scale;
    const size_t kj = (o.k_offsets[b] + j) * static_cast<size_t>(C) + h * D;
    for (int d = 0; d < D; ++d) {
      r.dq[qi * C + h * D + d] += ds * key(j)[d];
      r.dk[kj + d] += ds * q[d];
      r.dv[kj + d] += s[j] * dout[d];
    }
  }
}

template <typename T>
Reference reference(const Operands<T>& o) {
  Reference r;
  r.out.assign(static_cast<size_t>(o.Nq()) * o.C, 0.0);
  r.stats.assign(static_cast<size_t>(o.Nq()) * o.c.heads, 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(static_cast<size_t>(o.Nk()) * o.C, 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  for (size_t b = 0; b + 1 < o.q_offsets.size(); ++b) {
    for (int h = 0; h < o.c.heads; ++h) {
      for (int i = 0; i < o.q_offsets[b + 1] - o.q_offsets[b]; ++i) reference_row(r, o, b, i, h);
    }
  }
  return r;
}

// max |got - want| <= rel * max(1, max |want|).
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 1.0, worst = 0.0;
  size_t at = 0;
  for (double w : want) largest = std::max(largest, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    if (!(d <= worst)) worst = d, at = i;  // NaN counts as worst
  }
  EXPECT_LE(worst, rel * largest) << what << ": worst at " << at << ": " << got[at] << " vs "
                                  << want[at];
}

float* shared_memory() {
  return reinterpret_cast<float*>(cuda::flash::flash_shared);
}

// The tile starts of both sides, as attention_flash.cu numbers them, and
// the shape the kernels read.  tiles: (2 (B+1))
template <typename T>
Shape number_tiles(std::vector<int32_t>& tiles, const Operands<T>& o) {
  const int B = static_cast<int>(o.q_offsets.size()) - 1;
  tiles.assign(2 * (B + 1), -1);
  emulated::launch(dim3(2), 1024, shared_memory(), 1024, [&] {
    cuda::flash::tile_starts_kernel(tiles.data(), tiles.data() + B + 1, o.q_offsets.data(),
                                    o.k_offsets.data(), B);
  });
  return Shape{o.q_offsets.data(),
               o.k_offsets.data(),
               tiles.data(),
               tiles.data() + B + 1,
               B,
               o.c.heads,
               o.c.head_dim,
               o.q_stride,
               o.kv_stride,
               o.c.causal,
               o.c.scale,
               64.0f};
}

template <typename T, int kDmax>
constexpr bool kOnTensorCores = !std::is_same_v<T, float> && kDmax <= 64;

// What attention_flash.cu launches for T and kDmax: grid (tiles, H).
template <typename T, int kDmax>
void forward(const Shape& s, int tiles, T* out, float* stats, const T* q, const T* k, const T* v) {
  const dim3 grid(tiles, s.heads);
  if constexpr (kOnTensorCores<T, kDmax>) {
    using G = cuda::flash::MmaGeometry<kDmax>;
    emulated::launch(grid, G::kThreads, shared_memory(), cuda::flash::MmaSharedFloats<G>::kForward,
                     [&] { cuda::flash::forward_mma_kernel<T, kDmax>(s, out, stats, q, k, v); });
  } else {
    using G = cuda::flash::Geometry<kDmax>;
    emulated::launch(grid, G::kThreads, shared_memory(), cuda::flash::SharedFloats<G>::kForward,
                     [&] { cuda::flash::forward_kernel<T, kDmax>(s, out, stats, q, k, v); });
  }
}

// The dQ pass, then the dK/dV pass.  in: dout, out, q, k, v
template <typename T, int kDmax>
void backward(const Shape& s, int q_tiles, int k_tiles, T* dq, T* dk, T* dv, float* delta,
              const float* stats, const T* const (&in)[5]) {
  const T *dout = in[0], *out = in[1], *q = in[2], *k = in[3], *v = in[4];
  namespace flash = cuda::flash;
  if constexpr (kOnTensorCores<T, kDmax>) {
    using G = flash::MmaGeometry<kDmax>;
    emulated::launch(
        dim3(q_tiles, s.heads), G::kThreads, shared_memory(), flash::MmaSharedFloats<G>::kQueryGrad,
        [&] { flash::query_grad_mma_kernel<T, kDmax>(s, dq, delta, dout, out, stats, q, k, v); });
    emulated::launch(
        dim3(k_tiles, s.heads), G::kThreads, shared_memory(), flash::MmaSharedFloats<G>::kKeyGrad,
        [&] { flash::key_grad_mma_kernel<T, kDmax>(s, dk, dv, delta, dout, stats, q, k, v); });
  } else {
    using G = flash::Geometry<kDmax>;
    emulated::launch(
        dim3(q_tiles, s.heads), G::kThreads, shared_memory(), flash::SharedFloats<G>::kQueryGrad,
        [&] { flash::query_grad_kernel<T, kDmax>(s, dq, delta, dout, out, stats, q, k, v); });
    emulated::launch(
        dim3(k_tiles, s.heads), G::kThreads, shared_memory(), flash::SharedFloats<G>::kKeyGrad,
        [&] { flash::key_grad_kernel<T, kDmax>(s, dk, dv, delta, dout, stats, q, k, v); });
  }
}

template <typename T>
std::vector<double> widened_all(const std::vector<T>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = widened(x[i]);
  return out;
}

// Columns [col, col + C) of rows `stride` apart, widened; columns past
// `written` must still hold the sentinel 7.  buf: (rows, stride)
template <typename T>
std::vector<double> columns(const std::vector<T>& buf, int rows, int stride, int col, int C,
                            int written, const std::string& what) {
  std::vector<double> out;
  for (int i = 0; i < rows; ++i) {
    for (int c = 0; c < stride; ++c) {
      const float x = widened(buf[static_cast<size_t>(i) * stride + c]);
      if (c >= col && c < col + C) out.push_back(x);
      if (c >= written) {
        EXPECT_EQ(x, 7.0f) << what << ": pad column written, row " << i;
      }
    }
  }
  return out;
}

int tiles_of(const std::vector<int32_t>& offsets) {
  int tiles = 0;
  for (size_t b = 0; b + 1 < offsets.size(); ++b)
    tiles += tiling::tiles_of(offsets[b + 1] - offsets[b]);
  return tiles;
}

template <typename T, int kDmax>
void check_case(const EmulationCase& c) {
  const Operands<T> o(c);
  const Reference want = reference(o);
  const double rel = std::is_same_v<T, float> ? 1e-5 : 2.5e-2;
  const double grad_rel = std::is_same_v<T, float> ? 1e-4 : 2.5e-2;
  const int C = o.C, Nq = o.Nq(), Nk = o.Nk(), q_tiles = tiles_of(o.q_offsets);
  std::vector<int32_t> tiles;
  const Shape s = number_tiles(tiles, o);
  EXPECT_EQ(tiles[o.q_offsets.size() - 1], q_tiles);
  std::vector<T> out(static_cast<size_t>(Nq) * C, stored<T>(99.0f));
  std::vector<float> stats(static_cast<size_t>(Nq) * c.heads, 99.0f);
  forward<T, kDmax>(s, q_tiles, out.data(), stats.data(), o.q.data(), o.k(), o.k() + C);
  expect_close(widened_all(out), want.out, rel, "out");
  expect_close(std::vector<double>(stats.begin(), stats.end()), want.stats, rel, "stats");

  std::vector<T> dq(o.q.size(), stored<T>(7.0f)), dkv(o.kv.size(), stored<T>(7.0f));
  T* dk = o.cross() ? dkv.data() : dq.data() + C;
  std::vector<float> delta(std::max(1, Nq * c.heads));
  const T* const in[5] = {o.dout.data(), out.data(), o.q.data(), o.k(), o.k() + C};
  backward<T, kDmax>(s, q_tiles, tiles_of(o.k_offsets), dq.data(), dk, dk + C, delta.data(),
                     stats.data(), in);
  const std::vector<T>& kv_grads = o.cross() ? dkv : dq;
  const int q_written = o.cross() ? C : 3 * C, kv_written = o.cross() ? 2 * C : 3 * C;
  const int k_col = o.cross() ? 0 : C;
  expect_close(columns(dq, Nq, o.q_stride, 0, C, q_written, "dq"), want.dq, grad_rel, "dq");
  expect_close(columns(kv_grads, Nk, o.kv_stride, k_col, C, kv_written, "dk"), want.dk, grad_rel,
               "dk");
  expect_close(columns(kv_grads, Nk, o.kv_stride, k_col + C, C, kv_written, "dv"), want.dv,
               grad_rel, "dv");
}

template <typename T>
void check_case_any_head(const EmulationCase& c) {
  if (c.head_dim <= 32)
    check_case<T, 32>(c);
  else if (c.head_dim <= 64)
    check_case<T, 64>(c);
  else
    check_case<T, 128>(c);
}

class FlashEmulation : public ::testing::TestWithParam<EmulationCase> {};

TEST_P(FlashEmulation, Fp32OnCudaCores) {
  check_case_any_head<float>(GetParam());
}

// bf16 heads up to 64 on (emulated) tensor cores, D 65 to 128 on CUDA cores.
TEST_P(FlashEmulation, Bf16) {
  check_case_any_head<__nv_bfloat16>(GetParam());
}

constexpr AttentionScale kLog = AttentionScale::kLogLength;

INSTANTIATE_TEST_SUITE_P(
    Cases, FlashEmulation,
    ::testing::Values(
        EmulationCase{"causal_h3_d8", {5, 1, 13, 0, 7}, {}, 3, 8, true},
        EmulationCase{"bidirectional_log_length_h3_d8", {5, 1, 13, 0, 7}, {}, 3, 8, false, kLog},
        EmulationCase{"causal_log_length_d64", {1, 70, 130, 64}, {}, 2, 64, true, kLog},
        EmulationCase{"bidirectional_d64", {65, 3, 128}, {}, 1, 64, false},
        EmulationCase{"cross_no_keys_d64", {9, 40, 1, 70}, {64, 0, 130, 3}, 2, 64, false},
        EmulationCase{"causal_d128", {100, 28}, {}, 1, 128, true},
        EmulationCase{"cross_log_length_d96", {30, 7}, {50, 65}, 1, 96, false, kLog},
        EmulationCase{"causal_odd_d5", {13, 1, 66}, {}, 3, 5, true},
        EmulationCase{"vit_d16", {17, 17}, {}, 2, 16, false}),
    [](const ::testing::TestParamInfo<EmulationCase>& info) { return info.param.name; });

// The scan that numbers the tiles, with more sequences than its threads.
TEST(FlashEmulationTiles, StartsOfManySequences) {
  std::mt19937 rng(9);
  std::vector<int> lengths(3000);
  for (int& n : lengths) n = std::uniform_int_distribution<int>(0, 150)(rng);
  const EmulationCase c{"many", lengths, {}, 1, 1, false};
  const Operands<float> o(c);
  std::vector<int32_t> tiles;
  number_tiles(tiles, o);
  int expected = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    ASSERT_EQ(tiles[b], expected) << "sequence " << b;
    expected += tiling::tiles_of(lengths[b]);
  }
  EXPECT_EQ(tiles[lengths.size()], expected);
}

}  // namespace
}  // namespace mpiformer
