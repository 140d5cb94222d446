// Parm's cases of the randomized equivalence campaign (campaign --parm,
// docs/reliability.md): Parm's layer (include/moe/parm.h) against the
// single-process layer on random cases.
//
// What a case draws (every rank the same, from the case seed and P): the
// MP x EP x ESP layout (DP the rest), the schedule (baseline, s1, s2), SAA,
// chunks (1, 2..8, rarely up to 64) with a row-chunked task schedule, the
// all-to-all algorithm, the executor's wait policy, E (a multiple of EP), K,
// M, H (a multiple of ESP), tokens per data part (MP peers pass the same
// tokens; uneven, 0 on some parts, sometimes on all), spare configured
// tokens, the capacity factor (dropless, tiny, moderate), activation, gate
// convention, renormalisation, aux and z coefficients, check_finite, the
// expert kind, a hot expert and 1 or 2 passes. Compression is not drawn
// (every compressor that is not the identity is lossy; test_parm_layer
// bounds them).
//
// The reference: the single-process layer on the global batch (the data
// parts' tokens in data-index order). With a capacity, the sources that
// apply it are the data parts (baseline and s2) or each MP rank's slice of
// its part (s1), so the reference is assembled per source as in campaign.c:
// one layer per source with the capacity and aux = z = 0, plus one dropless
// layer on the global batch with dy = 0 for the losses and their gradients.
// Compared per case: y and dx of every rank (the whole data part: MP peers
// get the same), aux and z, rows and drops of the rank's gate tokens, the
// gate gradient and every held expert shard's gradients (w1's columns and
// b1's entries of the shard, w2's rows, b2 whole) after all passes.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "campaign.h"
#include "moe/expert.h"
#include "moe/parallel.h"  // MOE_MAX_CHUNKS
#include "moe/parm.h"

struct parm_case {
  uint64_t seed;
  moe_layer_config cfg;  // tokens = the most tokens a data part passes (+ spare)
  moe_parm_config pc;
  int passes;
  int T[MAX_PASSES][MAX_P];  // tokens of data part d in each pass
  int hot;
};

static int split_at(int n, int m, int parts) { return (int)((long long)n * m / parts); }

