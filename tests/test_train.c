// moe_train_run across layouts, determinism, resume and bad input. Run under
// mpirun with 4 ranks (with fewer, the layouts that need more are skipped).
//
// 1. Layouts: a tiny dropless MoE-GPT trained 20 steps on 1 rank (the
//    reference), on 2 ranks (EP 2; EP 1 = pure DP) and on 4 ranks (EP 4,
//    EP 2 x DP 2 contiguous and strided, EP 1): the losses of every step equal
//    the 1-rank run's within 1e-5 relative; with the pipeline/optsche schedules
//    and chunks too, and with a dense block between MoE blocks.
// 2. Determinism: the same run twice gives bitwise-identical losses.
// 3. Resume: 20 steps stopped at 10 and resumed equals the uninterrupted run
//    bitwise (same layout); resumed on another world size within 1e-5; the
//    resumed run's first validation is the checkpoint's. The learning-rate
//    schedule is the checkpoint's: more steps run past it at min_lr (steps
//    11..20 unchanged), another lr / warmup or fewer steps are refused, and a
//    version 1 checkpoint (no stored schedule) loads with the run's schedule.
// 4. Errors reach every rank (no hang): batch not divisible by P, experts
//    not divisible by EP, a corrupted checkpoint (the file is left as it was),
//    a checkpoint of another model, an unwritable checkpoint path.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/moe.h"
#include "moe/train.h"
#include "testutil.h"

#define STEPS 20
#define REL_TOL 1e-5

static int g_rank, g_world;
static moe_train_result g_res;  // the last run_on's result (on the ranks that ran it)
static char g_text[256], g_ckpt[256], g_ckpt2[256], g_ckpt2_whole[256];

typedef struct {
  double loss[STEPS + 1];
  double val[STEPS + 1];
  double lr[2 * STEPS + 1];  // also past STEPS (a resumed run extended beyond the schedule)
  int n;                     // steps 1..STEPS that ran
} losses;

static void on_step(void *user, const moe_train_step_info *info) {
  losses *l = user;
  if (info->step >= 1 && info->step <= 2 * STEPS) l->lr[info->step] = info->lr;
  if (info->step >= 1 && info->step <= STEPS) {
    l->loss[info->step] = info->loss;
    l->val[info->step] = info->val_loss;
    l->n++;
  }
}

static void base_config(moe_train_config *tc) {
  moe_train_config_default(tc);
  moe_gpt_config *m = &tc->model;
  m->seq_len = 16;
  m->n_layer = 2;
  m->n_head = 2;
  m->d_model = 16;
  m->dense_hidden = 32;
  m->moe.num_experts = 4;
  m->moe.top_k = 2;
  m->moe.hidden_dim = 24;
  m->moe.capacity_factor = -1;  // dropless: every layout routes the same
  tc->batch = 8;
  tc->steps = STEPS;
  tc->seed = 7;
  tc->eval_every = 5;
  tc->eval_batches = 2;
  tc->progress = 0;
  tc->data = g_text;
  tc->optim.warmup_steps = 3;
  tc->optim.lr = 1e-2f;
  tc->optim.min_lr = 1e-3f;
  tc->on_step = on_step;
}

// Runs tc on the first `size` ranks (the others wait). Returns the status on
// those ranks (OK on the others) and the losses in *l.
static moe_status run_on(int size, const moe_train_config *tc0, losses *l, moe_ctx *ctx) {
  MPI_Comm comm;
  moe_status st = MOE_STATUS_OK;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank < size ? 0 : MPI_UNDEFINED, g_rank, &comm);
  memset(l, 0, sizeof *l);
  if (comm != MPI_COMM_NULL) {
    moe_train_config tc = *tc0;
    tc.on_step_user = l;
    st = moe_train_run(ctx, comm, &tc, &g_res);
    MPI_Comm_free(&comm);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return st;
}

static void compare(const char *name, const losses *got, const losses *ref, int first, int exact) {
  if (g_rank != 0) return;
  TU_CHECK(got->n == STEPS - first + 1, "%s: %d steps ran, expected %d", name, got->n,
           STEPS - first + 1);
  double worst = 0;
  int at = 0;
  for (int s = first; s <= STEPS; s++) {
    const double e = fabs(got->loss[s] - ref->loss[s]) / fabs(ref->loss[s]);
    if (e > worst) worst = e, at = s;
    if (!isnan(ref->val[s]) || !isnan(got->val[s])) {
      const double ev = fabs(got->val[s] - ref->val[s]) / fabs(ref->val[s]);
      TU_CHECK(exact ? got->val[s] == ref->val[s] : ev <= REL_TOL,
               "%s: val loss at step %d: %.9g vs %.9g", name, s, got->val[s], ref->val[s]);
    }
  }
  if (exact) {
    int same = 1;
    for (int s = first; s <= STEPS; s++) same &= got->loss[s] == ref->loss[s];
    TU_CHECK(same, "%s: losses not bitwise equal (worst rel %.3g at step %d)", name, worst, at);
  } else {
    TU_CHECK(worst <= REL_TOL, "%s: loss rel error %.3g at step %d (%.9g vs %.9g)", name, worst, at,
             got->loss[at], ref->loss[at]);
  }
  printf("  %-44s max rel diff %.2e over steps %d..%d\n", name, worst, first, STEPS);
}

