// The expert-parallel layer against the single-process layer: every rank runs
// moe_ep_layer on its share of a global batch and moe_layer on the whole batch,
// and compares its outputs, dx, the aux and z losses, the gate gradient and the
// gradients of the experts it holds (relative error <= 1e-5), over DP x EP
// layouts (contiguous and strided), every all-to-all algorithm, topologies from
// ranks-per-node, a replica map, a rank with zero tokens, and all tokens routed
// to one expert. Then bad input: each error must reach every rank (no hang).
// Run under mpirun with 1..4 ranks.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "moe/parallel.h"
#include "testutil.h"

// The scenario tables below leave trailing fields (bias, placements) at zero.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#define REL_TOL 1e-5

typedef struct {
  int ep, strided, rpn;
  const char *a2a;
  double f;        // capacity factor (0 = dropless; large = capacity without drops)
  int zero_rank;   // rank with no tokens, or -1
  int one_expert;  // route every first choice to expert 5
  int replicas;    // add replicas
  moe_activation act;
  int deepspeed;   // gate_convention deepspeed (first-choice aux, renormalised after dropping)
  int bias;        // a router bias skewing the choices toward low experts (same on both layers)
  int placements;  // then this many placements of expert copies (set_placement), each compared
} scenario;

static int g_rank, g_world;
static MPI_Comm g_comm;  // the communicator scenarios run on (world, or a split of it)

static void tokens_of(int r, const scenario *sc, int *T, int *off) {
  int o = 0;
  for (int q = 0; q <= r; q++) {
    const int t = q == sc->zero_rank ? 0 : 5 + (3 * q) % 7;
    if (q == r) *T = t;
    if (q < r) o += t;
  }
  *off = o;
}

// Outputs, losses and every gradient of the distributed layer against the
// reference's (this rank's tokens and home experts).
static void compare_with_ref(const char *name, int T, int off, int M, int H, int E, const float *y,
                             const float *y_ref, const float *dx, const float *dx_ref,
                             const moe_layer_stats *sp, const moe_layer_stats *rsp,
                             const moe_ep_tensors *tp, const moe_layer_tensors *rtp) {
  const moe_layer_stats s = *sp, rs = *rsp;
  const moe_ep_tensors t = *tp;
  const moe_layer_tensors rt = *rtp;
  char label[256];
  if (T > 0) {
    snprintf(label, sizeof label, "%s rank %d y", name, g_rank);
    tu_rel_close(label, y, y_ref + (size_t)off * M, (size_t)T * M, REL_TOL);
    snprintf(label, sizeof label, "%s rank %d dx", name, g_rank);
    tu_rel_close(label, dx, dx_ref + (size_t)off * M, (size_t)T * M, REL_TOL);
  }
  snprintf(label, sizeof label, "%s aux", name);
  tu_rel_close(label, &s.aux_loss, &rs.aux_loss, 1, REL_TOL);
  snprintf(label, sizeof label, "%s z", name);
  tu_rel_close(label, &s.z_loss, &rs.z_loss, 1, REL_TOL);
  snprintf(label, sizeof label, "%s dwg", name);
  tu_rel_close(label, t.dwg, rt.dwg, (size_t)M * E, REL_TOL);
  const size_t f = (size_t)t.home_first, n = (size_t)t.home_count;
  snprintf(label, sizeof label, "%s rank %d dw1", name, g_rank);
  tu_rel_close(label, t.dw1, rt.dw1 + f * M * H, n * M * H, REL_TOL);
  snprintf(label, sizeof label, "%s rank %d db1", name, g_rank);
  tu_rel_close(label, t.db1, rt.db1 + f * H, n * H, REL_TOL);
  snprintf(label, sizeof label, "%s rank %d dw2", name, g_rank);
  tu_rel_close(label, t.dw2, rt.dw2 + f * H * M, n * H * M, REL_TOL);
  snprintf(label, sizeof label, "%s rank %d db2", name, g_rank);
  tu_rel_close(label, t.db2, rt.db2 + f * M, n * M, REL_TOL);
}

// Placement i of expert copies (0: expert 0 copied to every other rank; 1:
// none; then random bits, the same on every rank), then one forward and
// backward compared with the reference. The load matrix sums to the
// reference's rows per expert, and (EP = world) each rank computes the rows
// the planners' rule says (moe_balance_rows). Switching placements and the
// passes allocate nothing.
// The same placement on D, a layer with deferred Agg (pc.defer_agg): its
// outputs, dx and, after moe_ep_layer_grads_wait, every gradient equal L's
// bit for bit; while its gradients are pending, a placement is refused on
// every rank.
// The linked layers' background polls over every check_deferred (rank-local).
static long g_bg_polls, g_bg_done;

