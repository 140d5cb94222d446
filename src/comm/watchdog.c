// The hang watchdog: a rank that stops making progress ends the job within a
// bounded time, with one line naming it and the operation the others waited in,
// instead of every rank waiting forever (declared in include/moe/comm.h).
//
// Two halves:
//   - the marks: moe_watchdog_op_begin/_end claim and release one of WD_SLOTS
//     process-wide slots (operation, detail, start time, id); any thread may be
//     in an operation (the caller's, the executor's communication thread);
//   - the thread: wakes every WD_TICK_NS, answers the pings of other ranks,
//     and when this rank's oldest operation has waited timeout_s, probes the
//     others (point-to-point on the caller's communicator with a tag of its
//     own, WD_TAG: no collective call, so starting it cannot hang on a rank
//     that is stopped already) and decides:
//       1. ranks silent for grace_s: stopped or hung as a whole -> abort;
//       2. every rank waits >= timeout_s, twice grace_s apart, and no rank
//          began an operation in between -> deadlock -> abort;
//       3. otherwise some rank is busy outside communication (slow, not hung)
//          -> one warning, probe again after timeout_s.
// The probe needs MPI_THREAD_MULTIPLE (a second thread calling MPI); without it
// the timeout alone aborts.
//
// Messages are tiny (eager): a SIGSTOPped peer cannot block the thread. The
// thread never blocks in MPI: MPI_Test on a posted receive, and one outgoing
// request per peer (a peer whose previous message is still in flight gets no
// new one; it is not answering anyway).
//
// Not here: where the marks go (every file that waits on other ranks), the
// command-line option (cli/).
#define _POSIX_C_SOURCE 200809L
#include "moe_build_config.h"

#if MOE_HAVE_MPI
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "moe/comm.h"

#define WD_SLOTS 32
#define WD_TICK_NS 100000000ull  // 100 ms between looks
#define WD_TAG MOE_WATCHDOG_TAG
#define NS 1e9

// ---- the marks -------------------------------------------------------------------------------

typedef struct {
  atomic_int busy;               // claimed
  atomic_uint_fast64_t id;       // the operation's number (0: free); written last, read first
  _Atomic(const char *) op;      // what it is
  _Atomic(const char *) detail;  // more about it, or NULL
  atomic_uint_fast64_t since;    // when it began (moe_time_ns)
} wd_slot;

static wd_slot g_slot[WD_SLOTS];
static atomic_int g_on;               // marks are taken (a watchdog thread runs)
static atomic_int g_running;          // a watchdog exists (one per process)
static atomic_uint_fast64_t g_begun;  // operations begun (the progress counter)
static atomic_long g_step;
static atomic_int g_round;  // probe rounds of every watchdog of this process: an answer
                            // meant for an earlier watchdog never matches a later one

int moe_watchdog_op_begin(const char *op, const char *detail) {
  if (!atomic_load_explicit(&g_on, memory_order_relaxed)) return 0;
  const uint64_t id = atomic_fetch_add_explicit(&g_begun, 1, memory_order_relaxed) + 1;
  const uint64_t now = moe_time_ns();
  for (int i = 0; i < WD_SLOTS; i++) {
    wd_slot *s = &g_slot[i];
    int expect = 0;
    if (atomic_load_explicit(&s->busy, memory_order_relaxed) != 0 ||
        !atomic_compare_exchange_strong(&s->busy, &expect, 1))
      continue;
    atomic_store_explicit(&s->op, op, memory_order_relaxed);
    atomic_store_explicit(&s->detail, detail, memory_order_relaxed);
    atomic_store_explicit(&s->since, now, memory_order_relaxed);
    atomic_store_explicit(&s->id, id, memory_order_release);
    return i + 1;
  }
  return 0;  // every slot taken: this operation goes unwatched
}

void moe_watchdog_op_end(int token) {
  if (token <= 0 || token > WD_SLOTS) return;
  wd_slot *s = &g_slot[token - 1];
  atomic_store_explicit(&s->id, 0, memory_order_release);
  atomic_store_explicit(&s->busy, 0, memory_order_release);
}

void moe_watchdog_note_step(long step) {
  atomic_store_explicit(&g_step, step, memory_order_relaxed);
}

