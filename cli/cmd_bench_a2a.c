// moe bench a2a: an OSU / nccl-tests style benchmark of the all-to-all
// algorithms under mpirun. For each algorithm and each per-rank buffer size S
// (doubling from --min-bytes to --max-bytes) it prints the median time (the
// slowest rank of each iteration, median over iterations), algbw = S / time,
// busbw = algbw * (P-1)/P, and whether the received bytes were right.
//
// `bare` is not a registered algorithm: it is a plain MPI_Alltoallv loop with
// the same timing, so `mpi` next to it shows what the harness adds.
#define _POSIX_C_SOURCE 200809L  // strtok_r
#include "cli.h"

#if MOE_CLI_MPI
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/measure_mpi.h"

typedef struct {
  const char *algo;  // name, "all" or "bare"
  size_t min_bytes, max_bytes;
  int skewed;
  int check;
  int iters, warmup;
  int ranks_per_node;
  int grouped_size;
  int bound;
  const char *json_path;
  double hang_timeout;  // --hang-timeout, seconds (0: off)
  size_t max_memory;    // --max-memory per rank, 0: the node's available memory / its ranks
} a2a_opts;

// --bound (ScheMoE eq. 16-18) compares Pipe-A2A with the sequential pairwise
// exchange: the two algorithms the paper's bound is about, by name.
static const char *const k_bound_pipe = "pipe";     // catalogue: ScheMoE eq. 18's Pipe-A2A
static const char *const k_bound_seq = "pairwise";  // catalogue: eq. 18's sequential pairs

static void usage(FILE *f) {
  char names[256];
  moe_a2a_names(names, sizeof names, 0);
  fprintf(
      f,
      "usage: mpirun -n P moe bench a2a [options]\n"
      "\n"
      "Times the all-to-all algorithms over a size sweep. S is the bytes one rank\n"
      "sends in total (its whole send buffer, split over the P destinations).\n"
      "\n"
      "options (default in brackets):\n"
      "  --algo LIST            (or --a2a) comma-separated: %s,\n"
      "                         bare (a plain MPI_Alltoallv loop), all (every algorithm\n"
      "                         and bare) [all]\n"
      "  --min-bytes S          smallest per-rank buffer, >= 0 [1024]\n"
      "  --max-bytes S          largest per-rank buffer, <= 1 GiB [16777216]\n"
      "  --counts uniform|skewed  uniform: S/P to every rank; skewed: rank d gets a\n"
      "                         share proportional to 2^-(d mod 4) (hot ranks) [uniform]\n"
      "  --check                verify every received byte (payload encodes source,\n"
      "                         destination and index)\n"
      "  --bound                also time %s, %s, `intra` and `inter` (%s moving "
      "only the\n"
      "                         same-node / only the other-node blocks) and print\n"
      "                         ScheMoE's eq. 18 bound (intra+inter)/max(intra,inter)\n"
      "                         next to %s's speedup over %s\n"
      "  --iters N              timed iterations per size, 1..10000 [20]\n"
      "  --warmup N             untimed iterations first, 0..1000 [3]\n"
      "  --ranks-per-node N     pretend every N consecutive ranks share a node\n"
      "                         (also MOE_RANKS_PER_NODE); 0 = from MPI [0]\n"
      "  --group-size G         group size of `grouped` (0 = ranks per node when nodes\n"
      "                         are uniform, else 1) [0]\n"
      "  --json FILE            write every row as JSON (rank 0)\n"
      "  --max-memory SIZE      refuse to start when a rank would need more than SIZE\n"
      "                         (e.g. 512M, 2G; per rank) [the node's MemAvailable, or\n"
      "                         its cgroup's memory.max room, / its ranks]\n" CLI_HANG_TIMEOUT_HELP,
      names, k_bound_seq, k_bound_pipe, k_bound_pipe, k_bound_pipe, k_bound_seq);
}

static int parse_size(cli_args *a, const char *opt, size_t *out) {
  char *end = NULL;
  errno = 0;
  const unsigned long long v = strtoull(a->value, &end, 10);
  if (!a->value || end == a->value || *end != '\0' || errno == ERANGE || strchr(a->value, '-') ||
      v > (1ull << 30)) {
    cli_error("%s (%s) must be an integer in [0, 1073741824]", opt, a->value ? a->value : "");
    a->bad = 1;
    return 0;
  }
  *out = (size_t)v;
  return 1;
}