static void check_deferred(moe_ctx *ctx, const char *name, int i, const moe_layer_config *c,
                           moe_ep_layer *L, moe_ep_layer *D, const uint8_t *rep, const float *x,
                           const float *dy, int T, const float *y, const float *dx) {
  const int M = c->model_dim;
  float *yd = calloc((size_t)T * M + 1, sizeof(float)), *dxd = calloc((size_t)T * M + 1, 4);
  // L and D linked (Pro-Prophet's block-wise scheduler): while D's Agg is
  // pending, a pass of L on the same input polls it on L's comm stream;
  // every result stays bitwise
  moe_ep_layer *pair[2] = {L, D}, *twice[2] = {L, L}, *none[2] = {L, NULL};
  if (i == 0)
    TU_CHECK(moe_ep_layer_link(twice, 2) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "layer 1 is layer 0 again") &&
                 moe_ep_layer_link(none, 2) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "layer 1 is NULL"),
             "%s: bad links refused: '%s'", name, moe_ctx_error(ctx));
  moe_status st = moe_ep_layer_link(pair, 2);
  TU_CHECK(st == MOE_STATUS_OK, "%s link: %s", name, moe_ctx_error(ctx));
  if (i == 0) {
    // both layers' loads in one call equal each layer's own; one bitmap that
    // differs between ranks fails the batched placement on every rank
    const int E = c->num_experts;
    const int P = E / moe_ep_layer_get_tensors(L).home_count;  // the EP size
    int64_t *both = calloc((size_t)2 * E * P, sizeof(int64_t)), *one = calloc((size_t)E * P, 8);
    TU_CHECK(moe_ep_layers_load(pair, 2, both) == MOE_STATUS_OK &&
                 moe_ep_layer_load(L, one) == MOE_STATUS_OK &&
                 memcmp(both, one, (size_t)E * P * 8) == 0 &&
                 moe_ep_layer_load(D, one) == MOE_STATUS_OK &&
                 memcmp(both + (size_t)E * P, one, (size_t)E * P * 8) == 0,
             "%s: the batched load differs from the layers' own: %s", name, moe_ctx_error(ctx));
    uint8_t *mine = calloc((size_t)E * P, 1);
    if (g_rank == 0 && P > 1) mine[(size_t)(E - 1) * P] = 1;  // expert E-1's copy on rank 0
    const uint8_t *bitmaps[2] = {rep, mine};
    const moe_status bad = moe_ep_layers_set_placement(pair, 2, bitmaps);
    if (P > 1)
      TU_CHECK(bad == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(ctx), "bitmaps differ"),
               "%s: a bitmap differing between ranks: status %d, '%s'", name, (int)bad,
               moe_ctx_error(ctx));
    free(both);
    free(one);
    free(mine);
  }
  if (st == MOE_STATUS_OK) st = moe_ep_layer_set_placement(D, rep);
  moe_ep_layer_zero_grad(D);
  if (st == MOE_STATUS_OK) st = moe_ep_layer_forward(D, x, T, yd, NULL);
  if (st == MOE_STATUS_OK) st = moe_ep_layer_backward(D, dy, dxd);
  TU_CHECK(st == MOE_STATUS_OK, "%s deferred: %s", name, moe_ctx_error(ctx));
  if (st == MOE_STATUS_OK) {
    TU_CHECK(moe_ep_layer_link(pair, 2) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "transfers pending"),
             "%s: link with an Agg pending: '%s'", name, moe_ctx_error(ctx));
    float *y2 = calloc((size_t)T * M + 1, sizeof(float)), *dx2 = calloc((size_t)T * M + 1, 4);
    moe_ep_layer_zero_grad(L);
    st = moe_ep_layer_forward(L, x, T, y2, NULL);
    if (st == MOE_STATUS_OK) st = moe_ep_layer_backward(L, dy, dx2);
    TU_CHECK(st == MOE_STATUS_OK && memcmp(y, y2, (size_t)T * M * sizeof(float)) == 0 &&
                 memcmp(dx, dx2, (size_t)T * M * sizeof(float)) == 0,
             "%s: the linked layer's pass beside a pending Agg: %s", name, moe_ctx_error(ctx));
    for (int d = 0; d < 2; d++) {
      const moe_executor_background b = moe_ep_layer_background(L, d);
      TU_CHECK(!b.failed, "%s: the background poll failed", name);
      g_bg_polls += b.polls;
      g_bg_done += b.done;
    }
    free(y2);
    free(dx2);
  }
  if (st == MOE_STATUS_OK && i == 0) {
    const moe_status again = moe_ep_layer_set_placement(D, rep);
    TU_CHECK(again == MOE_STATUS_INVALID_ARG && strstr(moe_ctx_error(ctx), "pending"),
             "%s deferred: a placement with gradients pending: status %d, '%s'", name, (int)again,
             moe_ctx_error(ctx));
  }
  if (st == MOE_STATUS_OK) st = moe_ep_layer_grads_wait(D);
  TU_CHECK(st == MOE_STATUS_OK, "%s deferred wait: %s", name, moe_ctx_error(ctx));
  if (st == MOE_STATUS_OK) {
    const moe_ep_tensors a = moe_ep_layer_get_tensors(L), b = moe_ep_layer_get_tensors(D);
    const size_t n = (size_t)a.home_count, Mz = (size_t)c->model_dim, H = (size_t)c->hidden_dim;
    TU_CHECK(memcmp(y, yd, (size_t)T * M * sizeof(float)) == 0 &&
                 memcmp(dx, dxd, (size_t)T * M * sizeof(float)) == 0,
             "%s deferred: y or dx differ from the blocking layer's", name);
    TU_CHECK(memcmp(a.dwg, b.dwg, Mz * (size_t)c->num_experts * sizeof(float)) == 0 &&
                 memcmp(a.dw1, b.dw1, n * Mz * H * sizeof(float)) == 0 &&
                 memcmp(a.db1, b.db1, n * H * sizeof(float)) == 0 &&
                 memcmp(a.dw2, b.dw2, n * H * Mz * sizeof(float)) == 0 &&
                 memcmp(a.db2, b.db2, n * Mz * sizeof(float)) == 0,
             "%s deferred: gradients not bitwise the blocking layer's", name);
  }
  TU_CHECK(moe_ep_layer_link(&L, 1) == MOE_STATUS_OK && moe_ep_layer_link(&D, 1) == MOE_STATUS_OK,
           "%s: unlink: %s", name, moe_ctx_error(ctx));
  free(yd);
  free(dxd);
}

