// Parm's three schedules of one MoE layer on a described cluster (moe
// simulate --parm; include/moe/perf.h; ALGORITHMS.md 2): the per-pass time
// of DeepSpeed-MoE's baseline, S1 and S2 from the directed link model and
// the GEMM rate, Parm's alpha-beta terms fitted to that model, and its
// Algorithm 1.
//
// Per device, with C = f K T / E rows per expert and n = E C M elements:
//   baseline  fwd: gate(T); ESP-AG(n); EP-A2A(ESP n); experts (4 n H FLOPs,
//             redundant over MP); ESP-AR(ESP n); EP-A2A back; ESP-Split.
//             bwd: ESP-AG(n); EP-A2A; experts x2; EP-A2A; ESP-RS(ESP n); gate x2.
//   s1        fwd: MP-Split; gate(T / MP); EP&ESP-A2A(V); experts (4 n H / MP);
//             EP&ESP-A2A back; local combine; MP-AG(T M).
//             bwd: EP&ESP-A2A; experts x2; EP&ESP-A2A; gate x2; MP-AG of dx (T M).
//   s2        fwd: gate(T); MP-Split of the rows; EP&ESP-A2A(V); experts;
//             [EP&ESP-A2A back | MP-AG(n)] overlapped (SAA).
//             bwd: EP&ESP-A2A; experts x2; [EP&ESP-A2A | MP-AG of the rows'
//             gradients] (SAA); gate x2.
// with V = ESP n / MP. Every collective runs in all its groups at once: one
// D x D exchange matrix, timed by moe_model_alltoall_s (busiest directed link
// plus one latency). All-gathers are direct exchanges (each member sends its
// block to every peer, Parm's eq. 8 and the SAA kernel's send/recv loop);
// the all-reduce and reduce-scatter are rings, 2 (ESP - 1) and ESP - 1 steps
// in which every member sends one ESP-th of the buffer to its successor.
//
// SAA [R]: the kernel cuts the all-to-all into W = EP ESP shift steps and
// gathers the slice of step i - 1 beside step i. As a two-stage pipeline of
// W equal slices whose middle W - 1 steps share the links:
//   t = (load(A) + (W - 1) load(A + G) + load(G)) / W + lat(A) + lat(G)
// where load is the busiest link's bytes / bandwidth. On disjoint links it is
// max(A, G) plus one slice of the other; on one shared bottleneck it is A + G
// (no gain), never more.
//
// Not: memory (the baseline's ESP-gathered buffers may not fit a real GPU),
// skewed routing, the combine's sums and copies, gradient all-reduces
// (excluded by Parm as well).
#include <math.h>
#include <string.h>

#include "moe/perf.h"

void moe_parm_sim_config_default(moe_parm_sim_config *c) {
  memset(c, 0, sizeof *c);
  c->mp = c->ep = c->esp = 1;
  c->tokens = 4096;
  c->model_dim = 1024;
  c->hidden_dim = 4096;
  c->experts = 0;
  c->top_k = 2;
  c->capacity_factor = 1.2;
  c->elem_bytes = 4;
}

static const char *const schedule_names[MOE_PARM_SCHEDULES] = {"baseline", "s1", "s2"};

const char *moe_parm_schedule_name(int s) {
  return s >= 0 && s < MOE_PARM_SCHEDULES ? schedule_names[s] : "?";
}

moe_status moe_parm_schedule_parse(moe_ctx *ctx, const char *text, moe_parm_schedule *out) {
  moe_status st = MOE_STATUS_OK;
  for (int i = 0; text && i < MOE_PARM_SCHEDULES; i++) {
    if (strcmp(text, schedule_names[i]) == 0) {
      *out = (moe_parm_schedule)i;
      goto done;
    }
  }
  MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "unknown Parm schedule '%s' (valid: %s, %s, %s)",
           text ? text : "(null)", schedule_names[0], schedule_names[1], schedule_names[2]);
done:
  return st;
}

