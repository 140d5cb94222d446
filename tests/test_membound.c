// The memory bound without MPI (include/moe/core.h, moe_layer_memory,
// moe_gpt_memory, moe_optim_memory_bytes, moe_measure_layer_single_memory):
// every estimate equals, byte for byte, what the objects it sizes allocate
// (moe_alloc_bytes counted around their create calls); sizes parse strictly;
// the refusal names the need by category, the limit and its source; the
// machine's available memory is read.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/measure.h"
#include "moe/model.h"
#include "testutil.h"

static moe_ctx *g_ctx;

static void test_sizes(void) {
  struct {
    const char *text;
    size_t bytes;
  } const ok[] = {{"4096", 4096},
                  {"512M", (size_t)512 << 20},
                  {"2G", (size_t)2 << 30},
                  {"2g", (size_t)2 << 30},
                  {"1.5GiB", (size_t)3 << 29},
                  {"64KB", 65536},
                  {"1T", (size_t)1 << 40},
                  {"100B", 100}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    size_t got = 0;
    const moe_status st = moe_size_parse(g_ctx, ok[i].text, &got);
    TU_CHECK(st == MOE_STATUS_OK && got == ok[i].bytes, "size '%s': status %d, %zu (want %zu)",
             ok[i].text, (int)st, got, ok[i].bytes);
  }
  const char *const bad[] = {"", "M", "-1", "2X", "0", "0.1", "2 G", "2GG", "1e30", "nan", "2Gi"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t got = 7;
    const moe_status st = moe_size_parse(g_ctx, bad[i], &got);
    TU_CHECK(st == MOE_STATUS_INVALID_ARG && got == 7, "size '%s' accepted (%zu)", bad[i], got);
    TU_CHECK(strstr(moe_ctx_error(g_ctx), "size") != NULL, "size '%s': message '%s'", bad[i],
             moe_ctx_error(g_ctx));
  }
}

// The layer's estimate against its allocation, for shapes with and without capacity.
static void test_layer(void) {
  const struct {
    int T, M, H, E, K;
    double f;
  } shapes[] = {{1, 1, 1, 1, 1, -1},
                {96, 32, 64, 4, 2, 1.0},
                {100, 24, 40, 8, 2, -1},
                {1000, 64, 96, 16, 4, 1.25},
                {513, 17, 33, 3, 3, 0.5}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    moe_layer_config c;
    moe_layer_config_default(&c);
    c.tokens = shapes[i].T;
    c.model_dim = shapes[i].M;
    c.hidden_dim = shapes[i].H;
    c.num_experts = shapes[i].E;
    c.top_k = shapes[i].K;
    c.capacity_factor = shapes[i].f;
    moe_memory_need need;
    TU_CHECK(moe_layer_memory(g_ctx, &c, &need) == MOE_STATUS_OK, "layer memory: %s",
             moe_ctx_error(g_ctx));
    const uint64_t before = moe_alloc_bytes();
    moe_layer *layer = NULL;
    TU_CHECK(moe_layer_create(g_ctx, &c, &layer) == MOE_STATUS_OK, "create: %s",
             moe_ctx_error(g_ctx));
    const double got = (double)(moe_alloc_bytes() - before);
    TU_CHECK(got == moe_memory_need_total(&need), "layer %zu: estimate %.0f bytes, allocated %.0f",
             i, moe_memory_need_total(&need), got);
    // parameters and gradients are what the layer reports
    const double pbytes = (double)moe_layer_num_params(layer) * 4;
    TU_CHECK(need.bytes[MOE_MEM_PARAMS] >= pbytes && need.bytes[MOE_MEM_PARAMS] < pbytes + 5 * 64,
             "layer %zu: params %.0f for %.0f bytes of parameters", i, need.bytes[MOE_MEM_PARAMS],
             pbytes);
    TU_CHECK(need.bytes[MOE_MEM_GRADS] == need.bytes[MOE_MEM_PARAMS], "layer %zu: grads %.0f", i,
             need.bytes[MOE_MEM_GRADS]);
    TU_CHECK(need.bytes[MOE_MEM_OPTIM] == 0 && need.bytes[MOE_MEM_A2A] == 0 && need.skew_bytes == 0,
             "layer %zu: no optimizer, all-to-all or data-dependent bytes", i);
    moe_layer_destroy(layer);
  }
  // an invalid config is refused, not estimated
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.top_k = 9;
  moe_memory_need need;
  TU_CHECK(moe_layer_memory(g_ctx, &c, &need) == MOE_STATUS_INVALID_ARG, "top_k 9 of 8 accepted");
}

