// libFuzzer harness: routing traces as the skew "trace:FILE[#LAYER][@FIRST-LAST]"
// reads them (moe_skew_parse, moe_routing_trace_shares, moe_skew_shares in
// include/moe/layer.h).
//
// Input: 3 parameter bytes, then the trace file.
//   byte 0   E = 1 + byte % 16 (the layer's experts)
//   byte 1   K = 1 + byte % E (its top_k)
//   byte 2   bits 0-2: the layer selected (7: every layer); bit 3: a step
//            range 1..(1 + bits 4-7)
// Invariants checked:
//   - the spec built from those bytes parses and prints back the same;
//   - on failure: an error status with a message in the context;
//   - on success: at least one count line was used; every share is in
//     [0, 1] and they sum to 1; moe_skew_shares then caps them: every share
//     in [0, 1/K], summing to 1, and equal to the raw ones where none needed
//     the cap;
//   - the whole trace read (moe_routing_trace_load, moe simulate --lina): on
//     failure an error status, a message and nothing held; on success its
//     lines' rows are counts (whole, >= 0, within the header's bounds) and
//     every estimate is absent or finite and >= 0; where the shares' read
//     succeeded with every line selected, the lines summed give its shares.
#include <math.h>
#include <string.h>

#include "fuzz_util.h"
#include "moe/layer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  moe_ctx *ctx = fuzz_ctx();
  const int E = 1 + data[0] % 16, K = 1 + data[1] % E;
  const int layer = data[2] & 7, ranged = (data[2] >> 3) & 1, last = 1 + (data[2] >> 4);
  const char *path = fuzz_memfile(data + 3, size - 3);
  char spec[600], sel[32] = "", back[700];
  if (layer != 7) snprintf(sel, sizeof sel, "#%d", layer);
  if (ranged) snprintf(sel + strlen(sel), sizeof sel - strlen(sel), "@1-%d", last);
  snprintf(spec, sizeof spec, "trace:%s%s", path, sel);
  moe_skew skew;
  moe_status st = moe_skew_parse(ctx, spec, &skew);
  FUZZ_CHECK(st == MOE_STATUS_OK, "spec '%s' refused: %s", spec, moe_ctx_error(ctx));
  moe_skew_to_string(&skew, back, sizeof back);
  FUZZ_CHECK(strcmp(back, spec) == 0, "spec '%s' prints back as '%s'", spec, back);
  double raw[16], capped[16];
  int lines = 0;
  st = moe_routing_trace_shares(ctx, &skew, E, K, raw, &lines);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_routing_trace_shares");
  } else {
    FUZZ_CHECK(lines >= 1, "success with %d count lines", lines);
    double sum = 0;
    int over = 0;
    for (int e = 0; e < E; e++) {
      FUZZ_CHECK(raw[e] >= 0 && raw[e] <= 1, "share %d = %g", e, raw[e]);
      sum += raw[e];
      over |= raw[e] > 1.0 / K;
    }
    FUZZ_CHECK(fabs(sum - 1) < 1e-9, "shares sum to %.17g", sum);
    st = moe_skew_shares(ctx, &skew, E, K, capped);
    FUZZ_CHECK(st == MOE_STATUS_OK, "moe_skew_shares failed on a readable trace: %s",
               moe_ctx_error(ctx));
    sum = 0;
    for (int e = 0; e < E; e++) {
      FUZZ_CHECK(capped[e] >= 0 && capped[e] <= 1.0 / K + 1e-12, "capped share %d = %g (K %d)", e,
                 capped[e], K);
      FUZZ_CHECK(over || capped[e] == raw[e], "share %d changed without a cap: %g -> %g", e, raw[e],
                 capped[e]);
      sum += capped[e];
    }
    FUZZ_CHECK(fabs(sum - 1) < 1e-9, "capped shares sum to %.17g", sum);
  }
  moe_routing_trace_data tr;
  const moe_status sl = moe_routing_trace_load(ctx, path, &tr);
  if (sl != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, sl, "moe_routing_trace_load");
    FUZZ_CHECK(tr.n == 0 && !tr.rows && !tr.estimate, "a failed load holds %d lines", tr.n);
  } else {
    const int TE = tr.experts;
    double sums[16] = {0};
    for (int i = 0; i < tr.n; i++) {
      for (int e = 0; e < TE; e++) {
        const double v = tr.rows[(size_t)i * TE + e];
        FUZZ_CHECK(v >= 0 && v == floor(v) && v <= (double)tr.ranks * tr.tokens_per_rank,
                   "line %d expert %d: rows %g", i, e, v);
        if (e < 16) sums[e] += v;
      }
      const double *est = tr.estimate + (size_t)i * TE;
      if (!isnan(est[0]))
        for (int e = 0; e < TE; e++)
          FUZZ_CHECK(isfinite(est[e]) && est[e] >= 0, "line %d estimate %d: %g", i, e, est[e]);
    }
    if (st == MOE_STATUS_OK && layer == 7 && !ranged && TE == E) {
      double tot = 0;
      for (int e = 0; e < E; e++) tot += sums[e];
      for (int e = 0; e < E; e++)
        FUZZ_CHECK(fabs(sums[e] / tot - raw[e]) < 1e-9, "expert %d: %g whole, %g as shares", e,
                   sums[e] / tot, raw[e]);
    }
    moe_routing_trace_data_free(&tr);
  }
  moe_ctx_destroy(ctx);
  return 0;
}
