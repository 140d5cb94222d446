// Tests of core/: status strings, per-context errors, logging levels, counted
// allocation, arenas and tensor tables, the Philox RNG (Random123 known-answer
// vectors and split invariance), timers, and the layer config JSON parser.
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "moe/moe.h"
#include "testutil.h"

static void test_status(void) {
  for (int s = 0; s < MOE_STATUS_COUNT_; s++) {
    const char *txt = moe_status_str((moe_status)s);
    TU_CHECK(txt && strlen(txt) > 0 && strcmp(txt, "unknown status") != 0, "status %d has no name",
             s);
  }
  TU_CHECK(strcmp(moe_status_str(MOE_STATUS_INVALID_ARG), "invalid argument") == 0,
           "INVALID_ARG name");
  TU_CHECK(strcmp(moe_status_str((moe_status)999), "unknown status") == 0, "unknown code");
}

static moe_status fails_with_code(moe_ctx *ctx, int v) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, v > 3, MOE_STATUS_INVALID_ARG, "value (%d) must be in [0, 3]", v);
done:
  return st;
}

static moe_status propagates(moe_ctx *ctx, int v, int *reached) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(fails_with_code(ctx, v));
  *reached = 1;
done:
  return st;
}

static void test_ctx_errors(void) {
  moe_ctx *ctx = NULL;
  TU_CHECK(moe_ctx_create(&ctx) == MOE_STATUS_OK && ctx, "ctx create");
  TU_CHECK(strcmp(moe_ctx_error(ctx), "") == 0, "fresh ctx has no error");
  int reached = 0;
  TU_CHECK(propagates(ctx, 7, &reached) == MOE_STATUS_INVALID_ARG, "MOE_TRY propagates");
  TU_CHECK(!reached, "MOE_TRY stops at the failure");
  TU_CHECK(strcmp(moe_ctx_error(ctx), "value (7) must be in [0, 3]") == 0, "message: %s",
           moe_ctx_error(ctx));
  TU_CHECK(strstr(moe_ctx_error_where(ctx), "test_core.c:") != NULL, "where: %s",
           moe_ctx_error_where(ctx));
  TU_CHECK(moe_ctx_status(ctx) == MOE_STATUS_INVALID_ARG, "status kept");
  TU_CHECK(propagates(ctx, 1, &reached) == MOE_STATUS_OK && reached, "success path");
  moe_ctx_clear_error(ctx);
  TU_CHECK(moe_ctx_status(ctx) == MOE_STATUS_OK && moe_ctx_error(ctx)[0] == '\0', "clear");
  // NULL ctx: error still returned.
  TU_CHECK(fails_with_code(NULL, 9) == MOE_STATUS_INVALID_ARG, "NULL ctx");
  moe_ctx_destroy(ctx);
  moe_ctx_destroy(NULL);
}

static void test_log_levels(void) {
  moe_log_level lv;
  TU_CHECK(moe_log_level_parse("debug", &lv) == MOE_STATUS_OK && lv == MOE_LOG_DEBUG, "debug");
  TU_CHECK(moe_log_level_parse("0", &lv) == MOE_STATUS_OK && lv == MOE_LOG_ERROR, "0");
  TU_CHECK(moe_log_level_parse("loud", &lv) == MOE_STATUS_INVALID_ARG, "bad level rejected");
  const moe_log_level old = moe_log_get_level();
  moe_log_set_level(MOE_LOG_TRACE);
  TU_CHECK(moe_log_get_level() == MOE_LOG_TRACE, "set level");
  moe_log_set_level(old);
}