static void run_placement(moe_ctx *ctx, const char *scen, int i, const scenario *sc,
                          moe_ep_layer *L, moe_ep_layer *D, const float *x, const float *dy, int T,
                          int off, int Tg, float *y, const float *y_ref, float *dx,
                          const float *dx_ref, const moe_layer_stats *rs, moe_layer *ref) {
  const moe_layer_config *cfg = moe_layer_get_config(ref);
  const int E = cfg->num_experts, M = cfg->model_dim, H = cfg->hidden_dim, P = sc->ep;
  const int El = E / P;
  char name[200];
  snprintf(name, sizeof name, "%s placement %d", scen, i);
  uint8_t *rep = calloc((size_t)E * P, 1);
  int64_t *load = calloc((size_t)E * P, sizeof(int64_t)), rows[64];
  uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
  for (int e = 0; e < E; e++) {
    for (int p = 0; p < P; p++) {
      if (p == e / El) continue;
      h ^= h << 13;
      h ^= h >> 7;
      h ^= h << 17;
      rep[(size_t)e * P + p] = i == 0 ? e == 0 : i == 1 ? 0 : (h >> 33) & 1;
    }
  }
  const uint64_t before = moe_alloc_count();
  moe_status st = moe_ep_layer_set_placement(L, rep);
  TU_CHECK(st == MOE_STATUS_OK, "%s: set_placement: %s", name, moe_ctx_error(ctx));
  TU_CHECK(moe_alloc_count() == before, "%s: set_placement allocated %llu times", name,
           (unsigned long long)(moe_alloc_count() - before));
  moe_layer_stats s;
  // twice: the first pass may grow the receive buffers (a rank can compute
  // more rows than before, as with any new routing); the second allocates nothing
  for (int pass = 0; pass < 2 && st == MOE_STATUS_OK; pass++) {
    const uint64_t b2 = moe_alloc_count();
    moe_ep_layer_zero_grad(L);
    memset(dx, 0, ((size_t)T * M + 1) * sizeof(float));
    st = moe_ep_layer_forward(L, x + (size_t)off * M, T, y, &s);
    if (st == MOE_STATUS_OK) st = moe_ep_layer_backward(L, dy + (size_t)off * M, dx);
    TU_CHECK(st == MOE_STATUS_OK, "%s: pass", name);
    if (pass == 1)
      TU_CHECK(moe_alloc_count() == b2, "%s: the second pass allocated %llu times", name,
               (unsigned long long)(moe_alloc_count() - b2));
  }
  if (st == MOE_STATUS_OK) {
    const moe_ep_tensors t = moe_ep_layer_get_tensors(L);
    const moe_layer_tensors rt = moe_layer_get_tensors(ref);
    compare_with_ref(name, T, off, M, H, E, y, y_ref, dx, dx_ref, &s, rs, &t, &rt);
    TU_CHECK(moe_ep_layer_load(L, load) == MOE_STATUS_OK, "%s: load", name);
    const moe_route *rr = moe_layer_get_route(ref);
    for (int e = 0; e < E; e++) {
      int64_t sum = 0;
      for (int p = 0; p < P; p++) sum += load[(size_t)p * E + e];
      TU_CHECK(sum == rr->count[e], "%s: load of expert %d: %lld, reference %d", name, e,
               (long long)sum, rr->count[e]);
    }
    if (P == g_world && P <= 64) {
      const moe_balance_load bl = {E, P, load};
      TU_CHECK(moe_balance_rows(NULL, &bl, rep, rows) == MOE_STATUS_OK, "%s: rows", name);
      TU_CHECK(rows[g_rank] == moe_ep_layer_rows_computed(L),
               "%s: rank %d computed %d rows, the rule says %lld", name, g_rank,
               moe_ep_layer_rows_computed(L), (long long)rows[g_rank]);
    }
  }
  if (st == MOE_STATUS_OK && D)
    check_deferred(ctx, name, i, cfg, L, D, rep, x + (size_t)off * M, dy + (size_t)off * M, T, y,
                   dx);
  (void)Tg;
  free(rep);
  free(load);
}

static void run_scenario(const scenario *sc) {
  char name[160];
  snprintf(name, sizeof name, "ep=%d%s rpn=%d a2a=%s f=%g zero=%d one=%d rep=%d %s%s%s", sc->ep,
           sc->strided ? "s" : "c", sc->rpn, sc->a2a, sc->f, sc->zero_rank, sc->one_expert,
           sc->replicas, moe_activation_name(sc->act), sc->deepspeed ? " deepspeed" : "",
           sc->bias ? " bias" : "");
  int Tg = 0, T = 0, off = 0, dummy = 0;
  for (int q = 0; q < g_world; q++) {
    int t = 0;
    tokens_of(q, sc, &t, &dummy);
    Tg += t;
  }
  tokens_of(g_rank, sc, &T, &off);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = Tg > 0 ? Tg : 1;
  cfg.model_dim = 8;
  cfg.hidden_dim = 12;
  cfg.num_experts = 12;
  cfg.top_k = 2;
  cfg.capacity_factor = sc->f;
  cfg.act = sc->act;
  cfg.aux_loss_coef = 0.01f;
  cfg.z_loss_coef = 0.001f;
  if (sc->deepspeed) {
    cfg.gate_convention = MOE_GATE_DEEPSPEED;
    cfg.renormalize = 1;
  }
  const int M = cfg.model_dim, H = cfg.hidden_dim, E = cfg.num_experts;
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer *ref = NULL;
  moe_ep_layer *L = NULL, *D = NULL;
  float *x = malloc((size_t)Tg * M * sizeof(float)), *dy = malloc((size_t)Tg * M * sizeof(float));
  float *y_ref = calloc((size_t)Tg * M, sizeof(float)),
        *dx_ref = calloc((size_t)Tg * M, sizeof(float));
  float *y = calloc((size_t)Tg * M + 1, sizeof(float)),
        *dx = calloc((size_t)Tg * M + 1, sizeof(float));
  tu_fill(x, (size_t)Tg * M, 11, -1.0f, 1.0f);
  tu_fill(dy, (size_t)Tg * M, 12, -1.0f, 1.0f);
  if (sc->one_expert) {
    for (int t = 0; t < Tg; t++) x[(size_t)t * M] = 1.0f;  // a constant feature
  }
  // reference on the whole batch
  if (moe_layer_create(ctx, &cfg, &ref) != MOE_STATUS_OK) {
    TU_CHECK(0, "%s: ref create: %s", name, moe_ctx_error(ctx));
    goto done;
  }
  moe_layer_init_params(ref, 77);
  moe_layer_tensors rt = moe_layer_get_tensors(ref);
  if (sc->one_expert) rt.wg[5] = 8.0f;  // wg[0, 5]: the constant feature pulls to expert 5
  if (sc->bias)  // expert e's logit raised by 1.5 / (e + 1): skewed, not one-hot
    for (int e = 0; e < E; e++) rt.router_bias[e] = 1.5f / (float)(e + 1);
  moe_layer_stats rs;
  moe_layer_zero_grad(ref);
  TU_CHECK(moe_layer_forward(ref, x, Tg, y_ref, &rs) == MOE_STATUS_OK, "%s: ref forward", name);
  TU_CHECK(moe_layer_backward(ref, dy, dx_ref) == MOE_STATUS_OK, "%s: ref backward", name);
  TU_CHECK(rs.dropped == 0, "%s: reference dropped %d tokens (test needs none)", name, rs.dropped);
  if (sc->one_expert) {
    const moe_route *rr = moe_layer_get_route(ref);
    int all = 1;
    for (int t = 0; t < Tg; t++) all &= rr->expert[t * 2] == 5;
    TU_CHECK(all, "%s: not every first choice went to expert 5", name);
  }
  // distributed
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  pc.ep_size = sc->ep;
  pc.ep_strided = sc->strided;
  pc.ranks_per_node = sc->rpn;
  snprintf(pc.a2a, sizeof pc.a2a, "%s", sc->a2a);
  if (sc->placements) pc.copy_slots = E - E / sc->ep;
  moe_status st = moe_ep_layer_create(ctx, g_comm, &cfg, &pc, &L);
  TU_CHECK(st == MOE_STATUS_OK, "%s: create: %s", name, moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) goto done;
  moe_ep_layer_init_params(L, 77);
  moe_ep_tensors t = moe_ep_layer_get_tensors(L);
  if (sc->one_expert) t.wg[5] = 8.0f;
  if (sc->bias)
    for (int e = 0; e < E; e++) t.router_bias[e] = 1.5f / (float)(e + 1);
  if (sc->replicas && sc->ep > 1) {
    // expert 0 (home EP rank 0) replicated on the last EP rank, and the last
    // expert (home EP rank ep-1) on EP rank 0
    TU_CHECK(moe_ep_layer_set_replica(L, 0, sc->ep - 1, 1) == MOE_STATUS_OK, "%s: replica: %s",
             name, moe_ctx_error(ctx));
    TU_CHECK(moe_ep_layer_set_replica(L, E - 1, 0, 1) == MOE_STATUS_OK, "%s: replica 2", name);
  }
  moe_ep_layer_zero_grad(L);
  moe_layer_stats s;
  st = moe_ep_layer_forward(L, x + (size_t)off * M, T, y, &s);
  TU_CHECK(st == MOE_STATUS_OK, "%s: forward: %s", name, moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) goto done;
  st = moe_ep_layer_backward(L, dy + (size_t)off * M, dx);
  TU_CHECK(st == MOE_STATUS_OK, "%s: backward: %s", name, moe_ctx_error(ctx));
  if (st != MOE_STATUS_OK) goto done;
  compare_with_ref(name, T, off, M, H, E, y, y_ref, dx, dx_ref, &s, &rs, &t, &rt);
  const size_t f = (size_t)t.home_first, n = (size_t)t.home_count;
  // parameters are the reference's slice (the two init paths share RNG streams)
  TU_CHECK(memcmp(t.w1, rt.w1 + f * M * H, n * M * H * sizeof(float)) == 0 &&
               memcmp(t.b1, rt.b1 + f * H, n * H * sizeof(float)) == 0 &&
               memcmp(t.w2, rt.w2 + f * H * M, n * H * M * sizeof(float)) == 0 &&
               memcmp(t.b2, rt.b2 + f * M, n * M * sizeof(float)) == 0 &&
               memcmp(t.wg, rt.wg, (size_t)M * E * sizeof(float)) == 0,
           "%s: init_params slice differs from moe_layer_init_params", name);
  // a second pass allocates nothing
  {
    const uint64_t before = moe_alloc_count();
    moe_ep_layer_zero_grad(L);
    TU_CHECK(moe_ep_layer_forward(L, x + (size_t)off * M, T, y, NULL) == MOE_STATUS_OK &&
                 moe_ep_layer_backward(L, dy + (size_t)off * M, dx) == MOE_STATUS_OK,
             "%s: second pass", name);
    TU_CHECK(moe_alloc_count() == before, "%s: the second pass allocated %llu times", name,
             (unsigned long long)(moe_alloc_count() - before));
  }
  if (sc->placements) {  // the same layer with deferred Agg
    pc.defer_agg = 1;
    st = moe_ep_layer_create(ctx, g_comm, &cfg, &pc, &D);
    TU_CHECK(st == MOE_STATUS_OK, "%s: create (deferred Agg): %s", name, moe_ctx_error(ctx));
    if (D) {
      moe_ep_layer_init_params(D, 77);
      moe_ep_tensors td = moe_ep_layer_get_tensors(D);
      if (sc->one_expert) td.wg[5] = 8.0f;
      if (sc->bias)
        for (int e = 0; e < E; e++) td.router_bias[e] = 1.5f / (float)(e + 1);
    }
  }
  for (int i = 0; i < sc->placements; i++)
    run_placement(ctx, name, i, sc, L, D, x, dy, T, off, Tg, y, y_ref, dx, dx_ref, &rs, ref);
done:
  moe_ep_layer_destroy(D);
  moe_ep_layer_destroy(L);
  moe_layer_destroy(ref);
  moe_ctx_destroy(ctx);
  free(x);
  free(dy);
  free(y_ref);
  free(dx_ref);
  free(y);
  free(dx);
}

