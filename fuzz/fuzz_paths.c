// libFuzzer harness: Lina's path profiles as moe generate --paths reads them
// (moe_path_profile_from_json, include/moe/paths.h).
//
// Input: the profile's JSON text (any bytes). Invariants checked:
//   - on failure: an error status with a message in the context, no profile;
//   - on success: writing it again and reading that back gives the same text
//     (a round trip), its stats are consistent (unkept <= tokens per block,
//     paths <= max_paths per block), and the estimate of every block for a
//     few tokens whose earlier choices come from the input's bytes is
//     finite, >= 0 and sums to tokens x top_k;
//   - merging it into a copy of itself succeeds and doubles its tokens.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "moe/paths.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  moe_ctx *ctx = fuzz_ctx();
  moe_path_profile *p = NULL, *q = NULL;
  char *t1 = NULL, *t2 = NULL;
  const moe_status st = moe_path_profile_from_json(ctx, (const char *)data, size, &p);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_path_profile_from_json");
    FUZZ_CHECK(!p, "a refused profile was returned");
    goto done;
  }
  FUZZ_CHECK(moe_path_profile_to_json(ctx, p, &t1) == MOE_STATUS_OK, "to_json: %s",
             moe_ctx_error(ctx));
  FUZZ_CHECK(moe_path_profile_from_json(ctx, t1, strlen(t1), &q) == MOE_STATUS_OK,
             "its own text refused: %s", moe_ctx_error(ctx));
  FUZZ_CHECK(moe_path_profile_to_json(ctx, q, &t2) == MOE_STATUS_OK && strcmp(t1, t2) == 0,
             "the round trip changed the text");
  {
    const moe_path_config *c = moe_path_profile_config(p);
    const moe_path_profile_stats s = moe_path_profile_get_stats(p);
    FUZZ_CHECK(s.paths <= (int64_t)c->n_blocks * c->max_paths && s.unkept >= 0 && s.tokens >= 0,
               "stats: %lld paths, %lld unkept", (long long)s.paths, (long long)s.unkept);
    enum { T = 3 };
    int32_t *ch[MOE_PATHS_MAX_BLOCKS];
    const int K = c->top_k, E = c->num_experts;
    double *pop = malloc((size_t)E * sizeof(double));
    int ok = pop != NULL;
    for (int b = 0; b < c->n_blocks; b++) {
      ch[b] = malloc((size_t)T * K * sizeof(int32_t));
      ok &= ch[b] != NULL;
      for (int i = 0; ch[b] && i < T * K; i++)
        ch[b][i] = size ? (int32_t)(data[(size_t)(b * T * K + i) % size] % (E + 1)) - 1 : 0;
    }
    for (int b = 0; ok && b < c->n_blocks; b++) {
      const int32_t *cc[MOE_PATHS_MAX_BLOCKS];
      for (int i = 0; i < c->n_blocks; i++) cc[i] = ch[i];
      FUZZ_CHECK(moe_path_profile_estimate(p, b, cc, T, pop, NULL) == MOE_STATUS_OK,
                 "estimate block %d", b);
      double sum = 0;
      for (int e = 0; e < E; e++) {
        FUZZ_CHECK(isfinite(pop[e]) && pop[e] >= 0, "block %d: pop[%d] = %g", b, e, pop[e]);
        sum += pop[e];
      }
      FUZZ_CHECK(fabs(sum - (double)T * K) < 1e-6 * T * K, "block %d: estimate sums to %.17g", b,
                 sum);
    }
    for (int b = 0; b < c->n_blocks; b++) free(ch[b]);
    free(pop);
    FUZZ_CHECK(moe_path_profile_merge(ctx, q, p) == MOE_STATUS_OK, "merge: %s", moe_ctx_error(ctx));
    const moe_path_profile_stats s2 = moe_path_profile_get_stats(q);
    FUZZ_CHECK(s2.tokens == 2 * s.tokens, "merged tokens %lld, from %lld", (long long)s2.tokens,
               (long long)s.tokens);
  }
done:
  moe_free(t1);
  moe_free(t2);
  moe_path_profile_destroy(p);
  moe_path_profile_destroy(q);
  moe_ctx_destroy(ctx);
  return 0;
}
