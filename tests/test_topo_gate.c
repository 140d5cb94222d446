// FasterMoE's topology-aware gate (issue "Load balancing", item 4): at most
// floor(share x T x K) choices leave the node, the highest-scoring ones; the
// rest re-select the best local expert their token has not chosen.
//
// 1. moe_topo_gate_reselect on hand-worked cases (budget, ranking, ties,
//    distinct re-selections, a token with no local expert left, budget 0,
//    a budget that covers every off-node choice) and against a naive
//    reference (a different algorithm: repeated argmax) on random cases.
// 2. The single-process layer with moe_layer_set_topology: gradients by
//    finite differences; off = the plain gate bit for bit.
// 3. The distributed layer (4 ranks as 2 nodes of 2, EP 4): every rank's
//    routing, outputs and dx equal a single-process layer given that rank's
//    tokens and node (moe_layer_set_topology), the gradients their sum over
//    the ranks (relative 1e-5); the choices left on other nodes never exceed
//    the budget; on one node (4 ranks per node) the gate is the plain one,
//    bit for bit; a ratio out of range fails on every rank.
// Run under mpirun with 4 ranks (part 3 is skipped with fewer).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "moe/parallel.h"
#include "testutil.h"

#define REL_TOL 1e-5

static moe_ctx *ctx;
static int g_rank, g_world;

// ---- 1. the rule ------------------------------------------------------------------------------

static void test_hand(void) {
  // T 4, E 4, K 1; experts 0 and 1 local; share 0.25: budget floor(1) = 1.
  // Off-node first choices: t0 -> e2 (0.5), t1 -> e3 (0.6), t3 -> e2 (0.4):
  // t1 (highest) goes; t0 and t3 re-select their best local expert.
  const uint8_t local[4] = {1, 1, 0, 0};
  float scores[16] = {0.1f,  0.3f, 0.5f, 0.1f,    // t0: local best e1
                      0.2f,  0.1f, 0.1f, 0.6f,    // t1
                      0.7f,  0.1f, 0.1f, 0.1f,    // t2: local already
                      0.25f, 0.2f, 0.4f, 0.15f};  // t3: local best e0
  int32_t expert[4] = {2, 3, 0, 2};
  float topk_p[4] = {0.5f, 0.6f, 0.7f, 0.4f};
  uint64_t scratch[MOE_TOPO_SCRATCH_BYTES(4, 1) / 8];
  int n = moe_topo_gate_reselect(expert, topk_p, scores, scores, 4, 4, 1, local, 0.25, scratch);
  TU_CHECK(n == 2 && expert[0] == 1 && expert[1] == 3 && expert[2] == 0 && expert[3] == 0,
           "hand K=1: rerouted %d, experts %d %d %d %d (want 2: 1 3 0 0)", n, expert[0], expert[1],
           expert[2], expert[3]);
  TU_CHECK(topk_p[0] == 0.3f && topk_p[1] == 0.6f && topk_p[3] == 0.25f,
           "hand K=1: weights %g %g %g", (double)topk_p[0], (double)topk_p[1], (double)topk_p[3]);

  // K 2, E 4, one local expert (e0); share 0: budget 0, every off-node choice
  // re-selects. t0 chose (e2, e3): e2's slot takes e0; e3's slot finds no
  // local expert left and keeps e3. t1 chose (e0, e1): e1 cannot take e0 (its
  // token holds it) and stays.
  const uint8_t one[4] = {1, 0, 0, 0};
  float s2[8] = {0.1f, 0.2f, 0.4f, 0.3f, 0.5f, 0.3f, 0.1f, 0.1f};
  int32_t ex2[4] = {2, 3, 0, 1};
  float p2[4] = {0.4f, 0.3f, 0.5f, 0.3f};
  uint64_t scr2[MOE_TOPO_SCRATCH_BYTES(2, 2) / 8];
  n = moe_topo_gate_reselect(ex2, p2, s2, s2, 2, 4, 2, one, 0.0, scr2);
  TU_CHECK(n == 1 && ex2[0] == 0 && ex2[1] == 3 && ex2[2] == 0 && ex2[3] == 1,
           "hand K=2: rerouted %d, experts %d %d | %d %d (want 1: 0 3 | 0 1)", n, ex2[0], ex2[1],
           ex2[2], ex2[3]);
  TU_CHECK(p2[0] == 0.1f, "hand K=2: the re-selected weight is %g, not e0's 0.1", (double)p2[0]);

  // Ties: equal scores, the earlier choice goes (budget 1 of 2 choices).
  float s3[4] = {0.0f, 0.5f, 0.0f, 0.5f};  // T 2, E 2: e1 remote, both tokens chose it at 0.5
  int32_t ex3[2] = {1, 1};
  float p3[2] = {0.5f, 0.5f};
  const uint8_t l3[2] = {1, 0};
  uint64_t scr3[MOE_TOPO_SCRATCH_BYTES(2, 1) / 8];
  n = moe_topo_gate_reselect(ex3, p3, s3, s3, 2, 2, 1, l3, 0.5, scr3);
  TU_CHECK(n == 1 && ex3[0] == 1 && ex3[1] == 0, "tie: experts %d %d (want 1 0)", ex3[0], ex3[1]);

  // Two re-selections of one token (K 2, budget 0): e2's slot takes the best
  // local expert (e1), e3's the next one (e0).
  float s5[4] = {0.1f, 0.2f, 0.4f, 0.3f};
  int32_t ex5[2] = {2, 3};
  float p5[2] = {0.4f, 0.3f};
  uint64_t scr5[MOE_TOPO_SCRATCH_BYTES(1, 2) / 8];
  n = moe_topo_gate_reselect(ex5, p5, s5, s5, 1, 4, 2, local, 0.0, scr5);
  TU_CHECK(n == 2 && ex5[0] == 1 && ex5[1] == 0 && p5[0] == 0.2f && p5[1] == 0.1f,
           "two re-selections: rerouted %d, experts %d %d (want 2: 1 0)", n, ex5[0], ex5[1]);

  // A budget that covers every off-node choice changes nothing.
  int32_t ex4[4] = {2, 3, 0, 2};
  float p4[4] = {0.5f, 0.6f, 0.7f, 0.4f};
  n = moe_topo_gate_reselect(ex4, p4, scores, scores, 4, 4, 1, local, 0.75, scratch);
  TU_CHECK(n == 0 && ex4[0] == 2 && ex4[1] == 3 && ex4[3] == 2, "budget 3 of 3: rerouted %d", n);
}