// Replicas really compute: after set_replica, the home's parameters of expert e
// change without a sync, so the replica's rank p must see the OLD expert e and
// every other rank the NEW one; after sync_replicas everyone sees the new one.
static void test_replica_is_used(void) {
  if (g_world < 2) return;
  const int e = 0, p = g_world - 1;  // expert 0 lives on EP rank 0
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = 64;
  cfg.model_dim = 8;
  cfg.hidden_dim = 12;
  cfg.num_experts = 12;
  cfg.capacity_factor = 0.0;
  cfg.aux_loss_coef = 0.0f;
  const int M = 8, T = 6;
  float x[6 * 8], y[6 * 8], y_old[6 * 8], y_new[6 * 8];
  tu_fill(x, (size_t)T * M, 100 + (uint64_t)g_rank, -1.0f, 1.0f);
  for (int t = 0; t < T; t++) x[t * M] = 1.0f;  // constant feature: pull every token to expert 0
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer *ref = NULL;
  moe_ep_layer *L = NULL;
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  pc.ep_size = g_world;
  cfg.tokens = T;
  TU_CHECK(moe_layer_create(ctx, &cfg, &ref) == MOE_STATUS_OK, "replica: ref create");
  cfg.tokens = 64;
  TU_CHECK(moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L) == MOE_STATUS_OK,
           "replica: create: %s", moe_ctx_error(ctx));
  if (!ref || !L) goto done;
  moe_layer_init_params(ref, 9);
  moe_ep_layer_init_params(L, 9);
  moe_layer_tensors rt = moe_layer_get_tensors(ref);
  moe_ep_tensors t = moe_ep_layer_get_tensors(L);
  rt.wg[e] = 8.0f;
  t.wg[e] = 8.0f;
  TU_CHECK(moe_ep_layer_set_replica(L, e, p, 1) == MOE_STATUS_OK, "replica on: %s",
           moe_ctx_error(ctx));
  // references with the old and the new expert 0 (b2 shifted by 0.5)
  TU_CHECK(moe_layer_forward(ref, x, T, y_old, NULL) == MOE_STATUS_OK, "ref old");
  for (int j = 0; j < M; j++) rt.b2[j] += 0.5f;
  TU_CHECK(moe_layer_forward(ref, x, T, y_new, NULL) == MOE_STATUS_OK, "ref new");
  if (t.home_first == 0) {
    for (int j = 0; j < M; j++) t.b2[j] += 0.5f;  // the home changes, the replica does not
  }
  TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward: %s",
           moe_ctx_error(ctx));
  char label[96];
  snprintf(label, sizeof label, "replica rank %d sees the %s expert", g_rank,
           g_rank == p ? "old (replica)" : "new (home)");
  tu_rel_close(label, y, g_rank == p ? y_old : y_new, (size_t)T * M, REL_TOL);
  TU_CHECK(moe_ep_layer_sync_replicas(L) == MOE_STATUS_OK, "sync: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward after sync");
  snprintf(label, sizeof label, "rank %d after sync_replicas", g_rank);
  tu_rel_close(label, y, y_new, (size_t)T * M, REL_TOL);
  // set_replica invalidates a pending backward; bad arguments fail everywhere
  TU_CHECK(moe_ep_layer_set_replica(L, e, p, 0) == MOE_STATUS_OK, "replica off");
  float dx[6 * 8] = {0};
  TU_CHECK(moe_ep_layer_backward(L, y, dx) == MOE_STATUS_INVALID_ARG,
           "backward after set_replica must need a new forward");
  TU_CHECK(moe_ep_layer_set_replica(L, e, 0, 1) == MOE_STATUS_INVALID_ARG, "replica on home");
  TU_CHECK(moe_ep_layer_set_replica(L, 99, p, 1) == MOE_STATUS_INVALID_ARG, "bad expert");
  TU_CHECK(moe_ep_layer_set_replica(L, g_rank == 0 ? 1 : 2, p, 1) == MOE_STATUS_INVALID_ARG ||
               g_world == 1,
           "differing set_replica arguments fail on every rank");
  // NaN in dy on one rank: backward fails everywhere
  TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward again");
  if (g_rank == 0) y[3] = NAN;
  TU_CHECK(moe_ep_layer_backward(L, y, dx) == MOE_STATUS_INVALID_ARG,
           "NaN dy on rank 0: backward fails on rank %d", g_rank);
