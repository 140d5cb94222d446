// The two-stream executor: runs a validated schedule of a task graph on the
// caller's thread (compute stream) and one communication thread, and times
// every task for the profiler.
//
// Steps of a pass (moe_executor_run):
//   0. validate the schedule (each task once, on its stream, no deadlock) with
//      scratch allocated at create time;
//   1. reset the done flags and records, note t0, wake the comm thread;
//   2. each stream walks its order: wait (condition variable, no spinning)
//      until the next task's dependencies are done or the pass has failed, run
//      the task, mark it done and wake the other stream;
//   3. the caller waits for the comm thread to finish its order, then reports
//      the first failure, if any, naming the task.
// All pass state (done flags, failure) lives under one mutex; a task's record
// is written by the thread that runs it and read by the caller after the
// handshake in step 3.
//
// Split tasks (a test function): run starts them; the wait policy decides how
// the stream waits for test to say done (moe_wait_policy in moe/sched.h).
//
// Not here: schedules (which order), MPI itself (tasks bring their own calls).
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "moe/sched.h"
#include "sched/sched_internal.h"

struct moe_executor {
  moe_executor_config cfg;
  int max_tasks;
  pthread_t comm_thread;
  int thread_started;
  int sync_ready;  // mutex and condition variables initialized
  pthread_mutex_t mu;
  pthread_cond_t cv_work;   // comm thread: a pass started, or shutdown
  pthread_cond_t cv_state;  // a task finished, the pass failed, or the comm stream finished
  moe_ctx *stream_ctx[MOE_STREAM_COUNT_];  // the tasks' contexts, one per stream

  // ---- pass state, under mu
  unsigned pass_seq;
  int shutdown;
  int comm_finished;
  const moe_task_graph *graph;
  const moe_schedule *sched;
  uint64_t t0;
  unsigned char *done;  // (max_tasks)
  int failed;
  moe_status fail_status;
  int fail_task;
  // a stream is waiting for the other one (for a dependency, or at the end
  // of its order): MOE_WAIT_ADAPTIVE then blocks in the other's pending task
  int idle[MOE_STREAM_COUNT_];
  int compute_finished;  // the compute stream's order is done (or stopped)

  // ---- the background task (moe_executor_set_background): set between
  // passes; polled by the comm stream while it waits
  moe_task_test_fn bg_test;
  void *bg_arg;
  int bg_done;                    // this pass: it reported done (or failed)
  moe_executor_background bg_st;  // this pass's polls and completion

  // ---- written by the running stream, read after the pass
  moe_task_record *records;  // (max_tasks)
  int n_records;
  int *scratch;  // (2 * max_tasks) for validation
};

// ---- names and config ----------------------------------------------------------------

const char *moe_wait_policy_name(moe_wait_policy policy) {
  switch (policy) {
    case MOE_WAIT_BLOCKING:
      return "blocking";
    case MOE_WAIT_POLL_BACKOFF:
      return "poll-backoff";
    case MOE_WAIT_ADAPTIVE:
      return "adaptive";
  }
  return "unknown";
}

moe_status moe_wait_policy_parse(moe_ctx *ctx, const char *text, moe_wait_policy *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !text || !out, MOE_STATUS_INVALID_ARG, "wait policy text or output is NULL");
  if (strcmp(text, "blocking") == 0) {
    *out = MOE_WAIT_BLOCKING;
  } else if (strcmp(text, "poll-backoff") == 0) {
    *out = MOE_WAIT_POLL_BACKOFF;
  } else if (strcmp(text, "adaptive") == 0) {
    *out = MOE_WAIT_ADAPTIVE;
  } else {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "unknown wait policy '%s' (expected blocking, poll-backoff or adaptive)", text);
  }
done:
  return st;
}

moe_executor_config moe_executor_config_default(void) {
  moe_executor_config cfg;
  cfg.wait = MOE_WAIT_ADAPTIVE;
  cfg.poll_min_ns = 5000;
  cfg.poll_max_ns = 100000;
  return cfg;
}

// ---- running one task -----------------------------------------------------------------

static void sleep_ns(uint32_t ns) {
  struct timespec ts;
  ts.tv_sec = (time_t)(ns / 1000000000u);
  ts.tv_nsec = (long)(ns % 1000000000u);
  nanosleep(&ts, NULL);
}

