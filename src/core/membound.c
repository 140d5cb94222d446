// The memory bound's core half: the per-category need (moe_memory_need), the
// machine's available memory (/proc/meminfo, cgroup v2), the process's
// resident set, strict size parsing and the refusal message. The per-object
// estimates live next to the objects they size (layer.c, ep_layer.c, gpt.c,
// trainer.c); the agreement across ranks is moe_comm_memory_check (comm).
// Not here: any allocation accounting beyond moe_alloc_bytes (memory.c).
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/core.h"

static const char *const k_cat_names[MOE_MEM_COUNT_] = {
    "parameters",         "gradients", "optimizer state",  "activations",
    "all-to-all buffers", "workspace", "process baseline",
};
static const char *const k_cat_short[MOE_MEM_COUNT_] = {
    "params", "grads", "optimizer", "activations", "all-to-all", "workspace", "baseline",
};

const char *moe_mem_category_name(moe_mem_category c) {
  return (int)c >= 0 && c < MOE_MEM_COUNT_ ? k_cat_names[c] : "?";
}

double moe_memory_need_total(const moe_memory_need *n) {
  double t = 0;
  for (int c = 0; c < MOE_MEM_COUNT_; c++) t += n->bytes[c];
  return t;
}

double moe_memory_need_expected(const moe_memory_need *n) {
  return moe_memory_need_total(n) - MOE_MEM_SKEW_EXPECTED * n->skew_bytes;
}

void moe_memory_need_add(moe_memory_need *dst, const moe_memory_need *src) {
  moe_memory_need_add_scaled(dst, src, 1.0);
}

void moe_memory_need_add_scaled(moe_memory_need *dst, const moe_memory_need *src, double k) {
  for (int c = 0; c < MOE_MEM_COUNT_; c++) dst->bytes[c] += k * src->bytes[c];
  dst->skew_bytes += k * src->skew_bytes;
}

void moe_format_bytes(double bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    u++;
  }
  if (u == 0) {
    snprintf(buf, len, "%.0f B", bytes);
  } else {
    snprintf(buf, len, bytes < 10 ? "%.2f %s" : "%.1f %s", bytes, units[u]);
  }
}

void moe_memory_need_format(const moe_memory_need *n, char *buf, size_t len) {
  size_t used = 0;
  char b[32];
  if (len == 0) return;
  buf[0] = '\0';
  for (int c = 0; c < MOE_MEM_COUNT_; c++) {
    if (n->bytes[c] <= 0) continue;
    moe_format_bytes(n->bytes[c], b, sizeof b);
    const int w = snprintf(buf + used, len - used, "%s%s %s", used ? " + " : "", k_cat_short[c], b);
    if (w < 0 || (size_t)w >= len - used) return;
    used += (size_t)w;
  }
  moe_format_bytes(moe_memory_need_total(n), b, sizeof b);
  snprintf(buf + used, len - used, "%s%s", used ? " = " : "", b);
}

// ---- sizes -----------------------------------------------------------------------

moe_status moe_size_parse(moe_ctx *ctx, const char *text, size_t *out) {
  return moe_size_parse_min(ctx, text, 1, out);
}

moe_status moe_size_parse_min(moe_ctx *ctx, const char *text, size_t min_bytes, size_t *out) {
  moe_status st = MOE_STATUS_OK;
  const char *form =
      "a size: a number with an optional K, M, G or T suffix (1024-based), e.g. "
      "512M, 2G, 1.5GiB";
  MOE_FAIL_IF(ctx, !text || !out, MOE_STATUS_INVALID_ARG, "size: text and out must be given");
  {
    const char *p = text;
    MOE_FAIL_IF(ctx, !isdigit((unsigned char)*p), MOE_STATUS_INVALID_ARG, "size '%s' is not %s",
                text, form);
    char *end = NULL;
    const double v = strtod(p, &end);
    double mult = 1;
    const char u = (char)toupper((unsigned char)*end);
    if (u == 'K' || u == 'M' || u == 'G' || u == 'T') {
      mult = u == 'K' ? 0x1p10 : u == 'M' ? 0x1p20 : u == 'G' ? 0x1p30 : 0x1p40;
      end++;
      if (toupper((unsigned char)end[0]) == 'I' && toupper((unsigned char)end[1]) == 'B') {
        end += 2;
      } else if (toupper((unsigned char)end[0]) == 'B') {
        end++;
      }
    } else if (u == 'B') {
      end++;
    }
    MOE_FAIL_IF(ctx, *end != '\0' || !isfinite(v), MOE_STATUS_INVALID_ARG, "size '%s' is not %s",
                text, form);
    const double bytes = floor(v * mult);
    MOE_FAIL_IF(ctx, !(bytes >= (double)min_bytes) || bytes > 0x1p60, MOE_STATUS_INVALID_ARG,
                "size '%s' must be between %zu byte%s and 1 EiB (2^60 bytes)", text, min_bytes,
                min_bytes == 1 ? "" : "s");
    *out = (size_t)bytes;
  }
done:
  return st;
}

