// The gate conventions (moe_layer_config.gate_convention) against their
// documented formulas, computed here in double from the layer's own
// parameters and routing:
//   libmoe / Megatron-Core: aux = E sum_e (choices of e / (T K)) * mean_t p_te;
//     renormalised weights p_k / sum_k p_k over the top K, before dropping;
//   DeepSpeed / GShard: aux = E sum_e (tokens whose first choice is e / T) *
//     mean_t p_te; renormalised weights p_k / sum over the kept choices, 0 for
//     a dropped one.
// Each with and without `renormalize` (without: p_k, also for DeepSpeed). The
// routing is recomputed here too (top K of the double probabilities, GShard's
// slot order for the capacity: all first choices before any second, token
// order within a choice), and y against the double-precision combine
// sum over kept choices of weight * (W2 gelu(W1 x + b1) + b2) of the expert.
// Then the backward of each against central finite differences of
// L = sum(y . dy) + aux_coef * aux in the gate weights (routing held fixed by a
// small step), and the JSON key round trip.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/moe.h"
#include "testutil.h"

enum { T = 48, M = 12, H = 10, E = 4, K = 2 };

static moe_ctx *g_ctx;

typedef struct {
  moe_layer *layer;
  const float *x, *dy;
  float *y;
  float aux_coef;
} fd_state;

// L = sum(y . dy) + aux_coef * aux, with the layer's current parameters.
static double loss_of(void *user) {
  fd_state *s = user;
  moe_layer_stats st;
  moe_layer_forward(s->layer, s->x, T, s->y, &st);
  double l = 0.0;
  for (size_t i = 0; i < (size_t)T * M; i++) l += (double)s->y[i] * s->dy[i];
  return l + (double)s->aux_coef * st.aux_loss;
}

// probs (T, E) in double from x and wg.
static void reference_probs(const float *x, const float *wg, double *probs) {
  for (int t = 0; t < T; t++) {
    double lg[E], mx = -INFINITY, sum = 0.0;
    for (int e = 0; e < E; e++) {
      lg[e] = 0.0;
      for (int m = 0; m < M; m++) lg[e] += (double)x[t * M + m] * wg[m * E + e];
      mx = fmax(mx, lg[e]);
    }
    for (int e = 0; e < E; e++) sum += exp(lg[e] - mx);
    for (int e = 0; e < E; e++) probs[t * E + e] = exp(lg[e] - mx) / sum;
  }
}

// The expert FFN of e on row xt in double (the exact erf GELU).
static void reference_ffn(const moe_layer_tensors *tn, int e, const float *xt, double *out) {
  double h[H];
  for (int j = 0; j < H; j++) {
    double a = tn->b1[e * H + j];
    for (int m = 0; m < M; m++) a += (double)xt[m] * tn->w1[((size_t)e * M + m) * H + j];
    h[j] = 0.5 * a * (1.0 + erf(a / sqrt(2.0)));
  }
  for (int m = 0; m < M; m++) {
    double a = tn->b2[e * M + m];
    for (int j = 0; j < H; j++) a += h[j] * tn->w2[((size_t)e * H + j) * M + m];
    out[m] = a;
  }
}

