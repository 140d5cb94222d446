// moe bench layer: times one MoE layer's forward and backward in one process,
// with the GFLOP/s of its expert GEMMs next to the single-thread SGEMM peak that
// the same binary measures, and writes the numbers as JSON on request.
// A benchmark, not a test: it reports; the correctness tests live in tests/.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moe/measure.h"

typedef struct {
  moe_layer_config cfg;
  int iters, warmup, threads, peak_n;
  const char *backend;  // compute backend (moe_backend_find)
  int precision;        // moe_precision
  unsigned long long seed;
  const char *json_path;
  size_t max_memory;  // --max-memory, 0: the available memory
  moe_skew skew;      // --skew
} bench_opts;

void cli_bench_layer_usage(FILE *f) {
  fprintf(f,
          "usage: moe bench layer [options]\n"
          "       mpirun -n P moe bench layer [distributed options]\n"
          "\n"
          "Times one MoE layer (gate, top-k, dispatch, expert FFNs, combine) forward and\n"
          "backward in one process, and measures the single-thread SGEMM peak of this\n"
          "machine with the same BLAS. Prints a table of medians; --json writes them.\n"
          "The options of the distributed benchmark (below) switch to it.\n"
          "\n"
          "options (default in brackets):\n"
          "  --tokens T             tokens per batch [4096]\n"
          "  --model M              model dimension [1024]\n"
          "  --hidden H             expert hidden dimension [2048]\n"
          "  --experts E            number of experts [8]\n"
          "  --topk K               experts per token, 1..E [2]\n"
          "  --capacity-factor F    capacity C = ceil(F*K*T/E); F <= 0 is dropless [1.2]\n"
          "  --act gelu|relu        expert activation [gelu]\n"
          "  --renormalize          renormalise the kept top-k gate weights\n"
          "  --config FILE          layer config JSON (keys of moe_layer_config_from_json);\n"
          "                         options after it override it\n"
          "  --iters N              timed iterations, 1..10000 [5]\n"
          "  --warmup N             untimed iterations first, 0..1000 [1]\n"
          "  --threads N            compute threads of the backend, 1..256 [1] (the fixed\n"
          "                         backend runs on one)\n"
          "  --backend NAME         compute backend of every GEMM: %s\n"
          "                         (fixed: batch-invariant, docs/reliability.md) [fixed]\n"
          "  --precision fp32|bf16  GEMM precision: bf16 rounds the GEMMs' inputs to bf16 and\n"
          "                         accumulates in fp32 (the router stays fp32); needs\n"
          "                         AVX512_BF16 and the fixed backend [fp32]\n"
          "  --peak-size N          square SGEMM size for the peak, 64..8192 [2048]\n"
          "  --seed S               parameter and input seed [1]\n"
          "  --skew SPEC            expert popularity through a fitted router bias:\n"
          "                         none, uniform, zipf:S (expert e's share ~ (e+1)^-S,\n"
          "                         S in (0, 10]), hot:F (a fraction F in (0, 1] of the\n"
          "                         tokens choose expert 0) or trace:FILE[#LAYER][@A-B] (the\n"
          "                         shares of a moe train --routing-trace file, one MoE\n"
          "                         block, steps A..B) [none: the router as initialised]\n"
          "  --json FILE            write config and results as JSON\n"
          "  --max-memory SIZE      refuse to start when the run would need more than SIZE\n"
          "                         (e.g. 512M, 2G; per rank under mpirun) [the available\n"
          "                         memory: MemAvailable or the cgroup's room, / local ranks]\n",
          moe_backend_names());
  cli_bench_layer_ep_usage(f);
}

