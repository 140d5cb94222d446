// The router bias (moe_layer_tensors.router_bias): named expert-popularity
// distributions for benchmarks ("skew you can reproduce"), the fit of a bias
// that makes a layer's router follow one, and DeepSeek-V3's aux-loss-free
// balancing update.
//
// Why a bias and not forced routing: the bias moves which experts are chosen
// while the gate stays the real one (softmax weights, aux and z losses, their
// gradients), so a skewed benchmark runs exactly the code a skewed model runs.
//
// Not here: applying the bias (moe_gate_route in layer_ops.c), recording
// routing traces (train/), planning placements from the loads (balance/).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/kernels.h"
#include "moe/layer.h"
#include "moe/layer_ops.h"

// ---- named distributions -----------------------------------------------------------------

// "trace:FILE[#LAYER][@FIRST-LAST]": the selectors are read from the end,
// after the path's last '/'.
static moe_status parse_trace_spec(moe_ctx *ctx, const char *spec, moe_skew *s) {
  moe_status st = MOE_STATUS_OK;
  char buf[sizeof s->path + 64];
  const size_t n = strlen(spec + 6);
  MOE_FAIL_IF(ctx, n == 0 || n >= sizeof buf, MOE_STATUS_INVALID_ARG,
              "skew '%s': trace needs a file path of 1 to %zu characters "
              "(trace:FILE[#LAYER][@FIRST-LAST])",
              spec, sizeof s->path - 1);
  memcpy(buf, spec + 6, n + 1);
  s->kind = MOE_SKEW_TRACE;
  s->trace_layer = -1;
  const char *slash = strrchr(buf, '/');
  char *base = slash ? buf + (slash - buf) + 1 : buf;
  char *at = strrchr(base, '@');
  if (at) {
    char *end = NULL;
    *at = '\0';
    const long a = strtol(at + 1, &end, 10);
    long b = a;
    if (end && *end == '-') b = strtol(end + 1, &end, 10);
    MOE_FAIL_IF(ctx, end == at + 1 || *end != '\0' || a < 1 || b < a || b > (1L << 30),
                MOE_STATUS_INVALID_ARG,
                "skew '%s': the steps after '@' must be FIRST-LAST with 1 <= FIRST <= LAST", spec);
    s->trace_first = (int)a;
    s->trace_last = (int)b;
  }
  char *hash = strrchr(base, '#');
  if (hash) {
    char *end = NULL;
    *hash = '\0';
    const long l = strtol(hash + 1, &end, 10);
    MOE_FAIL_IF(ctx, end == hash + 1 || *end != '\0' || l < 0 || l > 255, MOE_STATUS_INVALID_ARG,
                "skew '%s': the layer after '#' must be a block index in [0, 255]", spec);
    s->trace_layer = (int)l;
  }
  MOE_FAIL_IF(ctx, buf[0] == '\0' || strlen(buf) >= sizeof s->path, MOE_STATUS_INVALID_ARG,
              "skew '%s': trace needs a file path of 1 to %zu characters", spec,
              sizeof s->path - 1);
  snprintf(s->path, sizeof s->path, "%s", buf);
done:
  return st;
}