// Whether the pass failed; *other_idle: whether the stream other than s is
// waiting for this one.
static int pass_failed(moe_executor *ex, moe_stream s, int *other_idle) {
  pthread_mutex_lock(&ex->mu);
  const int failed = ex->failed;
  *other_idle = ex->idle[s == MOE_STREAM_COMPUTE ? MOE_STREAM_COMM : MOE_STREAM_COMPUTE];
  pthread_mutex_unlock(&ex->mu);
  return failed;
}

// Runs task t to completion (or until the pass fails elsewhere while it is pending).
static moe_status run_task(moe_executor *ex, const moe_task *task, moe_ctx *ctx,
                           moe_task_record *rec) {
  moe_status st = task->run(task->arg, ctx);
  if (st != MOE_STATUS_OK || !task->test) return st;
  if (ex->cfg.wait == MOE_WAIT_BLOCKING && task->wait) return task->wait(task->arg, ctx);

  uint32_t pause = ex->cfg.poll_min_ns;
  for (;;) {
    moe_task_state state = MOE_TASK_PENDING;
    st = task->test(task->arg, ctx, &state);
    rec->polls++;
    if (st != MOE_STATUS_OK || state == MOE_TASK_DONE) return st;
    // The other stream failed: abandon the pending task (its owner cleans up).
    int other_idle = 0;
    if (pass_failed(ex, task->stream, &other_idle)) return MOE_STATUS_OK;
    if (ex->cfg.wait == MOE_WAIT_ADAPTIVE && other_idle) {
      // The other stream waits for this one, so it stays idle until this task
      // is done: nothing to slow down, and every protocol step of the
      // exchange would otherwise wait for the next poll. Block in the task
      // (or test back to back).
      if (task->wait) return task->wait(task->arg, ctx);
      continue;
    }
    if (ex->cfg.wait != MOE_WAIT_BLOCKING) {
      sleep_ns(pause);
      pause = pause > ex->cfg.poll_max_ns / 2 ? ex->cfg.poll_max_ns : 2 * pause;
    }
  }
}

static int deps_done(const moe_executor *ex, const moe_task_graph *graph, int t) {
  const moe_task *task = &graph->tasks[t];
  const int *deps = graph->deps + task->dep_offset;
  for (int d = 0; d < task->n_deps; d++) {
    if (!ex->done[deps[d]]) return 0;
  }
  return 1;
}

// One poll of the background task, from the comm stream with ex->mu held
// (released around the call). A failure is reported once (it does not fail
// the pass: the task's owner sees it when it completes the work itself).
static void poll_background(moe_executor *ex, moe_ctx *ctx) {
  pthread_mutex_unlock(&ex->mu);
  moe_task_state state = MOE_TASK_PENDING;
  const moe_status st = ex->bg_test(ex->bg_arg, ctx, &state);
  const uint64_t now = moe_time_ns() - ex->t0;
  pthread_mutex_lock(&ex->mu);
  ex->bg_st.polls++;
  if (st != MOE_STATUS_OK || state == MOE_TASK_DONE) {
    ex->bg_done = 1;
    ex->bg_st.done = st == MOE_STATUS_OK;
    ex->bg_st.failed = st != MOE_STATUS_OK;
    ex->bg_st.done_ns = now;
    moe_ctx_clear_error(ctx);
  }
}

// The comm stream waits (ex->mu held) until `ready` holds or the pass
// failed: on the condition variable, or, while a background task is
// pending, polling it with back-off sleeps (at most 20 us, so the stream's
// next task starts late by no more than that).
static void comm_wait(moe_executor *ex, int (*ready)(const moe_executor *, int), int t) {
  moe_ctx *ctx = ex->stream_ctx[MOE_STREAM_COMM];
  uint32_t pause = ex->cfg.poll_min_ns;
  const uint32_t cap = ex->cfg.poll_max_ns < 20000 ? ex->cfg.poll_max_ns : 20000;
  while (!ex->failed && !ready(ex, t)) {
    if (!ex->bg_test || ex->bg_done) {
      pthread_cond_wait(&ex->cv_state, &ex->mu);
      continue;
    }
    poll_background(ex, ctx);
    if (ex->bg_done || ex->failed || ready(ex, t)) continue;
    pthread_mutex_unlock(&ex->mu);
    sleep_ns(pause);
    pause = pause > cap / 2 ? cap : 2 * pause;
    pthread_mutex_lock(&ex->mu);
  }
}