// The naive reference: the off-node choices, the budget's best taken by
// repeated argmax (score, then earlier choice); the others in choice order,
// each the argmax of the local experts its token does not hold.
static int naive_reselect(int32_t *expert, float *topk_p, const float *s, const float *probs, int T,
                          int E, int K, const uint8_t *local, double share) {
  const int n_all = T * K;
  int *keep = calloc((size_t)n_all, sizeof(int)), n_off = 0;
  for (int i = 0; i < n_all; i++) n_off += !local[expert[i]];
  const int budget = (int)floor(share * T * K);
  for (int b = 0; b < budget && b < n_off; b++) {
    int best = -1;
    for (int i = 0; i < n_all; i++) {
      if (local[expert[i]] || keep[i]) continue;
      const float v = s[(size_t)(i / K) * E + expert[i]];
      if (best < 0 || v > s[(size_t)(best / K) * E + expert[best]]) best = i;
    }
    keep[best] = 1;
  }
  int rerouted = 0;
  for (int i = 0; i < n_all && n_off > budget; i++) {
    if (local[expert[i]] || keep[i]) continue;
    const int t = i / K;
    int best = -1;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int k = 0; k < K; k++) taken |= expert[t * K + k] == e;
      if (!local[e] || taken) continue;
      if (best < 0 || s[(size_t)t * E + e] > s[(size_t)t * E + best]) best = e;
    }
    if (best < 0) continue;
    expert[i] = best;
    topk_p[i] = probs[(size_t)t * E + best];
    rerouted++;
  }
  free(keep);
  return rerouted;
}

