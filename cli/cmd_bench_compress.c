// moe bench compress: single-thread throughput of every compressor of
// include/moe/compress.h on one (rows, cols) float matrix: compress and
// decompress GB/s (input float bytes / median time), compression ratio and the
// largest error seen, as a table and optionally JSON.
// A benchmark, not a test: it reports; tests/test_compress.c checks the bounds.
// Hook (cli/main.c, by the lead): "compress" -> cmd_bench_compress(argc, argv).
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moe/compress.h"
#include "moe/measure.h"

int cmd_bench_compress(int argc, char **argv);

typedef struct {
  int rows, cols, iters;
  const char *list;  // comma-separated specs, NULL for all
  const char *json_path;
  size_t max_memory;  // --max-memory, 0: the available memory
} cbench_opts;

typedef struct {
  char spec[64];
  double comp_gbs, decomp_gbs, ratio, max_abs_err, max_rel_err;
  size_t bytes;
} cbench_row;

static void bench_compress_usage(FILE *f) {
  fprintf(f,
          "usage: moe bench compress [options]\n"
          "\n"
          "Times each compressor (one thread) on a uniform [-1, 1) float matrix: compress and\n"
          "decompress GB/s of input floats (median), ratio (input bytes / compressed bytes)\n"
          "and the largest absolute error (and that error / max|x|).\n"
          "\n"
          "options (default in brackets):\n"
          "  --rows N         matrix rows, 1..1048576 [8192]\n"
          "  --cols N         matrix columns, 1..1048576 [1024]\n"
          "  --iters N        timed iterations, 1..10000 [10]\n"
          "  --compress LIST  comma-separated specs (%s) [all]\n"
          "  --json FILE      write the results as JSON\n"
          "  --max-memory SIZE  refuse to start when the run would need more than SIZE\n"
          "                   (e.g. 512M, 2G) [MemAvailable, or the cgroup's room]\n",
          moe_compressor_names());
}

static int parse_cbench(int argc, char **argv, cbench_opts *o) {
  o->rows = 8192;
  o->cols = 1024;
  o->iters = 10;
  o->list = NULL;
  o->json_path = NULL;
  o->max_memory = 0;
  cli_args a;
  cli_args_init(&a, argc, argv, 3);
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      bench_compress_usage(stdout);
      return -1;
    } else if (cli_opt(&a, "--rows")) {
      cli_parse_int(&a, "--rows", 1, 1 << 20, &o->rows);
    } else if (cli_opt(&a, "--cols")) {
      cli_parse_int(&a, "--cols", 1, 1 << 20, &o->cols);
    } else if (cli_opt(&a, "--iters")) {
      cli_parse_int(&a, "--iters", 1, 10000, &o->iters);
    } else if (cli_opt(&a, "--compress")) {
      o->list = a.value;
    } else if (cli_opt(&a, "--json")) {
      o->json_path = a.value;
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &o->max_memory);
    } else {
      cli_error("unknown option '%s' for 'moe bench compress' (see --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
  }
  if (!a.bad && (double)o->rows * (double)o->cols > (double)(1u << 28)) {
    cli_error("--rows x --cols (%d x %d) must be at most 2^28 floats", o->rows, o->cols);
    a.bad = 1;
  }
  return a.bad ? CLI_USAGE : CLI_OK;
}

// Splits the list into specs and checks each (exit 2 naming --compress).
static int collect_specs(moe_ctx *ctx, const char *list, char specs[][64], int max, int *count) {
  char buf[1024];
  *count = 0;
  if (!list) list = moe_compressor_names();  // "none, fp16, ..., zfp[:RATE]"
  if (strlen(list) >= sizeof buf) {
    cli_error("--compress: the list is too long");
    return CLI_USAGE;
  }
  strcpy(buf, list);
  for (char *p = buf; *p;) {
    char *end = strchr(p, ',');
    if (end) *end = '\0';
    while (*p == ' ') p++;
    char *bracket = strchr(p, '[');  // "zfp[:RATE]" in the default list
    if (bracket) *bracket = '\0';
    size_t len = strlen(p);
    while (len && p[len - 1] == ' ') p[--len] = '\0';
    moe_compressor c;
    if (len == 0 || len >= 64 || moe_compressor_get(ctx, p, &c) != MOE_STATUS_OK) {
      cli_error("--compress: %s", len ? moe_ctx_error(ctx) : "empty compressor name");
      return CLI_USAGE;
    }
    if (*count == max) {
      cli_error("--compress: at most %d compressors", max);
      return CLI_USAGE;
    }
    strcpy(specs[(*count)++], p);
    if (!end) break;
    p = end + 1;
  }
  return CLI_OK;
}

