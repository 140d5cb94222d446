// Fitting the simulator to whole layer runs (moe_profile_fit_layer, perf.h).
//
// The bottom-up models of a profile come from micro-benchmarks: a blocking
// all-to-all timed alone, an expert step timed alone, the single-process
// layer's phases. Inside the expert-parallel layer the same work costs more:
// the executor polls a nonblocking all-to-all with back-off, so every protocol
// step of an exchange waits for the next poll; ranks skew; the layer's buffers
// share the caches with the weights. None of that is a new term the simulator
// could derive; it shows up as a per-task offset and a scale on each kind of
// task, which a handful of measured layer runs determine. The fit keeps the
// simulator's structure (the same task graphs and schedules) and only
// corrects the durations it feeds them.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/perf.h"

// The scale of a correction stays within [1/10, 10]: outside it the samples
// do not describe the model's tasks (a one-rank "all-to-all" that is a copy of
// a few bytes, a machine busy with something else) and an unbounded fit
// would predict nonsense for every other shape.
#define LF_SCALE_MIN 0.1
#define LF_SCALE_MAX 10.0

// Weighted least squares y ~ s x + o n over k points with weights 1 / y²
// (relative error, so small configurations count as much as large ones),
// with s in [LF_SCALE_MIN, LF_SCALE_MAX] and o >= 0 (a task does not take
// less than its measured overhead). The objective is convex, so the box
// minimum is the unconstrained one when that is inside, else the best of the
// faces' minima (each a clamped one-variable solution). *at_bound: s is on a
// bound. Returns 0 without points.
static int fit_scale_offset(const double *x, const double *n, const double *y, int k, double *s,
                            double *o, int *at_bound) {
  double axx = 0, axn = 0, ann = 0, bx = 0, bn = 0;
  for (int i = 0; i < k; i++) {
    const double w = 1.0 / (y[i] * y[i]);
    axx += w * x[i] * x[i];
    axn += w * x[i] * n[i];
    ann += w * n[i] * n[i];
    bx += w * x[i] * y[i];
    bn += w * n[i] * y[i];
  }
  *s = 1.0;
  *o = 0.0;
  *at_bound = 0;
  if (k < 1 || !(axx > 0) || !(ann > 0)) return 0;
  double cand[3][2];  // (s, o): the interior minimum, or the three faces' minima
  int nc = 0;
  const double det = axx * ann - axn * axn;
  if (det > 1e-12 * axx * ann) {
    cand[nc][0] = (bx * ann - bn * axn) / det;
    cand[nc][1] = (axx * bn - axn * bx) / det;
    if (cand[nc][0] >= LF_SCALE_MIN && cand[nc][0] <= LF_SCALE_MAX && cand[nc][1] >= 0) nc++;
  }
  if (nc == 0) {
    cand[nc][0] = fmin(LF_SCALE_MAX, fmax(LF_SCALE_MIN, bx / axx));  // face o = 0
    cand[nc++][1] = 0.0;
    for (int b = 0; b < 2; b++) {  // faces s = min and s = max
      cand[nc][0] = b ? LF_SCALE_MAX : LF_SCALE_MIN;
      cand[nc][1] = fmax(0.0, (bn - cand[nc][0] * axn) / ann);
      nc++;
    }
  }
  double best = INFINITY;
  for (int c = 0; c < nc; c++) {
    const double cs = cand[c][0], co = cand[c][1];
    // the weighted squared error less its constant sum w y²
    const double e = cs * cs * axx + 2 * cs * co * axn + co * co * ann - 2 * cs * bx - 2 * co * bn;
    if (e < best) best = e, *s = cs, *o = co;
  }
  *at_bound = *s <= LF_SCALE_MIN || *s >= LF_SCALE_MAX;
  return isfinite(*s) && isfinite(*o);
}

// The simulated result of sample s on profile pf.
static moe_status simulate_sample(moe_ctx *ctx, const moe_profile *pf, const moe_layer_sample *s,
                                  moe_sim_result *out) {
  moe_sim_variant v;
  memset(&v, 0, sizeof v);
  v.cfg = s->cfg;
  snprintf(v.a2a, sizeof v.a2a, "%s", s->a2a);
  snprintf(v.schedule, sizeof v.schedule, "%s", s->schedule);
  v.chunks = s->chunks;
  snprintf(v.compress, sizeof v.compress, "none");  // catalogue: default (uncompressed)
  v.profile = pf;
  return moe_simulate_layer(ctx, &pf->cluster, &v, out);
}