done:
  moe_ep_layer_destroy(L);
  moe_layer_destroy(ref);
  moe_ctx_destroy(ctx);
}

// Frozen parameters (inference): set_placement sends parameters only to the
// copies it places anew. Seen by changing the home's parameters between two
// placements (what frozen_params forbids): a kept copy computes with the old
// ones; one placed again after being dropped, and any copy of an unfrozen
// layer, with the new ones.
// The gate hook (Lina's phase 2): called after the gate with the world's
// choices per expert, it places a copy before the dispatch, and the output
// is the single-process layer's; an error in it fails the forward on every
// rank (no hang).
typedef struct {
  const uint8_t *rep;
  int calls;
  int64_t rows_sum;
  double rows[64];
  int fail;
} hook_state;

static moe_status gate_hook(void *arg, moe_ep_layer *L, int tokens, const double *rows) {
  hook_state *h = arg;
  const int E = moe_ep_layer_get_placement(L)->num_experts;
  h->calls++;
  h->rows_sum = 0;
  for (int e = 0; e < E; e++) {
    h->rows[e] = rows[e];
    h->rows_sum += (int64_t)rows[e];
  }
  (void)tokens;
  if (h->fail) return MOE_STATUS_INVALID_ARG;
  return h->rep ? moe_ep_layer_set_placement(L, h->rep) : MOE_STATUS_OK;
}

static void test_gate_hook(void) {
  if (g_world < 2) return;
  const int P = g_world, E = 2 * P, M = 8, T = 6, H = 12, K = 2;
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.model_dim = M;
  cfg.hidden_dim = H;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.capacity_factor = 0.0;
  cfg.tokens = T;
  float x[6 * 8], y[6 * 8], y_ref[6 * 8];
  tu_fill(x, (size_t)T * M, 500 + (uint64_t)g_rank, -1.0f, 1.0f);
  for (int t = 0; t < T; t++) x[t * M] = 1.0f;  // pull every token to expert 0
  uint8_t *rep = calloc((size_t)E * P, 1);
  for (int p = 1; p < P; p++) rep[p] = 1;  // expert 0 (home: rank 0) copied on every other rank
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer *ref = NULL;
  moe_ep_layer *L = NULL;
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  pc.ep_size = P;
  pc.copy_slots = 1;
  pc.frozen_params = 1;
  TU_CHECK(moe_layer_create(ctx, &cfg, &ref) == MOE_STATUS_OK, "hook: ref create");
  TU_CHECK(moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L) == MOE_STATUS_OK,
           "hook: create: %s", moe_ctx_error(ctx));
  if (ref && L) {
    moe_layer_init_params(ref, 13);
    moe_ep_layer_init_params(L, 13);
    moe_layer_get_tensors(ref).wg[0] = 8.0f;
    moe_ep_layer_get_tensors(L).wg[0] = 8.0f;
    TU_CHECK(moe_layer_forward(ref, x, T, y_ref, NULL) == MOE_STATUS_OK, "hook: ref forward");
    hook_state h = {rep, 0, 0, {0}, 0};
    moe_ep_layer_set_gate_hook(L, gate_hook, &h);
    TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "hook: forward: %s",
             moe_ctx_error(ctx));
    char label[64];
    snprintf(label, sizeof label, "hook rank %d, copy placed after the gate", g_rank);
    tu_rel_close(label, y, y_ref, (size_t)T * M, REL_TOL);
    // the rows are the world's choices: every rank's count_all, summed
    const moe_route *r = moe_ep_layer_get_route(L);
    int64_t mine[64] = {0}, all[64] = {0};
    for (int e = 0; e < E; e++) mine[e] = r->count_all[e];
    MPI_Allreduce(mine, all, E, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int same = h.calls == 1 && h.rows_sum == (int64_t)P * T * K;
    for (int e = 0; e < E; e++) same &= (int64_t)h.rows[e] == all[e];
    TU_CHECK(same, "hook rank %d: %d calls, rows sum %lld (want 1 call, %d x %d x %d)", g_rank,
             h.calls, (long long)h.rows_sum, P, T, K);
    TU_CHECK(
        moe_ep_layer_get_placement(L)->replica[1] == 1 && moe_ep_layer_trans_copies(L) == P - 1,
        "hook: the placement set in the hook is in force (%d copies sent)",
        moe_ep_layer_trans_copies(L));
    // the rows of expert 0 were computed by the copies: rank 0 received none
    // from the others (its home rows are its own T)
    // a failing hook fails the forward on every rank, and the next one runs
    h.fail = 1;
    TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) != MOE_STATUS_OK, "hook: failure reported");
    h.fail = 0;
    moe_ep_layer_set_gate_hook(L, NULL, &h);
    const int calls = h.calls;
    TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK && h.calls == calls,
             "hook removed: forward runs without it: %s", moe_ctx_error(ctx));
    snprintf(label, sizeof label, "hook rank %d, after a failed hook", g_rank);
    tu_rel_close(label, y, y_ref, (size_t)T * M, REL_TOL);
  }
  moe_ep_layer_destroy(L);
  moe_layer_destroy(ref);
  moe_ctx_destroy(ctx);
  free(rep);
}

