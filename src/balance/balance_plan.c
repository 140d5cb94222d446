// The balancing planners: FasterMoE's shadowing (Algorithm 1), Pro-Prophet's
// greedy placement (Algorithm 1) and EPLB-style redundant slots. Each writes a
// copy bitmap (E, P) under the rule of moe/balance.h and its predicted time.
// Deterministic: integer loads, fixed-order double models, ties to the lowest
// index; qsort is only given total orders (index as the last key), so its
// instability cannot show. Scratch comes from moe_malloc, freed before
// returning. Not the run-time mechanism (Trans/Agg tasks), not `auto`.
//
// Cost: shadow O(E (log E + P)) loads; prophet O(E P) per step, at most E/P x P
// steps per n, P - 1 values of n with n = -1; eplb O(E P) per copy, at most
// slots x P copies.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "balance/balance_internal.h"

// ---- shared -------------------------------------------------------------------------------

static moe_status check_plan_args(moe_ctx *ctx, const moe_balance_load *load,
                                  const moe_balance_cost *cost, const uint8_t *replica) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_balance_check(ctx, load, NULL));
  MOE_TRY(moe_balance_check_cost(ctx, cost));
  MOE_FAIL_IF(ctx, !replica, MOE_STATUS_INVALID_ARG,
              "balance: replica must not be NULL (an (E, P) = (%d, %d) bitmap)", load->num_experts,
              load->num_ranks);
done:
  return st;
}

static int64_t count_at(const moe_balance_load *load, int src, int e) {
  return load->counts[(size_t)src * (size_t)load->num_experts + (size_t)e];
}

// totals (E): rows sent to each expert by every rank, summed in rank order.
static void expert_totals(const moe_balance_load *load, int64_t *totals) {
  const int E = load->num_experts, P = load->num_ranks;
  for (int e = 0; e < E; e++) totals[e] = 0;
  for (int src = 0; src < P; src++)
    for (int e = 0; e < E; e++) totals[e] += count_at(load, src, e);
}

// A (key, index) pair for qsort: key descending or ascending, then index.
typedef struct {
  int64_t key;
  int index;
} keyed;

