// Tests of sched/: task graph building and its errors, schedule validation
// (including the deadlock check), and the two-stream executor: dependencies are
// honoured across streams, stream orders are respected, failures stop both
// streams and name the task, both wait policies work, and the profiler's
// records and breakdown match known sleeps. No MPI: tasks sleep or spin.
// A watchdog (alarm) turns any hang into a failure well before ctest's timeout.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moe/core.h"
#include "moe/sched.h"
#include "testutil.h"

#define MS 1000000ull  // ns

static void sleep_ms(double ms) {
  const uint64_t ns = (uint64_t)(ms * 1e6);
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

// ---- a tiny task framework for the tests ---------------------------------------------

// Every task of a test shares one log. A task's own slot is written only by the
// stream running it; the executor's synchronization makes it visible to the
// dependents and to the caller, which is what ThreadSanitizer checks here.
#define MAX_T 128

typedef struct {
  int finished[MAX_T];                // set by the task itself when it ends
  int dep_ok[MAX_T];                  // 1 if every dependency had finished when the task started
  int seq[MOE_STREAM_COUNT_][MAX_T];  // execution order per stream
  int n_seq[MOE_STREAM_COUNT_];
  const moe_task_graph *graph;
  double sleep_ms[MAX_T];
  int fail_at;  // task that returns an error, -1 for none
} tlog;

typedef struct {
  tlog *log;
  int index;
} targ;

static targ g_args[MAX_T];
static moe_ctx *g_run_ctx;  // for run_and_check, created once: passes must not allocate

static moe_status log_task(void *arg, moe_ctx *ctx) {
  const targ *a = arg;
  tlog *log = a->log;
  const moe_task *task = &log->graph->tasks[a->index];
  const int *deps = NULL;
  int nd = 0;
  moe_task_graph_deps(log->graph, a->index, &deps, &nd);
  int ok = 1;
  for (int d = 0; d < nd; d++) ok &= log->finished[deps[d]];
  log->dep_ok[a->index] = ok;
  log->seq[task->stream][log->n_seq[task->stream]++] = a->index;
  if (log->sleep_ms[a->index] > 0) sleep_ms(log->sleep_ms[a->index]);
  if (a->index == log->fail_at) {
    return moe_error_at(ctx, MOE_STATUS_COMM, __FILE__, __LINE__, "peer %d went away", 3);
  }
  log->finished[a->index] = 1;
  return MOE_STATUS_OK;
}

static void log_reset(tlog *log, const moe_task_graph *g) {
  memset(log, 0, sizeof(*log));
  log->graph = g;
  log->fail_at = -1;
}

// Adds a logging task; returns its index (or -1, which fails the test).
static int add(moe_task_graph *g, tlog *log, moe_stream s, const char *name, const int *deps,
               int nd) {
  const int i = g->n_tasks;
  g_args[i].log = log;
  g_args[i].index = i;
  moe_task_desc d = {s, name, 0, log_task, NULL, NULL, &g_args[i], deps, nd};
  int idx = -1;
  const moe_status st = moe_task_graph_add(NULL, g, &d, &idx);
  TU_CHECK(st == MOE_STATUS_OK && idx == i, "add task %s: %s", name ? name : "?",
           moe_status_str(st));
  return idx;
}

// Runs g in sched on ex; checks success, all deps honoured, every task ran
// once, and each stream ran exactly its order.
static void run_and_check(const char *what, moe_executor *ex, const moe_task_graph *g,
                          const moe_schedule *s, tlog *log) {
  moe_ctx *ctx = g_run_ctx;
  const moe_status st = moe_executor_run(ex, g, s, ctx);
  TU_CHECK(st == MOE_STATUS_OK, "%s: run: %s (%s)", what, moe_status_str(st), moe_ctx_error(ctx));
  for (int i = 0; i < g->n_tasks; i++) {
    TU_CHECK(log->finished[i] && log->dep_ok[i], "%s: task %s finished %d deps-ok %d", what,
             g->tasks[i].name, log->finished[i], log->dep_ok[i]);
  }
  for (int k = 0; k < MOE_STREAM_COUNT_; k++) {
    int same = log->n_seq[k] == s->len[k];
    for (int p = 0; same && p < s->len[k]; p++) same = log->seq[k][p] == s->order[k][p];
    TU_CHECK(same, "%s: %s stream ran %d tasks, not its order of %d", what,
             moe_stream_name((moe_stream)k), log->n_seq[k], s->len[k]);
  }
  int n = 0;
  const moe_task_record *rec = moe_executor_records(ex, &n);
  TU_CHECK(rec && n == g->n_tasks, "%s: %d records", what, n);
  for (int i = 0; rec && i < n; i++) {
    const int *deps = NULL;
    int nd = 0;
    moe_task_graph_deps(g, i, &deps, &nd);
    for (int d = 0; d < nd; d++) {
      TU_CHECK(rec[i].start_ns >= rec[deps[d]].end_ns, "%s: %s starts before its dep %s ends", what,
               g->tasks[i].name, g->tasks[deps[d]].name);
    }
    TU_CHECK(rec[i].ran && rec[i].stream == g->tasks[i].stream && rec[i].end_ns >= rec[i].start_ns,
             "%s: record of %s", what, g->tasks[i].name);
  }
}

// ---- graph building -----------------------------------------------------------------

static void test_graph_errors(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_task_graph g;
  tlog log;
  TU_CHECK(moe_task_graph_init(ctx, &g, 0, 4) == MOE_STATUS_INVALID_ARG, "capacity 0 refused");
  TU_CHECK(moe_task_graph_init(ctx, &g, 3, 2) == MOE_STATUS_OK, "init");
  log_reset(&log, &g);

  const uint64_t allocs = moe_alloc_count();
  const int a = add(&g, &log, MOE_STREAM_COMPUTE, "A", NULL, 0);
  int dep_fwd[1] = {5};
  moe_task_desc d = {MOE_STREAM_COMM, "B", 1, log_task, NULL, NULL, &g_args[1], dep_fwd, 1};
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "forward dep refused");
  TU_CHECK(strstr(moe_ctx_error(ctx), "'B'") && strstr(moe_ctx_error(ctx), "not an earlier task"),
           "forward dep message: %s", moe_ctx_error(ctx));
  int dep_self[1] = {1};
  d.deps = dep_self;
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "self dep refused");
  int dep_neg[1] = {-1};
  d.deps = dep_neg;
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "negative dep refused");
  d.deps = NULL;
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "NULL dep list");
  d.n_deps = 0;
  d.run = NULL;
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "NULL run refused");
  d.run = log_task;
  d.stream = (moe_stream)7;
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "bad stream refused");
  d.stream = MOE_STREAM_COMM;
  d.name = "a-name-that-is-much-too-long-for-a-task";
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "long name refused");
  TU_CHECK(strstr(moe_ctx_error(ctx), "longer than") != NULL, "long name message: %s",
           moe_ctx_error(ctx));
  TU_CHECK(g.n_tasks == 1, "failed adds leave the graph unchanged (%d tasks)", g.n_tasks);

  int dep_a[3] = {a, a, a};
  d.name = "B";
  d.deps = dep_a;
  d.n_deps = 3;
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "dep pool overflow");
  TU_CHECK(strstr(moe_ctx_error(ctx), "do not fit") != NULL, "dep pool message: %s",
           moe_ctx_error(ctx));
  const int b = add(&g, &log, MOE_STREAM_COMM, "B", dep_a, 2);
  add(&g, &log, MOE_STREAM_COMPUTE, NULL, NULL, 0);
  TU_CHECK(strcmp(g.tasks[2].name, "#2") == 0, "unnamed task gets #index: %s", g.tasks[2].name);
  TU_CHECK(g.tasks[2].kind == -1, "a task outside a chunked pass has kind -1 (%d)",
           g.tasks[2].kind);
  d.deps = NULL;
  d.n_deps = 0;
  d.name = "D";
  TU_CHECK(moe_task_graph_add(ctx, &g, &d, NULL) == MOE_STATUS_INVALID_ARG, "too many tasks");
  TU_CHECK(strstr(moe_ctx_error(ctx), "too many tasks") != NULL, "capacity message: %s",
           moe_ctx_error(ctx));
  TU_CHECK(moe_alloc_count() == allocs, "building the graph allocated %llu times",
           (unsigned long long)(moe_alloc_count() - allocs));
  const int *deps = NULL;
  int nd = 0;
  moe_task_graph_deps(&g, b, &deps, &nd);
  TU_CHECK(nd == 2 && deps[0] == a && deps[1] == a, "deps stored");
  moe_task_graph_clear(&g);
  TU_CHECK(g.n_tasks == 0 && g.n_deps == 0 && g.max_tasks == 3, "clear keeps capacity");
  moe_task_graph_free(&g);
  moe_task_graph_free(&g);  // twice: no-op
  moe_task_graph_free(NULL);
  moe_ctx_destroy(ctx);
}

