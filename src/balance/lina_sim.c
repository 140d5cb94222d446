// Lina's inference scheduling (ATC'23 section 5) replayed on a described
// cluster (include/moe/balance.h, `moe simulate --lina`): for every line of
// a serving routing trace (moe generate / moe serve --routing-trace with
// --paths: a MoE block's actual rows per expert in one step and the
// popularity its path profile estimated before the gate), the devices each
// expert gets under Lina's allocation (eq. 1, first-fit-decreasing packing)
// from the actual popularity (ideal), from the estimate (phase 1), and from
// the estimate corrected by phase 2 (re-planned from the actual popularity,
// blocking, when the top-2K experts missed), next to a static block
// placement, each timed by one closed-form model of the layer's forward.
//
// Not here: the engine's own placement (src/infer/engine.c, on the copy
// mechanism of the expert-parallel layer); Lina assumes every device can
// serve every expert (inference: the parameters resident), which this
// replay assumes too.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/balance.h"
#include "moe/paths.h"

typedef struct {
  double n;
  int e;
} lina_item;

// n descending, then expert ascending
static int by_n_desc(const void *a, const void *b) {
  const lina_item *x = a, *y = b;
  if (x->n != y->n) return x->n > y->n ? -1 : 1;
  return (x->e > y->e) - (x->e < y->e);
}

// The device of least load, then fewest experts, then lowest index, among
// those with fewer than room experts; -1 when none.
static int least_loaded(const double *load, const int *cnt, int D, int room) {
  int at = -1;
  for (int d = 0; d < D; d++) {
    if (cnt[d] >= room) continue;
    if (at < 0 || load[d] < load[at] || (load[d] == load[at] && cnt[d] < cnt[at])) at = d;
  }
  return at;
}

moe_status moe_lina_allocate(moe_ctx *ctx, const double *pop, int E, int D, int max_pack,
                             uint8_t *on) {
  moe_status st = MOE_STATUS_OK;
  lina_item *it = NULL;
  double *load = NULL;
  int *cnt = NULL;
  MOE_FAIL_IF(ctx, !pop || !on || E < 1 || D < 1 || E > 65536 || D > 65536, MOE_STATUS_INVALID_ARG,
              "lina allocate: popularity and output needed, experts (%d) and devices (%d) in "
              "[1, 65536]",
              E, D);
  MOE_FAIL_IF(ctx, max_pack < 1 || (double)max_pack * D < E, MOE_STATUS_INVALID_ARG,
              "lina allocate: at most %d experts a device cannot hold %d experts on %d devices "
              "(need >= %d)",
              max_pack, E, D, (E + D - 1) / D);
  double sum = 0;
  for (int e = 0; e < E; e++) {
    MOE_FAIL_IF(ctx, !(pop[e] >= 0) || !isfinite(pop[e]), MOE_STATUS_INVALID_ARG,
                "lina allocate: popularity of expert %d (%g) must be finite and >= 0", e, pop[e]);
    sum += pop[e];
  }
  it = moe_malloc((size_t)E * sizeof *it);
  load = moe_calloc((size_t)D, sizeof(double));
  cnt = moe_calloc((size_t)D, sizeof(int));
  MOE_FAIL_IF(ctx, !it || !load || !cnt, MOE_STATUS_OUT_OF_MEMORY, "lina allocate: out of memory");
  memset(on, 0, (size_t)E * (size_t)D);
  for (int e = 0; e < E; e++) {  // eq. 1: n_e = N x share (the expected devices)
    it[e].n = sum > 0 ? (double)D * pop[e] / sum : 0.0;
    it[e].e = e;
  }
  qsort(it, (size_t)E, sizeof *it, by_n_desc);
  int popular = 0;
  while (popular < E && it[popular].n >= 1.0) popular++;
  // the popular experts, n_e >= 1: round(n_e) devices of their own, at
  // least one each, leaving one for every popular expert after it
  int next = 0;
  for (int k = 0; k < popular; k++) {
    const int left = D - next - (popular - k - 1);
    int d = (int)floor(it[k].n + 0.5);
    d = d < 1 ? 1 : d > left ? left : d;
    for (int j = 0; j < d; j++, next++) {
      on[(size_t)it[k].e * D + next] = 1;
      load[next] = it[k].n / d;
      cnt[next] = 1;
    }
  }
  // the rest, n_e < 1, first-fit-decreasing on the free devices (capacity 1
  // in units of n, at most max_pack experts each); one that fits nowhere
  // (and experts nobody chose) goes to the device of least load, then fewest
  // experts, then lowest index, with room [R: Lina says "a random device"]
  for (int k = popular; k < E; k++) {
    const int e = it[k].e;
    int at = -1;
    if (it[k].n > 0)
      for (int d = next; d < D && at < 0; d++)
        if (cnt[d] < max_pack && load[d] + it[k].n <= 1.0 + 1e-12) at = d;
    // no fit: the least loaded device with room; when the popular experts'
    // devices left none, the least loaded of all (max_pack exceeded)
    if (at < 0) at = least_loaded(load, cnt, D, max_pack);
    if (at < 0) at = least_loaded(load, cnt, D, INT_MAX);
    on[(size_t)e * D + at] = 1;
    load[at] += it[k].n;
    cnt[at]++;
  }
done:
  moe_free(it);
  moe_free(load);
  moe_free(cnt);
  return st;
}