static void check_convention(moe_gate_convention gc, int renorm) {
  char name[48];
  snprintf(name, sizeof name, "%s renormalize=%d", moe_gate_convention_name(gc), renorm);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = T;
  cfg.model_dim = M;
  cfg.hidden_dim = H;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.capacity_factor = 0.6;  // C = ceil(0.6 * 2 * 48 / 4) = 15: some choices dropped
  cfg.renormalize = renorm;
  cfg.aux_loss_coef = 0.3f;
  cfg.gate_convention = (int)gc;
  snprintf(cfg.expert, sizeof cfg.expert, "ffn-ref");
  moe_layer *layer = NULL;
  TU_CHECK(moe_layer_create(g_ctx, &cfg, &layer) == MOE_STATUS_OK, "%s: create: %s", name,
           moe_ctx_error(g_ctx));
  if (!layer) return;
  moe_layer_init_params(layer, 9);
  moe_layer_tensors tn = moe_layer_get_tensors(layer);
  for (int i = 0; i < M * E; i++) tn.wg[i] *= 6.0f;  // a peaked gate: uneven loads
  float *x = tu_filled((size_t)T * M, 31, -1.0f, 1.0f);
  float *dy = tu_filled((size_t)T * M, 32, -1.0f, 1.0f);
  float *y = tu_filled((size_t)T * M, 33, 0.0f, 0.0f);
  float *dx = tu_filled((size_t)T * M, 34, 0.0f, 0.0f);
  moe_layer_stats st;
  TU_CHECK(moe_layer_forward(layer, x, T, y, &st) == MOE_STATUS_OK, "%s: forward", name);
  TU_CHECK(st.dropped > 0, "%s: the case needs dropped choices (got %d)", name, st.dropped);
  const moe_route *r = moe_layer_get_route(layer);
  double probs[T * E], pe[E] = {0}, fe[E] = {0};
  reference_probs(x, tn.wg, probs);
  // the routing: top K in descending order (ties to the lower index), then
  // the capacity in GShard's order
  int ref_expert[T * K], ref_kept[T * K], count[E] = {0};
  const int cap = (int)ceil(0.6 * K * T / E);
  int route_ok = 1, bad_t = -1;
  for (int t = 0; t < T; t++) {
    int used[E] = {0};
    for (int k = 0; k < K; k++) {
      int best = -1;
      for (int e = 0; e < E; e++)
        if (!used[e] && (best < 0 || probs[t * E + e] > probs[t * E + best])) best = e;
      used[best] = 1;
      ref_expert[t * K + k] = best;
      if (r->expert[t * K + k] != best) route_ok = 0, bad_t = t;
    }
  }
  for (int k = 0; k < K; k++) {
    for (int t = 0; t < T; t++) {
      const int e = ref_expert[t * K + k];
      ref_kept[t * K + k] = count[e] < cap;
      if (count[e] < cap) count[e]++;
      if (ref_kept[t * K + k] != (r->slot[t * K + k] >= 0)) route_ok = 0, bad_t = t;
    }
  }
  TU_CHECK(route_ok, "%s: token %d's choices or kept set differ from the reference", name, bad_t);
  for (int t = 0; t < T; t++)
    for (int e = 0; e < E; e++) pe[e] += probs[t * E + e] / T;
  for (int t = 0; t < T; t++) {
    for (int k = 0; k < (gc == MOE_GATE_DEEPSPEED ? 1 : K); k++) fe[r->expert[t * K + k]] += 1.0;
  }
  double aux = 0.0;
  for (int e = 0; e < E; e++) aux += fe[e] / (gc == MOE_GATE_DEEPSPEED ? T : T * K) * pe[e];
  aux *= E;
  TU_CHECK(fabs(st.aux_loss - aux) <= 1e-5 * fabs(aux), "%s: aux %.7f, formula %.7f", name,
           (double)st.aux_loss, aux);
  int weights_ok = 1, worst_t = -1;
  double yref[T * M], ymax = 0.0, ydiff = 0.0;
  for (int t = 0; t < T; t++) {
    double sum = 0.0, w[K];
    for (int k = 0; k < K; k++) {
      const int kept = ref_kept[t * K + k];
      if (gc == MOE_GATE_LIBMOE || kept) sum += probs[t * E + ref_expert[t * K + k]];
    }
    for (int k = 0; k < K; k++) {
      const int kept = ref_kept[t * K + k];
      const double p = probs[t * E + ref_expert[t * K + k]];
      w[k] = renorm ? p / sum : p;
      if (renorm && gc == MOE_GATE_DEEPSPEED && !kept) w[k] = 0.0;
      if (!(fabs(r->weight[t * K + k] - w[k]) <= 1e-5)) weights_ok = 0, worst_t = t;
    }
    // y: the kept choices' experts, weighed
    for (int m = 0; m < M; m++) yref[t * M + m] = 0.0;
    for (int k = 0; k < K; k++) {
      if (!ref_kept[t * K + k]) continue;
      double out[M];
      reference_ffn(&tn, ref_expert[t * K + k], x + (size_t)t * M, out);
      for (int m = 0; m < M; m++) yref[t * M + m] += w[k] * out[m];
    }
    for (int m = 0; m < M; m++) {
      ymax = fmax(ymax, fabs(yref[t * M + m]));
      ydiff = fmax(ydiff, fabs(y[t * M + m] - yref[t * M + m]));
    }
  }
  TU_CHECK(weights_ok, "%s: the gate weights of token %d differ from the formula", name, worst_t);
  TU_CHECK(ymax > 0.1 && ydiff <= 1e-5 * ymax + 1e-6,
           "%s: y differs from the reference by %.3g (max |y| %.3g)", name, ydiff, ymax);
  // backward against finite differences (dwg), routing fixed by a small step
  moe_layer_zero_grad(layer);
  TU_CHECK(moe_layer_forward(layer, x, T, y, &st) == MOE_STATUS_OK, "%s: forward", name);
  TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_OK, "%s: backward", name);
  float *dwg = tu_copy_of(tn.dwg, (size_t)M * E);
  fd_state s = {layer, x, dy, y, cfg.aux_loss_coef};
  char label[64];
  snprintf(label, sizeof label, "%s dwg", name);
  tu_fd_check(label, loss_of, &s, tn.wg, dwg, (size_t)M * E, 1e-3f, 2e-3, 2e-2);
  moe_layer_destroy(layer);
}

