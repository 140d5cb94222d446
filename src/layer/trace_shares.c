// Routing traces (docs/balance.md "Routing traces"): the one writer of the
// format (moe_routing_trace_write_header / _write_step, used by training and
// serving), its reader (moe_routing_trace_load), and expert popularity from a
// recorded trace (moe train --routing-trace):
// the skew "trace:FILE" replays the shares of the choices per expert that a
// trained router produced, through the same bias fit as the named skews.
//
// Only the popularity per expert is replayed, not the (source rank x expert)
// pattern: the router bias is one per layer, the same on every rank (a
// token's routing must not depend on where it is).
//
// Format (one JSON object per line):
//   {"format": "libmoe-routing-trace", "version": 1, "ranks": P, "experts": E,
//    "top_k": K, "tokens_per_rank": T, "moe_layers": [block, ...]}
//   {"step": s, "layer": block, "counts": [[c_00, ..., c_0(E-1)], ...,
//    [c_(P-1)0, ...]]} with, optionally, "estimate": [e_0, ..., e_(E-1)]
//
// Not here: gathering the counts over ranks (src/train/routing_trace.c,
// src/infer/engine.c), the bias fit (router_bias.c).
#define _POSIX_C_SOURCE 200809L  // getline
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "moe/layer.h"

void moe_routing_trace_write_header(FILE *f, int ranks, int experts, int top_k, int tokens_per_rank,
                                    const int *moe_blocks, int n_blocks) {
  fprintf(f,
          "{\"format\": \"libmoe-routing-trace\", \"version\": 1, \"ranks\": %d, "
          "\"experts\": %d, \"top_k\": %d, \"tokens_per_rank\": %d, \"moe_layers\": [",
          ranks, experts, top_k, tokens_per_rank);
  for (int i = 0; i < n_blocks; i++) fprintf(f, "%s%d", i ? ", " : "", moe_blocks[i]);
  fputs("]}\n", f);
}

void moe_routing_trace_write_step(FILE *f, long long step, int block, const int32_t *counts,
                                  int ranks, int experts, size_t rank_stride,
                                  const double *estimate) {
  fprintf(f, "{\"step\": %lld, \"layer\": %d, \"counts\": [", step, block);
  for (int p = 0; p < ranks; p++) {
    fputs(p ? ", [" : "[", f);
    for (int x = 0; x < experts; x++)
      fprintf(f, "%s%d", x ? ", " : "", (int)counts[(size_t)p * rank_stride + x]);
    fputc(']', f);
  }
  fputc(']', f);
  if (estimate) {
    fputs(", \"estimate\": [", f);
    for (int x = 0; x < experts; x++) fprintf(f, "%s%.6g", x ? ", " : "", estimate[x]);
    fputc(']', f);
  }
  fputs("}\n", f);
}

#define TRACE_MAX_LINE ((size_t)16 << 20)  // bytes of one line (P x E counts)

typedef struct {
  int ranks, experts, top_k, tokens;
  int layers[256], n_layers;
} trace_header;

static moe_status parse_header(moe_ctx *ctx, const char *path, const char *line, trace_header *h) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  char what[600];
  snprintf(what, sizeof what, "routing trace %s: the header", path);
  MOE_TRY(moe_json_parse_object(ctx, line, what, &root));
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
  char what[600];
  snprintf(what, sizeof what, "routing trace %s line %d", path, lineno);
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

// Reads the trace at path line by line: the header (its experts and top_k
// must be E and K when E > 0), then fn for every non-blank body line.
typedef moe_status (*line_fn)(moe_ctx *ctx, const char *path, int lineno, const char *line,
                              const trace_header *h, void *arg);

moe_status moe_routing_trace_load_header(moe_ctx *ctx, const char *path,
                                         moe_routing_trace_data *out) {
  moe_status st = MOE_STATUS_OK;
  FILE *f = NULL;
  char *line = NULL;
  size_t cap = 0;
  MOE_FAIL_IF(ctx, !path || !out, MOE_STATUS_INVALID_ARG, "a path and an output must be given");
  memset(out, 0, sizeof *out);
  f = fopen(path, "r");
  MOE_FAIL_IF(ctx, !f, MOE_STATUS_IO, "cannot open the routing trace '%s': %s", path,
              strerror(errno));
  const ssize_t n = getline(&line, &cap, f);
  MOE_FAIL_IF(ctx, n < 0, MOE_STATUS_BAD_FORMAT, "%s: empty (no header line)", path);
  MOE_FAIL_IF(ctx, (size_t)n > TRACE_MAX_LINE || strlen(line) != (size_t)n, MOE_STATUS_BAD_FORMAT,
              "%s line 1: longer than %zu bytes or with a NUL byte", path, TRACE_MAX_LINE);
  trace_header h;
  MOE_TRY(parse_header(ctx, path, line, &h));
  out->ranks = h.ranks;
  out->experts = h.experts;
  out->top_k = h.top_k;
  out->tokens_per_rank = h.tokens;
  out->n_layers = h.n_layers;
  memcpy(out->layers, h.layers, (size_t)h.n_layers * sizeof h.layers[0]);
done:
  if (f) fclose(f);
  free(line);  // getline's allocator
  return st;
}