// The fit's baseline runs (cmd_calibrate_layers.c samples them at r = 1, 2, 4).
static int is_sequential(const moe_layer_sample *s) {
  return strcmp(s->schedule, "sequential") == 0;  // catalogue: the baseline schedule
}

// Whether the sample's schedule chunks by peer groups (smart): its contention
// factors are fitted apart.
static int is_peer_grouped(const char *schedule) {
  int count = 0;
  const moe_schedule_algo *list = moe_schedule_algo_list(&count);
  for (int i = 0; i < count; i++) {
    if (strcmp(list[i].name, schedule) == 0) return list[i].chunking == MOE_CHUNK_PEER_GROUPS;
  }
  return 0;
}

// MAPE (%) and R² of the predicted totals pred[] against the measured ones.
static void total_errors(const double *pred, const moe_layer_sample *s, int n, double *mape,
                         double *r2) {
  double sum = 0, mean = 0, ss_res = 0, ss_tot = 0;
  for (int i = 0; i < n; i++) mean += s[i].total_ms / n;
  for (int i = 0; i < n; i++) {
    sum += fabs(pred[i] - s[i].total_ms) / s[i].total_ms;
    ss_res += (pred[i] - s[i].total_ms) * (pred[i] - s[i].total_ms);
    ss_tot += (s[i].total_ms - mean) * (s[i].total_ms - mean);
  }
  *mape = 100.0 * sum / n;
  *r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : 1.0;
}

// Which overlapping samples a contention fit uses.
typedef enum { CONT_ALL, CONT_PIPELINED, CONT_SMART } cont_family;

static int in_family(const moe_layer_sample *s, const char *a2a, cont_family fam) {
  if (is_sequential(s) || (a2a && strcmp(s->a2a, a2a) != 0)) return 0;
  const int smart = is_peer_grouped(s->schedule);
  return fam == CONT_ALL || (fam == CONT_SMART) == smart;
}

static int count_family(const moe_layer_sample *s, int n, const char *a2a, cont_family fam) {
  int m = 0;
  for (int i = 0; i < n; i++) m += in_family(&s[i], a2a, fam);
  return m;
}

#define CONT_MAX 4.0  // largest contention factor searched

// Squared relative error of the pass makespans of the samples in the family
// with pf's profile-wide factors set to (c, m).
static moe_status contention_error(moe_ctx *ctx, moe_profile *pf, const moe_layer_sample *s, int n,
                                   const char *a2a, cont_family fam, double c, double m,
                                   double *err) {
  moe_status st = MOE_STATUS_OK;
  pf->slow_compute = c;
  pf->slow_comm = m;
  *err = 0;
  for (int i = 0; i < n; i++) {
    if (!in_family(&s[i], a2a, fam)) continue;
    moe_sim_result res;
    MOE_TRY(simulate_sample(ctx, pf, &s[i], &res));
    const double e = (res.pass_ms[0] + res.pass_ms[1]) / s[i].passes_ms - 1.0;
    *err += e * e;
  }
done:
  return st;
}

