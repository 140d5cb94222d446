// The layer simulator: an expert-parallel layer's forward and backward passes
// on a described cluster, with the same task graphs and schedules the real
// layer runs (moe_chunk_pass_build) and modelled task durations, through
// moe_schedule_simulate.
//
// Model of one variant (all devices do EP over all experts; E / D experts each):
//   rows a device sends each expert: n = K T / E, at most the capacity C
//   (uniform routing, the expectation of a balanced gate); real-valued
//   chunk c of r holds slots [c C / r, (c + 1) C / r) of each block (capacity)
//   or n / r rows (dropless); with peer groups (smart) step j holds the pairs
//   (s, d) whose groups differ by j
//   A1, A2   moe_model_a2a_algo_s on the chunk's bytes (raw 4 M per row, or the
//            compressor's size for that many rows)
//   E        eq. 1: the busiest device's rows x 4 M H FLOPs (forward; 8 M H
//            backward) at the cluster's GEMM rate
//   C1 D1 C2 D2  raw bytes of the chunk on the busiest device / codec rate
//   outside the passes: the gate GEMMs, 2 T M E FLOPs forward, 4 T M E backward
// With a calibrated profile (moe calibrate), the all-to-all, GEMM and codec
// times come from its fitted alpha-beta models instead, and when the profile
// has them, the expert steps and the work outside the passes from their own
// fits (the outside time is split 1:2 between forward and backward).
// With the profile's layer corrections (moe_profile_fit_layer), A and E task
// durations are scaled and offset and the outside time is the measured fit.
// Not modelled from a description: dispatch, combine and softmax
// (memory-bound, small next to the GEMMs), per-task overheads, slowdown of
// overlapping tasks; a calibrated profile supplies all three.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/compress.h"
#include "moe/perf.h"

moe_status moe_codec_rate_default(moe_ctx *ctx, const char *name, double *compress_gbs,
                                  double *decompress_gbs) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !name || !compress_gbs || !decompress_gbs, MOE_STATUS_INVALID_ARG,
              "codec rate: arguments must not be NULL");
  // the compressor's own declaration (its file in src/compress/), by name
  const size_t len = strcspn(name, ":");
  int n = 0;
  const moe_compressor_entry *const *list = moe_compressor_list(&n);
  for (int i = 0; i < n; i++) {
    if (strlen(list[i]->codec.name) == len && strncmp(list[i]->codec.name, name, len) == 0) {
      *compress_gbs = list[i]->compress_gbs;
      *decompress_gbs = list[i]->decompress_gbs;
      goto done;
    }
  }
  MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
           "codec rate: compressor '%s' has no default throughput (known: %s)", name,
           moe_compressor_names());
done:
  return st;
}

// Seconds of one expert step over `rows` rows from the profile's measured
// points: the points of the (M, H) closest to this one (in log M H) give
// seconds per FLOP as a function of log rows, interpolated linearly (clamped
// at the ends), times this step's FLOPs.
static double expert_point_time(const moe_profile *pf, int backward, double rows, double M,
                                double H) {
  const double mh = M * H;
  double best_d = 1e300, bmh = 0;
  for (int i = 0; i < pf->n_expert_points; i++) {
    const double d = fabs(log(pf->expert_points[i][1] * pf->expert_points[i][2]) - log(mh));
    if (d < best_d) best_d = d, bmh = pf->expert_points[i][1] * pf->expert_points[i][2];
  }
  // the points of that shape, by rows: per-FLOP seconds
  double lo_r = 0, lo_v = 0, hi_r = 0, hi_v = 0;
  int have_lo = 0, have_hi = 0;
  for (int i = 0; i < pf->n_expert_points; i++) {
    const double *e = pf->expert_points[i];
    if (e[1] * e[2] != bmh) continue;
    const double per_flop = e[backward ? 4 : 3] / ((backward ? 8.0 : 4.0) * e[0] * e[1] * e[2]);
    if (e[0] <= rows && (!have_lo || e[0] > lo_r)) lo_r = e[0], lo_v = per_flop, have_lo = 1;
    if (e[0] >= rows && (!have_hi || e[0] < hi_r)) hi_r = e[0], hi_v = per_flop, have_hi = 1;
  }
  double per_flop = have_lo ? lo_v : hi_v;
  if (have_lo && have_hi && hi_r > lo_r) {
    const double t = (log(rows) - log(lo_r)) / (log(hi_r) - log(lo_r));
    per_flop = lo_v + t * (hi_v - lo_v);
  } else if (!have_lo && have_hi) {
    per_flop = hi_v;
  }
  return per_flop * (backward ? 8.0 : 4.0) * rows * M * H;
}

