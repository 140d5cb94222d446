// Randomized equivalence campaign (issue 18, item 2): the expert-parallel layer
// (include/moe/parallel.h) against the single-process layer (include/moe/layer.h)
// on random cases drawn from a seeded Philox stream.
//
//   mpirun -n P campaign --seed S --cases N [--first I] [--verbose] [--timeout SEC]
//   mpirun -n P campaign --case-seed X [--verbose]          (rerun one case)
//
// What a case draws (every rank draws the same case from the case seed and P):
// the DP x EP layout (EP a divisor of P, contiguous or strided), ranks per node
// (automatic or a divisor of P), the all-to-all algorithm, schedule, compressor
// (lossless entries only) and expert kind from their catalogues, the grouped
// size, chunks (1..64), compress_backward, the executor's wait policy, E (a
// multiple of EP), K, M, H, tokens per rank (uneven, 0 on some ranks, sometimes
// on all), spare configured tokens, the capacity factor (dropless, tiny factors
// that drop, moderate ones), activation, gate convention, renormalisation, aux
// and z coefficients, check_finite, a "hot" expert most tokens choose, expert
// replicas, and 1 or 2 passes (the second one accumulates gradients).
// Configurations the documentation says the layer rejects (a hierarchical
// all-to-all on nodes holding unequal shares of an EP group, E not divisible by
// EP) are drawn rarely, and then every rank must get INVALID_ARG.
//
// The reference: the single-process layer on the global batch (every rank's
// tokens in rank order). Dropless: one moe_layer on the global batch. With a
// capacity factor the distributed layer applies capacity per source rank
// (docs/distributed.md), so the reference is assembled from single-process
// layers, using that the aux and z losses depend only on the gate (before
// dropping) and that their gradients add to the rest:
//   - one moe_layer per source rank r on r's tokens, with the case's capacity
//     and aux = z = 0: y, the main part of dx, of the gate gradient and every
//     expert gradient (summed over r), kept and dropped choices;
//   - one dropless moe_layer on the global batch with dy = 0 and the case's
//     coefficients: the aux and z losses and their parts of dx and of the gate
//     gradient.
// Compared per case: y and dx of every rank, the aux and z losses, the gate
// gradient, the gradients of every home expert (after all passes), rows and
// drops per rank, and the routing plan (expert of every choice and, with
// capacity, its slot, exactly; its gate weight to tolerance).
//
// Tolerance: max |got - ref| over a tensor <= REL_TOL * max |ref| of that
// tensor (test_ep_layer's criterion), plus ABS_TOL for tensors whose entries
// are sums that cancel to ~0. See docs/reliability.md.
//
// A failing case prints MISMATCH and a one-line command reproducing it; a case
// that does not finish within --timeout seconds prints HANG and its command on
// every rank and ends the job (exit 3). Exit: 0 all cases equal, 1 a mismatch,
// 2 bad arguments.
//
// Load balancing's copies are drawn as replicas, half of them as one placement
// with its slots (moe_ep_layer_set_placement); the policies that choose them
// are not (any placement must give the same result). Parm's layouts are drawn
// with --parm (tests/campaign_parm.c). Not drawn: lossy compressors (they
// change results by design; tests/test_ep_sched.c bounds them).
#define _POSIX_C_SOURCE 200809L
#include "campaign.h"

// The launcher of a reproduce line: Open MPI's mpirun needs --oversubscribe
// for more ranks than cores; MPICH's mpiexec takes no such flag.
#if defined(OPEN_MPI) && OPEN_MPI
#define LAUNCH "mpirun -n %d --oversubscribe "
#else
#define LAUNCH "mpiexec -n %d "
#endif

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/compress.h"
#include "moe/expert.h"
#include "moe/moe.h"
#include "moe/parallel.h"

#define MAX_REPLICAS 6

// ---- the case ------------------------------------------------------------------------------

typedef struct {
  uint64_t seed;
  moe_layer_config cfg;  // tokens = the most tokens any rank passes (+ spare)
  moe_parallel_config pc;
  int passes;
  int T[MAX_PASSES][MAX_P];  // tokens of each rank in each pass
  int hot;                   // -1, or an expert a constant feature pulls most tokens to
  int nrep, rep_e[MAX_REPLICAS], rep_p[MAX_REPLICAS];
  int placed;         // 1: the replica pairs as one placement of expert copies (set_placement)
  int expect_reject;  // 1: the docs say create fails (why in reject_why)
  char reject_why[96];
} camp_case;

int g_rank, g_world;
static int *g_auto_nodes;  // node of each rank with ranks_per_node = 0
int g_verbose;
static char g_repro[512];  // the current case's reproduce line (the alarm handler prints it)
static const char *g_prog;

int draw(moe_rng *r, int lo, int hi) {  // uniform in [lo, hi]
  return lo + (int)(moe_rng_u32(r) % (uint32_t)(hi - lo + 1));
}
int chance(moe_rng *r, double p) { return moe_rng_uniform(r) < p; }

// The seed of case i of a campaign with seed S (Philox of (i, S)).
static uint64_t case_seed_of(uint64_t S, uint64_t i) {
  const uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(i >> 32), 0x63616d70u, 0};
  const uint32_t key[2] = {(uint32_t)S, (uint32_t)(S >> 32)};
  uint32_t out[4];
  moe_philox4x32_10(ctr, key, out);
  return ((uint64_t)out[1] << 32 | out[0]) >> 1;  // 63 bits: prints the same signed or not
}

