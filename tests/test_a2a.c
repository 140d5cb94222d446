// MPI test of every registered all-to-all algorithm: each algorithm x node
// layout x count pattern x buffer layout, compared byte for byte with
// MPI_Alltoallv on the same inputs and with the expected payload, whose bytes
// encode (source, destination, index). Also: the uniform-node restriction fails
// with INVALID_ARG on every rank, the grouped algorithm under several group
// sizes, the registry lookup, the topology helper, and that a second identical
// call neither grows the workspace nor allocates.
//
// Usage: mpiexec -n P test_a2a [data_dir (ignored)] [--verbose]
// Prints a line per failed check; rank 0 ends with "test_a2a: N passed, M
// failed" (sums over ranks). Every rank exits non-zero if any rank failed.
#define _GNU_SOURCE  // setenv, unsetenv, sched_getaffinity, CPU_COUNT

#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/comm.h"
#include "moe/core.h"
#include "testutil_mpi.h"

static int g_world_rank = 0, g_world_size = 1, g_verbose = 0;
static moe_ctx *g_ctx = NULL;

// ---- payloads ------------------------------------------------------------------------

static uint64_t mix64(uint64_t x) {  // the murmur3 finaliser
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The block that group rank src sends to group rank dst: byte i is byte i%4 of
// a 32-bit word hashed from (src, dst, i/4), so counts need not be multiples of 4.
static void payload_fill(unsigned char *out, int src, int dst, size_t n) {
  const uint64_t key =
      (uint64_t)src * 0x9e3779b97f4a7c15ULL ^ (uint64_t)dst * 0xc2b2ae3d27d4eb4fULL;
  for (size_t w = 0; 4 * w < n; w++) {
    const uint32_t h = (uint32_t)mix64(key ^ (uint64_t)w * 0x165667b1ULL);
    for (size_t k = 0; k < 4 && 4 * w + k < n; k++) out[4 * w + k] = (unsigned char)(h >> (8 * k));
  }
}

// ---- count patterns ----------------------------------------------------------------------

enum {
  PAT_UNIFORM,
  PAT_RANDOM,
  PAT_SENDER_SILENT,
  PAT_RECEIVER_SILENT,
  PAT_ALL_ZERO,
  PAT_SELF_ONLY,
  PAT_LARGE,
  PAT_COUNT
};
static const char *const k_pattern_names[PAT_COUNT] = {
    "uniform", "random", "sender_silent", "receiver_silent", "all_zero", "self_only", "large"};

// Fills C (P x P, C[s*P + d] = bytes s sends d) the same way on every rank.
static void gen_counts(int pattern, uint64_t seed, int P, size_t *C) {
  moe_rng rng;
  moe_rng_init(&rng, seed, (uint64_t)pattern);
  const size_t large_base = ((size_t)1 << 20) / (size_t)P;  // ~1 MiB sent per rank
  for (int s = 0; s < P; s++) {
    for (int d = 0; d < P; d++) {
      size_t c = 0;
      switch (pattern) {
        case PAT_UNIFORM:
          c = 37;
          break;
        case PAT_ALL_ZERO:
          c = 0;
          break;
        case PAT_SELF_ONLY:
          c = s == d ? 41 + (size_t)s : 0;
          break;
        case PAT_LARGE:
          c = large_base / 2 + moe_rng_u32(&rng) % large_base;
          break;
        default: {  // random with about a quarter of zeros
          const uint32_t a = moe_rng_u32(&rng), b = moe_rng_u32(&rng);
          c = a % 4 == 0 ? 0 : b % 300;
        }
      }
      if (pattern == PAT_SENDER_SILENT && s == (P > 1 ? 1 : 0)) c = 0;
      if (pattern == PAT_RECEIVER_SILENT && d == P - 1) c = 0;
      C[(size_t)s * P + d] = c;
    }
  }
}

// ---- buffers of one run ---------------------------------------------------------------------

typedef struct {
  int P, rank;
  size_t *send_counts, *send_displs, *recv_counts, *recv_displs;  // (P) each
  unsigned char *send, *recv, *ref, *garbage;
  unsigned char *in_block;        // (recv_bytes + 1): 1 where a received block lies
  unsigned char *expect;          // (recv_bytes + 1): the expected payload in the blocks
  size_t send_bytes, recv_bytes;  // buffer sizes, gaps included
  int *isc, *isd, *irc, *ird;     // int copies for the MPI_Alltoallv reference
} run_bufs;

static void bufs_free(run_bufs *b) {
  free(b->send_counts);
  free(b->send_displs);
  free(b->recv_counts);
  free(b->recv_displs);
  free(b->send);
  free(b->recv);
  free(b->ref);
  free(b->garbage);
  free(b->in_block);
  free(b->expect);
  free(b->isc);
  free(b->isd);
  free(b->irc);
  free(b->ird);
  memset(b, 0, sizeof *b);
}

// Lays out P blocks of counts[] in a buffer. scattered = 0: packed in rank
// order; 1: a random order with random gaps, and empty blocks pointing anywhere.
// Returns the buffer size.
static size_t lay_out(const size_t *counts, size_t *displs, int P, int scattered, moe_rng *rng,
                      int *order) {
  for (int i = 0; i < P; i++) order[i] = i;
  if (scattered) {
    for (int i = P - 1; i > 0; i--) {  // Fisher-Yates
      const int j = (int)(moe_rng_u32(rng) % (uint32_t)(i + 1));
      const int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
  }
  size_t off = scattered ? moe_rng_u32(rng) % 8 : 0;
  for (int i = 0; i < P; i++) {
    const int r = order[i];
    displs[r] = off;
    off += counts[r];
    if (scattered) off += moe_rng_u32(rng) % 8;
  }
  if (scattered) {
    for (int r = 0; r < P; r++) {
      if (counts[r] == 0) displs[r] = off > 0 ? moe_rng_u32(rng) % off : 0;
    }
  }
  return off;
}

static int bufs_make(run_bufs *b, const size_t *C, int P, int rank, int scattered, uint64_t seed) {
  memset(b, 0, sizeof *b);
  b->P = P;
  b->rank = rank;
  b->send_counts = calloc((size_t)P, sizeof(size_t));
  b->send_displs = calloc((size_t)P, sizeof(size_t));
  b->recv_counts = calloc((size_t)P, sizeof(size_t));
  b->recv_displs = calloc((size_t)P, sizeof(size_t));
  b->isc = calloc((size_t)P, sizeof(int));
  b->isd = calloc((size_t)P, sizeof(int));
  b->irc = calloc((size_t)P, sizeof(int));
  b->ird = calloc((size_t)P, sizeof(int));
  int *order = calloc((size_t)P, sizeof(int));
  if (!b->send_counts || !b->send_displs || !b->recv_counts || !b->recv_displs || !b->isc ||
      !b->isd || !b->irc || !b->ird || !order) {
    free(order);
    return 0;
  }
  for (int q = 0; q < P; q++) {
    b->send_counts[q] = C[(size_t)rank * P + q];
    b->recv_counts[q] = C[(size_t)q * P + rank];
  }
  moe_rng rng;
  moe_rng_init(&rng, seed, 1000 + (uint64_t)rank);  // layouts differ between ranks
  b->send_bytes = lay_out(b->send_counts, b->send_displs, P, scattered, &rng, order);
  b->recv_bytes = lay_out(b->recv_counts, b->recv_displs, P, scattered, &rng, order);
  free(order);
  // +1: never malloc(0); buffers of all-empty runs stay valid pointers.
  b->send = malloc(b->send_bytes + 1);
  b->recv = malloc(b->recv_bytes + 1);
  b->ref = malloc(b->recv_bytes + 1);
  b->garbage = malloc(b->recv_bytes + 1);
  b->in_block = calloc(b->recv_bytes + 1, 1);
  b->expect = calloc(b->recv_bytes + 1, 1);
  if (!b->send || !b->recv || !b->ref || !b->garbage || !b->in_block || !b->expect) return 0;
  for (int s = 0; s < P; s++) {
    memset(b->in_block + b->recv_displs[s], 1, b->recv_counts[s]);
    payload_fill(b->expect + b->recv_displs[s], s, rank, b->recv_counts[s]);
  }
  memset(b->send, 0xee, b->send_bytes + 1);
  for (int d = 0; d < P; d++) payload_fill(b->send + b->send_displs[d], rank, d, b->send_counts[d]);
  for (int q = 0; q < P; q++) {
    b->isc[q] = (int)b->send_counts[q];
    b->isd[q] = (int)b->send_displs[q];
    b->irc[q] = (int)b->recv_counts[q];
    b->ird[q] = (int)b->recv_displs[q];
  }
  return 1;
}

// Fresh random garbage in recv (xorshift64* seeded from the test's RNG).
static void fill_garbage(run_bufs *b, moe_rng *rng) {
  uint64_t x = ((uint64_t)moe_rng_u32(rng) << 32 | moe_rng_u32(rng)) | 1;
  for (size_t i = 0; i <= b->recv_bytes; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const uint64_t v = x * 0x2545f4914f6cdd1dULL;
    for (size_t k = 0; k < 8 && i + k <= b->recv_bytes; k++) {
      b->garbage[i + k] = (unsigned char)(v >> (8 * k));
    }
  }
  memcpy(b->recv, b->garbage, b->recv_bytes + 1);
}

// 1 if recv equals the MPI_Alltoallv result in every block, still holds this
// call's garbage in the gaps, and holds the expected payload.
static int check_recv(const run_bufs *b, const char *what) {
  for (size_t i = 0; i <= b->recv_bytes; i++) {
    const unsigned char want = b->in_block[i] ? b->ref[i] : b->garbage[i];
    if (b->recv[i] != want) {
      TU_CHECK(
          0, "%s: rank %d: byte %zu is 0x%02x, expected 0x%02x (%s)", what, b->rank, i, b->recv[i],
          want,
          b->in_block[i] ? "differs from MPI_Alltoallv" : "in a gap: written outside the blocks");
      return 0;
    }
  }
  for (size_t i = 0; i <= b->recv_bytes; i++) {
    if (b->in_block[i] && b->recv[i] != b->expect[i]) {
      TU_CHECK(0, "%s: rank %d: byte %zu is 0x%02x, expected payload 0x%02x", what, b->rank, i,
               b->recv[i], b->expect[i]);
      return 0;
    }
  }
  tu_checks++;
  return 1;
}

// ---- layouts ------------------------------------------------------------------------------------

typedef struct {
  char name[48];
  MPI_Comm comm;       // the communicator the group is built over (world or a split)
  int *world_node_of;  // (world size): node of every world rank
  int expect_uniform;  // -1: do not check
} layout;

// Checks the group's topology fields against the node map.
static void check_group(const moe_group *g, const layout *L) {
  const int P = g->size;
  int *world_of = malloc((size_t)P * sizeof(int));
  if (!world_of) return;
  MPI_Allgather(&g_world_rank, 1, MPI_INT, world_of, 1, MPI_INT, g->comm);
  int lr = 0, ls = 0, ok = 1;
  const int my_key = L->world_node_of[g_world_rank];
  for (int q = 0; q < P; q++) {
    const int key = L->world_node_of[world_of[q]];
    if (key == my_key) {
      ls++;
      if (q < g->rank) lr++;
    }
    for (int q2 = 0; q2 < P; q2++) {  // same node id <=> same key
      const int same_key = L->world_node_of[world_of[q2]] == key;
      ok &= same_key == (g->node_of[q2] == g->node_of[q]);
    }
  }
  TU_CHECK(ok, "%s: node_of does not follow the node map", L->name);
  TU_CHECK(g->local_rank == lr && g->local_size == ls && g->local_rank_of[g->rank] == lr,
           "%s: rank %d: local rank %d of %d, expected %d of %d", L->name, g->rank, g->local_rank,
           g->local_size, lr, ls);
  int intra_size = 0, inter_size = 0, inter_rank = 0;
  MPI_Comm_size(g->intra, &intra_size);
  MPI_Comm_size(g->inter, &inter_size);
  MPI_Comm_rank(g->inter, &inter_rank);
  TU_CHECK(intra_size == ls, "%s: intra communicator has %d ranks, expected %d", L->name,
           intra_size, ls);
  if (L->expect_uniform >= 0) {
    TU_CHECK(g->uniform == L->expect_uniform, "%s: uniform is %d, expected %d", L->name, g->uniform,
             L->expect_uniform);
  }
  if (g->uniform) {
    TU_CHECK(inter_size == g->num_nodes && inter_rank == g->node,
             "%s: inter communicator: rank %d of %d, expected %d of %d", L->name, inter_rank,
             inter_size, g->node, g->num_nodes);
  }
  free(world_of);
}

// ---- one algorithm on one group -------------------------------------------------------------

static double g_time_algo[16];

static void run_pattern(const moe_a2a_algo *algo, const moe_group *g, MPI_Comm ref_comm,
                        moe_workspace *ws, int pattern, int scattered, const char *lname) {
  const int P = g->size;
  char what[160];
  snprintf(what, sizeof what, "algo=%s layout=%s pattern=%s buffers=%s grouped_size=%d", algo->name,
           lname, k_pattern_names[pattern], scattered ? "scattered" : "packed", g->grouped_size);
  size_t *C = malloc((size_t)P * P * sizeof(size_t));
  run_bufs b;
  const uint64_t seed = 0x5eed0000u + (uint64_t)P;
  int ok = C != NULL;
  if (ok) gen_counts(pattern, seed, P, C);
  ok = ok && bufs_make(&b, C, P, g->rank, scattered, seed + (uint64_t)pattern);
  TU_CHECK(ok, "%s: out of memory in the test", what);
  if (!ok) {
    free(C);
    return;
  }
  moe_rng rng;
  moe_rng_init(&rng, seed ^ 0xabcdef, 2000 + (uint64_t)g->rank);
  // reference
  fill_garbage(&b, &rng);
  memcpy(b.ref, b.garbage, b.recv_bytes + 1);
  MPI_Alltoallv(b.send, b.isc, b.isd, MPI_BYTE, b.ref, b.irc, b.ird, MPI_BYTE, ref_comm);
  // first call (may grow the workspace)
  fill_garbage(&b, &rng);
  const double t0 = MPI_Wtime();
  moe_status st = moe_a2a_run(g_ctx, algo, g, b.send, b.send_counts, b.send_displs, b.recv,
                              b.recv_counts, b.recv_displs, ws);
  const double t1 = MPI_Wtime();
  TU_CHECK(st == MOE_STATUS_OK, "%s: rank %d: status %s: %s", what, g->rank, moe_status_str(st),
           moe_ctx_error(g_ctx));
  if (st == MOE_STATUS_OK) check_recv(&b, what);
  // second identical call: no growth, no allocation
  fill_garbage(&b, &rng);
  const size_t cap = ws->capacity;
  const uint64_t allocs = moe_alloc_count();
  st = moe_a2a_run(g_ctx, algo, g, b.send, b.send_counts, b.send_displs, b.recv, b.recv_counts,
                   b.recv_displs, ws);
  TU_CHECK(st == MOE_STATUS_OK, "%s (2nd call): rank %d: status %s: %s", what, g->rank,
           moe_status_str(st), moe_ctx_error(g_ctx));
  TU_CHECK(ws->capacity == cap && moe_alloc_count() == allocs,
           "%s: rank %d: the second identical call grew the workspace (%zu -> %zu bytes) or "
           "allocated (%llu times)",
           what, g->rank, cap, ws->capacity, (unsigned long long)(moe_alloc_count() - allocs));
  if (st == MOE_STATUS_OK) check_recv(&b, what);
  // the nonblocking form (blocking for algorithms without one): a zeroed
  // handle is idle; a second start on a busy handle is refused; test polls to
  // completion and the result equals MPI_Alltoallv's
  {
    fill_garbage(&b, &rng);
    moe_a2a_pending pend;
    memset(&pend, 0, sizeof pend);
    int done = 0;
    st = moe_a2a_test(g_ctx, &pend, &done);
    TU_CHECK(st == MOE_STATUS_OK && done == 1, "%s: a zeroed pending handle is not idle", what);
    st = moe_a2a_start(g_ctx, algo, g, b.send, b.send_counts, b.send_displs, b.recv, b.recv_counts,
                       b.recv_displs, ws, &pend);
    TU_CHECK(st == MOE_STATUS_OK, "%s (start): rank %d: %s", what, g->rank, moe_ctx_error(g_ctx));
    TU_CHECK(pend.active == (algo->start != NULL), "%s: start left active=%d", what, pend.active);
    if (pend.active) {
      const moe_status again = moe_a2a_start(g_ctx, algo, g, b.send, b.send_counts, b.send_displs,
                                             b.recv, b.recv_counts, b.recv_displs, ws, &pend);
      TU_CHECK(again == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(g_ctx), "in flight"),
               "%s: a second start on a busy handle must be refused: %s", what,
               moe_ctx_error(g_ctx));
    }
    // poll with short sleeps (a spinning rank starves the others when
    // ranks outnumber cores); bounded at ~100 s
    for (long polls = 0; st == MOE_STATUS_OK && polls < 2000000L; polls++) {
      st = moe_a2a_test(g_ctx, &pend, &done);
      if (done) break;
      const struct timespec nap = {0, 50000};
      nanosleep(&nap, NULL);
    }
    TU_CHECK(st == MOE_STATUS_OK && done && !pend.active, "%s (test): rank %d: %s", what, g->rank,
             moe_ctx_error(g_ctx));
    if (st == MOE_STATUS_OK && done) check_recv(&b, what);
  }
  int n_list = 0;
  const moe_a2a_algo *const *list = moe_a2a_list(&n_list);
  for (int idx = 0; idx < n_list && idx < 16; idx++) {
    if (list[idx] == algo) g_time_algo[idx] += t1 - t0;
  }
  bufs_free(&b);
  free(C);
}

static void run_algo(const moe_a2a_algo *algo, const moe_group *g, MPI_Comm ref_comm,
                     const char *lname, int patterns_mask) {
  if (algo->needs_uniform_nodes && !g->uniform) {
    // Must fail on every rank before any communication (so no rank hangs).
    moe_ctx_clear_error(g_ctx);
    const moe_status st = moe_a2a_run(g_ctx, algo, g, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(g_ctx), algo->name),
             "algo=%s layout=%s: non-uniform nodes: status %s (%s), expected invalid argument "
             "naming the algorithm",
             algo->name, lname, moe_status_str(st), moe_ctx_error(g_ctx));
    return;
  }
  moe_workspace ws = {0};
  for (int p = 0; p < PAT_COUNT; p++) {
    if (!(patterns_mask & (1 << p))) continue;
    for (int scattered = 0; scattered < 2; scattered++) {
      run_pattern(algo, g, ref_comm, &ws, p, scattered, lname);
    }
  }
  moe_workspace_free(&ws);
}