// ---- what the machine has -----------------------------------------------------------

// The value of `key` (e.g. "MemAvailable:") in a /proc file of "key value kB"
// lines, in bytes; 0 when absent.
static size_t proc_kib(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  char line[256];
  size_t out = 0;
  const size_t n = strlen(key);
  if (!f) return 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, n) == 0) {
      out = (size_t)strtoull(line + n, NULL, 10) * 1024u;
      break;
    }
  }
  fclose(f);
  return out;
}

// The first number of a one-line file; 0 on "max" or when unreadable.
static size_t file_number(const char *path, int *found) {
  FILE *f = fopen(path, "r");
  char line[64] = "";
  *found = 0;
  if (!f) return 0;
  if (fgets(line, sizeof line, f) && isdigit((unsigned char)line[0])) *found = 1;
  fclose(f);
  return *found ? (size_t)strtoull(line, NULL, 10) : 0;
}

moe_status moe_memory_available(moe_ctx *ctx, size_t *out, char *source, size_t len) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  {
    size_t avail = proc_kib("/proc/meminfo", "MemAvailable:");
    const char *from = "MemAvailable";
    // cgroup v2: the process's group is named by /proc/self/cgroup ("0::/path").
    char path[512] = "/sys/fs/cgroup", line[400] = "";
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f) {
      while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "0::", 3) == 0) {
          line[strcspn(line, "\n")] = '\0';
          if (strcmp(line + 3, "/") != 0) snprintf(path, sizeof path, "/sys/fs/cgroup%s", line + 3);
          break;
        }
      }
      fclose(f);
    }
    char file[600];
    int has_max = 0, has_cur = 0;
    snprintf(file, sizeof file, "%s/memory.max", path);
    const size_t max = file_number(file, &has_max);
    snprintf(file, sizeof file, "%s/memory.current", path);
    const size_t cur = file_number(file, &has_cur);
    if (has_max) {
      const size_t room = has_cur && cur < max ? max - cur : (has_cur ? 0 : max);
      if (!avail || room < avail) {
        avail = room;
        from = "cgroup memory.max";
      }
    }
    MOE_FAIL_IF(ctx, avail == 0 && !has_max, MOE_STATUS_IO,
                "cannot read the available memory (/proc/meminfo MemAvailable, cgroup "
                "memory.max); give a limit with --max-memory");
    *out = avail;
    if (source && len) snprintf(source, len, "%s", from);
  }
done:
  return st;
}

size_t moe_rss_bytes(void) { return proc_kib("/proc/self/status", "VmRSS:"); }
size_t moe_peak_rss_bytes(void) { return proc_kib("/proc/self/status", "VmHWM:"); }
size_t moe_memory_baseline_bytes(void) { return moe_rss_bytes() + MOE_MEM_BLAS_BYTES; }

// ---- the refusal ---------------------------------------------------------------------

moe_status moe_memory_check(moe_ctx *ctx, const moe_memory_need *need, size_t limit,
                            const char *limit_source, const char *who, const char *what_to_change) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !need, MOE_STATUS_INVALID_ARG, "need must not be NULL");
  {
    const double total = moe_memory_need_total(need);
    if (total <= (double)limit) goto done;
    char by[512], lim[32];
    moe_memory_need_format(need, by, sizeof by);
    moe_format_bytes((double)limit, lim, sizeof lim);
    MOE_FAIL(
        ctx, MOE_STATUS_INVALID_ARG,
        "%s needs more memory than it may use: %s, but the limit is %s (%s); %s",
        who ? who : "this process", by, lim, limit_source ? limit_source : "limit",
        what_to_change ? what_to_change : "use a smaller shape, more ranks, or raise --max-memory");
  }
done:
  return st;
}

moe_status moe_memory_check_process(moe_ctx *ctx, moe_memory_need *need, size_t max_memory,
                                    const char *what_to_change) {
  moe_status st = MOE_STATUS_OK;
  size_t limit = max_memory;
  char source[64] = "--max-memory";
  MOE_FAIL_IF(ctx, !need, MOE_STATUS_INVALID_ARG, "need must not be NULL");
  need->bytes[MOE_MEM_BASELINE] = (double)moe_memory_baseline_bytes();
  if (limit == 0) MOE_TRY(moe_memory_available(ctx, &limit, source, sizeof source));
  MOE_TRY(moe_memory_check(ctx, need, limit, source, "this process", what_to_change));
done:
  return st;
}
