// Load balancing, the parts every planner shares: checking a load, the rows
// each rank computes and the all-to-all traffic under a copy bitmap, the
// FasterMoE and Pro-Prophet time models, the policy catalogue and the window
// of recent loads. Pure C, no MPI, deterministic (integer sums; the models
// are a fixed sequence of double operations). Not the planners
// (balance_plan.c) and not the run-time mechanism that moves copies.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "balance/balance_internal.h"

// E x P is kept well inside size_t and int arithmetic on every platform.
#define MOE_BALANCE_MAX_EXPERTS (1 << 20)

// ---- checks ---------------------------------------------------------------------------

static moe_status check_shape(moe_ctx *ctx, int num_experts, int num_ranks) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, num_ranks < 1, MOE_STATUS_INVALID_ARG, "balance: ranks (%d) must be >= 1",
              num_ranks);
  MOE_FAIL_IF(ctx, num_experts < 1 || num_experts > MOE_BALANCE_MAX_EXPERTS, MOE_STATUS_INVALID_ARG,
              "balance: experts (%d) must be in [1, %d]", num_experts, MOE_BALANCE_MAX_EXPERTS);
  MOE_FAIL_IF(ctx, num_experts % num_ranks != 0, MOE_STATUS_INVALID_ARG,
              "balance: experts (%d) must be divisible by EP ranks (%d)", num_experts, num_ranks);
done:
  return st;
}

moe_status moe_balance_check(moe_ctx *ctx, const moe_balance_load *load, const uint8_t *replica) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !load, MOE_STATUS_INVALID_ARG, "balance: load must not be NULL");
  MOE_TRY(check_shape(ctx, load->num_experts, load->num_ranks));
  MOE_FAIL_IF(ctx, !load->counts, MOE_STATUS_INVALID_ARG,
              "balance: counts must not be NULL (a (P, E) = (%d, %d) matrix)", load->num_ranks,
              load->num_experts);
  const int E = load->num_experts, P = load->num_ranks;
  for (int src = 0; src < P; src++) {
    for (int e = 0; e < E; e++) {
      const int64_t c = load->counts[(size_t)src * (size_t)E + (size_t)e];
      MOE_FAIL_IF(ctx, c < 0 || c > MOE_BALANCE_COUNT_MAX, MOE_STATUS_INVALID_ARG,
                  "balance: counts[%d][%d] (%lld) must be in [0, %lld] (rows rank %d sends to "
                  "expert %d)",
                  src, e, (long long)c, (long long)MOE_BALANCE_COUNT_MAX, src, e);
    }
  }
  if (replica) {
    for (int e = 0; e < E; e++) {
      const int home = moe_balance_home(E, P, e);
      for (int p = 0; p < P; p++) {
        const uint8_t b = replica[(size_t)e * (size_t)P + (size_t)p];
        MOE_FAIL_IF(ctx, b > 1, MOE_STATUS_INVALID_ARG,
                    "balance: replica[%d][%d] (%d) must be 0 or 1", e, p, (int)b);
        MOE_FAIL_IF(ctx, b && p == home, MOE_STATUS_INVALID_ARG,
                    "balance: replica[%d][%d] is set on expert %d's home rank %d (copies go to "
                    "the other ranks)",
                    e, p, e, home);
      }
    }
  }
done:
  return st;
}

