// Load-balancing planners (include/moe/balance.h): rows and traffic under the
// copy rule, the FasterMoE and Pro-Prophet models, FasterMoE Algorithm 1,
// Pro-Prophet Algorithm 1 (its steps and BottomK), EPLB slots, the window,
// the policy catalogue, determinism and properties over random loads, and bad
// input. Every expected value is worked out by hand in the comments, not by
// calling the code under test.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "balance/balance_internal.h"
#include "moe/balance.h"
#include "testutil.h"

static moe_ctx *g_ctx;

static int near(double got, double want) {
  return fabs(got - want) <= 1e-9 * fmax(1.0, fabs(want));
}

static int bitmap_is(const uint8_t *got, const uint8_t *want, int n) {
  return memcmp(got, want, (size_t)n) == 0;
}

static void print_bitmap(const char *name, const uint8_t *b, int E, int P) {
  printf("  %s:", name);
  for (int e = 0; e < E; e++) {
    printf(" e%d[", e);
    for (int p = 0; p < P; p++) printf("%d", b[e * P + p]);
    printf("]");
  }
  printf("\n");
}

// M = H = 1 and round rates, so every time is a small integer of ms.
static moe_balance_cost unit_cost(double flops, double net, double param) {
  moe_balance_cost c;
  moe_balance_cost_default(&c, 1, 1);
  c.flops_per_s = flops;
  c.net_bytes_per_s = net;
  c.act_bytes = 1;
  c.expert_param_bytes = param;
  return c;
}

// ---- rows, ratio, traffic -------------------------------------------------------------------

static void test_rows(void) {
  // E = P = 4, home(e) = e. counts (src rows, expert columns):
  //   src0: 10 2 0 4 | src1: 3 8 1 0 | src2: 5 0 6 2 | src3: 7 1 0 9
  const int64_t counts[16] = {10, 2, 0, 4, 3, 8, 1, 0, 5, 0, 6, 2, 7, 1, 0, 9};
  const moe_balance_load load = {4, 4, counts};
  int64_t rows[4], sent[4], recv[4];
  // no copies: rows = column sums 25, 11, 7, 15 (total 58)
  TU_CHECK(moe_balance_rows(g_ctx, &load, NULL, rows) == MOE_STATUS_OK, "%s", moe_ctx_error(g_ctx));
  TU_CHECK(rows[0] == 25 && rows[1] == 11 && rows[2] == 7 && rows[3] == 15,
           "rows %lld %lld %lld %lld", (long long)rows[0], (long long)rows[1], (long long)rows[2],
           (long long)rows[3]);
  // ratio = 25 / (58 / 4) = 100 / 58
  TU_CHECK(near(moe_balance_ratio(rows, 4), 100.0 / 58.0), "ratio %g", moe_balance_ratio(rows, 4));
  // sent = row sums minus the diagonal: 6, 4, 7, 8; recv = column sums minus it: 15, 3, 1, 6
  TU_CHECK(moe_balance_traffic(g_ctx, &load, NULL, sent, recv) == MOE_STATUS_OK, "traffic");
  TU_CHECK(sent[0] == 6 && sent[1] == 4 && sent[2] == 7 && sent[3] == 8, "sent without copies");
  TU_CHECK(recv[0] == 15 && recv[1] == 3 && recv[2] == 1 && recv[3] == 6, "recv without copies");

  // copies: expert 0 on every other rank (1, 2, 3); expert 1 on rank 3 (which
  // sends it 1 row); expert 3 on rank 1 (which sends it 0 rows: no change)
  uint8_t rep[16] = {0};
  rep[0 * 4 + 1] = rep[0 * 4 + 2] = rep[0 * 4 + 3] = 1;
  rep[1 * 4 + 3] = 1;
  rep[3 * 4 + 1] = 1;
  // rank0: e0 from itself 10                                   = 10
  // rank1: e1 from src0 2, src1 8, src2 0 (src3 local); e0 own 3; e3 own 0 = 13
  // rank2: e2 0 + 1 + 6 + 0; e0 own 5                          = 12
  // rank3: e3 from src0 4, src2 2, itself 9; e0 own 7; e1 own 1 = 23   (total 58)
  TU_CHECK(moe_balance_rows(g_ctx, &load, rep, rows) == MOE_STATUS_OK, "%s", moe_ctx_error(g_ctx));
  TU_CHECK(rows[0] == 10 && rows[1] == 13 && rows[2] == 12 && rows[3] == 23,
           "rows with copies %lld %lld %lld %lld", (long long)rows[0], (long long)rows[1],
           (long long)rows[2], (long long)rows[3]);
  // sent: src0 e1 2 + e2 0 + e3 4 = 6; src1 e2 1 = 1; src2 e1 0 + e3 2 = 2; src3 nothing = 0
  // recv: rank0 0; rank1 e1 from src0 2 (+ src2 0) = 2; rank2 e2 from src1 1; rank3 e3 4 + 2 = 6
  TU_CHECK(moe_balance_traffic(g_ctx, &load, rep, sent, recv) == MOE_STATUS_OK, "traffic");
  TU_CHECK(sent[0] == 6 && sent[1] == 1 && sent[2] == 2 && sent[3] == 0, "sent with copies");
  TU_CHECK(recv[0] == 0 && recv[1] == 2 && recv[2] == 1 && recv[3] == 6, "recv with copies");

  const int64_t zeros[4] = {0, 0, 0, 0};
  TU_CHECK(moe_balance_ratio(zeros, 4) == 1.0, "ratio of zeros is 1");
}

// ---- FasterMoE: eq 7/8 and Algorithm 1 ------------------------------------------------------

// M = H = 1, act_bytes 1, F = 12000 FLOP/s: 3 x 4 M H / F = 1 ms per row computed;
// W = 4000 B/s: 4 x M x 1 / W = 1 ms per row of features; param = 20 B:
// 2 x 20 / 4000 s = 10 ms per shadowed expert. So Lat = 2 max(B) + 10 r ms.
static void test_shadow(void) {
  const moe_balance_cost cost = unit_cost(12000, 4000, 20);
  uint8_t rep[16], want[16];
  double ms = -1;

  // 1. one hot expert: every rank sends 10, 1, 1, 1. B = 40, 4, 4, 4: Lat_imbl = 80.
  //    Shadow e0 (load 40): B' = 10, 4 + 10, 14, 14: 28 + 10 = 38 < 80, kept.
  //    Shadow e1 (load 4; ties with e2, e3 go to the lowest index): each of
  //    ranks 0, 2, 3 keeps its 1 row: B' = 11, 11, 15, 15: 30 + 20 = 50 >= 38: stop.
  const int64_t one[16] = {10, 1, 1, 1, 10, 1, 1, 1, 10, 1, 1, 1, 10, 1, 1, 1};
  const moe_balance_load l1 = {4, 4, one};
  TU_CHECK(moe_balance_predict(g_ctx, &l1, NULL, &cost, MOE_BALANCE_MODEL_FASTERMOE, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 80),
           "Lat_imbl %g, want 80", ms);
  TU_CHECK(moe_balance_plan_shadow(g_ctx, &l1, &cost, rep, &ms) == MOE_STATUS_OK, "%s",
           moe_ctx_error(g_ctx));
  memset(want, 0, 16);
  want[1] = want[2] = want[3] = 1;  // e0 on ranks 1, 2, 3
  TU_CHECK(bitmap_is(rep, want, 16) && near(ms, 38), "one hot expert: ms %g, want 38", ms);
  if (!bitmap_is(rep, want, 16)) print_bitmap("got", rep, 4, 4);

  // 2. uniform, 5 everywhere: B = 20 each, 40 ms. Shadow e0: B' = 5, 25, 25, 25:
  //    50 + 10 = 60 >= 40: nothing is shadowed.
  int64_t uni[16];
  for (int i = 0; i < 16; i++) uni[i] = 5;
  const moe_balance_load l2 = {4, 4, uni};
  TU_CHECK(moe_balance_plan_shadow(g_ctx, &l2, &cost, rep, &ms) == MOE_STATUS_OK, "uniform");
  memset(want, 0, 16);
  TU_CHECK(bitmap_is(rep, want, 16) && near(ms, 40), "uniform: ms %g, want 40", ms);

  // 3. two win: every rank sends 20, 8, 1, 1. B = 80, 32, 4, 4: 160 ms.
  //    e0: B' = 20, 32 + 20, 4 + 20, 24: 104 + 10 = 114 < 160, kept.
  //    e1: ranks 0, 2, 3 keep their 8: B' = 28, 52 - 24, 32, 32: 64 + 20 = 84 < 114, kept.
  //    e2: ranks 0, 1, 3 keep their 1: B' = 29, 29, 32 - 3, 33: 66 + 30 = 96 >= 84: stop.
  const int64_t two[16] = {20, 8, 1, 1, 20, 8, 1, 1, 20, 8, 1, 1, 20, 8, 1, 1};
  const moe_balance_load l3 = {4, 4, two};
  TU_CHECK(moe_balance_plan_shadow(g_ctx, &l3, &cost, rep, &ms) == MOE_STATUS_OK, "two");
  memset(want, 0, 16);
  want[0 * 4 + 1] = want[0 * 4 + 2] = want[0 * 4 + 3] = 1;
  want[1 * 4 + 0] = want[1 * 4 + 2] = want[1 * 4 + 3] = 1;
  TU_CHECK(bitmap_is(rep, want, 16) && near(ms, 84), "two hot experts: ms %g, want 84", ms);
  if (!bitmap_is(rep, want, 16)) print_bitmap("got", rep, 4, 4);

  // 4. a tie is not a gain: case 1 with 104 B of parameters (52 ms per shadowed
  //    expert): shadowing e0 predicts 28 + 52 = 80 = Lat_imbl: nothing is shadowed.
  const moe_balance_cost tie = unit_cost(12000, 4000, 104);
  TU_CHECK(moe_balance_plan_shadow(g_ctx, &l1, &tie, rep, &ms) == MOE_STATUS_OK, "tie");
  memset(want, 0, 16);
  TU_CHECK(bitmap_is(rep, want, 16) && near(ms, 80), "tie: ms %g, want 80 and no copy", ms);
}

// ---- Pro-Prophet: eq 6/8 and Algorithm 1 ----------------------------------------------------

// M = H = 1, act_bytes 1, P = 4; W = 1000 B/s: 1 ms per row received (T_A2A);
// F = 4000 FLOP/s: 4 M H / F = 1 ms per row computed (T_FEC); param = 8 B:
// T_Trans = T_Agg = 8 / (4 x 1000) s = 2 ms per copy. So eq 6 is
// T' = 4 max(R) + 3 max(H) + 4 c   (c copies).
//   src0: 8 1 1 0 | src1: 6 2 0 1 | src2: 5 1 3 0 | src3: 1 6 0 4
// H = 20, 10, 4, 5 (I = 39); R = 6+5+1, 1+1+6, 1, 1 = 12, 8, 1, 1:
// T'(no copies) = 48 + 60 = 108.
static const int64_t k_prophet[16] = {8, 1, 1, 0, 6, 2, 0, 1, 5, 1, 3, 0, 1, 6, 0, 4};

