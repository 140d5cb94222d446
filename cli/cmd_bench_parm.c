// moe bench parm: Parm's schedules measured under mpirun. For each layer
// shape and MP x EP x ESP layout of a grid (or the one given), one Parm layer
// runs baseline, s1, s2 and s2 with SAA interleaved round by round
// (moe_measure_parm); the table gives each variant's median forward +
// backward time (slowest rank), its speedup over the baseline, its all-to-all,
// MP and ESP collective times, and the largest difference of its outputs and
// input gradients from the baseline's (docs/parm.md).
#define _POSIX_C_SOURCE 200809L  // strtok_r
#include "cli.h"

#if MOE_CLI_MPI
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/measure_mpi.h"

#define PB_MAX 16       // values per list
#define PB_AB_POINTS 4  // sizes of the alpha-beta fits
#define PB_AB_ROUNDS 5  // rounds per size

typedef struct {
  int tokens[PB_MAX], n_tokens;
  int model[PB_MAX], n_model;
  int hidden[PB_MAX], n_hidden;
  double f[PB_MAX];
  int n_f;
  int layout[PB_MAX][3], n_layout;  // MP, EP, ESP
  int experts, top_k;
  const char *a2a;
  int chunks;                 // s1 / s2's EP&ESP pass in chunks on the executor
  const char *task_schedule;  // their order
  const char *compress;       // s1 / s2's payloads (NULL: none)
  int compress_backward;
  int ranks_per_node;
  moe_parm_bench_config bc;
  const char *json_path;
  double hang_timeout;
  size_t max_memory;
} pb_opts;

static void usage(FILE *f) {
  char names[256];
  moe_a2a_names(names, sizeof names, 0);
  fprintf(f,
          "usage: mpirun -n P moe bench parm [options]\n\n"
          "Parm's schedules of an MoE layer under tensor parallelism (MP) with sharded\n"
          "experts (ESP): baseline (DeepSpeed-MoE), s1, s2 and s2 with SAA, interleaved\n"
          "round by round on one layer, for every combination of the lists below (a\n"
          "scaled-down Parm Table III grid by default: 2 x 2 x 2 x 2 shapes x the\n"
          "layouts). Times are medians of the slowest rank's forward + backward; the\n"
          "last column is the largest relative difference of a variant's outputs and\n"
          "input gradients from the baseline's (s2 keeps the baseline's math; s1\n"
          "applies the capacity per MP slice, so with drops it differs).\n\n"
          "options:\n"
          "  --layouts L        MPxEPxESP,... e.g. 2x2x1,1x2x2; each divides P (DP the rest)\n"
          "                     [every MP, ESP in {1, 2} with EP = P / (MP x ESP)]\n"
          "  --tokens LIST      tokens per data part [512,1024]\n"
          "  --model LIST       M [256,512]\n"
          "  --hidden LIST      H [512,1024]\n"
          "  --capacity LIST    capacity factors f, 0 = dropless [1.2,2.4]\n"
          "  --experts E        [4]; divisible by every EP\n"
          "  --top-k K          [2]\n"
          "  --a2a NAME         all-to-all algorithm: %s [mpi]\n"
          "  --chunks R         s1 and s2 run their EP&ESP pass (and s2+saa its SAA) in R\n"
          "                     chunks on the two-stream executor, 1..%d; the baseline\n"
          "                     stays unchunked [1]\n"
          "  --schedule NAME    the chunks' task schedule [sequential]: %s\n"
          "                     (not one that cuts a pass by peer groups)\n"
          "  --compress SPEC    s1 and s2's EP&ESP payloads [none]: %s\n"
          "                     (lossy ones change the results: see the last column)\n"
          "  --compress-backward  the backward's gradients too\n"
          "  --rounds N         timed rounds, 1..100000 [7]\n"
          "  --warmup N         untimed rounds first, 0..1000 [2]\n"
          "  --ranks-per-node N pretend every N consecutive ranks share a node [0: real]\n"
          "  --json FILE        write the results as JSON (rank 0)\n" CLI_MAX_MEMORY_HELP
              CLI_HANG_TIMEOUT_HELP,
          names, MOE_MAX_CHUNKS, moe_schedule_algo_names(), moe_compressor_names());
}

