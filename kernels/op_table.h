// The compute ops of kernels/ops.h, each declared here once: its
// documentation (shapes beside every argument), its signature, and what the
// observing wrapper (kernels/observed_ops.h) shows of a call. Adding an op
// is an entry here, its CPU reference in kernels/cpu/FAMILY.cpp, its CUDA
// kernel in kernels/cuda/FAMILY.cu and its test: Ops, CpuOps, CudaOps and
// ObservedOps take their declarations from this table.
//
//   MPIFORMER_OP(NAME, FAMILY, DTYPE, (SIZES), (PARAMETERS), (ARGUMENTS))
//
// FAMILY: an OpFamily (profiles sum by it); DTYPE: the type of the op's
// activations, an expression of its parameters; SIZES: {{"name", value},
// ...}, what a profile or a fault names of a call; ARGUMENTS: the
// parameters' names, for forwarding. Every op returns void.
//
// Included, without a guard, inside a class with MPIFORMER_OP defined, which
// the includer undefines after.

// ---- precision --------------------------------------------------------
// dst = src rounded to dst's type (the compute copy of the weights).
// dst: (n), src: (n) fp32
MPIFORMER_OP(convert, kElementwise, dst.dtype, ({{"n", n}}), (Act dst, const float* src, size_t n),
             (dst, src, n))

// ---- elementwise ------------------------------------------------------
// out = dropout(x); out may alias x. The backward is the same op on the
// gradient (the mask and scale are regenerated).  out, x: (n)
MPIFORMER_OP(dropout, kElementwise, out.dtype, ({{"n", n}}),
             (Act out, Act x, size_t n, const Dropout& d), (out, x, n, d))
// out = act(pre): an activation made again from its kept pre-activation
// (--recompute activation); fp32 math on the stored values.  out, pre: (n)
MPIFORMER_OP(activation_forward, kElementwise, out.dtype, ({{"n", n}}),
             (Act out, Act pre, size_t n, Activation act), (out, pre, n, act))
// dx = act'(pre) * dout, for an activation whose backward follows no GEMM
// (the mlm head); dx may alias dout.  dx, dout, pre: (n)
MPIFORMER_OP(activation_backward, kElementwise, dx.dtype, ({{"n", n}}),
             (Act dx, Act dout, Act pre, size_t n, Activation act), (dx, dout, pre, n, act))

// ---- embeddings -------------------------------------------------------
// out[i] = tokens[ids[i]] * scale + positions[pos[i]].
// out: (N, C), ids, pos: (N), tokens: (V, C), positions: (L, C) (a
// learned table's compute copy, or fixed sinusoids)
MPIFORMER_OP(embedding_forward, kEmbedding, out.dtype, ({{"N", N}, {"C", C}}),
             (Act out, const int32_t* ids, Act tokens, const int32_t* pos, Act positions, int N,
              int C, float scale),
             (out, ids, tokens, pos, positions, N, C, scale))
// dtokens[ids[i]] += dout[i] * scale and, when dpositions is not null,
// dpositions[pos[i]] += dout[i]; each row of a table sums its rows in
// ascending order (no float atomics: deterministic).
// dtokens: (V, C), dpositions: (L, C) or null, dout: (N, C)
MPIFORMER_OP(
    embedding_backward, kEmbedding, dout.dtype,
    ({{"N", N}, {"C", C}, {"id groups", by_id.groups}, {"position groups", by_pos.groups}}),
    (float* dtokens, float* dpositions, Act dout, const RowGroups& by_id, const RowGroups& by_pos,
     int N, int C, float scale),
    (dtokens, dpositions, dout, by_id, by_pos, N, C, scale))

// ---- layer norm -------------------------------------------------------
// out = (x - mean) * rstd * gamma + beta, per row.
// out, x: (N, C), mean, rstd: (N) saved for backward, gamma, beta: (C)
MPIFORMER_OP(layernorm_forward, kNorm, out.dtype, ({{"N", N}, {"C", C}}),
             (Act out, float* mean, float* rstd, Act x, Act gamma, Act beta, int N, int C,
              float eps),
             (out, mean, rstd, x, gamma, beta, N, C, eps))
