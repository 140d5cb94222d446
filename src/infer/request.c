// Completion requests from JSON (moe_infer_request_from_json): the OpenAI
// completions request shape, strict about keys, types and ranges, so that
// `moe generate` and `moe serve` refuse the same bad input with the same words.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "moe/infer_request.h"

void moe_infer_params_default(moe_infer_params *p) {
  memset(p, 0, sizeof *p);
  p->max_tokens = 16;
  p->temperature = 1.0;
  p->top_k = 0;
  p->top_p = 1.0;
  p->seed = 0;
}

moe_status moe_infer_params_validate(moe_ctx *ctx, const moe_infer_params *p) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !p, MOE_STATUS_INVALID_ARG, "request parameters must not be NULL");
  MOE_FAIL_IF(ctx, p->max_tokens < 0 || p->max_tokens > (1 << 20), MOE_STATUS_INVALID_ARG,
              "max_tokens (%d) must be in [0, %d]", p->max_tokens, 1 << 20);
  MOE_FAIL_IF(ctx, !(p->temperature >= 0 && p->temperature <= 100), MOE_STATUS_INVALID_ARG,
              "temperature (%g) must be in [0, 100]", p->temperature);
  MOE_FAIL_IF(ctx, p->top_k < 0 || p->top_k > 65536, MOE_STATUS_INVALID_ARG,
              "top_k (%d) must be in [0, 65536] (0: all tokens)", p->top_k);
  MOE_FAIL_IF(ctx, !(p->top_p > 0 && p->top_p <= 1), MOE_STATUS_INVALID_ARG,
              "top_p (%g) must be in (0, 1]", p->top_p);
  MOE_FAIL_IF(ctx, p->n_stop < 0 || p->n_stop > MOE_INFER_MAX_STOP, MOE_STATUS_INVALID_ARG,
              "stop strings (%d) must be at most %d", p->n_stop, MOE_INFER_MAX_STOP);
  for (int i = 0; i < p->n_stop; i++) {
    const size_t n = strnlen(p->stop[i], MOE_INFER_STOP_BYTES + 1);
    MOE_FAIL_IF(ctx, n < 1 || n > MOE_INFER_STOP_BYTES, MOE_STATUS_INVALID_ARG,
                "stop string %d must have 1 to %d bytes", i, MOE_INFER_STOP_BYTES);
  }
done:
  return st;
}

static moe_status get_string(moe_ctx *ctx, const cJSON *it, const char *key, const char **out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cJSON_IsString(it) || !it->valuestring, MOE_STATUS_INVALID_ARG,
              "'%s' must be a string", key);
  *out = it->valuestring;
done:
  return st;
}

static moe_status get_stop(moe_ctx *ctx, const cJSON *it, moe_infer_params *p) {
  moe_status st = MOE_STATUS_OK;
  p->n_stop = 0;
  if (cJSON_IsNull(it)) goto done;
  if (cJSON_IsString(it)) {
    const size_t n = strlen(it->valuestring);
    MOE_FAIL_IF(ctx, n < 1 || n > MOE_INFER_STOP_BYTES, MOE_STATUS_INVALID_ARG,
                "'stop' must have 1 to %d bytes (got %zu)", MOE_INFER_STOP_BYTES, n);
    memcpy(p->stop[0], it->valuestring, n + 1);
    p->n_stop = 1;
    goto done;
  }
  MOE_FAIL_IF(ctx, !cJSON_IsArray(it), MOE_STATUS_INVALID_ARG,
              "'stop' must be a string or an array of strings");
  const int count = cJSON_GetArraySize(it);
  MOE_FAIL_IF(ctx, count > MOE_INFER_MAX_STOP, MOE_STATUS_INVALID_ARG,
              "'stop' holds %d strings; at most %d", count, MOE_INFER_MAX_STOP);
  const cJSON *s;
  cJSON_ArrayForEach(s, it) {
    MOE_FAIL_IF(ctx, !cJSON_IsString(s), MOE_STATUS_INVALID_ARG,
                "'stop' must be a string or an array of strings");
    const size_t n = strlen(s->valuestring);
    MOE_FAIL_IF(ctx, n < 1 || n > MOE_INFER_STOP_BYTES, MOE_STATUS_INVALID_ARG,
                "'stop' strings must have 1 to %d bytes (got %zu)", MOE_INFER_STOP_BYTES, n);
    memcpy(p->stop[p->n_stop++], s->valuestring, n + 1);
  }
done:
  return st;
}