static void test_frozen_placement(void) {
  if (g_world < 2) return;
  const int P = g_world, E = 4 * P, M = 8, T = 6, H = 12;
  const int e = 0, p = P - 1;  // expert 0 lives on EP rank 0; its copy on the last rank
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.model_dim = M;
  cfg.hidden_dim = H;
  cfg.num_experts = E;
  cfg.capacity_factor = 0.0;
  cfg.aux_loss_coef = 0.0f;
  float x[6 * 8], y[6 * 8], y_old[6 * 8], y_new[6 * 8];
  tu_fill(x, (size_t)T * M, 300 + (uint64_t)g_rank, -1.0f, 1.0f);
  for (int t = 0; t < T; t++) x[t * M] = 1.0f;  // pull every token to expert 0
  uint8_t *rep = calloc((size_t)E * P, 1), *none = calloc((size_t)E * P, 1);
  rep[(size_t)e * P + p] = 1;
  rep[(size_t)(E - 1) * P + 0] = 1;  // and the last expert's on rank 0
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  for (int frozen = 0; frozen <= 1; frozen++) {
    moe_layer *ref = NULL;
    moe_ep_layer *L = NULL;
    moe_parallel_config pc;
    moe_parallel_config_default(&pc);
    pc.ep_size = P;
    pc.copy_slots = 2;
    pc.frozen_params = frozen;
    cfg.tokens = T;
    TU_CHECK(moe_layer_create(ctx, &cfg, &ref) == MOE_STATUS_OK, "frozen: ref create");
    TU_CHECK(moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L) == MOE_STATUS_OK,
             "frozen %d: create: %s", frozen, moe_ctx_error(ctx));
    if (!ref || !L) {
      moe_layer_destroy(ref);
      moe_ep_layer_destroy(L);
      break;
    }
    moe_layer_init_params(ref, 11);
    moe_ep_layer_init_params(L, 11);
    moe_layer_tensors rt = moe_layer_get_tensors(ref);
    moe_ep_tensors t = moe_ep_layer_get_tensors(L);
    rt.wg[e] = t.wg[e] = 8.0f;
    TU_CHECK(moe_layer_forward(ref, x, T, y_old, NULL) == MOE_STATUS_OK, "ref old");
    for (int j = 0; j < M; j++) rt.b2[j] += 0.5f;
    TU_CHECK(moe_layer_forward(ref, x, T, y_new, NULL) == MOE_STATUS_OK, "ref new");
    char label[96];
    TU_CHECK(
        moe_ep_layer_set_placement(L, rep) == MOE_STATUS_OK && moe_ep_layer_trans_copies(L) == 2,
        "frozen %d: first placement sends 2 copies (%d): %s", frozen, moe_ep_layer_trans_copies(L),
        moe_ctx_error(ctx));
    TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward");
    snprintf(label, sizeof label, "frozen %d rank %d, first placement", frozen, g_rank);
    tu_rel_close(label, y, y_old, (size_t)T * M, REL_TOL);
    if (t.home_first == 0) {
      for (int j = 0; j < M; j++) t.b2[j] += 0.5f;  // the home changes
    }
    TU_CHECK(moe_ep_layer_set_placement(L, rep) == MOE_STATUS_OK &&
                 moe_ep_layer_trans_copies(L) == (frozen ? 0 : 2),
             "frozen %d: the same placement again sends %d copies", frozen,
             moe_ep_layer_trans_copies(L));
    TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward");
    snprintf(label, sizeof label, "frozen %d rank %d, placement kept", frozen, g_rank);
    tu_rel_close(label, y, frozen && g_rank == p ? y_old : y_new, (size_t)T * M, REL_TOL);
    // dropped, then placed again: sent anew, frozen or not
    TU_CHECK(moe_ep_layer_set_placement(L, none) == MOE_STATUS_OK &&
                 moe_ep_layer_trans_copies(L) == 0 &&
                 moe_ep_layer_set_placement(L, rep) == MOE_STATUS_OK &&
                 moe_ep_layer_trans_copies(L) == 2,
             "frozen %d: dropped and placed again: %s", frozen, moe_ctx_error(ctx));
    TU_CHECK(moe_ep_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward");
    snprintf(label, sizeof label, "frozen %d rank %d, placed again", frozen, g_rank);
    tu_rel_close(label, y, y_new, (size_t)T * M, REL_TOL);
    moe_ep_layer_destroy(L);
    moe_layer_destroy(ref);
  }
  {  // frozen_params out of range
    moe_parallel_config pc;
    moe_parallel_config_default(&pc);
    pc.ep_size = P;
    pc.frozen_params = 2;
    moe_ep_layer *L = NULL;
    cfg.tokens = T;
    TU_CHECK(moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "frozen_params (2) must be 0 or 1"),
             "frozen_params 2 refused: %s", moe_ctx_error(ctx));
    moe_ep_layer_destroy(L);
  }
  free(rep);
  free(none);
  moe_ctx_destroy(ctx);
}

// Every rank must get `want` from create (no hang), with `text` in the message
// on at least the ranks that detected it.
static void expect_create_error(const char *what, const moe_layer_config *cfg,
                                const moe_parallel_config *pc, const char *text) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_ep_layer *L = NULL;
  const moe_status st = moe_ep_layer_create(ctx, MPI_COMM_WORLD, cfg, pc, &L);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG && L == NULL, "%s: status %s on rank %d", what,
           moe_status_str(st), g_rank);
  int found = strstr(moe_ctx_error(ctx), text) != NULL;
  MPI_Allreduce(MPI_IN_PLACE, &found, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  TU_CHECK(found, "%s: no rank reported '%s' (rank %d: %s)", what, text, g_rank,
           moe_ctx_error(ctx));
  moe_ep_layer_destroy(L);
  moe_ctx_destroy(ctx);
}

