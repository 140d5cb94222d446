// libFuzzer harness: moe_gpt_config_from_json (include/moe/model.h).
//
// Input: JSON text. Invariants checked:
//   - on failure: an error status with a message in the context, and the
//     config left exactly as it was;
//   - on success, when the config also validates: moe_gpt_config_to_json
//     writes it, and reading that text over a config whose every field
//     differs gives back an equal config, which validates too (the trainer
//     stores this text in every checkpoint and reads it back on resume).
#include <string.h>

#include "fuzz_layer_eq.h"
#include "fuzz_util.h"
#include "moe/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void other_config(moe_gpt_config *c) {
  memset(c, 0, sizeof *c);
  c->vocab_size = c->seq_len = c->n_layer = c->n_head = c->d_model = c->moe_every = -9;
  c->dense_hidden = -9;
  c->ln_eps = c->init_std = -2.5f;
  fuzz_layer_config_other(&c->moe);
}

static void check_equal(const moe_gpt_config *a, const moe_gpt_config *b, const char *text) {
#define EQ(f) FUZZ_CHECK(a->f == b->f, "field " #f ": %d became %d via %s", a->f, b->f, text)
  EQ(vocab_size);
  EQ(seq_len);
  EQ(n_layer);
  EQ(n_head);
  EQ(d_model);
  EQ(moe_every);
  EQ(dense_hidden);
#undef EQ
  FUZZ_CHECK(a->ln_eps == b->ln_eps, "ln_eps %.9g became %.9g via %s", (double)a->ln_eps,
             (double)b->ln_eps, text);
  FUZZ_CHECK(a->init_std == b->init_std, "init_std %.9g became %.9g via %s", (double)a->init_std,
             (double)b->init_std, text);
  fuzz_layer_config_check_equal(&a->moe, &b->moe, text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size);
  moe_ctx *ctx = fuzz_ctx();
  moe_gpt_config cfg, before;
  moe_gpt_config_default(&cfg);
  before = cfg;
  moe_status st = moe_gpt_config_from_json(ctx, text, &cfg);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_gpt_config_from_json");
    FUZZ_CHECK(memcmp(&cfg, &before, sizeof cfg) == 0, "config changed by a failed parse");
  } else if (moe_gpt_config_validate(ctx, &cfg) == MOE_STATUS_OK) {
    char buf[4096];
    st = moe_gpt_config_to_json(ctx, &cfg, buf, sizeof buf);
    FUZZ_CHECK(st == MOE_STATUS_OK, "to_json of a valid config: %s", moe_ctx_error(ctx));
    moe_gpt_config back;
    other_config(&back);
    st = moe_gpt_config_from_json(ctx, buf, &back);
    FUZZ_CHECK(st == MOE_STATUS_OK, "reading back %s: %s", buf, moe_ctx_error(ctx));
    check_equal(&cfg, &back, buf);
    FUZZ_CHECK(moe_gpt_config_validate(ctx, &back) == MOE_STATUS_OK, "read-back invalid: %s",
               moe_ctx_error(ctx));
  } else {
    fuzz_check_failure(ctx, moe_ctx_status(ctx), "moe_gpt_config_validate");
  }
  moe_ctx_destroy(ctx);
  free(text);
  return 0;
}