static void run_layout(const layout *L) {
  moe_group g;
  const moe_status st = moe_group_init(g_ctx, &g, L->comm, L->world_node_of[g_world_rank]);
  TU_CHECK(st == MOE_STATUS_OK, "%s: moe_group_init: %s", L->name, moe_ctx_error(g_ctx));
  if (st != MOE_STATUS_OK) return;
  check_group(&g, L);
  int n_algo = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&n_algo);
  const int all = (1 << PAT_COUNT) - 1;
  for (int a = 0; a < n_algo; a++) run_algo(algos[a], &g, L->comm, L->name, all);
  // grouped under explicit group sizes (the default 0 ran above)
  const moe_a2a_algo *grouped = NULL;
  if (moe_a2a_find(g_ctx, "grouped", &grouped) == MOE_STATUS_OK) {
    const int sizes[4] = {1, 2, 3, g.size};
    for (int i = 0; i < 4; i++) {
      if (sizes[i] > g.size || (i == 3 && g.size <= 3)) continue;
      g.grouped_size = sizes[i];
      const int some = (1 << PAT_RANDOM) | (1 << PAT_SENDER_SILENT) | (1 << PAT_RECEIVER_SILENT) |
                       (1 << PAT_LARGE);
      run_algo(grouped, &g, L->comm, L->name, some);
    }
    // a negative group size fails on every rank, before any communication
    size_t *zeros = calloc((size_t)g.size, sizeof(size_t));
    if (zeros) {
      g.grouped_size = -1;
      const moe_status gst =
          moe_a2a_run(g_ctx, grouped, &g, NULL, zeros, zeros, NULL, zeros, zeros, NULL);
      TU_CHECK(gst == MOE_STATUS_INVALID_ARG, "%s: grouped with group size -1: status %s", L->name,
               moe_status_str(gst));
      free(zeros);
    }
    g.grouped_size = 0;
  }
  moe_group_free(&g);
}