// This rank's oldest operation in progress (the one waiting longest).
typedef struct {
  int active;
  uint64_t id, since;
  char op[MOE_WATCHDOG_OP_LEN];
} wd_oldest;

static void oldest_op(wd_oldest *o) {
  memset(o, 0, sizeof *o);
  const char *op = NULL, *detail = NULL;
  for (int i = 0; i < WD_SLOTS; i++) {
    wd_slot *s = &g_slot[i];
    const uint64_t id = atomic_load_explicit(&s->id, memory_order_acquire);
    if (id == 0) continue;
    const char *sop = atomic_load_explicit(&s->op, memory_order_relaxed);
    const char *sdet = atomic_load_explicit(&s->detail, memory_order_relaxed);
    const uint64_t since = atomic_load_explicit(&s->since, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s->id, memory_order_relaxed) != id) continue;  // reused meanwhile
    if (!o->active || since < o->since) {
      o->active = 1;
      o->id = id;
      o->since = since;
      op = sop;
      detail = sdet;
    }
  }
  if (!o->active) return;
  if (detail) {
    snprintf(o->op, sizeof o->op, "%s: %s", op ? op : "?", detail);
  } else {
    snprintf(o->op, sizeof o->op, "%s", op ? op : "?");
  }
}

// ---- the watchdog ----------------------------------------------------------------------------

enum { MSG_PING = 1, MSG_PONG = 2 };

// One message, ping or answer (same binary on every rank: sent as bytes).
typedef struct {
  int32_t kind, round;
  int32_t waiting;  // the sender is in an operation
  int32_t pad_;
  double wait_s;   // for how long (its oldest)
  uint64_t begun;  // operations it has begun
  char op[MOE_WATCHDOG_OP_LEN];
} wd_msg;

struct moe_watchdog {
  moe_watchdog_config cfg;
  double grace_s;
  MPI_Comm comm;  // the caller's (messages tagged WD_TAG)
  int rank, size;
  int probe;  // MPI_THREAD_MULTIPLE: peers can be probed
  pthread_t thread;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;  // under mu

  // ---- the thread's own
  wd_msg in;
  MPI_Request in_req;
  wd_msg *out;           // (size) one outgoing message per peer
  MPI_Request *out_req;  // (size)
  int round;             // of this rank's probe in progress (from g_round)
  int probing;
  uint64_t probe_t0, trigger_id, next_probe;
  int *answered;      // (size) in this round
  wd_msg *answers;    // (size)
  uint64_t *begun0;   // (size) every rank's count at the first all-waiting probe
  int confirm;        // 1: the last probe found every rank waiting
  uint64_t reported;  // the operation id last reported (no repeats)
};

static void sleep_tick(moe_watchdog *wd) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)WD_TICK_NS;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&wd->mu);
  if (!wd->stop) pthread_cond_timedwait(&wd->cv, &wd->mu, &ts);
  pthread_mutex_unlock(&wd->mu);
}

static int stopping(moe_watchdog *wd) {
  pthread_mutex_lock(&wd->mu);
  const int s = wd->stop;
  pthread_mutex_unlock(&wd->mu);
  return s;
}

// Sends m to peer unless its previous message is still in flight (then the
// peer is not receiving: it gets none). Never blocks.
static void send_to(moe_watchdog *wd, int peer, const wd_msg *m) {
  if (wd->out_req[peer] != MPI_REQUEST_NULL) {
    int flag = 0;
    if (MPI_Test(&wd->out_req[peer], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) return;
  }
  wd->out[peer] = *m;
  if (MPI_Isend(&wd->out[peer], (int)sizeof *m, MPI_BYTE, peer, WD_TAG, wd->comm,
                &wd->out_req[peer]) != MPI_SUCCESS)
    wd->out_req[peer] = MPI_REQUEST_NULL;
}

static void my_state(wd_msg *m, int kind, int round) {
  wd_oldest o;
  oldest_op(&o);
  memset(m, 0, sizeof *m);
  m->kind = kind;
  m->round = round;
  m->waiting = o.active;
  m->wait_s = o.active ? (double)(moe_time_ns() - o.since) / NS : 0;
  m->begun = atomic_load_explicit(&g_begun, memory_order_relaxed);
  memcpy(m->op, o.op, sizeof m->op);
}

// Answers pings, collects answers to this rank's probe.
static void service(moe_watchdog *wd) {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Test(&wd->in_req, &flag, &status) != MPI_SUCCESS || !flag) return;
    const int from = status.MPI_SOURCE;
    const wd_msg m = wd->in;
    if (MPI_Irecv(&wd->in, (int)sizeof wd->in, MPI_BYTE, MPI_ANY_SOURCE, WD_TAG, wd->comm,
                  &wd->in_req) != MPI_SUCCESS)
      wd->in_req = MPI_REQUEST_NULL;
    if (from < 0 || from >= wd->size) continue;
    if (m.kind == MSG_PING) {
      wd_msg a;
      my_state(&a, MSG_PONG, m.round);
      send_to(wd, from, &a);
    } else if (m.kind == MSG_PONG && wd->probing && m.round == wd->round) {
      wd->answered[from] = 1;
      wd->answers[from] = m;
      wd->answers[from].op[MOE_WATCHDOG_OP_LEN - 1] = '\0';
    }
    if (wd->in_req == MPI_REQUEST_NULL) return;
  }
}

