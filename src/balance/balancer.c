// A load-balancing policy driven step by step (include/moe/balance.h,
// moe_balancer): the window of recent loads, the re-planning period
// (Pro-Prophet's locality: the load changes little between steps, so a plan
// made from step j's counts serves step j + 1, and need not be remade every
// step), the planner of the policy, and the fit of a plan to the copy slots.
//
// Deterministic: every rank gives the same counts and gets the same bytes.
// No MPI here: the caller all-gathers the counts (moe_ep_layer_load) and
// applies the placement (moe_ep_layer_set_placement).
#include <math.h>
#include <string.h>

#include "balance/balance_internal.h"
#include "moe/balance.h"
#include "moe/core.h"

struct moe_balancer {
  moe_ctx *ctx;
  moe_balance_config cfg;
  int E, P;
  int step;  // steps seen
  moe_balance_window win;
  int64_t *mean;     // (P, E) the window's mean
  int64_t *rows;     // (P)
  uint8_t *current;  // (E, P) the placement in force
};

void moe_balance_config_default(moe_balance_config *cfg, int policy, int M, int H, int slots) {
  memset(cfg, 0, sizeof *cfg);
  cfg->policy = policy;
  cfg->replan_every = 1;
  cfg->window = policy == MOE_BALANCE_EPLB ? 10 : 1;
  cfg->slots = slots;
  cfg->prophet_n = MOE_BALANCE_PROPHET_N_DEFAULT;
  cfg->prophet_alpha = MOE_BALANCE_PROPHET_ALPHA_DEFAULT;
  // eq 6: Trans and Agg exposed, as the mechanism runs them today (eq 8
  // assumes Pro-Prophet's scheduler hides them behind compute, not built yet)
  cfg->model = MOE_BALANCE_MODEL_PROPHET;
  moe_balance_cost_default(&cfg->cost, M, H);
}