static void test_memory(void) {
  const uint64_t before = moe_alloc_count();
  void *p = moe_malloc(100);
  TU_CHECK(p && ((uintptr_t)p % 64) == 0, "moe_malloc aligned");
  TU_CHECK(moe_alloc_count() == before + 1, "allocation counted");
  moe_free(p);
  moe_free(NULL);
  TU_CHECK(moe_malloc(0) == NULL, "zero-byte malloc is NULL");
  TU_CHECK(moe_calloc(SIZE_MAX / 2, 4) == NULL, "calloc overflow is NULL");

  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_arena arena;
  TU_CHECK(moe_arena_init(ctx, &arena, 1000) == MOE_STATUS_OK, "arena init");
  float *a = NULL, *b = NULL, *c = NULL;
  const moe_tensor_spec specs[] = {{"a", 10, &a}, {"b", 0, &b}, {"c", 100, &c}};
  TU_CHECK(moe_tensor_table_bytes(specs, 3) == 64 + 0 + 448, "table bytes %zu",
           moe_tensor_table_bytes(specs, 3));
  TU_CHECK(moe_tensor_table_carve(ctx, &arena, specs, 3) == MOE_STATUS_OK, "carve");
  TU_CHECK(a && !b && c && (uintptr_t)c % 64 == 0 && (char *)c >= (char *)a + 40, "carved");
  TU_CHECK(c[99] == 0.0f, "arena memory zeroed");
  float *big = NULL;
  const moe_tensor_spec too_big[] = {{"too_big", 1000, &big}};
  TU_CHECK(moe_tensor_table_carve(ctx, &arena, too_big, 1) == MOE_STATUS_OUT_OF_MEMORY,
           "full arena fails");
  TU_CHECK(strstr(moe_ctx_error(ctx), "too_big") != NULL, "error names the tensor: %s",
           moe_ctx_error(ctx));
  moe_arena_reset(&arena);
  TU_CHECK(arena.used == 0 && moe_arena_alloc(&arena, 960) != NULL, "reset reuses");
  moe_arena_free(&arena);
  moe_arena_free(&arena);  // second free is a no-op on a zeroed arena
  moe_ctx_destroy(ctx);
}

static void test_rng(void) {
  // Known-answer vectors of Random123 (kat_vectors, philox4x32 with 10 rounds).
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
       0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
       0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    moe_philox4x32_10(kat[i], kat[i] + 4, out);
    TU_CHECK(memcmp(out, kat[i] + 6, sizeof out) == 0, "philox KAT %d: got %08x %08x %08x %08x", i,
             out[0], out[1], out[2], out[3]);
  }
  // Value i of a stream depends only on (seed, stream, i): a fill split in two
  // parts equals one fill; another stream or seed differs.
  float whole[1001], part[1001], other[1001];
  moe_rng r;
  moe_rng_init(&r, 42, 3);
  moe_rng_fill_uniform(&r, whole, 1001, -2.0f, 2.0f);
  moe_rng_init(&r, 42, 3);
  moe_rng_fill_uniform(&r, part, 333, -2.0f, 2.0f);
  moe_rng_fill_uniform(&r, part + 333, 668, -2.0f, 2.0f);
  TU_CHECK(memcmp(whole, part, sizeof whole) == 0, "split fill equals one fill");
  moe_rng_init(&r, 42, 4);
  moe_rng_fill_uniform(&r, other, 1001, -2.0f, 2.0f);
  TU_CHECK(memcmp(whole, other, sizeof whole) != 0, "streams differ");
  double mean = 0.0, lo = 1e9, hi = -1e9;
  for (int i = 0; i < 1001; i++) {
    mean += whole[i];
    lo = fmin(lo, whole[i]);
    hi = fmax(hi, whole[i]);
  }
  mean /= 1001;
  TU_CHECK(fabs(mean) < 0.15 && lo >= -2.0 && hi < 2.0 && hi - lo > 3.8,
           "uniform range/mean: mean %g lo %g hi %g", mean, lo, hi);
  // Normals: mean ~0, variance ~1 over 20000 draws.
  double s1 = 0.0, s2 = 0.0;
  moe_rng_init(&r, 9, 0);
  for (int i = 0; i < 20000; i++) {
    const double v = moe_rng_normal(&r);
    s1 += v;
    s2 += v * v;
  }
  s1 /= 20000;
  s2 = s2 / 20000 - s1 * s1;
  TU_CHECK(fabs(s1) < 0.03 && fabs(s2 - 1.0) < 0.05, "normal moments: mean %g var %g", s1, s2);
  // The first uniform of (seed 0, stream 0) is lane 0 of the all-zero KAT.
  moe_rng_init(&r, 0, 0);
  TU_CHECK(moe_rng_u32(&r) == 0x6627e8d5u, "stream maps to the Philox counter");
}

static void test_timer(void) {
  const uint64_t a = moe_time_ns();
  volatile double sink = 0.0;
  for (int i = 0; i < 100000; i++) sink = sink + i;
  const uint64_t b = moe_time_ns();
  TU_CHECK(sink > 0.0, "busy loop ran");
  TU_CHECK(b >= a, "monotonic");
  TU_CHECK(moe_time_ms_since(a) >= 0.0, "elapsed non-negative");
  float v[4] = {1.0f, 2.0f, NAN, 3.0f};
  TU_CHECK(moe_find_nonfinite(v, 4) == 2 && moe_find_nonfinite(v, 2) == -1, "nonfinite");
}