// ---- schedule validation ----------------------------------------------------------------

static void test_schedule_validation(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_task_graph g;
  moe_schedule s;
  tlog log;
  moe_task_graph_init(ctx, &g, 8, 16);
  moe_schedule_init(ctx, &s, 8);
  log_reset(&log, &g);

  // same stream: compute order [B, A] with B dep A
  const int a = add(&g, &log, MOE_STREAM_COMPUTE, "A", NULL, 0);
  const int b = add(&g, &log, MOE_STREAM_COMPUTE, "B", &a, 1);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, b);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, a);
  TU_CHECK(moe_schedule_validate(ctx, &g, &s) == MOE_STATUS_INVALID_ARG, "[B, A] deadlocks");
  TU_CHECK(strstr(moe_ctx_error(ctx), "deadlock") && strstr(moe_ctx_error(ctx), "'B'") &&
               strstr(moe_ctx_error(ctx), "'A'"),
           "same-stream deadlock message: %s", moe_ctx_error(ctx));
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, a);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, b);
  TU_CHECK(moe_schedule_validate(ctx, &g, &s) == MOE_STATUS_OK, "[A, B] valid: %s",
           moe_ctx_error(ctx));

  // cross-stream: compute [X, Y], comm [Z, W], X dep W, Z dep Y
  moe_task_graph_clear(&g);
  log_reset(&log, &g);
  const int w = add(&g, &log, MOE_STREAM_COMM, "W", NULL, 0);
  const int y = add(&g, &log, MOE_STREAM_COMPUTE, "Y", NULL, 0);
  const int x = add(&g, &log, MOE_STREAM_COMPUTE, "X", &w, 1);
  const int z = add(&g, &log, MOE_STREAM_COMM, "Z", &y, 1);
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, x);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, y);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, z);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, w);
  TU_CHECK(moe_schedule_validate(ctx, &g, &s) == MOE_STATUS_INVALID_ARG, "cross-stream deadlock");
  const char *m = moe_ctx_error(ctx);
  TU_CHECK(strstr(m, "'X'") && strstr(m, "'W'") && strstr(m, "'Z'") && strstr(m, "'Y'"),
           "cross-stream deadlock message: %s", m);
  // the executor refuses it too, before running anything
  moe_executor *ex = NULL;
  TU_CHECK(moe_executor_create(ctx, NULL, 8, &ex) == MOE_STATUS_OK, "executor");
  TU_CHECK(moe_executor_run(ex, &g, &s, ctx) == MOE_STATUS_INVALID_ARG, "run refuses deadlock");
  TU_CHECK(log.n_seq[0] + log.n_seq[1] == 0, "nothing ran");
  int nrec = -1;
  TU_CHECK(moe_executor_records(ex, &nrec) == NULL && nrec == 0, "no records after refusal");
  // the same tasks in a compatible order run
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, y);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, x);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, w);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, z);
  run_and_check("cross-stream ok", ex, &g, &s, &log);

  // membership errors
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, y);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, w);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, z);
  TU_CHECK(moe_schedule_validate(ctx, &g, &s) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "'X'") && strstr(moe_ctx_error(ctx), "missing"),
           "missing task: %s", moe_ctx_error(ctx));
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, x);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, x);
  TU_CHECK(moe_schedule_validate(ctx, &g, &s) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "twice"),
           "duplicate task: %s", moe_ctx_error(ctx));
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, y);
  TU_CHECK(moe_schedule_validate(ctx, &g, &s) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "'Y'") && strstr(moe_ctx_error(ctx), "compute task"),
           "wrong stream: %s", moe_ctx_error(ctx));
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, MOE_STREAM_COMM, 42);
  TU_CHECK(moe_schedule_validate(ctx, &g, &s) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "not a task"),
           "index out of range: %s", moe_ctx_error(ctx));
  moe_schedule_clear(&s);
  for (int i = 0; i < 8; i++) moe_schedule_push(ctx, &s, MOE_STREAM_COMM, w);
  TU_CHECK(moe_schedule_push(ctx, &s, MOE_STREAM_COMM, w) == MOE_STATUS_INVALID_ARG,
           "full order refused");
  TU_CHECK(moe_schedule_in_index_order(ctx, &s, &g) == MOE_STATUS_OK &&
               moe_schedule_validate(ctx, &g, &s) == MOE_STATUS_OK,
           "index order is valid: %s", moe_ctx_error(ctx));

  moe_executor_destroy(ex);
  moe_schedule_free(&s);
  moe_schedule_free(&s);
  moe_task_graph_free(&g);
  moe_ctx_destroy(ctx);
}