// ---- fixed-order sums (moe_allreduce_fixed, moe_sum_slices_ordered) --------------------------

// Every rank's input is generated from (rank, index), so each rank can compute
// the expected result alone: the pairwise tree over ranks (rank 2i's value +
// rank 2i+1's, then pairs of pairs; a rank without a partner passes its value
// up), and the left-to-right sum of every slice in rank order. Both must match
// bitwise. Values span many magnitudes so that another order gives other bits.
static float fixed_input(int rank, size_t i) {
  const uint64_t h = (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);
  const float mant = (float)((h >> 40) & 0xffffff) / 16777216.0f - 0.5f;
  return ldexpf(mant, (int)((h >> 20) % 24) - 12);
}

static void tree_expect(float *out, size_t n, int lo, int count) {
  // sum over ranks [lo, lo + count) as the pairwise tree with blocks of powers of two
  if (count == 1) {
    for (size_t i = 0; i < n; i++) out[i] = fixed_input(lo, i);
    return;
  }
  int half = 1;
  while (half * 2 < count) half *= 2;
  float *hi = malloc(n * sizeof(float));
  if (!hi) MPI_Abort(MPI_COMM_WORLD, 2);
  tree_expect(out, n, lo, half);
  tree_expect(hi, n, lo + half, count - half);
  for (size_t i = 0; i < n; i++) out[i] = out[i] + hi[i];
  free(hi);
}