moe_status moe_balance_check_cost(moe_ctx *ctx, const moe_balance_cost *cost) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cost, MOE_STATUS_INVALID_ARG, "balance: cost must not be NULL");
  MOE_FAIL_IF(ctx, !(cost->flops_per_s > 0) || !isfinite(cost->flops_per_s), MOE_STATUS_INVALID_ARG,
              "balance: flops_per_s (%g) must be finite and > 0", cost->flops_per_s);
  MOE_FAIL_IF(ctx, !(cost->net_bytes_per_s > 0) || !isfinite(cost->net_bytes_per_s),
              MOE_STATUS_INVALID_ARG, "balance: net_bytes_per_s (%g) must be finite and > 0",
              cost->net_bytes_per_s);
  MOE_FAIL_IF(ctx, cost->model_dim < 1, MOE_STATUS_INVALID_ARG,
              "balance: model_dim M (%d) must be >= 1", cost->model_dim);
  MOE_FAIL_IF(ctx, cost->hidden_dim < 1, MOE_STATUS_INVALID_ARG,
              "balance: hidden_dim H (%d) must be >= 1", cost->hidden_dim);
  MOE_FAIL_IF(ctx, cost->act_bytes < 1, MOE_STATUS_INVALID_ARG,
              "balance: act_bytes (%d) must be >= 1", cost->act_bytes);
  MOE_FAIL_IF(ctx, !(cost->expert_param_bytes >= 0) || !isfinite(cost->expert_param_bytes),
              MOE_STATUS_INVALID_ARG, "balance: expert_param_bytes (%g) must be finite and >= 0",
              cost->expert_param_bytes);
  MOE_FAIL_IF(ctx, !(cost->fnec_ms >= 0) || !isfinite(cost->fnec_ms), MOE_STATUS_INVALID_ARG,
              "balance: fnec_ms (%g) must be finite and >= 0", cost->fnec_ms);
  MOE_FAIL_IF(ctx, !(cost->bnec_ms >= 0) || !isfinite(cost->bnec_ms), MOE_STATUS_INVALID_ARG,
              "balance: bnec_ms (%g) must be finite and >= 0", cost->bnec_ms);
  MOE_FAIL_IF(
      ctx, !(cost->compute_slots >= 0) || !isfinite(cost->compute_slots), MOE_STATUS_INVALID_ARG,
      "balance: compute_slots (%g) must be finite and >= 0 (0: one per rank)", cost->compute_slots);
  MOE_FAIL_IF(ctx, cost->ranks_per_node < 0, MOE_STATUS_INVALID_ARG,
              "balance: ranks_per_node (%d) must be >= 0 (0: the papers' flat form)",
              cost->ranks_per_node);
done:
  return st;
}

// ---- rows and traffic -------------------------------------------------------------------

// The rank that computes the rows src sends to expert e.
static inline int target_of(const moe_balance_load *load, const uint8_t *replica, int e, int src) {
  const int P = load->num_ranks;
  if (replica && replica[(size_t)e * (size_t)P + (size_t)src]) return src;
  return moe_balance_home(load->num_experts, P, e);
}

void moe_balance_rows_unchecked(const moe_balance_load *load, const uint8_t *replica,
                                int64_t *rows) {
  const int E = load->num_experts, P = load->num_ranks;
  for (int p = 0; p < P; p++) rows[p] = 0;
  for (int src = 0; src < P; src++) {
    const int64_t *c = load->counts + (size_t)src * (size_t)E;
    for (int e = 0; e < E; e++) rows[target_of(load, replica, e, src)] += c[e];
  }
}

// sent, recv (P), either NULL: the rows each rank sends to / receives from
// ranks on other nodes of g ranks (rank p on node p / g; g = 1: other ranks).
static void traffic_between_nodes(const moe_balance_load *load, const uint8_t *replica, int g,
                                  int64_t *sent, int64_t *recv) {
  const int E = load->num_experts, P = load->num_ranks;
  for (int p = 0; p < P; p++) {
    if (sent) sent[p] = 0;
    if (recv) recv[p] = 0;
  }
  for (int src = 0; src < P; src++) {
    const int64_t *c = load->counts + (size_t)src * (size_t)E;
    for (int e = 0; e < E; e++) {
      const int t = target_of(load, replica, e, src);
      if (t / g == src / g) continue;  // computed on its node (g = 1: where it is)
      if (sent) sent[src] += c[e];
      if (recv) recv[t] += c[e];
    }
  }
}

void moe_balance_traffic_unchecked(const moe_balance_load *load, const uint8_t *replica,
                                   int64_t *sent, int64_t *recv) {
  traffic_between_nodes(load, replica, 1, sent, recv);
}

moe_status moe_balance_rows(moe_ctx *ctx, const moe_balance_load *load, const uint8_t *replica,
                            int64_t *rows) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_balance_check(ctx, load, replica));
  MOE_FAIL_IF(ctx, !rows, MOE_STATUS_INVALID_ARG, "balance: rows must not be NULL");
  moe_balance_rows_unchecked(load, replica, rows);
done:
  return st;
}

double moe_balance_ratio(const int64_t *rows, int num_ranks) {
  if (!rows || num_ranks < 1) return 1.0;
  int64_t max = 0, sum = 0;
  for (int p = 0; p < num_ranks; p++) {
    sum += rows[p];
    if (rows[p] > max) max = rows[p];
  }
  if (sum == 0) return 1.0;
  // max / (sum / P), as one rounding
  return (double)max * (double)num_ranks / (double)sum;
}