// ---- dependencies across streams ----------------------------------------------------------

static void test_dependencies(moe_wait_policy policy) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_executor_config cfg = moe_executor_config_default();
  cfg.wait = policy;
  moe_executor *ex = NULL;
  TU_CHECK(moe_executor_create(ctx, &cfg, MAX_T, &ex) == MOE_STATUS_OK, "executor");
  moe_task_graph g;
  moe_schedule s;
  tlog log;
  moe_task_graph_init(ctx, &g, MAX_T, 4 * MAX_T);
  moe_schedule_init(ctx, &s, MAX_T);

  // 1. the refusal: comm A sleeps 20 ms, compute B (first on its stream) depends on A
  log_reset(&log, &g);
  const int a = add(&g, &log, MOE_STREAM_COMM, "A1^0", NULL, 0);
  const int b = add(&g, &log, MOE_STREAM_COMPUTE, "E^0", &a, 1);
  log.sleep_ms[a] = 20;
  moe_schedule_in_index_order(ctx, &s, &g);
  run_and_check("comm->compute", ex, &g, &s, &log);
  const moe_task_record *rec = moe_executor_records(ex, NULL);
  TU_CHECK(rec && rec[b].start_ns >= rec[a].end_ns && rec[a].end_ns >= 19 * MS,
           "E^0 starts %.3f ms, A1^0 ends %.3f ms", rec ? (double)rec[b].start_ns / 1e6 : -1,
           rec ? (double)rec[a].end_ns / 1e6 : -1);

  // 2. the other way: compute sleeps, comm depends on it
  moe_task_graph_clear(&g);
  log_reset(&log, &g);
  const int c = add(&g, &log, MOE_STREAM_COMPUTE, "C1^0", NULL, 0);
  add(&g, &log, MOE_STREAM_COMM, "A1^0", &c, 1);
  log.sleep_ms[c] = 20;
  moe_schedule_in_index_order(ctx, &s, &g);
  run_and_check("compute->comm", ex, &g, &s, &log);

  // 3. ping-pong chains across streams, starting on either
  for (int first = 0; first < 2; first++) {
    moe_task_graph_clear(&g);
    log_reset(&log, &g);
    int prev = -1;
    for (int i = 0; i < 12; i++) {
      const moe_stream st = (moe_stream)((i + first) % 2);
      prev = add(&g, &log, st, NULL, prev >= 0 ? &prev : NULL, prev >= 0 ? 1 : 0);
      log.sleep_ms[prev] = i % 3 == 0 ? 1 : 0;
    }
    moe_schedule_in_index_order(ctx, &s, &g);
    run_and_check(first ? "ping-pong from comm" : "ping-pong from compute", ex, &g, &s, &log);
  }

  // 4. diamond: A -> (B comm, C compute) -> D comm
  moe_task_graph_clear(&g);
  log_reset(&log, &g);
  const int da = add(&g, &log, MOE_STREAM_COMPUTE, "A", NULL, 0);
  const int db = add(&g, &log, MOE_STREAM_COMM, "B", &da, 1);
  const int dc = add(&g, &log, MOE_STREAM_COMPUTE, "C", &da, 1);
  const int dbc[2] = {db, dc};
  add(&g, &log, MOE_STREAM_COMM, "D", dbc, 2);
  log.sleep_ms[da] = 2;
  log.sleep_ms[dc] = 10;
  moe_schedule_in_index_order(ctx, &s, &g);
  run_and_check("diamond", ex, &g, &s, &log);

  // 5. no dependencies at all, orders permuted against index order
  moe_task_graph_clear(&g);
  log_reset(&log, &g);
  for (int i = 0; i < 20; i++) add(&g, &log, (moe_stream)(i % 3 == 0), NULL, NULL, 0);
  moe_schedule_clear(&s);
  for (int i = g.n_tasks - 1; i >= 0; i--) moe_schedule_push(ctx, &s, g.tasks[i].stream, i);
  run_and_check("zero deps, reversed orders", ex, &g, &s, &log);

  // 6. a chain of 100 tasks over pseudo-random streams
  moe_task_graph_clear(&g);
  log_reset(&log, &g);
  uint32_t lcg = 12345u;
  int prev = -1;
  for (int i = 0; i < 100; i++) {
    lcg = lcg * 1664525u + 1013904223u;
    prev = add(&g, &log, (moe_stream)((lcg >> 16) & 1u), NULL, prev >= 0 ? &prev : NULL,
               prev >= 0 ? 1 : 0);
  }
  moe_schedule_in_index_order(ctx, &s, &g);
  run_and_check("chain of 100", ex, &g, &s, &log);

  // 7. chunked pipeline shape (r = 4): A1^i comm -> E^i compute -> A2^i comm, with
  //    the Tutel order on comm (all A1 first) and run many times on one executor
  moe_task_graph_clear(&g);
  moe_schedule_clear(&s);
  log_reset(&log, &g);
  int a1[4], e[4], a2[4];
  char name[16];
  for (int i = 0; i < 4; i++) {
    snprintf(name, sizeof(name), "A1^%d", i);
    a1[i] = add(&g, &log, MOE_STREAM_COMM, name, NULL, 0);
    snprintf(name, sizeof(name), "E^%d", i);
    e[i] = add(&g, &log, MOE_STREAM_COMPUTE, name, &a1[i], 1);
    snprintf(name, sizeof(name), "A2^%d", i);
    a2[i] = add(&g, &log, MOE_STREAM_COMM, name, &e[i], 1);
  }
  for (int i = 0; i < 4; i++) moe_schedule_push(ctx, &s, MOE_STREAM_COMM, a1[i]);
  for (int i = 0; i < 4; i++) moe_schedule_push(ctx, &s, MOE_STREAM_COMPUTE, e[i]);
  for (int i = 0; i < 4; i++) moe_schedule_push(ctx, &s, MOE_STREAM_COMM, a2[i]);
  const uint64_t allocs = moe_alloc_count();
  for (int pass = 0; pass < 200; pass++) {
    log_reset(&log, &g);
    run_and_check("pipeline pass", ex, &g, &s, &log);
  }
  TU_CHECK(moe_alloc_count() == allocs, "200 passes allocated %llu times",
           (unsigned long long)(moe_alloc_count() - allocs));

  moe_executor_destroy(ex);
  moe_schedule_free(&s);
  moe_task_graph_free(&g);
  moe_ctx_destroy(ctx);
}

