// The layer-variant harness (moe_measure_layer_variants): creates the
// expert-parallel layer of every variant, runs them interleaved, and reduces
// what each iteration measured (wall times, the passes' busy-time breakdown,
// busy time per task kind) to the slowest rank's medians; ScheMoE's task
// model of every variant from its baseline's per-kind times. `moe bench
// layer` prints these numbers and calibration's layer step fits on them.
//
// Not here: choosing variants, printing, derived ratios (the callers').
#include "moe_build_config.h"
#if MOE_HAVE_MPI  // the whole file: collective measurements

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "measure_internal.h"
#include "moe/measure_mpi.h"

// Per iteration: fwd, bwd, total ms; fwd pass (5); bwd pass (5); the sums of
// both passes' compute, comm and makespans; busy ms per kind, fwd and bwd.
#define N_BASE 15
#define N_SUMS 3
#define N_COLS (N_BASE + N_SUMS + 2 * MOE_CT_KINDS)
#define COL_SUMS N_BASE
#define COL_KINDS (N_BASE + N_SUMS)

// out5 = compute, comm, overlap, exposed comm, makespan (ms) of the last pass.
static void breakdown_ms(const moe_ep_layer *layer, int backward, double *out5,
                         uint64_t *total_ns) {
  const moe_task_graph *g = NULL;
  const moe_task_record *rec = NULL;
  moe_ep_layer_last_pass(layer, backward, &g, &rec);
  moe_pass_breakdown b;
  memset(&b, 0, sizeof b);
  if (g && rec) moe_pass_breakdown_compute(rec, g->n_tasks, &b);
  out5[0] = (double)b.compute_ns / 1e6;
  out5[1] = (double)b.comm_ns / 1e6;
  out5[2] = (double)b.overlap_ns / 1e6;
  out5[3] = (double)b.exposed_comm_ns / 1e6;
  out5[4] = (double)b.total_ns / 1e6;
  if (total_ns) *total_ns = b.total_ns;
}

// out (MOE_CT_KINDS) = busy ms of each task kind in the last pass of one direction.
static void kind_ms(const moe_ep_layer *layer, int backward, double *out) {
  const moe_task_graph *g = NULL;
  const moe_task_record *rec = NULL;
  moe_ep_layer_last_pass(layer, backward, &g, &rec);
  for (int k = 0; k < MOE_CT_KINDS; k++) out[k] = 0.0;
  for (int i = 0; g && rec && i < g->n_tasks; i++) {
    const int k = g->tasks[i].kind;  // a moe_chunk_task, or -1
    if (k >= 0 && rec[i].ran) out[k] += (double)(rec[i].end_ns - rec[i].start_ns) / 1e6;
  }
}

// The model makespan (ms) of one pass of this layer: its graph and schedule
// simulated with the baseline's per-kind times divided by the chunks.
static double model_pass_ms(moe_ctx *ctx, const moe_ep_layer *layer, int backward,
                            const double *base_kind_ms, int chunks) {
  const moe_task_graph *g = NULL;
  const moe_task_record *rec = NULL;
  moe_ep_layer_last_pass(layer, backward, &g, &rec);
  const moe_schedule *s = moe_ep_layer_schedule(layer, backward);
  if (!g || !s || chunks < 1) return NAN;
  double *dur = moe_malloc((size_t)g->n_tasks * sizeof *dur), m = NAN;
  if (!dur) return NAN;
  for (int i = 0; i < g->n_tasks; i++) {
    const int k = g->tasks[i].kind;  // a moe_chunk_task, or -1
    dur[i] = k >= 0 ? base_kind_ms[k] / chunks : 0.0;
  }
  if (moe_schedule_simulate(ctx, g, s, dur, NULL, &m) != MOE_STATUS_OK) m = NAN;
  moe_free(dur);
  return m;
}

typedef struct {
  float *x, *y, *dy, *dx;
} buffers;

// A variant's load balancing: its balancer, the load and placement tables.
typedef struct {
  moe_balancer *b;
  int64_t *load;     // (EP, E)
  uint8_t *replica;  // (E, EP)
  int copies;
  moe_balance_step_info plan;  // the last step that planned (predictions NAN before one)
  moe_balance_cost cost;       // the rates set (measured) for the plans
  int have_cost;               // the rates are set (given, or measured on the first iteration)
} balancing;

