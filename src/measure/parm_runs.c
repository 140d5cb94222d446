// Parm's schedules, measured (moe_measure_parm, `moe bench parm`): one
// moe_parm_layer switched between baseline, s1, s2 and s2 with SAA, the
// variants interleaved round by round so that a slow phase of the machine
// hits them alike; each pass's time is the slowest rank's. The outputs and
// input gradients of every variant are compared with the baseline's on the
// same tokens (the schedules keep the math).
#include "moe_build_config.h"
#if MOE_HAVE_MPI  // the whole file: collective measurements

#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "measure/measure_internal.h"
#include "moe/measure_mpi.h"

// The first three runs are the schedules of the same index (one name list).
const char *moe_parm_run_name(int run) {
  return run == MOE_PARM_RUN_S2_SAA ? "s2+saa" : moe_parm_schedule_name(run);
}

void moe_parm_bench_config_default(moe_parm_bench_config *c) {
  memset(c, 0, sizeof *c);
  c->warmup = 2;
  c->rounds = 7;
  c->seed = 1;
}

static double max_rel(const float *a, const float *ref, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    const double e = fabs((double)a[i] - (double)ref[i]), r = fabs((double)ref[i]);
    if (e > d) d = e;
    if (r > m) m = r;
  }
  return m > 0 ? d / m : d;
}

// Per variant and round: fwd, bwd, a2a, mp, esp, expert (slowest rank's).
enum { F_FWD, F_BWD, F_A2A, F_MP, F_ESP, F_EXP, F_N };