// E as used: experts, or the least multiple of EP that is at least K.
static int experts_of(const moe_parm_sim_config *c) {
  if (c->experts > 0) return c->experts;
  const int k = c->top_k > 1 ? c->top_k : 1, ep = c->ep > 1 ? c->ep : 1;
  return (k + ep - 1) / ep * ep;
}

// ---- layout and exchange matrices --------------------------------------------------

typedef struct {
  const moe_cluster *cl;
  int D, dp, mp, ep, esp;
  double *bytes;  // D x D scratch
} layout;

static int dev_of(const layout *L, int dp, int ep, int esp, int mp) {
  return ((dp * L->ep + ep) * L->esp + esp) * L->mp + mp;
}

static void clear(layout *L) { memset(L->bytes, 0, (size_t)L->D * L->D * sizeof *L->bytes); }

static void add(layout *L, int s, int d, double b) {
  if (s != d) L->bytes[(size_t)s * L->D + d] += b;
}

// The kinds of exchange, each over every group of its kind at once.
typedef enum {
  X_ESP_GATHER,  // ESP group: each member sends b to every peer
  X_ESP_RING,    // ESP group: each member sends b to its successor
  X_EP_A2A,      // EP group (same dp, esp, mp): b to every other EP rank
  X_A2A,         // EP x ESP group (same dp, mp): b to every other member
  X_MP_GATHER    // MP group: each member sends b to every peer
} xkind;

static void fill(layout *L, xkind k, double b) {
  for (int dp = 0; dp < L->dp; dp++)
    for (int ep = 0; ep < L->ep; ep++)
      for (int es = 0; es < L->esp; es++)
        for (int mp = 0; mp < L->mp; mp++) {
          const int s = dev_of(L, dp, ep, es, mp);
          switch (k) {
            case X_ESP_GATHER:
              for (int j = 0; j < L->esp; j++) add(L, s, dev_of(L, dp, ep, j, mp), b);
              break;
            case X_ESP_RING:
              add(L, s, dev_of(L, dp, ep, (es + 1) % L->esp, mp), b);
              break;
            case X_EP_A2A:
              for (int j = 0; j < L->ep; j++) add(L, s, dev_of(L, dp, j, es, mp), b);
              break;
            case X_A2A:
              for (int j = 0; j < L->ep; j++)
                for (int q = 0; q < L->esp; q++) add(L, s, dev_of(L, dp, j, q, mp), b);
              break;
            case X_MP_GATHER:
              for (int j = 0; j < L->mp; j++) add(L, s, dev_of(L, dp, ep, es, j), b);
              break;
          }
        }
}

// One exchange of kind k moving b bytes per (sender, receiver) pair.
static moe_status xchg(moe_ctx *ctx, layout *L, xkind k, double b, moe_link_report *r) {
  clear(L);
  fill(L, k, b);
  return moe_model_alltoall_s(ctx, L->cl, L->bytes, r);
}

static moe_status xchg_s(moe_ctx *ctx, layout *L, xkind k, double b, double *s) {
  moe_link_report r;
  moe_status st = xchg(ctx, L, k, b, &r);
  *s = r.seconds;
  return st;
}

// SAA: the all-to-all (a bytes per pair) beside the MP-AllGather (g bytes per
// pair), W slices (see the file's header).
static moe_status saa_s(moe_ctx *ctx, layout *L, double a, double g, double *s) {
  moe_status st = MOE_STATUS_OK;
  moe_link_report ra, rg, rb;
  MOE_TRY(xchg(ctx, L, X_A2A, a, &ra));
  MOE_TRY(xchg(ctx, L, X_MP_GATHER, g, &rg));
  clear(L);
  fill(L, X_A2A, a);
  fill(L, X_MP_GATHER, g);
  MOE_TRY(moe_model_alltoall_s(ctx, L->cl, L->bytes, &rb));
  const double W = (double)L->ep * L->esp;
  *s = (ra.max_load_s + (W - 1) * rb.max_load_s + rg.max_load_s) / W + ra.latency_s + rg.latency_s;
  if (*s > ra.seconds + rg.seconds) *s = ra.seconds + rg.seconds;  // equal up to rounding
done:
  return st;
}

