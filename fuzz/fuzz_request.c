// libFuzzer harness: completion requests as moe serve and moe generate read
// them (moe_infer_request_from_json, include/moe/infer_request.h), and the
// JSON text of completions (moe_infer_json_string).
//
// Input: a flag byte (bit 0: MOE_INFER_JSON_ID, bit 1: MOE_INFER_JSON_CHAT,
// bit 2: also escape the body as completion text), then the request body
// (any bytes: HTTP bodies are not NUL-terminated). Invariants checked:
//   - on failure: an error status with a message, and nothing to free;
//   - on success: the parameters validate, the prompt is prompt_len bytes with
//     a NUL after them and no NUL inside, at most MOE_INFER_MAX_STOP non-empty
//     stop strings, a chat prompt ends with "assistant:";
//   - moe_infer_json_string of any bytes is one JSON string: quoted, no raw
//     control byte, quotes and backslashes escaped, valid UTF-8 throughout.
#include <string.h>

#include "fuzz_util.h"
#include "moe/infer_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid.
static size_t utf8_ok(const unsigned char *s, size_t n) {
  size_t len = s[0] < 0x80             ? 1
               : (s[0] & 0xE0) == 0xC0 ? 2
               : (s[0] & 0xF0) == 0xE0 ? 3
               : (s[0] & 0xF8) == 0xF0 ? 4
                                       : 0;
  if (len == 0 || len > n) return 0;
  unsigned cp = len == 1 ? s[0] : s[0] & (0x7F >> len);
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

static void check_json_string(const char *bytes, size_t n) {
  char *js = moe_infer_json_string(bytes, n);
  FUZZ_CHECK(js != NULL, "json string of %zu bytes: out of memory", n);
  const size_t len = strlen(js);
  FUZZ_CHECK(len >= 2 && js[0] == '"' && js[len - 1] == '"', "not quoted: %s", js);
  const unsigned char *u = (const unsigned char *)js;
  for (size_t i = 1; i + 1 < len;) {
    FUZZ_CHECK(u[i] >= 0x20 && u[i] != 0x7F, "raw control byte 0x%02x at %zu", u[i], i);
    FUZZ_CHECK(u[i] != '"', "unescaped quote at %zu in %s", i, js);
    if (u[i] == '\\') {
      FUZZ_CHECK(i + 2 < len && strchr("\"\\ntru", js[i + 1]) != NULL, "bad escape at %zu", i);
      i += js[i + 1] == 'u' ? 6 : 2;
      continue;
    }
    const size_t k = utf8_ok(u + i, len - 1 - i);
    FUZZ_CHECK(k > 0, "invalid UTF-8 at %zu", i);
    i += k;
  }
  moe_free(js);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const unsigned flags = data[0] & 3u;
  const char *body = (const char *)data + 1;
  const size_t n = size - 1;
  if (data[0] & 4u) check_json_string(body, n);
  moe_ctx *ctx = fuzz_ctx();
  moe_infer_params d;
  moe_infer_params_default(&d);
  moe_infer_request r;
  const moe_status st = moe_infer_request_from_json(ctx, body, n, &d, flags, &r);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_infer_request_from_json");
  } else {
    FUZZ_CHECK(moe_infer_params_validate(ctx, &r.params) == MOE_STATUS_OK,
               "accepted parameters do not validate: %s", moe_ctx_error(ctx));
    FUZZ_CHECK(
        r.prompt != NULL && r.prompt[r.prompt_len] == '\0' && strlen(r.prompt) == r.prompt_len,
        "prompt of %zu bytes is not NUL-terminated there", r.prompt_len);
    FUZZ_CHECK(r.params.n_stop >= 0 && r.params.n_stop <= MOE_INFER_MAX_STOP, "n_stop %d",
               r.params.n_stop);
    for (int i = 0; i < r.params.n_stop; i++)
      FUZZ_CHECK(r.params.stop[i][0] != '\0', "empty stop string %d", i);
    if (flags & 2u)
      FUZZ_CHECK(r.prompt_len >= 10 && memcmp(r.prompt + r.prompt_len - 10, "assistant:", 10) == 0,
                 "chat prompt does not end with the template's assistant turn");
    FUZZ_CHECK((flags & 1u) || r.id_json == NULL, "an id without the flag");
    check_json_string(r.prompt, r.prompt_len);
    moe_infer_request_free(&r);
  }
  moe_ctx_destroy(ctx);
  return 0;
}
