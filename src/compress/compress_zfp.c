// "zfp[:RATE]": libzfp (Lindstrom 2014) in fixed-rate mode, RATE bits per value
// (default 8, ScheMoE's choice; ALGORITHMS.md 1.3), on the matrix as a 2D field
// nx = cols (contiguous), ny = rows; a matrix with one row or one column is a 1D
// field instead (a 2D 4x4 block would pad it 4x).
//
// Format: a 40-byte header {char magic[4] = "MZF1", uint32 0, double rate,
// uint64 rows, uint64 cols, uint64 payload bytes} then the libzfp stream. In
// fixed-rate mode every 4^d block (partial blocks are padded by libzfp) takes
// exactly maxbits = round(rate * 4^d) bits, so the payload is blocks * maxbits
// bits rounded up to libzfp's stream word (stream_word_bits: 64 by default, 32 in
// Debian's build) whatever the data: max_bytes is exact.
//
// Why: ScheMoE's best codec for the all-to-all (BLEU unchanged at ~4x).
// Not: bounded. Fixed rate gives no a-priori error bound; docs/compression.md
// has the measured one. Not NaN/Inf-safe: non-finite input is rejected with
// INVALID_ARG. Buffers must be 8-byte aligned (libzfp reads 64-bit words).
// libzfp mallocs its bit-stream handle (stream_open) once per call; the stream
// and field descriptors live on the stack.
#include <stdint.h>
#include <string.h>

#include "moe/compress.h"
#include "moe_build_config.h"

#if MOE_HAVE_ZFP
#include <zfp.h>

enum { ZFP_HDR_BYTES = 40 };
static const char k_magic[4] = {'M', 'Z', 'F', '1'};

// Sets up a fixed-rate stream and a field for x (rows, cols) (rows, cols > 0);
// returns the payload bytes.
static size_t zfp_setup(double rate, size_t rows, size_t cols, zfp_stream *zs, zfp_field *f,
                        void *data) {
  const unsigned dims = (rows == 1 || cols == 1) ? 1u : 2u;
  memset(zs, 0, sizeof *zs);
  memset(f, 0, sizeof *f);
  zfp_stream_set_rate(zs, rate, zfp_type_float, dims, zfp_false);
  zfp_field_set_type(f, zfp_type_float);
  zfp_field_set_pointer(f, data);
  size_t blocks;
  if (dims == 1) {
    zfp_field_set_size_1d(f, rows * cols);
    blocks = (rows * cols + 3) / 4;
  } else {
    zfp_field_set_size_2d(f, cols, rows);
    blocks = ((rows + 3) / 4) * ((cols + 3) / 4);
  }
  const size_t bits = blocks * (size_t)zs->maxbits, w = stream_word_bits;
  return (bits + w - 1) / w * (w / 8);
}

static size_t zfp_c_max_bytes(const moe_compressor *c, size_t rows, size_t cols) {
  zfp_stream zs;
  zfp_field f;
  if (rows == 0 || cols == 0) return 0;
  return ZFP_HDR_BYTES + zfp_setup(c->param, rows, cols, &zs, &f, NULL);
}

// x (rows, cols) -> out: header, then the libzfp stream
static moe_status zfp_c_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                                 size_t cols, void *out, size_t *out_bytes) {
  moe_status st = MOE_STATUS_OK;
  bitstream *bs = NULL;
  const size_t n = rows * cols;
  unsigned char *o = out;
  *out_bytes = 0;
  if (n == 0) goto done;
  MOE_FAIL_IF(ctx, (uintptr_t)out % 8 != 0, MOE_STATUS_INVALID_ARG,
              "zfp: the output buffer must be 8-byte aligned");
  const ptrdiff_t bad = moe_find_nonfinite(x, n);
  MOE_FAIL_IF(ctx, bad >= 0, MOE_STATUS_INVALID_ARG,
              "zfp: x[%zu][%zu] = %g is not finite (zfp cannot represent NaN/Inf; use none, "
              "fp16 or bf16)",
              (size_t)bad / cols, (size_t)bad % cols, (double)x[bad]);
  zfp_stream zs;
  zfp_field f;
  const size_t payload = zfp_setup(c->param, rows, cols, &zs, &f, (void *)(uintptr_t)x);
  bs = stream_open(o + ZFP_HDR_BYTES, payload);
  MOE_FAIL_IF(ctx, !bs, MOE_STATUS_OUT_OF_MEMORY, "zfp: cannot open a bit stream");
  zfp_stream_set_bit_stream(&zs, bs);
  zfp_stream_rewind(&zs);
  const size_t got = zfp_compress(&zs, &f);
  MOE_FAIL_IF(ctx, got != payload, MOE_STATUS_INTERNAL,
              "zfp: libzfp wrote %zu bytes for a (%zu, %zu) matrix at rate %g, expected %zu", got,
              rows, cols, c->param, payload);
  const uint32_t zero = 0;
  const uint64_t h[3] = {(uint64_t)rows, (uint64_t)cols, (uint64_t)payload};
  memcpy(o, k_magic, 4);
  memcpy(o + 4, &zero, 4);
  memcpy(o + 8, &c->param, 8);
  memcpy(o + 16, h, sizeof h);
  *out_bytes = ZFP_HDR_BYTES + payload;
done:
  if (bs) stream_close(bs);
  return st;
}

