// libFuzzer harness: moe_cluster_from_json (include/moe/perf.h).
//
// Input: JSON text. Invariants checked:
//   - on failure: an error status with a message in the context, and the
//     output left exactly as it was;
//   - on success: the description passes moe_cluster_validate (the parser
//     promises range checks), and written back (a profile is the library's
//     writer of cluster descriptions: moe_profile_to_json) and read again it
//     is equal field by field, strings included.
#include <string.h>

#include "fuzz_perf_eq.h"
#include "fuzz_util.h"
#include "moe/perf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size);
  moe_ctx *ctx = fuzz_ctx();
  moe_cluster c, before;
  memset(&c, 0x5a, sizeof c);
  before = c;
  moe_status st = moe_cluster_from_json(ctx, text, &c);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_cluster_from_json");
    FUZZ_CHECK(memcmp(&c, &before, sizeof c) == 0, "output changed by a failed parse");
  } else {
    FUZZ_CHECK(moe_cluster_validate(ctx, &c) == MOE_STATUS_OK, "parsed cluster is invalid: %s",
               moe_ctx_error(ctx));
    // The smallest profile that holds it: one GEMM fit, one all-to-all fit.
    moe_profile *p = calloc(2, sizeof *p);
    FUZZ_CHECK(p != NULL, "out of memory");
    p[0].cluster = c;
    p[0].slow_compute = p[0].slow_comm = 1.0;
    p[0].gemm = (moe_linear_fit){.alpha = 1e-6, .beta = 1e-12, .r2 = 1.0, .n = 2};
    p[0].n_a2a = 1;
    snprintf(p[0].a2a[0].name, sizeof p[0].a2a[0].name, "a");
    p[0].a2a[0].fit = p[0].gemm;
    char *json = NULL;
    st = moe_profile_to_json(ctx, &p[0], &json);
    FUZZ_CHECK(st == MOE_STATUS_OK, "moe_profile_to_json: %s", moe_ctx_error(ctx));
    st = moe_profile_from_json(ctx, json, &p[1]);
    FUZZ_CHECK(st == MOE_STATUS_OK, "reading back %s: %s", json, moe_ctx_error(ctx));
    fuzz_cluster_check_equal(&p[0].cluster, &p[1].cluster);
    moe_free(json);
    free(p);
  }
  moe_ctx_destroy(ctx);
  free(text);
  return 0;
}
