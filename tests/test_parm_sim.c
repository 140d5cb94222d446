// Parm's schedules simulated (src/perf/parm_sim.c, moe simulate --parm):
// two tiny layouts worked by hand from the model's formulas, the invariants
// Parm states (MP = 1: S1 = S2; eq. 6: S1, S2 <= baseline with intra-node
// groups), Algorithm 1 on terms built to make each answer obvious and on
// terms fitted to the model, and bad input.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/perf.h"
#include "testutil.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (1 + fabs(b)); }

// nodes x dpn devices, 1 TFLOP/s, 1 GB/s links (8 Gbit/s) both ways.
static moe_cluster tiny(int nodes, int dpn, double intra_lat_us, double inter_lat_us) {
  moe_cluster c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "tiny");
  snprintf(c.device, sizeof c.device, "d");
  c.nodes = nodes;
  c.devices_per_node = dpn;
  c.gemm_tflops = 1;
  c.intra.gbit_per_s = 8;
  c.intra.latency_us = intra_lat_us;
  c.inter.gbit_per_s = 8;
  c.inter.latency_us = inter_lat_us;
  c.nics_per_node = 1;
  c.inter_uses_intra = 0;
  return c;
}

// T 1024, M 256, H 512, E 2, K 1, f 1, fp32: C = 512 rows per expert,
// n = E C M = 262144 elements (1 MiB).
static moe_parm_sim_config small(int mp, int ep, int esp) {
  moe_parm_sim_config c;
  moe_parm_sim_config_default(&c);
  c.mp = mp;
  c.ep = ep;
  c.esp = esp;
  c.tokens = 1024;
  c.model_dim = 256;
  c.hidden_dim = 512;
  c.experts = 2;
  c.top_k = 1;
  c.capacity_factor = 1;
  c.elem_bytes = 4;
  return c;
}

// One node of 4, MP 2 x ESP 2 (EP 1), no latency: device d = esp * 2 + mp, MP
// groups {0,1} {2,3}, ESP groups {0,2} {1,3}, all-to-all groups {0,2} {1,3}.
static void test_hand_one_node(moe_ctx *ctx) {
  const moe_cluster cl = tiny(1, 4, 0, 0);
  const moe_parm_sim_config c = small(2, 1, 2);
  moe_parm_sim_result r;
  TU_CHECK(moe_parm_simulate(ctx, &cl, &c, &r) == MOE_STATUS_OK, "simulate: %s",
           moe_ctx_error(ctx));
  TU_CHECK(r.dp == 1 && r.experts == 2 && near(r.rows, 512) && near(r.v_elems, 262144),
           "dp %d E %d rows %g V %g", r.dp, r.experts, r.rows, r.v_elems);
  TU_CHECK(r.mp_intra == 1 && r.esp_intra == 1, "groups inside the node: %d %d", r.mp_intra,
           r.esp_intra);
  const double nb = 262144.0 * 4 / 1e9;             // n elements over a 1 GB/s link, s
  const double gate = 2.0 * 1024 * 256 * 2 / 1e12;  // 2 T M E FLOPs
  const double exp = 4.0 * 262144 * 512 / 1e12;     // 4 n H
  // baseline: ESP-AG sends n to the one peer; EP = 1: no all-to-all; a ring
  // step sends n; forward 2 ring steps (all-reduce), backward 1 (reduce-scatter)
  const moe_parm_sim_times *b = &r.sched[MOE_PARM_BASELINE];
  TU_CHECK(near(b->fwd_ms, (gate + nb + exp + 2 * nb) * 1e3), "baseline fwd %g ms, want %g",
           b->fwd_ms, (gate + nb + exp + 2 * nb) * 1e3);
  TU_CHECK(near(b->bwd_ms, (nb + 2 * exp + nb + 2 * gate) * 1e3), "baseline bwd %g ms", b->bwd_ms);
  TU_CHECK(near(b->esp_ms, 5 * nb * 1e3) && b->a2a_ms == 0 && b->mp_ms == 0,
           "baseline parts: esp %g a2a %g mp %g", b->esp_ms, b->a2a_ms, b->mp_ms);
  // s1 and s2: (E / EP) (C / MP) M = 2 x 256 x 256 elements to the one other
  // member = n / 2; s1's MP-AG sends T / MP x M = n / 2, s2's n / MP = n / 2
  const double a = nb / 2, g = nb / 2;
  const moe_parm_sim_times *s1 = &r.sched[MOE_PARM_S1], *s2 = &r.sched[MOE_PARM_S2];
  TU_CHECK(near(s1->total_ms, (3 * (gate / 2 + exp / 2) + 4 * a + 2 * g) * 1e3),
           "s1 total %g ms, want %g", s1->total_ms,
           (3 * (gate / 2 + exp / 2) + 4 * a + 2 * g) * 1e3);
  TU_CHECK(near(s1->fwd_ms, (gate / 2 + 2 * a + exp / 2 + g) * 1e3), "s1 fwd %g", s1->fwd_ms);
  // SAA: the all-to-all and the gather both load every device's link by n / 2:
  // together n: (a + (W - 1) (a + g) + g) / W with W = 2 is a + g, no gain
  TU_CHECK(near(s2->total_ms, (3 * (gate + exp / 2) + 4 * a + 2 * g) * 1e3) &&
               fabs(s2->saa_saved_ms) < 1e-12,
           "s2 total %g ms (saved %g), want %g", s2->total_ms, s2->saa_saved_ms,
           (3 * (gate + exp / 2) + 4 * a + 2 * g) * 1e3);
  for (int s = 0; s < MOE_PARM_SCHEDULES; s++) {
    const moe_parm_sim_times *t = &r.sched[s];
    TU_CHECK(
        near(t->total_ms, t->fwd_ms + t->bwd_ms) &&
            near(t->total_ms, t->compute_ms + t->a2a_ms + t->esp_ms + t->mp_ms - t->saa_saved_ms),
        "%s: the parts do not add up", moe_parm_schedule_name(s));
  }
}

