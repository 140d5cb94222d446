// moe calibrate's layer step: runs the expert-parallel layer itself on a few
// shapes and variants, and fits the profile's layer corrections to what it
// measured (moe_profile_fit_layer): a scale and a per-task cost for the
// expert steps and for each all-to-all algorithm (sequential r = 1, 2, 4),
// the time outside the passes, and the contention factors (optsche r=2,
// pipeline r=4 and smart of each algorithm).
#define _POSIX_C_SOURCE 200809L  // strtok_r
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moe/perf.h"

#if MOE_CLI_MPI
#include "moe/parallel.h"

enum { MAX_SHAPES = 16, MAX_VARIANTS = 6 * MOE_PROFILE_MAX };

typedef struct {
  const char *a2a, *schedule;
  int chunks;
} layer_variant;

// "T:M:H:f,..." -> configs (E = 2 x P experts, top-2, GELU). CLI_USAGE with
// the message on rank 0 for a malformed item.
static int parse_shapes(const char *text, int P, int rank, moe_layer_config *cfgs, int *n) {
  char list[512];
  *n = 0;
  if (strlen(text) >= sizeof list) {
    if (rank == 0) cli_error("--layers: the list is longer than %zu bytes", sizeof list - 1);
    return CLI_USAGE;
  }
  snprintf(list, sizeof list, "%s", text);
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    int T = 0, M = 0, H = 0, used = 0;
    double f = 0;
    if (*n >= MAX_SHAPES || sscanf(tok, "%d:%d:%d:%lf%n", &T, &M, &H, &f, &used) != 4 ||
        tok[used] != '\0' || T < 1 || T > 65536 || M < 1 || M > 16384 || H < 1 || H > 65536 ||
        !(f == 0.0 || (f >= 0.01 && f <= 64.0))) {
      if (rank == 0) {
        cli_error(
            "--layers: '%s' is not T:M:H:f (tokens per rank 1..65536, model 1..16384, hidden "
            "1..65536, capacity factor 0 = dropless or 0.01..64; at most %d items)",
            tok, MAX_SHAPES);
      }
      return CLI_USAGE;
    }
    moe_layer_config *c = &cfgs[(*n)++];
    moe_layer_config_default(c);
    c->tokens = T;
    c->model_dim = M;
    c->hidden_dim = H;
    c->num_experts = 2 * P;
    c->top_k = 2;
    c->capacity_factor = (float)f;
  }
  if (*n == 0) {
    if (rank == 0) cli_error("--layers: no shape given");
    return CLI_USAGE;
  }
  return CLI_OK;
}

moe_pass_breakdown cli_ep_pass_breakdown(const moe_ep_layer *layer, int backward) {
  const moe_task_graph *g = NULL;
  const moe_task_record *rec = NULL;
  moe_ep_layer_last_pass(layer, backward, &g, &rec);
  moe_pass_breakdown b;
  memset(&b, 0, sizeof b);
  if (g && rec) moe_pass_breakdown_compute(rec, g->n_tasks, &b);
  return b;
}

// Compute and communication busy ms and the makespan of one pass, added to the sums.
static void pass_ms(const moe_ep_layer *layer, int backward, double *comp, double *comm,
                    double *total) {
  const moe_pass_breakdown b = cli_ep_pass_breakdown(layer, backward);
  *comp += (double)b.compute_ns * 1e-6;
  *comm += (double)b.comm_ns * 1e-6;
  *total += (double)b.total_ns * 1e-6;
}

