// MoE layer configuration: defaults, validation with messages that name the
// field and its valid range, JSON in and out, and the capacity formula.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "moe/expert.h"
#include "moe/layer.h"

const char *moe_activation_name(moe_activation act) {
  switch (act) {
    case MOE_ACT_GELU:
      return "gelu";
    case MOE_ACT_RELU:
      return "relu";
  }
  return "unknown";
}

moe_status moe_activation_parse(moe_ctx *ctx, const char *text, moe_activation *out) {
  moe_status st = MOE_STATUS_OK;
  if (text && strcmp(text, "gelu") == 0) {
    *out = MOE_ACT_GELU;
  } else if (text && strcmp(text, "relu") == 0) {
    *out = MOE_ACT_RELU;
  } else {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "activation '%s' is unknown (valid: gelu, relu)",
             text ? text : "(null)");
  }
done:
  return st;
}

void moe_layer_config_default(moe_layer_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->tokens = 1024;
  cfg->model_dim = 256;
  cfg->hidden_dim = 1024;
  cfg->num_experts = 8;
  cfg->top_k = 2;
  cfg->capacity_factor = 1.25;
  cfg->act = MOE_ACT_GELU;
  cfg->renormalize = 0;
  cfg->aux_loss_coef = 0.01f;
  cfg->z_loss_coef = 0.0f;
  cfg->check_finite = 1;
  snprintf(cfg->expert, sizeof cfg->expert, "ffn");
}

#define CHECK_RANGE(field, lo, hi)                                                     \
  MOE_FAIL_IF(ctx, (cfg->field < (lo)) || (cfg->field > (hi)), MOE_STATUS_INVALID_ARG, \
              #field " (%d) must be in [%d, %d]", cfg->field, (int)(lo), (int)(hi))

moe_status moe_layer_config_validate(moe_ctx *ctx, const moe_layer_config *cfg) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cfg, MOE_STATUS_INVALID_ARG, "layer config must not be NULL");
  CHECK_RANGE(tokens, 1, MOE_MAX_TOKENS);
  CHECK_RANGE(model_dim, 1, MOE_MAX_DIM);
  CHECK_RANGE(hidden_dim, 1, MOE_MAX_DIM);
  CHECK_RANGE(num_experts, 1, MOE_MAX_EXPERTS);
  CHECK_RANGE(top_k, 1, cfg->num_experts);
  MOE_FAIL_IF(ctx, (int64_t)cfg->tokens * cfg->top_k > MOE_MAX_ROWS, MOE_STATUS_INVALID_ARG,
              "tokens x top_k (%lld) must be <= %d", (long long)cfg->tokens * cfg->top_k,
              MOE_MAX_ROWS);
  MOE_FAIL_IF(ctx, cfg->act != MOE_ACT_GELU && cfg->act != MOE_ACT_RELU, MOE_STATUS_INVALID_ARG,
              "activation (%d) is unknown (valid: gelu, relu)", (int)cfg->act);
  MOE_FAIL_IF(ctx, !isfinite(cfg->capacity_factor) || cfg->capacity_factor > 1e6,
              MOE_STATUS_INVALID_ARG,
              "capacity_factor (%g) must be finite and at most 1e6 (<= 0 means dropless)",
              cfg->capacity_factor);
  MOE_FAIL_IF(ctx, !(cfg->aux_loss_coef >= 0.0f) || !isfinite(cfg->aux_loss_coef),
              MOE_STATUS_INVALID_ARG, "aux_loss_coef (%g) must be finite and >= 0",
              (double)cfg->aux_loss_coef);
  MOE_FAIL_IF(ctx, !(cfg->z_loss_coef >= 0.0f) || !isfinite(cfg->z_loss_coef),
              MOE_STATUS_INVALID_ARG, "z_loss_coef (%g) must be finite and >= 0",
              (double)cfg->z_loss_coef);
  MOE_FAIL_IF(ctx, cfg->renormalize != 0 && cfg->renormalize != 1, MOE_STATUS_INVALID_ARG,
              "renormalize (%d) must be 0 or 1", cfg->renormalize);
  MOE_FAIL_IF(ctx,
              cfg->gate_convention != MOE_GATE_LIBMOE && cfg->gate_convention != MOE_GATE_DEEPSPEED,
              MOE_STATUS_INVALID_ARG, "gate_convention (%d) must be %d (libmoe) or %d (deepspeed)",
              cfg->gate_convention, MOE_GATE_LIBMOE, MOE_GATE_DEEPSPEED);
  MOE_FAIL_IF(ctx, cfg->check_finite != 0 && cfg->check_finite != 1, MOE_STATUS_INVALID_ARG,
              "check_finite (%d) must be 0 or 1", cfg->check_finite);
  MOE_FAIL_IF(ctx, !memchr(cfg->expert, 0, sizeof cfg->expert), MOE_STATUS_INVALID_ARG,
              "expert kind is not a NUL-terminated name (valid: %s)", moe_expert_kind_names());
  {
    const moe_expert_kind *kind = NULL;
    MOE_TRY(moe_expert_kind_find(ctx, cfg->expert, &kind));
  }
