// Gradient buckets summed over ranks while the backward still runs (moe_grad_reducer
// in comm.h): the data-parallel half of issue 15 (Lina's training scheduler builds
// on it; DDP's and Megatron's overlapped gradient reduction do the same).
//
// Layout: the tensors, in the order their gradients become final, are packed
// back to back in one buffer; a bucket is a run of whole tensors of at least
// bucket_bytes (the last one may be smaller), so a bucket is one slice of the
// buffer. Each bucket is reduced in micro-ops of at most micro_op_bytes (never
// across two buckets), one at a time, in bucket order on every rank, on a
// communicator of its own (a duplicate of the caller's), so the reducer's
// messages never meet the caller's.
//
// The thread: it waits (condition variable) until the next bucket's tensors
// are all marked ready, then reduces it with non-blocking MPI calls that it
// tests with back-off sleeps (5 us doubling to 50 us), so it does not take a
// core from the backward it overlaps. finish waits for the last bucket, then
// copies the sums back into the tensors.
//
// The sums: deterministic, the binomial tree of moe_allreduce_fixed (rank r
// adds rank r + d's partial sum after its own) then a broadcast from rank 0, on
// each element independently, so the bits equal one moe_allreduce_fixed call on
// the whole packed buffer whatever the buckets and micro-ops. Otherwise
// MPI_Iallreduce per micro-op: MPI chooses the order, which may differ from
// one MPI_Allreduce of the whole buffer in the last bits.
#define _POSIX_C_SOURCE 200809L
#include "moe_build_config.h"

#if MOE_HAVE_MPI
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "moe/comm.h"
#include "moe/core.h"
#include "moe/kernels.h"

#define GR_TAG 43
#define GR_POLL_MIN_NS 5000u
#define GR_POLL_MAX_NS 50000u
// MPI counts are int; a micro-op never exceeds this many floats.
#define GR_MAX_OP ((size_t)1 << 28)

struct moe_grad_reducer {
  moe_grad_reducer_config cfg;
  MPI_Comm comm;  // a duplicate of the caller's: the reducer's messages only
  int rank, size;
  int n;                 // tensors
  float **grads;         // (n) the caller's gradient tensors
  size_t *numel, *off;   // (n) their sizes and offsets in buf
  int *bucket_of;        // (n) the bucket of each tensor
  int n_buckets;         //
  size_t *b_first;       // (n_buckets + 1) buckets' first floats in buf; [n_buckets] = total
  int *b_tensors;        // (n_buckets) tensors per bucket
  size_t total, op_max;  // floats in buf; floats per micro-op
  float *buf;            // (total) the packed gradients
  float *tmp;            // (largest micro-op) deterministic, receiving ranks: a partner's sum

  // ---- step state, under mu
  pthread_mutex_t mu;
  pthread_cond_t cv_ready;  // thread: a tensor became ready, or shutdown
  pthread_cond_t cv_done;   // caller: a bucket finished, or the thread failed
  int *pending;             // (n_buckets) tensors not yet marked this step
  unsigned char *marked;    // (n) marked this step
  int next;                 // the bucket the thread reduces next (n_buckets: all done)
  int shutdown;
  moe_status fail;  // the thread's first failure (then it reduces nothing more)
  char fail_msg[512];
  uint64_t t0;  // the step's first mark
  int thread_started, sync_ready;
  pthread_t thread;
  moe_ctx *tctx;  // the thread's context (its MPI errors)

  // ---- the last step's micro-ops (written by the reducing thread; read after finish)
  moe_grad_op_record *rec;  // (rec_cap)
  int rec_cap, rec_n;
  double finish_wait_ms;
};

static void sleep_ns(uint32_t ns) {
  const struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  nanosleep(&ts, NULL);
}

// Completes req by testing it with back-off sleeps.
static moe_status wait_req(moe_ctx *ctx, MPI_Request *req) {
  moe_status st = MOE_STATUS_OK;
  uint32_t pause = GR_POLL_MIN_NS;
  for (;;) {
    int flag = 0;
    MOE_MPI_TRY(ctx, MPI_Test(req, &flag, MPI_STATUS_IGNORE));
    if (flag) break;
    sleep_ns(pause);
    pause = pause >= GR_POLL_MAX_NS / 2 ? GR_POLL_MAX_NS : 2 * pause;
  }
done:
  return st;
}