// Two nodes of 2, MP 2 x EP 2: MP groups inside the nodes, the all-to-all
// between them (separate links: inter_uses_intra 0); latency 2 us intra, 3 us
// inter. SAA hides part of the gather.
static void test_hand_two_nodes(moe_ctx *ctx) {
  const moe_cluster cl = tiny(2, 2, 2, 3);
  const moe_parm_sim_config c = small(2, 2, 1);
  moe_parm_sim_result r;
  TU_CHECK(moe_parm_simulate(ctx, &cl, &c, &r) == MOE_STATUS_OK, "simulate: %s",
           moe_ctx_error(ctx));
  // all-to-all: (E / EP) (C / MP) M = 65536 elements to the peer in the other
  // node, both devices of a node: 2 x 256 KiB over the node's 1 GB/s NIC
  const double a_load = 2 * 65536.0 * 4 / 1e9, lat_a = 3e-6, lat_g = 2e-6;
  // s2's gather: n / MP = 131072 elements to the MP peer, over the device link
  const double g_load = 131072.0 * 4 / 1e9;
  // the pair shares no link: load(A + G) = max; W = EP ESP = 2
  const double both = a_load > g_load ? a_load : g_load;
  const double saa = (a_load + both + g_load) / 2 + lat_a + lat_g;
  const double saved = (a_load + lat_a + g_load + lat_g) - saa;
  const moe_parm_sim_times *s2 = &r.sched[MOE_PARM_S2];
  TU_CHECK(near(s2->saa_saved_ms, 2 * saved * 1e3) && saved > 0, "SAA saved %g ms, want %g",
           s2->saa_saved_ms, 2 * saved * 1e3);
  TU_CHECK(
      near(s2->a2a_ms, 4 * (a_load + lat_a) * 1e3) && near(s2->mp_ms, 2 * (g_load + lat_g) * 1e3),
      "s2 a2a %g mp %g", s2->a2a_ms, s2->mp_ms);
  // baseline, ESP = 1: the EP all-to-all of n / EP to the peer, the same bytes
  // as s2's times MP (every MP rank sends all its rows)
  const moe_parm_sim_times *b = &r.sched[MOE_PARM_BASELINE];
  TU_CHECK(near(b->a2a_ms, 4 * (2 * a_load + lat_a) * 1e3) && b->esp_ms == 0,
           "baseline a2a %g esp %g", b->a2a_ms, b->esp_ms);
  TU_CHECK(r.mp_intra == 1, "MP groups inside nodes");
}

