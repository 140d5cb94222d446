// The router bias (issue "Load balancing", item 1): experts chosen by
// logits + bias and weighed by the unbiased probabilities, checked against a
// naive double-precision gate; the layer's gradients with a bias by finite
// differences; the named distributions' shares by hand; the bias fit against
// the layer's own routing; DeepSeek-V3's update on a hand example.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "testutil.h"

static moe_ctx *ctx;

static moe_layer_config small_cfg(int T, int M, int H, int E, int K) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.tokens = T;
  c.model_dim = M;
  c.hidden_dim = H;
  c.num_experts = E;
  c.top_k = K;
  c.capacity_factor = 0.0;  // dropless
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  return c;
}

// The gate by hand in double: the K largest of logits + bias (ties by lower
// index), weights = softmax(logits) at those experts.
static void naive_route(const float *x, const float *wg, const float *bias, int T, int M, int E,
                        int K, int32_t *expert, float *weight) {
  double *l = malloc((size_t)E * sizeof(double)), *s = malloc((size_t)E * sizeof(double));
  for (int t = 0; t < T; t++) {
    double mx = -INFINITY, z = 0.0;
    for (int e = 0; e < E; e++) {
      double a = 0.0;
      for (int m = 0; m < M; m++) a += (double)x[(size_t)t * M + m] * wg[(size_t)m * E + e];
      l[e] = a;
      s[e] = a + bias[e];
      if (a > mx) mx = a;
    }
    for (int e = 0; e < E; e++) z += exp(l[e] - mx);
    for (int k = 0; k < K; k++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        int used = 0;
        for (int j = 0; j < k; j++) used |= expert[(size_t)t * K + j] == e;
        if (!used && (best < 0 || s[e] > s[best])) best = e;
      }
      expert[(size_t)t * K + k] = best;
      weight[(size_t)t * K + k] = (float)(exp(l[best] - mx) / z);
    }
  }
  free(l);
  free(s);
}