// A comma list of ints in [lo, hi] into v (at most PB_MAX); 0 after printing why.
static int int_list(const char *opt, const char *text, int lo, int hi, int *v, int *n) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", text);
  *n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *end = NULL;
    const long x = strtol(tok, &end, 10);
    if (*n >= PB_MAX || end == tok || *end || x < lo || x > hi) {
      cli_error("%s: '%s' is not a list of at most %d integers in [%d, %d]", opt, text, PB_MAX, lo,
                hi);
      return 0;
    }
    v[(*n)++] = (int)x;
  }
  if (*n == 0) cli_error("%s: empty list", opt);
  return *n > 0;
}

static int layouts(const char *text, pb_opts *o) {
  if (!text) return 0;  // (cli_opt said the value is missing)
  char buf[512];
  snprintf(buf, sizeof buf, "%s", text);
  o->n_layout = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int a = 0, b = 0, c = 0;
    char extra = 0;
    if (o->n_layout >= PB_MAX || sscanf(tok, "%dx%dx%d%c", &a, &b, &c, &extra) != 3 || a < 1 ||
        b < 1 || c < 1 || a > 4096 || b > 4096 || c > 4096) {
      cli_error("--layouts: '%s' is not a list of at most %d MPxEPxESP triples (each 1..4096)",
                text, PB_MAX);
      return 0;
    }
    o->layout[o->n_layout][0] = a;
    o->layout[o->n_layout][1] = b;
    o->layout[o->n_layout][2] = c;
    o->n_layout++;
  }
  if (o->n_layout == 0)
    cli_error("--layouts: '%s' is empty: give MPxEPxESP triples, e.g. 2x2x1,1x2x2", text);
  return o->n_layout > 0;
}

// CLI_OK, CLI_USAGE, or -1 after --help.
static int parse_opts(int argc, char **argv, pb_opts *o) {
  memset(o, 0, sizeof *o);
  const int tok[2] = {512, 1024}, mod[2] = {256, 512}, hid[2] = {512, 1024};
  const double fs[2] = {1.2, 2.4};
  for (int i = 0; i < 2; i++) {
    o->tokens[i] = tok[i];
    o->model[i] = mod[i];
    o->hidden[i] = hid[i];
    o->f[i] = fs[i];
  }
  o->n_tokens = o->n_model = o->n_hidden = o->n_f = 2;
  o->experts = 4;
  o->top_k = 2;
  o->a2a = "mpi";  // catalogue: the default all-to-all
  o->chunks = 1;
  moe_parm_bench_config_default(&o->bc);
  o->hang_timeout = CLI_HANG_TIMEOUT_DEFAULT;
  cli_args a;
  cli_args_init(&a, argc, argv, 3);
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      usage(stdout);
      return -1;
    } else if (cli_opt(&a, "--layouts")) {
      a.bad = !layouts(a.value, o);
    } else if (cli_opt(&a, "--tokens")) {
      a.bad = !int_list("--tokens", a.value, 1, MOE_MAX_TOKENS, o->tokens, &o->n_tokens);
    } else if (cli_opt(&a, "--model")) {
      a.bad = !int_list("--model", a.value, 1, MOE_MAX_DIM, o->model, &o->n_model);
    } else if (cli_opt(&a, "--hidden")) {
      a.bad = !int_list("--hidden", a.value, 1, MOE_MAX_DIM, o->hidden, &o->n_hidden);
    } else if (cli_opt(&a, "--capacity")) {
      char buf[512];
      snprintf(buf, sizeof buf, "%s", a.value);
      o->n_f = 0;
      for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && !a.bad;
           t = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        const double x = strtod(t, &end);
        if (o->n_f >= PB_MAX || end == t || *end || !(x >= 0 && x <= 1e6)) {
          cli_error("--capacity: '%s' is not a list of at most %d factors in [0, 1e6]", a.value,
                    PB_MAX);
          a.bad = 1;
        } else {
          o->f[o->n_f++] = x;
        }
      }
      if (!a.bad && o->n_f == 0) {
        cli_error("--capacity: empty list");
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--experts")) {
      cli_parse_int(&a, "--experts", 1, MOE_MAX_EXPERTS, &o->experts);
    } else if (cli_opt(&a, "--top-k")) {
      cli_parse_int(&a, "--top-k", 1, MOE_MAX_EXPERTS, &o->top_k);
    } else if (cli_opt(&a, "--a2a")) {
      o->a2a = a.value;
    } else if (cli_opt(&a, "--chunks")) {
      cli_parse_int(&a, "--chunks", 1, MOE_MAX_CHUNKS, &o->chunks);
    } else if (cli_opt(&a, "--schedule")) {
      const moe_schedule_algo *ts = NULL;
      o->task_schedule = a.value;
      if (moe_schedule_algo_find(NULL, a.value, &ts) != MOE_STATUS_OK) {
        cli_error("--schedule: unknown task schedule '%s' (valid: %s)", a.value,
                  moe_schedule_algo_names());
        a.bad = 1;
      } else if (ts->chunking != MOE_CHUNK_ROWS) {
        cli_error("--schedule %s cuts a pass by peer groups; Parm's EP&ESP pass is cut by rows",
                  a.value);
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--compress")) {
      moe_compressor comp;
      o->compress = a.value;
      if (moe_compressor_get(NULL, a.value, &comp) != MOE_STATUS_OK) {
        cli_error("--compress: unknown or malformed compressor '%s' (valid: %s)", a.value,
                  moe_compressor_names());
        a.bad = 1;
      }
    } else if (cli_flag(&a, "--compress-backward")) {
      o->compress_backward = 1;
    } else if (cli_opt(&a, "--rounds")) {
      cli_parse_int(&a, "--rounds", 1, 100000, &o->bc.rounds);
    } else if (cli_opt(&a, "--warmup")) {
      cli_parse_int(&a, "--warmup", 0, 1000, &o->bc.warmup);
    } else if (cli_opt(&a, "--ranks-per-node")) {
      cli_parse_int(&a, "--ranks-per-node", 0, 1 << 20, &o->ranks_per_node);
    } else if (cli_opt(&a, "--json")) {
      o->json_path = a.value;
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &o->max_memory);
    } else if (cli_hang_timeout_opt(&a, &o->hang_timeout)) {
    } else {
      cli_error("unknown option '%s' for 'moe bench parm' (see --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
  }
  if (a.bad) return CLI_USAGE;
  if (o->top_k > o->experts) {
    cli_error("--top-k (%d) must be at most --experts (%d)", o->top_k, o->experts);
    return CLI_USAGE;
  }
  return CLI_OK;
}

