// Measurements in one process (include/moe/measure.h): the single-process
// layer's forward + backward, a compressor's throughput and error, and the
// SGEMM peak. The benchmarks print these; nothing here prints.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "measure_internal.h"
#include "moe/kernels.h"
#include "moe/measure.h"

moe_measure_config moe_measure_config_default(void) {
  moe_measure_config c;
  memset(&c, 0, sizeof c);
  c.iters = 5;
  c.warmup = 1;
  c.seed = 1;
  return c;
}

moe_status moe_measure_skew_bias(moe_ctx *ctx, const moe_layer_config *cfg,
                                 const moe_measure_config *mc, const float *wg, float *bias,
                                 double *tv) {
  moe_status st = MOE_STATUS_OK;
  float *x = NULL;
  double *shares = NULL;
  *tv = 0.0;
  if (mc->skew.kind == MOE_SKEW_NONE) goto done;
  const size_t tm = (size_t)cfg->tokens * (size_t)cfg->model_dim;
  x = moe_malloc((tm ? tm : 1) * sizeof(float));
  shares = moe_malloc((size_t)cfg->num_experts * sizeof(double));
  MOE_FAIL_IF(ctx, !x || !shares, MOE_STATUS_OUT_OF_MEMORY,
              "measure: cannot allocate the skew fit's tokens (%zu floats)", tm);
  moe_rng rng;
  moe_rng_init(&rng, mc->seed, 100);
  moe_rng_fill_uniform(&rng, x, tm, -1.0f, 1.0f);
  MOE_TRY(moe_skew_shares(ctx, &mc->skew, cfg->num_experts, cfg->top_k, shares));
  moe_router_fit fit = {NULL, 0.0, 0};
  MOE_TRY(moe_router_bias_fit(ctx, cfg, wg, x, cfg->tokens, shares, bias, &fit));
  *tv = fit.total_variation;
done:
  moe_free(x);
  moe_free(shares);
  return st;
}

double moe_measure_skew_bytes(const moe_layer_config *cfg, const moe_measure_config *mc) {
  if (mc->skew.kind == MOE_SKEW_NONE) return 0.0;
  const size_t T = (size_t)cfg->tokens, M = (size_t)cfg->model_dim, E = (size_t)cfg->num_experts;
  // x (T, M) and the shares, then the fit's logits (T, E) and its small tables
  const size_t tm = T * M > 0 ? T * M : 1;
  return (double)(moe_align64(tm * 4) + moe_align64(T * E * 4) + 6 * moe_align64(E * 8 + 64));
}

// Per iteration: the 15 quantities of moe_measure_single_result, in order.
enum { N_SINGLE = 15 };

moe_status moe_measure_layer_single_memory(moe_ctx *ctx, const moe_layer_config *cfg,
                                           const moe_measure_config *mc, int peak_n,
                                           moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cfg || !mc || !out, MOE_STATUS_INVALID_ARG, "cfg, mc and out must be given");
  MOE_TRY(moe_layer_memory(ctx, cfg, out));
  {
    // moe_measure_layer_single, below: x, y, dy, dx (T, M); the samples and a column
    const double tm = (double)moe_align64((size_t)cfg->tokens * (size_t)cfg->model_dim * 4);
    out->bytes[MOE_MEM_ACTIVATIONS] += 4 * tm + moe_measure_skew_bytes(cfg, mc);
    out->bytes[MOE_MEM_WORKSPACE] +=
        (double)(moe_align64((size_t)(mc->iters > 0 ? mc->iters : 1) * N_SINGLE * sizeof(double)) +
                 moe_align64((size_t)(mc->iters > 0 ? mc->iters : 1) * sizeof(double)));
    const double peak = 3.0 * (double)moe_align64((size_t)peak_n * (size_t)peak_n * 4);
    if (peak_n > 0 && peak > moe_memory_need_total(out)) {
      memset(out, 0, sizeof *out);
      out->bytes[MOE_MEM_ACTIVATIONS] = peak;
    }
  }
done:
  return st;
}

