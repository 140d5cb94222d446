// moe_grad_reducer (src/comm/grad_reducer.c) against references computed on
// each rank alone: deterministic sums bitwise equal to moe_allreduce_fixed's
// pairwise tree over ranks, MPI's order within 1e-5 of MPI_Allreduce over the
// packed tensors, for every bucket size (one bucket, a tensor per bucket, in
// between), micro-op size (smaller than a tensor, in between, whole buckets),
// with and without overlap (sums started by the marks or only by finish), two
// steps in a row, tensors marked out of
// order or not at all. The records: the operations cover the packed tensors
// once, in order, one at a time, none across two buckets. Progress calls sum a
// bucket before finish is called, and report when nothing is left to do. Bad calls: a tensor marked
// twice or out of range, ranks passing different tensors.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/comm.h"
#include "moe/core.h"
#include "testutil_mpi.h"

static moe_ctx *g_ctx;
static int g_rank, g_size;

// Inputs from (rank, step, packed index): many magnitudes, so another order of
// summation gives other bits.
static float input(int rank, int step, size_t i) {
  const uint64_t h =
      (uint64_t)(rank + 1 + 1000 * step) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);
  const float mant = (float)((h >> 40) & 0xffffff) / 16777216.0f - 0.5f;
  return ldexpf(mant, (int)((h >> 20) % 24) - 12);
}

// The pairwise tree over ranks [lo, lo + count) (moe_allreduce_fixed's order).
static void tree_expect(float *out, size_t n, int step, int lo, int count) {
  if (count == 1) {
    for (size_t i = 0; i < n; i++) out[i] = input(lo, step, i);
    return;
  }
  int half = 1;
  while (half * 2 < count) half *= 2;
  float *hi = malloc(n * sizeof(float));
  if (!hi) MPI_Abort(MPI_COMM_WORLD, 2);
  tree_expect(out, n, step, lo, half);
  tree_expect(hi, n, step, lo + half, count - half);
  for (size_t i = 0; i < n; i++) out[i] = out[i] + hi[i];
  free(hi);
}

#define NT 8
static const size_t k_numel[NT] = {1, 7, 1000, 3, 9000, 12, 20011, 5};

typedef struct {
  size_t bucket_bytes, micro_op_bytes;
  int deterministic, overlap;
  int order;  // 0: tensors marked in order; 1: in reverse; 2: only the even ones (finish marks the
              // rest)
} run_cfg;

