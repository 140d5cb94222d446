// One query row of causal self-attention against a KV cache (moe_attention_decode):
// the incremental decode of MoE-GPT, where a new position attends to the keys
// and values of the positions before it without recomputing them.
//
// Per head: scores (1, len) = q_h K_h^T / sqrt(hd); p = softmax(scores);
// out_h (1, hd) = p V_h. K_h and V_h are read in place from the cache rows
// (leading dimension ld), nothing is copied. The products go through
// moe_gemm_fp32 (fp32 whatever the precision, as the training attention) with
// one row, so on the batch-invariant backend a row's bits do not depend on
// which other rows are decoded in the same step, on how a prompt was cut into
// prefill chunks, or on the rank that computes it. The values equal
// moe_attention_forward's row t = len - 1 up to rounding (its tiled GEMMs and
// its own softmax sum in another order).
#include <math.h>

#include "moe/kernels.h"

void moe_attention_decode(float *out, const float *q, const float *k, const float *v, int ld,
                          int len, int nh, int hd, float *scratch) {
  if (nh <= 0 || hd <= 0 || len < 1) return;
  const float scale = 1.0f / sqrtf((float)hd);
  float *scores = scratch, *prob = scratch + len;
  for (int h = 0; h < nh; h++) {
    const int off = h * hd;
    moe_gemm_fp32(0, 1, 1, len, hd, scale, q + off, hd, k + off, ld, 0.0f, scores, len);
    moe_softmax_forward(prob, scores, 1, len);
    moe_gemm_fp32(0, 0, 1, hd, len, 1.0f, prob, len, v + off, ld, 0.0f, out + off, hd);
  }
}
