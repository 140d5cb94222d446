// Load-balancing predictions on a described cluster (include/moe/balance.h,
// `moe simulate --balance`): the load a skew gives every device, each
// policy's plan on it with the cluster's rates, and the plan's time under
// both papers' models next to no copies. The papers' testbeds are shipped
// cluster descriptions (clusters/*.json); the skew is a named distribution
// (moe_skew) because the papers' own gate traces are not published.
//
// Not here: the layer's task graphs (moe_simulate_layer simulates those for
// uniform routing); these are the planners' closed-form models.
#include <math.h>
#include <string.h>

#include "balance/balance_internal.h"
#include "moe/balance.h"

void moe_balance_cost_of_cluster(const moe_cluster *cl, int M, int H, moe_balance_cost *cost) {
  moe_balance_cost_default(cost, M, H);
  cost->flops_per_s = cl->gemm_tflops * 1e12;
  const double inter = cl->inter.gbit_per_s * 1e9 / 8.0 * cl->nics_per_node / cl->devices_per_node;
  const double intra = cl->intra.gbit_per_s * 1e9 / 8.0;
  cost->net_bytes_per_s = cl->nodes > 1 ? (inter < intra ? inter : intra) : intra;
}

moe_status moe_balance_simulate(moe_ctx *ctx, const moe_cluster *cl, const moe_layer_config *cfg,
                                const double *shares, const int *policies, int n, int slots,
                                moe_balance_sim_result *out) {
  moe_status st = MOE_STATUS_OK;
  int64_t *counts = NULL, *rows = NULL;
  uint8_t *rep = NULL;
  MOE_FAIL_IF(ctx, !cl || !cfg || !shares || !policies || !out || n < 1, MOE_STATUS_INVALID_ARG,
              "balance simulate: cluster, cfg, shares, policies and out must be given (n >= 1)");
  const int P = moe_cluster_devices(cl), E = cfg->num_experts;
  MOE_FAIL_IF(ctx, P < 1 || E < 1 || E % P != 0, MOE_STATUS_INVALID_ARG,
              "experts (%d) must be divisible by the devices (%d)", E, P);
  MOE_FAIL_IF(ctx, slots < 0 || slots > E - E / P, MOE_STATUS_INVALID_ARG,
              "balance slots (%d) must be in [0, %d] (the experts a device does not hold)", slots,
              E - E / P);
  counts = moe_malloc((size_t)P * E * sizeof(int64_t));
  rows = moe_malloc((size_t)P * sizeof(int64_t));
  rep = moe_malloc((size_t)E * P);
  MOE_FAIL_IF(ctx, !counts || !rows || !rep, MOE_STATUS_OUT_OF_MEMORY,
              "balance simulate: cannot allocate %d x %d counts", P, E);
  for (int p = 0; p < P; p++)
    for (int e = 0; e < E; e++)
      counts[(size_t)p * E + e] = (int64_t)llround((double)cfg->tokens * cfg->top_k * shares[e]);
  moe_balance_cost cost;
  moe_balance_cost_of_cluster(cl, cfg->model_dim, cfg->hidden_dim, &cost);
  const moe_balance_load load = {E, P, counts};
  for (int i = 0; i < n; i++) {
    moe_balance_sim_result *r = &out[i];
    memset(r, 0, sizeof *r);
    r->policy = policies[i];
    switch (policies[i]) {
      case MOE_BALANCE_NONE:
        memset(rep, 0, (size_t)E * P);
        break;
      case MOE_BALANCE_SHADOW:
        MOE_TRY(moe_balance_plan_shadow(ctx, &load, &cost, rep, NULL));
        break;
      case MOE_BALANCE_PROPHET:
        MOE_TRY(moe_balance_plan_prophet(ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET,
                                         MOE_BALANCE_PROPHET_N_DEFAULT,
                                         MOE_BALANCE_PROPHET_ALPHA_DEFAULT, rep, NULL));
        break;
      case MOE_BALANCE_EPLB:
        MOE_TRY(
            moe_balance_plan_eplb(ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, slots, rep, NULL));
        break;
      case MOE_BALANCE_AUTO:
        MOE_TRY(moe_balance_plan_auto(ctx, &load, &cost, MOE_BALANCE_MODEL_PROPHET, slots, rep,
                                      NULL, NULL));
        break;
      default:
        MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "balance policy %d is unknown (valid: %s)",
                 policies[i], moe_balance_policy_names());
    }
    if (policies[i] != MOE_BALANCE_NONE)  // the model the policy planned with judges the cut
      MOE_TRY(moe_balance_fit_plan(ctx, &load, rep, slots, &cost,
                                   policies[i] == MOE_BALANCE_SHADOW ? MOE_BALANCE_MODEL_FASTERMOE
                                                                     : MOE_BALANCE_MODEL_PROPHET,
                                   NULL, NULL));
    for (size_t k = 0; k < (size_t)E * P; k++) r->copies += rep[k] != 0;
    MOE_TRY(moe_balance_rows(ctx, &load, NULL, rows));
    r->ratio_before = moe_balance_ratio(rows, P);
    MOE_TRY(moe_balance_rows(ctx, &load, rep, rows));
    r->ratio_after = moe_balance_ratio(rows, P);
    MOE_TRY(
        moe_balance_predict(ctx, &load, rep, &cost, MOE_BALANCE_MODEL_FASTERMOE, &r->ms_fastermoe));
    MOE_TRY(moe_balance_predict(ctx, &load, rep, &cost, MOE_BALANCE_MODEL_PROPHET, &r->ms_prophet));
    MOE_TRY(moe_balance_predict(ctx, &load, NULL, &cost, MOE_BALANCE_MODEL_FASTERMOE,
                                &r->none_fastermoe));
    MOE_TRY(
        moe_balance_predict(ctx, &load, NULL, &cost, MOE_BALANCE_MODEL_PROPHET, &r->none_prophet));
  }
done:
  moe_free(counts);
  moe_free(rows);
  moe_free(rep);
  return st;
}