static int by_key_desc(const void *a, const void *b) {
  const keyed *x = a, *y = b;
  if (x->key != y->key) return x->key > y->key ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

static int by_key_asc(const void *a, const void *b) {
  const keyed *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

// ---- shadow: FasterMoE Algorithm 1 --------------------------------------------------------
//
// 1. c_min = Lat_imbl (eq 7) of the load as it is.
// 2. For the experts in descending load: shadow it (a copy on every rank but
//    home that sends it rows; those rows are computed at their source) and
//    predict Lat_shadow(|E_s| + 1, B') (eq 8).
// 3. Keep it when the prediction is below c_min (which becomes it); else
//    undo it and stop.

moe_status moe_balance_plan_shadow(moe_ctx *ctx, const moe_balance_load *load,
                                   const moe_balance_cost *cost, uint8_t *replica, double *ms) {
  moe_status st = MOE_STATUS_OK;
  int64_t *scratch = NULL;
  keyed *order = NULL;
  MOE_TRY(check_plan_args(ctx, load, cost, replica));
  const int E = load->num_experts, P = load->num_ranks;
  memset(replica, 0, (size_t)E * (size_t)P);
  scratch = moe_malloc(((size_t)E + 2 * (size_t)P) * sizeof *scratch);
  order = moe_malloc((size_t)E * sizeof *order);
  MOE_FAIL_IF(ctx, !scratch || !order, MOE_STATUS_OUT_OF_MEMORY,
              "balance: cannot allocate the shadow planner's scratch (E = %d, P = %d)", E, P);
  int64_t *totals = scratch + 2 * P;
  expert_totals(load, totals);
  for (int e = 0; e < E; e++) order[e] = (keyed){totals[e], e};
  qsort(order, (size_t)E, sizeof *order, by_key_desc);
  const moe_balance_model model = MOE_BALANCE_MODEL_FASTERMOE;
  double c_min = moe_balance_predict_unchecked(load, replica, cost, model, scratch);
  for (int k = 0; k < E; k++) {
    const int e = order[k].index, home = moe_balance_home(E, P, e);
    uint8_t *bits = replica + (size_t)e * (size_t)P;
    for (int p = 0; p < P; p++) bits[p] = p != home && count_at(load, p, e) > 0;
    const double c = moe_balance_predict_unchecked(load, replica, cost, model, scratch);
    if (c < c_min) {
      c_min = c;
    } else {
      memset(bits, 0, (size_t)P);
      break;
    }
  }
  if (ms) *ms = c_min;
done:
  moe_free(scratch);
  moe_free(order);
  return st;
}

// ---- prophet: Pro-Prophet Algorithm 1 -------------------------------------------------------

typedef struct {
  const moe_balance_load *load;
  const moe_balance_cost *cost;
  moe_balance_model model;
  double alpha;
  int64_t *scratch;  // 2 P: the prediction's
  int64_t *rows;     // P
  int64_t *totals;   // E
  keyed *ranks;      // P
  int *chosen;       // E: the experts in the order the greedy takes them
  uint8_t *used;     // E
  uint8_t *work;     // E x P
  double *trace;     // NULL or E + 1: T' without copies, then after each step
  int steps, best;   // of the last run: experts taken, the answer's prefix
} prophet_state;

// Gives expert e its copies for this n: the ranks other than home, sorted by
// the rows they send e (ascending, then rank); the first n get none
// (BottomK), the others a copy when they send e rows.
static void prophet_copies(prophet_state *s, int e, int n, uint8_t *replica) {
  const moe_balance_load *load = s->load;
  const int E = load->num_experts, P = load->num_ranks, home = moe_balance_home(E, P, e);
  int m = 0;
  for (int p = 0; p < P; p++)
    if (p != home) s->ranks[m++] = (keyed){count_at(load, p, e), p};
  qsort(s->ranks, (size_t)m, sizeof *s->ranks, by_key_asc);
  for (int j = n; j < m; j++)
    if (s->ranks[j].key > 0) replica[(size_t)e * (size_t)P + (size_t)s->ranks[j].index] = 1;
}

// eq 7: max(H) - min(H) < alpha I / E; a load with no rows is balanced.
static int prophet_balanced(const prophet_state *s, const int64_t *rows) {
  const int E = s->load->num_experts, P = s->load->num_ranks;
  int64_t max = rows[0], min = rows[0], total = 0;
  for (int p = 0; p < P; p++) {
    total += rows[p];
    if (rows[p] > max) max = rows[p];
    if (rows[p] < min) min = rows[p];
  }
  if (total == 0) return 1;
  return (double)(max - min) * (double)E < s->alpha * (double)total;
}

static int64_t rows_max(const int64_t *rows, int P) {
  int64_t m = rows[0];
  for (int p = 1; p < P; p++)
    if (rows[p] > m) m = rows[p];
  return m;
}

// One greedy run for one n: writes the best prefix into replica, returns its T'.
// 1. T_out = T'(no copies); Used = {}.
// 2. While H is not balanced (eq 7): i = the heaviest rank; e = its heaviest
//    home expert not in Used (none: stop); Used += e; give e its copies
//    (BottomK of n); T_c = T'. A prefix becomes the answer when T_c < T_out
//    and max(H) is not above the max without copies.
// 3. Replay the answer's prefix into replica.
static double prophet_run(prophet_state *s, int n, uint8_t *replica) {
  const moe_balance_load *load = s->load;
  const int E = load->num_experts, P = load->num_ranks, per_rank = E / P;
  const size_t bits = (size_t)E * (size_t)P;
  memset(s->work, 0, bits);
  memset(s->used, 0, (size_t)E);
  double t_out = moe_balance_predict_unchecked(load, s->work, s->cost, s->model, s->scratch);
  if (s->trace) s->trace[0] = t_out;
  moe_balance_rows_unchecked(load, s->work, s->rows);
  const int64_t max0 = rows_max(s->rows, P);
  int steps = 0, best = 0;
  while (!prophet_balanced(s, s->rows)) {
    int dev = 0;
    for (int p = 1; p < P; p++)
      if (s->rows[p] > s->rows[dev]) dev = p;
    int e = -1;
    for (int x = dev * per_rank; x < (dev + 1) * per_rank; x++)
      if (!s->used[x] && (e < 0 || s->totals[x] > s->totals[e])) e = x;
    if (e < 0) break;
    s->used[e] = 1;
    s->chosen[steps++] = e;
    prophet_copies(s, e, n, s->work);
    const double t_c = moe_balance_predict_unchecked(load, s->work, s->cost, s->model, s->scratch);
    if (s->trace) s->trace[steps] = t_c;
    moe_balance_rows_unchecked(load, s->work, s->rows);
    if (t_c < t_out && rows_max(s->rows, P) <= max0) {
      t_out = t_c;
      best = steps;
    }
  }
  memset(replica, 0, bits);
  for (int k = 0; k < best; k++) prophet_copies(s, s->chosen[k], n, replica);
  s->steps = steps;
  s->best = best;
  return t_out;
}

// The planner; with trace (E + 1), chosen (E), steps, best not NULL it runs
// one n >= 0 and reports the greedy's steps (moe_balance_prophet_steps).
static moe_status plan_prophet(moe_ctx *ctx, const moe_balance_load *load,
                               const moe_balance_cost *cost, moe_balance_model model, int n,
                               double alpha, uint8_t *replica, double *ms, double *trace,
                               int *chosen, int *steps, int *best) {
  moe_status st = MOE_STATUS_OK;
  prophet_state s = {0};
  void *mem = NULL;
  MOE_TRY(check_plan_args(ctx, load, cost, replica));
  const int E = load->num_experts, P = load->num_ranks;
  const int n_max = P >= 2 ? P - 2 : 0;
  MOE_FAIL_IF(ctx, model != MOE_BALANCE_MODEL_PROPHET && model != MOE_BALANCE_MODEL_PROPHET_SCHED,
              MOE_STATUS_INVALID_ARG,
              "balance: prophet's model (%d) must be MOE_BALANCE_MODEL_PROPHET (%d) or "
              "MOE_BALANCE_MODEL_PROPHET_SCHED (%d)",
              (int)model, (int)MOE_BALANCE_MODEL_PROPHET, (int)MOE_BALANCE_MODEL_PROPHET_SCHED);
  MOE_FAIL_IF(ctx, n < -1 || n > n_max, MOE_STATUS_INVALID_ARG,
              "balance: prophet's n (%d) must be -1 (try every n) or in [0, %d] (P - 2)", n, n_max);
  MOE_FAIL_IF(ctx, !(alpha > 0) || !(alpha < 1e300), MOE_STATUS_INVALID_ARG,
              "balance: prophet's alpha (%g) must be finite and > 0", alpha);
  MOE_FAIL_IF(ctx, trace && n < 0, MOE_STATUS_INVALID_ARG,
              "balance: prophet's steps are reported for one n >= 0 (n = %d)", n);
  const size_t bits = (size_t)E * (size_t)P;
  // one block: int64 scratch (2P), rows (P), totals (E); keyed ranks (P);
  // int chosen (E); used (E), work (E P), cand (E P) bytes
  const size_t n64 = 3 * (size_t)P + (size_t)E;
  const size_t bytes = n64 * sizeof(int64_t) + (size_t)P * sizeof(keyed) + (size_t)E * sizeof(int) +
                       (size_t)E + 2 * bits;
  mem = moe_malloc(bytes);
  MOE_FAIL_IF(ctx, !mem, MOE_STATUS_OUT_OF_MEMORY,
              "balance: cannot allocate the prophet planner's scratch (%zu bytes)", bytes);
  s.load = load;
  s.cost = cost;
  s.model = model;
  s.alpha = alpha;
  s.trace = trace;
  s.scratch = mem;
  s.rows = s.scratch + 2 * P;
  s.totals = s.rows + P;
  s.ranks = (keyed *)(s.totals + E);
  s.chosen = (int *)(s.ranks + P);
  s.used = (uint8_t *)(s.chosen + E);
  s.work = s.used + E;
  uint8_t *cand = s.work + bits;
  expert_totals(load, s.totals);
  double t_best;
  if (n >= 0 || P < 2) {
    t_best = prophet_run(&s, n < 0 ? 0 : n, replica);
  } else {
    t_best = prophet_run(&s, 0, replica);
    for (int k = 1; k <= P - 2; k++) {
      const double t = prophet_run(&s, k, cand);
      if (t < t_best) {
        t_best = t;
        memcpy(replica, cand, bits);
      }
    }
  }
  if (ms) *ms = t_best;
  if (chosen) memcpy(chosen, s.chosen, (size_t)s.steps * sizeof *chosen);
  if (steps) *steps = s.steps;
  if (best) *best = s.best;
done:
  moe_free(mem);
  return st;
}

moe_status moe_balance_plan_prophet(moe_ctx *ctx, const moe_balance_load *load,
                                    const moe_balance_cost *cost, moe_balance_model model, int n,
                                    double alpha, uint8_t *replica, double *ms) {
  return plan_prophet(ctx, load, cost, model, n, alpha, replica, ms, NULL, NULL, NULL, NULL);
}

moe_status moe_balance_prophet_steps(moe_ctx *ctx, const moe_balance_load *load,
                                     const moe_balance_cost *cost, moe_balance_model model, int n,
                                     double alpha, uint8_t *replica, int *chosen, double *trace,
                                     int *steps, int *best) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !chosen || !trace || !steps || !best, MOE_STATUS_INVALID_ARG,
              "balance: chosen, trace, steps and best must not be NULL");
  st = plan_prophet(ctx, load, cost, model, n, alpha, replica, NULL, trace, chosen, steps, best);
done:
  return st;
}

