// MoE-GPT without PyTorch: configuration (defaults, every validation error,
// JSON errors and round trip), the parameter table, init statistics, forward
// argument checks, finite-difference gradients of every tensor (a dense-only
// model and a dropless MoE model), slicing B and S, the learning-rate schedule,
// the optimizer (decay only where declared, clipping), and that a second
// forward + backward + step allocates nothing.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/model.h"
#include "testutil.h"

static moe_ctx *g_ctx;
static const double K_PI = 3.14159265358979323846;

// ---- configuration ----------------------------------------------------------------------

static void expect_invalid(const moe_gpt_config *cfg, const char *field) {
  const moe_status st = moe_gpt_config_validate(g_ctx, cfg);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "config with bad %s: status %s", field,
           moe_status_str(st));
  TU_CHECK(strstr(moe_ctx_error(g_ctx), field) != NULL, "error '%s' does not name '%s'",
           moe_ctx_error(g_ctx), field);
}

static void test_config(void) {
  moe_gpt_config d, c;
  moe_gpt_config_default(&d);
  TU_CHECK(moe_gpt_config_validate(g_ctx, &d) == MOE_STATUS_OK, "defaults invalid: %s",
           moe_ctx_error(g_ctx));
  TU_CHECK(d.vocab_size == 256 && d.seq_len == 128 && d.n_layer == 4 && d.n_head == 4 &&
               d.d_model == 128 && d.moe_every == 1 && d.dense_hidden == 512 &&
               d.moe.num_experts == 8 && d.moe.top_k == 2 && d.moe.hidden_dim == 256 &&
               d.moe.capacity_factor <= 0 && d.moe.renormalize == 1 && d.moe.act == MOE_ACT_GELU,
           "defaults differ from the header");
  TU_CHECK(moe_gpt_block_is_moe(&d, 0) && moe_gpt_block_is_moe(&d, 3), "moe_every 1");
  c = d;
  c.moe_every = 2;
  TU_CHECK(!moe_gpt_block_is_moe(&c, 0) && moe_gpt_block_is_moe(&c, 1) &&
               !moe_gpt_block_is_moe(&c, 2) && moe_gpt_block_is_moe(&c, 3),
           "moe_every 2: dense blocks 0, 2");
  c.moe_every = 0;
  TU_CHECK(!moe_gpt_block_is_moe(&c, 0) && !moe_gpt_block_is_moe(&c, 3), "moe_every 0");

#define BAD(field, value, name) \
  do {                          \
    c = d;                      \
    c.field = value;            \
    expect_invalid(&c, name);   \
  } while (0)
  BAD(vocab_size, 1, "vocab_size");
  BAD(vocab_size, 65537, "vocab_size");
  BAD(seq_len, 0, "seq_len");
  BAD(seq_len, 65537, "seq_len");
  BAD(n_layer, 0, "n_layer");
  BAD(n_layer, MOE_GPT_MAX_LAYERS + 1, "n_layer");
  BAD(d_model, 0, "d_model");
  BAD(n_head, 0, "n_head");
  BAD(n_head, 3, "n_head");  // does not divide 128
  BAD(n_head, 256, "n_head");
  BAD(moe_every, -1, "moe_every");
  BAD(moe_every, 5, "moe_every");
  BAD(dense_hidden, 0, "dense_hidden");
  BAD(ln_eps, 0.0f, "ln_eps");
  BAD(ln_eps, NAN, "ln_eps");
  BAD(init_std, -1.0f, "init_std");
  BAD(moe.top_k, 9, "top_k");
  BAD(moe.num_experts, 0, "num_experts");
  BAD(moe.hidden_dim, 0, "hidden_dim");
  BAD(moe.aux_loss_coef, -1.0f, "aux_loss_coef");
#undef BAD
  c = d;
  c.n_head = 3;
  moe_gpt_config_validate(g_ctx, &c);
  TU_CHECK(strstr(moe_ctx_error(g_ctx), "divide d_model") != NULL, "n_head message: %s",
           moe_ctx_error(g_ctx));
  // MoE sub-config ignored when no block has an MoE FFN
  c = d;
  c.moe_every = 0;
  c.moe.top_k = 99;
  TU_CHECK(moe_gpt_config_validate(g_ctx, &c) == MOE_STATUS_OK, "dense-only ignores moe: %s",
           moe_ctx_error(g_ctx));

  // JSON: overrides, round trip
  c = d;
  TU_CHECK(moe_gpt_config_from_json(g_ctx,
                                    "{\"vocab_size\": 100, \"seq_len\": 64, \"n_layer\": 3, "
                                    "\"n_head\": 2, \"d_model\": 32, \"moe_every\": 2, "
                                    "\"dense_hidden\": 48, \"ln_eps\": 1e-6, \"init_std\": 0.05, "
                                    "\"moe\": {\"num_experts\": 4, \"top_k\": 1, "
                                    "\"capacity_factor\": 1.5, \"activation\": \"relu\"}}",
                                    &c) == MOE_STATUS_OK,
           "JSON: %s", moe_ctx_error(g_ctx));
  TU_CHECK(c.vocab_size == 100 && c.seq_len == 64 && c.n_layer == 3 && c.n_head == 2 &&
               c.d_model == 32 && c.moe_every == 2 && c.dense_hidden == 48 && c.ln_eps == 1e-6f &&
               c.init_std == 0.05f && c.moe.num_experts == 4 && c.moe.top_k == 1 &&
               c.moe.capacity_factor == 1.5 && c.moe.act == MOE_ACT_RELU &&
               c.moe.hidden_dim == d.moe.hidden_dim,
           "JSON values not applied");
  char buf[2048];
  TU_CHECK(moe_gpt_config_to_json(g_ctx, &c, buf, sizeof buf) == MOE_STATUS_OK, "to_json: %s",
           moe_ctx_error(g_ctx));
  moe_gpt_config back = d;
  TU_CHECK(moe_gpt_config_from_json(g_ctx, buf, &back) == MOE_STATUS_OK, "round trip: %s",
           moe_ctx_error(g_ctx));
  TU_CHECK(
      memcmp(&back, &c, sizeof c) == 0 ||
          (back.vocab_size == c.vocab_size && back.seq_len == c.seq_len &&
           back.n_layer == c.n_layer && back.n_head == c.n_head && back.d_model == c.d_model &&
           back.moe_every == c.moe_every && back.dense_hidden == c.dense_hidden &&
           back.ln_eps == c.ln_eps && back.init_std == c.init_std &&
           back.moe.tokens == c.moe.tokens && back.moe.model_dim == c.moe.model_dim &&
           back.moe.hidden_dim == c.moe.hidden_dim && back.moe.num_experts == c.moe.num_experts &&
           back.moe.top_k == c.moe.top_k && back.moe.capacity_factor == c.moe.capacity_factor &&
           back.moe.act == c.moe.act && back.moe.renormalize == c.moe.renormalize &&
           back.moe.aux_loss_coef == c.moe.aux_loss_coef &&
           back.moe.z_loss_coef == c.moe.z_loss_coef &&
           back.moe.check_finite == c.moe.check_finite &&
           strcmp(back.moe.expert, c.moe.expert) == 0),
      "JSON round trip differs: %s", buf);
  TU_CHECK(moe_gpt_config_to_json(g_ctx, &c, buf, 20) == MOE_STATUS_INVALID_ARG,
           "to_json into a short buffer");
  // found by fuzzing (fuzz/fuzz_gpt_config.c): a dense model does not check its
  // MoE fields, so its expert kind may be any name; the text written (which
  // every checkpoint stores) must still read back, quotes and control
  // characters included
  {
    moe_gpt_config dense = d;
    dense.moe_every = 0;
    snprintf(dense.moe.expert, sizeof dense.moe.expert,
             "a\"b\\c\x01"
             "d");
    TU_CHECK(moe_gpt_config_validate(g_ctx, &dense) == MOE_STATUS_OK, "dense config: %s",
             moe_ctx_error(g_ctx));
    moe_gpt_config dback = d;
    TU_CHECK(moe_gpt_config_to_json(g_ctx, &dense, buf, sizeof buf) == MOE_STATUS_OK &&
                 moe_gpt_config_from_json(g_ctx, buf, &dback) == MOE_STATUS_OK &&
                 strcmp(dback.moe.expert, dense.moe.expert) == 0 && dback.moe_every == 0,
             "dense config with expert name a\"b\\c\\x01d: %s -> %s", buf, moe_ctx_error(g_ctx));
  }
  // found by fuzzing: the largest accepted values (aux/z coefficients 1e30,
  // float fields 3e38) are written as the float they are stored in, which is
  // above the bound as a double; they must still read back
  {
    moe_gpt_config big = d;
    big.moe.aux_loss_coef = big.moe.z_loss_coef = 1e30f;
    big.ln_eps = big.init_std = 3e38f;
    TU_CHECK(moe_gpt_config_validate(g_ctx, &big) == MOE_STATUS_OK, "large values: %s",
             moe_ctx_error(g_ctx));
    moe_gpt_config bback = d;
    TU_CHECK(moe_gpt_config_to_json(g_ctx, &big, buf, sizeof buf) == MOE_STATUS_OK &&
                 moe_gpt_config_from_json(g_ctx, buf, &bback) == MOE_STATUS_OK &&
                 bback.moe.aux_loss_coef == 1e30f && bback.moe.z_loss_coef == 1e30f &&
                 bback.ln_eps == 3e38f && bback.init_std == 3e38f,
             "largest values round trip: %s -> %s", buf, moe_ctx_error(g_ctx));
    moe_gpt_config over = d;
    TU_CHECK(
        moe_gpt_config_from_json(g_ctx, "{\"moe\": {\"aux_loss_coef\": 1.1e30}}", &over) ==
                MOE_STATUS_INVALID_ARG &&
            moe_gpt_config_from_json(g_ctx, "{\"ln_eps\": 1e39}", &over) == MOE_STATUS_INVALID_ARG,
        "values above the bounds are still refused");
  }

  // JSON errors name the key; cfg unchanged
  static const struct {
    const char *json, *want;
  } bad[] = {
      {"{\"vocab\": 3}", "vocab"},
      {"{\"n_layer\": 2, \"n_layer\": 3}", "n_layer"},
      {"{\"seq_len\": \"long\"}", "seq_len"},
      {"{\"d_model\": 1.5}", "d_model"},
      {"{\"ln_eps\": true}", "ln_eps"},
      {"{\"init_std\": 1e300}", "init_std"},
      {"{\"moe\": 3}", "moe"},
      {"{\"moe\": {\"experts\": 3}}", "experts"},
      {"{\"moe\": {\"top_k\": \"two\"}}", "top_k"},
      {"{\"n_head\": 2", ""},
      {"[1, 2]", ""},
      {"{\"n_head\": 2} x", ""},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    moe_gpt_config t = d;
    const moe_status st = moe_gpt_config_from_json(g_ctx, bad[i].json, &t);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG || st == MOE_STATUS_BAD_FORMAT,
             "bad JSON %s accepted (%s)", bad[i].json, moe_status_str(st));
    TU_CHECK(strstr(moe_ctx_error(g_ctx), bad[i].want) != NULL,
             "bad JSON %s: error '%s' does not name '%s'", bad[i].json, moe_ctx_error(g_ctx),
             bad[i].want);
    TU_CHECK(memcmp(&t, &d, sizeof d) == 0, "bad JSON %s changed the config", bad[i].json);
  }
}