// A residual connection and the layer norm after it, in one pass:
// sum = s + dropout(y), out = LN(sum).  sum, out, s, y: (N, C)
MPIFORMER_OP(residual_layernorm_forward, kNorm, out.dtype, ({{"N", N}, {"C", C}}),
             (Act sum, Act out, float* mean, float* rstd, Act s, Act y, const Dropout& d, Act gamma,
              Act beta, int N, int C, float eps),
             (sum, out, mean, rstd, s, y, d, gamma, beta, N, C, eps))
// dx (= or += with accumulate): (N, C), dgamma, dbeta (+=): (C).
// dx_sums (+=, with accumulate; null to skip): (C), the sums over rows of
// dx as it came in, before the add: where dx is the residual stream's
// gradient, the bias gradient of the sublayer whose output it is, from
// the pass that reads it anyway (dbias_out=norm: src/model/blocks.cpp).
MPIFORMER_OP(layernorm_backward, kNorm, dx.dtype, ({{"N", N}, {"C", C}}),
             (Act dx, float* dgamma, float* dbeta, Act dout, Act x, Act gamma, const float* mean,
              const float* rstd, int N, int C, bool accumulate, float* dx_sums = nullptr),
             (dx, dgamma, dbeta, dout, x, gamma, mean, rstd, N, C, accumulate, dx_sums))

// ---- GEMM -------------------------------------------------------------
// out = act(x @ weight^T + bias); with an activation, fused.pre (N, OC)
// keeps x @ weight^T + bias for the backward pass.
// out: (N, OC) rows out_stride elements apart (0: OC; a padded stride
// keeps wide GEMMs aligned), x: (N, IC), weight: (OC, IC), bias: (OC) or null
MPIFORMER_OP(matmul_forward, kGemm, out.dtype,
             ({{"N", N},
               {"IC", IC},
               {"OC", OC},
               {"out_stride", out_stride},
               {"bias", bias.data != nullptr},
               {"fused activation", fused.pre.data != nullptr}}),
             (Act out, Act x, Act weight, Act bias, int N, int IC, int OC,
              const FusedActivation& fused = {}, int out_stride = 0),
             (out, x, weight, bias, N, IC, OC, fused, out_stride))
// dx (= or += with accumulate; null to skip): (N, IC), dweight (+=):
// (OC, IC), dbias (+=, null to skip): (OC), dout: (N, OC) rows dout_stride
// apart (0: OC). With an activation (fused.pre: (N, IC), the forward's
// pre-activation of x), dx = act'(pre) * (dout @ weight): the gradient at
// the pre-activation (accumulate must be false); with fused.pre_bias_grad
// (dx not null) also its sums over rows, += into it (dbias_in=dgelu:
// src/model/blocks.cpp).
MPIFORMER_OP(matmul_backward, kGemm, dout.dtype,
             ({{"N", N},
               {"IC", IC},
               {"OC", OC},
               {"dout_stride", dout_stride},
               {"dx", dx.data != nullptr},
               {"dbias", dbias != nullptr},
               {"fused activation", fused.pre.data != nullptr},
               {"accumulate", accumulate}}),
             (Act dx, float* dweight, float* dbias, Act dout, Act x, Act weight, int N, int IC,
              int OC, bool accumulate, const FusedActivation& fused = {}, int dout_stride = 0),
             (dx, dweight, dbias, dout, x, weight, N, IC, OC, accumulate, fused, dout_stride))

