// libFuzzer harness: the small name parsers and catalogue lookups.
//
// Input: a selector byte, then the text. The selector picks one of
//   moe_log_level_parse, moe_activation_parse, moe_gate_convention_parse,
//   moe_wait_policy_parse, moe_compressor_find, moe_compressor_get,
//   moe_a2a_find, moe_schedule_algo_find, moe_expert_kind_find,
//   moe_cluster_builtin, moe_codec_rate_default, moe_skew_parse.
// Each is checked against a reference computed here: the documented names
// (the header's list for the fixed enums, the catalogue's own list for the
// registries). Invariants: the call succeeds exactly when the text is one of
// them (a compressor spec: a name, or "name:VALUE" for one that takes a
// parameter, VALUE a number in its range); on success the result is that
// entry (its name reads back through the matching _name function or is the
// entry's name; a built-in cluster validates); on failure an error status
// with a message in the context (moe_log_level_parse has no context: its
// status only). A skew spec (none, uniform, zipf:S, hot:F, trace:FILE with
// its selectors; the file is not read) that parses prints back to a spec
// that parses to the same skew and prints the same again; a named one's
// shares for E experts, top_k K (from the text's length) are each in
// [0, 1/K] and sum to 1.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "moe/a2a_catalog.h"
#include "moe/compress.h"
#include "moe/core.h"
#include "moe/expert.h"
#include "moe/layer.h"
#include "moe/perf.h"
#include "moe/sched.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Index of text in a NULL-terminated list, or -1.
static int index_of(const char *const *list, const char *text) {
  for (int i = 0; list[i]; i++) {
    if (strcmp(list[i], text) == 0) return i;
  }
  return -1;
}

static void expect(moe_ctx *ctx, moe_status st, int ok, const char *what, const char *text) {
  if (ok) {
    FUZZ_CHECK(st == MOE_STATUS_OK, "%s('%s') failed: %s", what, text, moe_ctx_error(ctx));
  } else {
    FUZZ_CHECK(st != MOE_STATUS_OK, "%s('%s') accepted a text it should refuse", what, text);
    fuzz_check_failure(ctx, st, what);
  }
}

static void log_level(const char *text) {
  static const char *const names[] = {"error", "warn", "info", "debug", "trace", NULL};
  static const char *const digits[] = {"0", "1", "2", "3", "4", NULL};
  int want = index_of(names, text);
  if (want < 0) want = index_of(digits, text);
  moe_log_level lv = (moe_log_level)99;
  const moe_status st = moe_log_level_parse(text, &lv);
  FUZZ_CHECK((st == MOE_STATUS_OK) == (want >= 0), "log level '%s': %s", text, moe_status_str(st));
  if (want >= 0) FUZZ_CHECK((int)lv == want, "log level '%s' parsed as %d", text, (int)lv);
  if (st != MOE_STATUS_OK) FUZZ_CHECK(st == MOE_STATUS_INVALID_ARG, "log level status %d", st);
}

static void activation(moe_ctx *ctx, const char *text) {
  static const char *const names[] = {"gelu", "relu", NULL};
  moe_activation a = (moe_activation)99;
  const moe_status st = moe_activation_parse(ctx, text, &a);
  expect(ctx, st, index_of(names, text) >= 0, "moe_activation_parse", text);
  if (st == MOE_STATUS_OK) {
    FUZZ_CHECK(strcmp(moe_activation_name(a), text) == 0, "'%s' parsed as '%s'", text,
               moe_activation_name(a));
  }
}

static void gate_convention(moe_ctx *ctx, const char *text) {
  // "megatron" is an alias of "libmoe" (include/moe/layer.h)
  static const char *const names[] = {"libmoe", "megatron", "deepspeed", NULL};
  moe_gate_convention g = (moe_gate_convention)99;
  const moe_status st = moe_gate_convention_parse(ctx, text, &g);
  const int want = index_of(names, text);
  expect(ctx, st, want >= 0, "moe_gate_convention_parse", text);
  if (st == MOE_STATUS_OK) {
    const char *canon = want == 1 ? "libmoe" : text;
    FUZZ_CHECK(strcmp(moe_gate_convention_name(g), canon) == 0, "'%s' parsed as '%s'", text,
               moe_gate_convention_name(g));
  }
}

static void wait_policy(moe_ctx *ctx, const char *text) {
  static const char *const names[] = {"blocking", "poll-backoff", "adaptive", NULL};
  moe_wait_policy w = (moe_wait_policy)99;
  const moe_status st = moe_wait_policy_parse(ctx, text, &w);
  expect(ctx, st, index_of(names, text) >= 0, "moe_wait_policy_parse", text);
  if (st == MOE_STATUS_OK) {
    FUZZ_CHECK(strcmp(moe_wait_policy_name(w), text) == 0, "'%s' parsed as '%s'", text,
               moe_wait_policy_name(w));
  }
}