parm_case *parm_case_draw(uint64_t seed) {
  parm_case *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->seed = seed;
  moe_rng r;
  moe_rng_init(&r, seed, 7);
  moe_parm_config *pc = &c->pc;
  moe_parm_config_default(pc);
  moe_layer_config *cfg = &c->cfg;
  moe_layer_config_default(cfg);
  const int P = g_world;
  int divs[MAX_P], nd = 0;
  for (int d = 1; d <= P; d++)
    if (P % d == 0) divs[nd++] = d;
  for (;;) {  // MP and ESP dividing P together, EP a divisor of the rest
    pc->mp = divs[draw(&r, 0, nd - 1)];
    pc->esp = divs[draw(&r, 0, nd - 1)];
    if (P % (pc->mp * pc->esp) == 0) break;
  }
  {
    const int rest = P / (pc->mp * pc->esp);
    int rd[MAX_P], nr = 0;
    for (int d = 1; d <= rest; d++)
      if (rest % d == 0) rd[nr++] = d;
    pc->ep = rd[draw(&r, 0, nr - 1)];
  }
  pc->schedule = (moe_parm_schedule)draw(&r, 0, MOE_PARM_SCHEDULES - 1);
  pc->saa = draw(&r, 0, 1);
  int na = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&na);
  snprintf(pc->a2a, sizeof pc->a2a, "%s", algos[draw(&r, 0, na - 1)]->name);
  pc->chunks = chance(&r, 0.4) ? 1 : chance(&r, 0.9) ? draw(&r, 2, 8) : draw(&r, 9, MOE_MAX_CHUNKS);
  {
    int ns = 0, nrow = 0;
    const moe_schedule_algo *scheds = moe_schedule_algo_list(&ns);
    const moe_schedule_algo *rows[16];
    for (int i = 0; i < ns && nrow < 16; i++)
      if (scheds[i].chunking == MOE_CHUNK_ROWS) rows[nrow++] = &scheds[i];
    snprintf(pc->task_schedule, sizeof pc->task_schedule, "%s", rows[draw(&r, 0, nrow - 1)]->name);
  }
  const moe_wait_policy waits[] = {MOE_WAIT_BLOCKING, MOE_WAIT_POLL_BACKOFF, MOE_WAIT_ADAPTIVE};
  pc->exec.wait = waits[draw(&r, 0, 2)];
  // the layer
  const int EP = pc->ep, ESP = pc->esp;
  cfg->num_experts = EP * draw(&r, 1, EP >= 8 ? 3 : 24 / EP);
  const int E = cfg->num_experts;
  cfg->top_k = draw(&r, 1, E < 4 ? E : 4);
  cfg->model_dim = chance(&r, 0.1) ? 1 : draw(&r, 1, 24);
  cfg->hidden_dim = ESP * (chance(&r, 0.1) ? 1 : draw(&r, 1, 24 / ESP > 1 ? 24 / ESP : 1));
  const int cap = draw(&r, 0, 9);
  cfg->capacity_factor = cap < 3   ? (chance(&r, 0.5) ? 0.0 : -1.0)     // dropless
                         : cap < 6 ? 0.05 + 0.45 * moe_rng_uniform(&r)  // tiny: drops
                         : cap < 9 ? 0.5 + 1.5 * moe_rng_uniform(&r)    // some drops
                                   : 2.0 + 6.0 * moe_rng_uniform(&r);   // few or none
  cfg->act = (moe_activation)draw(&r, 0, 1);
  cfg->gate_convention = draw(&r, 0, 1);
  cfg->renormalize = draw(&r, 0, 1);
  cfg->aux_loss_coef = chance(&r, 0.25) ? 0.0f : 0.1f * moe_rng_uniform(&r);
  cfg->z_loss_coef = chance(&r, 0.4) ? 0.0f : 0.01f * moe_rng_uniform(&r);
  cfg->check_finite = draw(&r, 0, 1);
  snprintf(cfg->expert, sizeof cfg->expert, "%s",
           moe_expert_kind_get(draw(&r, 0, moe_expert_kind_count() - 1))->name);
  // tokens per data part: uneven, zero on some parts (rarely on all)
  const int D = P / pc->mp;
  c->passes = chance(&r, 0.25) ? 2 : 1;
  int most = 0;
  for (int p = 0; p < c->passes; p++) {
    const int all_zero = chance(&r, 0.02), tiny = chance(&r, 0.15);
    for (int d = 0; d < D; d++) {
      int t = chance(&r, 0.15) ? 0 : tiny ? draw(&r, 1, 2) : draw(&r, 1, 32);
      if (all_zero) t = 0;
      c->T[p][d] = t;
      if (t > most) most = t;
    }
  }
  cfg->tokens = (most > 0 ? most : 1) + (chance(&r, 0.5) ? 0 : draw(&r, 1, 3));
  c->hot = chance(&r, 0.2) ? draw(&r, 0, E - 1) : -1;
  return c;
}

void parm_case_free(parm_case *c) { free(c); }