moe_status moe_balance_traffic(moe_ctx *ctx, const moe_balance_load *load, const uint8_t *replica,
                               int64_t *sent, int64_t *recv) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_balance_check(ctx, load, replica));
  moe_balance_traffic_unchecked(load, replica, sent, recv);
done:
  return st;
}

// ---- costs and models -----------------------------------------------------------------

void moe_balance_cost_default(moe_balance_cost *cost, int model_dim, int hidden_dim) {
  memset(cost, 0, sizeof *cost);
  cost->flops_per_s = 11.5e12;         // FasterMoE bw_mm
  cost->net_bytes_per_s = 50e9 / 8.0;  // FasterMoE bw_net: 50 Gb/s
  cost->model_dim = model_dim;
  cost->hidden_dim = hidden_dim;
  cost->act_bytes = 4;
  // W1 (M, H), W2 (H, M), b1 (H), b2 (M) in fp32
  cost->expert_param_bytes =
      (2.0 * (double)model_dim * (double)hidden_dim + (double)hidden_dim + (double)model_dim) * 4.0;
}

moe_status moe_balance_cost_from_profile(moe_ctx *ctx, const moe_profile *prof, const char *a2a,
                                         int model_dim, int hidden_dim, moe_balance_cost *cost) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !prof || !cost, MOE_STATUS_INVALID_ARG,
              "balance: profile and cost must not be NULL");
  const moe_linear_fit *net = NULL;
  if (a2a) {
    net = moe_profile_a2a(prof, a2a);
  } else if (prof->n_a2a > 0) {
    net = &prof->a2a[0].fit;
  }
  MOE_FAIL_IF(ctx, !net, MOE_STATUS_INVALID_ARG,
              "balance: profile '%s' has no all-to-all fit%s%s%s", prof->name, a2a ? " for '" : "",
              a2a ? a2a : "", a2a ? "'" : "");
  MOE_FAIL_IF(ctx, !(prof->gemm.beta > 0), MOE_STATUS_INVALID_ARG,
              "balance: profile '%s': GEMM slope (%g s/FLOP) must be > 0", prof->name,
              prof->gemm.beta);
  MOE_FAIL_IF(ctx, !(net->beta > 0), MOE_STATUS_INVALID_ARG,
              "balance: profile '%s': all-to-all slope (%g s/byte) must be > 0", prof->name,
              net->beta);
  moe_balance_cost_default(cost, model_dim, hidden_dim);
  cost->flops_per_s = 1.0 / prof->gemm.beta;
  cost->net_bytes_per_s = 1.0 / net->beta;
done:
  return st;
}

static int64_t max_of(const int64_t *x, int n) {
  int64_t m = 0;
  for (int i = 0; i < n; i++)
    if (x[i] > m) m = x[i];
  return m;
}

static int64_t max_pair(const int64_t *a, const int64_t *b, int n) {
  int64_t m = 0;
  for (int i = 0; i < n; i++) {
    if (a[i] > m) m = a[i];
    if (b[i] > m) m = b[i];
  }
  return m;
}

// sent, recv (P): the copies whose parameters each rank sends to / receives
// from another node (home(e) sends one to each copy of e).
static void copies_off_node(const moe_balance_load *load, const uint8_t *replica, int g,
                            int64_t *sent, int64_t *recv) {
  const int E = load->num_experts, P = load->num_ranks;
  for (int p = 0; p < P; p++) sent[p] = recv[p] = 0;
  if (!replica) return;
  for (int e = 0; e < E; e++) {
    const int h = moe_balance_home(E, P, e);
    for (int p = 0; p < P; p++) {
      if (!replica[(size_t)e * (size_t)P + (size_t)p] || p / g == h / g) continue;
      sent[h]++;
      recv[p]++;
    }
  }
}