// ---- attention --------------------------------------------------------
// Multi-head scaled dot-product attention over ragged batches. Query b
// attends to the keys of sequence b only (key padding by construction),
// and with `causal` to keys 0..i (requires q and k lengths equal).
// q: (Nq, H*D) rows `q_stride` elements apart; k, v: (Nk, H*D) rows
// `kv_stride` apart (so q, k, v may be column slices of one fused QKV
// tensor); out: (Nq, H*D) dense. Saved for backward: out and
// stats (Nq, H), each query row's log-sum-exp of its scaled scores (not
// the probabilities).
MPIFORMER_OP(attention_forward, kAttention, out.dtype,
             ({{"B", qs.batch},
               {"Nq", qs.total},
               {"Nk", ks.total},
               {"longest q", qs.max_len},
               {"longest k", ks.max_len},
               {"heads", cfg.heads},
               {"head size", cfg.head_dim},
               {"causal", cfg.causal},
               {"log-length", cfg.scale == AttentionScale::kLogLength}}),
             (Act out, float* stats, Act q, int q_stride, Act k, Act v, int kv_stride,
              const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg),
             (out, stats, q, q_stride, k, v, kv_stride, qs, ks, cfg))
// dq: (Nq, H*D) stride q_stride; dk, dv: (Nk, H*D) stride kv_stride; all
// written (=). dout, out: (Nq, H*D) dense; stats: (Nq, H) from forward.
MPIFORMER_OP(attention_backward, kAttention, dout.dtype,
             ({{"B", qs.batch},
               {"Nq", qs.total},
               {"Nk", ks.total},
               {"longest q", qs.max_len},
               {"longest k", ks.max_len},
               {"heads", cfg.heads},
               {"head size", cfg.head_dim},
               {"causal", cfg.causal},
               {"log-length", cfg.scale == AttentionScale::kLogLength}}),
             (Act dq, Act dk, Act dv, Act dout, Act out, const float* stats, Act q, int q_stride,
              Act k, Act v, int kv_stride, const Ragged& qs, const Ragged& ks,
              const AttentionConfig& cfg),
             (dq, dk, dv, dout, out, stats, q, q_stride, k, v, kv_stride, qs, ks, cfg))
// Decoding: each query row against its own list of key rows (KeyLists),
// scaled as a query that sees that many keys (cfg.causal is not read: the
// list is what the row may see); a row with an empty list gets 0. A row's
// result depends on its query and its listed keys alone, in any batch.
// out: (R, H*D) dense, q: (R, H*D) rows q_stride apart, k, v: (P, H*D)
// rows kv_stride apart (a key/value cache, or an encoder's memory)
MPIFORMER_OP(attention_listed, kAttention, out.dtype,
             ({{"R", keys.queries},
               {"P", keys.key_rows},
               {"longest", keys.longest},
               {"heads", cfg.heads},
               {"head size", cfg.head_dim},
               {"log-length", cfg.scale == AttentionScale::kLogLength}}),
             (Act out, Act q, int q_stride, Act k, Act v, int kv_stride, const KeyLists& keys,
              const AttentionConfig& cfg),
             (out, q, q_stride, k, v, kv_stride, keys, cfg))
// Decoding: dst row rows[i] = src row i, `width` elements each, for i < n
// (a step's keys and values into the cache rows they were given). dst and
// src share a dtype; the rows are distinct.  src: (n, width) rows
// src_stride apart, dst: rows dst_stride apart, rows: backend (n)
MPIFORMER_OP(scatter_rows, kElementwise, dst.dtype, ({{"n", n}, {"width", width}}),
             (Act dst, int dst_stride, Act src, int src_stride, const int32_t* rows, int n,
              int width),
             (dst, dst_stride, src, src_stride, rows, n, width))

// ---- loss -------------------------------------------------------------
// Label-smoothed softmax cross entropy fused with its gradient. Target
// distribution: 1-e on the label, e/(V-1) elsewhere; the constant
// -((1-e)ln(1-e) + e ln(e/(V-1))) is subtracted so a perfect prediction
// scores 0. Rows whose target is pad_id have weight 0. Softmax and loss in
// fp32. With compute_grad, logits are overwritten by
// dlogits = (p - q) * grad_scale (0 on pad rows): the probabilities are
// never stored. The batch's sums are added to *sums in row order.
// logits: (N, V) rows `stride` elements apart (0: V), targets: (N),
// sums: backend (1)
MPIFORMER_OP(cross_entropy, kLoss, logits.dtype,
             ({{"N", N}, {"V", V}, {"stride", stride}, {"gradient", compute_grad}}),
             (Act logits, const int32_t* targets, int N, int V, float smoothing, int pad_id,
              float grad_scale, bool compute_grad, LossSums* sums, int stride = 0),
             (logits, targets, N, V, smoothing, pad_id, grad_scale, compute_grad, sums, stride))