// ---- verdicts --------------------------------------------------------------------------------

static const char *kind_word(moe_hang_kind k) {
  switch (k) {
    case MOE_HANG_SLOW:
      return "slow";
    case MOE_HANG_NO_ANSWER:
      return "no answer";
    case MOE_HANG_DEADLOCK:
      return "deadlock";
    case MOE_HANG_UNPROBED:
      return "timeout";
  }
  return "?";
}

// Appends printf output to r->message.
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
say(moe_watchdog_report *r, const char *fmt, ...) {
  const size_t used = strlen(r->message);
  if (used + 1 >= sizeof r->message) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->message + used, sizeof r->message - used, fmt, ap);
  va_end(ap);
}

static void add_suspect(moe_watchdog_report *r, int rank, const char *op) {
  if (r->n_suspects < MOE_WATCHDOG_MAX_SUSPECTS) {
    r->suspects[r->n_suspects] = rank;
    snprintf(r->suspect_op[r->n_suspects], MOE_WATCHDOG_OP_LEN, "%s", op ? op : "");
  }
  r->n_suspects++;
}

// Builds the report's head: who waits in what, for how long.
static void report_head(moe_watchdog *wd, moe_watchdog_report *r, moe_hang_kind kind,
                        const wd_oldest *me) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->rank = wd->rank;
  r->size = wd->size;
  snprintf(r->op, sizeof r->op, "%s", me->op);
  r->waited_s = (double)(moe_time_ns() - me->since) / NS;
  r->step = atomic_load_explicit(&g_step, memory_order_relaxed);
  say(r, "hang watchdog (%s): rank %d of %d has waited %.1f s in '%s'", kind_word(kind), r->rank,
      r->size, r->waited_s, r->op);
  if (r->step > 0) say(r, " (step %ld)", r->step);
}

static void deliver(moe_watchdog *wd, moe_watchdog_report *r) {
  if (wd->cfg.hint && *wd->cfg.hint) say(r, "; %s", wd->cfg.hint);
  if (wd->cfg.on_hang) {
    wd->cfg.on_hang(wd->cfg.user, r);
    return;
  }
  fprintf(stderr, "moe: %s: %s\n", r->kind == MOE_HANG_SLOW ? "warning" : "error", r->message);
  fflush(stderr);
  if (r->kind != MOE_HANG_SLOW) MPI_Abort(wd->comm, 1);
}

// Lists the ranks in r's suspects: "rank 2 ('op', 4.1 s)".
static void say_suspects(moe_watchdog_report *r, const wd_msg *answers, int with_op) {
  const int n =
      r->n_suspects < MOE_WATCHDOG_MAX_SUSPECTS ? r->n_suspects : MOE_WATCHDOG_MAX_SUSPECTS;
  say(r, "%s", n > 1 ? "ranks " : "rank ");
  for (int i = 0; i < n; i++) {
    const int q = r->suspects[i];
    say(r, "%s%d", i ? ", " : "", q);
    if (with_op && answers) say(r, " ('%s', %.1f s)", answers[q].op, answers[q].wait_s);
  }
  if (r->n_suspects > n) say(r, " and %d more", r->n_suspects - n);
}