void parm_case_describe(const parm_case *c, char *buf, size_t len) {
  const moe_layer_config *cfg = &c->cfg;
  const moe_parm_config *pc = &c->pc;
  int n = snprintf(
      buf, len,
      "parm P=%d MPxEPxESP=%dx%dx%d (DP %d) %s%s a2a=%s r=%d %s wait=%s E=%d K=%d M=%d H=%d "
      "f=%.3g %s %s%s aux=%.3g z=%.3g fin=%d expert=%s tok=%d hot=%d passes=%d T=",
      g_world, pc->mp, pc->ep, pc->esp, g_world / (pc->mp * pc->ep * pc->esp),
      moe_parm_schedule_name(pc->schedule), pc->schedule == MOE_PARM_S2 && pc->saa ? "+saa" : "",
      pc->a2a, pc->chunks, pc->task_schedule, moe_wait_policy_name(pc->exec.wait), cfg->num_experts,
      cfg->top_k, cfg->model_dim, cfg->hidden_dim, cfg->capacity_factor,
      moe_activation_name(cfg->act),
      moe_gate_convention_name((moe_gate_convention)cfg->gate_convention),
      cfg->renormalize ? " renorm" : "", cfg->aux_loss_coef, cfg->z_loss_coef, cfg->check_finite,
      cfg->expert, cfg->tokens, c->hot, c->passes);
  const int D = g_world / pc->mp;
  for (int p = 0; p < c->passes && n > 0 && (size_t)n < len; p++) {
    for (int d = 0; d < D && n > 0 && (size_t)n < len; d++) {
      n += snprintf(buf + n, len - (size_t)n, "%s%d", d ? "," : (p ? "/" : ""), c->T[p][d]);
    }
  }
}

void parm_case_count(const parm_case *c) {
  cov(moe_parm_schedule_name(c->pc.schedule));
  if (c->pc.schedule == MOE_PARM_S2 && c->pc.saa && c->pc.mp > 1) cov("saa");
  if (c->pc.mp > 1) cov("mp>1");
  if (c->pc.esp > 1) cov("esp>1");
  if (c->pc.mp * c->pc.ep * c->pc.esp < g_world) cov("dp>1");
  if (c->pc.chunks > 1) cov("chunks>1");
  int n = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&n);
  for (int i = 0; i < n; i++)
    if (strcmp(algos[i]->name, c->pc.a2a) == 0) cov(algos[i]->name);
  const moe_schedule_algo *sc = moe_schedule_algo_list(&n);
  for (int i = 0; i < n; i++)
    if (c->pc.chunks > 1 && strcmp(sc[i].name, c->pc.task_schedule) == 0) cov(sc[i].name);
  cov(c->cfg.capacity_factor > 0 ? "capacity" : "dropless");
  if (c->hot >= 0) cov("hot-expert");
  if (c->passes > 1) cov("2-passes");
}

// One pass's reference for this rank: its data part's rows.
typedef struct {
  float *x, *dy;          // (Tg, M) the global batch
  int Tg, off;            // global tokens; first row of my data part
  float *y_ref, *dx_ref;  // (T_d, M)
  float aux, z;
  int rows, dropped;  // of my gate tokens (s1: my slice)
} parm_ref;