// ---- classification (--model classify) ---------------------------------
// One row per sequence: out[b] = x[offsets[b]] (cls: the first row) or the
// mean of rows [offsets[b], offsets[b+1]) (mean; 0 for an empty sequence).
// out: (B, C), x: (N, C)
MPIFORMER_OP(pool_forward, kElementwise, out.dtype,
             ({{"B", rows.batch}, {"N", rows.total}, {"C", C}}),
             (Act out, Act x, const Ragged& rows, int C, PoolKind kind), (out, x, rows, C, kind))
// The backward of pool_forward, written (=): cls: dx = dout[b] on the first
// row of sequence b and 0 on its other rows; mean: dout[b] / length(b) on
// every row of b.  dx: (N, C), dout: (B, C)
MPIFORMER_OP(pool_backward, kElementwise, dx.dtype,
             ({{"B", rows.batch}, {"N", rows.total}, {"C", C}}),
             (Act dx, Act dout, const Ragged& rows, int C, PoolKind kind),
             (dx, dout, rows, C, kind))
// Multi-label ZLPR loss with soft targets t in [0, 1], per row of K scores s:
//   log(1 + sum_i (1 - t_i) e^{s_i}) + log(1 + sum_i t_i e^{-s_i}),
// both terms as log-sum-exp over {0} and the weighted exponents, so any
// finite score is safe. Label i is predicted when s_i > 0 and true when
// t_i >= 0.5. With compute_grad, logits are overwritten by
// dlogits * grad_scale, dloss/ds_i = (1 - t_i) e^{s_i - A} - t_i e^{-s_i - B}
// (A and B the two log-sum-exps). Added to *sums in row order: loss and nll
// (both the ZLPR loss), tokens (rows) and correct (rows whose predicted set
// equals the true set). label_counts (+=) holds, for each label, its true
// positives, false positives and false negatives: rows [0, K), [K, 2K),
// [2K, 3K). Every sum is fp64 or an integer, in an order fixed by B and K.
// logits: (B, K) rows `stride` elements apart (0: K), targets: (B, K) fp32,
// sums: backend (1), label_counts: backend (3 K) int64
MPIFORMER_OP(zlpr_loss, kLoss, logits.dtype,
             ({{"B", B}, {"K", K}, {"stride", stride}, {"gradient", compute_grad}}),
             (Act logits, const float* targets, int B, int K, float grad_scale, bool compute_grad,
              LossSums* sums, int64_t* label_counts, int stride = 0),
             (logits, targets, B, K, grad_scale, compute_grad, sums, label_counts, stride))

// ---- exact gradient sum (src/parallel/gradient_reducer.h) -------------
// Math on the device's memory, so ops like the rest (and timed with
// them), though the reducer, not the model, calls them.
// fixed[i] += round(grads[i] * 2^fraction_bits) for every i with
// |grads[i]| < 2^limit_bits; each other element (NaN too) adds 1 to
// *out_of_range instead. Integer sums: any order gives the same result.
// first: the step's first contribution, written rather than added (fixed[i]
// = round(...), 0 for an element out of range), so fixed need not be zeroed.
// fixed: backend (n) int64, grads: backend (n) fp32, out_of_range: backend (1)
MPIFORMER_OP(
    fixed_point_accumulate, kOptimizer, DType::kF32,
    ({{"n", n}, {"fraction bits", fraction_bits}, {"limit bits", limit_bits}, {"first", first}}),
    (int64_t * fixed, int64_t* out_of_range, const float* grads, size_t n, int fraction_bits,
     int limit_bits, bool first = false),
    (fixed, out_of_range, grads, n, fraction_bits, limit_bits, first))