// set_placement's refusals, on every rank alike (no hang); copy_slots at create.
static void test_placement_errors(void) {
  if (g_world < 2) return;
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = 16;
  cfg.model_dim = 8;
  cfg.hidden_dim = 12;
  cfg.num_experts = 2 * g_world;
  const int E = cfg.num_experts, P = g_world;
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  pc.ep_size = P;
  pc.copy_slots = E - 2 + 1;  // one more than the experts a rank does not hold
  expect_create_error("copy_slots too large", &cfg, &pc, "copy_slots (");
  pc.copy_slots = 0;  // no slots: the empty placement is a no-op, any copy is refused
  {
    moe_ep_layer *Z = NULL;
    TU_CHECK(moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &Z) == MOE_STATUS_OK, "create 0");
    uint8_t *zero = calloc((size_t)E * P, 1);
    TU_CHECK(Z && moe_ep_layer_set_placement(Z, zero) == MOE_STATUS_OK, "empty placement, 0 slots");
    zero[2 * P + 0] = 1;
    TU_CHECK(Z && moe_ep_layer_set_placement(Z, zero) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "no expert copy slots"),
             "a copy without slots: %s", moe_ctx_error(ctx));
    free(zero);
    moe_ep_layer_destroy(Z);
  }
  pc.copy_slots = 1;
  moe_ep_layer *L = NULL;
  TU_CHECK(moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L) == MOE_STATUS_OK, "create");
  if (!L) goto done;
  moe_ep_layer_init_params(L, 3);
  uint8_t *rep = calloc((size_t)E * P, 1);
  TU_CHECK(moe_ep_layer_set_placement(L, NULL) == MOE_STATUS_INVALID_ARG, "NULL bitmap");
  rep[0 * P + 0] = 1;  // expert 0 on its home, rank 0
  TU_CHECK(moe_ep_layer_set_placement(L, rep) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "is expert 0's home"),
           "copy on home: %s", moe_ctx_error(ctx));
  memset(rep, 0, (size_t)E * P);
  rep[2 * P + 0] = rep[3 * P + 0] = 1;  // two copies on rank 0, one slot
  TU_CHECK(moe_ep_layer_set_placement(L, rep) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "would hold 2 expert copies; the layer has 1 copy slots"),
           "too many copies: %s", moe_ctx_error(ctx));
  memset(rep, 0, (size_t)E * P);
  rep[(g_rank == 0 ? 2 : 3) * P + 0] = 1;  // rank 0 passes another (valid) bitmap
  TU_CHECK(moe_ep_layer_set_placement(L, rep) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "bitmaps differ between ranks"),
           "differing bitmaps: %s", moe_ctx_error(ctx));
  memset(rep, 0, (size_t)E * P);
  rep[2 * P + 0] = 1;  // expert 2 (home rank 1) copied on rank 0: fine
  TU_CHECK(moe_ep_layer_set_placement(L, rep) == MOE_STATUS_OK, "valid placement: %s",
           moe_ctx_error(ctx));
  TU_CHECK(moe_ep_layer_set_replica(L, 3, 0, 1) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "cannot be mixed"),
           "replica after a placement: %s", moe_ctx_error(ctx));
  memset(rep, 0, (size_t)E * P);
  TU_CHECK(moe_ep_layer_set_placement(L, rep) == MOE_STATUS_OK, "empty placement");
  TU_CHECK(moe_ep_layer_set_replica(L, 3, 0, 1) == MOE_STATUS_OK, "replica without copies: %s",
           moe_ctx_error(ctx));
  rep[2 * P + 0] = 1;
  TU_CHECK(moe_ep_layer_set_placement(L, rep) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "cannot be mixed"),
           "placement after a replica: %s", moe_ctx_error(ctx));
  free(rep);
done:
  moe_ep_layer_destroy(L);
  moe_ctx_destroy(ctx);
}

