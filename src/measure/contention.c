// Lina's Table 1 question, measured (moe_measure_contention, `moe bench
// contention`): how much slower is an all-to-all while gradient sums share
// the network with it, first-come first-served (FIFO) and with Lina's
// priority (all-to-alls first, sums in micro-ops in the gaps)?
//
// A round stands for one MoE layer's backward: `layers` all-to-alls, each
// followed by a gap of gap_ms (the experts' compute; the rank sleeps in
// short steps and, in the sum modes, progresses the sum in between, as the
// MoE layers' comm streams do in training). In the sum modes the gradients
// are all ready when the round starts (the dense blocks after this layer
// finished them): a moe_grad_reducer with the mode's priority and micro-ops
// starts them at once (FIFO) or only in the gaps (Lina: held for the round),
// and what is left is waited for after the last gap. The modes run
// interleaved, round by round, so a slow phase of the machine hits them alike.
#include "moe_build_config.h"
#if MOE_HAVE_MPI  // the whole file: collective measurements

#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "moe/measure_mpi.h"

// The gradients are tensors of this many floats (a bucket holds whole ones).
#define CT_TENSOR_FLOATS 16384

void moe_contention_config_default(moe_contention_config *c) {
  memset(c, 0, sizeof *c);
  c->a2a_bytes = (size_t)1 << 20;
  c->layers = 4;
  c->gap_ms = 5.0;
  c->sum_bytes = (size_t)4 << 20;
  c->micro_op_bytes = (size_t)256 << 10;
  c->deterministic = 1;
  c->rounds = 10;
  c->warmup = 2;
}

const char *moe_contention_mode_name(int mode) {
  return mode == MOE_CONTENTION_ALONE  ? "alone"
         : mode == MOE_CONTENTION_FIFO ? "fifo"
         : mode == MOE_CONTENTION_LINA ? "lina"
                                       : "?";
}

static void sleep_us(double us) {
  struct timespec ts = {0, (long)(us * 1e3)};
  nanosleep(&ts, NULL);
}

// The all-to-all sends bytes / P to every rank and the rest of the bytes to
// the last, which so receives this block from everyone.
static size_t last_block(size_t bytes, int P) {
  return bytes - bytes / (size_t)P * (size_t)(P - 1);
}

// The config's ranges (the same message as moe_measure_contention's).
static moe_status check_config(moe_ctx *ctx, const moe_contention_config *c) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !c, MOE_STATUS_INVALID_ARG, "contention: NULL config");
  MOE_FAIL_IF(ctx,
              c->layers < 1 || c->layers > 1000 || c->rounds < 1 || c->rounds > 100000 ||
                  c->warmup < 0 || c->warmup > 1000 || !(c->gap_ms >= 0 && c->gap_ms <= 60000) ||
                  c->a2a_bytes > ((size_t)1 << 30) || c->sum_bytes > ((size_t)1 << 32),
              MOE_STATUS_INVALID_ARG,
              "contention: layers (%d) must be in [1, 1000], rounds (%d) in [1, 100000], warmup "
              "(%d) in [0, 1000], gap (%g ms) in [0, 60000], all-to-all bytes (%zu) <= 1 GiB, "
              "sum bytes (%zu) <= 4 GiB",
              c->layers, c->rounds, c->warmup, c->gap_ms, c->a2a_bytes, c->sum_bytes);
done:
  return st;
}

moe_status moe_measure_contention_memory(moe_ctx *ctx, int P, int ranks_per_node,
                                         const moe_a2a_algo *algo, const moe_contention_config *c,
                                         moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !out || P < 1, MOE_STATUS_INVALID_ARG, "contention memory: out, P >= 1 (%d)", P);
  memset(out, 0, sizeof *out);
  MOE_TRY(check_config(ctx, c));
  const char *names[1] = {algo ? algo->name : ""};
  MOE_TRY(moe_measure_a2a_memory(ctx, P, ranks_per_node, c->a2a_bytes,
                                 (size_t)P * last_block(c->a2a_bytes, P), names, 1, 1, out));
  // the gradients, each reducer's packed copy and (deterministic) its receive
  // buffer of one micro-op, the per-round tables
  // (fifo: a bucket per operation; lina: a micro-op)
  const double sum = (double)moe_align64(c->sum_bytes + sizeof(float));
  const double op = c->micro_op_bytes > 0 && (double)c->micro_op_bytes < sum
                        ? (double)moe_align64(c->micro_op_bytes)
                        : sum;
  out->bytes[MOE_MEM_WORKSPACE] +=
      sum * 3 + (c->deterministic ? sum + op : 0) +
      (double)MOE_CONTENTION_MODES * (double)c->rounds * ((double)c->layers + 2) * sizeof(double);
done:
  return st;
}