static int parse_opts(int argc, char **argv, a2a_opts *o) {
  memset(o, 0, sizeof *o);
  o->algo = "all";
  o->min_bytes = 1024;
  o->max_bytes = 16u << 20;
  o->iters = 20;
  o->warmup = 3;
  o->hang_timeout = CLI_HANG_TIMEOUT_DEFAULT;
  cli_args a;
  cli_args_init(&a, argc, argv, 3);
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      usage(stdout);
      return -1;
    } else if (cli_opt(&a, "--algo") || cli_opt(&a, "--a2a")) {
      o->algo = a.value;
    } else if (cli_opt(&a, "--min-bytes")) {
      if (a.value) parse_size(&a, "--min-bytes", &o->min_bytes);
    } else if (cli_opt(&a, "--max-bytes")) {
      if (a.value) parse_size(&a, "--max-bytes", &o->max_bytes);
    } else if (cli_opt(&a, "--counts")) {
      if (a.value && strcmp(a.value, "uniform") == 0) {
        o->skewed = 0;
      } else if (a.value && strcmp(a.value, "skewed") == 0) {
        o->skewed = 1;
      } else if (a.value) {
        cli_error("--counts '%s' is unknown (valid: uniform, skewed)", a.value);
        a.bad = 1;
      }
    } else if (cli_flag(&a, "--check")) {
      o->check = 1;
    } else if (cli_flag(&a, "--bound")) {
      o->bound = 1;
    } else if (cli_opt(&a, "--iters")) {
      cli_parse_int(&a, "--iters", 1, 10000, &o->iters);
    } else if (cli_opt(&a, "--warmup")) {
      cli_parse_int(&a, "--warmup", 0, 1000, &o->warmup);
    } else if (cli_opt(&a, "--ranks-per-node")) {
      cli_parse_int(&a, "--ranks-per-node", 0, 1 << 20, &o->ranks_per_node);
    } else if (cli_opt(&a, "--group-size")) {
      cli_parse_int(&a, "--group-size", 0, 1 << 20, &o->grouped_size);
    } else if (cli_opt(&a, "--json")) {
      o->json_path = a.value;
    } else if (cli_hang_timeout_opt(&a, &o->hang_timeout)) {
      // consumed
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &o->max_memory);
    } else {
      cli_error("unknown option '%s' for 'moe bench a2a' (see --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
  }
  if (!a.bad && o->min_bytes > o->max_bytes) {
    cli_error("--min-bytes (%zu) must be <= --max-bytes (%zu)", o->min_bytes, o->max_bytes);
    a.bad = 1;
  }
  return a.bad ? CLI_USAGE : CLI_OK;
}

// Block sizes: counts[s * P + d] = bytes rank s sends to rank d for a per-rank
// buffer of S bytes; the same on every rank, so no counts exchange is needed.
static void make_counts(size_t *counts, int P, size_t S, int skewed) {
  for (int s = 0; s < P; s++) {
    double wsum = 0.0;
    for (int d = 0; d < P; d++) wsum += skewed ? 1.0 / (double)(1 << (d % 4)) : 1.0;
    size_t given = 0;
    for (int d = 0; d < P; d++) {
      const double w = skewed ? 1.0 / (double)(1 << (d % 4)) : 1.0;
      counts[(size_t)s * P + d] = d == P - 1 ? S - given : (size_t)((double)S * w / wsum);
      given += counts[(size_t)s * P + d];
    }
  }
}

typedef struct {
  const char *algo;
  size_t bytes;
  double ms, algbw, busbw;
  const char *check;
} a2a_row;

typedef struct {
  size_t bytes;
  double bound, model_speedup, speedup;
} a2a_bound;