static void test_fixed_sums(void) {
  const int P = g_world_size, me = g_world_rank;
  // each size twice with a kept state (the second call without an agreement: the
  // buffer of the first), then the last size without a state (NULL)
  const size_t sizes[] = {1, 1, 7, 7, 100003, 100003, 1000, 1000, 100003};
  moe_fixed_sum fs;
  memset(&fs, 0, sizeof fs);
  for (size_t q = 0; q < sizeof sizes / sizeof sizes[0]; q++) {
    const size_t n = sizes[q];
    moe_fixed_sum *state = q + 1 < sizeof sizes / sizeof sizes[0] ? &fs : NULL;
    float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    if (!got || !want) MPI_Abort(MPI_COMM_WORLD, 2);
    for (size_t i = 0; i < n; i++) got[i] = fixed_input(me, i);
    const moe_status st = moe_allreduce_fixed(g_ctx, state, got, n, MPI_COMM_WORLD, "test sum");
    TU_CHECK(st == MOE_STATUS_OK, "allreduce_fixed n=%zu: %s", n, moe_ctx_error(g_ctx));
    tree_expect(want, n, 0, P);
    TU_CHECK(memcmp(got, want, n * sizeof(float)) == 0,
             "allreduce_fixed n=%zu P=%d call %zu: not the pairwise tree over ranks (rank %d)", n,
             P, q, me);
    // and MPI's own sum is close (the same numbers, another order)
    double maxd = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
      got[i] = fixed_input(me, i);
      scale = fmax(scale, fabs((double)want[i]));
    }
    MPI_Allreduce(MPI_IN_PLACE, got, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++) maxd = fmax(maxd, fabs((double)got[i] - (double)want[i]));
    TU_CHECK(maxd <= 1e-5 * scale * P, "allreduce_fixed n=%zu: differs from MPI_SUM by %g", n,
             maxd);
    free(got);
    free(want);
  }
  // sizes that differ between ranks: refused on every rank, naming both sizes (no hang); the
  // state still works after it
  if (P > 1) {
    float v[3] = {1, 2, 3};
    const size_t n = me == P - 1 ? 3 : 2;
    const moe_status st = moe_allreduce_fixed(g_ctx, &fs, v, n, MPI_COMM_WORLD, "test sum");
    TU_CHECK(
        st == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(g_ctx),
                                               "test sum (fixed order): the ranks pass different "
                                               "sizes (from 2 to 3 floats)"),
        "allreduce_fixed with n 2 and 3: status %d, '%s' (rank %d)", (int)st, moe_ctx_error(g_ctx),
        me);
    v[0] = 1.0f;
    TU_CHECK(moe_allreduce_fixed(g_ctx, &fs, v, 1, MPI_COMM_WORLD, "test sum") == MOE_STATUS_OK &&
                 v[0] == (float)P,
             "allreduce_fixed after a refused call: %s", moe_ctx_error(g_ctx));
  }
  moe_fixed_sum_free(&fs);
  moe_fixed_sum_free(&fs);  // a freed state is zeroed: freeing again is a no-op
  // ordered slices: rank r holds r % 3 slices (0 included) of 5 doubles
  const int nv = 5, mine = me % 3;
  double local[2 * 5], out[5], want[5] = {0, 0, 0, 0, 0};
  for (int sl = 0; sl < mine; sl++) {
    for (int j = 0; j < nv; j++)
      local[sl * nv + j] = (double)fixed_input(me, (size_t)(sl * nv + j)) * 1e3;
  }
  const moe_status st =
      moe_sum_slices_ordered(g_ctx, local, mine, nv, out, MPI_COMM_WORLD, "test sum");
  TU_CHECK(st == MOE_STATUS_OK, "sum_slices_ordered: %s", moe_ctx_error(g_ctx));
  for (int r = 0; r < P; r++) {
    for (int sl = 0; sl < r % 3; sl++) {
      for (int j = 0; j < nv; j++) want[j] += (double)fixed_input(r, (size_t)(sl * nv + j)) * 1e3;
    }
  }
  TU_CHECK(memcmp(out, want, sizeof want) == 0, "sum_slices_ordered P=%d: not the ordered sum", P);
}

