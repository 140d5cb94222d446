// moe_schedule_simulate against makespans worked out by hand for ScheMoE's task
// model (r = 2 chunks, with and without compression, under sequential,
// pipeline/optsche orders), plus its argument checks.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/moe.h"
#include "testutil.h"

static moe_status noop(void *arg, moe_ctx *ctx) {
  (void)arg;
  (void)ctx;
  return MOE_STATUS_OK;
}

// Builds r chained chunks of the kinds present (compression or not) and the
// schedule `name` over them; durations by kind.
static void run_case(const char *name, int r, int compressed, const double *by_kind, double expect,
                     const char *end_task, double expect_end) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_task_graph g;
  moe_schedule s;
  memset(&g, 0, sizeof g);
  memset(&s, 0, sizeof s);
  int tidx[8][MOE_CT_KINDS];
  double dur[64], ends[64];
  TU_CHECK(moe_task_graph_init(ctx, &g, 7 * r, 7 * r) == MOE_STATUS_OK, "graph init");
  TU_CHECK(moe_schedule_init(ctx, &s, 7 * r) == MOE_STATUS_OK, "schedule init");
  for (int c = 0; c < r; c++) {
    int prev = -1;
    for (int k = 0; k < MOE_CT_KINDS; k++) {
      tidx[c][k] = -1;
      const int comp = k == MOE_CT_C1 || k == MOE_CT_D1 || k == MOE_CT_C2 || k == MOE_CT_D2;
      if (comp && !compressed) continue;
      char tn[MOE_TASK_NAME_MAX];
      snprintf(tn, sizeof tn, "%s^%d", moe_chunk_task_name((moe_chunk_task)k), c + 1);
      moe_task_desc d;
      memset(&d, 0, sizeof d);
      d.stream = (k == MOE_CT_A1 || k == MOE_CT_A2) ? MOE_STREAM_COMM : MOE_STREAM_COMPUTE;
      d.name = tn;
      d.chunk = c;
      d.run = noop;
      d.deps = prev >= 0 ? &prev : NULL;
      d.n_deps = prev >= 0;
      int idx = -1;
      moe_task_graph_add(ctx, &g, &d, &idx);
      dur[idx] = by_kind[k];
      tidx[c][k] = prev = idx;
    }
  }
  const moe_schedule_algo *algo = NULL;
  TU_CHECK(moe_schedule_algo_find(ctx, name, &algo) == MOE_STATUS_OK, "find %s", name);
  double m = -1.0;
  if (algo) {
    algo->order(ctx, r, (const int(*)[MOE_CT_KINDS])tidx, 0, &s);
    TU_CHECK(moe_schedule_simulate(ctx, &g, &s, dur, ends, &m) == MOE_STATUS_OK, "simulate: %s",
             moe_ctx_error(ctx));
    TU_CHECK(fabs(m - expect) < 1e-12, "%s r=%d comp=%d: makespan %g, expected %g", name, r,
             compressed, m, expect);
    double ms = -1.0;
    TU_CHECK(moe_schedule_simulate_shared(ctx, &g, &s, dur, 1.0, 1.0, NULL, &ms) == MOE_STATUS_OK &&
                 fabs(ms - m) < 1e-12,
             "%s: the shared simulation without contention gives %g, not %g", name, ms, m);
    for (int i = 0; end_task && i < g.n_tasks; i++) {
      if (strcmp(g.tasks[i].name, end_task) == 0) {
        TU_CHECK(fabs(ends[i] - expect_end) < 1e-12, "%s: %s ends at %g, expected %g", name,
                 end_task, ends[i], expect_end);
      }
    }
  }
  moe_task_graph_free(&g);
  moe_schedule_free(&s);
  moe_ctx_destroy(ctx);
}

static void errors(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_task_graph g;
  moe_schedule s;
  moe_task_graph_init(ctx, &g, 2, 2);
  moe_schedule_init(ctx, &s, 2);
  moe_task_desc d;
  memset(&d, 0, sizeof d);
  d.run = noop;
  d.stream = MOE_STREAM_COMPUTE;
  d.name = "a";
  moe_task_graph_add(ctx, &g, &d, NULL);
  const int dep = 0;
  d.name = "b";
  d.deps = &dep;
  d.n_deps = 1;
  moe_task_graph_add(ctx, &g, &d, NULL);
  // b before a on the same stream: deadlock
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, 1);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, 0);
  double dur[2] = {1.0, 2.0}, m = 0.0;
  TU_CHECK(moe_schedule_simulate(ctx, &g, &s, dur, NULL, &m) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "deadlock") != NULL,
           "deadlocking order refused: %s", moe_ctx_error(ctx));
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, 0);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, 1);
  TU_CHECK(moe_schedule_simulate(ctx, &g, &s, dur, NULL, &m) == MOE_STATUS_OK && m == 3.0,
           "chain of 1 + 2 = 3 (got %g)", m);
  dur[1] = -1.0;
  TU_CHECK(moe_schedule_simulate(ctx, &g, &s, dur, NULL, &m) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "'b'") != NULL,
           "negative duration refused: %s", moe_ctx_error(ctx));
  dur[1] = NAN;
  TU_CHECK(moe_schedule_simulate(ctx, &g, &s, dur, NULL, &m) == MOE_STATUS_INVALID_ARG,
           "NaN duration refused");
  TU_CHECK(moe_schedule_simulate(ctx, &g, &s, NULL, NULL, &m) == MOE_STATUS_INVALID_ARG,
           "NULL durations refused");
  moe_task_graph_free(&g);
  moe_schedule_free(&s);
  moe_ctx_destroy(ctx);
}

