// The measurement module (include/moe/measure.h) under mpirun: the layer
// harness's numbers obey the relations that hold for every iteration (a pass
// fits in its direction's wall time, a stream's busy time in its pass, the
// busy time per kind adds up to at least the stream's), every variant routes
// the same tokens (rows and dropped choices equal across schedules and
// chunks), the chunks run are the ones asked for, the task model needs a
// baseline; errors are agreed on every rank; calibration fills a profile
// that round-trips through JSON, reports on rank 0 only and refuses bad
// configs on every rank.
#define _POSIX_C_SOURCE 200809L  // getpid
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "moe/kernels.h"
#include "moe/measure_mpi.h"
#include "testutil.h"

static int g_rank, g_world;
static moe_ctx *g_ctx;
static int g_lines;  // report lines this rank received

static void count_line(void *user, const char *line) {
  (void)user;
  (void)line;
  g_lines++;
}

static moe_measure_variant variant(const char *schedule, int chunks, int baseline) {
  moe_measure_variant v;
  memset(&v, 0, sizeof v);
  moe_parallel_config_default(&v.pc);
  snprintf(v.pc.schedule, sizeof v.pc.schedule, "%s", schedule);
  v.pc.chunks = chunks;
  v.baseline = baseline;
  return v;
}

static void test_layer_runs(void) {
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = 96;
  cfg.model_dim = 32;
  cfg.hidden_dim = 64;
  cfg.num_experts = 2 * g_world;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0f;  // some choices are dropped
  moe_measure_variant v[4] = {variant("sequential", 1, 0), variant("sequential", 2, 0),
                              variant("pipeline", 3, 0), variant("optsche", 2, -1)};
  moe_measure_config mc = moe_measure_config_default();
  mc.iters = 1;  // the relations below then hold for the reported numbers exactly
  mc.warmup = 1;
  mc.seed = 11;
  char trace[256];
  snprintf(trace, sizeof trace, "/tmp/moe_test_measure_%d.json", (int)getpid());
  mc.trace_path = trace;
  moe_measure_result r[4];
  const moe_status st = moe_measure_layer_variants(g_ctx, MPI_COMM_WORLD, &cfg, v, 4, &mc, r);
  TU_CHECK(st == MOE_STATUS_OK, "harness: %s", moe_ctx_error(g_ctx));
  if (st != MOE_STATUS_OK) return;
  const long long choices = (long long)cfg.tokens * cfg.top_k * g_world;
  for (int k = 0; k < 4; k++) {
    const moe_measure_result *m = &r[k];
    TU_CHECK(m->fwd_ms > 0 && m->bwd_ms > 0 && m->total_ms >= m->fwd_ms, "variant %d times", k);
    TU_CHECK(m->fwd_pass[4] <= m->fwd_ms && m->bwd_pass[4] <= m->bwd_ms,
             "variant %d: a pass (%g, %g ms) longer than its direction (%g, %g ms)", k,
             m->fwd_pass[4], m->bwd_pass[4], m->fwd_ms, m->bwd_ms);
    for (int d = 0; d < 2; d++) {
      const double *p = d ? m->bwd_pass : m->fwd_pass;
      TU_CHECK(p[0] <= p[4] * (1 + 1e-12) && p[1] <= p[4] * (1 + 1e-12),
               "variant %d dir %d: busy compute %g / comm %g beyond the pass %g", k, d, p[0], p[1],
               p[4]);
      const double compute_kinds = m->kind_ms[d][MOE_CT_C1] + m->kind_ms[d][MOE_CT_D1] +
                                   m->kind_ms[d][MOE_CT_E] + m->kind_ms[d][MOE_CT_C2] +
                                   m->kind_ms[d][MOE_CT_D2];
      const double comm_kinds = m->kind_ms[d][MOE_CT_A1] + m->kind_ms[d][MOE_CT_A2];
      // per kind the slowest rank, per stream the slowest rank's sum: >=
      TU_CHECK(compute_kinds >= p[0] * (1 - 1e-9) && comm_kinds >= p[1] * (1 - 1e-9),
               "variant %d dir %d: kinds %g/%g below the streams' busy %g/%g", k, d, compute_kinds,
               comm_kinds, p[0], p[1]);
    }
    TU_CHECK(m->comp_sum_ms >= m->fwd_pass[0] * (1 - 1e-9) - 1e-9 &&
                 m->passes_sum_ms >= m->fwd_pass[4] * (1 - 1e-9) - 1e-9,
             "variant %d: per-iteration sums below a pass", k);
    TU_CHECK(m->rows + m->dropped == choices, "variant %d: rows %lld + dropped %lld != %lld", k,
             m->rows, m->dropped, choices);
    TU_CHECK(m->rows == r[0].rows && m->dropped == r[0].dropped,
             "variant %d routes differently: rows %lld dropped %lld vs %lld %lld", k, m->rows,
             m->dropped, r[0].rows, r[0].dropped);
    TU_CHECK(m->total_q1 <= m->total_ms && m->total_ms <= m->total_q3, "variant %d quartiles", k);
  }
  TU_CHECK(r[0].chunks == 1 && r[1].chunks == 2 && r[2].chunks == 3 && r[3].chunks == 2,
           "chunks run: %d %d %d %d", r[0].chunks, r[1].chunks, r[2].chunks, r[3].chunks);
  TU_CHECK(isfinite(r[0].model_ms) && r[0].model_ms > 0 && isfinite(r[2].model_ms) &&
               isnan(r[3].model_ms),
           "task model: %g %g %g (the last has no baseline)", r[0].model_ms, r[2].model_ms,
           r[3].model_ms);
  if (g_rank == 0) {
    FILE *f = fopen(trace, "r");
    char head[64] = "";
    if (f) {
      const size_t n = fread(head, 1, sizeof head - 1, f);
      head[n] = '\0';
      fclose(f);
    }
    TU_CHECK(strstr(head, "traceEvents") != NULL, "trace %s: '%s'", trace, head);
    remove(trace);
  }
  // errors on every rank
  moe_measure_variant bad[2] = {variant("sequential", 1, 0), variant("sequential", 1, 0)};
  snprintf(bad[1].pc.a2a, sizeof bad[1].pc.a2a, "no-such-a2a");
  mc.trace_path = NULL;
  TU_CHECK(moe_measure_layer_variants(g_ctx, MPI_COMM_WORLD, &cfg, bad, 2, &mc, r) ==
                   MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "no-such-a2a"),
           "unknown a2a: %s", moe_ctx_error(g_ctx));
  bad[1] = variant("sequential", 1, 1);
  bad[0].baseline = 1;
  TU_CHECK(moe_measure_layer_variants(g_ctx, MPI_COMM_WORLD, &cfg, bad, 2, &mc, r) ==
                   MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "baseline"),
           "baseline after its variant: %s", moe_ctx_error(g_ctx));
  mc.iters = 0;
  TU_CHECK(moe_measure_layer_variants(g_ctx, MPI_COMM_WORLD, &cfg, v, 1, &mc, r) ==
               MOE_STATUS_INVALID_ARG,
           "iters 0");
}