static void test_prophet(void) {
  const moe_balance_cost cost = unit_cost(4000, 1000, 8);
  const moe_balance_load load = {4, 4, k_prophet};
  uint8_t rep[16], want[16];
  int chosen[4], steps = -1, best = -1;
  double trace[5], ms = -1;
  TU_CHECK(moe_balance_predict(g_ctx, &load, NULL, &cost, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 108),
           "T' without copies %g, want 108", ms);

  // n = 1, alpha = 0.1 (balanced when (max H - min H) x 4 < 3.9):
  // step 1: heaviest rank 0 -> e0. Other ranks by rows to e0: rank3 (1), rank2 (5),
  //   rank1 (6): BottomK(1) = {3}; copies on 1, 2. H = 8 + 1, 10 + 6, 4 + 5, 5 =
  //   9, 16, 9, 5; R = 1 (src3), 1 + 1 + 6, 1, 1: max 8; c = 2:
  //   T' = 32 + 48 + 8 = 88 < 108: best prefix 1.
  // step 2: heaviest rank 1 -> e1. rank0 (1), rank2 (1), rank3 (6): ties to the
  //   lowest rank, BottomK(1) = {0}; copies on 2, 3. H = 9, 16 - 7, 9 + 1, 5 + 6 =
  //   9, 9, 10, 11; R: rank1 gets only src0's 1, all max 1; c = 4:
  //   T' = 4 + 33 + 16 = 53 < 88: best prefix 2.
  // step 3: spread 2 (8 >= 3.9): heaviest rank 3 -> e3. rank0 (0), rank2 (0),
  //   rank1 (1): BottomK(1) = {0}; rank2 sends 0 (no copy); a copy on 1.
  //   H = 9, 10, 10, 10; max R 1; c = 5: T' = 4 + 30 + 20 = 54 >= 53: not kept.
  // step 4: heaviest rank 1 (ties: lowest) -> e1 already used, no other: stop.
  TU_CHECK(moe_balance_prophet_steps(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, 1, 0.1, rep,
                                     chosen, trace, &steps, &best) == MOE_STATUS_OK,
           "%s", moe_ctx_error(g_ctx));
  TU_CHECK(steps == 3 && chosen[0] == 0 && chosen[1] == 1 && chosen[2] == 3 && best == 2,
           "prophet steps %d (%d %d %d), best %d; want 3 (0 1 3), best 2", steps, chosen[0],
           chosen[1], chosen[2], best);
  TU_CHECK(near(trace[0], 108) && near(trace[1], 88) && near(trace[2], 53) && near(trace[3], 54),
           "T' %g %g %g %g, want 108 88 53 54", trace[0], trace[1], trace[2], trace[3]);
  memset(want, 0, 16);
  want[0 * 4 + 1] = want[0 * 4 + 2] = 1;  // e0 on 1, 2 (not 3: BottomK)
  want[1 * 4 + 2] = want[1 * 4 + 3] = 1;  // e1 on 2, 3 (not 0: BottomK, tie to lowest)
  TU_CHECK(bitmap_is(rep, want, 16), "prophet n=1 bitmap");
  if (!bitmap_is(rep, want, 16)) print_bitmap("got", rep, 4, 4);
  TU_CHECK(moe_balance_plan_prophet(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, 1, 0.1, rep,
                                    &ms) == MOE_STATUS_OK &&
               bitmap_is(rep, want, 16) && near(ms, 53),
           "plan_prophet n=1: ms %g, want 53", ms);

  // alpha = 1 (balanced when spread x 4 < 39): after step 2 the spread is 2:
  // stops there, same answer, two steps.
  TU_CHECK(moe_balance_prophet_steps(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, 1, 1.0, rep,
                                     chosen, trace, &steps, &best) == MOE_STATUS_OK &&
               steps == 2 && best == 2 && bitmap_is(rep, want, 16),
           "alpha 1: steps %d best %d", steps, best);

  // n = 0 (every rank that sends rows gets a copy):
  // step 1: e0 on 1, 2, 3: H = 8, 16, 9, 6; max R 8 (rank1); c = 3: 32 + 48 + 12 = 92.
  // step 2: e1 on 0, 2, 3: H = 9, 8, 10, 12; max R 1; c = 6: 4 + 36 + 24 = 64.
  // step 3: rank 3 -> e3 on 1 only: H = 9, 9, 10, 11; c = 7: 4 + 33 + 28 = 65: not kept.
  // step 4: rank 3 -> e3 used: stop. Answer 64.
  // n = 2: step 1: e0 on 1 only (BottomK {3, 2}): H = 14, 16, 4, 5; R = 6, 8, 1, 1;
  //   c = 1: 32 + 48 + 4 = 84. step 2: e1 on 3 only (BottomK {0, 2}): H = 14, 10,
  //   4, 11; R = 6, 2, 1, 1; c = 2: 24 + 42 + 8 = 74. step 3: rank 0 -> e0 used: stop.
  // n = -1 keeps the lowest: n = 1's 53.
  TU_CHECK(moe_balance_plan_prophet(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, 0, 0.1, rep,
                                    &ms) == MOE_STATUS_OK &&
               near(ms, 64),
           "n=0: ms %g, want 64", ms);
  TU_CHECK(moe_balance_plan_prophet(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, 2, 0.1, rep,
                                    &ms) == MOE_STATUS_OK &&
               near(ms, 74),
           "n=2: ms %g, want 74", ms);
  uint8_t want2[16] = {0};
  want2[0 * 4 + 1] = 1;
  want2[1 * 4 + 3] = 1;
  TU_CHECK(bitmap_is(rep, want2, 16), "n=2 bitmap (BottomK of 2)");
  TU_CHECK(moe_balance_plan_prophet(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, -1, 0.1, rep,
                                    &ms) == MOE_STATUS_OK &&
               near(ms, 53) && bitmap_is(rep, want, 16),
           "n=-1: ms %g, want 53 (n = 1)", ms);

  // eq 8 on n = 1's answer (T_Trans = T_Agg = 8, T_FEC = 11): both hide, 4 + 33 = 37.
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &cost, MOE_BALANCE_MODEL_PROPHET_SCHED, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 37),
           "eq 8: %g, want 37", ms);
  // with 80 B of parameters (20 ms per copy each way: T_Trans = T_Agg = 80), FNEC 5,
  // BNEC 10: T_PTrans = 80 - 11 - 5 = 64, T_PAgg = 80 - 22 - 10 = 48: 37 + 112 = 149;
  // eq 6: 37 + 160 = 197.
  moe_balance_cost big = unit_cost(4000, 1000, 80);
  big.fnec_ms = 5;
  big.bnec_ms = 10;
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &big, MOE_BALANCE_MODEL_PROPHET_SCHED, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 149),
           "eq 8 with exposed transfers: %g, want 149", ms);
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &big, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 197),
           "eq 6: %g, want 197", ms);

  // Per link (cost.ranks_per_node = 2: ranks 0, 1 on node 0 and 2, 3 on node 1;
  // W = 1000 B/s per rank: 1 ms per row over a rank's link, 8 ms per copy's
  // parameters). Without copies, off-node rows: sent = 1, 1, 6 (src2: e0 5,
  // e1 1), 7 (src3: e0 1, e1 6); received = 6, 7, 1, 1: T_A2A = 7;
  // T' = 28 + 60 = 88.
  // With n = 1's answer (e0 on 1, 2; e1 on 2, 3): H = 9, 9, 10, 11; off-node
  // rows: sent 1, 1, 0, 1 (src3's e0 goes home), received 1, 0, 1, 1: T_A2A = 1.
  // Copies crossing nodes: e0 -> 2, e1 -> 2, e1 -> 3 (e0 -> 1 stays on node 0):
  // rank 1 sends two, rank 2 receives two: T_Trans = T_Agg = 2 x 8 = 16 (the
  // flat eq 4 spreads 4 copies over 4 links: 8 each).
  // T' = 4 + 33 + 32 = 69; eq 8: T_PTrans = 16 - 11 = 5, T_PAgg = 0: 42.
  moe_balance_cost links = cost;
  links.ranks_per_node = 2;
  TU_CHECK(moe_balance_predict(g_ctx, &load, NULL, &links, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 88),
           "per link, no copies: %g, want 88", ms);
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &links, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 69),
           "per link, n = 1's plan: %g, want 69", ms);
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &links, MOE_BALANCE_MODEL_PROPHET_SCHED, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 42),
           "per link, eq 8: %g, want 42", ms);
  // e0 copied to every rank: its home sends two copies off node (16 ms), where
  // eq 4 charges 3 x 8 / 4 = 6. H = 8, 16, 9, 6 -> 48; off-node rows: src0
  // sends e2 1, src1 e3 1, src2 e1 1, src3 e1 6; received: rank1 7: T_A2A = 7.
  // T' = 28 + 48 + 32 = 108 (flat: R = 0, 8, 1, 1 -> 32 + 48 + 12 = 92).
  uint8_t all0[16] = {0};
  all0[0 * 4 + 1] = all0[0 * 4 + 2] = all0[0 * 4 + 3] = 1;
  TU_CHECK(moe_balance_predict(g_ctx, &load, all0, &links, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 108),
           "per link, e0 everywhere: %g, want 108", ms);
  TU_CHECK(moe_balance_predict(g_ctx, &load, all0, &cost, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 92),
           "flat, e0 everywhere: %g, want 92", ms);
  // one node (g >= P): nothing crosses: T' = 3 max(H) = 60 without copies, 33 with.
  links.ranks_per_node = 4;
  TU_CHECK(moe_balance_predict(g_ctx, &load, NULL, &links, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 60),
           "one node, no copies: %g, want 60", ms);
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &links, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 33),
           "one node, n = 1's plan: %g, want 33", ms);
  // FasterMoE's model ignores the layout: the same with and without it.
  double flat_ms = -1;
  links.ranks_per_node = 2;
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &links, MOE_BALANCE_MODEL_FASTERMOE, &ms) ==
                   MOE_STATUS_OK &&
               moe_balance_predict(g_ctx, &load, want, &cost, MOE_BALANCE_MODEL_FASTERMOE,
                                   &flat_ms) == MOE_STATUS_OK &&
               ms == flat_ms,
           "FasterMoE's model with a layout: %g, without %g", ms, flat_ms);

  // Ranks sharing cores (cost.compute_slots = 2 of P = 4): the compute term
  // takes max(max H, sum H / 2) rows. Without copies H = 20, 10, 4, 5 (sum 39):
  // max(20, 19.5) = 20, T' = 108 as before. n = 1's plan: H = 9, 9, 10, 11:
  // max(11, 19.5) = 19.5: T' = 4 + 58.5 + 16 = 78.5 (53 with a core per rank).
  moe_balance_cost shared = cost;
  shared.compute_slots = 2;
  TU_CHECK(moe_balance_predict(g_ctx, &load, NULL, &shared, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 108),
           "2 compute slots, no copies: %g, want 108", ms);
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &shared, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 78.5),
           "2 compute slots, n = 1's plan: %g, want 78.5", ms);
  // FasterMoE's model: its compute term 3 x 4 M H B / F grows by 3 x (19.5 - 11) ms
  double own = -1;
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &shared, MOE_BALANCE_MODEL_FASTERMOE, &ms) ==
                   MOE_STATUS_OK &&
               moe_balance_predict(g_ctx, &load, want, &cost, MOE_BALANCE_MODEL_FASTERMOE, &own) ==
                   MOE_STATUS_OK &&
               near(ms - own, 25.5),
           "2 compute slots under FasterMoE's model: %g - %g, want 25.5 more", ms, own);
  // slots >= P (and 0) change nothing
  shared.compute_slots = 4;
  TU_CHECK(moe_balance_predict(g_ctx, &load, want, &shared, MOE_BALANCE_MODEL_PROPHET, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 53),
           "4 compute slots of 4: %g, want 53", ms);

  // A plan that lowers T' but raises max(H) is refused. E = P = 2, W = 100 B/s
  // (10 ms per row received), 1 ms per row computed, param 0:
  //   src0: 5 0 | src1: 10 6: H = 15, 6; R = 10, 0: T' = 400 + 45 = 445.
  // step 1: rank 0 -> e0, a copy on 1: H = 5, 16 (above 15); R = 0, 0: T' = 48.
  // step 2: rank 1 -> e1; rank 0 sends it nothing: no copy, T' 48. step 3: e1 used: stop.
  // Eq 6 alone would take step 1; the answer is the empty placement.
  const int64_t comm[4] = {5, 0, 10, 6};
  const moe_balance_load lc = {2, 2, comm};
  const moe_balance_cost slow = unit_cost(4000, 100, 0);
  uint8_t rc[4], none[4] = {0};
  TU_CHECK(moe_balance_prophet_steps(g_ctx, &lc, &slow, MOE_BALANCE_MODEL_PROPHET, 0, 0.1, rc,
                                     chosen, trace, &steps, &best) == MOE_STATUS_OK &&
               steps == 2 && best == 0 && near(trace[0], 445) && near(trace[1], 48) &&
               bitmap_is(rc, none, 4),
           "max(H) guard: steps %d best %d T' %g %g", steps, best, trace[0], trace[1]);
}