static void one_config(const run_cfg *rc) {
  size_t total = 0, off[NT];
  for (int i = 0; i < NT; i++) {
    off[i] = total;
    total += k_numel[i];
  }
  float *t[NT];
  for (int i = 0; i < NT; i++) t[i] = malloc(k_numel[i] * sizeof(float));
  float *want = malloc(total * sizeof(float)), *packed = malloc(total * sizeof(float));
  for (int i = 0; i < NT; i++)
    if (!t[i]) MPI_Abort(MPI_COMM_WORLD, 2);
  if (!want || !packed) MPI_Abort(MPI_COMM_WORLD, 2);
  moe_grad_reducer_config cfg;
  moe_grad_reducer_config_default(&cfg);
  cfg.bucket_bytes = rc->bucket_bytes;
  cfg.micro_op_bytes = rc->micro_op_bytes;
  cfg.deterministic = rc->deterministic;
  cfg.overlap = rc->overlap;
  char name[160];
  snprintf(name, sizeof name, "bucket %zu B, micro-op %zu B, %s, overlap %d, order %d (P=%d)",
           rc->bucket_bytes, rc->micro_op_bytes, rc->deterministic ? "fixed" : "mpi", rc->overlap,
           rc->order, g_size);
  moe_grad_reducer *r = NULL;
  moe_status st = moe_grad_reducer_create(g_ctx, MPI_COMM_WORLD, NT, t, k_numel, &cfg, &r);
  TU_CHECK(st == MOE_STATUS_OK, "%s: create: %s", name, moe_ctx_error(g_ctx));
  if (st != MOE_STATUS_OK) goto done;
  for (int step = 0; step < 2; step++) {
    for (int i = 0; i < NT; i++)
      for (size_t j = 0; j < k_numel[i]; j++) t[i][j] = input(g_rank, step, off[i] + j);
    for (int q = 0; q < NT; q++) {
      const int i = rc->order == 1 ? NT - 1 - q : q;
      if (rc->order == 2 && i % 2) continue;
      st = moe_grad_reducer_ready(r, g_ctx, i);
      TU_CHECK(st == MOE_STATUS_OK, "%s: ready %d: %s", name, i, moe_ctx_error(g_ctx));
      // the caller may reuse its gradient buffer once marked: the sum is of the marked values
      memset(t[i], 0, k_numel[i] * sizeof(float));
    }
    if (rc->order == 2)  // the unmarked ones are marked by finish: their values must be back
      for (int i = 1; i < NT; i += 2)
        for (size_t j = 0; j < k_numel[i]; j++) t[i][j] = input(g_rank, step, off[i] + j);
    st = moe_grad_reducer_finish(r, g_ctx);
    TU_CHECK(st == MOE_STATUS_OK, "%s: finish: %s", name, moe_ctx_error(g_ctx));
    for (int i = 0; i < NT; i++) memcpy(packed + off[i], t[i], k_numel[i] * sizeof(float));
    if (rc->deterministic) {
      tree_expect(want, total, step, 0, g_size);
      TU_CHECK(memcmp(packed, want, total * sizeof(float)) == 0,
               "%s step %d: not bitwise the fixed-order tree", name, step);
    } else {
      for (size_t j = 0; j < total; j++) want[j] = input(g_rank, step, j);
      MPI_Allreduce(MPI_IN_PLACE, want, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      size_t bad = 0;
      for (size_t j = 0; j < total; j++) {
        double mag = 0;  // sum of |inputs|: the scale of the rounding
        for (int p = 0; p < g_size; p++) mag += fabs((double)input(p, step, j));
        if (fabs((double)packed[j] - (double)want[j]) > 1e-5 * mag) bad++;
      }
      TU_CHECK(bad == 0, "%s step %d: %zu sums differ from MPI_Allreduce's by more than 1e-5", name,
               step, bad);
    }
    // the records
    int nr = 0;
    const moe_grad_op_record *rec = moe_grad_reducer_records(r, &nr);
    if (g_size == 1) {
      TU_CHECK(nr == 0, "%s: %d operations on one rank", name, nr);
      continue;
    }
    size_t at = 0, op_max = rc->micro_op_bytes / sizeof(float);
    int ok = 1, prev_bucket = 0;
    for (int k = 0; k < nr && ok; k++) {  // a check for the first bad one only
      size_t bf = 0, bc = 0;
      moe_grad_reducer_bucket(r, rec[k].bucket, &bf, &bc, NULL);
      ok = rec[k].first == at && rec[k].count > 0 && rec[k].first >= bf &&
           rec[k].first + rec[k].count <= bf + bc && rec[k].bucket >= prev_bucket &&
           (op_max == 0 || rec[k].count <= op_max) &&
           (k == 0 || rec[k].start_ns >= rec[k - 1].end_ns) && rec[k].end_ns >= rec[k].start_ns;
      if (!ok)
        TU_CHECK(0,
                 "%s: operation %d (bucket %d, [%zu, +%zu)) out of order, across buckets or "
                 "larger than a micro-op",
                 name, k, rec[k].bucket, rec[k].first, rec[k].count);
      at += rec[k].count;
      prev_bucket = rec[k].bucket;
    }
    TU_CHECK(at == total, "%s: operations cover %zu of %zu floats", name, at, total);
  }
  // bucket layout: whole tensors, at least bucket_bytes except the last
  const int nb = moe_grad_reducer_buckets(r);
  size_t sum = 0;
  for (int b = 0; b < nb; b++) {
    size_t first = 0, count = 0;
    int tensors = 0;
    moe_grad_reducer_bucket(r, b, &first, &count, &tensors);
    TU_CHECK(
        first == sum && tensors >= 1 &&
            (b == nb - 1 || rc->bucket_bytes == 0 || count * sizeof(float) >= rc->bucket_bytes),
        "%s: bucket %d [%zu, +%zu) of %d tensors", name, b, first, count, tensors);
    sum += count;
  }
  TU_CHECK(sum == total && (rc->bucket_bytes != 0 || nb == 1), "%s: %d buckets hold %zu of %zu",
           name, nb, sum, total);
done:
  moe_grad_reducer_destroy(r);
  for (int i = 0; i < NT; i++) free(t[i]);
  free(want);
  free(packed);
}

// Progress calls sum a bucket before finish: mark the first tensor (its own
// bucket), progress (at most 30 s) until it is summed and all_done says so.
static void test_overlap(void) {
  if (g_size == 1) return;
  float *t[NT];
  for (int i = 0; i < NT; i++) {
    t[i] = calloc(k_numel[i], sizeof(float));
    if (!t[i]) MPI_Abort(MPI_COMM_WORLD, 2);
  }
  moe_grad_reducer_config cfg;
  moe_grad_reducer_config_default(&cfg);
  cfg.bucket_bytes = 4;  // a tensor per bucket
  moe_grad_reducer *r = NULL;
  moe_status st = moe_grad_reducer_create(g_ctx, MPI_COMM_WORLD, NT, t, k_numel, &cfg, &r);
  TU_CHECK(st == MOE_STATUS_OK, "overlap: create: %s", moe_ctx_error(g_ctx));
  if (st != MOE_STATUS_OK) return;
  t[0][0] = 1.0f;
  moe_grad_reducer_ready(r, g_ctx, 0);
  int done = 0, all = 0;
  for (int w = 0; w < 30000 && !all; w++) {
    const struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    st = moe_grad_reducer_progress(r, g_ctx, &all);
    if (st != MOE_STATUS_OK) break;
  }
  done = moe_grad_reducer_done(r);
  TU_CHECK(st == MOE_STATUS_OK && all && done == 1,
           "overlap: the first bucket was not summed by progress calls (%d done, all %d: %s)", done,
           all, moe_ctx_error(g_ctx));
  // nothing else is marked: nothing left to do
  st = moe_grad_reducer_progress(r, g_ctx, &all);
  TU_CHECK(st == MOE_STATUS_OK && all && moe_grad_reducer_done(r) == 1,
           "overlap: progress with nothing marked: all %d, %d done", all, moe_grad_reducer_done(r));
  st = moe_grad_reducer_finish(r, g_ctx);
  TU_CHECK(st == MOE_STATUS_OK && t[0][0] == (float)g_size, "overlap: sum %g, want %d (%s)",
           (double)t[0][0], g_size, moe_ctx_error(g_ctx));
  moe_grad_reducer_destroy(r);
  for (int i = 0; i < NT; i++) free(t[i]);
}

// Priorities: held, Lina starts no micro-op at a mark or progress call, but
// does in a gap (progress_gap) and in finish; FIFO starts them anyway. The
// records say who started each and whether it was held. Names parse.
static void test_priority(void) {
  moe_comm_priority p = MOE_COMM_PRIORITY_FIFO;
  TU_CHECK(moe_comm_priority_parse(g_ctx, "lina", &p) == MOE_STATUS_OK &&
               p == MOE_COMM_PRIORITY_LINA && strcmp(moe_comm_priority_name(p), "lina") == 0,
           "parse lina");
  TU_CHECK(moe_comm_priority_parse(g_ctx, "fifo", &p) == MOE_STATUS_OK &&
               p == MOE_COMM_PRIORITY_FIFO && strcmp(moe_comm_priority_name(p), "fifo") == 0,
           "parse fifo");
  TU_CHECK(moe_comm_priority_parse(g_ctx, "first", &p) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "'first' is unknown (valid: fifo, lina)"),
           "parse first: '%s'", moe_ctx_error(g_ctx));
  if (g_size == 1) return;
  for (int lina = 0; lina <= 1; lina++) {
    float *t[NT];
    for (int i = 0; i < NT; i++) {
      t[i] = malloc(k_numel[i] * sizeof(float));
      if (!t[i]) MPI_Abort(MPI_COMM_WORLD, 2);
      for (size_t j = 0; j < k_numel[i]; j++) t[i][j] = 1.0f;
    }
    moe_grad_reducer_config cfg;
    moe_grad_reducer_config_default(&cfg);
    cfg.bucket_bytes = 4;  // a tensor per bucket
    cfg.micro_op_bytes = 4000;
    cfg.priority = lina ? MOE_COMM_PRIORITY_LINA : MOE_COMM_PRIORITY_FIFO;
    const char *name = lina ? "lina" : "fifo";
    moe_grad_reducer *r = NULL;
    moe_status st = moe_grad_reducer_create(g_ctx, MPI_COMM_WORLD, NT, t, k_numel, &cfg, &r);
    TU_CHECK(st == MOE_STATUS_OK, "%s: create: %s", name, moe_ctx_error(g_ctx));
    if (st != MOE_STATUS_OK) {
      for (int i = 0; i < NT; i++) free(t[i]);
      continue;
    }
    moe_grad_reducer_hold(r, 1);
    moe_grad_reducer_ready(r, g_ctx, 0);  // bucket 0: one float
    int all = 0;
    for (int w = 0; w < 30000 && moe_grad_reducer_done(r) < 1; w++) {
      const struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
      st = moe_grad_reducer_progress(r, g_ctx, &all);
      if (st != MOE_STATUS_OK || (lina && w == 200)) break;  // lina: 200 ms without a start
    }
    TU_CHECK(moe_grad_reducer_done(r) == (lina ? 0 : 1),
             "%s held: %d buckets summed by marks and progress calls, want %d", name,
             moe_grad_reducer_done(r), lina ? 0 : 1);
    // the ranks agree that nothing is in flight before the gap calls
    MPI_Barrier(MPI_COMM_WORLD);
    for (int w = 0; w < 30000 && moe_grad_reducer_done(r) < 1; w++) {
      const struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
      st = moe_grad_reducer_progress_gap(r, g_ctx, &all);
      if (st != MOE_STATUS_OK) break;
    }
    TU_CHECK(st == MOE_STATUS_OK && moe_grad_reducer_done(r) == 1,
             "%s held: the gap calls did not sum bucket 0 (%d done: %s)", name,
             moe_grad_reducer_done(r), moe_ctx_error(g_ctx));
    st = moe_grad_reducer_finish(r, g_ctx);  // still held: finish must not wait for a gap
    TU_CHECK(st == MOE_STATUS_OK && t[0][0] == (float)g_size && t[NT - 1][0] == (float)g_size,
             "%s: finish while held: %s, sums %g %g", name, moe_ctx_error(g_ctx), (double)t[0][0],
             (double)t[NT - 1][0]);
    int nr = 0;
    const moe_grad_op_record *rec = moe_grad_reducer_records(r, &nr);
    TU_CHECK(nr >= NT, "%s: %d records for %d buckets", name, nr, NT);
    for (int k = 0; k < nr; k++)
      TU_CHECK(rec[k].held == 1 && rec[k].gap == (k == 0 ? lina : 0),
               "%s: micro-op %d held %d gap %d (want held 1, gap %d)", name, k, rec[k].held,
               rec[k].gap, k == 0 ? lina : 0);
    moe_grad_reducer_destroy(r);
    for (int i = 0; i < NT; i++) free(t[i]);
  }
}