// 1 when every group of `size` members `stride` devices apart (MP: stride 1;
// ESP: stride MP) has its first and last member in one node.
static int group_intra(const moe_cluster *cl, int stride, int size) {
  const int D = moe_cluster_devices(cl), G = cl->devices_per_node;
  for (int base = 0; base < D; base += stride * size)
    for (int off = 0; off < stride; off++)
      if ((base + off) / G != (base + off + stride * (size - 1)) / G) return 0;
  return 1;
}

// ---- validation ---------------------------------------------------------------------

static moe_status check(moe_ctx *ctx, const moe_cluster *cl, const moe_parm_sim_config *c) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_cluster_validate(ctx, cl));
  const int D = moe_cluster_devices(cl);
  MOE_FAIL_IF(ctx, c->mp < 1 || c->mp > D, MOE_STATUS_INVALID_ARG,
              "parm: MP (%d) must be in [1, %d] (the devices)", c->mp, D);
  MOE_FAIL_IF(ctx, c->ep < 1 || c->ep > D, MOE_STATUS_INVALID_ARG,
              "parm: EP (%d) must be in [1, %d] (the devices)", c->ep, D);
  MOE_FAIL_IF(ctx, c->esp < 1 || c->esp > D, MOE_STATUS_INVALID_ARG,
              "parm: ESP (%d) must be in [1, %d] (the devices)", c->esp, D);
  const long long prod = (long long)c->mp * c->ep * c->esp;
  MOE_FAIL_IF(ctx, prod > D || D % prod != 0, MOE_STATUS_INVALID_ARG,
              "parm: MP x EP x ESP (%d x %d x %d = %lld) must divide the devices (%d)", c->mp,
              c->ep, c->esp, prod, D);
  MOE_FAIL_IF(ctx, c->tokens < c->mp || c->tokens > (1 << 30), MOE_STATUS_INVALID_ARG,
              "parm: tokens (%d) must be in [MP = %d, %d] (s1 gives each MP rank T / MP)",
              c->tokens, c->mp, 1 << 30);
  MOE_FAIL_IF(ctx, c->model_dim < 1 || c->model_dim > (1 << 24), MOE_STATUS_INVALID_ARG,
              "parm: model dimension M (%d) must be in [1, %d]", c->model_dim, 1 << 24);
  MOE_FAIL_IF(ctx, c->hidden_dim < 1 || c->hidden_dim > (1 << 24), MOE_STATUS_INVALID_ARG,
              "parm: hidden dimension H (%d) must be in [1, %d]", c->hidden_dim, 1 << 24);
  MOE_FAIL_IF(ctx, c->hidden_dim % c->esp != 0, MOE_STATUS_INVALID_ARG,
              "parm: hidden dimension H (%d) must be divisible by ESP (%d): each shard holds H / "
              "ESP",
              c->hidden_dim, c->esp);
  MOE_FAIL_IF(ctx, c->experts < 0 || c->experts > (1 << 20), MOE_STATUS_INVALID_ARG,
              "parm: experts (%d) must be in [0, %d] (0: the least multiple of EP >= K)",
              c->experts, 1 << 20);
  const int E = experts_of(c);
  MOE_FAIL_IF(ctx, E % c->ep != 0, MOE_STATUS_INVALID_ARG,
              "parm: experts (%d) must be divisible by EP (%d): each EP rank holds E / EP", E,
              c->ep);
  MOE_FAIL_IF(ctx, c->top_k < 1 || c->top_k > E, MOE_STATUS_INVALID_ARG,
              "parm: top-k (%d) must be in [1, %d] (the experts)", c->top_k, E);
  MOE_FAIL_IF(
      ctx, !isfinite(c->capacity_factor) || c->capacity_factor > 1e6, MOE_STATUS_INVALID_ARG,
      "parm: capacity factor (%g) must be finite and <= 1e6 (<= 0: dropless)", c->capacity_factor);
  MOE_FAIL_IF(ctx, !(c->elem_bytes > 0 && c->elem_bytes <= 16), MOE_STATUS_INVALID_ARG,
              "parm: element bytes (%g) must be in (0, 16]", c->elem_bytes);