// Seconds of an all-to-all sending `bytes` per rank from the profile's
// measured points of that algorithm (log-log interpolation of the running
// maximum of the times), or -1 when the profile has none.
static double a2a_point_time(const moe_profile *pf, const char *algo, double bytes) {
  for (int i = 0; i < pf->n_a2a; i++) {
    if (strcmp(pf->a2a[i].name, algo) != 0 || pf->n_a2a_points[i] == 0) continue;
    const int n = pf->n_a2a_points[i];
    const double(*pt)[2] = pf->a2a_points[i];
    // times made non-decreasing in the size (noise can make a larger
    // exchange look faster); below the first point its time; above the last
    // the last time plus the fitted per-byte cost
    double prev_t = pt[0][1];
    if (bytes <= pt[0][0]) return prev_t;
    for (int j = 1; j < n; j++) {
      const double tj = fmax(pt[j][1], prev_t);
      if (bytes <= pt[j][0]) {
        const double t = (log(bytes) - log(pt[j - 1][0])) / (log(pt[j][0]) - log(pt[j - 1][0]));
        return exp(log(prev_t) + t * (log(tj) - log(prev_t)));
      }
      prev_t = tj;
    }
    return prev_t + pf->a2a[i].fit.beta * (bytes - pt[n - 1][0]);
  }
  return -1.0;
}

// Everything one simulation needs, derived once.
typedef struct {
  const moe_cluster *c;
  const moe_sim_variant *v;
  moe_compressor comp;
  int compressed_fwd, compressed_bwd;
  int D, G, r, groups, group_size;
  double n_block;  // rows a device sends one expert
  int cap;         // capacity C, or -1 dropless
  double *bytes;   // (D, D) scratch
  // the profile's layer corrections for this variant (moe_profile_fit_layer):
  // A tasks a2a_scale x modelled + a2a_exch, E tasks comp_scale x modelled +
  // comp_task; identity without them
  double a2a_scale, a2a_exch, comp_scale, comp_task;
  double slow_comp, slow_comm;  // contention factors (1: none)
} sim_ctx;

// Rows a device sends one expert in chunk c (rows chunking).
static double chunk_rows(const sim_ctx *s, int c) {
  if (s->cap < 0) return s->n_block / s->r;
  const double lo = fmin(s->n_block, (double)s->cap * c / s->r);
  const double hi = fmin(s->n_block, (double)s->cap * (c + 1) / s->r);
  return hi - lo;
}

// Rows device src sends device dst in chunk c.
static double pair_rows(const sim_ctx *s, int c, int src, int dst) {
  const double experts = (double)s->v->cfg.num_experts / s->D;
  if (s->groups > 1) {  // peer groups: the whole block in the step of its group distance
    const int gs = src / s->group_size, gd = dst / s->group_size;
    return ((gd - gs + s->groups) % s->groups == c) ? experts * s->n_block : 0.0;
  }
  if (s->r == 1 || s->groups == 1) return experts * chunk_rows(s, c);
  return 0.0;
}

// Wire bytes of `rows` rows of M floats, compressed or not.
static double wire_bytes(const sim_ctx *s, double rows, int compressed) {
  const size_t M = (size_t)s->v->cfg.model_dim;
  if (rows <= 0.0) return 0.0;
  if (!compressed) return rows * (double)M * 4.0;
  // the compressor's exact size for the nearest whole rows, scaled back
  const size_t whole = (size_t)ceil(rows);
  return (double)moe_compress_max_bytes(&s->comp, whole, M) * rows / (double)whole;
}

// Fills s->bytes (D x D) with the wire bytes of chunk c.
static void fill_bytes(sim_ctx *s, int c, int compressed) {
  const int D = s->D;
  for (int a = 0; a < D; a++) {
    for (int b = 0; b < D; b++) {
      s->bytes[(size_t)a * D + b] = a == b ? 0.0 : wire_bytes(s, pair_rows(s, c, a, b), compressed);
    }
  }
}

