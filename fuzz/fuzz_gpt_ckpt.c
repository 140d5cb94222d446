// libFuzzer harness: MoE-GPT checkpoints, moe_gpt_ckpt_read_info and
// moe_gpt_ckpt_load (include/moe/gpt_io.h), on top of the checkpoint reader.
//
// Input: a flag byte and a checkpoint file (fuzz_ckpt_input.h), handed over
// as an in-memory file. Invariants checked:
//   - on failure of either call: an error status with a message in the context;
//   - read_info on success: the model config passes moe_gpt_config_validate,
//     the content version is 1..3, the step >= 0, a stored schedule only from
//     version 2 and within its documented ranges;
//   - then, for a model small enough to build here (about a million
//     parameters and activations at most), the model (and AdamW state when
//     the file has it) is created from that config and loaded; on success
//     every parameter, and every AdamW moment, equals the bytes of its tensor
//     read straight from the file with moe_ckpt_reader_read, every router
//     bias the file's (version 3) or zero (versions 1, 2), and the
//     optimizer's step count is the file's step.
#include <string.h>

#include "fuzz_ckpt_input.h"
#include "fuzz_util.h"
#include "moe/checkpoint.h"
#include "moe/gpt_io.h"
#include "moe/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Rough count of the floats the model and one sequence's activations need.
static double model_floats(const moe_gpt_config *c) {
  const double M = c->d_model, S = c->seq_len, V = c->vocab_size, L = c->n_layer;
  const double E = c->moe.num_experts, H = c->moe.hidden_dim, K = c->moe.top_k;
  const double block = 12 * M * M + 2 * M * c->dense_hidden + E * (2 * M * H + H + M) + M * E;
  const double acts = S * (V + 32 * M + 4 * K * H + 4 * c->dense_hidden + 4 * E);
  return V * M + S * M + L * (block + acts);
}

// The tensor `name` of the file equals n floats at have.
static void check_tensor(moe_ctx *ctx, moe_ckpt_reader *r, const char *name, const float *have,
                         size_t n) {
  const int i = moe_ckpt_reader_find(r, name);
  FUZZ_CHECK(i >= 0, "loaded, but tensor '%s' is not in the file", name);
  float *want = malloc(n * sizeof *want);
  FUZZ_CHECK(want != NULL, "out of memory");
  const moe_status st = moe_ckpt_reader_read(r, i, 0, n, want);
  FUZZ_CHECK(st == MOE_STATUS_OK, "reading '%s': %s", name, moe_ctx_error(ctx));
  FUZZ_CHECK(memcmp(want, have, n * sizeof *want) == 0, "tensor '%s' loaded other values", name);
  free(want);
}

static void load_and_check(moe_ctx *ctx, const char *path, const moe_gpt_ckpt_info *info) {
  moe_gpt *model = NULL;
  moe_optim *opt = NULL;
  moe_ckpt_reader *r = NULL;
  moe_status st = moe_gpt_create(ctx, &info->model, 1, NULL, NULL, &model);
  FUZZ_CHECK(st == MOE_STATUS_OK, "a validated config does not build: %s", moe_ctx_error(ctx));
  if (info->has_optim) {
    moe_optim_config oc;
    moe_optim_config_default(&oc);
    st = moe_optim_create(ctx, model, &oc, &opt);
    FUZZ_CHECK(st == MOE_STATUS_OK, "moe_optim_create: %s", moe_ctx_error(ctx));
  }
  st = moe_gpt_ckpt_load(ctx, path, model, opt);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_gpt_ckpt_load");
  } else {
    st = moe_ckpt_reader_open(ctx, path, &r);
    FUZZ_CHECK(st == MOE_STATUS_OK, "loaded, but the reader refuses it: %s", moe_ctx_error(ctx));
    for (int i = 0; i < moe_gpt_num_params(model); i++) {
      const moe_gpt_param p = moe_gpt_get_param(model, i);
      check_tensor(ctx, r, p.name, p.data, p.numel);
      if (opt) {
        char name[96];
        snprintf(name, sizeof name, "adam.m.%s", p.name);
        check_tensor(ctx, r, name, moe_optim_m(opt, i), p.numel);
        snprintf(name, sizeof name, "adam.v.%s", p.name);
        check_tensor(ctx, r, name, moe_optim_v(opt, i), p.numel);
      }
    }
    // the router biases: the file's from version 3, zero before
    for (int b = 0; b < info->model.n_layer; b++) {
      const float *bias = moe_gpt_router_bias(model, b);
      if (!bias) continue;
      const size_t E = (size_t)info->model.moe.num_experts;
      if (info->version >= 3) {
        char name[64];
        snprintf(name, sizeof name, MOE_GPT_ROUTER_BIAS_NAME, b);
        check_tensor(ctx, r, name, bias, E);
      } else {
        for (size_t e = 0; e < E; e++)
          FUZZ_CHECK(bias[e] == 0.0f, "version %d file: router bias %zu is %g, not 0",
                     info->version, e, (double)bias[e]);
      }
    }
    if (opt) {
      FUZZ_CHECK(moe_optim_step_count(opt) == info->step, "step count %d, the file's %d",
                 moe_optim_step_count(opt), info->step);
    }
  }
  moe_ckpt_reader_close(r);
  moe_optim_destroy(opt);
  moe_gpt_destroy(model);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  moe_ctx *ctx = fuzz_ctx();
  const char *path = fuzz_ckpt_file(data, size);
  moe_gpt_ckpt_info info;
  memset(&info, 0, sizeof info);
  moe_status st = moe_gpt_ckpt_read_info(ctx, path, &info);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_gpt_ckpt_read_info");
  } else {
    FUZZ_CHECK(moe_gpt_config_validate(ctx, &info.model) == MOE_STATUS_OK,
               "checkpoint model config invalid: %s", moe_ctx_error(ctx));
    FUZZ_CHECK(info.version >= MOE_GPT_CKPT_VERSION_MIN && info.version <= MOE_GPT_CKPT_VERSION,
               "version %d", info.version);
    FUZZ_CHECK(info.step >= 0, "step %d", info.step);
    FUZZ_CHECK(info.has_optim == 0 || info.has_optim == 1, "has_optim %d", info.has_optim);
    if (info.has_schedule) {
      const moe_gpt_ckpt_schedule *s = &info.schedule;
      FUZZ_CHECK(info.version >= 2, "a schedule in a version %d file", info.version);
      FUZZ_CHECK(s->lr >= 0 && s->min_lr >= 0 && s->min_lr <= s->lr && s->warmup_steps >= 0 &&
                     s->total_steps >= 1,
                 "schedule out of range: lr %g min_lr %g warmup %d total %d", (double)s->lr,
                 (double)s->min_lr, s->warmup_steps, s->total_steps);
    }
    if (model_floats(&info.model) <= 1e6) load_and_check(ctx, path, &info);
  }
  moe_ctx_destroy(ctx);
  return 0;
}
