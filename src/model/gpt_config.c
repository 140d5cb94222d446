// MoE-GPT configuration: defaults, validation with messages that name the
// field and its valid range, strict JSON in and out (the "moe" sub-object goes
// through the MoE layer's own parser), and which blocks carry an MoE FFN.
//
// Not here: the model itself (gpt.c) and the MoE backends (gpt_moe_local.c).
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "moe/model.h"

void moe_gpt_config_default(moe_gpt_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->vocab_size = 256;
  cfg->seq_len = 128;
  cfg->n_layer = 4;
  cfg->n_head = 4;
  cfg->d_model = 128;
  cfg->moe_every = 1;
  cfg->dense_hidden = 512;
  cfg->ln_eps = 1e-5f;
  cfg->init_std = 0.02f;
  moe_layer_config_default(&cfg->moe);
  cfg->moe.tokens = cfg->seq_len;
  cfg->moe.model_dim = cfg->d_model;
  cfg->moe.num_experts = 8;
  cfg->moe.top_k = 2;
  cfg->moe.hidden_dim = 256;
  cfg->moe.capacity_factor = -1.0;  // dropless
  cfg->moe.act = MOE_ACT_GELU;
  cfg->moe.renormalize = 1;
  cfg->moe.aux_loss_coef = 0.01f;
  cfg->moe.z_loss_coef = 0.0f;
}

int moe_gpt_block_is_moe(const moe_gpt_config *cfg, int block) {
  return cfg->moe_every > 0 && (block + 1) % cfg->moe_every == 0;
}

#define CHECK_RANGE(field, lo, hi)                                                     \
  MOE_FAIL_IF(ctx, (cfg->field < (lo)) || (cfg->field > (hi)), MOE_STATUS_INVALID_ARG, \
              #field " (%d) must be in [%d, %d]", cfg->field, (int)(lo), (int)(hi))

moe_status moe_gpt_config_validate(moe_ctx *ctx, const moe_gpt_config *cfg) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cfg, MOE_STATUS_INVALID_ARG, "model config must not be NULL");
  CHECK_RANGE(vocab_size, 2, 65536);
  CHECK_RANGE(seq_len, 1, 65536);
  CHECK_RANGE(n_layer, 1, MOE_GPT_MAX_LAYERS);
  CHECK_RANGE(d_model, 1, MOE_MAX_DIM);
  CHECK_RANGE(n_head, 1, cfg->d_model);
  MOE_FAIL_IF(ctx, cfg->d_model % cfg->n_head != 0, MOE_STATUS_INVALID_ARG,
              "n_head (%d) must divide d_model (%d)", cfg->n_head, cfg->d_model);
  CHECK_RANGE(moe_every, 0, cfg->n_layer);
  CHECK_RANGE(dense_hidden, 1, MOE_MAX_DIM);
  MOE_FAIL_IF(ctx, !(cfg->ln_eps > 0.0f) || !isfinite(cfg->ln_eps), MOE_STATUS_INVALID_ARG,
              "ln_eps (%g) must be finite and > 0", (double)cfg->ln_eps);
  MOE_FAIL_IF(ctx, !(cfg->init_std > 0.0f) || !isfinite(cfg->init_std), MOE_STATUS_INVALID_ARG,
              "init_std (%g) must be finite and > 0", (double)cfg->init_std);
  if (cfg->moe_every > 0) {
    // tokens and model_dim are set by moe_gpt_create; check the rest as the layer will.
    moe_layer_config lc = cfg->moe;
    lc.model_dim = cfg->d_model;
    lc.tokens = cfg->seq_len;
    st = moe_layer_config_validate(ctx, &lc);
    if (st != MOE_STATUS_OK) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s", moe_ctx_error(ctx));
      MOE_FAIL(ctx, st, "moe.%s", msg);
    }
  }
done:
  return st;
}

// ---- JSON ----------------------------------------------------------------------------

static const char *const k_keys =
    "vocab_size, seq_len, n_layer, n_head, d_model, moe_every, dense_hidden, ln_eps, init_std, "
    "moe";