// 1 when every EP group has the same number G of members on each node it
// spans and its members are node-contiguous (moe_group.uniform), for the
// world's node ids `nodes`.
static int groups_uniform(const moe_parallel_config *pc, const int *nodes) {
  const int EP = pc->ep_size, DP = g_world / EP;
  for (int g = 0; g < DP; g++) {
    int node_of[MAX_P], ids[MAX_P], n_ids = 0, size[MAX_P] = {0};
    for (int i = 0; i < EP; i++) {
      const int r = pc->ep_strided ? g + i * DP : g * EP + i;
      int id = -1;
      for (int j = 0; j < n_ids; j++)
        if (ids[j] == nodes[r]) id = j;
      if (id < 0) {
        ids[n_ids] = nodes[r];
        id = n_ids++;
      }
      node_of[i] = id;
      size[id]++;
    }
    const int G = size[0];
    for (int i = 0; i < EP; i++) {
      if (size[node_of[i]] != G || node_of[i] != i / G) return 0;
    }
  }
  return 1;
}

static void draw_case(uint64_t seed, camp_case *c) {
  memset(c, 0, sizeof *c);
  c->seed = seed;
  moe_rng r;
  moe_rng_init(&r, seed, 0);
  moe_parallel_config *pc = &c->pc;
  moe_parallel_config_default(pc);
  moe_layer_config *cfg = &c->cfg;
  moe_layer_config_default(cfg);
  const int P = g_world;
  // layout: EP a divisor of P, strided only when it differs from contiguous
  int divs[MAX_P], nd = 0;
  for (int d = 1; d <= P; d++)
    if (P % d == 0) divs[nd++] = d;
  int na = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&na);
  const int want_reject = chance(&r, 0.03);
  for (int attempt = 0;; attempt++) {
    pc->ep_size = divs[draw(&r, 0, nd - 1)];
    pc->ep_strided = pc->ep_size > 1 && pc->ep_size < P ? draw(&r, 0, 1) : 0;
    pc->ranks_per_node = chance(&r, 0.35) ? 0 : divs[draw(&r, 0, nd - 1)];
    const moe_a2a_algo *a = algos[draw(&r, 0, na - 1)];
    snprintf(pc->a2a, sizeof pc->a2a, "%s", a->name);
    int nodes[MAX_P];
    for (int q = 0; q < P; q++)
      nodes[q] = pc->ranks_per_node > 0 ? q / pc->ranks_per_node : g_auto_nodes[q];
    const int ok = !a->needs_uniform_nodes || groups_uniform(pc, nodes);
    if (ok && !(want_reject && attempt < 20)) break;
    if (!ok && want_reject) {  // keep it: create must fail on every rank
      c->expect_reject = 1;
      snprintf(c->reject_why, sizeof c->reject_why, "%s needs uniform nodes", a->name);
      break;
    }
  }
  pc->grouped_size = chance(&r, 0.5) ? 0 : draw(&r, 1, pc->ep_size + 1);
  int ns = 0;
  const moe_schedule_algo *scheds = moe_schedule_algo_list(&ns);
  snprintf(pc->schedule, sizeof pc->schedule, "%s", scheds[draw(&r, 0, ns - 1)].name);
  pc->chunks = chance(&r, 0.3) ? 1 : chance(&r, 0.9) ? draw(&r, 2, 8) : draw(&r, 9, MOE_MAX_CHUNKS);
  // lossless compressors of this build
  int nc = 0, nlossless = 0;
  const moe_compressor_entry *const *comps = moe_compressor_list(&nc);
  const moe_compressor_entry *lossless[32];
  for (int i = 0; i < nc && nlossless < 32; i++) {
    if (comps[i]->available && comps[i]->codec.lossless) lossless[nlossless++] = comps[i];
  }
  moe_compressor_default_spec(lossless[draw(&r, 0, nlossless - 1)], pc->compress,
                              sizeof pc->compress);
  pc->compress_backward = draw(&r, 0, 1);
  const moe_wait_policy waits[] = {MOE_WAIT_BLOCKING, MOE_WAIT_POLL_BACKOFF, MOE_WAIT_ADAPTIVE};
  pc->exec.wait = waits[draw(&r, 0, 2)];
  // the layer
  const int EP = pc->ep_size;
  const int per = draw(&r, 1, EP >= 8 ? 3 : 24 / EP);  // experts per EP rank
  cfg->num_experts = EP * per;
  if (!c->expect_reject && chance(&r, 0.02) && EP > 1) {
    cfg->num_experts = EP * per + draw(&r, 1, EP - 1);
    c->expect_reject = 1;
    snprintf(c->reject_why, sizeof c->reject_why, "E=%d not divisible by EP=%d", cfg->num_experts,
             EP);
  }
  const int E = cfg->num_experts;
  cfg->top_k = draw(&r, 1, E < 4 ? E : 4);
  cfg->model_dim = chance(&r, 0.1) ? 1 : draw(&r, 1, 24);
  cfg->hidden_dim = chance(&r, 0.1) ? 1 : draw(&r, 1, 24);
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
  // tokens: uneven, zero on some ranks (rarely on all), tiny or up to 32
  c->passes = chance(&r, 0.25) ? 2 : 1;
  int most = 0;
  for (int p = 0; p < c->passes; p++) {
    const int all_zero = chance(&r, 0.02), tiny = chance(&r, 0.15);
    for (int q = 0; q < P; q++) {
      int t = chance(&r, 0.15) ? 0 : tiny ? draw(&r, 1, 2) : draw(&r, 1, 32);
      if (all_zero) t = 0;
      c->T[p][q] = t;
      if (t > most) most = t;
    }
  }
  cfg->tokens = (most > 0 ? most : 1) + (chance(&r, 0.5) ? 0 : draw(&r, 1, 3));
  c->hot = chance(&r, 0.2) ? draw(&r, 0, E - 1) : -1;
  // replicas: (expert, EP rank) pairs off the expert's home
  if (EP > 1 && !c->expect_reject && chance(&r, 0.35)) {
    const int want = draw(&r, 1, MAX_REPLICAS);
    for (int i = 0; i < want; i++) {
      const int e = draw(&r, 0, E - 1), p = draw(&r, 0, EP - 1);
      if (p == e / (E / EP)) continue;
      int dup = 0;
      for (int j = 0; j < c->nrep; j++) dup |= c->rep_e[j] == e && c->rep_p[j] == p;
      if (dup) continue;
      c->rep_e[c->nrep] = e;
      c->rep_p[c->nrep] = p;
      c->nrep++;
    }
    // half of them as a placement of load balancing's copies: slots for the
    // most copies one rank holds (sometimes one more than needed)
    if (c->nrep > 0 && chance(&r, 0.5)) {
      int busiest = 0;
      for (int p = 0; p < EP; p++) {
        int n = 0;
        for (int i = 0; i < c->nrep; i++) n += c->rep_p[i] == p;
        if (n > busiest) busiest = n;
      }
      c->placed = 1;
      c->pc.copy_slots = busiest + (busiest < E - E / EP && chance(&r, 0.3) ? 1 : 0);
    }
  }
}

