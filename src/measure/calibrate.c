// Calibration (moe_calibrate): measures this cluster under MPI and fills a
// profile (include/moe/perf.h): alpha-beta fits of one GEMM (seconds vs
// FLOPs), of one expert's forward and backward step, of the layer's work
// outside the experts, of every all-to-all algorithm (seconds vs bytes one
// rank sends to the others) and of every compressor (seconds vs input float
// bytes), each with R²; the contention of a compute task beside all-to-alls
// on the executor, the executor's hand-off per task, a small collective and
// the copy bandwidth; then the layer step: the expert-parallel layer itself
// run through the measurement harness (moe_measure_layer_variants) and the
// profile's corrections fitted to those runs (moe_profile_fit_layer).
//
// All ranks measure at the same time, as in a training step, and every point
// is the slowest rank's median. Rank 0 reports through the config's log
// callback; nothing here prints.
#define _POSIX_C_SOURCE 200809L  // strtok_r
#include "moe_build_config.h"
#if MOE_HAVE_MPI  // the whole file: collective measurements

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "measure/measure_internal.h"
#include "moe/comm.h"
#include "moe/compress.h"
#include "moe/expert.h"
#include "moe/kernels.h"
#include "moe/measure_mpi.h"

enum { MAX_SHAPES = 16, MAX_VARIANTS = 6 * MOE_PROFILE_MAX };

typedef struct {
  moe_ctx *ctx;
  MPI_Comm comm;
  int rank, P;
  const moe_calibrate_config *cfg;
} cal;

moe_calibrate_config moe_calibrate_config_default(void) {
  moe_calibrate_config c;
  memset(&c, 0, sizeof c);
  c.a2a = "all";
  c.compress = "all";
  c.min_bytes = 4096;
  c.max_bytes = 8 << 20;
  c.iters = 5;
  c.layers = MOE_CALIBRATE_DEFAULT_LAYERS;
  return c;
}

// A line of the report, on rank 0 only.
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void
say_to(moe_calibrate_log_fn log, void *user, int rank, const char *fmt, ...) {
  if (!log || rank != 0) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  log(user, line);
}
#define SAY(c, ...) say_to((c)->cfg->log, (c)->cfg->log_user, (c)->rank, __VA_ARGS__)

// What a negative fitted intercept means, reported next to it: an ordinary
// least-squares line over the measured sizes may cross zero below them; it is
// not a latency, and the simulator never uses a negative time (it interpolates
// the measured points, or clamps a task's time at 0).
static const char *intercept_note(double alpha) {
  return alpha < 0 ? " (alpha < 0: the intercept of the line fitted over the measured sizes, not "
                     "a latency; predictions interpolate the measured points or clamp at 0)"
                   : "";
}

// The slowest rank's time of the median of n measurements t[].
static double slowest_median(const cal *c, double *t, int n) {
  double m = moe_median(t, n);
  MOE_MPI_WATCHED("all-reduce of the timings",
                  MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, c->comm));
  return m;
}

// Every rank's allocation (ok) agreed: OUT_OF_MEMORY naming what on all.
static moe_status agree_alloc(const cal *c, int ok, const char *what) {
  const moe_status local = ok ? MOE_STATUS_OK
                              : moe_error_at(c->ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                             "calibrate: cannot allocate %s", what);
  return moe_comm_agree(c->ctx, c->comm, local, what);
}

// ---- the layer-step shapes ---------------------------------------------------------

// "T:M:H:f,..." -> configs (E = 2 x P experts, top-2, GELU). INVALID_ARG for a
// malformed item (not collective).
static moe_status parse_shapes(moe_ctx *ctx, const char *text, int P, moe_layer_config *cfgs,
                               int *n) {
  moe_status st = MOE_STATUS_OK;
  char list[512];
  *n = 0;
  MOE_FAIL_IF(ctx, strlen(text) >= sizeof list, MOE_STATUS_INVALID_ARG,
              "layers: the list is longer than %zu bytes", sizeof list - 1);
  snprintf(list, sizeof list, "%s", text);
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    int T = 0, M = 0, H = 0, used = 0;
    double f = 0;
    MOE_FAIL_IF(ctx,
                *n >= MAX_SHAPES || sscanf(tok, "%d:%d:%d:%lf%n", &T, &M, &H, &f, &used) != 4 ||
                    tok[used] != '\0' || T < 1 || T > 65536 || M < 1 || M > 16384 || H < 1 ||
                    H > 65536 || !(f == 0.0 || (f >= 0.01 && f <= 64.0)),
                MOE_STATUS_INVALID_ARG,
                "layers: '%s' is not T:M:H:f (tokens per rank 1..65536, model 1..16384, hidden "
                "1..65536, capacity factor 0 = dropless or 0.01..64; at most %d items)",
                tok, MAX_SHAPES);
    moe_layer_config *l = &cfgs[(*n)++];
    moe_layer_config_default(l);
    l->tokens = T;
    l->model_dim = M;
    l->hidden_dim = H;
    l->num_experts = 2 * P;
    l->top_k = 2;
    l->capacity_factor = (float)f;
  }
  MOE_FAIL_IF(ctx, *n == 0, MOE_STATUS_INVALID_ARG, "layers: no shape given");
done:
  return st;
}

moe_status moe_calibrate_config_check(moe_ctx *ctx, const moe_calibrate_config *cfg, int ranks) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cfg, MOE_STATUS_INVALID_ARG, "cfg must not be NULL");
  MOE_FAIL_IF(ctx, cfg->iters < 1 || cfg->iters > 1000, MOE_STATUS_INVALID_ARG,
              "iters (%d) must be in [1, 1000]", cfg->iters);
  MOE_FAIL_IF(ctx, cfg->min_bytes < 1024 || cfg->max_bytes > (1LL << 30), MOE_STATUS_INVALID_ARG,
              "all-to-all sizes must be in [1024, 2^30] bytes (min %lld, max %lld)", cfg->min_bytes,
              cfg->max_bytes);
  MOE_FAIL_IF(ctx, cfg->min_bytes * 4 > cfg->max_bytes, MOE_STATUS_INVALID_ARG,
              "max bytes (%lld) must be at least 4 x min bytes (%lld) for a fit", cfg->max_bytes,
              cfg->min_bytes);
  MOE_FAIL_IF(ctx, cfg->ranks_per_node < 0, MOE_STATUS_INVALID_ARG,
              "ranks per node (%d) must be >= 0", cfg->ranks_per_node);
  MOE_FAIL_IF(ctx, cfg->name && strlen(cfg->name) >= 64, MOE_STATUS_INVALID_ARG,
              "name '%s' is longer than 63 bytes", cfg->name);
  MOE_FAIL_IF(ctx, !cfg->a2a || !cfg->compress, MOE_STATUS_INVALID_ARG,
              "a2a and compress lists must be given (\"all\" for every one)");
  if (cfg->layers) {
    moe_layer_config cfgs[MAX_SHAPES];
    int n = 0;
    MOE_TRY(parse_shapes(ctx, cfg->layers, ranks, cfgs, &n));
  }
done:
  return st;
}

// ---- micro-benchmarks ------------------------------------------------------------

// GEMM: rows x M x H shapes, all ranks at once.
static moe_status fit_gemm(const cal *c, moe_linear_fit *fit) {
  static const int rows[] = {64, 256, 1024, 2048},
                   mh[][2] = {{256, 512}, {512, 1024}, {1024, 2048}};
  moe_status st = MOE_STATUS_OK;
  double x[12], y[12], t[1000];
  int n = 0;
  float *a = moe_malloc((size_t)2048 * 1024 * sizeof(float));
  float *b = moe_malloc((size_t)1024 * 2048 * sizeof(float));
  float *cc = moe_malloc((size_t)2048 * 2048 * sizeof(float));
  MOE_TRY(agree_alloc(c, a && b && cc, "the GEMM buffers"));
  moe_rng rng;
  moe_rng_init(&rng, 5, (uint64_t)c->rank);
  moe_rng_fill_uniform(&rng, a, (size_t)2048 * 1024, -1.0f, 1.0f);
  moe_rng_fill_uniform(&rng, b, (size_t)1024 * 2048, -1.0f, 1.0f);
  for (size_t s = 0; s < sizeof mh / sizeof mh[0]; s++) {
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
      const int m = rows[r], k = mh[s][0], nn = mh[s][1];
      moe_gemm(0, 0, m, nn, k, 1.0f, a, k, b, nn, 0.0f, cc, nn);  // warm-up
      MOE_MPI_WATCHED("barrier before a timed run", MPI_Barrier(c->comm));
      for (int i = 0; i < c->cfg->iters; i++) {
        const uint64_t t0 = moe_time_ns();
        moe_gemm(0, 0, m, nn, k, 1.0f, a, k, b, nn, 0.0f, cc, nn);
        t[i] = (double)(moe_time_ns() - t0) * 1e-9;
      }
      x[n] = 2.0 * m * (double)k * nn;
      y[n] = slowest_median(c, t, c->cfg->iters);
      n++;
    }
  }
  // the same points on every rank: every rank agrees on the outcome
  MOE_TRY(moe_fit_linear(c->ctx, x, y, n, fit));
  MOE_FAIL_IF(c->ctx, !(fit->beta > 0), MOE_STATUS_INVALID_ARG,
              "GEMM fit: no usable fit (slope %g s/FLOP)", fit->beta);
  SAY(c, "gemm: %d shapes, alpha %.2f us, %.1f GFLOP/s per rank, R² %.4f%s", n, fit->alpha * 1e6,
      1e-9 / fit->beta, fit->r2, intercept_note(fit->alpha));