double moe_lina_layer_ms(const uint8_t *on, const double *rows, int E, int D,
                         double rows_per_device, const moe_balance_cost *cost) {
  double most = 0;
  for (int d = 0; d < D; d++) {
    double l = 0;
    for (int e = 0; e < E; e++) {
      if (!on[(size_t)e * D + d]) continue;
      int de = 0;
      for (int q = 0; q < D; q++) de += on[(size_t)e * D + q];
      l += rows[e] / de;
    }
    most = l > most ? l : most;
  }
  const double M = cost->model_dim, H = cost->hidden_dim;
  const double comp = most * 4.0 * M * H / cost->flops_per_s;
  const double moved = (most > rows_per_device ? most : rows_per_device) * (1.0 - 1.0 / D);
  const double a2a = moved * M * cost->act_bytes / cost->net_bytes_per_s;
  return 1e3 * (comp + 2.0 * a2a);
}

// The static placement: E / D experts per device (block), or each expert on
// D / E devices; INVALID_ARG when neither divides the other.
static moe_status uniform_on(moe_ctx *ctx, int E, int D, uint8_t *on) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, E % D != 0 && D % E != 0, MOE_STATUS_INVALID_ARG,
              "lina simulate: the static placement needs experts (%d) divisible by the devices "
              "(%d) or the devices by the experts",
              E, D);
  memset(on, 0, (size_t)E * (size_t)D);
  for (int e = 0; e < E; e++) {
    if (E % D == 0) {
      on[(size_t)e * D + e / (E / D)] = 1;
    } else {
      for (int j = 0; j < D / E; j++) on[(size_t)e * D + e * (D / E) + j] = 1;
    }
  }
done:
  return st;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// The q-quantile (nearest rank) of n values (sorted in place).
static double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int k = (int)ceil(q * n) - 1;
  k = k < 0 ? 0 : k >= n ? n - 1 : k;
  return v[k];
}

void moe_lina_sim_config_default(moe_lina_sim_config *c) {
  memset(c, 0, sizeof *c);
  c->tokens = 1024;
  c->model_dim = 1024;
  c->hidden_dim = 4096;
  c->act_bytes = 2;
  c->max_pack = 4;
  c->replan_ms = -1;
  c->check_ms = -1;
  c->from_block = 0;
}