static void test_calibrate(void) {
  moe_calibrate_config c = moe_calibrate_config_default();
  c.a2a = "mpi";
  c.compress = "none,int8";
  c.min_bytes = 4096;
  c.max_bytes = 65536;
  c.iters = 1;
  c.layers = "64:32:64:0,128:32:64:0";
  c.log = count_line;
  moe_profile prof;
  moe_layer_sample *samples = NULL;
  int n = 0;
  g_lines = 0;
  const moe_status st = moe_calibrate(g_ctx, MPI_COMM_WORLD, &c, &prof, &samples, &n);
  TU_CHECK(st == MOE_STATUS_OK, "calibrate: %s", moe_ctx_error(g_ctx));
  if (st == MOE_STATUS_OK) {
    TU_CHECK(prof.n_a2a == 1 && strcmp(prof.a2a[0].name, "mpi") == 0 && prof.n_codec == 2,
             "profile holds %d a2a, %d codecs", prof.n_a2a, prof.n_codec);
    TU_CHECK(moe_cluster_devices(&prof.cluster) == g_world, "devices %d",
             moe_cluster_devices(&prof.cluster));
    TU_CHECK(prof.gemm.beta > 0 && prof.task_overhead > 0 && prof.slow_compute >= 1.0 &&
                 prof.layer_fit.have,
             "fits: gemm beta %g, overhead %g, slowdown %g, layer fit %d", prof.gemm.beta,
             prof.task_overhead, prof.slow_compute, prof.layer_fit.have);
    TU_CHECK(n == 2 * 6 && samples && samples[0].total_ms >= samples[0].passes_ms, "%d layer runs",
             n);
    char *json = NULL;
    moe_profile back;
    TU_CHECK(moe_profile_to_json(g_ctx, &prof, &json) == MOE_STATUS_OK &&
                 moe_profile_from_json(g_ctx, json, &back) == MOE_STATUS_OK,
             "profile round trip: %s", moe_ctx_error(g_ctx));
    moe_free(json);
    // the report goes to rank 0 only
    TU_CHECK(g_rank == 0 ? g_lines > 10 : g_lines == 0, "rank %d got %d report lines", g_rank,
             g_lines);
  }
  moe_free(samples);
  // refused on every rank, before measuring
  c.layers = "64:32";
  TU_CHECK(moe_calibrate(g_ctx, MPI_COMM_WORLD, &c, &prof, NULL, NULL) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "layers: '64:32' is not T:M:H:f"),
           "bad shape: %s", moe_ctx_error(g_ctx));
  c.layers = NULL;
  c.max_bytes = 8192;
  TU_CHECK(moe_calibrate(g_ctx, MPI_COMM_WORLD, &c, &prof, NULL, NULL) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "at least 4 x min"),
           "sizes: %s", moe_ctx_error(g_ctx));
  c.max_bytes = 65536;
  c.a2a = "no-such-a2a";
  TU_CHECK(moe_calibrate(g_ctx, MPI_COMM_WORLD, &c, &prof, NULL, NULL) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "no-such-a2a"),
           "unknown a2a: %s", moe_ctx_error(g_ctx));
}