// The contention pair in [1, CONT_MAX]² (steps of 0.05) with the least
// squared relative error of the pass makespans of the overlapping samples of
// the family (of algorithm a2a only, unless NULL); the error surface has
// ridges (a slower compute and a faster exchange give the same makespan), so
// the search is exhaustive. Uses pf's profile-wide factors for the
// search (per-algorithm ones are cleared while it runs).
static moe_status fit_contention(moe_ctx *ctx, moe_profile *pf, const moe_layer_sample *s, int n,
                                 const char *a2a, cont_family fam, double *best_c, double *best_m) {
  moe_status st = MOE_STATUS_OK;
  const double keep_c = pf->slow_compute, keep_m = pf->slow_comm;
  double saved[2][MOE_PROFILE_MAX][2];
  memcpy(saved[0], pf->layer_fit.a2a_slow, sizeof saved[0]);
  memcpy(saved[1], pf->layer_fit.a2a_smart_slow, sizeof saved[1]);
  memset(pf->layer_fit.a2a_slow, 0, sizeof pf->layer_fit.a2a_slow);
  memset(pf->layer_fit.a2a_smart_slow, 0, sizeof pf->layer_fit.a2a_smart_slow);
  double best = INFINITY;
  *best_c = keep_c;
  *best_m = keep_m;
  const int steps = (int)lround((CONT_MAX - 1.0) / 0.05);
  for (int ic = 0; ic <= steps; ic++) {
    for (int im = 0; im <= steps; im++) {
      double err = 0;
      const double c = 1.0 + 0.05 * ic, m = 1.0 + 0.05 * im;
      MOE_TRY(contention_error(ctx, pf, s, n, a2a, fam, c, m, &err));
      if (err < best) best = err, *best_c = c, *best_m = m;
    }
  }
done:
  pf->slow_compute = keep_c;
  pf->slow_comm = keep_m;
  memcpy(pf->layer_fit.a2a_slow, saved[0], sizeof saved[0]);
  memcpy(pf->layer_fit.a2a_smart_slow, saved[1], sizeof saved[1]);
  return st;
}

