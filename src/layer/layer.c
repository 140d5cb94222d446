// The single-process MoE layer: gate -> top-k -> routing plan -> dispatch ->
// expert FFNs -> combine, and the backward of each step (docs/moe-layer.md).
//
// All buffers are carved from two arenas at create time (parameters+gradients,
// activations+scratch) for the configured maximum of T tokens, so forward and
// backward allocate nothing. Each expert runs as two GEMMs over all of its rows
// (forward) and four (backward); every GEMM is timed so benchmarks can compare
// the layer with its GEMMs alone.
//
// Deliberately not here: communication, chunking and scheduling (comm/, sched/
// build on the routing plan and placement this file exposes).
#include "moe/layer.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "moe/expert.h"
#include "moe/kernels.h"
#include "moe/layer_ops.h"

struct moe_layer {
  moe_ctx *ctx;
  moe_layer_config cfg;
  const moe_expert_kind *expert;
  int max_rows;  // R: rows the expert buffers hold
  moe_arena param_arena;
  moe_arena work_arena;
  moe_layer_tensors t;
  moe_route route;
  moe_placement placement;
  // forward activations
  float *logits;  // (T, E)
  float *probs;   // (T, E)
  float *lse;     // (T): logsumexp of logits, for the z-loss
  float *topk_p;  // (T, K): probabilities of the chosen experts
  float *xe;      // (R, M): dispatched rows, expert-ordered
  float *pre;     // (R, H): pre-activation
  float *h;       // (R, H): activation
  float *ye;      // (R, M): expert outputs
  // backward scratch
  float *dye;      // (R, M): grads of expert outputs, then reused for grads of xe
  float *dh;       // (R, H)
  float *dpre;     // (R, H)
  float *dweight;  // (T, K)
  float *dprobs;   // (T, E)
  float *dlogits;  // (T, E)
  // state of the last forward
  const float *x_last;
  int tokens_last;
  int have_forward;
  moe_layer_stats stats;
  double *loss_stats;  // (MOE_LOSS_STATS(E)) of the last forward
  moe_layer_timing fwd_timing, bwd_timing;
  // topology-aware gate (moe_layer_set_topology): NULL = off
  uint8_t *topo_local;  // (E)
  double topo_share;
  void *topo_scratch;  // MOE_TOPO_SCRATCH_BYTES(T, K)
};

// Warns once per process when the BLAS runs kernels weaker than the CPU allows.
static void warn_slow_blas_once(void) {
  static atomic_int warned = 0;
  const char *better = moe_blas_better_core();
  if (better && atomic_exchange(&warned, 1) == 0) {
    MOE_WARN(
        "OpenBLAS runs its '%s' kernels on a CPU that supports '%s'; set "
        "OPENBLAS_CORETYPE=%s before starting for several times faster GEMMs",
        moe_blas_core(), better, better);
  }
}

// The layer's two arenas as tables of named tensors: parameters then their
// gradients (N_PARAM_SPECS, the first half data), and the activations with the
// backward scratch. moe_layer_create carves them; moe_layer_memory sizes them,
// so the estimate is the allocation.
// The router bias is the work table's last entry; moe_layer_memory counts it
// as workspace, with the routing plan it steers (it has no gradient).
enum { N_PARAM_SPECS = 10, N_WORK_SPECS = 15, ROUTER_BIAS_SPEC = N_WORK_SPECS - 1 };

static void layer_tables(const moe_layer_config *cfg, size_t R, moe_layer *L,
                         moe_tensor_spec params[N_PARAM_SPECS],
                         moe_tensor_spec work[N_WORK_SPECS]) {
  const size_t T = (size_t)cfg->tokens, M = (size_t)cfg->model_dim, H = (size_t)cfg->hidden_dim,
               E = (size_t)cfg->num_experts, K = (size_t)cfg->top_k;
  moe_layer_tensors *t = &L->t;
  const moe_tensor_spec p[N_PARAM_SPECS] = {
      {"wg", M * E, &t->wg},       {"w1", E * M * H, &t->w1}, {"b1", E * H, &t->b1},
      {"w2", E * H * M, &t->w2},   {"b2", E * M, &t->b2},     {"dwg", M * E, &t->dwg},
      {"dw1", E * M * H, &t->dw1}, {"db1", E * H, &t->db1},   {"dw2", E * H * M, &t->dw2},
      {"db2", E * M, &t->db2},
  };
  const moe_tensor_spec w[N_WORK_SPECS] = {
      {"logits", T * E, &L->logits},
      {"probs", T * E, &L->probs},
      {"lse", T, &L->lse},
      {"topk_p", T * K, &L->topk_p},
      {"xe", R * M, &L->xe},
      {"pre", R * H, &L->pre},
      {"h", R * H, &L->h},
      {"ye", R * M, &L->ye},
      {"dye", R * M, &L->dye},
      {"dh", R * H, &L->dh},
      {"dpre", R * H, &L->dpre},
      {"dweight", T * K, &L->dweight},
      {"dprobs", T * E, &L->dprobs},
      {"dlogits", T * E, &L->dlogits},
      {"router_bias", E, &t->router_bias},
  };
  memcpy(params, p, sizeof p);
  memcpy(work, w, sizeof w);
}