moe_status moe_lina_simulate(moe_ctx *ctx, const moe_cluster *cl, const moe_lina_sim_config *c,
                             const moe_routing_trace_data *tr, moe_lina_sim_result *out) {
  moe_status st = MOE_STATUS_OK;
  uint8_t *on = NULL, *uni = NULL;
  double *ms = NULL, *share = NULL;
  MOE_FAIL_IF(ctx, !cl || !c || !tr || !out, MOE_STATUS_INVALID_ARG,
              "lina simulate: cluster, config, trace and output must be given");
  memset(out, 0, sizeof *out);
  const int D = moe_cluster_devices(cl), E = tr->experts, K = tr->top_k;
  MOE_FAIL_IF(ctx,
              c->tokens < 1 || c->tokens > (1 << 24) || c->model_dim < 1 || c->hidden_dim < 1 ||
                  c->act_bytes < 1 || c->act_bytes > 8,
              MOE_STATUS_INVALID_ARG,
              "lina simulate: tokens (%d) in [1, 2^24], model and hidden dims >= 1, activation "
              "bytes (%d) in [1, 8]",
              c->tokens, c->act_bytes);
  MOE_FAIL_IF(ctx, c->from_block < 0, MOE_STATUS_INVALID_ARG,
              "lina simulate: from_block (%d) must be >= 0", c->from_block);
  MOE_FAIL_IF(ctx, E < 1 || K < 1 || tr->n < 1, MOE_STATUS_INVALID_ARG,
              "lina simulate: the trace has no lines");
  MOE_FAIL_IF(ctx, tr->with_estimate == 0, MOE_STATUS_INVALID_ARG,
              "lina simulate: the trace holds no estimates (record it with --paths FILE and "
              "--routing-trace FILE)");
  on = moe_malloc((size_t)E * (size_t)D);
  uni = moe_malloc((size_t)E * (size_t)D);
  ms = moe_malloc((size_t)MOE_LINA_SCENARIOS * (size_t)tr->n * sizeof(double));
  share = moe_malloc(2 * (size_t)E * sizeof(double));
  MOE_FAIL_IF(ctx, !on || !uni || !ms || !share, MOE_STATUS_OUT_OF_MEMORY,
              "lina simulate: out of memory");
  MOE_TRY(uniform_on(ctx, E, D, uni));
  moe_balance_cost cost;
  moe_balance_cost_of_cluster(cl, c->model_dim, c->hidden_dim, &cost);
  cost.act_bytes = c->act_bytes;
  // the small collectives of the two phases (estimates and the actual
  // popularity: D x E doubles) when not given: log2 D latency rounds plus the bytes
  const double lat_ms = (cl->nodes > 1 ? cl->inter.latency_us : cl->intra.latency_us) * 1e-3;
  const double coll_ms =
      ceil(log2((double)D)) * lat_ms + 1e3 * (double)D * E * 8.0 / cost.net_bytes_per_s;
  out->check_ms = c->check_ms >= 0 ? c->check_ms : coll_ms;
  out->replan_ms = c->replan_ms >= 0 ? c->replan_ms : coll_ms;
  out->devices = D;
  const double R = (double)D * c->tokens * K;  // rows per step on the cluster
  int n = 0, accurate = 0, missed = 0;
  for (int i = 0; i < tr->n; i++) {
    const double *rows = tr->rows + (size_t)i * E, *est = tr->estimate + (size_t)i * E;
    if (isnan(est[0])) continue;
    int block = 0;  // the line's MoE block: its layer's index in the header's list
    while (block < tr->n_layers && tr->layers[block] != tr->layer[i]) block++;
    if (block < c->from_block) continue;
    double tot = 0, etot = 0;
    for (int e = 0; e < E; e++) tot += rows[e], etot += est[e];
    if (!(tot > 0)) continue;
    for (int e = 0; e < E; e++) {
      share[e] = R * rows[e] / tot;  // actual rows on the cluster
      share[E + e] = etot > 0 ? est[e] : 1.0;
    }
    double *t = ms + (size_t)n * MOE_LINA_SCENARIOS;
    MOE_TRY(moe_lina_allocate(ctx, share, E, D, c->max_pack, on));
    t[MOE_LINA_IDEAL] = moe_lina_layer_ms(on, share, E, D, c->tokens * (double)K, &cost);
    t[MOE_LINA_UNIFORM] = moe_lina_layer_ms(uni, share, E, D, c->tokens * (double)K, &cost);
    MOE_TRY(moe_lina_allocate(ctx, share + E, E, D, c->max_pack, on));
    t[MOE_LINA_PHASE1] = moe_lina_layer_ms(on, share, E, D, c->tokens * (double)K, &cost);
    int ordered = 0, same = 0;
    moe_path_compare(est, rows, E, 2 * K, &ordered, &same);
    accurate += ordered;
    missed += !same;
    // phase 2: the check always; a miss re-plans from the actual popularity
    t[MOE_LINA_TWO_PHASE] = same ? t[MOE_LINA_PHASE1] + out->check_ms
                                 : t[MOE_LINA_IDEAL] + out->check_ms + out->replan_ms;
    n++;
  }
  MOE_FAIL_IF(ctx, n == 0, MOE_STATUS_INVALID_ARG,
              "lina simulate: no line with an estimate and rows from MoE block %d on",
              c->from_block);
  out->samples = n;
  out->accuracy = (double)accurate / n;
  out->finetune = (double)missed / n;
  {
    double *v = share;  // reuse as scratch when n <= 2E, else a buffer
    double *buf = n > 2 * E ? moe_malloc((size_t)n * sizeof(double)) : NULL;
    MOE_FAIL_IF(ctx, n > 2 * E && !buf, MOE_STATUS_OUT_OF_MEMORY, "lina simulate: out of memory");
    if (buf) v = buf;
    for (int s = 0; s < MOE_LINA_SCENARIOS; s++) {
      for (int i = 0; i < n; i++) v[i] = ms[(size_t)i * MOE_LINA_SCENARIOS + s];
      out->p50[s] = quantile(v, n, 0.5);
      out->p95[s] = quantile(v, n, 0.95);
    }
    moe_free(buf);
  }
done:
  moe_free(on);
  moe_free(uni);
  moe_free(ms);
  moe_free(share);
  return st;
}