// ---- registry and topology ------------------------------------------------------------------

static void test_registry(void) {
  int n = 0;
  const moe_a2a_algo *const *list = moe_a2a_list(&n);
  // one entry per src/comm/alltoall_<name>.c (counted by CMake): a file whose
  // registry line is missing fails here
  TU_CHECK(n == MOE_TEST_A2A_CATALOGUE_COUNT,
           "moe_a2a_list: %d algorithms, but src/comm/ has %d alltoall_<name>.c files (one "
           "X(<name>) line each in MOE_A2A_CATALOG)",
           n, MOE_TEST_A2A_CATALOGUE_COUNT);
  for (int i = 0; i < n; i++) {
    const moe_a2a_algo *found = NULL;
    const moe_status st = moe_a2a_find(g_ctx, list[i]->name, &found);
    TU_CHECK(st == MOE_STATUS_OK && found == list[i], "moe_a2a_find('%s') failed", list[i]->name);
    TU_CHECK(list[i]->source && list[i]->cost && list[i]->run && list[i]->model,
             "algorithm '%s' lacks a field", list[i]->name);
    for (int j = 0; j < i; j++) {
      TU_CHECK(strcmp(list[i]->name, list[j]->name) != 0, "algorithm '%s' is registered twice",
               list[i]->name);
    }
  }
  const moe_a2a_algo *found = NULL;
  moe_status st = moe_a2a_find(g_ctx, "no-such-algo", &found);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(g_ctx), "no-such-algo") &&
               strstr(moe_ctx_error(g_ctx), "pairwise"),
           "moe_a2a_find(unknown): status %s, message '%s'", moe_status_str(st),
           moe_ctx_error(g_ctx));
  st = moe_a2a_find(g_ctx, NULL, &found);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "moe_a2a_find(NULL): status %s", moe_status_str(st));
}

