// Pairwise (tree) summation of equal-sized vectors, one leaf at a time, in a
// fixed order (moe_pairwise_* in kernels.h): the deterministic mode sums the
// per-slice weight gradients with it, so that a rank holding slices
// [k 2^j, (k+1) 2^j) produces exactly one node of the tree over all slices;
// moe_pairwise_wgrad forms those leaves for a weight gradient x^T dy (and bias).
#include <string.h>

#include "moe/core.h"
#include "moe/kernels.h"

static int pairwise_cap(int max_leaves) {
  int depth = 1;
  while ((1 << (depth - 1)) < max_leaves) depth++;
  return depth + 1;
}

size_t moe_pairwise_bytes(size_t n, int max_leaves) {
  if (max_leaves < 1) return 0;
  return moe_align64((n ? n : 1) * (size_t)pairwise_cap(max_leaves) * sizeof(float));
}

moe_status moe_pairwise_init(moe_ctx *ctx, moe_pairwise *pw, size_t n, int max_leaves) {
  moe_status st = MOE_STATUS_OK;
  memset(pw, 0, sizeof *pw);
  MOE_FAIL_IF(ctx, max_leaves < 1 || max_leaves > (1 << 24), MOE_STATUS_INVALID_ARG,
              "pairwise sum: leaves %d out of range [1, %d]", max_leaves, 1 << 24);
  pw->cap = pairwise_cap(max_leaves);
  pw->n = pw->n_cap = n;
  pw->max_leaves = max_leaves;
  pw->buf = moe_malloc((n ? n : 1) * (size_t)pw->cap * sizeof(float));
  MOE_FAIL_IF(ctx, !pw->buf, MOE_STATUS_OUT_OF_MEMORY,
              "pairwise sum: out of memory (%d x %zu floats)", pw->cap, n);
done:
  return st;
}

void moe_pairwise_free(moe_pairwise *pw) {
  moe_free(pw->buf);
  memset(pw, 0, sizeof *pw);
}

void moe_pairwise_reset(moe_pairwise *pw, size_t n) {
  pw->top = 0;
  pw->n = n < pw->n_cap ? n : pw->n_cap;
}

float *moe_pairwise_leaf(moe_pairwise *pw) { return pw->buf + (size_t)pw->top * pw->n; }

void moe_pairwise_push(moe_pairwise *pw) {
  pw->size[pw->top++] = 1;
  while (pw->top >= 2 && pw->size[pw->top - 1] == pw->size[pw->top - 2]) {
    moe_add_inplace(pw->buf + (size_t)(pw->top - 2) * pw->n,
                    pw->buf + (size_t)(pw->top - 1) * pw->n, pw->n);
    pw->size[pw->top - 2] *= 2;
    pw->top--;
  }
}

const float *moe_pairwise_result(moe_pairwise *pw) {
  if (pw->top == 0) {
    float *z = pw->buf;
    for (size_t i = 0; i < pw->n; i++) z[i] = 0.0f;
    return z;
  }
  // The tree over a count that is not a power of two, padded with absent
  // leaves: the remaining nodes (largest first) fold from the right.
  for (int i = pw->top - 2; i >= 0; i--) {
    moe_add_inplace(pw->buf + (size_t)i * pw->n, pw->buf + (size_t)(i + 1) * pw->n, pw->n);
  }
  pw->size[0] = 0;
  for (int i = 0; i < pw->top; i++) pw->size[0] += pw->size[i];
  pw->top = 1;
  return pw->buf;
}

void moe_pairwise_wgrad(moe_pairwise *pw, moe_gemm_fn gemm, float *dw, float *db, const float *x,
                        const float *dy, int slices, int rows, int din, int dout) {
  if (!gemm) gemm = moe_gemm;
  const size_t nw = (size_t)din * (size_t)dout;
  moe_pairwise_reset(pw, nw + (db ? (size_t)dout : 0));
  for (int q = 0; q < slices; q++) {
    float *leaf = moe_pairwise_leaf(pw);
    const float *xq = x + (size_t)q * rows * din, *dyq = dy + (size_t)q * rows * dout;
    gemm(1, 0, din, dout, rows, 1.0f, xq, din, dyq, dout, 0.0f, leaf, dout);
    if (db) {
      memset(leaf + nw, 0, (size_t)dout * sizeof(float));
      moe_bias_add_backward(leaf + nw, dyq, rows, dout);
    }
    moe_pairwise_push(pw);
  }
  const float *root = moe_pairwise_result(pw);
  moe_add_inplace(dw, root, nw);
  if (db) moe_add_inplace(db, root + nw, (size_t)dout);
}