// ---- helpers ---------------------------------------------------------------------------------

// A tiny config: V 11, S 5, L 2, NH 2, M 8, dense 12, E 4, K 2, H 8, dropless.
static moe_gpt_config tiny_config(int moe_every) {
  moe_gpt_config c;
  moe_gpt_config_default(&c);
  c.vocab_size = 11;
  c.seq_len = 5;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  c.dense_hidden = 12;
  c.moe_every = moe_every;
  c.init_std = 0.3f;
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.hidden_dim = 8;
  c.moe.capacity_factor = -1.0;
  c.moe.aux_loss_coef = 0.05f;
  c.moe.z_loss_coef = 0.01f;
  return c;
}

static moe_gpt *make_model(const moe_gpt_config *c, int max_batch, const moe_gpt_moe_ops *ops,
                           void *user) {
  moe_gpt *m = NULL;
  const moe_status st = moe_gpt_create(g_ctx, c, max_batch, ops, user, &m);
  TU_CHECK(st == MOE_STATUS_OK, "create: %s", moe_ctx_error(g_ctx));
  return m;
}

// Init, then perturb the vectors (biases 0 and gains 1 would hide mistakes).
static void init_random(moe_gpt *m, uint64_t seed) {
  moe_gpt_init_params(m, seed);
  for (int i = 0; i < moe_gpt_num_params(m); i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    if (p.ndim != 1) continue;
    float *noise = malloc(p.numel * sizeof(float));
    tu_fill(noise, p.numel, seed * 131 + (uint64_t)i, -0.2f, 0.2f);
    for (size_t j = 0; j < p.numel; j++) p.data[j] += noise[j];
    free(noise);
  }
}

