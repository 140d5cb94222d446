// Expert popularity from a recorded routing trace (moe train --routing-trace,
// format in src/train/routing_trace.c and docs/balance.md "Routing traces"):
// the skew "trace:FILE" replays the shares of the choices per expert that a
// trained router produced, through the same bias fit as the named skews.
//
// Only the popularity per expert is replayed, not the (source rank x expert)
// pattern: the router bias is one per layer, the same on every rank (a
// token's routing must not depend on where it is).
//
// Not here: writing traces (src/train/routing_trace.c), the bias fit
// (router_bias.c).
#define _POSIX_C_SOURCE 200809L  // getline
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "moe/layer.h"

#define TRACE_MAX_LINE ((size_t)16 << 20)  // bytes of one line (P x E counts)

typedef struct {
  int ranks, experts, top_k, tokens;
  int layers[256], n_layers;
} trace_header;

static moe_status parse_header(moe_ctx *ctx, const char *path, const char *line, trace_header *h) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  MOE_TRY(moe_json_parse_object(ctx, line, "routing trace header", &root));
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  MOE_FAIL_IF(ctx, !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "libmoe-routing-trace") != 0,
              MOE_STATUS_BAD_FORMAT,
              "%s: not a routing trace (its first line has no \"format\": "
              "\"libmoe-routing-trace\")",
              path);
  int version = 0;
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "version"),
                           "routing trace version", &version));
  MOE_FAIL_IF(ctx, version != 1, MOE_STATUS_BAD_FORMAT,
              "%s: routing trace version %d, this build reads version 1", path, version);
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "ranks"),
                           "routing trace ranks", &h->ranks));
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "experts"),
                           "routing trace experts", &h->experts));
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "top_k"),
                           "routing trace top_k", &h->top_k));
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "tokens_per_rank"),
                           "routing trace tokens_per_rank", &h->tokens));
  MOE_FAIL_IF(ctx,
              h->ranks < 1 || h->ranks > (1 << 20) || h->experts < 1 || h->experts > 65536 ||
                  h->top_k < 1 || h->top_k > h->experts || h->tokens < 0,
              MOE_STATUS_BAD_FORMAT,
              "%s: header out of range (ranks %d in [1, 2^20], experts %d in [1, 65536], top_k "
              "%d in [1, experts], tokens_per_rank %d >= 0)",
              path, h->ranks, h->experts, h->top_k, h->tokens);
  const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "moe_layers");
  MOE_FAIL_IF(ctx, !cJSON_IsArray(layers), MOE_STATUS_BAD_FORMAT,
              "%s: header has no \"moe_layers\" array", path);
  h->n_layers = 0;
  const cJSON *it = NULL;
  cJSON_ArrayForEach(it, layers) {
    int b = -1;
    MOE_TRY(moe_json_get_int(ctx, it, "routing trace moe_layers entry", &b));
    MOE_FAIL_IF(ctx, b < 0 || b > 255 || h->n_layers >= 256, MOE_STATUS_BAD_FORMAT,
                "%s: moe_layers entry %d out of range [0, 255] (at most 256 entries)", path, b);
    h->layers[h->n_layers++] = b;
  }
  MOE_FAIL_IF(ctx, h->n_layers == 0, MOE_STATUS_BAD_FORMAT, "%s: moe_layers is empty", path);
done:
  cJSON_Delete(root);
  return st;
}