// The testbeds: both shipped, and the invariants on a grid.
static void test_invariants(moe_ctx *ctx) {
  moe_cluster a, b, b8, b16;
  TU_CHECK(moe_cluster_builtin(ctx, "parm-1x8-rtx4090-pcie", &a) == MOE_STATUS_OK && a.nodes == 1 &&
               a.devices_per_node == 8,
           "testbed A: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_cluster_builtin(ctx, "parm-8x4-rtx2080ti-100g", &b) == MOE_STATUS_OK &&
               b.nodes == 8 && b.devices_per_node == 4,
           "testbed B: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_cluster_scale(ctx, &b, 8, &b8) == MOE_STATUS_OK &&
               moe_cluster_scale(ctx, &b, 16, &b16) == MOE_STATUS_OK,
           "scale B: %s", moe_ctx_error(ctx));
  const moe_cluster *cls[4] = {&a, &b8, &b16, &b};
  static const int lay[3] = {1, 2, 4}, toks[2] = {2048, 8192}, dims[2] = {1024, 4096};
  static const double fs[3] = {1.2, 2.4, 0};
  int intra_rows = 0, s2_wins = 0, mp1_rows = 0;
  for (int ci = 0; ci < 4; ci++) {
    const int D = moe_cluster_devices(cls[ci]);
    for (int im = 0; im < 3; im++)
      for (int ie = 0; ie < 3; ie++)
        for (int it = 0; it < 2; it++)
          for (int ix = 0; ix < 2; ix++)
            for (int jf = 0; jf < 3; jf++) {
              moe_parm_sim_config c;
              moe_parm_sim_config_default(&c);
              c.mp = lay[im];
              c.esp = lay[ie];
              if (D % (c.mp * c.esp) != 0) continue;
              c.ep = D / (c.mp * c.esp);
              c.tokens = toks[it];
              c.model_dim = dims[ix];
              c.hidden_dim = dims[1 - ix];
              c.capacity_factor = fs[jf];
              moe_parm_sim_result r;
              int pick = -1;
              if (moe_parm_choose(ctx, cls[ci], &c, &pick, &r) != MOE_STATUS_OK) {
                TU_CHECK(0, "%s MP %d ESP %d: %s", cls[ci]->name, c.mp, c.esp, moe_ctx_error(ctx));
                continue;
              }
              const double t0 = r.sched[0].total_ms, t1 = r.sched[1].total_ms,
                           t2 = r.sched[2].total_ms;
              TU_CHECK(t0 > 0 && t1 > 0 && t2 > 0 && isfinite(t0), "times %g %g %g", t0, t1, t2);
              // eq. 2: no MP, no difference
              if (c.mp == 1) {
                mp1_rows++;
                TU_CHECK(near(t1, t2), "%s MP 1 ESP %d T %d: s1 %g != s2 %g", cls[ci]->name, c.esp,
                         c.tokens, t1, t2);
              }
              // eq. 6: with the MP and ESP groups inside the nodes, neither is slower
              if (r.mp_intra && r.esp_intra) {
                intra_rows++;
                TU_CHECK(t1 <= t0 * (1 + 1e-9) && t2 <= t0 * (1 + 1e-9),
                         "%s MP %d ESP %d T %d M %d f %g: baseline %g, s1 %g, s2 %g", cls[ci]->name,
                         c.mp, c.esp, c.tokens, c.model_dim, c.capacity_factor, t0, t1, t2);
              }
              TU_CHECK(pick == (t1 <= t2 * (1 + 1e-9) ? MOE_PARM_S1 : MOE_PARM_S2),
                       "choose picked %d: s1 %g s2 %g", pick, t1, t2);
              s2_wins += c.mp > 1 && pick == MOE_PARM_S2;
              // Algorithm 1 on terms fitted to the model: its t1 and t2 are the
              // simulated communication of one pass of s1 and s2
              moe_parm_alpha_beta ab;
              double a1 = 0, a2 = 0;
              TU_CHECK(moe_parm_fit_alpha_beta(ctx, cls[ci], &c, &ab) == MOE_STATUS_OK, "fit: %s",
                       moe_ctx_error(ctx));
              moe_parm_alg1(&ab, &c, &a1, &a2);
              const moe_parm_sim_times *p1 = &r.sched[1], *p2 = &r.sched[2];
              TU_CHECK(fabs(a1 * 1e3 - (p1->a2a_ms + p1->mp_ms) / 2) <= 1e-6 * (p1->a2a_ms + 1) &&
                           fabs(a2 * 1e3 - (p2->a2a_ms + p2->mp_ms - p2->saa_saved_ms) / 2) <=
                               1e-6 * (p2->a2a_ms + 1),
                       "%s MP %d ESP %d: Algorithm 1's t1 %g t2 %g ms vs the model's %g %g",
                       cls[ci]->name, c.mp, c.esp, a1 * 1e3, a2 * 1e3, (p1->a2a_ms + p1->mp_ms) / 2,
                       (p2->a2a_ms + p2->mp_ms - p2->saa_saved_ms) / 2);
            }
  }
  TU_CHECK(intra_rows > 50 && mp1_rows > 20, "only %d intra-node and %d MP 1 rows", intra_rows,
           mp1_rows);
  // testbed B's NIC is the bottleneck of some layouts: SAA hides the gather there
  TU_CHECK(s2_wins > 0, "s2 never faster than s1");
  // placement: on 2 x 4 devices, ESP 4 at MP 1 stays in a node, at MP 2 it crosses
  moe_parm_sim_config c = small(1, 2, 4);
  moe_parm_sim_result r;
  TU_CHECK(moe_parm_simulate(ctx, &b8, &c, &r) == MOE_STATUS_OK && r.esp_intra == 1, "ESP intra");
  c = small(2, 1, 4);
  TU_CHECK(
      moe_parm_simulate(ctx, &b8, &c, &r) == MOE_STATUS_OK && r.esp_intra == 0 && r.mp_intra == 1,
      "MP 2 x ESP 4 on 2 x 4: ESP %d MP %d", r.esp_intra, r.mp_intra);
}