moe_status moe_measure_parm(moe_ctx *ctx, MPI_Comm world, const moe_layer_config *cfg,
                            const moe_parm_config *pc, const moe_parm_bench_config *bc,
                            moe_parm_run_result *out) {
  moe_status st = MOE_STATUS_OK;
  moe_parm_layer *L = NULL;
  float *x = NULL, *dy = NULL, *y = NULL, *dx = NULL, *y0 = NULL, *dx0 = NULL;
  double *v = NULL, *col = NULL;
  int W = 0, rank = 0;
  MOE_MPI_TRY(ctx, MPI_Comm_size(world, &W));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(world, &rank));
  {
    moe_status local = MOE_STATUS_OK;
    if (!cfg || !pc || !bc || !out) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "bench parm: NULL argument");
    } else if (bc->rounds < 1 || bc->rounds > 100000 || bc->warmup < 0 || bc->warmup > 1000) {
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "bench parm: rounds (%d) must be in [1, 100000], warmup (%d) in [0, "
                           "1000]",
                           bc ? bc->rounds : 0, bc ? bc->warmup : 0);
    }
    MOE_TRY(moe_comm_agree(ctx, world, local, "bench parm"));
  }
  MOE_TRY(moe_parm_layer_create(ctx, world, cfg, pc, &L));
  moe_parm_layer_init_params(L, bc->seed);
  const int T = cfg->tokens, M = cfg->model_dim, R = bc->rounds;
  const size_t n = (size_t)T * M;
  {
    moe_status local = MOE_STATUS_OK;
    x = moe_malloc(n * sizeof(float));
    dy = moe_malloc(n * sizeof(float));
    y = moe_malloc(n * sizeof(float));
    dx = moe_malloc(n * sizeof(float));
    y0 = moe_malloc(n * sizeof(float));
    dx0 = moe_malloc(n * sizeof(float));
    v = moe_calloc((size_t)MOE_PARM_RUNS * R * F_N, sizeof(double));
    col = moe_calloc((size_t)R, sizeof(double));
    if (!x || !dy || !y || !dx || !y0 || !dx0 || !v || !col)
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "bench parm: cannot allocate %zu floats of tokens", 6 * n);
    MOE_TRY(moe_comm_agree(ctx, world, local, "bench parm allocation"));
  }
  {
    // the tokens of this rank's data part (MP peers alike)
    const uint64_t d = (uint64_t)moe_parm_data_index(pc, W, rank);
    moe_rng rng;
    moe_rng_init(&rng, bc->seed, 1000 + 2 * d);
    moe_rng_fill_uniform(&rng, x, n, -1.0f, 1.0f);
    moe_rng_init(&rng, bc->seed, 1001 + 2 * d);
    moe_rng_fill_uniform(&rng, dy, n, -1.0f, 1.0f);
  }
  memset(out, 0, (size_t)MOE_PARM_RUNS * sizeof *out);
  for (int round = -bc->warmup; round < R; round++) {
    for (int run = 0; run < MOE_PARM_RUNS; run++) {
      const moe_parm_schedule s = run == MOE_PARM_RUN_S2_SAA ? MOE_PARM_S2 : (moe_parm_schedule)run;
      MOE_TRY(moe_parm_layer_set_schedule(L, s, run == MOE_PARM_RUN_S2_SAA));
      moe_parm_layer_zero_grad(L);
      moe_layer_stats stats;
      MOE_MPI_TRY_OP(ctx, "bench parm", MPI_Barrier(world));
      double t[F_N];
      uint64_t t0 = moe_time_ns();
      MOE_TRY(moe_parm_layer_forward(L, x, T, y, &stats));
      t[F_FWD] = moe_time_ms_since(t0);
      MOE_MPI_TRY_OP(ctx, "bench parm", MPI_Barrier(world));
      t0 = moe_time_ns();
      MOE_TRY(moe_parm_layer_backward(L, dy, dx));
      t[F_BWD] = moe_time_ms_since(t0);
      const moe_parm_timing tf = moe_parm_layer_timing(L, 0), tb = moe_parm_layer_timing(L, 1);
      t[F_A2A] = tf.a2a_ms + tb.a2a_ms;
      t[F_MP] = tf.mp_ms + tb.mp_ms;
      t[F_ESP] = tf.esp_ms + tb.esp_ms;
      t[F_EXP] = tf.expert_ms + tb.expert_ms;
      MOE_MPI_TRY_OP(ctx, "bench parm",
                     MPI_Allreduce(MPI_IN_PLACE, t, F_N, MPI_DOUBLE, MPI_MAX, world));
      // the math: every variant against the baseline of the same round
      double diff = 0;
      if (run == MOE_PARM_RUN_BASELINE) {
        memcpy(y0, y, n * sizeof(float));
        memcpy(dx0, dx, n * sizeof(float));
      } else {
        const double a = max_rel(y, y0, n), b = max_rel(dx, dx0, n);
        diff = a > b ? a : b;
      }
      int drops = stats.dropped;
      MOE_MPI_TRY_OP(ctx, "bench parm",
                     MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_DOUBLE, MPI_MAX, world));
      MOE_MPI_TRY_OP(ctx, "bench parm",
                     MPI_Allreduce(MPI_IN_PLACE, &drops, 1, MPI_INT, MPI_MAX, world));
      if (diff > out[run].max_rel_diff) out[run].max_rel_diff = diff;
      if (drops > out[run].dropped) out[run].dropped = drops;
      if (round >= 0) memcpy(v + ((size_t)run * R + round) * F_N, t, sizeof t);
    }
  }
  for (int run = 0; run < MOE_PARM_RUNS; run++) {
    double med[F_N];
    for (int f = 0; f < F_N; f++) {
      for (int r = 0; r < R; r++) col[r] = v[((size_t)run * R + r) * F_N + f];
      med[f] = moe_median(col, R);
    }
    for (int r = 0; r < R; r++)
      col[r] = v[((size_t)run * R + r) * F_N + F_FWD] + v[((size_t)run * R + r) * F_N + F_BWD];
    moe_parm_run_result *o = &out[run];
    o->total_ms = moe_median(col, R);  // sorts col
    o->total_q1 = moe_quantile_sorted(col, R, 0.25);
    o->total_q3 = moe_quantile_sorted(col, R, 0.75);
    o->fwd_ms = med[F_FWD];
    o->bwd_ms = med[F_BWD];
    o->a2a_ms = med[F_A2A];
    o->mp_ms = med[F_MP];
    o->esp_ms = med[F_ESP];
    o->expert_ms = med[F_EXP];
  }
done:
  moe_parm_layer_destroy(L);
  void *all[] = {x, dy, y, dx, y0, dx0, v, col};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) moe_free(all[i]);
  return st;
}

// ---- alpha-beta terms ------------------------------------------------------------------

// One timing: the slowest rank's ms.
static moe_status slowest(moe_ctx *ctx, MPI_Comm world, double ms, double *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_MPI_TRY_OP(ctx, "Parm alpha-beta", MPI_Allreduce(&ms, out, 1, MPI_DOUBLE, MPI_MAX, world));
done:
  return st;
}