// Seconds of the all-to-all whose traffic is in s->bytes: with a profile, its
// measured points (else its fit) on the bytes the busiest device sends; else
// the algorithm's link model on the description.
static moe_status bytes_a2a_seconds(moe_ctx *ctx, const sim_ctx *s, double *out) {
  moe_status st = MOE_STATUS_OK;
  const moe_profile *pf = s->v->profile;
  const int D = s->D;
  if (!pf) {
    MOE_TRY(moe_model_a2a_algo_s(ctx, s->c, s->v->a2a, s->bytes, out));
    goto done;
  }
  const moe_linear_fit *f = moe_profile_a2a(pf, s->v->a2a);
  MOE_FAIL_IF(ctx, !f, MOE_STATUS_INVALID_ARG,
              "simulate: the profile '%s' has no model for all-to-all '%s' (calibrate it with moe "
              "calibrate --a2a %s)",
              pf->name, s->v->a2a, s->v->a2a);
  double worst = 0.0;
  for (int a = 0; a < D; a++) {
    double sent = 0.0;
    for (int b = 0; b < D; b++) sent += s->bytes[(size_t)a * D + b];
    worst = fmax(worst, sent);
  }
  const double tp = worst > 0.0 ? a2a_point_time(pf, s->v->a2a, worst) : 0.0;
  *out = worst > 0.0 ? (tp >= 0 ? tp : fmax(0.0, moe_fit_eval(f, worst))) : 0.0;
done:
  return st;
}

// Durations (s) of the tasks of one pass, by their kind and chunk.
static moe_status pass_durations(moe_ctx *ctx, sim_ctx *s, const moe_task_graph *g, int backward,
                                 double *dur) {
  moe_status st = MOE_STATUS_OK;
  const int D = s->D, compressed = backward ? s->compressed_bwd : s->compressed_fwd;
  const double M = s->v->cfg.model_dim, H = s->v->cfg.hidden_dim;
  const double experts_here = (double)s->v->cfg.num_experts / D;
  const moe_profile *pf = s->v->profile;
  double *chunk = NULL;
  double cgbs = s->v->compress_gbs, dgbs = s->v->decompress_gbs;
  if (!(cgbs > 0) || !(dgbs > 0)) {
    double dc = 0, dd = 0;
    MOE_TRY(moe_codec_rate_default(ctx, s->comp.name, &dc, &dd));
    if (!(cgbs > 0)) cgbs = dc;
    if (!(dgbs > 0)) dgbs = dd;
  }
  // per chunk, computed once: the rows the busiest device sends and receives
  // (every kind of task of the chunk needs them) and the all-to-all time (A1
  // and A2 move the same volume under uniform routing)
  const int r = s->r;
  chunk = moe_malloc((size_t)r * 3 * sizeof(double));
  MOE_FAIL_IF(ctx, !chunk, MOE_STATUS_OUT_OF_MEMORY, "simulate: cannot allocate %d chunks", r);
  for (int c = 0; c < r; c++) {
    double max_send = 0.0, max_recv = 0.0;
    for (int d = 0; d < D; d++) {
      double snd = 0.0, rcv = 0.0;
      for (int u = 0; u < D; u++) {
        snd += pair_rows(s, c, d, u);
        rcv += pair_rows(s, c, u, d);
      }
      max_send = fmax(max_send, snd);
      max_recv = fmax(max_recv, rcv);
    }
    chunk[3 * c] = max_send;
    chunk[3 * c + 1] = max_recv;
    chunk[3 * c + 2] = -1.0;  // all-to-all time: computed on first use
  }
  for (int i = 0; i < g->n_tasks; i++) {
    const int c = g->tasks[i].chunk;
    const int kind = g->tasks[i].kind;  // a moe_chunk_task: the graph is moe_chunk_pass_build's
    const double max_send = chunk[3 * c], max_recv = chunk[3 * c + 1];
    if (kind == MOE_CT_A1 || kind == MOE_CT_A2) {
      if (chunk[3 * c + 2] < 0) {
        fill_bytes(s, c, compressed);
        MOE_TRY(bytes_a2a_seconds(ctx, s, &chunk[3 * c + 2]));
      }
      dur[i] = s->a2a_scale * chunk[3 * c + 2] + s->a2a_exch;
    } else if (kind == MOE_CT_E) {
      const double flops = max_recv * (backward ? 8.0 : 4.0) * M * H;
      if (pf && pf->n_expert_points > 0) {
        const double rows_e = max_recv / experts_here;
        dur[i] = max_recv > 0 ? experts_here * expert_point_time(pf, backward, rows_e, M, H) : 0.0;
        // the layer regroups the chunk's rows to expert-major order and back
        if (pf->copy_gbs > 0) dur[i] += 2.0 * max_recv * M * 4.0 / (pf->copy_gbs * 1e9);
      } else if (pf && pf->have_step_fits) {
        // measured expert steps: alpha per expert, beta per FLOP
        const moe_linear_fit *f = backward ? &pf->expert_bwd : &pf->expert_fwd;
        dur[i] = max_recv > 0
                     ? fmax(0.0, experts_here * (f->alpha + f->gamma * M * H) + f->beta * flops)
                     : 0.0;
      } else if (pf) {
        // two GEMMs per expert forward, four backward, each paying alpha
        const double gemms = max_recv > 0 ? (backward ? 4.0 : 2.0) * experts_here : 0.0;
        dur[i] = fmax(0.0, gemms * pf->gemm.alpha + pf->gemm.beta * flops);
      } else {
        dur[i] = flops / (s->c->gemm_tflops * 1e12);
      }
      dur[i] = s->comp_scale * dur[i] + s->comp_task;
    } else {
      // C1 and D2 on the token side, C2 and D1 on the expert side
      const int compress = kind == MOE_CT_C1 || kind == MOE_CT_C2;
      const int token_side = kind == MOE_CT_C1 || kind == MOE_CT_D2;
      const double bytes = (token_side ? max_send : max_recv) * M * 4.0;
      const moe_linear_fit *fc = NULL, *fd = NULL;
      MOE_FAIL_IF(ctx, pf && !moe_profile_codec(pf, s->comp.name, &fc, &fd), MOE_STATUS_INVALID_ARG,
                  "simulate: the profile '%s' has no model for compressor '%s' (calibrate it "
                  "with moe calibrate --compress %s)",
                  pf->name, s->comp.name, s->comp.name);
      if (pf) {
        dur[i] = bytes > 0 ? fmax(0.0, moe_fit_eval(compress ? fc : fd, bytes)) : 0.0;
      } else {
        dur[i] = bytes / ((compress ? cgbs : dgbs) * 1e9);
      }
    }
  }
done:
  moe_free(chunk);
  return st;
}

