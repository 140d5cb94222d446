// The hang watchdog (include/moe/comm.h, src/comm/watchdog.c) under mpirun,
// with a callback in place of MPI_Abort so that each verdict can be checked
// and the job goes on:
//   - API: bad configs refused, one watchdog per process, marks only while
//     one runs, slots run out into unwatched operations (token 0);
//   - healthy: many short marked collectives give no abort verdict;
//   - slow (P >= 2): the last rank sleeps 4 timeouts outside any operation
//     while the others wait in a barrier: a SLOW report naming it, no abort;
//   - stopped (P >= 2): the last rank SIGSTOPs itself while the others wait:
//     NO_ANSWER naming it and the others' wait (then rank 0 SIGCONTs it);
//   - deadlock (P >= 3): the last rank waits in an operation of its own that
//     never ends while the others wait in a barrier: DEADLOCK naming it and
//     its operation, on every rank;
//   - `--serialized` (MPI_THREAD_SERIALIZED): no probe; a wait of one timeout
//     gives UNPROBED.
#define _POSIX_C_SOURCE 200809L  // kill, nanosleep
#include <mpi.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moe/comm.h"
#include "testutil.h"

static int g_rank, g_world;
static moe_ctx *g_ctx;
static pid_t *g_pids;  // (world) every rank's process id

// The first report of the running watchdog (written by its thread).
static moe_watchdog_report g_report;
static atomic_int g_reports;

static void on_hang(void *user, const moe_watchdog_report *r) {
  (void)user;
  if (atomic_load(&g_reports) == 0) {
    g_report = *r;
    if (g_rank == 0 || r->kind != MOE_HANG_SLOW) printf("  rank %d got: %s\n", g_rank, r->message);
  }
  atomic_fetch_add(&g_reports, 1);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static moe_watchdog *start(double timeout_s) {
  memset(&g_report, 0, sizeof g_report);
  atomic_store(&g_reports, 0);
  moe_watchdog_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.timeout_s = timeout_s;
  cfg.grace_s = 2.0;  // generous: the test machine may be loaded
  cfg.hint = "test hint";
  cfg.on_hang = on_hang;
  moe_watchdog *wd = NULL;
  const moe_status st = moe_watchdog_start(g_ctx, MPI_COMM_WORLD, &cfg, &wd);
  TU_CHECK(st == MOE_STATUS_OK && wd, "start: %s", moe_ctx_error(g_ctx));
  return wd;
}

static void barrier(const char *op) { MOE_MPI_WATCHED(op, MPI_Barrier(MPI_COMM_WORLD)); }

static int has_suspect(const moe_watchdog_report *r, int rank) {
  for (int i = 0; i < r->n_suspects && i < MOE_WATCHDOG_MAX_SUSPECTS; i++)
    if (r->suspects[i] == rank) return 1;
  return 0;
}

// ---- API ---------------------------------------------------------------------------------------

static void test_api(void) {
  moe_watchdog *wd = NULL;
  moe_watchdog_config cfg;
  memset(&cfg, 0, sizeof cfg);
  TU_CHECK(moe_watchdog_start(g_ctx, MPI_COMM_WORLD, &cfg, &wd) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "hang timeout (0 s) must be in (0, 1e9]"),
           "timeout 0 accepted (%s)", moe_ctx_error(g_ctx));
  cfg.timeout_s = 1;
  cfg.grace_s = -1;
  TU_CHECK(moe_watchdog_start(g_ctx, MPI_COMM_WORLD, &cfg, &wd) == MOE_STATUS_INVALID_ARG,
           "negative grace accepted");
  TU_CHECK(moe_watchdog_start(g_ctx, MPI_COMM_WORLD, NULL, &wd) == MOE_STATUS_INVALID_ARG,
           "NULL config accepted");
  TU_CHECK(wd == NULL, "a failed start returned a watchdog");
  TU_CHECK(moe_watchdog_op_begin("nothing runs", NULL) == 0, "a mark without a watchdog");
  moe_watchdog_op_end(0);  // no-op
  moe_watchdog_stop(NULL);

  wd = start(30);
  moe_watchdog *second = NULL;
  TU_CHECK(moe_watchdog_start(g_ctx, MPI_COMM_WORLD, &(moe_watchdog_config){.timeout_s = 1},
                              &second) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "already runs") && !second,
           "a second watchdog started (%s)", moe_ctx_error(g_ctx));
  const int probing = moe_watchdog_probing(wd);
  TU_CHECK(probing == (g_world == 1 ? -1 : 1), "probing %d with %d ranks", probing, g_world);
  // Marks are taken while a thread watches (more than one rank); beyond the
  // slots, operations go unwatched (token 0) and nothing breaks.
  int tokens[64], n_tracked = 0;
  for (int i = 0; i < 64; i++) {
    tokens[i] = moe_watchdog_op_begin("many", NULL);
    n_tracked += tokens[i] != 0;
    for (int k = 0; k < i; k++)
      TU_CHECK(tokens[i] == 0 || tokens[i] != tokens[k], "token %d given twice", tokens[i]);
  }
  if (g_world == 1) {
    TU_CHECK(n_tracked == 0, "%d marks with nothing to watch", n_tracked);
  } else {
    TU_CHECK(n_tracked >= 8 && n_tracked < 64, "%d of 64 nested marks tracked", n_tracked);
  }
  for (int i = 0; i < 64; i++) moe_watchdog_op_end(tokens[i]);
  // What a mark costs (a clock read and a few atomics; printed, bounded loosely).
  const int reps = 100000;
  const uint64_t t0 = moe_time_ns();
  for (int i = 0; i < reps; i++) moe_watchdog_op_end(moe_watchdog_op_begin("cost", NULL));
  const double ns = (double)(moe_time_ns() - t0) / reps;
  if (g_rank == 0)
    printf("  op_begin + op_end: %.0f ns (watchdog %s)\n", ns, g_world > 1 ? "running" : "idle");
  TU_CHECK(ns < 20000, "a mark costs %.0f ns", ns);
  const int t = moe_watchdog_op_begin("after", NULL);
  TU_CHECK(g_world == 1 || t != 0, "slots not released");
  moe_watchdog_op_end(t);
  moe_watchdog_stop(wd);
  TU_CHECK(moe_watchdog_op_begin("stopped", NULL) == 0, "a mark after stop");
  // stop released the process's watchdog: another one starts
  wd = start(30);
  moe_watchdog_stop(wd);
}