// moe bench parm's grid helpers on hand-made rows: the layouts, the fitted
// range, the judge (quartiles apart or noise, Algorithm 1 on given terms) and
// the summary's speedups, score and worst s2 difference.
static void test_parm_grid(void) {
  int lay[4][3];
  TU_CHECK(moe_parm_grid_default_layouts(4, lay) == 4 && lay[0][1] == 4 && lay[3][0] == 2 &&
               lay[3][1] == 1 && lay[3][2] == 2,
           "4 ranks: 1x4x1 .. 2x1x2");
  TU_CHECK(moe_parm_grid_default_layouts(3, lay) == 1 && lay[0][0] == 1 && lay[0][1] == 3,
           "3 ranks: 1x3x1 only");
  moe_parm_grid_row rows[3];
  memset(rows, 0, sizeof rows);
  for (int i = 0; i < 3; i++) {
    moe_layer_config_default(&rows[i].cfg);
    moe_parm_config_default(&rows[i].pc);
    rows[i].cfg.top_k = 2;
    rows[i].pc.mp = 2;
    rows[i].pc.ep = 2;
    rows[i].pc.esp = 1;
    rows[i].layout = i < 2 ? 0 : 1;
    for (int v = 0; v < MOE_PARM_RUNS; v++) {  // baseline 10 ms, s1 5, s2 4, s2+saa 4
      moe_parm_run_result *r = &rows[i].r[v];
      r->total_ms = v == 0 ? 10 : v == 1 ? 5 : 4;
      r->total_q1 = r->total_ms - 0.4;
      r->total_q3 = r->total_ms + 0.4;
      r->max_rel_diff = 1e-7 * v;
    }
  }
  rows[0].cfg.tokens = 100;
  rows[0].cfg.model_dim = 64;
  rows[0].cfg.capacity_factor = 0;  // dropless: f = 1
  rows[1].cfg.tokens = 400;
  rows[1].cfg.model_dim = 128;
  rows[1].cfg.capacity_factor = 1.5;
  int lo, hi, width;
  moe_parm_grid_ab_range(rows, 3, 0, &lo, &hi, &width);
  // 2 x 100 / (2 x 2) = 50 rows; 1.5 x 2 x 400 / 4 = 300
  TU_CHECK(lo == 50 && hi == 300 && width == 128, "range %d..%d width %d", lo, hi, width);
  rows[1].cfg = rows[0].cfg;
  moe_parm_grid_ab_range(rows, 3, 0, &lo, &hi, &width);
  TU_CHECK(lo == 50 && hi == 100 && width == 64, "one size: %d..%d (twice the low end)", lo, hi);

  moe_parm_alpha_beta ab = {1e-4, 1e-9, 1e-4, 1e-9, 1e-4, 1e-9};
  moe_parm_grid_judge(&rows[0], &ab);
  double t1, t2;
  const moe_parm_schedule want = moe_parm_pick(&ab, &rows[0].cfg, &rows[0].pc, &t1, &t2);
  TU_CHECK(rows[0].alg1 == (int)want && rows[0].t1_ms == t1 && rows[0].t2_ms == t2,
           "judge runs Algorithm 1 on the row");
  TU_CHECK(rows[0].faster == MOE_PARM_S2, "s2+saa (3.6-4.4 ms) apart from s1 (4.6-5.4 ms): %d",
           rows[0].faster);
  TU_CHECK(fabs(rows[0].max_diff - 3e-7) < 1e-12, "max diff %g", rows[0].max_diff);
  rows[1].r[MOE_PARM_RUN_S1].total_q1 = 3.0;  // quartile ranges overlap: noise
  moe_parm_grid_judge(&rows[1], &ab);
  TU_CHECK(rows[1].faster == -1, "overlapping quartiles are noise: %d", rows[1].faster);
  rows[2].r[MOE_PARM_RUN_S1].total_ms = 2;
  rows[2].r[MOE_PARM_RUN_S1].total_q1 = 1.5;
  rows[2].r[MOE_PARM_RUN_S1].total_q3 = 2.5;
  moe_parm_grid_judge(&rows[2], &ab);
  TU_CHECK(rows[2].faster == MOE_PARM_S1, "s1 faster: %d", rows[2].faster);
  rows[2].alg1 = MOE_PARM_S1;
  rows[0].alg1 = MOE_PARM_S1;  // wrong on purpose
  moe_parm_grid_summary sum;
  moe_parm_grid_summarize(rows, 3, &sum);
  TU_CHECK(sum.judged == 2 && sum.right == 1 && sum.noise == 1, "score %d of %d, %d noise",
           sum.right, sum.judged, sum.noise);
  TU_CHECK(sum.lo[0] == 2 && sum.hi[0] == 5 && sum.lo[1] == 2.5 && sum.hi[2] == 2.5,
           "speedups s1 %g-%g s2 %g-%g", sum.lo[0], sum.hi[0], sum.lo[1], sum.hi[1]);
  TU_CHECK(fabs(sum.worst_s2 - 3e-7) < 1e-12, "worst s2 difference %g (s1's not counted)",
           sum.worst_s2);
  rows[1].pc.mp = 1;  // s1 and s2 are one schedule: not judged
  moe_parm_grid_summarize(rows, 3, &sum);
  TU_CHECK(sum.judged == 2 && sum.noise == 0, "MP 1 rows are not judged");
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  int provided = 0;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  moe_log_set_level(MOE_LOG_ERROR);
  moe_blas_set_threads(1);
  moe_ctx_create(&g_ctx);
  test_layer_runs();
  test_calibrate();
  test_parm_grid();
  moe_ctx_destroy(g_ctx);
  int failures = tu_failures, all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = 0;
  if (g_rank == 0) rc = tu_finish("test_measure");
  MPI_Finalize();
  return all ? 1 : rc;
}