// Sums x (c floats, c <= GR_MAX_OP) over the ranks, in place.
static moe_status reduce_op(moe_grad_reducer *r, moe_ctx *ctx, float *x, size_t c) {
  moe_status st = MOE_STATUS_OK;
  MPI_Request req = MPI_REQUEST_NULL;
  if (!r->cfg.deterministic) {
    MOE_MPI_TRY(ctx, MPI_Iallreduce(MPI_IN_PLACE, x, (int)c, MPI_FLOAT, MPI_SUM, r->comm, &req));
    MOE_TRY(wait_req(ctx, &req));
    goto done;
  }
  // moe_allreduce_fixed's tree: at distance d, rank r (a multiple of 2d) adds
  // rank r + d's partial sum after its own
  for (int d = 1; d < r->size; d *= 2) {
    if (r->rank % (2 * d) == 0) {
      if (r->rank + d < r->size) {
        MOE_MPI_TRY(ctx, MPI_Irecv(r->tmp, (int)c, MPI_FLOAT, r->rank + d, GR_TAG, r->comm, &req));
        MOE_TRY(wait_req(ctx, &req));
        moe_add_inplace(x, r->tmp, c);
      }
    } else {
      MOE_MPI_TRY(ctx, MPI_Isend(x, (int)c, MPI_FLOAT, r->rank - d, GR_TAG, r->comm, &req));
      MOE_TRY(wait_req(ctx, &req));
      break;
    }
  }
  MOE_MPI_TRY(ctx, MPI_Ibcast(x, (int)c, MPI_FLOAT, 0, r->comm, &req));
  MOE_TRY(wait_req(ctx, &req));
done:
  return st;
}

// Reduces bucket b in micro-ops, recording each.
static moe_status reduce_bucket(moe_grad_reducer *r, moe_ctx *ctx, int b) {
  moe_status st = MOE_STATUS_OK;
  const size_t end = r->b_first[b + 1];
  for (size_t i = r->b_first[b]; i < end;) {
    const size_t c = end - i < r->op_max ? end - i : r->op_max;
    const uint64_t t_start = moe_time_ns();
    MOE_TRY(reduce_op(r, ctx, r->buf + i, c));
    if (r->rec_n < r->rec_cap) {
      moe_grad_op_record *q = &r->rec[r->rec_n++];
      q->bucket = b;
      q->first = i;
      q->count = c;
      q->start_ns = t_start - r->t0;
      q->end_ns = moe_time_ns() - r->t0;
    }
    i += c;
  }
done:
  return st;
}

// The thread: bucket after bucket, each once all its tensors are marked.
static void *reducer_main(void *arg) {
  moe_grad_reducer *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->shutdown && (r->next >= r->n_buckets || r->pending[r->next] > 0 || r->fail))
      pthread_cond_wait(&r->cv_ready, &r->mu);
    if (r->shutdown) break;
    const int b = r->next;
    pthread_mutex_unlock(&r->mu);
    const moe_status st = reduce_bucket(r, r->tctx, b);
    pthread_mutex_lock(&r->mu);
    if (st != MOE_STATUS_OK) {
      r->fail = st;
      snprintf(r->fail_msg, sizeof r->fail_msg, "%s", moe_ctx_error(r->tctx));
    } else {
      r->next = b + 1;
    }
    pthread_cond_broadcast(&r->cv_done);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

void moe_grad_reducer_config_default(moe_grad_reducer_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->bucket_bytes = (size_t)25 << 20;
  cfg->deterministic = 1;
  cfg->overlap = 1;
}

void moe_grad_reducer_destroy(moe_grad_reducer *r) {
  if (!r) return;
  if (r->thread_started) {
    pthread_mutex_lock(&r->mu);
    r->shutdown = 1;
    pthread_cond_broadcast(&r->cv_ready);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
  }
  if (r->sync_ready) {
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv_ready);
    pthread_cond_destroy(&r->cv_done);
  }
  if (r->comm != MPI_COMM_NULL) MPI_Comm_free(&r->comm);
  moe_ctx_destroy(r->tctx);
  moe_free(r->grads);
  moe_free(r->numel);
  moe_free(r->off);
  moe_free(r->bucket_of);
  moe_free(r->b_first);
  moe_free(r->b_tensors);
  moe_free(r->pending);
  moe_free(r->marked);
  moe_free(r->buf);
  moe_free(r->tmp);
  moe_free(r->rec);
  moe_free(r);
}

