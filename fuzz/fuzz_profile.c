// libFuzzer harness: moe_profile_from_json (include/moe/perf.h).
//
// Input: JSON text. Invariants checked:
//   - on failure: an error status with a message in the context, and the
//     output left exactly as it was;
//   - on success: its cluster passes moe_cluster_validate; moe_profile_to_json
//     writes it, and that text reads back to an equal profile, every number
//     bitwise and every name intact (`moe calibrate --refit` and
//     `--profile` rely on profiles reading back exactly); writing the
//     read-back profile gives the same text.
#include <string.h>

#include "fuzz_perf_eq.h"
#include "fuzz_util.h"
#include "moe/perf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size);
  moe_ctx *ctx = fuzz_ctx();
  // moe_profile is large (~14 KB): on the heap.
  moe_profile *p = malloc(3 * sizeof *p);
  FUZZ_CHECK(p != NULL, "out of memory");
  memset(p, 0x5a, 3 * sizeof *p);
  moe_status st = moe_profile_from_json(ctx, text, &p[0]);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_profile_from_json");
    FUZZ_CHECK(memcmp(&p[0], &p[2], sizeof *p) == 0, "output changed by a failed parse");
  } else {
    FUZZ_CHECK(moe_cluster_validate(ctx, &p[0].cluster) == MOE_STATUS_OK,
               "profile's cluster is invalid: %s", moe_ctx_error(ctx));
    char *json = NULL, *again = NULL;
    st = moe_profile_to_json(ctx, &p[0], &json);
    FUZZ_CHECK(st == MOE_STATUS_OK, "moe_profile_to_json: %s", moe_ctx_error(ctx));
    st = moe_profile_from_json(ctx, json, &p[1]);
    FUZZ_CHECK(st == MOE_STATUS_OK, "reading back %s: %s", json, moe_ctx_error(ctx));
    fuzz_profile_check_equal(&p[0], &p[1]);
    st = moe_profile_to_json(ctx, &p[1], &again);
    FUZZ_CHECK(st == MOE_STATUS_OK, "moe_profile_to_json again: %s", moe_ctx_error(ctx));
    FUZZ_CHECK(strcmp(json, again) == 0, "written twice, the texts differ:\n%s\n%s", json, again);
    moe_free(json);
    moe_free(again);
  }
  free(p);
  moe_ctx_destroy(ctx);
  free(text);
  return 0;
}
