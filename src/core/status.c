// Status codes, the per-context last error, and error recording.
// Library code never exits or prints errors itself: it records them in a
// context and returns the status; the caller decides what to show.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "moe/core.h"

struct moe_ctx {
  moe_status status;
  char message[1024];
  char where[192];
};

const char *moe_status_str(moe_status st) {
  switch (st) {
    case MOE_STATUS_OK:
      return "ok";
    case MOE_STATUS_INVALID_ARG:
      return "invalid argument";
    case MOE_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case MOE_STATUS_IO:
      return "I/O error";
    case MOE_STATUS_BAD_FORMAT:
      return "bad format";
    case MOE_STATUS_UNSUPPORTED:
      return "unsupported";
    case MOE_STATUS_COMM:
      return "communication error";
    case MOE_STATUS_INTERNAL:
      return "internal error";
    case MOE_STATUS_BUSY:
      return "busy";
    case MOE_STATUS_COUNT_:
      break;
  }
  return "unknown status";
}

moe_status moe_ctx_create(moe_ctx **out) {
  if (!out) return MOE_STATUS_INVALID_ARG;
  *out = moe_calloc(1, sizeof(moe_ctx));
  return *out ? MOE_STATUS_OK : MOE_STATUS_OUT_OF_MEMORY;
}

void moe_ctx_destroy(moe_ctx *ctx) { moe_free(ctx); }

const char *moe_ctx_error(const moe_ctx *ctx) { return ctx ? ctx->message : ""; }
const char *moe_ctx_error_where(const moe_ctx *ctx) { return ctx ? ctx->where : ""; }
moe_status moe_ctx_status(const moe_ctx *ctx) { return ctx ? ctx->status : MOE_STATUS_OK; }

void moe_ctx_clear_error(moe_ctx *ctx) {
  if (!ctx) return;
  ctx->status = MOE_STATUS_OK;
  ctx->message[0] = '\0';
  ctx->where[0] = '\0';
}

moe_status moe_error_at(moe_ctx *ctx, moe_status code, const char *file, int line, const char *fmt,
                        ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ctx) {
    ctx->status = code;
    snprintf(ctx->message, sizeof ctx->message, "%s", msg);
    snprintf(ctx->where, sizeof ctx->where, "%s:%d", file, line);
  }
  moe_log_at(MOE_LOG_DEBUG, file, line, "%s: %s", moe_status_str(code), msg);
  return code;
}