// Contention: compute C = 10 beside an independent comm A = 4, both 2x slower
// while they overlap: A ends at 8 (4 units at half speed), C has done 4 units
// by then and runs its last 6 alone: 14. A dependent chain never overlaps.
static void shared(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_task_graph g;
  moe_schedule s;
  moe_task_graph_init(ctx, &g, 3, 3);
  moe_schedule_init(ctx, &s, 3);
  moe_task_desc d;
  memset(&d, 0, sizeof d);
  d.run = noop;
  d.stream = MOE_STREAM_COMPUTE;
  d.name = "C";
  moe_task_graph_add(ctx, &g, &d, NULL);
  d.stream = MOE_STREAM_COMM;
  d.name = "A";
  moe_task_graph_add(ctx, &g, &d, NULL);
  moe_schedule_in_index_order(ctx, &s, &g);
  double dur[3] = {10.0, 4.0, 0.0}, end[3], m = 0.0;
  TU_CHECK(moe_schedule_simulate_shared(ctx, &g, &s, dur, 2.0, 2.0, end, &m) == MOE_STATUS_OK &&
               fabs(m - 14.0) < 1e-12 && fabs(end[1] - 8.0) < 1e-12 && fabs(end[0] - 14.0) < 1e-12,
           "contention: makespan %g (A %g, C %g), expected 14 (8, 14)", m, end[1], end[0]);
  // comm slowed 3x, compute not: C ends at 10, when A has done 10/3 of its 4
  // units; A finishes the rest alone at 10 + 2/3
  TU_CHECK(moe_schedule_simulate_shared(ctx, &g, &s, dur, 1.0, 3.0, end, &m) == MOE_STATUS_OK &&
               fabs(end[1] - 32.0 / 3.0) < 1e-12 && fabs(end[0] - 10.0) < 1e-12,
           "comm-only contention: A %g C %g", end[1], end[0]);
  // chain A -> C': no overlap, no slowdown
  const int dep = 1;
  d.stream = MOE_STREAM_COMPUTE;
  d.name = "C2";
  d.deps = &dep;
  d.n_deps = 1;
  moe_task_graph_add(ctx, &g, &d, NULL);
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, 1);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, 2);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, 0);
  dur[2] = 5.0;
  TU_CHECK(moe_schedule_simulate_shared(ctx, &g, &s, dur, 2.0, 2.0, end, &m) == MOE_STATUS_OK &&
               fabs(end[2] - 9.0) < 1e-12 && fabs(m - 19.0) < 1e-12,
           "chain then C: C2 ends %g (9), makespan %g (19)", end[2], m);
  TU_CHECK(
      moe_schedule_simulate_shared(ctx, &g, &s, dur, 0.5, 1.0, end, &m) == MOE_STATUS_INVALID_ARG,
      "slowdown below 1 refused");
  moe_task_graph_free(&g);
  moe_schedule_free(&s);
  moe_ctx_destroy(ctx);
}

int main(void) {
  // kinds: C1 A1 D1 E C2 A2 D2
  const double plain[MOE_CT_KINDS] = {0, 4, 0, 6, 0, 4, 0};
  const double comp[MOE_CT_KINDS] = {1, 4, 1, 6, 1, 4, 1};
  // No compression, r = 2, A = 4, E = 6:
  //   sequential: A1 [0,4] E [4,10] A2 [10,14] A1 [14,18] E [18,24] A2 [24,28]
  //   optsche:    A1^1 [0,4] A1^2 [4,8]; E^1 [4,10] E^2 [10,16]; A2^1 [10,14] A2^2 [16,20]
  run_case("sequential", 2, 0, plain, 28.0, "A2^1", 14.0);
  run_case("optsche", 2, 0, plain, 20.0, "A1^2", 8.0);
  run_case("pipeline", 2, 0, plain, 20.0, "E^2", 16.0);
  // r = 1: everything in a chain: 4 + 6 + 4
  run_case("optsche", 1, 0, plain, 14.0, NULL, 0.0);
  // With compression (C = D = 1), optsche (eq. 12-14):
  //   C1^1 [0,1] C1^2 [1,2]; A1^1 [1,5] A1^2 [5,9]; D1^1 [5,6] E^1 [6,12] C2^1 [12,13]
  //   D1^2 [13,14] E^2 [14,20] C2^2 [20,21]; A2^1 [13,17] A2^2 [21,25]; D2^1 [21,22] D2^2 [25,26]
  run_case("optsche", 2, 1, comp, 26.0, "A2^1", 17.0);
  // sequential with compression: (1 + 4 + 1 + 6 + 1 + 4 + 1) per chunk = 18, twice
  run_case("sequential", 2, 1, comp, 36.0, "D2^1", 18.0);
  errors();
  shared();
  return tu_finish("test_simulate");
}
