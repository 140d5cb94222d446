// Expert kinds (include/moe/expert.h): every registered kind against the
// naive "ffn-ref" kind, forward (pre, h, y) and backward (dX and the four
// parameter gradients, accumulated onto non-zero values), for both
// activations and row counts 0, 1 and odd sizes; a whole layer run with each
// kind; the registry's lookup errors; the "expert" key of the config JSON.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "testutil.h"

#define TOL 1e-5

static void compare_kind(const moe_expert_kind *kind, const moe_expert_kind *ref,
                         moe_activation act, int n, int M, int H) {
  char name[128];
  snprintf(name, sizeof name, "%s vs %s act=%s n=%d M=%d H=%d", kind->name, ref->name,
           moe_activation_name(act), n, M, H);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.model_dim = M;
  cfg.hidden_dim = H;
  cfg.act = act;
  const size_t nm = (size_t)(n ? n : 1) * M, nh = (size_t)(n ? n : 1) * H, mh = (size_t)M * H;
  float *w1 = malloc(mh * 4), *b1 = malloc((size_t)H * 4), *w2 = malloc(mh * 4),
        *b2 = malloc((size_t)M * 4), *x = malloc(nm * 4), *dy = malloc(nm * 4);
  tu_fill(w1, mh, 1, -0.5f, 0.5f);
  tu_fill(b1, (size_t)H, 2, -0.5f, 0.5f);
  tu_fill(w2, mh, 3, -0.5f, 0.5f);
  tu_fill(b2, (size_t)M, 4, -0.5f, 0.5f);
  tu_fill(x, nm, 5, -1.5f, 1.5f);
  tu_fill(dy, nm, 6, -1.0f, 1.0f);
  const moe_expert_params p = {w1, b1, w2, b2};
  float *out[2][11];  // per kind: pre h y dyx dh dpre dw1 db1 dw2 db2
  const moe_expert_kind *k2[2] = {kind, ref};
  for (int k = 0; k < 2; k++) {
    float *pre = calloc(nh, 4), *h = calloc(nh, 4), *y = calloc(nm, 4), *dyx = malloc(nm * 4);
    float *dh = calloc(nh, 4), *dpre = calloc(nh, 4);
    float *dw1 = malloc(mh * 4), *db1 = malloc((size_t)H * 4), *dw2 = malloc(mh * 4),
          *db2 = malloc((size_t)M * 4);
    // gradients start non-zero: kinds must accumulate
    tu_fill(dw1, mh, 7, -0.1f, 0.1f);
    tu_fill(db1, (size_t)H, 8, -0.1f, 0.1f);
    tu_fill(dw2, mh, 9, -0.1f, 0.1f);
    tu_fill(db2, (size_t)M, 10, -0.1f, 0.1f);
    memcpy(dyx, dy, nm * 4);
    moe_layer_timing tm;
    memset(&tm, 0, sizeof tm);
    k2[k]->forward(&cfg, &p, x, n, pre, h, y, &tm);
    const moe_expert_grads g = {dw1, db1, dw2, db2};
    k2[k]->backward(&cfg, &p, &g, x, pre, h, dyx, n, dh, dpre, &tm);
    float *list[10] = {pre, h, y, dyx, dh, dpre, dw1, db1, dw2, db2};
    for (int i = 0; i < 10; i++) out[k][i] = list[i];
  }
  const char *what[] = {"pre", "h", "y", "dx", "dw1", "db1", "dw2", "db2"};
  const int idx[] = {0, 1, 2, 3, 6, 7, 8, 9};
  const size_t len[] = {nh, nh, nm, nm, mh, (size_t)H, mh, (size_t)M};
  for (int i = 0; i < 8; i++) {
    if (n == 0 && i < 4) continue;  // no rows: only the gradients (unchanged) compare
    char label[192];
    snprintf(label, sizeof label, "%s %s", name, what[i]);
    tu_rel_close(label, out[0][idx[i]], out[1][idx[i]], len[i], TOL);
  }
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 10; i++) free(out[k][i]);
  }
  free(w1);
  free(b1);
  free(w2);
  free(b2);
  free(x);
  free(dy);
}

