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
  moe_ctx_destroy(g_ctx);
  int failures = tu_failures, all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = 0;
  if (g_rank == 0) rc = tu_finish("test_measure");
  MPI_Finalize();
  return all ? 1 : rc;
}