// The SAA pair as the layer runs it: the way back (r rows of M floats from
// every member) as point-to-point transfers, and EP rank by EP rank, once its
// ESP members' rows are in, an MP-AllGather of r rows.
static moe_status saa_pair(moe_ctx *ctx, const moe_group *g, MPI_Comm mp, int ep_me, int EP,
                           int ESP, int r, int M, const float *send, float *recv, float *part,
                           float *gath, MPI_Request *rq, MPI_Status *sts) {
  moe_status st = MOE_STATUS_OK;
  const int P = g->size, n = r * M;
  int MP = 1;
  MOE_MPI_TRY(ctx, MPI_Comm_size(mp, &MP));
  for (int i = 0; i < 2 * P + EP; i++) rq[i] = MPI_REQUEST_NULL;
  for (int q = 0; q < P; q++)
    MOE_MPI_TRY(ctx, MPI_Irecv(recv + (size_t)q * n, n, MPI_FLOAT, q, 0x5ab, g->comm, &rq[q]));
  for (int q = 0; q < P; q++)
    MOE_MPI_TRY(ctx, MPI_Isend(send + (size_t)q * n, n, MPI_FLOAT, q, 0x5ab, g->comm, &rq[P + q]));
  for (int i = 0; i < EP; i++) {
    const int e = (ep_me + i) % EP;
    MOE_MPI_TRY(ctx, MPI_Waitall(ESP, rq + e * ESP, sts));
    memcpy(part + (size_t)e * n, recv + (size_t)e * ESP * n, (size_t)n * sizeof(float));
    MOE_MPI_TRY(ctx, MPI_Iallgather(part + (size_t)e * n, n, MPI_FLOAT, gath + (size_t)e * MP * n,
                                    n, MPI_FLOAT, mp, &rq[2 * P + e]));
  }
  MOE_MPI_TRY(ctx, MPI_Waitall(2 * P + EP, rq, sts));
done:
  return st;
}

// The layer moe_measure_parm_alpha_beta times the collectives of: the
// smallest shape for pc's groups.
static moe_layer_config alpha_beta_layer(const moe_parm_config *pc, int model_dim) {
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = 1;
  cfg.model_dim = model_dim;
  cfg.hidden_dim = pc->esp;
  cfg.num_experts = pc->ep;
  cfg.top_k = 1;
  cfg.capacity_factor = 0;
  return cfg;
}

moe_status moe_measure_parm_alpha_beta_memory(moe_ctx *ctx, const moe_parm_config *pc,
                                              int world_size, int model_dim, int rows_hi,
                                              int points, int rounds, moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !pc || !out || model_dim < 1 || rows_hi < 1 || points < 2 || rounds < 1,
              MOE_STATUS_INVALID_ARG,
              "Parm alpha-beta memory: a layout, an output, M, rows, points and rounds >= 1");
  {
    const moe_layer_config cfg = alpha_beta_layer(pc, model_dim);
    MOE_TRY(moe_parm_layer_memory(ctx, &cfg, pc, world_size, out));
    const double EP = pc->ep, P = (double)pc->ep * pc->esp, MP = pc->mp, M = model_dim, R = rows_hi;
    const double big = (P * R * M + 1) * sizeof(float);  // send and receive
    const char *names[1] = {pc->a2a};
    moe_memory_need a2a;
    MOE_TRY(moe_measure_a2a_memory(ctx, (int)P, pc->ranks_per_node, (size_t)big, (size_t)big, names,
                                   1, rounds, &a2a));
    for (int k = 0; k < MOE_MEM_COUNT_; k++) out->bytes[k] += a2a.bytes[k];
    out->bytes[MOE_MEM_WORKSPACE] +=
        (EP * R * M + 1) * sizeof(float) + (MP * P * R * M + 1) * sizeof(float) +  // part, gath
        (6.0 * points + rounds) * sizeof(double) + (2 * EP + P) * sizeof(int) +
        4 * P * sizeof(size_t) + (2 * P + EP) * (sizeof(MPI_Request) + sizeof(MPI_Status));
  }
done:
  return st;
}

