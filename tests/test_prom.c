// moe_prom_value (include/moe/infer_request.h), the reader `moe bench serve`
// takes the server's /metrics with: a sample is found only by its whole name
// and labels (not a prefix of a longer name, not a HELP or TYPE comment), its
// value is read exactly, and a missing sample or a value that is not a number
// gives NAN. moe_server_metrics_get fails with a clear error when nothing
// answers.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/infer_request.h"
#include "testutil.h"

// In the server's format (src/infer/server.c, metrics()).
static const char k_text[] =
    "# HELP moe_placement_copies_sent_total Expert copies whose parameters moved.\n"
    "# TYPE moe_placement_copies_sent_total counter\n"
    "moe_placement_copies_sent_total 12\n"
    "# HELP moe_placement_copies Expert copies in force, over the MoE blocks.\n"
    "moe_placement_copies 3\n"
    "moe_engine_moe_layer_seconds{quantile=\"0.5\"} 0.001250\n"
    "moe_engine_moe_layer_seconds{quantile=\"0.95\"} 0.002500\n"
    "moe_engine_moe_layer_seconds_sum 1.500000\n"
    "moe_engine_moe_layer_seconds_count 1200\n"
    "moe_placement_balance_ratio{copies=\"none\"} 1.750000\n"
    "moe_placement_balance_ratio{copies=\"placed\"} 1.125000\n"
    "with_timestamp 7.5 1700000000000\n"
    "not_a_number abc\n"
    "trailing_junk 4x\n"
    "empty_value \n"
    "last_line_without_newline 42";

int main(void) {
  struct {
    const char *name;
    double want;  // NAN: must be NAN
  } cases[] = {
      {"moe_placement_copies_sent_total", 12},
      {"moe_placement_copies", 3},  // a prefix of the line above: its own line only
      {"moe_engine_moe_layer_seconds{quantile=\"0.5\"}", 0.00125},
      {"moe_engine_moe_layer_seconds{quantile=\"0.95\"}", 0.0025},
      {"moe_engine_moe_layer_seconds_sum", 1.5},
      {"moe_engine_moe_layer_seconds_count", 1200},
      {"moe_placement_balance_ratio{copies=\"none\"}", 1.75},
      {"moe_placement_balance_ratio{copies=\"placed\"}", 1.125},
      {"with_timestamp", 7.5},
      {"last_line_without_newline", 42},
      {"moe_engine_moe_layer_seconds", NAN},                    // only labelled samples have it
      {"moe_engine_moe_layer_seconds{quantile=\"0.9\"}", NAN},  // another label value
      {"moe_placement_copies_sent", NAN},                       // a prefix of a name, not a name
      {"# HELP moe_placement_copies", NAN},                     // comments are not samples
      {"HELP", NAN},
      {"not_a_number", NAN},
      {"trailing_junk", NAN},
      {"empty_value", NAN},
      {"absent_total", NAN},
      {"", NAN},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const double got = moe_prom_value(k_text, cases[i].name);
    if (isnan(cases[i].want))
      TU_CHECK(isnan(got), "'%s': %g, expected NAN", cases[i].name, got);
    else
      TU_CHECK(got == cases[i].want, "'%s': %.17g, expected %.17g", cases[i].name, got,
               cases[i].want);
  }
  TU_CHECK(isnan(moe_prom_value(NULL, "x")) && isnan(moe_prom_value("x 1\n", NULL)),
           "NULL text or name: NAN");
  TU_CHECK(isnan(moe_prom_value("", "x")), "empty text: NAN");

  // nothing listens on port 1 of loopback: an error naming the URL, no values
  moe_ctx *ctx = NULL;
  TU_CHECK(moe_ctx_create(&ctx) == MOE_STATUS_OK, "context");
  moe_server_metrics m;
  memset(&m, 0, sizeof m);
  const moe_status st = moe_server_metrics_get(ctx, "http://127.0.0.1:1", &m);
  TU_CHECK(st != MOE_STATUS_OK, "metrics from a closed port succeeded");
  if (st == MOE_STATUS_IO)
    TU_CHECK(strstr(moe_ctx_error(ctx), "127.0.0.1:1") != NULL, "the error names the URL: %s",
             moe_ctx_error(ctx));
  else
    TU_CHECK(st == MOE_STATUS_UNSUPPORTED, "closed port: status %d (%s)", (int)st,
             moe_ctx_error(ctx));
  moe_ctx_destroy(ctx);
  return tu_finish("test_prom");
}
