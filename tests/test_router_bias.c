// The router bias (issue "Load balancing", item 1): experts chosen by
// logits + bias and weighed by the unbiased probabilities, checked against a
// naive double-precision gate; the layer's gradients with a bias by finite
// differences; the named distributions' shares by hand; the bias fit against
// the layer's own routing; DeepSeek-V3's update on a hand example.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/moe.h"
#include "testutil.h"

static moe_ctx *ctx;

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
  moe_layer_config cfg = tu_layer_config(T, M, H, E, K);
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

// The layer's gradients with a bias by finite differences of tu_layer_fd_loss.
static void test_gradients_with_bias(void) {
  const int T = 12, M = 6, H = 5, E = 4, K = 2;
  moe_layer_config cfg = tu_layer_config(T, M, H, E, K);
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
  tu_layer_fd f = {L, x, dy, T, M, y};
  tu_fd_check("dwg with bias", tu_layer_fd_loss, &f, t.wg, dwg, (size_t)M * E, 1e-2f, 2e-3, 2e-2);
  tu_fd_check("dw1 with bias", tu_layer_fd_loss, &f, t.w1, dw1, (size_t)M * H, 1e-2f, 2e-3, 2e-2);
  tu_fd_check("dx with bias", tu_layer_fd_loss, &f, x, dx, (size_t)T * M, 1e-2f, 2e-3, 2e-2);
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
  // a subnormal hot share: the cap spreads the excess exactly (finding 10:
  // excess x share before the division lost 1e-8 of the sum)
  {
    moe_skew h;
    double q[12], sum = 0;
    TU_CHECK(moe_skew_parse(ctx, "hot:1e-315", &h) == MOE_STATUS_OK &&
                 moe_skew_shares(ctx, &h, 12, 12, q) == MOE_STATUS_OK,
             "hot:1e-315 with E = K = 12");
    for (int e = 0; e < 12; e++) sum += q[e];
    TU_CHECK(fabs(sum - 1.0) < 1e-12 && fabs(q[0] - 1.0 / 12) < 1e-15, "sum %.17g, share 0 %.17g",
             sum, q[0]);
  }
  // a spec prints back to the same value (not %g's 6 digits)
  moe_skew r;
  TU_CHECK(moe_skew_parse(ctx, "hot:0.123456789012345678", &s) == MOE_STATUS_OK, "hot parses");
  moe_skew_to_string(&s, buf, sizeof buf);
  TU_CHECK(moe_skew_parse(ctx, buf, &r) == MOE_STATUS_OK && r.param == s.param,
           "hot:0.123456789012345678 prints as %s, which reads back", buf);
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
  moe_layer_config cfg = tu_layer_config(T, M, H, E, K);
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

// ---- skew from a routing trace ----------------------------------------------------------------

static void write_str(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static const char *const TRACE_HEADER =
    "{\"format\": \"libmoe-routing-trace\", \"version\": 1, \"ranks\": 2, \"experts\": 4, "
    "\"top_k\": 2, \"tokens_per_rank\": 10, \"moe_layers\": [0, 2]}\n";

// shares of trace `body` (after the header) under spec suffix sel; the status.
static moe_status trace_shares(const char *body, const char *sel, int E, int K, double *sh,
                               int *lines) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/moe_test_trace_%d.jsonl", (int)getpid());
  char text[2048];
  snprintf(text, sizeof text, "%s%s", TRACE_HEADER, body);
  write_str(path, text);
  char spec[160];
  snprintf(spec, sizeof spec, "trace:%s%s", path, sel);
  moe_skew sk;
  moe_status st = moe_skew_parse(ctx, spec, &sk);
  if (st == MOE_STATUS_OK) st = moe_routing_trace_shares(ctx, &sk, E, K, sh, lines);
  remove(path);
  return st;
}

static void test_trace(void) {
  const char *body =
      "{\"step\": 1, \"layer\": 0, \"counts\": [[10, 0, 5, 5], [6, 4, 5, 5]]}\n"
      "{\"step\": 1, \"layer\": 2, \"counts\": [[2, 2, 8, 8], [4, 4, 6, 6]]}\n"
      "\n"
      "{\"step\": 2, \"layer\": 0, \"counts\": [[8, 2, 5, 5], [8, 2, 5, 5]]}\n";
  double sh[4];
  int lines = 0;
  // every line: expert sums 38, 14, 34, 34 of 120
  TU_CHECK(trace_shares(body, "", 4, 2, sh, &lines) == MOE_STATUS_OK, "%s", moe_ctx_error(ctx));
  const double all[4] = {38 / 120.0, 14 / 120.0, 34 / 120.0, 34 / 120.0};
  for (int e = 0; e < 4; e++)
    TU_CHECK(fabs(sh[e] - all[e]) < 1e-15, "all lines: share %d %g, want %g", e, sh[e], all[e]);
  TU_CHECK(lines == 3, "all lines: %d used, want 3", lines);
  // layer 0, step 2 only: 16, 4, 10, 10 of 40
  TU_CHECK(trace_shares(body, "#0@2-2", 4, 2, sh, &lines) == MOE_STATUS_OK, "%s",
           moe_ctx_error(ctx));
  TU_CHECK(lines == 1 && fabs(sh[0] - 0.4) < 1e-15 && fabs(sh[1] - 0.1) < 1e-15,
           "layer 0 step 2: %d lines, shares %g %g", lines, sh[0], sh[1]);
  // layer 2: 6, 6, 14, 14 of 40
  TU_CHECK(trace_shares(body, "#2", 4, 2, sh, &lines) == MOE_STATUS_OK && lines == 1 &&
               fabs(sh[2] - 0.35) < 1e-15,
           "layer 2: %d lines, share 2 %g", lines, sh[2]);
  // bad input: each refused with a message naming the problem
  struct {
    const char *body, *sel, *words;
    int E, K;
    moe_status want;
  } bad[] = {
      {body, "", "recorded with 4 experts and top_k 2; this layer has 8", 8, 2,
       MOE_STATUS_INVALID_ARG},
      {body, "#1", "#1 names no MoE layer of the trace (its moe_layers: 0, 2)", 4, 2,
       MOE_STATUS_INVALID_ARG},
      {body, "@3-9", "no routed rows in the lines selected (0 lines of every MoE layer, steps 3-9)",
       4, 2, MOE_STATUS_INVALID_ARG},
      {"{\"step\": 1, \"layer\": 0, \"counts\": [[1, 2, 3], [1, 2, 3, 4]]}\n", "",
       "must hold 4 numbers", 4, 2, MOE_STATUS_BAD_FORMAT},
      {"{\"step\": 1, \"layer\": 0, \"counts\": [[1, 2, 3, 4]]}\n", "", "must be 2 rows", 4, 2,
       MOE_STATUS_BAD_FORMAT},
      {"{\"step\": 1, \"layer\": 0, \"counts\": [[1, -2, 3, 4], [0, 0, 0, 0]]}\n", "",
       "out of range [0, 10]", 4, 2, MOE_STATUS_BAD_FORMAT},
      {"{\"step\": 1, \"layer\": 0, \"counts\": [[10, 10, 10, 0], [0, 0, 0, 0]]}\n", "",
       "more than tokens_per_rank x top_k", 4, 2, MOE_STATUS_BAD_FORMAT},
      {"{\"step\": 1, \"layer\": 1, \"counts\": [[1, 1, 1, 1], [1, 1, 1, 1]]}\n", "",
       "not among the header's moe_layers", 4, 2, MOE_STATUS_BAD_FORMAT},
      {"{\"step\": 1, \"layer\": 0, \"counts\": [[1, 1, 1, 1], [1, 1, 1, 1]]\n", "", "line 2", 4, 2,
       MOE_STATUS_BAD_FORMAT},
      {"", "", "no routed rows", 4, 2, MOE_STATUS_INVALID_ARG},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const moe_status st = trace_shares(bad[i].body, bad[i].sel, bad[i].E, bad[i].K, sh, NULL);
    TU_CHECK(st == bad[i].want && strstr(moe_ctx_error(ctx), bad[i].words) != NULL,
             "bad trace %zu: status %d, message '%s' (want %d, '%s')", i, (int)st,
             moe_ctx_error(ctx), (int)bad[i].want, bad[i].words);
  }
  // not a trace; a missing file
  moe_skew sk;
  char path[64];
  snprintf(path, sizeof path, "/tmp/moe_test_trace_%d.json", (int)getpid());
  write_str(path, "{\"format\": \"libmoe-gpt\"}\n");
  char spec[128];
  snprintf(spec, sizeof spec, "trace:%s", path);
  TU_CHECK(moe_skew_parse(ctx, spec, &sk) == MOE_STATUS_OK &&
               moe_routing_trace_shares(ctx, &sk, 4, 2, sh, NULL) == MOE_STATUS_BAD_FORMAT &&
               strstr(moe_ctx_error(ctx), "not a routing trace"),
           "a non-trace: %s", moe_ctx_error(ctx));
  remove(path);
  TU_CHECK(moe_routing_trace_shares(ctx, &sk, 4, 2, sh, NULL) == MOE_STATUS_IO &&
               strstr(moe_ctx_error(ctx), "cannot open the routing trace"),
           "a missing trace: %s", moe_ctx_error(ctx));
  // specs: selectors read after the path's last '/', printed back
  TU_CHECK(moe_skew_parse(ctx, "trace:/a@b/run#x.jsonl#3@5-9", &sk) == MOE_STATUS_OK &&
               strcmp(sk.path, "/a@b/run#x.jsonl") == 0 && sk.trace_layer == 3 &&
               sk.trace_first == 5 && sk.trace_last == 9,
           "trace spec with selectors: path '%s' layer %d steps %d-%d", sk.path, sk.trace_layer,
           sk.trace_first, sk.trace_last);
  char back[600];
  moe_skew_to_string(&sk, back, sizeof back);
  TU_CHECK(strcmp(back, "trace:/a@b/run#x.jsonl#3@5-9") == 0, "printed back as '%s'", back);
  const char *bad_specs[] = {"trace:", "trace:x#300", "trace:x@5-2", "trace:x@0-1", "trace:x#"};
  for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++)
    TU_CHECK(moe_skew_parse(ctx, bad_specs[i], &sk) == MOE_STATUS_INVALID_ARG, "'%s' accepted",
             bad_specs[i]);
}

