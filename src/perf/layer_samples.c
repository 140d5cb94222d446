// The layer runs behind a profile's layer corrections, as JSON (perf.h):
// `moe calibrate --samples FILE` writes them, `moe calibrate --refit FILE`
// fits a profile's corrections to them again without measuring.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "moe/perf.h"

#define SAMPLES_MAX_BYTES (16u << 20)

moe_status moe_layer_samples_to_json(moe_ctx *ctx, const moe_layer_sample *s, int n, char **out) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  char *text = NULL;
  MOE_FAIL_IF(ctx, !out || n < 0 || (n > 0 && !s), MOE_STATUS_INVALID_ARG,
              "layer samples: need samples (got %d) and an output", n);
  *out = NULL;
  root = cJSON_CreateObject();
  const int ver_ok = root && cJSON_AddNumberToObject(root, "layer_samples_version", 1);
  cJSON *arr = ver_ok ? cJSON_AddArrayToObject(root, "samples") : NULL;
  MOE_FAIL_IF(ctx, !arr, MOE_STATUS_OUT_OF_MEMORY, "layer samples: out of memory");
  for (int i = 0; i < n; i++) {
    char cfg[1024];
    MOE_TRY(moe_layer_config_to_json(ctx, &s[i].cfg, cfg, sizeof cfg));
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddItemToArray(arr, o)) {
      cJSON_Delete(o);
      o = NULL;
    }
    MOE_FAIL_IF(ctx, !o, MOE_STATUS_OUT_OF_MEMORY, "layer samples: out of memory");
    // the config's own text (%.17g for the capacity factor) and %.17g for the
    // times, as raw JSON: cJSON prints 15 digits when they read back within
    // an epsilon, which may change the last bit
    MOE_FAIL_IF(ctx,
                !cJSON_AddRawToObject(o, "config", cfg) ||
                    !cJSON_AddStringToObject(o, "a2a", s[i].a2a) ||
                    !cJSON_AddStringToObject(o, "schedule", s[i].schedule) ||
                    !cJSON_AddNumberToObject(o, "chunks", s[i].chunks),
                MOE_STATUS_OUT_OF_MEMORY, "layer samples: out of memory");
    const char *names[] = {"comp_ms", "comm_ms", "passes_ms", "total_ms"};
    const double vals[] = {s[i].comp_ms, s[i].comm_ms, s[i].passes_ms, s[i].total_ms};
    for (int k = 0; k < 4; k++) {
      char num[40];
      snprintf(num, sizeof num, "%.17g", vals[k]);
      MOE_FAIL_IF(ctx, !cJSON_AddRawToObject(o, names[k], num), MOE_STATUS_OUT_OF_MEMORY,
                  "layer samples: out of memory");
    }
  }
  text = cJSON_Print(root);
  MOE_FAIL_IF(ctx, !text, MOE_STATUS_OUT_OF_MEMORY, "layer samples: out of memory");
  const size_t len = strlen(text);
  *out = moe_malloc(len + 2);
  MOE_FAIL_IF(ctx, !*out, MOE_STATUS_OUT_OF_MEMORY, "layer samples: out of memory");
  memcpy(*out, text, len);
  (*out)[len] = '\n';
  (*out)[len + 1] = '\0';
done:
  cJSON_free(text);
  cJSON_Delete(root);
  return st;
}

// A string field of at most cap - 1 bytes.
static moe_status get_name(moe_ctx *ctx, const cJSON *it, const char *what, char *dst, size_t cap) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cJSON_IsString(it) || !it->valuestring, MOE_STATUS_INVALID_ARG,
              "layer samples: %s must be a string", what);
  MOE_FAIL_IF(ctx, strlen(it->valuestring) >= cap || it->valuestring[0] == '\0',
              MOE_STATUS_INVALID_ARG, "layer samples: %s '%s' must be 1..%zu bytes", what,
              it->valuestring, cap - 1);
  snprintf(dst, cap, "%s", it->valuestring);
done:
  return st;
}