static void fill_tokens(int32_t *tok, int32_t *tgt, int n, int v, uint64_t seed) {
  moe_rng rng;
  moe_rng_init(&rng, seed, 7);
  for (int i = 0; i < n; i++) {
    tok[i] = (int32_t)(moe_rng_u32(&rng) % (uint32_t)v);
    if (tgt) tgt[i] = (int32_t)(moe_rng_u32(&rng) % (uint32_t)v);
  }
}

// A backend that is the local one but remembers its layers, so a test can read
// the routing (a finite difference is only valid when the routing stays put).
typedef struct {
  moe_layer *layers[MOE_GPT_MAX_LAYERS];
  int n;
} route_spy;

static moe_status spy_create(void *user, moe_ctx *ctx, const moe_layer_config *cfg, int block,
                             void **impl) {
  route_spy *s = user;
  const moe_status st = moe_gpt_moe_local.create(NULL, ctx, cfg, block, impl);
  if (st == MOE_STATUS_OK) s->layers[s->n++] = *impl;
  return st;
}

static moe_gpt_moe_ops spy_ops(void) {
  moe_gpt_moe_ops o = moe_gpt_moe_local;
  o.name = "spy";
  o.create = spy_create;
  return o;
}

// Copies every layer's expert choices (T, K) into out (n ints at most); returns the count.
static int route_signature(const route_spy *s, int32_t *out, int n) {
  int k = 0;
  for (int l = 0; l < s->n; l++) {
    const moe_route *r = moe_layer_get_route(s->layers[l]);
    for (int i = 0; i < r->tokens * r->top_k && k < n; i++) out[k++] = r->expert[i];
  }
  return k;
}

// ---- finite differences ------------------------------------------------------------------------

typedef struct {
  moe_gpt *m;
  const int32_t *tok, *tgt;
  int b, s;
} fd_case;

// The full objective: CE / denominator + sum of aux_coef * aux + z_coef * z.
static double objective(const fd_case *fc) {
  moe_gpt_loss l;
  const moe_status st = moe_gpt_forward(fc->m, fc->tok, fc->tgt, fc->b, fc->s, 1.0, &l);
  if (st != MOE_STATUS_OK) return NAN;
  const moe_gpt_config *c = moe_gpt_get_config(fc->m);
  return l.loss + (double)c->moe.aux_loss_coef * l.aux + (double)c->moe.z_loss_coef * l.z;
}

static void fd_check_model(const char *what, moe_gpt *m, route_spy *spy, int b, int s) {
  const moe_gpt_config *c = moe_gpt_get_config(m);
  const int N = b * s;
  int32_t *tok = malloc((size_t)N * sizeof *tok), *tgt = malloc((size_t)N * sizeof *tgt);
  fill_tokens(tok, tgt, N, c->vocab_size, 99);
  tgt[1] = -1;  // an ignored position
  fd_case fc = {m, tok, tgt, b, s};
  moe_gpt_zero_grad(m);
  const double base = objective(&fc);
  TU_CHECK(isfinite(base), "%s: forward failed: %s", what, moe_ctx_error(g_ctx));
  TU_CHECK(moe_gpt_backward(m) == MOE_STATUS_OK, "%s: backward: %s", what, moe_ctx_error(g_ctx));
  enum { SIG = 4096 };
  int32_t sig0[SIG], sig1[SIG];
  const int nsig = spy ? route_signature(spy, sig0, SIG) : 0;
  int checked_total = 0, skipped = 0;
  double worst = 0.0;
  for (int i = 0; i < moe_gpt_num_params(m); i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    // the analytic gradient, copied (the forwards below do not touch it, but be safe)
    float *an = malloc(p.numel * sizeof(float));
    memcpy(an, p.grad, p.numel * sizeof(float));
    float gmax = 0.0f;
    size_t imax = 0;
    for (size_t j = 0; j < p.numel; j++) {
      if (fabsf(an[j]) > gmax) {
        gmax = fabsf(an[j]);
        imax = j;
      }
    }
    // entries: the largest gradient, then a few spread over the tensor
    size_t cand[6] = {imax, 0, p.numel / 3, p.numel / 2, (2 * p.numel) / 3, p.numel - 1};
    int checked = 0;
    for (int ci = 0; ci < 6; ci++) {
      const size_t j = cand[ci];
      // central differences at h and h/2, Richardson-combined (cancels the h^2 term)
      const float orig = p.data[j];
      double fdh[2];
      int flip = 0;
      for (int hi = 0; hi < 2; hi++) {
        const float h = hi == 0 ? 1e-2f : 5e-3f;
        p.data[j] = orig + h;
        const float up = p.data[j];
        const double fp = objective(&fc);
        flip = flip || (spy && (route_signature(spy, sig1, SIG) != nsig ||
                                memcmp(sig0, sig1, (size_t)nsig * sizeof(int32_t)) != 0));
        p.data[j] = orig - h;
        const float dn = p.data[j];
        const double fm = objective(&fc);
        flip = flip || (spy && (route_signature(spy, sig1, SIG) != nsig ||
                                memcmp(sig0, sig1, (size_t)nsig * sizeof(int32_t)) != 0));
        fdh[hi] = (fp - fm) / ((double)up - (double)dn);
      }
      p.data[j] = orig;
      if (flip) {
        skipped++;
        continue;
      }
      const double fd = (4.0 * fdh[1] - fdh[0]) / 3.0;
      const double err = fabs(fd - an[j]);
      const double tol = 1e-3 + 1e-2 * fmax(fabs(fd), fabs(an[j]));
      worst = fmax(worst, err / tol);
      TU_CHECK(err <= tol, "%s: %s[%zu]: finite difference %.6g, backward %.6g", what, p.name, j,
               fd, (double)an[j]);
      checked++;
    }
    TU_CHECK(checked >= 3, "%s: %s: only %d entries checked (routing flips)", what, p.name,
             checked);
    TU_CHECK(gmax > 0.0f, "%s: %s: gradient is all zero", what, p.name);
    checked_total += checked;
    free(an);
  }
  objective(&fc);  // leave the model as it was
  printf(
      "%s: %d gradient entries checked against finite differences (%d skipped for routing), "
      "worst |fd - backward| / tolerance %.2f\n",
      what, checked_total, skipped, worst);
  free(tok);
  free(tgt);
}