static void test_topology(void) {
  const int P = g_world_size;
  int *out = malloc((size_t)P * sizeof(int));
  if (!out) return;
  for (int rpn = 1; rpn <= P; rpn++) {
    const moe_status st = moe_topology_nodes(g_ctx, MPI_COMM_WORLD, rpn, out);
    if (P % rpn == 0) {
      int ok = st == MOE_STATUS_OK;
      for (int r = 0; r < P && ok; r++) ok = out[r] == r / rpn;
      TU_CHECK(ok, "moe_topology_nodes(rpn=%d): status %s", rpn, moe_status_str(st));
    } else {
      TU_CHECK(st == MOE_STATUS_INVALID_ARG, "moe_topology_nodes(rpn=%d, P=%d): status %s", rpn, P,
               moe_status_str(st));
    }
  }
  moe_status st = moe_topology_nodes(g_ctx, MPI_COMM_WORLD, -1, out);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "moe_topology_nodes(rpn=-1): status %s",
           moe_status_str(st));
  st = moe_topology_nodes(g_ctx, MPI_COMM_WORLD, 0, out);  // shared memory (or the env override)
  int ok = st == MOE_STATUS_OK && out[0] == 0;
  for (int r = 0; r < P && ok; r++) ok = out[r] >= 0 && out[r] < P;
  TU_CHECK(ok, "moe_topology_nodes(rpn=0): status %s", moe_status_str(st));
  // the MOE_RANKS_PER_NODE override (set the same on every rank), then restored
  const char *prev_env = getenv("MOE_RANKS_PER_NODE");
  char prev[64] = "";
  if (prev_env) snprintf(prev, sizeof prev, "%s", prev_env);
  setenv("MOE_RANKS_PER_NODE", "1", 1);
  st = moe_topology_nodes(g_ctx, MPI_COMM_WORLD, 0, out);
  ok = st == MOE_STATUS_OK;
  for (int r = 0; r < P && ok; r++) ok = out[r] == r;
  TU_CHECK(ok, "moe_topology_nodes with MOE_RANKS_PER_NODE=1: status %s", moe_status_str(st));
  setenv("MOE_RANKS_PER_NODE", "two", 1);
  st = moe_topology_nodes(g_ctx, MPI_COMM_WORLD, 0, out);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(g_ctx), "MOE_RANKS_PER_NODE"),
           "moe_topology_nodes with MOE_RANKS_PER_NODE=two: status %s", moe_status_str(st));
  if (prev_env) {
    setenv("MOE_RANKS_PER_NODE", prev, 1);
  } else {
    unsetenv("MOE_RANKS_PER_NODE");
  }
  free(out);
}