moe_status moe_measure_parm_alpha_beta(moe_ctx *ctx, MPI_Comm world, const moe_parm_config *pc,
                                       int model_dim, int rows_lo, int rows_hi, int points,
                                       int rounds, moe_parm_alpha_beta *out, moe_linear_fit *fits) {
  moe_status st = MOE_STATUS_OK;
  moe_parm_layer *L = NULL;
  float *send = NULL, *recv = NULL, *part = NULL, *gath = NULL;
  double *x = NULL, *y = NULL, *col = NULL;
  int *rows = NULL, *first = NULL, *rrows = NULL;
  size_t *counts = NULL;
  MPI_Request *rq = NULL;
  MPI_Status *sts = NULL;  // not MPI_STATUSES_IGNORE: GCC 12 flags it in MPICH's MPI_Waitall
  moe_workspace ws;
  memset(&ws, 0, sizeof ws);
  {
    moe_status local = MOE_STATUS_OK;
    if (!pc || !out || model_dim < 1 || model_dim > MOE_MAX_DIM || rows_lo < 1 ||
        rows_hi < rows_lo || points < 2 || points > 64 || rounds < 1 || rounds > 1000 ||
        (double)rows_hi * model_dim * pc->ep * pc->esp * pc->mp > 1 << 28)
      local = moe_error_at(ctx, MOE_STATUS_INVALID_ARG, __FILE__, __LINE__,
                           "Parm alpha-beta: M (%d) in [1, %d], 1 <= rows %d <= %d, points (%d) "
                           "in [2, 64], rounds (%d) in [1, 1000], at most 2^28 floats",
                           model_dim, MOE_MAX_DIM, rows_lo, rows_hi, points, rounds);
    MOE_TRY(moe_comm_agree(ctx, world, local, "Parm alpha-beta"));
  }
  {
    const moe_layer_config cfg = alpha_beta_layer(pc, model_dim);
    MOE_TRY(moe_parm_layer_create(ctx, world, &cfg, pc, &L));
  }
  const moe_group *g = moe_parm_layer_a2a_group(L);
  const MPI_Comm mp = moe_parm_layer_mp_comm(L);
  const moe_a2a_algo *algo = moe_parm_layer_algo(L);
  int W = 0, rank = 0;
  MOE_MPI_TRY(ctx, MPI_Comm_size(world, &W));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(world, &rank));
  const int EP = pc->ep, ESP = pc->esp, MP = pc->mp, P = EP * ESP, M = model_dim;
  const int ep_me = moe_parm_coords_of(pc, W, rank).ep;
  {
    moe_status local = MOE_STATUS_OK;
    const size_t big = (size_t)P * rows_hi * M + 1;
    send = moe_malloc(big * sizeof(float));
    recv = moe_malloc(big * sizeof(float));
    part = moe_malloc(((size_t)EP * rows_hi * M + 1) * sizeof(float));
    gath = moe_malloc(((size_t)MP * P * rows_hi * M + 1) * sizeof(float));
    x = moe_calloc((size_t)3 * points, sizeof(double));
    y = moe_calloc((size_t)3 * points, sizeof(double));
    col = moe_calloc((size_t)rounds, sizeof(double));
    rows = moe_calloc((size_t)EP, sizeof(int));
    first = moe_calloc((size_t)EP, sizeof(int));
    rrows = moe_calloc((size_t)P, sizeof(int));
    counts = moe_calloc((size_t)4 * P, sizeof(size_t));
    rq = moe_calloc((size_t)(2 * P + EP), sizeof(MPI_Request));
    sts = moe_calloc((size_t)(2 * P + EP), sizeof(MPI_Status));
    if (!send || !recv || !part || !gath || !x || !y || !col || !rows || !first || !rrows || !rq ||
        !sts || !counts)
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "Parm alpha-beta: cannot allocate %zu floats", 3 * big);
    MOE_TRY(moe_comm_agree(ctx, world, local, "Parm alpha-beta allocation"));
    for (size_t i = 0; i < big; i++) send[i] = (float)(i % 1000) * 1e-3f;
  }
  for (int i = 0; i < points; i++) {
    const double t = points > 1 ? (double)i / (points - 1) : 0;
    const int r = (int)lround((double)rows_lo * pow((double)rows_hi / rows_lo, t));
    for (int e = 0; e < EP; e++) {
      rows[e] = r;
      first[e] = e * r;
    }
    for (int q = 0; q < P; q++) rrows[q] = r;
    for (int k = 0; k < 3; k++) {
      // warm-up once, then the rounds
      for (int round = -1; round < rounds; round++) {
        MOE_MPI_TRY_OP(ctx, "Parm alpha-beta", MPI_Barrier(world));
        const uint64_t t0 = moe_time_ns();
        if (k == 0) {
          MOE_TRY(
              moe_parm_dump_a2a(ctx, algo, g, ESP, send, rows, first, M, recv, rrows, counts, &ws));
        } else if (k == 1) {
          MOE_MPI_TRY_OP(ctx, "Parm alpha-beta",
                         MPI_Allgather(send, r * M, MPI_FLOAT, gath, r * M, MPI_FLOAT, mp));
        } else {
          MOE_TRY(saa_pair(ctx, g, mp, ep_me, EP, ESP, r, M, send, recv, part, gath, rq, sts));
        }
        double ms = 0;
        MOE_TRY(slowest(ctx, world, moe_time_ms_since(t0), &ms));
        if (round >= 0) col[round] = ms;
      }
      // x: V = P r M for the all-to-all and the pair; the MP-AllGather's total MP r M
      x[k * points + i] = (double)(k == 1 ? MP : P) * r * M;
      y[k * points + i] = moe_median(col, rounds) * 1e-3;
    }
  }
  {
    moe_linear_fit f[3];
    for (int k = 0; k < 3; k++)
      MOE_TRY(moe_fit_linear_nonneg(ctx, x + k * points, y + k * points, points, &f[k]));
    out->alpha_a2a = f[0].alpha;
    out->beta_a2a = f[0].beta;
    out->alpha_mp = f[1].alpha;
    out->beta_mp = f[1].beta;
    out->alpha_o = f[2].alpha;
    out->beta_o = f[2].beta;
    if (fits) memcpy(fits, f, sizeof f);
  }