// ---- EPLB ---------------------------------------------------------------------------------

static void test_eplb(void) {
  // E = 8, P = 4, slots 1; homes e0 e1 -> 0, e2 e3 -> 1, e4 e5 -> 2, e6 e7 -> 3.
  //   src0: 6 2 1 0 1 0 0 1 | src1: 5 4 2 1 0 1 0 0
  //   src2: 7 1 1 1 2 0 1 0 | src3: 2 5 0 1 0 1 1 1
  // totals: e0 20, e1 12, e2 4, e3 3, e4 3, e5 2, e6 2, e7 2; rows 32, 7, 5, 4 (48).
  // step 1: max rank 0: e0 (20/1) before e1 (12/1). e0 on 1 -> (27, 1), on 2 -> (25, 1),
  //   on 3 -> (30, 1): rank 2. rows 25, 7, 12, 4.
  // step 2: e1 (12/1) before e0 (20/2). e1 on 1 -> (21, 1), rank 2 full, on 3 -> (20, 1):
  //   rank 3. rows 20, 7, 12, 9.
  // step 3: e0 (10) before e1 (6). e0 on 1 -> (15, 1) (2 has one, 3 full). rows 15, 12, 12, 9.
  // step 4: ranks 1, 2, 3 have used their slot: stop.
  // With param 0 and eq 6 (M = H = 1, W = 1000, F = 4000): T' = 4 max R + 3 max H:
  //   no copies: R0 = 5 + 7 + 2 + 4 + 1 + 5 = 24: 96 + 96 = 192; step 1: R0 17, H 25:
  //   143; step 2: R0 12, H 20: 108; step 3: R0 7, H 15: 28 + 45 = 73 (all kept).
  const int64_t counts[32] = {6, 2, 1, 0, 1, 0, 0, 1, 5, 4, 2, 1, 0, 1, 0, 0,
                              7, 1, 1, 1, 2, 0, 1, 0, 2, 5, 0, 1, 0, 1, 1, 1};
  const moe_balance_load load = {8, 4, counts};
  const moe_balance_cost cost = unit_cost(4000, 1000, 0);
  uint8_t rep[32], want[32] = {0};
  double ms = -1;
  TU_CHECK(moe_balance_plan_eplb(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, 1, rep, &ms) ==
               MOE_STATUS_OK,
           "%s", moe_ctx_error(g_ctx));
  want[0 * 4 + 2] = want[0 * 4 + 1] = 1;
  want[1 * 4 + 3] = 1;
  TU_CHECK(bitmap_is(rep, want, 32) && near(ms, 73), "eplb: ms %g, want 73", ms);
  if (!bitmap_is(rep, want, 32)) print_bitmap("got", rep, 8, 4);
  int64_t rows[4];
  moe_balance_rows(g_ctx, &load, rep, rows);
  TU_CHECK(rows[0] == 15 && rows[1] == 12 && rows[2] == 12 && rows[3] == 9, "eplb rows");
  // copies that cost more than they save (1 MB of parameters: 500 s per copy) are dropped
  const moe_balance_cost dear = unit_cost(4000, 1000, 1e6);
  TU_CHECK(moe_balance_plan_eplb(g_ctx, &load, &dear, MOE_BALANCE_MODEL_PROPHET, 1, rep, &ms) ==
                   MOE_STATUS_OK &&
               near(ms, 192),
           "eplb with dear copies: ms %g, want 192", ms);
  memset(want, 0, 32);
  TU_CHECK(bitmap_is(rep, want, 32), "eplb with dear copies: empty");

  // E = 4, P = 2, slots 1: homes e0 e1 -> 0, e2 e3 -> 1.
  //   src0: 10 4 1 1 | src1: 8 6 2 0: rows 28, 4.
  // step 1: e0 (18) before e1 (10): on rank 1 -> (20, 1). step 2: e1 (10) before e0 (9):
  // rank 1's slot is taken; e0 has rank 1 already: stop. e0 on 1.
  const int64_t small[8] = {10, 4, 1, 1, 8, 6, 2, 0};
  const moe_balance_load l2 = {4, 2, small};
  uint8_t rep2[8], want2[8] = {0};
  want2[0 * 2 + 1] = 1;
  TU_CHECK(moe_balance_plan_eplb(g_ctx, &l2, &cost, MOE_BALANCE_MODEL_PROPHET, 1, rep2, &ms) ==
                   MOE_STATUS_OK &&
               bitmap_is(rep2, want2, 8),
           "eplb E=4 P=2");
  // Two ranks tied at the max (E = P = 4, slots 1):
  //   src0: 4 4 0 0 | src1: 4 4 0 0 | src2: 2 2 1 0 | src3: 2 2 0 1: rows 12, 12, 1, 1.
  // step 1: pair (12, 2); e0 and e1 tie on 12 per copy: e0. On 1 -> (16, 1), on 2 ->
  //   (12, 1), on 3 -> (12, 1): rank 2 (lowest). rows 10, 12, 3, 1 (no lower max yet:
  //   a max-only rule would stop here with nothing).
  // step 2: pair (12, 1): e1 on 0 -> (14, 1), rank 2 full, on 3 -> (10, 2): rank 3.
  //   rows 10, 10, 3, 3.
  // step 3: e0 and e1 (6 per copy) have no free rank that lowers (10, 2): stop.
  // eq 6 (param 0): no copies R = 8, 8, 0, 0, H max 12: 32 + 36 = 68; step 1: R0 6,
  //   R1 8: 68 again (not kept alone); step 2: R 6, 6, max H 10: 24 + 30 = 54: both kept.
  const int64_t tied[16] = {4, 4, 0, 0, 4, 4, 0, 0, 2, 2, 1, 0, 2, 2, 0, 1};
  const moe_balance_load l3 = {4, 4, tied};
  uint8_t rep3[16], want3[16] = {0};
  want3[0 * 4 + 2] = 1;
  want3[1 * 4 + 3] = 1;
  TU_CHECK(moe_balance_plan_eplb(g_ctx, &l3, &cost, MOE_BALANCE_MODEL_PROPHET, 1, rep3, &ms) ==
                   MOE_STATUS_OK &&
               bitmap_is(rep3, want3, 16) && near(ms, 54),
           "eplb with a tie at the max: ms %g, want 54", ms);
  if (!bitmap_is(rep3, want3, 16)) print_bitmap("got", rep3, 4, 4);
}

// ---- uniform load: nothing to do ------------------------------------------------------------

static void test_uniform(void) {
  int64_t counts[32];
  for (int i = 0; i < 32; i++) counts[i] = 3;
  const moe_balance_load load = {8, 4, counts};
  moe_balance_cost cost;
  moe_balance_cost_default(&cost, 512, 1024);
  uint8_t rep[32], zero[32] = {0};
  double ms;
  TU_CHECK(moe_balance_plan_shadow(g_ctx, &load, &cost, rep, &ms) == MOE_STATUS_OK &&
               bitmap_is(rep, zero, 32),
           "uniform: shadow empty");
  TU_CHECK(moe_balance_plan_prophet(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET_SCHED, -1,
                                    MOE_BALANCE_PROPHET_ALPHA_DEFAULT, rep, &ms) == MOE_STATUS_OK &&
               bitmap_is(rep, zero, 32),
           "uniform: prophet empty");
  TU_CHECK(moe_balance_plan_eplb(g_ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET_SCHED, 2, rep,
                                 &ms) == MOE_STATUS_OK &&
               bitmap_is(rep, zero, 32),
           "uniform: eplb empty");
}

// ---- determinism and properties over random loads ------------------------------------------

static uint64_t g_lcg = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_lcg >> 33);
}

