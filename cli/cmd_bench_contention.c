// moe bench contention: Lina's Table 1 question on this cluster. Rounds of
// all-to-alls with gaps between them (one MoE layer's backward) run alone,
// beside a gradient sum started at once (FIFO, as DDP's buckets), and beside
// the same sum in micro-ops that Lina's priority starts only in the gaps; it
// prints each mode's all-to-all time, its slowdown against alone, the round
// time and the sum's wait (moe_measure_contention; docs/lina.md).
#include "cli.h"

#if MOE_CLI_MPI
#include <string.h>

#include "moe/comm.h"
#include "moe/measure_mpi.h"

typedef struct {
  const char *algo;
  moe_contention_config c;
  int ranks_per_node;
  const char *json_path;
  double hang_timeout;
  size_t max_memory;  // --max-memory per rank, 0: the node's available memory / its ranks
} ct_opts;

static void usage(FILE *f) {
  char names[256];
  moe_a2a_names(names, sizeof names, 0);
  fprintf(f,
          "usage: mpirun -n P moe bench contention [options]\n\n"
          "How much slower an all-to-all gets while dense gradients are summed over the\n"
          "same network (Lina, ATC'23, Table 1). A round is one MoE layer's backward:\n"
          "--layers all-to-alls, each followed by a gap of --gap-ms (the experts'\n"
          "compute; the rank sleeps and progresses the sum). Three modes, interleaved\n"
          "round by round:\n"
          "  alone  the all-to-alls only\n"
          "  fifo   a sum of --sum-bytes started when the round starts, a bucket per\n"
          "         operation, running beside the all-to-alls (DDP's buckets)\n"
          "  lina   the same sum in micro-ops of --micro-op-kb, one at a time, started\n"
          "         only in the gaps (the all-to-alls go first)\n"
          "Every time is the slowest rank's; the table gives medians and quartiles.\n\n"
          "options:\n"
          "  --algo NAME            all-to-all algorithm: %s [mpi]\n"
          "  --a2a-bytes S          bytes each rank sends per all-to-all, 0..1073741824\n"
          "                         (e.g. 1M) [1M]\n"
          "  --layers N             all-to-alls per round, 1..1000 [4]\n"
          "  --gap-ms G             the gap after each, 0..60000 ms [5]\n"
          "  --sum-bytes S          gradients summed beside them, 0..4G [4M]\n"
          "  --bucket-bytes S       their buckets, 0 = one bucket [0]; a bucket holds\n"
          "                         whole 64 KiB tensors, so one under 64 KiB holds one\n"
          "  --micro-op-kb K        lina's micro-ops, 1..1048576 KiB [256]\n"
          "  --deterministic on|off the sum: on, the fixed-order tree of deterministic\n"
          "                         training; off, MPI_Iallreduce [on]\n"
          "  --rounds N             timed rounds per mode, 1..100000 [10]\n"
          "  --warmup N             untimed rounds first, 0..1000 [2]\n"
          "  --ranks-per-node N     pretend every N consecutive ranks share a node [0: real]\n"
          "  --json FILE            write the table as JSON (rank 0)\n" CLI_MAX_MEMORY_HELP
              CLI_HANG_TIMEOUT_HELP,
          names);
}