static void test_random(void) {
  enum { T = 40, E = 8, K = 2 };
  int cases = 0, changed = 0;
  for (int c = 0; c < 300; c++) {
    moe_rng rng;
    moe_rng_init(&rng, 77, (uint64_t)c);
    float s[T * E], probs[T * E], p_a[T * K], p_b[T * K];
    int32_t ex_a[T * K], ex_b[T * K];
    uint8_t local[E];
    int any_local = 0;
    for (int e = 0; e < E; e++) any_local |= local[e] = (uint8_t)(moe_rng_u32(&rng) % 2);
    if (!any_local) local[c % E] = 1;
    // coarse scores (ties happen) and a top-K without repeats per token
    for (int i = 0; i < T * E; i++) {
      s[i] = (float)(moe_rng_u32(&rng) % 16) / 16.0f;
      probs[i] = (float)(moe_rng_u32(&rng) % 1000) / 1000.0f;
    }
    for (int t = 0; t < T; t++) {
      const int a = (int)(moe_rng_u32(&rng) % E),
                b = (a + 1 + (int)(moe_rng_u32(&rng) % (E - 1))) % E;
      ex_a[t * K] = ex_b[t * K] = a;
      ex_a[t * K + 1] = ex_b[t * K + 1] = b;
    }
    for (int i = 0; i < T * K; i++) p_a[i] = p_b[i] = -1.0f;
    const double share = (double)(c % 7) / 8.0;
    uint64_t scratch[MOE_TOPO_SCRATCH_BYTES(T, K) / 8];
    const int na = moe_topo_gate_reselect(ex_a, p_a, s, probs, T, E, K, local, share, scratch);
    const int nb = naive_reselect(ex_b, p_b, s, probs, T, E, K, local, share);
    int same = na == nb;
    for (int i = 0; i < T * K; i++) same &= ex_a[i] == ex_b[i] && p_a[i] == p_b[i];
    TU_CHECK(same, "random case %d (share %g): rerouted %d vs the naive %d, or other experts", c,
             share, na, nb);
    // each token's experts stay distinct; at most the budget leaves the node
    // beyond the choices that had no local expert left
    int off = 0, stuck = 0;
    for (int t = 0; t < T; t++) {
      TU_CHECK(ex_a[t * K] != ex_a[t * K + 1], "case %d token %d chose expert %d twice", c, t,
               ex_a[t * K]);
      for (int k = 0; k < K; k++) {
        if (local[ex_a[t * K + k]]) continue;
        off++;
        int free_local = 0;
        for (int e = 0; e < E; e++)
          free_local += local[e] && ex_a[t * K] != e && ex_a[t * K + 1] != e;
        stuck += free_local == 0;
      }
    }
    TU_CHECK(off <= (int)floor(share * T * K) + stuck, "case %d: %d choices off the node", c, off);
    cases++;
    changed += na > 0;
  }
  if (g_rank == 0)
    printf("  topo gate vs naive reference: %d random cases, %d with re-selections\n", cases,
           changed);
  TU_CHECK(changed > 100, "only %d random cases re-selected anything", changed);
}

// ---- 2. the single-process layer ------------------------------------------------------------