static void check_plan(const char *name, int iter, const moe_balance_load *load,
                       const moe_balance_cost *cost, moe_balance_model model, const uint8_t *rep,
                       double ms, int check_ratio) {
  const int E = load->num_experts, P = load->num_ranks;
  int bad = 0;
  for (int e = 0; e < E; e++)
    for (int p = 0; p < P; p++)
      if (rep[e * P + p] && (p == moe_balance_home(E, P, e) || load->counts[p * E + e] == 0)) bad++;
  TU_CHECK(!bad, "%s #%d: %d copies on home or where no rows come from", name, iter, bad);
  double empty_ms, got_ms;
  moe_balance_predict(g_ctx, load, NULL, cost, model, &empty_ms);
  moe_balance_predict(g_ctx, load, rep, cost, model, &got_ms);
  TU_CHECK(got_ms == ms, "%s #%d: reported %.17g, predicted %.17g", name, iter, ms, got_ms);
  TU_CHECK(ms <= empty_ms, "%s #%d: %.17g ms above the empty plan's %.17g", name, iter, ms,
           empty_ms);
  if (check_ratio) {
    int64_t before[64], after[64];
    moe_balance_rows(g_ctx, load, NULL, before);
    moe_balance_rows(g_ctx, load, rep, after);
    TU_CHECK(moe_balance_ratio(after, P) <= moe_balance_ratio(before, P),
             "%s #%d: ratio %g after, %g before", name, iter, moe_balance_ratio(after, P),
             moe_balance_ratio(before, P));
  }
}

static void test_random(void) {
  static const int shapes[][2] = {{4, 4}, {8, 4}, {16, 8}, {6, 2}, {8, 8}, {3, 1}};
  int64_t counts[16 * 8];
  uint8_t a[16 * 8], b[16 * 8];
  int nonempty[3] = {0, 0, 0};  // plans with a copy: shadow, prophet, eplb
  int fallbacks = 0;            // prophet plans whose cut to the slots no longer beat none
  for (int iter = 0; iter < 300; iter++) {
    const int E = shapes[iter % 6][0], P = shapes[iter % 6][1];
    // skewed: a few hot experts, some zeros
    const int hot = (int)(rnd() % (uint32_t)E);
    for (int i = 0; i < E * P; i++) {
      const int e = i % E;
      int64_t c = rnd() % 20;
      if (rnd() % 4 == 0) c = 0;
      if (e == hot || (iter % 3 == 0 && e == (hot + 1) % E)) c += rnd() % 200;
      counts[i] = c;
    }
    const moe_balance_load load = {E, P, counts};
    moe_balance_cost cost;
    moe_balance_cost_default(&cost, 64 << (iter % 4), 128 << (iter % 3));
    cost.fnec_ms = (iter % 5) * 0.01;
    cost.ranks_per_node = (iter / 6) % 3;  // flat, one rank per node, pairs
    cost.compute_slots = (iter / 18) % 3;  // one per rank, 1, 2
    const int slots = (int)(rnd() % (uint32_t)(E - E / P + 1));
    double ma, mb;
    // shadow
    moe_balance_plan_shadow(g_ctx, &load, &cost, a, &ma);
    moe_balance_plan_shadow(g_ctx, &load, &cost, b, &mb);
    TU_CHECK(bitmap_is(a, b, E * P) && ma == mb, "shadow #%d not deterministic", iter);
    check_plan("shadow", iter, &load, &cost, MOE_BALANCE_MODEL_FASTERMOE, a, ma, 0);
    nonempty[0] += memchr(a, 1, (size_t)(E * P)) != NULL;
    // prophet, every n and n = 1
    const moe_balance_model pm =
        iter % 2 ? MOE_BALANCE_MODEL_PROPHET : MOE_BALANCE_MODEL_PROPHET_SCHED;
    for (int n = -1; n <= (P >= 3 ? 1 : -1); n += 2) {
      moe_balance_plan_prophet(g_ctx, &load, &cost, pm, n, 0.1, a, &ma);
      moe_balance_plan_prophet(g_ctx, &load, &cost, pm, n, 0.1, b, &mb);
      TU_CHECK(bitmap_is(a, b, E * P) && ma == mb, "prophet #%d not deterministic", iter);
      check_plan("prophet", iter, &load, &cost, pm, a, ma, 1);
      nonempty[1] += memchr(a, 1, (size_t)(E * P)) != NULL;
    }
    // prophet's last plan cut to the slots (moe_balance_fit_plan): the cut
    // plan where it still beats none, else no copies
    {
      memcpy(b, a, (size_t)(E * P));
      moe_balance_fit_slots(b, counts, E, P, slots);
      double cut_ms = 0.0, fit_ms = 0.0, none_ms = 0.0;
      moe_balance_predict(g_ctx, &load, b, &cost, pm, &cut_ms);
      TU_CHECK(moe_balance_fit_plan(g_ctx, &load, a, slots, &cost, pm, &fit_ms, &none_ms) ==
                   MOE_STATUS_OK,
               "fit_plan #%d: %s", iter, moe_ctx_error(g_ctx));
      if (cut_ms < none_ms) {
        TU_CHECK(bitmap_is(a, b, E * P) && fit_ms == cut_ms,
                 "fit_plan #%d: the cut plan (%.17g ms < none's %.17g) was not kept", iter, cut_ms,
                 none_ms);
      } else {
        TU_CHECK(!memchr(a, 1, (size_t)(E * P)) && fit_ms == none_ms,
                 "fit_plan #%d: the cut plan (%.17g ms >= none's %.17g) was kept", iter, cut_ms,
                 none_ms);
        fallbacks += memchr(b, 1, (size_t)(E * P)) != NULL;
      }
    }
    // eplb
    const moe_balance_model em = (moe_balance_model)(iter % 3);
    moe_balance_plan_eplb(g_ctx, &load, &cost, em, slots, a, &ma);
    moe_balance_plan_eplb(g_ctx, &load, &cost, em, slots, b, &mb);
    TU_CHECK(bitmap_is(a, b, E * P) && ma == mb, "eplb #%d not deterministic", iter);
    check_plan("eplb", iter, &load, &cost, em, a, ma, 1);
    nonempty[2] += memchr(a, 1, (size_t)(E * P)) != NULL;
    int per_rank[8] = {0};
    for (int i = 0; i < E * P; i++) per_rank[i % P] += a[i];
    for (int p = 0; p < P; p++)
      TU_CHECK(per_rank[p] <= slots, "eplb #%d: rank %d holds %d copies > %d slots", iter, p,
               per_rank[p], slots);
  }
  // the loads are skewed enough that every planner places copies in many cases
  printf("random loads: plans with copies: shadow %d/300, prophet %d/500, eplb %d/300\n",
         nonempty[0], nonempty[1], nonempty[2]);
  TU_CHECK(nonempty[0] > 30 && nonempty[1] > 30 && nonempty[2] > 30, "too few plans with copies");
  printf("random loads: prophet plans cut to the slots that fell back to no copies: %d/300\n",
         fallbacks);
  TU_CHECK(fallbacks > 0, "no cut plan fell back to no copies: the check was not exercised");
}

// ---- window, catalogue, costs -----------------------------------------------------------------

static void test_window(void) {
  moe_balance_window w;
  TU_CHECK(moe_balance_window_init(g_ctx, &w, 2, 1, 2) == MOE_STATUS_OK, "window init");
  int64_t m[2];
  double f[2];
  moe_balance_window_mean(&w, m);
  TU_CHECK(m[0] == 0 && m[1] == 0, "empty window: zeros");
  const int64_t c1[2] = {1, 10}, c2[2] = {2, 20}, c3[2] = {6, 31};
  moe_balance_window_push(g_ctx, &w, c1);
  moe_balance_window_push(g_ctx, &w, c2);
  // (1 + 2) / 2 = 1.5 -> 2 (halves up), (10 + 20) / 2 = 15
  moe_balance_window_mean(&w, m);
  moe_balance_window_mean_f64(&w, f);
  TU_CHECK(m[0] == 2 && m[1] == 15 && f[0] == 1.5 && f[1] == 15.0, "mean of 2: %lld %lld",
           (long long)m[0], (long long)m[1]);
  // c1 leaves: (2 + 6) / 2 = 4, (20 + 31) / 2 = 25.5 -> 26
  moe_balance_window_push(g_ctx, &w, c3);
  moe_balance_window_mean(&w, m);
  moe_balance_window_mean_f64(&w, f);
  TU_CHECK(m[0] == 4 && m[1] == 26 && f[1] == 25.5, "ring: %lld %lld", (long long)m[0],
           (long long)m[1]);
  const int64_t neg[2] = {1, -1};
  TU_CHECK(moe_balance_window_push(g_ctx, &w, neg) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "counts[0][1] (-1)"),
           "negative push: %s", moe_ctx_error(g_ctx));
  moe_balance_window_mean(&w, m);
  TU_CHECK(m[0] == 4 && m[1] == 26, "a refused push changes nothing");
  moe_balance_window_free(&w);
  moe_balance_window_free(&w);
  moe_balance_window_free(NULL);
  TU_CHECK(moe_balance_window_init(g_ctx, &w, 2, 1, 0) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "window (0)"),
           "window 0: %s", moe_ctx_error(g_ctx));
}

static void test_catalogue(void) {
  TU_CHECK(moe_balance_policy_find("none") == MOE_BALANCE_NONE, "none");
  TU_CHECK(moe_balance_policy_find("shadow") == MOE_BALANCE_SHADOW, "shadow");
  TU_CHECK(moe_balance_policy_find("prophet") == MOE_BALANCE_PROPHET, "prophet");
  TU_CHECK(moe_balance_policy_find("eplb") == MOE_BALANCE_EPLB, "eplb");
  TU_CHECK(moe_balance_policy_find("auto") == MOE_BALANCE_AUTO, "auto");
  TU_CHECK(moe_balance_policy_find("magic") == -1 && moe_balance_policy_find(NULL) == -1,
           "unknown names");
  TU_CHECK(strcmp(moe_balance_policy_names(), "none, shadow, prophet, eplb, auto") == 0,
           "names '%s'", moe_balance_policy_names());
  TU_CHECK(strcmp(moe_balance_policy_name(MOE_BALANCE_EPLB), "eplb") == 0 &&
               moe_balance_policy_name(MOE_BALANCE_POLICY_COUNT_) == NULL,
           "policy_name");
  // FasterMoE's defaults; (2 x 1024 x 4096 + 4096 + 1024) x 4 = 33574912 bytes
  moe_balance_cost c;
  moe_balance_cost_default(&c, 1024, 4096);
  TU_CHECK(c.flops_per_s == 11.5e12 && c.net_bytes_per_s == 6.25e9 && c.act_bytes == 4 &&
               c.expert_param_bytes == 33574912.0 && c.fnec_ms == 0 && c.bnec_ms == 0,
           "cost defaults");
  moe_profile prof;
  memset(&prof, 0, sizeof prof);
  snprintf(prof.name, sizeof prof.name, "t");
  prof.gemm.beta = 1e-12;  // 1 TFLOP/s
  prof.n_a2a = 1;
  snprintf(prof.a2a[0].name, sizeof prof.a2a[0].name, "mpi");
  prof.a2a[0].fit.beta = 1e-9;  // 1 GB/s
  TU_CHECK(moe_balance_cost_from_profile(g_ctx, &prof, NULL, 8, 16, &c) == MOE_STATUS_OK &&
               near(c.flops_per_s, 1e12) && near(c.net_bytes_per_s, 1e9) && c.model_dim == 8,
           "cost from profile");
  TU_CHECK(
      moe_balance_cost_from_profile(g_ctx, &prof, "pipe", 8, 16, &c) == MOE_STATUS_INVALID_ARG &&
          strstr(moe_ctx_error(g_ctx), "'pipe'"),
      "profile without the fit: %s", moe_ctx_error(g_ctx));
}

