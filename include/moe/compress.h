// libmoe compressors for all-to-all payloads: a small vtable (ScheMoE's
// AbsCompressor) and a registry that builds one from a spec string.
//
// What: lossy or lossless codecs of a row-major float matrix x (rows, cols) into
// a byte buffer, and back. Registered: "none" (identity), "fp16" (IEEE half,
// round-to-nearest-even), "bf16" (bfloat16, round-to-nearest-even), "int8"
// (per-row min/range quantisation, ScheMoE) and "zfp[:RATE]" (libzfp fixed-rate,
// RATE bits/value, default 8; only when built with libzfp).
// Why: the ScheMoE experiments (ALGORITHMS.md 1.3) shrink the expert all-to-all
// by compressing its payload; one signature lets the layer and the benchmark
// swap codecs by name.
// Not: a streaming or self-describing container format. The caller knows (rows,
// cols) and the compressor on both sides. No GPU path. Not thread-hostile:
// compressors hold no state, any thread may call them with its own ctx.
//
// Buffers: the caller provides every buffer (at least moe_compress_max_bytes
// bytes for the compressed form; 8-byte aligned for zfp, as libmoe's 64-byte
// aligned moe_malloc buffers are). No compressor allocates through moe_malloc.
// libzfp itself mallocs its small bit-stream handle per call (its C API has no
// caller-provided variant); that is the only allocation on any path.
//
// Formats (n = rows*cols; native byte order; empty input (n = 0) is 0 bytes for
// every compressor, and decompressing 0 bytes of it writes nothing):
//   none  n float32                                   4n bytes
//   fp16  n binary16                                  2n bytes
//   bf16  n bfloat16 (top 16 bits of the float32)     2n bytes
//   int8  rows x {float bias, float scale}, then n uint8 (row-major)
//                                                     8*rows + n bytes
//   zfp   40-byte header {char magic[4] "MZF1", uint32 0, double rate,
//         uint64 rows, uint64 cols, uint64 payload bytes}, then the libzfp
//         stream of the 2D field nx = cols, ny = rows (fixed rate, 4x4 blocks,
//         partial blocks padded by libzfp; a 1D field when rows or cols is 1)
//         40 + ceil(blocks * round(rate * 4^d) / W) * W/8 bytes, W = libzfp's
//         stream word (64 bits, or 32 in Debian's libzfp); exact, data-independent
//
// Error bounds (per element; what tests/test_compress.c asserts):
//   none  exact (bit-identical, NaN payloads included).
//   fp16  correctly rounded (round-to-nearest-even, checked bit-exactly against a
//         reference); for |x| in the half normal range [2^-14, 65504]
//         |y - x| <= 2^-11 |x|; below it |y - x| <= 2^-25 (half a subnormal ulp);
//         |x| >= 65520 becomes +-Inf, as IEEE rounding says.
//   bf16  correctly rounded; |y - x| <= 2^-8 |x| for normal floats; values that
//         round above 0x1.FEp127 become +-Inf.
//   int8  |y - x| <= scale/510 + 2^-21 (|bias| + scale), scale = row max - row min
//         (half a quantisation step plus float rounding); constant rows exact.
//   zfp   no a-priori bound in fixed-rate mode. Empirical, over uniform, normal,
//         log-uniform and smooth test data (worst seen ~47 * 2^-rate; see
//         docs/compression.md): |y - x| <= (2^(6 - rate) + 2^-23) * max|x| over
//         the matrix; asserted for rates 4, 8, 12, 16, 24, 32. At rate 8 on white
//         noise that is up to ~0.17 max|x|: far looser than int8.
//
// NaN/Inf policy:
//   none, fp16, bf16  preserve NaN (stays NaN, quiet, sign kept) and +-Inf.
//   int8, zfp         reject non-finite input with INVALID_ARG naming the first
//                     bad (row, col); int8 also rejects rows whose max - min
//                     overflows float.
#ifndef MOE_COMPRESS_H
#define MOE_COMPRESS_H

#include <stddef.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_compressor moe_compressor;