// Resets the step state (mu held or no thread yet).
static void reset_step(moe_grad_reducer *r) {
  for (int b = 0; b < r->n_buckets; b++) r->pending[b] = r->b_tensors[b];
  memset(r->marked, 0, (size_t)r->n);
  r->next = 0;
  r->t0 = 0;
}

moe_status moe_grad_reducer_create(moe_ctx *ctx, MPI_Comm comm, int n, float *const *grads,
                                   const size_t *numel, const moe_grad_reducer_config *config,
                                   moe_grad_reducer **out) {
  moe_status st = MOE_STATUS_OK, mine = MOE_STATUS_OK;
  moe_grad_reducer *r = NULL;
  moe_grad_reducer_config cfg;
  if (config) {
    cfg = *config;
  } else {
    moe_grad_reducer_config_default(&cfg);
  }
  MOE_FAIL_IF(ctx, !out || n < 0 || (n > 0 && (!grads || !numel)), MOE_STATUS_INVALID_ARG,
              "gradient reducer: out, grads and numel must not be NULL and n (%d) >= 0", n);
  *out = NULL;
  r = moe_calloc(1, sizeof *r);
  MOE_FAIL_IF(ctx, !r, MOE_STATUS_OUT_OF_MEMORY, "gradient reducer: out of memory");
  r->comm = MPI_COMM_NULL;
  r->cfg = cfg;
  r->n = n;
  MPI_Comm_rank(comm, &r->rank);
  MPI_Comm_size(comm, &r->size);

  // step 1: what the ranks must agree on: the tensor count and sizes, the
  // options (a hash of them; max and min of it) and, to overlap, the thread level
  uint64_t h = 1469598103934665603ull;
#define MIX(v)             \
  do {                     \
    h ^= (uint64_t)(v);    \
    h *= 1099511628211ull; \
  } while (0)
  MIX(n);
  for (int i = 0; i < n; i++) MIX(numel[i]);
  MIX(cfg.bucket_bytes);
  MIX(cfg.micro_op_bytes);
  MIX(cfg.deterministic);
  MIX(cfg.overlap);
#undef MIX
  unsigned long long ext[2] = {(unsigned long long)h, ~(unsigned long long)h};
  MOE_MPI_TRY_OP(ctx, "agreement: gradient buckets",
                 MPI_Allreduce(MPI_IN_PLACE, ext, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm));
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (ext[0] != ~ext[1]) {
    mine = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                        "gradient reducer: the ranks pass different tensors or options; every "
                        "rank must pass the same");
  } else if (cfg.overlap && r->size > 1 && level < MPI_THREAD_MULTIPLE) {
    mine = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                        "gradient reducer: overlapping the backward needs MPI_THREAD_MULTIPLE "
                        "(MPI_Init_thread gave level %d); reduce after the backward instead",
                        level);
  }
  MOE_TRY(moe_comm_agree(ctx, comm, mine, "gradient buckets"));

  // step 2: the layout
  r->grads = moe_calloc((size_t)(n ? n : 1), sizeof *r->grads);
  r->numel = moe_calloc((size_t)(n ? n : 1), sizeof *r->numel);
  r->off = moe_calloc((size_t)(n ? n : 1), sizeof *r->off);
  r->bucket_of = moe_calloc((size_t)(n ? n : 1), sizeof *r->bucket_of);
  r->b_first = moe_calloc((size_t)n + 1, sizeof *r->b_first);
  r->b_tensors = moe_calloc((size_t)n + 1, sizeof *r->b_tensors);  // [n_buckets] may be read
  r->pending = moe_calloc((size_t)n + 1, sizeof *r->pending);
  r->marked = moe_calloc((size_t)(n ? n : 1), 1);
  mine = r->grads && r->numel && r->off && r->bucket_of && r->b_first && r->b_tensors &&
                 r->pending && r->marked
             ? MOE_STATUS_OK
             : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                            "gradient reducer: out of memory");
  if (mine == MOE_STATUS_OK) {
    const size_t bucket_floats = cfg.bucket_bytes / sizeof(float);
    size_t in_bucket = 0;
    for (int i = 0; i < n; i++) {
      r->grads[i] = grads[i];
      r->numel[i] = numel[i];
      r->off[i] = r->total;
      if (in_bucket == 0) r->b_first[r->n_buckets] = r->total;
      r->bucket_of[i] = r->n_buckets;
      r->b_tensors[r->n_buckets]++;
      r->total += numel[i];
      in_bucket += numel[i];
      if (bucket_floats > 0 && in_bucket >= bucket_floats) {  // the bucket closes
        r->n_buckets++;
        in_bucket = 0;
      }
    }
    if (in_bucket > 0 || (n > 0 && r->b_tensors[r->n_buckets] > 0)) r->n_buckets++;
    r->b_first[r->n_buckets] = r->total;
    size_t largest = 0;
    for (int b = 0; b < r->n_buckets; b++)
      if (r->b_first[b + 1] - r->b_first[b] > largest) largest = r->b_first[b + 1] - r->b_first[b];
    r->op_max = cfg.micro_op_bytes / sizeof(float);
    if (r->op_max == 0 || r->op_max > GR_MAX_OP) r->op_max = GR_MAX_OP;
    const size_t op_floats = largest < r->op_max ? largest : r->op_max;
    r->buf = moe_malloc((r->total ? r->total : 1) * sizeof(float));
    const int receives = cfg.deterministic && r->rank % 2 == 0 && r->rank + 1 < r->size;
    if (receives) r->tmp = moe_malloc((op_floats ? op_floats : 1) * sizeof(float));
    size_t ops = 0;
    for (int b = 0; b < r->n_buckets; b++)
      ops += (r->b_first[b + 1] - r->b_first[b] + r->op_max - 1) / r->op_max;
    r->rec_cap = (int)(ops < 1000000 ? ops : 1000000);
    r->rec = moe_calloc((size_t)(r->rec_cap ? r->rec_cap : 1), sizeof *r->rec);
    if (!r->buf || (receives && !r->tmp) || !r->rec)
      mine = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                          "gradient reducer: out of memory (%zu floats)", r->total);
  }
  if (mine == MOE_STATUS_OK && moe_ctx_create(&r->tctx) != MOE_STATUS_OK)
    mine = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                        "gradient reducer: out of memory");
  if (mine == MOE_STATUS_OK) {
    const int rc = MPI_Comm_dup(comm, &r->comm);
    if (rc != MPI_SUCCESS) {
      r->comm = MPI_COMM_NULL;
      mine = moe_mpi_error(ctx, rc, "MPI_Comm_dup", __FILE__, __LINE__);
    }
  }
  MOE_TRY(moe_comm_agree(ctx, comm, mine, "gradient buckets"));
  reset_step(r);

  // step 3: the thread (only when it has something to overlap)
  if (cfg.overlap && r->size > 1 && r->total > 0) {
    mine = MOE_STATUS_OK;
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
      mine = moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__,
                          "gradient reducer: cannot create a mutex");
    } else if (pthread_cond_init(&r->cv_ready, NULL) != 0) {
      pthread_mutex_destroy(&r->mu);
      mine = moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__,
                          "gradient reducer: cannot create a condition variable");
    } else if (pthread_cond_init(&r->cv_done, NULL) != 0) {
      pthread_cond_destroy(&r->cv_ready);
      pthread_mutex_destroy(&r->mu);
      mine = moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__,
                          "gradient reducer: cannot create a condition variable");
    } else {
      r->sync_ready = 1;
      if (pthread_create(&r->thread, NULL, reducer_main, r) == 0)
        r->thread_started = 1;
      else
        mine = moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__,
                            "gradient reducer: cannot start its thread");
    }
    MOE_TRY(moe_comm_agree(ctx, comm, mine, "gradient buckets"));
  }
  *out = r;
  r = NULL;