done:
  moe_free(a);
  moe_free(b);
  moe_free(cc);
  return st;
}

// One expert's forward and backward step (the "ffn" kind: GEMMs, bias,
// activation) over rows x M x H shapes, all ranks at once; x = FLOPs.
static moe_status fit_expert(const cal *c, moe_linear_fit *ffit, moe_linear_fit *bfit,
                             double (*points)[5], int *n_points) {
  static const int rows[] = {64, 256, 1024, 2048},
                   mh[][2] = {{256, 512}, {512, 1024}, {1024, 2048}};
  moe_status st = MOE_STATUS_OK;
  double x[12], yf[12], yb[12], t[1000];
  int n = 0;
  const int iters = c->cfg->iters;
  const size_t big = (size_t)2048 * 2048;
  float *w1 = moe_malloc(big * 4), *w2 = moe_malloc(big * 4), *b1 = moe_malloc(2048 * 4),
        *b2 = moe_malloc(2048 * 4), *xin = moe_malloc(big * 4), *pre = moe_malloc(big * 4),
        *h = moe_malloc(big * 4), *y = moe_malloc(big * 4), *dh = moe_malloc(big * 4),
        *dpre = moe_malloc(big * 4), *g1 = moe_malloc(big * 4), *g2 = moe_malloc(big * 4),
        *gb1 = moe_malloc(2048 * 4), *gb2 = moe_malloc(2048 * 4);
  const moe_expert_kind *kind = NULL;
  MOE_TRY(agree_alloc(
      c, w1 && w2 && b1 && b2 && xin && pre && h && y && dh && dpre && g1 && g2 && gb1 && gb2,
      "the expert buffers"));
  MOE_TRY(moe_expert_kind_find(c->ctx, "ffn", &kind));  // catalogue: the default kind
  moe_rng rng;
  moe_rng_init(&rng, 9, (uint64_t)c->rank);
  float *fill[] = {w1, w2, xin, y};
  for (int i = 0; i < 4; i++) moe_rng_fill_uniform(&rng, fill[i], big, -0.1f, 0.1f);
  moe_rng_fill_uniform(&rng, b1, 2048, -0.1f, 0.1f);
  moe_rng_fill_uniform(&rng, b2, 2048, -0.1f, 0.1f);
  for (size_t s = 0; s < sizeof mh / sizeof mh[0]; s++) {
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
      moe_layer_config lc;
      moe_layer_config_default(&lc);
      lc.model_dim = mh[s][0];
      lc.hidden_dim = mh[s][1];
      const int m = rows[r];
      const moe_expert_params p = {w1, b1, w2, b2};
      const moe_expert_grads gr = {g1, gb1, g2, gb2};
      moe_layer_timing tm;
      memset(&tm, 0, sizeof tm);
      kind->forward(&lc, &p, xin, m, pre, h, y, &tm);  // warm-up
      MOE_MPI_WATCHED("barrier before a timed run", MPI_Barrier(c->comm));
      for (int i = 0; i < iters; i++) {
        const uint64_t t0 = moe_time_ns();
        kind->forward(&lc, &p, xin, m, pre, h, y, &tm);
        t[i] = (double)(moe_time_ns() - t0) * 1e-9;
      }
      yf[n] = slowest_median(c, t, iters);
      for (int i = 0; i < iters; i++) {
        const uint64_t t0 = moe_time_ns();
        kind->backward(&lc, &p, &gr, xin, pre, h, y, m, dh, dpre, &tm);
        t[i] = (double)(moe_time_ns() - t0) * 1e-9;
      }
      yb[n] = slowest_median(c, t, iters);
      x[n] = 4.0 * m * (double)lc.model_dim * lc.hidden_dim;  // forward FLOPs
      if (points) {
        points[n][0] = m;
        points[n][1] = lc.model_dim;
        points[n][2] = lc.hidden_dim;
        points[n][3] = yf[n];
        points[n][4] = yb[n];
      }
      n++;
    }
  }
  if (n_points) *n_points = n;
  double xb[12], wt[12];
  for (int i = 0; i < n; i++) {
    xb[i] = 2.0 * x[i];                           // backward FLOPs
    wt[i] = (double)mh[i / 4][0] * mh[i / 4][1];  // weight elements read per call (M H)
  }
  MOE_TRY(moe_fit_linear2(c->ctx, x, wt, yf, n, ffit));
  MOE_TRY(moe_fit_linear2(c->ctx, xb, wt, yb, n, bfit));
  MOE_FAIL_IF(c->ctx, !(ffit->beta > 0) || !(bfit->beta > 0), MOE_STATUS_INVALID_ARG,
              "expert fit: no usable fit (slopes %g, %g s/FLOP)", ffit->beta, bfit->beta);
  SAY(c, "expert forward: alpha %.1f us, %.1f GFLOP/s, %.3f ns per weight, R² %.4f%s",
      ffit->alpha * 1e6, 1e-9 / ffit->beta, ffit->gamma * 1e9, ffit->r2,
      intercept_note(ffit->alpha));
  SAY(c, "expert backward: alpha %.1f us, %.1f GFLOP/s, %.3f ns per weight, R² %.4f%s",
      bfit->alpha * 1e6, 1e-9 / bfit->beta, bfit->gamma * 1e9, bfit->r2,
      intercept_note(bfit->alpha));
done:;
  float *all[] = {w1, w2, b1, b2, xin, pre, h, y, dh, dpre, g1, g2, gb1, gb2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) moe_free(all[i]);
  return st;
}

// The layer's work outside the expert passes (gate, softmax, top-k,
// dispatch, combine and their backward), from the single-process layer's own
// phase timings, over T x M with E = 8, K = 2; x = T M (E + K).
static moe_status fit_outside(const cal *c, moe_linear_fit *fit) {
  static const int toks[] = {256, 512, 1024, 2048}, dims[] = {256, 512};
  moe_status st = MOE_STATUS_OK;
  double x[8], y[8], t[1000];
  int n = 0;
  const int iters = c->cfg->iters;
  float *in = moe_malloc((size_t)2048 * 512 * 4), *out = moe_malloc((size_t)2048 * 512 * 4),
        *dx = moe_malloc((size_t)2048 * 512 * 4);
  MOE_TRY(agree_alloc(c, in && out && dx, "the layer buffers"));
  moe_rng rng;
  moe_rng_init(&rng, 13, (uint64_t)c->rank);
  moe_rng_fill_uniform(&rng, in, (size_t)2048 * 512, -1.0f, 1.0f);
  for (size_t d = 0; d < 2; d++) {
    for (size_t k = 0; k < 4; k++) {
      moe_layer_config lc;
      moe_layer_config_default(&lc);
      lc.tokens = toks[k];
      lc.model_dim = dims[d];
      lc.hidden_dim = 16;  // experts are timed apart; keep them cheap
      lc.num_experts = 8;
      lc.top_k = 2;
      moe_layer *L = NULL;
      moe_status local = moe_layer_create(c->ctx, &lc, &L);
      if (local == MOE_STATUS_OK) moe_layer_init_params(L, 3);
      for (int i = -1; i < iters && local == MOE_STATUS_OK; i++) {
        local = moe_layer_forward(L, in, lc.tokens, out, NULL);
        if (local == MOE_STATUS_OK) local = moe_layer_backward(L, in, dx);  // dy = x: any values
        const moe_layer_timing f = moe_layer_get_forward_timing(L);
        const moe_layer_timing b = moe_layer_get_backward_timing(L);
        if (i >= 0) {
          t[i] = (f.gate_ms + f.dispatch_ms + f.combine_ms + b.gate_ms + b.dispatch_ms +
                  b.combine_ms) *
                 1e-3;
        }
      }
      moe_layer_destroy(L);
      MOE_TRY(moe_comm_agree(c->ctx, c->comm, local, "layer timing"));
      y[n] = slowest_median(c, t, iters);
      x[n] = (double)lc.tokens * lc.model_dim * (lc.num_experts + lc.top_k);
      n++;
    }
  }
  MOE_TRY(moe_fit_linear(c->ctx, x, y, n, fit));
  MOE_FAIL_IF(c->ctx, !(fit->beta > 0), MOE_STATUS_INVALID_ARG,
              "outside fit: no usable fit (slope %g)", fit->beta);
  SAY(c,
      "outside the experts (gate, dispatch, combine; fwd+bwd): alpha %.1f us, %.3f ns per "
      "T*M*(E+K), R² %.4f%s",
      fit->alpha * 1e6, fit->beta * 1e9, fit->r2, intercept_note(fit->alpha));
done:
  moe_free(in);
  moe_free(out);
  moe_free(dx);
  return st;
}

