// Option parsing for the moe CLI: "--name VALUE" or "--name=VALUE", numbers
// checked against their valid range with a message that names the option.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "moe/kernels.h"

void cli_error(const char *fmt, ...) {
  va_list ap;
  fputs("moe: error: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

void cli_args_init(cli_args *a, int argc, char **argv, int first) {
  a->argc = argc;
  a->argv = argv;
  a->i = first;
  a->value = NULL;
  a->bad = 0;
}

int cli_args_done(const cli_args *a) { return a->i >= a->argc; }
const char *cli_args_peek(const cli_args *a) { return a->i < a->argc ? a->argv[a->i] : NULL; }

int cli_flag(cli_args *a, const char *name) {
  if (a->i < a->argc && strcmp(a->argv[a->i], name) == 0) {
    a->i++;
    return 1;
  }
  return 0;
}

int cli_opt(cli_args *a, const char *name) {
  if (a->i >= a->argc) return 0;
  const char *arg = a->argv[a->i];
  const size_t n = strlen(name);
  if (strncmp(arg, name, n) != 0) return 0;
  if (arg[n] == '=') {
    a->value = arg + n + 1;
    a->i++;
    return 1;
  }
  if (arg[n] != '\0') return 0;
  if (a->i + 1 >= a->argc) {
    cli_error("option %s needs a value", name);
    a->bad = 1;
    a->value = NULL;
    a->i++;
    return 1;
  }
  a->value = a->argv[a->i + 1];
  a->i += 2;
  return 1;
}

void cli_parse_backend(cli_args *a, const char *opt, const char **out) {
  if (!a->value) return;
  moe_ctx *ctx = NULL;
  const moe_backend *b = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("%s: out of memory", opt);
    a->bad = 1;
  } else if (moe_backend_find(ctx, a->value, &b) != MOE_STATUS_OK) {
    cli_error("%s: %s", opt, moe_ctx_error(ctx));
    a->bad = 1;
  } else {
    *out = a->value;
  }
  moe_ctx_destroy(ctx);
}

void cli_parse_precision(cli_args *a, const char *opt, int *out) {
  if (!a->value) return;
  moe_precision p = MOE_PRECISION_FP32;
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("%s: out of memory", opt);
    a->bad = 1;
  } else if (moe_precision_parse(ctx, a->value, &p) != MOE_STATUS_OK) {
    cli_error("%s: %s", opt, moe_ctx_error(ctx));
    a->bad = 1;
  } else {
    *out = (int)p;
  }
  moe_ctx_destroy(ctx);
}

void cli_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
    if (*q == '"' || *q == '\\') {
      fprintf(f, "\\%c", *q);
    } else if (*q < 0x20) {
      fprintf(f, "\\u%04x", *q);
    } else {
      fputc(*q, f);
    }
  }
  fputc('"', f);
}

int cli_check_skew(const moe_skew *skew, int num_experts, int top_k, int print) {
  if (skew->kind != MOE_SKEW_TRACE) return CLI_OK;
  moe_ctx *ctx = NULL;
  double *shares = moe_calloc(num_experts > 0 ? (size_t)num_experts : 1, sizeof(double));
  int rc = CLI_OK;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK || !shares) {
    if (print) cli_error("--skew: out of memory");
    rc = CLI_FAILED;
  } else if (moe_skew_shares(ctx, skew, num_experts, top_k, shares) != MOE_STATUS_OK) {
    if (print) cli_error("--skew: %s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
  }
  moe_free(shares);
  moe_ctx_destroy(ctx);
  return rc;
}

void cli_parse_skew(cli_args *a, const char *opt, moe_skew *out) {
  if (!a->value) return;
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("%s: out of memory", opt);
    a->bad = 1;
  } else if (moe_skew_parse(ctx, a->value, out) != MOE_STATUS_OK) {
    cli_error("%s: %s", opt, moe_ctx_error(ctx));
    a->bad = 1;
  }
  moe_ctx_destroy(ctx);
}

