// Lina's priority (moe_grad_reducer with MOE_COMM_PRIORITY_LINA) checked
// against the executor's records of a real expert-parallel backward, as the
// trainer drives it: the reducer is held from before the MoE layer's backward
// (its combine's gradient comes first, then the all-to-alls) to its end, the
// gradients are all marked ready before it, and the layer's comm stream
// progresses the sums in its gaps (moe_ep_layer_set_background_extra). For
// every micro-op that started during the hold:
//   - it was started by the comm stream in a gap (not by a mark or a call);
//   - it started inside the layer's executor pass (none between the start of
//     the backward's combine and the pass, none after the pass);
//   - no all-to-all task (A1', A2') was running when it started;
//   - no all-to-all was waiting: none whose dependencies had ended more than
//     LATE_NS before it started and that had not started yet (the comm stream
//     sees an ended dependency at its next check; LATE_NS covers a thread
//     descheduled on an oversubscribed machine).
// For every micro-op of both priorities: at most one in flight, never two
// buckets in one, and the sums bitwise equal to the fixed-order tree (the
// same elementwise order as moe_allreduce_fixed). The layer's input
// gradients are bitwise those of a backward without the reducer. Over the
// steps, micro-ops must have started in gaps (else the test checked nothing).
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/core.h"
#include "moe/parallel.h"
#include "moe/sched.h"
#include "testutil_mpi.h"

#define T_TOK 384
#define M_DIM 64
#define H_DIM 1024
#define NT 24
#define NUMEL 3000
#define STEPS 8
#define LATE_NS 20000000ull  // 20 ms

static int g_rank, g_size;
static moe_ctx *g_ctx;

static float input(int rank, int step, size_t i) {
  return (float)((rank + 1) * (int)((i * 7 + (size_t)step) % 13)) * 0.25f;
}

static moe_status gap_progress(void *arg, moe_ctx *ctx, moe_task_state *state) {
  int all = 1;
  const moe_status st = moe_grad_reducer_progress_gap(arg, ctx, &all);
  *state = all ? MOE_TASK_DONE : MOE_TASK_PENDING;
  return st;
}

// Checks one step's records against the layer's backward pass. Returns the
// micro-ops started in gaps.
static int check_step(const char *name, moe_grad_reducer *r, const moe_ep_layer *L, int lina,
                      uint64_t t_hold, uint64_t t_unhold) {
  int nr = 0, in_gaps = 0;
  const moe_grad_op_record *rec = moe_grad_reducer_records(r, &nr);
  const uint64_t t0 = moe_grad_reducer_step_start_ns(r);
  const moe_task_graph *graph = NULL;
  const moe_task_record *tr = NULL;
  moe_ep_layer_last_pass(L, 1, &graph, &tr);
  const uint64_t p0 = moe_ep_layer_pass_start_ns(L, 1);
  TU_CHECK(graph && tr && p0 > 0 && t0 > 0, "%s: no backward pass records", name);
  if (!graph || !tr) return 0;
  uint64_t pass_end = p0;
  for (int t = 0; t < graph->n_tasks; t++)
    if (tr[t].ran && p0 + tr[t].end_ns > pass_end) pass_end = p0 + tr[t].end_ns;
  for (int k = 0; k < nr; k++) {
    size_t bf = 0, bc = 0;
    moe_grad_reducer_bucket(r, rec[k].bucket, &bf, &bc, NULL);
    TU_CHECK(rec[k].first >= bf && rec[k].first + rec[k].count <= bf + bc,
             "%s: micro-op %d [%zu, +%zu) mixes buckets (bucket %d is [%zu, +%zu))", name, k,
             rec[k].first, rec[k].count, rec[k].bucket, bf, bc);
    TU_CHECK(k == 0 || rec[k].start_ns >= rec[k - 1].end_ns,
             "%s: micro-op %d started before %d ended: two in flight", name, k, k - 1);
    const uint64_t s = t0 + rec[k].start_ns;
    in_gaps += rec[k].gap;
    if (!lina || s < t_hold || s >= t_unhold) continue;
    TU_CHECK(rec[k].gap && rec[k].held, "%s: micro-op %d started during the hold by %s", name, k,
             rec[k].gap ? "?" : "a mark or progress call, not a gap");
    TU_CHECK(s >= p0 && s <= pass_end,
             "%s: micro-op %d started %.3f ms after the hold, outside the pass [%.3f, %.3f] ms",
             name, k, (double)(s - t_hold) * 1e-6, (double)(p0 - t_hold) * 1e-6,
             (double)(pass_end - t_hold) * 1e-6);
    for (int t = 0; t < graph->n_tasks; t++) {
      const moe_task *task = &graph->tasks[t];
      if (task->stream != MOE_STREAM_COMM || !tr[t].ran) continue;
      const uint64_t a0 = p0 + tr[t].start_ns, a1 = p0 + tr[t].end_ns;
      TU_CHECK(!(s >= a0 && s < a1), "%s: micro-op %d started while all-to-all task %d ran", name,
               k, t);
      uint64_t ready = p0;  // when its dependencies had all ended
      for (int d = 0; d < task->n_deps; d++) {
        const int dep = graph->deps[task->dep_offset + d];
        if (p0 + tr[dep].end_ns > ready) ready = p0 + tr[dep].end_ns;
      }
      TU_CHECK(!(s > ready + LATE_NS && s < a0),
               "%s: micro-op %d started %.3f ms after all-to-all task %d was ready, before it ran",
               name, k, (double)(s - ready) * 1e-6, t);
    }
  }
  return in_gaps;
}

