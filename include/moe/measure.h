// Measurement in one process (no MPI): the timing loops behind `moe bench
// layer` (one process), `moe bench compress` and the SGEMM peak, so the
// benchmarks print what the library measured and a library user can measure
// the same way. The collective measurements (layer variants over ranks, the
// all-to-alls, calibration) are in moe/measure_mpi.h.
//
// Every time is a median over the timed iterations (moe_median).
#ifndef MOE_MEASURE_H
#define MOE_MEASURE_H

#include "moe/compress.h"
#include "moe/core.h"
#include "moe/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// How to repeat a measurement (shared by every timing function here and in
// moe/measure_mpi.h).
typedef struct {
  int iters;               // timed iterations, >= 1
  int warmup;              // untimed iterations first, >= 0
  uint64_t seed;           // parameters and inputs
  const char *trace_path;  // (layer variants over ranks only) Chrome trace of the last
                           // variant's last iteration (every rank merged), or NULL
  // Expert popularity (moe_skew): a router bias fitted (moe_router_bias_fit)
  // on the tokens of input stream 100 of the seed (the single-process
  // benchmark's x, rank 0's under MPI; every rank fits the same bias) so that
  // the layer's router follows the distribution. MOE_SKEW_NONE: no bias.
  moe_skew skew;
} moe_measure_config;

// Defaults: 5 iterations after 1 warm-up, seed 1, no trace, no skew.
moe_measure_config moe_measure_config_default(void);

// ---- the single-process layer ----------------------------------------------------------

// Medians (ms) of one forward + backward of moe_layer over the iterations.
typedef struct {
  double fwd_ms, bwd_ms, total_ms;
  double expert_gemm_ms;  // the experts' GEMMs, forward + backward
  double all_gemm_ms;     // ... and the gate's
  double expert_gflops;   // the experts' GEMM rate
  double tokens_per_s;    // tokens / total
  // forward and backward phases: gate, dispatch, the experts' work besides
  // GEMMs (bias, activation), combine
  double fwd_gate_ms, fwd_dispatch_ms, fwd_expert_other_ms, fwd_combine_ms;
  double bwd_gate_ms, bwd_dispatch_ms, bwd_expert_other_ms, bwd_combine_ms;
  moe_layer_stats stats;      // routing of the last iteration
  double skew_tv;             // with a skew: total variation between the fitted and the
                              // target shares of the choices (0 without)
  unsigned long long allocs;  // libmoe allocations (moe_malloc) in the timed iterations
} moe_measure_single_result;

// Creates the layer of cfg, initialises it from mc->seed (inputs x and dy
// uniform in [-1, 1), stream 100 of the seed) and times mc->warmup + mc->iters
// forward + backward passes. INVALID_ARG for an invalid cfg or mc (the
// layer's message); OUT_OF_MEMORY.
moe_status moe_measure_layer_single(moe_ctx *ctx, const moe_layer_config *cfg,
                                    const moe_measure_config *mc, moe_measure_single_result *out);
// The bytes moe_measure_layer_single(cfg, mc) allocates at most, by category
// (include/moe/core.h): the layer (moe_layer_memory), its inputs x, dy and
// outputs y, dx (activations) and the sample tables (workspace); and, when
// peak_n > 0, the larger of that and the three peak_n^2 matrices of
// moe_measure_sgemm_peak (activations), which run after the layer is freed.
moe_status moe_measure_layer_single_memory(moe_ctx *ctx, const moe_layer_config *cfg,
                                           const moe_measure_config *mc, int peak_n,
                                           moe_memory_need *out);

// ---- compressors -------------------------------------------------------------------------

typedef struct {
  size_t bytes;        // compressed size
  double comp_gbs;     // input bytes / median compress time, GB/s
  double decomp_gbs;   // input bytes / median decompress time
  double ratio;        // input bytes / compressed bytes
  double max_abs_err;  // max |decompressed - x|
  double max_rel_err;  // max_abs_err / max |x| (max_abs_err when x is all zero)
} moe_measure_codec_result;

// Times c on x (rows, cols): one untimed round trip, then iters compressions
// and iters decompressions; the errors of the last round trip. Buffers are
// allocated here. Errors: the compressor's (a NaN for int8, say), sizes.
moe_status moe_measure_codec(moe_ctx *ctx, const moe_compressor *c, const float *x, size_t rows,
                             size_t cols, int iters, moe_measure_codec_result *out);
// The bytes a compressor benchmark of a (rows, cols) matrix needs, by
// category: the caller's input x and moe_measure_codec's output and
// compressed buffer (activations), its timings (workspace). INVALID_ARG when
// the matrix is too large for the compressor.
moe_status moe_measure_codec_memory(moe_ctx *ctx, const moe_compressor *c, size_t rows, size_t cols,
                                    int iters, moe_memory_need *out);

// ---- the machine ---------------------------------------------------------------------------

// Median GFLOP/s (and ms) of an n x n x n SGEMM (moe_gemm) over 5 runs after
// one warm-up, on the BLAS threads set (moe_blas_set_threads).
moe_status moe_measure_sgemm_peak(moe_ctx *ctx, int n, double *gflops, double *ms);

#ifdef __cplusplus
}
#endif

#endif  // MOE_MEASURE_H
