// moe_chain_run (comm.h) against one rank's whole chain, bit for bit: C = A B
// (+ C) by moe_gemm_fixed with k cut into segments that random ranks own,
// C's rows cut into blocks, and column sums by moe_bias_add_backward with the
// rows cut into segments (two ranges per block). Every rank must end with the
// bits of the single call. Also: one segment, one block, segments that stay on
// one rank, a rank that owns nothing, and bad descriptions refused on every
// rank. Run under mpirun with 1, 2, 3 and 4 ranks.
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/core.h"
#include "moe/kernels.h"
#include "testutil.h"
#include "testutil_mpi.h"

static int g_rank, g_world;

typedef struct {
  int m, n, k, blocks, segs;
  const int *kcut;  // (segs + 1) where each segment's k starts
  const float *a, *b;
  float *c;
  const int *rcut;   // (blocks + 1) where each block's rows start
  const int *owner;  // (segs) each segment's rank
  // column sums: rows of dy cut into segments as k is, into db (n) in two halves
  const float *dy;
  float *db;
} gemm_case;

static int case_owner(void *user, int seg) { return ((const gemm_case *)user)->owner[seg]; }

static void gemm_compute(void *user, int block, int seg) {
  gemm_case *g = user;
  const int r0 = g->rcut[block], rows = g->rcut[block + 1] - r0;
  const int k0 = g->kcut[seg], kn = g->kcut[seg + 1] - k0;
  moe_gemm_fixed(0, 0, rows, g->n, kn, 1.0f, g->a + (size_t)r0 * g->k + k0, g->k,
                 g->b + (size_t)k0 * g->n, g->n, 1.0f, g->c + (size_t)r0 * g->n, g->n);
}

static int gemm_spans(void *user, int block, float **p, size_t *n) {
  gemm_case *g = user;
  const int r0 = g->rcut[block], rows = g->rcut[block + 1] - r0;
  p[0] = g->c + (size_t)r0 * g->n;
  n[0] = (size_t)rows * g->n;
  return 1;
}

// column sums: one block (db, as two ranges), segments of rows
static void sum_compute(void *user, int block, int seg) {
  gemm_case *g = user;
  (void)block;
  const int r0 = g->kcut[seg], rn = g->kcut[seg + 1] - r0;
  moe_bias_add_backward(g->db, g->dy + (size_t)r0 * g->n, rn, g->n);
}

static int sum_spans(void *user, int block, float **p, size_t *n) {
  gemm_case *g = user;
  (void)block;
  p[0] = g->db;
  n[0] = (size_t)g->n / 2;
  p[1] = g->db + g->n / 2;
  n[1] = (size_t)(g->n - g->n / 2);
  return 2;
}

static void fill(float *x, size_t n, uint64_t *s) {
  for (size_t i = 0; i < n; i++) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    x[i] = (float)((double)(*s >> 40) / (double)(1u << 24) * 2.0 - 1.0);
  }
}

static int draw(uint64_t *s, int lo, int hi) {  // [lo, hi]
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (int)((*s >> 33) % (uint64_t)(hi - lo + 1));
}

// Cuts [0, total) into parts pieces (some may be empty when allow_empty).
static void cut(int *at, int parts, int total, uint64_t *s, int allow_empty) {
  at[0] = 0;
  at[parts] = total;
  for (int i = 1; i < parts; i++) at[i] = draw(s, 0, total);
  // sort the inner cuts
  for (int i = 1; i < parts; i++)
    for (int j = i + 1; j < parts; j++)
      if (at[j] < at[i]) {
        const int t = at[i];
        at[i] = at[j];
        at[j] = t;
      }
  if (!allow_empty)
    for (int i = 1; i <= parts; i++)
      if (at[i] <= at[i - 1]) at[i] = at[i - 1] + 1 <= total ? at[i - 1] + 1 : total;
}

