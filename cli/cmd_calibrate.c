// moe calibrate: measures this cluster under mpirun and writes a profile
// (include/moe/perf.h) for `moe simulate --profile`, `bench layer --profile`
// and the planner. The measuring and fitting are the library's
// (moe_calibrate, include/moe/measure.h); this file parses, prints the
// report and writes the profile (and the layer runs) atomically.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moe/perf.h"

#if MOE_CLI_MPI
#include "moe/measure_mpi.h"

typedef struct {
  const char *out, *name, *a2a, *compress;
  const char *layers;   // shapes of the layer step, NULL: skipped
  const char *samples;  // write the layer step's runs there
  const char *refit;    // fit --profile's corrections to these runs instead of measuring
  const char *profile;  // the profile to refit
  int ranks_per_node, iters;
  long long min_bytes, max_bytes;
  double hang_timeout;  // --hang-timeout, seconds (0: off)
  size_t max_memory;    // --max-memory per rank, 0: the node's available memory / its ranks
} cal_opts;

static void calibrate_usage(FILE *f) {
  // (unformatted: the catalogue marker makes one line long)
  // clang-format off
  fprintf(f,
          "usage: mpirun -n P moe calibrate --out FILE [options]\n"
          "\n"
          "Measures this cluster and writes a profile (JSON): least-squares fits\n"
          "t = alpha + beta * x of one GEMM (x = FLOPs), of one expert's forward and\n"
          "backward step (x = FLOPs), of the layer's work outside the experts (gate,\n"
          "dispatch, combine; x = T M (E + K)), of each all-to-all algorithm\n"
          "(x = bytes one rank sends to the others, uniform counts) and of each\n"
          "compressor (x = input float bytes), with R², and how much a compute task and\n"
          "an all-to-all slow each other down when they overlap on the executor (the\n"
                    "simulator's contention factors), and Parm's alpha-beta terms on every\n"
          "layout with MP >= 2 whose MP x ESP groups fit in a node (read by 'moe train\n"
          "--parm auto --profile FILE'). Every rank measures at the same\n"
          "time; each point is the slowest rank's median. Read it back with\n"
          "'moe simulate --profile FILE'.\n"
          "\n"
          "options (default in brackets):\n"
          "  --out FILE             the profile to write (required)\n"
          "  --name NAME            profile and cluster name [calibrated-<ranks>]\n"
          "  --ranks-per-node N     pretend every N consecutive ranks share a node\n"
          "  --a2a LIST|all         algorithms to fit [all that run on this layout]\n"
          "  --compress LIST|all    compressors to fit [all]\n"
          "  --min-bytes S          smallest all-to-all, bytes per rank [4096]\n"
          "  --max-bytes S          largest all-to-all, bytes per rank [8388608]\n"
          "  --iters N              timed repetitions per point, 1..1000 [5]\n"
          "  --layers LIST          layer step: shapes T:M:H:f (tokens per rank, model,\n"
          "                         hidden, capacity factor, 0 = dropless) of the\n"
          "                         expert-parallel layer to run, E = 2 x ranks, K = 2\n"
          "                         [" MOE_CALIBRATE_DEFAULT_LAYERS
          "]\n"
          "  --no-layers            skip the layer step (no layer corrections)\n"
          "  --samples FILE         also write the layer step's runs (JSON) to FILE\n"
          "  --max-memory SIZE      refuse to start when a rank would need more than SIZE\n"
          "                         (e.g. 512M, 2G; per rank; the largest step with the\n"
          "                         all-to-all buffers) [the node's MemAvailable, or its\n"
          "                         cgroup's memory.max room, / its ranks]\n"
          "  --refit FILE --profile IN\n"
          "                         measure nothing: fit IN's layer corrections again to the\n"
          "                         runs in FILE (from --samples) and write the result to\n"
          "                         --out (one process is enough; no measuring option\n"
          "                         applies)\n"
          CLI_HANG_TIMEOUT_HELP
          "\n"
          "The layer step runs every calibrated all-to-all with the sequential schedule\n"
          "at r = 1, 2, 4 and with optsche r=2, pipeline r=4 and smart, then fits a\n"  // catalogue: the layer step's sample set (src/measure/calibrate.c)
          "scale and a per-task cost of the expert steps and of each all-to-all, the\n"
          "time outside the passes and each all-to-all's contention factors to those\n"
          "runs (layer_fit in the profile), so the simulator predicts what the layer\n"
          "does rather than what the micro-benchmarks do alone.\n");
  // clang-format on
}