// The model and AdamW against their allocation (local MoE backend).
static void test_gpt(void) {
  for (int variant = 0; variant < 3; variant++) {
    moe_gpt_config c;
    moe_gpt_config_default(&c);
    c.n_layer = 2 + variant;
    c.d_model = 32;
    c.n_head = 2;
    c.seq_len = 16;
    c.dense_hidden = 48;
    c.moe.num_experts = 4;
    c.moe.hidden_dim = 24;
    c.moe_every = variant;  // 0: dense only; 1: every block; 2: every other
    const int B = 3;
    moe_memory_need need;
    TU_CHECK(moe_gpt_memory(g_ctx, &c, B, 1, NULL, 1, &need) == MOE_STATUS_OK, "gpt memory: %s",
             moe_ctx_error(g_ctx));
    const uint64_t before = moe_alloc_bytes();
    moe_gpt *m = NULL;
    moe_optim *o = NULL;
    moe_optim_config oc;
    moe_optim_config_default(&oc);
    TU_CHECK(moe_gpt_create(g_ctx, &c, B, NULL, NULL, &m) == MOE_STATUS_OK, "create: %s",
             moe_ctx_error(g_ctx));
    const uint64_t model = moe_alloc_bytes() - before;
    TU_CHECK(moe_optim_create(g_ctx, m, &oc, &o) == MOE_STATUS_OK, "optim: %s",
             moe_ctx_error(g_ctx));
    const double got = (double)(moe_alloc_bytes() - before);
    TU_CHECK(got == moe_memory_need_total(&need), "gpt %d: estimate %.0f, allocated %.0f", variant,
             moe_memory_need_total(&need), got);
    TU_CHECK(need.bytes[MOE_MEM_OPTIM] == got - (double)model,
             "gpt %d: optimizer estimate %.0f, allocated %.0f", variant, need.bytes[MOE_MEM_OPTIM],
             got - (double)model);
    // AdamW holds 2 floats per parameter element, params 1 (padding aside)
    const double elems = (double)moe_gpt_total_elements(m);
    TU_CHECK(need.bytes[MOE_MEM_OPTIM] >= 8 * elems && need.bytes[MOE_MEM_PARAMS] >= 4 * elems,
             "gpt %d: %.0f elements, params %.0f, optim %.0f bytes", variant, elems,
             need.bytes[MOE_MEM_PARAMS], need.bytes[MOE_MEM_OPTIM]);
    moe_optim_destroy(o);
    moe_gpt_destroy(m);
  }
}

// The single-process benchmark's harness: its estimate bounds what it allocates.
static void test_measure_single(void) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.tokens = 64;
  c.model_dim = 32;
  c.hidden_dim = 48;
  c.num_experts = 4;
  moe_measure_config mc = moe_measure_config_default();
  mc.iters = 2;
  moe_memory_need need;
  TU_CHECK(moe_measure_layer_single_memory(g_ctx, &c, &mc, 0, &need) == MOE_STATUS_OK, "%s",
           moe_ctx_error(g_ctx));
  const uint64_t before = moe_alloc_bytes();
  moe_measure_single_result r;
  TU_CHECK(moe_measure_layer_single(g_ctx, &c, &mc, &r) == MOE_STATUS_OK, "%s",
           moe_ctx_error(g_ctx));
  const double got = (double)(moe_alloc_bytes() - before);
  TU_CHECK(got == moe_memory_need_total(&need), "measure single: estimate %.0f, allocated %.0f",
           moe_memory_need_total(&need), got);
  // with the SGEMM peak's matrices larger than the layer run, the peak phase is the need
  TU_CHECK(moe_measure_layer_single_memory(g_ctx, &c, &mc, 512, &need) == MOE_STATUS_OK, "%s",
           moe_ctx_error(g_ctx));
  TU_CHECK(moe_memory_need_total(&need) == 3.0 * 512 * 512 * 4, "peak phase: %.0f",
           moe_memory_need_total(&need));
}

