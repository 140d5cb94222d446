// Pairwise (tree) summation of equal-sized vectors, one leaf at a time, in a
// fixed order (moe_pairwise_* in kernels.h): the deterministic mode sums the
// per-slice weight gradients with it, so that a rank holding slices
// [k 2^j, (k+1) 2^j) produces exactly one node of the tree over all slices.
#include <string.h>

#include "moe/core.h"
#include "moe/kernels.h"

moe_status moe_pairwise_init(moe_ctx *ctx, moe_pairwise *pw, size_t n, int max_leaves) {
  moe_status st = MOE_STATUS_OK;
  memset(pw, 0, sizeof *pw);
  MOE_FAIL_IF(ctx, max_leaves < 1 || max_leaves > (1 << 24), MOE_STATUS_INVALID_ARG,
              "pairwise sum: leaves %d out of range [1, %d]", max_leaves, 1 << 24);
  int depth = 1;
  while ((1 << (depth - 1)) < max_leaves) depth++;
  pw->cap = depth + 1;
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

static void add_into(float *restrict lo, const float *restrict hi, size_t n) {
  for (size_t i = 0; i < n; i++) lo[i] = lo[i] + hi[i];
}

void moe_pairwise_push(moe_pairwise *pw) {
  pw->size[pw->top++] = 1;
  while (pw->top >= 2 && pw->size[pw->top - 1] == pw->size[pw->top - 2]) {
    add_into(pw->buf + (size_t)(pw->top - 2) * pw->n, pw->buf + (size_t)(pw->top - 1) * pw->n,
             pw->n);
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
    add_into(pw->buf + (size_t)i * pw->n, pw->buf + (size_t)(i + 1) * pw->n, pw->n);
  }
  pw->size[0] = 0;
  for (int i = 0; i < pw->top; i++) pw->size[0] += pw->size[i];
  pw->top = 1;
  return pw->buf;
}