// --algo: a comma-separated list of names, "bare" and "all", validated
// identically on every rank (same argv); at most 12. CLI_OK or CLI_USAGE.
static int collect_names(moe_ctx *ctx, const a2a_opts *o, int rank, const char **names,
                         int *nnames) {
  int nalgos = 0;
  const moe_a2a_algo *const *algos = moe_a2a_list(&nalgos);
  char list[256];
  *nnames = 0;
  snprintf(list, sizeof list, "%s", o->algo);
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    const char *add[16];
    int nadd = 0;
    if (strcmp(tok, "all") == 0) {
      for (int i = 0; i < nalgos && nadd < 15; i++) add[nadd++] = algos[i]->name;
      add[nadd++] = "bare";
    } else if (strcmp(tok, "bare") == 0) {
      add[nadd++] = "bare";
    } else {
      const moe_a2a_algo *found = NULL;
      if (moe_a2a_find(ctx, tok, &found) != MOE_STATUS_OK) {
        if (rank == 0) cli_error("--algo: %s (or all, bare)", moe_ctx_error(ctx));
        return CLI_USAGE;
      }
      add[nadd++] = found->name;
    }
    for (int i = 0; i < nadd; i++) {
      int have = 0;
      for (int j = 0; j < *nnames; j++) have |= strcmp(names[j], add[i]) == 0;
      if (!have && *nnames < 12) names[(*nnames)++] = add[i];
    }
  }
  if (*nnames == 0) {
    if (rank == 0) cli_error("--algo needs at least one name (see --help)");
    return CLI_USAGE;
  }
  return CLI_OK;
}

// The rows and eq. 18 summaries as JSON (rank 0), committed atomically.
static int write_a2a_json(cli_out *out, const a2a_opts *o, int P, int nodes, const a2a_row *rows,
                          int nrows, const a2a_bound *bounds, int nbounds) {
  FILE *json = out->f;
  fprintf(json, "{\n  \"benchmark\": \"a2a\",\n  \"ranks\": %d,\n  \"nodes\": %d,\n", P, nodes);
  fprintf(json, "  \"counts\": \"%s\",\n  \"iters\": %d,\n  \"warmup\": %d,\n  \"rows\": [\n",
          o->skewed ? "skewed" : "uniform", o->iters, o->warmup);
  for (int i = 0; i < nrows; i++) {
    fprintf(json,
            "    {\"algo\": \"%s\", \"bytes\": %zu, \"time_ms\": %.6f, \"algbw_gbs\": %.6f, "
            "\"busbw_gbs\": %.6f, \"check\": \"%s\"}%s\n",
            rows[i].algo, rows[i].bytes, rows[i].ms, rows[i].algbw, rows[i].busbw, rows[i].check,
            i + 1 < nrows ? "," : "");
  }
  fprintf(json, "  ],\n  \"eq18\": [");
  for (int i = 0; i < nbounds; i++) {
    fprintf(json,
            "%s\n    {\"bytes\": %zu, \"bound\": %.6f, \"pipe_over_sequential_model\": %.6f, "
            "\"pipe_over_pairwise\": %.6f}",
            i ? "," : "", bounds[i].bytes, bounds[i].bound, bounds[i].model_speedup,
            bounds[i].speedup);
  }
  fprintf(json, "\n  ]\n}\n");
  return cli_out_commit(out);
}