static int deps_ready(const moe_executor *ex, int t) { return deps_done(ex, ex->graph, t); }
static int compute_over(const moe_executor *ex, int t) {
  (void)t;
  return ex->compute_finished;
}

// Walks the order of stream s; returns when it is done or the pass failed.
static void run_stream(moe_executor *ex, moe_stream s) {
  const moe_task_graph *graph = ex->graph;
  const moe_schedule *sched = ex->sched;
  moe_ctx *ctx = ex->stream_ctx[s];
  for (int p = 0; p < sched->len[s]; p++) {
    const int t = sched->order[s][p];
    const moe_task *task = &graph->tasks[t];
    moe_task_record *rec = &ex->records[t];

    // 1. wait for the dependencies (the other stream signals each completion)
    pthread_mutex_lock(&ex->mu);
    ex->idle[s] = 1;
    if (s == MOE_STREAM_COMM) {
      comm_wait(ex, deps_ready, t);
    } else {
      while (!ex->failed && !deps_done(ex, graph, t)) pthread_cond_wait(&ex->cv_state, &ex->mu);
    }
    ex->idle[s] = 0;
    const int failed = ex->failed;
    pthread_mutex_unlock(&ex->mu);
    if (failed) return;

    // 2. run it
    rec->start_ns = moe_time_ns() - ex->t0;
    moe_status st = run_task(ex, task, ctx, rec);
    rec->end_ns = moe_time_ns() - ex->t0;

    // 3. publish the outcome
    pthread_mutex_lock(&ex->mu);
    int stop = ex->failed;
    if (st != MOE_STATUS_OK) {
      if (!ex->failed) {
        ex->failed = 1;
        ex->fail_status = st;
        ex->fail_task = t;
      }
      stop = 1;
    } else if (!stop) {
      ex->done[t] = 1;
      rec->ran = 1;
    }
    pthread_cond_broadcast(&ex->cv_state);
    pthread_mutex_unlock(&ex->mu);
    if (stop) return;
  }
}

static void *comm_thread_main(void *arg) {
  moe_executor *ex = arg;
#if defined(__linux__) && defined(PR_SET_TIMERSLACK)
  // Back-off sleeps of 5 us would otherwise last the default 50 us slack.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
  // pass_seq is 0 when the thread is created; reading it here instead would
  // miss a pass started before this thread first runs.
  unsigned seen = 0;
  pthread_mutex_lock(&ex->mu);
  for (;;) {
    while (!ex->shutdown && ex->pass_seq == seen) pthread_cond_wait(&ex->cv_work, &ex->mu);
    if (ex->shutdown) break;
    seen = ex->pass_seq;
    pthread_mutex_unlock(&ex->mu);
    run_stream(ex, MOE_STREAM_COMM);
    pthread_mutex_lock(&ex->mu);
    // its order done, the comm stream keeps polling a pending background
    // task while the compute stream works
    ex->idle[MOE_STREAM_COMM] = 1;
    if (ex->bg_test) comm_wait(ex, compute_over, 0);
    ex->comm_finished = 1;
    ex->idle[MOE_STREAM_COMM] = 1;
    pthread_cond_broadcast(&ex->cv_state);
  }
  pthread_mutex_unlock(&ex->mu);
  return NULL;
}

// ---- lifecycle ------------------------------------------------------------------------