int main(void) {
  moe_log_set_level(MOE_LOG_ERROR);
  moe_ctx_create(&g_ctx);
  for (int renorm = 0; renorm < 2; renorm++) {
    check_convention(MOE_GATE_LIBMOE, renorm);
    check_convention(MOE_GATE_DEEPSPEED, renorm);
  }
  // JSON: the key in and out; the default is not written (configs stay as before)
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  char buf[1024];
  TU_CHECK(moe_layer_config_to_json(g_ctx, &cfg, buf, sizeof buf) == MOE_STATUS_OK &&
               !strstr(buf, "gate_convention"),
           "the default convention is not written: %s", buf);
  TU_CHECK(moe_layer_config_from_json(g_ctx, "{\"gate_convention\": \"deepspeed\"}", &cfg) ==
                   MOE_STATUS_OK &&
               cfg.gate_convention == MOE_GATE_DEEPSPEED,
           "deepspeed parsed: %s", moe_ctx_error(g_ctx));
  moe_layer_config back;
  moe_layer_config_default(&back);
  TU_CHECK(moe_layer_config_to_json(g_ctx, &cfg, buf, sizeof buf) == MOE_STATUS_OK &&
               moe_layer_config_from_json(g_ctx, buf, &back) == MOE_STATUS_OK &&
               back.gate_convention == MOE_GATE_DEEPSPEED,
           "round trip: %s", buf);
  TU_CHECK(moe_layer_config_from_json(g_ctx, "{\"gate_convention\": \"megatron\"}", &cfg) ==
                   MOE_STATUS_OK &&
               cfg.gate_convention == MOE_GATE_LIBMOE,
           "megatron is libmoe's convention");
  TU_CHECK(moe_layer_config_from_json(g_ctx, "{\"gate_convention\": \"tutel\"}", &cfg) ==
                   MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(g_ctx), "deepspeed"),
           "unknown convention: %s", moe_ctx_error(g_ctx));
  cfg.gate_convention = 7;
  TU_CHECK(moe_layer_config_validate(g_ctx, &cfg) == MOE_STATUS_INVALID_ARG, "validate range");
  moe_ctx_destroy(g_ctx);
  tu_free_all();
  return tu_finish("test_gate_conventions");
}