// Algorithm 1 on terms that make each answer obvious.
static void test_alg1(void) {
  moe_parm_sim_config c;
  moe_parm_sim_config_default(&c);
  c.mp = 2;
  c.esp = 1;
  c.tokens = 1000;
  c.model_dim = 10;
  c.top_k = 2;
  c.capacity_factor = 1.2;  // V = ESP f K T M / MP = 12000; T M = 10000
  // the all-to-all dominates and SAA hides the gather (t_o = the all-to-all):
  // t1 = 2 V + T M, t2 = 2 V
  moe_parm_alpha_beta ab = {0, 1, 0, 1, 0, 1};
  double t1 = 0, t2 = 0;
  TU_CHECK(moe_parm_alg1(&ab, &c, &t1, &t2) == MOE_PARM_S2 && near(t1, 34000) && near(t2, 24000),
           "a2a-bound: t1 %g t2 %g", t1, t2);
  // the MP-AllGather dominates (a free all-to-all): s1 gathers T M, s2 f K T M
  ab = (moe_parm_alpha_beta){0, 0, 0, 1, 0, 1};
  TU_CHECK(moe_parm_alg1(&ab, &c, &t1, &t2) == MOE_PARM_S1 && near(t1, 10000) && near(t2, 12000),
           "gather-bound: t1 %g t2 %g", t1, t2);
  // alphas count: a costly overlapped call tips it to s1
  ab = (moe_parm_alpha_beta){0, 1, 0, 1, 1e6, 1};
  TU_CHECK(moe_parm_alg1(&ab, &c, NULL, NULL) == MOE_PARM_S1, "alpha_o ignored");
  TU_CHECK(strcmp(moe_parm_schedule_name(MOE_PARM_S2), "s2") == 0 &&
               strcmp(moe_parm_schedule_name(7), "?") == 0,
           "schedule names");
}