// The last iteration's load, the next placement, posting its Trans; *ms the
// wall time (the Trans not hidden is read after the forward that completes it).
static moe_status balance_step(moe_ctx *ctx, MPI_Comm comm, moe_ep_layer *layer, balancing *bal,
                               double *ms) {
  moe_status st = MOE_STATUS_OK;
  const uint64_t t0 = moe_time_ns();
  moe_balance_step_info info;
  MOE_TRY(moe_ep_layer_load(layer, bal->load));
  MOE_TRY(moe_comm_agree(ctx, comm, moe_balancer_step(bal->b, bal->load, bal->replica, &info),
                         "the balancing plan"));
  MOE_TRY(moe_ep_layer_set_placement(layer, bal->replica));
  bal->copies = info.copies;
  if (info.planned) {
    bal->plan = info;
  }
  *ms = moe_time_ms_since(t0);
done:
  return st;
}

// After the first round (every variant ran once, without copies): the rates
// of the variants whose balancer has none given, measured on each of them
// (moe_ep_layer_rates), and their medians given to all of them. One round's
// rates move by tens of percent between variants, and the policies are then
// compared under the same machine.
static moe_status set_rates(moe_ctx *ctx, const moe_layer_config *cfg, MPI_Comm comm,
                            const moe_measure_variant *variants, moe_ep_layer **layers,
                            balancing *bals, int n) {
  moe_status st = MOE_STATUS_OK;
  double *f = moe_malloc(2 * (size_t)n * sizeof *f), *w = f ? f + n : NULL;
  MOE_TRY(moe_comm_agree(ctx, comm,
                         f ? MOE_STATUS_OK
                           : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                          "measure: cannot allocate %d variants' rates", n),
                         "measure: rates"));
  {
    int nf = 0, nw = 0, first = -1;
    for (int k = 0; k < n; k++) {
      if (!bals[k].b || bals[k].have_cost) continue;
      double fk = 0, wk = 0;
      MOE_TRY(moe_ep_layer_rates(layers[k], &fk, &wk));
      if (fk > 0) f[nf++] = fk;
      if (wk > 0) w[nw++] = wk;
      if (first < 0) first = k;
    }
    if (first < 0) goto done;
    const double fm = nf ? moe_median(f, nf) : 0.0;  // sorts
    const double wm = nw ? moe_median(w, nw) : 0.0;
    for (int k = first; k < n; k++) {
      if (!bals[k].b || bals[k].have_cost) continue;
      moe_balance_config bc = variants[k].balance;  // its cost, measured
      if (!(bc.cost.flops_per_s > 0))
        moe_balance_cost_default(&bc.cost, cfg->model_dim, cfg->hidden_dim);
      if (fm > 0) bc.cost.flops_per_s = fm;
      if (wm > 0) bc.cost.net_bytes_per_s = wm;
      // the rate is the off-node one when the group spans nodes: charge what
      // crosses them (moe_balance_cost.ranks_per_node); the variant's own
      // layout and cores (collective: the same k on every rank)
      MOE_TRY(moe_ep_layer_ranks_per_node(layers[k], &bc.cost.ranks_per_node));
      MOE_TRY(moe_ep_layer_compute_slots(layers[k], &bc.cost.compute_slots));
      MOE_TRY(moe_comm_agree(ctx, comm, moe_balancer_set_cost(bals[k].b, &bc.cost),
                             "measure: balancer"));
      bals[k].cost = bc.cost;
      bals[k].have_cost = 1;
    }
  }
done:
  moe_free(f);
  return st;
}