// ---- bad input --------------------------------------------------------------------------------

#define EXPECT_BAD(call, text)                                                                \
  do {                                                                                        \
    moe_ctx_clear_error(g_ctx);                                                               \
    const moe_status st_ = (call);                                                            \
    TU_CHECK(st_ == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(g_ctx), text),             \
             "%s: status %d, message '%s', want '%s'", #call, (int)st_, moe_ctx_error(g_ctx), \
             text);                                                                           \
  } while (0)

static void test_bad_input(void) {
  int64_t counts[16] = {0};
  int64_t rows[4];
  uint8_t rep[16] = {0};
  double ms;
  moe_balance_cost cost;
  moe_balance_cost_default(&cost, 8, 8);
  const moe_balance_load not_div = {6, 4, counts};
  EXPECT_BAD(moe_balance_rows(g_ctx, &not_div, NULL, rows),
             "experts (6) must be divisible by EP ranks (4)");
  const moe_balance_load no_ranks = {4, 0, counts};
  EXPECT_BAD(moe_balance_rows(g_ctx, &no_ranks, NULL, rows), "ranks (0) must be >= 1");
  const moe_balance_load null_counts = {4, 4, NULL};
  EXPECT_BAD(moe_balance_plan_shadow(g_ctx, &null_counts, &cost, rep, &ms),
             "counts must not be NULL");
  counts[1 * 4 + 2] = -5;
  const moe_balance_load neg = {4, 4, counts};
  EXPECT_BAD(moe_balance_predict(g_ctx, &neg, NULL, &cost, MOE_BALANCE_MODEL_PROPHET, &ms),
             "counts[1][2] (-5) must be in [0, 1099511627776]");
  counts[1 * 4 + 2] = MOE_BALANCE_COUNT_MAX + 1;  // sums would overflow int64
  EXPECT_BAD(moe_balance_predict(g_ctx, &neg, NULL, &cost, MOE_BALANCE_MODEL_PROPHET, &ms),
             "counts[1][2] (1099511627777) must be in [0, 1099511627776]");
  counts[1 * 4 + 2] = 0;
  const moe_balance_load ok = {4, 4, counts};
  EXPECT_BAD(moe_balance_plan_eplb(g_ctx, &ok, &cost, MOE_BALANCE_MODEL_PROPHET, 4, rep, &ms),
             "slots (4) must be in [0, 3]");
  EXPECT_BAD(moe_balance_plan_eplb(g_ctx, &ok, &cost, MOE_BALANCE_MODEL_PROPHET, -1, rep, &ms),
             "slots (-1) must be in [0, 3]");
  EXPECT_BAD(
      moe_balance_plan_prophet(g_ctx, &ok, &cost, MOE_BALANCE_MODEL_PROPHET, 3, 0.1, rep, &ms),
      "n (3) must be -1 (try every n) or in [0, 2]");
  EXPECT_BAD(
      moe_balance_plan_prophet(g_ctx, &ok, &cost, MOE_BALANCE_MODEL_PROPHET, 0, 0.0, rep, &ms),
      "alpha (0) must be finite and > 0");
  EXPECT_BAD(
      moe_balance_plan_prophet(g_ctx, &ok, &cost, MOE_BALANCE_MODEL_FASTERMOE, 0, 0.1, rep, &ms),
      "prophet's model (0)");
  EXPECT_BAD(moe_balance_predict(g_ctx, &ok, NULL, &cost, MOE_BALANCE_MODEL_COUNT_, &ms),
             "model (3) must be in [0, 3)");
  moe_balance_cost bad_slots = cost;
  bad_slots.compute_slots = -0.5;
  EXPECT_BAD(moe_balance_predict(g_ctx, &ok, NULL, &bad_slots, MOE_BALANCE_MODEL_PROPHET, &ms),
             "compute_slots (-0.5) must be finite and >= 0");
  moe_balance_cost bad_nodes = cost;
  bad_nodes.ranks_per_node = -1;
  EXPECT_BAD(moe_balance_predict(g_ctx, &ok, NULL, &bad_nodes, MOE_BALANCE_MODEL_PROPHET, &ms),
             "ranks_per_node (-1) must be >= 0");
  rep[2 * 4 + 2] = 1;  // expert 2's home is rank 2
  EXPECT_BAD(moe_balance_rows(g_ctx, &ok, rep, rows), "replica[2][2] is set on expert 2's home");
  rep[2 * 4 + 2] = 0;
  EXPECT_BAD(moe_balance_plan_shadow(g_ctx, &ok, &cost, NULL, &ms), "replica must not be NULL");
  moe_balance_cost bad = cost;
  bad.net_bytes_per_s = 0;
  EXPECT_BAD(moe_balance_plan_shadow(g_ctx, &ok, &bad, rep, &ms), "net_bytes_per_s (0)");
  bad = cost;
  bad.model_dim = 0;
  EXPECT_BAD(moe_balance_plan_shadow(g_ctx, &ok, &bad, rep, &ms), "model_dim M (0)");
}

// The step-by-step driver: none never copies; a plan is kept between
// re-plans; plans are fitted to the slots keeping the copies that take the
// most rows; the window's mean is planned on; bad configs are refused.
static void test_balancer(void) {
  const int64_t one[16] = {10, 1, 1, 1, 10, 1, 1, 1, 10, 1, 1, 1, 10, 1, 1, 1};
  const int64_t uni[16] = {5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5};
  uint8_t rep[16], want[16];
  moe_balance_config c;
  moe_balancer *b = NULL;
  moe_balance_step_info info;
  // none
  moe_balance_config_default(&c, MOE_BALANCE_NONE, 8, 8, 3);
  TU_CHECK(moe_balancer_create(g_ctx, &c, 4, 4, &b) == MOE_STATUS_OK, "create none");
  memset(rep, 1, 16);
  TU_CHECK(moe_balancer_step(b, one, rep, &info) == MOE_STATUS_OK, "step none");
  memset(want, 0, 16);
  TU_CHECK(bitmap_is(rep, want, 16) && !info.planned && info.copies == 0, "none: no copies");
  TU_CHECK(near(info.ratio_before, 40.0 / 13.0) && near(info.ratio_after, 40.0 / 13.0),
           "none: ratio %g (rows 40, 4, 4, 4 over their mean 13)", info.ratio_before);
  moe_balancer_destroy(b);
  // shadow with the costs of test_shadow's case 1: e0 copied to ranks 1, 2, 3;
  // re-planned every 2 steps: step 1 keeps step 0's plan although uniform
  moe_balance_config_default(&c, MOE_BALANCE_SHADOW, 8, 8, 3);
  c.cost = unit_cost(12000, 4000, 20);
  c.replan_every = 2;
  TU_CHECK(moe_balancer_create(g_ctx, &c, 4, 4, &b) == MOE_STATUS_OK, "create shadow");
  TU_CHECK(moe_balancer_step(b, one, rep, &info) == MOE_STATUS_OK && info.planned, "step 0");
  want[1] = want[2] = want[3] = 1;
  TU_CHECK(bitmap_is(rep, want, 16) && info.copies == 3 && near(info.predicted_ms, 38),
           "shadow step 0: copies %d, ms %g", info.copies, info.predicted_ms);
  // rows under it: 10, 14, 14, 14 (rank p's own 10 rows of e0 plus its home
  // expert's 4): 14 over the mean 13
  TU_CHECK(near(info.ratio_after, 14.0 / 13.0), "shadow: ratio after %g", info.ratio_after);
  TU_CHECK(moe_balancer_step(b, uni, rep, &info) == MOE_STATUS_OK && !info.planned &&
               bitmap_is(rep, want, 16),
           "step 1 keeps the plan");
  TU_CHECK(
      moe_balancer_step(b, uni, rep, &info) == MOE_STATUS_OK && info.planned && info.copies == 0,
      "step 2 re-plans on the uniform load: no copies (%d)", info.copies);
  moe_balancer_destroy(b);
  // slots: a plan of 3 copies of e0 and slots 0 -> nothing; and a rank with two
  // copies and one slot keeps the copy taking more rows
  moe_balance_config_default(&c, MOE_BALANCE_SHADOW, 8, 8, 0);
  c.cost = unit_cost(12000, 4000, 20);
  TU_CHECK(moe_balancer_create(g_ctx, &c, 4, 4, &b) == MOE_STATUS_OK, "create slots 0");
  TU_CHECK(moe_balancer_step(b, one, rep, &info) == MOE_STATUS_OK && info.copies == 0,
           "slots 0: no copies (%d)", info.copies);
  {  // rates replaced later (measured): a bad one is refused, a good one kept
    moe_balance_cost bad = c.cost;
    bad.flops_per_s = 0;
    TU_CHECK(moe_balancer_set_cost(b, &bad) == MOE_STATUS_INVALID_ARG &&
                 moe_balancer_set_cost(b, &c.cost) == MOE_STATUS_OK,
             "set_cost: %s", moe_ctx_error(g_ctx));
  }
  moe_balancer_destroy(b);
  // eplb planned on the window's mean: two steps one and uni average to
  // (one + uni) / 2 rounded half up
  moe_balance_config_default(&c, MOE_BALANCE_EPLB, 8, 8, 1);
  c.cost = unit_cost(12000, 4000, 20);
  c.window = 2;
  c.replan_every = 2;
  TU_CHECK(moe_balancer_create(g_ctx, &c, 4, 4, &b) == MOE_STATUS_OK, "create eplb");
  uint8_t r1[16], r2[16];
  TU_CHECK(moe_balancer_step(b, uni, r1, &info) == MOE_STATUS_OK && info.planned, "eplb step 0");
  TU_CHECK(moe_balancer_step(b, one, r1, &info) == MOE_STATUS_OK && !info.planned, "eplb step 1");
  TU_CHECK(moe_balancer_step(b, uni, r1, &info) == MOE_STATUS_OK && info.planned, "eplb step 2");
  {
    // the plan of step 2 = eplb on the mean of steps 1 and 2
    int64_t mean[16];
    for (int i = 0; i < 16; i++) mean[i] = (one[i] + uni[i] + 1) / 2;
    const moe_balance_load lm = {4, 4, mean};
    TU_CHECK(moe_balance_plan_eplb(g_ctx, &lm, &c.cost, c.model, 1, r2, NULL) == MOE_STATUS_OK,
             "eplb direct");
    TU_CHECK(bitmap_is(r1, r2, 16), "eplb plans on the window's mean");
  }
  moe_balancer_destroy(b);
  // bad configs
  moe_balance_config_default(&c, 99, 8, 8, 1);
  TU_CHECK(moe_balancer_create(g_ctx, &c, 4, 4, &b) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "balance policy 99 is unknown (valid: none, shadow"),
           "unknown policy: %s", moe_ctx_error(g_ctx));
  moe_balance_config_default(&c, MOE_BALANCE_EPLB, 8, 8, 4);
  TU_CHECK(moe_balancer_create(g_ctx, &c, 4, 4, &b) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "balance slots (4) must be in [0, 3]"),
           "slots: %s", moe_ctx_error(g_ctx));
  moe_balance_config_default(&c, MOE_BALANCE_EPLB, 8, 8, 1);
  c.replan_every = 0;
  TU_CHECK(moe_balancer_create(g_ctx, &c, 4, 4, &b) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "replan_every (0)"),
           "replan_every: %s", moe_ctx_error(g_ctx));
  TU_CHECK(moe_balancer_create(g_ctx, &c, 6, 4, &b) == MOE_STATUS_INVALID_ARG,
           "E not divisible by P");
}

