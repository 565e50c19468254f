// Launchers of the flash attention kernels (attention_flash_kernels.cuh):
// the tiles are numbered on the device from the batch's offsets, then one
// block runs per (tile, head).
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_flash.h"
#include "kernels/cuda/attention_flash_kernels.cuh"
#include "kernels/cuda/attention_flash_mma_kernels.cuh"
#include "kernels/cuda/common.cuh"

namespace mpiformer::cuda {
namespace {

using flash::Geometry;
using flash::MmaGeometry;
using flash::MmaSharedFloats;
using flash::SharedFloats;

constexpr int kScanThreads = 1024;
constexpr int kLargestHead = 128;

// Calls fn(std::integral_constant<int, kDmax>{}) for the smallest
// instantiation whose heads hold head_dim (1..128).
template <typename Fn>
void dispatch_head(int head_dim, Fn&& fn) {
  if (head_dim <= 32)
    fn(std::integral_constant<int, 32>{});
  else if (head_dim <= 64)
    fn(std::integral_constant<int, 64>{});
  else
    fn(std::integral_constant<int, 128>{});
}

// Shared memory of the hungriest kernel (the dK/dV pass) for heads up to kDmax.
template <int kDmax>
constexpr size_t largest_shared_bytes() {
  return sizeof(float) * SharedFloats<Geometry<kDmax>>::kKeyGrad;
}

// sum over b of tiles_of(L_b): the grid, from the host's offsets.
int tiles_of_batch(const Ragged& r) {
  int tiles = 0;
  for (int b = 0; b < r.batch; ++b) tiles += tiling::tiles_of(r.length(b));
  return tiles;
}

// tiles: (2 (B+1)), the query side's tile starts, then the key side's.
flash::Shape shape_of(const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg,
                      const int32_t* tiles, int q_stride, int kv_stride) {
  return flash::Shape{qs.device_offsets, ks.device_offsets, tiles,        tiles + qs.batch + 1,
                      qs.batch,          cfg.heads,         cfg.head_dim, q_stride,
                      kv_stride,         cfg.causal,        cfg.scale,    cfg.ref_len};
}

void number_tiles(int32_t* tiles, const Ragged& qs, const Ragged& ks, cudaStream_t stream) {
  flash::tile_starts_kernel<<<2, kScanThreads, kScanThreads * sizeof(int), stream>>>(
      tiles, tiles + qs.batch + 1, qs.device_offsets, ks.device_offsets, qs.batch);
}

// kernel on grid (tiles, heads) with `floats` floats of shared memory, more
// than the default 48 KiB allowed first.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, int tiles, int heads, int threads, int floats, cudaStream_t stream,
            Args... args) {
  const int bytes = static_cast<int>(sizeof(float)) * floats;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "flash attention: shared memory limit");
  kernel<<<dim3(tiles, heads), threads, bytes, stream>>>(args...);
}

}  // namespace

PlainAttention plain_attention_from_environment() {
  const char* value = std::getenv("MPIFORMER_PLAIN_ATTENTION");
  const std::string name = value ? value : "";
  if (name.empty() || name == "flash") return PlainAttention::kFlash;
  if (name == "naive") return PlainAttention::kNaive;
  throw std::runtime_error("MPIFORMER_PLAIN_ATTENTION is '" + name +
                           "': expected flash (the default) or naive");
}

bool flash_attention_covers(int head_dim) {
  if (head_dim < 1 || head_dim > kLargestHead) return false;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();  // not an error of a later op
    return false;
  }
  size_t need = 0;
  dispatch_head(head_dim, [&](auto dmax) { need = largest_shared_bytes<decltype(dmax)::value>(); });
  return need <= static_cast<size_t>(optin);
}

size_t flash_attention_tiles_bytes(int batch) {
  return 2 * sizeof(int32_t) * (static_cast<size_t>(batch) + 1);
}

size_t flash_attention_delta_bytes(size_t tokens, int heads) {
  return sizeof(float) * tokens * heads;
}

size_t flash_attention_scratch_bytes(size_t tokens, const AttentionConfig& cfg, bool backward) {
  const size_t tiles = flash_attention_tiles_bytes(static_cast<int>(tokens));
  return tiles + (backward ? flash_attention_delta_bytes(tokens, cfg.heads) : 0);
}

namespace {

// Whether heads up to kDmax of T run on tensor cores (bf16 and fp16 heads
// up to 64, on devices of compute capability 8.0 and later) or on CUDA
// cores (fp32, heads of 65 to 128, older devices).
template <typename T, int kDmax>
constexpr bool kOnTensorCores = !std::is_same_v<T, float> && kDmax <= 64;

bool device_has_mma() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();  // not an error of a later op
    return false;
  }
  return major >= 8;
}

