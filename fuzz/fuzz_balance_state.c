// libFuzzer harness: a load balancer's state as a checkpoint stores it
// (moe_balancer_state_load in include/moe/balance.h; the trainer reads it
// from `h<block>.balance.state` on resume).
//
// Input: 1 config byte, then the state's bytes.
//   byte 0   bits 0-1: the policy (shadow, prophet, eplb, auto); bits 2-3:
//            the window, 1 + value steps; bits 4-6: the copy slots,
//            value % 7 (E = 8 experts on P = 4 ranks: at most 6)
// Invariants checked:
//   - on failure: an error status with a message in the context, and the
//     balancer unchanged (its saved state equals the one before);
//   - on success: saving it again gives the input bytes exactly, its
//     placement is a valid bitmap within the slots, and it plans the next
//     step (a uniform load) without error.
#include <string.h>

#include "fuzz_util.h"
#include "moe/balance.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { E = 8, P = 4, N = E * P };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  moe_ctx *ctx = fuzz_ctx();
  const int policy = MOE_BALANCE_SHADOW + (data[0] & 3);
  moe_balance_config c;
  moe_balance_config_default(&c, policy, 16, 32, ((data[0] >> 4) & 7) % 7);
  c.window = 1 + ((data[0] >> 2) & 3);
  moe_balancer *b = NULL;
  FUZZ_CHECK(moe_balancer_create(ctx, &c, E, P, &b) == MOE_STATUS_OK, "create: %s",
             moe_ctx_error(ctx));
  if (!b) {
    moe_ctx_destroy(ctx);
    return 0;
  }
  const size_t bytes = moe_balancer_state_bytes(b);
  uint8_t *before = moe_malloc(bytes), *after = moe_malloc(bytes);
  FUZZ_CHECK(before && after, "out of memory");
  moe_balancer_state_save(b, before);
  const moe_status st = moe_balancer_state_load(b, data + 1, size - 1);
  moe_balancer_state_save(b, after);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_balancer_state_load");
    FUZZ_CHECK(memcmp(before, after, bytes) == 0, "a refused state changed the balancer");
  } else {
    FUZZ_CHECK(size - 1 == bytes && memcmp(after, data + 1, bytes) == 0,
               "an accepted state does not save back as the same bytes");
    const uint8_t *cur = moe_balancer_placement(b);
    int64_t counts[N];
    for (int i = 0; i < N; i++) counts[i] = 3;
    const moe_balance_load load = {E, P, counts};
    FUZZ_CHECK(moe_balance_check(ctx, &load, cur) == MOE_STATUS_OK, "placement: %s",
               moe_ctx_error(ctx));
    for (int p = 0; p < P; p++) {
      int k = 0;
      for (int e = 0; e < E; e++) k += cur[e * P + p];
      FUZZ_CHECK(k <= c.slots, "rank %d holds %d copies, slots %d", p, k, c.slots);
    }
    uint8_t rep[N];
    FUZZ_CHECK(moe_balancer_step(b, counts, rep, NULL) == MOE_STATUS_OK, "step: %s",
               moe_ctx_error(ctx));
  }
  moe_free(before);
  moe_free(after);
  moe_balancer_destroy(b);
  moe_ctx_destroy(ctx);
  return 0;
}
