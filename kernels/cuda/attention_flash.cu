// Launchers of the flash attention kernels (attention_flash_kernels.cuh):
// the tiles are numbered on the device from the batch's offsets, then one
// block runs per (tile, head).
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_flash.h"
#include "kernels/cuda/attention_flash_kernels.cuh"
#include "kernels/cuda/common.cuh"

namespace mpiformer::cuda {
namespace {

using flash::Geometry;
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
      constexpr int kDmax = decltype(dmax)::value;
      using G = Geometry<kDmax>;
      launch(flash::forward_kernel<T, kDmax>, q_tiles, cfg.heads, G::kThreads,
             SharedFloats<G>::kForward, stream, s, typed<T>(out), stats,
             static_cast<const T*>(typed<T>(q)), static_cast<const T*>(typed<T>(k)),
             static_cast<const T*>(typed<T>(v)));
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
    const T *qp = typed<T>(q), *kp = typed<T>(k), *vp = typed<T>(v);
    const T *dop = typed<T>(dout), *op = typed<T>(out);
    dispatch_head(cfg.head_dim, [&](auto dmax) {
      constexpr int kDmax = decltype(dmax)::value;
      using G = Geometry<kDmax>;
      // dQ first: it writes the delta the dK/dV pass reads.
      if (q_tiles > 0) {
        launch(flash::query_grad_kernel<T, kDmax>, q_tiles, cfg.heads, G::kThreads,
               SharedFloats<G>::kQueryGrad, stream, s, typed<T>(dq), delta, dop, op, stats, qp, kp,
               vp);
      }
      if (k_tiles > 0) {
        launch(flash::key_grad_kernel<T, kDmax>, k_tiles, cfg.heads, G::kThreads,
               SharedFloats<G>::kKeyGrad, stream, s, typed<T>(dk), typed<T>(dv),
               static_cast<const float*>(delta), dop, stats, qp, kp, vp);
      }
    });
  });
  check(cudaGetLastError(), "flash attention_backward");
}

}  // namespace mpiformer::cuda