static moe_status get_float(moe_ctx *ctx, const cJSON *it, const char *k, float *out) {
  moe_status st = MOE_STATUS_OK;
  double d = 0.0;
  MOE_TRY(moe_json_get_double(ctx, it, k, &d));
  // bounded as the float it is stored in: the writer prints the float (%.9g:
  // 3e38f prints as 3.00000006e+38, above 3e38 as a double), which must read
  // back (found by fuzz/fuzz_gpt_config.c for the MoE loss coefficients)
  MOE_FAIL_IF(ctx, !(fabs(d) <= FLT_MAX) || !(fabsf((float)d) <= 3e38f), MOE_STATUS_INVALID_ARG,
              "'%s' (%g) must be a finite float32 value", k, d);
  *out = (float)d;
done:
  return st;
}

moe_status moe_gpt_config_from_json(moe_ctx *ctx, const char *json, moe_gpt_config *cfg) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  char *sub = NULL;
  MOE_FAIL_IF(ctx, !cfg, MOE_STATUS_INVALID_ARG, "model config must not be NULL");
  moe_gpt_config next = *cfg;
  MOE_TRY(moe_json_parse_object(ctx, json, "model config", &root));
  for (const cJSON *it = root->child; it; it = it->next) {
    const char *k = it->string;
    for (const cJSON *prev = root->child; prev != it; prev = prev->next) {
      MOE_FAIL_IF(ctx, strcmp(prev->string, k) == 0, MOE_STATUS_INVALID_ARG,
                  "key '%s' appears twice in model config", k);
    }
    if (strcmp(k, "vocab_size") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.vocab_size));
    } else if (strcmp(k, "seq_len") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.seq_len));
    } else if (strcmp(k, "n_layer") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.n_layer));
    } else if (strcmp(k, "n_head") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.n_head));
    } else if (strcmp(k, "d_model") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.d_model));
    } else if (strcmp(k, "moe_every") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.moe_every));
    } else if (strcmp(k, "dense_hidden") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.dense_hidden));
    } else if (strcmp(k, "ln_eps") == 0) {
      MOE_TRY(get_float(ctx, it, k, &next.ln_eps));
    } else if (strcmp(k, "init_std") == 0) {
      MOE_TRY(get_float(ctx, it, k, &next.init_std));
    } else if (strcmp(k, "moe") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsObject(it), MOE_STATUS_INVALID_ARG,
                  "'moe' must be an object of MoE layer config keys");
      sub = cJSON_PrintUnformatted(it);
      MOE_FAIL_IF(ctx, !sub, MOE_STATUS_OUT_OF_MEMORY, "cannot print the 'moe' object");
      st = moe_layer_config_from_json(ctx, sub, &next.moe);
      if (st != MOE_STATUS_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", moe_ctx_error(ctx));
        MOE_FAIL(ctx, st, "in 'moe': %s", msg);
      }
      cJSON_free(sub);
      sub = NULL;
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "unknown key '%s' in model config (valid: %s)", k,
               k_keys);
    }
  }
  *cfg = next;
done:
  if (sub) cJSON_free(sub);
  cJSON_Delete(root);
  return st;
}

moe_status moe_gpt_config_to_json(moe_ctx *ctx, const moe_gpt_config *cfg, char *buf, size_t len) {
  moe_status st = MOE_STATUS_OK;
  char moe_json[1024];
  MOE_FAIL_IF(ctx, !cfg || (!buf && len > 0), MOE_STATUS_INVALID_ARG,
              "config and buffer must not be NULL");
  MOE_TRY(moe_layer_config_to_json(ctx, &cfg->moe, moe_json, sizeof moe_json));
  const int n = snprintf(buf, len,
                         "{\"vocab_size\": %d, \"seq_len\": %d, \"n_layer\": %d, \"n_head\": %d, "
                         "\"d_model\": %d, \"moe_every\": %d, \"dense_hidden\": %d, "
                         "\"ln_eps\": %.9g, \"init_std\": %.9g, \"moe\": %s}",
                         cfg->vocab_size, cfg->seq_len, cfg->n_layer, cfg->n_head, cfg->d_model,
                         cfg->moe_every, cfg->dense_hidden, (double)cfg->ln_eps,
                         (double)cfg->init_std, moe_json);
  MOE_FAIL_IF(ctx, n < 0 || (size_t)n >= len, MOE_STATUS_INVALID_ARG,
              "model config JSON needs %d bytes, buffer has %zu", n + 1, len);
done:
  return st;
}
