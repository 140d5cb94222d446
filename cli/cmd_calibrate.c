// moe calibrate: measures this cluster under mpirun and writes a profile
// (include/moe/perf.h): alpha-beta fits of one GEMM (seconds vs FLOPs), of
// every all-to-all algorithm (seconds vs bytes one rank sends to the others)
// and of every compressor (seconds vs input float bytes), each with R².
// All ranks measure at the same time, as in a training step, and every point
// is the slowest rank's median. `moe simulate --profile FILE` and the planner
// read the result.
#define _POSIX_C_SOURCE 200809L  // strtok_r
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moe/compress.h"
#include "moe/expert.h"
#include "moe/kernels.h"
#include "moe/perf.h"
#include "moe/sched.h"

#if MOE_CLI_MPI
#include "moe/comm.h"

typedef struct {
  const char *out, *name, *a2a, *compress;
  const char *layers;   // shapes of the layer step, NULL: skipped
  const char *samples;  // write the layer step's runs there
  const char *refit;    // fit --profile's corrections to these runs instead of measuring
  const char *profile;  // the profile to refit
  int ranks_per_node, iters;
  long long min_bytes, max_bytes;
} cal_opts;

#define CAL_DEFAULT_LAYERS "256:256:512:1.1,512:256:1024:1.1,256:512:1024:1.1,384:384:768:1.1"

static void calibrate_usage(FILE *f) {
  // (unformatted: the catalogue marker makes one line long)
  // clang-format off
  fprintf(f,
          "usage: mpirun -n P moe calibrate --out FILE [options]\n"
          "\n"
          "Measures this cluster and writes a profile (JSON): least-squares fits\n"
          "t = alpha + beta * x of one GEMM (x = FLOPs), of one expert's forward and\n"
          "backward step (x = FLOPs), of the layer's work outside the experts (gate,\n"
          "dispatch, combine; x = T M (E + K)), of each all-to-all algorithm\n"
          "(x = bytes one rank sends to the others, uniform counts) and of each\n"
          "compressor (x = input float bytes), with R², and how much a compute task and\n"
          "an all-to-all slow each other down when they overlap on the executor (the\n"
          "simulator's contention factors). Every rank measures at the same\n"
          "time; each point is the slowest rank's median. Read it back with\n"
          "'moe simulate --profile FILE'.\n"
          "\n"
          "options (default in brackets):\n"
          "  --out FILE             the profile to write (required)\n"
          "  --name NAME            profile and cluster name [calibrated-<ranks>]\n"
          "  --ranks-per-node N     pretend every N consecutive ranks share a node\n"
          "  --a2a LIST|all         algorithms to fit [all that run on this layout]\n"
          "  --compress LIST|all    compressors to fit [all]\n"
          "  --min-bytes S          smallest all-to-all, bytes per rank [4096]\n"
          "  --max-bytes S          largest all-to-all, bytes per rank [8388608]\n"
          "  --iters N              timed repetitions per point, 1..1000 [5]\n"
          "  --layers LIST          layer step: shapes T:M:H:f (tokens per rank, model,\n"
          "                         hidden, capacity factor, 0 = dropless) of the\n"
          "                         expert-parallel layer to run, E = 2 x ranks, K = 2\n"
          "                         [" CAL_DEFAULT_LAYERS
          "]\n"
          "  --no-layers            skip the layer step (no layer corrections)\n"
          "  --samples FILE         also write the layer step's runs (JSON) to FILE\n"
          "  --refit FILE --profile IN\n"
          "                         measure nothing: fit IN's layer corrections again to the\n"
          "                         runs in FILE (from --samples) and write the result to\n"
          "                         --out (one process is enough; no measuring option\n"
          "                         applies)\n"
          "\n"
          "The layer step runs every calibrated all-to-all with the sequential schedule\n"
          "at r = 1, 2, 4 and with optsche r=2, pipeline r=4 and smart, then fits a\n"  // catalogue: cmd_calibrate_layers.c's sample set
          "scale and a per-task cost of the expert steps and of each all-to-all, the\n"
          "time outside the passes and each all-to-all's contention factors to those\n"
          "runs (layer_fit in the profile), so the simulator predicts what the layer\n"
          "does rather than what the micro-benchmarks do alone.\n");
  // clang-format on
}

