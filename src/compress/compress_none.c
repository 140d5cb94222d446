// "none": the identity compressor (ScheMoE's `no`). The compressed form is the
// float32 matrix itself, bit for bit, so NaN payloads and -0 survive.
// Why: the baseline every lossy codec is measured against, and the default of a
// layer that does not compress. Not: a copy elision; it always copies.
#include <string.h>

#include "moe/compress.h"

static size_t none_max_bytes(const moe_compressor *c, size_t rows, size_t cols) {
  (void)c;
  return rows * cols * sizeof(float);
}

// x (rows, cols) -> out (rows*cols floats)
static moe_status none_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                                size_t cols, void *out, size_t *out_bytes) {
  (void)c;
  (void)ctx;
  const size_t bytes = rows * cols * sizeof(float);
  if (bytes) memcpy(out, x, bytes);
  *out_bytes = bytes;
  return MOE_STATUS_OK;
}

// in (rows*cols floats) -> y (rows, cols)
static moe_status none_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in,
                                  size_t in_bytes, size_t rows, size_t cols, float *y) {
  moe_status st = MOE_STATUS_OK;
  const size_t bytes = rows * cols * sizeof(float);
  (void)c;
  MOE_FAIL_IF(ctx, in_bytes != bytes, MOE_STATUS_BAD_FORMAT,
              "none: a (%zu, %zu) matrix is %zu bytes, got %zu", rows, cols, bytes, in_bytes);
  if (bytes) memcpy(y, in, bytes);
done:
  return st;
}

const moe_compressor_entry moe_compressor_none = {
    .codec = {"none", 1, 0.0, none_max_bytes, none_compress, none_decompress},
    .description = "identity (ScheMoE's no compression): the float32 matrix as is",
    .available = 1,
    .identity = 1,
    .plannable = 1,
    .param = NULL,
    .compress_gbs = 12.7,
    .decompress_gbs = 13.3};