// The chat template: "<role>: <content>\n" per message, then "assistant:".
static moe_status chat_prompt(moe_ctx *ctx, const cJSON *msgs, moe_infer_request *r) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) < 1, MOE_STATUS_INVALID_ARG,
              "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
  size_t need = strlen("assistant:") + 1;
  const cJSON *m;
  int i = 0;
  cJSON_ArrayForEach(m, msgs) {
    MOE_FAIL_IF(ctx, !cJSON_IsObject(m), MOE_STATUS_INVALID_ARG,
                "'messages[%d]' must be an object with \"role\" and \"content\"", i);
    const cJSON *role = NULL, *content = NULL, *f;
    cJSON_ArrayForEach(f, m) {
      if (strcmp(f->string, "role") == 0) {
        MOE_FAIL_IF(ctx, role != NULL, MOE_STATUS_INVALID_ARG,
                    "'messages[%d]': key 'role' appears twice", i);
        role = f;
      } else if (strcmp(f->string, "content") == 0) {
        MOE_FAIL_IF(ctx, content != NULL, MOE_STATUS_INVALID_ARG,
                    "'messages[%d]': key 'content' appears twice", i);
        content = f;
      } else if (strcmp(f->string, "name") == 0) {  // accepted, not part of the prompt
        MOE_FAIL_IF(ctx, !cJSON_IsString(f), MOE_STATUS_INVALID_ARG,
                    "'messages[%d].name' must be a string", i);
      } else {
        MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
                 "'messages[%d]': unrecognized key '%s' (known: role, content, name)", i,
                 f->string);
      }
    }
    MOE_FAIL_IF(ctx,
                !cJSON_IsString(role) || (strcmp(role->valuestring, "system") != 0 &&
                                          strcmp(role->valuestring, "user") != 0 &&
                                          strcmp(role->valuestring, "assistant") != 0),
                MOE_STATUS_INVALID_ARG,
                "'messages[%d].role' must be \"system\", \"user\" or \"assistant\"", i);
    MOE_FAIL_IF(ctx, !cJSON_IsString(content), MOE_STATUS_INVALID_ARG,
                "'messages[%d].content' must be a string (content parts are not supported)", i);
    need += strlen(role->valuestring) + 3 + strlen(content->valuestring);
    i++;
  }
  r->prompt = moe_malloc(need);
  MOE_FAIL_IF(ctx, !r->prompt, MOE_STATUS_OUT_OF_MEMORY, "request: out of memory");
  size_t o = 0;
  cJSON_ArrayForEach(m, msgs) {
    const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
    const char *content = cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring;
    o += (size_t)snprintf(r->prompt + o, need - o, "%s: %s\n", role, content);
  }
  o += (size_t)snprintf(r->prompt + o, need - o, "assistant:");
  r->prompt_len = o;
done:
  return st;
}