// in (header, libzfp stream) -> y (rows, cols)
static moe_status zfp_c_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in,
                                   size_t in_bytes, size_t rows, size_t cols, float *y) {
  moe_status st = MOE_STATUS_OK;
  bitstream *bs = NULL;
  const unsigned char *p = in;
  (void)c;
  if (rows == 0 || cols == 0) {
    MOE_FAIL_IF(ctx, in_bytes != 0, MOE_STATUS_BAD_FORMAT,
                "zfp: an empty matrix is 0 bytes, got %zu", in_bytes);
    goto done;
  }
  MOE_FAIL_IF(ctx, in_bytes < ZFP_HDR_BYTES, MOE_STATUS_BAD_FORMAT,
              "zfp: %zu bytes is shorter than the %d-byte header", in_bytes, ZFP_HDR_BYTES);
  MOE_FAIL_IF(ctx, (uintptr_t)in % 8 != 0, MOE_STATUS_INVALID_ARG,
              "zfp: the input buffer must be 8-byte aligned");
  double rate;
  uint64_t h[3];
  memcpy(&rate, p + 8, 8);
  memcpy(h, p + 16, sizeof h);
  MOE_FAIL_IF(ctx, memcmp(p, k_magic, 4) != 0, MOE_STATUS_BAD_FORMAT,
              "zfp: bad magic (not a libmoe zfp buffer)");
  MOE_FAIL_IF(ctx, !(rate >= 1.0 && rate <= 32.0), MOE_STATUS_BAD_FORMAT,
              "zfp: header rate %g is outside [1, 32]", rate);
  MOE_FAIL_IF(ctx, h[0] != (uint64_t)rows || h[1] != (uint64_t)cols, MOE_STATUS_BAD_FORMAT,
              "zfp: the buffer holds a (%llu, %llu) matrix, expected (%zu, %zu)",
              (unsigned long long)h[0], (unsigned long long)h[1], rows, cols);
  zfp_stream zs;
  zfp_field f;
  const size_t payload = zfp_setup(rate, rows, cols, &zs, &f, y);
  MOE_FAIL_IF(ctx, h[2] != (uint64_t)payload || in_bytes != ZFP_HDR_BYTES + payload,
              MOE_STATUS_BAD_FORMAT,
              "zfp: %zu bytes (header says %llu payload bytes) for a (%zu, %zu) matrix at rate "
              "%g, expected %zu",
              in_bytes, (unsigned long long)h[2], rows, cols, rate, ZFP_HDR_BYTES + payload);
  bs = stream_open((void *)(uintptr_t)(p + ZFP_HDR_BYTES), payload);
  MOE_FAIL_IF(ctx, !bs, MOE_STATUS_OUT_OF_MEMORY, "zfp: cannot open a bit stream");
  zfp_stream_set_bit_stream(&zs, bs);
  zfp_stream_rewind(&zs);
  const size_t got = zfp_decompress(&zs, &f);
  MOE_FAIL_IF(ctx, got != payload, MOE_STATUS_BAD_FORMAT,
              "zfp: libzfp read %zu of %zu payload bytes", got, payload);
done:
  if (bs) stream_close(bs);
  return st;
}

#else  // no libzfp: the registry refuses "zfp" before these can be reached

static size_t zfp_c_max_bytes(const moe_compressor *c, size_t rows, size_t cols) {
  (void)c;
  (void)rows;
  (void)cols;
  return 0;
}

static moe_status zfp_c_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                                 size_t cols, void *out, size_t *out_bytes) {
  (void)c;
  (void)x;
  (void)rows;
  (void)cols;
  (void)out;
  *out_bytes = 0;
  return moe_error_at(ctx, MOE_STATUS_UNSUPPORTED, __FILE__, __LINE__,
                      "zfp: libmoe was built without libzfp (install libzfp-dev and rebuild)");
}

static moe_status zfp_c_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in,
                                   size_t in_bytes, size_t rows, size_t cols, float *y) {
  (void)c;
  (void)in;
  (void)in_bytes;
  (void)rows;
  (void)cols;
  (void)y;
  return moe_error_at(ctx, MOE_STATUS_UNSUPPORTED, __FILE__, __LINE__,
                      "zfp: libmoe was built without libzfp (install libzfp-dev and rebuild)");
}
#endif

#define ZFP_DEFAULT_RATE 8.0  // ScheMoE's choice
static const moe_compressor_param k_rate = {
    .name = "RATE", .meaning = "bits per value", .def = ZFP_DEFAULT_RATE, .min = 1.0, .max = 32.0};

const moe_compressor_entry moe_compressor_zfp = {
    .codec = {"zfp", 0, ZFP_DEFAULT_RATE, zfp_c_max_bytes, zfp_c_compress, zfp_c_decompress},
    .description = "libzfp fixed-rate (ScheMoE)",
    .available = MOE_HAVE_ZFP,
    .unavailable = "libmoe was built without libzfp (install libzfp-dev and rebuild)",
    .identity = 0,
    .plannable = 1,
    .param = &k_rate,
    .compress_gbs = 0.18,  // at rate 8
    .decompress_gbs = 0.21};