// The variants of one shape, all layers created; interleaved iterations (a
// slow phase of the machine hits every variant alike); medians of the slowest
// rank into out. CLI_OK or CLI_FAILED on every rank.
static int run_shape(moe_ctx *ctx, const moe_layer_config *cfg, const layer_variant *vs, int nv,
                     int ep, int ranks_per_node, int iters, int rank, moe_layer_sample *out) {
  int rc = CLI_OK;
  moe_ep_layer *layers[MAX_VARIANTS] = {0};
  const size_t tm = (size_t)cfg->tokens * (size_t)cfg->model_dim;
  float *x = moe_malloc(tm * sizeof(float)), *y = moe_malloc(tm * sizeof(float));
  float *dy = moe_malloc(tm * sizeof(float)), *dx = moe_malloc(tm * sizeof(float));
  double *v = moe_malloc((size_t)nv * (size_t)iters * 4 * sizeof(double));
  double col[1000];
  int ok = x && y && dy && dx && v;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (rank == 0)
      cli_error("layer step: cannot allocate the buffers of T=%d M=%d", cfg->tokens,
                cfg->model_dim);
    rc = CLI_FAILED;
    goto done;
  }
  moe_rng rng;
  moe_rng_init(&rng, 7, 100 + 2 * (uint64_t)rank);
  moe_rng_fill_uniform(&rng, x, tm, -1.0f, 1.0f);
  moe_rng_init(&rng, 7, 101 + 2 * (uint64_t)rank);
  moe_rng_fill_uniform(&rng, dy, tm, -1.0f, 1.0f);
  for (int k = 0; k < nv; k++) {
    moe_parallel_config pc;
    moe_parallel_config_default(&pc);
    pc.ep_size = ep;  // all ranks
    pc.ranks_per_node = ranks_per_node;
    snprintf(pc.a2a, sizeof pc.a2a, "%s", vs[k].a2a);
    snprintf(pc.schedule, sizeof pc.schedule, "%s", vs[k].schedule);
    pc.chunks = vs[k].chunks;
    snprintf(pc.compress, sizeof pc.compress, "none");  // catalogue: default (uncompressed)
    if (moe_ep_layer_create(ctx, MPI_COMM_WORLD, cfg, &pc, &layers[k]) != MOE_STATUS_OK) {
      if (rank == 0) cli_error("layer step: %s", moe_ctx_error(ctx));
      rc = CLI_FAILED;
      goto done;
    }
    moe_ep_layer_init_params(layers[k], 7);
  }
  for (int it = -1; it < iters; it++) {  // it = -1: warm-up
    for (int k = 0; k < nv; k++) {
      double t[4] = {0, 0, 0, 0};  // comp, comm, passes, total
      moe_ep_layer_zero_grad(layers[k]);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      moe_status st = moe_ep_layer_forward(layers[k], x, cfg->tokens, y, NULL);
      if (st == MOE_STATUS_OK) st = moe_ep_layer_backward(layers[k], dy, dx);
      t[3] = (MPI_Wtime() - t0) * 1e3;
      if (st != MOE_STATUS_OK) {  // the layer agrees on failures: every rank is here
        if (rank == 0) cli_error("layer step: %s", moe_ctx_error(ctx));
        rc = CLI_FAILED;
        goto done;
      }
      pass_ms(layers[k], 0, &t[0], &t[1], &t[2]);
      pass_ms(layers[k], 1, &t[0], &t[1], &t[2]);
      MPI_Allreduce(MPI_IN_PLACE, t, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it >= 0) memcpy(v + ((size_t)k * iters + (size_t)it) * 4, t, sizeof t);
    }
  }
  for (int k = 0; k < nv; k++) {
    moe_layer_sample *s = &out[k];
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    snprintf(s->a2a, sizeof s->a2a, "%s", vs[k].a2a);
    snprintf(s->schedule, sizeof s->schedule, "%s", vs[k].schedule);
    s->chunks = vs[k].chunks;
    double med[4];
    for (int c = 0; c < 4; c++) {
      for (int i = 0; i < iters; i++) col[i] = v[((size_t)k * iters + (size_t)i) * 4 + c];
      med[c] = cli_median(col, iters);
    }
    s->comp_ms = med[0];
    s->comm_ms = med[1];
    s->passes_ms = med[2];
    // medians of separate columns: the total's can fall a little below the
    // passes' (each iteration's total includes its passes)
    s->total_ms = med[3] > med[2] ? med[3] : med[2];
  }
done:
  for (int k = 0; k < nv; k++) moe_ep_layer_destroy(layers[k]);
  moe_free(x);
  moe_free(y);
  moe_free(dy);
  moe_free(dx);
  moe_free(v);
  return rc;
}

// Fits prof's layer corrections to n samples and prints the result on rank
// 0 (the layer step and, refit, --refit: the contention factors before the
// fit are then the earlier fit's, not the executor measurement's). CLI_OK or
// CLI_FAILED.
int cli_fit_layer_samples(moe_ctx *ctx, moe_profile *prof, const moe_layer_sample *samples, int n,
                          int refit, int rank) {
  int rc = CLI_OK;
  moe_layer_fit_report rep;
  const double sc0 = prof->slow_compute, sm0 = prof->slow_comm;
  if (moe_profile_fit_layer(ctx, prof, samples, n, &rep) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("layer step: %s", moe_ctx_error(ctx));
    return CLI_FAILED;
  }
  if (rank != 0) return rc;
  printf("layer fit over %d runs: compute x%.3f %+.1f us per task", n, prof->lf_compute_scale,
         prof->lf_compute_task_s * 1e6);
  for (int a = 0; a < prof->n_a2a; a++) {
    if (prof->lf_a2a_scale[a] > 0) {
      printf("\n  %-9s x%.3f %+.1f us per exchange", prof->a2a[a].name, prof->lf_a2a_scale[a],
             prof->lf_a2a_exchange_s[a] * 1e6);
    }
    if (prof->lf_a2a_slow[a][0] >= 1.0) {
      printf(", overlapped: compute x%.2f, comm x%.2f", prof->lf_a2a_slow[a][0],
             prof->lf_a2a_slow[a][1]);
    }
    if (prof->lf_a2a_smart_slow[a][0] >= 1.0) {
      printf("; smart: compute x%.2f, comm x%.2f", prof->lf_a2a_smart_slow[a][0],
             prof->lf_a2a_smart_slow[a][1]);
    }
  }
  printf(
      "\n  outside the passes: %.1f us + %.3f ns per T*M*(E+K), R² %.3f; contention, all "
      "algorithms: x%.2f compute, x%.2f comm (%s: x%.2f, x%.2f)\n"
      "  the layer runs' totals: MAPE %.1f%% with the micro-benchmark models alone, "
      "%.1f%% fitted (R² %.3f; in-sample)\n",
      prof->lf_outside.alpha * 1e6, prof->lf_outside.beta * 1e9, prof->lf_outside.r2,
      prof->slow_compute, prof->slow_comm, refit ? "before the refit" : "executor measurement", sc0,
      sm0, rep.mape_before, rep.mape_after, rep.r2_after);
  if (rep.outliers > 0) {
    printf(
        "  left out as outliers: %d run%s whose total the fit missed by more than %.0f%% "
        "(noise bursts)\n",
        rep.outliers, rep.outliers == 1 ? "" : "s", rep.outlier_threshold * 100.0);
  }
  if (rep.at_bound > 0) {
    printf(
        "  warning: %d correction%s hit the scale bound (x0.1 or x10): the layer runs do not "
        "look like the micro-benchmarks' tasks (one rank, tiny shapes, or a busy machine)\n",
        rep.at_bound, rep.at_bound == 1 ? "" : "s");
  }
  if (rep.r2_after < 0.8 || rep.mape_after > 15.0) {
    printf(
        "  warning: the fitted model explains the layer runs poorly (R² %.2f, MAPE %.0f%%): "
        "the machine was probably busy or noisy during calibration; run it again before "
        "trusting predictions\n",
        rep.r2_after, rep.mape_after);
  }
  return rc;
}