static int parse_opts(int argc, char **argv, bench_opts *o) {
  memset(o, 0, sizeof *o);  // every option not set below: 0 (precision: fp32)
  moe_layer_config_default(&o->cfg);
  o->cfg.tokens = 4096;
  o->cfg.model_dim = 1024;
  o->cfg.hidden_dim = 2048;
  o->cfg.num_experts = 8;
  o->cfg.top_k = 2;
  o->cfg.capacity_factor = 1.2;
  o->iters = 5;
  o->warmup = 1;
  o->threads = 1;
  o->backend = "fixed";  // catalogue: the default backend
  o->peak_n = 2048;
  o->seed = 1;
  o->json_path = NULL;
  o->max_memory = 0;
  memset(&o->skew, 0, sizeof o->skew);
  cli_args a;
  unsigned set = 0;  // layer options given (unused here)
  cli_args_init(&a, argc, argv, 3);
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      cli_bench_layer_usage(stdout);
      return -1;
    } else if (cli_layer_shape_opt(&a, &o->cfg, &set) || cli_layer_config_opt(&a, &o->cfg, &set)) {
    } else if (cli_opt(&a, "--iters")) {
      cli_parse_int(&a, "--iters", 1, 10000, &o->iters);
    } else if (cli_opt(&a, "--warmup")) {
      cli_parse_int(&a, "--warmup", 0, 1000, &o->warmup);
    } else if (cli_opt(&a, "--threads")) {
      cli_parse_int(&a, "--threads", 1, 256, &o->threads);
    } else if (cli_opt(&a, "--backend")) {
      cli_parse_backend(&a, "--backend", &o->backend);
    } else if (cli_opt(&a, "--precision")) {
      cli_parse_precision(&a, "--precision", &o->precision);
    } else if (cli_opt(&a, "--peak-size")) {
      cli_parse_int(&a, "--peak-size", 64, 8192, &o->peak_n);
    } else if (cli_opt(&a, "--seed")) {
      cli_parse_u64(&a, "--seed", &o->seed);
    } else if (cli_opt(&a, "--skew")) {
      cli_parse_skew(&a, "--skew", &o->skew);
    } else if (cli_opt(&a, "--json")) {
      o->json_path = a.value;
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &o->max_memory);
    } else {
      cli_error("unknown option '%s' for 'moe bench layer' (see --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
  }
  if (!a.bad && o->cfg.top_k > o->cfg.num_experts) {
    cli_error("--topk (%d) must be in [1, %d] (the number of experts)", o->cfg.top_k,
              o->cfg.num_experts);
    a.bad = 1;
  }
  return a.bad ? CLI_USAGE : CLI_OK;
}

typedef moe_measure_single_result bench_result;  // the library measures, this prints

// "key": value, with null for NaN/Inf so the file stays valid JSON.
static void json_num(FILE *f, const char *key, double v, const char *sep) {
  if (isfinite(v)) {
    fprintf(f, "\"%s\": %.6f%s", key, v, sep);
  } else {
    fprintf(f, "\"%s\": null%s", key, sep);
  }
}

// Writes the results into the already open temporary file f (opened before the
// run, so an unwritable path fails early), then renames it onto path.
static int write_json(cli_out *out, moe_ctx *ctx, const bench_opts *o, const moe_layer_stats *s,
                      int capacity, const bench_result *r, double peak, double peak_ms,
                      unsigned long long allocs) {
  FILE *f = out->f;
  char cfg_json[1024];
  if (moe_layer_config_to_json(ctx, &o->cfg, cfg_json, sizeof cfg_json) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    cli_out_abort(out);
    return CLI_FAILED;
  }
  fprintf(f,
          "{\n  \"benchmark\": \"layer\",\n  \"version\": \"%s\",\n  \"features\": \"%s\",\n"
          "  \"config\": %s,\n  \"iters\": %d,\n  \"warmup\": %d,\n  \"threads\": %d,\n  "
          "\"backend\": \"%s\",\n  \"precision\": \"%s\",\n"
          "  \"capacity\": %d,\n  \"rows\": %d,\n  \"dropped\": %d,\n  \"peak_size\": %d,\n"
          "  \"allocations_in_timed_iterations\": %llu,\n  ",
          moe_version(), moe_features(), cfg_json, o->iters, o->warmup, o->threads, o->backend,
          moe_precision_name((moe_precision)o->precision), capacity, s->rows, s->dropped, o->peak_n,
          allocs);
  char spec[MOE_SKEW_SPEC_MAX];
  moe_skew_to_string(&o->skew, spec, sizeof spec);
  fprintf(f, "\"skew\": ");
  cli_json_string(f, spec);
  fprintf(f, ",\n  ");
  json_num(f, "skew_total_variation", r->skew_tv, ",\n  ");
  const char *sep = ",\n  ";
  json_num(f, "fwd_ms", r->fwd_ms, sep);
  json_num(f, "bwd_ms", r->bwd_ms, sep);
  json_num(f, "total_ms", r->total_ms, sep);
  json_num(f, "expert_gemm_ms", r->expert_gemm_ms, sep);
  json_num(f, "all_gemm_ms", r->all_gemm_ms, sep);
  json_num(f, "layer_over_gemm", r->total_ms / r->all_gemm_ms, sep);
  json_num(f, "expert_gflops", r->expert_gflops, sep);
  json_num(f, "peak_gflops", peak, sep);
  json_num(f, "peak_ms", peak_ms, sep);
  json_num(f, "expert_gemm_fraction_of_peak", r->expert_gflops / peak, sep);
  json_num(f, "tokens_per_s", r->tokens_per_s, sep);
  fprintf(f, "\"phases_ms\": {");
  json_num(f, "fwd_gate", r->fwd_gate_ms, ", ");
  json_num(f, "fwd_dispatch", r->fwd_dispatch_ms, ", ");
  json_num(f, "fwd_expert_other", r->fwd_expert_other_ms, ", ");
  json_num(f, "fwd_combine", r->fwd_combine_ms, ", ");
  json_num(f, "bwd_gate", r->bwd_gate_ms, ", ");
  json_num(f, "bwd_dispatch", r->bwd_dispatch_ms, ", ");
  json_num(f, "bwd_expert_other", r->bwd_expert_other_ms, ", ");
  json_num(f, "bwd_combine", r->bwd_combine_ms, "}\n}\n");
  return cli_out_commit(out);
}