done:
  moe_grad_reducer_destroy(r);
  return st;
}

int moe_grad_reducer_buckets(const moe_grad_reducer *r) { return r ? r->n_buckets : 0; }

int moe_grad_reducer_done(moe_grad_reducer *r) {
  if (!r) return 0;
  if (!r->thread_started) return r->next;
  pthread_mutex_lock(&r->mu);
  const int done = r->next;
  pthread_mutex_unlock(&r->mu);
  return done;
}

void moe_grad_reducer_bucket(const moe_grad_reducer *r, int b, size_t *first, size_t *count,
                             int *tensors) {
  const int ok = r && b >= 0 && b < r->n_buckets;
  if (first) *first = ok ? r->b_first[b] : 0;
  if (count) *count = ok ? r->b_first[b + 1] - r->b_first[b] : 0;
  if (tensors) *tensors = ok ? r->b_tensors[b] : 0;
}

moe_status moe_grad_reducer_ready(moe_grad_reducer *r, moe_ctx *ctx, int i) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !r || i < 0 || i >= r->n, MOE_STATUS_INVALID_ARG,
              "gradient reducer: tensor %d out of range [0, %d)", i, r ? r->n : 0);
  if (r->thread_started) pthread_mutex_lock(&r->mu);
  const int again = r->marked[i];
  if (!again) {
    if (r->t0 == 0) {  // the step's first mark: the last step's records go
      r->t0 = moe_time_ns();
      r->rec_n = 0;
    }
    r->marked[i] = 1;
  }
  if (r->thread_started) pthread_mutex_unlock(&r->mu);
  MOE_FAIL_IF(ctx, again, MOE_STATUS_INVALID_ARG,
              "gradient reducer: tensor %d marked ready twice in one step", i);
  // the copy outside the lock: the thread touches this slice only after the
  // bucket's last tensor is marked
  memcpy(r->buf + r->off[i], r->grads[i], r->numel[i] * sizeof(float));
  if (r->thread_started) {
    pthread_mutex_lock(&r->mu);
    if (--r->pending[r->bucket_of[i]] == 0) pthread_cond_broadcast(&r->cv_ready);
    pthread_mutex_unlock(&r->mu);
  } else {
    r->pending[r->bucket_of[i]]--;
  }