moe_status moe_executor_create(moe_ctx *ctx, const moe_executor_config *config, int max_tasks,
                               moe_executor **out) {
  moe_status st = MOE_STATUS_OK;
  moe_executor *ex = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "executor output is NULL");
  *out = NULL;
  const moe_executor_config cfg = config ? *config : moe_executor_config_default();
  MOE_FAIL_IF(ctx,
              cfg.wait != MOE_WAIT_BLOCKING && cfg.wait != MOE_WAIT_POLL_BACKOFF &&
                  cfg.wait != MOE_WAIT_ADAPTIVE,
              MOE_STATUS_INVALID_ARG, "executor: unknown wait policy %d", (int)cfg.wait);
  MOE_FAIL_IF(
      ctx,
      cfg.poll_min_ns == 0 || cfg.poll_min_ns > cfg.poll_max_ns || cfg.poll_max_ns >= 1000000000u,
      MOE_STATUS_INVALID_ARG,
      "executor: poll back-off (%u ns .. %u ns) must satisfy 0 < min <= max < 1 s",
      (unsigned)cfg.poll_min_ns, (unsigned)cfg.poll_max_ns);
  MOE_FAIL_IF(ctx, max_tasks < 1, MOE_STATUS_INVALID_ARG,
              "executor: capacity (%d tasks) must be at least 1", max_tasks);

  ex = moe_calloc(1, sizeof(*ex));
  MOE_FAIL_IF(ctx, !ex, MOE_STATUS_OUT_OF_MEMORY, "executor: cannot allocate");
  ex->cfg = cfg;
  ex->max_tasks = max_tasks;
  ex->done = moe_calloc((size_t)max_tasks, 1);
  ex->records = moe_calloc((size_t)max_tasks, sizeof(moe_task_record));
  ex->scratch = moe_calloc(2 * (size_t)max_tasks, sizeof(int));
  MOE_FAIL_IF(ctx, !ex->done || !ex->records || !ex->scratch, MOE_STATUS_OUT_OF_MEMORY,
              "executor: cannot allocate state for %d tasks", max_tasks);
  for (int s = 0; s < MOE_STREAM_COUNT_; s++) MOE_TRY(moe_ctx_create(&ex->stream_ctx[s]));

  MOE_FAIL_IF(ctx, pthread_mutex_init(&ex->mu, NULL) != 0, MOE_STATUS_INTERNAL,
              "executor: pthread_mutex_init failed");
  if (pthread_cond_init(&ex->cv_work, NULL) != 0) {
    pthread_mutex_destroy(&ex->mu);
    MOE_FAIL(ctx, MOE_STATUS_INTERNAL, "executor: pthread_cond_init failed");
  }
  if (pthread_cond_init(&ex->cv_state, NULL) != 0) {
    pthread_cond_destroy(&ex->cv_work);
    pthread_mutex_destroy(&ex->mu);
    MOE_FAIL(ctx, MOE_STATUS_INTERNAL, "executor: pthread_cond_init failed");
  }
  ex->sync_ready = 1;
  MOE_FAIL_IF(ctx, pthread_create(&ex->comm_thread, NULL, comm_thread_main, ex) != 0,
              MOE_STATUS_INTERNAL, "executor: cannot start the communication thread");
  ex->thread_started = 1;
  *out = ex;
  ex = NULL;
done:
  moe_executor_destroy(ex);
  return st;
}

void moe_executor_destroy(moe_executor *ex) {
  if (!ex) return;
  if (ex->thread_started) {
    pthread_mutex_lock(&ex->mu);
    ex->shutdown = 1;
    pthread_cond_broadcast(&ex->cv_work);
    pthread_mutex_unlock(&ex->mu);
    pthread_join(ex->comm_thread, NULL);
  }
  if (ex->sync_ready) {
    pthread_cond_destroy(&ex->cv_state);
    pthread_cond_destroy(&ex->cv_work);
    pthread_mutex_destroy(&ex->mu);
  }
  for (int s = 0; s < MOE_STREAM_COUNT_; s++) moe_ctx_destroy(ex->stream_ctx[s]);
  moe_free(ex->done);
  moe_free(ex->records);
  moe_free(ex->scratch);
  moe_free(ex);
}

// ---- a pass ----------------------------------------------------------------------------