static void run(int lina, int *gaps_total) {
  const char *name = lina ? "lina" : "fifo";
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = T_TOK;
  cfg.model_dim = M_DIM;
  cfg.hidden_dim = H_DIM;
  cfg.num_experts = 2 * g_size;
  cfg.top_k = 2;
  cfg.capacity_factor = 0;  // dropless
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  pc.ep_size = g_size;
  snprintf(pc.schedule, sizeof pc.schedule, "pipeline");
  pc.chunks = 2;
  moe_ep_layer *L = NULL;
  moe_grad_reducer *r = NULL;
  float *x = malloc((size_t)T_TOK * M_DIM * sizeof(float));
  float *dy = malloc((size_t)T_TOK * M_DIM * sizeof(float));
  float *y = malloc((size_t)T_TOK * M_DIM * sizeof(float));
  float *dx = malloc((size_t)T_TOK * M_DIM * sizeof(float));
  float *dx_ref = malloc((size_t)T_TOK * M_DIM * sizeof(float));
  float *t[NT];
  size_t numel[NT];
  for (int i = 0; i < NT; i++) {
    t[i] = malloc(NUMEL * sizeof(float));
    numel[i] = NUMEL;
    if (!t[i]) MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (!x || !dy || !y || !dx || !dx_ref) MPI_Abort(MPI_COMM_WORLD, 2);
  moe_rng rng;
  moe_rng_init(&rng, 900, (uint64_t)g_rank);
  for (size_t i = 0; i < (size_t)T_TOK * M_DIM; i++) {
    x[i] = moe_rng_uniform(&rng) * 2.0f - 1.0f;
    dy[i] = moe_rng_uniform(&rng) * 2.0f - 1.0f;
  }
  moe_status st = moe_ep_layer_create(g_ctx, MPI_COMM_WORLD, &cfg, &pc, &L);
  TU_CHECK(st == MOE_STATUS_OK, "%s: layer: %s", name, moe_ctx_error(g_ctx));
  if (st != MOE_STATUS_OK) goto done;
  moe_ep_layer_init_params(L, 5);
  moe_grad_reducer_config gc;
  moe_grad_reducer_config_default(&gc);
  gc.bucket_bytes = 4 * NUMEL * sizeof(float);  // 4 tensors per bucket
  gc.micro_op_bytes = 4096;                     // about 3 micro-ops per tensor
  gc.priority = lina ? MOE_COMM_PRIORITY_LINA : MOE_COMM_PRIORITY_FIFO;
  st = moe_grad_reducer_create(g_ctx, MPI_COMM_WORLD, NT, t, numel, &gc, &r);
  TU_CHECK(st == MOE_STATUS_OK, "%s: reducer: %s", name, moe_ctx_error(g_ctx));
  if (st != MOE_STATUS_OK) goto done;

  // the reference: the backward without the reducer
  moe_layer_stats s;
  moe_ep_layer_zero_grad(L);
  st = moe_ep_layer_forward(L, x, T_TOK, y, &s);
  memset(dx_ref, 0, (size_t)T_TOK * M_DIM * sizeof(float));  // the backward adds into dx
  if (st == MOE_STATUS_OK) st = moe_ep_layer_backward(L, dy, dx_ref);
  TU_CHECK(st == MOE_STATUS_OK, "%s: reference pass: %s", name, moe_ctx_error(g_ctx));
  if (st != MOE_STATUS_OK) goto done;
  moe_ep_layer_set_background_extra(L, gap_progress, r);
  for (int step = 0; step < STEPS && st == MOE_STATUS_OK; step++) {
    for (int i = 0; i < NT; i++)
      for (size_t j = 0; j < NUMEL; j++) t[i][j] = input(g_rank, step, (size_t)i * NUMEL + j);
    moe_ep_layer_zero_grad(L);
    st = moe_ep_layer_forward(L, x, T_TOK, y, &s);
    TU_CHECK(st == MOE_STATUS_OK, "%s: forward: %s", name, moe_ctx_error(g_ctx));
    if (st != MOE_STATUS_OK) break;
    // as the trainer: held from before the MoE backward, the gradients ready
    memset(dx, 0, (size_t)T_TOK * M_DIM * sizeof(float));
    const uint64_t t_hold = moe_time_ns();
    moe_grad_reducer_hold(r, 1);
    for (int i = 0; i < NT && st == MOE_STATUS_OK; i++) st = moe_grad_reducer_ready(r, g_ctx, i);
    if (st == MOE_STATUS_OK) st = moe_ep_layer_backward(L, dy, dx);
    const uint64_t t_unhold = moe_time_ns();
    moe_grad_reducer_hold(r, 0);
    if (st == MOE_STATUS_OK) st = moe_grad_reducer_finish(r, g_ctx);
    TU_CHECK(st == MOE_STATUS_OK, "%s step %d: %s", name, step, moe_ctx_error(g_ctx));
    if (st != MOE_STATUS_OK) break;
    TU_CHECK(memcmp(dx, dx_ref, (size_t)T_TOK * M_DIM * sizeof(float)) == 0,
             "%s step %d: the layer's input gradients differ from the pass without sums", name,
             step);
    size_t bad = 0;  // small multiples of 1/4: every order gives the exact sum
    for (int i = 0; i < NT; i++)
      for (size_t j = 0; j < NUMEL; j++) {
        float want = 0;
        for (int p = 0; p < g_size; p++) want += input(p, step, (size_t)i * NUMEL + j);
        bad += t[i][j] != want;
      }
    TU_CHECK(bad == 0, "%s step %d: %zu sums wrong", name, step, bad);
    char label[64];
    snprintf(label, sizeof label, "%s step %d (P=%d)", name, step, g_size);
    if (g_size > 1) *gaps_total += check_step(label, r, L, lina, t_hold, t_unhold);
  }
done:
  if (L) moe_ep_layer_set_background_extra(L, NULL, NULL);
  moe_grad_reducer_destroy(r);
  moe_ep_layer_destroy(L);
  for (int i = 0; i < NT; i++) free(t[i]);
  free(x);
  free(dy);
  free(y);
  free(dx);
  free(dx_ref);
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (moe_ctx_create(&g_ctx) != MOE_STATUS_OK) MPI_Abort(MPI_COMM_WORLD, 2);
  int gaps[2] = {0, 0};
  run(1, &gaps[1]);
  run(0, &gaps[0]);
  int all_gaps = 0;
  MPI_Allreduce(&gaps[1], &all_gaps, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_size > 1)
    TU_CHECK(all_gaps > 0, "lina: no micro-op started in a gap over %d steps: nothing was checked",
             STEPS);
  if (g_rank == 0 && g_size > 1)
    printf("lina: %d micro-ops started in the all-to-all stream's gaps (all ranks, %d steps)\n",
           all_gaps, STEPS);

  const int rc = tu_mpi_finish("test_lina_order");
  moe_ctx_destroy(g_ctx);
  MPI_Finalize();
  return rc;
}