moe_status moe_layer_memory(moe_ctx *ctx, const moe_layer_config *cfg, moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  memset(out, 0, sizeof *out);
  MOE_TRY(moe_layer_config_validate(ctx, cfg));
  {
    moe_layer dummy;  // only its addresses are used: the tables' out-pointers
    moe_tensor_spec params[N_PARAM_SPECS], work[N_WORK_SPECS];
    const size_t R = moe_layer_max_rows(cfg);
    layer_tables(cfg, R, &dummy, params, work);
    const int half = N_PARAM_SPECS / 2;
    // moe_tensor_table_bytes saturates at SIZE_MAX; the sum in double does not wrap.
    for (int i = 0; i < N_PARAM_SPECS; i++)
      out->bytes[i < half ? MOE_MEM_PARAMS : MOE_MEM_GRADS] +=
          (double)moe_align64(params[i].count * sizeof(float));
    for (int i = 0; i < N_WORK_SPECS; i++)
      out->bytes[i == ROUTER_BIAS_SPEC ? MOE_MEM_WORKSPACE : MOE_MEM_ACTIVATIONS] +=
          (double)moe_align64(work[i].count * sizeof(float));
    out->bytes[MOE_MEM_WORKSPACE] +=
        (double)(moe_align64(sizeof(moe_layer)) +
                 moe_route_bytes(cfg->tokens, cfg->top_k, cfg->num_experts, (int)R) +
                 moe_placement_bytes(cfg->num_experts, 1) +
                 moe_align64(MOE_LOSS_STATS(cfg->num_experts) * sizeof(double)));
  }
done:
  return st;
}

moe_status moe_layer_create(moe_ctx *ctx, const moe_layer_config *cfg, moe_layer **out) {
  moe_status st = MOE_STATUS_OK;
  moe_layer *L = NULL;
  warn_slow_blas_once();
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  *out = NULL;
  MOE_TRY(moe_layer_config_validate(ctx, cfg));
  L = moe_calloc(1, sizeof *L);
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the layer");
  L->ctx = ctx;
  L->cfg = *cfg;
  MOE_TRY(moe_expert_kind_find(ctx, cfg->expert, &L->expert));
  const size_t R = moe_layer_max_rows(cfg);
  MOE_FAIL_IF(ctx, R > (size_t)MOE_MAX_ROWS, MOE_STATUS_INVALID_ARG,
              "tokens x top_k (%zu rows) exceeds %d", R, MOE_MAX_ROWS);
  L->max_rows = (int)R;

  moe_tensor_spec params[N_PARAM_SPECS], work[N_WORK_SPECS];
  layer_tables(cfg, R, L, params, work);
  const int np = N_PARAM_SPECS, nw = N_WORK_SPECS;
  const size_t pbytes = moe_tensor_table_bytes(params, np);
  const size_t wbytes = moe_tensor_table_bytes(work, nw);
  MOE_FAIL_IF(ctx, pbytes == SIZE_MAX || wbytes == SIZE_MAX, MOE_STATUS_INVALID_ARG,
              "layer sizes overflow the address space (M %zu, H %zu, E %zu, T %zu)",
              (size_t)cfg->model_dim, (size_t)cfg->hidden_dim, (size_t)cfg->num_experts,
              (size_t)cfg->tokens);
  MOE_TRY(moe_arena_init(ctx, &L->param_arena, pbytes));
  MOE_TRY(moe_arena_init(ctx, &L->work_arena, wbytes));
  MOE_TRY(moe_tensor_table_carve(ctx, &L->param_arena, params, np));
  MOE_TRY(moe_tensor_table_carve(ctx, &L->work_arena, work, nw));
  MOE_TRY(moe_route_init(ctx, &L->route, cfg->tokens, cfg->top_k, cfg->num_experts, L->max_rows));
  MOE_TRY(moe_placement_init(ctx, &L->placement, cfg->num_experts, 1));
  L->loss_stats = moe_calloc(MOE_LOSS_STATS(cfg->num_experts), sizeof(double));
  MOE_FAIL_IF(ctx, !L->loss_stats, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate loss statistics");
  *out = L;
  L = NULL;
done:
  moe_layer_destroy(L);
  return st;
}

// The topology-aware gate off: its mask and scratch freed.
static void topology_off(moe_layer *L) {
  moe_free(L->topo_local);
  moe_free(L->topo_scratch);
  L->topo_local = NULL;
  L->topo_scratch = NULL;
}

void moe_layer_destroy(moe_layer *L) {
  if (!L) return;
  moe_arena_free(&L->param_arena);
  moe_arena_free(&L->work_arena);
  moe_route_free(&L->route);
  moe_placement_free(&L->placement);
  moe_free(L->loss_stats);
  topology_off(L);
  moe_free(L);
}

moe_status moe_layer_set_topology(moe_layer *L, const uint8_t *local, double share) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  const int E = L->cfg.num_experts;
  if (!local) {
    topology_off(L);
    goto done;
  }
  MOE_FAIL_IF(ctx, !(share >= 0 && share <= 1), MOE_STATUS_INVALID_ARG,
              "topology-aware gate: share %g out of range [0, 1]", share);
  if (!L->topo_local) {
    L->topo_local = moe_malloc((size_t)E);
    L->topo_scratch =
        moe_malloc(MOE_TOPO_SCRATCH_BYTES(L->cfg.tokens > 0 ? L->cfg.tokens : 1, L->cfg.top_k));
    if (!L->topo_local || !L->topo_scratch) {
      topology_off(L);
      MOE_FAIL(ctx, MOE_STATUS_OUT_OF_MEMORY, "topology-aware gate: out of memory");
    }
  }
  for (int e = 0; e < E; e++) L->topo_local[e] = local[e] ? 1 : 0;
  L->topo_share = share;
done:
  return st;
}

