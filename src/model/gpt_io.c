// MoE-GPT checkpoint contents: the config JSON a training checkpoint carries,
// and loading a model (whole, or one rank's expert slice) plus its AdamW state
// from one. The byte format is src/model/checkpoint.c's; writing the whole
// model from many ranks is the trainer's (src/train/trainer.c).
#include "moe/gpt_io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "moe/checkpoint.h"

// ---- config JSON ------------------------------------------------------------------------

// The model config as a checkpoint stores it: moe.tokens (set from the batch
// by moe_gpt_create) and moe.model_dim (= d_model) are not properties of the
// trained model, so they are normalised to seq_len and d_model.
static moe_status model_json(moe_ctx *ctx, const moe_gpt_config *cfg, char *buf, size_t len) {
  moe_gpt_config c = *cfg;
  c.moe.tokens = c.seq_len;
  c.moe.model_dim = c.d_model;
  return moe_gpt_config_to_json(ctx, &c, buf, len);
}

static moe_status parse_model_text(moe_ctx *ctx, const char *text, void *out) {
  return moe_gpt_config_from_json(ctx, text, out);
}

moe_status moe_gpt_config_load_file(moe_ctx *ctx, const char *path, moe_gpt_config *cfg) {
  return moe_json_load_file(ctx, path, (size_t)1 << 20, parse_model_text, cfg);
}

moe_status moe_gpt_ckpt_config_json(moe_ctx *ctx, const moe_gpt *model, const moe_optim *opt,
                                    int step, uint64_t seed, int batch, char **out) {
  moe_status st = MOE_STATUS_OK;
  char mj[4096];
  const size_t cap = sizeof mj + 512;
  char *buf = NULL;
  *out = NULL;
  MOE_TRY(model_json(ctx, moe_gpt_get_config(model), mj, sizeof mj));
  buf = moe_malloc(cap);
  MOE_FAIL_IF(ctx, !buf, MOE_STATUS_OUT_OF_MEMORY, "checkpoint config: out of memory");
  char sched[256] = "";
  if (opt) {
    // %.9g: every float prints to the text that reads back as the same float
    const moe_optim_config *oc = moe_optim_get_config(opt);
    snprintf(sched, sizeof sched,
             ",\"schedule\":{\"lr\":%.9g,\"min_lr\":%.9g,\"warmup\":%d,\"total\":%d}",
             (double)oc->lr, (double)oc->min_lr, oc->warmup_steps, oc->total_steps);
  }
  const int n = snprintf(buf, cap,
                         "{\"format\":\"%s\",\"version\":%d,\"model\":%s,\"step\":%d,"
                         "\"seed\":%llu,\"batch\":%d,\"optim\":%s%s}",
                         MOE_GPT_CKPT_FORMAT, MOE_GPT_CKPT_VERSION, mj, step,
                         (unsigned long long)seed, batch, opt ? "true" : "false", sched);
  MOE_FAIL_IF(ctx, n < 0 || (size_t)n >= cap, MOE_STATUS_INTERNAL,
              "checkpoint config does not fit in %zu bytes", cap);
  *out = buf;
  buf = NULL;
done:
  moe_free(buf);
  return st;
}