// The balancer's state for checkpoints: a balancer restored from another's
// state after some steps plans like it for every later step (window,
// re-planning phase and rates carried); a state of another shape, policy,
// window or slot count, or a damaged one, is refused and changes nothing.
static void test_balancer_state(void) {
  enum { E = 8, P = 4, N = E * P };
  moe_balance_config c;
  moe_balancer *a = NULL, *b = NULL, *o = NULL;
  moe_balance_config_default(&c, MOE_BALANCE_EPLB, 8, 8, 2);
  c.cost = unit_cost(12000, 4000, 20);
  c.window = 3;
  c.replan_every = 2;
  int64_t counts[N];
  uint8_t ra[N], rb[N];
  moe_balance_step_info ia, ib;
  TU_CHECK(moe_balancer_create(g_ctx, &c, E, P, &a) == MOE_STATUS_OK, "create a");
  // the restored balancer planned with other rates until the load replaces them
  moe_balance_config cb = c;
  cb.cost.flops_per_s = 1e3;
  TU_CHECK(moe_balancer_create(g_ctx, &cb, E, P, &b) == MOE_STATUS_OK, "create b");
  TU_CHECK(moe_balancer_placement(a) && moe_balancer_placement(NULL) == NULL, "placement");
  g_lcg = 12345;
  for (int step = 0; step < 5; step++) {  // 5 steps: the window wrapped, odd phase
    for (int i = 0; i < N; i++) counts[i] = (int64_t)(rnd() % 50) * (i % E == 1 ? 6 : 1);
    TU_CHECK(moe_balancer_step(a, counts, ra, &ia) == MOE_STATUS_OK, "a step %d", step);
  }
  const size_t bytes = moe_balancer_state_bytes(a);
  TU_CHECK(bytes == moe_balancer_state_bytes(b) && bytes > (size_t)3 * N * 8, "state bytes %zu",
           bytes);
  uint8_t *st = malloc(bytes), *bad = malloc(bytes);
  TU_CHECK(st && bad, "malloc");
  if (!st || !bad) return;
  moe_balancer_state_save(a, st);
  TU_CHECK(moe_balancer_state_load(b, st, bytes) == MOE_STATUS_OK, "load: %s",
           moe_ctx_error(g_ctx));
  TU_CHECK(memcmp(moe_balancer_placement(a), moe_balancer_placement(b), N) == 0,
           "the placement in force is restored");
  int differ = 0, plans = 0, copies = 0;
  for (int step = 5; step < 12; step++) {
    for (int i = 0; i < N; i++) counts[i] = (int64_t)(rnd() % 50) * (i % E == step % E ? 5 : 1);
    TU_CHECK(moe_balancer_step(a, counts, ra, &ia) == MOE_STATUS_OK &&
                 moe_balancer_step(b, counts, rb, &ib) == MOE_STATUS_OK,
             "step %d", step);
    differ |=
        memcmp(ra, rb, N) != 0 || ia.planned != ib.planned ||
        !(ia.predicted_ms == ib.predicted_ms || (isnan(ia.predicted_ms) && isnan(ib.predicted_ms)));
    plans += ia.planned;
    copies += ia.copies;
  }
  TU_CHECK(!differ && plans == 3 && copies > 0,  // steps 6, 8, 10
           "restored balancer plans like the original (plans %d, copies %d)", plans, copies);
  // the same state saved twice is the same bytes
  moe_balancer_state_save(a, st);
  moe_balancer_state_save(b, bad);
  TU_CHECK(memcmp(st, bad, bytes) == 0, "saved states of equal balancers are equal bytes");
  // refused: another policy, window, slots, shape; b keeps its state
  moe_balancer_state_save(b, st);
  struct {
    int policy, window, slots, P;
    const char *words;
  } other[4] = {
      {MOE_BALANCE_PROPHET, 3, 2, P, "of policy eplb, this run balances with prophet"},
      {MOE_BALANCE_EPLB, 4, 2, P, "a window of 3 steps and 2 slots, this run has 4 and 2"},
      {MOE_BALANCE_EPLB, 3, 1, P, "a window of 3 steps and 2 slots, this run has 3 and 1"},
      {MOE_BALANCE_EPLB, 3, 2, 2, "of 8 experts on 4 ranks, this run has 8 on 2"}};
  for (int k = 0; k < 4; k++) {
    moe_balance_config co = c;
    co.policy = other[k].policy;
    co.window = other[k].window;
    co.slots = other[k].slots;
    TU_CHECK(moe_balancer_create(g_ctx, &co, E, other[k].P, &o) == MOE_STATUS_OK, "create other");
    TU_CHECK(moe_balancer_state_load(o, st, bytes) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), other[k].words),
             "other config %d refused: %s", k, moe_ctx_error(g_ctx));
    moe_balancer_destroy(o);
    o = NULL;
  }
  // damaged: magic, length, a negative count (the one the fuzzer found
  // too large would overflow the window's sums), a copy on its home, a rank
  // over its slots, count and next that disagree
  const size_t ring = 8 + 4 * 8 + 8 + 8 * 5;  // the header's bytes
  struct {
    size_t at;
    uint8_t value;
    size_t len;
    const char *words;
  } dmg[7] = {{0, 'X', bytes, "without the state's header"},
              {ring + 5, 0x02, bytes, "count 2199023255552 in the window (entry 0) is not in"},
              {0, 'M', bytes - 1, "bytes, a state of this shape has"},
              {ring + 7, 0x80, bytes, "in the window (entry 0) is not in [0, 1099511627776]"},
              {bytes - N + 0 * P + 0, 1, bytes, "home"},
              {bytes - N, 0, bytes, "more copies than its 2 slots"},
              {8 + 4 * 6, 1, bytes, "out of range"}};
  for (int k = 0; k < 7; k++) {
    memcpy(bad, st, bytes);
    if (k == 5) {  // rank 1 holds 3 copies: experts 0, 1 (home 0) and 4 (home 2)
      memset(bad + bytes - N, 0, N);
      bad[bytes - N + 0 * P + 1] = bad[bytes - N + 1 * P + 1] = bad[bytes - N + 4 * P + 1] = 1;
    } else if (k == 6) {  // 2 of 3 held, but the next slot is 0 (it must be 2)
      bad[8 + 4 * 5] = 2;
      bad[8 + 4 * 6] = 0;
    } else {
      bad[dmg[k].at] = dmg[k].value;
    }
    TU_CHECK(moe_balancer_state_load(b, bad, dmg[k].len) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), dmg[k].words),
             "damaged state %d refused: %s", k, moe_ctx_error(g_ctx));
  }
  moe_balancer_state_save(b, bad);
  TU_CHECK(memcmp(st, bad, bytes) == 0, "a refused state leaves the balancer as it was");
  // the step counter (finding 8): a state of step 2^31 - 1 steps on without
  // overflowing and saves back the next step; one past 2^53 is refused
  {
    const size_t at = 8 + 4 * 8;  // the step, after the magic and the ints
    memcpy(bad, st, bytes);
    const uint64_t big = 2147483647u;
    for (int i = 0; i < 8; i++) bad[at + i] = (uint8_t)(big >> (8 * i));
    TU_CHECK(moe_balancer_state_load(b, bad, bytes) == MOE_STATUS_OK, "load step 2^31-1: %s",
             moe_ctx_error(g_ctx));
    uint8_t rep[N];
    int64_t flat[N];
    for (int i = 0; i < N; i++) flat[i] = 5;
    TU_CHECK(moe_balancer_step(b, flat, rep, NULL) == MOE_STATUS_OK, "step past 2^31-1: %s",
             moe_ctx_error(g_ctx));
    moe_balancer_state_save(b, bad);
    uint64_t got = 0;
    for (int i = 0; i < 8; i++) got |= (uint64_t)bad[at + i] << (8 * i);
    TU_CHECK(got == big + 1, "the saved step is 2^31 (got %llu)", (unsigned long long)got);
    TU_CHECK(moe_balancer_state_load(b, bad, bytes) == MOE_STATUS_OK, "reload step 2^31: %s",
             moe_ctx_error(g_ctx));
    const uint64_t over = ((uint64_t)1 << 53) + 1;
    for (int i = 0; i < 8; i++) bad[at + i] = (uint8_t)(over >> (8 * i));
    TU_CHECK(moe_balancer_state_load(b, bad, bytes) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "out of range"),
             "step 2^53+1 refused: %s", moe_ctx_error(g_ctx));
  }
  free(st);
  free(bad);
  moe_balancer_destroy(a);
  moe_balancer_destroy(b);
}