// Adds line `lineno`'s counts to sums (E) when sel selects its layer and
// step (*used 1), else checks it only (*used 0).
static moe_status add_line(moe_ctx *ctx, const char *path, int lineno, const char *line,
                           const trace_header *h, const moe_skew *sel, double *sums, int *used) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  char what[64];
  snprintf(what, sizeof what, "routing trace line %d", lineno);
  MOE_TRY(moe_json_parse_object(ctx, line, what, &root));
  int step = 0, layer = -1;
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "step"), what, &step));
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "layer"), what, &layer));
  int known = 0;
  for (int i = 0; i < h->n_layers; i++) known |= h->layers[i] == layer;
  MOE_FAIL_IF(ctx, step < 1 || !known, MOE_STATUS_BAD_FORMAT,
              "%s line %d: step %d (>= 1) or layer %d (not among the header's moe_layers)", path,
              lineno, step, layer);
  *used = (sel->trace_layer < 0 || sel->trace_layer == layer) &&
          (sel->trace_first <= 0 || step >= sel->trace_first) &&
          (sel->trace_last <= 0 || step <= sel->trace_last);
  const cJSON *counts = cJSON_GetObjectItemCaseSensitive(root, "counts");
  MOE_FAIL_IF(ctx, !cJSON_IsArray(counts) || cJSON_GetArraySize(counts) != h->ranks,
              MOE_STATUS_BAD_FORMAT, "%s line %d: \"counts\" must be %d rows (the ranks)", path,
              lineno, h->ranks);
  const cJSON *row = NULL;
  cJSON_ArrayForEach(row, counts) {
    MOE_FAIL_IF(ctx, !cJSON_IsArray(row) || cJSON_GetArraySize(row) != h->experts,
                MOE_STATUS_BAD_FORMAT, "%s line %d: a counts row must hold %d numbers (experts)",
                path, lineno, h->experts);
    double row_sum = 0;
    int e = 0;
    const cJSON *c = NULL;
    cJSON_ArrayForEach(c, row) {
      int v = -1;
      MOE_TRY(moe_json_get_int(ctx, c, what, &v));
      MOE_FAIL_IF(ctx, v < 0 || v > h->tokens, MOE_STATUS_BAD_FORMAT,
                  "%s line %d: count %d out of range [0, %d] (tokens_per_rank)", path, lineno, v,
                  h->tokens);
      if (*used) sums[e] += v;
      e++;
      row_sum += v;
    }
    MOE_FAIL_IF(ctx, row_sum > (double)h->tokens * h->top_k, MOE_STATUS_BAD_FORMAT,
                "%s line %d: a rank's counts sum to %.0f, more than tokens_per_rank x top_k "
                "(%.0f)",
                path, lineno, row_sum, (double)h->tokens * h->top_k);
  }
done:
  cJSON_Delete(root);
  return st;
}

moe_status moe_routing_trace_shares(moe_ctx *ctx, const moe_skew *sel, int E, int K, double *shares,
                                    int *lines_read) {
  moe_status st = MOE_STATUS_OK;
  const char *path = sel ? sel->path : NULL;
  FILE *f = NULL;
  char *line = NULL;
  size_t cap = 0;
  double *sums = NULL;
  trace_header h;
  memset(&h, 0, sizeof h);
  int lineno = 0, body = 0;
  MOE_FAIL_IF(ctx, !sel || sel->kind != MOE_SKEW_TRACE || !shares, MOE_STATUS_INVALID_ARG,
              "a trace skew and shares must be given");
  f = fopen(path, "r");
  MOE_FAIL_IF(ctx, !f, MOE_STATUS_IO, "cannot open the routing trace '%s': %s", path,
              strerror(errno));
  for (;;) {
    errno = 0;
    const ssize_t n = getline(&line, &cap, f);
    if (n < 0) {
      MOE_FAIL_IF(ctx, ferror(f), MOE_STATUS_IO, "%s: read error: %s", path, strerror(errno));
      break;
    }
    lineno++;
    MOE_FAIL_IF(ctx, (size_t)n > TRACE_MAX_LINE, MOE_STATUS_BAD_FORMAT,
                "%s line %d: longer than %zu bytes", path, lineno, TRACE_MAX_LINE);
    MOE_FAIL_IF(ctx, strlen(line) != (size_t)n, MOE_STATUS_BAD_FORMAT, "%s line %d: a NUL byte",
                path, lineno);
    if (lineno == 1) {
      MOE_TRY(parse_header(ctx, path, line, &h));
      MOE_FAIL_IF(ctx, h.experts != E || h.top_k != K, MOE_STATUS_INVALID_ARG,
                  "routing trace '%s' was recorded with %d experts and top_k %d; this layer has "
                  "%d experts and top_k %d",
                  path, h.experts, h.top_k, E, K);
      sums = moe_calloc((size_t)E, sizeof(double));
      MOE_FAIL_IF(ctx, !sums, MOE_STATUS_OUT_OF_MEMORY, "routing trace: out of memory");
      continue;
    }
    if (n == 0 || (n == 1 && line[0] == '\n')) continue;  // a blank line
    int used = 0;
    MOE_TRY(add_line(ctx, path, lineno, line, &h, sel, sums, &used));
    body += used;
  }
  MOE_FAIL_IF(ctx, lineno == 0, MOE_STATUS_BAD_FORMAT, "%s: empty (no header line)", path);
  double total = 0;
  for (int e = 0; e < E; e++) total += sums[e];
  MOE_FAIL_IF(ctx, body == 0 || !(total > 0), MOE_STATUS_INVALID_ARG,
              "%s: no routed rows in the lines selected (%d lines of layer %d, steps %d-%d; -1 "
              "and 0: all)",
              path, body, sel->trace_layer, sel->trace_first, sel->trace_last);
  for (int e = 0; e < E; e++) shares[e] = sums[e] / total;
  if (lines_read) *lines_read = body;
done:
  if (f) fclose(f);
  free(line);  // getline's allocator
  moe_free(sums);
  return st;
}