// One mode's reducer over g->comm: FIFO sums each bucket in one operation
// (as DDP's buckets on their own stream), Lina in micro-ops.
static moe_status make_reducer(moe_ctx *ctx, const moe_group *g, const moe_contention_config *c,
                               int mode, int n, float *const *grads, const size_t *numel,
                               moe_grad_reducer **out) {
  moe_grad_reducer_config gc;
  moe_grad_reducer_config_default(&gc);
  gc.bucket_bytes = c->bucket_bytes;
  gc.deterministic = c->deterministic;
  gc.overlap = 1;
  gc.priority = mode == MOE_CONTENTION_LINA ? MOE_COMM_PRIORITY_LINA : MOE_COMM_PRIORITY_FIFO;
  gc.micro_op_bytes = mode == MOE_CONTENTION_LINA ? c->micro_op_bytes : 0;
  return moe_grad_reducer_create(ctx, g->comm, n, grads, numel, &gc, out);
}

moe_status moe_measure_contention(moe_ctx *ctx, const moe_group *g, const moe_a2a_algo *algo,
                                  const moe_contention_config *c, moe_contention_result *out) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size, rank = g->rank;
  size_t *sc = NULL, *sd = NULL;
  unsigned char *sbuf = NULL, *rbuf = NULL;
  float *grad = NULL, **grads = NULL;
  size_t *numel = NULL;
  double *a2a[MOE_CONTENTION_MODES] = {0}, *round[MOE_CONTENTION_MODES] = {0},
         *wait[MOE_CONTENTION_MODES] = {0};
  moe_grad_reducer *red[MOE_CONTENTION_MODES] = {0};
  moe_workspace ws = {0};
  MOE_FAIL_IF(ctx, !c || !out, MOE_STATUS_INVALID_ARG, "contention: NULL config or result");
  memset(out, 0, MOE_CONTENTION_MODES * sizeof *out);
  MOE_TRY(check_config(ctx, c));

  // the all-to-all: a2a_bytes / P to every rank (the rest to the last)
  const size_t block = c->a2a_bytes / (size_t)P, last = last_block(c->a2a_bytes, P);
  sc = moe_malloc(4 * (size_t)P * sizeof *sc);
  sd = sc ? sc + P : NULL;
  size_t *rc = sc ? sc + 2 * (size_t)P : NULL, *rd = sc ? sc + 3 * (size_t)P : NULL;
  sbuf = moe_malloc(c->a2a_bytes + 1);
  rbuf = moe_malloc((size_t)P * last + 1);
  // the gradients: tensors of CT_TENSOR_FLOATS floats; rank r's element i
  // holds (r + 1) * (i % 7 + 1), small integers whose sums are exact
  const size_t floats = c->sum_bytes / sizeof(float);
  const int n = (int)((floats + CT_TENSOR_FLOATS - 1) / CT_TENSOR_FLOATS);
  grad = moe_malloc((floats ? floats : 1) * sizeof *grad);
  grads = moe_calloc((size_t)(n ? n : 1), sizeof *grads);
  numel = moe_calloc((size_t)(n ? n : 1), sizeof *numel);
  const int total = c->warmup + c->rounds;
  int have_tables = 1;
  for (int m = 0; m < MOE_CONTENTION_MODES; m++) {
    a2a[m] = moe_calloc((size_t)c->rounds * c->layers, sizeof(double));
    round[m] = moe_calloc((size_t)c->rounds, sizeof(double));
    wait[m] = moe_calloc((size_t)c->rounds, sizeof(double));
    have_tables &= a2a[m] && round[m] && wait[m];
  }
  MOE_TRY(moe_comm_agree(
      ctx, g->comm,
      sc && sbuf && rbuf && grad && grads && numel && have_tables
          ? MOE_STATUS_OK
          : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                         "contention: out of memory (%zu + %zu bytes)", c->a2a_bytes, c->sum_bytes),
      "contention buffers"));
  for (int p = 0; p < P; p++) {
    sc[p] = p == P - 1 ? last : block;
    sd[p] = block * (size_t)p;
    rc[p] = rank == P - 1 ? last : block;
    rd[p] = rc[p] * (size_t)p;
  }
  for (size_t i = 0; i < c->a2a_bytes; i++) sbuf[i] = (unsigned char)(rank + i);
  for (int k = 0; k < n; k++) {
    grads[k] = grad + (size_t)k * CT_TENSOR_FLOATS;
    numel[k] = floats - (size_t)k * CT_TENSOR_FLOATS < CT_TENSOR_FLOATS
                   ? floats - (size_t)k * CT_TENSOR_FLOATS
                   : CT_TENSOR_FLOATS;
  }
  for (int m = MOE_CONTENTION_FIFO; m < MOE_CONTENTION_MODES && floats > 0; m++)
    MOE_TRY(make_reducer(ctx, g, c, m, n, grads, numel, &red[m]));

  int sum_bad[MOE_CONTENTION_MODES] = {0};
  const double expect_scale = (double)P * (P + 1) / 2.0;
  for (int it = 0; it < total; it++) {
    for (int m = 0; m < MOE_CONTENTION_MODES; m++) {
      moe_grad_reducer *r = red[m];
      if (m != MOE_CONTENTION_ALONE && !r) continue;  // nothing to sum
      for (size_t i = 0; i < floats; i++) grad[i] = (float)((rank + 1) * (int)(i % 7 + 1));
      MOE_MPI_WATCHED("barrier before a contention round", MPI_Barrier(g->comm));
      const uint64_t t0 = moe_time_ns();
      if (r) {
        moe_grad_reducer_hold(r, 1);  // Lina: the all-to-alls go first
        for (int k = 0; k < n; k++) MOE_TRY(moe_grad_reducer_ready(r, ctx, k));
      }
      for (int l = 0; l < c->layers; l++) {
        const uint64_t a0 = moe_time_ns();
        if (moe_a2a_run(ctx, algo, g, sbuf, sc, sd, rbuf, rc, rd, &ws) != MOE_STATUS_OK) {
          char why[512];
          snprintf(why, sizeof why, "%s", moe_ctx_error(ctx));
          MOE_FAIL(ctx, MOE_STATUS_COMM, "rank %d: all-to-all '%s': %s", rank, algo->name, why);
        }
        const double dt = (double)(moe_time_ns() - a0) * 1e-6;
        if (it >= c->warmup) a2a[m][(size_t)(it - c->warmup) * c->layers + l] = dt;
        // the gap: sleep in steps of 20 us, progressing the sum between them
        const uint64_t g_end = moe_time_ns() + (uint64_t)(c->gap_ms * 1e6);
        while (moe_time_ns() < g_end) {
          if (r) MOE_TRY(moe_grad_reducer_progress_gap(r, ctx, NULL));
          sleep_us(20);
        }
      }
      const uint64_t w0 = moe_time_ns();
      if (r) {
        moe_grad_reducer_hold(r, 0);
        MOE_TRY(moe_grad_reducer_finish(r, ctx));
        for (size_t i = 0; i < floats && !sum_bad[m]; i++)
          sum_bad[m] |= grad[i] != (float)(expect_scale * (double)(i % 7 + 1));
      }
      const double rt = (double)(moe_time_ns() - t0) * 1e-6;
      if (it >= c->warmup) {
        round[m][it - c->warmup] = rt;
        wait[m][it - c->warmup] = (double)(moe_time_ns() - w0) * 1e-6;
      }
    }
  }
  // the slowest rank's values, then the medians
  for (int m = 0; m < MOE_CONTENTION_MODES; m++) {
    const int nl = c->rounds * c->layers;
    MOE_MPI_TRY_OP(ctx, "all-reduce of the contention timings",
                   MPI_Allreduce(MPI_IN_PLACE, a2a[m], nl, MPI_DOUBLE, MPI_MAX, g->comm));
    MOE_MPI_TRY_OP(ctx, "all-reduce of the contention timings",
                   MPI_Allreduce(MPI_IN_PLACE, round[m], c->rounds, MPI_DOUBLE, MPI_MAX, g->comm));
    MOE_MPI_TRY_OP(ctx, "all-reduce of the contention timings",
                   MPI_Allreduce(MPI_IN_PLACE, wait[m], c->rounds, MPI_DOUBLE, MPI_MAX, g->comm));
    out[m].ran = m == MOE_CONTENTION_ALONE || red[m] != NULL;
    out[m].a2a_ms = moe_median(a2a[m], nl);  // sorts
    out[m].a2a_q1 = moe_quantile_sorted(a2a[m], nl, 0.25);
    out[m].a2a_q3 = moe_quantile_sorted(a2a[m], nl, 0.75);
    out[m].round_ms = moe_median(round[m], c->rounds);
    out[m].round_q1 = moe_quantile_sorted(round[m], c->rounds, 0.25);
    out[m].round_q3 = moe_quantile_sorted(round[m], c->rounds, 0.75);
    out[m].sum_wait_ms = moe_median(wait[m], c->rounds);
    if (red[m]) {
      int nrec = 0;
      moe_grad_reducer_records(red[m], &nrec);
      out[m].micro_ops = nrec;
    }
  }
  MOE_MPI_TRY_OP(
      ctx, "all-reduce of the sums' check",
      MPI_Allreduce(MPI_IN_PLACE, sum_bad, MOE_CONTENTION_MODES, MPI_INT, MPI_MAX, g->comm));
  for (int m = 0; m < MOE_CONTENTION_MODES; m++) out[m].sum_bad = sum_bad[m];
done:
  for (int m = 0; m < MOE_CONTENTION_MODES; m++) {
    // after a failed exchange peers may wait inside it: no collective (the
    // reducer's MPI_Comm_free) may follow; the caller aborts the job
    if (st != MOE_STATUS_COMM) moe_grad_reducer_destroy(red[m]);
    moe_free(a2a[m]);
    moe_free(round[m]);
    moe_free(wait[m]);
  }
  moe_workspace_free(&ws);
  moe_free(sc);
  moe_free(sbuf);
  moe_free(rbuf);
  moe_free(grad);
  moe_free(grads);
  moe_free(numel);
  return st;
}

#else
typedef int moe_measure_contention_needs_mpi;
#endif  // MOE_HAVE_MPI