// Predictions on a described cluster: uniform shares give no copies; a hot
// expert gives copies and a faster plan; the "none" figures are the models'
// values for the load the shares give.
static void test_simulate(void) {
  moe_cluster cl;
  TU_CHECK(moe_cluster_builtin(g_ctx, "proprophet-4x4-rtx3090", &cl) == MOE_STATUS_OK, "cluster");
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = 1024;
  cfg.model_dim = 256;
  cfg.hidden_dim = 512;
  cfg.num_experts = 16;
  cfg.top_k = 1;
  const int pol[4] = {MOE_BALANCE_NONE, MOE_BALANCE_SHADOW, MOE_BALANCE_PROPHET, MOE_BALANCE_EPLB};
  moe_balance_sim_result r[4];
  double shares[16];
  for (int e = 0; e < 16; e++) shares[e] = 1.0 / 16;
  TU_CHECK(moe_balance_simulate(g_ctx, &cl, &cfg, shares, pol, 4, 1, r) == MOE_STATUS_OK, "%s",
           moe_ctx_error(g_ctx));
  for (int i = 0; i < 4; i++)
    TU_CHECK(r[i].copies == 0 && r[i].ms_prophet == r[i].none_prophet && near(r[i].ratio_before, 1),
             "uniform: %s places %d copies", moe_balance_policy_name(pol[i]), r[i].copies);
  // expert 0 takes half of the choices: 512 rows from every device
  for (int e = 0; e < 16; e++) shares[e] = e == 0 ? 0.5 : 0.5 / 15;
  TU_CHECK(moe_balance_simulate(g_ctx, &cl, &cfg, shares, pol, 4, 1, r) == MOE_STATUS_OK, "%s",
           moe_ctx_error(g_ctx));
  TU_CHECK(r[1].copies > 0 && r[1].ms_fastermoe < r[1].none_fastermoe &&
               r[1].ratio_after < r[1].ratio_before,
           "hot: shadow %d copies, %g vs %g ms", r[1].copies, r[1].ms_fastermoe,
           r[1].none_fastermoe);
  int64_t counts[16 * 16];
  for (int p = 0; p < 16; p++)
    for (int e = 0; e < 16; e++)
      counts[p * 16 + e] = e == 0 ? 512 : (int64_t)llround(1024 * 0.5 / 15);
  const moe_balance_load load = {16, 16, counts};
  moe_balance_cost cost;
  moe_balance_cost_of_cluster(&cl, 256, 512, &cost);
  double ms = 0;
  moe_balance_predict(g_ctx, &load, NULL, &cost, MOE_BALANCE_MODEL_PROPHET, &ms);
  TU_CHECK(ms == r[0].none_prophet, "none under eq 6: %g, want %g", r[0].none_prophet, ms);
  // 4 nodes x 4 devices, one NIC per node: a device's share of it
  TU_CHECK(near(cost.net_bytes_per_s, cl.inter.gbit_per_s * 1e9 / 8 / 4),
           "cluster bandwidth per device %g", cost.net_bytes_per_s);
  cfg.num_experts = 12;  // not divisible by 16 devices
  TU_CHECK(moe_balance_simulate(g_ctx, &cl, &cfg, shares, pol, 4, 1, r) == MOE_STATUS_INVALID_ARG,
           "E not divisible by the devices");
}

// auto: the least predicted of no copies and the three plans (each fitted to
// the slots), checked against the planners called one by one; the uniform
// load gets no copies.
static void test_auto(void) {
  const moe_balance_cost cost = unit_cost(12000, 4000, 20);
  const int64_t one[16] = {10, 1, 1, 1, 10, 1, 1, 1, 10, 1, 1, 1, 10, 1, 1, 1};
  const int64_t uni[16] = {5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5};
  uint8_t rep[16], cand[16];
  double ms = 0, t = 0, best = 0;
  int chosen = -1;
  const moe_balance_load lu = {4, 4, uni};
  TU_CHECK(moe_balance_plan_auto(g_ctx, &lu, &cost, MOE_BALANCE_MODEL_PROPHET, 3, rep, &ms,
                                 &chosen) == MOE_STATUS_OK &&
               chosen == MOE_BALANCE_NONE,
           "uniform: auto chose %d", chosen);
  for (int i = 0; i < 16; i++) TU_CHECK(rep[i] == 0, "uniform: no copies");
  const moe_balance_load l1 = {4, 4, one};
  for (int model = 0; model < MOE_BALANCE_MODEL_COUNT_; model++) {
    TU_CHECK(moe_balance_plan_auto(g_ctx, &l1, &cost, model, 3, rep, &ms, &chosen) == MOE_STATUS_OK,
             "auto: %s", moe_ctx_error(g_ctx));
    // the minimum by hand over the four candidates
    moe_balance_predict(g_ctx, &l1, NULL, &cost, model, &best);
    int want = MOE_BALANCE_NONE;
    for (int p = MOE_BALANCE_SHADOW; p <= MOE_BALANCE_EPLB; p++) {
      if (p == MOE_BALANCE_SHADOW) moe_balance_plan_shadow(g_ctx, &l1, &cost, cand, NULL);
      const int pm = model == MOE_BALANCE_MODEL_FASTERMOE ? MOE_BALANCE_MODEL_PROPHET : model;
      if (p == MOE_BALANCE_PROPHET)
        moe_balance_plan_prophet(g_ctx, &l1, &cost, pm, -1, 0.1, cand, NULL);
      if (p == MOE_BALANCE_EPLB) moe_balance_plan_eplb(g_ctx, &l1, &cost, pm, 3, cand, NULL);
      moe_balance_predict(g_ctx, &l1, cand, &cost, model, &t);
      if (t < best) best = t, want = p;
    }
    TU_CHECK(chosen == want && ms == best, "model %d: auto chose %d (%g ms), want %d (%g ms)",
             model, chosen, ms, want, best);
    TU_CHECK(chosen != MOE_BALANCE_NONE, "model %d: a hot expert is worth a copy", model);
  }
  // the balancer reports what auto chose
  moe_balance_config c;
  moe_balance_config_default(&c, MOE_BALANCE_AUTO, 8, 8, 3);
  c.cost = cost;
  moe_balancer *b = NULL;
  moe_balance_step_info info;
  TU_CHECK(moe_balancer_create(g_ctx, &c, 4, 4, &b) == MOE_STATUS_OK, "create auto");
  TU_CHECK(moe_balancer_step(b, one, rep, &info) == MOE_STATUS_OK &&
               info.chosen != MOE_BALANCE_NONE && info.copies > 0,
           "balancer auto: chose %d, %d copies", info.chosen, info.copies);
  moe_balancer_destroy(b);
}

// Lina's allocation by hand. E = P = 4, slots 1: expert 0 (home 0) has 60 of
// 80 rows: d = round(4 x 0.75) = 3, two copies, to ranks 1 and 2 (30 rows
// each; the tie goes to the lower rank first), none to rank 3 (it sends
// none); expert 3 (20 rows): d = 1, no copy. E = 8, P = 4, slots 1: experts 0
// and 4 each need one copy; expert 0 (first: the lower index) takes rank 1's
// slot, and expert 4 (home 2) finds no free rank that sends it rows.
static void test_lina(void) {
  {
    const int64_t c[16] = {0, 0, 0, 0, 30, 0, 0, 0, 30, 0, 0, 0, 0, 0, 0, 20};
    const moe_balance_load l = {4, 4, c};
    uint8_t r[16];
    TU_CHECK(moe_balance_plan_lina(g_ctx, &l, 1, r) == MOE_STATUS_OK, "lina 4x4");
    const uint8_t want[16] = {0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    TU_CHECK(memcmp(r, want, 16) == 0, "lina 4x4 placement");
    TU_CHECK(moe_balance_plan_lina(g_ctx, &l, 0, r) == MOE_STATUS_OK &&
                 memcmp(r, (uint8_t[16]){0}, 16) == 0,
             "no slots: no copy");
  }
  {
    int64_t c[32] = {0};
    c[1 * 8 + 0] = c[1 * 8 + 4] = c[2 * 8 + 0] = c[2 * 8 + 4] = 40;
    const moe_balance_load l = {8, 4, c};
    uint8_t r[32];
    TU_CHECK(moe_balance_plan_lina(g_ctx, &l, 1, r) == MOE_STATUS_OK, "lina 8x4");
    int n = 0;
    for (int i = 0; i < 32; i++) n += r[i];
    TU_CHECK(n == 1 && r[0 * 4 + 1] == 1, "lina 8x4: one copy, expert 0 on rank 1 (%d copies)", n);
    TU_CHECK(moe_balance_plan_lina(g_ctx, &l, 7, r) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "lina's slots (7) must be in [0, 6]"),
             "lina slots 7: %s", moe_ctx_error(g_ctx));
  }
  {  // a copy that would leave its rank busier than the home was is not placed:
     // rank 1 is home of expert 1 (50 rows, all from rank 0) and sends expert
     // 0 (home 0, 60 rows) 40: 50 + 40 > 60, so expert 0's second device goes
     // to rank 3 (20 rows); expert 1's copy on rank 0 (60 - 20 + 50 > 50) is
     // not placed either
    int64_t c[16] = {0};
    c[1 * 4 + 0] = 40;
    c[3 * 4 + 0] = 20;
    c[0 * 4 + 1] = 50;
    const moe_balance_load l = {4, 4, c};
    uint8_t r[16];
    TU_CHECK(moe_balance_plan_lina(g_ctx, &l, 1, r) == MOE_STATUS_OK, "lina, busy rank");
    const uint8_t want[16] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    TU_CHECK(memcmp(r, want, 16) == 0, "lina: the copy skips the rank it would overload");
  }
  {  // an odd rank count (its tables' alignment; UBSan): expert 0 (home 0) gets
     // all 3 devices: copies on ranks 1 (30 rows, 30 <= 40) and 2 (10 <= 10)
    int64_t c[9] = {0};
    c[1 * 3 + 0] = 30;
    c[2 * 3 + 0] = 10;
    const moe_balance_load l = {3, 3, c};
    uint8_t r[9];
    const uint8_t want[9] = {0, 1, 1, 0, 0, 0, 0, 0, 0};
    TU_CHECK(moe_balance_plan_lina(g_ctx, &l, 1, r) == MOE_STATUS_OK && memcmp(r, want, 9) == 0,
             "lina on 3 ranks");
  }
  {  // no load: no copy
    const int64_t c[4] = {0, 0, 0, 0};
    const moe_balance_load l = {2, 2, c};
    uint8_t r[4] = {1, 1, 1, 1};
    TU_CHECK(moe_balance_plan_lina(g_ctx, &l, 1, r) == MOE_STATUS_OK &&
                 memcmp(r, (uint8_t[4]){0}, 4) == 0,
             "lina, no load");
  }
}