static moe_status scan_trace(moe_ctx *ctx, const char *path, int E, int K, trace_header *h,
                             line_fn fn, void *arg) {
  moe_status st = MOE_STATUS_OK;
  FILE *f = NULL;
  char *line = NULL;
  size_t cap = 0;
  memset(h, 0, sizeof *h);
  int lineno = 0;
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
      MOE_TRY(parse_header(ctx, path, line, h));
      MOE_FAIL_IF(ctx, E > 0 && (h->experts != E || h->top_k != K), MOE_STATUS_INVALID_ARG,
                  "routing trace '%s' was recorded with %d experts and top_k %d; this layer has "
                  "%d experts and top_k %d",
                  path, h->experts, h->top_k, E, K);
      continue;
    }
    if (n == 0 || (n == 1 && line[0] == '\n')) continue;  // a blank line
    MOE_TRY(fn(ctx, path, lineno, line, h, arg));
  }
  MOE_FAIL_IF(ctx, lineno == 0, MOE_STATUS_BAD_FORMAT, "%s: empty (no header line)", path);
done:
  if (f) fclose(f);
  free(line);  // getline's allocator
  return st;
}

typedef struct {
  const moe_skew *sel;
  double *sums;
  int body;
} shares_arg;

static moe_status shares_line(moe_ctx *ctx, const char *path, int lineno, const char *line,
                              const trace_header *h, void *arg) {
  shares_arg *a = arg;
  int used = 0;
  const moe_status st = add_line(ctx, path, lineno, line, h, a->sel, a->sums, &used);
  a->body += used;
  return st;
}

moe_status moe_routing_trace_shares(moe_ctx *ctx, const moe_skew *sel, int E, int K, double *shares,
                                    int *lines_read) {
  moe_status st = MOE_STATUS_OK;
  trace_header h;
  shares_arg a = {sel, NULL, 0};
  MOE_FAIL_IF(ctx, !sel || sel->kind != MOE_SKEW_TRACE || !shares || E < 1, MOE_STATUS_INVALID_ARG,
              "a trace skew, shares and experts >= 1 must be given");
  a.sums = moe_calloc((size_t)E, sizeof(double));
  MOE_FAIL_IF(ctx, !a.sums, MOE_STATUS_OUT_OF_MEMORY, "routing trace: out of memory");
  MOE_TRY(scan_trace(ctx, sel->path, E, K, &h, shares_line, &a));
  double total = 0;
  for (int e = 0; e < E; e++) total += a.sums[e];
  if (sel->trace_layer >= 0) {  // a layer the trace does not have: say which it has
    int known = 0;
    char list[256] = "";
    for (int i = 0, len = 0; i < h.n_layers && len < (int)sizeof list - 8; i++) {
      known |= h.layers[i] == sel->trace_layer;
      len += snprintf(list + len, sizeof list - (size_t)len, "%s%d", i ? ", " : "", h.layers[i]);
    }
    MOE_FAIL_IF(ctx, !known, MOE_STATUS_INVALID_ARG,
                "%s: #%d names no MoE layer of the trace (its moe_layers: %s)", sel->path,
                sel->trace_layer, list);
  }
  if (a.body == 0 || !(total > 0)) {
    char layer[32] = "every MoE layer", steps[48] = "every step";
    if (sel->trace_layer >= 0) snprintf(layer, sizeof layer, "layer %d", sel->trace_layer);
    if (sel->trace_first > 0 || sel->trace_last > 0)
      snprintf(steps, sizeof steps, "steps %d-%d", sel->trace_first, sel->trace_last);
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "%s: no routed rows in the lines selected (%d lines of %s, %s)", sel->path, a.body,
             layer, steps);
  }
  for (int e = 0; e < E; e++) shares[e] = a.sums[e] / total;
  if (lines_read) *lines_read = a.body;
done:
  moe_free(a.sums);
  return st;
}

// ---- every line (moe simulate --lina) --------------------------------------------------