static void test_layer(void) {
  const int T = 12, M = 6, H = 5, E = 4, K = 2;
  moe_layer_config cfg = tu_layer_config(T, M, H, E, K);
  moe_layer *L = NULL, *P = NULL;
  TU_CHECK(moe_layer_create(ctx, &cfg, &L) == MOE_STATUS_OK, "create");
  TU_CHECK(moe_layer_create(ctx, &cfg, &P) == MOE_STATUS_OK, "create");
  if (!L || !P) return;
  moe_layer_init_params(L, 9);
  moe_layer_init_params(P, 9);
  // large gaps between the biased scores so that eps never flips a choice;
  // share 0 (every off-node choice re-selects: no ranking across tokens):
  // every token chooses e0, e1, and e0 (remote) becomes e2
  const float bias[4] = {3.0f, 1.0f, -1.0f, -3.0f};
  memcpy(moe_layer_get_tensors(L).router_bias, bias, sizeof bias);
  memcpy(moe_layer_get_tensors(P).router_bias, bias, sizeof bias);
  const uint8_t local[4] = {0, 1, 1, 0};
  TU_CHECK(moe_layer_set_topology(L, local, 0.0) == MOE_STATUS_OK, "set_topology: %s",
           moe_ctx_error(ctx));
  TU_CHECK(moe_layer_set_topology(L, local, 1.5) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "out of range [0, 1]"),
           "share 1.5 accepted or unclear: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_layer_set_topology(L, local, 0.0) == MOE_STATUS_OK, "set_topology");
  float *x = tu_filled((size_t)T * M, 4, -1.0f, 1.0f), *dy = tu_filled((size_t)T * M, 5, -1, 1);
  float *y = tu_fbuf((size_t)T * M), *dx = tu_fbuf((size_t)T * M), *yp = tu_fbuf((size_t)T * M);
  moe_layer_stats st;
  moe_layer_zero_grad(L);
  TU_CHECK(moe_layer_forward(L, x, T, y, &st) == MOE_STATUS_OK, "forward");
  TU_CHECK(st.rerouted == T, "rerouted %d of %d tokens' remote choices", st.rerouted, T);
  const moe_route *r = moe_layer_get_route(L);
  int ok = 1;
  for (int t = 0; t < T; t++) ok &= r->expert[t * K] == 2 && r->expert[t * K + 1] == 1;
  TU_CHECK(ok, "not every token routed to (e2, e1)");
  TU_CHECK(moe_layer_backward(L, dy, dx) == MOE_STATUS_OK, "backward");
  moe_layer_tensors t = moe_layer_get_tensors(L);
  float *dwg = tu_copy_of(t.dwg, (size_t)M * E), *dw1 = tu_copy_of(t.dw1, (size_t)E * M * H);
  tu_layer_fd f = {L, x, dy, T, M, y};
  tu_fd_check("topo gate dwg", tu_layer_fd_loss, &f, t.wg, dwg, (size_t)M * E, 1e-2f, 2e-3, 2e-2);
  tu_fd_check("topo gate dw1 (expert 2)", tu_layer_fd_loss, &f, t.w1 + 2 * M * H, dw1 + 2 * M * H,
              (size_t)M * H, 1e-2f, 2e-3, 2e-2);
  tu_fd_check("topo gate dx", tu_layer_fd_loss, &f, x, dx, (size_t)T * M, 1e-2f, 2e-3, 2e-2);
  // off again: the plain gate, bit for bit
  TU_CHECK(moe_layer_set_topology(L, NULL, 0.0) == MOE_STATUS_OK, "set_topology off");
  moe_layer_forward(L, x, T, y, &st);
  moe_layer_forward(P, x, T, yp, NULL);
  TU_CHECK(memcmp(y, yp, (size_t)T * M * sizeof(float)) == 0 && st.rerouted == 0,
           "topology off is not the plain gate");
  moe_layer_destroy(L);
  moe_layer_destroy(P);
}

// ---- 3. the distributed layer ----------------------------------------------------------------

enum { DT = 32, DM = 16, DH = 24, DE = 8, DK = 2 };

static void fill_rank_x(float *x, int rank) {
  tu_fill(x, (size_t)DT * DM, 100 + (uint64_t)rank, -1.0f, 1.0f);
}

static moe_ep_layer *make_ep(const moe_layer_config *cfg, int rpn, double topo) {
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  pc.ep_size = g_world;
  pc.ranks_per_node = rpn;
  pc.topo_gate = topo;
  moe_ep_layer *L = NULL;
  const moe_status s = moe_ep_layer_create(ctx, MPI_COMM_WORLD, cfg, &pc, &L);
  TU_CHECK(s == MOE_STATUS_OK, "ep create (rpn %d, topo %g): %s", rpn, topo, moe_ctx_error(ctx));
  if (L) moe_ep_layer_init_params(L, 21);
  return L;
}