const moe_layer_config *moe_layer_get_config(const moe_layer *L) { return &L->cfg; }
moe_layer_tensors moe_layer_get_tensors(moe_layer *L) { return L->t; }
const moe_route *moe_layer_get_route(const moe_layer *L) { return &L->route; }
const moe_placement *moe_layer_get_placement(const moe_layer *L) { return &L->placement; }
moe_layer_timing moe_layer_get_forward_timing(const moe_layer *L) { return L->fwd_timing; }
moe_layer_timing moe_layer_get_backward_timing(const moe_layer *L) { return L->bwd_timing; }

size_t moe_layer_num_params(const moe_layer *L) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim,
               E = (size_t)L->cfg.num_experts;
  return M * E + E * (M * H + H + H * M + M);
}

void moe_layer_init_params(moe_layer *L, uint64_t seed) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim,
               E = (size_t)L->cfg.num_experts;
  const float am = 1.0f / sqrtf((float)M), ah = 1.0f / sqrtf((float)H);
  struct {
    float *p;
    size_t n;
    float a;
    uint64_t stream;
  } const init[] = {{L->t.wg, M * E, am, MOE_STREAM_WG},
                    {L->t.w1, E * M * H, am, MOE_STREAM_W1},
                    {L->t.b1, E * H, am, MOE_STREAM_B1},
                    {L->t.w2, E * H * M, ah, MOE_STREAM_W2},
                    {L->t.b2, E * M, ah, MOE_STREAM_B2}};
  for (size_t i = 0; i < sizeof init / sizeof init[0]; i++) {
    moe_init_uniform_slice(init[i].p, init[i].n, seed, init[i].stream, 0, init[i].a);
  }
}

void moe_layer_zero_grad(moe_layer *L) {
  const size_t M = (size_t)L->cfg.model_dim, H = (size_t)L->cfg.hidden_dim,
               E = (size_t)L->cfg.num_experts;
  memset(L->t.dwg, 0, M * E * sizeof(float));
  memset(L->t.dw1, 0, E * M * H * sizeof(float));
  memset(L->t.db1, 0, E * H * sizeof(float));
  memset(L->t.dw2, 0, E * H * M * sizeof(float));
  memset(L->t.db2, 0, E * M * sizeof(float));
}

// ---- forward -----------------------------------------------------------------------

