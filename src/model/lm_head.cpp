// The language model's head: the vocabulary projection's loss fused with
// its backward, and before it mlm's transform (dense, activation, layer
// norm) of the stack's output.
#include <algorithm>

#include "src/model/model_impl.h"

namespace mpiformer {

// Loss of the vocabulary projection over rows [0, N) of h, fused with its
// backward: dh (N, C) is written when `backward`. The sums go to *sums.
// h: (N, C)
void Model::Impl::head(Act h, Act dh, int N, float smoothing, float grad_scale, bool backward,
                       LossSums* sums) {
  const int C = config.d_model, V = config.vocab;
  for (int r0 = 0; r0 < N; r0 += chunk_rows) {
    const int n = std::min(chunk_rows, N - r0);
    const Act x = h + static_cast<size_t>(r0) * C;
    ops.matmul_forward(logits, x, params.weight(output_weight), head_bias(), n, C, V, {},
                       logits_stride);
    ops.cross_entropy(logits, targets + r0, n, V, smoothing, config.special.pad, grad_scale,
                      backward, sums, logits_stride);
    if (backward)
      ops.matmul_backward(dh + static_cast<size_t>(r0) * C, params.grad(output_weight),
                          output_bias >= 0 ? params.grad(output_bias) : nullptr, logits, x,
                          params.weight(output_weight), n, C, V, false, {}, logits_stride);
  }
}

// mlm: the transform of the stack's output h (N, C) the head reads.
// returns: backend (N, C)
Act Model::Impl::mlm_transform_forward(Act h, int N) {
  const int C = config.d_model;
  ops.matmul_forward(mlm_act, h, params.weight(mlm_dense_w), params.weight(mlm_dense_b), N, C, C,
                     FusedActivation{config.activation, mlm_dense});
  mlm_norm.forward(ctx, mlm_act, N);
  return mlm_norm.out;
}

// Its backward: the head's gradient in `spare` becomes d(main.out), in `spare`.
void Model::Impl::mlm_transform_backward(int N, GradientListener* listener) {
  const int C = config.d_model;
  const size_t n = static_cast<size_t>(N) * C;
  mlm_norm.backward(ctx, scratch.dy, spare, mlm_act, N, false);
  ops.activation_backward(scratch.du, scratch.dy, mlm_dense, n, config.activation);
  ops.matmul_backward(spare, params.grad(mlm_dense_w), params.grad(mlm_dense_b), scratch.du,
                      main.out, params.weight(mlm_dense_w), N, C, C, false);
  if (listener) listener->gradients_final(params.info()[mlm_dense_w].offset);
}

}  // namespace mpiformer