done:
  moe_parm_layer_destroy(L);
  moe_workspace_free(&ws);
  void *all[] = {send, recv, part, gath, x, y, col, rows, first, rrows, rq, counts, sts};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) moe_free(all[i]);
  return st;
}

moe_status moe_measure_parm_memory(moe_ctx *ctx, const moe_layer_config *cfg,
                                   const moe_parm_config *pc, int world_size,
                                   moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_parm_layer_memory(ctx, cfg, pc, world_size, out));
  // x, dy, y, dx and the baseline's y and dx
  out->bytes[MOE_MEM_ACTIVATIONS] += 6.0 * cfg->tokens * (double)cfg->model_dim * sizeof(float);
done:
  return st;
}

// ---- the grid ----------------------------------------------------------------------

int moe_parm_grid_default_layouts(int P, int layouts[][3]) {
  int n = 0;
  for (int mp = 1; mp <= 2; mp++) {
    for (int esp = 1; esp <= 2; esp++) {
      if (P % (mp * esp)) continue;
      layouts[n][0] = mp;
      layouts[n][1] = P / (mp * esp);
      layouts[n][2] = esp;
      n++;
    }
  }
  return n;
}

void moe_parm_grid_ab_range(const moe_parm_grid_row *rows, int n, int layout, int *rows_lo,
                            int *rows_hi, int *width) {
  double lo = 1e30, hi = 0;
  *width = 0;
  for (int i = 0; i < n; i++) {
    if (rows[i].layout != layout) continue;
    const moe_layer_config *c = &rows[i].cfg;
    const double f = c->capacity_factor > 0 ? c->capacity_factor : 1.0;
    const double r = f * c->top_k * c->tokens / ((double)rows[i].pc.ep * rows[i].pc.mp);
    lo = r < lo ? r : lo;
    hi = r > hi ? r : hi;
    *width = c->model_dim > *width ? c->model_dim : *width;
  }
  *rows_lo = (int)(lo < 1 ? 1 : lo);
  *rows_hi = (int)hi;
  if (*rows_hi < 2 * *rows_lo) *rows_hi = 2 * *rows_lo;
}

void moe_parm_grid_judge(moe_parm_grid_row *w, const moe_parm_alpha_beta *ab) {
  w->alg1 = moe_parm_pick(ab, &w->cfg, &w->pc, &w->t1_ms, &w->t2_ms);
  const moe_parm_run_result *a = &w->r[MOE_PARM_RUN_S1], *b = &w->r[MOE_PARM_RUN_S2_SAA];
  w->faster = a->total_q3 < b->total_q1   ? MOE_PARM_S1
              : b->total_q3 < a->total_q1 ? MOE_PARM_S2
                                          : -1;
  w->max_diff = 0;
  for (int v = 1; v < MOE_PARM_RUNS; v++)
    if (w->r[v].max_rel_diff > w->max_diff) w->max_diff = w->r[v].max_rel_diff;
}