// ---- failures -------------------------------------------------------------------------------

static void test_failure(moe_wait_policy policy, moe_stream failing_stream) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_executor_config cfg = moe_executor_config_default();
  cfg.wait = policy;
  moe_executor *ex = NULL;
  moe_executor_create(ctx, &cfg, 16, &ex);
  moe_task_graph g;
  moe_schedule s;
  tlog log;
  moe_task_graph_init(ctx, &g, 16, 16);
  moe_schedule_init(ctx, &s, 16);
  log_reset(&log, &g);
  // The failing task runs first on its stream; the other stream is then blocked
  // on a dependency that will never be done (a task after the failing one).
  const moe_stream other = failing_stream == MOE_STREAM_COMM ? MOE_STREAM_COMPUTE : MOE_STREAM_COMM;
  const int f = add(&g, &log, failing_stream, "A1^3", NULL, 0);
  const int after = add(&g, &log, failing_stream, "after", NULL, 0);
  const int waiter = add(&g, &log, other, "waiter", &after, 1);
  const int free_task = add(&g, &log, other, "free", NULL, 0);
  log.fail_at = f;
  log.sleep_ms[f] = 5;  // let the other stream reach its wait first
  moe_schedule_clear(&s);
  moe_schedule_push(ctx, &s, other, free_task);
  moe_schedule_push(ctx, &s, other, waiter);
  moe_schedule_push(ctx, &s, failing_stream, f);
  moe_schedule_push(ctx, &s, failing_stream, after);
  g.tasks[f].chunk = 3;
  const moe_status st = moe_executor_run(ex, &g, &s, ctx);
  const char *m = moe_ctx_error(ctx);
  TU_CHECK(st == MOE_STATUS_COMM, "%s/%s: failing task's status comes back (%s)",
           moe_wait_policy_name(policy), moe_stream_name(failing_stream), moe_status_str(st));
  TU_CHECK(strstr(m, "'A1^3'") && strstr(m, "peer 3 went away") && strstr(m, "chunk 3") &&
               strstr(m, moe_stream_name(failing_stream)),
           "message names the task: %s", m);
  TU_CHECK(!log.n_seq[failing_stream] || log.seq[failing_stream][0] == f, "failing task ran");
  TU_CHECK(log.n_seq[failing_stream] == 1, "no task after the failure on its stream");
  TU_CHECK(!log.finished[waiter] && !log.finished[after], "dependents did not run");
  const moe_task_record *rec = moe_executor_records(ex, NULL);
  TU_CHECK(rec && !rec[f].ran && !rec[waiter].ran, "records say what ran");

  // the executor is usable after a failure
  log_reset(&log, &g);
  moe_schedule_in_index_order(ctx, &s, &g);
  run_and_check("after failure", ex, &g, &s, &log);

  moe_executor_destroy(ex);
  moe_schedule_free(&s);
  moe_task_graph_free(&g);
  moe_ctx_destroy(ctx);
}