// One fit over all n samples (moe_profile_fit_layer without the outlier pass).
static moe_status fit_layer_once(moe_ctx *ctx, moe_profile *pf, const moe_layer_sample *s, int n,
                                 moe_layer_fit_report *rep) {
  moe_status st = MOE_STATUS_OK;
  double *buf = NULL;
  moe_sim_result *base_res = NULL;
  moe_layer_fit_report r;
  memset(&r, 0, sizeof r);
  MOE_FAIL_IF(ctx, !pf || !s || n < 2 || !rep, MOE_STATUS_INVALID_ARG,
              "layer fit: needs a profile, at least 2 samples (got %d) and a report", n);
  for (int i = 0; i < n; i++) {
    MOE_FAIL_IF(ctx,
                !(s[i].total_ms > 0) || !(s[i].passes_ms > 0) || !(s[i].comp_ms > 0) ||
                    !(s[i].comm_ms > 0) || !isfinite(s[i].total_ms) || !isfinite(s[i].comp_ms) ||
                    !isfinite(s[i].comm_ms) || s[i].passes_ms > s[i].total_ms,
                MOE_STATUS_INVALID_ARG,
                "layer fit: sample %d needs positive finite times with passes <= total (got "
                "comp %g, comm %g, passes %g, total %g ms)",
                i, s[i].comp_ms, s[i].comm_ms, s[i].passes_ms, s[i].total_ms);
  }
  moe_profile base = *pf;  // the bottom-up models only
  base.layer_fit.have = 0;
  moe_profile fitted = base;
  // x (modelled s), count, y (measured s) for up to n points; outside x, y;
  // predicted totals; and every sample simulated on the bottom-up models
  buf = moe_malloc((size_t)n * 6 * sizeof(double));
  base_res = moe_malloc((size_t)n * sizeof *base_res);
  MOE_FAIL_IF(ctx, !buf || !base_res, MOE_STATUS_OUT_OF_MEMORY,
              "layer fit: cannot allocate %d samples", n);
  double *x = buf, *cnt = buf + n, *y = buf + 2 * n, *ox = buf + 3 * n, *oy = buf + 4 * n;
  double *pred = buf + 5 * n;
  const double ovh = base.task_overhead;
  // compute: the sequential samples (no overlap, so busy time is solo time)
  int k = 0;
  for (int i = 0; i < n; i++) {
    MOE_TRY(simulate_sample(ctx, &base, &s[i], &base_res[i]));
    const moe_sim_result res = base_res[i];
    ox[i] = (double)s[i].cfg.tokens * s[i].cfg.model_dim * (s[i].cfg.num_experts + s[i].cfg.top_k);
    oy[i] = (s[i].total_ms - s[i].passes_ms) * 1e-3;
    if (!is_sequential(&s[i])) continue;
    const double tasks = 2.0 * res.chunks;  // E tasks, forward and backward
    x[k] = (double)(res.breakdown[0].compute_ns + res.breakdown[1].compute_ns) * 1e-9 - tasks * ovh;
    cnt[k] = tasks;
    y[k] = s[i].comp_ms * 1e-3;  // with the executor's overhead (see the fit below)
    if (x[k] > 0) k++;
  }
  r.seq_samples = k;
  {
    int distinct = 0;
    for (int i = 1; i < k; i++) distinct |= cnt[i] != cnt[0];
    MOE_FAIL_IF(ctx, k < 2 || !distinct, MOE_STATUS_INVALID_ARG,
                "layer fit: needs sequential samples at two or more chunk counts (got %d "
                "sequential samples)",
                k);
  }
  // The measured busy time includes the executor's overhead per task; the
  // fitted offset does too, and the correction is what it adds to the
  // overhead the simulator already charges. It is negative when the layer's
  // tasks cost less than the (noisy) overhead measurement, never below
  // -overhead: the offset is not negative.
  int bound = 0;
  MOE_FAIL_IF(ctx,
              !fit_scale_offset(x, cnt, y, k, &fitted.layer_fit.compute_scale,
                                &fitted.layer_fit.compute_task_s, &bound),
              MOE_STATUS_INVALID_ARG, "layer fit: no compute correction fits the samples");
  r.at_bound += bound;
  fitted.layer_fit.compute_task_s -= ovh;
  // all-to-all: per algorithm, its sequential samples
  for (int a = 0; a < base.n_a2a; a++) {
    fitted.layer_fit.a2a_scale[a] = fitted.layer_fit.a2a_exchange_s[a] = 0.0;
    k = 0;
    for (int i = 0; i < n; i++) {
      if (!is_sequential(&s[i]) || strcmp(s[i].a2a, base.a2a[a].name) != 0) continue;
      const moe_sim_result res = base_res[i];
      const double tasks = 4.0 * res.chunks;  // A1 and A2, forward and backward
      x[k] = (double)(res.breakdown[0].comm_ns + res.breakdown[1].comm_ns) * 1e-9 - tasks * ovh;
      cnt[k] = tasks;
      y[k] = s[i].comm_ms * 1e-3;  // with the overhead, as for compute
      if (x[k] > 0) k++;
    }
    int distinct = 0;
    for (int i = 1; i < k; i++) distinct |= cnt[i] != cnt[0];
    if (k >= 2 && distinct) {
      double sc = 0, ex = 0;
      if (fit_scale_offset(x, cnt, y, k, &sc, &ex, &bound)) {
        r.at_bound += bound;
        fitted.layer_fit.a2a_scale[a] = sc;
        fitted.layer_fit.a2a_exchange_s[a] = ex - ovh;
      }
    }
  }
  // outside the passes: every sample
  MOE_TRY(moe_fit_linear(ctx, ox, oy, n, &fitted.layer_fit.outside));
  if (!(fitted.layer_fit.outside.beta > 0)) {
    // no growth with the size in these samples: their mean, flat
    double m = 0;
    for (int i = 0; i < n; i++) m += oy[i] / n;
    fitted.layer_fit.outside.alpha = m;
    fitted.layer_fit.outside.beta = 1e-30;
  }
  fitted.layer_fit.samples = n;
  fitted.layer_fit.have = 1;
  // contention: the overlapping samples' pass makespans, all of them (the
  // profile's factors), then per algorithm
  for (int i = 0; i < n; i++) r.overlap_samples += !is_sequential(&s[i]);
  memset(fitted.layer_fit.a2a_slow, 0, sizeof fitted.layer_fit.a2a_slow);
  memset(fitted.layer_fit.a2a_smart_slow, 0, sizeof fitted.layer_fit.a2a_smart_slow);
  if (r.overlap_samples >= 2) {
    double sl[2];
    MOE_TRY(fit_contention(ctx, &fitted, s, n, NULL, CONT_ALL, &sl[0], &sl[1]));
    fitted.slow_compute = sl[0];
    fitted.slow_comm = sl[1];
  }
  for (int a = 0; a < fitted.n_a2a; a++) {
    const char *name = fitted.a2a[a].name;
    const cont_family pip =
        count_family(s, n, name, CONT_PIPELINED) >= 2 ? CONT_PIPELINED : CONT_ALL;
    double sl[2];
    if (count_family(s, n, name, pip) >= 2) {
      MOE_TRY(fit_contention(ctx, &fitted, s, n, name, pip, &sl[0], &sl[1]));
      fitted.layer_fit.a2a_slow[a][0] = sl[0];
      fitted.layer_fit.a2a_slow[a][1] = sl[1];
    }
    if (count_family(s, n, name, CONT_SMART) >= 2) {
      MOE_TRY(fit_contention(ctx, &fitted, s, n, name, CONT_SMART, &sl[0], &sl[1]));
      fitted.layer_fit.a2a_smart_slow[a][0] = sl[0];
      fitted.layer_fit.a2a_smart_slow[a][1] = sl[1];
    }
  }
  {
    double r2_before = 0;
    for (int i = 0; i < n; i++) pred[i] = base_res[i].total_ms;
    total_errors(pred, s, n, &r.mape_before, &r2_before);
    for (int i = 0; i < n; i++) {
      moe_sim_result res;
      MOE_TRY(simulate_sample(ctx, &fitted, &s[i], &res));
      pred[i] = res.total_ms;
    }
    total_errors(pred, s, n, &r.mape_after, &r.r2_after);
  }
  *pf = fitted;
  *rep = r;
done:
  moe_free(buf);
  moe_free(base_res);
  return st;
}