template <typename T, int kDmax>
void launch_forward(const flash::Shape& s, int tiles, T* out, float* stats, const T* q, const T* k,
                    const T* v, cudaStream_t stream) {
  if constexpr (kOnTensorCores<T, kDmax>) {
    if (device_has_mma()) {
      using G = MmaGeometry<kDmax>;
      launch(flash::forward_mma_kernel<T, kDmax>, tiles, s.heads, G::kThreads,
             MmaSharedFloats<G>::kForward, stream, s, out, stats, q, k, v);
      return;
    }
  }
  using G = Geometry<kDmax>;
  launch(flash::forward_kernel<T, kDmax>, tiles, s.heads, G::kThreads, SharedFloats<G>::kForward,
         stream, s, out, stats, q, k, v);
}

// The dQ pass (which writes delta), then the dK/dV pass. dq, dk, dv: the
// gradients; in[0..4]: dout, out, q, k, v
template <typename T, int kDmax>
void launch_backward(const flash::Shape& s, int q_tiles, int k_tiles, T* dq, T* dk, T* dv,
                     float* delta, const float* stats, const T* const (&in)[5],
                     cudaStream_t stream) {
  const T *dout = in[0], *out = in[1], *q = in[2], *k = in[3], *v = in[4];
  const float* delta_in = delta;
  if constexpr (kOnTensorCores<T, kDmax>) {
    if (device_has_mma()) {
      using G = MmaGeometry<kDmax>;
      if (q_tiles > 0)
        launch(flash::query_grad_mma_kernel<T, kDmax>, q_tiles, s.heads, G::kThreads,
               MmaSharedFloats<G>::kQueryGrad, stream, s, dq, delta, dout, out, stats, q, k, v);
      if (k_tiles > 0)
        launch(flash::key_grad_mma_kernel<T, kDmax>, k_tiles, s.heads, G::kThreads,
               MmaSharedFloats<G>::kKeyGrad, stream, s, dk, dv, delta_in, dout, stats, q, k, v);
      return;
    }
  }
  using G = Geometry<kDmax>;
  if (q_tiles > 0)
    launch(flash::query_grad_kernel<T, kDmax>, q_tiles, s.heads, G::kThreads,
           SharedFloats<G>::kQueryGrad, stream, s, dq, delta, dout, out, stats, q, k, v);
  if (k_tiles > 0)
    launch(flash::key_grad_kernel<T, kDmax>, k_tiles, s.heads, G::kThreads,
           SharedFloats<G>::kKeyGrad, stream, s, dk, dv, delta_in, dout, stats, q, k, v);
}

}  // namespace

void flash_attention_forward(Act out, float* stats, Act q, int q_stride, Act k, Act v,
                             int kv_stride, const Ragged& qs, const Ragged& ks,
                             const AttentionConfig& cfg, int32_t* tiles, cudaStream_t stream) {
  const int q_tiles = tiles_of_batch(qs);
  if (q_tiles == 0) return;
  number_tiles(tiles, qs, ks, stream);
  const flash::Shape s = shape_of(qs, ks, cfg, tiles, q_stride, kv_stride);
  dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head(cfg.head_dim, [&](auto dmax) {
      launch_forward<T, decltype(dmax)::value>(s, q_tiles, typed<T>(out), stats, typed<T>(q),
                                               typed<T>(k), typed<T>(v), stream);
    });
  });
  check(cudaGetLastError(), "flash attention_forward");
}

void flash_attention_backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats, Act q,
                              int q_stride, Act k, Act v, int kv_stride, const Ragged& qs,
                              const Ragged& ks, const AttentionConfig& cfg, int32_t* tiles,
                              float* delta, cudaStream_t stream) {
  const int q_tiles = tiles_of_batch(qs), k_tiles = tiles_of_batch(ks);
  if (q_tiles == 0 && k_tiles == 0) return;
  number_tiles(tiles, qs, ks, stream);
  const flash::Shape s = shape_of(qs, ks, cfg, tiles, q_stride, kv_stride);
  dispatch(dq.dtype, [&](auto t) {
    using T = decltype(t);
    const T* const in[5] = {typed<T>(dout), typed<T>(out), typed<T>(q), typed<T>(k), typed<T>(v)};
    dispatch_head(cfg.head_dim, [&](auto dmax) {
      launch_backward<T, decltype(dmax)::value>(s, q_tiles, k_tiles, typed<T>(dq), typed<T>(dk),
                                                typed<T>(dv), delta, stats, in, stream);
    });
  });
  check(cudaGetLastError(), "flash attention_backward");
}

}  // namespace mpiformer::cuda