static void test_finite_differences(void) {
  // dense-only
  moe_gpt_config c = tiny_config(0);
  moe_gpt *m = make_model(&c, 3, NULL, NULL);
  if (m) {
    init_random(m, 5);
    fd_check_model("dense-only", m, NULL, 3, 5);
  }
  moe_gpt_destroy(m);
  // MoE in every block, dropless, renormalised, aux and z losses on
  route_spy spy = {{0}, 0};
  const moe_gpt_moe_ops ops = spy_ops();
  c = tiny_config(1);
  m = make_model(&c, 3, &ops, &spy);
  if (m) {
    init_random(m, 6);
    fd_check_model("moe_every=1 dropless", m, &spy, 3, 5);
  }
  moe_gpt_destroy(m);
  // dense + MoE, no renormalisation, B and S below the maxima
  route_spy spy2 = {{0}, 0};
  c = tiny_config(2);
  c.moe.renormalize = 0;
  m = make_model(&c, 4, &ops, &spy2);
  if (m) {
    init_random(m, 7);
    fd_check_model("moe_every=2 B3 S4", m, &spy2, 3, 4);
  }
  moe_gpt_destroy(m);
}

// ---- parameter table and init ------------------------------------------------------------------

static double stddev(const float *x, size_t n, double *mean_out) {
  double s = 0.0, s2 = 0.0;
  for (size_t i = 0; i < n; i++) {
    s += x[i];
    s2 += (double)x[i] * x[i];
  }
  const double mean = s / (double)n;
  if (mean_out) *mean_out = mean;
  return sqrt(fmax(s2 / (double)n - mean * mean, 0.0));
}