double moe_balance_predict_unchecked(const moe_balance_load *load, const uint8_t *replica,
                                     const moe_balance_cost *cost, moe_balance_model model,
                                     int64_t *scratch) {
  const int E = load->num_experts, P = load->num_ranks;
  const double M = cost->model_dim, H = cost->hidden_dim;
  const double F = cost->flops_per_s, W = cost->net_bytes_per_s;
  const double row_bytes = M * (double)cost->act_bytes;
  int64_t *rows = scratch, *recv = scratch + P;
  moe_balance_rows_unchecked(load, replica, rows);
  // experts with a copy (r) and copies (c)
  int64_t r = 0, c = 0;
  if (replica) {
    for (int e = 0; e < E; e++) {
      int64_t k = 0;
      for (int p = 0; p < P; p++) k += replica[(size_t)e * (size_t)P + (size_t)p];
      c += k;
      r += k > 0;
    }
  }
  // the busiest rank's rows, or the shared cores' share of all rows when
  // fewer ranks than P compute at once (cost->compute_slots)
  const double bmax = (double)max_of(rows, P);
  double bcomp = bmax;
  if (cost->compute_slots > 0 && cost->compute_slots < P) {
    int64_t sum = 0;
    for (int p = 0; p < P; p++) sum += rows[p];
    bcomp = fmax(bmax, (double)sum / cost->compute_slots);
  }
  if (model == MOE_BALANCE_MODEL_FASTERMOE) {
    // eq 7 / 8: max_w {3 x 4 M H B_w / F + 4 B_w M act_bytes / W} + 2 r param / W;
    // both terms of the max grow with B_w, so the max is at the largest B_w
    const double comp_s = 3.0 * 4.0 * M * H * bcomp / F;
    const double comm_s = 4.0 * bmax * row_bytes / W;
    const double shadow_s = 2.0 * (double)r * cost->expert_param_bytes / W;
    return (comp_s + comm_s + shadow_s) * 1e3;
  }
  double a2a_ms, trans_ms;
  if (cost->ranks_per_node > 0) {  // per link: what crosses nodes, each rank at its own
    int64_t *sent = rows;          // rows is spent (bmax, bcomp)
    traffic_between_nodes(load, replica, cost->ranks_per_node, sent, recv);
    a2a_ms = (double)max_pair(sent, recv, P) * row_bytes / W * 1e3;
    copies_off_node(load, replica, cost->ranks_per_node, sent, recv);
    trans_ms = (double)max_pair(sent, recv, P) * cost->expert_param_bytes / W * 1e3;
  } else {
    moe_balance_traffic_unchecked(load, replica, NULL, recv);
    a2a_ms = (double)max_of(recv, P) * row_bytes / W * 1e3;                   // eq 1
    trans_ms = (double)c * cost->expert_param_bytes / ((double)P * W) * 1e3;  // eq 4
  }
  const double fec_ms = bcomp * 4.0 * M * H / F * 1e3;  // eq 2 (BEC: eq 3)
  const double agg_ms = trans_ms;  // eq 5: the gradients are as large as the parameters
  if (model == MOE_BALANCE_MODEL_PROPHET) return 4.0 * a2a_ms + 3.0 * fec_ms + trans_ms + agg_ms;
  // eq 8: Trans hides behind FEC and FNEC, Agg behind BEC = 2 FEC and BNEC
  const double ptrans = fmax(0.0, trans_ms - fec_ms - cost->fnec_ms);
  const double pagg = fmax(0.0, agg_ms - 2.0 * fec_ms - cost->bnec_ms);
  return 4.0 * a2a_ms + 3.0 * fec_ms + ptrans + pagg;
}

moe_status moe_balance_predict(moe_ctx *ctx, const moe_balance_load *load, const uint8_t *replica,
                               const moe_balance_cost *cost, moe_balance_model model, double *ms) {
  moe_status st = MOE_STATUS_OK;
  int64_t *scratch = NULL;
  MOE_TRY(moe_balance_check(ctx, load, replica));
  MOE_TRY(moe_balance_check_cost(ctx, cost));
  MOE_FAIL_IF(ctx, (int)model < 0 || model >= MOE_BALANCE_MODEL_COUNT_, MOE_STATUS_INVALID_ARG,
              "balance: model (%d) must be in [0, %d)", (int)model, (int)MOE_BALANCE_MODEL_COUNT_);
  MOE_FAIL_IF(ctx, !ms, MOE_STATUS_INVALID_ARG, "balance: ms must not be NULL");
  scratch = moe_malloc(2 * (size_t)load->num_ranks * sizeof *scratch);
  MOE_FAIL_IF(ctx, !scratch, MOE_STATUS_OUT_OF_MEMORY, "balance: cannot allocate %d ranks' rows",
              load->num_ranks);
  *ms = moe_balance_predict_unchecked(load, replica, cost, model, scratch);
done:
  moe_free(scratch);
  return st;
}

// ---- the policy catalogue ------------------------------------------------------------

#define MOE_BALANCE_POLICY_NAME_(U, l) #l,
static const char *const k_policy_names[] = {MOE_BALANCE_POLICIES(MOE_BALANCE_POLICY_NAME_)};
#undef MOE_BALANCE_POLICY_NAME_
#define N_POLICIES ((int)(sizeof k_policy_names / sizeof k_policy_names[0]))