// A whole layer with each kind equals the layer with ffn-ref.
static void layer_with_kinds(void) {
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.tokens = 37;
  cfg.model_dim = 12;
  cfg.hidden_dim = 20;
  cfg.num_experts = 4;
  cfg.top_k = 2;
  cfg.capacity_factor = 1.0;  // some drops
  const size_t TM = (size_t)cfg.tokens * cfg.model_dim;
  float *x = malloc(TM * 4), *dy = malloc(TM * 4), *y[2], *dx[2], *dw1[2];
  tu_fill(x, TM, 21, -1, 1);
  tu_fill(dy, TM, 22, -1, 1);
  const size_t nw = (size_t)cfg.num_experts * cfg.model_dim * cfg.hidden_dim;
  for (int i = 0; i < moe_expert_kind_count(); i++) {
    const char *names[2] = {moe_expert_kind_get(i)->name, "ffn-ref"};
    for (int k = 0; k < 2; k++) {
      moe_ctx *ctx = NULL;
      moe_ctx_create(&ctx);
      snprintf(cfg.expert, sizeof cfg.expert, "%s", names[k]);
      moe_layer *L = NULL;
      y[k] = calloc(TM, 4);
      dx[k] = calloc(TM, 4);
      dw1[k] = calloc(nw, 4);
      TU_CHECK(moe_layer_create(ctx, &cfg, &L) == MOE_STATUS_OK, "create %s: %s", names[k],
               moe_ctx_error(ctx));
      if (L) {
        moe_layer_init_params(L, 3);
        moe_layer_zero_grad(L);
        TU_CHECK(moe_layer_forward(L, x, cfg.tokens, y[k], NULL) == MOE_STATUS_OK &&
                     moe_layer_backward(L, dy, dx[k]) == MOE_STATUS_OK,
                 "layer pass with %s: %s", names[k], moe_ctx_error(ctx));
        memcpy(dw1[k], moe_layer_get_tensors(L).dw1, nw * 4);
      }
      moe_layer_destroy(L);
      moe_ctx_destroy(ctx);
    }
    char label[96];
    snprintf(label, sizeof label, "layer %s y", names[0]);
    tu_rel_close(label, y[0], y[1], TM, TOL);
    snprintf(label, sizeof label, "layer %s dx", names[0]);
    tu_rel_close(label, dx[0], dx[1], TM, TOL);
    snprintf(label, sizeof label, "layer %s dw1", names[0]);
    tu_rel_close(label, dw1[0], dw1[1], nw, TOL);
    for (int k = 0; k < 2; k++) {
      free(y[k]);
      free(dx[k]);
      free(dw1[k]);
    }
  }
  free(x);
  free(dy);
}

static void registry_and_config(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  const moe_expert_kind *k = NULL;
  TU_CHECK(moe_expert_kind_count() >= 2, "at least ffn and ffn-ref are registered");
  TU_CHECK(moe_expert_kind_get(moe_expert_kind_count()) == NULL && moe_expert_kind_get(-1) == NULL,
           "out-of-range index gives NULL");
  TU_CHECK(moe_expert_kind_find(ctx, "ffn", &k) == MOE_STATUS_OK && strcmp(k->name, "ffn") == 0,
           "find ffn");
  TU_CHECK(moe_expert_kind_find(ctx, "swiglu", &k) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "ffn-ref") != NULL,
           "unknown kind names the valid ones: %s", moe_ctx_error(ctx));
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  TU_CHECK(strcmp(cfg.expert, "ffn") == 0, "default kind is ffn");
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"expert\": \"ffn-ref\"}", &cfg) == MOE_STATUS_OK &&
               strcmp(cfg.expert, "ffn-ref") == 0,
           "JSON expert key: %s", moe_ctx_error(ctx));
  char text[1024];
  TU_CHECK(moe_layer_config_to_json(ctx, &cfg, text, sizeof text) == MOE_STATUS_OK &&
               strstr(text, "\"expert\": \"ffn-ref\"") != NULL,
           "to_json writes the kind: %s", text);
  moe_layer_config back;
  moe_layer_config_default(&back);
  TU_CHECK(moe_layer_config_from_json(ctx, text, &back) == MOE_STATUS_OK &&
               strcmp(back.expert, "ffn-ref") == 0,
           "round trip");
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"expert\": 3}", &cfg) == MOE_STATUS_INVALID_ARG,
           "non-string expert rejected");
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"expert\": \"a-very-long-kind-name\"}", &cfg) ==
               MOE_STATUS_INVALID_ARG,
           "too-long expert rejected");
  snprintf(cfg.expert, sizeof cfg.expert, "nope");
  TU_CHECK(moe_layer_config_validate(ctx, &cfg) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "nope") != NULL,
           "validate rejects an unknown kind: %s", moe_ctx_error(ctx));
  memset(cfg.expert, 'x', sizeof cfg.expert);
  TU_CHECK(moe_layer_config_validate(ctx, &cfg) == MOE_STATUS_INVALID_ARG,
           "validate rejects an unterminated kind");
  moe_ctx_destroy(ctx);
}

int main(void) {
  const moe_expert_kind *ref = NULL;
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_expert_kind_find(ctx, "ffn-ref", &ref);
  moe_ctx_destroy(ctx);
  const int shapes[][3] = {{0, 8, 12}, {1, 8, 12}, {7, 5, 9}, {33, 16, 24}, {64, 17, 31}};
  for (int i = 0; i < moe_expert_kind_count(); i++) {
    for (int a = 0; a < 2; a++) {
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        compare_kind(moe_expert_kind_get(i), ref, a ? MOE_ACT_RELU : MOE_ACT_GELU, shapes[s][0],
                     shapes[s][1], shapes[s][2]);
      }
    }
  }
  layer_with_kinds();
  registry_and_config();
  return tu_finish("test_expert");
}