static void test_params_and_init(void) {
  moe_gpt_config c;
  moe_gpt_config_default(&c);
  c.moe_every = 2;
  moe_gpt *m = make_model(&c, 2, NULL, NULL);
  if (!m) return;
  const size_t V = 256, S = 128, M = 128, Hd = 512, E = 8, H = 256, K = 2;
  // table: 2 + 2 x (8 + 4) + 2 x (8 + 5) + 2 tensors, in the documented order
  TU_CHECK(moe_gpt_num_params(m) == 2 + 2 * 12 + 2 * 13 + 2, "num_params %d",
           moe_gpt_num_params(m));
  static const char *const order[] = {
      "wte",           "wpe",           "h0.ln1.g",       "h0.ln1.b",
      "h0.attn.w_qkv", "h0.attn.b_qkv", "h0.attn.w_proj", "h0.attn.b_proj",
      "h0.ln2.g",      "h0.ln2.b",      "h0.ffn.w_fc",    "h0.ffn.b_fc",
      "h0.ffn.w_fc2",  "h0.ffn.b_fc2",  "h1.ln1.g",       "h1.ln1.b",
      "h1.attn.w_qkv", "h1.attn.b_qkv", "h1.attn.w_proj", "h1.attn.b_proj",
      "h1.ln2.g",      "h1.ln2.b",      "h1.moe.wg",      "h1.moe.w1",
      "h1.moe.b1",     "h1.moe.w2",     "h1.moe.b2"};
  for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    TU_CHECK(strcmp(p.name, order[i]) == 0, "param %d is '%s', expected '%s'", i, p.name, order[i]);
  }
  const int np = moe_gpt_num_params(m);
  TU_CHECK(strcmp(moe_gpt_get_param(m, np - 2).name, "lnf.g") == 0 &&
               strcmp(moe_gpt_get_param(m, np - 1).name, "lnf.b") == 0,
           "lnf last");
  TU_CHECK(moe_gpt_get_param(m, np).data == NULL && moe_gpt_get_param(m, -1).data == NULL,
           "out-of-range param is empty");
  size_t dense = 0;
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    size_t whole = 1;
    for (int d = 0; d < p.ndim; d++) whole *= (size_t)p.dims[d];
    TU_CHECK(p.numel == whole, "%s: numel %zu != dims product %zu (local backend)", p.name, p.numel,
             whole);
    const char *leaf = strrchr(p.name, '.') ? strrchr(p.name, '.') + 1 : p.name;
    const int want_decay = p.ndim >= 2 && strcmp(leaf, "b1") != 0 && strcmp(leaf, "b2") != 0;
    TU_CHECK(p.decay == want_decay, "%s: decay %d", p.name, p.decay);
    TU_CHECK(p.data && p.grad, "%s: no memory", p.name);
    if (p.kind == MOE_GPT_PARAM_EXPERT) {
      TU_CHECK(p.expert_first == 0 && p.expert_count == (int)E && p.dims[0] == (int64_t)E,
               "%s: experts %d+%d", p.name, p.expert_first, p.expert_count);
    }
    if (p.kind == MOE_GPT_PARAM_DENSE) dense += p.numel;
  }
  const size_t attn = 2 * M + 3 * M * M + 3 * M + M * M + M + 2 * M;
  const size_t want_dense = V * M + S * M + 4 * attn + 2 * (M * Hd + Hd + Hd * M + M) + 2 * M;
  TU_CHECK(dense == want_dense, "dense elements %zu, expected %zu", dense, want_dense);
  const size_t expert = M * H + H + H * M + M;
  TU_CHECK(moe_gpt_total_elements(m) == want_dense + 2 * (M * E + E * expert), "total elements %zu",
           moe_gpt_total_elements(m));
  TU_CHECK(moe_gpt_active_elements(m) == want_dense + 2 * (M * E + K * expert),
           "active elements %zu", moe_gpt_active_elements(m));
  {
    // the formula of docs/model.md "Memory" (max_batch 2: N = 2 S), up to alignment padding
    const size_t N = 2 * S, L = 4, NH = 4, T = N, R = T * K, Ldense = 2;
    const size_t model = N * ((L + 1) * M + L * (7 * M + 4) + 3 * M + V + 5) + L * 2 * NH * S * S +
                         Ldense * 2 * N * Hd;
    const size_t scratch = 4 * N * M + 2 * N * Hd + S * S;
    const size_t shared = scratch > N * V ? scratch : N * V;
    const size_t moe =
        4 * T * E + T + 2 * T * K + 3 * R * M + 4 * R * H + 3 * T * K + 3 * E + 1 + 2 * R;
    const size_t want = 4 * (model + shared + 2 * moe), got = moe_gpt_activation_bytes(m);
    TU_CHECK(got >= want && got <= want + 64 * 128, "activation bytes %zu, formula %zu", got, want);
  }

  moe_gpt_init_params(m, 42);
  const float std = c.init_std, std_res = c.init_std / sqrtf(2.0f * (float)c.n_layer);
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    const char *leaf = strrchr(p.name, '.') ? strrchr(p.name, '.') + 1 : p.name;
    double mean;
    const double sd = stddev(p.data, p.numel, &mean);
    if (p.kind == MOE_GPT_PARAM_DENSE && p.ndim >= 2) {
      const double want = (strcmp(leaf, "w_proj") == 0 || strcmp(leaf, "w_fc2") == 0)
                              ? (double)std_res
                              : (double)std;
      TU_CHECK(fabs(sd - want) <= 0.03 * want && fabs(mean) <= 0.03 * want,
               "%s: std %.5f mean %.5f, expected N(0, %.5f)", p.name, sd, mean, want);
    } else if (p.kind == MOE_GPT_PARAM_DENSE) {
      const float want = strcmp(leaf, "g") == 0 ? 1.0f : 0.0f;
      int ok = 1;
      for (size_t j = 0; j < p.numel; j++) ok &= p.data[j] == want;
      TU_CHECK(ok, "%s: expected all %g", p.name, (double)want);
    } else {
      // the MoE layer's own init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
      const double bound =
          1.0 / sqrt((strcmp(leaf, "w2") == 0 || strcmp(leaf, "b2") == 0) ? (double)H : (double)M);
      float amax = 0.0f;
      for (size_t j = 0; j < p.numel; j++) amax = fmaxf(amax, fabsf(p.data[j]));
      TU_CHECK(amax <= bound && fabs(sd - bound / sqrt(3.0)) <= 0.05 * bound,
               "%s: max %.4f std %.4f, expected U(+-%.4f)", p.name, (double)amax, sd, bound);
    }
  }
  // deterministic, seed-dependent, layout-independent (the same tensors in a model
  // with other blocks get the same values)
  const moe_gpt_param wte = moe_gpt_get_param(m, 0);
  float first[4];
  memcpy(first, wte.data, sizeof first);
  moe_gpt_init_params(m, 42);
  TU_CHECK(memcmp(first, wte.data, sizeof first) == 0, "init not deterministic");
  moe_gpt_init_params(m, 43);
  TU_CHECK(memcmp(first, wte.data, sizeof first) != 0, "init ignores the seed");
  moe_gpt_config c2 = c;
  c2.moe_every = 1;
  moe_gpt *m2 = make_model(&c2, 1, NULL, NULL);
  if (m2) {
    moe_gpt_init_params(m2, 42);
    const moe_gpt_param a = moe_gpt_get_param(m2, 4);  // h0.attn.w_qkv
    moe_gpt_init_params(m, 42);
    const moe_gpt_param b = moe_gpt_get_param(m, 4);
    TU_CHECK(strcmp(a.name, b.name) == 0 && memcmp(a.data, b.data, a.numel * sizeof(float)) == 0,
             "h0.attn.w_qkv depends on the other blocks");
  }
  moe_gpt_destroy(m2);
  moe_gpt_destroy(m);
}

// ---- forward arguments and slicing -------------------------------------------------------------