static void describe(const camp_case *c, char *buf, size_t len) {
  const moe_layer_config *cfg = &c->cfg;
  const moe_parallel_config *pc = &c->pc;
  int n = snprintf(
      buf, len,
      "P=%d DPxEP=%dx%d%s rpn=%d a2a=%s g=%d sched=%s r=%d comp=%s cb=%d wait=%s "
      "E=%d K=%d M=%d H=%d f=%.3g %s %s%s aux=%.3g z=%.3g fin=%d expert=%s tok=%d "
      "hot=%d rep=%d%s passes=%d T=",
      g_world, g_world / pc->ep_size, pc->ep_size, pc->ep_strided ? "s" : "c", pc->ranks_per_node,
      pc->a2a, pc->grouped_size, pc->schedule, pc->chunks, pc->compress, pc->compress_backward,
      moe_wait_policy_name(pc->exec.wait), cfg->num_experts, cfg->top_k, cfg->model_dim,
      cfg->hidden_dim, cfg->capacity_factor, moe_activation_name(cfg->act),
      moe_gate_convention_name((moe_gate_convention)cfg->gate_convention),
      cfg->renormalize ? " renorm" : "", cfg->aux_loss_coef, cfg->z_loss_coef, cfg->check_finite,
      cfg->expert, cfg->tokens, c->hot, c->nrep, c->placed ? " placed" : "", c->passes);
  for (int p = 0; p < c->passes && n > 0 && (size_t)n < len; p++) {
    for (int q = 0; q < g_world && n > 0 && (size_t)n < len; q++) {
      n += snprintf(buf + n, len - (size_t)n, "%s%d", q ? "," : (p ? "/" : ""), c->T[p][q]);
    }
  }
  if (c->expect_reject && n > 0 && (size_t)n < len)
    snprintf(buf + n, len - (size_t)n, " expect-reject(%s)", c->reject_why);
}

// ---- comparisons ---------------------------------------------------------------------------

// The worst error seen per quantity, as a fraction of the tolerance's relative part.
static const char *q_names[Q_COUNT] = {"y",   "dx",  "aux", "z",   "dwg",
                                       "dw1", "db1", "dw2", "db2", "weight"};
static double g_worst[Q_COUNT], g_worst_abs[Q_COUNT], g_worst_tol[Q_COUNT];
static int g_plant = -1;  // --plant NAME: report an error in that quantity (self-check)
static int g_plant_hang;  // --plant hang: the last rank stalls in the first case

void fail(verdict *v, const char *fmt, ...) {
  if (!v->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->first, sizeof v->first, fmt, ap);
    va_end(ap);
  }
  v->failed++;
}

// max |got - ref| <= REL_TOL * max |ref| + ABS_TOL over the tensor.
void close_to(verdict *v, int q, const char *what, const float *got, const float *ref, size_t n) {
  double diff = 0.0, mag = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - ref[i]);
    if (!(d <= diff)) {  // NaN counts as worst
      diff = isnan(d) ? INFINITY : d;
      worst = i;
    }
    if (fabs(ref[i]) > mag) mag = fabs(ref[i]);
  }
  const double rel = mag > 0 ? diff / mag : (diff > 0 ? INFINITY : 0.0);
  if (mag > 0 && rel > g_worst[q]) g_worst[q] = rel;
  if (q == g_plant && n > 0) diff = 2 * (REL_TOL * mag + ABS_TOL);  // --plant: must be reported
  if (mag > 0 && diff > g_worst_abs[q]) g_worst_abs[q] = diff;
  const double used = diff / (REL_TOL * mag + ABS_TOL);  // share of the tolerance
  if (used > g_worst_tol[q]) g_worst_tol[q] = used;
  if (!(diff <= REL_TOL * mag + ABS_TOL)) {
    fail(v, "%s: max |diff| %.3g at %zu (got %.9g, ref %.9g), max |ref| %.3g, rel %.3g > %.1g",
         what, diff, worst, n ? got[worst] : 0.0, n ? ref[worst] : 0.0, mag, rel, REL_TOL);
  }
}

