// The registry of compressors: spec parsing ("zfp:RATE"), the list of names, and
// the checked entry points (moe_compress, moe_decompress) that validate what the
// implementations assume. A new compressor is one file
// (src/compress/compress_<name>.c defining moe_compressor_<name>_impl) plus one
// line in k_compressors.
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/compress.h"
#include "moe_build_config.h"

extern const moe_compressor moe_compressor_none_impl;
extern const moe_compressor moe_compressor_fp16_impl;
extern const moe_compressor moe_compressor_bf16_impl;
extern const moe_compressor moe_compressor_int8_impl;
extern const moe_compressor moe_compressor_zfp_impl;

static const moe_compressor *const k_compressors[] = {
    &moe_compressor_none_impl, &moe_compressor_fp16_impl, &moe_compressor_bf16_impl,
    &moe_compressor_int8_impl, &moe_compressor_zfp_impl,
};

// The largest rows*cols accepted: every format fits in 8*n + 64 bytes.
#define MOE_COMPRESS_MAX_N ((SIZE_MAX - 64) / 8)

// The names, built once from k_compressors ("zfp[:RATE]" for the one with a
// parameter; compressors missing from this build are left out).
static char g_names[256];
static pthread_once_t g_names_once = PTHREAD_ONCE_INIT;

static void build_names(void) {
  size_t used = 0;
  for (size_t i = 0; i < sizeof k_compressors / sizeof k_compressors[0]; i++) {
    const char *nm = k_compressors[i]->name;
    const int is_zfp = strcmp(nm, "zfp") == 0;
    if (is_zfp && !MOE_HAVE_ZFP) continue;
    const int w = snprintf(g_names + used, sizeof g_names - used, "%s%s%s", used ? ", " : "", nm,
                           is_zfp ? "[:RATE]" : "");
    if (w < 0 || (size_t)w >= sizeof g_names - used) break;
    used += (size_t)w;
  }
}

const char *moe_compressor_names(void) {
  pthread_once(&g_names_once, build_names);
  return g_names;
}

moe_status moe_compressor_get(moe_ctx *ctx, const char *spec, moe_compressor *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !spec || !out, MOE_STATUS_INVALID_ARG, "compressor: spec and out must be set");
  const char *colon = strchr(spec, ':');
  const size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
  const moe_compressor *found = NULL;
  for (size_t i = 0; i < sizeof k_compressors / sizeof k_compressors[0]; i++) {
    const char *nm = k_compressors[i]->name;
    if (strlen(nm) == name_len && strncmp(nm, spec, name_len) == 0) found = k_compressors[i];
  }
  MOE_FAIL_IF(ctx, !found, MOE_STATUS_INVALID_ARG, "unknown compressor '%s' (valid: %s)", spec,
              moe_compressor_names());
  const int is_zfp = strcmp(found->name, "zfp") == 0;
  MOE_FAIL_IF(ctx, is_zfp && !MOE_HAVE_ZFP, MOE_STATUS_UNSUPPORTED,
              "compressor 'zfp' is not available: libmoe was built without libzfp (install "
              "libzfp-dev and rebuild; valid here: %s)",
              moe_compressor_names());
  MOE_FAIL_IF(ctx, colon && !is_zfp, MOE_STATUS_INVALID_ARG,
              "compressor '%s' takes no parameter (only zfp:RATE does)", spec);
  *out = *found;
  if (colon) {
    char *end = NULL;
    errno = 0;
    const double rate = strtod(colon + 1, &end);
    MOE_FAIL_IF(
        ctx,
        end == colon + 1 || *end != '\0' || errno == ERANGE || !(rate >= 1.0) || !(rate <= 32.0),
        MOE_STATUS_INVALID_ARG,
        "zfp rate '%s' must be a number of bits per value in [1, 32] (e.g. zfp:8)", colon + 1);
    out->param = rate;
  }
done:
  return st;
}

size_t moe_compress_max_bytes(const moe_compressor *c, size_t rows, size_t cols) {
  if (rows != 0 && cols > MOE_COMPRESS_MAX_N / rows) return SIZE_MAX;
  return c->max_bytes(c, rows, cols);
}

// Shared checks of both directions: c valid, rows*cols in range.
static moe_status check_common(const moe_compressor *c, moe_ctx *ctx, const char *what, size_t rows,
                               size_t cols) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !c || !c->max_bytes || !c->compress || !c->decompress, MOE_STATUS_INVALID_ARG,
              "%s: the compressor is not set (use moe_compressor_get)", what);
  MOE_FAIL_IF(ctx, rows != 0 && cols > MOE_COMPRESS_MAX_N / rows, MOE_STATUS_INVALID_ARG,
              "%s %s: a (%zu, %zu) matrix is too large", c->name, what, rows, cols);
done:
  return st;
}

moe_status moe_compress(const moe_compressor *c, moe_ctx *ctx, const float *x, size_t rows,
                        size_t cols, void *out, size_t out_capacity, size_t *out_bytes) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !out_bytes, MOE_STATUS_INVALID_ARG, "compress: out_bytes must be set");
  *out_bytes = 0;
  MOE_TRY(check_common(c, ctx, "compress", rows, cols));
  const size_t n = rows * cols;
  MOE_FAIL_IF(ctx, n && (!x || !out), MOE_STATUS_INVALID_ARG,
              "%s compress: x and out must be set for a (%zu, %zu) matrix", c->name, rows, cols);
  const size_t need = c->max_bytes(c, rows, cols);
  MOE_FAIL_IF(ctx, out_capacity < need, MOE_STATUS_INVALID_ARG,
              "%s compress: the output buffer holds %zu bytes, a (%zu, %zu) matrix needs up to %zu",
              c->name, out_capacity, rows, cols, need);
  MOE_TRY(c->compress(c, ctx, x, rows, cols, out, out_bytes));
done:
  return st;
}

moe_status moe_decompress(const moe_compressor *c, moe_ctx *ctx, const void *in, size_t in_bytes,
                          size_t rows, size_t cols, float *y) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(check_common(c, ctx, "decompress", rows, cols));
  MOE_FAIL_IF(ctx, (in_bytes && !in) || (rows * cols != 0 && !y), MOE_STATUS_INVALID_ARG,
              "%s decompress: in and y must be set for a (%zu, %zu) matrix", c->name, rows, cols);
  MOE_TRY(c->decompress(c, ctx, in, in_bytes, rows, cols, y));
done:
  return st;
}