moe_status moe_skew_parse(moe_ctx *ctx, const char *spec, moe_skew *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !spec || !out, MOE_STATUS_INVALID_ARG, "spec and out must not be NULL");
  moe_skew s;
  memset(&s, 0, sizeof s);
  s.kind = MOE_SKEW_NONE;
  if (strncmp(spec, "trace:", 6) == 0) {  // a path may hold ':' and most else
    MOE_TRY(parse_trace_spec(ctx, spec, &s));
    *out = s;
    goto done;
  }
  const char *colon = strchr(spec, ':');
  const size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
  double v = 0.0;
  if (colon) {
    char *end = NULL;
    v = strtod(colon + 1, &end);
    MOE_FAIL_IF(ctx, end == colon + 1 || *end != '\0' || !isfinite(v), MOE_STATUS_INVALID_ARG,
                "skew '%s': the part after ':' must be a number", spec);
  }
  if (name_len == 4 && strncmp(spec, "none", 4) == 0 && !colon) {  // catalogue: the skew "none"
    s.kind = MOE_SKEW_NONE;
  } else if (name_len == 7 && strncmp(spec, "uniform", 7) == 0 && !colon) {
    s.kind = MOE_SKEW_UNIFORM;
  } else if (name_len == 4 && strncmp(spec, "zipf", 4) == 0) {
    MOE_FAIL_IF(ctx, !colon || !(v > 0.0 && v <= 10.0), MOE_STATUS_INVALID_ARG,
                "skew '%s': zipf needs an exponent S in (0, 10] (zipf:S, e.g. zipf:1.2)", spec);
    s.kind = MOE_SKEW_ZIPF;
    s.param = v;
  } else if (name_len == 3 && strncmp(spec, "hot", 3) == 0) {
    MOE_FAIL_IF(ctx, !colon || !(v > 0.0 && v <= 1.0), MOE_STATUS_INVALID_ARG,
                "skew '%s': hot needs the fraction F in (0, 1] of tokens choosing expert 0 "
                "(hot:F, e.g. hot:0.5)",
                spec);
    s.kind = MOE_SKEW_HOT;
    s.param = v;
  } else {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "skew '%s' is unknown (valid: none, uniform, zipf:S with S in (0, 10], hot:F with F "
             "in (0, 1], trace:FILE[#LAYER][@FIRST-LAST])",
             spec);
  }
  *out = s;
done:
  return st;
}

// "name:VALUE" with the shortest of %.15g and %.17g that reads back as the
// same double, so a printed spec parses to the same skew ("zipf:1.2", not
// "zipf:1.2000000000000002"; nor %g's 6 digits, which lose the value).
static int print_param(char *buf, size_t len, const char *name, double v) {
  char num[32];
  snprintf(num, sizeof num, "%.15g", v);
  if (strtod(num, NULL) != v) snprintf(num, sizeof num, "%.17g", v);
  return snprintf(buf, len, "%s:%s", name, num);
}

int moe_skew_to_string(const moe_skew *s, char *buf, size_t len) {
  switch (s->kind) {
    case MOE_SKEW_UNIFORM:
      return snprintf(buf, len, "uniform");
    case MOE_SKEW_ZIPF:
      return print_param(buf, len, "zipf", s->param);
    case MOE_SKEW_HOT:
      return print_param(buf, len, "hot", s->param);
    case MOE_SKEW_TRACE: {
      char layer[16] = "", steps[32] = "";
      if (s->trace_layer >= 0) snprintf(layer, sizeof layer, "#%d", s->trace_layer);
      if (s->trace_first > 0)
        snprintf(steps, sizeof steps, "@%d-%d", s->trace_first, s->trace_last);
      return snprintf(buf, len, "trace:%s%s%s", s->path, layer, steps);
    }
    default:
      return snprintf(buf, len, "none");
  }
}

// Caps every share at 1/K (a token chooses an expert at most once) and moves
// the excess to the uncapped experts in proportion to their shares (evenly
// when those are all zero, as a trace's unused experts are), until none
// exceeds the cap (at most E + 1 rounds: each round caps one more expert).
static void cap_shares(double *p, int E, int K) {
  const double cap = 1.0 / (double)K;
  for (int round = 0; round <= E; round++) {
    double excess = 0.0, free_sum = 0.0;
    int n_free = 0;
    for (int e = 0; e < E; e++) {
      if (p[e] > cap) {
        excess += p[e] - cap;
        p[e] = cap;
      } else if (p[e] < cap) {
        free_sum += p[e];
        n_free++;
      }
    }
    if (excess <= 0.0 || n_free == 0) return;
    for (int e = 0; e < E; e++)
      // the ratio first: excess x p[e] of a tiny (subnormal) share would lose
      // its precision before the division (finding 10)
      if (p[e] < cap) p[e] += free_sum > 0.0 ? excess * (p[e] / free_sum) : excess / n_free;
  }
}

