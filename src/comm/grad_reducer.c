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
// No thread of its own: the sums are non-blocking MPI operations (one micro-op
// in flight) that moe_grad_reducer_progress tests and advances without
// waiting. The caller's marks and progress calls advance them (the trainer's:
// after each block of the backward and between its kernels), and so can a
// communication stream whenever it would wait (the MoE layers'
// executors, moe_ep_layer_set_background_extra: Lina's "all-reduce fills the
// all-to-all's gaps"), so every MPI call stays on one thread at a time (a
// thread of the reducer calling MPI beside the all-to-alls stalled Open MPI's
// TCP transport for tens of seconds on the emulated cluster). finish
// waits for the rest request by request (MPI_Wait, which progresses it without
// pause), then copies the sums back into the tensors. The buckets' sum of
// messages is that of one moe_allreduce_fixed per bucket, which for a few large
// buckets is slower than one packed call (docs/lina.md).
//
// The sums: deterministic, the binomial tree of moe_allreduce_fixed (rank r
// adds rank r + d's partial sum after its own) then a binomial broadcast from
// rank 0 (point-to-point: with MPI_Ibcast instead, the wait for 4 MiB buckets
// of a 12 MiB model was about 115 ms against 80 ms, on the emulated cluster), on
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
// MPI counts are int; a micro-op never exceeds this many floats.
#define GR_MAX_OP ((size_t)1 << 28)

typedef enum {
  OP_IDLE = 0,
  OP_TREE,       // the sum's tree at distance d: post the next request
  OP_RECV,       // receiving rank + d's partial sum
  OP_SEND,       // sending ours to rank - d
  OP_BTREE,      // the broadcast's tree at distance d (from the largest down)
  OP_BRECV,      // receiving the sum from rank - d
  OP_BSEND,      // sending the sum to rank + d
  OP_ALLREDUCE,  // MPI_Iallreduce
} op_phase;

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
  int *b_tensors;        // (n_buckets + 1) tensors per bucket
  size_t total, op_max;  // floats in buf; floats per micro-op
  float *buf;            // (total) the packed gradients
  float *tmp;            // (largest micro-op) deterministic, receiving ranks: a partner's sum

  // ---- the step, under mu (progress may be called from a comm stream's background)
  pthread_mutex_t mu;
  int mu_ready;
  int *pending;           // (n_buckets + 1) tensors not yet marked this step
  unsigned char *marked;  // (n) marked this step
  int next;               // the bucket summed now or next (n_buckets: all done)
  // the micro-op in flight, or the last one done (idle: the next one starts at
  // op_first + op_count): floats [op_first, op_first + op_count), its phase,
  // the tree distance, its request
  op_phase phase;
  size_t op_first, op_count;
  int d;
  MPI_Request req;
  uint64_t op_start;
  int op_held, op_gap;  // the micro-op started while held / in a gap
  int held;             // moe_grad_reducer_hold
  moe_status fail;      // the first failure (then nothing more is summed)
  char fail_msg[512];
  uint64_t t0;      // the step's first mark
  uint64_t rec_t0;  // the last finished step's

  // ---- the last step's micro-ops
  moe_grad_op_record *rec;  // (rec_cap)
  int rec_cap, rec_n;
};