static void test_bad_calls(void) {
  float a[4] = {0}, b[4] = {0};
  float *t[2] = {a, b};
  size_t numel[2] = {4, 4};
  moe_grad_reducer *r = NULL;
  moe_status st = moe_grad_reducer_create(g_ctx, MPI_COMM_WORLD, 2, t, numel, NULL, &r);
  TU_CHECK(st == MOE_STATUS_OK, "bad calls: create: %s", moe_ctx_error(g_ctx));
  if (st == MOE_STATUS_OK) {
    TU_CHECK(moe_grad_reducer_ready(r, g_ctx, 2) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "tensor 2 out of range [0, 2)"),
             "ready(2) of 2 tensors: '%s'", moe_ctx_error(g_ctx));
    TU_CHECK(moe_grad_reducer_ready(r, g_ctx, 0) == MOE_STATUS_OK, "ready(0)");
    TU_CHECK(moe_grad_reducer_ready(r, g_ctx, 0) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(g_ctx), "marked ready twice"),
             "ready(0) twice: '%s'", moe_ctx_error(g_ctx));
    TU_CHECK(moe_grad_reducer_finish(r, g_ctx) == MOE_STATUS_OK, "finish after a refused mark: %s",
             moe_ctx_error(g_ctx));
    moe_grad_reducer_destroy(r);
  }
  if (g_size > 1) {  // the last rank passes another size: refused on every rank
    size_t other[2] = {4, g_rank == g_size - 1 ? 3 : 4};
    r = NULL;
    st = moe_grad_reducer_create(g_ctx, MPI_COMM_WORLD, 2, t, other, NULL, &r);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG && r == NULL &&
                 strstr(moe_ctx_error(g_ctx), "different tensors or options"),
             "different sizes: status %d, '%s' (rank %d)", (int)st, moe_ctx_error(g_ctx), g_rank);
    moe_grad_reducer_destroy(r);
    // the last rank passes no sizes at all: refused there, and no other rank waits
    r = NULL;
    st = moe_grad_reducer_create(g_ctx, MPI_COMM_WORLD, 2, t, g_rank == g_size - 1 ? NULL : numel,
                                 NULL, &r);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG && r == NULL,
             "NULL sizes on the last rank: status %d, '%s' (rank %d)", (int)st,
             moe_ctx_error(g_ctx), g_rank);
    if (g_rank == g_size - 1)
      TU_CHECK(strstr(moe_ctx_error(g_ctx), "must not be NULL") != NULL, "NULL sizes: message '%s'",
               moe_ctx_error(g_ctx));
    moe_grad_reducer_destroy(r);
  }
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (moe_ctx_create(&g_ctx) != MOE_STATUS_OK) MPI_Abort(MPI_COMM_WORLD, 2);
  (void)provided;  // the reducer calls MPI from the calling thread only
  const size_t buckets[] = {0, 4, 4000, 60000, (size_t)1 << 40};
  const size_t ops[] = {0, 400, 40000, (size_t)1 << 40};
  for (int det = 1; det >= 0; det--)
    for (size_t bi = 0; bi < sizeof buckets / sizeof buckets[0]; bi++)
      for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++)
        for (int ov = 0; ov <= 1; ov++) {
          run_cfg rc = {buckets[bi], ops[oi], det, ov, (int)((bi + oi) % 3)};
          one_config(&rc);
        }
  test_overlap();
  test_priority();
  test_bad_calls();

  const int rc = tu_mpi_finish("test_grad_reducer");
  moe_ctx_destroy(g_ctx);
  MPI_Finalize();
  return rc;
}