// Field-by-field: the struct has padding, which memcmp would compare too.
static int config_equal(const moe_layer_config *a, const moe_layer_config *b) {
  return a->tokens == b->tokens && a->model_dim == b->model_dim && a->hidden_dim == b->hidden_dim &&
         a->num_experts == b->num_experts && a->top_k == b->top_k &&
         a->capacity_factor == b->capacity_factor && a->act == b->act &&
         a->renormalize == b->renormalize && a->aux_loss_coef == b->aux_loss_coef &&
         a->z_loss_coef == b->z_loss_coef && a->check_finite == b->check_finite;
}

static void test_config_json(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  TU_CHECK(moe_layer_config_validate(ctx, &cfg) == MOE_STATUS_OK, "defaults valid");
  TU_CHECK(moe_layer_config_from_json(ctx,
                                      "{\"tokens\": 64, \"num_experts\": 4, \"top_k\": 1, "
                                      "\"activation\": \"relu\", \"renormalize\": true, "
                                      "\"capacity_factor\": 0}",
                                      &cfg) == MOE_STATUS_OK,
           "parse: %s", moe_ctx_error(ctx));
  TU_CHECK(cfg.tokens == 64 && cfg.num_experts == 4 && cfg.top_k == 1 && cfg.act == MOE_ACT_RELU &&
               cfg.renormalize == 1 && cfg.capacity_factor == 0.0 && cfg.model_dim == 256,
           "parsed values");
  const moe_layer_config before = cfg;
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"tokens\": 8, \"bogus\": 1}", &cfg) ==
               MOE_STATUS_INVALID_ARG,
           "unknown key rejected");
  TU_CHECK(strstr(moe_ctx_error(ctx), "bogus") != NULL, "message names the key");
  TU_CHECK(config_equal(&cfg, &before), "cfg unchanged on error");
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"tokens\": 8.5}", &cfg) == MOE_STATUS_INVALID_ARG,
           "non-integer rejected");
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"tokens\": ", &cfg) == MOE_STATUS_BAD_FORMAT,
           "malformed rejected");
  TU_CHECK(moe_layer_config_from_json(ctx, "[1, 2]", &cfg) == MOE_STATUS_BAD_FORMAT,
           "non-object rejected");
  TU_CHECK(
      moe_layer_config_from_json(ctx, "{\"tokens\": 8} trailing", &cfg) == MOE_STATUS_BAD_FORMAT,
      "trailing text rejected");
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"tokens\": 8, \"tokens\": 9}", &cfg) ==
                   MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "'tokens' appears twice"),
           "duplicate key rejected: %s", moe_ctx_error(ctx));
  TU_CHECK(
      moe_layer_config_from_json(ctx, "{\"renormalize\": 1}", &cfg) == MOE_STATUS_INVALID_ARG &&
          strstr(moe_ctx_error(ctx), "true or false"),
      "number for a boolean rejected");
  TU_CHECK(
      moe_layer_config_from_json(ctx, "{\"aux_loss_coef\": 1e300}", &cfg) == MOE_STATUS_INVALID_ARG,
      "coefficient beyond float range rejected");
  TU_CHECK(
      moe_layer_config_from_json(ctx, "{\"activation\": \"tanh\"}", &cfg) == MOE_STATUS_INVALID_ARG,
      "unknown activation rejected");
  TU_CHECK(strstr(moe_ctx_error(ctx), "gelu, relu") != NULL, "lists valid activations");
  // Round trip through JSON.
  char buf[1024];
  TU_CHECK(moe_layer_config_to_json(ctx, &cfg, buf, sizeof buf) == MOE_STATUS_OK, "to json");
  moe_layer_config back;
  moe_layer_config_default(&back);
  TU_CHECK(
      moe_layer_config_from_json(ctx, buf, &back) == MOE_STATUS_OK && config_equal(&back, &cfg),
      "JSON round trip: %s", buf);
  TU_CHECK(moe_layer_config_to_json(ctx, &cfg, buf, 10) == MOE_STATUS_INVALID_ARG,
           "small buffer rejected");
  // A NUL inside a string would silently cut it ("ffn\u0000x" read as "ffn");
  // an escaped backslash before "u0000" is ordinary text.
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"expert\": \"ffn\\u0000x\"}", &back) ==
                   MOE_STATUS_BAD_FORMAT &&
               strstr(moe_ctx_error(ctx), "NUL"),
           "a NUL in a string: %s", moe_ctx_error(ctx));
  TU_CHECK(
      moe_layer_config_from_json(ctx, "{\"expert\": \"ffn\\\\u0000x\"}", &back) == MOE_STATUS_OK &&
          strcmp(back.expert, "ffn\\u0000x") == 0,
      "an escaped backslash is not a NUL: '%s'", back.expert);
  // An integer beyond int: the range in the message, the value as written.
  TU_CHECK(moe_layer_config_from_json(ctx, "{\"tokens\": 4294967296}", &back) ==
                   MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "(4294967296) is out of range") &&
               strstr(moe_ctx_error(ctx), "2147483647"),
           "a too-large integer: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_layer_config_load(ctx, "/nonexistent/cfg.json", &cfg) == MOE_STATUS_IO &&
               strstr(moe_ctx_error(ctx), "/nonexistent/cfg.json") != NULL,
           "missing file names the path");
  // Capacity formula: ceil(f*K*T/E).
  moe_layer_config c2;
  moe_layer_config_default(&c2);
  c2.capacity_factor = 1.2;
  c2.top_k = 2;
  c2.num_experts = 8;
  TU_CHECK(moe_layer_capacity(&c2, 4096) == 1229, "C(4096) = %d", moe_layer_capacity(&c2, 4096));
  TU_CHECK(moe_layer_capacity(&c2, 0) == 0, "C(0) = 0");
  c2.capacity_factor = 0.0;
  TU_CHECK(moe_layer_capacity(&c2, 100) == -1, "dropless");
  moe_ctx_destroy(ctx);
}