// *p grown from old to bytes (contents kept); 0 when out of memory (*p unchanged).
static int grow(void **p, size_t old, size_t bytes) {
  void *n = moe_malloc(bytes);
  if (!n) return 0;
  if (*p && old) memcpy(n, *p, old);
  moe_free(*p);
  *p = n;
  return 1;
}

static moe_status load_line(moe_ctx *ctx, const char *path, int lineno, const char *line,
                            const trace_header *h, void *arg) {
  moe_status st = MOE_STATUS_OK;
  moe_routing_trace_data *d = arg;
  cJSON *root = NULL;
  const size_t E = (size_t)h->experts;
  if (d->n == d->cap) {  // grow (bounded)
    MOE_FAIL_IF(ctx, (size_t)d->n >= MOE_ROUTING_TRACE_MAX_VALUES / (2 * E), MOE_STATUS_INVALID_ARG,
                "%s: more than %zu lines of %zu experts (a trace read whole holds at most %zu "
                "values)",
                path, MOE_ROUTING_TRACE_MAX_VALUES / (2 * E), E, MOE_ROUTING_TRACE_MAX_VALUES);
    const size_t old = (size_t)d->cap, most = MOE_ROUTING_TRACE_MAX_VALUES / (2 * E);
    const size_t cap = old ? (2 * old < most ? 2 * old : most) : (64 < most ? 64 : most);
    const int ok =
        grow((void **)&d->rows, old * E * sizeof(double), cap * E * sizeof(double)) &&
        grow((void **)&d->estimate, old * E * sizeof(double), cap * E * sizeof(double)) &&
        grow((void **)&d->layer, old * sizeof(int), cap * sizeof(int)) &&
        grow((void **)&d->step, old * sizeof(int), cap * sizeof(int));
    MOE_FAIL_IF(ctx, !ok, MOE_STATUS_OUT_OF_MEMORY, "routing trace: out of memory at line %d",
                lineno);
    d->cap = (int)cap;
  }
  double *rows = d->rows + (size_t)d->n * E, *est = d->estimate + (size_t)d->n * E;
  for (size_t e = 0; e < E; e++) rows[e] = 0.0;
  const moe_skew all = {.kind = MOE_SKEW_TRACE, .trace_layer = -1};
  int used = 0;
  MOE_TRY(add_line(ctx, path, lineno, line, h, &all, rows, &used));
  char what[600];
  snprintf(what, sizeof what, "routing trace %s line %d", path, lineno);
  MOE_TRY(moe_json_parse_object(ctx, line, what, &root));
  MOE_TRY(
      moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "step"), what, &d->step[d->n]));
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "layer"), what,
                           &d->layer[d->n]));
  const cJSON *e_arr = cJSON_GetObjectItemCaseSensitive(root, "estimate");
  if (!e_arr) {
    est[0] = NAN;  // none
  } else {
    MOE_FAIL_IF(ctx, !cJSON_IsArray(e_arr) || (size_t)cJSON_GetArraySize(e_arr) != E,
                MOE_STATUS_BAD_FORMAT, "%s line %d: \"estimate\" must be %zu numbers (experts)",
                path, lineno, E);
    size_t e = 0;
    const cJSON *v = NULL;
    cJSON_ArrayForEach(v, e_arr) {
      MOE_FAIL_IF(ctx, !cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0,
                  MOE_STATUS_BAD_FORMAT,
                  "%s line %d: an \"estimate\" entry must be a finite number >= 0", path, lineno);
      est[e++] = v->valuedouble;
    }
    d->with_estimate++;
  }
  d->n++;
done:
  cJSON_Delete(root);
  return st;
}

moe_status moe_routing_trace_load(moe_ctx *ctx, const char *path, moe_routing_trace_data *out) {
  moe_status st = MOE_STATUS_OK;
  trace_header h;
  MOE_FAIL_IF(ctx, !path || !out, MOE_STATUS_INVALID_ARG, "a path and an output must be given");
  memset(out, 0, sizeof *out);
  st = scan_trace(ctx, path, 0, 0, &h, load_line, out);
  out->ranks = h.ranks;
  out->experts = h.experts;
  out->top_k = h.top_k;
  out->tokens_per_rank = h.tokens;
  out->n_layers = h.n_layers;
  memcpy(out->layers, h.layers, sizeof out->layers);
  if (st != MOE_STATUS_OK) moe_routing_trace_data_free(out);
done:
  return st;
}

void moe_routing_trace_data_free(moe_routing_trace_data *d) {
  if (!d) return;
  moe_free(d->rows);
  moe_free(d->estimate);
  moe_free(d->layer);
  moe_free(d->step);
  memset(d, 0, sizeof *d);
}