done:
  return st;
}

moe_status moe_grad_reducer_finish(moe_grad_reducer *r, moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !r, MOE_STATUS_INVALID_ARG, "gradient reducer must not be NULL");
  for (int i = 0; i < r->n; i++) {  // tensors nobody marked: marked now, in order
    int marked;
    if (r->thread_started) pthread_mutex_lock(&r->mu);
    marked = r->marked[i];
    if (r->thread_started) pthread_mutex_unlock(&r->mu);
    if (!marked) MOE_TRY(moe_grad_reducer_ready(r, ctx, i));
  }
  const uint64_t w0 = moe_time_ns();
  if (r->size > 1 && r->total > 0) {
    if (r->thread_started) {
      const int token = moe_watchdog_op_begin("all-reduce of the gradient buckets", NULL);
      pthread_mutex_lock(&r->mu);
      while (!r->fail && r->next < r->n_buckets) pthread_cond_wait(&r->cv_done, &r->mu);
      const moe_status fail = r->fail;
      pthread_mutex_unlock(&r->mu);
      moe_watchdog_op_end(token);
      MOE_FAIL_IF(ctx, fail != MOE_STATUS_OK, fail, "all-reduce of the gradient buckets: %s",
                  r->fail_msg);
    } else {
      const int token = moe_watchdog_op_begin("all-reduce of the gradient buckets", NULL);
      for (int b = 0; b < r->n_buckets && st == MOE_STATUS_OK; b++) st = reduce_bucket(r, ctx, b);
      moe_watchdog_op_end(token);
      if (st != MOE_STATUS_OK) goto done;
    }
  }
  r->finish_wait_ms = (double)(moe_time_ns() - w0) / 1e6;
  for (int i = 0; i < r->n; i++)
    memcpy(r->grads[i], r->buf + r->off[i], r->numel[i] * sizeof(float));
  if (r->thread_started) pthread_mutex_lock(&r->mu);
  reset_step(r);  // the records stay readable until the next step's first mark
  if (r->thread_started) pthread_mutex_unlock(&r->mu);
done:
  return st;
}

const moe_grad_op_record *moe_grad_reducer_records(const moe_grad_reducer *r, int *n) {
  if (n) *n = r ? r->rec_n : 0;
  return r ? r->rec : NULL;
}

double moe_grad_reducer_wait_ms(const moe_grad_reducer *r) { return r ? r->finish_wait_ms : 0; }

#else
typedef int moe_comm_grad_reducer_needs_mpi;
#endif  // MOE_HAVE_MPI