moe_status moe_balancer_create(moe_ctx *ctx, const moe_balance_config *cfg, int E, int P,
                               moe_balancer **out) {
  moe_status st = MOE_STATUS_OK;
  moe_balancer *b = NULL;
  MOE_FAIL_IF(ctx, !cfg || !out, MOE_STATUS_INVALID_ARG, "cfg and out must not be NULL");
  *out = NULL;
  MOE_FAIL_IF(ctx, !moe_balance_policy_name(cfg->policy), MOE_STATUS_INVALID_ARG,
              "balance policy %d is unknown (valid: %s)", cfg->policy, moe_balance_policy_names());
  MOE_FAIL_IF(ctx, P < 1 || E < 1 || E % P != 0, MOE_STATUS_INVALID_ARG,
              "experts (%d) must be divisible by the EP ranks (%d)", E, P);
  MOE_FAIL_IF(ctx, cfg->replan_every < 1 || cfg->replan_every > 1000000, MOE_STATUS_INVALID_ARG,
              "balance replan_every (%d) must be in [1, 1000000]", cfg->replan_every);
  MOE_FAIL_IF(ctx, cfg->window < 1 || cfg->window > 10000, MOE_STATUS_INVALID_ARG,
              "balance window (%d) must be in [1, 10000] steps", cfg->window);
  MOE_FAIL_IF(ctx, cfg->slots < 0 || cfg->slots > E - E / P, MOE_STATUS_INVALID_ARG,
              "balance slots (%d) must be in [0, %d] (the experts a rank does not hold)",
              cfg->slots, E - E / P);
  MOE_FAIL_IF(ctx, (unsigned)cfg->model >= (unsigned)MOE_BALANCE_MODEL_COUNT_,
              MOE_STATUS_INVALID_ARG, "balance model (%d) must be in [0, %d)", (int)cfg->model,
              (int)MOE_BALANCE_MODEL_COUNT_);
  b = moe_calloc(1, sizeof *b);
  MOE_FAIL_IF(ctx, !b, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the balancer");
  b->ctx = ctx;
  b->cfg = *cfg;
  b->E = E;
  b->P = P;
  MOE_TRY(moe_balance_window_init(ctx, &b->win, E, P, cfg->window));
  b->mean = moe_calloc((size_t)E * P, sizeof(int64_t));
  b->rows = moe_calloc((size_t)P, sizeof(int64_t));
  b->current = moe_calloc((size_t)E * P, 1);
  MOE_FAIL_IF(ctx, !b->mean || !b->rows || !b->current, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate the balancer's tables (%d x %d)", P, E);
  *out = b;
  b = NULL;
done:
  moe_balancer_destroy(b);
  return st;
}

moe_status moe_balancer_set_cost(moe_balancer *b, const moe_balance_cost *cost) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(b ? b->ctx : NULL, !b, MOE_STATUS_INVALID_ARG, "balancer must not be NULL");
  MOE_TRY(moe_balance_check_cost(b->ctx, cost));
  b->cfg.cost = *cost;
done:
  return st;
}

void moe_balancer_destroy(moe_balancer *b) {
  if (!b) return;
  moe_balance_window_free(&b->win);
  moe_free(b->mean);
  moe_free(b->rows);
  moe_free(b->current);
  moe_free(b);
}

void moe_balance_fit_slots(uint8_t *rep, const int64_t *counts, int E, int P, int slots) {
  for (int p = 0; p < P; p++) {
    for (;;) {
      int n = 0, worst = -1;
      for (int e = 0; e < E; e++) {
        if (!rep[(size_t)e * P + p]) continue;
        n++;
        if (worst < 0 || counts[(size_t)p * E + e] <= counts[(size_t)p * E + worst]) worst = e;
      }
      if (n <= slots) break;
      rep[(size_t)worst * P + p] = 0;
    }
  }
}

moe_status moe_balance_plan_auto(moe_ctx *ctx, const moe_balance_load *load,
                                 const moe_balance_cost *cost, moe_balance_model model, int slots,
                                 uint8_t *replica, double *ms, int *chosen) {
  moe_status st = MOE_STATUS_OK;
  uint8_t *cand = NULL;
  int64_t *scratch = NULL;
  MOE_TRY(moe_balance_check(ctx, load, NULL));
  MOE_FAIL_IF(ctx, !replica, MOE_STATUS_INVALID_ARG, "balance: replica must not be NULL");
  const int E = load->num_experts, P = load->num_ranks;
  const size_t n = (size_t)E * P;
  MOE_FAIL_IF(ctx, slots < 0 || slots > E - E / P, MOE_STATUS_INVALID_ARG,
              "balance slots (%d) must be in [0, %d] (the experts a rank does not hold)", slots,
              E - E / P);
  cand = moe_malloc(n);
  MOE_FAIL_IF(ctx, !cand, MOE_STATUS_OUT_OF_MEMORY, "balance: cannot allocate a %d x %d plan", E,
              P);
  double best = 0.0;
  MOE_TRY(moe_balance_predict(ctx, load, NULL, cost, model, &best));
  memset(replica, 0, n);
  int pick = MOE_BALANCE_NONE;
  // prophet and eplb plan with Pro-Prophet's T' (eq 6 when judging by FasterMoE's model)
  const moe_balance_model pm =
      model == MOE_BALANCE_MODEL_FASTERMOE ? MOE_BALANCE_MODEL_PROPHET : model;
  for (int p = MOE_BALANCE_SHADOW; p <= MOE_BALANCE_EPLB; p++) {
    if (p == MOE_BALANCE_SHADOW) MOE_TRY(moe_balance_plan_shadow(ctx, load, cost, cand, NULL));
    if (p == MOE_BALANCE_PROPHET)
      MOE_TRY(moe_balance_plan_prophet(ctx, load, cost, pm, MOE_BALANCE_PROPHET_N_DEFAULT,
                                       MOE_BALANCE_PROPHET_ALPHA_DEFAULT, cand, NULL));
    if (p == MOE_BALANCE_EPLB)
      MOE_TRY(moe_balance_plan_eplb(ctx, load, cost, pm, slots, cand, NULL));
    moe_balance_fit_slots(cand, load->counts, E, P, slots);
    double t = 0.0;
    MOE_TRY(moe_balance_predict(ctx, load, cand, cost, model, &t));
    if (t < best) {
      best = t;
      pick = p;
      memcpy(replica, cand, n);
    }
  }
  if (ms) *ms = best;
  if (chosen) *chosen = pick;
done:
  moe_free(cand);
  moe_free(scratch);
  return st;
}

moe_status moe_balancer_step(moe_balancer *b, const int64_t *counts, uint8_t *replica,
                             moe_balance_step_info *info) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = b ? b->ctx : NULL;
  MOE_FAIL_IF(ctx, !b || !counts || !replica, MOE_STATUS_INVALID_ARG,
              "balancer, counts and replica must not be NULL");
  const uint64_t t0 = moe_time_ns();
  const int E = b->E, P = b->P;
  const size_t n = (size_t)E * P;
  MOE_TRY(moe_balance_window_push(ctx, &b->win, counts));
  moe_balance_step_info in;
  memset(&in, 0, sizeof in);
  in.predicted_ms = NAN;
  in.chosen = b->cfg.policy;
  const int plan = b->cfg.policy != MOE_BALANCE_NONE && b->step % b->cfg.replan_every == 0;
  b->step++;
  if (plan) {
    moe_balance_window_mean(&b->win, b->mean);
    const moe_balance_load load = {E, P, b->mean};
    const moe_balance_config *c = &b->cfg;
    switch (c->policy) {
      case MOE_BALANCE_SHADOW:
        MOE_TRY(moe_balance_plan_shadow(ctx, &load, &c->cost, replica, &in.predicted_ms));
        break;
      case MOE_BALANCE_PROPHET:
        MOE_TRY(moe_balance_plan_prophet(ctx, &load, &c->cost, c->model, c->prophet_n,
                                         c->prophet_alpha, replica, &in.predicted_ms));
        break;
      case MOE_BALANCE_EPLB:
        MOE_TRY(moe_balance_plan_eplb(ctx, &load, &c->cost, c->model, c->slots, replica,
                                      &in.predicted_ms));
        break;
      case MOE_BALANCE_AUTO:
        MOE_TRY(moe_balance_plan_auto(ctx, &load, &c->cost, c->model, c->slots, replica,
                                      &in.predicted_ms, &in.chosen));
        break;
      default:
        memset(replica, 0, n);
        break;
    }
    moe_balance_fit_slots(replica, b->mean, E, P, c->slots);
    memcpy(b->current, replica, n);
    in.planned = 1;
  } else {
    memcpy(replica, b->current, n);
  }
  for (size_t i = 0; i < n; i++) in.copies += replica[i] != 0;
  {
    const moe_balance_load now = {E, P, counts};
    MOE_TRY(moe_balance_rows(ctx, &now, NULL, b->rows));
    in.ratio_before = moe_balance_ratio(b->rows, P);
    MOE_TRY(moe_balance_rows(ctx, &now, replica, b->rows));
    in.ratio_after = moe_balance_ratio(b->rows, P);
  }
  in.plan_ms = moe_time_ms_since(t0);
  if (info) *info = in;
done:
  return st;
}