// Decides on the answers of the probe just finished.
static void evaluate(moe_watchdog *wd) {
  wd->probing = 0;
  wd_oldest me;
  oldest_op(&me);
  const uint64_t now = moe_time_ns();
  // The operation that triggered the probe has ended meanwhile: no verdict.
  if (!me.active || me.id != wd->trigger_id) {
    wd->confirm = 0;
    return;
  }
  moe_watchdog_report r;
  // 1. silent ranks
  int silent = 0;
  for (int q = 0; q < wd->size; q++) silent += !wd->answered[q];
  if (silent) {
    report_head(wd, &r, MOE_HANG_NO_ANSWER, &me);
    for (int q = 0; q < wd->size; q++)
      if (!wd->answered[q]) add_suspect(&r, q, "");
    say(&r, "; ");
    say_suspects(&r, NULL, 0);
    say(&r, " did not answer a probe within %.1f s (stopped, or hung with all its threads)%s",
        wd->grace_s, wd->cfg.on_hang ? "" : ": aborting the job");
    wd->reported = wd->trigger_id;
    wd->next_probe = now + (uint64_t)(wd->cfg.timeout_s * NS);
    deliver(wd, &r);
    return;
  }
  // 2. everyone waits (some perhaps only just: they reached the wait a moment
  // after this rank): confirm grace_s later that nobody has begun an operation
  const double T = wd->cfg.timeout_s;
  int all_wait = 1;
  for (int q = 0; q < wd->size; q++) {
    if (q == wd->rank) continue;
    all_wait &= wd->answers[q].waiting;
  }
  wd->answers[wd->rank].waiting = 1;
  wd->answers[wd->rank].wait_s = (double)(now - me.since) / NS;
  wd->answers[wd->rank].begun = atomic_load_explicit(&g_begun, memory_order_relaxed);
  memcpy(wd->answers[wd->rank].op, me.op, sizeof me.op);
  if (all_wait) {
    int same = wd->confirm;
    for (int q = 0; q < wd->size && same; q++) same = wd->begun0[q] == wd->answers[q].begun;
    if (!same) {  // first sighting: look again after the grace period
      for (int q = 0; q < wd->size; q++) wd->begun0[q] = wd->answers[q].begun;
      wd->confirm = 1;
      wd->next_probe = now + (uint64_t)(wd->grace_s * NS);
      return;
    }
    wd->confirm = 0;
    report_head(wd, &r, MOE_HANG_DEADLOCK, &me);
    // the ranks whose operation differs from the most common one
    int best = 0, best_n = 0;
    for (int q = 0; q < wd->size; q++) {
      int n = 0;
      for (int k = 0; k < wd->size; k++) n += strcmp(wd->answers[q].op, wd->answers[k].op) == 0;
      if (n > best_n) best = q, best_n = n;
    }
    for (int q = 0; q < wd->size; q++)
      if (strcmp(wd->answers[q].op, wd->answers[best].op) != 0 || best_n == 1)
        add_suspect(&r, q, wd->answers[q].op);
    say(&r, "; every rank answers, but every rank waits and none has begun an operation for %.1f s",
        wd->grace_s);
    if (r.n_suspects > 0) {
      say(&r, ": ");
      say_suspects(&r, wd->answers, 1);
      if (best_n > 1) say(&r, " waits while the others wait in '%s'", wd->answers[best].op);
    } else {
      say(&r, ", all in '%s'", wd->answers[best].op);
    }
    say(&r, "%s", wd->cfg.on_hang ? "" : ": aborting the job");
    wd->reported = wd->trigger_id;
    wd->next_probe = now + (uint64_t)(T * NS);
    deliver(wd, &r);
    return;
  }
  // 3. alive and busy somewhere: keep waiting (warn once per wait)
  wd->confirm = 0;
  wd->next_probe = now + (uint64_t)(T * NS);
  if (wd->reported == wd->trigger_id) return;
  wd->reported = wd->trigger_id;
  report_head(wd, &r, MOE_HANG_SLOW, &me);
  for (int q = 0; q < wd->size; q++)
    if (q != wd->rank && !wd->answers[q].waiting) add_suspect(&r, q, "");
  say(&r, "; every rank answers");
  if (r.n_suspects > 0) {
    say(&r, " and ");
    say_suspects(&r, NULL, 0);
    say(&r, " %s busy outside communication", r.n_suspects > 1 ? "are" : "is");
  }
  say(&r, ": still waiting (slow, not hung; checked again every %.0f s)", T);
  deliver(wd, &r);
}