moe_status moe_measure_layer_single(moe_ctx *ctx, const moe_layer_config *cfg,
                                    const moe_measure_config *mc, moe_measure_single_result *out) {
  moe_status st = MOE_STATUS_OK;
  moe_layer *layer = NULL;
  float *x = NULL, *y = NULL, *dy = NULL, *dx = NULL;
  double *samples = NULL, *col = NULL;
  MOE_FAIL_IF(ctx, !cfg || !mc || !out, MOE_STATUS_INVALID_ARG, "cfg, mc and out must be given");
  MOE_FAIL_IF(ctx, mc->iters < 1 || mc->warmup < 0, MOE_STATUS_INVALID_ARG,
              "measure: iters (%d) must be >= 1 and warmup (%d) >= 0", mc->iters, mc->warmup);
  memset(out, 0, sizeof *out);
  MOE_TRY(moe_layer_create(ctx, cfg, &layer));
  moe_layer_init_params(layer, mc->seed);
  {
    const moe_layer_tensors t = moe_layer_get_tensors(layer);
    MOE_TRY(moe_measure_skew_bias(ctx, cfg, mc, t.wg, t.router_bias, &out->skew_tv));
  }
  const size_t tm = (size_t)cfg->tokens * (size_t)cfg->model_dim;
  x = moe_malloc(tm * sizeof(float));
  y = moe_malloc(tm * sizeof(float));
  dy = moe_malloc(tm * sizeof(float));
  dx = moe_malloc(tm * sizeof(float));
  samples = moe_calloc((size_t)mc->iters * N_SINGLE, sizeof(double));
  col = moe_calloc((size_t)mc->iters, sizeof(double));
  MOE_FAIL_IF(ctx, !x || !y || !dy || !dx || !samples || !col, MOE_STATUS_OUT_OF_MEMORY,
              "measure: cannot allocate the layer's inputs (%zu floats each)", tm);
  moe_rng rng;
  moe_rng_init(&rng, mc->seed, 100);
  moe_rng_fill_uniform(&rng, x, tm, -1.0f, 1.0f);
  moe_rng_fill_uniform(&rng, dy, tm, -1.0f, 1.0f);
  for (int it = 0; it < mc->warmup + mc->iters; it++) {
    const uint64_t a0 = moe_alloc_count();
    memset(dx, 0, tm * sizeof(float));
    moe_layer_zero_grad(layer);
    MOE_TRY(moe_layer_forward(layer, x, cfg->tokens, y, &out->stats));
    MOE_TRY(moe_layer_backward(layer, dy, dx));
    if (it < mc->warmup) continue;
    out->allocs += moe_alloc_count() - a0;
    const moe_layer_timing f = moe_layer_get_forward_timing(layer);
    const moe_layer_timing b = moe_layer_get_backward_timing(layer);
    double *s = samples + (size_t)(it - mc->warmup) * N_SINGLE;
    s[0] = f.total_ms;
    s[1] = b.total_ms;
    s[2] = f.total_ms + b.total_ms;
    s[3] = f.expert_gemm_ms + b.expert_gemm_ms;
    s[4] = s[3] + f.gate_gemm_ms + b.gate_gemm_ms;
    s[5] = (f.expert_flops + b.expert_flops) / (s[3] * 1e6);
    s[6] = cfg->tokens / (s[2] * 1e-3);
    s[7] = f.gate_ms;
    s[8] = f.dispatch_ms;
    s[9] = f.expert_other_ms;
    s[10] = f.combine_ms;
    s[11] = b.gate_ms;
    s[12] = b.dispatch_ms;
    s[13] = b.expert_other_ms;
    s[14] = b.combine_ms;
  }
  double med[N_SINGLE];
  for (int c = 0; c < N_SINGLE; c++) {
    for (int i = 0; i < mc->iters; i++) col[i] = samples[(size_t)i * N_SINGLE + (size_t)c];
    med[c] = moe_median(col, mc->iters);
  }
  out->fwd_ms = med[0];
  out->bwd_ms = med[1];
  out->total_ms = med[2];
  out->expert_gemm_ms = med[3];
  out->all_gemm_ms = med[4];
  out->expert_gflops = med[5];
  out->tokens_per_s = med[6];
  out->fwd_gate_ms = med[7];
  out->fwd_dispatch_ms = med[8];
  out->fwd_expert_other_ms = med[9];
  out->fwd_combine_ms = med[10];
  out->bwd_gate_ms = med[11];
  out->bwd_dispatch_ms = med[12];
  out->bwd_expert_other_ms = med[13];
  out->bwd_combine_ms = med[14];
done:
  moe_free(x);
  moe_free(y);
  moe_free(dy);
  moe_free(dx);
  moe_free(samples);
  moe_free(col);
  moe_layer_destroy(layer);
  return st;
}

moe_status moe_measure_codec_memory(moe_ctx *ctx, const moe_compressor *c, size_t rows, size_t cols,
                                    int iters, moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !c || !out || iters < 1, MOE_STATUS_INVALID_ARG,
              "measure: a compressor, out and iters >= 1 (%d) are needed", iters);
  memset(out, 0, sizeof *out);
  {
    const size_t cap = moe_compress_max_bytes(c, rows, cols);
    MOE_FAIL_IF(ctx, cap == SIZE_MAX, MOE_STATUS_INVALID_ARG,
                "measure: %zu x %zu is too large for compressor '%s'", rows, cols, c->name);
    // x (the caller's), y and the compressed buffer of moe_measure_codec, below
    const double n = (double)rows * (double)cols * sizeof(float);
    out->bytes[MOE_MEM_ACTIVATIONS] = 2 * n + (double)moe_align64(cap);
    out->bytes[MOE_MEM_WORKSPACE] = (double)moe_align64((size_t)iters * sizeof(double));
  }