static moe_status parse_info(moe_ctx *ctx, const char *path, const char *json,
                             moe_gpt_ckpt_info *info) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  char *model_json = NULL;
  MOE_TRY(moe_json_parse_object(ctx, json, "checkpoint config", &root));
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  MOE_FAIL_IF(ctx, !cJSON_IsString(fmt) || strcmp(fmt->valuestring, MOE_GPT_CKPT_FORMAT) != 0,
              MOE_STATUS_BAD_FORMAT,
              "%s: not a MoE-GPT checkpoint (config has no \"format\": \"%s\")", path,
              MOE_GPT_CKPT_FORMAT);
  int version = 0;
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "version"),
                           "checkpoint version", &version));
  MOE_FAIL_IF(ctx, version < MOE_GPT_CKPT_VERSION_MIN || version > MOE_GPT_CKPT_VERSION,
              MOE_STATUS_BAD_FORMAT,
              "%s: MoE-GPT checkpoint content version %d, this build reads versions %d..%d", path,
              version, MOE_GPT_CKPT_VERSION_MIN, MOE_GPT_CKPT_VERSION);
  info->version = version;
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  MOE_FAIL_IF(ctx, !cJSON_IsObject(model), MOE_STATUS_BAD_FORMAT,
              "%s: config has no \"model\" object", path);
  model_json = cJSON_PrintUnformatted(model);
  MOE_FAIL_IF(ctx, !model_json, MOE_STATUS_OUT_OF_MEMORY, "checkpoint config: out of memory");
  moe_gpt_config_default(&info->model);
  MOE_TRY(moe_gpt_config_from_json(ctx, model_json, &info->model));
  MOE_TRY(moe_gpt_config_validate(ctx, &info->model));
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "step"), "checkpoint step",
                           &info->step));
  MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(root, "batch"), "checkpoint batch",
                           &info->batch));
  double seed = 0;
  MOE_TRY(moe_json_get_double(ctx, cJSON_GetObjectItemCaseSensitive(root, "seed"),
                              "checkpoint seed", &seed));
  MOE_FAIL_IF(ctx, !(seed >= 0) || seed > 9007199254740992.0, MOE_STATUS_BAD_FORMAT,
              "%s: seed %g out of range", path, seed);
  info->seed = (uint64_t)seed;
  MOE_TRY(moe_json_get_bool(ctx, cJSON_GetObjectItemCaseSensitive(root, "optim"),
                            "checkpoint optim", &info->has_optim));
  MOE_FAIL_IF(ctx, info->step < 0, MOE_STATUS_BAD_FORMAT, "%s: step %d is negative", path,
              info->step);
  // The learning-rate schedule: from version 2, whenever the optimizer state is stored.
  info->has_schedule = 0;
  memset(&info->schedule, 0, sizeof info->schedule);
  const cJSON *sch = cJSON_GetObjectItemCaseSensitive(root, "schedule");
  MOE_FAIL_IF(ctx, version >= 2 && info->has_optim && !cJSON_IsObject(sch), MOE_STATUS_BAD_FORMAT,
              "%s: version %d config has no \"schedule\" object", path, version);
  if (version >= 2 && cJSON_IsObject(sch)) {
    double lr = 0, min_lr = 0;
    moe_gpt_ckpt_schedule *s = &info->schedule;
    MOE_TRY(moe_json_get_double(ctx, cJSON_GetObjectItemCaseSensitive(sch, "lr"),
                                "checkpoint schedule lr", &lr));
    MOE_TRY(moe_json_get_double(ctx, cJSON_GetObjectItemCaseSensitive(sch, "min_lr"),
                                "checkpoint schedule min_lr", &min_lr));
    MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(sch, "warmup"),
                             "checkpoint schedule warmup", &s->warmup_steps));
    MOE_TRY(moe_json_get_int(ctx, cJSON_GetObjectItemCaseSensitive(sch, "total"),
                             "checkpoint schedule total", &s->total_steps));
    MOE_FAIL_IF(ctx,
                !(lr >= 0 && lr <= 1e6) || !(min_lr >= 0 && min_lr <= lr) || s->warmup_steps < 0 ||
                    s->total_steps < 1,
                MOE_STATUS_BAD_FORMAT,
                "%s: schedule out of range (lr %g >= 0, min_lr %g in [0, lr], warmup %d >= 0, "
                "total %d >= 1)",
                path, lr, min_lr, s->warmup_steps, s->total_steps);
    s->lr = (float)lr;
    s->min_lr = (float)min_lr;
    info->has_schedule = 1;
  }
done:
  free(model_json);  // cJSON's allocator
  cJSON_Delete(root);
  return st;
}

moe_status moe_gpt_ckpt_read_info(moe_ctx *ctx, const char *path, moe_gpt_ckpt_info *info) {
  moe_status st = MOE_STATUS_OK;
  moe_ckpt_reader *r = NULL;
  MOE_TRY(moe_ckpt_reader_open(ctx, path, &r));
  MOE_TRY(parse_info(ctx, path, moe_ckpt_reader_config(r), info));
done:
  moe_ckpt_reader_close(r);
  return st;
}

// ---- loading ------------------------------------------------------------------------------