// Posts the micro-op's next request, or finishes it (phase OP_IDLE). mu held.
static moe_status op_advance(moe_grad_reducer *r, moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  float *x = r->buf + r->op_first;
  const int c = (int)r->op_count;
  for (;;) {
    if (r->phase == OP_TREE) {  // moe_allreduce_fixed's tree, distance d
      if (r->d >= r->size) {    // the sum is on rank 0: the broadcast's tree
        r->d = 1;
        while (r->d * 2 < r->size) r->d *= 2;
        r->phase = OP_BTREE;
        continue;
      }
      if (r->rank % (2 * r->d) != 0) {
        MOE_MPI_TRY(ctx, MPI_Isend(x, c, MPI_FLOAT, r->rank - r->d, GR_TAG, r->comm, &r->req));
        r->phase = OP_SEND;
        break;
      }
      if (r->rank + r->d < r->size) {
        MOE_MPI_TRY(ctx, MPI_Irecv(r->tmp, c, MPI_FLOAT, r->rank + r->d, GR_TAG, r->comm, &r->req));
        r->phase = OP_RECV;
        break;
      }
      r->d *= 2;
      continue;
    }
    if (r->phase == OP_RECV) {  // rank + d's partial sum after our own
      moe_add_inplace(x, r->tmp, r->op_count);
      r->d *= 2;
      r->phase = OP_TREE;
      continue;
    }
    if (r->phase == OP_SEND) {  // our part is sent: the sum comes by the broadcast
      r->d = r->size;
      r->phase = OP_TREE;
      continue;
    }
    if (r->phase == OP_BTREE) {  // binomial broadcast from rank 0, distance d
      if (r->d < 1) goto op_done;
      if (r->rank % (2 * r->d) == r->d) {  // from rank - d (the level of our lowest bit)
        MOE_MPI_TRY(ctx, MPI_Irecv(x, c, MPI_FLOAT, r->rank - r->d, GR_TAG + 1, r->comm, &r->req));
        r->phase = OP_BRECV;
        break;
      }
      if (r->rank % (2 * r->d) == 0 && r->rank + r->d < r->size) {
        MOE_MPI_TRY(ctx, MPI_Isend(x, c, MPI_FLOAT, r->rank + r->d, GR_TAG + 1, r->comm, &r->req));
        r->phase = OP_BSEND;
        break;
      }
      r->d /= 2;
      continue;
    }
    if (r->phase == OP_BRECV || r->phase == OP_BSEND) {
      r->d /= 2;
      r->phase = OP_BTREE;
      continue;
    }
  op_done:
    // the broadcast's tree or MPI_Iallreduce completed: the micro-op is done
    if (r->rec_n < r->rec_cap) {
      moe_grad_op_record *q = &r->rec[r->rec_n++];
      q->bucket = r->next;
      q->first = r->op_first;
      q->count = r->op_count;
      q->start_ns = r->op_start - r->t0;
      q->end_ns = moe_time_ns() - r->t0;
      q->held = r->op_held;
      q->gap = r->op_gap;
    }
    r->phase = OP_IDLE;
    if (r->op_first + r->op_count >= r->b_first[r->next + 1]) r->next++;
    break;
  }
done:
  return st;
}

// Keeps the first failure and its message (mu held): nothing more is summed.
static void keep_failure(moe_grad_reducer *r, moe_ctx *ctx, moe_status st) {
  if (st == MOE_STATUS_OK || r->fail != MOE_STATUS_OK) return;
  r->fail = st;
  snprintf(r->fail_msg, sizeof r->fail_msg, "%s", moe_ctx_error(ctx));
}

// Who progresses: a mark or progress call; an all-to-all stream in a gap
// (Lina's priority lets it start micro-ops while held); finish (nothing left
// to give way to).
enum { BY_CALL = 0, BY_GAP = 1, BY_FINISH = 2 };

// Makes what progress it can without waiting. mu held.
static moe_status progress_locked(moe_grad_reducer *r, moe_ctx *ctx, int by) {
  moe_status st = MOE_STATUS_OK;
  if (r->fail != MOE_STATUS_OK)  // kept from an earlier call (maybe another stream's)
    return moe_error_at(ctx, r->fail, __FILE__, __LINE__, "%s", r->fail_msg);
  for (;;) {
    if (r->phase != OP_IDLE) {
      int flag = 0;
      MOE_MPI_TRY(ctx, MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE));
      if (!flag) break;
      MOE_TRY(op_advance(r, ctx));
      continue;
    }
    if (r->next >= r->n_buckets || r->pending[r->next] > 0) break;  // nothing ready
    // Lina: the all-to-alls go first (no new micro-op while they are imminent)
    const int held = __atomic_load_n(&r->held, __ATOMIC_RELAXED);
    if (r->cfg.priority == MOE_COMM_PRIORITY_LINA && held && by == BY_CALL) break;
    // the next micro-op of bucket `next`, right after the last one
    r->op_first += r->op_count;
    const size_t left = r->b_first[r->next + 1] - r->op_first;
    r->op_count = left < r->op_max ? left : r->op_max;
    r->op_start = moe_time_ns();
    r->op_held = held;
    r->op_gap = by == BY_GAP;
    if (r->cfg.deterministic) {
      r->phase = OP_TREE;
      r->d = 1;
      MOE_TRY(op_advance(r, ctx));
    } else {
      MOE_MPI_TRY(ctx, MPI_Iallreduce(MPI_IN_PLACE, r->buf + r->op_first, (int)r->op_count,
                                      MPI_FLOAT, MPI_SUM, r->comm, &r->req));
      r->phase = OP_ALLREDUCE;
    }
  }
done:
  keep_failure(r, ctx, st);
  return st;
}

static moe_status progress_call(moe_grad_reducer *r, moe_ctx *ctx, int by, int *all_done) {
  moe_status st = MOE_STATUS_OK;
  if (all_done) *all_done = 1;
  if (!r || r->size == 1 || r->total == 0 || !r->cfg.overlap) return st;
  if (pthread_mutex_trylock(&r->mu) != 0) {  // another stream is at it
    if (all_done) *all_done = 0;
    return st;
  }
  st = progress_locked(r, ctx, by);
  // done for now: nothing in flight and nothing ready to start
  if (all_done)
    *all_done = r->phase == OP_IDLE && (r->next >= r->n_buckets || r->pending[r->next] > 0);
  pthread_mutex_unlock(&r->mu);
  return st;
}