int cmd_bench_layer(int argc, char **argv) {
  if (cli_bench_layer_is_ep(argc, argv)) return cmd_bench_layer_ep(argc, argv);
  bench_opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc < 0) return CLI_OK;  // --help
  if (rc != CLI_OK) return rc;

  moe_ctx *ctx = NULL;
  bench_result r;
  cli_out json = {0};
  // Open the output first: an unwritable path fails before the long run.
  if (o.json_path) {  // before the run: a bad path is refused first (CLI_USAGE)
    const int opened = cli_out_open(&json, o.json_path);
    if (opened != CLI_OK) return opened;
  }
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    rc = CLI_FAILED;
    goto done;
  }
  rc = cli_check_skew(&o.skew, o.cfg.num_experts, o.cfg.top_k, 1);
  if (rc != CLI_OK) goto done;
  char gemm_name[160];
  rc = cli_use_compute(o.backend, o.threads, o.precision, gemm_name, sizeof gemm_name);
  if (rc != CLI_OK) goto done;
  moe_measure_config mc = moe_measure_config_default();
  mc.iters = o.iters;
  mc.warmup = o.warmup;
  mc.seed = o.seed;
  mc.skew = o.skew;
  {
    // The memory bound: refuse a shape that does not fit before allocating it.
    moe_memory_need need;
    if (moe_measure_layer_single_memory(ctx, &o.cfg, &mc, o.peak_n, &need) != MOE_STATUS_OK) {
      cli_error("%s", moe_ctx_error(ctx));
      rc = CLI_USAGE;
      goto done;
    }
    rc = cli_memory_check(ctx, &need, o.max_memory,
                          "use fewer --tokens, a smaller --model, --hidden or --experts, or raise "
                          "--max-memory");
    if (rc != CLI_OK) goto done;
  }
  if (moe_measure_layer_single(ctx, &o.cfg, &mc, &r) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    rc = moe_ctx_status(ctx) == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
    goto done;
  }
  const moe_layer_stats stats = r.stats;
  const unsigned long long allocs = r.allocs;
  double peak = 0.0, peak_ms = 0.0;
  if (moe_measure_sgemm_peak(ctx, o.peak_n, &peak, &peak_ms) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
    goto done;
  }
  const int capacity = moe_layer_capacity(&o.cfg, o.cfg.tokens);

  printf("moe bench layer: T=%d M=%d H=%d E=%d K=%d f=%g act=%s%s, GEMM %s\n", o.cfg.tokens,
         o.cfg.model_dim, o.cfg.hidden_dim, o.cfg.num_experts, o.cfg.top_k, o.cfg.capacity_factor,
         moe_activation_name(o.cfg.act), o.cfg.renormalize ? " renormalized" : "", gemm_name);
  if (capacity < 0) {
    printf("routing: dropless, %d rows, 0 dropped\n", stats.rows);
  } else {
    printf("routing: capacity C=%d, %d rows, %d dropped choices\n", capacity, stats.rows,
           stats.dropped);
  }
  if (o.skew.kind != MOE_SKEW_NONE) {
    char spec[MOE_SKEW_SPEC_MAX];
    moe_skew_to_string(&o.skew, spec, sizeof spec);
    printf("skew: %s (router bias fitted to total variation %.4f)\n", spec, r.skew_tv);
  }
  printf("median of %d iterations (after %d warm-up)\n\n", o.iters, o.warmup);
  printf("%-34s %12s\n", "quantity", "value");
  printf("%-34s %12.3f\n", "forward ms", r.fwd_ms);
  printf("%-34s %12.3f\n", "backward ms", r.bwd_ms);
  printf("%-34s %12.3f\n", "forward+backward ms", r.total_ms);
  printf("%-34s %12.3f\n", "  expert GEMMs ms", r.expert_gemm_ms);
  printf("%-34s %12.3f\n", "  all GEMMs (expert+gate) ms", r.all_gemm_ms);
  printf("%-34s %12.3f\n", "  fwd gate/dispatch/act/combine ms",
         r.fwd_gate_ms + r.fwd_dispatch_ms + r.fwd_expert_other_ms + r.fwd_combine_ms);
  printf("%-34s %12.3f\n", "  bwd gate/dispatch/act/combine ms",
         r.bwd_gate_ms + r.bwd_dispatch_ms + r.bwd_expert_other_ms + r.bwd_combine_ms);
  printf("%-34s %12.3f\n", "layer time / GEMM time", r.total_ms / r.all_gemm_ms);
  printf("%-34s %12.2f\n", "expert GEMM GFLOP/s", r.expert_gflops);
  char peak_label[48];
  snprintf(peak_label, sizeof peak_label, "GEMM peak GFLOP/s (measured, %s)",
           moe_precision_name((moe_precision)o.precision));
  printf("%-34s %12.2f\n", peak_label, peak);
  printf("%-34s %11.1f%%\n", "expert GEMMs / peak", 100.0 * r.expert_gflops / peak);
  printf("%-34s %12.0f\n", "tokens/s (fwd+bwd)", r.tokens_per_s);
  printf("%-34s %12llu\n", "allocations in timed iterations", allocs);
  printf("\npeak: %dx%dx%d GEMM through the same GEMM (%s), median of 5 (%.2f ms)\n", o.peak_n,
         o.peak_n, o.peak_n, gemm_name, peak_ms);
  if (o.json_path) {
    rc = write_json(&json, ctx, &o, &stats, capacity, &r, peak, peak_ms, allocs);
    if (rc == CLI_OK) printf("wrote %s\n", o.json_path);
  }