// One look: answer pings, finish or start a probe.
static void check(moe_watchdog *wd) {
  const uint64_t now = moe_time_ns();
  if (wd->probing) {
    int all = 1;
    for (int q = 0; q < wd->size && all; q++) all = wd->answered[q];
    if (all || now >= wd->probe_t0 + (uint64_t)(wd->grace_s * NS)) evaluate(wd);
    return;
  }
  wd_oldest me;
  oldest_op(&me);
  if (!me.active) {
    wd->confirm = 0;
    return;
  }
  if ((double)(now - me.since) < wd->cfg.timeout_s * NS || now < wd->next_probe) return;
  if (!wd->probe) {
    if (wd->reported == me.id) return;
    moe_watchdog_report r;
    report_head(wd, &r, MOE_HANG_UNPROBED, &me);
    say(&r,
        "; MPI was not initialised with MPI_THREAD_MULTIPLE, so the other ranks cannot be "
        "probed (slow or hung: not told apart)%s",
        wd->cfg.on_hang ? "" : ": aborting the job");
    wd->reported = me.id;
    deliver(wd, &r);
    return;
  }
  if (me.id != wd->trigger_id) wd->confirm = 0;
  wd->round = atomic_fetch_add(&g_round, 1) + 1;
  wd->probing = 1;
  wd->probe_t0 = now;
  wd->trigger_id = me.id;
  wd_msg ping;
  memset(&ping, 0, sizeof ping);
  ping.kind = MSG_PING;
  ping.round = wd->round;
  for (int q = 0; q < wd->size; q++) {
    wd->answered[q] = q == wd->rank;
    if (q != wd->rank) send_to(wd, q, &ping);
  }
}

static void *watchdog_main(void *arg) {
  moe_watchdog *wd = arg;
  while (!stopping(wd)) {
    sleep_tick(wd);
    if (stopping(wd)) break;
    if (wd->probe) service(wd);
    check(wd);
  }
  return NULL;
}

// ---- lifecycle -------------------------------------------------------------------------------

int moe_watchdog_probing(const moe_watchdog *wd) {
  if (!wd || !wd->started) return -1;
  return wd->probe;
}

