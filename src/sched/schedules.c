// Schedules of a chunked layer pass: for r chunks of ScheMoE's seven tasks
// (C1 A1 D1 E C2 A2 D2, compression tasks possibly absent), the order of the
// compute stream and of the communication stream. The executor then starts a
// task when it is next on its stream and its dependencies (the chain of its
// chunk) are done.
//
//   sequential  chunk after chunk, each chain in order: compute C1 D1 E C2 D2
//               per chunk, comm A1 A2 per chunk. With r = 1 this is the
//               unpipelined layer (DeepSpeed-MoE, ScheMoE's "Naive").
//   pipeline    the order of Tutel's and the ScheMoE release's overlap code
//               (ALGORITHMS.md 1.1 [C]): forward compute (C1^1..C1^r)
//               (D1 E C2)^1..^r (D2^1..D2^r), comm A1^1..A1^r A2^1..A2^r.
//               Backward is what PyTorch autograd runs for that graph (nodes
//               by decreasing creation order): the same pattern over the
//               chunks in reverse order, r..1.
//   optsche     ScheMoE Theorem 1 (eq. 12-14): compute (C1^1..C1^r)
//               (D1^i E^i C2^i)_i (D2^1..D2^r), comm FIFO A1^1..A1^r then
//               A2^1..A2^r; backward the mirrored order over chunks 1..r.
//   smart       FasterMoE's smart schedule on peer-group chunks: comm
//               S_0..S_{n-1} then R_0..R_{n-1}, compute C_0..C_{n-1}, step 0
//               (own group) first; backward mirrors it.
//
// pipeline and optsche produce the same forward order: the release code runs
// eq. 12 (its three loops are exactly C1/A1, then D1 E C2 A2, then D2). They
// differ in the backward pass, where autograd walks the chunks in reverse.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "moe/sched.h"

const char *moe_chunk_task_name(moe_chunk_task kind) {
  static const char *const names[MOE_CT_KINDS] = {"C1", "A1", "D1", "E", "C2", "A2", "D2"};
  return (int)kind >= 0 && kind < MOE_CT_KINDS ? names[kind] : "?";
}

// Appends tasks[c][k] for the given kinds (skipping absent ones) to stream.
static moe_status push_kinds(moe_ctx *ctx, moe_schedule *s, moe_stream stream,
                             const int (*tasks)[MOE_CT_KINDS], int c, const moe_chunk_task *kinds,
                             int nk) {
  moe_status st = MOE_STATUS_OK;
  for (int i = 0; i < nk; i++) {
    const int t = tasks[c][kinds[i]];
    if (t >= 0) MOE_TRY(moe_schedule_push(ctx, s, stream, t));
  }
done:
  return st;
}

static moe_status order_sequential(moe_ctx *ctx, int r, const int (*tasks)[MOE_CT_KINDS],
                                   int backward, moe_schedule *out) {
  moe_status st = MOE_STATUS_OK;
  static const moe_chunk_task comp[] = {MOE_CT_C1, MOE_CT_D1, MOE_CT_E, MOE_CT_C2, MOE_CT_D2};
  static const moe_chunk_task comm[] = {MOE_CT_A1, MOE_CT_A2};
  (void)backward;
  moe_schedule_clear(out);
  for (int c = 0; c < r; c++) {
    MOE_TRY(push_kinds(ctx, out, MOE_STREAM_COMPUTE, tasks, c, comp, 5));
    MOE_TRY(push_kinds(ctx, out, MOE_STREAM_COMM, tasks, c, comm, 2));
  }
done:
  return st;
}

// Eq. 12 over the chunks in the order first, first + step, ... (step +1 or -1).
static moe_status eq12(moe_ctx *ctx, int r, const int (*tasks)[MOE_CT_KINDS], int reverse,
                       moe_schedule *out) {
  moe_status st = MOE_STATUS_OK;
  static const moe_chunk_task c1[] = {MOE_CT_C1}, mid[] = {MOE_CT_D1, MOE_CT_E, MOE_CT_C2},
                              d2[] = {MOE_CT_D2}, a1[] = {MOE_CT_A1}, a2[] = {MOE_CT_A2};
  moe_schedule_clear(out);
  for (int i = 0; i < r; i++) {
    const int c = reverse ? r - 1 - i : i;
    MOE_TRY(push_kinds(ctx, out, MOE_STREAM_COMPUTE, tasks, c, c1, 1));
    MOE_TRY(push_kinds(ctx, out, MOE_STREAM_COMM, tasks, c, a1, 1));
  }
  for (int i = 0; i < r; i++) {
    const int c = reverse ? r - 1 - i : i;
    MOE_TRY(push_kinds(ctx, out, MOE_STREAM_COMPUTE, tasks, c, mid, 3));
    MOE_TRY(push_kinds(ctx, out, MOE_STREAM_COMM, tasks, c, a2, 1));
  }
  for (int i = 0; i < r; i++) {
    const int c = reverse ? r - 1 - i : i;
    MOE_TRY(push_kinds(ctx, out, MOE_STREAM_COMPUTE, tasks, c, d2, 1));
  }
done:
  return st;
}

static moe_status order_pipeline(moe_ctx *ctx, int r, const int (*tasks)[MOE_CT_KINDS],
                                 int backward, moe_schedule *out) {
  return eq12(ctx, r, tasks, backward, out);
}

static moe_status order_optsche(moe_ctx *ctx, int r, const int (*tasks)[MOE_CT_KINDS], int backward,
                                moe_schedule *out) {
  (void)backward;  // the mirrored backward chain has the same shape, chunks 1..r
  return eq12(ctx, r, tasks, 0, out);
}