moe_status moe_skew_shares(moe_ctx *ctx, const moe_skew *s, int E, int K, double *shares) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !s || !shares, MOE_STATUS_INVALID_ARG, "skew and shares must not be NULL");
  MOE_FAIL_IF(ctx, E < 1 || K < 1 || K > E, MOE_STATUS_INVALID_ARG,
              "experts (%d) and top_k (%d) must satisfy 1 <= top_k <= experts", E, K);
  if (s->kind == MOE_SKEW_TRACE) {
    MOE_TRY(moe_routing_trace_shares(ctx, s, E, K, shares, NULL));
    cap_shares(shares, E, K);  // drops elsewhere can leave an expert above 1/K
    goto done;
  }
  double sum = 0.0;
  for (int e = 0; e < E; e++) {
    double w = 1.0;
    if (s->kind == MOE_SKEW_ZIPF) w = pow((double)(e + 1), -s->param);
    if (s->kind == MOE_SKEW_HOT) {
      // expert 0 is chosen by a fraction F of the tokens: F / K of the choices
      const double hot = s->param / (double)K;
      w = e == 0 ? hot : (E > 1 ? (1.0 - hot) / (double)(E - 1) : 1.0);
    }
    shares[e] = w;
    sum += w;
  }
  for (int e = 0; e < E; e++) shares[e] /= sum;
  cap_shares(shares, E, K);
done:
  return st;
}

// ---- fitting a bias to a distribution ------------------------------------------------------

// counts (E) = choices per expert of the T tokens' logits + bias, top-K.
static void biased_counts(const float *logits, int T, int E, int K, const float *bias, float *row,
                          int32_t *idx, float *val, double *counts) {
  memset(counts, 0, (size_t)E * sizeof(double));
  for (int t = 0; t < T; t++) {
    const float *l = logits + (size_t)t * E;
    for (int e = 0; e < E; e++) row[e] = l[e] + bias[e];
    moe_topk_forward(idx, val, row, 1, E, K);
    for (int k = 0; k < K; k++) counts[idx[k]] += 1.0;
  }
}

static double total_variation(const double *a, const double *b, int E) {
  double d = 0.0;
  for (int e = 0; e < E; e++) d += fabs(a[e] - b[e]);
  return 0.5 * d;
}