done:
  return st;
}

// ---- the three schedules ------------------------------------------------------------

// The collectives' times of a configuration with `tokens` (possibly not an
// integer: the fit scales it) per device; everything in seconds.
typedef struct {
  double gate_f, exp_f;        // baseline / s2 gate on T, baseline experts (forward)
  double gate1_f, exp1_f;      // s1 gate on T / MP; s1 / s2 experts (forward)
  double esp_ag, ep_a2a;       // baseline
  double esp_ring_step;        // one ring step of the ESP all-reduce / reduce-scatter
  double a2a, mp_ag1, mp_ag2;  // EP&ESP-A2A; MP-AllGather of s1 (T M) and of s2 (n)
  double saa;                  // s2's overlapped pair
  double v_elems, rows;
} parts;

static moe_status parts_of(moe_ctx *ctx, layout *L, const moe_parm_sim_config *c, double T,
                           parts *p) {
  moe_status st = MOE_STATUS_OK;
  double *flops = NULL;
  const int E = experts_of(c);
  const double M = c->model_dim, H = c->hidden_dim, K = c->top_k, b = c->elem_bytes;
  const double f = c->capacity_factor > 0 ? c->capacity_factor : 1.0;
  const double C = f * K * T / E, n = E * C * M;  // rows per expert; gate output elements
  const double mp = c->mp, ep = c->ep, esp = c->esp;
  memset(p, 0, sizeof *p);
  p->rows = C;
  p->v_elems = esp * n / mp;
  // compute: every device alike (balanced), through eq. 1
  flops = moe_calloc((size_t)L->D, sizeof *flops);
  MOE_FAIL_IF(ctx, !flops, MOE_STATUS_OUT_OF_MEMORY, "parm: out of memory");
  const double fl[4] = {2 * T * M * E, 4 * n * H, 2 * (T / mp) * M * E, 4 * n * H / mp};
  double *out[4] = {&p->gate_f, &p->exp_f, &p->gate1_f, &p->exp1_f};
  for (int i = 0; i < 4; i++) {
    for (int d = 0; d < L->D; d++) flops[d] = fl[i];
    *out[i] = moe_model_compute_s(L->cl, flops);
  }
  // baseline: ESP-AG of n; EP-A2A of the ESP n gathered elements, 1 / EP to each
  // EP rank; the ring steps move ESP n / ESP = n
  MOE_TRY(xchg_s(ctx, L, X_ESP_GATHER, n * b, &p->esp_ag));
  MOE_TRY(xchg_s(ctx, L, X_EP_A2A, esp * n / ep * b, &p->ep_a2a));
  MOE_TRY(xchg_s(ctx, L, X_ESP_RING, n * b, &p->esp_ring_step));
  // s1, s2: V elements, (E / EP) (C / MP) M to each of the EP x ESP members
  const double per_dest = (E / ep) * (C / mp) * M * b;
  MOE_TRY(xchg_s(ctx, L, X_A2A, per_dest, &p->a2a));
  MOE_TRY(xchg_s(ctx, L, X_MP_GATHER, T / mp * M * b, &p->mp_ag1));
  MOE_TRY(xchg_s(ctx, L, X_MP_GATHER, n / mp * b, &p->mp_ag2));
  MOE_TRY(saa_s(ctx, L, per_dest, n / mp * b, &p->saa));
done:
  moe_free(flops);
  return st;
}