moe_status moe_grad_reducer_progress(moe_grad_reducer *r, moe_ctx *ctx, int *all_done) {
  return progress_call(r, ctx, BY_CALL, all_done);
}

moe_status moe_grad_reducer_progress_gap(moe_grad_reducer *r, moe_ctx *ctx, int *all_done) {
  return progress_call(r, ctx, BY_GAP, all_done);
}

void moe_grad_reducer_hold(moe_grad_reducer *r, int held) {
  if (r) __atomic_store_n(&r->held, held != 0, __ATOMIC_RELAXED);
}

const char *moe_comm_priority_name(moe_comm_priority p) {
  return p == MOE_COMM_PRIORITY_FIFO ? "fifo" : p == MOE_COMM_PRIORITY_LINA ? "lina" : "?";
}

moe_status moe_comm_priority_parse(moe_ctx *ctx, const char *text, moe_comm_priority *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !text || !out, MOE_STATUS_INVALID_ARG, "comm priority: NULL argument");
  if (strcmp(text, "fifo") == 0) {
    *out = MOE_COMM_PRIORITY_FIFO;
  } else if (strcmp(text, "lina") == 0) {
    *out = MOE_COMM_PRIORITY_LINA;
  } else {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "comm priority '%s' is unknown (valid: fifo, lina)",
             text);
  }
done:
  return st;
}

void moe_grad_reducer_config_default(moe_grad_reducer_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->bucket_bytes = (size_t)25 << 20;
  cfg->deterministic = 1;
  cfg->overlap = 1;
}

void moe_grad_reducer_destroy(moe_grad_reducer *r) {
  if (!r) return;
  int leak = 0;  // an operation left in flight by a failure
  if (r->phase != OP_IDLE && r->req != MPI_REQUEST_NULL) {
    if (r->phase == OP_RECV || r->phase == OP_BRECV) {  // a receive can be cancelled
      MPI_Cancel(&r->req);
      MPI_Wait(&r->req, MPI_STATUS_IGNORE);
    } else {  // a send or MPI_Iallreduce cannot: MPI may still read the buffers
      MPI_Request_free(&r->req);
      leak = 1;
    }
  }
  if (r->mu_ready) pthread_mutex_destroy(&r->mu);
  if (r->comm != MPI_COMM_NULL) MPI_Comm_free(&r->comm);
  moe_free(r->grads);
  moe_free(r->numel);
  moe_free(r->off);
  moe_free(r->bucket_of);
  moe_free(r->b_first);
  moe_free(r->b_tensors);
  moe_free(r->pending);
  moe_free(r->marked);
  if (!leak) {  // else kept for MPI (only after a failure, before the job ends)
    moe_free(r->buf);
    moe_free(r->tmp);
  }
  moe_free(r->rec);
  moe_free(r);
}

// Starts the next step (mu held).
static void reset_step(moe_grad_reducer *r) {
  for (int b = 0; b < r->n_buckets; b++) r->pending[b] = r->b_tensors[b];
  memset(r->marked, 0, (size_t)r->n);
  r->next = 0;
  r->op_first = r->op_count = 0;
  r->rec_t0 = r->t0;
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
  // a bad argument on one rank must not leave the others waiting: it takes
  // part in the agreement below with a hash no other rank has
  const int bad_args = !out || n < 0 || (n > 0 && (!grads || !numel));
  if (out) *out = NULL;
  if (bad_args) {
    moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                 "gradient reducer: out, grads and numel must not be NULL and n (%d) >= 0", n);
    unsigned long long ext[2] = {~0ull, ~0ull};  // max: every rank sees a mismatch
    MPI_Allreduce(MPI_IN_PLACE, ext, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
    moe_comm_agree(ctx, comm, MOE_STATUS_INVALID_ARG, "gradient buckets");
    return MOE_STATUS_INVALID_ARG;
  }
  r = moe_calloc(1, sizeof *r);
  const int no_memory = r == NULL;
  if (r) {
    r->comm = MPI_COMM_NULL;
    r->req = MPI_REQUEST_NULL;
    r->cfg = cfg;
    r->n = n;
    MPI_Comm_rank(comm, &r->rank);
    MPI_Comm_size(comm, &r->size);
  }

  // step 1: the ranks agree on the tensor count and sizes and the options (a
  // hash of them: its max and min over the ranks)
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
  MIX(cfg.priority);
#undef MIX
  unsigned long long ext[2] = {(unsigned long long)h, ~(unsigned long long)h};
  MOE_MPI_TRY_OP(ctx, "agreement: gradient buckets",
                 MPI_Allreduce(MPI_IN_PLACE, ext, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm));
  if (no_memory)
    mine = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                        "gradient reducer: out of memory");
  else if (ext[0] != ~ext[1])
    mine = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                        "gradient reducer: the ranks pass different tensors or options; every "
                        "rank must pass the same");
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
    if (r->b_tensors[r->n_buckets] > 0) r->n_buckets++;
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
  if (mine == MOE_STATUS_OK) {
    if (pthread_mutex_init(&r->mu, NULL) == 0)
      r->mu_ready = 1;
    else
      mine = moe_error_at(ctx, MOE_STATUS_INTERNAL, __FILE__, __LINE__,
                          "gradient reducer: cannot create a mutex");
  }
  if (mine == MOE_STATUS_OK) {
    const int rc = MPI_Comm_dup(comm, &r->comm);
    if (rc != MPI_SUCCESS) {
      r->comm = MPI_COMM_NULL;
      mine = moe_mpi_error(ctx, rc, "MPI_Comm_dup", __FILE__, __LINE__);
    }
  }
  MOE_TRY(moe_comm_agree(ctx, comm, mine, "gradient buckets"));
  reset_step(r);
  *out = r;
  r = NULL;
