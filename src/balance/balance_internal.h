// Private helpers of src/balance/: the unchecked forms of the rows, traffic and
// prediction that the planners call in their loops (the public functions check
// their input once and call these).
#ifndef MOE_BALANCE_INTERNAL_H
#define MOE_BALANCE_INTERNAL_H

#include "moe/balance.h"

// rows (P) under replica (E, P) or NULL; the load is valid.
void moe_balance_rows_unchecked(const moe_balance_load *load, const uint8_t *replica,
                                int64_t *rows);
// sent, recv (P), either NULL; the load is valid.
void moe_balance_traffic_unchecked(const moe_balance_load *load, const uint8_t *replica,
                                   int64_t *sent, int64_t *recv);
// The prediction (ms) of a valid load, bitmap, cost and model; scratch holds
// 2 P int64.
double moe_balance_predict_unchecked(const moe_balance_load *load, const uint8_t *replica,
                                     const moe_balance_cost *cost, moe_balance_model model,
                                     int64_t *scratch);
// Fits replica (E, P) to `slots` copies per rank: a rank over it drops, one
// at a time, its copy taking the fewest rows of counts (P, E) (ties: the
// highest expert), so the copies that move the most work stay.
void moe_balance_fit_slots(uint8_t *replica, const int64_t *counts, int num_experts, int num_ranks,
                           int slots);
// A planner's replica fitted to the slots (moe_balance_fit_slots), then
// checked again: when the fitted placement is predicted no faster than no
// copies under model m (the model the policy planned with), no copies, as
// every planner returns when nothing beats none. *ms and *none_ms (either may
// be NULL): the predictions of the placement returned and of no copies.
moe_status moe_balance_fit_plan(moe_ctx *ctx, const moe_balance_load *load, uint8_t *replica,
                                int slots, const moe_balance_cost *cost, moe_balance_model m,
                                double *ms, double *none_ms);
// INVALID_ARG naming the first field of cost out of range (NULL included).
moe_status moe_balance_check_cost(moe_ctx *ctx, const moe_balance_cost *cost);

// Pro-Prophet's greedy for one n >= 0, with its steps shown (for tests):
// replica (E, P) as moe_balance_plan_prophet; chosen (E): the experts in the
// order taken; trace (E + 1): T' without copies, then after each step;
// *steps: experts taken; *best: the returned prefix's length.
moe_status moe_balance_prophet_steps(moe_ctx *ctx, const moe_balance_load *load,
                                     const moe_balance_cost *cost, moe_balance_model model, int n,
                                     double alpha, uint8_t *replica, int *chosen, double *trace,
                                     int *steps, int *best);

#endif