// ---- contention: a compute task beside all-to-alls on the executor ------------------

typedef struct {
  const moe_group *g;
  const moe_a2a_algo *algo;
  unsigned char *send, *recv;
  size_t *sc, *sd, *rc, *rd;
  moe_workspace *ws;
  moe_a2a_pending pending;
  float *a, *b, *c;  // the compute task's GEMM operands
  int gemms;
} overlap_arg;

static moe_status ov_compute(void *p, moe_ctx *ctx) {
  overlap_arg *o = p;
  (void)ctx;
  for (int i = 0; i < o->gemms; i++)
    moe_gemm(0, 0, 512, 1024, 1024, 1.0f, o->a, 1024, o->b, 1024, 0.0f, o->c, 1024);
  return MOE_STATUS_OK;
}

static moe_status ov_a2a(void *p, moe_ctx *ctx) {
  overlap_arg *o = p;
  return moe_a2a_start(ctx, o->algo, o->g, o->send, o->sc, o->sd, o->recv, o->rc, o->rd, o->ws,
                       &o->pending);
}

static moe_status ov_test(void *p, moe_ctx *ctx, moe_task_state *state) {
  overlap_arg *o = p;
  int done = 0;
  const moe_status st = moe_a2a_test(ctx, &o->pending, &done);
  *state = done ? MOE_TASK_DONE : MOE_TASK_PENDING;
  return st;
}

// One executor pass: the compute task (if with_compute) and n_a2a chained
// all-to-alls on the communication stream, independent of each other. out:
// the compute task's duration and the mean duration of the all-to-alls that
// ran entirely within it (or of all of them without compute), in seconds.
static moe_status overlap_pass(moe_ctx *ctx, moe_executor *ex, overlap_arg *arg, int with_compute,
                               int n_a2a, double *comp_s, double *a2a_s) {
  moe_status st = MOE_STATUS_OK;
  moe_task_graph g;
  moe_schedule sch;
  memset(&g, 0, sizeof g);
  memset(&sch, 0, sizeof sch);
  MOE_TRY(moe_task_graph_init(ctx, &g, n_a2a + 1, n_a2a + 1));
  MOE_TRY(moe_schedule_init(ctx, &sch, n_a2a + 1));
  int prev = -1, ci = -1;
  for (int i = 0; i < n_a2a; i++) {
    moe_task_desc d;
    memset(&d, 0, sizeof d);
    d.stream = MOE_STREAM_COMM;
    d.run = ov_a2a;
    d.test = ov_test;
    d.arg = arg;
    d.deps = prev >= 0 ? &prev : NULL;
    d.n_deps = prev >= 0;
    MOE_TRY(moe_task_graph_add(ctx, &g, &d, &prev));
  }
  if (with_compute) {
    moe_task_desc d;
    memset(&d, 0, sizeof d);
    d.stream = MOE_STREAM_COMPUTE;
    d.run = ov_compute;
    d.arg = arg;
    MOE_TRY(moe_task_graph_add(ctx, &g, &d, &ci));
  }
  MOE_TRY(moe_schedule_in_index_order(ctx, &sch, &g));
  MOE_TRY(moe_executor_run(ex, &g, &sch, ctx));
  int nr = 0;
  const moe_task_record *rec = moe_executor_records(ex, &nr);
  *comp_s = ci >= 0 ? (double)(rec[ci].end_ns - rec[ci].start_ns) * 1e-9 : 0.0;
  double sum = 0.0;
  int cnt = 0;
  for (int i = 0; i < n_a2a; i++) {
    const int inside =
        ci < 0 || (rec[i].start_ns >= rec[ci].start_ns && rec[i].end_ns <= rec[ci].end_ns);
    if (!inside) continue;
    sum += (double)(rec[i].end_ns - rec[i].start_ns) * 1e-9;
    cnt++;
  }
  *a2a_s = cnt ? sum / cnt : 0.0;
done:
  moe_task_graph_free(&g);
  moe_schedule_free(&sch);
  return st;
}

static moe_status ov_nothing(void *p, moe_ctx *ctx) {
  (void)p;
  (void)ctx;
  return MOE_STATUS_OK;
}

// The executor's fixed cost per task: a chain of empty tasks alternating
// between the streams (every one a hand-off), median over repetitions.
static moe_status measure_task_overhead(const cal *c, double *out) {
  enum { N = 200 };
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_executor *ex = NULL;
  moe_task_graph g;
  moe_schedule sch;
  memset(&g, 0, sizeof g);
  memset(&sch, 0, sizeof sch);
  double t[1000];
  local = moe_executor_create(c->ctx, NULL, N, &ex);
  if (local == MOE_STATUS_OK) local = moe_task_graph_init(c->ctx, &g, N, N);
  if (local == MOE_STATUS_OK) local = moe_schedule_init(c->ctx, &sch, N);
  int prev = -1;
  for (int i = 0; local == MOE_STATUS_OK && i < N; i++) {
    moe_task_desc d;
    memset(&d, 0, sizeof d);
    d.stream = i % 2 ? MOE_STREAM_COMM : MOE_STREAM_COMPUTE;
    d.run = ov_nothing;
    d.deps = prev >= 0 ? &prev : NULL;
    d.n_deps = prev >= 0;
    local = moe_task_graph_add(c->ctx, &g, &d, &prev);
  }
  if (local == MOE_STATUS_OK) local = moe_schedule_in_index_order(c->ctx, &sch, &g);
  for (int r = 0; local == MOE_STATUS_OK && r < c->cfg->iters; r++) {
    const uint64_t t0 = moe_time_ns();
    local = moe_executor_run(ex, &g, &sch, c->ctx);
    t[r] = (double)(moe_time_ns() - t0) * 1e-9 / N;
  }
  MOE_TRY(moe_comm_agree(c->ctx, c->comm, local, "task overhead"));
  *out = slowest_median(c, t, c->cfg->iters);
  SAY(c, "executor hand-off per task: %.1f us", *out * 1e6);
done:
  moe_task_graph_free(&g);
  moe_schedule_free(&sch);
  moe_executor_destroy(ex);
  return st;
}

// A small collective over the world (8-double allreduce) and one rank's
// memory copy bandwidth (32 MiB memcpy), medians, slowest rank.
static moe_status measure_small(const cal *c, double *coll_s, double *copy_gbs) {
  moe_status st = MOE_STATUS_OK;
  double t[1000], v[8] = {0};
  const int iters = c->cfg->iters;
  for (int i = 0; i < iters; i++) {
    MOE_MPI_WATCHED("barrier before a timed run", MPI_Barrier(c->comm));
    const uint64_t t0 = moe_time_ns();
    for (int k = 0; k < 10; k++)
      MOE_MPI_WATCHED("timed all-reduce",
                      MPI_Allreduce(MPI_IN_PLACE, v, 8, MPI_DOUBLE, MPI_SUM, c->comm));
    t[i] = (double)(moe_time_ns() - t0) * 1e-9 / 10;
  }
  *coll_s = slowest_median(c, t, iters);
  const size_t n = (size_t)32 << 20;
  char *a = moe_malloc(n), *b = moe_malloc(n);
  MOE_TRY(agree_alloc(c, a && b, "the copy buffers"));
  memset(a, 1, n);
  memset(b, 2, n);
  for (int i = 0; i < iters; i++) {
    const uint64_t t0 = moe_time_ns();
    memcpy(b, a, n);
    t[i] = (double)(moe_time_ns() - t0) * 1e-9;
  }
  const double s = slowest_median(c, t, iters);
  *copy_gbs = s > 0 ? (double)n / s / 1e9 : 0.0;
  SAY(c, "small collective (8-double allreduce): %.1f us; memory copy %.2f GB/s per rank",
      *coll_s * 1e6, *copy_gbs);
done:
  moe_free(a);
  moe_free(b);
  return st;
}