// Reads this rank's part of tensor `name` (numel elements from element `first`,
// or the pieces of a tensor split over MP: moe_gpt_param.tp_*) after checking
// the stored shape equals the whole shape of p.
static moe_status read_part(moe_ctx *ctx, const char *path, moe_ckpt_reader *r, const char *name,
                            const moe_gpt_param *p, float *dst) {
  moe_status st = MOE_STATUS_OK;
  const int i = moe_ckpt_reader_find(r, name);
  MOE_FAIL_IF(ctx, i < 0, MOE_STATUS_BAD_FORMAT, "%s: tensor '%s' is missing", path, name);
  const moe_ckpt_tensor_desc *d = moe_ckpt_reader_desc(r, i);
  int same = d->ndim == p->ndim && d->dtype == MOE_CKPT_F32;
  for (int k = 0; same && k < p->ndim; k++) same = d->dims[k] == p->dims[k];
  MOE_FAIL_IF(ctx, !same, MOE_STATUS_BAD_FORMAT,
              "%s: tensor '%s' has another shape or type than the model's", path, name);
  const size_t runs = moe_gpt_param_runs(p);
  for (size_t k = 0; k < runs; k++) {
    size_t at = 0;
    const size_t n = moe_gpt_param_run(p, k, &at);
    MOE_TRY(moe_ckpt_reader_read(r, i, at, n, dst));
    dst += n;
  }
done:
  return st;
}

moe_status moe_gpt_ckpt_load(moe_ctx *ctx, const char *path, moe_gpt *model, moe_optim *opt) {
  moe_status st = MOE_STATUS_OK;
  moe_ckpt_reader *r = NULL;
  char a[4096], b[4096];
  moe_gpt_ckpt_info info;
  MOE_TRY(moe_ckpt_reader_open(ctx, path, &r));
  MOE_TRY(parse_info(ctx, path, moe_ckpt_reader_config(r), &info));
  MOE_TRY(model_json(ctx, &info.model, a, sizeof a));
  MOE_TRY(model_json(ctx, moe_gpt_get_config(model), b, sizeof b));
  MOE_FAIL_IF(
      ctx, strcmp(a, b) != 0, MOE_STATUS_BAD_FORMAT,
      "%s: the checkpoint's model differs from this model:\n  checkpoint %s\n  model      %s", path,
      a, b);
  MOE_FAIL_IF(ctx, opt && !info.has_optim, MOE_STATUS_BAD_FORMAT,
              "%s: has no optimizer state (saved without it)", path);
  const int n = moe_gpt_num_params(model);
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(model, i);
    MOE_TRY(read_part(ctx, path, r, p.name, &p, p.data));
    if (opt) {
      char name[96];
      snprintf(name, sizeof name, "adam.m.%s", p.name);
      MOE_TRY(read_part(ctx, path, r, name, &p, moe_optim_m(opt, i)));
      snprintf(name, sizeof name, "adam.v.%s", p.name);
      MOE_TRY(read_part(ctx, path, r, name, &p, moe_optim_v(opt, i)));
    }
  }
  // The router biases (routing state, not parameters): version 3 stores one
  // per MoE block; an older file routes without one.
  for (int blk = 0; blk < info.model.n_layer; blk++) {
    float *bias = moe_gpt_router_bias(model, blk);
    if (!bias) continue;
    const int E = info.model.moe.num_experts;
    if (info.version < 3) {
      memset(bias, 0, (size_t)E * sizeof(float));
      continue;
    }
    char name[64];
    snprintf(name, sizeof name, MOE_GPT_ROUTER_BIAS_NAME, blk);
    const int i = moe_ckpt_reader_find(r, name);
    MOE_FAIL_IF(ctx, i < 0, MOE_STATUS_BAD_FORMAT, "%s: tensor '%s' is missing", path, name);
    const moe_ckpt_tensor_desc *d = moe_ckpt_reader_desc(r, i);
    MOE_FAIL_IF(ctx, d->dtype != MOE_CKPT_F32 || d->ndim != 1 || d->dims[0] != E,
                MOE_STATUS_BAD_FORMAT, "%s: tensor '%s' is not f32 of shape (%d)", path, name, E);
    MOE_TRY(moe_ckpt_reader_read(r, i, 0, (size_t)E, bias));
    for (int e = 0; e < E; e++)
      MOE_FAIL_IF(ctx, !isfinite(bias[e]), MOE_STATUS_BAD_FORMAT,
                  "%s: tensor '%s' holds a non-finite value at expert %d", path, name, e);
  }
  if (opt) moe_optim_set_step_count(opt, info.step);
done:
  moe_ckpt_reader_close(r);
  return st;
}
