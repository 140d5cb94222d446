// libFuzzer harness: moe_layer_samples_from_json (include/moe/perf.h).
//
// Input: JSON text. Invariants checked:
//   - on failure: an error status with a message in the context, *out NULL
//     and *n 0;
//   - on success: 1..100000 samples, each with a config that passes
//     moe_layer_config_validate, non-empty a2a and schedule names, chunks in
//     [1, 64], positive finite times and passes_ms <= total_ms (what the
//     reader promises); moe_layer_samples_to_json writes them, and that text
//     reads back to equal samples, every time bitwise (`moe calibrate
//     --refit` fits on exactly the runs that were saved).
#include <math.h>
#include <string.h>

#include "fuzz_layer_eq.h"
#include "fuzz_util.h"
#include "moe/perf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_sample(moe_ctx *ctx, const moe_layer_sample *s, int i) {
  FUZZ_CHECK(moe_layer_config_validate(ctx, &s->cfg) == MOE_STATUS_OK,
             "sample %d: config invalid: %s", i, moe_ctx_error(ctx));
  FUZZ_CHECK(s->a2a[0] && memchr(s->a2a, 0, sizeof s->a2a), "sample %d: bad a2a name", i);
  FUZZ_CHECK(s->schedule[0] && memchr(s->schedule, 0, sizeof s->schedule),
             "sample %d: bad schedule name", i);
  FUZZ_CHECK(s->chunks >= 1 && s->chunks <= 64, "sample %d: chunks %d", i, s->chunks);
  const double t[4] = {s->comp_ms, s->comm_ms, s->passes_ms, s->total_ms};
  for (int k = 0; k < 4; k++) {
    FUZZ_CHECK(t[k] > 0 && isfinite(t[k]), "sample %d: time %d is %g", i, k, t[k]);
  }
  FUZZ_CHECK(s->passes_ms <= s->total_ms, "sample %d: passes %g > total %g", i, s->passes_ms,
             s->total_ms);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size);
  moe_ctx *ctx = fuzz_ctx();
  static moe_layer_sample sentinel;
  moe_layer_sample *s = &sentinel, *back = NULL;  // not NULL: a failure must reset it
  int n = -5, nb = 0;
  moe_status st = moe_layer_samples_from_json(ctx, text, &s, &n);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_layer_samples_from_json");
    FUZZ_CHECK(s == NULL && n == 0, "failed parse left out = %p, n = %d", (void *)s, n);
  } else {
    FUZZ_CHECK(s != NULL && n >= 1 && n <= 100000, "parsed %d samples", n);
    for (int i = 0; i < n; i++) check_sample(ctx, &s[i], i);
    char *json = NULL;
    st = moe_layer_samples_to_json(ctx, s, n, &json);
    FUZZ_CHECK(st == MOE_STATUS_OK, "moe_layer_samples_to_json: %s", moe_ctx_error(ctx));
    st = moe_layer_samples_from_json(ctx, json, &back, &nb);
    FUZZ_CHECK(st == MOE_STATUS_OK, "reading back %s: %s", json, moe_ctx_error(ctx));
    FUZZ_CHECK(nb == n, "%d samples became %d", n, nb);
    for (int i = 0; i < n; i++) {
      fuzz_layer_config_check_equal(&s[i].cfg, &back[i].cfg, json);
      FUZZ_CHECK(strcmp(s[i].a2a, back[i].a2a) == 0, "sample %d a2a '%s' became '%s'", i, s[i].a2a,
                 back[i].a2a);
      FUZZ_CHECK(strcmp(s[i].schedule, back[i].schedule) == 0,
                 "sample %d schedule '%s' became '%s'", i, s[i].schedule, back[i].schedule);
      FUZZ_CHECK(s[i].chunks == back[i].chunks, "sample %d chunks", i);
      FUZZ_CHECK(s[i].comp_ms == back[i].comp_ms && s[i].comm_ms == back[i].comm_ms &&
                     s[i].passes_ms == back[i].passes_ms && s[i].total_ms == back[i].total_ms,
                 "sample %d: times changed after write + read", i);
    }
    moe_free(json);
    moe_free(back);
    moe_free(s);
  }
  moe_ctx_destroy(ctx);
  free(text);
  return 0;
}