static void expect_forward_invalid(moe_gpt *m, const int32_t *tok, const int32_t *tgt, int b, int s,
                                   const char *word) {
  moe_gpt_loss l;
  const moe_status st = moe_gpt_forward(m, tok, tgt, b, s, 0.0, &l);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "forward(b=%d, s=%d) expected INVALID_ARG, got %s", b, s,
           moe_status_str(st));
  TU_CHECK(strstr(moe_ctx_error(g_ctx), word) != NULL, "error '%s' does not name '%s'",
           moe_ctx_error(g_ctx), word);
}

static void test_forward_args_and_slicing(void) {
  moe_gpt_config c = tiny_config(1);
  c.seq_len = 7;
  const int B = 4, S = 7, V = c.vocab_size, N = B * S;
  moe_gpt *m = make_model(&c, B, NULL, NULL);
  if (!m) return;
  init_random(m, 11);
  int32_t tok[28], tgt[28];
  fill_tokens(tok, tgt, N, V, 3);

  // bad arguments
  expect_forward_invalid(m, tok, tgt, 0, S, "B");
  expect_forward_invalid(m, tok, tgt, B + 1, S, "B");
  expect_forward_invalid(m, tok, tgt, B, 0, "S");
  expect_forward_invalid(m, tok, tgt, B, S + 1, "S");
  expect_forward_invalid(m, NULL, tgt, B, S, "tokens");
  int32_t bad[28];
  memcpy(bad, tok, sizeof bad);
  bad[9] = V;
  expect_forward_invalid(m, bad, tgt, B, S, "tokens[1][2]");
  bad[9] = -1;
  expect_forward_invalid(m, bad, tgt, B, S, "tokens[1][2]");
  memcpy(bad, tgt, sizeof bad);
  bad[27] = V;
  expect_forward_invalid(m, tok, bad, B, S, "targets[3][6]");
  bad[27] = -2;
  expect_forward_invalid(m, tok, bad, B, S, "targets[3][6]");
  TU_CHECK(moe_gpt_backward(m) == MOE_STATUS_INVALID_ARG, "backward after a failed forward");

  // forward without targets: same logits, backward refused
  moe_gpt_loss full;
  TU_CHECK(moe_gpt_forward(m, tok, tgt, B, S, 0.0, &full) == MOE_STATUS_OK, "forward: %s",
           moe_ctx_error(g_ctx));
  float *logits = malloc((size_t)N * V * sizeof(float));
  memcpy(logits, moe_gpt_logits(m), (size_t)N * V * sizeof(float));
  moe_gpt_loss nt;
  TU_CHECK(moe_gpt_forward(m, tok, NULL, B, S, 0.0, &nt) == MOE_STATUS_OK,
           "forward without targets: %s", moe_ctx_error(g_ctx));
  TU_CHECK(memcmp(logits, moe_gpt_logits(m), (size_t)N * V * sizeof(float)) == 0,
           "logits differ without targets");
  TU_CHECK(nt.tokens == 0 && nt.loss == 0.0 && nt.aux == full.aux, "loss without targets");
  TU_CHECK(moe_gpt_backward(m) == MOE_STATUS_INVALID_ARG, "backward without targets refused");

  // the loss: CE recomputed in double from the logits; denominators
  double ce = 0.0;
  for (int i = 0; i < N; i++) {
    const float *row = logits + (size_t)i * V;
    double mx = row[0], se = 0.0;
    for (int v = 1; v < V; v++) mx = fmax(mx, row[v]);
    for (int v = 0; v < V; v++) se += exp(row[v] - mx);
    ce += mx + log(se) - row[tgt[i]];
  }
  TU_CHECK(full.tokens == N && fabs(full.ce_sum - ce) <= 1e-5 * ce &&
               fabs(full.loss - ce / N) <= 1e-5 * ce / N,
           "loss %.8g (ce_sum %.8g), expected %.8g", full.loss, full.ce_sum, ce / N);
  tgt[0] = -1;
  tgt[5] = -1;
  moe_gpt_loss ig;
  moe_gpt_forward(m, tok, tgt, B, S, 0.0, &ig);
  TU_CHECK(ig.tokens == N - 2 && fabs(ig.loss - ig.ce_sum / (N - 2)) <= 1e-12 * ig.ce_sum,
           "ignored targets: tokens %d", ig.tokens);
  moe_gpt_forward(m, tok, tgt, B, S, 100.0, &ig);
  TU_CHECK(fabs(ig.loss - ig.ce_sum / 100.0) <= 1e-12 * ig.ce_sum, "loss_denominator");

  // B and S below the maxima: the same logits as the corresponding slice
  // (causal attention, dropless routing: a token's output depends only on its prefix)
  const int b2 = 2, s2 = 4;
  int32_t tok2[8];
  for (int bb = 0; bb < b2; bb++) {
    for (int t = 0; t < s2; t++) tok2[bb * s2 + t] = tok[bb * S + t];
  }
  moe_gpt_forward(m, tok, NULL, B, S, 0.0, &nt);
  memcpy(logits, moe_gpt_logits(m), (size_t)N * V * sizeof(float));
  TU_CHECK(moe_gpt_forward(m, tok2, NULL, b2, s2, 0.0, &nt) == MOE_STATUS_OK, "small forward: %s",
           moe_ctx_error(g_ctx));
  float *slice = malloc((size_t)b2 * s2 * V * sizeof(float));
  for (int bb = 0; bb < b2; bb++) {
    for (int t = 0; t < s2; t++) {
      memcpy(slice + ((size_t)bb * s2 + t) * V, logits + ((size_t)bb * S + t) * V,
             (size_t)V * sizeof(float));
    }
  }
  tu_rel_close("logits of (B 2, S 4) vs slice of (4, 7)", moe_gpt_logits(m), slice,
               (size_t)b2 * s2 * V, 1e-5);
  free(slice);
  free(logits);
  moe_gpt_destroy(m);

  // gradients scale with 1 / denominator: twice the target count halves every
  // gradient exactly (a power of two; dense-only, so no aux term)
  {
    moe_gpt_config dc = tiny_config(0);
    moe_gpt *dm = make_model(&dc, 2, NULL, NULL);
    if (dm) {
      init_random(dm, 12);
      int32_t t2[10], g2[10];
      fill_tokens(t2, g2, 10, dc.vocab_size, 5);
      const moe_gpt_param w = moe_gpt_get_param(dm, 4);  // h0.attn.w_qkv
      float *ga = malloc(w.numel * sizeof(float));
      moe_gpt_zero_grad(dm);
      moe_gpt_forward(dm, t2, g2, 2, 5, 0.0, &nt);
      moe_gpt_backward(dm);
      for (size_t j = 0; j < w.numel; j++) ga[j] = 0.5f * w.grad[j];
      moe_gpt_zero_grad(dm);
      moe_gpt_forward(dm, t2, g2, 2, 5, 20.0, &nt);
      moe_gpt_backward(dm);
      TU_CHECK(memcmp(ga, w.grad, w.numel * sizeof(float)) == 0,
               "loss_denominator 2n does not halve the gradients");
      free(ga);
    }
    moe_gpt_destroy(dm);
  }

  // create errors
  moe_gpt *bad_m = NULL;
  TU_CHECK(moe_gpt_create(g_ctx, &c, 0, NULL, NULL, &bad_m) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "max_batch") && !bad_m,
           "max_batch 0 accepted");
  c.n_head = 3;
  TU_CHECK(moe_gpt_create(g_ctx, &c, 1, NULL, NULL, &bad_m) == MOE_STATUS_INVALID_ARG && !bad_m,
           "bad config accepted by create");
  moe_gpt_destroy(NULL);
}