// ---- verdicts ----------------------------------------------------------------------------------

static void test_healthy(void) {
  moe_watchdog *wd = start(1.0);
  // 40 short waits, 50 ms apart (2 timeouts in all), the same number on every rank
  for (int i = 0; i < 40; i++) {
    barrier("test: short barrier");
    sleep_s(0.05);
  }
  barrier("test: short barrier");
  moe_watchdog_stop(wd);
  // A loaded machine may hold a rank back for a timeout (a SLOW warning, correct);
  // never an abort.
  TU_CHECK(atomic_load(&g_reports) == 0 || g_report.kind == MOE_HANG_SLOW,
           "healthy run reported: %s", g_report.message);
}

static void test_slow(void) {
  const int last = g_world - 1;
  if (g_rank == 0) printf("slow rank %d (4 s, timeout 1 s):\n", last);
  moe_watchdog *wd = start(1.0);
  // busy outside any operation for longer than the timeout and the probe's grace
  if (g_rank == last) sleep_s(4.0);
  barrier("test: barrier behind a slow rank");
  moe_watchdog_stop(wd);
  if (g_rank == last) {
    TU_CHECK(atomic_load(&g_reports) == 0, "the slow rank reported: %s", g_report.message);
  } else {
    TU_CHECK(atomic_load(&g_reports) >= 1 && g_report.kind == MOE_HANG_SLOW,
             "rank %d: no SLOW report (reports %d, kind %d: %s)", g_rank, atomic_load(&g_reports),
             (int)g_report.kind, g_report.message);
    TU_CHECK(has_suspect(&g_report, last) && strstr(g_report.message, "busy outside communication"),
             "SLOW report does not name rank %d: %s", last, g_report.message);
    TU_CHECK(strcmp(g_report.op, "test: barrier behind a slow rank") == 0 &&
                 g_report.waited_s >= 1.0 && g_report.rank == g_rank && g_report.size == g_world,
             "SLOW report's fields: op '%s', waited %.2f, rank %d of %d", g_report.op,
             g_report.waited_s, g_report.rank, g_report.size);
  }
}

// Polls (marked as op) until this rank's watchdog has reported and then until
// every rank of comm has (an unmarked MPI_Ibarrier; at most 30 s), so that each
// rank's watchdog sees the same situation before the test undoes it.
static void wait_for_reports(const char *op, const char *detail, MPI_Comm comm) {
  const int tok = moe_watchdog_op_begin(op, detail);
  const uint64_t t0 = moe_time_ns();
  MPI_Request all_reported = MPI_REQUEST_NULL;
  int done = 0;
  while (!done) {
    const int late = moe_time_ns() - t0 > 30000000000ull;
    if (all_reported == MPI_REQUEST_NULL && (atomic_load(&g_reports) > 0 || late))
      MPI_Ibarrier(comm, &all_reported);
    if (all_reported != MPI_REQUEST_NULL) MPI_Test(&all_reported, &done, MPI_STATUS_IGNORE);
    if (!done) sleep_s(0.01);
  }
  moe_watchdog_op_end(tok);
}