// The layer config of one grid point.
static moe_layer_config config_of(const pb_opts *o, int t, int m, int h, int f) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.tokens = o->tokens[t];
  c.model_dim = o->model[m];
  c.hidden_dim = o->hidden[h];
  c.num_experts = o->experts;
  c.top_k = o->top_k;
  c.capacity_factor = o->f[f];
  return c;
}

int cmd_bench_parm(int argc, char **argv) {
  pb_opts o;
  int saved[2];  // the options' errors once, from the launcher's rank 0
  cli_silence_begin(moe_launcher_rank() != 0, saved);
  int rc = parse_opts(argc, argv, &o);
  cli_silence_end(saved);
  if (rc < 0) return CLI_OK;
  if (rc != CLI_OK) return rc;

  int provided = 0, rank = 0, P = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  moe_ctx *ctx = NULL;
  cli_out out = {0};
  moe_watchdog *wd = NULL;
  moe_parm_grid_row *rows = NULL;
  moe_parm_alpha_beta ab[PB_MAX];
  int n = 0;
  if (o.n_layout == 0) o.n_layout = moe_parm_grid_default_layouts(P, o.layout);
  const int total = o.n_layout * o.n_tokens * o.n_model * o.n_hidden * o.n_f;

  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    rc = CLI_FAILED;
    goto done;
  }
  if (moe_launch_check(ctx) != MOE_STATUS_OK) {
    cli_error("bench parm: %s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  if (cli_watchdog_start(ctx, o.hang_timeout, rank, &wd) != CLI_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  rows = calloc((size_t)total, sizeof *rows);
  if (!rows) {
    cli_error("bench parm: out of memory");
    rc = CLI_FAILED;
    goto done;
  }
  // every grid point checked (and its memory bounded) before any runs
  for (int l = 0; l < o.n_layout; l++) {
    for (int t = 0; t < o.n_tokens; t++) {
      for (int m = 0; m < o.n_model; m++) {
        for (int h = 0; h < o.n_hidden; h++) {
          for (int f = 0; f < o.n_f; f++) {
            moe_parm_grid_row *w = &rows[n++];
            w->layout = l;
            w->cfg = config_of(&o, t, m, h, f);
            moe_parm_config_default(&w->pc);
            w->pc.mp = o.layout[l][0];
            w->pc.ep = o.layout[l][1];
            w->pc.esp = o.layout[l][2];
            w->pc.ranks_per_node = o.ranks_per_node;
            snprintf(w->pc.a2a, sizeof w->pc.a2a, "%s", o.a2a);
            w->pc.chunks = o.chunks;
            if (o.compress) snprintf(w->pc.compress, sizeof w->pc.compress, "%s", o.compress);
            w->pc.compress_backward = o.compress_backward;
            if (o.task_schedule)
              snprintf(w->pc.task_schedule, sizeof w->pc.task_schedule, "%s", o.task_schedule);
            moe_memory_need need;
            const moe_status est = moe_measure_parm_memory(ctx, &w->cfg, &w->pc, P, &need);
            if (est != MOE_STATUS_OK && rank == 0) {
              cli_error("bench parm: layout %dx%dx%d, T %d M %d H %d: %s", w->pc.mp, w->pc.ep,
                        w->pc.esp, w->cfg.tokens, w->cfg.model_dim, w->cfg.hidden_dim,
                        moe_ctx_error(ctx));
            }
            if (est != MOE_STATUS_OK) {
              rc = CLI_USAGE;
              goto done;
            }
            rc = cli_memory_check_world(ctx, est, &need, o.max_memory,
                                        "lower --tokens, --model or --hidden, or raise "
                                        "--max-memory",
                                        rank);
            if (rc != CLI_OK) goto done;
          }
        }
      }
    }
  }
  if ((rc = cli_out_open_root(&out, o.json_path, rank)) != CLI_OK) {
    goto done;
  }
  if (rank == 0) {
    printf(
        "moe bench parm: Algorithm 1's alpha-beta terms, measured per layout (all-to-all of V "
        "elements a rank, MP-AllGather of n in all, the SAA pair in V; median of %d rounds at "
        "%d sizes, least squares):\n",
        PB_AB_ROUNDS, PB_AB_POINTS);
    fflush(stdout);
  }
  for (int l = 0; l < o.n_layout; l++) {
    int r_lo, r_hi, width;
    moe_parm_grid_ab_range(rows, n, l, &r_lo, &r_hi, &width);
    moe_parm_config pc;
    moe_parm_config_default(&pc);
    pc.mp = o.layout[l][0];
    pc.ep = o.layout[l][1];
    pc.esp = o.layout[l][2];
    pc.ranks_per_node = o.ranks_per_node;
    snprintf(pc.a2a, sizeof pc.a2a, "%s", o.a2a);
    moe_linear_fit fits[3];
    const moe_status st = moe_measure_parm_alpha_beta(ctx, MPI_COMM_WORLD, &pc, width, r_lo, r_hi,
                                                      PB_AB_POINTS, PB_AB_ROUNDS, &ab[l], fits);
    if (st == MOE_STATUS_COMM) {
      cli_error("%s", moe_ctx_error(ctx));
      MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
    }
    if (st != MOE_STATUS_OK) {
      if (rank == 0) cli_error("bench parm: %s", moe_ctx_error(ctx));
      rc = st == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
      goto done;
    }
    if (rank == 0) {
      const moe_parm_alpha_beta *a = &ab[l];
      printf(
          "  %dx%dx%d (rows %d..%d of %d): a2a %.3g ms + %.3g ns/elem (r2 %.3f), MP-AllGather "
          "%.3g ms + %.3g ns/elem (r2 %.3f), SAA pair %.3g ms + %.3g ns/elem (r2 %.3f)\n",
          pc.mp, pc.ep, pc.esp, r_lo, r_hi, width, a->alpha_a2a * 1e3, a->beta_a2a * 1e9,
          fits[0].r2, a->alpha_mp * 1e3, a->beta_mp * 1e9, fits[1].r2, a->alpha_o * 1e3,
          a->beta_o * 1e9, fits[2].r2);
      fflush(stdout);
    }
  }
  if (rank == 0) {
    printf(
        "moe bench parm: P=%d ranks, %d configs, E %d, top-%d, all-to-all %s, %d rounds after "
        "%d warm-up; ms are medians of the slowest rank's forward + backward\n",
        P, total, o.experts, o.top_k, o.a2a, o.bc.rounds, o.bc.warmup);
    if (o.chunks > 1)
      printf(
          "s1, s2 and s2+saa: the EP&ESP pass in %d chunks on the executor (task schedule "
          "%s); the baseline unchunked\n",
          o.chunks, rows[0].pc.task_schedule);
    if (o.compress)
      printf(
          "s1, s2 and s2+saa: the EP&ESP payloads compressed with %s (%s); the baseline "
          "uncompressed\n",
          o.compress, o.compress_backward ? "forward and backward" : "forward only");
    printf("\n");
    printf(
        "\n%-9s %5s %5s %5s %4s | %9s %9s %9s %9s | %6s %6s %6s | %7s %7s %7s | %4s %6s | "
        "%9s\n",
        "MPxEPxESP", "T", "M", "H", "f", "base ms", "s1 ms", "s2 ms", "s2+saa", "s1 x", "s2 x",
        "saa x", "a2a s1", "mp s1", "mp s2", "alg1", "faster", "max diff");
    fflush(stdout);
  }
  for (int i = 0; i < n; i++) {
    moe_parm_grid_row *w = &rows[i];
    const moe_status st = moe_measure_parm(ctx, MPI_COMM_WORLD, &w->cfg, &w->pc, &o.bc, w->r);
    if (st == MOE_STATUS_COMM) {  // peers may wait inside an exchange
      cli_error("%s", moe_ctx_error(ctx));
      MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
    }
    if (st != MOE_STATUS_OK) {  // agreed on every rank
      if (rank == 0) cli_error("bench parm: %s", moe_ctx_error(ctx));
      rc = st == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
      goto done;
    }
    moe_parm_grid_judge(w, &ab[w->layout]);
    const moe_parm_run_result *r = w->r;
    if (rank == 0) {
      char lay[32];
      snprintf(lay, sizeof lay, "%dx%dx%d", w->pc.mp, w->pc.ep, w->pc.esp);
      const double b = r[0].total_ms;
      printf(
          "%-9s %5d %5d %5d %4g | %9.2f %9.2f %9.2f %9.2f | %5.2fx %5.2fx %5.2fx | %7.2f "
          "%7.2f %7.2f | %4s %6s | %9.1e%s\n",
          lay, w->cfg.tokens, w->cfg.model_dim, w->cfg.hidden_dim, w->cfg.capacity_factor, b,
          r[1].total_ms, r[2].total_ms, r[3].total_ms, b / r[1].total_ms, b / r[2].total_ms,
          r[2].total_ms / r[3].total_ms, r[1].a2a_ms, r[1].mp_ms, r[2].mp_ms,
          w->pc.mp == 1 ? "-" : moe_parm_schedule_name(w->alg1),  // s1 = s2 without MP
          w->pc.mp == 1   ? "-"
          : w->faster < 0 ? "noise"
                          : moe_parm_schedule_name(w->faster),
          w->max_diff, r[1].dropped != r[0].dropped ? " (s1 drops differ)" : "");
      fflush(stdout);
    }
  }
  if (rank == 0) {
    moe_parm_grid_summary sum;
    moe_parm_grid_summarize(rows, n, &sum);
    printf(
        "\nspeedup over baseline: s1 %.2f-%.2fx, s2 %.2f-%.2fx, s2+saa %.2f-%.2fx (Parm: s1 "
        "2.1-5.77x, s2 1.99-5.38x over DeepSpeed-MoE on GPUs)\n",
        sum.lo[0], sum.hi[0], sum.lo[1], sum.hi[1], sum.lo[2], sum.hi[2]);
    printf(
        "Algorithm 1 (measured alpha-beta terms) picked the faster of s1 and s2+saa in %d of "
        "%d configs with MP > 1 where they differ beyond noise (quartiles apart); %d within "
        "noise\n",
        sum.right, sum.judged, sum.noise);
    moe_compressor comp;
    const int lossy = o.compress && moe_compressor_get(NULL, o.compress, &comp) == MOE_STATUS_OK &&
                      !comp.lossless;
    printf(
        "s2's outputs and input gradients against the baseline's: max relative difference "
        "%.1e (%s)\n",
        sum.worst_s2,
        lossy                  ? "not checked: the lossy compressor changes them"
        : sum.worst_s2 <= 1e-4 ? "ok"
                               : "FAIL: the schedules must keep the math");
    if (!lossy && sum.worst_s2 > 1e-4) rc = CLI_FAILED;
    if (out.f) {
      moe_parm_grid_write_json(out.f, rows, n, P, o.a2a, &o.bc);
      if (cli_out_commit(&out) != CLI_OK)
        rc = CLI_FAILED;
      else
        printf("wrote %s\n", o.json_path);
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
done:
  moe_watchdog_stop(wd);
  cli_out_abort(&out);
  free(rows);
  moe_ctx_destroy(ctx);
  MPI_Finalize();
  return rc;
}

#else  // !MOE_CLI_MPI

int cmd_bench_parm(int argc, char **argv) {
  (void)argc;
  (void)argv;
  cli_error("this moe was built without MPI: 'bench parm' is not available");
  return CLI_FAILED;
}

#endif