// ---- optimizer --------------------------------------------------------------------------------

static void test_lr_schedule(void) {
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  TU_CHECK(oc.lr == 3e-3f && oc.min_lr == 3e-4f && oc.warmup_steps == 100 &&
               oc.total_steps == 1000 && oc.beta1 == 0.9f && oc.beta2 == 0.95f && oc.eps == 1e-8f &&
               oc.weight_decay == 0.1f && oc.grad_clip == 1.0f,
           "optimizer defaults");
  TU_CHECK(moe_optim_config_validate(g_ctx, &oc) == MOE_STATUS_OK, "defaults valid");
  oc.lr = 1e-3f;
  oc.min_lr = 1e-4f;
  oc.warmup_steps = 10;
  oc.total_steps = 110;
  const struct {
    int step;
    double lr;
  } want[] = {{1, 1e-4},
              {5, 5e-4},
              {10, 1e-3},
              {60, 1e-4 + 0.5 * 9e-4},
              {35, 1e-4 + 0.5 * 9e-4 * (1 + cos(K_PI * 0.25))},
              {110, 1e-4},
              {500, 1e-4}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const double got = moe_optim_lr(&oc, want[i].step);
    TU_CHECK(fabs(got - want[i].lr) <= 1e-6 * want[i].lr, "lr(%d) = %.9g, expected %.9g",
             want[i].step, got, want[i].lr);
  }
  oc.warmup_steps = 0;
  TU_CHECK(fabs(moe_optim_lr(&oc, 1) - (1e-4 + 0.5 * 9e-4 * (1 + cos(K_PI / 110)))) < 1e-9,
           "no warm-up");
  oc.grad_clip = 2.0f;
  TU_CHECK(moe_optim_clip_scale(&oc, 4.0) == 0.5f && moe_optim_clip_scale(&oc, 1.0) == 1.0f,
           "clip scale");
  oc.grad_clip = 0.0f;
  TU_CHECK(moe_optim_clip_scale(&oc, 100.0) == 1.0f, "no clipping");
  moe_optim_config b = oc;
  b.beta2 = 1.0f;
  TU_CHECK(moe_optim_config_validate(g_ctx, &b) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "beta2"),
           "beta2 1 accepted");
  b = oc;
  b.min_lr = 1.0f;
  TU_CHECK(moe_optim_config_validate(g_ctx, &b) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "min_lr"),
           "min_lr > lr accepted");
  b = oc;
  b.eps = 0.0f;
  TU_CHECK(moe_optim_config_validate(g_ctx, &b) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "eps"),
           "eps 0 accepted");
  b = oc;
  b.total_steps = 0;
  TU_CHECK(moe_optim_config_validate(g_ctx, &b) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "total_steps"),
           "total 0 accepted");
}