// Lina's inference scheduling replayed (moe_lina_allocate, moe_lina_layer_ms,
// moe_lina_simulate, moe_routing_trace_load) on hand-worked cases.
static void test_lina_sim(void) {
  {  // eq. 1 and first-fit-decreasing: n = (2, 1, 0.6, 0.4) on 4 devices
    const double pop[4] = {20, 10, 6, 4};
    uint8_t on[16];
    TU_CHECK(moe_lina_allocate(g_ctx, pop, 4, 4, 4, on) == MOE_STATUS_OK, "lina allocate");
    // expert 0: devices 0 and 1; expert 1: device 2; experts 2 and 3 packed on device 3
    const uint8_t want[16] = {1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1};
    TU_CHECK(bitmap_is(on, want, 16), "lina allocate: popular own devices, the rest packed");
    // at most 1 expert a device: expert 3 fits nowhere with room, so it goes
    // to the least loaded device of all (3, at 0.6)
    TU_CHECK(moe_lina_allocate(g_ctx, pop, 4, 4, 1, on) == MOE_STATUS_OK && bitmap_is(on, want, 16),
             "lina allocate, pack 1: the least loaded device of all");
    // FFD of n = (0.5, 0.3 x 5) on 2 devices (none popular): device 0 takes
    // experts 0, 1 (0.8); 2 does not fit there, device 1 takes 2, 3, 4 (0.9);
    // 5 fits nowhere: the least loaded with room, device 0
    const double pk[6] = {0.5, 0.3, 0.3, 0.3, 0.3, 0.3};
    uint8_t o2[12];
    TU_CHECK(moe_lina_allocate(g_ctx, pk, 6, 2, 4, o2) == MOE_STATUS_OK, "lina FFD");
    const uint8_t w2[12] = {1, 0, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0};
    print_bitmap("lina FFD", o2, 6, 2);
    TU_CHECK(bitmap_is(o2, w2, 12), "lina FFD packing on 2 devices");
    // an expert nobody chose goes to the least loaded device
    const double hot[4] = {4, 0, 0, 0};
    TU_CHECK(moe_lina_allocate(g_ctx, hot, 4, 4, 4, on) == MOE_STATUS_OK, "lina hot");
    const uint8_t wh[16] = {1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0};
    TU_CHECK(bitmap_is(on, wh, 16), "lina: one hot expert on every device, the others spread");
    TU_CHECK(moe_lina_allocate(g_ctx, pop, 4, 2, 1, on) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "at most 1 experts a device cannot hold 4"),
             "lina allocate: no room: %s", moe_ctx_error(g_ctx));
    const double bad[4] = {1, -1, 0, 0};
    TU_CHECK(moe_lina_allocate(g_ctx, bad, 4, 4, 4, on) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "popularity of expert 1 (-1)"),
             "lina allocate: negative popularity: %s", moe_ctx_error(g_ctx));
  }
  {  // the layer's time: most rows 300 (>= 200 sent): 300 x 4 x 10 x 25 / 1e12 s of
     // GEMM, 2 x 300 x (1 - 1/2) x 10 x 2 / 1e9 s of all-to-all
    moe_balance_cost cost;
    moe_balance_cost_default(&cost, 10, 25);
    cost.flops_per_s = 1e12;
    cost.net_bytes_per_s = 1e9;
    cost.act_bytes = 2;
    const uint8_t on[4] = {1, 0, 0, 1};
    const double rows[2] = {300, 100};
    const double ms = moe_lina_layer_ms(on, rows, 2, 2, 200, &cost);
    TU_CHECK(near(ms, 1e3 * (300 * 4 * 10 * 25 / 1e12 + 2 * 150 * 10 * 2 / 1e9)),
             "lina layer ms %.9f", ms);
    const uint8_t both[4] = {1, 1, 1, 1};  // each expert split over both: 200 rows each
    TU_CHECK(near(moe_lina_layer_ms(both, rows, 2, 2, 200, &cost),
                  1e3 * (200 * 4 * 10 * 25 / 1e12 + 2 * 100 * 10 * 2 / 1e9)),
             "lina layer ms, split experts");
  }
  {  // a two-step trace: step 1's estimate is exact, step 2's misses (top-2
     // {0, 1} against {3, 2}): ideal is the same at both steps (a permutation),
     // two phases = ideal + check at 1, + check + re-plan at 2; phase 1 = ideal
     // at 1 and the wrong allocation's time at 2
    char path[96];
    snprintf(path, sizeof path, "/tmp/moe_test_lina_%d.jsonl", (int)getpid());
    FILE *f = fopen(path, "w");
    TU_CHECK(f != NULL, "trace file");
    if (!f) return;
    fputs(
        "{\"format\": \"libmoe-routing-trace\", \"version\": 1, \"ranks\": 1, \"experts\": 4, "
        "\"top_k\": 1, \"tokens_per_rank\": 100, \"moe_layers\": [1, 3]}\n",
        f);
    fputs(
        "{\"step\": 1, \"layer\": 1, \"counts\": [[50, 30, 15, 5]], \"estimate\": [50, 30, 15, "
        "5]}\n",
        f);
    fputs(
        "{\"step\": 2, \"layer\": 3, \"counts\": [[5, 15, 30, 50]], \"estimate\": [50, 30, 15, "
        "5]}\n",
        f);
    fputs("{\"step\": 3, \"layer\": 1, \"counts\": [[5, 15, 30, 50]]}\n", f);  // no estimate
    fclose(f);
    moe_routing_trace_data tr;
    TU_CHECK(moe_routing_trace_load(g_ctx, path, &tr) == MOE_STATUS_OK && tr.n == 3 &&
                 tr.with_estimate == 2 && tr.experts == 4 && tr.n_layers == 2 &&
                 tr.layers[1] == 3 && tr.rows[4 + 3] == 50 && isnan(tr.estimate[8]),
             "trace load: %s", moe_ctx_error(g_ctx));
    moe_cluster cl;
    TU_CHECK(moe_cluster_builtin(g_ctx, "lina-4x4-a100", &cl) == MOE_STATUS_OK, "cluster");
    moe_lina_sim_config c;
    moe_lina_sim_config_default(&c);
    c.check_ms = 1;
    c.replan_ms = 10;
    moe_lina_sim_result r;
    TU_CHECK(moe_lina_simulate(g_ctx, &cl, &c, &tr, &r) == MOE_STATUS_OK, "lina simulate: %s",
             moe_ctx_error(g_ctx));
    moe_balance_cost cost;
    moe_balance_cost_of_cluster(&cl, c.model_dim, c.hidden_dim, &cost);
    cost.act_bytes = c.act_bytes;
    const int D = 16;
    const double R = D * c.tokens * 1.0;
    double act[4], est[4];
    for (int e = 0; e < 4; e++) act[e] = R * tr.rows[4 + e] / 100, est[e] = tr.estimate[e];
    uint8_t on[64];
    moe_lina_allocate(g_ctx, act, 4, D, 4, on);
    const double ideal = moe_lina_layer_ms(on, act, 4, D, c.tokens, &cost);
    moe_lina_allocate(g_ctx, est, 4, D, 4, on);
    const double wrong = moe_lina_layer_ms(on, act, 4, D, c.tokens, &cost);
    TU_CHECK(r.samples == 2 && near(r.accuracy, 0.5) && near(r.finetune, 0.5),
             "lina simulate: %d samples, accuracy %g, fine-tune %g", r.samples, r.accuracy,
             r.finetune);
    TU_CHECK(wrong > ideal * 1.5, "the missed estimate's allocation is slower (%g vs %g ms)", wrong,
             ideal);
    TU_CHECK(near(r.p50[MOE_LINA_IDEAL], ideal) && near(r.p95[MOE_LINA_IDEAL], ideal) &&
                 near(r.p50[MOE_LINA_PHASE1], ideal) && near(r.p95[MOE_LINA_PHASE1], wrong) &&
                 near(r.p50[MOE_LINA_TWO_PHASE], ideal + 1) &&
                 near(r.p95[MOE_LINA_TWO_PHASE], ideal + 11),
             "lina simulate: ideal %g/%g, phase 1 %g/%g, two phases %g/%g (want %g, %g/%g, "
             "%g/%g)",
             r.p50[0], r.p95[0], r.p50[2], r.p95[2], r.p50[3], r.p95[3], ideal, ideal, wrong,
             ideal + 1, ideal + 11);
    // static: each expert on 4 of the 16 devices; the busiest (50%) sets it
    TU_CHECK(r.p50[MOE_LINA_UNIFORM] > ideal, "static slower than ideal");
    c.from_block = 1;  // only the layer-3 line
    TU_CHECK(moe_lina_simulate(g_ctx, &cl, &c, &tr, &r) == MOE_STATUS_OK && r.samples == 1 &&
                 near(r.finetune, 1.0),
             "lina simulate from block 1: %d samples", r.samples);
    c.from_block = 2;
    TU_CHECK(moe_lina_simulate(g_ctx, &cl, &c, &tr, &r) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "no line with an estimate"),
             "lina simulate past the blocks: %s", moe_ctx_error(g_ctx));
    tr.with_estimate = 0;
    TU_CHECK(moe_lina_simulate(g_ctx, &cl, &c, &tr, &r) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "holds no estimates"),
             "lina simulate without estimates: %s", moe_ctx_error(g_ctx));
    moe_routing_trace_data_free(&tr);
    // malformed estimates are named by line
    f = fopen(path, "w");
    if (f) {
      fputs(
          "{\"format\": \"libmoe-routing-trace\", \"version\": 1, \"ranks\": 1, \"experts\": "
          "2, \"top_k\": 1, \"tokens_per_rank\": 10, \"moe_layers\": [0]}\n"
          "{\"step\": 1, \"layer\": 0, \"counts\": [[5, 5]], \"estimate\": [1]}\n",
          f);
      fclose(f);
    }
    TU_CHECK(moe_routing_trace_load(g_ctx, path, &tr) == MOE_STATUS_BAD_FORMAT &&
                 strstr(moe_ctx_error(g_ctx), "line 2: \"estimate\" must be 2 numbers") &&
                 tr.n == 0 && !tr.rows,
             "trace load: short estimate: %s", moe_ctx_error(g_ctx));
    f = fopen(path, "w");
    if (f) {
      fputs(
          "{\"format\": \"libmoe-routing-trace\", \"version\": 1, \"ranks\": 1, \"experts\": "
          "2, \"top_k\": 1, \"tokens_per_rank\": 10, \"moe_layers\": [0]}\n"
          "{\"step\": 1, \"layer\": 0, \"counts\": [[5, 5]], \"estimate\": [1, -2]}\n",
          f);
      fclose(f);
    }
    TU_CHECK(moe_routing_trace_load(g_ctx, path, &tr) == MOE_STATUS_BAD_FORMAT &&
                 strstr(moe_ctx_error(g_ctx), "finite number >= 0"),
             "trace load: negative estimate: %s", moe_ctx_error(g_ctx));
    remove(path);
  }
}

int main(void) {
  if (moe_ctx_create(&g_ctx) != MOE_STATUS_OK) return 2;
  test_rows();
  test_shadow();
  test_prophet();
  test_eplb();
  test_uniform();
  test_random();
  test_window();
  test_catalogue();
  test_bad_input();
  test_balancer();
  test_balancer_state();
  test_simulate();
  test_auto();
  test_lina();
  test_lina_sim();
  moe_ctx_destroy(g_ctx);
  return tu_finish("test_balance");
}
