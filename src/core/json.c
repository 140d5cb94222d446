// JSON helpers over cJSON (see json.h). Keeps cJSON out of the public headers.
#define _POSIX_C_SOURCE 200809L
#include "core/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

// Byte offset of the first \u0000 escape in text (a NUL inside a JSON
// string, which C strings would silently cut: "ffn\u0000x" would read as
// "ffn"), or -1. An escape is a backslash preceded by an even number of
// backslashes.
static long find_nul_escape(const char *text) {
  for (const char *p = text; *p; p++) {
    if (p[0] != '\\' || p[1] != 'u' || p[2] != '0' || p[3] != '0' || p[4] != '0' || p[5] != '0')
      continue;
    size_t run = 0;
    for (const char *q = p; q > text && q[-1] == '\\'; q--) run++;
    if (run % 2 == 0) return (long)(p - text);
  }
  return -1;
}

moe_status moe_json_parse_object(moe_ctx *ctx, const char *text, const char *what, cJSON **out) {
  moe_status st = MOE_STATUS_OK;
  *out = NULL;
  MOE_FAIL_IF(ctx, !text, MOE_STATUS_INVALID_ARG, "%s: no JSON text", what);
  const long nul = find_nul_escape(text);
  MOE_FAIL_IF(ctx, nul >= 0, MOE_STATUS_BAD_FORMAT,
              "%s: a string holds a NUL character (\\u0000 at byte %ld): not allowed", what, nul);
  // ParseWithOpts reports where parsing stopped through `end` (no global state)
  // and, with require_null_terminated, rejects trailing text.
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
  if (!root) {
    const long pos = end ? (long)(end - text) : -1;
    MOE_FAIL(ctx, MOE_STATUS_BAD_FORMAT, "%s: malformed JSON near byte %ld", what, pos);
  }
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    MOE_FAIL(ctx, MOE_STATUS_BAD_FORMAT, "%s: expected a JSON object at the top level", what);
  }
  *out = root;
done:
  return st;
}

moe_status moe_read_file(moe_ctx *ctx, const char *path, size_t max_bytes, char **out,
                         size_t *len) {
  moe_status st = MOE_STATUS_OK;
  char *buf = NULL;
  FILE *f = NULL;
  *out = NULL;
  if (len) *len = 0;
  f = fopen(path, "rb");
  MOE_FAIL_IF(ctx, !f, MOE_STATUS_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat sb;
  MOE_FAIL_IF(ctx, fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode), MOE_STATUS_IO,
              "'%s' is not a regular file", path);
  MOE_FAIL_IF(ctx, fseek(f, 0, SEEK_END) != 0, MOE_STATUS_IO, "cannot seek '%s'", path);
  long size = ftell(f);
  MOE_FAIL_IF(ctx, size < 0, MOE_STATUS_IO, "cannot size '%s'", path);
  MOE_FAIL_IF(ctx, (size_t)size > max_bytes, MOE_STATUS_INVALID_ARG,
              "'%s' is %ld bytes; the limit is %zu", path, size, max_bytes);
  rewind(f);
  buf = moe_malloc((size_t)size + 1);
  MOE_FAIL_IF(ctx, !buf, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %ld bytes for '%s'", size + 1,
              path);
  MOE_FAIL_IF(ctx, fread(buf, 1, (size_t)size, f) != (size_t)size, MOE_STATUS_IO,
              "short read on '%s'", path);
  buf[size] = '\0';
  *out = buf;
  buf = NULL;
  if (len) *len = (size_t)size;
done:
  if (f) fclose(f);
  moe_free(buf);
  return st;
}

moe_status moe_json_load_file(moe_ctx *ctx, const char *path, size_t max_bytes,
                              moe_json_text_parser parse, void *out) {
  moe_status st = MOE_STATUS_OK;
  char *text = NULL;
  MOE_TRY(moe_read_file(ctx, path, max_bytes, &text, NULL));
  st = parse(ctx, text, out);
  if (st != MOE_STATUS_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", moe_ctx_error(ctx));
    MOE_FAIL(ctx, st, "%s: %s", path, msg);
  }
done:
  moe_free(text);
  return st;
}

moe_status moe_json_get_int(moe_ctx *ctx, const cJSON *item, const char *what, int *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cJSON_IsNumber(item), MOE_STATUS_INVALID_ARG, "'%s' must be an integer", what);
  const double v = item->valuedouble;
  MOE_FAIL_IF(ctx, !(v == floor(v)), MOE_STATUS_INVALID_ARG, "'%s' must be an integer (got %.17g)",
              what, v);
  MOE_FAIL_IF(ctx, v < -2147483648.0 || v > 2147483647.0, MOE_STATUS_INVALID_ARG,
              "'%s' (%.0f) is out of range: integers here are in [-2147483648, 2147483647]", what,
              v);
  *out = (int)v;
done:
  return st;
}

moe_status moe_json_get_double(moe_ctx *ctx, const cJSON *item, const char *what, double *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cJSON_IsNumber(item), MOE_STATUS_INVALID_ARG, "'%s' must be a number", what);
  *out = item->valuedouble;
done:
  return st;
}

moe_status moe_json_get_bool(moe_ctx *ctx, const cJSON *item, const char *what, int *out) {
  moe_status st = MOE_STATUS_OK;
  if (cJSON_IsBool(item)) {
    *out = cJSON_IsTrue(item) ? 1 : 0;
  } else {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "'%s' must be true or false", what);
  }
done:
  return st;
}