// Bad input: INVALID_ARG, the message naming the field and its range.
static void expect_bad(moe_ctx *ctx, const moe_cluster *cl, const moe_parm_sim_config *c,
                       const char *needle) {
  moe_parm_sim_result r;
  const moe_status st = moe_parm_simulate(ctx, cl, c, &r);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(ctx), needle),
           "want INVALID_ARG with '%s', got %d '%s'", needle, (int)st, moe_ctx_error(ctx));
}

static void test_bad(moe_ctx *ctx) {
  const moe_cluster cl = tiny(2, 4, 1, 1);
  moe_parm_sim_config c = small(2, 2, 3);
  expect_bad(ctx, &cl, &c, "MP x EP x ESP (2 x 2 x 3 = 12) must divide the devices (8)");
  c = small(1, 1, 0);
  expect_bad(ctx, &cl, &c, "ESP (0) must be in [1, 8]");
  c = small(1, 2, 4);
  c.hidden_dim = 510;
  expect_bad(ctx, &cl, &c, "hidden dimension H (510) must be divisible by ESP (4)");
  c = small(1, 4, 1);
  c.experts = 6;
  expect_bad(ctx, &cl, &c, "experts (6) must be divisible by EP (4)");
  c = small(1, 2, 1);
  c.top_k = 3;
  expect_bad(ctx, &cl, &c, "top-k (3) must be in [1, 2]");
  c = small(4, 1, 1);
  c.tokens = 3;
  expect_bad(ctx, &cl, &c, "tokens (3) must be in [MP = 4,");
  c = small(1, 1, 1);
  c.elem_bytes = 0;
  expect_bad(ctx, &cl, &c, "element bytes (0) must be in (0, 16]");
  c = small(1, 1, 1);
  c.capacity_factor = NAN;
  expect_bad(ctx, &cl, &c, "capacity factor");
  moe_parm_sim_result r;
  TU_CHECK(moe_parm_simulate(ctx, NULL, &c, &r) == MOE_STATUS_INVALID_ARG, "NULL cluster");
  int pick = 0;
  c = small(1, 1, 1);
  TU_CHECK(moe_parm_choose(ctx, &cl, &c, NULL, NULL) == MOE_STATUS_INVALID_ARG, "NULL pick");
  // dropless (f <= 0): C = K T / E, the same as f = 1
  moe_parm_sim_result r1;
  c = small(2, 2, 2);
  TU_CHECK(moe_parm_choose(ctx, &cl, &c, &pick, &r1) == MOE_STATUS_OK, "f 1: %s",
           moe_ctx_error(ctx));
  c.capacity_factor = 0;
  TU_CHECK(moe_parm_simulate(ctx, &cl, &c, &r) == MOE_STATUS_OK && near(r.rows, r1.rows) &&
               near(r.sched[0].total_ms, r1.sched[0].total_ms),
           "dropless rows %g vs %g", r.rows, r1.rows);
}

int main(void) {
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return 2;
  test_hand_one_node(ctx);
  test_hand_two_nodes(ctx);
  test_invariants(ctx);
  test_alg1();
  test_bad(ctx);
  moe_ctx_destroy(ctx);
  return tu_finish("test_parm_sim");
}
