// The model of Lina's training step (src/perf/lina_train.c, moe simulate
// --lina-train): the timeline engine on hand-worked cases, then properties of
// the whole simulation on Lina's testbed.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/perf.h"
#include "testutil.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (1 + fabs(b)); }

// compute 5 s, then 8 s of all-reduce ready; an all-to-all of 10 s; compute 2 s
static void test_timeline_hand(moe_ctx *ctx) {
  const moe_lina_segment seg[3] = {
      {MOE_LINA_SEG_COMPUTE, 5, 8}, {MOE_LINA_SEG_A2A, 10, 0}, {MOE_LINA_SEG_COMPUTE, 2, 0}};
  double step = 0, left = 0;
  // packed: everything, then the 8 s
  TU_CHECK(moe_lina_train_timeline(ctx, seg, 3, MOE_LINA_TRAIN_PACKED, 2.0, 4.0, &step, &left) ==
                   MOE_STATUS_OK &&
               near(step, 25) && near(left, 8),
           "packed: step %g left %g, want 25 and 8", step, left);
  // fifo, contention 2: the all-reduce gets half the link during the
  // all-to-all: 8 s of work end after 16 s, while the all-to-all moves 8 s
  // of its 10 at half speed; its last 2 s at full speed: 18 s; then 2 s
  TU_CHECK(moe_lina_train_timeline(ctx, seg, 3, MOE_LINA_TRAIN_FIFO, 2.0, 4.0, &step, &left) ==
                   MOE_STATUS_OK &&
               near(step, 25) && near(left, 0),
           "fifo: step %g left %g, want 25 and 0", step, left);
  // priority: the micro-op in flight (half of 4 s) ends beside the
  // all-to-all (12 s); the 6 s left: 2 s in the compute, 4 s after
  TU_CHECK(moe_lina_train_timeline(ctx, seg, 3, MOE_LINA_TRAIN_PRIORITY, 2.0, 4.0, &step, &left) ==
                   MOE_STATUS_OK &&
               near(step, 23) && near(left, 4),
           "priority: step %g left %g, want 23 and 4", step, left);
  // fifo where the all-reduce outlasts the all-to-all: 30 s of work, contention 3:
  // the all-to-all takes 30 s, the all-reduce does 20 s of its work; 10 left - 2 in compute
  const moe_lina_segment big[3] = {
      {MOE_LINA_SEG_COMPUTE, 0, 30}, {MOE_LINA_SEG_A2A, 10, 0}, {MOE_LINA_SEG_COMPUTE, 2, 0}};
  TU_CHECK(moe_lina_train_timeline(ctx, big, 3, MOE_LINA_TRAIN_FIFO, 3.0, 0, &step, &left) ==
                   MOE_STATUS_OK &&
               near(step, 40) && near(left, 8),
           "fifo, long all-reduce: step %g left %g, want 40 and 8", step, left);
  // no contention (1): the all-to-all is never slower and the all-reduce waits it out
  TU_CHECK(moe_lina_train_timeline(ctx, seg, 3, MOE_LINA_TRAIN_FIFO, 1.0, 4.0, &step, &left) ==
                   MOE_STATUS_OK &&
               near(step, 23) && near(left, 6),
           "fifo, contention 1: step %g left %g, want 23 and 6", step, left);
  TU_CHECK(moe_lina_train_timeline(ctx, seg, 3, MOE_LINA_TRAIN_PRIORITY, 1.0, 4.0, &step, &left) ==
                   MOE_STATUS_OK &&
               near(step, 23) && near(left, 6),
           "priority, contention 1: step %g left %g, want 23 and 6", step, left);
  // priority, contention 1.1: the micro-op in flight can do at most 10 x 0.1 = 1 s of
  // its work beside the 10 s all-to-all: 11 s, 7 s left, 2 in the compute
  TU_CHECK(moe_lina_train_timeline(ctx, seg, 3, MOE_LINA_TRAIN_PRIORITY, 1.1, 4.0, &step, &left) ==
                   MOE_STATUS_OK &&
               near(step, 23) && near(left, 5),
           "priority, contention 1.1: step %g left %g, want 23 and 5", step, left);
  // bad input
  TU_CHECK(moe_lina_train_timeline(ctx, seg, 3, MOE_LINA_TRAIN_FIFO, 0.5, 4.0, &step, &left) ==
                   MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "contention (0.5) must be >= 1"),
           "contention 0.5: '%s'", moe_ctx_error(ctx));
  const moe_lina_segment neg = {MOE_LINA_SEG_A2A, -1, 0};
  TU_CHECK(moe_lina_train_timeline(ctx, &neg, 1, MOE_LINA_TRAIN_FIFO, 2, 4, &step, &left) ==
               MOE_STATUS_INVALID_ARG,
           "a negative segment accepted");
  TU_CHECK(moe_lina_train_timeline(ctx, seg, 3, 7, 2, 4, &step, &left) == MOE_STATUS_INVALID_ARG,
           "variant 7 accepted");
}