// ---- split tasks and the wait policies --------------------------------------------------------

typedef struct {
  uint64_t ready_at;  // test says done from this time on
  uint64_t latency_ms;
  int started, waited, tests;
  int never;           // never completes
  int wait_completes;  // wait completes it at once (as MPI_Waitall drives progress)
} split_arg;

static moe_status split_run(void *arg, moe_ctx *ctx) {
  split_arg *a = arg;
  a->started = 1;
  a->ready_at = moe_time_ns() + a->latency_ms * MS;
  return MOE_STATUS_OK;
}

static moe_status split_test(void *arg, moe_ctx *ctx, moe_task_state *state) {
  split_arg *a = arg;
  a->tests++;
  *state = !a->never && moe_time_ns() >= a->ready_at ? MOE_TASK_DONE : MOE_TASK_PENDING;
  return MOE_STATUS_OK;
}

static moe_status split_wait(void *arg, moe_ctx *ctx) {
  split_arg *a = arg;
  a->waited = 1;
  if (a->wait_completes) a->ready_at = 0;
  const uint64_t now = moe_time_ns();
  if (now < a->ready_at) sleep_ms((double)(a->ready_at - now) / 1e6);
  return MOE_STATUS_OK;
}

static moe_status fail_run(void *arg, moe_ctx *ctx) {
  sleep_ms(10);
  return moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__, "boom");
}