moe_status moe_executor_run(moe_executor *ex, const moe_task_graph *graph,
                            const moe_schedule *sched, moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !ex || !graph || !sched, MOE_STATUS_INVALID_ARG,
              "executor, graph or schedule is NULL");
  const int n = graph->n_tasks;
  MOE_FAIL_IF(ctx, n > ex->max_tasks, MOE_STATUS_INVALID_ARG,
              "executor: graph has %d tasks, more than its capacity (%d)", n, ex->max_tasks);
  ex->n_records = 0;
  MOE_TRY(moe_sched_validate_scratch_(ctx, graph, sched, ex->scratch));

  // 1. reset and start the comm stream
  memset(ex->records, 0, (size_t)n * sizeof(moe_task_record));
  for (int i = 0; i < n; i++) ex->records[i].stream = graph->tasks[i].stream;
  for (int s = 0; s < MOE_STREAM_COUNT_; s++) moe_ctx_clear_error(ex->stream_ctx[s]);
  pthread_mutex_lock(&ex->mu);
  memset(ex->done, 0, (size_t)n);
  ex->failed = 0;
  ex->fail_status = MOE_STATUS_OK;
  ex->fail_task = -1;
  ex->comm_finished = 0;
  ex->compute_finished = 0;
  ex->bg_done = 0;
  memset(&ex->bg_st, 0, sizeof ex->bg_st);
  memset(ex->idle, 0, sizeof ex->idle);
  ex->graph = graph;
  ex->sched = sched;
  ex->t0 = moe_time_ns();
  ex->pass_seq++;
  pthread_cond_broadcast(&ex->cv_work);
  pthread_mutex_unlock(&ex->mu);

  // 2. the compute stream runs here
  run_stream(ex, MOE_STREAM_COMPUTE);

  // 3. wait for the comm stream
  pthread_mutex_lock(&ex->mu);
  ex->idle[MOE_STREAM_COMPUTE] = 1;
  ex->compute_finished = 1;
  pthread_cond_broadcast(&ex->cv_state);
  while (!ex->comm_finished) pthread_cond_wait(&ex->cv_state, &ex->mu);
  const int failed = ex->failed;
  const moe_status fail_status = ex->fail_status;
  const int t = ex->fail_task;
  pthread_mutex_unlock(&ex->mu);
  ex->n_records = n;
  if (failed) {
    const moe_task *task = &graph->tasks[t];
    const char *msg = moe_ctx_error(ex->stream_ctx[task->stream]);
    MOE_FAIL(ctx, fail_status, "task '%s' (#%d, %s stream, chunk %d) failed: %s", task->name, t,
             moe_stream_name(task->stream), task->chunk,
             msg[0] ? msg : moe_status_str(fail_status));
  }
done:
  return st;
}

void moe_executor_set_background(moe_executor *ex, moe_task_test_fn test, void *arg) {
  if (!ex) return;
  pthread_mutex_lock(&ex->mu);
  ex->bg_test = test;
  ex->bg_arg = test ? arg : NULL;
  pthread_mutex_unlock(&ex->mu);
}

int moe_executor_pass_failed(moe_executor *ex) {
  if (!ex) return 0;
  pthread_mutex_lock(&ex->mu);
  const int failed = ex->failed;
  pthread_mutex_unlock(&ex->mu);
  return failed;
}

uint64_t moe_executor_pass_start_ns(const moe_executor *ex) { return ex ? ex->t0 : 0; }

moe_executor_background moe_executor_background_stats(const moe_executor *ex) {
  moe_executor_background b;
  memset(&b, 0, sizeof b);
  if (ex) b = ex->bg_st;
  return b;
}

// ---- profiler ----------------------------------------------------------------------------

const moe_task_record *moe_executor_records(const moe_executor *ex, int *n) {
  if (!ex || ex->n_records == 0) {
    if (n) *n = 0;
    return NULL;
  }
  if (n) *n = ex->n_records;
  return ex->records;
}

void moe_pass_breakdown_compute(const moe_task_record *records, int n, moe_pass_breakdown *out) {
  memset(out, 0, sizeof(*out));
  for (int i = 0; i < n; i++) {
    const moe_task_record *a = &records[i];
    if (!a->ran) continue;
    const uint64_t len = a->end_ns - a->start_ns;
    if (a->end_ns > out->total_ns) out->total_ns = a->end_ns;
    if (a->stream == MOE_STREAM_COMPUTE) {
      out->compute_ns += len;
      continue;
    }
    out->comm_ns += len;
    // Compute tasks never overlap one another, so the pairwise intersections
    // add up to the time this comm task shares with the compute stream.
    for (int j = 0; j < n; j++) {
      const moe_task_record *b = &records[j];
      if (!b->ran || b->stream != MOE_STREAM_COMPUTE) continue;
      const uint64_t lo = a->start_ns > b->start_ns ? a->start_ns : b->start_ns;
      const uint64_t hi = a->end_ns < b->end_ns ? a->end_ns : b->end_ns;
      if (hi > lo) out->overlap_ns += hi - lo;
    }
  }
  out->exposed_comm_ns = out->comm_ns - out->overlap_ns;
}

void moe_executor_breakdown(const moe_executor *ex, moe_pass_breakdown *out) {
  int n = 0;
  const moe_task_record *rec = moe_executor_records(ex, &n);
  moe_pass_breakdown_compute(rec, n, out);
}