moe_status moe_router_bias_fit(moe_ctx *ctx, const moe_layer_config *cfg, const float *wg,
                               const float *x, int tokens, const double *shares, float *bias,
                               moe_router_fit *fit) {
  moe_status st = MOE_STATUS_OK;
  float *logits = NULL, *row = NULL, *cur = NULL, *val = NULL;
  int32_t *idx = NULL;
  double *counts = NULL;
  MOE_FAIL_IF(ctx, !cfg || !wg || !x || !shares || !bias, MOE_STATUS_INVALID_ARG,
              "cfg, wg, x, shares and bias must not be NULL");
  MOE_FAIL_IF(ctx, tokens < 1, MOE_STATUS_INVALID_ARG, "the fit needs at least 1 token (got %d)",
              tokens);
  const int M = cfg->model_dim, E = cfg->num_experts, K = cfg->top_k;
  MOE_FAIL_IF(ctx, E < 1 || K < 1 || K > E || M < 1, MOE_STATUS_INVALID_ARG,
              "config: experts (%d), top_k (%d), model_dim (%d) out of range", E, K, M);
  for (int e = 0; e < E; e++)
    MOE_FAIL_IF(ctx, !(shares[e] >= 0.0 && shares[e] <= 1.0 / K + 1e-12), MOE_STATUS_INVALID_ARG,
                "share of expert %d (%g) must be in [0, 1/top_k]", e, shares[e]);
  logits = moe_malloc((size_t)tokens * E * sizeof(float));
  row = moe_malloc((size_t)E * sizeof(float));
  cur = moe_calloc((size_t)E, sizeof(float));
  val = moe_malloc((size_t)K * sizeof(float));
  idx = moe_malloc((size_t)K * sizeof(int32_t));
  counts = moe_malloc((size_t)E * sizeof(double) * 2);
  MOE_FAIL_IF(ctx, !logits || !row || !cur || !val || !idx || !counts, MOE_STATUS_OUT_OF_MEMORY,
              "cannot allocate the router fit's buffers (%d tokens x %d experts)", tokens, E);
  // the router's own logits (the same batch-invariant GEMM as moe_gate_route)
  moe_gemm_fixed(0, 0, tokens, E, M, 1.0f, x, M, wg, E, 0.0f, logits, E);
  double *obs = counts + E;
  const double choices = (double)tokens * K;
  // Fixed-point iteration on log shares: b_e += step (log target_e - log obs_e),
  // centred to mean 0, with a floor of half a choice on both so an empty
  // expert moves by a bounded step. A share's response to its bias scales
  // with 1 / (the spread of the logits) (exactly so for Gumbel-distributed
  // scores), so the step starts at 0.5 x the logits' standard deviation and
  // shrinks by 0.7 whenever an iterate is worse than the one before. The best
  // iterate (least total variation) is kept. Deterministic: the same inputs
  // give the same bias bits.
  double mean_l = 0.0, var_l = 0.0;
  const size_t n = (size_t)tokens * E;
  for (size_t i = 0; i < n; i++) mean_l += logits[i];
  mean_l /= (double)n;
  for (size_t i = 0; i < n; i++) var_l += (logits[i] - mean_l) * (logits[i] - mean_l);
  double step = 0.5 * sqrt(var_l / (double)n);
  if (!(step > 1e-6)) step = 1e-6;
  const double floor = 0.5 / choices;
  double best = INFINITY, prev = INFINITY;
  int iters = 0;
  for (int it = 0; it < MOE_ROUTER_FIT_ITERS; it++) {
    biased_counts(logits, tokens, E, K, cur, row, idx, val, counts);
    for (int e = 0; e < E; e++) obs[e] = counts[e] / choices;
    const double tv = total_variation(obs, shares, E);
    iters = it + 1;
    if (tv < best) {
      best = tv;
      memcpy(bias, cur, (size_t)E * sizeof(float));
      if (fit && fit->achieved)
        for (int e = 0; e < E; e++) fit->achieved[e] = obs[e];
    }
    if (tv <= MOE_ROUTER_FIT_TOL) break;
    if (tv > prev) step *= 0.7;
    prev = tv;
    double mean = 0.0;
    for (int e = 0; e < E; e++) {
      const double t = shares[e] > floor ? shares[e] : floor;
      const double o = obs[e] > floor ? obs[e] : floor;
      double b = (double)cur[e] + step * (log(t) - log(o));
      if (b > 1e4) b = 1e4;
      if (b < -1e4) b = -1e4;
      cur[e] = (float)b;
      mean += b;
    }
    mean /= E;
    for (int e = 0; e < E; e++) cur[e] = (float)((double)cur[e] - mean);
  }
  if (fit) {
    fit->total_variation = best;
    fit->iterations = iters;
  }
done:
  moe_free(logits);
  moe_free(row);
  moe_free(cur);
  moe_free(val);
  moe_free(idx);
  moe_free(counts);
  return st;
}

// ---- DeepSeek-V3's update ------------------------------------------------------------------

void moe_router_bias_update(float *bias, const double *load, int E, float rate) {
  double mean = 0.0;
  for (int e = 0; e < E; e++) mean += load[e];
  mean /= E;
  // b_e += rate * sign(mean - load_e): an overloaded expert becomes less
  // attractive, an underloaded one more (DeepSeek-V3, section 2.1.2)
  for (int e = 0; e < E; e++) {
    if (load[e] < mean) bias[e] += rate;
    if (load[e] > mean) bias[e] -= rate;
  }
}