// moe_comm_cpu_share: one rank alone has a core; on a machine (the tests run on
// one: its MPI shared-memory domain), every rank gets
// min(1, cores / ranks), the cores being the union of the ranks' affinity masks
// (Open MPI binds 2 ranks to a core each, and leaves oversubscribed ranks unbound).
static void test_cpu_share(void) {
  double share = -1.0;
  moe_status st = moe_comm_cpu_share(g_ctx, MPI_COMM_SELF, &share);
  TU_CHECK(st == MOE_STATUS_OK && share == 1.0, "cpu share of one rank: %s, %g", moe_status_str(st),
           share);
  st = moe_comm_cpu_share(g_ctx, MPI_COMM_WORLD, &share);
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_world_rank, MPI_INFO_NULL, &host);
  int local = 1;
  MPI_Comm_size(host, &local);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) CPU_ZERO(&set);
  MPI_Allreduce(MPI_IN_PLACE, &set, (int)sizeof set, MPI_BYTE, MPI_BOR, host);
  const int cores = CPU_COUNT(&set);
  double lo = share, hi = share;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, host);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, host);
  MPI_Comm_free(&host);
  const double want = cores < 1 || cores >= local ? 1.0 : (double)cores / local;
  TU_CHECK(st == MOE_STATUS_OK && share > 0.0 && share <= 1.0 && lo == hi &&
               (cores < 1 || share == want),
           "cpu share %g (host: %d ranks, %d cores: want %g; %g..%g over the host)", share, local,
           cores, want, lo, hi);
  st = moe_comm_cpu_share(g_ctx, MPI_COMM_WORLD, NULL);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "cpu share into NULL: %s", moe_status_str(st));
}