static void test_gate_with_bias(void) {
  const int T = 96, M = 24, H = 16, E = 8, K = 2;
  moe_layer_config cfg = small_cfg(T, M, H, E, K);
  moe_layer *L = NULL;
  TU_CHECK(moe_layer_create(ctx, &cfg, &L) == MOE_STATUS_OK, "create: %s", moe_ctx_error(ctx));
  if (!L) return;
  moe_layer_init_params(L, 5);
  moe_layer_tensors t = moe_layer_get_tensors(L);
  for (int e = 0; e < E; e++) TU_CHECK(t.router_bias[e] == 0.0f, "bias starts at 0");
  // a bias strong enough to move choices (logits here are O(0.5)) but not one-hot
  const float bias[8] = {0.9f, -0.4f, 0.0f, 0.35f, -1.2f, 0.2f, 0.6f, -0.1f};
  memcpy(t.router_bias, bias, sizeof bias);
  float *x = tu_filled((size_t)T * M, 3, -1.0f, 1.0f), *y = tu_fbuf((size_t)T * M);
  TU_CHECK(moe_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward");
  const moe_route *r = moe_layer_get_route(L);
  int32_t *ex = tu_ibuf((size_t)T * K);
  float *w = tu_fbuf((size_t)T * K);
  naive_route(x, t.wg, bias, T, M, E, K, ex, w);
  tu_equal_i32("biased choices", r->expert, ex, (size_t)T * K);
  tu_allclose("unbiased weights of the chosen experts", r->weight, w, (size_t)T * K, 1e-6, 1e-5);
  // the bias really moved choices: without it some token chooses differently
  memset(t.router_bias, 0, sizeof bias);
  TU_CHECK(moe_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward without bias");
  int moved = 0;
  for (int i = 0; i < T * K; i++) moved += r->expert[i] != ex[i];
  TU_CHECK(moved > T / 4, "the bias moved only %d of %d choices", moved, T * K);
  moe_layer_destroy(L);
}

// Finite differences of L = sum(y * g) + aux and z terms... the layer's own
// backward includes the aux and z gradients, so the scalar is sum(y * dy) +
// aux_coef * aux + z_coef * z.
typedef struct {
  moe_layer *L;
  const float *x, *dy;
  int T, M;
  float *y;
} fd_ctx;

static double fd_loss(void *user) {
  fd_ctx *f = user;
  moe_layer_stats s;
  moe_layer_forward(f->L, f->x, f->T, f->y, &s);
  const moe_layer_config *c = moe_layer_get_config(f->L);
  double l = 0.0;
  for (size_t i = 0; i < (size_t)f->T * f->M; i++) l += (double)f->y[i] * f->dy[i];
  return l + c->aux_loss_coef * s.aux_loss + c->z_loss_coef * s.z_loss;
}

static void test_gradients_with_bias(void) {
  const int T = 12, M = 6, H = 5, E = 4, K = 2;
  moe_layer_config cfg = small_cfg(T, M, H, E, K);
  moe_layer *L = NULL;
  TU_CHECK(moe_layer_create(ctx, &cfg, &L) == MOE_STATUS_OK, "create");
  if (!L) return;
  moe_layer_init_params(L, 9);
  moe_layer_tensors t = moe_layer_get_tensors(L);
  // large gaps between the biased scores so that eps never flips a choice
  const float bias[4] = {3.0f, 1.0f, -1.0f, -3.0f};
  memcpy(t.router_bias, bias, sizeof bias);
  float *x = tu_filled((size_t)T * M, 4, -1.0f, 1.0f), *dy = tu_filled((size_t)T * M, 5, -1, 1);
  float *y = tu_fbuf((size_t)T * M), *dx = tu_fbuf((size_t)T * M);
  moe_layer_zero_grad(L);
  TU_CHECK(moe_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward");
  TU_CHECK(moe_layer_backward(L, dy, dx) == MOE_STATUS_OK, "backward");
  float *dwg = tu_copy_of(t.dwg, (size_t)M * E), *dw1 = tu_copy_of(t.dw1, (size_t)E * M * H);
  fd_ctx f = {L, x, dy, T, M, y};
  tu_fd_check("dwg with bias", fd_loss, &f, t.wg, dwg, (size_t)M * E, 1e-2f, 2e-3, 2e-2);
  tu_fd_check("dw1 with bias", fd_loss, &f, t.w1, dw1, (size_t)M * H, 1e-2f, 2e-3, 2e-2);
  tu_fd_check("dx with bias", fd_loss, &f, x, dx, (size_t)T * M, 1e-2f, 2e-3, 2e-2);
  moe_layer_destroy(L);
}

static void test_skew_shares(void) {
  moe_skew s;
  double p[4];
  TU_CHECK(moe_skew_parse(ctx, "zipf:1", &s) == MOE_STATUS_OK && s.kind == MOE_SKEW_ZIPF,
           "zipf:1 parses");
  // zipf 1 over 4 experts: 1, 1/2, 1/3, 1/4 over their sum 25/12
  moe_skew_shares(ctx, &s, 4, 1, p);
  const double z1[4] = {12.0 / 25, 6.0 / 25, 4.0 / 25, 3.0 / 25};
  for (int e = 0; e < 4; e++) TU_CHECK(fabs(p[e] - z1[e]) < 1e-12, "zipf:1 share %d %g", e, p[e]);
  // K = 2 caps at 1/2: hot:1 wants expert 0 in every token (share 1/2, the cap)
  // and the other choice spread evenly: 1/6 each
  TU_CHECK(moe_skew_parse(ctx, "hot:1", &s) == MOE_STATUS_OK, "hot:1 parses");
  moe_skew_shares(ctx, &s, 4, 2, p);
  const double h1[4] = {0.5, 1.0 / 6, 1.0 / 6, 1.0 / 6};
  for (int e = 0; e < 4; e++) TU_CHECK(fabs(p[e] - h1[e]) < 1e-12, "hot:1 share %d %g", e, p[e]);
  // zipf:3 with K = 2: raw 1, 1/8, 1/27, 1/64 (sum S); expert 0's 1/S > 1/2 is
  // capped and the excess 1/S - 1/2 goes to the rest in proportion: each of
  // them is its raw share x (1/2) / (1 - 1/S) = raw / (2 (S - 1))
  TU_CHECK(moe_skew_parse(ctx, "zipf:3", &s) == MOE_STATUS_OK, "zipf:3 parses");
  moe_skew_shares(ctx, &s, 4, 2, p);
  const double S = 1.0 + 1.0 / 8 + 1.0 / 27 + 1.0 / 64;
  const double z3[4] = {0.5, (1.0 / 8) / (2 * (S - 1)), (1.0 / 27) / (2 * (S - 1)),
                        (1.0 / 64) / (2 * (S - 1))};
  for (int e = 0; e < 4; e++) TU_CHECK(fabs(p[e] - z3[e]) < 1e-12, "zipf:3 share %d %g", e, p[e]);
  TU_CHECK(moe_skew_parse(ctx, "uniform", &s) == MOE_STATUS_OK, "uniform parses");
  moe_skew_shares(ctx, &s, 4, 2, p);
  for (int e = 0; e < 4; e++) TU_CHECK(p[e] == 0.25, "uniform share");
  char buf[32];
  s.kind = MOE_SKEW_ZIPF;
  s.param = 1.2;
  moe_skew_to_string(&s, buf, sizeof buf);
  TU_CHECK(strcmp(buf, "zipf:1.2") == 0, "to_string %s", buf);
  const char *bad[] = {"zipf", "zipf:0",    "zipf:11", "zipf:x", "hot:0",     "hot:1.5",
                       "hot",  "uniform:2", "normal",  "",       "zipf:1.2x", "none:1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    TU_CHECK(moe_skew_parse(ctx, bad[i], &s) == MOE_STATUS_INVALID_ARG, "'%s' refused", bad[i]);
    TU_CHECK(strstr(moe_ctx_error(ctx), "skew") != NULL, "message names the skew: %s",
             moe_ctx_error(ctx));
  }
}

// The fit reaches the target, and the layer with the fitted bias routes the
// same tokens in exactly the shares the fit reports.
static void test_fit(const char *spec, double max_tv) {
  const int T = 4096, M = 64, H = 8, E = 8, K = 2;
  moe_layer_config cfg = small_cfg(T, M, H, E, K);
  moe_layer *L = NULL;
  TU_CHECK(moe_layer_create(ctx, &cfg, &L) == MOE_STATUS_OK, "create");
  if (!L) return;
  moe_layer_init_params(L, 21);
  moe_layer_tensors t = moe_layer_get_tensors(L);
  float *x = tu_filled((size_t)T * M, 22, -1.0f, 1.0f), *y = tu_fbuf((size_t)T * M);
  moe_skew s;
  double target[8], got[8];
  moe_skew_parse(ctx, spec, &s);
  moe_skew_shares(ctx, &s, E, K, target);
  float bias[8], bias2[8];
  moe_router_fit fit = {got, 0, 0};
  TU_CHECK(moe_router_bias_fit(ctx, &cfg, t.wg, x, T, target, bias, &fit) == MOE_STATUS_OK,
           "%s: fit: %s", spec, moe_ctx_error(ctx));
  printf("%s: total variation %.4f after %d iterations; shares", spec, fit.total_variation,
         fit.iterations);
  for (int e = 0; e < E; e++) printf(" %.3f/%.3f", got[e], target[e]);
  printf("\n");
  TU_CHECK(fit.total_variation <= max_tv, "%s: total variation %g > %g", spec, fit.total_variation,
           max_tv);
  TU_CHECK(moe_router_bias_fit(ctx, &cfg, t.wg, x, T, target, bias2, NULL) == MOE_STATUS_OK &&
               memcmp(bias, bias2, sizeof bias) == 0,
           "%s: the fit is deterministic", spec);
  memcpy(t.router_bias, bias, sizeof bias);
  TU_CHECK(moe_layer_forward(L, x, T, y, NULL) == MOE_STATUS_OK, "forward");
  const moe_route *r = moe_layer_get_route(L);
  for (int e = 0; e < E; e++)
    TU_CHECK(fabs((double)r->count_all[e] / (T * K) - got[e]) < 1e-12,
             "%s: expert %d: layer share %g, fit %g", spec, e, (double)r->count_all[e] / (T * K),
             got[e]);
  // bad input
  double wrong[8];
  memcpy(wrong, target, sizeof wrong);
  wrong[0] = 0.9;  // above 1/K
  TU_CHECK(
      moe_router_bias_fit(ctx, &cfg, t.wg, x, T, wrong, bias2, NULL) == MOE_STATUS_INVALID_ARG &&
          strstr(moe_ctx_error(ctx), "share of expert 0"),
      "a share above 1/K is refused: %s", moe_ctx_error(ctx));
  moe_layer_destroy(L);
}

static void test_update(void) {
  // loads 10, 30, 20, 20 (mean 20): expert 0 under (+), 1 over (-), 2 and 3 at the mean (0)
  float b[4] = {0.0f, 0.0f, 0.5f, -0.5f};
  const double load[4] = {10, 30, 20, 20};
  moe_router_bias_update(b, load, 4, 0.25f);
  const float want[4] = {0.25f, -0.25f, 0.5f, -0.5f};
  for (int e = 0; e < 4; e++) TU_CHECK(b[e] == want[e], "update %d: %g, want %g", e, b[e], want[e]);
}

int main(void) {
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return 2;
  test_gate_with_bias();
  test_gradients_with_bias();
  test_skew_shares();
  test_fit("zipf:1.2", 0.02);
  test_fit("hot:0.6", 0.02);
  test_fit("uniform", 0.02);
  test_update();
  moe_ctx_destroy(ctx);
  tu_free_all();
  return tu_finish("test_router_bias");
}