int moe_balance_policy_find(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < N_POLICIES; i++)
    if (strcmp(k_policy_names[i], name) == 0) return i;
  return -1;
}

const char *moe_balance_policy_name(int policy) {
  return policy >= 0 && policy < N_POLICIES ? k_policy_names[policy] : NULL;
}

static char g_policy_list[128];
static pthread_once_t g_policy_list_once = PTHREAD_ONCE_INIT;

static void build_policy_list(void) {
  size_t used = 0;
  for (int i = 0; i < N_POLICIES; i++) {
    const int w = snprintf(g_policy_list + used, sizeof g_policy_list - used, "%s%s",
                           used ? ", " : "", k_policy_names[i]);
    if (w < 0 || (size_t)w >= sizeof g_policy_list - used) break;
    used += (size_t)w;
  }
}

const char *moe_balance_policy_names(void) {
  pthread_once(&g_policy_list_once, build_policy_list);
  return g_policy_list;
}

// ---- window ---------------------------------------------------------------------------

moe_status moe_balance_window_init(moe_ctx *ctx, moe_balance_window *win, int num_experts,
                                   int num_ranks, int window) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !win, MOE_STATUS_INVALID_ARG, "balance: window must not be NULL");
  memset(win, 0, sizeof *win);
  MOE_TRY(check_shape(ctx, num_experts, num_ranks));
  MOE_FAIL_IF(ctx, window < 1 || window > 1 << 16, MOE_STATUS_INVALID_ARG,
              "balance: window (%d) must be in [1, %d]", window, 1 << 16);
  const size_t n = (size_t)num_experts * (size_t)num_ranks;
  win->ring = moe_calloc((size_t)window * n, sizeof *win->ring);
  win->sum = moe_calloc(n, sizeof *win->sum);
  MOE_FAIL_IF(ctx, !win->ring || !win->sum, MOE_STATUS_OUT_OF_MEMORY,
              "balance: cannot allocate a window of %d (%d x %d) count matrices", window, num_ranks,
              num_experts);
  win->num_experts = num_experts;
  win->num_ranks = num_ranks;
  win->capacity = window;
done:
  if (st != MOE_STATUS_OK && win) moe_balance_window_free(win);
  return st;
}

void moe_balance_window_free(moe_balance_window *win) {
  if (!win) return;
  moe_free(win->ring);
  moe_free(win->sum);
  memset(win, 0, sizeof *win);
}

moe_status moe_balance_window_push(moe_ctx *ctx, moe_balance_window *win, const int64_t *counts) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !win || !win->ring, MOE_STATUS_INVALID_ARG,
              "balance: window must be initialised (moe_balance_window_init)");
  MOE_FAIL_IF(ctx, !counts, MOE_STATUS_INVALID_ARG, "balance: counts must not be NULL");
  const int E = win->num_experts;
  const size_t n = (size_t)E * (size_t)win->num_ranks;
  for (size_t i = 0; i < n; i++) {
    MOE_FAIL_IF(ctx, counts[i] < 0 || counts[i] > MOE_BALANCE_COUNT_MAX, MOE_STATUS_INVALID_ARG,
                "balance: counts[%d][%d] (%lld) must be in [0, %lld]", (int)(i / (size_t)E),
                (int)(i % (size_t)E), (long long)counts[i], (long long)MOE_BALANCE_COUNT_MAX);
  }
  int64_t *slot = win->ring + (size_t)win->next * n;
  for (size_t i = 0; i < n; i++) {
    if (win->count == win->capacity) win->sum[i] -= slot[i];  // the oldest leaves
    slot[i] = counts[i];
    win->sum[i] += counts[i];
  }
  if (win->count < win->capacity) win->count++;
  win->next = (win->next + 1) % win->capacity;
done:
  return st;
}

void moe_balance_window_mean(const moe_balance_window *win, int64_t *out) {
  const size_t n = (size_t)win->num_experts * (size_t)win->num_ranks;
  const int64_t k = win->count;
  for (size_t i = 0; i < n; i++) out[i] = k ? (2 * win->sum[i] + k) / (2 * k) : 0;
}

void moe_balance_window_mean_f64(const moe_balance_window *win, double *out) {
  const size_t n = (size_t)win->num_experts * (size_t)win->num_ranks;
  for (size_t i = 0; i < n; i++) out[i] = win->count ? (double)win->sum[i] / win->count : 0.0;
}
