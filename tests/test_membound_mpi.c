// The memory bound under MPI: moe_ep_layer_memory against what the
// expert-parallel layer really allocates (moe_alloc_bytes around create and a
// forward + backward whose routing sends every token to rank 0's experts, the
// worst case the estimate is sized for), for several all-to-alls, schedules,
// chunk counts, compressors and node layouts, and with the deterministic
// mode's fixed-order sums (their kept receive buffers); the resident set of
// growing workspaces (moe_heap_trim); and moe_comm_memory_check,
// which must refuse on every rank with the same message naming the rank that
// does not fit, and pass when all fit.
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "moe/parallel.h"
#include "testutil.h"

// A sanitizer build (gcc defines __SANITIZE_*__, clang answers __has_feature):
// its allocator keeps freed blocks on purpose, so RSS is not the heap's.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MOE_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define MOE_TEST_SANITIZED 1
#endif
#endif
#ifndef MOE_TEST_SANITIZED
#define MOE_TEST_SANITIZED 0
#endif

static int g_rank, g_world;
static moe_ctx *g_ctx;

// How far below the estimate rank 0 may stay: the fixed structures' allowance.
#define SLACK_BYTES ((double)(16 << 10))

static int g_copy_slots;  // expert copy slots of load balancing (pc.copy_slots)
static double g_topo;     // the topology-aware gate (pc.topo_gate)
static int g_defer;       // deferred Agg (pc.defer_agg)

static void test_ep_layer(const char *a2a, const char *schedule, int chunks, const char *compress,
                          int ranks_per_node, int slice_tokens) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.tokens = 64;
  c.model_dim = 64;
  c.hidden_dim = 40;
  c.num_experts = 2 * g_world;  // 2 per rank: top-2 fits in rank 0's experts
  c.top_k = 2;
  c.capacity_factor = -1;  // dropless: rank 0 receives every row
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  pc.ep_size = g_world;
  pc.ranks_per_node = ranks_per_node;
  snprintf(pc.a2a, sizeof pc.a2a, "%s", a2a);
  snprintf(pc.schedule, sizeof pc.schedule, "%s", schedule);
  snprintf(pc.compress, sizeof pc.compress, "%s", compress);
  pc.chunks = chunks;
  // fixed-order sums: EP 1 (DP = every rank), so the home experts' sum runs too
  pc.slice_tokens = slice_tokens;
  if (slice_tokens > 0) pc.ep_size = 1;
  pc.copy_slots = pc.ep_size > 1 ? g_copy_slots : 0;
  pc.topo_gate = g_topo;
  pc.defer_agg = pc.copy_slots > 0 ? g_defer : 0;
  moe_memory_need need;
  TU_CHECK(moe_ep_layer_memory(g_ctx, &c, &pc, g_world, ranks_per_node, &need) == MOE_STATUS_OK,
           "ep memory: %s", moe_ctx_error(g_ctx));
  // the peak of the live bytes: workspaces grow by replacing their block
  const uint64_t before = moe_alloc_live_bytes();
  moe_alloc_peak_reset();
  moe_ep_layer *L = NULL;
  if (moe_ep_layer_create(g_ctx, MPI_COMM_WORLD, &c, &pc, &L) != MOE_STATUS_OK) {
    TU_CHECK(0, "create %s %s r=%d %s: %s", a2a, schedule, chunks, compress, moe_ctx_error(g_ctx));
    return;
  }
  // Parameters are zero: every gate logit ties, so top-2 picks experts 0 and 1,
  // rank 0's; x and dy must merely be finite.
  const size_t tm = (size_t)c.tokens * (size_t)c.model_dim;
  float *x = tu_filled(tm, 3 + (uint64_t)g_rank, -1, 1), *dy = tu_filled(tm, 9, -1, 1);
  float *y = tu_fbuf(tm), *dx = tu_fbuf(tm);
  TU_CHECK(moe_ep_layer_forward(L, x, c.tokens, y, NULL) == MOE_STATUS_OK, "forward: %s",
           moe_ctx_error(g_ctx));
  TU_CHECK(moe_ep_layer_backward(L, dy, dx) == MOE_STATUS_OK, "backward: %s", moe_ctx_error(g_ctx));
  TU_CHECK(moe_ep_layer_grads_wait(L) == MOE_STATUS_OK, "grads_wait: %s", moe_ctx_error(g_ctx));
  // tu_* buffers are not moe_malloc's. Usable sizes exceed the requests: by a
  // few bytes, and up to a page for blocks the C library maps (the first large
  // ones of a process), hence 2 x SLACK_BYTES above the estimate.
  const double got = (double)(moe_alloc_peak_bytes() - before);
  const double est = moe_memory_need_total(&need);
  // Every rank: the estimate bounds the allocation. Rank 0 receives the most
  // rows there can be: its allocation is the estimate, up to the fixed structures.
  TU_CHECK(got <= est + 2 * SLACK_BYTES,
           "rank %d %s %s r=%d %s G=%d: allocated %.0f > estimate %.0f", g_rank, a2a, schedule,
           chunks, compress, ranks_per_node, got, est);
  // (the hierarchical all-to-alls' workspace is a bound: its growth steps vary)
  if (g_rank == 0 && ranks_per_node == 0) {
    TU_CHECK(got >= est - SLACK_BYTES,
             "rank 0 %s %s r=%d %s G=%d: allocated %.0f, estimate %.0f (more than %.0f apart)", a2a,
             schedule, chunks, compress, ranks_per_node, got, est, SLACK_BYTES);
  }
  if (pc.ep_size > 1) {  // (EP 1 exchanges nothing: no skew)
    TU_CHECK(need.skew_bytes > 0 && need.skew_bytes < est, "skew bytes %.0f of %.0f",
             need.skew_bytes, est);
  }
  // the prediction: the routing-dependent part halfway, strictly between
  // balanced routing and the bound when anything depends on the routing
  const double expect = moe_memory_need_expected(&need);
  TU_CHECK(pc.ep_size > 1 ? expect < est && expect > est - need.skew_bytes : expect == est,
           "expected %.0f, bound %.0f, skew %.0f", expect, est, need.skew_bytes);
  moe_ep_layer_destroy(L);
}