static void test_cap_zero_shares(void) {
  // moe_skew_shares caps a trace's shares; zeros take the excess evenly
  char path[64];
  snprintf(path, sizeof path, "/tmp/moe_test_trace_cap_%d.jsonl", (int)getpid());
  write_str(path,
            "{\"format\": \"libmoe-routing-trace\", \"version\": 1, \"ranks\": 1, "
            "\"experts\": 3, \"top_k\": 2, \"tokens_per_rank\": 10, \"moe_layers\": [0]}\n"
            "{\"step\": 1, \"layer\": 0, \"counts\": [[10, 0, 0]]}\n");
  char spec[128];
  snprintf(spec, sizeof spec, "trace:%s", path);
  moe_skew sk;
  double sh[3];
  TU_CHECK(moe_skew_parse(ctx, spec, &sk) == MOE_STATUS_OK &&
               moe_skew_shares(ctx, &sk, 3, 2, sh) == MOE_STATUS_OK,
           "cap: %s", moe_ctx_error(ctx));
  TU_CHECK(sh[0] == 0.5 && sh[1] == 0.25 && sh[2] == 0.25,
           "capped shares %g %g %g (want .5 .25 .25)", sh[0], sh[1], sh[2]);
  remove(path);
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
  test_trace();
  test_cap_zero_shares();
  moe_ctx_destroy(ctx);
  tu_free_all();
  return tu_finish("test_router_bias");
}