static void test_bad_input(void) {
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = 16;
  cfg.model_dim = 8;
  cfg.hidden_dim = 12;
  cfg.num_experts = 12;
  moe_parallel_config pc;
  moe_parallel_config_default(&pc);
  if (g_world > 1) {
    moe_layer_config c = cfg;
    c.num_experts = g_world == 4 ? 6 : 7;
    pc.ep_size = g_world;
    char text[96];
    snprintf(text, sizeof text, "experts (%d) must be divisible by EP ranks (%d)", c.num_experts,
             g_world);
    expect_create_error("E not divisible by EP", &c, &pc, text);
    moe_parallel_config p2 = pc;
    p2.ranks_per_node = g_world + 1;
    snprintf(text, sizeof text, "ranks per node (%d) must divide the number of ranks (%d)",
             g_world + 1, g_world);
    expect_create_error("ranks per node too large", &cfg, &p2, text);
    if (g_world % 3 != 0) {
      p2 = pc;
      p2.ranks_per_node = 3;
      expect_create_error("ranks per node not dividing", &cfg, &p2,
                          "ranks per node (3) must divide the number of ranks");
    }
    // a configuration that differs on one rank
    c = cfg;
    if (g_rank == g_world - 1) c.hidden_dim = 16;
    expect_create_error("config differs", &c, &pc, "differs between ranks");
    // an invalid value on one rank only
    c = cfg;
    if (g_rank == 0) c.top_k = 0;
    expect_create_error("invalid on one rank", &c, &pc, "top_k (0) must be in");
  }
  if (g_world == 6) {  // EP groups {0,1,2} and {3,4,5} on nodes {0,0,1} and {1,2,2}
    moe_parallel_config p4 = pc;
    p4.ep_size = 3;
    p4.ranks_per_node = 2;
    snprintf(p4.a2a, sizeof p4.a2a, "2dh");
    expect_create_error("2dh on uneven nodes", &cfg, &p4, "needs the same number of ranks");
  }
  moe_parallel_config p3 = pc;
  snprintf(p3.a2a, sizeof p3.a2a, "carrier-pigeon");
  expect_create_error("unknown algorithm", &cfg, &p3, "'carrier-pigeon' is unknown");
  p3 = pc;
  p3.ep_size = g_world + 1;
  expect_create_error("EP too large", &cfg, &p3, "EP size");

  // NaN on one rank: forward fails everywhere, then a good forward works again.
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_ep_layer *L = NULL;
  pc.ep_size = g_world;
  cfg.num_experts = 12;
  TU_CHECK(moe_ep_layer_create(ctx, MPI_COMM_WORLD, &cfg, &pc, &L) == MOE_STATUS_OK, "create: %s",
           moe_ctx_error(ctx));
  moe_ep_layer_init_params(L, 5);
  float x[8 * 8], y[8 * 8], dx[8 * 8] = {0};
  tu_fill(x, 64, 3, -1.0f, 1.0f);
  if (g_rank == g_world - 1) x[10] = NAN;
  const moe_status st = moe_ep_layer_forward(L, x, 8, y, NULL);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "NaN on the last rank: rank %d got %s", g_rank,
           moe_status_str(st));
  TU_CHECK(g_rank != g_world - 1 || strstr(moe_ctx_error(ctx), "input x"), "NaN message: %s",
           moe_ctx_error(ctx));
  TU_CHECK(moe_ep_layer_backward(L, x, dx) == MOE_STATUS_INVALID_ARG,
           "backward after a failed forward");
  x[10] = 0.5f;
  TU_CHECK(moe_ep_layer_forward(L, x, 8, y, NULL) == MOE_STATUS_OK, "recovers: %s",
           moe_ctx_error(ctx));
  const moe_status tst = moe_ep_layer_forward(L, x, g_rank == 0 ? 17 : 8, y, NULL);
  TU_CHECK(tst == MOE_STATUS_INVALID_ARG, "too many tokens on rank 0: rank %d got %s", g_rank,
           moe_status_str(tst));
  moe_ep_layer_destroy(L);
  moe_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  g_comm = MPI_COMM_WORLD;
  int nalgos = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&nalgos);
  // Layouts: DP x EP for every divisor EP of the world, contiguous and strided.
  for (int ep = 1; ep <= g_world; ep++) {
    if (g_world % ep) continue;
    for (int strided = 0; strided <= (ep > 1 && ep < g_world); strided++) {
      const scenario sc = {ep, strided, 0, "mpi", 0.0, -1, 0, 0, MOE_ACT_GELU, 0, 0};
      run_scenario(&sc);
    }
  }
  // Every algorithm with EP = world, on 1 rank per node and (when it divides)
  // 2 ranks per node; dropless and capacity without drops.
  for (int a = 0; a < nalgos; a++) {
    for (int rpn = 1; rpn <= 2; rpn++) {
      if (g_world % rpn) continue;
      const scenario sc = {g_world,
                           0,
                           rpn,
                           algos[a]->name,
                           rpn == 1 ? 0.0 : 6.0,
                           -1,
                           0,
                           0,
                           rpn == 1 ? MOE_ACT_GELU : MOE_ACT_RELU,
                           0,
                           0};
      run_scenario(&sc);
    }
  }
  // A rank with zero tokens, all tokens to one expert, replicas, and all at once.
  const scenario special[] = {
      {g_world, 0, 0, "pairwise", 0.0, g_world - 1, 0, 0, MOE_ACT_GELU, 0, 0},
      {g_world, 0, 0, "pipe", 0.0, -1, 1, 0, MOE_ACT_GELU, 0, 0},
      {g_world, 0, 0, "mpi", 0.0, -1, 0, 1, MOE_ACT_GELU, 0, 0},
      {g_world, 0, 0, "grouped", 6.0, 0, 1, 1, MOE_ACT_RELU, 0, 0},
      {g_world, 0, 0, "mpi", 0.0, -1, 0, 1, MOE_ACT_GELU, 1, 0},
      {g_world, 0, 0, "pipe", 6.0, -1, 1, 0, MOE_ACT_GELU, 1, 0},
      {g_world, 0, 0, "pairwise", 0.0, g_world - 1, 0, 1, MOE_ACT_GELU, 0, 1},
      {g_world, 0, 0, "grouped", 6.0, -1, 0, 0, MOE_ACT_GELU, 1, 1},
      // placements of expert copies: a zero-token rank; skewed by a bias
      {g_world, 0, 0, "pairwise", 0.0, g_world - 1, 0, 0, MOE_ACT_GELU, 0, 0, 5},
      {g_world, 0, 0, "mpi", 0.0, -1, 0, 0, MOE_ACT_RELU, 0, 1, 5},
  };
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
    if (special[i].zero_rank >= 0 && g_world == 1) continue;  // the only rank needs tokens
    if (special[i].placements && g_world == 1) continue;      // one rank holds every expert
    run_scenario(&special[i]);
  }
  if (g_world % 2 == 0 && g_world > 2) {  // every algorithm with DP > 1 (EP = 2)
    for (int a = 0; a < nalgos; a++) {
      for (int strided = 0; strided <= 1; strided++) {
        const scenario sc = {2, strided, 2, algos[a]->name, 0.0, -1, 0, 0, MOE_ACT_GELU, 0, 0};
        run_scenario(&sc);
      }
    }
  }
  if (g_world >= 4 && g_world % 2 == 0) {  // on a sub-communicator: even and odd ranks
    const int world_rank = g_rank, world_size = g_world;
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &sub);
    g_comm = sub;
    MPI_Comm_rank(sub, &g_rank);
    MPI_Comm_size(sub, &g_world);
    for (int a = 0; a < nalgos; a++) {
      const scenario sc = {g_world, 0, 1, algos[a]->name, 0.0, -1, 0, 1, MOE_ACT_GELU, 0, 0};
      run_scenario(&sc);
    }
    g_comm = MPI_COMM_WORLD;
    g_rank = world_rank;
    g_world = world_size;
    MPI_Comm_free(&sub);
  }
  test_replica_is_used();
  test_frozen_placement();
  test_gate_hook();
  if (g_world == 4) {  // DP 2 x EP 2 with replicas and a zero-token rank; with placements
    const scenario sc = {2, 1, 0, "pairwise", 0.0, 1, 0, 1, MOE_ACT_GELU, 0, 0};
    run_scenario(&sc);
    const scenario sp = {2, 1, 0, "pipe", 0.0, 1, 0, 0, MOE_ACT_GELU, 0, 1, 4};
    run_scenario(&sp);
  }
  if (g_world >= 2) {
    // the linked layers' passes polled the pending Agg beside their compute,
    // and on some pass it completed there (many passes: not a timing bound)
    long polls = g_bg_polls, done = g_bg_done;
    MPI_Allreduce(MPI_IN_PLACE, &polls, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &done, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
      printf("linked layers: %ld background polls, done in %ld passes\n", polls, done);
    TU_CHECK(polls > 0 && done > 0, "linked layers: %ld polls, done in %ld passes", polls, done);
  }
  test_bad_input();
  test_placement_errors();

  // Collective result: every rank fails if any did; rank 0 prints the sums.
  int sums[2] = {tu_checks, tu_failures}, tot[2] = {0, 0};
  MPI_Allreduce(sums, tot, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = tot[1] ? 1 : 0;
  if (g_rank == 0) {
    tu_checks = tot[0];
    tu_failures = tot[1];
    rc = tu_finish("test_ep_layer (all ranks)");
  }
  MPI_Finalize();
  return rc;
}