// Lina's Table 1 question (moe_measure_contention): an all-to-all of 1 MiB
// per rank (`mpi`) alone and beside a 4 MiB gradient sum started with it,
// two per round with 5 ms gaps, iters rounds; the fifo mode's slowdown. One
// rank: 0 (not measured: nothing shares a link).
static moe_status measure_a2a_allreduce(const cal *c, const moe_group *g, double *slowdown) {
  moe_status st = MOE_STATUS_OK;
  *slowdown = 0;  // absent: one rank shares no link
  if (c->P < 2) return st;
  const moe_a2a_algo *algo = NULL;
  MOE_TRY(moe_a2a_find(c->ctx, "mpi", &algo));  // catalogue: every build has it
  moe_contention_config cc;
  moe_contention_config_default(&cc);
  cc.layers = 2;
  cc.rounds = c->cfg->iters;
  cc.warmup = 1;
  moe_contention_result r[MOE_CONTENTION_MODES];
  MOE_TRY(moe_measure_contention(c->ctx, g, algo, &cc, r));
  const double a = r[MOE_CONTENTION_ALONE].a2a_ms, f = r[MOE_CONTENTION_FIFO].a2a_ms;
  *slowdown = a > 0 && f > a ? f / a : 1.0;
  if (*slowdown > 100.0) *slowdown = 100.0;
  SAY(c,
      "all-to-all beside a gradient sum (Lina's Table 1): %.2f ms alone, %.2f ms beside a FIFO "
      "sum (%.2fx), %.2f ms beside Lina's micro-ops",
      a, f, *slowdown, r[MOE_CONTENTION_LINA].a2a_ms);
done:
  return st;
}

// Contention factors: a GEMM loop (~50 ms) on the compute stream beside a
// chain of 1 MiB-per-rank all-to-alls (algorithm `mpi`, the baseline every
// build has) on the communication stream, against each alone; medians over
// the repetitions, slowest rank. A failed exchange: MOE_STATUS_COMM (peers may
// be inside it; no collective can follow).
static moe_status measure_overlap(const cal *c, const moe_group *g, unsigned char *sbuf,
                                  unsigned char *rbuf, moe_workspace *ws, double *slow_comp,
                                  double *slow_comm) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  const int P = g->size;
  overlap_arg arg;
  memset(&arg, 0, sizeof arg);
  moe_executor *ex = NULL;
  size_t *cnt = moe_malloc(4 * (size_t)P * sizeof(size_t));
  arg.a = moe_malloc((size_t)512 * 1024 * 4);
  arg.b = moe_malloc((size_t)1024 * 1024 * 4);
  arg.c = moe_malloc((size_t)512 * 1024 * 4);
  const moe_a2a_algo *algo = NULL;
  if (!(cnt && arg.a && arg.b && arg.c)) {
    local = moe_error_at(c->ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                         "contention measurement: cannot allocate its buffers");
  }
  if (local == MOE_STATUS_OK) local = moe_a2a_find(c->ctx, "mpi", &algo);  // catalogue: baseline
  if (local == MOE_STATUS_OK) local = moe_executor_create(c->ctx, NULL, 300, &ex);
  MOE_TRY(moe_comm_agree(c->ctx, c->comm, local, "contention measurement set-up"));
  memset(arg.a, 0, (size_t)512 * 1024 * 4);
  memset(arg.b, 0, (size_t)1024 * 1024 * 4);
  {
    const size_t S =
        (size_t)1 << 20 < (size_t)c->cfg->max_bytes ? (size_t)1 << 20 : (size_t)c->cfg->max_bytes;
    const size_t block = S / (size_t)P;
    for (int p = 0; p < P; p++) {
      cnt[p] = cnt[2 * P + p] = block;
      cnt[P + p] = cnt[3 * P + p] = (size_t)p * block;
    }
  }
  arg.g = g;
  arg.algo = algo;
  arg.send = sbuf;
  arg.recv = rbuf;
  arg.sc = cnt;
  arg.sd = cnt + P;
  arg.rc = cnt + 2 * P;
  arg.rd = cnt + 3 * P;
  arg.ws = ws;
  // size the compute task to ~50 ms alone
  {
    const uint64_t t0 = moe_time_ns();
    arg.gemms = 1;
    ov_compute(&arg, c->ctx);
    const double one = (double)(moe_time_ns() - t0) * 1e-9;
    int gemms = (int)(0.05 / (one > 1e-6 ? one : 1e-6)) + 1;
    if (gemms > 1000) gemms = 1000;
    MOE_MPI_WATCHED("all-reduce of the run length",
                    MPI_Allreduce(MPI_IN_PLACE, &gemms, 1, MPI_INT, MPI_MAX, c->comm));
    arg.gemms = gemms;
  }
  double comp_alone[1000], a2a_alone[1000], comp_both[1000], a2a_both[1000];
  const int reps = c->cfg->iters;
  int n_a2a = 8;
  for (int r = 0; r < reps; r++) {
    double tc = 0, ta = 0;
    MOE_MPI_WATCHED("barrier before a timed run", MPI_Barrier(c->comm));
    if (overlap_pass(c->ctx, ex, &arg, 0, 8, &tc, &ta) != MOE_STATUS_OK) {
      MOE_FAIL(c->ctx, MOE_STATUS_COMM, "rank %d: contention measurement: %s", c->rank,
               moe_ctx_error(c->ctx));
    }
    a2a_alone[r] = ta;
    const uint64_t t0 = moe_time_ns();
    ov_compute(&arg, c->ctx);
    comp_alone[r] = (double)(moe_time_ns() - t0) * 1e-9;
    // enough all-to-alls to outlast the compute task (at most 256)
    int k = ta > 0 ? (int)(2.0 * comp_alone[r] / ta) + 2 : 8;
    if (k > 256) k = 256;
    MOE_MPI_WATCHED("all-reduce of the run length",
                    MPI_Allreduce(MPI_IN_PLACE, &k, 1, MPI_INT, MPI_MAX, c->comm));
    n_a2a = k;
    MOE_MPI_WATCHED("barrier before a timed run", MPI_Barrier(c->comm));
    if (overlap_pass(c->ctx, ex, &arg, 1, n_a2a, &tc, &ta) != MOE_STATUS_OK) {
      MOE_FAIL(c->ctx, MOE_STATUS_COMM, "rank %d: contention measurement: %s", c->rank,
               moe_ctx_error(c->ctx));
    }
    comp_both[r] = tc;
    a2a_both[r] = ta;
  }
  {
    const double ca = slowest_median(c, comp_alone, reps), cb = slowest_median(c, comp_both, reps);
    const double aa = slowest_median(c, a2a_alone, reps), ab = slowest_median(c, a2a_both, reps);
    *slow_comp = ca > 0 && cb > ca ? cb / ca : 1.0;
    *slow_comm = aa > 0 && ab > aa ? ab / aa : 1.0;
    // the profile format caps them at 100 (beyond that the streams are
    // effectively serialized)
    if (*slow_comp > 100.0) *slow_comp = 100.0;
    if (*slow_comm > 100.0) *slow_comm = 100.0;
    SAY(c,
        "contention (executor: %d GEMMs beside %d all-to-alls of 1 MiB per rank): compute "
        "%.1f -> %.1f ms (x%.3f), all-to-all %.2f -> %.2f ms (x%.3f)",
        arg.gemms, n_a2a, ca * 1e3, cb * 1e3, *slow_comp, aa * 1e3, ab * 1e3, *slow_comm);
  }
done:
  moe_executor_destroy(ex);
  moe_free(cnt);
  moe_free(arg.a);
  moe_free(arg.b);
  moe_free(arg.c);
  return st;
}

// The line y = alpha + beta x through n points of `what` (an all-to-all,
// a compressor). Times that do not grow with the size (tiny sizes, noise, a
// busy machine) keep, for the line, the largest point's average cost per x
// without an intercept, with a warning. hint: what the user can change.
static moe_status fit_growing(const cal *c, const char *what, const char *hint, const double *x,
                              const double *y, int n, moe_linear_fit *fit) {
  moe_status st = MOE_STATUS_OK;
  if (moe_fit_linear(c->ctx, x, y, n, fit) != MOE_STATUS_OK) {
    MOE_FAIL(c->ctx, MOE_STATUS_INVALID_ARG, "%s: no usable fit (%s); %s", what,
             moe_ctx_error(c->ctx), hint);
  }
  if (!(fit->beta > 0)) {
    SAY(c,
        "%s warning: times do not grow with the size (slope %g s per unit); the line uses the "
        "largest point's cost per unit; %s",
        what, fit->beta, hint);
    fit->beta = y[n - 1] / x[n - 1];
    fit->alpha = 0.0;
  }
done:
  return st;
}