static void test_wait_policies(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_wait_policy p = MOE_WAIT_BLOCKING;
  TU_CHECK(
      moe_wait_policy_parse(ctx, "poll-backoff", &p) == MOE_STATUS_OK && p == MOE_WAIT_POLL_BACKOFF,
      "parse poll-backoff");
  TU_CHECK(moe_wait_policy_parse(ctx, "blocking", &p) == MOE_STATUS_OK && p == MOE_WAIT_BLOCKING,
           "parse blocking");
  TU_CHECK(moe_wait_policy_parse(ctx, "spin", &p) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "'spin'"),
           "parse error: %s", moe_ctx_error(ctx));
  TU_CHECK(strcmp(moe_wait_policy_name(MOE_WAIT_POLL_BACKOFF), "poll-backoff") == 0, "name");
  moe_executor_config bad = moe_executor_config_default();
  TU_CHECK(bad.wait == MOE_WAIT_ADAPTIVE, "default policy is adaptive");
  bad.poll_min_ns = 200000;
  moe_executor *ex = NULL;
  TU_CHECK(moe_executor_create(ctx, &bad, 4, &ex) == MOE_STATUS_INVALID_ARG && !ex,
           "min > max refused");
  bad = moe_executor_config_default();
  bad.wait = (moe_wait_policy)9;
  TU_CHECK(moe_executor_create(ctx, &bad, 4, &ex) == MOE_STATUS_INVALID_ARG, "bad policy");

  moe_task_graph g;
  moe_schedule s;
  moe_task_graph_init(ctx, &g, 4, 4);
  moe_schedule_init(ctx, &s, 4);
  for (int variant = 0; variant < 3; variant++) {
    // 0: poll-backoff, 1: blocking with a wait function, 2: blocking without one
    moe_executor_config cfg = moe_executor_config_default();
    cfg.wait = variant == 0 ? MOE_WAIT_POLL_BACKOFF : MOE_WAIT_BLOCKING;
    moe_executor_create(ctx, &cfg, 4, &ex);
    split_arg sa = {0, 20, 0, 0, 0, 0, 0};
    moe_task_graph_clear(&g);
    moe_task_desc d = {MOE_STREAM_COMM,
                       "A1^0",
                       0,
                       split_run,
                       split_test,
                       variant == 1 ? split_wait : NULL,
                       &sa,
                       NULL,
                       0};
    int ia = -1;
    moe_task_graph_add(ctx, &g, &d, &ia);
    moe_schedule_in_index_order(ctx, &s, &g);
    const moe_status st = moe_executor_run(ex, &g, &s, ctx);
    const moe_task_record *rec = moe_executor_records(ex, NULL);
    TU_CHECK(st == MOE_STATUS_OK && rec && rec[ia].ran, "variant %d runs: %s", variant,
             moe_ctx_error(ctx));
    if (rec) {
      const double ms = (double)(rec[ia].end_ns - rec[ia].start_ns) / 1e6;
      TU_CHECK(ms >= 19.9 && ms < 200, "variant %d: split task took %.3f ms", variant, ms);
      printf("  split task, variant %d: %.3f ms, %u tests\n", variant, ms, rec[ia].polls);
      if (variant == 0) {
        // back-off: 5, 10, ..., 80, then 100 us: about 200 tests in 20 ms at most
        TU_CHECK(sa.tests >= 2 && sa.tests <= 400, "poll-backoff: %d tests", sa.tests);
      }
    }
    TU_CHECK((variant == 1) == sa.waited, "variant %d: wait function used %d", variant, sa.waited);
    TU_CHECK(variant != 1 || sa.tests == 0, "blocking with wait: no tests (%d)", sa.tests);
    TU_CHECK(variant != 2 || sa.tests >= 1, "blocking without wait: tests back to back");

    // a pending split task is abandoned when the compute stream fails
    split_arg never = {0, 0, 0, 0, 0, 1, 0};
    moe_task_graph_clear(&g);
    d.arg = &never;
    d.wait = NULL;
    moe_task_graph_add(ctx, &g, &d, NULL);
    moe_task_desc fd = {MOE_STREAM_COMPUTE, "E^1", 1, fail_run, NULL, NULL, NULL, NULL, 0};
    moe_task_graph_add(ctx, &g, &fd, NULL);
    moe_schedule_in_index_order(ctx, &s, &g);
    TU_CHECK(moe_executor_run(ex, &g, &s, ctx) == MOE_STATUS_INTERNAL &&
                 strstr(moe_ctx_error(ctx), "'E^1'") && strstr(moe_ctx_error(ctx), "boom"),
             "variant %d: pending task abandoned on failure: %s", variant, moe_ctx_error(ctx));
    TU_CHECK(never.started && never.tests >= 1, "variant %d: pending task was polled", variant);
    moe_executor_destroy(ex);
    ex = NULL;
  }
  moe_schedule_free(&s);
  moe_task_graph_free(&g);
  moe_ctx_destroy(ctx);
}

static moe_status nap_run(void *arg, moe_ctx *ctx) {
  (void)ctx;
  sleep_ms(*(const double *)arg);
  return MOE_STATUS_OK;
}

// MOE_WAIT_ADAPTIVE: a pending comm task blocks in its wait function when
// the compute stream waits for it, and polls with back-off while a compute
// task runs beside it.
static void test_adaptive_wait(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_wait_policy p = MOE_WAIT_BLOCKING;
  TU_CHECK(moe_wait_policy_parse(ctx, "adaptive", &p) == MOE_STATUS_OK && p == MOE_WAIT_ADAPTIVE &&
               strcmp(moe_wait_policy_name(MOE_WAIT_ADAPTIVE), "adaptive") == 0,
           "parse adaptive");
  moe_executor_config cfg = moe_executor_config_default();
  cfg.wait = MOE_WAIT_ADAPTIVE;
  moe_executor *ex = NULL;
  TU_CHECK(moe_executor_create(ctx, &cfg, 4, &ex) == MOE_STATUS_OK, "create: %s",
           moe_ctx_error(ctx));
  moe_task_graph g;
  moe_schedule s;
  moe_task_graph_init(ctx, &g, 4, 4);
  moe_schedule_init(ctx, &s, 4);
  for (int dependent = 1; dependent >= 0 && ex; dependent--) {
    // the comm task and a compute task: after it (dependent: the compute
    // stream waits), or beside it for 100 ms. Dependent: test reports done
    // only after 5 s, but wait completes it at once, so the pass is quick
    // exactly when the executor blocks in wait (no timing bound to race on).
    // Beside: done after 20 ms, found by the back-off polls.
    split_arg sa = {0, 20, 0, 0, 0, 0, 0};
    if (dependent) {
      sa.latency_ms = 5000;
      sa.wait_completes = 1;
    }
    double nap = dependent ? 1.0 : 100.0;
    moe_task_graph_clear(&g);
    moe_task_desc d = {MOE_STREAM_COMM, "A1^0", 0, split_run, split_test, split_wait, &sa, NULL, 0};
    int ia = -1;
    moe_task_graph_add(ctx, &g, &d, &ia);
    moe_task_desc e = {MOE_STREAM_COMPUTE, "E^0", 0, nap_run, NULL, NULL, &nap, NULL, 0};
    if (dependent) {
      e.deps = &ia;
      e.n_deps = 1;
    }
    moe_task_graph_add(ctx, &g, &e, NULL);
    moe_schedule_in_index_order(ctx, &s, &g);
    const moe_status st = moe_executor_run(ex, &g, &s, ctx);
    const moe_task_record *rec = moe_executor_records(ex, NULL);
    TU_CHECK(st == MOE_STATUS_OK && rec && rec[ia].ran, "adaptive, dependent %d: %s", dependent,
             moe_ctx_error(ctx));
    if (dependent) {
      TU_CHECK(sa.waited == 1 && rec[ia].end_ns - rec[ia].start_ns < 2000 * MS,
               "compute waits for the comm task: it blocks in wait (waited %d, %d tests)",
               sa.waited, sa.tests);
    } else {
      TU_CHECK(sa.waited == 0 && sa.tests >= 2,
               "compute runs beside the comm task: back-off polls (waited %d, %d tests)", sa.waited,
               sa.tests);
    }
  }
  moe_executor_destroy(ex);
  moe_schedule_free(&s);
  moe_task_graph_free(&g);
  moe_ctx_destroy(ctx);
}