static void test_simulate(moe_ctx *ctx) {
  moe_cluster cl;
  TU_CHECK(moe_cluster_builtin(ctx, "lina-4x4-a100", &cl) == MOE_STATUS_OK, "lina cluster: %s",
           moe_ctx_error(ctx));
  moe_lina_train_config c;
  moe_lina_train_config_default(&c);
  moe_lina_train_result r[MOE_LINA_TRAIN_VARIANTS];
  TU_CHECK(moe_lina_train_simulate(ctx, &cl, &c, r) == MOE_STATUS_OK, "simulate: %s",
           moe_ctx_error(ctx));
  const moe_lina_train_result *pk = &r[MOE_LINA_TRAIN_PACKED], *ff = &r[MOE_LINA_TRAIN_FIFO],
                              *pr = &r[MOE_LINA_TRAIN_PRIORITY];
  // the same work in every policy but packing; packed leaves all of the sum
  TU_CHECK(near(pk->ar_ms, ff->ar_ms) && near(ff->ar_ms, pr->ar_ms) && near(pk->a2a_ms, ff->a2a_ms),
           "the policies do different work");
  TU_CHECK(near(pk->ar_exposed_ms, pk->ar_ms) && pk->ar_ms > 0, "packed: %g of %g ms left",
           pk->ar_exposed_ms, pk->ar_ms);
  TU_CHECK(ff->ar_exposed_ms < pk->ar_exposed_ms && pr->ar_exposed_ms < pk->ar_exposed_ms,
           "overlap hides nothing: %g, %g vs %g", ff->ar_exposed_ms, pr->ar_exposed_ms,
           pk->ar_exposed_ms);
  TU_CHECK(near(pk->step_ms, pk->fwd_ms + pk->bwd_ms + pk->ar_exposed_ms), "packed: parts");
  TU_CHECK(r[MOE_LINA_TRAIN_PACKING].ep == 8 && pk->ep == 16, "EP %d / %d",
           r[MOE_LINA_TRAIN_PACKING].ep, pk->ep);
  // without contention, fifo can only gain from the overlap: never slower than packed
  c.contention = 1;
  TU_CHECK(moe_lina_train_simulate(ctx, &cl, &c, r) == MOE_STATUS_OK &&
               r[MOE_LINA_TRAIN_FIFO].step_ms <= r[MOE_LINA_TRAIN_PACKED].step_ms + 1e-9,
           "contention 1: fifo %g > packed %g", r[MOE_LINA_TRAIN_FIFO].step_ms,
           r[MOE_LINA_TRAIN_PACKED].step_ms);
  // more contention never makes fifo or priority faster, and near 1 priority
  // moves smoothly from its contention-free step (no jump)
  double prev[2] = {0, 0};
  for (double s = 1; s <= 4; s += 0.25) {
    c.contention = s;
    TU_CHECK(moe_lina_train_simulate(ctx, &cl, &c, r) == MOE_STATUS_OK, "contention %g: %s", s,
             moe_ctx_error(ctx));
    TU_CHECK(r[MOE_LINA_TRAIN_FIFO].step_ms >= prev[0] - 1e-9 &&
                 r[MOE_LINA_TRAIN_PRIORITY].step_ms >= prev[1] - 1e-9,
             "faster at contention %g", s);
    prev[0] = r[MOE_LINA_TRAIN_FIFO].step_ms;
    prev[1] = r[MOE_LINA_TRAIN_PRIORITY].step_ms;
  }
  double base = 0;
  c.contention = 1;
  moe_lina_train_simulate(ctx, &cl, &c, r);
  base = r[MOE_LINA_TRAIN_PRIORITY].step_ms;
  c.contention = 1.0001;
  moe_lina_train_simulate(ctx, &cl, &c, r);
  TU_CHECK(fabs(r[MOE_LINA_TRAIN_PRIORITY].step_ms - base) < 1e-3 * base,
           "priority jumps from %g ms at contention 1 to %g ms at 1.0001", base,
           r[MOE_LINA_TRAIN_PRIORITY].step_ms);
  // bad config
  c.contention = 1.83;
  c.packing = 3;
  TU_CHECK(moe_lina_train_simulate(ctx, &cl, &c, r) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "packing (3) must divide the devices"),
           "packing 3 of 16 devices: '%s'", moe_ctx_error(ctx));
}

int main(void) {
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return 2;
  test_timeline_hand(ctx);
  test_simulate(ctx);
  moe_ctx_destroy(ctx);
  return tu_finish("test_lina_train");
}