// A compressor: a name, a parameter and three functions. Plain data: copy it
// freely. Prefer the checked entry points below to calling the pointers
// directly: they validate the arguments the implementations assume valid.
struct moe_compressor {
  const char *name;  // "none", "fp16", "bf16", "int8", "zfp"
  int lossless;      // 1 for none
  double param;      // zfp rate (bits/value); 0 otherwise
  // Max bytes of the compressed form of a (rows, cols) float matrix.
  size_t (*max_bytes)(const moe_compressor *c, size_t rows, size_t cols);
  // x (rows, cols) -> out; *out_bytes = bytes written (<= max_bytes). Never
  // allocates through moe_malloc.
  moe_status (*compress)(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                         size_t cols, void *out, size_t *out_bytes);
  // in (in_bytes, from compress) -> y (rows, cols). BAD_FORMAT if in_bytes or the
  // header do not match (rows, cols) (e.g. a truncated buffer).
  moe_status (*decompress)(const moe_compressor *c, moe_ctx *ctx, const void *in, size_t in_bytes,
                           size_t rows, size_t cols, float *y);
};

// ---- the catalogue ----------------------------------------------------------------------
// Each compressor's file (src/compress/compress_<name>.c) defines ONE entry,
// `const moe_compressor_entry moe_compressor_<name>`, and the registry
// (src/compress/compress_registry.c) lists them in one array: a new compressor
// is one file plus one registry line. Names, parameters, default modelled rates
// and the planner's candidates are read from here and nowhere else.

// A compressor's numeric parameter, parsed from "name:VALUE" (zfp's rate).
typedef struct {
  const char *name;     // as shown in the name list, "RATE" -> "zfp[:RATE]"
  const char *meaning;  // "bits per value"
  double def;           // the value without ":VALUE" (also the codec's param)
  double min, max;      // valid range, inclusive
} moe_compressor_param;

typedef struct {
  moe_compressor codec;  // name, lossless, param = the default parameter, functions
  const char *description;
  int available;            // 0: not compiled into this build
  const char *unavailable;  // then: what to install ("libzfp-dev")
  int identity;             // 1: the compressed form is the input (the layer skips C/D tasks)
  int plannable;            // 1: the planner (`auto`) considers it (lossy ones only when allowed)
  const moe_compressor_param *param;  // NULL: takes no parameter
  // Default modelled throughput, GB/s of float input per device (compress,
  // decompress), used by the layer simulator when no profile or --codec-gbs is
  // given (one core of the development machine, docs/compression.md).
  double compress_gbs, decompress_gbs;
} moe_compressor_entry;

// Registered compressors in a fixed order (those not compiled in included,
// available = 0): an array of *count pointers.
const moe_compressor_entry *const *moe_compressor_list(int *count);
// The entry of a compressor name (without ":PARAM"); INVALID_ARG naming the
// valid names otherwise. Unavailable ones are found (check ->available).
moe_status moe_compressor_find(moe_ctx *ctx, const char *name, const moe_compressor_entry **out);
// The spec selecting an entry with its default parameter: "none", "zfp:8".
void moe_compressor_default_spec(const moe_compressor_entry *e, char *buf, size_t len);
// 1 when c's compressed form is its input (no compression: "none").
int moe_compressor_is_identity(const moe_compressor *c);

// Builds the compressor named by spec: a registered name, or "name:VALUE" for
// one with a parameter (zfp:RATE, RATE a number in [1, 32], bits per value;
// default 8). Unknown names give INVALID_ARG listing the valid ones; a bad or
// unexpected parameter INVALID_ARG naming its range; a compressor not compiled
// in (zfp without libzfp) UNSUPPORTED. spec and out must not be NULL.
moe_status moe_compressor_get(moe_ctx *ctx, const char *spec, moe_compressor *out);

// "none, fp16, bf16, int8, zfp[:RATE]": the available compressors, each with its
// parameter in brackets.
const char *moe_compressor_names(void);

// Largest compressed size of a (rows, cols) matrix; SIZE_MAX if rows*cols is too
// large for this process (moe_compress then fails with INVALID_ARG).
size_t moe_compress_max_bytes(const moe_compressor *c, size_t rows, size_t cols);

// Checked c->compress: x (rows, cols) -> out (out_capacity bytes, at least
// moe_compress_max_bytes(c, rows, cols)). x and out may be NULL only when the
// matrix is empty. *out_bytes gets the bytes written.
moe_status moe_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                        size_t cols, void *out, size_t out_capacity, size_t *out_bytes);

// Checked c->decompress: in (in_bytes) -> y (rows, cols).
moe_status moe_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in, size_t in_bytes,
                          size_t rows, size_t cols, float *y);

#ifdef __cplusplus
}
#endif
#endif  // MOE_COMPRESS_H