// One all-to-all algorithm over sizes min..max (doubling), uniform counts. A
// failed exchange: MOE_STATUS_COMM (peers may wait inside it).
static moe_status fit_a2a(const cal *c, const moe_group *g, const moe_a2a_algo *algo,
                          unsigned char *sbuf, unsigned char *rbuf, moe_workspace *ws,
                          moe_linear_fit *fit, double (*points)[2], int *n_points) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size;
  double x[32], y[32];
  int n = 0;
  size_t *sc = moe_malloc(4 * (size_t)P * sizeof(size_t));
  MOE_TRY(agree_alloc(c, sc != NULL, "the all-to-all counts"));
  size_t *sd = sc + P, *rc = sd + P, *rd = rc + P;
  for (long long S = c->cfg->min_bytes; S <= c->cfg->max_bytes && n < 32; S *= 2) {
    const size_t block = (size_t)S / (size_t)P;
    for (int p = 0; p < P; p++) {
      sc[p] = rc[p] = block;
      sd[p] = rd[p] = (size_t)p * block;
    }
    // a failed exchange is MOE_STATUS_COMM: peers cannot recover
    moe_measure_a2a_result m;
    MOE_TRY(
        moe_measure_a2a(c->ctx, g, algo, sc, sd, rc, rd, sbuf, rbuf, ws, c->cfg->iters, 1, 0, &m));
    x[n] = (double)block * (P - 1);  // bytes one rank sends to the others
    y[n] = m.slowest_median_s;
    n++;
  }
  if (P == 1) {  // nothing leaves the rank: the time is a copy; fit it against the block size
    for (int i = 0; i < n; i++) x[i] = (double)(c->cfg->min_bytes << i);
  }
  *n_points = 0;
  for (int i = 0; i < n && i < 24; i++) {
    if (x[i] <= 0 || y[i] <= 0 || (i > 0 && x[i] <= x[i - 1])) continue;
    points[*n_points][0] = x[i];
    points[*n_points][1] = y[i];
    (*n_points)++;
  }
  char what[64];
  snprintf(what, sizeof what, "all-to-all '%s'", algo->name);
  MOE_TRY(fit_growing(c, what, "widen the all-to-all sizes or calibrate on a quiet machine", x, y,
                      n, fit));
  SAY(c, "a2a %-9s %2d sizes, alpha %8.1f us, %8.3f GB/s sent per rank, R² %.4f%s", algo->name, n,
      fit->alpha * 1e6, 1e-9 / fit->beta, fit->r2, intercept_note(fit->alpha));
done:
  moe_free(sc);
  return st;
}

// One compressor: rows x 512 floats, all ranks at once.
static moe_status fit_codec(const cal *c, const moe_compressor *comp, moe_linear_fit *fc,
                            moe_linear_fit *fd) {
  static const int rows[] = {64, 256, 1024, 4096};
  moe_status st = MOE_STATUS_OK;
  const size_t cols = 512, max_n = 4096 * cols;
  double x[4], yc[4], yd[4], t[1000];
  const int iters = c->cfg->iters;
  float *in = moe_malloc(max_n * sizeof(float)), *back = moe_malloc(max_n * sizeof(float));
  const size_t cap = moe_compress_max_bytes(comp, 4096, cols);
  void *buf = moe_malloc(cap);
  MOE_TRY(agree_alloc(c, in && back && buf, "the compressor buffers"));
  moe_rng rng;
  moe_rng_init(&rng, 11, (uint64_t)c->rank);
  moe_rng_fill_uniform(&rng, in, max_n, -1.0f, 1.0f);
  for (int r = 0; r < 4; r++) {
    const size_t m = (size_t)rows[r];
    size_t got = 0;
    moe_status local = moe_compress(comp, c->ctx, in, m, cols, buf, cap, &got);
    for (int i = 0; i < iters && local == MOE_STATUS_OK; i++) {
      const uint64_t t0 = moe_time_ns();
      local = moe_compress(comp, c->ctx, in, m, cols, buf, cap, &got);
      t[i] = (double)(moe_time_ns() - t0) * 1e-9;
    }
    MOE_TRY(moe_comm_agree(c->ctx, c->comm, local, "compressor"));
    yc[r] = slowest_median(c, t, iters);
    for (int i = 0; i < iters; i++) {
      const uint64_t t0 = moe_time_ns();
      moe_decompress(comp, c->ctx, buf, got, m, cols, back);
      t[i] = (double)(moe_time_ns() - t0) * 1e-9;
    }
    yd[r] = slowest_median(c, t, iters);
    x[r] = (double)(m * cols * sizeof(float));
  }
  static const char quiet[] = "calibrate again on a quiet machine";
  char what[64];
  snprintf(what, sizeof what, "compressor '%s' (compress)", comp->name);
  MOE_TRY(fit_growing(c, what, quiet, x, yc, 4, fc));
  snprintf(what, sizeof what, "compressor '%s' (decompress)", comp->name);
  MOE_TRY(fit_growing(c, what, quiet, x, yd, 4, fd));
  SAY(c, "codec %-6s compress %7.2f GB/s (R² %.4f), decompress %7.2f GB/s (R² %.4f)", comp->name,
      1e-9 / fc->beta, fc->r2, 1e-9 / fd->beta, fd->r2);
done:
  moe_free(in);
  moe_free(back);
  moe_free(buf);
  return st;
}

// ---- the selected algorithms and compressors --------------------------------------

// The lists --a2a and --compress name, read in one place for the run (fit_all_a2a,
// fit_all_codecs) and for its memory estimate (moe_calibrate_memory).

// An all-to-all algorithm of the list, and whether the list names it (and not
// only "all": a named one that cannot run on the layout is an error, one that
// "all" brings is skipped).
typedef struct {
  const moe_a2a_algo *algo;
  int named;
} a2a_pick;

// The algorithms of list ("all": every one of the catalogue), each once, in the
// order of their first mention (for "all", the catalogue's). At most max.
static moe_status a2a_picks(moe_ctx *ctx, const char *list, a2a_pick *out, int max, int *n) {
  moe_status st = MOE_STATUS_OK;
  int na = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&na);
  char buf[256];
  *n = 0;
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    const int all = strcmp(tok, "all") == 0;
    const moe_a2a_algo *known = NULL;
    if (!all) MOE_TRY(moe_a2a_find(ctx, tok, &known));
    for (int i = 0; i < na; i++) {
      if (!all && known != algos[i]) continue;
      int k = 0;
      while (k < *n && out[k].algo != algos[i]) k++;
      if (k == *n) {
        if (*n >= max) continue;
        out[(*n)++] = (a2a_pick){algos[i], 0};
      }
      out[k].named |= !all;
    }
  }
done:
  return st;
}

// The compressors of list ("all": every one this build has), each once by
// name, in the order of their first mention, built with their parameters
// ("zfp:4"). At most max.
static moe_status codec_picks(moe_ctx *ctx, const char *list, moe_compressor *out, int max,
                              int *n) {
  moe_status st = MOE_STATUS_OK;
  *n = 0;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int nc = 0, all = strcmp(tok, "all") == 0;
    const moe_compressor_entry *const *codecs = moe_compressor_list(&nc);
    for (int i = 0; i < (all ? nc : 1); i++) {
      if (all && !codecs[i]->available) continue;
      moe_compressor comp;
      MOE_TRY(moe_compressor_get(ctx, all ? codecs[i]->codec.name : tok, &comp));
      int k = 0;
      while (k < *n && strcmp(out[k].name, comp.name) != 0) k++;
      if (k == *n && *n < max) out[(*n)++] = comp;
    }
  }
done:
  return st;
}