// Times one compressor (the library's moe_measure_codec) into row.
static int run_one(moe_ctx *ctx, const char *spec, const float *x, const cbench_opts *o,
                   cbench_row *row) {
  moe_compressor c;
  moe_measure_codec_result m;
  if (moe_compressor_get(ctx, spec, &c) != MOE_STATUS_OK ||
      moe_measure_codec(ctx, &c, x, (size_t)o->rows, (size_t)o->cols, o->iters, &m) !=
          MOE_STATUS_OK) {
    cli_error("%s: %s", spec, moe_ctx_error(ctx));
    return CLI_FAILED;
  }
  const size_t len = strlen(spec) < sizeof row->spec - 1 ? strlen(spec) : sizeof row->spec - 1;
  memcpy(row->spec, spec, len);
  row->spec[len] = '\0';
  row->bytes = m.bytes;
  row->comp_gbs = m.comp_gbs;
  row->decomp_gbs = m.decomp_gbs;
  row->ratio = m.ratio;
  row->max_abs_err = m.max_abs_err;
  row->max_rel_err = m.max_rel_err;
  return CLI_OK;
}

static int write_cbench_json(const char *path, const cbench_opts *o, const cbench_row *r, int n) {
  cli_out out;
  const int opened = cli_out_open(&out, path);  // CLI_USAGE: a bad path
  if (opened != CLI_OK) return opened;
  FILE *f = out.f;
  fprintf(f,
          "{\n  \"benchmark\": \"compress\",\n  \"version\": \"%s\",\n  \"features\": \"%s\",\n"
          "  \"rows\": %d,\n  \"cols\": %d,\n  \"iters\": %d,\n  \"threads\": 1,\n"
          "  \"input\": \"uniform [-1, 1)\",\n  \"results\": [",
          moe_version(), moe_features(), o->rows, o->cols, o->iters);
  for (int i = 0; i < n; i++) {
    fprintf(f,
            "%s\n    {\"compressor\": \"%s\", \"bytes\": %zu, \"compress_gbs\": %.4f, "
            "\"decompress_gbs\": %.4f, \"ratio\": %.4f, \"max_abs_err\": %.6g, "
            "\"max_err_over_max_abs_x\": %.6g}",
            i ? "," : "", r[i].spec, r[i].bytes, r[i].comp_gbs, r[i].decomp_gbs, r[i].ratio,
            r[i].max_abs_err, r[i].max_rel_err);
  }
  fprintf(f, "\n  ]\n}\n");
  return cli_out_commit(&out);
}

int cmd_bench_compress(int argc, char **argv) {
  enum { MAX_SPECS = 32 };
  cbench_opts o;
  int rc = parse_cbench(argc, argv, &o);
  if (rc < 0) return CLI_OK;  // --help
  if (rc != CLI_OK) return rc;
  moe_ctx *ctx = NULL;
  float *x = NULL;
  char specs[MAX_SPECS][64];
  cbench_row rows[MAX_SPECS];
  int nspecs = 0;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return CLI_FAILED;
  rc = collect_specs(ctx, o.list, specs, MAX_SPECS, &nspecs);
  if (rc != CLI_OK) goto done;
  const size_t n = (size_t)o.rows * (size_t)o.cols;
  {
    // The memory bound: the largest compressor's run, before anything is allocated.
    moe_memory_need need, one;
    memset(&need, 0, sizeof need);
    for (int i = 0; i < nspecs; i++) {
      moe_compressor c;
      if (moe_compressor_get(ctx, specs[i], &c) != MOE_STATUS_OK ||
          moe_measure_codec_memory(ctx, &c, (size_t)o.rows, (size_t)o.cols, o.iters, &one) !=
              MOE_STATUS_OK) {
        cli_error("%s: %s", specs[i], moe_ctx_error(ctx));
        rc = CLI_USAGE;
        goto done;
      }
      if (moe_memory_need_total(&one) > moe_memory_need_total(&need)) need = one;
    }
    rc = cli_memory_check(ctx, &need, o.max_memory,
                          "use fewer --rows or --cols, or raise --max-memory");
    if (rc != CLI_OK) goto done;
  }
  x = moe_malloc(n * sizeof(float));
  if (!x) {
    cli_error("cannot allocate the benchmark's input (%zu floats)", n);
    rc = CLI_FAILED;
    goto done;
  }
  moe_rng rng;
  moe_rng_init(&rng, 1, 200);
  moe_rng_fill_uniform(&rng, x, n, -1.0f, 1.0f);
  printf(
      "moe bench compress: (%d, %d) float32 uniform [-1, 1), %.1f MB, 1 thread, median of %d\n\n",
      o.rows, o.cols, (double)n * sizeof(float) / 1e6, o.iters);
  printf("%-12s %14s %16s %8s %12s %14s\n", "compressor", "compress GB/s", "decompress GB/s",
         "ratio", "max |err|", "err/max|x|");
  for (int i = 0; i < nspecs; i++) {
    rc = run_one(ctx, specs[i], x, &o, &rows[i]);
    if (rc != CLI_OK) goto done;
    printf("%-12s %14.3f %16.3f %8.2f %12.3g %14.3g\n", rows[i].spec, rows[i].comp_gbs,
           rows[i].decomp_gbs, rows[i].ratio, rows[i].max_abs_err, rows[i].max_rel_err);
  }
  if (o.json_path) {
    rc = write_cbench_json(o.json_path, &o, rows, nspecs);
    if (rc == CLI_OK) printf("wrote %s\n", o.json_path);
  }
done:
  moe_free(x);
  moe_ctx_destroy(ctx);
  return rc;
}