static void test_optimizer(void) {
  moe_gpt_config c = tiny_config(2);
  moe_gpt *m = make_model(&c, 2, NULL, NULL);
  if (!m) return;
  init_random(m, 3);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  oc.warmup_steps = 0;
  oc.total_steps = 10;
  oc.lr = 0.01f;
  oc.min_lr = 0.01f;
  oc.weight_decay = 0.5f;
  moe_optim *opt = NULL;
  TU_CHECK(moe_optim_create(g_ctx, m, &oc, &opt) == MOE_STATUS_OK, "optim create: %s",
           moe_ctx_error(g_ctx));
  if (!opt) {
    moe_gpt_destroy(m);
    return;
  }
  // zero gradients: only the decayed tensors move, by the factor (1 - lr * wd)
  const int np = moe_gpt_num_params(m);
  float **before = calloc((size_t)np, sizeof *before);
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    before[i] = malloc(p.numel * sizeof(float));
    memcpy(before[i], p.data, p.numel * sizeof(float));
  }
  moe_gpt_zero_grad(m);
  double sq[3];
  moe_optim_grad_sq(m, sq);
  TU_CHECK(sq[0] == 0.0 && sq[1] == 0.0 && sq[2] == 0.0, "zero_grad leaves gradients");
  const float lr = moe_optim_step(opt, m, 1.0f);
  TU_CHECK(lr == 0.01f && moe_optim_step_count(opt) == 1, "step lr %g count %d", (double)lr,
           moe_optim_step_count(opt));
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    const float f = p.decay ? 1.0f - 0.01f * 0.5f : 1.0f;
    int ok = 1;
    for (size_t j = 0; j < p.numel; j++) ok &= fabsf(p.data[j] - before[i][j] * f) <= 1e-7f;
    TU_CHECK(ok, "%s: zero-gradient step with decay %d", p.name, p.decay);
  }
  // a real step: gradients scaled in place by clip_scale, then AdamW (vs the reference kernel)
  int32_t tok[10], tgt[10];
  fill_tokens(tok, tgt, 10, c.vocab_size, 4);
  moe_gpt_loss l;
  moe_gpt_zero_grad(m);
  moe_gpt_forward(m, tok, tgt, 2, 5, 0.0, &l);
  moe_gpt_backward(m);
  moe_optim_grad_sq(m, sq);
  TU_CHECK(sq[0] > 0.0 && sq[1] > 0.0 && sq[2] > 0.0, "grad_sq by kind %g %g %g", sq[0], sq[1],
           sq[2]);
  double manual = 0.0;
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    for (size_t j = 0; j < p.numel; j++) manual += (double)p.grad[j] * p.grad[j];
  }
  TU_CHECK(fabs(sq[0] + sq[1] + sq[2] - manual) <= 1e-9 * manual, "grad_sq total");
  const float scale = moe_optim_clip_scale(&oc, sqrt(manual) * 4.0);  // forces clipping
  TU_CHECK(scale < 1.0f, "clip scale %g", (double)scale);
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    free(before[i]);
    before[i] = malloc(3 * p.numel * sizeof(float));
    memcpy(before[i], p.data, p.numel * sizeof(float));
    memcpy(before[i] + p.numel, moe_optim_m(opt, i), p.numel * sizeof(float));
    memcpy(before[i] + 2 * p.numel, moe_optim_v(opt, i), p.numel * sizeof(float));
  }
  float **grads = calloc((size_t)np, sizeof *grads);
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    grads[i] = malloc(p.numel * sizeof(float));
    for (size_t j = 0; j < p.numel; j++) grads[i][j] = p.grad[j] * scale;
  }
  moe_optim_step(opt, m, scale);
  for (int i = 0; i < np; i++) {
    const moe_gpt_param p = moe_gpt_get_param(m, i);
    const moe_adamw_config ac = {0.01f, oc.beta1, oc.beta2, oc.eps, p.decay ? 0.5f : 0.0f};
    moe_adamw_update_ref(before[i], before[i] + p.numel, before[i] + 2 * p.numel, grads[i], p.numel,
                         &ac, 2);
    char label[96];
    snprintf(label, sizeof label, "AdamW step 2 on %s", p.name);
    tu_allclose(label, p.data, before[i], p.numel, 1e-7, 1e-6);
    snprintf(label, sizeof label, "gradient of %s scaled in place", p.name);
    tu_allclose(label, p.grad, grads[i], p.numel, 0.0, 0.0);
    free(before[i]);
    free(grads[i]);
  }
  free(before);
  free(grads);
  moe_optim_set_step_count(opt, 7);
  TU_CHECK(moe_optim_step_count(opt) == 7, "set_step_count");
  moe_optim_destroy(opt);
  moe_optim_destroy(NULL);
  moe_gpt_destroy(m);
}

// ---- allocation-free steady state, determinism ------------------------------------------------

static void test_no_alloc_and_determinism(void) {
  moe_gpt_config c;
  moe_gpt_config_default(&c);
  c.seq_len = 32;
  c.d_model = 64;
  c.moe_every = 2;
  const int B = 3, N = B * c.seq_len;
  moe_gpt *m = make_model(&c, B, NULL, NULL);
  if (!m) return;
  moe_gpt_init_params(m, 1);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  moe_optim *opt = NULL;
  moe_optim_create(g_ctx, m, &oc, &opt);
  int32_t *tok = malloc((size_t)N * sizeof *tok), *tgt = malloc((size_t)N * sizeof *tgt);
  fill_tokens(tok, tgt, N, c.vocab_size, 8);
  moe_gpt_loss l1, l2;
  moe_gpt_zero_grad(m);
  moe_gpt_forward(m, tok, tgt, B, c.seq_len, 0.0, &l1);
  moe_gpt_backward(m);
  TU_CHECK(fabs(l1.loss - log(256.0)) < 0.1, "initial loss %.4f, expected ~ln 256", l1.loss);
  const moe_gpt_param wte = moe_gpt_get_param(m, 0);
  float *g1 = malloc(wte.numel * sizeof(float));
  memcpy(g1, wte.grad, wte.numel * sizeof(float));
  const uint64_t a0 = moe_alloc_count();
  moe_gpt_zero_grad(m);
  moe_gpt_forward(m, tok, tgt, B, c.seq_len, 0.0, &l2);
  moe_gpt_backward(m);
  TU_CHECK(moe_alloc_count() == a0, "second forward+backward allocated %llu times",
           (unsigned long long)(moe_alloc_count() - a0));
  TU_CHECK(l1.loss == l2.loss && memcmp(g1, wte.grad, wte.numel * sizeof(float)) == 0,
           "forward+backward not bitwise deterministic");
  double sq[3];
  moe_optim_grad_sq(m, sq);
  moe_optim_step(opt, m, moe_optim_clip_scale(&oc, sqrt(sq[0] + sq[1] + sq[2])));
  TU_CHECK(moe_alloc_count() == a0, "optimizer step allocated");
  free(g1);
  free(tok);
  free(tgt);
  moe_optim_destroy(opt);
  moe_gpt_destroy(m);
}

int main(void) {
  moe_ctx_create(&g_ctx);
  test_config();
  test_params_and_init();
  test_forward_args_and_slicing();
  test_finite_differences();
  test_lr_schedule();
  test_optimizer();
  test_no_alloc_and_determinism();
  moe_ctx_destroy(g_ctx);
  return tu_finish("test_gpt");
}