// A run is an outlier when its total's error under the fit exceeds both
// LF_OUTLIER_MIN and LF_OUTLIER_K x the median error of all runs; the fit is
// redone without the outliers while they are at most a quarter of the runs
// (more: the machine was noisy throughout, and the fit says so by its
// errors), up to LF_OUTLIER_ROUNDS times.
#define LF_OUTLIER_MIN 0.25
#define LF_OUTLIER_K 4.0
#define LF_OUTLIER_ROUNDS 4

moe_status moe_profile_fit_layer(moe_ctx *ctx, moe_profile *pf, const moe_layer_sample *s, int n,
                                 moe_layer_fit_report *rep) {
  moe_status st = MOE_STATUS_OK;
  double *err = NULL;
  moe_layer_sample *kept = NULL;
  moe_layer_fit_report r;
  moe_profile first = pf ? *pf : (moe_profile){0};
  MOE_TRY(fit_layer_once(ctx, &first, s, n, &r));
  err = moe_malloc(2 * (size_t)n * sizeof(double));
  kept = moe_malloc((size_t)n * sizeof *kept);
  MOE_FAIL_IF(ctx, !err || !kept, MOE_STATUS_OUT_OF_MEMORY, "layer fit: cannot allocate %d samples",
              n);
  // up to LF_OUTLIER_ROUNDS rounds: the errors of every run under the
  // current fit, the runs within the threshold fitted again, until the
  // number left out stops changing
  int prev_out = 0;
  for (int round = 0; round < LF_OUTLIER_ROUNDS; round++) {
    for (int i = 0; i < n; i++) {
      moe_sim_result res;
      MOE_TRY(simulate_sample(ctx, &first, &s[i], &res));
      err[i] = err[n + i] = fabs(res.total_ms / s[i].total_ms - 1.0);
    }
    const double med = moe_median(err + n, n);
    const double thr = fmax(LF_OUTLIER_MIN, LF_OUTLIER_K * med);
    int nk = 0;
    for (int i = 0; i < n; i++) {
      if (err[i] <= thr) kept[nk++] = s[i];
    }
    if (n - nk == prev_out) break;  // as many left out as in this fit: done
    if (4 * (n - nk) > n) break;    // noisy throughout: keep the last fit
    moe_profile next = *pf;
    moe_layer_fit_report rn;
    if (fit_layer_once(ctx, &next, kept, nk, &rn) != MOE_STATUS_OK) {
      moe_ctx_clear_error(ctx);  // the kept runs cannot be fitted alone: keep the last fit
      break;
    }
    first = next;
    r = rn;
    r.outliers = prev_out = n - nk;
    r.outlier_threshold = thr;
  }
  first.layer_fit.samples = n;  // the runs given, outliers included (rep->outliers)
  *pf = first;
  *rep = r;
done:
  moe_free(err);
  moe_free(kept);
  return st;
}