done:
  moe_grad_reducer_destroy(r);
  return st;
}

int moe_grad_reducer_buckets(const moe_grad_reducer *r) { return r ? r->n_buckets : 0; }

int moe_grad_reducer_done(moe_grad_reducer *r) {
  if (!r) return 0;
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

// Marks tensor i (mu held): copied into the packed buffer.
static moe_status mark_locked(moe_grad_reducer *r, moe_ctx *ctx, int i) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, r->marked[i], MOE_STATUS_INVALID_ARG,
              "gradient reducer: tensor %d marked ready twice in one step", i);
  if (r->t0 == 0) {  // the step's first mark: the last step's records go
    r->t0 = moe_time_ns();
    r->rec_n = 0;
  }
  r->marked[i] = 1;
  memcpy(r->buf + r->off[i], r->grads[i], r->numel[i] * sizeof(float));
  r->pending[r->bucket_of[i]]--;
done:
  return st;
}

moe_status moe_grad_reducer_ready(moe_grad_reducer *r, moe_ctx *ctx, int i) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !r || i < 0 || i >= r->n, MOE_STATUS_INVALID_ARG,
              "gradient reducer: tensor %d out of range [0, %d)", i, r ? r->n : 0);
  pthread_mutex_lock(&r->mu);
  st = mark_locked(r, ctx, i);
  if (st == MOE_STATUS_OK && r->cfg.overlap && r->size > 1) st = progress_locked(r, ctx, BY_CALL);
  pthread_mutex_unlock(&r->mu);
done:
  return st;
}

moe_status moe_grad_reducer_finish(moe_grad_reducer *r, moe_ctx *ctx) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !r, MOE_STATUS_INVALID_ARG, "gradient reducer must not be NULL");
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n && st == MOE_STATUS_OK; i++)  // the ones nobody marked, in order
    if (!r->marked[i]) st = mark_locked(r, ctx, i);
  if (st == MOE_STATUS_OK && r->size > 1 && r->total > 0) {
    const int token = moe_watchdog_op_begin("all-reduce of the gradient buckets", NULL);
    // nothing else to do now: each request is waited for (MPI progresses it
    // at full speed, as a blocking call would), then the next one posted
    for (;;) {
      st = progress_locked(r, ctx, BY_FINISH);
      if (st != MOE_STATUS_OK || r->next >= r->n_buckets) break;
      if (r->phase != OP_IDLE) {
        const int rc = MPI_Wait(&r->req, MPI_STATUS_IGNORE);
        st = rc == MPI_SUCCESS ? op_advance(r, ctx)
                               : moe_mpi_error(ctx, rc, "MPI_Wait", __FILE__, __LINE__);
        keep_failure(r, ctx, st);
        if (st != MOE_STATUS_OK) break;
      }
    }
    moe_watchdog_op_end(token);
    if (st != MOE_STATUS_OK)
      moe_error_at(ctx, st, __FILE__, __LINE__, "all-reduce of the gradient buckets: %s",
                   r->fail_msg);
  }
  if (st == MOE_STATUS_OK) {
    for (int i = 0; i < r->n; i++)
      memcpy(r->grads[i], r->buf + r->off[i], r->numel[i] * sizeof(float));
    reset_step(r);  // the records stay readable until the next step's first mark
  }
  pthread_mutex_unlock(&r->mu);
done:
  return st;
}

const moe_grad_op_record *moe_grad_reducer_records(const moe_grad_reducer *r, int *n) {
  if (n) *n = r ? r->rec_n : 0;
  return r ? r->rec : NULL;
}

uint64_t moe_grad_reducer_step_start_ns(const moe_grad_reducer *r) { return r ? r->rec_t0 : 0; }

#else
typedef int moe_comm_grad_reducer_needs_mpi;
#endif  // MOE_HAVE_MPI