void moe_parm_grid_summarize(const moe_parm_grid_row *rows, int n, moe_parm_grid_summary *out) {
  memset(out, 0, sizeof *out);
  for (int v = 0; v < 3; v++) out->lo[v] = 1e30;
  for (int i = 0; i < n; i++) {
    const moe_parm_grid_row *w = &rows[i];
    for (int v = 1; v < MOE_PARM_RUNS; v++) {
      const double s = w->r[0].total_ms / w->r[v].total_ms;
      if (s < out->lo[v - 1]) out->lo[v - 1] = s;
      if (s > out->hi[v - 1]) out->hi[v - 1] = s;
      if (v != MOE_PARM_RUN_S1 && w->r[v].max_rel_diff > out->worst_s2)
        out->worst_s2 = w->r[v].max_rel_diff;
    }
    if (w->pc.mp == 1) continue;  // s1 and s2 are one schedule
    if (w->faster < 0) {
      out->noise++;
      continue;
    }
    out->judged++;
    out->right += w->alg1 == w->faster;
  }
}

void moe_parm_grid_write_json(FILE *f, const moe_parm_grid_row *rows, int n, int ranks,
                              const char *a2a, const moe_parm_bench_config *bc) {
  fprintf(f,
          "{\n  \"benchmark\": \"parm\",\n  \"ranks\": %d,\n  \"a2a\": \"%s\",\n  \"rounds\": %d,"
          "\n  \"warmup\": %d,\n  \"chunks\": %d,\n  \"task_schedule\": \"%s\",\n  "
          "\"compress\": \"%s\",\n  \"compress_backward\": %d,\n  \"configs\": [",
          ranks, a2a, bc->rounds, bc->warmup, n > 0 ? rows[0].pc.chunks : 1,
          n > 0 ? rows[0].pc.task_schedule : "", n > 0 ? rows[0].pc.compress : "",
          n > 0 ? rows[0].pc.compress_backward : 0);
  for (int i = 0; i < n; i++) {
    const moe_parm_grid_row *w = &rows[i];
    fprintf(f,
            "%s\n    {\"mp\": %d, \"ep\": %d, \"esp\": %d, \"tokens\": %d, \"model\": %d, "
            "\"hidden\": %d, \"experts\": %d, \"top_k\": %d, \"capacity\": %g, \"alg1\": "
            "\"%s\", \"alg1_t1_ms\": %.6f, \"alg1_t2_ms\": %.6f, \"faster\": \"%s\", "
            "\"variants\": [",
            i ? "," : "", w->pc.mp, w->pc.ep, w->pc.esp, w->cfg.tokens, w->cfg.model_dim,
            w->cfg.hidden_dim, w->cfg.num_experts, w->cfg.top_k, w->cfg.capacity_factor,
            moe_parm_schedule_name(w->alg1), w->t1_ms, w->t2_ms,
            w->faster < 0 ? "noise" : moe_parm_schedule_name(w->faster));
    for (int v = 0; v < MOE_PARM_RUNS; v++) {
      const moe_parm_run_result *r = &w->r[v];
      fprintf(f,
              "%s\n      {\"variant\": \"%s\", \"total_ms\": %.6f, \"total_q1\": %.6f, "
              "\"total_q3\": %.6f, \"fwd_ms\": %.6f, \"bwd_ms\": %.6f, \"speedup\": %.6f, "
              "\"a2a_ms\": %.6f, \"mp_ms\": %.6f, \"esp_ms\": %.6f, \"expert_ms\": %.6f, "
              "\"max_rel_diff\": %.3e, \"dropped\": %d}",
              v ? "," : "", moe_parm_run_name(v), r->total_ms, r->total_q1, r->total_q3, r->fwd_ms,
              r->bwd_ms, r->total_ms > 0 ? w->r[0].total_ms / r->total_ms : 0.0, r->a2a_ms,
              r->mp_ms, r->esp_ms, r->expert_ms, r->max_rel_diff, r->dropped);
    }
    fprintf(f, "\n    ]}");
  }
  fprintf(f, "\n  ]\n}\n");
}

#else
typedef int moe_measure_parm_needs_mpi;
#endif  // MOE_HAVE_MPI