moe_status moe_layer_forward(moe_layer *L, const float *x, int tokens, float *y,
                             moe_layer_stats *stats) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  const moe_layer_config *c = &L->cfg;
  const int M = c->model_dim, H = c->hidden_dim;
  L->have_forward = 0;
  const uint64_t t_start = moe_time_ns();
  MOE_TRY(moe_forward_checks(ctx, c, x, tokens, y));
  memset(&L->fwd_timing, 0, sizeof L->fwd_timing);
  moe_layer_timing *tm = &L->fwd_timing;

  // step 1: gate, routing plan, aux and z losses
  uint64_t t0 = moe_time_ns();
  // the backward scratch dprobs holds the biased scores (free until backward)
  moe_gate_buffers gb = {L->logits,
                         L->probs,
                         L->lse,
                         L->topk_p,
                         moe_router_bias_active(L->t.router_bias, c->num_experts),
                         L->dprobs,
                         L->topo_local,
                         L->topo_share,
                         L->topo_scratch,
                         0};
  MOE_TRY(moe_gate_route(ctx, c, L->t.wg, x, tokens, &gb, &L->route, tm));
  moe_gate_loss_stats(c, &gb, &L->route, tokens, L->loss_stats);
  moe_gate_losses(c, L->loss_stats, &L->stats.aux_loss, &L->stats.z_loss);
  tm->gate_ms = moe_time_ms_since(t0);

  // step 2: dispatch rows into expert order
  t0 = moe_time_ns();
  const moe_route *r = &L->route;
  moe_dispatch_forward(r, x, M, L->xe);
  tm->dispatch_ms = moe_time_ms_since(t0);

  // step 3: experts, each over all of its rows
  for (int e = 0; e < c->num_experts; e++) {
    const size_t off = (size_t)r->offset[e], MH = (size_t)M * (size_t)H;
    const moe_expert_params p = {L->t.w1 + (size_t)e * MH, L->t.b1 + (size_t)e * H,
                                 L->t.w2 + (size_t)e * MH, L->t.b2 + (size_t)e * M};
    L->expert->forward(c, &p, L->xe + off * M, r->count[e], L->pre + off * H, L->h + off * H,
                       L->ye + off * M, tm);
  }

  // step 4: combine
  t0 = moe_time_ns();
  moe_combine_forward(r, L->ye, M, tokens, y);
  tm->combine_ms = moe_time_ms_since(t0);
  tm->total_ms = moe_time_ms_since(t_start);

  L->x_last = x;
  L->tokens_last = tokens;
  L->have_forward = 1;
  L->stats.tokens = tokens;
  L->stats.rows = r->rows;
  L->stats.dropped = r->dropped;
  L->stats.rerouted = gb.topo_rerouted;
  if (stats) *stats = L->stats;
done:
  return st;
}

// ---- backward ----------------------------------------------------------------------

moe_status moe_layer_backward(moe_layer *L, const float *dy, float *dx) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = L ? L->ctx : NULL;
  MOE_FAIL_IF(ctx, !L, MOE_STATUS_INVALID_ARG, "layer must not be NULL");
  MOE_FAIL_IF(ctx, !L->have_forward, MOE_STATUS_INVALID_ARG,
              "backward needs a successful forward first");
  const moe_layer_config *c = &L->cfg;
  const int T = L->tokens_last, M = c->model_dim, H = c->hidden_dim;
  MOE_FAIL_IF(ctx, T > 0 && (!dy || !dx), MOE_STATUS_INVALID_ARG, "dy and dx must not be NULL");
  const uint64_t t_start = moe_time_ns();
  if (c->check_finite) MOE_TRY(moe_check_finite(ctx, "gradient dy", dy, T, M));
  memset(&L->bwd_timing, 0, sizeof L->bwd_timing);
  moe_layer_timing *tm = &L->bwd_timing;
  const moe_route *r = &L->route;

  // step 1: combine backward: grads of expert outputs and of gate weights
  uint64_t t0 = moe_time_ns();
  moe_combine_backward(r, dy, L->ye, M, T, L->dye, L->dweight);
  tm->combine_ms = moe_time_ms_since(t0);

  // step 2: experts backward (leaves the grads of the dispatched rows in L->dye)
  for (int e = 0; e < c->num_experts; e++) {
    const size_t off = (size_t)r->offset[e], MH = (size_t)M * (size_t)H;
    const moe_expert_params p = {L->t.w1 + (size_t)e * MH, L->t.b1 + (size_t)e * H,
                                 L->t.w2 + (size_t)e * MH, L->t.b2 + (size_t)e * M};
    const moe_expert_grads g = {L->t.dw1 + (size_t)e * MH, L->t.db1 + (size_t)e * H,
                                L->t.dw2 + (size_t)e * MH, L->t.db2 + (size_t)e * M};
    L->expert->backward(c, &p, &g, L->xe + off * M, L->pre + off * H, L->h + off * H,
                        L->dye + off * M, r->count[e], L->dh + off * H, L->dpre + off * H, tm);
  }

  // step 3: dispatch backward: scatter-add row grads into token grads
  t0 = moe_time_ns();
  moe_dispatch_backward(r, L->dye, M, dx);
  tm->dispatch_ms = moe_time_ms_since(t0);

  // step 4: gate backward (softmax, top-k, renormalisation, aux and z losses)
  t0 = moe_time_ns();
  moe_gate_buffers gb = {L->logits, L->probs, L->lse, L->topk_p, NULL, NULL, NULL, 0, NULL, 0};
  moe_gate_backward(c, &gb, r, T, L->loss_stats, L->dweight, L->dprobs, L->dlogits, L->x_last,
                    L->t.wg, L->t.dwg, dx, tm);
  tm->gate_ms = moe_time_ms_since(t0);
  tm->total_ms = moe_time_ms_since(t_start);
done:
  return st;
}