static int parse_cal(int argc, char **argv, cal_opts *o, int rank) {
  memset(o, 0, sizeof *o);
  o->a2a = "all";
  o->compress = "all";
  o->iters = 5;
  o->layers = MOE_CALIBRATE_DEFAULT_LAYERS;
  o->min_bytes = 4096;
  o->max_bytes = 8 << 20;
  o->hang_timeout = CLI_HANG_TIMEOUT_DEFAULT;
  cli_args a;
  cli_args_init(&a, argc, argv, 2);
  const char *measuring = NULL;  // the first option that only applies to measuring
  while (!cli_args_done(&a) && !a.bad) {
    const char *arg = cli_args_peek(&a);
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      if (rank == 0) calibrate_usage(stdout);
      return -1;
    } else if (cli_opt(&a, "--out")) {
      o->out = a.value;
      arg = NULL;
    } else if (cli_opt(&a, "--refit")) {
      o->refit = a.value;
      arg = NULL;
    } else if (cli_hang_timeout_opt(&a, &o->hang_timeout)) {
      arg = NULL;  // allowed with --refit too
    } else if (cli_opt(&a, "--profile")) {
      o->profile = a.value;
      arg = NULL;
    } else if (cli_opt(&a, "--samples")) {
      o->samples = a.value;
    } else if (cli_opt(&a, "--name")) {
      o->name = a.value;
      if (a.value && strlen(a.value) >= 64) {
        if (rank == 0) cli_error("--name '%s' is longer than 63 bytes", a.value);
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--ranks-per-node")) {
      cli_parse_int(&a, "--ranks-per-node", 0, 1 << 20, &o->ranks_per_node);
    } else if (cli_opt(&a, "--a2a")) {
      o->a2a = a.value;
    } else if (cli_opt(&a, "--compress")) {
      o->compress = a.value;
    } else if (cli_opt(&a, "--iters")) {
      cli_parse_int(&a, "--iters", 1, 1000, &o->iters);
    } else if (cli_opt(&a, "--layers")) {
      o->layers = a.value;
    } else if (cli_flag(&a, "--no-layers")) {
      o->layers = NULL;
    } else if (cli_opt(&a, "--min-bytes")) {
      int v = 0;
      cli_parse_int(&a, "--min-bytes", 1024, 1 << 30, &v);
      o->min_bytes = v;
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &o->max_memory);
    } else if (cli_opt(&a, "--max-bytes")) {
      int v = 0;
      cli_parse_int(&a, "--max-bytes", 1024, 1 << 30, &v);
      o->max_bytes = v;
    } else {
      if (rank == 0) cli_error("unknown option '%s' (see moe calibrate --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
    if (arg && !measuring) measuring = arg;
  }
  if (!a.bad && o->refit && (!o->profile || measuring)) {
    if (rank == 0) {
      if (!o->profile) {
        cli_error("--refit FILE needs --profile IN: the profile whose corrections to fit again");
      } else {
        cli_error("--refit measures nothing, so '%s' does not apply (see moe calibrate --help)",
                  measuring);
      }
    }
    a.bad = 1;
  }
  if (!a.bad && o->profile && !o->refit) {
    if (rank == 0) cli_error("--profile IN only goes with --refit FILE (see moe calibrate --help)");
    a.bad = 1;
  }
  if (!a.bad && o->samples && !o->layers) {
    if (rank == 0) cli_error("--samples FILE writes the layer step's runs; --no-layers skips it");
    a.bad = 1;
  }
  if (!a.bad && !o->out) {
    if (rank == 0) cli_error("--out FILE is required (see moe calibrate --help)");
    a.bad = 1;
  }
  if (!a.bad && o->layers && !o->refit) {
    int P = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    moe_calibrate_config c = moe_calibrate_config_default();
    c.layers = o->layers;
    moe_ctx *ctx = NULL;
    if (moe_ctx_create(&ctx) != MOE_STATUS_OK ||
        moe_calibrate_config_check(ctx, &c, P) != MOE_STATUS_OK) {
      if (rank == 0)
        cli_error("--%s", ctx ? moe_ctx_error(ctx) : "out of memory");  // "layers: ..."
      a.bad = 1;
    }
    moe_ctx_destroy(ctx);
  }
  if (!a.bad && !o->refit && o->min_bytes * 4 > o->max_bytes) {
    if (rank == 0) {
      cli_error("--max-bytes (%lld) must be at least 4 x --min-bytes (%lld) for a fit",
                o->max_bytes, o->min_bytes);
    }
    a.bad = 1;
  }
  return a.bad ? CLI_USAGE : CLI_OK;
}

// The library's report: one line each (rank 0 only).
static void print_line(void *user, const char *line) {
  (void)user;
  printf("%s\n", line);
  fflush(stdout);
}

// Writes prof to out, complete or not at all (rank 0). *json holds the text.
static int write_profile(moe_ctx *ctx, const moe_profile *prof, char **json, cli_out *out,
                         const char *path) {
  if (moe_profile_to_json(ctx, prof, json) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    return CLI_FAILED;
  }
  fputs(*json, out->f);
  const int rc = cli_out_commit(out);
  if (rc == CLI_OK) printf("wrote %s\n", path);
  return rc;
}

// Writes the layer runs to path (rank 0): complete or not at all.
static int write_samples(moe_ctx *ctx, const char *path, const moe_layer_sample *samples, int n) {
  char *json = NULL;
  cli_out out = {0};
  int rc = cli_out_open(&out, path);
  if (rc == CLI_OK && moe_layer_samples_to_json(ctx, samples, n, &json) != MOE_STATUS_OK) {
    cli_error("--samples: %s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
  }
  if (rc == CLI_OK) {
    fputs(json, out.f);
    rc = cli_out_commit(&out);
    if (rc == CLI_OK) printf("wrote the %d layer runs to %s\n", n, path);
  }
  cli_out_abort(&out);
  moe_free(json);
  return rc;
}

// --refit: o->profile's layer corrections fitted again to the runs in
// o->refit, written to out (one process).
static int refit_profile(moe_ctx *ctx, const cal_opts *o, moe_profile *prof, char **json,
                         cli_out *out) {
  moe_layer_sample *samples = NULL;
  int n = 0, rc = CLI_OK;
  if (moe_profile_load(ctx, o->profile, prof) != MOE_STATUS_OK ||
      moe_layer_samples_load(ctx, o->refit, &samples, &n) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
  }
  if (rc == CLI_OK) {
    printf("moe calibrate --refit: %d layer runs from %s, profile %s ('%s')\n", n, o->refit,
           o->profile, prof->name);
    if (moe_calibrate_fit_layer(ctx, prof, samples, n, 1, print_line, NULL) != MOE_STATUS_OK) {
      cli_error("layer step: %s", moe_ctx_error(ctx));
      rc = CLI_FAILED;
    }
  }
  if (rc == CLI_OK) rc = write_profile(ctx, prof, json, out, o->out);
  moe_free(samples);
  return rc;
}

int cmd_calibrate(int argc, char **argv) {
  int provided = 0, rank = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cal_opts o;
  int rc = parse_cal(argc, argv, &o, rank);
  moe_ctx *ctx = NULL;
  moe_profile prof;
  memset(&prof, 0, sizeof prof);
  moe_layer_sample *samples = NULL;
  int n_samples = 0;
  char *json = NULL;
  cli_out out = {0};
  moe_watchdog *wd = NULL;
  if (rc != CLI_OK) goto done;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    rc = CLI_FAILED;
    goto done;
  }
  if (moe_launch_check(ctx) != MOE_STATUS_OK) {
    cli_error("calibrate: %s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  if (cli_watchdog_start(ctx, o.hang_timeout, rank, &wd) != CLI_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  if ((rc = cli_out_open_root(&out, o.out, rank)) != CLI_OK) {
    goto done;
  }
  // --samples is written after the measurements: a path that cannot be is refused now
  if ((rc = cli_out_probe_root(o.samples, rank)) != CLI_OK) goto done;
  if (o.refit) {
    if (rank == 0) rc = refit_profile(ctx, &o, &prof, &json, &out);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    goto done;
  }
  moe_calibrate_config c = moe_calibrate_config_default();
  c.name = o.name;
  c.ranks_per_node = o.ranks_per_node;
  c.a2a = o.a2a;
  c.compress = o.compress;
  c.min_bytes = o.min_bytes;
  c.max_bytes = o.max_bytes;
  c.iters = o.iters;
  c.layers = o.layers;
  c.log = print_line;
  {  // the memory bound: the largest step's buffers, agreed before any is allocated
    int P = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    moe_memory_need need;
    const moe_status est = moe_calibrate_memory(ctx, P, &c, &need);
    rc = cli_memory_check_world(
        ctx, est, &need, o.max_memory,
        "lower --max-bytes, name fewer --a2a algorithms or smaller --layers, or raise --max-memory",
        rank);
    if (rc != CLI_OK) goto done;
  }
  const moe_status st =
      moe_calibrate(ctx, MPI_COMM_WORLD, &c, &prof, o.samples ? &samples : NULL, &n_samples);
  if (st == MOE_STATUS_COMM) {
    // an exchange failed midway: peers may wait inside it, nothing can follow
    cli_error("%s", moe_ctx_error(ctx));
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  if (st != MOE_STATUS_OK) {
    if (rank == 0) cli_error("%s", moe_ctx_error(ctx));
    rc = st == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
    goto done;
  }
  if (rank == 0 && o.samples) rc = write_samples(ctx, o.samples, samples, n_samples);
  if (rank == 0 && rc == CLI_OK) rc = write_profile(ctx, &prof, &json, &out, o.out);
  MOE_MPI_WATCHED("broadcast of the exit status", MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
done:
  moe_watchdog_stop(wd);
  if (rank == 0) cli_out_abort(&out);
  moe_free(json);
  moe_free(samples);
  moe_ctx_destroy(ctx);
  MPI_Finalize();
  return rc < 0 ? CLI_OK : rc;
}

#else  // !MOE_CLI_MPI

int cmd_calibrate(int argc, char **argv) {
  (void)argc;
  (void)argv;
  cli_error("calibrate needs MPI, and this moe was built without it (install libopenmpi-dev)");
  return CLI_FAILED;
}

#endif