// Every algorithm of cfg->a2a ("all": those that run on g's layout) fitted into prof.
static moe_status fit_all_a2a(const cal *c, const moe_group *g, unsigned char *sbuf,
                              unsigned char *rbuf, moe_workspace *ws, moe_profile *prof) {
  moe_status st = MOE_STATUS_OK;
  a2a_pick picks[MOE_PROFILE_MAX];
  int np = 0;
  MOE_TRY(a2a_picks(c->ctx, c->cfg->a2a, picks, MOE_PROFILE_MAX, &np));
  for (int i = 0; i < np; i++) {
    const moe_a2a_algo *algo = picks[i].algo;
    if (algo->needs_uniform_nodes && !g->uniform) {
      MOE_FAIL_IF(c->ctx, picks[i].named, MOE_STATUS_INVALID_ARG, "a2a: '%s' needs uniform nodes",
                  algo->name);
      continue;
    }
    if (moe_profile_a2a(prof, algo->name) || prof->n_a2a >= MOE_PROFILE_MAX) continue;
    moe_named_fit *nf = &prof->a2a[prof->n_a2a];
    snprintf(nf->name, sizeof nf->name, "%s", algo->name);
    MOE_TRY(fit_a2a(c, g, algo, sbuf, rbuf, ws, &nf->fit, prof->a2a_points[prof->n_a2a],
                    &prof->n_a2a_points[prof->n_a2a]));
    prof->n_a2a++;
  }
  MOE_FAIL_IF(c->ctx, prof->n_a2a == 0, MOE_STATUS_INVALID_ARG,
              "a2a '%s' leaves no algorithm that runs on this layout", c->cfg->a2a);
done:
  return st;
}

// Every compressor of cfg->compress ("all": every one this build has) fitted into prof.
static moe_status fit_all_codecs(const cal *c, moe_profile *prof) {
  moe_status st = MOE_STATUS_OK;
  moe_compressor comps[MOE_PROFILE_MAX];
  int nc = 0;
  MOE_TRY(codec_picks(c->ctx, c->cfg->compress, comps, MOE_PROFILE_MAX, &nc));
  for (int i = 0; i < nc; i++) {
    if (moe_profile_codec(prof, comps[i].name, NULL, NULL) || prof->n_codec >= MOE_PROFILE_MAX) {
      continue;
    }
    const int k = prof->n_codec;
    snprintf(prof->codec_c[k].name, sizeof prof->codec_c[k].name, "%s", comps[i].name);
    snprintf(prof->codec_d[k].name, sizeof prof->codec_d[k].name, "%s", comps[i].name);
    MOE_TRY(fit_codec(c, &comps[i], &prof->codec_c[k].fit, &prof->codec_d[k].fit));
    prof->n_codec++;
  }
done:
  return st;
}

// The description: shape from the topology, rates from the fits.
// ---- Parm's alpha-beta terms ------------------------------------------------------

// moe_measure_parm_alpha_beta on every layout with MP >= 2 (a power of two),
// ESP 1 or 2 and DP 1 whose MP x ESP groups fit in a node (Parm's placement:
// with consecutive ranks per node they do), for each calibrated all-to-all
// that runs on its groups: rows 16 .. 1024 of 256 floats per EP rank, 5
// sizes. Layouts an algorithm cannot run on are skipped (every rank alike).
static moe_status measure_parm(const cal *c, const moe_group *g, moe_profile *prof) {
  moe_status st = MOE_STATUS_OK;
  const int P = c->P, rpn = g->num_nodes > 0 ? g->node_size[0] : P;
  for (int n = 1; n < g->num_nodes; n++)
    if (g->node_size[n] != rpn) {
      SAY(c, "Parm's terms: skipped (nodes of different sizes)");
      return st;
    }
  for (int mp = 2; mp <= rpn; mp *= 2) {
    for (int esp = 1; esp <= 2; esp++) {
      if (rpn % (mp * esp) != 0 || P % (mp * esp) != 0) continue;
      for (int i = 0; i < prof->n_a2a && prof->n_parm < MOE_PROFILE_MAX; i++) {
        moe_parm_terms *t = &prof->parm[prof->n_parm];
        moe_parm_config pc;
        moe_parm_config_default(&pc);
        pc.mp = mp;
        pc.esp = esp;
        pc.ep = P / (mp * esp);
        pc.ranks_per_node = c->cfg->ranks_per_node;
        snprintf(pc.a2a, sizeof pc.a2a, "%s", prof->a2a[i].name);
        moe_linear_fit fits[3];
        const moe_status got = moe_measure_parm_alpha_beta(c->ctx, c->comm, &pc, 256, 16, 1024, 5,
                                                           c->cfg->iters, &t->ab, fits);
        if (got == MOE_STATUS_INVALID_ARG) {  // the algorithm cannot run on these groups
          SAY(c, "Parm's terms, MP %d x EP %d x ESP %d with %s: skipped (%s)", mp, pc.ep, esp,
              pc.a2a, moe_ctx_error(c->ctx));
          continue;
        }
        MOE_TRY(got);
        t->mp = mp;
        t->ep = pc.ep;
        t->esp = esp;
        snprintf(t->a2a, sizeof t->a2a, "%s", pc.a2a);
        prof->n_parm++;
        SAY(c,
            "Parm's terms, MP %d x EP %d x ESP %d with %s (seconds + per element): EP&ESP "
            "all-to-all %.1f us + %.3f ns (R2 %.3f), MP-AllGather %.1f us + %.3f ns (R2 %.3f), "
            "SAA pair %.1f us + %.3f ns (R2 %.3f)",
            mp, pc.ep, esp, pc.a2a, t->ab.alpha_a2a * 1e6, t->ab.beta_a2a * 1e9, fits[0].r2,
            t->ab.alpha_mp * 1e6, t->ab.beta_mp * 1e9, fits[1].r2, t->ab.alpha_o * 1e6,
            t->ab.beta_o * 1e9, fits[2].r2);
      }
    }
  }
done:
  return st;
}

static void describe_cluster(const moe_group *g, int P, moe_profile *prof) {
  moe_cluster *cl = &prof->cluster;
  snprintf(cl->name, sizeof cl->name, "%s", prof->name);
  snprintf(cl->device, sizeof cl->device, "calibrated rank");
  snprintf(cl->source, sizeof cl->source,
           "moe calibrate: GEMM rate from the GEMM fit; both link entries from the 'mpi' "
           "all-to-all fit (effective bandwidth per rank), not per link");
  cl->nodes = g->num_nodes;
  cl->devices_per_node = g->uniform ? g->local_size : 1;
  if (!g->uniform) cl->nodes = P;
  cl->gemm_tflops = 1e-12 / prof->gemm.beta;
  const moe_linear_fit *f = moe_profile_a2a(prof, "mpi");  // catalogue: the baseline
  if (!f) f = &prof->a2a[0].fit;
  const double gbit = 8e-9 / f->beta, lat = f->alpha > 0 ? f->alpha * 1e6 : 0.0;
  cl->intra.gbit_per_s = cl->inter.gbit_per_s = gbit;
  cl->intra.latency_us = cl->inter.latency_us = lat;
  snprintf(cl->intra.kind, sizeof cl->intra.kind, "effective (mpi fit)");
  snprintf(cl->inter.kind, sizeof cl->inter.kind, "effective (mpi fit)");
  cl->nics_per_node = 1;
}

// ---- the layer step ------------------------------------------------------------------