// out[i] = fixed[i] * 2^-fraction_bits, or NaN everywhere when
// *out_of_range > 0.  out: backend (n) fp32, fixed: backend (n), out_of_range: backend (1)
MPIFORMER_OP(fixed_point_to_float, kOptimizer, DType::kF32,
             ({{"n", n}, {"fraction bits", fraction_bits}}),
             (float* out, const int64_t* fixed, const int64_t* out_of_range, size_t n,
              int fraction_bits),
             (out, fixed, out_of_range, n, fraction_bits))
// One rank's exact sum of one contribution, in place and without the
// int64 buffer: grads[i] = round(grads[i] * 2^fraction_bits) *
// 2^-fraction_bits for every i with |grads[i]| < 2^limit_bits, the bits
// fixed_point_accumulate(first) then fixed_point_to_float give; each other
// element is left as it is and adds 1 to *out_of_range (then
// fixed_point_poison).  grads: backend (n) fp32, out_of_range: backend (1)
MPIFORMER_OP(fixed_point_round, kOptimizer, DType::kF32,
             ({{"n", n}, {"fraction bits", fraction_bits}, {"limit bits", limit_bits}}),
             (float* grads, int64_t* out_of_range, size_t n, int fraction_bits, int limit_bits),
             (grads, out_of_range, n, fraction_bits, limit_bits))
// x[i] = NaN for every i when *out_of_range > 0 (else x stays): the rounded
// sum's way of spoiling the step, as fixed_point_to_float's.
// x: backend (n) fp32, out_of_range: backend (1)
MPIFORMER_OP(fixed_point_poison, kOptimizer, DType::kF32, ({{"n", n}}),
             (float* x, const int64_t* out_of_range, size_t n), (x, out_of_range, n))

// ---- optimizer --------------------------------------------------------
// *out = sum of x[i]^2, accumulated in double in an order that depends on
// n only.  x: (n), out: backend (1)
MPIFORMER_OP(sum_squares, kOptimizer, DType::kF32, ({{"n", n}}),
             (double* out, const float* x, size_t n), (out, x, n))
// partial[b] = sum of x[i]^2 over block b, i in [b * kNormBlockFloats,
// min(n, (b + 1) * kNormBlockFloats)), in double, in an order that depends
// on the block's length only (the gradient norm: any slice of x that
// starts on a block boundary gives the same partials).
// x: (n), partial: backend (norm_blocks(n))
MPIFORMER_OP(sum_squares_blocks, kOptimizer, DType::kF32, ({{"n", n}}),
             (double* partial, const float* x, size_t n), (partial, x, n))
// *out = sum of x[0, n) in an order that depends on n only (0 when n is 0).
// x: backend (n), out: backend (1)
MPIFORMER_OP(sum_doubles, kOptimizer, DType::kF32, ({{"n", n}}),
             (double* out, const double* x, size_t n), (out, x, n))
// One AdamW update of every range of the flat buffers, in one pass (one
// launch on a GPU, a block per range). Gradients are multiplied by cfg.inv_loss_scale and by
// clip_factor(sqrt(*grad_norm_sq) * inv_loss_scale, max_norm) first, so
// the clip is decided on the device. compute (the compute copy of the
// weights) is refreshed; null when the compute precision is fp32.
// params, grads, m, v: (n) fp32, compute: (n), ranges: backend (R),
// grad_norm_sq: backend (1), from sum_squares
MPIFORMER_OP(adamw_update, kOptimizer, compute.dtype, ({{"n", n}, {"ranges", range_count}}),
             (float* params, const float* grads, float* m, float* v, Act compute, size_t n,
              const AdamWRange* ranges, int range_count, const AdamWConfig& cfg,
              const double* grad_norm_sq),
             (params, grads, m, v, compute, n, ranges, range_count, cfg, grad_norm_sq))