static void test_stopped(void) {
  const int last = g_world - 1;
  if (g_rank == 0) printf("stopped rank %d (SIGSTOP, timeout 1 s):\n", last);
  MPI_Comm others;  // every rank but the last
  MPI_Comm_split(MPI_COMM_WORLD, g_rank == last, g_rank, &others);
  moe_watchdog *wd = start(1.0);
  barrier("test: line-up");
  if (g_rank == last) {
    raise(SIGSTOP);  // every thread stops until rank 0 SIGCONTs it
  } else {
    // waiting for the stopped rank (as in a barrier with it), until every other rank has
    // its report; then rank 0 wakes it
    wait_for_reports("test: barrier behind a stopped rank", NULL, others);
    if (g_rank == 0) kill(g_pids[last], SIGCONT);
  }
  barrier("test: release");
  moe_watchdog_stop(wd);
  MPI_Comm_free(&others);
  if (g_rank != last) {
    TU_CHECK(atomic_load(&g_reports) >= 1 && g_report.kind == MOE_HANG_NO_ANSWER,
             "rank %d: no NO_ANSWER report (reports %d, kind %d: %s)", g_rank,
             atomic_load(&g_reports), (int)g_report.kind, g_report.message);
    TU_CHECK(g_report.n_suspects == 1 && g_report.suspects[0] == last,
             "NO_ANSWER suspects: %d (%s)", g_report.n_suspects, g_report.message);
    char want[128];
    snprintf(want, sizeof want, "rank %d did not answer", last);
    TU_CHECK(strstr(g_report.message, want) &&
                 strstr(g_report.message, "'test: barrier behind a stopped rank'") &&
                 strstr(g_report.message, "test hint"),
             "NO_ANSWER message: %s", g_report.message);
  }
}

static void test_deadlock(void) {
  const int last = g_world - 1;
  if (g_rank == 0) printf("deadlock: rank %d waits for something that never comes:\n", last);
  moe_watchdog *wd = start(1.0);
  // The last rank waits in an operation no other rank joins (a mismatched
  // collective, say), the others in a barrier it never reaches.
  if (g_rank == last) {
    wait_for_reports("test: wait", "a message that never comes", MPI_COMM_WORLD);
  } else {
    wait_for_reports("test: barrier behind a deadlock", NULL, MPI_COMM_WORLD);
  }
  moe_watchdog_stop(wd);
  TU_CHECK(atomic_load(&g_reports) >= 1 && g_report.kind == MOE_HANG_DEADLOCK,
           "rank %d: no DEADLOCK report (reports %d, kind %d: %s)", g_rank, atomic_load(&g_reports),
           (int)g_report.kind, g_report.message);
  TU_CHECK(g_report.n_suspects == 1 && g_report.suspects[0] == last &&
               strcmp(g_report.suspect_op[0], "test: wait: a message that never comes") == 0,
           "DEADLOCK suspects: %d, first %d '%s' (%s)", g_report.n_suspects, g_report.suspects[0],
           g_report.suspect_op[0], g_report.message);
  TU_CHECK(strstr(g_report.message, "others wait in 'test: barrier behind a deadlock'") != NULL,
           "DEADLOCK message: %s", g_report.message);
}

// MPI_THREAD_SERIALIZED: the thread cannot probe; the timeout alone reports.
static void test_unprobed(void) {
  moe_watchdog *wd = start(1.0);
  TU_CHECK(moe_watchdog_probing(wd) == (g_world == 1 ? -1 : 0), "probing %d",
           moe_watchdog_probing(wd));
  if (g_rank == 1) sleep_s(2.5);
  barrier("test: barrier without a probe");
  moe_watchdog_stop(wd);
  if (g_rank == 0 && g_world > 1) {
    TU_CHECK(atomic_load(&g_reports) == 1 && g_report.kind == MOE_HANG_UNPROBED &&
                 strstr(g_report.message, "MPI_THREAD_MULTIPLE") &&
                 strstr(g_report.message, "'test: barrier without a probe'"),
             "no UNPROBED report (reports %d: %s)", atomic_load(&g_reports), g_report.message);
  }
}

int main(int argc, char **argv) {
  const int serialized = argc > 1 && strcmp(argv[1], "--serialized") == 0;
  int provided = 0;
  MPI_Init_thread(NULL, NULL, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  moe_ctx_create(&g_ctx);
  setvbuf(stdout, NULL, _IOLBF, 0);
  g_pids = moe_calloc((size_t)g_world, sizeof *g_pids);
  const int pid = (int)getpid();
  int *pids = moe_calloc((size_t)g_world, sizeof *pids);
  MPI_Allgather(&pid, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < g_world; r++) g_pids[r] = (pid_t)pids[r];
  moe_free(pids);
  if (serialized) {
    TU_CHECK(provided == MPI_THREAD_SERIALIZED, "MPI gives thread level %d", provided);
    if (provided == MPI_THREAD_SERIALIZED) test_unprobed();
  } else if (provided < MPI_THREAD_MULTIPLE) {
    TU_CHECK(0, "MPI gives no MPI_THREAD_MULTIPLE (%d)", provided);
  } else {
    test_api();
    if (g_world >= 2) test_healthy();
    if (g_world >= 2) test_slow();
    if (g_world >= 2) test_stopped();
    if (g_world >= 3) test_deadlock();
  }
  moe_free(g_pids);
  moe_ctx_destroy(g_ctx);
  int failures = tu_failures, all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = 0;
  if (g_rank == 0) rc = tu_finish(serialized ? "test_watchdog --serialized" : "test_watchdog");
  MPI_Finalize();
  return all ? 1 : rc;
}
