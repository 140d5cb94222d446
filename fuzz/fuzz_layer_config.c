// libFuzzer harness: moe_layer_config_from_json (include/moe/layer.h).
//
// Input: JSON text. Invariants checked:
//   - on failure: an error status with a message in the context, and the
//     config left exactly as it was;
//   - on success, when the config also validates: moe_layer_config_to_json
//     writes it, and reading that text over a config whose every field
//     differs gives back an equal config (every field is written and reads
//     back exactly), which validates too.
#include <string.h>

#include "fuzz_layer_eq.h"
#include "fuzz_util.h"
#include "moe/layer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_cstr(data, size);
  moe_ctx *ctx = fuzz_ctx();
  moe_layer_config cfg, before;
  moe_layer_config_default(&cfg);
  before = cfg;
  moe_status st = moe_layer_config_from_json(ctx, text, &cfg);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_layer_config_from_json");
    FUZZ_CHECK(memcmp(&cfg, &before, sizeof cfg) == 0, "config changed by a failed parse");
  } else if (moe_layer_config_validate(ctx, &cfg) == MOE_STATUS_OK) {
    char buf[2048];
    st = moe_layer_config_to_json(ctx, &cfg, buf, sizeof buf);
    FUZZ_CHECK(st == MOE_STATUS_OK, "to_json of a valid config: %s", moe_ctx_error(ctx));
    moe_layer_config back;
    fuzz_layer_config_other(&back);
    st = moe_layer_config_from_json(ctx, buf, &back);
    FUZZ_CHECK(st == MOE_STATUS_OK, "reading back %s: %s", buf, moe_ctx_error(ctx));
    fuzz_layer_config_check_equal(&cfg, &back, buf);
    FUZZ_CHECK(moe_layer_config_validate(ctx, &back) == MOE_STATUS_OK, "read-back invalid: %s",
               moe_ctx_error(ctx));
  } else {
    fuzz_check_failure(ctx, moe_ctx_status(ctx), "moe_layer_config_validate");
  }
  moe_ctx_destroy(ctx);
  free(text);
  return 0;
}