static void allreduce(float *v, size_t n) {
  MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static void test_distributed(void) {
  moe_layer_config cfg = tu_layer_config(DT, DM, DH, DE, DK);
  cfg.aux_loss_coef = 0.0f;  // per-rank references: no global loss statistics
  cfg.z_loss_coef = 0.0f;
  const double ratio = 0.25;  // 2 ranks per node: share 0.125, budget 8 of 64 choices
  float *x = tu_fbuf((size_t)DT * DM), *dy = tu_fbuf((size_t)DT * DM);
  float *y = tu_fbuf((size_t)DT * DM), *dx = tu_fbuf((size_t)DT * DM);
  float *y_ref = tu_fbuf((size_t)DT * DM), *dx_ref = tu_fbuf((size_t)DT * DM);
  fill_rank_x(x, g_rank);
  tu_fill(dy, (size_t)DT * DM, 200 + (uint64_t)g_rank, -1.0f, 1.0f);
  moe_ep_layer *L = make_ep(&cfg, 2, ratio);
  moe_layer *ref = NULL;
  TU_CHECK(moe_layer_create(ctx, &cfg, &ref) == MOE_STATUS_OK, "ref create");
  if (!L || !ref) goto done;
  moe_layer_init_params(ref, 21);
  {
    // this rank's node: ranks 2n, 2n+1, experts homed there 4n .. 4n+3
    uint8_t local[DE];
    for (int e = 0; e < DE; e++) local[e] = (e / (DE / g_world)) / 2 == g_rank / 2;
    TU_CHECK(moe_layer_set_topology(ref, local, ratio / 2) == MOE_STATUS_OK, "ref topology");
    moe_layer_stats s, rs;
    moe_ep_layer_zero_grad(L);
    moe_layer_zero_grad(ref);
    TU_CHECK(moe_ep_layer_forward(L, x, DT, y, &s) == MOE_STATUS_OK, "ep forward: %s",
             moe_ctx_error(ctx));
    TU_CHECK(moe_layer_forward(ref, x, DT, y_ref, &rs) == MOE_STATUS_OK, "ref forward");
    TU_CHECK(moe_ep_layer_backward(L, dy, dx) == MOE_STATUS_OK, "ep backward: %s",
             moe_ctx_error(ctx));
    TU_CHECK(moe_layer_backward(ref, dy, dx_ref) == MOE_STATUS_OK, "ref backward");
    const moe_route *re = moe_ep_layer_get_route(L), *rr = moe_layer_get_route(ref);
    int same = s.rerouted == rs.rerouted, off = 0;
    for (int i = 0; i < DT * DK; i++) {
      same &= re->expert[i] == rr->expert[i];
      off += !local[re->expert[i]];
    }
    TU_CHECK(same, "rank %d: routing differs from the single-process topology gate's", g_rank);
    TU_CHECK(s.rerouted > 0, "rank %d: nothing re-selected (test without teeth)", g_rank);
    TU_CHECK(off <= (int)floor(ratio / 2 * DT * DK), "rank %d: %d choices off the node", g_rank,
             off);
    char label[96];
    snprintf(label, sizeof label, "rank %d topo y", g_rank);
    tu_rel_close(label, y, y_ref, (size_t)DT * DM, REL_TOL);
    snprintf(label, sizeof label, "rank %d topo dx", g_rank);
    tu_rel_close(label, dx, dx_ref, (size_t)DT * DM, REL_TOL);
    // gradients: the references' sum over the ranks
    moe_layer_tensors rt = moe_layer_get_tensors(ref);
    const moe_ep_tensors et = moe_ep_layer_get_tensors(L);
    allreduce(rt.dwg, (size_t)DM * DE);
    allreduce(rt.dw1, (size_t)DE * DM * DH);
    allreduce(rt.db1, (size_t)DE * DH);
    allreduce(rt.dw2, (size_t)DE * DH * DM);
    allreduce(rt.db2, (size_t)DE * DM);
    tu_rel_close("topo dwg", et.dwg, rt.dwg, (size_t)DM * DE, REL_TOL);
    const size_t f = (size_t)et.home_first, n = (size_t)et.home_count;
    snprintf(label, sizeof label, "rank %d topo dw1", g_rank);
    tu_rel_close(label, et.dw1, rt.dw1 + f * DM * DH, n * DM * DH, REL_TOL);
    snprintf(label, sizeof label, "rank %d topo db1", g_rank);
    tu_rel_close(label, et.db1, rt.db1 + f * DH, n * DH, REL_TOL);
    snprintf(label, sizeof label, "rank %d topo dw2", g_rank);
    tu_rel_close(label, et.dw2, rt.dw2 + f * DH * DM, n * DH * DM, REL_TOL);
    snprintf(label, sizeof label, "rank %d topo db2", g_rank);
    tu_rel_close(label, et.db2, rt.db2 + f * DM, n * DM, REL_TOL);
    int total = s.rerouted;
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
      printf(
          "  distributed topo gate (2 nodes x 2, ratio %g): %d of %d choices re-selected, "
          "equal to the per-rank references\n",
          ratio, total, g_world * DT * DK);
  }
  // One node: the plain gate, bit for bit.
  {
    moe_ep_layer *A = make_ep(&cfg, g_world, ratio), *B = make_ep(&cfg, g_world, 0.0);
    float *ya = tu_fbuf((size_t)DT * DM), *yb = tu_fbuf((size_t)DT * DM);
    moe_layer_stats sa;
    if (A && B) {
      moe_ep_layer_forward(A, x, DT, ya, &sa);
      moe_ep_layer_forward(B, x, DT, yb, NULL);
      TU_CHECK(memcmp(ya, yb, (size_t)DT * DM * sizeof(float)) == 0 && sa.rerouted == 0,
               "rank %d: one node, the topology gate is not the plain gate", g_rank);
    }
    moe_ep_layer_destroy(A);
    moe_ep_layer_destroy(B);
  }
  // A ratio out of range: every rank fails, naming it.
  {
    moe_parallel_config pc;
    moe_parallel_config_default(&pc);
    pc.ep_size = g_world;
    pc.topo_gate = 1.5;
    moe_ep_layer *bad = NULL;
    const moe_status s = moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &bad);
    TU_CHECK(s == MOE_STATUS_INVALID_ARG && bad == NULL, "ratio 1.5: status %d", (int)s);
    TU_CHECK(strstr(moe_ctx_error(ctx), "must be in (0, 1]") != NULL, "ratio 1.5: '%s'",
             moe_ctx_error(ctx));
    moe_ep_layer_destroy(bad);
  }
done:
  moe_ep_layer_destroy(L);
  moe_layer_destroy(ref);
}