// Workspaces grown the way the expert-parallel layers' receive buffers grow
// over a training run (several, interleaved, each replaced by a larger one):
// the replaced blocks' pages must go back to the system (moe_heap_trim), or
// the resident set exceeds what is allocated, which the estimate counts.
// glibc only (elsewhere the trim is a no-op); not under AddressSanitizer,
// whose quarantine keeps freed blocks on purpose.
static void test_workspace_trim(void) {
#if defined(__GLIBC__) && !MOE_TEST_SANITIZED
  enum { N = 12, STEPS = 10 };
  moe_workspace ws[N];
  memset(ws, 0, sizeof ws);
  const double mib = 1 << 20;
  const double rss0 = (double)moe_rss_bytes(), live0 = (double)moe_alloc_live_bytes();
  double most = 0;  // the most the workspaces held at once
  for (int step = 1; step <= STEPS; step++) {
    for (int i = 0; i < N; i++) {
      const size_t bytes = ((size_t)step * (size_t)(i % 5 + 1)) << 17;  // 128 KiB steps
      TU_CHECK(moe_workspace_reserve(g_ctx, &ws[i], bytes) == MOE_STATUS_OK, "reserve %zu: %s",
               bytes, moe_ctx_error(g_ctx));
      if (ws[i].buf) memset(ws[i].buf, 1, bytes);  // resident: touched
    }
    const double live = (double)moe_alloc_live_bytes() - live0;
    if (live > most) most = live;
  }
  const double grown = (double)moe_rss_bytes() - rss0;
  // (without the trim: 2-6 MiB above the 41 MiB held; 1 MiB: the heap's own
  // pages, partly used blocks and the top below the trim threshold)
  TU_CHECK(grown <= most + 1 * mib, "rank %d: RSS grew %.2f MiB, the workspaces hold %.2f MiB",
           g_rank, grown / mib, most / mib);
  for (int i = 0; i < N; i++) moe_workspace_free(&ws[i]);
#endif
}

