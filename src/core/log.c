// Leveled logging to stderr. The level is process-wide (an atomic), initialised
// from MOE_LOG_LEVEL on first use. Not a tracing facility: per-task timing goes
// to the profiler, not here.
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/core.h"

static atomic_int g_level = -1;  // -1: not yet read from the environment

static const char *const k_level_names[] = {"error", "warn", "info", "debug", "trace"};

moe_status moe_log_level_parse(const char *text, moe_log_level *out) {
  if (!text || !out) return MOE_STATUS_INVALID_ARG;
  for (int i = 0; i <= MOE_LOG_TRACE; i++) {
    if (strcmp(text, k_level_names[i]) == 0 || (text[0] == '0' + i && text[1] == '\0')) {
      *out = (moe_log_level)i;
      return MOE_STATUS_OK;
    }
  }
  return MOE_STATUS_INVALID_ARG;
}

moe_log_level moe_log_get_level(void) {
  int level = atomic_load(&g_level);
  if (level < 0) {
    moe_log_level parsed = MOE_LOG_WARN;
    const char *env = getenv("MOE_LOG_LEVEL");
    if (env && moe_log_level_parse(env, &parsed) != MOE_STATUS_OK) parsed = MOE_LOG_WARN;
    // Only the first initialisation wins: a concurrent moe_log_set_level is kept.
    int expect = -1;
    atomic_compare_exchange_strong(&g_level, &expect, (int)parsed);
    level = atomic_load(&g_level);
  }
  return (moe_log_level)level;
}

void moe_log_set_level(moe_log_level level) {
  if (level < MOE_LOG_ERROR) level = MOE_LOG_ERROR;
  if (level > MOE_LOG_TRACE) level = MOE_LOG_TRACE;
  atomic_store(&g_level, (int)level);
}

void moe_log_at(moe_log_level level, const char *file, int line, const char *fmt, ...) {
  if (level > moe_log_get_level() || level < MOE_LOG_ERROR) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  // One fprintf per message so lines from different threads do not interleave.
  if (level >= MOE_LOG_DEBUG) {
    fprintf(stderr, "[moe %s] %s (%s:%d)\n", k_level_names[level], msg, file, line);
  } else {
    fprintf(stderr, "[moe %s] %s\n", k_level_names[level], msg);
  }
}
