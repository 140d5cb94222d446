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

// the most steps a state records (a counter that cannot overflow; 2^53 steps
// is far past any run)
#define BALANCER_STEP_MAX ((int64_t)1 << 53)

struct moe_balancer {
  moe_ctx *ctx;
  moe_balance_config cfg;
  int E, P;
  int64_t step;  // steps seen (a state holds at most BALANCER_STEP_MAX)
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
  // eq 6: Trans and Agg charged in full. The mechanism hides Trans (posted
  // before the forward, waited for only before the copies' rows: 0.1-3 ms
  // left exposed of 200-2000 ms steps on the emulated cluster), so eq 8
  // describes it better on paper; measured, `auto` under eq 8 picked a policy
  // within 5% of the best on 2 of 8 grid points against 3 of 8 under eq 6
  // (docs/balance.md, `auto`): the conservative model stays the default.
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

moe_status moe_balance_fit_plan(moe_ctx *ctx, const moe_balance_load *load, uint8_t *replica,
                                int slots, const moe_balance_cost *cost, moe_balance_model m,
                                double *ms, double *none_ms) {
  moe_status st = MOE_STATUS_OK;
  const size_t n = (size_t)load->num_experts * load->num_ranks;
  moe_balance_fit_slots(replica, load->counts, load->num_experts, load->num_ranks, slots);
  double t = 0.0, t0 = 0.0;
  MOE_TRY(moe_balance_predict(ctx, load, NULL, cost, m, &t0));
  MOE_TRY(moe_balance_predict(ctx, load, replica, cost, m, &t));
  if (t >= t0) {
    memset(replica, 0, n);
    t = t0;
  }
  if (ms) *ms = t;
  if (none_ms) *none_ms = t0;
done:
  return st;
}

// moe_balance_plan_auto, with every candidate's prediction in cand_ms
// (MOE_BALANCE_AUTO entries, by policy: none, shadow, prophet, eplb) when not NULL.
static moe_status plan_auto(moe_ctx *ctx, const moe_balance_load *load,
                            const moe_balance_cost *cost, moe_balance_model model, int slots,
                            uint8_t *replica, double *ms, int *chosen, double *cand_ms) {
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
  if (cand_ms) cand_ms[MOE_BALANCE_NONE] = best;
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
    if (cand_ms) cand_ms[p] = t;
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

moe_status moe_balance_plan_auto(moe_ctx *ctx, const moe_balance_load *load,
                                 const moe_balance_cost *cost, moe_balance_model model, int slots,
                                 uint8_t *replica, double *ms, int *chosen) {
  return plan_auto(ctx, load, cost, model, slots, replica, ms, chosen, NULL);
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
  in.predicted_none_ms = NAN;
  for (int i = 0; i < MOE_BALANCE_AUTO; i++) in.auto_ms[i] = NAN;
  in.chosen = b->cfg.policy;
  const int plan = b->cfg.policy != MOE_BALANCE_NONE && b->step % b->cfg.replan_every == 0;
  if (b->step < BALANCER_STEP_MAX) b->step++;
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
        MOE_TRY(plan_auto(ctx, &load, &c->cost, c->model, c->slots, replica, &in.predicted_ms,
                          &in.chosen, in.auto_ms));
        break;
      default:
        memset(replica, 0, n);
        break;
    }
    if (c->policy != MOE_BALANCE_NONE) {
      // shadow plans with FasterMoE's model (moe_balance_plan_shadow), the
      // others with c->model; the placement as fitted to the slots (none
      // when the fitted one no longer beats it), and none
      const moe_balance_model m =
          c->policy == MOE_BALANCE_SHADOW ? MOE_BALANCE_MODEL_FASTERMOE : c->model;
      MOE_TRY(moe_balance_fit_plan(ctx, &load, replica, c->slots, &c->cost, m, &in.predicted_ms,
                                   &in.predicted_none_ms));
    }
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

// ---- the state in a checkpoint ------------------------------------------------------------
//
// Little-endian, host independent: the magic, the shape and config it
// belongs to, the steps seen, the window's ring (count, next slot, every
// held matrix), the rates, and the placement in force. The window's sum is
// recomputed on load.

static const char state_magic[8] = {'M', 'O', 'E', 'B', 'A', 'L', 'S', '1'};
enum { STATE_INTS = 8, STATE_DOUBLES = 5, STATE_HEAD = 8 + 4 * STATE_INTS + 8 + 8 * STATE_DOUBLES };

static double bits_f64(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}
static uint64_t f64_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

size_t moe_balancer_state_bytes(const moe_balancer *b) {
  if (!b) return 0;
  const size_t n = (size_t)b->E * b->P;
  return STATE_HEAD + (size_t)b->win.capacity * n * 8 + n;
}

void moe_balancer_state_save(const moe_balancer *b, uint8_t *out) {
  if (!b || !out) return;
  const size_t n = (size_t)b->E * b->P;
  const moe_balance_cost *c = &b->cfg.cost;
  uint8_t *p = out;
  memcpy(p, state_magic, 8);
  p += 8;
  const int32_t ints[STATE_INTS] = {b->E,         b->P,         b->cfg.policy, b->win.capacity,
                                    b->cfg.slots, b->win.count, b->win.next,   c->model_dim};
  for (int i = 0; i < STATE_INTS; i++, p += 4) moe_le_put_u32(p, (uint32_t)ints[i]);
  moe_le_put_u64(p, (uint64_t)b->step);
  p += 8;
  const double dbl[STATE_DOUBLES] = {c->flops_per_s, c->net_bytes_per_s, c->expert_param_bytes,
                                     c->fnec_ms, c->bnec_ms};
  for (int i = 0; i < STATE_DOUBLES; i++, p += 8) moe_le_put_u64(p, f64_bits(dbl[i]));
  for (size_t i = 0; i < (size_t)b->win.capacity * n; i++, p += 8)
    moe_le_put_u64(p, (uint64_t)b->win.ring[i]);
  memcpy(p, b->current, n);
}

moe_status moe_balancer_state_load(moe_balancer *b, const uint8_t *in, size_t bytes) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = b ? b->ctx : NULL;
  MOE_FAIL_IF(ctx, !b || !in, MOE_STATUS_INVALID_ARG, "balancer and state must not be NULL");
  const size_t n = (size_t)b->E * b->P;
  MOE_FAIL_IF(ctx, bytes < STATE_HEAD || memcmp(in, state_magic, 8) != 0, MOE_STATUS_INVALID_ARG,
              "balancer state: %zu bytes without the state's header (\"MOEBALS1\")", bytes);
  const uint8_t *p = in + 8;
  int32_t v[STATE_INTS];
  for (int i = 0; i < STATE_INTS; i++, p += 4) v[i] = (int32_t)moe_le_get_u32(p);
  const int64_t step = (int64_t)moe_le_get_u64(p);
  p += 8;
  // what the state belongs to: another one does not apply to this balancer
  MOE_FAIL_IF(ctx, v[0] != b->E || v[1] != b->P, MOE_STATUS_INVALID_ARG,
              "balancer state: of %d experts on %d ranks, this run has %d on %d", v[0], v[1], b->E,
              b->P);
  MOE_FAIL_IF(ctx, v[2] != b->cfg.policy, MOE_STATUS_INVALID_ARG,
              "balancer state: of policy %s, this run balances with %s",
              moe_balance_policy_name(v[2]) ? moe_balance_policy_name(v[2]) : "(unknown)",
              moe_balance_policy_name(b->cfg.policy));
  MOE_FAIL_IF(ctx, v[3] != b->win.capacity || v[4] != b->cfg.slots, MOE_STATUS_INVALID_ARG,
              "balancer state: a window of %d steps and %d slots, this run has %d and %d", v[3],
              v[4], b->win.capacity, b->cfg.slots);
  MOE_FAIL_IF(ctx, bytes != moe_balancer_state_bytes(b), MOE_STATUS_INVALID_ARG,
              "balancer state: %zu bytes, a state of this shape has %zu", bytes,
              moe_balancer_state_bytes(b));
  MOE_FAIL_IF(ctx,
              v[5] < 0 || v[5] > v[3] || v[6] < 0 || v[6] >= v[3] ||
                  (v[5] < v[3] && v[6] != v[5]) || step < 0 || step > BALANCER_STEP_MAX ||
                  v[7] != b->cfg.cost.model_dim,
              MOE_STATUS_INVALID_ARG,
              "balancer state: out of range (window %d held, next %d, step %lld, model dim %d)",
              v[5], v[6], (long long)step, v[7]);
  moe_balance_cost cost = b->cfg.cost;
  double d[STATE_DOUBLES];
  for (int i = 0; i < STATE_DOUBLES; i++, p += 8) d[i] = bits_f64(moe_le_get_u64(p));
  cost.flops_per_s = d[0];
  cost.net_bytes_per_s = d[1];
  cost.expert_param_bytes = d[2];
  cost.fnec_ms = d[3];
  cost.bnec_ms = d[4];
  MOE_TRY(moe_balance_check_cost(ctx, &cost));
  const size_t held = (size_t)v[3] * n;
  for (size_t i = 0; i < held; i++) {
    const int64_t c = (int64_t)moe_le_get_u64(p + 8 * i);
    MOE_FAIL_IF(ctx, c < 0 || c > MOE_BALANCE_COUNT_MAX, MOE_STATUS_INVALID_ARG,
                "balancer state: count %lld in the window (entry %zu) is not in [0, %lld]",
                (long long)c, i, (long long)MOE_BALANCE_COUNT_MAX);
  }
  const uint8_t *cur = p + 8 * held;
  {
    const moe_balance_load none = {b->E, b->P, b->mean};  // the bitmap check only
    memset(b->mean, 0, n * sizeof *b->mean);
    MOE_TRY(moe_balance_check(ctx, &none, cur));
    int over = 0;
    for (int r = 0; r < b->P; r++) {
      int k = 0;
      for (int e = 0; e < b->E; e++) k += cur[(size_t)e * b->P + r];
      over |= k > b->cfg.slots;
    }
    MOE_FAIL_IF(ctx, over, MOE_STATUS_INVALID_ARG,
                "balancer state: a rank holds more copies than its %d slots", b->cfg.slots);
  }
  // valid: replace the state
  b->cfg.cost = cost;
  b->step = step;
  b->win.count = v[5];
  b->win.next = v[6];
  memset(b->win.sum, 0, n * sizeof *b->win.sum);
  for (size_t i = 0; i < held; i++) b->win.ring[i] = (int64_t)moe_le_get_u64(p + 8 * i);
  // the sum of the held matrices: the `count` slots before `next`
  for (int k = 0; k < b->win.count; k++) {
    const int slot = (b->win.next - 1 - k + 2 * v[3]) % v[3];
    const int64_t *m = b->win.ring + (size_t)slot * n;
    for (size_t i = 0; i < n; i++) b->win.sum[i] += m[i];
  }
  memcpy(b->current, cur, n);
done:
  return st;
}

const uint8_t *moe_balancer_placement(const moe_balancer *b) { return b ? b->current : NULL; }