static void write_text(void) {
  // A deterministic text with structure to learn (the same on every rank).
  snprintf(g_text, sizeof g_text, "/tmp/moe_test_train_%d.txt", (int)getppid());
  snprintf(g_ckpt, sizeof g_ckpt, "/tmp/moe_test_train_%d.ckpt", (int)getppid());
  snprintf(g_ckpt2, sizeof g_ckpt2, "/tmp/moe_test_train_%d_b.ckpt", (int)getppid());
  snprintf(g_ckpt2_whole, sizeof g_ckpt2_whole, "/tmp/moe_test_train_%d_c.ckpt", (int)getppid());
  if (g_rank == 0) {
    FILE *f = fopen(g_text, "w");
    static const char *const words[] = {"the ",  "cat ", "sat ", "on ",  "a ",
                                        "mat. ", "dog ", "ran ", "far ", "away!\n"};
    moe_rng rng;
    moe_rng_init(&rng, 3, 0);
    for (int i = 0; i < 12000 && f; i++) fputs(words[moe_rng_u32(&rng) % 10], f);
    if (f) fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

static int file_equal(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb;
  while (same) {
    const int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) same = 0;
    if (ca == EOF || cb == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

static void copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  int c;
  while (a && b && (c = fgetc(a)) != EOF) fputc(c, b);
  if (a) fclose(a);
  if (b) fclose(b);
}

// Rewrites checkpoint `from` as a content version 1 file `to` (what libmoe
// wrote before it stored the learning-rate schedule and the router biases):
// the same tensors but the biases, the config without "schedule" and with
// "version":1. Rank 0 only.
static int write_v1_checkpoint(moe_ctx *ctx, const char *from, const char *to) {
  moe_ckpt_reader *r = NULL;
  moe_ckpt_writer *w = NULL;
  moe_ckpt_tensor_desc *d = NULL;
  int *src = NULL;
  float *buf = NULL;
  char config[8192];
  int ok = 0;
  if (moe_ckpt_reader_open(ctx, from, &r) != MOE_STATUS_OK) goto done;
  snprintf(config, sizeof config, "%s", moe_ckpt_reader_config(r));
  char *v = strstr(config, "\"version\":3"), *sc = strstr(config, ",\"schedule\":{");
  if (!v || !sc || !strchr(sc, '}')) goto done;
  v[10] = '1';
  memmove(sc, strchr(sc, '}') + 1, strlen(strchr(sc, '}') + 1) + 1);
  const int n_all = moe_ckpt_reader_num_tensors(r);
  d = calloc((size_t)n_all, sizeof *d);
  src = calloc((size_t)n_all, sizeof *src);
  size_t most = 1;
  int n = 0;
  for (int i = 0; d && src && i < n_all; i++) {
    if (strstr(moe_ckpt_reader_desc(r, i)->name, ".moe.router_bias")) continue;
    src[n] = i;
    d[n] = *moe_ckpt_reader_desc(r, i);
    size_t e = 1;
    for (int k = 0; k < d[n].ndim; k++) e *= (size_t)d[n].dims[k];
    if (e > most) most = e;
    n++;
  }
  buf = malloc(most * sizeof(float));
  if (!d || !src || !buf || moe_ckpt_writer_open(ctx, to, config, d, n, &w) != MOE_STATUS_OK)
    goto done;
  for (int i = 0; i < n; i++) {
    size_t e = 1;
    for (int k = 0; k < d[i].ndim; k++) e *= (size_t)d[i].dims[k];
    if (moe_ckpt_reader_read(r, src[i], 0, e, buf) != MOE_STATUS_OK ||
        moe_ckpt_writer_write(w, i, buf, e * sizeof(float)) != MOE_STATUS_OK)
      goto done;
  }
  ok = moe_ckpt_writer_commit(w) == MOE_STATUS_OK;
  w = NULL;
done:
  if (!ok) printf("write_v1_checkpoint: %s\n", moe_ctx_error(ctx));
  moe_ckpt_writer_abort(w);
  moe_ckpt_reader_close(r);
  free(d);
  free(src);
  free(buf);
  return ok;
}

// The router biases in checkpoint `ckpt` against DeepSeek-V3's rule applied
// by hand to the routing trace's counts of the steps before it: from zero,
// per step and MoE layer, b_e += rate where expert e's load (summed over the
// ranks) is below the mean, -= rate where above (float arithmetic, as the
// trainer's: bitwise equal). Rank 0.
static void check_bias_against_trace(moe_ctx *ctx, const char *ckpt, const char *trace,
                                     float rate) {
  enum { EMAX = 16, LMAX = 8 };
  float want[LMAX][EMAX];
  memset(want, 0, sizeof want);
  FILE *f = fopen(trace, "r");
  TU_CHECK(f != NULL, "cannot open %s", trace);
  if (!f) return;
  char line[8192];
  int lines = 0, E = 0;
  while (fgets(line, sizeof line, f)) {
    const char *c = strstr(line, "\"counts\": [");
    const char *l = strstr(line, "\"layer\": ");
    if (!c || !l) continue;
    const int layer = atoi(l + 9);
    int64_t load[EMAX] = {0};
    int e = 0, n = 0;
    // rows "[a, b, ...], [...]": expert index restarts at each '['
    for (const char *q = c + 11; *q && *q != '}'; q++) {
      if (*q == '[') e = 0;
      if (*q >= '0' && *q <= '9') {
        char *end = NULL;
        const long v = strtol(q, &end, 10);
        if (e < EMAX) load[e] += v;
        e++;
        n++;
        q = end - 1;
      }
      if (e > E) E = e;
    }
    TU_CHECK(layer >= 0 && layer < LMAX && E <= EMAX && n > 0, "trace line: %s", line);
    if (layer < 0 || layer >= LMAX || E > EMAX) continue;
    double mean = 0;
    for (int k = 0; k < E; k++) mean += (double)load[k];
    mean /= E;
    for (int k = 0; k < E; k++) {
      if ((double)load[k] < mean) want[layer][k] += rate;
      if ((double)load[k] > mean) want[layer][k] -= rate;
    }
    lines++;
  }
  fclose(f);
  moe_ckpt_reader *r = NULL;
  TU_CHECK(moe_ckpt_reader_open(ctx, ckpt, &r) == MOE_STATUS_OK, "%s", moe_ctx_error(ctx));
  int checked = 0, nonzero = 0;
  for (int layer = 0; r && layer < LMAX; layer++) {
    char name[64];
    snprintf(name, sizeof name, MOE_GPT_ROUTER_BIAS_NAME, layer);
    const int i = moe_ckpt_reader_find(r, name);
    if (i < 0) continue;
    float got[EMAX];
    TU_CHECK(moe_ckpt_reader_read(r, i, 0, (size_t)E, got) == MOE_STATUS_OK, "%s",
             moe_ctx_error(ctx));
    for (int k = 0; k < E; k++) {
      TU_CHECK(got[k] == want[layer][k], "%s[%d]: %.9g, the rule on the trace gives %.9g", name, k,
               (double)got[k], (double)want[layer][k]);
      nonzero += got[k] != 0;
    }
    checked++;
  }
  moe_ckpt_reader_close(r);
  TU_CHECK(checked == 2 && lines == 2 * 10 && nonzero > 0,
           "router bias vs trace: %d biases checked, %d trace lines, %d nonzero entries", checked,
           lines, nonzero);
  printf("  %-44s %d layers x %d steps, %d nonzero entries\n", "router bias = rule on the trace",
         checked, lines / 2, nonzero);
}

// Every rank of the run must fail with the same kind of error, the message
// containing `words`.
static void expect_fail(const char *name, int size, const moe_train_config *tc, const char *words,
                        moe_ctx *ctx) {
  losses l;
  const moe_status st = run_on(size, tc, &l, ctx);
  if (g_rank < size) {
    TU_CHECK(st != MOE_STATUS_OK, "%s: expected an error on rank %d", name, g_rank);
    if (g_rank == 0)
      TU_CHECK(strstr(moe_ctx_error(ctx), words) != NULL, "%s: message '%s' lacks '%s'", name,
               moe_ctx_error(ctx), words);
  }
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
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  write_text();

  moe_train_config tc;
  base_config(&tc);
  losses ref, got;
  if (g_rank == 0) printf("layouts against 1 rank:\n");
  TU_CHECK(run_on(1, &tc, &ref, ctx) == MOE_STATUS_OK, "1 rank: %s", moe_ctx_error(ctx));
  losses ref1 = ref;  // the 1-rank run (ref is reused below)
  if (g_rank == 0)
    TU_CHECK(ref.loss[STEPS] < ref.loss[1] - 0.5, "the loss does not fall (%g -> %g)", ref.loss[1],
             ref.loss[STEPS]);

  // 1. layouts
  struct {
    int size, ep, strided;
    const char *schedule;
    int chunks, moe_every;
  } lay[] = {
      {2, 2, 0, "sequential", 1, 1}, {2, 1, 0, "sequential", 1, 1}, {4, 4, 0, "sequential", 1, 1},
      {4, 2, 0, "sequential", 1, 1}, {4, 2, 1, "sequential", 1, 1}, {4, 1, 0, "sequential", 1, 1},
      {4, 4, 0, "optsche", 2, 1},    {2, 2, 0, "pipeline", 3, 1},   {4, 4, 0, "smart", 1, 1}};
  for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
    if (lay[i].size > g_world) continue;
    moe_train_config t = tc;
    t.par.ep_size = lay[i].ep;
    t.par.ep_strided = lay[i].strided;
    snprintf(t.par.schedule, sizeof t.par.schedule, "%s", lay[i].schedule);
    t.par.chunks = lay[i].chunks;
    char name[128];
    snprintf(name, sizeof name, "P=%d EP=%d%s %s r=%d", lay[i].size, lay[i].ep,
             lay[i].strided ? " strided" : "", lay[i].schedule, lay[i].chunks);
    TU_CHECK(run_on(lay[i].size, &t, &got, ctx) == MOE_STATUS_OK, "%s: %s", name,
             moe_ctx_error(ctx));
    compare(name, &got, &ref, 1, 0);
  }
  // A dense block between MoE blocks (moe_every 2), 1 rank vs all ranks.
  {
    moe_train_config t = tc;
    t.model.n_layer = 3;
    t.model.moe_every = 2;
    losses r1;
    TU_CHECK(run_on(1, &t, &r1, ctx) == MOE_STATUS_OK, "moe_every 2: %s", moe_ctx_error(ctx));
    TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "moe_every 2: %s",
             moe_ctx_error(ctx));
    compare("moe_every=2, all ranks", &got, &r1, 1, 0);
  }

  // 2. determinism
  TU_CHECK(run_on(g_world, &tc, &ref, ctx) == MOE_STATUS_OK, "%s", moe_ctx_error(ctx));
  TU_CHECK(run_on(g_world, &tc, &got, ctx) == MOE_STATUS_OK, "%s", moe_ctx_error(ctx));
  compare("same run twice (bitwise)", &got, &ref, 1, 1);

  // 2b. load balancing: every policy, with rates that make copies worth it
  // (slow compute, a fast network) so that copies are really placed, gives
  // the losses of training without it; a checkpoint written with balancing
  // resumes without it on one rank.
  for (int pol = MOE_BALANCE_SHADOW; pol <= MOE_BALANCE_AUTO; pol++) {
    for (int size = 2; size <= 4 && size <= g_world; size += 2) {
      moe_train_config t = tc;
      moe_balance_config_default(&t.balance, pol, t.model.d_model, t.model.moe.hidden_dim,
                                 t.model.moe.num_experts / size);
      t.balance.cost.flops_per_s = 1e6;
      t.balance.cost.net_bytes_per_s = 1e15;
      char name[128];
      snprintf(name, sizeof name, "P=%d balance %s", size, moe_balance_policy_name(pol));
      TU_CHECK(run_on(size, &t, &got, ctx) == MOE_STATUS_OK, "%s: %s", name, moe_ctx_error(ctx));
      compare(name, &got, &ref1, 1, 0);
      if (g_rank == 0) {
        TU_CHECK(g_res.balance_copies > 0, "%s: no copies were placed (%g)", name,
                 g_res.balance_copies);
        printf("  %-44s copies %.1f, balance ratio %.3f -> %.3f\n", name, g_res.balance_copies,
               g_res.balance_before, g_res.balance_after);
      }
    }
  }
  // deterministic mode: the rates are fixed, so the same balanced run twice
  // gives the same bits
  if (g_world >= 2) {
    moe_train_config t = tc;
    moe_balance_config_default(&t.balance, MOE_BALANCE_SHADOW, t.model.d_model,
                               t.model.moe.hidden_dim, t.model.moe.num_experts / g_world);
    t.balance.cost.flops_per_s = 0;  // the trainer's rates
    losses a, b2;
    TU_CHECK(run_on(g_world, &t, &a, ctx) == MOE_STATUS_OK, "balanced run: %s", moe_ctx_error(ctx));
    TU_CHECK(run_on(g_world, &t, &b2, ctx) == MOE_STATUS_OK, "balanced run: %s",
             moe_ctx_error(ctx));
    compare("balanced (shadow) run twice (bitwise)", &b2, &a, 1, 1);
  }
  {
    moe_train_config t = tc;
    moe_balance_config_default(&t.balance, MOE_BALANCE_EPLB, t.model.d_model,
                               t.model.moe.hidden_dim, t.model.moe.num_experts / g_world);
    t.balance.cost.flops_per_s = 1e6;
    t.balance.cost.net_bytes_per_s = 1e15;
    t.checkpoint = g_ckpt;
    t.stop_step = 10;
    if (g_world >= 2) {
      TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "balanced save: %s",
               moe_ctx_error(ctx));
      moe_train_config u = tc;
      u.resume = g_ckpt;
      TU_CHECK(run_on(1, &u, &got, ctx) == MOE_STATUS_OK, "resume without balancing: %s",
               moe_ctx_error(ctx));
      compare("balanced checkpoint resumed on 1 rank", &got, &ref1, 11, 0);
    }
    // resumed with the same balancing it continues bitwise: the balancer's
    // state (window, placement, re-planning phase, rates) is in the
    // checkpoint. prophet re-plans every 3 steps; eplb averages 10 steps.
    for (int pol = MOE_BALANCE_PROPHET; g_world >= 2 && pol <= MOE_BALANCE_EPLB; pol++) {
      moe_train_config v = t;
      moe_balance_config_default(&v.balance, pol, v.model.d_model, v.model.moe.hidden_dim,
                                 v.model.moe.num_experts / g_world);
      v.balance.cost.flops_per_s = 1e6;
      v.balance.cost.net_bytes_per_s = 1e15;
      v.balance.replan_every = pol == MOE_BALANCE_PROPHET ? 3 : 1;
      v.stop_step = 0;
      v.checkpoint = g_ckpt2;
      losses whole, part;
      char name[128];
      snprintf(name, sizeof name, "%s resumed at 10 with balancing (bitwise)",
               moe_balance_policy_name(pol));
      TU_CHECK(run_on(g_world, &v, &whole, ctx) == MOE_STATUS_OK, "%s: %s", name,
               moe_ctx_error(ctx));
      if (g_rank == 0) copy_file(g_ckpt2, g_ckpt2_whole);
      v.stop_step = 10;
      TU_CHECK(run_on(g_world, &v, &part, ctx) == MOE_STATUS_OK, "%s: %s", name,
               moe_ctx_error(ctx));
      v.stop_step = 0;
      v.resume = g_ckpt2;
      TU_CHECK(run_on(g_world, &v, &part, ctx) == MOE_STATUS_OK, "%s: %s", name,
               moe_ctx_error(ctx));
      compare(name, &part, &whole, 11, 1);
      if (g_rank == 0) {
        TU_CHECK(g_res.balance_copies > 0, "%s: no copies were placed", name);
        TU_CHECK(file_equal(g_ckpt2, g_ckpt2_whole),
                 "%s: the final checkpoint differs from the uninterrupted run's", name);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
    // bad input: EP 1, slots out of range (every rank, no hang)
    moe_train_config b = t;
    b.checkpoint = NULL;
    b.stop_step = 0;
    b.par.ep_size = 1;
    expect_fail("balance with EP 1", g_world, &b, "needs an EP size of at least 2", ctx);
    if (g_world >= 2) {
      b.par.ep_size = 0;
      b.balance.slots = 99;
      expect_fail("balance slots out of range", g_world, &b, "balance slots (99) must be in", ctx);
    }
  }

  // 2c. DeepSeek-V3's router-bias update: the same losses on every layout
  // (the load is integer counts summed over the world, so every rank and
  // world size holds the same bias); it changes the routing (other losses
  // than without it); the checkpoint's bias is the update rule applied by
  // hand to the routing trace's counts; resume is bitwise.
  {
    moe_train_config t = tc;
    t.router_bias_rate = 0.05f;
    losses rb1;
    TU_CHECK(run_on(1, &t, &rb1, ctx) == MOE_STATUS_OK, "router bias, 1 rank: %s",
             moe_ctx_error(ctx));
    if (g_rank == 0) {
      int differs = 0;
      for (int k = 2; k <= STEPS; k++) differs |= rb1.loss[k] != ref1.loss[k];
      TU_CHECK(differs, "router-bias update 0.05 left every loss as without it");
      TU_CHECK(g_res.router_bias_max > 0 && g_res.expert_load_ratio_first >= 1,
               "router bias: largest |bias| %g, load ratio %g", g_res.router_bias_max,
               g_res.expert_load_ratio_first);
    }
    for (int size = 2; size <= g_world; size *= 2) {
      char name[96];
      snprintf(name, sizeof name, "P=%d router-bias update", size);
      TU_CHECK(run_on(size, &t, &got, ctx) == MOE_STATUS_OK, "%s: %s", name, moe_ctx_error(ctx));
      compare(name, &got, &rb1, 1, 1);  // deterministic mode: bitwise
    }
    char trace[300];
    snprintf(trace, sizeof trace, "%s.routing", g_ckpt);
    t.routing_trace = trace;
    t.checkpoint = g_ckpt;
    t.stop_step = 10;
    TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "router bias save: %s",
             moe_ctx_error(ctx));
    if (g_rank == 0) check_bias_against_trace(ctx, g_ckpt, trace, t.router_bias_rate);
    t.routing_trace = NULL;
    t.checkpoint = NULL;
    t.stop_step = 0;
    losses full;
    TU_CHECK(run_on(g_world, &t, &full, ctx) == MOE_STATUS_OK, "router bias: %s",
             moe_ctx_error(ctx));
    t.resume = g_ckpt;
    TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "router bias resume: %s",
             moe_ctx_error(ctx));
    compare("router-bias update resumed at 10 (bitwise)", &got, &full, 11, 1);
    if (g_rank == 0) remove(trace);
    moe_train_config b = tc;
    b.router_bias_rate = 2;
    expect_fail("router-bias rate 2", g_world, &b, "out of range [0, 1]", ctx);
    b.router_bias_rate = NAN;
    expect_fail("router-bias rate NaN", g_world, &b, "out of range [0, 1]", ctx);
  }

  // 3. resume: stop at 10, resume to 20 (bitwise at the same layout).
  {
    moe_train_config t = tc;
    t.checkpoint = g_ckpt;
    t.stop_step = 10;
    TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "save: %s", moe_ctx_error(ctx));
    t.stop_step = 0;
    t.checkpoint = NULL;
    t.resume = g_ckpt;
    TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "resume: %s", moe_ctx_error(ctx));
    compare("resume at step 10, same layout (bitwise)", &got, &ref, 11, 1);
    // The resumed run's first validation is the checkpoint's (step 10, the
    // uninterrupted run's value there), not its own first one (step 15).
    if (g_rank == 0)
      TU_CHECK(g_res.first_val_step == 10 && g_res.first_val_loss == ref.val[10] &&
                   g_res.final_val_step == STEPS && g_res.final_val_loss == ref.val[STEPS],
               "resumed run's val loss: first %.9g at step %d (want %.9g at 10), final %.9g at "
               "step %d (want %.9g at %d)",
               g_res.first_val_loss, g_res.first_val_step, ref.val[10], g_res.final_val_loss,
               g_res.final_val_step, ref.val[STEPS], STEPS);
    if (g_world >= 2) {
      TU_CHECK(run_on(g_world / 2, &t, &got, ctx) == MOE_STATUS_OK, "resume: %s",
               moe_ctx_error(ctx));
      compare("resume on half the ranks", &got, &ref, 11, 0);
    }
    TU_CHECK(run_on(1, &t, &got, ctx) == MOE_STATUS_OK, "resume: %s", moe_ctx_error(ctx));
    compare("resume on 1 rank", &got, &ref, 11, 0);
  }

  // 3b. the learning-rate schedule is the checkpoint's on resume (g_ckpt: step
  // 10 of a 20-step schedule).
  {
    moe_train_config t = tc;
    t.resume = g_ckpt;
    // More steps: steps 11..20 exactly as the uninterrupted run (the schedule
    // did not stretch to 30 steps), 21..30 at min_lr.
    t.steps = 2 * STEPS;
    TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "resume, more steps: %s",
             moe_ctx_error(ctx));
    compare("resume with steps 40 > the schedule's 20", &got, &ref, 11, 1);
    if (g_rank == 0) {
      int same_lr = 1, at_min = 1;
      for (int k = 11; k <= STEPS; k++) same_lr &= got.lr[k] == ref.lr[k];
      for (int k = STEPS + 1; k <= 2 * STEPS; k++) at_min &= got.lr[k] == (double)tc.optim.min_lr;
      TU_CHECK(same_lr,
               "resume, more steps: lr of steps 11..20 differs from the uninterrupted "
               "run's (step 11: %.9g vs %.9g)",
               got.lr[11], ref.lr[11]);
      TU_CHECK(at_min, "resume, more steps: steps 21..40 not at min_lr (step 21: %.9g)",
               got.lr[21]);
      TU_CHECK(g_res.schedule.from_checkpoint && g_res.schedule.extended &&
                   g_res.schedule.total_steps == STEPS && g_res.schedule.resumed_step == 10 &&
                   g_res.schedule.warmup_steps == tc.optim.warmup_steps &&
                   g_res.schedule.lr == tc.optim.lr && g_res.schedule.min_lr == tc.optim.min_lr,
               "resume, more steps: schedule reported: from checkpoint %d, extended %d, total %d, "
               "resumed at %d",
               g_res.schedule.from_checkpoint, g_res.schedule.extended, g_res.schedule.total_steps,
               g_res.schedule.resumed_step);
    }
    // Another schedule asked for explicitly: refused on every rank.
    t = tc;
    t.resume = g_ckpt;
    t.optim.lr = 2e-2f;
    expect_fail("resume with another lr", g_world, &t, "schedule is kept on resume", ctx);
    t = tc;
    t.resume = g_ckpt;
    t.optim.warmup_steps = 5;
    expect_fail("resume with another warmup", g_world, &t, "asks for warmup 5", ctx);
    t = tc;
    t.resume = g_ckpt;
    t.steps = 15;
    expect_fail("resume with fewer steps", g_world, &t, "--stop-at 15", ctx);
    // A checkpoint without a schedule (content version 1) still loads, with
    // this run's schedule (the behaviour before schedules were stored).
    int v1 = 1;
    if (g_rank == 0) v1 = write_v1_checkpoint(ctx, g_ckpt, g_ckpt2);
    MPI_Bcast(&v1, 1, MPI_INT, 0, MPI_COMM_WORLD);
    TU_CHECK(v1, "writing a version 1 checkpoint");
    if (v1) {
      t = tc;
      t.resume = g_ckpt2;
      TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "resume a version 1 file: %s",
               moe_ctx_error(ctx));
      compare("resume a version 1 checkpoint (bitwise)", &got, &ref, 11, 1);
      if (g_rank == 0)
        TU_CHECK(!g_res.schedule.from_checkpoint && g_res.schedule.total_steps == STEPS,
                 "version 1: the schedule is this run's (from checkpoint %d, total %d)",
                 g_res.schedule.from_checkpoint, g_res.schedule.total_steps);
      t.steps = 30;  // no stored schedule: this run's 30-step one, as before
      TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "resume a version 1 file: %s",
               moe_ctx_error(ctx));
      if (g_rank == 0)
        TU_CHECK(g_res.schedule.total_steps == 30 && got.lr[11] != ref.lr[11],
                 "version 1, steps 30: the schedule follows steps (total %d)",
                 g_res.schedule.total_steps);
    }
    if (g_rank == 0) remove(g_ckpt2);
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // 4. errors on every rank
  {
    moe_train_config t = tc;
    if (g_world >= 3) {
      t.batch = 9;
      expect_fail("batch 9 on 3+ ranks", 3, &t, "divisible", ctx);
      t.batch = 8;
      t.model.moe.num_experts = 6;
      t.model.moe.top_k = 2;
      t.par.ep_size = 4;
      if (g_world >= 4) expect_fail("6 experts on EP 4", 4, &t, "divisible", ctx);
    }
    // A corrupted checkpoint: every rank fails, the file is unchanged.
    if (g_rank == 0) {
      copy_file(g_ckpt, g_ckpt2);
      FILE *f = fopen(g_ckpt2, "r+b");
      if (f) {
        fseek(f, 4000, SEEK_SET);
        const int c = fgetc(f);
        fseek(f, 4000, SEEK_SET);
        fputc(c ^ 0x5a, f);
        fclose(f);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char snapshot[300];
    snprintf(snapshot, sizeof snapshot, "%s.snap", g_ckpt2);
    if (g_rank == 0) copy_file(g_ckpt2, snapshot);
    MPI_Barrier(MPI_COMM_WORLD);
    t = tc;
    t.resume = g_ckpt2;
    t.checkpoint = g_ckpt2;
    expect_fail("corrupted checkpoint", g_world, &t, "checksum", ctx);
    if (g_rank == 0)
      TU_CHECK(file_equal(g_ckpt2, snapshot), "the corrupted checkpoint was changed");
    // Another model: a wider d_model.
    t = tc;
    t.model.d_model = 32;
    t.resume = g_ckpt;
    expect_fail("checkpoint of another model", g_world, &t, "differs", ctx);
    // An unwritable path: the run fails on every rank at its save.
    t = tc;
    t.checkpoint = "/nonexistent-dir/x.ckpt";
    t.steps = 2;
    expect_fail("unwritable checkpoint path", g_world, &t, "nonexistent", ctx);
    if (g_rank == 0) {
      remove(snapshot);
      remove(g_ckpt2);
      remove(g_ckpt2_whole);
    }
  }

  // 5. 'auto' planned in the library: moe_train_run with a profile makes the
  // planner's choice for the layer's per-rank shape (B/P x S tokens) and
  // trains exactly as the same choice given by hand; without a profile,
  // 'auto' is refused on every rank.
  {
    moe_profile prof;
    memset(&prof, 0, sizeof prof);
    snprintf(prof.name, sizeof prof.name, "unit");
    prof.cluster.nodes = 1;
    prof.cluster.devices_per_node = g_world;
    prof.cluster.gemm_tflops = 0.05;
    prof.cluster.intra.gbit_per_s = 8.0;
    prof.cluster.intra.latency_us = 20.0;
    prof.cluster.inter = prof.cluster.intra;
    prof.cluster.nics_per_node = 1;
    snprintf(prof.cluster.name, sizeof prof.cluster.name, "unit");
    prof.gemm = (moe_linear_fit){2e-6, 2e-11, 0.999, 0.0, 12, 0.0};
    prof.n_a2a = 2;
    snprintf(prof.a2a[0].name, sizeof prof.a2a[0].name, "mpi");
    prof.a2a[0].fit = (moe_linear_fit){4e-5, 1e-9, 0.999, 0.0, 12, 0.0};
    snprintf(prof.a2a[1].name, sizeof prof.a2a[1].name, "pairwise");
    prof.a2a[1].fit = (moe_linear_fit){1e-5, 2e-9, 0.999, 0.0, 12, 0.0};
    moe_train_config t = tc;
    snprintf(t.par.a2a, sizeof t.par.a2a, "auto");
    snprintf(t.par.schedule, sizeof t.par.schedule, "auto");
    t.par.chunks = 0;
    expect_fail("auto without a profile", g_world, &t, "needs a calibrated profile", ctx);
    t.profile = &prof;
    moe_train_config planned = t;
    moe_plan plan;
    TU_CHECK(moe_train_plan(ctx, MPI_COMM_WORLD, &planned, &plan) == MOE_STATUS_OK,
             "moe_train_plan: %s", moe_ctx_error(ctx));
    // the same request made by hand through the perf planner
    moe_plan_request q;
    memset(&q, 0, sizeof q);
    q.cfg = tc.model.moe;
    q.cfg.model_dim = tc.model.d_model;
    q.cfg.tokens = tc.batch / g_world * tc.model.seq_len;
    snprintf(q.a2a, sizeof q.a2a, "auto");
    snprintf(q.schedule, sizeof q.schedule, "auto");
    snprintf(q.compress, sizeof q.compress, "%s", tc.par.compress);
    q.profile = &prof;
    moe_plan direct;
    TU_CHECK(moe_plan_layer(ctx, &prof.cluster, &q, &direct) == MOE_STATUS_OK, "plan_layer: %s",
             moe_ctx_error(ctx));
    TU_CHECK(strcmp(planned.par.a2a, direct.best.a2a) == 0 &&
                 strcmp(planned.par.schedule, direct.best.schedule) == 0 &&
                 planned.par.chunks == direct.best.chunks && planned.par.chunks > 0 &&
                 plan.predicted.pass_ms[0] == direct.predicted.pass_ms[0],
             "train plan %s/%s/r=%d vs the planner's %s/%s/r=%d", planned.par.a2a,
             planned.par.schedule, planned.par.chunks, direct.best.a2a, direct.best.schedule,
             direct.best.chunks);
    if (g_rank == 0)
      printf("  the plan for %d tokens per rank: a2a %s, schedule %s, r=%d\n", q.cfg.tokens,
             planned.par.a2a, planned.par.schedule, planned.par.chunks);
    planned.profile = NULL;
    losses by_hand;
    TU_CHECK(run_on(g_world, &planned, &by_hand, ctx) == MOE_STATUS_OK, "planned by hand: %s",
             moe_ctx_error(ctx));
    TU_CHECK(run_on(g_world, &t, &got, ctx) == MOE_STATUS_OK, "auto with a profile: %s",
             moe_ctx_error(ctx));
    compare("auto with a profile = its plan given by hand (bitwise)", &got, &by_hand, 1, 1);
    // a profile of another number of ranks
    prof.cluster.devices_per_node = g_world + 1;
    expect_fail("profile of other ranks", g_world, &t, "calibrated on", ctx);
  }

  if (g_rank == 0) {
    remove(g_ckpt);
    remove(g_text);
  }
  moe_ctx_destroy(ctx);
  int failures = tu_failures, all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = 0;
  if (g_rank == 0) rc = tu_finish("test_train");
  MPI_Finalize();
  return all ? 1 : rc;
}