done:
  return st;
}

int moe_layer_capacity(const moe_layer_config *cfg, int tokens) {
  if (!(cfg->capacity_factor > 0.0)) return -1;
  // Evaluated as ((f*K)*T)/E in double, the same order as the PyTorch reference.
  const double c = ceil(cfg->capacity_factor * cfg->top_k * tokens / cfg->num_experts);
  return c > (double)MOE_MAX_ROWS ? MOE_MAX_ROWS : (int)c;
}

// ---- JSON ----------------------------------------------------------------------------

static const char *const k_keys =
    "tokens, model_dim, hidden_dim, num_experts, top_k, capacity_factor, activation, "
    "renormalize, aux_loss_coef, z_loss_coef, check_finite, expert, gate_convention";

// A loss coefficient: bounded by 1e30 as the float it is stored in, so that
// the float the writer prints (%.9g: 1e30f prints as 1.00000002e+30, above
// 1e30 as a double) reads back (found by fuzz/fuzz_gpt_config.c).
static moe_status get_coef(moe_ctx *ctx, const cJSON *it, const char *k, float *out) {
  moe_status st = MOE_STATUS_OK;
  double d = 0.0;
  MOE_TRY(moe_json_get_double(ctx, it, k, &d));
  MOE_FAIL_IF(ctx, !(fabs(d) <= FLT_MAX) || !(fabsf((float)d) <= 1e30f), MOE_STATUS_INVALID_ARG,
              "%s (%g) must be finite and >= 0", k, d);
  *out = (float)d;
done:
  return st;
}

moe_status moe_layer_config_from_json(moe_ctx *ctx, const char *json, moe_layer_config *cfg) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  moe_layer_config next = *cfg;
  MOE_TRY(moe_json_parse_object(ctx, json, "layer config", &root));
  for (const cJSON *it = root->child; it; it = it->next) {
    const char *k = it->string;
    for (const cJSON *prev = root->child; prev != it; prev = prev->next) {
      MOE_FAIL_IF(ctx, strcmp(prev->string, k) == 0, MOE_STATUS_INVALID_ARG,
                  "key '%s' appears twice in layer config", k);
    }
    if (strcmp(k, "tokens") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.tokens));
    } else if (strcmp(k, "model_dim") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.model_dim));
    } else if (strcmp(k, "hidden_dim") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.hidden_dim));
    } else if (strcmp(k, "num_experts") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.num_experts));
    } else if (strcmp(k, "top_k") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &next.top_k));
    } else if (strcmp(k, "capacity_factor") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, k, &next.capacity_factor));
    } else if (strcmp(k, "activation") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsString(it), MOE_STATUS_INVALID_ARG,
                  "'activation' must be a string (gelu or relu)");
      MOE_TRY(moe_activation_parse(ctx, it->valuestring, &next.act));
    } else if (strcmp(k, "renormalize") == 0) {
      MOE_TRY(moe_json_get_bool(ctx, it, k, &next.renormalize));
    } else if (strcmp(k, "aux_loss_coef") == 0) {
      MOE_TRY(get_coef(ctx, it, k, &next.aux_loss_coef));
    } else if (strcmp(k, "z_loss_coef") == 0) {
      MOE_TRY(get_coef(ctx, it, k, &next.z_loss_coef));
    } else if (strcmp(k, "check_finite") == 0) {
      MOE_TRY(moe_json_get_bool(ctx, it, k, &next.check_finite));
    } else if (strcmp(k, "gate_convention") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsString(it), MOE_STATUS_INVALID_ARG,
                  "'gate_convention' must be a string (libmoe, megatron, deepspeed)");
      moe_gate_convention gc = MOE_GATE_LIBMOE;
      MOE_TRY(moe_gate_convention_parse(ctx, it->valuestring, &gc));
      next.gate_convention = (int)gc;
    } else if (strcmp(k, "expert") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsString(it), MOE_STATUS_INVALID_ARG,
                  "'expert' must be a string (%s)", moe_expert_kind_names());
      MOE_FAIL_IF(ctx, strlen(it->valuestring) >= sizeof next.expert, MOE_STATUS_INVALID_ARG,
                  "'expert' (%s) is too long (valid: %s)", it->valuestring,
                  moe_expert_kind_names());
      snprintf(next.expert, sizeof next.expert, "%s", it->valuestring);
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "unknown key '%s' in layer config (valid: %s)", k,
               k_keys);
    }
  }
  *cfg = next;