// cs: the kept state (grown as the cases need) or NULL (one of the call alone).
static void one_case(moe_ctx *ctx, uint64_t seed, int owner_mode, moe_chain_state *cs) {
  uint64_t s = seed;  // the same draws on every rank
  gemm_case g;
  memset(&g, 0, sizeof g);
  g.m = draw(&s, 1, 70);
  g.n = draw(&s, 2, 50);
  g.k = draw(&s, 1, 300);
  g.segs = draw(&s, 1, 7);
  g.blocks = draw(&s, 1, 5);
  if (g.blocks > g.m) g.blocks = g.m;
  int kcut[8], rcut[6], owner[7];
  cut(kcut, g.segs, g.k, &s, 1);
  cut(rcut, g.blocks, g.m, &s, 0);
  for (int i = 0; i < g.segs; i++) {
    owner[i] = owner_mode == 0   ? draw(&s, 0, g_world - 1)  // random
               : owner_mode == 1 ? i % g_world               // round robin
                                 : g_world - 1;              // all on the last rank
  }
  g.kcut = kcut;
  g.rcut = rcut;
  float *a = malloc((size_t)g.m * g.k * sizeof(float));
  float *b = malloc((size_t)g.k * g.n * sizeof(float));
  float *c0 = malloc((size_t)g.m * g.n * sizeof(float));
  float *ref = malloc((size_t)g.m * g.n * sizeof(float));
  float *c = malloc((size_t)g.m * g.n * sizeof(float));
  float *dy = malloc((size_t)g.k * g.n * sizeof(float));
  float *db0 = malloc((size_t)g.n * sizeof(float));
  float *dbref = malloc((size_t)g.n * sizeof(float));
  float *db = malloc((size_t)g.n * sizeof(float));
  fill(a, (size_t)g.m * g.k, &s);
  fill(b, (size_t)g.k * g.n, &s);
  fill(c0, (size_t)g.m * g.n, &s);
  fill(dy, (size_t)g.k * g.n, &s);
  fill(db0, (size_t)g.n, &s);
  g.a = a;
  g.b = b;
  g.dy = dy;
  // the single call: C = C0 + A B; db = db0 + the column sums of dy
  memcpy(ref, c0, (size_t)g.m * g.n * sizeof(float));
  moe_gemm_fixed(0, 0, g.m, g.n, g.k, 1.0f, a, g.k, b, g.n, 1.0f, ref, g.n);
  memcpy(dbref, db0, (size_t)g.n * sizeof(float));
  moe_bias_add_backward(dbref, dy, g.k, g.n);
  // the chain: segment 0's owner starts from C0, the others from garbage
  for (size_t i = 0; i < (size_t)g.m * g.n; i++) c[i] = g_rank == owner[0] ? c0[i] : 1e30f;
  for (int j = 0; j < g.n; j++) db[j] = g_rank == owner[0] ? db0[j] : -7.0f;
  g.c = c;
  g.db = db;
  g.owner = owner;
  moe_chain ch = {g.blocks, g.segs, case_owner, gemm_compute, gemm_spans, &g};
  char what[160];
  snprintf(what, sizeof what, "seed %llu owners %d: m %d n %d k %d, %d blocks, %d segments",
           (unsigned long long)seed, owner_mode, g.m, g.n, g.k, g.blocks, g.segs);
  TU_CHECK(moe_chain_run(ctx, MPI_COMM_WORLD, &ch, cs, "test chain") == MOE_STATUS_OK,
           "chain failed: %s", what);
  TU_CHECK(memcmp(c, ref, (size_t)g.m * g.n * sizeof(float)) == 0,
           "GEMM chain differs from one call: %s", what);
  moe_chain sums = {1, g.segs, case_owner, sum_compute, sum_spans, &g};
  TU_CHECK(moe_chain_run(ctx, MPI_COMM_WORLD, &sums, cs, "test column sums") == MOE_STATUS_OK,
           "column-sum chain failed: %s", what);
  TU_CHECK(memcmp(db, dbref, (size_t)g.n * sizeof(float)) == 0,
           "column-sum chain differs from one call: %s", what);
  free(a);
  free(b);
  free(c0);
  free(ref);
  free(c);
  free(dy);
  free(db0);
  free(dbref);
  free(db);
}

static int no_spans(void *user, int block, float **p, size_t *n) {
  (void)user;
  (void)block;
  (void)p;
  (void)n;
  return MOE_CHAIN_SPANS + 1;
}

static void no_compute(void *user, int block, int seg) {
  (void)user;
  (void)block;
  (void)seg;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_chain_state kept = {NULL, NULL, 0};
  for (int mode = 0; mode < 3; mode++)
    for (uint64_t seed = 1; seed <= 40; seed++)
      one_case(ctx, seed * 7919 + (uint64_t)mode, mode, seed % 2 ? &kept : NULL);
  TU_CHECK(kept.cap >= 4 && kept.req && kept.sts, "the kept state holds requests (cap %zu)",
           kept.cap);
  moe_chain_state_free(&kept);
  TU_CHECK(kept.cap == 0 && !kept.req, "moe_chain_state_free zeroes the state");

  // bad descriptions: the same verdict on every rank, nobody waits
  const int owner_bad[2] = {0, g_world}, owner_ok[1] = {0};
  gemm_case bad_case = {.owner = owner_bad}, ok_case = {.owner = owner_ok};
  moe_chain bad = {1, 2, case_owner, no_compute, no_spans, &bad_case};
  TU_CHECK(moe_chain_run(ctx, MPI_COMM_WORLD, &bad, NULL, "bad owner") == MOE_STATUS_INVALID_ARG,
           "bad description accepted");
  TU_CHECK(strstr(moe_ctx_error(ctx), "owner") != NULL, "error names the problem: %s",
           moe_ctx_error(ctx));
  moe_chain neg = {-1, 1, case_owner, no_compute, no_spans, &bad_case};
  TU_CHECK(moe_chain_run(ctx, MPI_COMM_WORLD, &neg, NULL, "negative") == MOE_STATUS_INVALID_ARG,
           "bad description accepted");
  moe_chain none = {0, 1, case_owner, no_compute, no_spans, &ok_case};
  TU_CHECK(moe_chain_run(ctx, MPI_COMM_WORLD, &none, NULL, "empty") == MOE_STATUS_OK,
           "an empty chain fails");
  moe_chain many = {1, 1, case_owner, no_compute, no_spans, &ok_case};
  TU_CHECK(
      moe_chain_run(ctx, MPI_COMM_WORLD, &many, NULL, "too many ranges") == MOE_STATUS_INVALID_ARG,
      "bad description accepted");
  TU_CHECK(strstr(moe_ctx_error(ctx), "ranges") != NULL, "error names the problem: %s",
           moe_ctx_error(ctx));
  MPI_Barrier(MPI_COMM_WORLD);

  moe_ctx_destroy(ctx);
  const int rc = tu_mpi_finish("test_chain");
  MPI_Finalize();
  return rc;
}