moe_status moe_calibrate_fit_layer(moe_ctx *ctx, moe_profile *prof, const moe_layer_sample *s,
                                   int n, int refit, moe_calibrate_log_fn log, void *user) {
  moe_status st = MOE_STATUS_OK;
  moe_layer_fit_report rep;
  const double sc0 = prof->slow_compute, sm0 = prof->slow_comm;
  MOE_TRY(moe_profile_fit_layer(ctx, prof, s, n, &rep));
  if (!log) goto done;
  char line[4096];
  int len = snprintf(line, sizeof line, "layer fit over %d runs: compute x%.3f %+.1f us per task",
                     n, prof->layer_fit.compute_scale, prof->layer_fit.compute_task_s * 1e6);
  log(user, line);
  for (int a = 0; a < prof->n_a2a; a++) {
    len = 0;
    if (prof->layer_fit.a2a_scale[a] > 0) {
      len += snprintf(line + len, sizeof line - (size_t)len, "  %-9s x%.3f %+.1f us per exchange",
                      prof->a2a[a].name, prof->layer_fit.a2a_scale[a],
                      prof->layer_fit.a2a_exchange_s[a] * 1e6);
    }
    if (prof->layer_fit.a2a_slow[a][0] >= 1.0) {
      len +=
          snprintf(line + len, sizeof line - (size_t)len, ", overlapped: compute x%.2f, comm x%.2f",
                   prof->layer_fit.a2a_slow[a][0], prof->layer_fit.a2a_slow[a][1]);
    }
    if (prof->layer_fit.a2a_smart_slow[a][0] >= 1.0) {
      len += snprintf(line + len, sizeof line - (size_t)len, "; smart: compute x%.2f, comm x%.2f",
                      prof->layer_fit.a2a_smart_slow[a][0], prof->layer_fit.a2a_smart_slow[a][1]);
    }
    if (len > 0) log(user, line);
  }
  snprintf(line, sizeof line,
           "  outside the passes: %.1f us + %.3f ns per T*M*(E+K), R² %.3f; contention, all "
           "algorithms: x%.2f compute, x%.2f comm (%s: x%.2f, x%.2f)",
           prof->layer_fit.outside.alpha * 1e6, prof->layer_fit.outside.beta * 1e9,
           prof->layer_fit.outside.r2, prof->slow_compute, prof->slow_comm,
           refit ? "before the refit" : "executor measurement", sc0, sm0);
  log(user, line);
  snprintf(line, sizeof line,
           "  the layer runs' totals: MAPE %.1f%% with the micro-benchmark models alone, "
           "%.1f%% fitted (R² %.3f; in-sample)",
           rep.mape_before, rep.mape_after, rep.r2_after);
  log(user, line);
  if (rep.outliers > 0) {
    snprintf(line, sizeof line,
             "  left out as outliers: %d run%s whose total the fit missed by more than %.0f%% "
             "(noise bursts)",
             rep.outliers, rep.outliers == 1 ? "" : "s", rep.outlier_threshold * 100.0);
    log(user, line);
  }
  if (rep.at_bound > 0) {
    snprintf(line, sizeof line,
             "  warning: %d correction%s hit the scale bound (x0.1 or x10): the layer runs do "
             "not look like the micro-benchmarks' tasks (one rank, tiny shapes, or a busy "
             "machine)",
             rep.at_bound, rep.at_bound == 1 ? "" : "s");
    log(user, line);
  }
  if (rep.r2_after < 0.8 || rep.mape_after > 15.0) {
    snprintf(line, sizeof line,
             "  warning: the fitted model explains the layer runs poorly (R² %.2f, MAPE %.0f%%): "
             "the machine was probably busy or noisy during calibration; run it again before "
             "trusting predictions",
             rep.r2_after, rep.mape_after);
    log(user, line);
  }
done:
  return st;
}

// Runs the layer on every shape with every calibrated all-to-all (sequential
// r = 1, 2, 4; optsche r=2, pipeline r=4 and smart for the contention
// factors) through the measurement harness, and fits the corrections.
// The layer step's variants for the all-to-alls `names` (n of them): its
// fixed sample set for each, what the fit needs (the sequential chunkings for
// the scales, pipelined schedules and smart for the contention factors).
// Returns the count (at most MAX_VARIANTS).
static int layer_variants(const char *const *names, int n, int P, int ranks_per_node,
                          moe_measure_variant *vs) {
  static const struct {
    const char *schedule;
    int chunks;
  } sv[] = {
      // clang-format off
      {"sequential", 1}, {"sequential", 2}, {"sequential", 4},
      {"optsche", 2}, {"pipeline", 4}, {"smart", 1},  // catalogue: the layer step's sample set
      // clang-format on
  };
  const int per_a2a = (int)(sizeof sv / sizeof sv[0]);
  int nv = 0;
  memset(vs, 0, sizeof *vs * MAX_VARIANTS);  // balance.policy 0: none
  for (int a = 0; a < n && nv + per_a2a <= MAX_VARIANTS; a++) {
    for (int k = 0; k < per_a2a; k++, nv++) {
      moe_parallel_config *pc = &vs[nv].pc;
      moe_parallel_config_default(pc);
      pc->ep_size = P;  // all ranks
      pc->ranks_per_node = ranks_per_node;
      snprintf(pc->a2a, sizeof pc->a2a, "%s", names[a]);
      snprintf(pc->schedule, sizeof pc->schedule, "%s", sv[k].schedule);
      pc->chunks = sv[k].chunks;
      vs[nv].baseline = -1;  // the fit needs no task model
    }
  }
  return nv;
}

static moe_status layer_step(const cal *c, moe_profile *prof, moe_layer_sample **samples_out,
                             int *n_out) {
  moe_status st = MOE_STATUS_OK;
  moe_layer_config cfgs[MAX_SHAPES];
  int n_shapes = 0, nv = 0;
  moe_measure_result *res = NULL;
  moe_layer_sample *samples = NULL;
  MOE_TRY(parse_shapes(c->ctx, c->cfg->layers, c->P, cfgs, &n_shapes));
  moe_measure_variant vs[MAX_VARIANTS];
  const char *names[MOE_PROFILE_MAX];
  for (int a = 0; a < prof->n_a2a; a++) names[a] = prof->a2a[a].name;
  nv = layer_variants(names, prof->n_a2a, c->P, c->cfg->ranks_per_node, vs);
  res = moe_calloc((size_t)nv, sizeof *res);
  samples = moe_calloc((size_t)n_shapes * (size_t)nv, sizeof *samples);
  MOE_TRY(agree_alloc(c, res && samples, "the layer runs"));
  SAY(c, "layer runs: %d shape%s x %d variants (E = %d, K = 2), %d repetitions", n_shapes,
      n_shapes == 1 ? "" : "s", nv, 2 * c->P, c->cfg->iters);
  moe_measure_config mc = moe_measure_config_default();
  mc.iters = c->cfg->iters;
  mc.warmup = 1;
  mc.seed = 7;
  for (int i = 0; i < n_shapes; i++) {
    MOE_TRY(moe_measure_layer_variants(c->ctx, c->comm, &cfgs[i], vs, nv, &mc, res));
    for (int k = 0; k < nv; k++) {
      moe_layer_sample *s = &samples[(size_t)i * (size_t)nv + (size_t)k];
      s->cfg = cfgs[i];
      snprintf(s->a2a, sizeof s->a2a, "%s", vs[k].pc.a2a);
      snprintf(s->schedule, sizeof s->schedule, "%s", vs[k].pc.schedule);
      s->chunks = vs[k].pc.chunks;
      s->comp_ms = res[k].comp_sum_ms;
      s->comm_ms = res[k].comm_sum_ms;
      s->passes_ms = res[k].passes_sum_ms;
      // medians of separate columns: the total's can fall a little below the
      // passes' (each iteration's total includes its passes)
      s->total_ms = res[k].total_ms > s->passes_ms ? res[k].total_ms : s->passes_ms;
    }
  }
  // every rank fits (the same numbers: the samples are the slowest rank's)
  st = moe_calibrate_fit_layer(c->ctx, prof, samples, n_shapes * nv, 0,
                               c->rank == 0 ? c->cfg->log : NULL, c->cfg->log_user);
  if (st != MOE_STATUS_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", moe_ctx_error(c->ctx));
    MOE_FAIL(c->ctx, st, "layer step: %s (the layer shapes: %s)", why, c->cfg->layers);
  }
  if (samples_out) {
    *samples_out = samples;
    *n_out = n_shapes * nv;
    samples = NULL;
  }
done:
  moe_free(res);
  moe_free(samples);
  return st;
}

// ---- the whole calibration ----------------------------------------------------------

// ---- the memory it needs ------------------------------------------------------------

static double need_total(const moe_memory_need *m) { return moe_memory_need_total(m); }

static void need_add(moe_memory_need *to, const moe_memory_need *m) {
  for (int k = 0; k < MOE_MEM_COUNT_; k++) to->bytes[k] += m->bytes[k];
}

// *best = m when m needs more.
static void need_max(moe_memory_need *best, const moe_memory_need *m) {
  if (need_total(m) > need_total(best)) *best = *m;
}