static void test_check(void) {
  moe_memory_need n;
  memset(&n, 0, sizeof n);
  n.bytes[MOE_MEM_PARAMS] = 3.0 * (1 << 30);
  n.bytes[MOE_MEM_ACTIVATIONS] = 1.5 * (1 << 30);
  n.bytes[MOE_MEM_BASELINE] = 20.0 * (1 << 20);
  TU_CHECK(moe_memory_check(g_ctx, &n, (size_t)5 << 30, "test", "rank 0", NULL) == MOE_STATUS_OK,
           "4.52 GiB within 5 GiB refused: %s", moe_ctx_error(g_ctx));
  const moe_status st =
      moe_memory_check(g_ctx, &n, (size_t)4 << 30, "--max-memory", "rank 3 of 4", "change X");
  const char *msg = moe_ctx_error(g_ctx);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "4.52 GiB within 4 GiB accepted");
  const char *want[] = {"rank 3 of 4",       "params 3.00 GiB", "activations 1.50 GiB",
                        "baseline 20.0 MiB", "= 4.52 GiB",      "limit is 4.00 GiB",
                        "--max-memory",      "change X"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    TU_CHECK(strstr(msg, want[i]) != NULL, "message lacks '%s': %s", want[i], msg);
  TU_CHECK(strstr(msg, "grads") == NULL, "message names an empty category: %s", msg);
  // huge needs do not wrap (double), 1 TiB formats
  n.bytes[MOE_MEM_GRADS] = 1e30;
  TU_CHECK(moe_memory_check(g_ctx, &n, SIZE_MAX, "x", NULL, NULL) == MOE_STATUS_INVALID_ARG,
           "1e30 bytes within SIZE_MAX accepted");
  // one process: the baseline is set, the limit named
  memset(&n, 0, sizeof n);
  n.bytes[MOE_MEM_PARAMS] = 1 << 20;
  TU_CHECK(moe_memory_check_process(g_ctx, &n, (size_t)1 << 40, NULL) == MOE_STATUS_OK,
           "1 MiB + the baseline refused under 1 TiB: %s", moe_ctx_error(g_ctx));
  TU_CHECK(n.bytes[MOE_MEM_BASELINE] >= (double)MOE_MEM_BLAS_BYTES,
           "baseline %.0f not set (at least the BLAS allowance %zu)", n.bytes[MOE_MEM_BASELINE],
           MOE_MEM_BLAS_BYTES);
  TU_CHECK(
      moe_memory_check_process(g_ctx, &n, (size_t)4 << 20, "shrink it") == MOE_STATUS_INVALID_ARG &&
          strstr(moe_ctx_error(g_ctx), "this process needs more memory") &&
          strstr(moe_ctx_error(g_ctx), "limit is 4.00 MiB (--max-memory); shrink it"),
      "1 MiB + the baseline under 4 MiB: %s", moe_ctx_error(g_ctx));
  size_t avail = 0;
  if (moe_memory_available(g_ctx, &avail, NULL, 0) == MOE_STATUS_OK) {  // no limit: what is free
    n.bytes[MOE_MEM_PARAMS] = 2.0 * (double)avail;
    TU_CHECK(moe_memory_check_process(g_ctx, &n, 0, NULL) == MOE_STATUS_INVALID_ARG &&
                 (strstr(moe_ctx_error(g_ctx), "(MemAvailable)") ||
                  strstr(moe_ctx_error(g_ctx), "(cgroup memory.max)")),
             "twice the available memory: %s", moe_ctx_error(g_ctx));
  }
  char b[32];
  moe_format_bytes((double)((size_t)1 << 40), b, sizeof b);
  TU_CHECK(strcmp(b, "1.00 TiB") == 0, "1 TiB formats as '%s'", b);
}

static void test_machine(void) {
  size_t avail = 0;
  char src[64] = "";
  TU_CHECK(moe_memory_available(g_ctx, &avail, src, sizeof src) == MOE_STATUS_OK, "%s",
           moe_ctx_error(g_ctx));
  TU_CHECK(avail > ((size_t)16 << 20), "available memory %zu bytes (%s)", avail, src);
  TU_CHECK(strcmp(src, "MemAvailable") == 0 || strcmp(src, "cgroup memory.max") == 0, "source '%s'",
           src);
  const size_t rss = moe_rss_bytes(), peak = moe_peak_rss_bytes();
  TU_CHECK(rss > 0 && peak >= rss, "RSS %zu, peak %zu", rss, peak);
  TU_CHECK(moe_memory_baseline_bytes() >= rss + MOE_MEM_BLAS_BYTES, "baseline below RSS + BLAS");
}

int main(void) {
  if (moe_ctx_create(&g_ctx) != MOE_STATUS_OK) return 1;
  test_sizes();
  test_layer();
  test_gpt();
  test_measure_single();
  test_check();
  test_machine();
  moe_ctx_destroy(g_ctx);
  return tu_finish("test_membound");
}
