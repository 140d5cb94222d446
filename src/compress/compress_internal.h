// The shell shared by the 16-bit-per-value compressors (fp16, bf16): a
// (rows, cols) float matrix becomes rows*cols 16-bit codes, element by
// element, and back. The per-element conversions are the compressor's own;
// these are static inline and called with a known function, so the compiler
// inlines the conversion into the loop.
#ifndef MOE_COMPRESS_INTERNAL_H
#define MOE_COMPRESS_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "moe/compress.h"

static inline size_t moe_codec16_max_bytes(size_t rows, size_t cols) {
  return rows * cols * sizeof(uint16_t);
}

// x (rows*cols) -> out (rows*cols codes), *out_bytes = their size.
static inline void moe_codec16_encode(uint16_t (*enc)(float), const float *x, size_t n, void *out,
                                      size_t *out_bytes) {
  unsigned char *o = out;
  for (size_t i = 0; i < n; i++) {
    const uint16_t h = enc(x[i]);
    memcpy(o + 2 * i, &h, sizeof h);
  }
  *out_bytes = n * sizeof(uint16_t);
}

// in (rows*cols codes) -> y (rows, cols); BAD_FORMAT naming the codec when
// in_bytes is not the size of a (rows, cols) matrix.
static inline moe_status moe_codec16_decode(float (*dec)(uint16_t), const char *name, moe_ctx *ctx,
                                            const void *in, size_t in_bytes, size_t rows,
                                            size_t cols, float *y) {
  moe_status st = MOE_STATUS_OK;
  const size_t n = rows * cols;
  const unsigned char *p = in;
  MOE_FAIL_IF(ctx, in_bytes != n * sizeof(uint16_t), MOE_STATUS_BAD_FORMAT,
              "%s: a (%zu, %zu) matrix is %zu bytes, got %zu", name, rows, cols,
              n * sizeof(uint16_t), in_bytes);
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h);
    y[i] = dec(h);
  }
done:
  return st;
}

#endif