// One timed forward + backward of layer; v (N_COLS) = this rank's values,
// *fwd_ns the forward pass's makespan (for the trace).
static moe_status time_iteration(moe_ctx *ctx, const moe_layer_config *cfg, MPI_Comm comm,
                                 buffers *b, moe_ep_layer *layer, balancing *bal,
                                 moe_layer_stats *stats, double *v, uint64_t *fwd_ns) {
  moe_status st = MOE_STATUS_OK;
  memset(b->dx, 0, (size_t)cfg->tokens * (size_t)cfg->model_dim * sizeof(float));
  moe_ep_layer_zero_grad(layer);
  MOE_MPI_WATCHED("barrier before a timed layer run", MPI_Barrier(comm));
  const double t0 = MPI_Wtime();
  v[13] = v[14] = 0.0;
  // load balancing: the placement planned from the last iteration's load,
  // inside the timed forward (its Trans overlaps the gate and completes
  // before the experts: moe_ep_layer_set_placement)
  // (not before the rates are known: the first iteration measures them)
  const int balance = bal && bal->b && bal->have_cost;
  if (balance) MOE_TRY(balance_step(ctx, comm, layer, bal, &v[13]));
  st = moe_ep_layer_forward(layer, b->x, cfg->tokens, b->y, stats);
  if (balance) v[14] = moe_ep_layer_trans_ms(layer);
  const double t1 = MPI_Wtime();
  if (st == MOE_STATUS_OK) st = moe_ep_layer_backward(layer, b->dy, b->dx);
  const double t2 = MPI_Wtime();
  if (st != MOE_STATUS_OK) return st;  // the layer agrees on failures: every rank is here
  v[0] = (t1 - t0) * 1e3;
  v[1] = (t2 - t1) * 1e3;
  v[2] = (t2 - t0) * 1e3;
  breakdown_ms(layer, 0, v + 3, fwd_ns);
  breakdown_ms(layer, 1, v + 8, NULL);
  v[COL_SUMS + 0] = v[3] + v[8];   // compute
  v[COL_SUMS + 1] = v[4] + v[9];   // comm
  v[COL_SUMS + 2] = v[7] + v[12];  // makespans
  kind_ms(layer, 0, v + COL_KINDS);
  kind_ms(layer, 1, v + COL_KINDS + MOE_CT_KINDS);
done:
  return st;
}

moe_status moe_measure_layer_variants_memory(moe_ctx *ctx, int world_size,
                                             const moe_layer_config *cfg,
                                             const moe_measure_variant *variants, int n,
                                             const moe_measure_config *mc, moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cfg || !variants || !mc || !out || n < 1, MOE_STATUS_INVALID_ARG,
              "measure: cfg, variants, mc and out must be given, n >= 1 (n = %d)", n);
  memset(out, 0, sizeof *out);
  for (int k = 0; k < n; k++) {
    moe_memory_need one;
    MOE_TRY(moe_ep_layer_memory(ctx, cfg, &variants[k].pc, world_size,
                                variants[k].pc.ranks_per_node, &one));
    moe_memory_need_add(out, &one);
    const moe_balance_config *bc = &variants[k].balance;
    if (bc->policy != MOE_BALANCE_NONE) {
      // the balancer (its window of W loads, their sum and mean, rows, the
      // plan) and the harness's load and placement tables
      const size_t EP = (size_t)cfg->num_experts * (size_t)variants[k].pc.ep_size;
      const size_t W = (size_t)(bc->window > 0 ? bc->window : 1);
      out->bytes[MOE_MEM_WORKSPACE] +=
          (double)(moe_align64((W + 3) * EP * sizeof(int64_t)) + 2 * moe_align64(EP) + 4096);
    }
  }
  {
    // moe_measure_layer_variants, below: x, y, dy, dx; the tables of every iteration
    const size_t tm = (size_t)cfg->tokens * (size_t)cfg->model_dim, it = (size_t)mc->iters;
    out->bytes[MOE_MEM_ACTIVATIONS] +=
        4.0 * (double)moe_align64((tm ? tm : 1) * sizeof(float)) + moe_measure_skew_bytes(cfg, mc);
    out->bytes[MOE_MEM_WORKSPACE] +=
        (double)(moe_align64((size_t)n * sizeof(moe_ep_layer *)) +
                 2 * moe_align64((size_t)n * it * N_COLS * sizeof(double)) +
                 moe_align64(it * sizeof(double)) +
                 moe_align64((size_t)n * sizeof(moe_layer_stats)));
  }