// ---- the background task ---------------------------------------------------------------

typedef struct {
  int calls;    // polls so far
  int done_at;  // report done on this call (0: never)
  int fail;     // fail on the first call instead
} bg_arg;

static moe_status bg_test(void *arg, moe_ctx *ctx, moe_task_state *state) {
  bg_arg *b = arg;
  b->calls++;
  if (b->fail) return moe_error_at(ctx, MOE_STATUS_COMM, __FILE__, __LINE__, "background broke");
  *state = b->done_at > 0 && b->calls >= b->done_at ? MOE_TASK_DONE : MOE_TASK_PENDING;
  return MOE_STATUS_OK;
}

// The comm stream polls the background task while it waits for a
// dependency (A1 -> E (60 ms) -> A2) and, its order done, while compute
// runs (A1 beside E); it stops once the task is done; a task never done or
// failing does not change the pass; none set: never polled.
static void test_background(void) {
  moe_ctx *ctx = g_run_ctx;
  moe_executor *ex = NULL;
  TU_CHECK(moe_executor_create(ctx, NULL, 4, &ex) == MOE_STATUS_OK, "create: %s",
           moe_ctx_error(ctx));
  moe_task_graph g;
  moe_schedule s;
  moe_task_graph_init(ctx, &g, 4, 4);
  moe_schedule_init(ctx, &s, 4);
  static const char *const what[5] = {"between dependencies", "after the comm order", "never done",
                                      "failing", "none set"};
  for (int k = 0; ex && k < 5; k++) {
    bg_arg b = {0, k == 2 ? 0 : 5, k == 3};
    double nap = 60.0;
    moe_task_graph_clear(&g);
    moe_task_desc a1 = {MOE_STREAM_COMM, "A1^0", 0, nap_run, NULL, NULL, &(double){0.0}, NULL, 0};
    int ia = -1, ie = -1;
    moe_task_graph_add(ctx, &g, &a1, &ia);
    moe_task_desc e = {MOE_STREAM_COMPUTE, "E^0", 0, nap_run, NULL, NULL, &nap, &ia, 1};
    moe_task_graph_add(ctx, &g, &e, &ie);
    if (k != 1) {
      moe_task_desc a2 = {MOE_STREAM_COMM, "A2^0", 0, nap_run, NULL, NULL, &(double){0.0}, &ie, 1};
      moe_task_graph_add(ctx, &g, &a2, NULL);
    }
    moe_schedule_in_index_order(ctx, &s, &g);
    moe_executor_set_background(ex, k == 4 ? NULL : bg_test, &b);
    const moe_status st = moe_executor_run(ex, &g, &s, ctx);
    const moe_executor_background bs = moe_executor_background_stats(ex);
    const moe_task_record *rec = moe_executor_records(ex, NULL);
    TU_CHECK(st == MOE_STATUS_OK && rec && rec[ie].ran, "background %s: %s", what[k],
             moe_ctx_error(ctx));
    if (!rec) continue;
    switch (k) {
      case 0:
      case 1:  // done on the 5th poll, during E, and not polled again
        TU_CHECK(
            bs.done && !bs.failed && bs.polls == 5 && b.calls == 5 && bs.done_ns <= rec[ie].end_ns,
            "background %s: done %d, polls %d (calls %d), at %llu ns (E ends %llu)", what[k],
            bs.done, bs.polls, b.calls, (unsigned long long)bs.done_ns,
            (unsigned long long)rec[ie].end_ns);
        break;
      case 2:  // polled all through E (back-off at most 20 us: hundreds of polls)
        TU_CHECK(!bs.done && !bs.failed && bs.polls >= 100 && bs.polls == b.calls,
                 "background %s: done %d, polls %d", what[k], bs.done, bs.polls);
        break;
      case 3:
        TU_CHECK(!bs.done && bs.failed && bs.polls == 1, "background %s: failed %d, polls %d",
                 what[k], bs.failed, bs.polls);
        break;
      default:
        TU_CHECK(bs.polls == 0 && b.calls == 0, "background %s: polls %d", what[k], bs.polls);
    }
  }
  moe_executor_destroy(ex);
  moe_schedule_free(&s);
  moe_task_graph_free(&g);
}

// ---- profiler --------------------------------------------------------------------------------