// CLI_OK, CLI_USAGE, or -1 after --help.
static int parse_opts(int argc, char **argv, ct_opts *o) {
  memset(o, 0, sizeof *o);
  o->algo = "mpi";  // catalogue: the default all-to-all
  moe_contention_config_default(&o->c);
  o->hang_timeout = CLI_HANG_TIMEOUT_DEFAULT;
  cli_args a;
  cli_args_init(&a, argc, argv, 3);
  int micro_kb = (int)(o->c.micro_op_bytes >> 10);
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      usage(stdout);
      return -1;
    } else if (cli_opt(&a, "--algo") || cli_opt(&a, "--a2a")) {
      o->algo = a.value;
    } else if (cli_opt(&a, "--a2a-bytes")) {
      cli_parse_size_or_zero(&a, "--a2a-bytes", &o->c.a2a_bytes);
      if (!a.bad && o->c.a2a_bytes > ((size_t)1 << 30)) {
        cli_error("--a2a-bytes (%zu) must be in [0, 1073741824]", o->c.a2a_bytes);
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--layers")) {
      cli_parse_int(&a, "--layers", 1, 1000, &o->c.layers);
    } else if (cli_opt(&a, "--gap-ms")) {
      cli_parse_double(&a, "--gap-ms", 0, 60000, &o->c.gap_ms);
    } else if (cli_opt(&a, "--sum-bytes")) {
      cli_parse_size_or_zero(&a, "--sum-bytes", &o->c.sum_bytes);
      if (!a.bad && o->c.sum_bytes > ((size_t)1 << 32)) {
        cli_error("--sum-bytes (%zu) must be in [0, 4294967296]", o->c.sum_bytes);
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--bucket-bytes")) {
      cli_parse_size_or_zero(&a, "--bucket-bytes", &o->c.bucket_bytes);
    } else if (cli_opt(&a, "--micro-op-kb")) {
      cli_parse_int(&a, "--micro-op-kb", 1, 1048576, &micro_kb);
    } else if (cli_opt(&a, "--deterministic")) {
      cli_parse_on_off(&a, "--deterministic", &o->c.deterministic);
    } else if (cli_opt(&a, "--rounds")) {
      cli_parse_int(&a, "--rounds", 1, 100000, &o->c.rounds);
    } else if (cli_opt(&a, "--warmup")) {
      cli_parse_int(&a, "--warmup", 0, 1000, &o->c.warmup);
    } else if (cli_opt(&a, "--ranks-per-node")) {
      cli_parse_int(&a, "--ranks-per-node", 0, 1 << 20, &o->ranks_per_node);
    } else if (cli_opt(&a, "--json")) {
      o->json_path = a.value;
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &o->max_memory);
    } else if (cli_hang_timeout_opt(&a, &o->hang_timeout)) {
    } else {
      cli_error("unknown option '%s' for 'moe bench contention' (see --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
  }
  if (a.bad) return CLI_USAGE;
  o->c.micro_op_bytes = (size_t)micro_kb << 10;
  return CLI_OK;
}

static void write_json(FILE *f, const ct_opts *o, const char *algo, int P, int nodes,
                       const moe_contention_result *res) {
  const moe_contention_config *c = &o->c;
  fprintf(f,
          "{\n  \"benchmark\": \"contention\",\n  \"ranks\": %d,\n  \"nodes\": %d,\n  \"algo\": "
          "\"%s\",\n  \"a2a_bytes\": %zu,\n  \"layers\": %d,\n  \"gap_ms\": %g,\n  "
          "\"sum_bytes\": %zu,\n  \"bucket_bytes\": %zu,\n  \"micro_op_bytes\": %zu,\n  "
          "\"deterministic\": %s,\n  \"rounds\": %d,\n  \"warmup\": %d,\n  \"modes\": [",
          P, nodes, algo, c->a2a_bytes, c->layers, c->gap_ms, c->sum_bytes, c->bucket_bytes,
          c->micro_op_bytes, c->deterministic ? "true" : "false", c->rounds, c->warmup);
  int first = 1;
  for (int m = 0; m < MOE_CONTENTION_MODES; m++) {
    const moe_contention_result *r = &res[m];
    if (!r->ran) continue;
    fprintf(f,
            "%s\n    {\"mode\": \"%s\", \"a2a_ms\": %.6f, \"a2a_q1\": %.6f, \"a2a_q3\": %.6f, "
            "\"slowdown\": %.6f, \"round_ms\": %.6f, \"round_q1\": %.6f, \"round_q3\": %.6f, "
            "\"sum_wait_ms\": %.6f, \"micro_ops\": %d, \"sum\": \"%s\"}",
            first ? "" : ",", moe_contention_mode_name(m), r->a2a_ms, r->a2a_q1, r->a2a_q3,
            res[0].a2a_ms > 0 ? r->a2a_ms / res[0].a2a_ms : 0.0, r->round_ms, r->round_q1,
            r->round_q3, r->sum_wait_ms, r->micro_ops,
            m == MOE_CONTENTION_ALONE ? "-" : (r->sum_bad ? "FAIL" : "ok"));
    first = 0;
  }
  fprintf(f, "\n  ]\n}\n");
}

int cmd_bench_contention(int argc, char **argv) {
  ct_opts o;
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
  moe_group g;
  memset(&g, 0, sizeof g);
  int have_group = 0;
  cli_out out = {0};
  moe_watchdog *wd = NULL;
  const moe_a2a_algo *algo = NULL;
  moe_contention_result res[MOE_CONTENTION_MODES];
  memset(res, 0, sizeof res);

  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    rc = CLI_FAILED;
    goto done;
  }
  if (moe_launch_check(ctx) != MOE_STATUS_OK) {
    cli_error("bench contention: %s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  if (cli_watchdog_start(ctx, o.hang_timeout, rank, &wd) != CLI_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  if (moe_a2a_find(ctx, o.algo, &algo) != MOE_STATUS_OK) {  // the same argv on every rank
    if (rank == 0) cli_error("--algo: %s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  if ((rc = cli_out_open_root(&out, o.json_path, rank)) != CLI_OK) {
    goto done;
  }
  if (moe_group_init_topology(ctx, &g, MPI_COMM_WORLD, o.ranks_per_node) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("%s", moe_ctx_error(ctx));
    rc = moe_ctx_status(ctx) == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
    goto done;
  }
  have_group = 1;
  if (moe_a2a_check_topology(ctx, algo, &g) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("--algo: %s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  {  // the memory bound: every rank's buffers, agreed before they are allocated
    moe_memory_need need;
    const moe_status est =
        moe_measure_contention_memory(ctx, P, o.ranks_per_node, algo, &o.c, &need);
    rc = cli_memory_check_world(ctx, est, &need, o.max_memory,
                                "lower --a2a-bytes or --sum-bytes, or raise --max-memory", rank);
    if (rc != CLI_OK) goto done;
  }
  if (rank == 0) {
    printf(
        "moe bench contention: P=%d ranks on %d node%s, all-to-all %s of %zu bytes per rank, "
        "%d per round with %g ms gaps; sum of %zu bytes (%s order, buckets %zu bytes, lina's "
        "micro-ops %zu bytes); %d rounds after %d warm-up, slowest rank\n\n",
        P, g.num_nodes, g.num_nodes == 1 ? "" : "s", algo->name, o.c.a2a_bytes, o.c.layers,
        o.c.gap_ms, o.c.sum_bytes, o.c.deterministic ? "fixed" : "MPI", o.c.bucket_bytes,
        o.c.micro_op_bytes, o.c.rounds, o.c.warmup);
    fflush(stdout);
  }
  const moe_status st = moe_measure_contention(ctx, &g, algo, &o.c, res);
  if (st == MOE_STATUS_COMM) {  // peers may wait inside an exchange
    cli_error("%s", moe_ctx_error(ctx));
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  if (st != MOE_STATUS_OK) {  // agreed on every rank
    if (rank == 0) cli_error("bench contention: %s", moe_ctx_error(ctx));
    rc = st == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
    goto done;
  }
  if (rank == 0) {
    printf("%-6s %10s %19s %9s %10s %19s %12s %9s %5s\n", "mode", "a2a(ms)", "a2a q1-q3",
           "slowdown", "round(ms)", "round q1-q3", "sum wait(ms)", "micro-ops", "sum");
    for (int m = 0; m < MOE_CONTENTION_MODES; m++) {
      const moe_contention_result *r = &res[m];
      if (!r->ran) continue;
      const int alone = m == MOE_CONTENTION_ALONE;
      char aq[32], rq[32], wait[32] = "-", ops[32] = "-";
      snprintf(aq, sizeof aq, "%.2f-%.2f", r->a2a_q1, r->a2a_q3);
      snprintf(rq, sizeof rq, "%.1f-%.1f", r->round_q1, r->round_q3);
      if (!alone) {
        snprintf(wait, sizeof wait, "%.2f", r->sum_wait_ms);
        snprintf(ops, sizeof ops, "%d", r->micro_ops);
      }
      printf("%-6s %10.3f %19s %8.2fx %10.2f %19s %12s %9s %5s\n", moe_contention_mode_name(m),
             r->a2a_ms, aq, res[0].a2a_ms > 0 ? r->a2a_ms / res[0].a2a_ms : 0.0, r->round_ms, rq,
             wait, ops, alone ? "-" : (r->sum_bad ? "FAIL" : "ok"));
      if (!alone && r->sum_bad) rc = CLI_FAILED;
    }
    if (out.f) {
      write_json(out.f, &o, algo->name, P, g.num_nodes, res);
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
  if (have_group) moe_group_free(&g);
  moe_ctx_destroy(ctx);
  MPI_Finalize();
  return rc;
}

#else  // !MOE_CLI_MPI

int cmd_bench_contention(int argc, char **argv) {
  (void)argc;
  (void)argv;
  cli_error("this moe was built without MPI: 'bench contention' is not available");
  return CLI_FAILED;
}

#endif
