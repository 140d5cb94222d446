// The registry of compressors: the catalogue (one line per compressor, below),
// spec parsing ("name:PARAM" for a compressor that declares a parameter), the
// list of names, and the checked entry points (moe_compress, moe_decompress)
// that validate what the implementations assume. A new compressor is one file
// (src/compress/compress_<name>.c defining
// `const moe_compressor_entry moe_compressor_<name>`) plus one X(<name>) line in
// MOE_COMPRESSOR_CATALOG.
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/compress.h"

// The catalogue, in this order (moe_compressor_list, name lists, the planner).
#define MOE_COMPRESSOR_CATALOG(X) \
  X(none)                         \
  X(fp16)                         \
  X(bf16)                         \
  X(int8)                         \
  X(zfp)

#define MOE_COMPRESSOR_DECLARE(name) extern const moe_compressor_entry moe_compressor_##name;
#define MOE_COMPRESSOR_REF(name) &moe_compressor_##name,
MOE_COMPRESSOR_CATALOG(MOE_COMPRESSOR_DECLARE)
static const moe_compressor_entry *const k_compressors[] = {
    MOE_COMPRESSOR_CATALOG(MOE_COMPRESSOR_REF)};
#define N_COMPRESSORS ((int)(sizeof k_compressors / sizeof k_compressors[0]))

// The largest rows*cols accepted: every format fits in 8*n + 64 bytes.
#define MOE_COMPRESS_MAX_N ((SIZE_MAX - 64) / 8)

const moe_compressor_entry *const *moe_compressor_list(int *count) {
  if (count) *count = N_COMPRESSORS;
  return k_compressors;
}

// The names, built once from k_compressors ("zfp[:RATE]" for one with a
// parameter; compressors missing from this build are left out).
static char g_names[256];
static pthread_once_t g_names_once = PTHREAD_ONCE_INIT;

static void build_names(void) {
  size_t used = 0;
  for (int i = 0; i < N_COMPRESSORS; i++) {
    const moe_compressor_entry *e = k_compressors[i];
    if (!e->available) continue;
    const int w = snprintf(g_names + used, sizeof g_names - used, "%s%s%s%s%s", used ? ", " : "",
                           e->codec.name, e->param ? "[:" : "", e->param ? e->param->name : "",
                           e->param ? "]" : "");
    if (w < 0 || (size_t)w >= sizeof g_names - used) break;
    used += (size_t)w;
  }
}

const char *moe_compressor_names(void) {
  pthread_once(&g_names_once, build_names);
  return g_names;
}

// The entry whose name is the first len characters of name, or NULL.
static const moe_compressor_entry *lookup(const char *name, size_t len) {
  for (int i = 0; i < N_COMPRESSORS; i++) {
    const char *nm = k_compressors[i]->codec.name;
    if (strlen(nm) == len && strncmp(nm, name, len) == 0) return k_compressors[i];
  }
  return NULL;
}

moe_status moe_compressor_find(moe_ctx *ctx, const char *name, const moe_compressor_entry **out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !name || !out, MOE_STATUS_INVALID_ARG, "compressor: name and out must be set");
  *out = lookup(name, strlen(name));
  MOE_FAIL_IF(ctx, !*out, MOE_STATUS_INVALID_ARG, "unknown compressor '%s' (valid: %s)", name,
              moe_compressor_names());
done:
  return st;
}

void moe_compressor_default_spec(const moe_compressor_entry *e, char *buf, size_t len) {
  if (e->param) {
    snprintf(buf, len, "%s:%g", e->codec.name, e->param->def);
  } else {
    snprintf(buf, len, "%s", e->codec.name);
  }
}

int moe_compressor_is_identity(const moe_compressor *c) {
  const moe_compressor_entry *e = c && c->name ? lookup(c->name, strlen(c->name)) : NULL;
  return e && e->identity;
}

moe_status moe_compressor_get(moe_ctx *ctx, const char *spec, moe_compressor *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !spec || !out, MOE_STATUS_INVALID_ARG, "compressor: spec and out must be set");
  const char *colon = strchr(spec, ':');
  const moe_compressor_entry *found = lookup(spec, colon ? (size_t)(colon - spec) : strlen(spec));
  MOE_FAIL_IF(ctx, !found, MOE_STATUS_INVALID_ARG, "unknown compressor '%s' (valid: %s)", spec,
              moe_compressor_names());
  MOE_FAIL_IF(ctx, !found->available, MOE_STATUS_UNSUPPORTED,
              "compressor '%s' is not available: %s; valid here: %s", found->codec.name,
              found->unavailable ? found->unavailable : "not compiled in", moe_compressor_names());
  MOE_FAIL_IF(ctx, colon && !found->param, MOE_STATUS_INVALID_ARG,
              "compressor '%s' takes no parameter (valid: %s)", spec, moe_compressor_names());
  *out = found->codec;
  if (found->param) out->param = found->param->def;
  if (colon) {
    const moe_compressor_param *p = found->param;
    char *end = NULL;
    errno = 0;
    const double v = strtod(colon + 1, &end);
    char what[32];  // "rate" from "RATE"
    size_t k = 0;
    for (; p->name[k] && k + 1 < sizeof what; k++)
      what[k] = (char)tolower((unsigned char)p->name[k]);
    what[k] = '\0';
    MOE_FAIL_IF(
        ctx,
        end == colon + 1 || *end != '\0' || errno == ERANGE || !(v >= p->min) || !(v <= p->max),
        MOE_STATUS_INVALID_ARG, "%s %s '%s' must be a number of %s in [%g, %g] (e.g. %s:%g)",
        found->codec.name, what, colon + 1, p->meaning, p->min, p->max, found->codec.name, p->def);
    out->param = v;
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