// ---- main ---------------------------------------------------------------------------------------

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world_size);
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--verbose") == 0) g_verbose = 1;
  }
  const double t_start = MPI_Wtime();
  if (moe_ctx_create(&g_ctx) != MOE_STATUS_OK) MPI_Abort(MPI_COMM_WORLD, 2);
  const int P = g_world_size;
  test_registry();
  test_topology();
  test_cpu_share();
  test_fixed_sums();

  layout L;
  L.comm = MPI_COMM_WORLD;
  L.world_node_of = malloc((size_t)P * sizeof(int));
  if (!L.world_node_of) MPI_Abort(MPI_COMM_WORLD, 2);
  // uniform: ranks-per-node 1..4 where it divides P
  for (int rpn = 1; rpn <= 4; rpn++) {
    if (P % rpn != 0) continue;
    snprintf(L.name, sizeof L.name, "rpn%d", rpn);
    for (int r = 0; r < P; r++) L.world_node_of[r] = r / rpn;
    L.expect_uniform = 1;
    run_layout(&L);
  }
  if (P >= 3) {                                     // non-uniform layouts
    snprintf(L.name, sizeof L.name, "last_alone");  // {0, .., 0, 1}
    for (int r = 0; r < P; r++) L.world_node_of[r] = r == P - 1;
    L.expect_uniform = 0;
    run_layout(&L);
    snprintf(L.name, sizeof L.name, "first_alone");  // {0, 1, .., 1}
    for (int r = 0; r < P; r++) L.world_node_of[r] = r != 0;
    run_layout(&L);
    snprintf(L.name, sizeof L.name, "interleaved");  // {0, 1, 0, 1, ..}: not node-contiguous
    for (int r = 0; r < P; r++) L.world_node_of[r] = r % 2;
    run_layout(&L);
  }
  if (P >= 4) {  // a group over a sub-communicator: world ranks of one parity
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, g_world_rank % 2, g_world_rank, &sub);
    snprintf(L.name, sizeof L.name, "parity%d_of_rpn4", g_world_rank % 2);
    for (int r = 0; r < P; r++) L.world_node_of[r] = r / 4;
    L.comm = sub;
    L.expect_uniform = -1;
    run_layout(&L);
    MPI_Comm_free(&sub);
  }
  free(L.world_node_of);

  if (g_verbose) {
    int n = 0;
    const moe_a2a_algo *const *list = moe_a2a_list(&n);
    for (int a = 0; a < n && a < 16; a++) {
      double t = 0;
      MPI_Reduce(&g_time_algo[a], &t, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (g_world_rank == 0) printf("  %-8s %.3f s in first calls\n", list[a]->name, t);
    }
  }
  // Collective result: every rank fails if any did; rank 0 prints the sums.
  const int rc = tu_mpi_finish("test_a2a");
  if (g_verbose && g_world_rank == 0) printf("  total %.2f s\n", MPI_Wtime() - t_start);
  moe_ctx_destroy(g_ctx);
  MPI_Finalize();
  return rc;
}