void equal_int(verdict *v, const char *what, long got, long ref) {
  if (got != ref) fail(v, "%s: got %ld, reference %ld", what, got, ref);
}

// ---- one case ------------------------------------------------------------------------------

typedef struct {
  float *x, *dy;          // (Tg, M) global batch of each pass
  int Tg, off;            // global tokens; first row of this rank
  float *y_ref, *dx_ref;  // (T_me, M)
  float aux, z;
  int rows, dropped;
  int32_t *expert, *slot;  // (T_me, K) reference routing of this rank's tokens
  float *weight;           // (T_me, K)
} pass_ref;

static void on_alarm(int sig) {
  (void)sig;
  const ssize_t w = write(2, g_repro, strlen(g_repro));
  (void)w;
  _exit(3);
}

float *fzero(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

void set_hot(float *wg, int hot) {
  if (hot >= 0) wg[hot] += 4.0f;  // wg[0, hot]: feature 0 (set to 1) pulls to `hot`
}

void pass_inputs(uint64_t seed, int pass, int Tg, int M, int hot, float **x, float **dy) {
  *x = fzero((size_t)Tg * M);
  *dy = fzero((size_t)Tg * M);
  moe_rng rx;
  moe_rng_init(&rx, seed, 100 + (uint64_t)pass);
  moe_rng_fill_uniform(&rx, *x, (size_t)Tg * M, -1.0f, 1.0f);
  moe_rng_init(&rx, seed, 200 + (uint64_t)pass);
  moe_rng_fill_uniform(&rx, *dy, (size_t)Tg * M, -1.0f, 1.0f);
  if (hot >= 0)
    for (int i = 0; i < Tg; i++) (*x)[(size_t)i * M] = 1.0f;
}

moe_status reference_layers(moe_ctx *ctx, const moe_layer_config *cfg, int Tg_max, uint64_t seed,
                            int hot, moe_layer **R, moe_layer **G, moe_layer **B) {
  moe_layer_config gcfg = *cfg;
  gcfg.tokens = Tg_max;
  moe_status st = MOE_STATUS_OK;
  if (!(cfg->capacity_factor > 0.0)) {
    st = moe_layer_create(ctx, &gcfg, R);
  } else {
    gcfg.capacity_factor = 0.0;  // the losses do not depend on dropping
    moe_layer_config bcfg = *cfg;
    bcfg.aux_loss_coef = 0.0f;
    bcfg.z_loss_coef = 0.0f;
    st = moe_layer_create(ctx, &gcfg, G);
    if (st == MOE_STATUS_OK) st = moe_layer_create(ctx, &bcfg, B);
  }
  moe_layer *all[3] = {*R, *G, *B};
  for (int i = 0; i < 3 && st == MOE_STATUS_OK; i++) {
    if (!all[i]) continue;
    moe_layer_init_params(all[i], seed);
    set_hot(moe_layer_get_tensors(all[i]).wg, hot);
    moe_layer_zero_grad(all[i]);
  }
  return st;
}

void compare_pass(verdict *v, int pass, const float *y, const float *dx, const moe_layer_stats *s,
                  const float *y_ref, const float *dx_ref, float aux, float z, int rows,
                  int dropped, size_t n) {
  char what[64];
  snprintf(what, sizeof what, "pass %d y", pass);
  close_to(v, Q_Y, what, y, y_ref, n);
  snprintf(what, sizeof what, "pass %d dx", pass);
  close_to(v, Q_DX, what, dx, dx_ref, n);
  snprintf(what, sizeof what, "pass %d aux", pass);
  close_to(v, Q_AUX, what, &s->aux_loss, &aux, 1);
  snprintf(what, sizeof what, "pass %d z", pass);
  close_to(v, Q_Z, what, &s->z_loss, &z, 1);
  snprintf(what, sizeof what, "pass %d rows", pass);
  equal_int(v, what, s->rows, rows);
  snprintf(what, sizeof what, "pass %d dropped", pass);
  equal_int(v, what, s->dropped, dropped);
}

int verdict_agree(const verdict *v, int *dropped_any) {
  int bad = v->failed ? 1 : 0, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, dropped_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any) {
    for (int r = 0; r < g_world; r++) {  // rank by rank, so the lines do not interleave
      if (r == g_rank && bad) {
        fprintf(stderr, "  rank %d: %d failure(s), first: %s\n", g_rank, v->failed, v->first);
        fflush(stderr);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
  return any;
}

// Runs one case; returns 1 when it matched (or was rejected as documented) on
// every rank, 0 on a mismatch. *rejected = 1 for an expected rejection.
static int run_case(const camp_case *c, int *rejected, int *dropped_any) {
  const moe_layer_config *cfg = &c->cfg;
  const int M = cfg->model_dim, E = cfg->num_experts, K = cfg->top_k, H = cfg->hidden_dim;
  const int P = g_world, me = g_rank;
  const int dropless = !(cfg->capacity_factor > 0.0);
  verdict v = {0, ""};
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_ep_layer *L = NULL;
  moe_layer *R = NULL, *G = NULL, *B = NULL;
  pass_ref pr[MAX_PASSES];
  memset(pr, 0, sizeof pr);
  float *y = NULL, *dx = NULL, *zeros = NULL;
  *rejected = 0;
  *dropped_any = 0;

  // the distributed layer (first: a rejection needs no reference)
  moe_status st = moe_ep_layer_create(ctx, MPI_COMM_WORLD, cfg, &c->pc, &L);
  if (c->expect_reject) {
    if (st != MOE_STATUS_INVALID_ARG)
      fail(&v, "create of a config the docs reject (%s) returned %s", c->reject_why,
           moe_status_str(st));
    *rejected = 1;
    goto verdict;
  }
  if (st != MOE_STATUS_OK) {
    fail(&v, "create rejected a valid config: %s: %s", moe_status_str(st), moe_ctx_error(ctx));
    goto verdict;
  }
  moe_ep_layer_init_params(L, c->seed);
  moe_ep_tensors t = moe_ep_layer_get_tensors(L);
  set_hot(t.wg, c->hot);
  if (c->placed) {
    const int EP = c->pc.ep_size;
    uint8_t *rep = calloc((size_t)E * EP, 1);  // (E, EP)
    for (int i = 0; rep && i < c->nrep; i++) rep[(size_t)c->rep_e[i] * EP + c->rep_p[i]] = 1;
    st = rep ? moe_ep_layer_set_placement(L, rep) : MOE_STATUS_OUT_OF_MEMORY;
    free(rep);
    if (st != MOE_STATUS_OK) {
      fail(&v, "set_placement of %d copies: %s", c->nrep, moe_ctx_error(ctx));
      goto verdict;
    }
  }
  for (int i = 0; !c->placed && i < c->nrep; i++) {
    st = moe_ep_layer_set_replica(L, c->rep_e[i], c->rep_p[i], 1);
    if (st != MOE_STATUS_OK) {
      fail(&v, "set_replica(%d, %d): %s", c->rep_e[i], c->rep_p[i], moe_ctx_error(ctx));
      goto verdict;
    }
  }
  moe_ep_layer_zero_grad(L);

  // references (every rank builds the whole reference; the cases are tiny)
  int Tg_max = 1;
  for (int p = 0; p < c->passes; p++) {
    pass_ref *q = &pr[p];
    q->Tg = 0;
    for (int r = 0; r < P; r++) {
      if (r == me) q->off = q->Tg;
      q->Tg += c->T[p][r];
    }
    if (q->Tg > Tg_max) Tg_max = q->Tg;
    pass_inputs(c->seed, p, q->Tg, M, c->hot, &q->x, &q->dy);
    const int Tm = c->T[p][me];
    q->y_ref = fzero((size_t)Tm * M);
    q->dx_ref = fzero((size_t)Tm * M);
    q->expert = calloc((size_t)Tm * K + 1, sizeof(int32_t));
    q->slot = calloc((size_t)Tm * K + 1, sizeof(int32_t));
    q->weight = fzero((size_t)Tm * K);
  }
  if (reference_layers(ctx, cfg, Tg_max, c->seed, c->hot, &R, &G, &B) != MOE_STATUS_OK) {
    fail(&v, "reference create: %s", moe_ctx_error(ctx));
    goto verdict;
  }
  zeros = fzero((size_t)Tg_max * M);
  for (int p = 0; p < c->passes; p++) {
    pass_ref *q = &pr[p];
    const int Tm = c->T[p][me];
    moe_layer_stats s;
    if (dropless) {
      float *yg = fzero((size_t)q->Tg * M), *dxg = fzero((size_t)q->Tg * M);
      if (moe_layer_forward(R, q->x, q->Tg, yg, &s) != MOE_STATUS_OK ||
          moe_layer_backward(R, q->dy, dxg) != MOE_STATUS_OK) {
        fail(&v, "reference pass %d: %s", p, moe_ctx_error(ctx));
      }
      memcpy(q->y_ref, yg + (size_t)q->off * M, (size_t)Tm * M * sizeof(float));
      memcpy(q->dx_ref, dxg + (size_t)q->off * M, (size_t)Tm * M * sizeof(float));
      q->aux = s.aux_loss;
      q->z = s.z_loss;
      q->rows = Tm * K;
      q->dropped = 0;
      const moe_route *rt = moe_layer_get_route(R);
      memcpy(q->expert, rt->expert + (size_t)q->off * K, (size_t)Tm * K * sizeof(int32_t));
      memcpy(q->weight, rt->weight + (size_t)q->off * K, (size_t)Tm * K * sizeof(float));
      free(yg);
      free(dxg);
    } else {
      float *yg = fzero((size_t)q->Tg * M), *dxg = fzero((size_t)q->Tg * M);
      if (moe_layer_forward(G, q->x, q->Tg, yg, &s) != MOE_STATUS_OK ||
          moe_layer_backward(G, zeros, dxg) != MOE_STATUS_OK) {
        fail(&v, "loss reference pass %d: %s", p, moe_ctx_error(ctx));
      }
      q->aux = s.aux_loss;
      q->z = s.z_loss;
      memcpy(q->dx_ref, dxg + (size_t)q->off * M, (size_t)Tm * M * sizeof(float));
      for (int r = 0, off = 0; r < P; off += c->T[p][r], r++) {
        const int Tr = c->T[p][r];
        float *yr = fzero((size_t)Tr * M), *dxr = fzero((size_t)Tr * M);
        moe_layer_stats sr;
        if (moe_layer_forward(B, q->x + (size_t)off * M, Tr, yr, &sr) != MOE_STATUS_OK ||
            moe_layer_backward(B, q->dy + (size_t)off * M, dxr) != MOE_STATUS_OK) {
          fail(&v, "rank-%d reference pass %d: %s", r, p, moe_ctx_error(ctx));
        }
        if (sr.dropped > 0) *dropped_any = 1;
        if (r == me) {
          memcpy(q->y_ref, yr, (size_t)Tr * M * sizeof(float));
          for (size_t i = 0; i < (size_t)Tr * M; i++) q->dx_ref[i] += dxr[i];
          q->rows = sr.rows;
          q->dropped = sr.dropped;
          const moe_route *rt = moe_layer_get_route(B);
          memcpy(q->expert, rt->expert, (size_t)Tr * K * sizeof(int32_t));
          memcpy(q->slot, rt->slot, (size_t)Tr * K * sizeof(int32_t));
          memcpy(q->weight, rt->weight, (size_t)Tr * K * sizeof(float));
        }
        free(yr);
        free(dxr);
      }
      free(yg);
      free(dxg);
    }
  }
  if (v.failed) goto verdict;

  // the distributed passes
  y = fzero((size_t)cfg->tokens * M);
  dx = fzero((size_t)cfg->tokens * M);
  for (int p = 0; p < c->passes; p++) {
    pass_ref *q = &pr[p];
    const int Tm = c->T[p][me];
    char what[64];
    moe_layer_stats s;
    memset(&s, 0, sizeof s);
    if (g_plant_hang && me == P - 1) sleep(3600);  // the others wait in the forward's allreduce
    st = moe_ep_layer_forward(L, q->x + (size_t)q->off * M, Tm, y, &s);
    if (st != MOE_STATUS_OK) {
      fail(&v, "pass %d forward: %s: %s", p, moe_status_str(st), moe_ctx_error(ctx));
      break;
    }
    memset(dx, 0, (size_t)cfg->tokens * M * sizeof(float));
    st = moe_ep_layer_backward(L, q->dy + (size_t)q->off * M, dx);
    if (st != MOE_STATUS_OK) {
      fail(&v, "pass %d backward: %s: %s", p, moe_status_str(st), moe_ctx_error(ctx));
      break;
    }
    compare_pass(&v, p, y, dx, &s, q->y_ref, q->dx_ref, q->aux, q->z, q->rows, q->dropped,
                 (size_t)Tm * M);
    snprintf(what, sizeof what, "pass %d stats.tokens", p);
    equal_int(&v, what, s.tokens, Tm);
    const moe_route *rt = moe_ep_layer_get_route(L);
    for (int i = 0; i < Tm * K; i++) {
      if (rt->expert[i] != q->expert[i]) {
        fail(&v, "pass %d route: choice %d of token %d goes to expert %d, reference %d", p, i % K,
             i / K, rt->expert[i], q->expert[i]);
        break;
      }
      if (!dropless && rt->slot[i] != q->slot[i]) {
        fail(&v, "pass %d route: choice %d of token %d has slot %d, reference %d", p, i % K, i / K,
             rt->slot[i], q->slot[i]);
        break;
      }
    }
    snprintf(what, sizeof what, "pass %d gate weights", p);
    close_to(&v, Q_W, what, rt->weight, q->weight, (size_t)Tm * K);
  }
  if (!v.failed) {
    // gradients after every pass: gate (full), home experts (this rank's slice)
    moe_layer_tensors rt;
    float *dwg_ref = fzero((size_t)M * E);
    if (dropless) {
      rt = moe_layer_get_tensors(R);
      memcpy(dwg_ref, rt.dwg, (size_t)M * E * sizeof(float));
    } else {
      rt = moe_layer_get_tensors(B);
      const moe_layer_tensors gt = moe_layer_get_tensors(G);
      for (size_t i = 0; i < (size_t)M * E; i++) dwg_ref[i] = rt.dwg[i] + gt.dwg[i];
    }
    close_to(&v, Q_DWG, "dwg", t.dwg, dwg_ref, (size_t)M * E);
    free(dwg_ref);
    const size_t f = (size_t)t.home_first, n = (size_t)t.home_count;
    close_to(&v, Q_DW1, "dw1", t.dw1, rt.dw1 + f * M * H, n * M * H);
    close_to(&v, Q_DB1, "db1", t.db1, rt.db1 + f * H, n * H);
    close_to(&v, Q_DW2, "dw2", t.dw2, rt.dw2 + f * H * M, n * H * M);
    close_to(&v, Q_DB2, "db2", t.db2, rt.db2 + f * M, n * M);
  }

verdict:;
  const int any = verdict_agree(&v, dropped_any);
  moe_ep_layer_destroy(L);
  moe_layer_destroy(R);
  moe_layer_destroy(G);
  moe_layer_destroy(B);
  moe_ctx_destroy(ctx);
  for (int p = 0; p < MAX_PASSES; p++) {
    free(pr[p].x);
    free(pr[p].dy);
    free(pr[p].y_ref);
    free(pr[p].dx_ref);
    free(pr[p].expert);
    free(pr[p].slot);
    free(pr[p].weight);
  }
  free(y);
  free(dx);
  free(zeros);
  return !any;
}

// ---- coverage -------------------------------------------------------------------------------

// How often each catalogue entry and each special condition was drawn (printed
// at the end, so a campaign shows what it covered).
enum { COV_NAMES = 64 };
static const char *g_cov_name[COV_NAMES];
static long g_cov[COV_NAMES];
static int g_ncov;

void cov(const char *name) {
  for (int i = 0; i < g_ncov; i++) {
    if (strcmp(g_cov_name[i], name) == 0) {
      g_cov[i]++;
      return;
    }
  }
  if (g_ncov < COV_NAMES) {
    g_cov_name[g_ncov] = name;  // names are string literals or catalogue entries
    g_cov[g_ncov++] = 1;
  }
}

static void count_case(const camp_case *c) {
  int n = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&n);
  for (int i = 0; i < n; i++)
    if (strcmp(algos[i]->name, c->pc.a2a) == 0) cov(algos[i]->name);
  const moe_schedule_algo *sc = moe_schedule_algo_list(&n);
  for (int i = 0; i < n; i++)
    if (strcmp(sc[i].name, c->pc.schedule) == 0) cov(sc[i].name);
  const moe_compressor_entry *const *cp = moe_compressor_list(&n);
  for (int i = 0; i < n; i++)
    if (strncmp(cp[i]->codec.name, c->pc.compress, strlen(cp[i]->codec.name)) == 0)
      cov(cp[i]->codec.name);
  for (int i = 0; i < moe_expert_kind_count(); i++)
    if (strcmp(moe_expert_kind_get(i)->name, c->cfg.expert) == 0) cov(moe_expert_kind_get(i)->name);
  cov(moe_gate_convention_name((moe_gate_convention)c->cfg.gate_convention));
  cov(moe_wait_policy_name(c->pc.exec.wait));
  cov(c->cfg.capacity_factor > 0 ? "capacity" : "dropless");
  if (c->pc.ep_size > 1 && c->pc.ep_size < g_world)
    cov(c->pc.ep_strided ? "dp-ep-strided" : "dp-ep");
  if (c->pc.ranks_per_node > 0) cov("ranks-per-node");
  if (c->pc.chunks > 1) cov("chunks>1");
  if (c->nrep > 0) cov(c->placed ? "placements" : "replicas");
  if (c->hot >= 0) cov("hot-expert");
  if (c->passes > 1) cov("2-passes");
  if (c->expect_reject) cov("expect-reject");
  int zero = 0, all_zero = 0;
  for (int p = 0; p < c->passes; p++) {
    int sum = 0;
    for (int q = 0; q < g_world; q++) {
      zero |= c->T[p][q] == 0;
      sum += c->T[p][q];
    }
    all_zero |= sum == 0;
  }
  if (zero) cov("zero-token-rank");
  if (all_zero) cov("no-tokens-at-all");
}

// ---- main ----------------------------------------------------------------------------------

static void usage(void) {
  fprintf(stderr,
          "usage: mpirun -n P campaign [--parm] --seed S --cases N [--first I] [--timeout SEC] "
          "[--verbose]\n"
          "       mpirun -n P campaign [--parm] --case-seed X [--verbose]\n"
          "  --parm: Parm's layer (MP x EP x ESP, its schedules, chunks; tests/campaign_parm.c)\n"
          "  instead of the expert-parallel layer.\n"
          "  S, X: integers >= 0; N >= 0 cases (case i has seed philox(i, S)); I >= 0 the first\n"
          "  case index; SEC in [1, 3600] seconds a case may take before it counts as a hang\n"
          "  (default 120). Every rank must pass the same arguments.\n"
          "  --plant y|dx|aux|z|dwg|dw1|db1|dw2|db2|weight|hang: self-check of the campaign: an\n"
          "  error planted in that comparison (or a rank that stalls) must be reported.\n");
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end = NULL;
  if (!s || !*s || *s == '-') return 0;
  const unsigned long long v = strtoull(s, &end, 10);
  if (*end) return 0;
  *out = v;
  return 1;
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  g_prog = argv[0];
  uint64_t seed = 1, cases = 0, first = 0, case_seed = 0, timeout = 120;
  int have_case = 0, have_cases = 0, bad = 0, parm = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--verbose") == 0) {
      g_verbose = 1;
    } else if (strcmp(a, "--parm") == 0) {
      parm = 1;
    } else if (strcmp(a, "--seed") == 0 && parse_u64(val, &seed)) {
      i++;
    } else if (strcmp(a, "--cases") == 0 && parse_u64(val, &cases) && cases <= 100000000) {
      have_cases = 1;
      i++;
    } else if (strcmp(a, "--first") == 0 && parse_u64(val, &first)) {
      i++;
    } else if (strcmp(a, "--case-seed") == 0 && parse_u64(val, &case_seed)) {
      have_case = 1;
      i++;
    } else if (strcmp(a, "--plant") == 0 && val) {
      g_plant_hang = strcmp(val, "hang") == 0;
      for (int q = 0; q < Q_COUNT; q++)
        if (strcmp(val, q_names[q]) == 0) g_plant = q;
      if (!g_plant_hang && g_plant < 0) {
        if (g_rank == 0) fprintf(stderr, "campaign: --plant takes hang or a compared quantity\n");
        bad = 1;
        break;
      }
      i++;
    } else if (strcmp(a, "--timeout") == 0 && parse_u64(val, &timeout) && timeout >= 1 &&
               timeout <= 3600) {
      i++;
    } else {
      if (g_rank == 0)
        fprintf(stderr, "campaign: bad argument '%s'%s%s\n", a, val ? " " : "", val ? val : "");
      bad = 1;
      break;
    }
  }
  if (!bad && have_case == have_cases) {
    if (g_rank == 0) fprintf(stderr, "campaign: give either --cases N or --case-seed X\n");
    bad = 1;
  }
  if (!bad && g_world > MAX_P) {
    if (g_rank == 0) fprintf(stderr, "campaign: at most %d ranks (got %d)\n", MAX_P, g_world);
    bad = 1;
  }
  if (bad) {
    if (g_rank == 0) usage();
    MPI_Finalize();
    return 2;
  }
  // node ids of the automatic topology (what ranks_per_node = 0 gives)
  g_auto_nodes = calloc((size_t)g_world, sizeof(int));
  {
    moe_ctx *ctx = NULL;
    moe_ctx_create(&ctx);
    if (moe_topology_nodes(ctx, MPI_COMM_WORLD, 0, g_auto_nodes) != MOE_STATUS_OK) {
      if (g_rank == 0) fprintf(stderr, "campaign: topology: %s\n", moe_ctx_error(ctx));
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    moe_ctx_destroy(ctx);
  }
  signal(SIGALRM, on_alarm);
  const uint64_t n = have_case ? 1 : cases;
  long ok = 0, mismatches = 0, rejected = 0, with_drops = 0;
  const double t0 = MPI_Wtime();
  for (uint64_t i = 0; i < n; i++) {
    const uint64_t cs = have_case ? case_seed : case_seed_of(seed, first + i);
    camp_case c;
    parm_case *pcase = NULL;
    char desc[1024];
    if (parm) {
      pcase = parm_case_draw(cs);
      if (!pcase) MPI_Abort(MPI_COMM_WORLD, 2);
      parm_case_count(pcase);
      parm_case_describe(pcase, desc, sizeof desc);
    } else {
      draw_case(cs, &c);
      count_case(&c);
      describe(&c, desc, sizeof desc);
    }
    snprintf(
        g_repro, sizeof g_repro,
        "HANG rank %d: case index %llu (seed %llu) did not finish in %llu s; reproduce: " LAUNCH
        "%s%s --case-seed %llu --verbose\n",
        g_rank, (unsigned long long)(first + i), (unsigned long long)cs,
        (unsigned long long)timeout, g_world, g_prog, parm ? " --parm" : "",
        (unsigned long long)cs);
    if (g_verbose && g_rank == 0) {
      printf("case %llu seed %llu: %s\n", (unsigned long long)(first + i), (unsigned long long)cs,
             desc);
      fflush(stdout);
    }
    alarm((unsigned)timeout);
    int rej = 0, drops = 0;
    const int good = parm ? parm_case_run(pcase, &drops) : run_case(&c, &rej, &drops);
    alarm(0);
    parm_case_free(pcase);
    rejected += rej;
    with_drops += drops;
    if (good) {
      ok++;
    } else {
      mismatches++;
      if (g_rank == 0) {
        printf("MISMATCH case %llu (%s)\n  reproduce: " LAUNCH "%s%s --case-seed %llu --verbose\n",
               (unsigned long long)(first + i), desc, g_world, g_prog, parm ? " --parm" : "",
               (unsigned long long)cs);
        fflush(stdout);
      }
    }
  }
  const double wall = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, g_worst, Q_COUNT, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, g_worst_abs, Q_COUNT, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, g_worst_tol, Q_COUNT, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0) {
    printf(
        "campaign%s P=%d seed=%llu first=%llu: cases %llu, equal %ld (of which rejected as "
        "documented %ld, with drops %ld), mismatches %ld, hangs 0, %.2f s\n",
        parm ? " --parm" : "", g_world, (unsigned long long)seed, (unsigned long long)first,
        (unsigned long long)n, ok, rejected, with_drops, mismatches, wall);
    printf("worst relative error (max|diff| / max|ref| per tensor):");
    for (int q = 0; q < Q_COUNT; q++) printf(" %s %.2e", q_names[q], g_worst[q]);
    printf("\ncoverage (cases):");
    for (int i = 0; i < g_ncov; i++) printf(" %s %ld", g_cov_name[i], g_cov[i]);
    printf("\nworst absolute error (max|diff| per tensor):");
    for (int q = 0; q < Q_COUNT; q++) printf(" %s %.2e", q_names[q], g_worst_abs[q]);
    printf("\nworst share of the tolerance (max|diff| / (%.0e max|ref| + %.0e)):", REL_TOL,
           ABS_TOL);
    for (int q = 0; q < Q_COUNT; q++) printf(" %s %.3f", q_names[q], g_worst_tol[q]);
    printf("\n");
  }
  free(g_auto_nodes);
  MPI_Finalize();
  return mismatches ? 1 : 0;
}