static const moe_schedule_algo g_schedules[] = {
    {"sequential", "baseline (DeepSpeed-MoE; ScheMoE's Naive)",
     "chunk after chunk: compute C1 D1 E C2 D2, comm A1 A2 per chunk", MOE_CHUNK_ROWS,
     order_sequential},
    {"pipeline", "Tutel / ScheMoE release overlap code",
     "compute C1* (D1 E C2)* D2*, comm A1* A2*; backward over chunks r..1", MOE_CHUNK_ROWS,
     order_pipeline},
    {"optsche", "ScheMoE Theorem 1 (eq. 12-14)",
     "compute C1* (D1 E C2)* D2*, comm FIFO A1* A2*; mirrored backward over chunks 1..r",
     MOE_CHUNK_ROWS, order_optsche},
    {"smart", "FasterMoE smart schedule (grouped S/C/R)",
     "chunks are peer groups, own group first: comm S* R*, compute C*", MOE_CHUNK_PEER_GROUPS,
     order_optsche},
};

#define N_SCHEDULES ((int)(sizeof g_schedules / sizeof g_schedules[0]))

const moe_schedule_algo *moe_schedule_algo_list(int *count) {
  if (count) *count = N_SCHEDULES;
  return g_schedules;
}

static char g_names[256];
static pthread_once_t g_names_once = PTHREAD_ONCE_INIT;

static void build_names(void) {
  size_t used = 0;
  for (int i = 0; i < N_SCHEDULES && used < sizeof g_names; i++) {
    const int w =
        snprintf(g_names + used, sizeof g_names - used, "%s%s", i ? ", " : "", g_schedules[i].name);
    if (w < 0) break;
    used += (size_t)w;
  }
}

const char *moe_schedule_algo_names(void) {
  pthread_once(&g_names_once, build_names);
  return g_names;
}

moe_status moe_schedule_algo_find(moe_ctx *ctx, const char *name, const moe_schedule_algo **out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !name || !out, MOE_STATUS_INVALID_ARG, "schedule name and out must not be NULL");
  for (int i = 0; i < N_SCHEDULES; i++) {
    if (strcmp(g_schedules[i].name, name) == 0) {
      *out = &g_schedules[i];
      goto done;
    }
  }
  MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "unknown schedule '%s' (valid: %s)", name,
           moe_schedule_algo_names());
done:
  return st;
}

static moe_status noop_task(void *arg, moe_ctx *ctx) {
  (void)arg;
  (void)ctx;
  return MOE_STATUS_OK;
}

static int is_compression(int k) {
  return k == MOE_CT_C1 || k == MOE_CT_D1 || k == MOE_CT_C2 || k == MOE_CT_D2;
}

moe_status moe_chunk_pass_build(moe_ctx *ctx, const moe_schedule_algo *algo, int r, int compressed,
                                int backward, const moe_chunk_task_fns *fns, void *const *args,
                                moe_task_graph *graph, moe_schedule *sched,
                                int (*tidx)[MOE_CT_KINDS]) {
  moe_status st = MOE_STATUS_OK;
  int(*idx)[MOE_CT_KINDS] = NULL;
  MOE_FAIL_IF(ctx, !algo || !graph || !sched, MOE_STATUS_INVALID_ARG,
              "chunk pass: algo, graph and schedule must not be NULL");
  MOE_FAIL_IF(ctx, r < 1, MOE_STATUS_INVALID_ARG, "chunk pass: r (%d) must be >= 1", r);
  MOE_FAIL_IF(ctx,
              graph->max_tasks < MOE_CT_KINDS * r || graph->max_deps < MOE_CT_KINDS * r ||
                  sched->max_per_stream < MOE_CT_KINDS * r,
              MOE_STATUS_INVALID_ARG,
              "chunk pass: the graph and schedule need room for %d tasks (r = %d)",
              MOE_CT_KINDS * r, r);
  idx = tidx ? tidx : moe_calloc((size_t)r, sizeof *idx);
  MOE_FAIL_IF(ctx, !idx, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate task indices");
  moe_task_graph_clear(graph);
  for (int c = 0; c < r; c++) {
    int prev = -1;
    for (int k = 0; k < MOE_CT_KINDS; k++) {
      idx[c][k] = -1;
      if (!compressed && is_compression(k)) continue;
      char name[MOE_TASK_NAME_MAX];
      snprintf(name, sizeof name, "%s%s^%d", moe_chunk_task_name((moe_chunk_task)k),
               backward ? "'" : "", c + 1);
      moe_task_desc d;
      memset(&d, 0, sizeof d);
      d.stream = (k == MOE_CT_A1 || k == MOE_CT_A2) ? MOE_STREAM_COMM : MOE_STREAM_COMPUTE;
      d.name = name;
      d.chunk = c;
      d.run = fns && fns[k].run ? fns[k].run : noop_task;
      d.test = fns && fns[k].run ? fns[k].test : NULL;
      d.wait = fns && fns[k].run ? fns[k].wait : NULL;
      d.arg = args ? args[c] : NULL;
      d.deps = prev >= 0 ? &prev : NULL;
      d.n_deps = prev >= 0 ? 1 : 0;
      int t = -1;
      MOE_TRY(moe_task_graph_add(ctx, graph, &d, &t));
      graph->tasks[t].kind = k;
      idx[c][k] = prev = t;
    }
  }
  MOE_TRY(algo->order(ctx, r, (const int(*)[MOE_CT_KINDS])idx, backward, sched));
  MOE_TRY(moe_schedule_validate(ctx, graph, sched));
done:
  if (idx != tidx) moe_free(idx);
  return st;
}