static void test_breakdown_synthetic(void) {
  // compute [0, 10] and [20, 30] ms, comm [5, 25] ms and [40, 50] ms
  const moe_task_record rec[5] = {
      {MOE_STREAM_COMPUTE, 1, 0, 10 * MS, 0},
      {MOE_STREAM_COMPUTE, 1, 20 * MS, 30 * MS, 0},
      {MOE_STREAM_COMM, 1, 5 * MS, 25 * MS, 0},
      {MOE_STREAM_COMM, 1, 40 * MS, 50 * MS, 0},
      {MOE_STREAM_COMM, 0, 0, 0, 0},  // did not run: ignored
  };
  moe_pass_breakdown b;
  moe_pass_breakdown_compute(rec, 5, &b);
  TU_CHECK(b.total_ns == 50 * MS && b.compute_ns == 20 * MS && b.comm_ns == 30 * MS &&
               b.overlap_ns == 10 * MS && b.exposed_comm_ns == 20 * MS,
           "synthetic breakdown: total %llu compute %llu comm %llu overlap %llu exposed %llu",
           (unsigned long long)b.total_ns, (unsigned long long)b.compute_ns,
           (unsigned long long)b.comm_ns, (unsigned long long)b.overlap_ns,
           (unsigned long long)b.exposed_comm_ns);
  moe_pass_breakdown_compute(NULL, 0, &b);
  TU_CHECK(b.total_ns == 0 && b.comm_ns == 0, "empty breakdown");
}

static void test_profiler(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_executor *ex = NULL;
  moe_executor_create(ctx, NULL, 4, &ex);
  moe_pass_breakdown b;
  moe_executor_breakdown(ex, &b);
  TU_CHECK(b.total_ns == 0, "no breakdown before a run");
  moe_task_graph g;
  moe_schedule s;
  tlog log;
  moe_task_graph_init(ctx, &g, 4, 4);
  moe_schedule_init(ctx, &s, 4);

  // 1. independent 30 ms compute and 30 ms comm: they overlap
  log_reset(&log, &g);
  const int c = add(&g, &log, MOE_STREAM_COMPUTE, "E^0", NULL, 0);
  const int m = add(&g, &log, MOE_STREAM_COMM, "A1^0", NULL, 0);
  log.sleep_ms[c] = 30;
  log.sleep_ms[m] = 30;
  moe_schedule_in_index_order(ctx, &s, &g);
  run_and_check("overlap", ex, &g, &s, &log);
  moe_executor_breakdown(ex, &b);
  printf("  overlap pass: total %.2f compute %.2f comm %.2f overlap %.2f exposed %.2f ms\n",
         (double)b.total_ns / 1e6, (double)b.compute_ns / 1e6, (double)b.comm_ns / 1e6,
         (double)b.overlap_ns / 1e6, (double)b.exposed_comm_ns / 1e6);
  TU_CHECK(b.compute_ns >= 29 * MS && b.comm_ns >= 29 * MS, "busy times");
  TU_CHECK(b.overlap_ns >= 15 * MS, "overlap %.2f ms", (double)b.overlap_ns / 1e6);
  TU_CHECK(b.exposed_comm_ns + b.overlap_ns == b.comm_ns, "exposed + overlap = comm");
  TU_CHECK(b.total_ns < 55 * MS, "total %.2f ms is not serial", (double)b.total_ns / 1e6);

  // 2. comm depends on compute: nothing overlaps, comm is fully exposed
  moe_task_graph_clear(&g);
  log_reset(&log, &g);
  const int c2 = add(&g, &log, MOE_STREAM_COMPUTE, "E^0", NULL, 0);
  const int m2 = add(&g, &log, MOE_STREAM_COMM, "A2^0", &c2, 1);
  log.sleep_ms[c2] = 15;
  log.sleep_ms[m2] = 15;
  moe_schedule_in_index_order(ctx, &s, &g);
  run_and_check("serial", ex, &g, &s, &log);
  moe_executor_breakdown(ex, &b);
  TU_CHECK(b.overlap_ns == 0 && b.exposed_comm_ns == b.comm_ns && b.comm_ns >= 14 * MS,
           "serial pass: overlap %.3f ms, exposed %.3f ms", (double)b.overlap_ns / 1e6,
           (double)b.exposed_comm_ns / 1e6);
  TU_CHECK(b.total_ns >= 29 * MS, "serial total %.2f ms", (double)b.total_ns / 1e6);
  int n = 0;
  const moe_task_record *rec = moe_executor_records(ex, &n);
  TU_CHECK(n == 2 && rec[c2].stream == MOE_STREAM_COMPUTE && rec[m2].stream == MOE_STREAM_COMM &&
               rec[c2].polls == 0,
           "records");

  moe_executor_destroy(ex);
  moe_executor_destroy(NULL);
  moe_schedule_free(&s);
  moe_task_graph_free(&g);
  moe_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  alarm(120);  // watchdog: a deadlock fails the test with SIGALRM
  moe_ctx_create(&g_run_ctx);
  test_graph_errors();
  test_schedule_validation();
  test_dependencies(MOE_WAIT_POLL_BACKOFF);
  test_dependencies(MOE_WAIT_BLOCKING);
  test_dependencies(MOE_WAIT_ADAPTIVE);
  for (int p = 0; p < 2; p++) {
    test_failure((moe_wait_policy)p, MOE_STREAM_COMM);
    test_failure((moe_wait_policy)p, MOE_STREAM_COMPUTE);
  }
  test_wait_policies();
  test_adaptive_wait();
  test_background();
  test_breakdown_synthetic();
  test_profiler();
  moe_ctx_destroy(g_run_ctx);
  return tu_finish("test_executor");
}