// ---- eplb: redundant slots -----------------------------------------------------------------
//
// 1. rows = the load without copies; T_best = the prediction without copies.
// 2. The experts that can lower (max rows, ranks at max) are those whose home
//    is at the max; among them take the one with the highest total / (1 +
//    copies), then the rank whose copy lowers the pair most (a free slot, no
//    copy yet, not home, counts[p][e] > 0). None: stop.
// 3. Place it (counts[p][e] rows move from home to p); predict; a prefix
//    becomes the answer when its prediction is below T_best.
// 4. Replay the answer's prefix.

// (max, ranks at max) of rows after moving x rows from rank h to rank p.
static void pair_after(const int64_t *rows, int P, int h, int p, int64_t x, int64_t *max, int *at) {
  int64_t m = -1;
  int k = 0;
  for (int q = 0; q < P; q++) {
    const int64_t v = rows[q] + (q == p ? x : 0) - (q == h ? x : 0);
    if (v > m) {
      m = v;
      k = 1;
    } else if (v == m) {
      k++;
    }
  }
  *max = m;
  *at = k;
}

static int pair_less(int64_t m1, int a1, int64_t m2, int a2) {
  return m1 < m2 || (m1 == m2 && a1 < a2);
}

moe_status moe_balance_plan_eplb(moe_ctx *ctx, const moe_balance_load *load,
                                 const moe_balance_cost *cost, moe_balance_model model, int slots,
                                 uint8_t *replica, double *ms) {
  moe_status st = MOE_STATUS_OK;
  void *mem = NULL;
  MOE_TRY(check_plan_args(ctx, load, cost, replica));
  const int E = load->num_experts, P = load->num_ranks, per_rank = E / P;
  MOE_FAIL_IF(ctx, (int)model < 0 || model >= MOE_BALANCE_MODEL_COUNT_, MOE_STATUS_INVALID_ARG,
              "balance: model (%d) must be in [0, %d)", (int)model, (int)MOE_BALANCE_MODEL_COUNT_);
  MOE_FAIL_IF(ctx, slots < 0 || slots > E - per_rank, MOE_STATUS_INVALID_ARG,
              "balance: eplb's slots (%d) must be in [0, %d] (E - E/P, the experts a rank does "
              "not hold)",
              slots, E - per_rank);
  const size_t bits = (size_t)E * (size_t)P;
  const size_t max_steps = (size_t)slots * (size_t)P;
  // int64 scratch (2P), rows (P), totals (E); int copies (E), used (P), seq (2 x steps)
  const size_t bytes = (3 * (size_t)P + (size_t)E) * sizeof(int64_t) +
                       ((size_t)E + (size_t)P + 2 * max_steps) * sizeof(int);
  mem = moe_malloc(bytes);
  MOE_FAIL_IF(ctx, !mem, MOE_STATUS_OUT_OF_MEMORY,
              "balance: cannot allocate the eplb planner's scratch (%zu bytes)", bytes);
  int64_t *scratch = mem, *rows = scratch + 2 * P, *totals = rows + P;
  int *copies = (int *)(totals + E), *used = copies + E, *seq = used + P;
  memset(replica, 0, bits);
  memset(copies, 0, (size_t)E * sizeof *copies);
  memset(used, 0, (size_t)P * sizeof *used);
  expert_totals(load, totals);
  moe_balance_rows_unchecked(load, NULL, rows);
  double t_best = moe_balance_predict_unchecked(load, replica, cost, model, scratch);
  size_t steps = 0, best = 0;
  while (steps < max_steps) {
    int64_t cur_max;
    int cur_at;
    pair_after(rows, P, 0, 0, 0, &cur_max, &cur_at);
    int be = -1, bp = -1;
    for (int e = 0; e < E; e++) {
      const int home = moe_balance_home(E, P, e);
      if (rows[home] != cur_max) continue;  // moving rows off another rank lowers nothing
      // a candidate ranks below the best so far on load per copy: skip
      if (be >= 0) {
        const double lhs = (double)totals[e] * (double)(1 + copies[be]);
        const double rhs = (double)totals[be] * (double)(1 + copies[e]);
        if (lhs <= rhs) continue;  // ties keep the lower index, found first
      }
      int pe = -1;
      int64_t me = 0;
      int ae = 0;
      for (int p = 0; p < P; p++) {
        const int64_t x = count_at(load, p, e);
        if (p == home || x == 0 || used[p] >= slots || replica[(size_t)e * (size_t)P + (size_t)p])
          continue;
        int64_t m;
        int a;
        pair_after(rows, P, home, p, x, &m, &a);
        if (!pair_less(m, a, cur_max, cur_at)) continue;
        if (pe < 0 || pair_less(m, a, me, ae)) {
          pe = p;
          me = m;
          ae = a;
        }
      }
      if (pe >= 0) {
        be = e;
        bp = pe;
      }
    }
    if (be < 0) break;
    const int home = moe_balance_home(E, P, be);
    const int64_t x = count_at(load, bp, be);
    replica[(size_t)be * (size_t)P + (size_t)bp] = 1;
    rows[home] -= x;
    rows[bp] += x;
    copies[be]++;
    used[bp]++;
    seq[2 * steps] = be;
    seq[2 * steps + 1] = bp;
    steps++;
    const double t = moe_balance_predict_unchecked(load, replica, cost, model, scratch);
    if (t < t_best) {
      t_best = t;
      best = steps;
    }
  }
  memset(replica, 0, bits);
  for (size_t k = 0; k < best; k++)
    replica[(size_t)seq[2 * k] * (size_t)P + (size_t)seq[2 * k + 1]] = 1;
  if (ms) *ms = t_best;
done:
  moe_free(mem);
  return st;
}