int cli_use_compute(const char *name, int threads, int precision, char *desc, size_t len) {
  moe_ctx *ctx = NULL;
  const moe_backend *b = NULL;
  int rc = CLI_OK;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("out of memory");
    return CLI_FAILED;
  }
  if (moe_backend_find(ctx, name, &b) != MOE_STATUS_OK ||
      moe_compute_check(ctx, b, (moe_precision)precision) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
  } else {
    moe_backend_use(b, threads);
    moe_precision_use((moe_precision)precision);
    const int nt = b->set_threads ? threads : 1;
    if (precision == MOE_PRECISION_BF16) {
      snprintf(desc, len, "%s: %s, bf16 (%s kernel), %d thread%s", b->name, b->describe(),
               moe_gemm_bf16_isa(), nt, nt == 1 ? "" : "s");
    } else {
      snprintf(desc, len, "%s: %s, fp32, %d thread%s", b->name, b->describe(), nt,
               nt == 1 ? "" : "s");
    }
  }
  moe_ctx_destroy(ctx);
  return rc;
}

void cli_parse_int(cli_args *a, const char *opt, long lo, long hi, int *out) {
  if (!a->value) return;
  char *end = NULL;
  errno = 0;
  const long v = strtol(a->value, &end, 10);
  if (errno != 0 || end == a->value || *end != '\0') {
    cli_error("%s expects an integer, got '%s'", opt, a->value);
    a->bad = 1;
  } else if (v < lo || v > hi) {
    cli_error("%s (%ld) must be in [%ld, %ld]", opt, v, lo, hi);
    a->bad = 1;
  } else {
    *out = (int)v;
  }
}

void cli_parse_on_off(cli_args *a, const char *opt, int *out) {
  if (!a->value) return;
  if (strcmp(a->value, "on") == 0) {
    *out = 1;
  } else if (strcmp(a->value, "off") == 0) {
    *out = 0;
  } else {
    cli_error("%s: '%s' is not one of on, off", opt, a->value);
    a->bad = 1;
  }
}

void cli_parse_double(cli_args *a, const char *opt, double lo, double hi, double *out) {
  if (!a->value) return;
  char *end = NULL;
  errno = 0;
  const double v = strtod(a->value, &end);
  if (errno != 0 || end == a->value || *end != '\0' || !isfinite(v)) {
    cli_error("%s expects a finite number, got '%s'", opt, a->value);
    a->bad = 1;
  } else if (v < lo || v > hi) {
    cli_error("%s (%g) must be in [%g, %g]", opt, v, lo, hi);
    a->bad = 1;
  } else {
    *out = v;
  }
}

void cli_parse_u64(cli_args *a, const char *opt, unsigned long long *out) {
  if (!a->value) return;
  char *end = NULL;
  errno = 0;
  const unsigned long long v = strtoull(a->value, &end, 10);
  if (end == a->value || *end != '\0' || errno == ERANGE || strchr(a->value, '-')) {
    cli_error("%s (%s) must be an integer in [0, %llu]", opt, a->value, ULLONG_MAX);
    a->bad = 1;
  } else {
    *out = v;
  }
}

static void cli_parse_size_min(cli_args *a, const char *opt, size_t min_bytes, size_t *out) {
  if (!a->value) return;
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("out of memory");
    a->bad = 1;
    return;
  }
  if (moe_size_parse_min(ctx, a->value, min_bytes, out) != MOE_STATUS_OK) {
    cli_error("%s: %s", opt, moe_ctx_error(ctx));
    a->bad = 1;
  }
  moe_ctx_destroy(ctx);
}

void cli_parse_size(cli_args *a, const char *opt, size_t *out) {
  cli_parse_size_min(a, opt, 1, out);
}

void cli_parse_size_or_zero(cli_args *a, const char *opt, size_t *out) {
  cli_parse_size_min(a, opt, 0, out);
}

// ---- atomic output files ---------------------------------------------------------

int cli_out_open(cli_out *o, const char *path) {
  o->f = NULL;
  o->path = path;
  if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp", path) >= (int)sizeof o->tmp) {
    cli_error("output path '%s' is too long", path);
    return CLI_FAILED;
  }
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {  // caught before any work, not at the end
    cli_error("output '%s' is a directory: give a file path", path);
    return CLI_USAGE;
  }
  o->f = fopen(o->tmp, "w");
  if (!o->f) {
    cli_error("cannot write '%s': %s", o->tmp, strerror(errno));
    return CLI_USAGE;
  }
  return CLI_OK;
}