static void test_check(void) {
  moe_memory_need n;
  memset(&n, 0, sizeof n);
  n.bytes[MOE_MEM_PARAMS] = 1 << 20;
  // everyone fits a 1 GiB limit, and the node's available memory
  TU_CHECK(moe_comm_memory_check(g_ctx, MPI_COMM_WORLD, &n, (size_t)1 << 30, NULL) == MOE_STATUS_OK,
           "1 MiB refused under 1 GiB: %s", moe_ctx_error(g_ctx));
  TU_CHECK(moe_comm_memory_check(g_ctx, MPI_COMM_WORLD, &n, 0, NULL) == MOE_STATUS_OK,
           "1 MiB refused under the available memory: %s", moe_ctx_error(g_ctx));
  // only the last rank does not fit: every rank refuses, naming it
  if (g_rank == g_world - 1) n.bytes[MOE_MEM_ACTIVATIONS] = 3.0 * (1 << 30);
  const moe_status st =
      moe_comm_memory_check(g_ctx, MPI_COMM_WORLD, &n, (size_t)2 << 30, "shrink it");
  char want[64], msg[1024], root[1024];
  snprintf(want, sizeof want, "rank %d of %d", g_world - 1, g_world);
  snprintf(msg, sizeof msg, "%s", moe_ctx_error(g_ctx));
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "rank %d: 3 GiB on rank %d accepted", g_rank, g_world - 1);
  TU_CHECK(strstr(msg, want) && strstr(msg, "activations 3.00 GiB") &&
               strstr(msg, "limit is 2.00 GiB") && strstr(msg, "--max-memory") &&
               strstr(msg, "shrink it"),
           "rank %d: message '%s'", g_rank, msg);
  memcpy(root, msg, sizeof root);
  MPI_Bcast(root, (int)sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  TU_CHECK(strcmp(root, msg) == 0, "rank %d's message differs from rank 0's", g_rank);
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  if (moe_ctx_create(&g_ctx) != MOE_STATUS_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  test_ep_layer("mpi", "sequential", 1, "none", 0, 0);
  test_ep_layer("mpi", "sequential", 1, "none", 0, 16);  // the fixed-order sums' buffers
  test_ep_layer("pairwise", "pipeline", 2, "fp16", 0, 0);
  test_ep_layer("pipe", "optsche", 3, "int8", 0, 0);
  test_ep_layer("grouped", "smart", 1, "none", 0, 0);
  g_copy_slots = 2;  // load balancing's copy slots are counted too (2 <= E - E/EP)
  test_ep_layer("mpi", "sequential", 1, "none", 0, 0);
  g_defer = 1;  // and deferred Agg's buffers for the copies' gradients
  test_ep_layer("mpi", "sequential", 1, "none", 0, 0);
  g_defer = 0;
  g_copy_slots = 0;
  if (g_world % 2 == 0) {
    test_ep_layer("1dh", "sequential", 2, "none", 2, 0);
    test_ep_layer("2dh", "pipeline", 2, "bf16", 2, 0);
    g_topo = 0.5;  // the topology-aware gate's mask and scratch (2 nodes)
    test_ep_layer("mpi", "sequential", 1, "none", 1, 0);
    g_topo = 0;
  }
  test_workspace_trim();
  test_check();
  moe_ctx_destroy(g_ctx);
  tu_free_all();
  int failures = tu_failures;
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  const int rc = tu_finish("test_membound_mpi");
  MPI_Finalize();
  return failures ? 1 : rc;
}