// ---- Lina -------------------------------------------------------------------------------

typedef struct {
  int64_t devices, total;
  int index;
} lina_need;

// devices descending, then total descending, then index ascending
static int by_need(const void *a, const void *b) {
  const lina_need *x = a, *y = b;
  if (x->devices != y->devices) return x->devices > y->devices ? -1 : 1;
  if (x->total != y->total) return x->total > y->total ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

moe_status moe_balance_plan_lina(moe_ctx *ctx, const moe_balance_load *load, int slots,
                                 uint8_t *replica) {
  moe_status st = MOE_STATUS_OK;
  void *mem = NULL;
  MOE_TRY(moe_balance_check(ctx, load, NULL));
  MOE_FAIL_IF(ctx, !replica, MOE_STATUS_INVALID_ARG, "balance: replica must not be NULL");
  {
    const int E = load->num_experts, P = load->num_ranks, per_rank = E / P;
    MOE_FAIL_IF(ctx, slots < 0 || slots > E - per_rank, MOE_STATUS_INVALID_ARG,
                "balance: lina's slots (%d) must be in [0, %d] (E - E/P, the experts a rank "
                "does not hold)",
                slots, E - per_rank);
    memset(replica, 0, (size_t)E * (size_t)P);
    mem = moe_malloc((size_t)E * sizeof(int64_t) + (size_t)E * sizeof(lina_need) +
                     (size_t)P * sizeof(keyed) + (size_t)P * sizeof(int) +
                     (size_t)P * sizeof(int64_t));
    MOE_FAIL_IF(ctx, !mem, MOE_STATUS_OUT_OF_MEMORY, "balance: lina: out of memory");
    int64_t *totals = mem;
    lina_need *order = (lina_need *)(totals + E);
    keyed *ranks = (keyed *)(order + E);
    int64_t *rows = (int64_t *)(ranks + P);  // each rank's rows under the copies so far
    int *used = (int *)(rows + P);           // (after the 8-byte ones: aligned for any P)
    expert_totals(load, totals);
    int64_t all = 0;
    for (int e = 0; e < E; e++) all += totals[e];
    if (all == 0 || slots == 0 || P < 2) goto done;
    for (int p = 0; p < P; p++) used[p] = 0, rows[p] = 0;
    for (int e = 0; e < E; e++) rows[moe_balance_home(E, P, e)] += totals[e];
    for (int e = 0; e < E; e++) {  // d_e = round(P x share) in [1, P]
      int64_t de = (int64_t)floor((double)P * (double)totals[e] / (double)all + 0.5);
      order[e].devices = de < 1 ? 1 : de > P ? P : de;
      order[e].total = totals[e];
      order[e].index = e;
    }
    qsort(order, (size_t)E, sizeof *order, by_need);
    for (int k = 0; k < E && order[k].devices > 1; k++) {  // descending: the rest need none
      const int e = order[k].index, home = moe_balance_home(E, P, e);
      int need = (int)order[k].devices - 1, n = 0;
      for (int p = 0; p < P; p++) {
        if (p == home || used[p] >= slots || count_at(load, p, e) <= 0) continue;
        ranks[n].key = count_at(load, p, e);
        ranks[n++].index = p;
      }
      qsort(ranks, (size_t)n, sizeof *ranks, by_key_desc);
      for (int j = 0; j < n && need > 0; j++) {
        const int p = ranks[j].index;
        const int64_t c = ranks[j].key;
        if (rows[p] + c > rows[home]) continue;  // p would compute more than the home did
        replica[(size_t)e * P + p] = 1;
        used[p]++;
        rows[p] += c;
        rows[home] -= c;
        need--;
      }
    }
  }
done:
  moe_free(mem);
  return st;
}