moe_status moe_infer_request_from_json(moe_ctx *ctx, const char *json, size_t len,
                                       const moe_infer_params *defaults, unsigned flags,
                                       moe_infer_request *out) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  char *text = NULL;
  moe_infer_request r;
  memset(&r, 0, sizeof r);
  MOE_FAIL_IF(ctx, !json || !defaults || !out, MOE_STATUS_INVALID_ARG,
              "request: json, defaults and out must not be NULL");
  memset(out, 0, sizeof *out);
  MOE_FAIL_IF(ctx, memchr(json, '\0', len) != NULL, MOE_STATUS_BAD_FORMAT,
              "request: the body holds a NUL byte");
  text = moe_malloc(len + 1);
  MOE_FAIL_IF(ctx, !text, MOE_STATUS_OUT_OF_MEMORY, "request: out of memory (%zu bytes)", len);
  memcpy(text, json, len);
  text[len] = '\0';
  MOE_TRY(moe_json_parse_object(ctx, text, "request", &root));
  r.params = *defaults;
  const cJSON *it;
  int have_prompt = 0;
  cJSON_ArrayForEach(it, root) {
    const char *k = it->string;
    for (const cJSON *o = root->child; o != it; o = o->next)
      MOE_FAIL_IF(ctx, strcmp(o->string, k) == 0, MOE_STATUS_INVALID_ARG,
                  "request: key '%s' appears twice", k);
    const int chat = (flags & MOE_INFER_JSON_CHAT) != 0;
    if (chat && strcmp(k, "messages") == 0) {
      MOE_TRY(chat_prompt(ctx, it, &r));
      have_prompt = 1;
    } else if (chat && strcmp(k, "max_completion_tokens") == 0) {
      MOE_FAIL_IF(ctx, cJSON_GetObjectItemCaseSensitive(root, "max_tokens") != NULL,
                  MOE_STATUS_INVALID_ARG,
                  "give one of 'max_completion_tokens' and 'max_tokens' (its older name)");
      MOE_TRY(moe_json_get_int(ctx, it, k, &r.params.max_tokens));
    } else if (!chat && strcmp(k, "prompt") == 0) {
      const char *s = NULL;
      MOE_FAIL_IF(ctx, cJSON_IsArray(it), MOE_STATUS_INVALID_ARG,
                  "'prompt' must be one string (arrays of prompts are not supported: send one "
                  "request each)");
      MOE_TRY(get_string(ctx, it, k, &s));
      r.prompt_len = strlen(s);
      r.prompt = moe_malloc(r.prompt_len + 1);
      MOE_FAIL_IF(ctx, !r.prompt, MOE_STATUS_OUT_OF_MEMORY, "request: out of memory");
      memcpy(r.prompt, s, r.prompt_len + 1);
      have_prompt = 1;
    } else if (strcmp(k, "max_tokens") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &r.params.max_tokens));
    } else if (strcmp(k, "temperature") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, k, &r.params.temperature));
    } else if (strcmp(k, "top_p") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, k, &r.params.top_p));
    } else if (strcmp(k, "top_k") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &r.params.top_k));
    } else if (strcmp(k, "seed") == 0) {
      MOE_FAIL_IF(ctx,
                  !cJSON_IsNumber(it) || it->valuedouble < 0 ||
                      it->valuedouble > 9007199254740992.0 ||
                      it->valuedouble != floor(it->valuedouble),
                  MOE_STATUS_INVALID_ARG, "'seed' must be an integer in [0, 2^53]");
      r.params.seed = (uint64_t)it->valuedouble;
      r.has_seed = 1;
    } else if (strcmp(k, "stop") == 0) {
      MOE_TRY(get_stop(ctx, it, &r.params));
    } else if (strcmp(k, "stream") == 0) {
      MOE_TRY(moe_json_get_bool(ctx, it, k, &r.stream));
    } else if (strcmp(k, "model") == 0) {
      const char *s = NULL;
      MOE_TRY(get_string(ctx, it, k, &s));
      MOE_FAIL_IF(ctx, strlen(s) >= sizeof r.model, MOE_STATUS_INVALID_ARG,
                  "'model' must be shorter than %zu bytes", sizeof r.model);
      snprintf(r.model, sizeof r.model, "%s", s);
    } else if (strcmp(k, "n") == 0) {
      int n = 0;
      MOE_TRY(moe_json_get_int(ctx, it, k, &n));
      MOE_FAIL_IF(ctx, n != 1, MOE_STATUS_INVALID_ARG,
                  "'n' must be 1 (one completion per request; got %d)", n);
    } else if (strcmp(k, "user") == 0) {
      const char *s = NULL;
      MOE_TRY(get_string(ctx, it, k, &s));
    } else if (strcmp(k, "id") == 0 && (flags & MOE_INFER_JSON_ID)) {
      // echoed exactly: a string (as every JSON output: invalid UTF-8 as
      // U+FFFD) or an integer below 2^53 in magnitude (a larger literal may
      // round to one of these when parsed: 2^53 + 1 reads as 2^53, refused)
      const double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
      MOE_FAIL_IF(ctx, !cJSON_IsString(it) && !(fabs(v) < 9007199254740992.0 && v == floor(v)),
                  MOE_STATUS_INVALID_ARG,
                  "'id' must be a string or an integer in [-(2^53 - 1), 2^53 - 1] (echoed "
                  "exactly)");
      if (cJSON_IsString(it)) {
        r.id_json = moe_infer_json_string(it->valuestring, strlen(it->valuestring));
      } else if ((r.id_json = moe_malloc(32)) != NULL) {
        snprintf(r.id_json, 32, "%lld", (long long)v);
      }
      MOE_FAIL_IF(ctx, !r.id_json, MOE_STATUS_OUT_OF_MEMORY, "request: out of memory");
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
               "request: unrecognized key '%s' (known: %s, max_tokens, temperature, top_p, "
               "top_k, seed, stop, stream, model, n, user%s)",
               k, chat ? "messages, max_completion_tokens" : "prompt",
               (flags & MOE_INFER_JSON_ID) ? ", id" : "");
    }
  }
  MOE_FAIL_IF(ctx, !have_prompt, MOE_STATUS_INVALID_ARG, "request: '%s' is required",
              (flags & MOE_INFER_JSON_CHAT) ? "messages" : "prompt");
  MOE_TRY(moe_infer_params_validate(ctx, &r.params));
  *out = r;
  memset(&r, 0, sizeof r);
done:
  moe_infer_request_free(&r);
  cJSON_Delete(root);
  moe_free(text);
  return st;
}

void moe_infer_request_free(moe_infer_request *r) {
  if (!r) return;
  moe_free(r->prompt);
  moe_free(r->id_json);
  r->prompt = NULL;
  r->id_json = NULL;
}

// ---- expert placements (the names; the engine places) ----------------------------

#define MOE_INFER_PLACEMENT_NAME_(U, l) #l,
static const char *const k_placement_names[] = {MOE_INFER_PLACEMENTS(MOE_INFER_PLACEMENT_NAME_)};
#undef MOE_INFER_PLACEMENT_NAME_
#define N_PLACEMENTS ((int)(sizeof k_placement_names / sizeof k_placement_names[0]))

int moe_infer_placement_find(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < N_PLACEMENTS; i++)
    if (strcmp(name, k_placement_names[i]) == 0) return i;
  return -1;
}

const char *moe_infer_placement_name(int placement) {
  return placement >= 0 && placement < N_PLACEMENTS ? k_placement_names[placement] : NULL;
}

const char *moe_infer_placement_names(void) {
#define MOE_INFER_PLACEMENT_LIST_(U, l) ", " #l
  static const char list[] = MOE_INFER_PLACEMENTS(MOE_INFER_PLACEMENT_LIST_);
#undef MOE_INFER_PLACEMENT_LIST_
  return list + 2;  // without the first ", "
}