moe_status moe_watchdog_start(moe_ctx *ctx, MPI_Comm comm, const moe_watchdog_config *cfg,
                              moe_watchdog **out) {
  moe_status st = MOE_STATUS_OK;
  moe_watchdog *wd = NULL;
  int claimed = 0, level = MPI_THREAD_SINGLE;
  MOE_FAIL_IF(ctx, !out || !cfg, MOE_STATUS_INVALID_ARG, "watchdog: NULL argument");
  *out = NULL;
  MOE_FAIL_IF(ctx, !(cfg->timeout_s > 0) || cfg->timeout_s > 1e9, MOE_STATUS_INVALID_ARG,
              "hang timeout (%g s) must be in (0, 1e9]", cfg->timeout_s);
  MOE_FAIL_IF(ctx, !(cfg->grace_s >= 0), MOE_STATUS_INVALID_ARG,
              "hang probe grace (%g s) must be >= 0", cfg->grace_s);
  int expect = 0;
  claimed = atomic_compare_exchange_strong(&g_running, &expect, 1);
  MOE_FAIL_IF(ctx, !claimed, MOE_STATUS_INVALID_ARG,
              "a hang watchdog already runs in this process (one at a time)");
  wd = moe_calloc(1, sizeof *wd);
  MOE_FAIL_IF(ctx, !wd, MOE_STATUS_OUT_OF_MEMORY, "watchdog: out of memory");
  wd->cfg = *cfg;
  wd->comm = MPI_COMM_NULL;
  wd->in_req = MPI_REQUEST_NULL;
  double g = cfg->grace_s > 0 ? cfg->grace_s : cfg->timeout_s / 2;
  if (cfg->grace_s <= 0) g = g < 2 ? 2 : g > 30 ? 30 : g;
  wd->grace_s = g;
  MOE_MPI_TRY(ctx, MPI_Query_thread(&level));
  wd->probe = level == MPI_THREAD_MULTIPLE;
  wd->comm = comm;
  MOE_MPI_TRY(ctx, MPI_Comm_rank(wd->comm, &wd->rank));
  MOE_MPI_TRY(ctx, MPI_Comm_size(wd->comm, &wd->size));
  if (wd->size == 1) goto done;  // nobody to wait for: no thread
  const size_t P = (size_t)wd->size;
  wd->out = moe_calloc(P, sizeof *wd->out);
  wd->out_req = moe_malloc(P * sizeof *wd->out_req);
  wd->answered = moe_calloc(P, sizeof *wd->answered);
  wd->answers = moe_calloc(P, sizeof *wd->answers);
  wd->begun0 = moe_calloc(P, sizeof *wd->begun0);
  MOE_FAIL_IF(ctx, !wd->out || !wd->out_req || !wd->answered || !wd->answers || !wd->begun0,
              MOE_STATUS_OUT_OF_MEMORY, "watchdog: out of memory");
  for (size_t q = 0; q < P; q++) wd->out_req[q] = MPI_REQUEST_NULL;
  if (wd->probe)
    MOE_MPI_TRY(ctx, MPI_Irecv(&wd->in, (int)sizeof wd->in, MPI_BYTE, MPI_ANY_SOURCE, WD_TAG,
                               wd->comm, &wd->in_req));
  MOE_FAIL_IF(ctx, pthread_mutex_init(&wd->mu, NULL) != 0, MOE_STATUS_INTERNAL, "watchdog: mutex");
  if (pthread_cond_init(&wd->cv, NULL) != 0) {
    pthread_mutex_destroy(&wd->mu);
    MOE_FAIL(ctx, MOE_STATUS_INTERNAL, "watchdog: condition variable");
  }
  atomic_store(&g_on, 1);
  if (pthread_create(&wd->thread, NULL, watchdog_main, wd) != 0) {
    atomic_store(&g_on, 0);
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
    MOE_FAIL(ctx, MOE_STATUS_INTERNAL, "watchdog: cannot start its thread");
  }
  wd->started = 1;
done:
  if (st != MOE_STATUS_OK) {
    if (wd) {
      if (wd->in_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&wd->in_req);
        MPI_Wait(&wd->in_req, MPI_STATUS_IGNORE);
      }
      moe_free(wd->out);
      moe_free(wd->out_req);
      moe_free(wd->answered);
      moe_free(wd->answers);
      moe_free(wd->begun0);
      moe_free(wd);
    }
    if (claimed) atomic_store(&g_running, 0);
    return st;
  }
  *out = wd;
  return st;
}

void moe_watchdog_stop(moe_watchdog *wd) {
  if (!wd) return;
  if (wd->started) {
    pthread_mutex_lock(&wd->mu);
    wd->stop = 1;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);
    atomic_store(&g_on, 0);
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
  }
  if (wd->in_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&wd->in_req);
    MPI_Wait(&wd->in_req, MPI_STATUS_IGNORE);
  }
  // Our last answers are tiny (eager) and complete at once to a live peer;
  // one to a stopped peer may not: freed, its buffer is kept (a small leak,
  // only then).
  int leak = 0;
  for (int q = 0; wd->out_req && q < wd->size; q++) {
    const uint64_t t0 = moe_time_ns();
    int flag = wd->out_req[q] == MPI_REQUEST_NULL;
    while (!flag && moe_time_ns() - t0 < 1000000000ull) {
      if (MPI_Test(&wd->out_req[q], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
    }
    if (!flag && wd->out_req[q] != MPI_REQUEST_NULL) {
      MPI_Request_free(&wd->out_req[q]);
      leak = 1;
    }
  }
  if (!leak) moe_free(wd->out);
  moe_free(wd->out_req);
  moe_free(wd->answered);
  moe_free(wd->answers);
  moe_free(wd->begun0);
  moe_free(wd);
  atomic_store(&g_running, 0);
}
#else
// Without MPI this file has nothing to compile (ISO C wants a declaration).
typedef int moe_comm_watchdog_needs_mpi;
#endif  // MOE_HAVE_MPI