int parm_case_run(const parm_case *c, int *dropped_any) {
  const moe_layer_config *cfg = &c->cfg;
  const moe_parm_config *pc = &c->pc;
  const int M = cfg->model_dim, E = cfg->num_experts, H = cfg->hidden_dim;
  const int P = g_world, D = P / pc->mp;
  const int dropless = !(cfg->capacity_factor > 0.0);
  const int s1 = pc->schedule == MOE_PARM_S1, S = s1 ? pc->mp : 1;  // sources per data part
  const int d_me = moe_parm_data_index(pc, P, g_rank);
  const moe_parm_coords me = moe_parm_coords_of(pc, P, g_rank);
  verdict v = {0, ""};
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_parm_layer *L = NULL;
  moe_layer *R = NULL, *G = NULL, *B = NULL;
  parm_ref pr[MAX_PASSES];
  memset(pr, 0, sizeof pr);
  float *y = NULL, *dx = NULL, *zeros = NULL;
  *dropped_any = 0;

  moe_status st = moe_parm_layer_create(ctx, MPI_COMM_WORLD, cfg, pc, &L);
  if (st != MOE_STATUS_OK) {
    fail(&v, "create rejected a valid config: %s: %s", moe_status_str(st), moe_ctx_error(ctx));
    goto verdict;
  }
  moe_parm_layer_init_params(L, c->seed);
  const moe_parm_tensors t = moe_parm_layer_get_tensors(L);
  set_hot(t.wg, c->hot);
  moe_parm_layer_zero_grad(L);

  // references (every rank builds the whole reference; the cases are tiny)
  int Tg_max = 1;
  for (int p = 0; p < c->passes; p++) {
    parm_ref *q = &pr[p];
    for (int d = 0; d < D; d++) {
      if (d == d_me) q->off = q->Tg;
      q->Tg += c->T[p][d];
    }
    if (q->Tg > Tg_max) Tg_max = q->Tg;
    pass_inputs(c->seed, p, q->Tg, M, c->hot, &q->x, &q->dy);
    q->y_ref = fzero((size_t)c->T[p][d_me] * M);
    q->dx_ref = fzero((size_t)c->T[p][d_me] * M);
  }
  if (reference_layers(ctx, cfg, Tg_max, c->seed, c->hot, &R, &G, &B) != MOE_STATUS_OK) {
    fail(&v, "reference create: %s", moe_ctx_error(ctx));
    goto verdict;
  }
  zeros = fzero((size_t)Tg_max * M);
  for (int p = 0; p < c->passes && !v.failed; p++) {
    parm_ref *q = &pr[p];
    const int Td = c->T[p][d_me];
    moe_layer_stats s;
    float *yg = fzero((size_t)q->Tg * M), *dxg = fzero((size_t)q->Tg * M);
    if (dropless) {
      if (moe_layer_forward(R, q->x, q->Tg, yg, &s) != MOE_STATUS_OK ||
          moe_layer_backward(R, q->dy, dxg) != MOE_STATUS_OK)
        fail(&v, "reference pass %d: %s", p, moe_ctx_error(ctx));
      memcpy(q->y_ref, yg + (size_t)q->off * M, (size_t)Td * M * sizeof(float));
      memcpy(q->dx_ref, dxg + (size_t)q->off * M, (size_t)Td * M * sizeof(float));
      const int gate_tokens = s1 ? split_at(Td, me.mp + 1, S) - split_at(Td, me.mp, S) : Td;
      q->rows = gate_tokens * cfg->top_k;
      q->dropped = 0;
    } else {
      if (moe_layer_forward(G, q->x, q->Tg, yg, &s) != MOE_STATUS_OK ||
          moe_layer_backward(G, zeros, dxg) != MOE_STATUS_OK)
        fail(&v, "loss reference pass %d: %s", p, moe_ctx_error(ctx));
      memcpy(q->dx_ref, dxg + (size_t)q->off * M, (size_t)Td * M * sizeof(float));
      // the sources: each data part, or (s1) each MP slice of it
      for (int d = 0, off = 0; d < D; off += c->T[p][d], d++) {
        for (int m = 0; m < S; m++) {
          const int lo = split_at(c->T[p][d], m, S), n = split_at(c->T[p][d], m + 1, S) - lo;
          float *ys = fzero((size_t)n * M), *dxs = fzero((size_t)n * M);
          moe_layer_stats sr;
          if (moe_layer_forward(B, q->x + (size_t)(off + lo) * M, n, ys, &sr) != MOE_STATUS_OK ||
              moe_layer_backward(B, q->dy + (size_t)(off + lo) * M, dxs) != MOE_STATUS_OK)
            fail(&v, "part-%d slice-%d reference pass %d: %s", d, m, p, moe_ctx_error(ctx));
          if (sr.dropped > 0) *dropped_any = 1;
          if (d == d_me) {
            memcpy(q->y_ref + (size_t)lo * M, ys, (size_t)n * M * sizeof(float));
            for (size_t i = 0; i < (size_t)n * M; i++) q->dx_ref[(size_t)lo * M + i] += dxs[i];
            if (!s1 || m == me.mp) {
              q->rows = sr.rows;
              q->dropped = sr.dropped;
            }
          }
          free(ys);
          free(dxs);
        }
      }
    }
    q->aux = s.aux_loss;
    q->z = s.z_loss;
    free(yg);
    free(dxg);
  }
  if (v.failed) goto verdict;

  // the distributed passes
  y = fzero((size_t)cfg->tokens * M);
  dx = fzero((size_t)cfg->tokens * M);
  for (int p = 0; p < c->passes; p++) {
    parm_ref *q = &pr[p];
    const int Td = c->T[p][d_me];
    moe_layer_stats s;
    memset(&s, 0, sizeof s);
    st = moe_parm_layer_forward(L, q->x + (size_t)q->off * M, Td, y, &s);
    if (st != MOE_STATUS_OK) {
      fail(&v, "pass %d forward: %s: %s", p, moe_status_str(st), moe_ctx_error(ctx));
      break;
    }
    memset(dx, 0, (size_t)cfg->tokens * M * sizeof(float));
    st = moe_parm_layer_backward(L, q->dy + (size_t)q->off * M, dx);
    if (st != MOE_STATUS_OK) {
      fail(&v, "pass %d backward: %s: %s", p, moe_status_str(st), moe_ctx_error(ctx));
      break;
    }
    compare_pass(&v, p, y, dx, &s, q->y_ref, q->dx_ref, q->aux, q->z, q->rows, q->dropped,
                 (size_t)Td * M);
  }
  if (!v.failed) {
    // gradients after every pass: the gate (whole), my shards of my home experts
    moe_layer_tensors rt = moe_layer_get_tensors(dropless ? R : B);
    float *dwg_ref = fzero((size_t)M * E);
    memcpy(dwg_ref, rt.dwg, (size_t)M * E * sizeof(float));
    if (!dropless) {
      const moe_layer_tensors gt = moe_layer_get_tensors(G);
      for (size_t i = 0; i < (size_t)M * E; i++) dwg_ref[i] += gt.dwg[i];
    }
    close_to(&v, Q_DWG, "dwg", t.dwg, dwg_ref, (size_t)M * E);
    free(dwg_ref);
    const size_t f = (size_t)t.home_first, n = (size_t)t.home_count, hs = (size_t)t.hs;
    const size_t s0 = (size_t)t.shard * hs;
    float *w1 = fzero(n * M * hs), *b1 = fzero(n * hs), *w2 = fzero(n * hs * M);
    for (size_t el = 0; el < n; el++) {
      for (size_t m = 0; m < (size_t)M; m++)
        memcpy(w1 + (el * M + m) * hs, rt.dw1 + ((f + el) * M + m) * H + s0, hs * sizeof(float));
      memcpy(b1 + el * hs, rt.db1 + (f + el) * H + s0, hs * sizeof(float));
      memcpy(w2 + el * hs * M, rt.dw2 + ((f + el) * H + s0) * M, hs * M * sizeof(float));
    }
    close_to(&v, Q_DW1, "dw1 (shard)", t.dw1, w1, n * M * hs);
    close_to(&v, Q_DB1, "db1 (shard)", t.db1, b1, n * hs);
    close_to(&v, Q_DW2, "dw2 (shard)", t.dw2, w2, n * hs * M);
    close_to(&v, Q_DB2, "db2", t.db2, rt.db2 + f * M, n * M);
    free(w1);
    free(b1);
    free(w2);
  }

verdict:;
  const int any = verdict_agree(&v, dropped_any);
  moe_parm_layer_destroy(L);
  moe_layer_destroy(R);
  moe_layer_destroy(G);
  moe_layer_destroy(B);
  moe_ctx_destroy(ctx);
  for (int p = 0; p < MAX_PASSES; p++) {
    free(pr[p].x);
    free(pr[p].dy);
    free(pr[p].y_ref);
    free(pr[p].dx_ref);
  }
  free(y);
  free(dx);
  free(zeros);
  return !any;
}