// The registered compressor whose name is the first len bytes of text, or NULL.
static const moe_compressor_entry *compressor_entry(const char *text, size_t len) {
  int n = 0;
  const moe_compressor_entry *const *list = moe_compressor_list(&n);
  for (int i = 0; i < n; i++) {
    if (strlen(list[i]->codec.name) == len && strncmp(list[i]->codec.name, text, len) == 0)
      return list[i];
  }
  return NULL;
}

static void compressor_find(moe_ctx *ctx, const char *text) {
  const moe_compressor_entry *e = NULL, *want = compressor_entry(text, strlen(text));
  const moe_status st = moe_compressor_find(ctx, text, &e);
  expect(ctx, st, want != NULL, "moe_compressor_find", text);
  if (st == MOE_STATUS_OK) FUZZ_CHECK(e == want, "'%s' found another entry", text);
}

static void compressor_get(moe_ctx *ctx, const char *text) {
  const char *colon = strchr(text, ':');
  const moe_compressor_entry *e =
      compressor_entry(text, colon ? (size_t)(colon - text) : strlen(text));
  int ok = e && e->available;
  double value = e && e->param ? e->param->def : 0;
  if (ok && colon) {  // "name:VALUE": a parameter the entry takes, a number in its range
    ok = e->param != NULL;
    if (ok) {
      char *end = NULL;
      errno = 0;
      value = strtod(colon + 1, &end);
      ok = end != colon + 1 && *end == '\0' && errno != ERANGE && value >= e->param->min &&
           value <= e->param->max;
    }
  }
  moe_compressor c;
  memset(&c, 0, sizeof c);
  const moe_status st = moe_compressor_get(ctx, text, &c);
  expect(ctx, st, ok, "moe_compressor_get", text);
  if (st == MOE_STATUS_OK) {
    FUZZ_CHECK(c.name && strcmp(c.name, e->codec.name) == 0, "'%s' gave compressor '%s'", text,
               c.name ? c.name : "(null)");
    if (e->param) {
      FUZZ_CHECK(c.param == value, "'%s' gave parameter %.17g, expected %.17g", text, c.param,
                 value);
    }
  } else if (e && !e->available) {
    FUZZ_CHECK(st == MOE_STATUS_UNSUPPORTED, "'%s' not compiled in gave %s", text,
               moe_status_str(st));
  }
}

static void a2a(moe_ctx *ctx, const char *text) {
  int n = 0;
  const moe_a2a_algo *const *list = moe_a2a_list(&n), *want = NULL, *got = NULL;
  for (int i = 0; i < n; i++) {
    if (strcmp(list[i]->name, text) == 0) want = list[i];
  }
  const moe_status st = moe_a2a_find(ctx, text, &got);
  expect(ctx, st, want != NULL, "moe_a2a_find", text);
  if (st == MOE_STATUS_OK) FUZZ_CHECK(got == want, "'%s' found another algorithm", text);
}

static void schedule(moe_ctx *ctx, const char *text) {
  int n = 0;
  const moe_schedule_algo *list = moe_schedule_algo_list(&n), *want = NULL, *got = NULL;
  for (int i = 0; i < n; i++) {
    if (strcmp(list[i].name, text) == 0) want = &list[i];
  }
  const moe_status st = moe_schedule_algo_find(ctx, text, &got);
  expect(ctx, st, want != NULL, "moe_schedule_algo_find", text);
  if (st == MOE_STATUS_OK) FUZZ_CHECK(got == want, "'%s' found another schedule", text);
}

static void expert_kind(moe_ctx *ctx, const char *text) {
  const moe_expert_kind *want = NULL, *got = NULL;
  for (int i = 0; i < moe_expert_kind_count(); i++) {
    if (strcmp(moe_expert_kind_get(i)->name, text) == 0) want = moe_expert_kind_get(i);
  }
  const moe_status st = moe_expert_kind_find(ctx, text, &got);
  expect(ctx, st, want != NULL, "moe_expert_kind_find", text);
  if (st == MOE_STATUS_OK) FUZZ_CHECK(got == want, "'%s' found another expert kind", text);
}

static void cluster(moe_ctx *ctx, const char *text) {
  int want = 0;
  for (int i = 0; i < moe_cluster_builtin_count(); i++) {
    want |= strcmp(moe_cluster_builtin_name(i), text) == 0;
  }
  moe_cluster c;
  const moe_status st = moe_cluster_builtin(ctx, text, &c);
  expect(ctx, st, want, "moe_cluster_builtin", text);
  if (st == MOE_STATUS_OK) {
    FUZZ_CHECK(moe_cluster_validate(ctx, &c) == MOE_STATUS_OK, "built-in '%s' invalid: %s", text,
               moe_ctx_error(ctx));
  }
}