done:
  cJSON_Delete(root);
  return st;
}

moe_status moe_layer_config_load(moe_ctx *ctx, const char *path, moe_layer_config *cfg) {
  moe_status st = MOE_STATUS_OK;
  char *text = NULL;
  MOE_TRY(moe_read_file(ctx, path, 1u << 20, &text, NULL));
  MOE_TRY(moe_layer_config_from_json(ctx, text, cfg));
done:
  moe_free(text);
  return st;
}

// The expert kind as the text of a JSON string: quotes, backslashes and
// control characters escaped. A config that does not validate may hold any
// name (a dense model's MoE fields are not checked), and what the writer
// writes must read back: the model's checkpoint stores this text (found by
// fuzz/fuzz_gpt_config.c: "a\"b" made the checkpoint config unreadable).
static void escape_name(const char *s, size_t cap, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < cap && s[i]; i++) {
    const unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      out[o++] = '\\';
      out[o++] = (char)c;
    } else if (c < 0x20) {
      o += (size_t)snprintf(out + o, 7, "\\u%04x", (unsigned)c);
    } else {
      out[o++] = (char)c;
    }
  }
  out[o] = '\0';
}

moe_status moe_layer_config_to_json(moe_ctx *ctx, const moe_layer_config *cfg, char *buf,
                                    size_t len) {
  moe_status st = MOE_STATUS_OK;
  char expert[6 * sizeof cfg->expert + 1];  // each byte at most \u00XX
  escape_name(cfg->expert, sizeof cfg->expert, expert);
  // gate_convention only when it is not the default, so a config (and a
  // checkpoint or profile holding one) reads exactly as before it existed
  char gate[64] = "";
  if (cfg->gate_convention != MOE_GATE_LIBMOE)
    snprintf(gate, sizeof gate, ", \"gate_convention\": \"%s\"",
             moe_gate_convention_name((moe_gate_convention)cfg->gate_convention));
  const int n =
      snprintf(buf, len,
               "{\"tokens\": %d, \"model_dim\": %d, \"hidden_dim\": %d, \"num_experts\": %d, "
               "\"top_k\": %d, \"capacity_factor\": %.17g, \"activation\": \"%s\", "
               "\"renormalize\": %s, \"aux_loss_coef\": %.9g, \"z_loss_coef\": %.9g, "
               "\"check_finite\": %s, \"expert\": \"%s\"%s}",
               cfg->tokens, cfg->model_dim, cfg->hidden_dim, cfg->num_experts, cfg->top_k,
               cfg->capacity_factor, moe_activation_name(cfg->act),
               cfg->renormalize ? "true" : "false", (double)cfg->aux_loss_coef,
               (double)cfg->z_loss_coef, cfg->check_finite ? "true" : "false", expert, gate);
  MOE_FAIL_IF(ctx, n < 0 || (size_t)n >= len, MOE_STATUS_INVALID_ARG,
              "layer config JSON needs %d bytes, buffer has %zu", n + 1, len);
done:
  return st;
}

const char *moe_gate_convention_name(moe_gate_convention c) {
  return c == MOE_GATE_DEEPSPEED ? "deepspeed" : "libmoe";
}

moe_status moe_gate_convention_parse(moe_ctx *ctx, const char *text, moe_gate_convention *out) {
  moe_status st = MOE_STATUS_OK;
  if (text && (strcmp(text, "libmoe") == 0 || strcmp(text, "megatron") == 0)) {
    *out = MOE_GATE_LIBMOE;
  } else if (text && strcmp(text, "deepspeed") == 0) {
    *out = MOE_GATE_DEEPSPEED;
  } else {
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "gate convention '%s' is unknown (valid: libmoe, megatron (= libmoe), deepspeed)",
             text ? text : "(null)");
  }
done:
  return st;
}