done:
  moe_ctx_destroy(ctx);
  cli_out_abort(&json);  // still open only when the run failed
  return rc;
}

int cmd_bench(int argc, char **argv) {
  if (argc < 3 || strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
    FILE *f = argc < 3 ? stderr : stdout;
    fprintf(f,
            "usage: moe bench <what> [options]\n\n"
            "what:\n"
            "  layer    one MoE layer forward+backward: in one process, or expert-parallel\n"
            "           over MPI with the schedules (under mpirun)\n"
            "  a2a      all-to-all algorithms over a size sweep (under mpirun)\n"
            "  contention  all-to-alls beside a gradient sum, FIFO and with Lina's\n"
            "           priority (under mpirun)\n"
            "  parm     Parm's schedules (baseline, s1, s2, SAA) under tensor parallelism\n"
            "           with sharded experts (under mpirun)\n"
            "  compress compressors: GB/s per core, ratio, error\n"
            "  serve    a load generator against a running moe serve: throughput, TTFT,\n"
            "           inter-token latency, percentiles\n\n"
            "Run 'moe bench <what> --help' for its options.\n");
    return argc < 3 ? CLI_USAGE : CLI_OK;
  }
  if (strcmp(argv[2], "layer") == 0) return cmd_bench_layer(argc, argv);
  if (strcmp(argv[2], "a2a") == 0) return cmd_bench_a2a(argc, argv);
  if (strcmp(argv[2], "contention") == 0) return cmd_bench_contention(argc, argv);
  if (strcmp(argv[2], "parm") == 0) return cmd_bench_parm(argc, argv);
  if (strcmp(argv[2], "compress") == 0) return cmd_bench_compress(argc, argv);
  if (strcmp(argv[2], "serve") == 0) return cmd_bench_serve(argc, argv);
  cli_error("unknown benchmark '%s' (valid: layer, a2a, contention, parm, compress, serve)",
            argv[2]);
  return CLI_USAGE;
}