moe_status moe_simulate_layer(moe_ctx *ctx, const moe_cluster *c, const moe_sim_variant *v,
                              moe_sim_result *out) {
  moe_status st = MOE_STATUS_OK;
  sim_ctx s;
  memset(&s, 0, sizeof s);
  moe_task_graph g;
  moe_schedule sch;
  memset(&g, 0, sizeof g);
  memset(&sch, 0, sizeof sch);
  double *dur = NULL, *end = NULL;
  moe_task_record *rec = NULL;
  MOE_FAIL_IF(ctx, !c || !v || !out, MOE_STATUS_INVALID_ARG,
              "simulate: cluster, variant and out must not be NULL");
  MOE_TRY(moe_cluster_validate(ctx, c));
  MOE_TRY(moe_layer_config_validate(ctx, &v->cfg));
  const moe_schedule_algo *algo = NULL;
  MOE_TRY(moe_schedule_algo_find(ctx, v->schedule, &algo));
  MOE_TRY(moe_compressor_get(ctx, v->compress, &s.comp));
  s.c = c;
  s.v = v;
  s.a2a_scale = s.comp_scale = 1.0;
  s.slow_comp = v->profile && v->profile->slow_compute > 1.0 ? v->profile->slow_compute : 1.0;
  s.slow_comm = v->profile && v->profile->slow_comm > 1.0 ? v->profile->slow_comm : 1.0;
  if (v->profile && v->profile->layer_fit.have) {
    const moe_profile *pf = v->profile;
    // smart's contention factors are fitted apart: they serve peer-group schedules
    const int peer_grouped = algo->chunking == MOE_CHUNK_PEER_GROUPS;
    s.comp_scale = pf->layer_fit.compute_scale;
    s.comp_task = pf->layer_fit.compute_task_s;
    for (int i = 0; i < pf->n_a2a; i++) {
      if (strcmp(pf->a2a[i].name, v->a2a) == 0 && pf->layer_fit.a2a_scale[i] > 0) {
        s.a2a_scale = pf->layer_fit.a2a_scale[i];
        s.a2a_exch = pf->layer_fit.a2a_exchange_s[i];
      }
      if (strcmp(pf->a2a[i].name, v->a2a) != 0) continue;
      const double *sl = peer_grouped && pf->layer_fit.a2a_smart_slow[i][0] >= 1.0
                             ? pf->layer_fit.a2a_smart_slow[i]
                             : pf->layer_fit.a2a_slow[i];
      if (sl[0] >= 1.0) {
        s.slow_comp = sl[0];
        s.slow_comm = sl[1];
      }
    }
  }
  s.D = moe_cluster_devices(c);
  s.G = c->devices_per_node;
  MOE_FAIL_IF(ctx, v->cfg.num_experts % s.D != 0, MOE_STATUS_INVALID_ARG,
              "simulate: experts (%d) must be divisible by the devices (%d)", v->cfg.num_experts,
              s.D);
  MOE_FAIL_IF(ctx, v->compress_backward != 0 && v->compress_backward != 1, MOE_STATUS_INVALID_ARG,
              "simulate: compress_backward (%d) must be 0 or 1", v->compress_backward);
  const int lossy_or_any = !moe_compressor_is_identity(&s.comp);
  s.compressed_fwd = lossy_or_any;
  s.compressed_bwd = lossy_or_any && v->compress_backward;
  if (algo->chunking == MOE_CHUNK_PEER_GROUPS) {
    int gsz = v->group_size > 0 ? v->group_size : s.G;
    if (gsz > s.D) gsz = s.D;
    s.group_size = gsz;
    s.groups = (s.D + gsz - 1) / gsz;
    s.r = s.groups;
    MOE_FAIL_IF(ctx, s.r > 64, MOE_STATUS_INVALID_ARG,
                "simulate: smart with %d peer groups exceeds 64 chunks; set a larger group size",
                s.r);
  } else {
    MOE_FAIL_IF(ctx, v->chunks < 1 || v->chunks > 64, MOE_STATUS_INVALID_ARG,
                "simulate: chunks (%d) must be in [1, 64]", v->chunks);
    s.r = v->chunks;
    s.groups = 1;
    s.group_size = s.D;
  }
  const moe_layer_config *cfg = &v->cfg;
  const double T = cfg->tokens, K = cfg->top_k, E = cfg->num_experts;
  s.cap = moe_layer_capacity(cfg, cfg->tokens);
  s.n_block = K * T / E;
  if (s.cap >= 0 && s.n_block > s.cap) s.n_block = s.cap;
  const int n = MOE_CT_KINDS * s.r;
  s.bytes = moe_malloc((size_t)s.D * (size_t)s.D * sizeof(double));
  dur = moe_calloc((size_t)n, sizeof *dur);
  end = moe_calloc((size_t)n, sizeof *end);
  rec = moe_calloc((size_t)n, sizeof *rec);
  MOE_FAIL_IF(ctx, !s.bytes || !dur || !end || !rec, MOE_STATUS_OUT_OF_MEMORY,
              "simulate: cannot allocate for %d devices", s.D);
  MOE_TRY(moe_task_graph_init(ctx, &g, n, n));
  MOE_TRY(moe_schedule_init(ctx, &sch, n));
  memset(out, 0, sizeof *out);
  out->chunks = s.r;
  for (int dir = 0; dir < 2; dir++) {
    const int compressed = dir ? s.compressed_bwd : s.compressed_fwd;
    MOE_TRY(moe_chunk_pass_build(ctx, algo, s.r, compressed, dir, NULL, NULL, &g, &sch, NULL));
    MOE_TRY(pass_durations(ctx, &s, &g, dir, dur));
    double makespan = 0.0;
    if (v->profile && v->profile->task_overhead > 0) {
      for (int i = 0; i < g.n_tasks; i++) dur[i] += v->profile->task_overhead;
    }
    MOE_TRY(
        moe_schedule_simulate_shared(ctx, &g, &sch, dur, s.slow_comp, s.slow_comm, end, &makespan));
    // starts: a task starts when its stream's previous task and its
    // dependencies have ended (the simulation's rule; under contention a
    // task lasts longer than its solo duration)
    for (int st2 = 0; st2 < MOE_STREAM_COUNT_; st2++) {
      double prev = 0.0;
      for (int j = 0; j < sch.len[st2]; j++) {
        const int t = sch.order[st2][j];
        const int *deps = NULL;
        int nd = 0;
        moe_task_graph_deps(&g, t, &deps, &nd);
        double start = prev;
        for (int d = 0; d < nd; d++) start = fmax(start, end[deps[d]]);
        rec[t].stream = g.tasks[t].stream;
        rec[t].ran = 1;
        rec[t].start_ns = (uint64_t)llround(start * 1e9);
        rec[t].end_ns = (uint64_t)llround(end[t] * 1e9);
        prev = end[t];
      }
    }
    moe_pass_breakdown_compute(rec, g.n_tasks, &out->breakdown[dir]);
    out->pass_ms[dir] = makespan * 1e3;
  }
  // reference numbers: one unchunked forward all-to-all and expert step
  {
    const int saved_r = s.r, saved_groups = s.groups;
    s.r = 1;
    s.groups = 1;
    fill_bytes(&s, 0, 0);
    double t = 0.0;
    const double expert_flops =
        (E / s.D) * s.n_block * s.D * 4.0 * cfg->model_dim * cfg->hidden_dim;
    MOE_TRY(bytes_a2a_seconds(ctx, &s, &t));
    out->expert_ms = (v->profile ? fmax(0.0, moe_fit_eval(&v->profile->gemm, expert_flops))
                                 : expert_flops / (c->gemm_tflops * 1e12)) *
                     1e3;
    out->a2a_ms = t * 1e3;
    s.r = saved_r;
    s.groups = saved_groups;
  }
  const double gate_flops = 2.0 * T * cfg->model_dim * E;
  const double gate_fwd_ms = (v->profile ? fmax(0.0, moe_fit_eval(&v->profile->gemm, gate_flops))
                                         : gate_flops / (c->gemm_tflops * 1e12)) *
                             1e3;
  out->outside_ms = 3.0 * gate_fwd_ms;
  if (v->profile && v->profile->have_step_fits) {
    // measured: gate, softmax, top-k, dispatch, combine, forward and backward
    out->outside_ms =
        fmax(0.0, moe_fit_eval(&v->profile->outside, T * cfg->model_dim * (E + K))) * 1e3;
  }
  if (v->profile && v->profile->layer_fit.have) {
    // measured in the distributed layer itself: replaces the sum below
    out->outside_ms =
        fmax(0.0, moe_fit_eval(&v->profile->layer_fit.outside, T * cfg->model_dim * (E + K))) * 1e3;
  } else if (v->profile) {
    // the distributed layer's own work outside the passes: five small
    // collectives (loss statistics, counts exchange, two agreements, the gate
    // gradient) and two copies of every row per direction (to and from the
    // send order)
    out->outside_ms += 5.0 * v->profile->small_collective * 1e3;
    if (v->profile->copy_gbs > 0) {
      const double rows = K * T;
      out->outside_ms += 4.0 * rows * cfg->model_dim * 4.0 / (v->profile->copy_gbs * 1e9) * 1e3;
    }
  }
  out->fwd_ms = out->outside_ms / 3.0 + out->pass_ms[0];
  out->bwd_ms = 2.0 * out->outside_ms / 3.0 + out->pass_ms[1];
  out->total_ms = out->fwd_ms + out->bwd_ms;
done:
  moe_task_graph_free(&g);
  moe_schedule_free(&sch);
  moe_free(s.bytes);
  moe_free(dur);
  moe_free(end);
  moe_free(rec);
  return st;
}

void moe_roofline_of_layer(const moe_cluster *c, const moe_layer_config *cfg,
                           const moe_sim_result *r, moe_roofline *out) {
  const int D = moe_cluster_devices(c);
  const double T = cfg->tokens, K = cfg->top_k, E = cfg->num_experts;
  const int cap = moe_layer_capacity(cfg, cfg->tokens);
  double n_block = K * T / E;
  if (cap >= 0 && n_block > cap) n_block = cap;
  // every device computes E n_block rows (its E / D experts, n_block rows
  // from each of D devices), 12 M H FLOPs each over forward and backward
  const double flops = (double)D * 12.0 * E * n_block * cfg->model_dim * cfg->hidden_dim;
  const moe_pass_breakdown *b = r->breakdown;
  const double comp = (double)(b[0].compute_ns + b[1].compute_ns) * 1e-9;
  const double comm = (double)(b[0].comm_ns + b[1].comm_ns) * 1e-9;
  memset(out, 0, sizeof *out);
  moe_roofline_point(NULL, c->gemm_tflops * 1e12, flops, D, comp > 0 ? comp : 1e-12,
                     comm > 0 ? comm : 1e-12, r->total_ms * 1e-3, out);
}