// A shell in a group of its own with two children (sleeps): started, then
// stopped with moe_proc_tree_stop; the group must be empty afterwards.
static pid_t start_tree(const char *script) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", script, (char *)NULL);
    _exit(127);
  }
  if (pid > 0) setpgid(pid, pid);
  const struct timespec ts = {0, 300 * 1000000L};  // the children started
  nanosleep(&ts, NULL);
  return pid;
}

// Processes of group g that still run (not zombies: an orphan's zombie stays
// until the machine's init reaps it, which some containers' init never does).
static int group_running(pid_t g) {
  DIR *d = opendir("/proc");
  int n = 0;
  struct dirent *de;
  while (d && (de = readdir(d)) != NULL) {
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
    FILE *f = de->d_name[0] >= '1' && de->d_name[0] <= '9' ? fopen(path, "r") : NULL;
    if (!f) continue;
    const size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    const char *rp = strrchr(buf, ')');
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (rp && sscanf(rp + 1, " %c %ld %ld", &state, &ppid, &pgrp) == 3 && pgrp == (long)g &&
        state != 'Z' && state != 'X')
      n++;
  }
  if (d) closedir(d);
  return n;
}

static void test_proc_tree_stop(void) {
  pid_t pid = start_tree("sleep 30 & sleep 30 & wait");
  TU_CHECK(pid > 0 && group_running(pid) == 3, "the tree did not start (%d running)",
           pid > 0 ? group_running(pid) : -1);
  if (pid <= 0) return;
  int how = moe_proc_tree_stop((int)pid, 10, 5);
  TU_CHECK(how == 0 && group_running(pid) == 0, "SIGTERM: returned %d, %d still run", how,
           group_running(pid));
  // children that ignore SIGTERM: SIGKILL after term_s
  pid = start_tree("trap '' TERM; sleep 30 & sleep 30 & wait; sleep 30");
  TU_CHECK(pid > 0 && group_running(pid) == 3, "the tree did not start (%d running)",
           pid > 0 ? group_running(pid) : -1);
  if (pid <= 0) return;
  how = moe_proc_tree_stop((int)pid, 0.5, 5);
  TU_CHECK(how == 1 && group_running(pid) == 0, "SIGKILL: returned %d, %d still run", how,
           group_running(pid));
  TU_CHECK(moe_proc_tree_stop(0, 1, 1) == 0 && moe_proc_tree_stop(-3, 1, 1) == 0,
           "no process: nothing to stop");
}

int main(void) {
  test_status();
  test_ctx_errors();
  test_log_levels();
  test_memory();
  test_rng();
  test_timer();
  test_config_json();
  test_proc_tree_stop();
  return tu_finish("test_core");
}