static moe_status layout_init(moe_ctx *ctx, layout *L, const moe_cluster *cl,
                              const moe_parm_sim_config *c) {
  moe_status st = MOE_STATUS_OK;
  L->cl = cl;
  L->D = moe_cluster_devices(cl);
  L->mp = c->mp;
  L->ep = c->ep;
  L->esp = c->esp;
  L->dp = L->D / (c->mp * c->ep * c->esp);
  L->bytes = moe_malloc((size_t)L->D * L->D * sizeof *L->bytes);
  MOE_FAIL_IF(ctx, !L->bytes, MOE_STATUS_OUT_OF_MEMORY, "parm: cannot allocate %d x %d cells", L->D,
              L->D);
done:
  return st;
}

moe_status moe_parm_simulate(moe_ctx *ctx, const moe_cluster *cl, const moe_parm_sim_config *c,
                             moe_parm_sim_result *out) {
  moe_status st = MOE_STATUS_OK;
  layout L;
  memset(&L, 0, sizeof L);
  MOE_FAIL_IF(ctx, !cl || !c || !out, MOE_STATUS_INVALID_ARG,
              "parm: cluster, config and out must not be NULL");
  MOE_TRY(check(ctx, cl, c));
  MOE_TRY(layout_init(ctx, &L, cl, c));
  parts p;
  MOE_TRY(parts_of(ctx, &L, c, c->tokens, &p));
  memset(out, 0, sizeof *out);
  out->dp = L.dp;
  out->experts = experts_of(c);
  out->rows = p.rows;
  out->v_elems = p.v_elems;
  out->mp_intra = group_intra(cl, 1, c->mp);
  out->esp_intra = group_intra(cl, c->mp, c->esp);
  const double ring = (c->esp - 1) * p.esp_ring_step;  // one reduce-scatter or all-gather ring
  moe_parm_sim_times *t = &out->sched[MOE_PARM_BASELINE];
  // baseline: fwd gate, ESP-AG, EP-A2A, experts, ESP-AR (2 rings), EP-A2A
  //           bwd ESP-AG, EP-A2A, experts x2, EP-A2A, ESP-RS (1 ring), gate x2
  t->compute_ms = 3 * (p.gate_f + p.exp_f) * 1e3;
  t->a2a_ms = 4 * p.ep_a2a * 1e3;
  t->esp_ms = (2 * p.esp_ag + 3 * ring) * 1e3;
  t->fwd_ms = (p.gate_f + p.esp_ag + 2 * p.ep_a2a + p.exp_f + 2 * ring) * 1e3;
  t->bwd_ms = (p.esp_ag + 2 * p.ep_a2a + 2 * p.exp_f + ring + 2 * p.gate_f) * 1e3;
  // s1: fwd gate(T / MP), A2A, experts, A2A, MP-AG; bwd A2A, experts x2, A2A, gate x2, MP-AG
  t = &out->sched[MOE_PARM_S1];
  t->compute_ms = 3 * (p.gate1_f + p.exp1_f) * 1e3;
  t->a2a_ms = 4 * p.a2a * 1e3;
  t->mp_ms = 2 * p.mp_ag1 * 1e3;
  t->fwd_ms = (p.gate1_f + 2 * p.a2a + p.exp1_f + p.mp_ag1) * 1e3;
  t->bwd_ms = (2 * p.a2a + 2 * p.exp1_f + 2 * p.gate1_f + p.mp_ag1) * 1e3;
  // s2: fwd gate(T), A2A, experts, SAA; bwd A2A, experts x2, SAA, gate x2
  t = &out->sched[MOE_PARM_S2];
  t->compute_ms = 3 * (p.gate_f + p.exp1_f) * 1e3;
  t->a2a_ms = 4 * p.a2a * 1e3;
  t->mp_ms = 2 * p.mp_ag2 * 1e3;
  t->saa_saved_ms = 2 * (p.a2a + p.mp_ag2 - p.saa) * 1e3;
  t->fwd_ms = (p.gate_f + p.a2a + p.exp1_f + p.saa) * 1e3;
  t->bwd_ms = (p.a2a + 2 * p.exp1_f + p.saa + 2 * p.gate_f) * 1e3;
  for (int s = 0; s < MOE_PARM_SCHEDULES; s++)
    out->sched[s].total_ms = out->sched[s].fwd_ms + out->sched[s].bwd_ms;
done:
  moe_free(L.bytes);
  return st;
}