int cli_out_commit(cli_out *o) {
  const int bad = ferror(o->f);
  const int closed = fclose(o->f);
  o->f = NULL;
  if (closed != 0 || bad || rename(o->tmp, o->path) != 0) {
    cli_error("cannot write '%s'", o->path);
    remove(o->tmp);
    return CLI_FAILED;
  }
  return CLI_OK;
}

void cli_out_abort(cli_out *o) {
  if (!o->f) return;
  fclose(o->f);
  o->f = NULL;
  remove(o->tmp);
}

void cli_silence_begin(int on, int saved[2]) {
  saved[0] = saved[1] = -1;
  if (!on) return;
  fflush(stdout);
  fflush(stderr);
  const int null = open("/dev/null", O_WRONLY);
  for (int fd = 0; fd < 2 && null >= 0; fd++) {
    saved[fd] = dup(fd + 1);
    if (saved[fd] >= 0) dup2(null, fd + 1);
  }
  if (null >= 0) close(null);
}

void cli_silence_end(int saved[2]) {
  fflush(stdout);
  fflush(stderr);
  for (int fd = 0; fd < 2; fd++) {
    if (saved[fd] < 0) continue;
    dup2(saved[fd], fd + 1);
    close(saved[fd]);
    saved[fd] = -1;
  }
}

int cli_layer_shape_opt(cli_args *a, moe_layer_config *cfg, unsigned *set) {
  if (cli_opt(a, "--tokens")) {
    cli_parse_int(a, "--tokens", 1, MOE_MAX_TOKENS, &cfg->tokens);
    *set |= CLI_LAYER_TOKENS;
  } else if (cli_opt(a, "--model")) {
    cli_parse_int(a, "--model", 1, MOE_MAX_DIM, &cfg->model_dim);
    *set |= CLI_LAYER_MODEL;
  } else if (cli_opt(a, "--hidden")) {
    cli_parse_int(a, "--hidden", 1, MOE_MAX_DIM, &cfg->hidden_dim);
    *set |= CLI_LAYER_HIDDEN;
  } else if (cli_opt(a, "--experts")) {
    cli_parse_int(a, "--experts", 1, MOE_MAX_EXPERTS, &cfg->num_experts);
    *set |= CLI_LAYER_EXPERTS;
  } else if (cli_opt(a, "--topk")) {
    cli_parse_int(a, "--topk", 1, MOE_MAX_EXPERTS, &cfg->top_k);
    *set |= CLI_LAYER_TOPK;
  } else if (cli_opt(a, "--capacity-factor")) {
    cli_parse_double(a, "--capacity-factor", -1e6, 1e6, &cfg->capacity_factor);
    *set |= CLI_LAYER_CAPACITY;
  } else {
    return 0;
  }
  return 1;
}

int cli_layer_config_opt(cli_args *a, moe_layer_config *cfg, unsigned *set) {
  const int act = cli_opt(a, "--act");
  if (!act && cli_flag(a, "--renormalize")) {
    cfg->renormalize = 1;
    *set |= CLI_LAYER_RENORM;
    return 1;
  }
  if (!act && !cli_opt(a, "--config")) return 0;
  *set |= act ? CLI_LAYER_ACT : CLI_LAYER_CONFIG;
  if (!a->value) return 1;  // cli_opt reported the missing value
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("out of memory");
    a->bad = 1;
    return 1;
  }
  if (act && moe_activation_parse(ctx, a->value, &cfg->act) != MOE_STATUS_OK) {
    cli_error("--act: %s", moe_ctx_error(ctx));
    a->bad = 1;
  } else if (!act && moe_layer_config_load(ctx, a->value, cfg) != MOE_STATUS_OK) {
    cli_error("--config %s: %s", a->value, moe_ctx_error(ctx));
    a->bad = 1;
  }
  moe_ctx_destroy(ctx);
  return 1;
}

int cli_hang_timeout_opt(cli_args *a, double *seconds) {
  if (!cli_opt(a, "--hang-timeout")) return 0;
  cli_parse_double(a, "--hang-timeout", 0, CLI_HANG_TIMEOUT_MAX, seconds);
  return 1;
}

// ---- the memory bound of one-process commands ----------------------------------

int cli_memory_check(moe_ctx *ctx, moe_memory_need *need, size_t max_memory, const char *hint) {
  if (moe_memory_check_process(ctx, need, max_memory, hint) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  return CLI_OK;
}