static void test_spec(void) {
  double r = -1;
  TU_CHECK(moe_gate_spec_parse(ctx, "plain", &r) == MOE_STATUS_OK && r == 0, "plain");
  TU_CHECK(moe_gate_spec_parse(ctx, "topo", &r) == MOE_STATUS_OK && r == MOE_TOPO_GATE_DEFAULT,
           "topo");
  TU_CHECK(moe_gate_spec_parse(ctx, "topo:0.1", &r) == MOE_STATUS_OK && r == 0.1, "topo:0.1");
  const char *bad[] = {"topo:0", "topo:1.5", "topo:x", "topo:", "gshard", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    TU_CHECK(moe_gate_spec_parse(ctx, bad[i], &r) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "(0, 1]") != NULL,
             "'%s' accepted or unclear: %s", bad[i], moe_ctx_error(ctx));
  char buf[32];
  moe_gate_spec_to_string(0.1, buf, sizeof buf);
  TU_CHECK(strcmp(buf, "topo:0.1") == 0, "to_string: %s", buf);
  moe_gate_spec_to_string(0, buf, sizeof buf);
  TU_CHECK(strcmp(buf, "plain") == 0, "to_string: %s", buf);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  int provided = 0;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  moe_log_set_level(MOE_LOG_ERROR);
  moe_ctx_create(&ctx);
  test_hand();
  test_random();
  test_layer();
  test_spec();
  if (g_world == 4) {
    test_distributed();
  } else if (g_rank == 0) {
    printf("  distributed part skipped: needs 4 ranks (have %d)\n", g_world);
  }
  moe_ctx_destroy(ctx);
  tu_free_all();
  int failures = tu_failures, all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = 0;
  if (g_rank == 0) rc = tu_finish("test_topo_gate");
  MPI_Finalize();
  return all ? 1 : rc;
}