done:
  return st;
}

moe_status moe_measure_codec(moe_ctx *ctx, const moe_compressor *c, const float *x, size_t rows,
                             size_t cols, int iters, moe_measure_codec_result *out) {
  moe_status st = MOE_STATUS_OK;
  float *y = NULL;
  void *buf = NULL;
  double *t = NULL;
  MOE_FAIL_IF(ctx, !c || !x || !out || iters < 1 || rows == 0 || cols == 0, MOE_STATUS_INVALID_ARG,
              "measure: a compressor, input, output, iters >= 1 (%d) and a non-empty matrix "
              "(%zu x %zu) are needed",
              iters, rows, cols);
  memset(out, 0, sizeof *out);
  const size_t n = rows * cols, cap = moe_compress_max_bytes(c, rows, cols);
  MOE_FAIL_IF(ctx, cap == SIZE_MAX, MOE_STATUS_INVALID_ARG,
              "measure: %zu x %zu is too large for compressor '%s'", rows, cols, c->name);
  y = moe_malloc(n * sizeof(float));
  buf = moe_malloc(cap);
  t = moe_malloc((size_t)iters * sizeof(double));
  MOE_FAIL_IF(ctx, !y || !buf || !t, MOE_STATUS_OUT_OF_MEMORY,
              "measure: cannot allocate the buffers of %zu x %zu floats", rows, cols);
  size_t bytes = 0;
  MOE_TRY(moe_compress(c, ctx, x, rows, cols, buf, cap, &bytes));
  for (int i = 0; i < iters; i++) {
    const uint64_t t0 = moe_time_ns();
    MOE_TRY(moe_compress(c, ctx, x, rows, cols, buf, cap, &bytes));
    t[i] = moe_time_ms_since(t0);
  }
  const double comp_ms = moe_median(t, iters);
  MOE_TRY(moe_decompress(c, ctx, buf, bytes, rows, cols, y));
  for (int i = 0; i < iters; i++) {
    const uint64_t t0 = moe_time_ns();
    MOE_TRY(moe_decompress(c, ctx, buf, bytes, rows, cols, y));
    t[i] = moe_time_ms_since(t0);
  }
  const double decomp_ms = moe_median(t, iters);
  double amax = 0.0, emax = 0.0;
  for (size_t i = 0; i < n; i++) {
    amax = fmax(amax, fabs((double)x[i]));
    emax = fmax(emax, fabs((double)y[i] - (double)x[i]));
  }
  const double in_bytes = (double)n * sizeof(float);
  out->bytes = bytes;
  out->comp_gbs = in_bytes / (comp_ms * 1e6);
  out->decomp_gbs = in_bytes / (decomp_ms * 1e6);
  out->ratio = in_bytes / (double)bytes;
  out->max_abs_err = emax;
  out->max_rel_err = amax > 0.0 ? emax / amax : emax;
done:
  moe_free(y);
  moe_free(buf);
  moe_free(t);
  return st;
}

moe_status moe_measure_sgemm_peak(moe_ctx *ctx, int n, double *gflops, double *ms_out) {
  moe_status st = MOE_STATUS_OK;
  float *a = NULL, *b = NULL, *c = NULL;
  MOE_FAIL_IF(ctx, n < 1 || n > 65536 || !gflops || !ms_out, MOE_STATUS_INVALID_ARG,
              "measure: the SGEMM size (%d) must be in [1, 65536]", n);
  const size_t nn = (size_t)n * (size_t)n;
  a = moe_malloc(nn * sizeof(float));
  b = moe_malloc(nn * sizeof(float));
  c = moe_malloc(nn * sizeof(float));
  MOE_FAIL_IF(ctx, !a || !b || !c, MOE_STATUS_OUT_OF_MEMORY,
              "measure: cannot allocate the %dx%d matrices of the SGEMM peak", n, n);
  double gf[5], ms[5];
  moe_rng rng;
  moe_rng_init(&rng, 7, 0);
  moe_rng_fill_uniform(&rng, a, nn, -1.0f, 1.0f);
  moe_rng_fill_uniform(&rng, b, nn, -1.0f, 1.0f);
  moe_gemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  for (int i = 0; i < 5; i++) {
    const uint64_t t0 = moe_time_ns();
    moe_gemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    ms[i] = moe_time_ms_since(t0);
    gf[i] = 2.0 * n * (double)n * n / (ms[i] * 1e6);
  }
  *gflops = moe_median(gf, 5);
  *ms_out = moe_median(ms, 5);
done:
  moe_free(a);
  moe_free(b);
  moe_free(c);
  return st;
}