static moe_status parse_sample(moe_ctx *ctx, const cJSON *o, int i, moe_layer_sample *s) {
  moe_status st = MOE_STATUS_OK;
  char *cfg_text = NULL;
  char what[64];
  memset(s, 0, sizeof *s);
  MOE_FAIL_IF(ctx, !cJSON_IsObject(o), MOE_STATUS_INVALID_ARG,
              "layer samples: samples[%d] must be an object", i);
  static const char *const keys[] = {"config",  "a2a",     "schedule",  "chunks",
                                     "comp_ms", "comm_ms", "passes_ms", "total_ms"};
  int seen = 0;
  for (const cJSON *it = o->child; it; it = it->next) {
    int k = -1;
    for (int j = 0; j < 8; j++) {
      if (it->string && strcmp(it->string, keys[j]) == 0) k = j;
    }
    MOE_FAIL_IF(ctx, k < 0, MOE_STATUS_INVALID_ARG,
                "layer samples: samples[%d] has unknown key '%s' (valid: config, a2a, schedule, "
                "chunks, comp_ms, comm_ms, passes_ms, total_ms)",
                i, it->string ? it->string : "");
    MOE_FAIL_IF(ctx, seen & (1 << k), MOE_STATUS_INVALID_ARG,
                "layer samples: samples[%d] has key '%s' twice", i, keys[k]);
    seen |= 1 << k;
    snprintf(what, sizeof what, "samples[%d].%s", i, keys[k]);
    switch (k) {
      case 0:
        MOE_FAIL_IF(ctx, !cJSON_IsObject(it), MOE_STATUS_INVALID_ARG,
                    "layer samples: %s must be an object", what);
        cfg_text = cJSON_PrintUnformatted(it);
        MOE_FAIL_IF(ctx, !cfg_text, MOE_STATUS_OUT_OF_MEMORY, "layer samples: out of memory");
        moe_layer_config_default(&s->cfg);
        MOE_TRY(moe_layer_config_from_json(ctx, cfg_text, &s->cfg));
        MOE_TRY(moe_layer_config_validate(ctx, &s->cfg));
        break;
      case 1:
        MOE_TRY(get_name(ctx, it, what, s->a2a, sizeof s->a2a));
        break;
      case 2:
        MOE_TRY(get_name(ctx, it, what, s->schedule, sizeof s->schedule));
        break;
      case 3:
        MOE_TRY(moe_json_get_int(ctx, it, what, &s->chunks));
        MOE_FAIL_IF(ctx, s->chunks < 1 || s->chunks > 64, MOE_STATUS_INVALID_ARG,
                    "layer samples: %s (%d) must be in [1, 64]", what, s->chunks);
        break;
      default: {
        double v = 0;
        MOE_TRY(moe_json_get_double(ctx, it, what, &v));
        MOE_FAIL_IF(ctx, !(v > 0) || !isfinite(v), MOE_STATUS_INVALID_ARG,
                    "layer samples: %s (%g) must be a positive finite time in ms", what, v);
        double *dst[] = {&s->comp_ms, &s->comm_ms, &s->passes_ms, &s->total_ms};
        *dst[k - 4] = v;
      }
    }
  }
  for (int k = 0; k < 8; k++) {
    MOE_FAIL_IF(ctx, !(seen & (1 << k)), MOE_STATUS_INVALID_ARG,
                "layer samples: samples[%d] lacks '%s'", i, keys[k]);
  }
  MOE_FAIL_IF(ctx, s->passes_ms > s->total_ms, MOE_STATUS_INVALID_ARG,
              "layer samples: samples[%d] has passes_ms %g above total_ms %g", i, s->passes_ms,
              s->total_ms);
done:
  cJSON_free(cfg_text);
  return st;
}

moe_status moe_layer_samples_from_json(moe_ctx *ctx, const char *json, moe_layer_sample **out,
                                       int *n) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  moe_layer_sample *s = NULL;
  MOE_FAIL_IF(ctx, !json || !out || !n, MOE_STATUS_INVALID_ARG,
              "layer samples: arguments must not be NULL");
  *out = NULL;
  *n = 0;
  MOE_TRY(moe_json_parse_object(ctx, json, "layer samples", &root));
  const cJSON *ver = NULL, *arr = NULL;
  for (const cJSON *it = root->child; it; it = it->next) {
    if (strcmp(it->string, "layer_samples_version") == 0 && !ver) {
      ver = it;
    } else if (strcmp(it->string, "samples") == 0 && !arr) {
      arr = it;
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
               "layer samples: unknown or repeated key '%s' (valid: layer_samples_version, "
               "samples)",
               it->string);
    }
  }
  int version = 0;
  MOE_FAIL_IF(ctx, !ver, MOE_STATUS_INVALID_ARG, "layer samples: lacks 'layer_samples_version'");
  MOE_TRY(moe_json_get_int(ctx, ver, "layer_samples_version", &version));
  MOE_FAIL_IF(ctx, version != 1, MOE_STATUS_INVALID_ARG,
              "layer samples: layer_samples_version %d is not supported (this build reads 1)",
              version);
  MOE_FAIL_IF(ctx, !cJSON_IsArray(arr), MOE_STATUS_INVALID_ARG,
              "layer samples: 'samples' must be an array of objects");
  const int count = cJSON_GetArraySize(arr);
  MOE_FAIL_IF(ctx, count < 1 || count > 100000, MOE_STATUS_INVALID_ARG,
              "layer samples: 'samples' holds %d runs (valid: 1..100000)", count);
  s = moe_calloc((size_t)count, sizeof *s);
  MOE_FAIL_IF(ctx, !s, MOE_STATUS_OUT_OF_MEMORY, "layer samples: cannot allocate %d samples",
              count);
  int i = 0;
  for (const cJSON *it = arr->child; it; it = it->next, i++) {
    MOE_TRY(parse_sample(ctx, it, i, &s[i]));
  }
  *out = s;
  *n = count;
  s = NULL;
done:
  moe_free(s);
  cJSON_Delete(root);
  return st;
}

typedef struct {
  moe_layer_sample *s;
  int n;
} samples_out;

static moe_status parse_samples_text(moe_ctx *ctx, const char *text, void *out) {
  samples_out *o = out;
  return moe_layer_samples_from_json(ctx, text, &o->s, &o->n);
}

moe_status moe_layer_samples_load(moe_ctx *ctx, const char *path, moe_layer_sample **out, int *n) {
  moe_status st = MOE_STATUS_OK;
  samples_out o = {NULL, 0};
  MOE_FAIL_IF(ctx, !out || !n, MOE_STATUS_INVALID_ARG, "layer samples: outputs must not be NULL");
  MOE_TRY(moe_json_load_file(ctx, path, SAMPLES_MAX_BYTES, parse_samples_text, &o));
  *out = o.s;
  *n = o.n;
done:
  return st;
}