int cmd_bench_a2a(int argc, char **argv) {
  a2a_opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc < 0) return CLI_OK;
  if (rc != CLI_OK) return rc;

  int provided = 0, rank = 0, P = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  moe_ctx *ctx = NULL;
  moe_group g;
  memset(&g, 0, sizeof g);
  moe_workspace ws = {0};
  size_t *counts = NULL, *sc = NULL, *sd = NULL, *rcnt = NULL, *rd = NULL;
  unsigned char *sbuf = NULL, *rbuf = NULL;
  a2a_row *rows = NULL;
  int nrows = 0;
  a2a_bound bounds[64];
  int nbounds = 0;
  cli_out out = {0};
  FILE *json = NULL;
  int have_group = 0;
  moe_watchdog *wd = NULL;

  const char *names[16];
  int nnames = 0;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    rc = CLI_FAILED;
    goto done;
  }
  if (moe_launch_check(ctx) != MOE_STATUS_OK) {
    cli_error("bench a2a: %s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  if (cli_watchdog_start(ctx, o.hang_timeout, rank, &wd) != CLI_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  rc = collect_names(ctx, &o, rank, names, &nnames);
  if (rc != CLI_OK) goto done;
  if (o.bound) {  // the variants the eq. 18 summary needs
    const char *need[4] = {k_bound_seq, k_bound_pipe, "intra", "inter"};
    for (int i = 0; i < 4; i++) {
      int have = 0;
      for (int j = 0; j < nnames; j++) have |= strcmp(names[j], need[i]) == 0;
      if (!have) names[nnames++] = need[i];
    }
  }
  // Rank 0 opens the JSON output now, and every rank learns whether it could.
  if ((rc = cli_out_open_root(&out, o.json_path, rank)) != CLI_OK) {
    goto done;
  }
  json = out.f;

  if (moe_group_init_topology(ctx, &g, MPI_COMM_WORLD, o.ranks_per_node) != MOE_STATUS_OK) {
    // Topology errors (a ranks-per-node that does not divide P) are the same on every rank.
    if (rank == 0) cli_error("%s", moe_ctx_error(ctx));
    rc = moe_ctx_status(ctx) == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
    goto done;
  }
  have_group = 1;
  g.grouped_size = o.grouped_size;

  const size_t PP = (size_t)P;
  counts = moe_malloc(PP * PP * sizeof(size_t));
  sc = moe_malloc(PP * sizeof(size_t));
  sd = moe_malloc(PP * sizeof(size_t));
  rcnt = moe_malloc(PP * sizeof(size_t));
  rd = moe_malloc(PP * sizeof(size_t));
  const int max_rows = nnames * 64;
  rows = moe_calloc((size_t)max_rows, sizeof(a2a_row));
  // The most any rank receives (counts grow with S, so at the largest size);
  // the same on every rank, so an oversized sweep fails everywhere.
  size_t recv_max = 0;
  if (counts) {
    make_counts(counts, P, o.max_bytes, o.skewed);
    for (int r = 0; r < P; r++) {
      size_t sum = 0;
      for (int q = 0; q < P; q++) sum += counts[(size_t)q * PP + r];
      if (sum > recv_max) recv_max = sum;
    }
  }
  if (recv_max > INT_MAX) {
    if (rank == 0) {
      cli_error(
          "--max-bytes %zu makes one rank receive %zu bytes; MPI's int displacements allow "
          "%d (lower --max-bytes or use uniform counts)",
          o.max_bytes, recv_max, INT_MAX);
    }
    rc = CLI_USAGE;
    goto done;
  }
  {
    // The memory bound: every rank's buffers for the largest size, agreed
    // before they are allocated.
    moe_memory_need need;
    const moe_status est = moe_measure_a2a_memory(ctx, P, o.ranks_per_node, o.max_bytes, recv_max,
                                                  names, nnames, o.iters, &need);
    rc = cli_memory_check_world(ctx, est, &need, o.max_memory,
                                "lower --max-bytes, use uniform counts, or raise --max-memory",
                                rank);
    if (rc != CLI_OK) goto done;
  }
  sbuf = moe_malloc(o.max_bytes + 1);
  rbuf = moe_malloc(recv_max + 1);
  if (!counts || !sc || !sd || !rcnt || !rd || !rows || !sbuf || !rbuf) {
    cli_error("rank %d: cannot allocate buffers for %zu bytes per rank", rank, o.max_bytes);
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }

  if (rank == 0) {
    printf(
        "moe bench a2a: P=%d ranks on %d node%s (%s), counts=%s, %d iterations after %d "
        "warm-up, median of the slowest rank\n\n",
        P, g.num_nodes, g.num_nodes == 1 ? "" : "s", g.uniform ? "uniform" : "non-uniform",
        o.skewed ? "skewed" : "uniform", o.iters, o.warmup);
    printf("%-9s %12s %12s %12s %12s %7s\n", "algo", "bytes", "time(us)", "algbw(GB/s)",
           "busbw(GB/s)", "check");
  }
  for (size_t S = o.min_bytes;; S = S ? S * 2 : 1) {
    make_counts(counts, P, S, o.skewed);
    double t_of[4] = {0, 0, 0, 0};  // pairwise, pipe, intra, inter (for --bound)
    for (int a = 0; a < nnames; a++) {
      const int bare = strcmp(names[a], "bare") == 0;
      // "intra" / "inter": pipe with only the same-node / other-node blocks
      const int mask = strcmp(names[a], "intra") == 0 ? 1 : strcmp(names[a], "inter") == 0 ? 2 : 0;
      const moe_a2a_algo *algo = NULL;
      if (!bare) moe_a2a_find(ctx, mask ? k_bound_pipe : names[a], &algo);
      if (algo && algo->needs_uniform_nodes && !g.uniform) {
        if (rank == 0) printf("%-9s %12zu %12s %12s %12s %7s\n", names[a], S, "-", "-", "-", "n/a");
        continue;
      }
      size_t so = 0, ro = 0, moved = 0;
      for (int d = 0; d < P; d++) {
        const int same = g.node_of[d] == g.node;
        const int keep = mask == 0 || (mask == 1 && same) || (mask == 2 && !same);
        sc[d] = keep ? counts[(size_t)rank * PP + d] : 0;
        sd[d] = so;
        so += sc[d];
        rcnt[d] = keep ? counts[(size_t)d * PP + rank] : 0;
        rd[d] = ro;
        ro += rcnt[d];
        moved += sc[d];
      }
      moe_measure_a2a_result m;
      const moe_status st = moe_measure_a2a(ctx, &g, bare ? NULL : algo, sc, sd, rcnt, rd, sbuf,
                                            rbuf, &ws, o.iters, o.warmup, o.check, &m);
      if (st == MOE_STATUS_COMM) {
        // a failure inside an exchange leaves the others waiting: abort the job
        cli_error("%s: %s", names[a], moe_ctx_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
      }
      if (st != MOE_STATUS_OK) {  // agreed on every rank
        if (rank == 0) cli_error("%s: %s", names[a], moe_ctx_error(ctx));
        rc = CLI_FAILED;
        goto done;
      }
      const double t = m.median_s;
      const int bad = m.bad;
      // algbw counts the bytes this variant moves (all of S unless masked)
      const double algbw = t > 0 ? (double)(mask ? moved : S) / t / 1e9 : 0.0;
      const double busbw = algbw * (P - 1) / P;
      const char *check = o.check ? (bad ? "FAIL" : "ok") : "-";
      if (bad) rc = CLI_FAILED;
      if (strcmp(names[a], k_bound_seq) == 0) t_of[0] = t;
      if (strcmp(names[a], k_bound_pipe) == 0) t_of[1] = t;
      if (mask) t_of[1 + mask] = t;
      if (rank == 0) {
        printf("%-9s %12zu %12.2f %12.3f %12.3f %7s\n", names[a], S, t * 1e6, algbw, busbw, check);
        fflush(stdout);
        if (nrows < max_rows) rows[nrows++] = (a2a_row){names[a], S, t * 1e3, algbw, busbw, check};
      }
    }
    if (o.bound && rank == 0 && t_of[1] > 0 && t_of[2] > 0 && t_of[3] > 0) {
      // ScheMoE eq. 16-18 from the measured intra-only and inter-only times:
      // t_seq = intra + inter (eq. 17), t_ideal = max(intra, inter) (eq. 16),
      // bound = t_seq / t_ideal (eq. 18). Pipe's speedup in the model's terms is
      // t_seq / t_pipe, i.e. t_ideal / t_pipe of the bound; the measured
      // pairwise can beat t_seq (its steps overlap intra and inter transfers of
      // different ranks), so its ratio is printed too.
      const double t_seq = t_of[2] + t_of[3];
      const double t_ideal = t_of[2] > t_of[3] ? t_of[2] : t_of[3];
      const double bound = t_seq / t_ideal;
      const double speedup = t_of[0] > 0 ? t_of[0] / t_of[1] : 0.0;
      printf(
          "%-9s %12zu   eq.18 bound %.3f; %s reaches %.1f%% of it (t_seq/t_pipe %.3f); "
          "measured %s over %s %.3f (%.1f%%)\n",
          "bound", S, bound, k_bound_pipe, 100.0 * t_ideal / t_of[1], t_seq / t_of[1], k_bound_pipe,
          k_bound_seq, speedup, 100.0 * speedup / bound);
      if (nbounds < 64) bounds[nbounds++] = (a2a_bound){S, bound, t_seq / t_of[1], speedup};
    }
    if (S >= o.max_bytes || S > o.max_bytes / 2) break;
  }
  if (rank == 0 && json) {
    json = NULL;
    if (write_a2a_json(&out, &o, P, g.num_nodes, rows, nrows, bounds, nbounds) != CLI_OK) {
      rc = CLI_FAILED;
    } else {
      printf("wrote %s\n", o.json_path);
    }
  }
done:
  moe_watchdog_stop(wd);
  cli_out_abort(&out);
  moe_workspace_free(&ws);
  if (have_group) moe_group_free(&g);
  moe_free(counts);
  moe_free(sc);
  moe_free(sd);
  moe_free(rcnt);
  moe_free(rd);
  moe_free(rows);
  moe_free(sbuf);
  moe_free(rbuf);
  moe_ctx_destroy(ctx);
  MPI_Finalize();
  return rc;
}

#else  // !MOE_CLI_MPI

int cmd_bench_a2a(int argc, char **argv) {
  (void)argc;
  (void)argv;
  cli_error("this moe was built without MPI: 'bench a2a' is not available");
  return CLI_FAILED;
}

#endif