static int parse_cal(int argc, char **argv, cal_opts *o, int rank) {
  memset(o, 0, sizeof *o);
  o->a2a = "all";
  o->compress = "all";
  o->iters = 5;
  o->layers = CAL_DEFAULT_LAYERS;
  o->min_bytes = 4096;
  o->max_bytes = 8 << 20;
  cli_args a;
  cli_args_init(&a, argc, argv, 2);
  const char *measuring = NULL;  // the first option that only applies to measuring
  while (!cli_args_done(&a) && !a.bad) {
    const char *arg = cli_args_peek(&a);
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      if (rank == 0) calibrate_usage(stdout);
      return -1;
    } else if (cli_opt(&a, "--out")) {
      o->out = a.value;
      arg = NULL;
    } else if (cli_opt(&a, "--refit")) {
      o->refit = a.value;
      arg = NULL;
    } else if (cli_opt(&a, "--profile")) {
      o->profile = a.value;
      arg = NULL;
    } else if (cli_opt(&a, "--samples")) {
      o->samples = a.value;
    } else if (cli_opt(&a, "--name")) {
      o->name = a.value;
      if (a.value && strlen(a.value) >= 64) {
        if (rank == 0) cli_error("--name '%s' is longer than 63 bytes", a.value);
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--ranks-per-node")) {
      cli_parse_int(&a, "--ranks-per-node", 0, 1 << 20, &o->ranks_per_node);
    } else if (cli_opt(&a, "--a2a")) {
      o->a2a = a.value;
    } else if (cli_opt(&a, "--compress")) {
      o->compress = a.value;
    } else if (cli_opt(&a, "--iters")) {
      cli_parse_int(&a, "--iters", 1, 1000, &o->iters);
    } else if (cli_opt(&a, "--layers")) {
      o->layers = a.value;
    } else if (cli_flag(&a, "--no-layers")) {
      o->layers = NULL;
    } else if (cli_opt(&a, "--min-bytes")) {
      int v = 0;
      cli_parse_int(&a, "--min-bytes", 1024, 1 << 30, &v);
      o->min_bytes = v;
    } else if (cli_opt(&a, "--max-bytes")) {
      int v = 0;
      cli_parse_int(&a, "--max-bytes", 1024, 1 << 30, &v);
      o->max_bytes = v;
    } else {
      if (rank == 0) cli_error("unknown option '%s' (see moe calibrate --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
    if (arg && !measuring) measuring = arg;
  }
  if (!a.bad && o->refit && (!o->profile || measuring)) {
    if (rank == 0) {
      if (!o->profile) {
        cli_error("--refit FILE needs --profile IN: the profile whose corrections to fit again");
      } else {
        cli_error("--refit measures nothing, so '%s' does not apply (see moe calibrate --help)",
                  measuring);
      }
    }
    a.bad = 1;
  }
  if (!a.bad && o->profile && !o->refit) {
    if (rank == 0) cli_error("--profile IN only goes with --refit FILE (see moe calibrate --help)");
    a.bad = 1;
  }
  if (!a.bad && o->samples && !o->layers) {
    if (rank == 0) cli_error("--samples FILE writes the layer step's runs; --no-layers skips it");
    a.bad = 1;
  }
  if (!a.bad && !o->out) {
    if (rank == 0) cli_error("--out FILE is required (see moe calibrate --help)");
    a.bad = 1;
  }
  if (!a.bad && o->layers && !o->refit) {
    int P = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    if (cli_calibrate_layers(NULL, o->layers, 0, 1, rank, P, NULL, NULL) != CLI_OK) a.bad = 1;
  }
  if (!a.bad && !o->refit && o->min_bytes * 4 > o->max_bytes) {
    if (rank == 0) {
      cli_error("--max-bytes (%lld) must be at least 4 x --min-bytes (%lld) for a fit",
                o->max_bytes, o->min_bytes);
    }
    a.bad = 1;
  }
  return a.bad ? CLI_USAGE : CLI_OK;
}

// The slowest rank's time of the median of n measurements t[].
static double slowest_median(double *t, int n) {
  double m = cli_median(t, n);
  MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

// GEMM: rows x M x H shapes, all ranks at once.
static int fit_gemm(moe_ctx *ctx, const cal_opts *o, int rank, moe_linear_fit *fit) {
  static const int rows[] = {64, 256, 1024, 2048},
                   mh[][2] = {{256, 512}, {512, 1024}, {1024, 2048}};
  double x[12], y[12], t[1000];
  int n = 0;
  float *a = moe_malloc((size_t)2048 * 1024 * sizeof(float));
  float *b = moe_malloc((size_t)1024 * 2048 * sizeof(float));
  float *c = moe_malloc((size_t)2048 * 2048 * sizeof(float));
  int ok = a && b && c;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (rank == 0) cli_error("cannot allocate the GEMM buffers");
    moe_free(a);
    moe_free(b);
    moe_free(c);
    return CLI_FAILED;
  }
  moe_rng rng;
  moe_rng_init(&rng, 5, (uint64_t)rank);
  moe_rng_fill_uniform(&rng, a, (size_t)2048 * 1024, -1.0f, 1.0f);
  moe_rng_fill_uniform(&rng, b, (size_t)1024 * 2048, -1.0f, 1.0f);
  for (size_t s = 0; s < sizeof mh / sizeof mh[0]; s++) {
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
      const int m = rows[r], k = mh[s][0], nn = mh[s][1];
      moe_gemm(0, 0, m, nn, k, 1.0f, a, k, b, nn, 0.0f, c, nn);  // warm-up
      MPI_Barrier(MPI_COMM_WORLD);
      for (int i = 0; i < o->iters; i++) {
        const uint64_t t0 = moe_time_ns();
        moe_gemm(0, 0, m, nn, k, 1.0f, a, k, b, nn, 0.0f, c, nn);
        t[i] = (double)(moe_time_ns() - t0) * 1e-9;
      }
      x[n] = 2.0 * m * (double)k * nn;
      y[n] = slowest_median(t, o->iters);
      n++;
    }
  }
  moe_free(a);
  moe_free(b);
  moe_free(c);
  if (moe_fit_linear(ctx, x, y, n, fit) != MOE_STATUS_OK || !(fit->beta > 0)) {
    if (rank == 0) cli_error("GEMM fit: no usable fit (slope %g s/FLOP)", fit->beta);
    return CLI_FAILED;
  }
  if (rank == 0) {
    printf("gemm: %d shapes, alpha %.2f us, %.1f GFLOP/s per rank, R² %.4f\n", n, fit->alpha * 1e6,
           1e-9 / fit->beta, fit->r2);
  }
  return CLI_OK;
}

// One expert's forward and backward step (the "ffn" kind: GEMMs, bias,
// activation) over rows x M x H shapes, all ranks at once; x = FLOPs.
static int fit_expert(moe_ctx *ctx, const cal_opts *o, int rank, moe_linear_fit *ffit,
                      moe_linear_fit *bfit, double (*points)[5], int *n_points) {
  static const int rows[] = {64, 256, 1024, 2048},
                   mh[][2] = {{256, 512}, {512, 1024}, {1024, 2048}};
  double x[12], yf[12], yb[12], t[1000];
  int n = 0, rc = CLI_OK;
  const size_t big = (size_t)2048 * 2048;
  float *w1 = moe_malloc(big * 4), *w2 = moe_malloc(big * 4), *b1 = moe_malloc(2048 * 4),
        *b2 = moe_malloc(2048 * 4), *xin = moe_malloc(big * 4), *pre = moe_malloc(big * 4),
        *h = moe_malloc(big * 4), *y = moe_malloc(big * 4), *dh = moe_malloc(big * 4),
        *dpre = moe_malloc(big * 4), *g1 = moe_malloc(big * 4), *g2 = moe_malloc(big * 4),
        *gb1 = moe_malloc(2048 * 4), *gb2 = moe_malloc(2048 * 4);
  const moe_expert_kind *kind = NULL;
  const moe_status found = moe_expert_kind_find(ctx, "ffn", &kind);  // catalogue: the default kind
  int ok = w1 && w2 && b1 && b2 && xin && pre && h && y && dh && dpre && g1 && g2 && gb1 && gb2 &&
           found == MOE_STATUS_OK;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (rank == 0) cli_error("cannot allocate the expert buffers");
    rc = CLI_FAILED;
    goto done;
  }
  moe_rng rng;
  moe_rng_init(&rng, 9, (uint64_t)rank);
  float *fill[] = {w1, w2, xin, y};
  for (int i = 0; i < 4; i++) moe_rng_fill_uniform(&rng, fill[i], big, -0.1f, 0.1f);
  moe_rng_fill_uniform(&rng, b1, 2048, -0.1f, 0.1f);
  moe_rng_fill_uniform(&rng, b2, 2048, -0.1f, 0.1f);
  for (size_t s = 0; s < sizeof mh / sizeof mh[0]; s++) {
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
      moe_layer_config cfg;
      moe_layer_config_default(&cfg);
      cfg.model_dim = mh[s][0];
      cfg.hidden_dim = mh[s][1];
      const int m = rows[r];
      const moe_expert_params p = {w1, b1, w2, b2};
      const moe_expert_grads gr = {g1, gb1, g2, gb2};
      moe_layer_timing tm;
      memset(&tm, 0, sizeof tm);
      kind->forward(&cfg, &p, xin, m, pre, h, y, &tm);  // warm-up
      MPI_Barrier(MPI_COMM_WORLD);
      for (int i = 0; i < o->iters; i++) {
        const uint64_t t0 = moe_time_ns();
        kind->forward(&cfg, &p, xin, m, pre, h, y, &tm);
        t[i] = (double)(moe_time_ns() - t0) * 1e-9;
      }
      yf[n] = slowest_median(t, o->iters);
      for (int i = 0; i < o->iters; i++) {
        const uint64_t t0 = moe_time_ns();
        kind->backward(&cfg, &p, &gr, xin, pre, h, y, m, dh, dpre, &tm);
        t[i] = (double)(moe_time_ns() - t0) * 1e-9;
      }
      yb[n] = slowest_median(t, o->iters);
      x[n] = 4.0 * m * (double)cfg.model_dim * cfg.hidden_dim;  // forward FLOPs
      if (points) {
        points[n][0] = m;
        points[n][1] = cfg.model_dim;
        points[n][2] = cfg.hidden_dim;
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
  if (moe_fit_linear2(ctx, x, wt, yf, n, ffit) != MOE_STATUS_OK ||
      moe_fit_linear2(ctx, xb, wt, yb, n, bfit) != MOE_STATUS_OK || !(ffit->beta > 0) ||
      !(bfit->beta > 0)) {
    if (rank == 0) cli_error("expert fit: %s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
    goto done;
  }
  if (rank == 0) {
    printf("expert forward: alpha %.1f us, %.1f GFLOP/s, %.3f ns per weight, R² %.4f\n",
           ffit->alpha * 1e6, 1e-9 / ffit->beta, ffit->gamma * 1e9, ffit->r2);
    printf("expert backward: alpha %.1f us, %.1f GFLOP/s, %.3f ns per weight, R² %.4f\n",
           bfit->alpha * 1e6, 1e-9 / bfit->beta, bfit->gamma * 1e9, bfit->r2);
  }
done:;
  float *all[] = {w1, w2, b1, b2, xin, pre, h, y, dh, dpre, g1, g2, gb1, gb2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) moe_free(all[i]);
  return rc;
}

// The layer's work outside the expert passes (gate, softmax, top-k,
// dispatch, combine and their backward), from the single-process layer's own
// phase timings, over T x M with E = 8, K = 2; x = T M (E + K).
static int fit_outside(moe_ctx *ctx, const cal_opts *o, int rank, moe_linear_fit *fit) {
  static const int toks[] = {256, 512, 1024, 2048}, dims[] = {256, 512};
  double x[8], y[8], t[1000];
  int n = 0, rc = CLI_OK;
  float *in = moe_malloc((size_t)2048 * 512 * 4), *out = moe_malloc((size_t)2048 * 512 * 4),
        *dx = moe_malloc((size_t)2048 * 512 * 4);
  int ok = in && out && dx;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    rc = CLI_FAILED;
    goto done;
  }
  moe_rng rng;
  moe_rng_init(&rng, 13, (uint64_t)rank);
  moe_rng_fill_uniform(&rng, in, (size_t)2048 * 512, -1.0f, 1.0f);
  for (size_t d = 0; d < 2; d++) {
    for (size_t k = 0; k < 4; k++) {
      moe_layer_config cfg;
      moe_layer_config_default(&cfg);
      cfg.tokens = toks[k];
      cfg.model_dim = dims[d];
      cfg.hidden_dim = 16;  // experts are timed apart; keep them cheap
      cfg.num_experts = 8;
      cfg.top_k = 2;
      moe_layer *L = NULL;
      int fail = moe_layer_create(ctx, &cfg, &L) != MOE_STATUS_OK;
      if (!fail) moe_layer_init_params(L, 3);
      for (int i = -1; i < o->iters && !fail; i++) {
        fail = moe_layer_forward(L, in, cfg.tokens, out, NULL) != MOE_STATUS_OK ||
               moe_layer_backward(L, in, dx) != MOE_STATUS_OK;  // dy = x: any values do
        const moe_layer_timing f = moe_layer_get_forward_timing(L);
        const moe_layer_timing b = moe_layer_get_backward_timing(L);
        if (i >= 0) {
          t[i] = (f.gate_ms + f.dispatch_ms + f.combine_ms + b.gate_ms + b.dispatch_ms +
                  b.combine_ms) *
                 1e-3;
        }
      }
      moe_layer_destroy(L);
      MPI_Allreduce(MPI_IN_PLACE, &fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (fail) {
        if (rank == 0) cli_error("layer timing: %s", moe_ctx_error(ctx));
        rc = CLI_FAILED;
        goto done;
      }
      y[n] = slowest_median(t, o->iters);
      x[n] = (double)cfg.tokens * cfg.model_dim * (cfg.num_experts + cfg.top_k);
      n++;
    }
  }
  if (moe_fit_linear(ctx, x, y, n, fit) != MOE_STATUS_OK || !(fit->beta > 0)) {
    if (rank == 0) cli_error("outside fit: no usable fit");
    rc = CLI_FAILED;
    goto done;
  }
  if (rank == 0) {
    printf(
        "outside the experts (gate, dispatch, combine; fwd+bwd): alpha %.1f us, %.3f ns per "
        "T*M*(E+K), R² %.4f\n",
        fit->alpha * 1e6, fit->beta * 1e9, fit->r2);
  }
done:
  moe_free(in);
  moe_free(out);
  moe_free(dx);
  return rc;
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
static int measure_task_overhead(moe_ctx *ctx, const cal_opts *o, int rank, double *out) {
  enum { N = 200 };
  moe_executor *ex = NULL;
  moe_task_graph g;
  moe_schedule sch;
  memset(&g, 0, sizeof g);
  memset(&sch, 0, sizeof sch);
  double t[1000];
  int ok = moe_executor_create(ctx, NULL, N, &ex) == MOE_STATUS_OK &&
           moe_task_graph_init(ctx, &g, N, N) == MOE_STATUS_OK &&
           moe_schedule_init(ctx, &sch, N) == MOE_STATUS_OK;
  int prev = -1;
  for (int i = 0; ok && i < N; i++) {
    moe_task_desc d;
    memset(&d, 0, sizeof d);
    d.stream = i % 2 ? MOE_STREAM_COMM : MOE_STREAM_COMPUTE;
    d.run = ov_nothing;
    d.deps = prev >= 0 ? &prev : NULL;
    d.n_deps = prev >= 0;
    ok = moe_task_graph_add(ctx, &g, &d, &prev) == MOE_STATUS_OK;
  }
  ok = ok && moe_schedule_in_index_order(ctx, &sch, &g) == MOE_STATUS_OK;
  for (int r = 0; ok && r < o->iters; r++) {
    const uint64_t t0 = moe_time_ns();
    ok = moe_executor_run(ex, &g, &sch, ctx) == MOE_STATUS_OK;
    t[r] = (double)(moe_time_ns() - t0) * 1e-9 / N;
  }
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (ok) *out = slowest_median(t, o->iters);
  moe_task_graph_free(&g);
  moe_schedule_free(&sch);
  moe_executor_destroy(ex);
  if (!ok) {
    if (rank == 0) cli_error("task overhead: %s", moe_ctx_error(ctx));
    return CLI_FAILED;
  }
  if (rank == 0) printf("executor hand-off per task: %.1f us\n", *out * 1e6);
  return CLI_OK;
}

// A small collective over the world (8-double allreduce) and one rank's
// memory copy bandwidth (32 MiB memcpy), medians, slowest rank.
static int measure_small(const cal_opts *o, int rank, double *coll_s, double *copy_gbs) {
  double t[1000], v[8] = {0};
  for (int i = 0; i < o->iters; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    const uint64_t t0 = moe_time_ns();
    for (int k = 0; k < 10; k++)
      MPI_Allreduce(MPI_IN_PLACE, v, 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    t[i] = (double)(moe_time_ns() - t0) * 1e-9 / 10;
  }
  *coll_s = slowest_median(t, o->iters);
  const size_t n = (size_t)32 << 20;
  char *a = moe_malloc(n), *b = moe_malloc(n);
  int ok = a && b;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    moe_free(a);
    moe_free(b);
    if (rank == 0) cli_error("cannot allocate the copy buffers");
    return CLI_FAILED;
  }
  memset(a, 1, n);
  memset(b, 2, n);
  for (int i = 0; i < o->iters; i++) {
    const uint64_t t0 = moe_time_ns();
    memcpy(b, a, n);
    t[i] = (double)(moe_time_ns() - t0) * 1e-9;
  }
  const double s = slowest_median(t, o->iters);
  *copy_gbs = s > 0 ? (double)n / s / 1e9 : 0.0;
  moe_free(a);
  moe_free(b);
  if (rank == 0) {
    printf("small collective (8-double allreduce): %.1f us; memory copy %.2f GB/s per rank\n",
           *coll_s * 1e6, *copy_gbs);
  }
  return CLI_OK;
}

// Contention factors: a GEMM loop (~50 ms) on the compute stream beside a
// chain of 1 MiB-per-rank all-to-alls (algorithm `mpi`) on the communication
// stream, against each alone; medians over the repetitions, slowest rank.
static int measure_overlap(moe_ctx *ctx, const cal_opts *o, int rank, const moe_group *g,
                           unsigned char *sbuf, unsigned char *rbuf, moe_workspace *ws,
                           double *slow_comp, double *slow_comm) {
  int rc = CLI_OK;
  const int P = g->size;
  overlap_arg arg;
  memset(&arg, 0, sizeof arg);
  moe_executor *ex = NULL;
  size_t *cnt = moe_malloc(4 * (size_t)P * sizeof(size_t));
  arg.a = moe_malloc((size_t)512 * 1024 * 4);
  arg.b = moe_malloc((size_t)1024 * 1024 * 4);
  arg.c = moe_malloc((size_t)512 * 1024 * 4);
  const moe_a2a_algo *algo = NULL;
  const moe_status found = moe_a2a_find(ctx, "mpi", &algo);  // catalogue: the default algorithm
  int ok = cnt && arg.a && arg.b && arg.c && found == MOE_STATUS_OK &&
           moe_executor_create(ctx, NULL, 300, &ex) == MOE_STATUS_OK;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (rank == 0) cli_error("contention measurement: cannot set up (%s)", moe_ctx_error(ctx));
    rc = CLI_FAILED;
    goto done;
  }
  memset(arg.a, 0, (size_t)512 * 1024 * 4);
  memset(arg.b, 0, (size_t)1024 * 1024 * 4);
  {
    const size_t S =
        (size_t)1 << 20 < (size_t)o->max_bytes ? (size_t)1 << 20 : (size_t)o->max_bytes;
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
    ov_compute(&arg, ctx);
    const double one = (double)(moe_time_ns() - t0) * 1e-9;
    int gemms = (int)(0.05 / (one > 1e-6 ? one : 1e-6)) + 1;
    if (gemms > 1000) gemms = 1000;
    MPI_Allreduce(MPI_IN_PLACE, &gemms, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    arg.gemms = gemms;
  }
  double comp_alone[1000], a2a_alone[1000], comp_both[1000], a2a_both[1000];
  const int reps = o->iters;
  int n_a2a = 8;
  for (int r = 0; r < reps && rc == CLI_OK; r++) {
    double c = 0, a = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    if (overlap_pass(ctx, ex, &arg, 0, 8, &c, &a) != MOE_STATUS_OK) {
      // peers may be inside the failed exchange: no collective can follow
      cli_error("rank %d: contention measurement: %s", rank, moe_ctx_error(ctx));
      MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
    }
    a2a_alone[r] = a;
    const uint64_t t0 = moe_time_ns();
    ov_compute(&arg, ctx);
    comp_alone[r] = (double)(moe_time_ns() - t0) * 1e-9;
    // enough all-to-alls to outlast the compute task (at most 256)
    int k = a > 0 ? (int)(2.0 * comp_alone[r] / a) + 2 : 8;
    if (k > 256) k = 256;
    MPI_Allreduce(MPI_IN_PLACE, &k, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    n_a2a = k;
    MPI_Barrier(MPI_COMM_WORLD);
    if (overlap_pass(ctx, ex, &arg, 1, n_a2a, &c, &a) != MOE_STATUS_OK) {
      cli_error("rank %d: contention measurement: %s", rank, moe_ctx_error(ctx));
      MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
    }
    comp_both[r] = c;
    a2a_both[r] = a;
  }
  if (rc != CLI_OK) {
    cli_error("rank %d: contention measurement: %s", rank, moe_ctx_error(ctx));
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  {
    const double ca = slowest_median(comp_alone, reps), cb = slowest_median(comp_both, reps);
    const double aa = slowest_median(a2a_alone, reps), ab = slowest_median(a2a_both, reps);
    *slow_comp = ca > 0 && cb > ca ? cb / ca : 1.0;
    *slow_comm = aa > 0 && ab > aa ? ab / aa : 1.0;
    // the profile format caps them at 100 (beyond that the streams are
    // effectively serialized)
    if (*slow_comp > 100.0) *slow_comp = 100.0;
    if (*slow_comm > 100.0) *slow_comm = 100.0;
    if (rank == 0) {
      printf(
          "contention (executor: %d GEMMs beside %d all-to-alls of 1 MiB per rank): compute "
          "%.1f -> %.1f ms (x%.3f), all-to-all %.2f -> %.2f ms (x%.3f)\n",
          arg.gemms, n_a2a, ca * 1e3, cb * 1e3, *slow_comp, aa * 1e3, ab * 1e3, *slow_comm);
    }
  }
done:
  moe_executor_destroy(ex);
  moe_free(cnt);
  moe_free(arg.a);
  moe_free(arg.b);
  moe_free(arg.c);
  return rc;
}

// The line y = alpha + beta x through n points of `what` (an all-to-all,
// a compressor). Times that do not grow with the size (tiny sizes, noise, a
// busy machine) keep, for the line, the largest point's average cost per x
// without an intercept, with a warning. CLI_FAILED when no line fits at all.
// hint: what the user can change.
static int fit_growing(moe_ctx *ctx, const char *what, const char *hint, const double *x,
                       const double *y, int n, int rank, moe_linear_fit *fit) {
  if (moe_fit_linear(ctx, x, y, n, fit) != MOE_STATUS_OK) {
    if (rank == 0) {
      cli_error("%s: no usable fit (%s); %s", what, moe_ctx_error(ctx), hint);
    }
    return CLI_FAILED;
  }
  if (!(fit->beta > 0)) {
    if (rank == 0) {
      printf(
          "%s warning: times do not grow with the size (slope %g s per unit); the line uses the "
          "largest point's cost per unit; %s\n",
          what, fit->beta, hint);
    }
    fit->beta = y[n - 1] / x[n - 1];
    fit->alpha = 0.0;
  }
  return CLI_OK;
}

// One all-to-all algorithm over sizes min..max (doubling), uniform counts.
static int fit_a2a(moe_ctx *ctx, const cal_opts *o, int rank, const moe_group *g,
                   const moe_a2a_algo *algo, unsigned char *sbuf, unsigned char *rbuf,
                   moe_workspace *ws, moe_linear_fit *fit, double (*points)[2], int *n_points) {
  const int P = g->size;
  double x[32], y[32], t[1000];
  int n = 0;
  size_t *sc = moe_malloc(4 * (size_t)P * sizeof(size_t));
  if (!sc) {  // the others would wait in the exchanges below
    cli_error("rank %d: out of memory", rank);
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  size_t *sd = sc + P, *rc = sd + P, *rd = rc + P;
  moe_status st = MOE_STATUS_OK;
  for (long long S = o->min_bytes; S <= o->max_bytes && n < 32; S *= 2) {
    const size_t block = (size_t)S / (size_t)P;
    for (int p = 0; p < P; p++) {
      sc[p] = rc[p] = block;
      sd[p] = rd[p] = (size_t)p * block;
    }
    st = moe_a2a_run(ctx, algo, g, sbuf, sc, sd, rbuf, rc, rd, ws);  // warm-up
    for (int i = 0; i < o->iters && st == MOE_STATUS_OK; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      const uint64_t t0 = moe_time_ns();
      st = moe_a2a_run(ctx, algo, g, sbuf, sc, sd, rbuf, rc, rd, ws);
      t[i] = (double)(moe_time_ns() - t0) * 1e-9;
    }
    if (st != MOE_STATUS_OK) break;
    x[n] = (double)block * (P - 1);  // bytes one rank sends to the others
    y[n] = slowest_median(t, o->iters);
    n++;
  }
  moe_free(sc);
  if (st != MOE_STATUS_OK) {
    cli_error("rank %d: all-to-all '%s': %s", rank, algo->name, moe_ctx_error(ctx));
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);  // a collective failed midway: peers cannot recover
  }
  if (P == 1) {  // nothing leaves the rank: the time is a copy; fit it against the block size
    for (int i = 0; i < n; i++) x[i] = (double)(o->min_bytes << i);
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
  if (fit_growing(ctx, what, "widen --min-bytes/--max-bytes or calibrate on a quiet machine", x, y,
                  n, rank, fit) != CLI_OK)
    return CLI_FAILED;
  if (rank == 0) {
    printf("a2a %-9s %2d sizes, alpha %8.1f us, %8.3f GB/s sent per rank, R² %.4f\n", algo->name, n,
           fit->alpha * 1e6, 1e-9 / fit->beta, fit->r2);
  }
  return CLI_OK;
}

// One compressor: rows x 512 floats, all ranks at once.
static int fit_codec(moe_ctx *ctx, const cal_opts *o, int rank, const moe_compressor *comp,
                     moe_linear_fit *fc, moe_linear_fit *fd) {
  static const int rows[] = {64, 256, 1024, 4096};
  const size_t cols = 512, max_n = 4096 * cols;
  double x[4], yc[4], yd[4], t[1000];
  float *in = moe_malloc(max_n * sizeof(float)), *back = moe_malloc(max_n * sizeof(float));
  const size_t cap = moe_compress_max_bytes(comp, 4096, cols);
  void *buf = moe_malloc(cap);
  int ok = in && back && buf;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  int rc = CLI_OK;
  if (!ok) {
    rc = CLI_FAILED;
    goto done;
  }
  moe_rng rng;
  moe_rng_init(&rng, 11, (uint64_t)rank);
  moe_rng_fill_uniform(&rng, in, max_n, -1.0f, 1.0f);
  for (int r = 0; r < 4; r++) {
    const size_t m = (size_t)rows[r];
    size_t got = 0;
    int fail = moe_compress(comp, ctx, in, m, cols, buf, cap, &got) != MOE_STATUS_OK;
    for (int i = 0; i < o->iters && !fail; i++) {
      const uint64_t t0 = moe_time_ns();
      fail = moe_compress(comp, ctx, in, m, cols, buf, cap, &got) != MOE_STATUS_OK;
      t[i] = (double)(moe_time_ns() - t0) * 1e-9;
    }
    MPI_Allreduce(MPI_IN_PLACE, &fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (fail) {
      if (rank == 0) cli_error("compressor '%s' failed: %s", comp->name, moe_ctx_error(ctx));
      rc = CLI_FAILED;
      goto done;
    }
    yc[r] = slowest_median(t, o->iters);
    for (int i = 0; i < o->iters; i++) {
      const uint64_t t0 = moe_time_ns();
      moe_decompress(comp, ctx, buf, got, m, cols, back);
      t[i] = (double)(moe_time_ns() - t0) * 1e-9;
    }
    yd[r] = slowest_median(t, o->iters);
    x[r] = (double)(m * cols * sizeof(float));
  }
  static const char quiet[] = "calibrate again on a quiet machine";
  char what[64];
  snprintf(what, sizeof what, "compressor '%s' (compress)", comp->name);
  rc = fit_growing(ctx, what, quiet, x, yc, 4, rank, fc);
  snprintf(what, sizeof what, "compressor '%s' (decompress)", comp->name);
  if (rc == CLI_OK) rc = fit_growing(ctx, what, quiet, x, yd, 4, rank, fd);
  if (rc != CLI_OK) goto done;
  if (rank == 0) {
    printf("codec %-6s compress %7.2f GB/s (R² %.4f), decompress %7.2f GB/s (R² %.4f)\n",
           comp->name, 1e-9 / fc->beta, fc->r2, 1e-9 / fd->beta, fd->r2);
  }
done:
  moe_free(in);
  moe_free(back);
  moe_free(buf);
  return rc;
}

// Writes prof to out, complete or not at all (rank 0). *json holds the text.
static int write_profile(moe_ctx *ctx, const moe_profile *prof, char **json, cli_out *out,
                         const char *path) {
  if (moe_profile_to_json(ctx, prof, json) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    return CLI_FAILED;
  }
  fputs(*json, out->f);
  const int rc = cli_out_commit(out);
  if (rc == CLI_OK) printf("wrote %s\n", path);
  return rc;
}

// --refit: o->profile's layer corrections fitted again to the runs in
// o->refit, written to out (one process).
static int refit_profile(moe_ctx *ctx, const cal_opts *o, moe_profile *prof, char **json,
                         cli_out *out) {
  moe_layer_sample *samples = NULL;
  int n = 0, rc = CLI_OK;
  if (moe_profile_load(ctx, o->profile, prof) != MOE_STATUS_OK ||
      moe_layer_samples_load(ctx, o->refit, &samples, &n) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
  }
  if (rc == CLI_OK) {
    printf("moe calibrate --refit: %d layer runs from %s, profile %s ('%s')\n", n, o->refit,
           o->profile, prof->name);
    rc = cli_fit_layer_samples(ctx, prof, samples, n, 1, 0);
  }
  if (rc == CLI_OK) rc = write_profile(ctx, prof, json, out, o->out);
  moe_free(samples);
  return rc;
}

int cmd_calibrate(int argc, char **argv) {
  int provided = 0, rank = 0, P = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  cal_opts o;
  int rc = parse_cal(argc, argv, &o, rank);
  moe_ctx *ctx = NULL;
  moe_group g;
  memset(&g, 0, sizeof g);
  int have_group = 0;
  unsigned char *sbuf = NULL, *rbuf = NULL;
  moe_workspace ws = {0};
  moe_profile prof;
  memset(&prof, 0, sizeof prof);
  char *json = NULL;
  cli_out out = {0};
  if (rc != CLI_OK) goto done;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    rc = CLI_FAILED;
    goto done;
  }
  if (cli_out_open_root(&out, o.out, rank) != CLI_OK) {
    rc = CLI_FAILED;
    goto done;
  }
  if (o.refit) {
    if (rank == 0) rc = refit_profile(ctx, &o, &prof, &json, &out);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    goto done;
  }
  if (moe_group_init_topology(ctx, &g, MPI_COMM_WORLD, o.ranks_per_node) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("%s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  have_group = 1;
  snprintf(prof.name, sizeof prof.name, "%s", o.name ? o.name : "");
  if (!o.name) snprintf(prof.name, sizeof prof.name, "calibrated-%d", P);
  if (rank == 0) {
    printf("moe calibrate: %d rank%s on %d node%s, %d repetitions per point\n", P,
           P == 1 ? "" : "s", g.num_nodes, g.num_nodes == 1 ? "" : "s", o.iters);
  }
  rc = fit_gemm(ctx, &o, rank, &prof.gemm);
  if (rc == CLI_OK) {
    rc = fit_expert(ctx, &o, rank, &prof.expert_fwd, &prof.expert_bwd, prof.expert_points,
                    &prof.n_expert_points);
  }
  if (rc == CLI_OK) rc = fit_outside(ctx, &o, rank, &prof.outside);
  if (rc != CLI_OK) goto done;
  prof.have_layer_fits = 1;
  // all-to-all algorithms
  sbuf = moe_malloc((size_t)o.max_bytes + 1);
  rbuf = moe_malloc((size_t)o.max_bytes + 1);
  {
    int ok = sbuf && rbuf;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) {
      if (rank == 0) cli_error("cannot allocate %lld-byte all-to-all buffers", o.max_bytes);
      rc = CLI_FAILED;
      goto done;
    }
    memset(sbuf, rank & 0xff, (size_t)o.max_bytes);
  }
  {
    int na = 0;
    const moe_a2a_algo *const *algos = moe_a2a_list(&na);
    char list[256];
    snprintf(list, sizeof list, "%s", o.a2a);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
      const moe_a2a_algo *known = NULL;
      if (strcmp(tok, "all") != 0 && moe_a2a_find(ctx, tok, &known) != MOE_STATUS_OK) {
        if (rank == 0) cli_error("--a2a: %s (or all)", moe_ctx_error(ctx));
        rc = CLI_USAGE;
        goto done;
      }
      for (int i = 0; i < na; i++) {
        const int all = strcmp(tok, "all") == 0;
        if (!all && strcmp(tok, algos[i]->name) != 0) continue;
        if (algos[i]->needs_uniform_nodes && !g.uniform) {
          if (!all) {
            if (rank == 0) cli_error("--a2a: '%s' needs uniform nodes", algos[i]->name);
            rc = CLI_USAGE;
            goto done;
          }
          continue;
        }
        if (moe_profile_a2a(&prof, algos[i]->name) || prof.n_a2a >= MOE_PROFILE_MAX) continue;
        moe_named_fit *nf = &prof.a2a[prof.n_a2a];
        snprintf(nf->name, sizeof nf->name, "%s", algos[i]->name);
        rc = fit_a2a(ctx, &o, rank, &g, algos[i], sbuf, rbuf, &ws, &nf->fit,
                     prof.a2a_points[prof.n_a2a], &prof.n_a2a_points[prof.n_a2a]);
        if (rc != CLI_OK) goto done;
        prof.n_a2a++;
      }
    }
    if (prof.n_a2a == 0) {
      if (rank == 0) cli_error("--a2a '%s' leaves no algorithm that runs on this layout", o.a2a);
      rc = CLI_USAGE;
      goto done;
    }
  }
  rc = measure_overlap(ctx, &o, rank, &g, sbuf, rbuf, &ws, &prof.slow_compute, &prof.slow_comm);
  if (rc == CLI_OK) rc = measure_task_overhead(ctx, &o, rank, &prof.task_overhead);
  if (rc == CLI_OK) rc = measure_small(&o, rank, &prof.small_collective, &prof.copy_gbs);
  if (rc != CLI_OK) goto done;
  // compressors
  {
    // "all": every compressor of the catalogue compiled into this build
    char list[256] = "";
    if (strcmp(o.compress, "all") == 0) {
      int nc = 0;
      const moe_compressor_entry *const *codecs = moe_compressor_list(&nc);
      size_t used = 0;
      for (int i = 0; i < nc && used < sizeof list; i++) {
        if (!codecs[i]->available) continue;
        const int w = snprintf(list + used, sizeof list - used, "%s%s", used ? "," : "",
                               codecs[i]->codec.name);
        if (w > 0) used += (size_t)w;
      }
    } else {
      snprintf(list, sizeof list, "%s", o.compress);
    }
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
      moe_compressor comp;
      if (moe_compressor_get(ctx, tok, &comp) != MOE_STATUS_OK) {
        if (rank == 0) cli_error("--compress: %s", moe_ctx_error(ctx));
        rc = CLI_USAGE;
        goto done;
      }
      if (moe_profile_codec(&prof, comp.name, NULL, NULL) || prof.n_codec >= MOE_PROFILE_MAX) {
        continue;
      }
      const int k = prof.n_codec;
      snprintf(prof.codec_c[k].name, sizeof prof.codec_c[k].name, "%s", comp.name);
      snprintf(prof.codec_d[k].name, sizeof prof.codec_d[k].name, "%s", comp.name);
      rc = fit_codec(ctx, &o, rank, &comp, &prof.codec_c[k].fit, &prof.codec_d[k].fit);
      if (rc != CLI_OK) goto done;
      prof.n_codec++;
    }
  }
  // the description: shape from the topology, rates from the fits
  {
    moe_cluster *c = &prof.cluster;
    snprintf(c->name, sizeof c->name, "%s", prof.name);
    snprintf(c->device, sizeof c->device, "calibrated rank");
    snprintf(c->source, sizeof c->source,
             "moe calibrate: GEMM rate from the GEMM fit; both link entries from the 'mpi' "
             "all-to-all fit (effective bandwidth per rank), not per link");
    c->nodes = g.num_nodes;
    c->devices_per_node = g.uniform ? g.local_size : 1;
    if (!g.uniform) c->nodes = P;
    c->gemm_tflops = 1e-12 / prof.gemm.beta;
    const moe_linear_fit *f = moe_profile_a2a(&prof, "mpi");  // catalogue: the default
    if (!f) f = &prof.a2a[0].fit;
    const double gbit = 8e-9 / f->beta, lat = f->alpha > 0 ? f->alpha * 1e6 : 0.0;
    c->intra.gbit_per_s = c->inter.gbit_per_s = gbit;
    c->intra.latency_us = c->inter.latency_us = lat;
    snprintf(c->intra.kind, sizeof c->intra.kind, "effective (mpi fit)");
    snprintf(c->inter.kind, sizeof c->inter.kind, "effective (mpi fit)");
    c->nics_per_node = 1;
  }
  if (o.layers) {
    rc = cli_calibrate_layers(ctx, o.layers, o.ranks_per_node, o.iters, rank, P, o.samples, &prof);
    if (rc != CLI_OK) goto done;
  }
  if (rank == 0) rc = write_profile(ctx, &prof, &json, &out, o.out);
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
done:
  if (rank == 0) cli_out_abort(&out);
  moe_free(json);
  moe_free(sbuf);
  moe_free(rbuf);
  moe_workspace_free(&ws);
  if (have_group) moe_group_free(&g);
  moe_ctx_destroy(ctx);
  MPI_Finalize();
  return rc < 0 ? CLI_OK : rc;
}

#else  // !MOE_CLI_MPI

int cmd_calibrate(int argc, char **argv) {
  (void)argc;
  (void)argv;
  cli_error("calibrate needs MPI, and this moe was built without it (install libopenmpi-dev)");
  return CLI_FAILED;
}

#endif