// ---- Algorithm 1 --------------------------------------------------------------------

moe_status moe_parm_fit_alpha_beta(moe_ctx *ctx, const moe_cluster *cl,
                                   const moe_parm_sim_config *c, moe_parm_alpha_beta *out) {
  moe_status st = MOE_STATUS_OK;
  layout L;
  memset(&L, 0, sizeof L);
  MOE_FAIL_IF(ctx, !cl || !c || !out, MOE_STATUS_INVALID_ARG,
              "parm: cluster, config and out must not be NULL");
  MOE_TRY(check(ctx, cl, c));
  MOE_TRY(layout_init(ctx, &L, cl, c));
  enum { NPTS = 4 };
  static const double scale[NPTS] = {0.25, 0.5, 1, 2};
  double v[NPTS], tm[NPTS], ya[NPTS], ym[NPTS], yo[NPTS];
  for (int i = 0; i < NPTS; i++) {
    parts p;
    const double T = c->tokens * scale[i];
    MOE_TRY(parts_of(ctx, &L, c, T, &p));
    v[i] = p.v_elems;
    tm[i] = T * c->model_dim;
    ya[i] = p.a2a;
    ym[i] = p.mp_ag1;
    yo[i] = p.saa;
  }
  moe_linear_fit fa, fm, fo;
  MOE_TRY(moe_fit_linear(ctx, v, ya, NPTS, &fa));
  MOE_TRY(moe_fit_linear(ctx, tm, ym, NPTS, &fm));
  MOE_TRY(moe_fit_linear(ctx, v, yo, NPTS, &fo));
  out->alpha_a2a = fa.alpha;
  out->beta_a2a = fa.beta;
  out->alpha_mp = fm.alpha;
  out->beta_mp = fm.beta;
  out->alpha_o = fo.alpha;
  out->beta_o = fo.beta;
done:
  moe_free(L.bytes);
  return st;
}

int moe_parm_alg1(const moe_parm_alpha_beta *ab, const moe_parm_sim_config *c, double *t1_s,
                  double *t2_s) {
  const double f = c->capacity_factor > 0 ? c->capacity_factor : 1.0;
  const double blm = (double)c->tokens * c->model_dim;
  const double V = c->esp * f * c->top_k * blm / c->mp;
  const double a2a = ab->alpha_a2a + ab->beta_a2a * V;
  const double t1 = 2 * a2a + ab->alpha_mp + ab->beta_mp * blm;
  const double t2 = a2a + ab->alpha_o + ab->beta_o * V;
  if (t1_s) *t1_s = t1;
  if (t2_s) *t2_s = t2;
  return t1 <= t2 * (1 + 1e-9) ? MOE_PARM_S1 : MOE_PARM_S2;  // ties (rounding): s1
}

moe_status moe_parm_choose(moe_ctx *ctx, const moe_cluster *cl, const moe_parm_sim_config *c,
                           int *pick, moe_parm_sim_result *res) {
  moe_status st = MOE_STATUS_OK;
  moe_parm_sim_result r;
  MOE_FAIL_IF(ctx, !pick, MOE_STATUS_INVALID_ARG, "parm: pick must not be NULL");
  MOE_TRY(moe_parm_simulate(ctx, cl, c, &r));
  // a tie within rounding (MP = 1: the same steps summed in another order) is a tie
  const double t1 = r.sched[MOE_PARM_S1].total_ms, t2 = r.sched[MOE_PARM_S2].total_ms;
  *pick = t1 <= t2 * (1 + 1e-9) ? MOE_PARM_S1 : MOE_PARM_S2;
  if (res) *res = r;
done:
  return st;
}