moe_status moe_calibrate_memory(moe_ctx *ctx, int P, const moe_calibrate_config *cfg,
                                moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !out || P < 1, MOE_STATUS_INVALID_ARG, "calibrate memory: out, P >= 1 (%d)", P);
  memset(out, 0, sizeof *out);
  MOE_TRY(moe_calibrate_config_check(ctx, cfg, P));
  {
    const double f = sizeof(float);
    moe_memory_need m;
    // 1. the steps before the all-to-alls, one at a time: fit_gemm's three
    // matrices, fit_expert's ten 2048 x 2048 buffers and four biases,
    // fit_outside's three 2048 x 512 buffers
    memset(&m, 0, sizeof m);
    m.bytes[MOE_MEM_WORKSPACE] = (2048.0 * 1024 + 1024.0 * 2048 + 2048.0 * 2048) * f;
    need_max(out, &m);
    m.bytes[MOE_MEM_WORKSPACE] = (10.0 * 2048 * 2048 + 4.0 * 2048) * f;
    need_max(out, &m);
    m.bytes[MOE_MEM_WORKSPACE] = 3.0 * 2048 * 512 * f;
    need_max(out, &m);

    // 2. from the all-to-alls on, their buffers (max_bytes a rank, both ways)
    // and the algorithms' workspace stay; beside them, one step at a time
    // the algorithms of --a2a ("all": also those the real layout will skip, so
    // the count is an upper bound)
    a2a_pick picks[MOE_PROFILE_MAX];
    const char *names[MOE_PROFILE_MAX];
    int na = 0;
    MOE_TRY(a2a_picks(ctx, cfg->a2a, picks, MOE_PROFILE_MAX, &na));
    for (int i = 0; i < na; i++) names[i] = picks[i].algo->name;
    const int rpn = cfg->ranks_per_node > 0 && cfg->ranks_per_node < P ? cfg->ranks_per_node : P;
    moe_memory_need held, step;
    MOE_TRY(moe_measure_a2a_memory(ctx, P, cfg->ranks_per_node, (size_t)cfg->max_bytes,
                                   (size_t)cfg->max_bytes, names, na, cfg->iters, &held));
    memset(&step, 0, sizeof step);
    // measure_overlap: the counts and its GEMM's 512 x 1024, 1024 x 1024, 512 x 1024
    memset(&m, 0, sizeof m);
    m.bytes[MOE_MEM_WORKSPACE] = 4.0 * P * sizeof(size_t) + (2.0 * 512 * 1024 + 1024.0 * 1024) * f;
    need_max(&step, &m);
    // measure_small: two 32 MiB copy buffers
    m.bytes[MOE_MEM_WORKSPACE] = 2.0 * (32 << 20);
    need_max(&step, &m);
    // measure_a2a_allreduce: moe_measure_contention as it configures it
    if (P >= 2) {
      const moe_a2a_algo *mpi = NULL;
      MOE_TRY(moe_a2a_find(ctx, "mpi", &mpi));  // catalogue: every build has it
      moe_contention_config cc;
      moe_contention_config_default(&cc);
      cc.layers = 2;
      cc.rounds = cfg->iters;
      cc.warmup = 1;
      MOE_TRY(moe_measure_contention_memory(ctx, P, cfg->ranks_per_node, mpi, &cc, &m));
      need_max(&step, &m);
    }
    // fit_codec: input and round trip of 4096 x 512 floats and the largest
    // compressed buffer of the compressors named (with their parameters)
    {
      double cap = 0;
      moe_compressor comps[MOE_PROFILE_MAX];
      int nc = 0;
      MOE_TRY(codec_picks(ctx, cfg->compress, comps, MOE_PROFILE_MAX, &nc));
      for (int i = 0; i < nc; i++) {
        const double b = (double)moe_compress_max_bytes(&comps[i], 4096, 512);
        if (b > cap) cap = b;
      }
      memset(&m, 0, sizeof m);
      m.bytes[MOE_MEM_WORKSPACE] = 2.0 * 4096 * 512 * f + cap;
      need_max(&step, &m);
    }
    // measure_parm: every layout it may measure (the node size taken as P
    // unless ranks_per_node says less: an upper bound), each algorithm; none
    // past moe_measure_parm_alpha_beta's 2^28 floats (1024 rows of 256 per
    // rank of the MP x EP x ESP = P layout), which it refuses
    for (int mp = 2; mp <= rpn && 1024.0 * 256 * P <= (double)(1 << 28); mp *= 2) {
      for (int esp = 1; esp <= 2; esp++) {
        if (rpn % (mp * esp) != 0 || P % (mp * esp) != 0) continue;
        for (int i = 0; i < na; i++) {
          moe_parm_config pc;
          moe_parm_config_default(&pc);
          pc.mp = mp;
          pc.esp = esp;
          pc.ep = P / (mp * esp);
          pc.ranks_per_node = cfg->ranks_per_node;
          snprintf(pc.a2a, sizeof pc.a2a, "%s", names[i]);
          if (moe_measure_parm_alpha_beta_memory(ctx, &pc, P, 256, 1024, 5, cfg->iters, &m) !=
              MOE_STATUS_OK)
            continue;  // a layout the layer refuses is skipped there too
          need_max(&step, &m);
        }
      }
    }
    // layer_step: each shape's variants at once, and the runs' tables
    if (cfg->layers) {
      moe_layer_config cfgs[MAX_SHAPES];
      int n_shapes = 0;
      MOE_TRY(parse_shapes(ctx, cfg->layers, P, cfgs, &n_shapes));
      moe_measure_variant vs[MAX_VARIANTS];
      const int nv = layer_variants(names, na, P, cfg->ranks_per_node, vs);
      moe_measure_config mc = moe_measure_config_default();
      mc.iters = cfg->iters;
      mc.warmup = 1;
      mc.seed = 7;
      for (int i = 0; i < n_shapes; i++) {
        MOE_TRY(moe_measure_layer_variants_memory(ctx, P, &cfgs[i], vs, nv, &mc, &m));
        m.bytes[MOE_MEM_WORKSPACE] += (double)nv * sizeof(moe_measure_result) +
                                      (double)n_shapes * nv * sizeof(moe_layer_sample);
        need_max(&step, &m);
      }
    }
    need_add(&held, &step);
    need_max(out, &held);
  }
done:
  return st;
}

moe_status moe_calibrate(moe_ctx *ctx, MPI_Comm comm, const moe_calibrate_config *cfg,
                         moe_profile *prof, moe_layer_sample **samples, int *n_samples) {
  moe_status st = MOE_STATUS_OK;
  cal c = {ctx, comm, 0, 1, cfg};
  moe_group g;
  memset(&g, 0, sizeof g);
  int have_group = 0;
  unsigned char *sbuf = NULL, *rbuf = NULL;
  moe_workspace ws = {0};
  if (samples) *samples = NULL;
  if (n_samples) *n_samples = 0;
  MOE_FAIL_IF(ctx, !prof || (samples && !n_samples), MOE_STATUS_INVALID_ARG,
              "prof must not be NULL (and n_samples goes with samples)");
  MOE_MPI_TRY(ctx, MPI_Comm_rank(comm, &c.rank));
  MOE_MPI_TRY(ctx, MPI_Comm_size(comm, &c.P));
  MOE_TRY(moe_calibrate_config_check(ctx, cfg, c.P));  // the same on every rank
  memset(prof, 0, sizeof *prof);
  MOE_TRY(moe_group_init_topology(ctx, &g, comm, cfg->ranks_per_node));
  have_group = 1;
  if (cfg->name) {
    snprintf(prof->name, sizeof prof->name, "%s", cfg->name);
  } else {
    snprintf(prof->name, sizeof prof->name, "calibrated-%d", c.P);
  }
  SAY(&c, "moe calibrate: %d rank%s on %d node%s, %d repetitions per point", c.P,
      c.P == 1 ? "" : "s", g.num_nodes, g.num_nodes == 1 ? "" : "s", cfg->iters);
  MOE_TRY(fit_gemm(&c, &prof->gemm));
  MOE_TRY(fit_expert(&c, &prof->expert_fwd, &prof->expert_bwd, prof->expert_points,
                     &prof->n_expert_points));
  MOE_TRY(fit_outside(&c, &prof->outside));
  prof->have_step_fits = 1;
  sbuf = moe_malloc((size_t)cfg->max_bytes + 1);
  rbuf = moe_malloc((size_t)cfg->max_bytes + 1);
  MOE_TRY(agree_alloc(&c, sbuf && rbuf, "the all-to-all buffers"));
  memset(sbuf, c.rank & 0xff, (size_t)cfg->max_bytes);
  MOE_TRY(fit_all_a2a(&c, &g, sbuf, rbuf, &ws, prof));
  MOE_TRY(measure_overlap(&c, &g, sbuf, rbuf, &ws, &prof->slow_compute, &prof->slow_comm));
  MOE_TRY(measure_task_overhead(&c, &prof->task_overhead));
  MOE_TRY(measure_small(&c, &prof->small_collective, &prof->copy_gbs));
  MOE_TRY(measure_a2a_allreduce(&c, &g, &prof->a2a_allreduce_slowdown));
  MOE_TRY(fit_all_codecs(&c, prof));
  MOE_TRY(measure_parm(&c, &g, prof));
  describe_cluster(&g, c.P, prof);
  if (cfg->layers) MOE_TRY(layer_step(&c, prof, samples, n_samples));
done:
  moe_free(sbuf);
  moe_free(rbuf);
  moe_workspace_free(&ws);
  if (have_group) moe_group_free(&g);
  return st;
}

#else
// Without MPI this file has nothing to compile (ISO C wants a declaration).
typedef int moe_measure_calibrate_needs_mpi;
#endif  // MOE_HAVE_MPI