static void codec_rate(moe_ctx *ctx, const char *text) {
  // "zfp:12" reads zfp's rates: the name before any ':'
  const moe_compressor_entry *e = compressor_entry(text, strcspn(text, ":"));
  double c = -1, d = -1;
  const moe_status st = moe_codec_rate_default(ctx, text, &c, &d);
  expect(ctx, st, e != NULL, "moe_codec_rate_default", text);
  if (st == MOE_STATUS_OK) {
    FUZZ_CHECK(c == e->compress_gbs && d == e->decompress_gbs, "'%s': rates %g, %g", text, c, d);
  }
}

static void skew(moe_ctx *ctx, const char *text) {
  // the documented forms, but for trace: (its path and selectors: the
  // invariants below)
  int want = -1;
  const char *colon = strchr(text, ':');
  double v = 0;
  if (colon) {
    char *end = NULL;
    v = strtod(colon + 1, &end);
    if (end == colon + 1 || *end != '\0' || !isfinite(v)) colon = NULL, want = 0;
  }
  const size_t name = colon ? (size_t)(colon - text) : strlen(text);
  if (strncmp(text, "trace:", 6) == 0) {
    want = -1;
  } else if (want != 0) {
    want = (!colon && (strcmp(text, "none") == 0 || strcmp(text, "uniform") == 0)) ||
           (colon && name == 4 && strncmp(text, "zipf", 4) == 0 && v > 0 && v <= 10) ||
           (colon && name == 3 && strncmp(text, "hot", 3) == 0 && v > 0 && v <= 1);
  }
  moe_skew s, back;
  memset(&s, 0, sizeof s);
  const moe_status st = moe_skew_parse(ctx, text, &s);
  if (want >= 0) expect(ctx, st, want, "moe_skew_parse", text);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_skew_parse");
    return;
  }
  char spec[MOE_SKEW_SPEC_MAX], again[MOE_SKEW_SPEC_MAX];
  const int n = moe_skew_to_string(&s, spec, sizeof spec);
  FUZZ_CHECK(n > 0 && (size_t)n < sizeof spec, "'%s' prints %d bytes", text, n);
  memset(&back, 0, sizeof back);
  FUZZ_CHECK(moe_skew_parse(ctx, spec, &back) == MOE_STATUS_OK, "'%s' printed as '%s', refused: %s",
             text, spec, moe_ctx_error(ctx));
  FUZZ_CHECK(back.kind == s.kind && back.param == s.param && strcmp(back.path, s.path) == 0 &&
                 back.trace_layer == s.trace_layer && back.trace_first == s.trace_first &&
                 back.trace_last == s.trace_last,
             "'%s' printed as '%s' parses to another skew", text, spec);
  moe_skew_to_string(&back, again, sizeof again);
  FUZZ_CHECK(strcmp(spec, again) == 0, "'%s' prints '%s', then '%s'", text, spec, again);
  if (s.kind == MOE_SKEW_TRACE) return;
  const int E = 1 + (int)(strlen(text) % 64), K = 1 + (int)(strlen(text) % E);
  double shares[64], sum = 0;
  FUZZ_CHECK(moe_skew_shares(ctx, &s, E, K, shares) == MOE_STATUS_OK, "'%s' shares: %s", text,
             moe_ctx_error(ctx));
  for (int e = 0; e < E; e++) {
    FUZZ_CHECK(shares[e] >= 0 && shares[e] <= 1.0 / K + 1e-12, "'%s' E %d K %d: share %d = %g",
               text, E, K, e, shares[e]);
    sum += shares[e];
  }
  FUZZ_CHECK(fabs(sum - 1) < 1e-9, "'%s' E %d K %d: shares sum to %.17g", text, E, K, sum);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  char *text = fuzz_cstr(data + 1, size - 1);
  moe_ctx *ctx = fuzz_ctx();
  switch (data[0] % 12) {
    case 0:
      log_level(text);
      break;
    case 1:
      activation(ctx, text);
      break;
    case 2:
      gate_convention(ctx, text);
      break;
    case 3:
      wait_policy(ctx, text);
      break;
    case 4:
      compressor_find(ctx, text);
      break;
    case 5:
      compressor_get(ctx, text);
      break;
    case 6:
      a2a(ctx, text);
      break;
    case 7:
      schedule(ctx, text);
      break;
    case 8:
      expert_kind(ctx, text);
      break;
    case 9:
      cluster(ctx, text);
      break;
    case 10:
      codec_rate(ctx, text);
      break;
    default:
      skew(ctx, text);
      break;
  }
  moe_ctx_destroy(ctx);
  free(text);
  return 0;
}