done:
  return st;
}

moe_status moe_measure_layer_variants(moe_ctx *ctx, MPI_Comm comm, const moe_layer_config *cfg,
                                      const moe_measure_variant *variants, int n,
                                      const moe_measure_config *mc, moe_measure_result *out) {
  moe_status st = MOE_STATUS_OK;
  int rank = 0;
  moe_ep_layer **layers = NULL;
  double *local = NULL, *slow = NULL, *col = NULL;
  moe_layer_stats *stats = NULL;
  balancing *bals = NULL;
  buffers b;
  memset(&b, 0, sizeof b);
  uint64_t fwd_pass_ns = 0;
  double skew_tv = 0.0;
  MOE_FAIL_IF(ctx, !cfg || !variants || !mc || !out || n < 1, MOE_STATUS_INVALID_ARG,
              "measure: cfg, variants, mc and out must be given, n >= 1 (n = %d)", n);
  MOE_FAIL_IF(ctx, mc->iters < 1 || mc->warmup < 0, MOE_STATUS_INVALID_ARG,
              "measure: iters (%d) must be >= 1 and warmup (%d) >= 0", mc->iters, mc->warmup);
  for (int k = 0; k < n; k++) {
    MOE_FAIL_IF(ctx, variants[k].baseline > k, MOE_STATUS_INVALID_ARG,
                "measure: variant %d's baseline (%d) must come before it or be itself", k,
                variants[k].baseline);
  }
  MOE_MPI_TRY(ctx, MPI_Comm_rank(comm, &rank));
  const size_t tm = (size_t)cfg->tokens * (size_t)cfg->model_dim, it = (size_t)mc->iters;
  layers = moe_calloc((size_t)n, sizeof *layers);
  // every iteration's values: this rank's (the model's per-kind times) and
  // the slowest rank's (every reported number)
  local = moe_calloc((size_t)n * it * N_COLS, sizeof *local);
  slow = moe_calloc((size_t)n * it * N_COLS, sizeof *slow);
  col = moe_calloc(it, sizeof *col);
  stats = moe_calloc((size_t)n, sizeof *stats);
  bals = moe_calloc((size_t)n, sizeof *bals);
  b.x = moe_malloc((tm ? tm : 1) * sizeof(float));
  b.y = moe_malloc((tm ? tm : 1) * sizeof(float));
  b.dy = moe_malloc((tm ? tm : 1) * sizeof(float));
  b.dx = moe_malloc((tm ? tm : 1) * sizeof(float));
  {
    const int ok = layers && local && slow && col && stats && bals && b.x && b.y && b.dy && b.dx;
    MOE_TRY(moe_comm_agree(
        ctx, comm,
        ok ? MOE_STATUS_OK
           : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                          "measure: cannot allocate the buffers of %d variants (T=%d, M=%d)", n,
                          cfg->tokens, cfg->model_dim),
        "measure: allocation"));
  }
  moe_rng rng;
  moe_rng_init(&rng, mc->seed, 100 + 2 * (uint64_t)rank);
  moe_rng_fill_uniform(&rng, b.x, tm, -1.0f, 1.0f);
  moe_rng_init(&rng, mc->seed, 101 + 2 * (uint64_t)rank);
  moe_rng_fill_uniform(&rng, b.dy, tm, -1.0f, 1.0f);
  for (int k = 0; k < n; k++) {
    // collective: every rank fails alike (the layer agrees on its setup)
    MOE_TRY(moe_ep_layer_create(ctx, comm, cfg, &variants[k].pc, &layers[k]));
    moe_ep_layer_init_params(layers[k], mc->seed);
  }
  if (mc->skew.kind != MOE_SKEW_NONE) {
    // the same bias bits on every rank and variant (the same gate and tokens)
    moe_ep_tensors t0 = moe_ep_layer_get_tensors(layers[0]);
    MOE_TRY(moe_comm_agree(ctx, comm,
                           moe_measure_skew_bias(ctx, cfg, mc, t0.wg, t0.router_bias, &skew_tv),
                           "measure: skew fit"));
    for (int k = 1; k < n; k++) {
      moe_ep_tensors t = moe_ep_layer_get_tensors(layers[k]);
      memcpy(t.router_bias, t0.router_bias, (size_t)cfg->num_experts * sizeof(float));
    }
  }
  for (int k = 0; k < n; k++) {
    // load balancing: the balancer and its tables, agreed (every rank the same config)
    const moe_balance_config *bc = &variants[k].balance;
    bals[k].plan.predicted_ms = bals[k].plan.predicted_none_ms = NAN;  // no plan yet (or ever)
    for (int i = 0; i < MOE_BALANCE_AUTO; i++) bals[k].plan.auto_ms[i] = NAN;
    if (bc->policy == MOE_BALANCE_NONE) continue;
    const moe_ep_tensors t = moe_ep_layer_get_tensors(layers[k]);
    const int E = cfg->num_experts, P = E / t.home_count;
    moe_status bst = moe_balancer_create(ctx, bc, E, P, &bals[k].b);
    bals[k].cost = bc->cost;
    if (bst == MOE_STATUS_OK) {
      bals[k].load = moe_calloc((size_t)E * P, sizeof(int64_t));
      bals[k].replica = moe_calloc((size_t)E * P, 1);
      if (!bals[k].load || !bals[k].replica)
        bst = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "measure: cannot allocate the balancing tables");
    }
    MOE_TRY(moe_comm_agree(ctx, comm, bst, "measure: balancer"));
    bals[k].have_cost = bc->cost.flops_per_s > 0;
  }
  for (int i = 0; i < mc->warmup + mc->iters; i++) {
    for (int k = 0; k < n; k++) {
      double v[N_COLS];
      uint64_t fns = 0;
      MOE_TRY(time_iteration(ctx, cfg, comm, &b, layers[k], &bals[k], &stats[k], v, &fns));
      if (k == n - 1) fwd_pass_ns = fns;
      if (i < mc->warmup) continue;
      const size_t at = ((size_t)k * it + (size_t)(i - mc->warmup)) * N_COLS;
      memcpy(local + at, v, sizeof v);
      MOE_MPI_TRY_OP(ctx, "all-reduce of the timings",
                     MPI_Allreduce(v, slow + at, N_COLS, MPI_DOUBLE, MPI_MAX, comm));
    }
    if (i == 0) MOE_TRY(set_rates(ctx, cfg, comm, variants, layers, bals, n));
  }
  for (int k = 0; k < n; k++) {
    moe_measure_result *r = &out[k];
    memset(r, 0, sizeof *r);
    r->chunks = moe_ep_layer_chunks(layers[k]);
    double med[N_COLS];
    for (int c = 0; c < N_COLS; c++) {
      for (size_t i = 0; i < it; i++) col[i] = slow[((size_t)k * it + i) * N_COLS + (size_t)c];
      med[c] = moe_median(col, mc->iters);  // sorts col
      if (c == 2) {
        r->total_q1 = moe_quantile_sorted(col, mc->iters, 0.25);
        r->total_q3 = moe_quantile_sorted(col, mc->iters, 0.75);
      }
    }
    r->fwd_ms = med[0];
    r->bwd_ms = med[1];
    r->total_ms = med[2];
    memcpy(r->fwd_pass, med + 3, sizeof r->fwd_pass);
    memcpy(r->bwd_pass, med + 8, sizeof r->bwd_pass);
    r->comp_sum_ms = med[COL_SUMS];
    r->comm_sum_ms = med[COL_SUMS + 1];
    r->passes_sum_ms = med[COL_SUMS + 2];
    memcpy(r->kind_ms, med + COL_KINDS, sizeof r->kind_ms);
    // The model: the time outside the passes as the baseline measured it, the
    // passes simulated with this rank's median busy times per kind of the
    // baseline (a maximum over ranks per kind would count a collective's skew
    // twice: the slow rank's compute and the fast rank's wait inside the
    // all-to-all); the slowest rank's model counts.
    r->model_ms = NAN;
    const int bi = variants[k].baseline;
    if (bi >= 0) {
      const moe_measure_result *m = &out[bi];
      double mine[2 * MOE_CT_KINDS];
      for (int c = 0; c < 2 * MOE_CT_KINDS; c++) {
        for (size_t i = 0; i < it; i++)
          col[i] = local[((size_t)bi * it + i) * N_COLS + COL_KINDS + (size_t)c];
        mine[c] = moe_median(col, mc->iters);
      }
      const double outside = m->total_ms - m->fwd_pass[4] - m->bwd_pass[4];
      double passes = model_pass_ms(ctx, layers[k], 0, mine, r->chunks) +
                      model_pass_ms(ctx, layers[k], 1, mine + MOE_CT_KINDS, r->chunks);
      MOE_MPI_TRY_OP(ctx, "all-reduce of the timings",
                     MPI_Allreduce(MPI_IN_PLACE, &passes, 1, MPI_DOUBLE, MPI_MAX, comm));
      r->model_ms = outside + passes;
    }
    long long counts[4] = {stats[k].rows, stats[k].dropped, stats[k].rerouted,
                           moe_ep_layer_offnode_rows(layers[k])};
    MOE_MPI_TRY_OP(ctx, "all-reduce of the timings",
                   MPI_Allreduce(MPI_IN_PLACE, counts, 4, MPI_LONG_LONG, MPI_SUM, comm));
    r->rows = counts[0];
    r->dropped = counts[1];
    r->rerouted = counts[2];
    r->offnode_rows = counts[3];
    // balance: rows computed per rank (every rank of the world computes)
    long long mine = moe_ep_layer_rows_computed(layers[k]), most = 0, all = 0;
    MOE_MPI_TRY_OP(ctx, "all-reduce of the row counts",
                   MPI_Allreduce(&mine, &most, 1, MPI_LONG_LONG, MPI_MAX, comm));
    MOE_MPI_TRY_OP(ctx, "all-reduce of the row counts",
                   MPI_Allreduce(&mine, &all, 1, MPI_LONG_LONG, MPI_SUM, comm));
    int world = 1;
    MOE_MPI_TRY(ctx, MPI_Comm_size(comm, &world));
    r->balance_ms = med[13];
    r->trans_ms = med[14];
    r->copies = bals[k].copies;
    r->bal_plan = bals[k].plan;  // NAN predictions without a plan
    r->bal_cost = bals[k].cost;
    r->max_rank_rows = most;
    r->balance_ratio = all > 0 ? (double)most * world / (double)all : 1.0;
    r->skew_tv = skew_tv;
  }
  if (mc->trace_path) {
    moe_trace_pass passes[4];
    memset(passes, 0, sizeof passes);
    for (int d = 0; d < 2; d++) {
      moe_ep_layer_last_pass(layers[n - 1], d, &passes[d].graph, &passes[d].records);
      passes[d].offset_ns = d ? fwd_pass_ns : 0;
    }
    int np = passes[0].graph && passes[1].graph ? 2 : 0;
    // load balancing's Trans and Agg (comm stream), when the variant has copy slots
    for (int d = 0; np >= 2 && d < 2; d++) {
      moe_ep_layer_balance_pass(layers[n - 1], d, &passes[np].graph, &passes[np].records);
      passes[np].offset_ns = d ? fwd_pass_ns : 0;
      if (passes[np].graph) np++;
    }
    MOE_TRY(moe_trace_write_ranks(ctx, comm, mc->trace_path, passes, np));
  }
done:
  for (int k = 0; bals && k < n; k++) {
    moe_balancer_destroy(bals[k].b);
    moe_free(bals[k].load);
    moe_free(bals[k].replica);
  }
  moe_free(bals);
  for (int k = 0; layers && k < n; k++) moe_ep_layer_destroy(layers[k]);
  moe_free(layers);
  moe_free(local);
  moe_free(slow);
  moe_free(col);
  moe_free(stats);
  moe_free(b.x);
  moe_free(b.y);
  moe_free(b.dy);
  moe_free(b.dx);
  return st;
}

#else
// Without MPI this file has nothing to compile (ISO C wants a declaration).
typedef int moe_measure_layer_runs_need_mpi;
#endif  // MOE_HAVE_MPI