// Writes the layer runs to path (rank 0): complete or not at all.
int cli_write_layer_samples(moe_ctx *ctx, const char *path, const moe_layer_sample *samples,
                            int n) {
  char *json = NULL;
  cli_out out = {0};
  int rc = cli_out_open(&out, path);
  if (rc == CLI_OK && moe_layer_samples_to_json(ctx, samples, n, &json) != MOE_STATUS_OK) {
    cli_error("--samples: %s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
  }
  if (rc == CLI_OK) {
    fputs(json, out.f);
    rc = cli_out_commit(&out);
    if (rc == CLI_OK) printf("wrote the %d layer runs to %s\n", n, path);
  }
  cli_out_abort(&out);
  moe_free(json);
  return rc;
}

int cli_calibrate_layers(moe_ctx *ctx, const char *shapes, int ranks_per_node, int iters, int rank,
                         int P, const char *samples_path, moe_profile *prof) {
  moe_layer_config cfgs[MAX_SHAPES];
  int n_shapes = 0;
  int rc = parse_shapes(shapes, P, rank, cfgs, &n_shapes);
  if (rc != CLI_OK || !prof) return rc;
  layer_variant vs[MAX_VARIANTS];
  int nv = 0;
  static const int seq_chunks[] = {1, 2, 4};
  for (int a = 0; a < prof->n_a2a; a++) {
    for (int c = 0; c < 3; c++) {
      // catalogue: the fit's baseline (layer_fit.c)
      vs[nv++] = (layer_variant){prof->a2a[a].name, "sequential", seq_chunks[c]};
    }
    // the contention factors: pipelined schedules (the fit's sample set,
    // docs/performance-model.md; layer_fit.c fits smart's factors apart)
    vs[nv++] = (layer_variant){prof->a2a[a].name, "optsche", 2};   // catalogue: sample set
    vs[nv++] = (layer_variant){prof->a2a[a].name, "pipeline", 4};  // catalogue: sample set
    vs[nv++] = (layer_variant){prof->a2a[a].name, "smart", 1};     // catalogue: sample set
  }
  moe_layer_sample *samples = moe_calloc((size_t)n_shapes * (size_t)nv, sizeof *samples);
  int ok = samples != NULL;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (rank == 0) cli_error("layer step: cannot allocate %d samples", n_shapes * nv);
    moe_free(samples);
    return CLI_FAILED;
  }
  if (rank == 0) {
    printf("layer runs: %d shape%s x %d variants (E = %d, K = 2), %d repetitions\n", n_shapes,
           n_shapes == 1 ? "" : "s", nv, 2 * P, iters);
    fflush(stdout);
  }
  for (int i = 0; i < n_shapes && rc == CLI_OK; i++) {
    rc = run_shape(ctx, &cfgs[i], vs, nv, P, ranks_per_node, iters, rank, samples + (size_t)i * nv);
  }
  if (rc == CLI_OK && samples_path && rank == 0) {
    rc = cli_write_layer_samples(ctx, samples_path, samples, n_shapes * nv);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rc == CLI_OK) {
    // every rank fits (the same numbers: the samples are the slowest rank's)
    rc = cli_fit_layer_samples(ctx, prof, samples, n_shapes * nv, 0, rank);
  }
  moe_free(samples);
  return rc;
}

#endif
