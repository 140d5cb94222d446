// moe bench layer, distributed: times the expert-parallel layer (moe_ep_layer,
// include/moe/parallel.h) under mpirun for every variant of a2a algorithm x
// compressor x (schedule, chunks), next to the sequential schedule at r = 1 of
// the same a2a and compressor, and reports per variant the forward, backward
// and total time, the speedup over that baseline, the pass's compute and
// communication busy time, the communication not hidden by compute, and the
// overlap efficiency against ScheMoE's ideal bound (comm + comp) / max(comm,
// comp) (eq. 18 applied to the whole pass).
//
// Every number of an iteration is the slowest rank's (MPI_Allreduce MAX of each
// quantity separately); the table shows medians over the timed iterations.
// `cmd_bench_layer` (bench_layer.c) hands over to cmd_bench_layer_ep when an
// option of this benchmark is given or the job has more than one rank.
#define _POSIX_C_SOURCE 200809L  // strtok_r, fileno, dup
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "moe/compress.h"
#include "moe/perf.h"
#if MOE_CLI_MPI
#include "moe/comm.h"
#include "moe/measure_mpi.h"
#include "moe/parallel.h"
#define EP_MAX_CHUNKS MOE_MAX_CHUNKS
#else
#define EP_MAX_CHUNKS 64
#endif

// Options that select the distributed benchmark.
static const char *const ep_only_opts[] = {"--schedule",
                                           "--chunks",
                                           "--a2a",
                                           "--compress",
                                           "--compress-backward",
                                           "--grid",
                                           "--ep",
                                           "--ranks-per-node",
                                           "--trace",
                                           "--profile",
                                           "--allow-lossy",
                                           "--hang-timeout",
                                           "--balance",
                                           "--balance-slots",
                                           "--replan-every",
                                           "--gate"};

int cli_bench_layer_is_ep(int argc, char **argv) {
  for (int i = 3; i < argc; i++) {
    for (size_t k = 0; k < sizeof ep_only_opts / sizeof ep_only_opts[0]; k++) {
      const size_t n = strlen(ep_only_opts[k]);
      if (strncmp(argv[i], ep_only_opts[k], n) == 0 && (argv[i][n] == '\0' || argv[i][n] == '=')) {
        return 1;
      }
    }
  }
#if MOE_CLI_MPI
  return moe_launcher_size(NULL) > 1;  // the job has several ranks
#else
  return 0;
#endif
}

void cli_bench_layer_ep_usage(FILE *f) {
  // the options that select this benchmark, from the list that does
  char which[512] = "";
  const size_t n_opts = sizeof ep_only_opts / sizeof ep_only_opts[0];
  size_t len = 0, line = 0;
  for (size_t k = 0; k < n_opts; k++) {
    char item[48];
    const int w = snprintf(item, sizeof item, "%s%s%s", ep_only_opts[k],
                           k + 2 < n_opts   ? ","
                           : k + 1 < n_opts ? " or"
                                            : "",
                           k + 1 < n_opts ? " " : "");
    if (line + (size_t)w > 78 && len + 1 < sizeof which) {  // wrap at the help's width
      which[len - 1] = '\n';
      line = 0;
    }
    len += (size_t)snprintf(which + len, sizeof which - len, "%s", item);
    line += (size_t)w;
    if (len >= sizeof which) break;
  }
  char a2a[256] = "mpi";  // catalogue: shown when this build has no MPI
#if MOE_CLI_MPI
  moe_a2a_names(a2a, sizeof a2a, 0);
#endif
  fprintf(f,
          "\n"
          "distributed benchmark (MPI): 'mpirun -n P moe bench layer [options]', or one\n"
          "process as an MPI singleton. Used instead of the above when any of\n%s\n"
          "is given, or when the job has more than one rank.%s\n"
          "Times the expert-parallel layer forward and backward for every variant\n"
          "a2a x compress x (schedule, chunks); sequential at r=1 always runs as the\n"
          "baseline of each (a2a, compress). The variants of one (a2a, compress) run\n"
          "interleaved (each iteration runs every variant once), so machine noise hits\n"
          "them alike. Each iteration starts after a barrier; every number is the\n"
          "slowest rank's, the tables show medians over the iterations.\n"
          "\n"
          "options (default in brackets):\n"
          "  --tokens T             tokens per rank [1024]\n"
          "  --model M              model dimension [512]\n"
          "  --hidden H             expert hidden dimension [1024]\n"
          "  --experts E            number of experts, divisible by the EP size [2 x ranks]\n"
          "  --topk K               experts per token, 1..E [2]\n"
          "  --capacity-factor F    capacity per (source rank, expert) C = ceil(F*K*T/E);\n"
          "                         F <= 0 is dropless [1.2]\n"
          "  --act gelu|relu        expert activation [gelu]\n"
          "  --renormalize          renormalise the kept top-k gate weights\n"
          "  --config FILE          layer config JSON (its tokens are per rank); options\n"
          "                         after it override it\n"
          "  --ep N                 EP size: ranks one set of experts is spread over; must\n"
          "                         divide the ranks; DP = ranks / N [ranks]\n"
          "  --ranks-per-node N     pretend every N consecutive ranks share a node (must\n"
          "                         divide the ranks); 0 = from MPI [0]\n"
          "  --a2a LIST             all-to-all algorithms, comma-separated, or all:\n"
          "                         %s [mpi]\n"
          "  --schedule LIST        schedules, comma-separated, or all:\n"
          "                         %s [all]\n"
          "  --chunks LIST          chunks r of a pass, comma-separated, 1..%d [2]; smart\n"
          "                         ignores it (r = peer groups)\n"
          "  --compress LIST        compressors of the all-to-all payloads, comma-separated:\n"
          "                         %s [none]\n"
          "  --compress-backward    also compress the backward's gradients\n"
          "  --wait blocking|poll-backoff|adaptive\n"
          "                         how the communication thread waits for MPI: block,\n"
          "                         poll with back-off sleeps, or back off only while a\n"
          "                         compute task runs beside the exchange [%s]\n"
          "  --profile FILE         a profile from 'moe calibrate' on these ranks: adds the\n"
          "                         predicted time of every variant (pred ms, error), and\n"
          "                         lets --a2a, --schedule, --chunks and --compress be\n"
          "                         'auto' (the planner picks the least predicted time)\n"
          "  --allow-lossy          let --compress auto pick lossy compressors\n"
          "  --poll-us MIN,MAX      poll-backoff sleeps, microseconds, doubling from MIN to\n"
          "                         MAX [the executor's defaults]\n"
          "  --iters N              timed iterations per variant, 1..10000 [5; 3 with --grid]\n"
          "  --warmup N             untimed iterations first, 0..1000 [1; at least 1 with\n"
          "                         --balance: the first measures the planners' rates]\n"
          "  --threads N            compute threads per rank, 1..256 [1]\n"
          "  --seed S               parameter and input seed [1]\n"
          "  --json FILE            write the configs and every variant's numbers (rank 0)\n"
          "  --trace FILE           Chrome trace (Perfetto, chrome://tracing) of the last\n"
          "                         timed iteration of the last variant: every rank's\n"
          "                         forward pass, then its backward pass\n"
          "  --grid                 a scaled-down ScheMoE Table 4 grid of 24 configs:\n"
          "                         tokens per rank {256, 512} x M {256, 512} x\n"
          "                         H {512, 1024} x f {1.0, 1.2, dropless}; it sets tokens,\n"
          "                         model, hidden and capacity factor (not allowed with\n"
          "                         them); variants unless given: the first schedule\n"
          "                         (the baseline) at r=1, every other one at r=2\n"
          "                         (peer-group ones at their groups)\n",
          which,
#if MOE_CLI_MPI
          "",
#else
          "\n(Not available: this moe was built without MPI.)",
#endif
          a2a, moe_schedule_algo_names(), EP_MAX_CHUNKS, moe_compressor_names(),
          moe_wait_policy_name(moe_executor_config_default().wait));
  fprintf(f, "  --backend NAME         compute backend (as for one process) [fixed]\n");
  fprintf(f, "  --precision fp32|bf16  GEMM precision (as for one process) [fp32]\n");
  fprintf(f,
          "  --skew SPEC            expert popularity through a fitted router bias (as for\n"
          "                         one process); prints the balance: the busiest rank's\n"
          "                         rows over the mean [none]\n"
          "  --gate plain|topo[:R]  FasterMoE's topology-aware gate on every variant: at most\n"
          "                         R/M x T x K of a rank's choices leave its node (R =\n"
          "                         W_net/W_local in (0, 1], topo alone 0.25; M ranks per\n"
          "                         node), the rest re-select local experts; changes the\n"
          "                         routing; prints the rows that crossed nodes [plain]\n"
          "  --balance LIST         load-balancing policies, comma-separated, or all: %s\n"
          "                         (docs/balance.md); each runs every variant; after each\n"
          "                         iteration the load is all-gathered, the policy plans the\n"
          "                         next placement of expert copies and the copies receive\n"
          "                         their parameters; prints per variant the balance, the\n"
          "                         copies, the Trans no compute hid and the speedup over\n"
          "                         none, measured and as the plan's model predicted it;\n"
          "                         needs EP >= 2 [none]\n"
          "  --balance-slots N      expert copy slots per rank, 0..E-E/EP [E/EP]\n"
          "  --replan-every N       plan every N iterations, keep the plan between [1]\n",
          moe_balance_policy_names());
  fprintf(f,
          "%s\n"
          "columns: fwd/bwd/total ms (wall time, slowest rank); speedup = total of\n"
          "sequential r=1 (same a2a and compress) / total; comm, comp = summed durations\n"
          "of the pass's communication and compute tasks, fwd+bwd (an all-to-all's\n"
          "duration includes waiting for slower peers); exposed = comm not overlapped\n"
          "by compute; bound = (comm + comp) / max(comm, comp) of the sequential r=1 run;\n"
          "eff = speedup / bound; model = the speedup ScheMoE's task model predicts for\n"
          "this variant: its task graphs and schedules simulated with the baseline's\n"
          "busy time per task kind split evenly over the chunks (no overheads);\n"
          "eff_r = speedup / model; with --profile, pred ms = the predicted total\n"
          "(moe_simulate_layer with the measured models) and error = pred / measured - 1.\n",
          CLI_HANG_TIMEOUT_HELP);
}

#if MOE_CLI_MPI

#define MAX_LIST 16  // items of one list option
#define GRID_CONFIGS 24

typedef struct {
  moe_layer_config cfg;
  int ep, ranks_per_node, iters, warmup, threads, grid, compress_backward;
  const char *backend;  // compute backend (moe_backend_find)
  int precision;        // moe_precision
  int iters_set;
  unsigned layer_set;  // CLI_LAYER_* bits of the layer options given
  unsigned long long seed;
  moe_wait_policy wait;
  uint32_t poll_min_ns, poll_max_ns;               // 0: the executor's defaults
  const char *a2a, *schedule, *chunks, *compress;  // lists as given (NULL: default)
  const char *json_path, *trace_path;
  double hang_timeout;       // --hang-timeout, seconds (0: off)
  const char *profile_path;  // --profile: predictions, and the planner for "auto"
  int allow_lossy;
  size_t max_memory;    // --max-memory per rank, 0: the node's available memory / its ranks
  moe_skew skew;        // --skew
  double topo_gate;     // --gate topo[:R]: W_net / W_local (0: plain)
  const char *balance;  // --balance list as given (NULL: none)
  int balance_slots;    // --balance-slots, -1: the default (E / EP)
  int replan_every;     // --replan-every
  char bals[MAX_LIST][16];
  int n_bal;
  int auto_a2a, auto_sched, auto_chunks, auto_comp;  // "auto" given
  moe_profile profile;
  // the lists, validated
  char a2as[MAX_LIST][32];
  int n_a2a;
  char comps[MAX_LIST][32];
  int n_comp;
  char scheds[MAX_LIST][16];
  int n_sched;
  int chunk_list[MAX_LIST];
  int n_chunks;
} ep_opts;

// One (schedule, chunks) pair; the same for every a2a and compressor.
typedef struct {
  char schedule[16];
  int chunks;
} sched_variant;

typedef struct {
  const char *a2a, *compress, *schedule;
  int chunks_req, chunks;  // as asked, and as run (smart: peer groups)
  int baseline;            // index (within its config) of its sequential r=1 run
  double fwd_ms, bwd_ms, total_ms;
  // pass breakdowns (ms): compute, comm, overlap, exposed comm, pass total
  double fwd_pass[5], bwd_pass[5];
  double speedup, comm_ms, comp_ms, exposed_ms, bound, efficiency;
  double kind_ms[2][MOE_CT_KINDS];  // busy ms per task kind (C1 .. D2), fwd and bwd
  // ScheMoE's task model: this variant's graphs and schedules simulated with
  // the baseline's per-kind times split evenly over the chunks
  double model_ms, model_speedup, model_efficiency;
  double total_q1, total_q3;    // quartiles of the total over the iterations (noise)
  double predicted_ms;          // moe_simulate_layer with --profile; NaN without
  int planned;                  // chosen by the planner ("auto")
  long long rows, dropped;      // over all ranks, last iteration
  const char *balance;          // load-balancing policy
  int copies;                   // expert copies in force, last iteration
  double balance_ms, trans_ms;  // balancing step (load, plan, Trans) and its Trans, median
  moe_balance_step_info plan;   // its last plan's predictions (moe_measure_result.bal_plan)
  moe_balance_cost bal_cost;    // the rates its plans used
  long long max_rank_rows;      // most rows one rank computed, last iteration
  double balance_ratio;         // max_rank_rows / mean over ranks
  double skew_tv;               // --skew: the bias fit's total variation
  long long offnode_rows;       // rows sent to other nodes, all ranks, last iteration
  long long rerouted;           // choices the topology-aware gate re-selected, last iteration
} ep_result;

// Splits a comma-separated list into a copy (buf) and token pointers.
static int split_list(const char *text, char *buf, size_t len, char **items, int max) {
  snprintf(buf, len, "%s", text);
  int n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (n == max) return -1;
    items[n++] = tok;
  }
  return n;
}

// Adds name to list (of n items of size width) unless present.
static void add_unique(char *list, int *n, size_t width, const char *name) {
  for (int i = 0; i < *n; i++) {
    if (strcmp(list + (size_t)i * width, name) == 0) return;
  }
  if (*n < MAX_LIST) snprintf(list + (size_t)(*n)++ * width, width, "%s", name);
}

// Validates the list options into o's arrays. CLI_OK or CLI_USAGE (printed).
static int parse_lists(ep_opts *o, moe_ctx *ctx) {
  char buf[1024];
  char *items[MAX_LIST];
  char valid[256];
  int n;
  // "auto" (the planner) stands alone in its list and needs a profile
  o->auto_a2a = o->a2a && strcmp(o->a2a, "auto") == 0;
  o->auto_comp = o->compress && strcmp(o->compress, "auto") == 0;
  o->auto_sched = o->schedule && strcmp(o->schedule, "auto") == 0;
  o->auto_chunks = o->chunks && strcmp(o->chunks, "auto") == 0;
  if ((o->auto_a2a || o->auto_comp || o->auto_sched || o->auto_chunks) && !o->profile_path) {
    cli_error("'auto' needs a calibrated profile: --profile FILE (from 'moe calibrate')");
    return CLI_USAGE;
  }
  // placeholders (the defaults); the plan replaces them per config
  if (o->auto_a2a) o->a2a = "mpi";                // catalogue: default
  if (o->auto_comp) o->compress = "none";         // catalogue: default
  if (o->auto_sched) o->schedule = "sequential";  // catalogue: default
  if (o->auto_chunks) o->chunks = "1";
  // --a2a
  moe_a2a_names(valid, sizeof valid, 0);
  n = split_list(o->a2a ? o->a2a : "mpi", buf, sizeof buf, items, MAX_LIST);  // catalogue: default
  if (n <= 0) {
    cli_error("--a2a needs 1 to %d names from: %s, all", MAX_LIST, valid);
    return CLI_USAGE;
  }
  for (int i = 0; i < n; i++) {
    if (strcmp(items[i], "all") == 0) {
      int count = 0;
      const moe_a2a_algo *const *list = moe_a2a_list(&count);
      for (int k = 0; k < count; k++) add_unique(&o->a2as[0][0], &o->n_a2a, 32, list[k]->name);
      continue;
    }
    const moe_a2a_algo *algo = NULL;
    if (moe_a2a_find(ctx, items[i], &algo) != MOE_STATUS_OK) {
      cli_error("--a2a: %s (or all)", moe_ctx_error(ctx));
      return CLI_USAGE;
    }
    add_unique(&o->a2as[0][0], &o->n_a2a, 32, algo->name);
  }
  // --compress
  n = split_list(o->compress ? o->compress : "none", buf, sizeof buf, items,
                 MAX_LIST);  // catalogue: default
  if (n <= 0) {
    cli_error("--compress needs 1 to %d specs from: %s", MAX_LIST, moe_compressor_names());
    return CLI_USAGE;
  }
  for (int i = 0; i < n; i++) {
    moe_compressor c;
    if (strlen(items[i]) >= 32 || moe_compressor_get(ctx, items[i], &c) != MOE_STATUS_OK) {
      cli_error("--compress: %s",
                strlen(items[i]) >= 32 ? "compressor spec too long" : moe_ctx_error(ctx));
      return CLI_USAGE;
    }
    add_unique(&o->comps[0][0], &o->n_comp, 32, items[i]);
  }
  // --balance
  n = split_list(o->balance ? o->balance : "none", buf, sizeof buf, items,
                 MAX_LIST);  // catalogue: default
  if (n <= 0) {
    cli_error("--balance needs 1 to %d names from: %s, all", MAX_LIST, moe_balance_policy_names());
    return CLI_USAGE;
  }
  for (int i = 0; i < n; i++) {
    if (strcmp(items[i], "all") == 0) {
      for (int k = 0; moe_balance_policy_name(k); k++)
        add_unique(&o->bals[0][0], &o->n_bal, 16, moe_balance_policy_name(k));
      continue;
    }
    if (moe_balance_policy_find(items[i]) < 0) {
      cli_error("--balance: policy '%s' is unknown (valid: %s, all)", items[i],
                moe_balance_policy_names());
      return CLI_USAGE;
    }
    add_unique(&o->bals[0][0], &o->n_bal, 16, items[i]);
  }
  // --schedule
  n = split_list(o->schedule ? o->schedule : "all", buf, sizeof buf, items, MAX_LIST);
  if (n <= 0) {
    cli_error("--schedule needs 1 to %d names from: %s, all", MAX_LIST, moe_schedule_algo_names());
    return CLI_USAGE;
  }
  for (int i = 0; i < n; i++) {
    if (strcmp(items[i], "all") == 0) {
      int count = 0;
      const moe_schedule_algo *list = moe_schedule_algo_list(&count);
      for (int k = 0; k < count; k++) add_unique(&o->scheds[0][0], &o->n_sched, 16, list[k].name);
      continue;
    }
    const moe_schedule_algo *s = NULL;
    if (moe_schedule_algo_find(ctx, items[i], &s) != MOE_STATUS_OK) {
      cli_error("--schedule: %s (or all)", moe_ctx_error(ctx));
      return CLI_USAGE;
    }
    add_unique(&o->scheds[0][0], &o->n_sched, 16, s->name);
  }
  // --chunks
  n = split_list(o->chunks ? o->chunks : "2", buf, sizeof buf, items, MAX_LIST);
  if (n <= 0) {
    cli_error("--chunks needs 1 to %d integers in [1, %d]", MAX_LIST, MOE_MAX_CHUNKS);
    return CLI_USAGE;
  }
  for (int i = 0; i < n; i++) {
    char *end = NULL;
    errno = 0;
    const long v = strtol(items[i], &end, 10);
    if (errno != 0 || end == items[i] || *end != '\0') {
      cli_error("--chunks expects an integer or a comma-separated list of integers, got '%s'",
                items[i]);
      return CLI_USAGE;
    }
    if (v < 1 || v > MOE_MAX_CHUNKS) {
      cli_error("--chunks (%ld) must be in [1, %d]", v, MOE_MAX_CHUNKS);
      return CLI_USAGE;
    }
    int have = 0;
    for (int k = 0; k < o->n_chunks; k++) have |= o->chunk_list[k] == (int)v;
    if (!have) o->chunk_list[o->n_chunks++] = (int)v;
  }
  return CLI_OK;
}

// Parses argv. CLI_OK, CLI_USAGE (message printed) or -1 after --help.
static int parse_opts(int argc, char **argv, ep_opts *o) {
  memset(o, 0, sizeof *o);
  moe_layer_config_default(&o->cfg);
  o->cfg.tokens = 1024;
  o->cfg.model_dim = 512;
  o->cfg.hidden_dim = 1024;
  o->cfg.num_experts = 0;  // 2 x ranks unless given
  o->cfg.top_k = 2;
  o->cfg.capacity_factor = 1.2;
  o->iters = 5;
  o->warmup = 1;
  o->threads = 1;
  o->backend = "fixed";  // catalogue: the default backend
  o->seed = 1;
  o->wait = moe_executor_config_default().wait;
  o->hang_timeout = CLI_HANG_TIMEOUT_DEFAULT;
  o->balance_slots = -1;
  o->replan_every = 1;
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return CLI_FAILED;
  cli_args a;
  cli_args_init(&a, argc, argv, 3);
  int rc = CLI_OK;
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      cli_bench_layer_usage(stdout);
      rc = -1;
      goto done;
    } else if (cli_layer_shape_opt(&a, &o->cfg, &o->layer_set) ||
               cli_layer_config_opt(&a, &o->cfg, &o->layer_set)) {
    } else if (cli_opt(&a, "--ep")) {
      cli_parse_int(&a, "--ep", 1, 1 << 20, &o->ep);
    } else if (cli_opt(&a, "--ranks-per-node")) {
      cli_parse_int(&a, "--ranks-per-node", 0, 1 << 20, &o->ranks_per_node);
    } else if (cli_opt(&a, "--a2a")) {
      o->a2a = a.value;
    } else if (cli_opt(&a, "--schedule")) {
      o->schedule = a.value;
    } else if (cli_opt(&a, "--chunks")) {
      o->chunks = a.value;
    } else if (cli_flag(&a, "--compress-backward")) {
      o->compress_backward = 1;
    } else if (cli_opt(&a, "--compress")) {
      o->compress = a.value;
    } else if (cli_opt(&a, "--wait")) {
      if (a.value && moe_wait_policy_parse(ctx, a.value, &o->wait) != MOE_STATUS_OK) {
        cli_error("--wait '%s' is unknown (valid: blocking, poll-backoff, adaptive)", a.value);
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--poll-us")) {
      // MIN,MAX in microseconds
      unsigned lo = 0, hi = 0;
      char tail = 0;
      if (a.value &&
          (sscanf(a.value, "%u,%u%c", &lo, &hi, &tail) != 2 || lo < 1 || hi < lo || hi > 1000000)) {
        cli_error("--poll-us '%s' must be MIN,MAX microseconds with 1 <= MIN <= MAX <= 1000000",
                  a.value);
        a.bad = 1;
      } else if (a.value) {
        o->poll_min_ns = lo * 1000u;
        o->poll_max_ns = hi * 1000u;
      }
    } else if (cli_opt(&a, "--iters")) {
      cli_parse_int(&a, "--iters", 1, 10000, &o->iters);
      o->iters_set = 1;
    } else if (cli_opt(&a, "--warmup")) {
      cli_parse_int(&a, "--warmup", 0, 1000, &o->warmup);
    } else if (cli_opt(&a, "--threads")) {
      cli_parse_int(&a, "--threads", 1, 256, &o->threads);
    } else if (cli_opt(&a, "--backend")) {
      cli_parse_backend(&a, "--backend", &o->backend);
    } else if (cli_opt(&a, "--precision")) {
      cli_parse_precision(&a, "--precision", &o->precision);
    } else if (cli_opt(&a, "--seed")) {
      cli_parse_u64(&a, "--seed", &o->seed);
    } else if (cli_opt(&a, "--skew")) {
      cli_parse_skew(&a, "--skew", &o->skew);
    } else if (cli_opt(&a, "--gate")) {
      if (a.value && moe_gate_spec_parse(ctx, a.value, &o->topo_gate) != MOE_STATUS_OK) {
        cli_error("--gate: %s", moe_ctx_error(ctx));
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--balance")) {
      o->balance = a.value;
    } else if (cli_opt(&a, "--balance-slots")) {
      cli_parse_int(&a, "--balance-slots", 0, 1 << 20, &o->balance_slots);
    } else if (cli_opt(&a, "--replan-every")) {
      cli_parse_int(&a, "--replan-every", 1, 1000000, &o->replan_every);
    } else if (cli_opt(&a, "--profile")) {
      o->profile_path = a.value;
    } else if (cli_flag(&a, "--allow-lossy")) {
      o->allow_lossy = 1;
    } else if (cli_opt(&a, "--json")) {
      o->json_path = a.value;
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &o->max_memory);
    } else if (cli_opt(&a, "--trace")) {
      o->trace_path = a.value;
    } else if (cli_flag(&a, "--grid")) {
      o->grid = 1;
    } else if (cli_hang_timeout_opt(&a, &o->hang_timeout)) {
      // consumed
    } else if (cli_opt(&a, "--peak-size")) {
      cli_error("--peak-size applies only to the single-process 'moe bench layer' (see --help)");
      a.bad = 1;
    } else {
      cli_error("unknown option '%s' for the distributed 'moe bench layer' (see --help)",
                cli_args_peek(&a));
      a.bad = 1;
    }
  }
  if (a.bad) {
    rc = CLI_USAGE;
    goto done;
  }
  if (o->grid && (o->layer_set & (CLI_LAYER_TOKENS | CLI_LAYER_MODEL | CLI_LAYER_HIDDEN |
                                  CLI_LAYER_CAPACITY | CLI_LAYER_CONFIG))) {
    cli_error(
        "--grid sets the tokens, model, hidden dimension and capacity factor itself: drop "
        "--tokens, --model, --hidden, --capacity-factor and --config");
    rc = CLI_USAGE;
    goto done;
  }
  if (o->grid && !o->iters_set) o->iters = 3;
  rc = parse_lists(o, ctx);
done:
  moe_ctx_destroy(ctx);
  return rc;
}

// Whether a schedule chunks by peer groups (smart): it ignores --chunks.
static int peer_grouped(const char *schedule) {
  int count = 0;
  const moe_schedule_algo *list = moe_schedule_algo_list(&count);
  for (int i = 0; i < count; i++) {
    if (strcmp(list[i].name, schedule) == 0) return list[i].chunking == MOE_CHUNK_PEER_GROUPS;
  }
  return 0;
}

// The (schedule, chunks) variants: the baseline (the first schedule,
// sequential) at r=1 first, then the lists.
static int make_sched_variants(const ep_opts *o, sched_variant *out, int max) {
  int n = 0;
  int count = 0;
  const moe_schedule_algo *list = moe_schedule_algo_list(&count);
  snprintf(out[n].schedule, sizeof out[n].schedule, "%s", list[0].name);
  out[n++].chunks = 1;
  if (o->grid && !o->schedule && !o->chunks) {  // every other schedule at r=2
    for (int i = 1; i < count && n < max; i++) {
      snprintf(out[n].schedule, sizeof out[n].schedule, "%s", list[i].name);
      out[n++].chunks = list[i].chunking == MOE_CHUNK_PEER_GROUPS ? 1 : 2;
    }
    return n;
  }
  for (int s = 0; s < o->n_sched; s++) {
    const int smart = peer_grouped(o->scheds[s]);  // ignores chunks
    for (int c = 0; c < (smart ? 1 : o->n_chunks); c++) {
      const int r = smart ? 1 : o->chunk_list[c];
      int have = 0;
      for (int k = 0; k < n; k++) {
        have |= strcmp(out[k].schedule, o->scheds[s]) == 0 && out[k].chunks == r;
      }
      if (have || n == max) continue;
      snprintf(out[n].schedule, sizeof out[n].schedule, "%s", o->scheds[s]);
      out[n++].chunks = r;
    }
  }
  return n;
}

// Copy slots per rank of the balanced variants: --balance-slots, or E / EP
// (as many copies as home experts), within [0, E - E/EP].
static int balance_slots(const ep_opts *o, const moe_layer_config *cfg) {
  const int E = cfg->num_experts, most = E - E / o->ep;
  const int s = o->balance_slots >= 0 ? o->balance_slots : E / o->ep;
  return s < most ? s : most;
}

// Prints a failure that every rank returned (the library agrees on them):
// rank 0's message, and another rank's only where it differs (its own failure).
static void report_failure(moe_ctx *ctx, int rank, const char *what) {
  char root[1024];
  snprintf(root, sizeof root, "%s", moe_ctx_error(ctx));
  MPI_Bcast(root, (int)sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    cli_error("%s: %s", what, root);
  } else if (strcmp(root, moe_ctx_error(ctx)) != 0) {
    cli_error("rank %d: %s: %s", rank, what, moe_ctx_error(ctx));
  }
}

// Runs n variants interleaved through the library's harness
// (moe_measure_layer_variants: every iteration runs each variant once, so a
// slow phase of this shared machine hits all variants alike and the ratios
// stay fair). res[k].baseline is the index of k's baseline (sequential r=1 of
// its a2a and compressor) in the config; res is that config's row base_index
// on, and every baseline precedes its variants within res. Fills res; with
// trace_path writes the last variant's last iteration (every rank merged).
// CLI_OK or CLI_FAILED on every rank.
static int run_group(moe_ctx *ctx, const ep_opts *o, const moe_layer_config *cfg, int rank,
                     ep_result *res, int n, int base_index, const char *trace_path) {
  int rc = CLI_OK;
  moe_measure_variant *vs = moe_calloc((size_t)n, sizeof *vs);
  moe_measure_result *mr = moe_calloc((size_t)n, sizeof *mr);
  int ok = vs && mr;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (rank == 0) cli_error("cannot allocate the results of %d variants", n);
    rc = CLI_FAILED;
    goto done;
  }
  for (int k = 0; k < n; k++) {
    moe_parallel_config *pc = &vs[k].pc;
    moe_parallel_config_default(pc);
    pc->ep_size = o->ep;
    pc->ranks_per_node = o->ranks_per_node;
    pc->topo_gate = o->topo_gate;
    snprintf(pc->a2a, sizeof pc->a2a, "%s", res[k].a2a);
    snprintf(pc->schedule, sizeof pc->schedule, "%s", res[k].schedule);
    pc->chunks = res[k].chunks_req;
    snprintf(pc->compress, sizeof pc->compress, "%s", res[k].compress);
    pc->compress_backward = o->compress_backward;
    pc->exec = moe_executor_config_default();
    pc->exec.wait = o->wait;
    if (o->poll_max_ns) {
      pc->exec.poll_min_ns = o->poll_min_ns;
      pc->exec.poll_max_ns = o->poll_max_ns;
    }
    vs[k].baseline = res[k].baseline - base_index;
    const int policy = moe_balance_policy_find(res[k].balance);
    const int slots = balance_slots(o, cfg);
    moe_balance_config_default(&vs[k].balance, policy, cfg->model_dim, cfg->hidden_dim, slots);
    vs[k].balance.replan_every = o->replan_every;
    vs[k].balance.cost.flops_per_s = 0;  // measured on the first iteration
    if (policy != MOE_BALANCE_NONE) pc->copy_slots = slots;
  }
  moe_measure_config mc = moe_measure_config_default();
  mc.iters = o->iters;
  mc.warmup = o->warmup;
  mc.seed = o->seed;
  mc.skew = o->skew;
  mc.trace_path = trace_path;
  {
    // The memory bound: every rank's need for these n layers against its
    // limit, agreed before any of them is allocated.
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    moe_memory_need need;
    moe_status mst = moe_measure_layer_variants_memory(ctx, world, cfg, vs, n, &mc, &need);
    need.bytes[MOE_MEM_BASELINE] = (double)moe_memory_baseline_bytes();
    mst = moe_comm_agree(ctx, MPI_COMM_WORLD, mst, "the memory estimate");
    if (mst == MOE_STATUS_OK)
      mst = moe_comm_memory_check(ctx, MPI_COMM_WORLD, &need, o->max_memory,
                                  "use fewer --tokens, a smaller --model, --hidden or --experts, "
                                  "more ranks, fewer variants at once, or raise --max-memory");
    if (mst != MOE_STATUS_OK) {
      report_failure(ctx, rank, "memory");
      rc = CLI_USAGE;
      goto done;
    }
  }
  if (moe_measure_layer_variants(ctx, MPI_COMM_WORLD, cfg, vs, n, &mc, mr) != MOE_STATUS_OK) {
    report_failure(ctx, rank, "layer runs");
    rc = CLI_FAILED;
    goto done;
  }
  for (int k = 0; k < n; k++) {
    ep_result *r = &res[k];
    const moe_measure_result *m = &mr[k];
    r->chunks = m->chunks;
    r->fwd_ms = m->fwd_ms;
    r->bwd_ms = m->bwd_ms;
    r->total_ms = m->total_ms;
    r->total_q1 = m->total_q1;
    r->total_q3 = m->total_q3;
    memcpy(r->fwd_pass, m->fwd_pass, sizeof r->fwd_pass);
    memcpy(r->bwd_pass, m->bwd_pass, sizeof r->bwd_pass);
    r->comp_ms = r->fwd_pass[0] + r->bwd_pass[0];
    r->comm_ms = r->fwd_pass[1] + r->bwd_pass[1];
    r->exposed_ms = r->fwd_pass[3] + r->bwd_pass[3];
    memcpy(r->kind_ms, m->kind_ms, sizeof r->kind_ms);
    r->model_ms = m->model_ms;
    r->rows = m->rows;
    r->dropped = m->dropped;
    r->copies = m->copies;
    r->balance_ms = m->balance_ms;
    r->trans_ms = m->trans_ms;
    r->plan = m->bal_plan;
    r->bal_cost = m->bal_cost;
    r->max_rank_rows = m->max_rank_rows;
    r->balance_ratio = m->balance_ratio;
    r->skew_tv = m->skew_tv;
    r->offnode_rows = m->offnode_rows;
    r->rerouted = m->rerouted;
  }
done:
  moe_free(vs);
  moe_free(mr);
  return rc;
}

// speedup, bound and efficiency of the variants of one config against their baselines.
static void derive(ep_result *rs, int n) {
  for (int i = 0; i < n; i++) {
    const ep_result *base = &rs[rs[i].baseline];
    const double comm = base->comm_ms, comp = base->comp_ms;
    const double hi = comm > comp ? comm : comp;
    rs[i].speedup = rs[i].total_ms > 0 ? base->total_ms / rs[i].total_ms : NAN;
    rs[i].bound = hi > 0 ? (comm + comp) / hi : NAN;
    rs[i].efficiency = rs[i].speedup / rs[i].bound;
    rs[i].model_speedup = rs[i].model_ms > 0 ? base->total_ms / rs[i].model_ms : NAN;
    rs[i].model_efficiency = rs[i].speedup / rs[i].model_speedup;
  }
}

static void config_line(FILE *f, int index, int n_configs, const moe_layer_config *cfg, int world,
                        int ep) {
  fprintf(f, "config %d/%d: T=%d/rank (%lld in all) M=%d H=%d E=%d K=%d ", index + 1, n_configs,
          cfg->tokens, (long long)cfg->tokens * world, cfg->model_dim, cfg->hidden_dim,
          cfg->num_experts, cfg->top_k);
  if (cfg->capacity_factor > 0) {
    fprintf(f, "f=%g (C=%d per source rank and expert)", cfg->capacity_factor,
            moe_layer_capacity(cfg, cfg->tokens));
  } else {
    fprintf(f, "dropless");
  }
  fprintf(f, " %s%s, EP=%d DP=%d\n", moe_activation_name(cfg->act),
          cfg->renormalize ? " renormalized" : "", ep, world / ep);
}

static void print_table(const ep_result *rs, int n, int with_prediction) {
  int balanced = 0;
  for (int i = 0; i < n; i++)
    balanced |= moe_balance_policy_find(rs[i].balance) != MOE_BALANCE_NONE;
  if (balanced) printf("%-8s ", "balance");
  printf("%-8s %-8s %-10s %3s %9s %9s %9s %7s %8s %8s %8s %6s %6s %6s %6s", "a2a", "compress",
         "schedule", "r", "fwd ms", "bwd ms", "total ms", "speedup", "comm ms", "comp ms",
         "exposed", "bound", "eff", "model", "eff_r");
  if (with_prediction) printf(" %9s %7s", "pred ms", "error");
  printf("\n");
  for (int i = 0; i < n; i++) {
    const ep_result *r = &rs[i];
    if (balanced) printf("%-8s ", r->balance);
    printf(
        "%-8s %-8s %-10s %3d %9.2f %9.2f %9.2f %7.3f %8.2f %8.2f %8.2f %6.3f %5.1f%% %6.3f "
        "%5.1f%%",
        r->a2a, r->compress, r->schedule, r->chunks, r->fwd_ms, r->bwd_ms, r->total_ms, r->speedup,
        r->comm_ms, r->comp_ms, r->exposed_ms, r->bound, 100.0 * r->efficiency, r->model_speedup,
        100.0 * r->model_efficiency);
    if (with_prediction) {
      printf(" %9.2f %+6.1f%%", r->predicted_ms,
             100.0 * (r->predicted_ms - r->total_ms) / r->total_ms);
    }
    printf("%s\n", r->planned ? "  <- planned" : "");
  }
  const ep_result *base = &rs[rs[0].baseline];
  printf("dropped choices: %lld of %lld (all ranks, %s r=1)\n", base->dropped,
         base->rows + base->dropped, base->schedule);
  if (base->offnode_rows > 0 || base->rerouted > 0)
    printf(
        "topology: %lld of %lld rows crossed nodes (%.1f%%); the topology-aware gate "
        "re-selected %lld choices\n",
        base->offnode_rows, base->rows,
        base->rows > 0 ? 100.0 * (double)base->offnode_rows / (double)base->rows : 0.0,
        base->rerouted);
  if (!balanced) {
    printf("balance: the busiest rank computed %lld rows, %.3fx the mean over ranks",
           base->max_rank_rows, base->balance_ratio);
    if (base->skew_tv > 0.0) printf(" (skew fit: total variation %.4f)", base->skew_tv);
    printf("\n\n");
    return;
  }
  if (base->skew_tv > 0.0) printf("skew fit: total variation %.4f\n", base->skew_tv);
  printf("%-8s %-8s %-8s %-10s %3s %10s %8s %6s %9s %9s %10s %10s\n", "balance", "a2a", "compress",
         "schedule", "r", "busiest", "ratio", "copies", "step ms", "trans ms", "vs none",
         "predicted");
  for (int i = 0; i < n; i++) {
    const ep_result *r = &rs[i];
    // the same variant without balancing, when it ran
    const ep_result *none = NULL;
    for (int j = 0; j < n && !none; j++) {
      const ep_result *q = &rs[j];
      if (moe_balance_policy_find(q->balance) == MOE_BALANCE_NONE && q->a2a == r->a2a &&
          q->compress == r->compress && strcmp(q->schedule, r->schedule) == 0 &&
          q->chunks == r->chunks)
        none = q;
    }
    printf("%-8s %-8s %-8s %-10s %3d %10lld %8.3f %6d %9.2f %9.2f", r->balance, r->a2a, r->compress,
           r->schedule, r->chunks, r->max_rank_rows, r->balance_ratio, r->copies, r->balance_ms,
           r->trans_ms);
    if (none && r->total_ms > 0) {
      printf(" %9.3fx", none->total_ms / r->total_ms);
    } else {
      printf(" %10s", "-");
    }
    if (isfinite(r->plan.predicted_ms) && isfinite(r->plan.predicted_none_ms) &&
        r->plan.predicted_ms > 0) {
      printf(" %9.3fx", r->plan.predicted_none_ms / r->plan.predicted_ms);
    } else {
      printf(" %10s", "-");
    }
    printf("\n");
  }
  printf(
      "(busiest: rows the busiest rank's experts computed, last iteration; ratio: over the\n"
      "mean; step ms: all-gather of the last iteration's load, plan, posting Trans; trans ms:\n"
      "the Trans no compute hid (the expert task's wait for the copies' parameters); both inside\n"
      "fwd ms; vs none: the same variant's total without balancing over this one's;\n"
      "predicted: the same for the last plan under the balancer's model, the speedup it\n"
      "was chosen for)\n");
  for (int i = 0; i < n; i++) {  // what auto weighed (its last plan)
    const ep_result *r = &rs[i];
    if (moe_balance_policy_find(r->balance) != MOE_BALANCE_AUTO || !isfinite(r->plan.auto_ms[0]))
      continue;
    printf("auto's last plan, predicted ms per candidate:");
    for (int p = 0; p < MOE_BALANCE_AUTO; p++)
      printf(" %s %.4g%s", moe_balance_policy_name(p), r->plan.auto_ms[p],
             p + 1 < MOE_BALANCE_AUTO ? "," : "\n");
    break;
  }
  // the rates every policy planned with (the medians of the variants' first iterations)
  for (int i = 0; i < n; i++) {
    const ep_result *r = &rs[i];
    const moe_balance_cost *c = &r->bal_cost;
    if (moe_balance_policy_find(r->balance) == MOE_BALANCE_NONE || !(c->flops_per_s > 0)) continue;
    printf(
        "the plans' rates (medians over the variants' first iterations): expert GEMMs "
        "%.2f GFLOP/s per rank, network %.1f MB/s per %s,",
        c->flops_per_s / 1e9, c->net_bytes_per_s / 1e6,
        c->ranks_per_node > 0 ? "rank's link off its node" : "rank");
    if (c->ranks_per_node > 0) printf(" %d ranks per node,", c->ranks_per_node);
    if (c->compute_slots > 0) {
      printf(" %.2f ranks computing at once\n", c->compute_slots);
    } else {
      printf(" every rank computing at once\n");
    }
    break;
  }
  printf("\n");
}

// "key": value, null for NaN/Inf.
static void json_num(FILE *f, const char *key, double v, const char *sep) {
  if (isfinite(v)) {
    fprintf(f, "\"%s\": %.6f%s", key, v, sep);
  } else {
    fprintf(f, "\"%s\": null%s", key, sep);
  }
}

static void json_pass(FILE *f, const char *key, const double *p, const char *sep) {
  fprintf(f, "\"%s\": {", key);
  json_num(f, "compute_ms", p[0], ", ");
  json_num(f, "comm_ms", p[1], ", ");
  json_num(f, "overlap_ms", p[2], ", ");
  json_num(f, "exposed_comm_ms", p[3], ", ");
  json_num(f, "pass_ms", p[4], "}");
  fputs(sep, f);
}

static int write_json(cli_out *out, moe_ctx *ctx, const ep_opts *o, int world, int nodes,
                      const moe_layer_config *cfgs, int n_configs, const ep_result *rs,
                      int per_config) {
  FILE *f = out->f;
  char skew_spec[MOE_SKEW_SPEC_MAX], gate_spec[32];
  moe_skew_to_string(&o->skew, skew_spec, sizeof skew_spec);
  moe_gate_spec_to_string(o->topo_gate, gate_spec, sizeof gate_spec);
  fprintf(f,
          "{\n  \"benchmark\": \"layer_ep\",\n  \"version\": \"%s\",\n  \"features\": \"%s\",\n"
          "  \"ranks\": %d,\n  \"nodes\": %d,\n  \"ep_size\": %d,\n  \"dp_size\": %d,\n"
          "  \"ranks_per_node\": %d,\n  \"iters\": %d,\n  \"warmup\": %d,\n"
          "  \"threads\": %d,\n  \"backend\": \"%s\",\n  \"precision\": \"%s\",\n  \"seed\": "
          "%llu,\n  \"wait\": \"%s\",\n"
          "  \"compress_backward\": %s,\n  \"grid\": %s,\n  \"gate\": \"%s\",\n"
          "  \"skew\": ",
          moe_version(), moe_features(), world, nodes, o->ep, world / o->ep, o->ranks_per_node,
          o->iters, o->warmup, o->threads, o->backend,
          moe_precision_name((moe_precision)o->precision), o->seed, moe_wait_policy_name(o->wait),
          o->compress_backward ? "true" : "false", o->grid ? "true" : "false", gate_spec);
  cli_json_string(f, skew_spec);
  fprintf(f, ",\n  \"configs\": [\n");
  for (int c = 0; c < n_configs; c++) {
    char cfg_json[1024];
    if (moe_layer_config_to_json(ctx, &cfgs[c], cfg_json, sizeof cfg_json) != MOE_STATUS_OK) {
      cli_error("%s", moe_ctx_error(ctx));
      cli_out_abort(out);
      return CLI_FAILED;
    }
    fprintf(f,
            "    {\"config\": %s,\n     \"tokens_per_rank\": %d, \"tokens_total\": %lld, "
            "\"capacity\": %d,\n     \"variants\": [\n",
            cfg_json, cfgs[c].tokens, (long long)cfgs[c].tokens * world,
            moe_layer_capacity(&cfgs[c], cfgs[c].tokens));
    for (int v = 0; v < per_config; v++) {
      const ep_result *r = &rs[(size_t)c * (size_t)per_config + (size_t)v];
      fprintf(f,
              "      {\"a2a\": \"%s\", \"compress\": \"%s\", \"schedule\": \"%s\", "
              "\"chunks_requested\": %d, \"chunks\": %d, \"baseline\": \"%s r=1\", "
              "\"rows\": %lld, \"dropped\": %lld, \"max_rank_rows\": %lld, "
              "\"offnode_rows\": %lld, \"rerouted\": %lld,\n       ",
              r->a2a, r->compress, r->schedule, r->chunks_req, r->chunks,
              rs[(size_t)c * (size_t)per_config + (size_t)r->baseline].schedule, r->rows,
              r->dropped, r->max_rank_rows, r->offnode_rows, r->rerouted);
      json_num(f, "balance_ratio", r->balance_ratio, ", ");
      fprintf(f, "\"balance\": \"%s\", \"copies\": %d, ", r->balance, r->copies);
      json_num(f, "balance_ms", r->balance_ms, ", ");
      json_num(f, "trans_ms", r->trans_ms, ", ");
      json_num(f, "balance_pred_ms", r->plan.predicted_ms, ", ");
      json_num(f, "balance_pred_none_ms", r->plan.predicted_none_ms, ", ");
      if (moe_balance_policy_find(r->balance) != MOE_BALANCE_NONE) {
        // what the policy planned with: slots, period, window and the rates
        const moe_balance_cost *bc = &r->bal_cost;
        moe_balance_config d;  // the policy's window, as run_group configured it
        moe_balance_config_default(&d, moe_balance_policy_find(r->balance), cfgs[c].model_dim,
                                   cfgs[c].hidden_dim, 0);
        fprintf(f, "\"balance_slots\": %d, \"replan_every\": %d, \"balance_window\": %d, ",
                balance_slots(o, &cfgs[c]), o->replan_every, d.window);
        json_num(f, "plan_gemm_flops_per_s", bc->flops_per_s, ", ");
        json_num(f, "plan_net_bytes_per_s", bc->net_bytes_per_s, ", ");
        json_num(f, "plan_compute_slots", bc->compute_slots, ", ");
        fprintf(f, "\"plan_ranks_per_node\": %d, ", bc->ranks_per_node);
      }
      if (moe_balance_policy_find(r->balance) == MOE_BALANCE_AUTO) {
        fprintf(f, "\"auto_candidates_ms\": {");
        for (int p = 0; p < MOE_BALANCE_AUTO; p++)
          json_num(f, moe_balance_policy_name(p), r->plan.auto_ms[p],
                   p + 1 < MOE_BALANCE_AUTO ? ", " : "}, ");
      }
      json_num(f, "fwd_ms", r->fwd_ms, ", ");
      json_num(f, "bwd_ms", r->bwd_ms, ", ");
      json_num(f, "total_ms", r->total_ms, ", ");
      json_num(f, "total_ms_q1", r->total_q1, ", ");
      json_num(f, "total_ms_q3", r->total_q3, ", ");
      json_num(f, "speedup", r->speedup, ",\n       ");
      json_num(f, "comm_ms", r->comm_ms, ", ");
      json_num(f, "comp_ms", r->comp_ms, ", ");
      json_num(f, "exposed_comm_ms", r->exposed_ms, ", ");
      json_num(f, "bound", r->bound, ", ");
      json_num(f, "overlap_efficiency", r->efficiency, ",\n       ");
      json_num(f, "model_ms", r->model_ms, ", ");
      json_num(f, "model_speedup", r->model_speedup, ", ");
      json_num(f, "model_efficiency", r->model_efficiency, ",\n       ");
      json_num(f, "predicted_ms", r->predicted_ms, ", ");
      fprintf(f, "\"planned\": %s, ", r->planned ? "true" : "false");
      json_pass(f, "fwd_pass", r->fwd_pass, ", ");
      json_pass(f, "bwd_pass", r->bwd_pass, "}");
      fputs(v + 1 < per_config ? ",\n" : "\n", f);
    }
    fprintf(f, "     ]}%s\n", c + 1 < n_configs ? "," : "");
  }
  fputs("  ]\n}\n", f);
  return cli_out_commit(out);
}

// Grid mode's summary: one row per config, the speedup of each (schedule, r)
// for the first a2a and compressor.
static void print_grid_summary(const moe_layer_config *cfgs, int n_configs, const ep_result *rs,
                               int per_config, int n_sv) {
  printf("grid summary (%s, %s): speedup over sequential r=1\n", rs[0].a2a, rs[0].compress);
  printf("%6s %5s %5s %8s %10s", "T/rank", "M", "H", "f", "seq ms");
  for (int v = 1; v < n_sv; v++) {
    char label[32];
    snprintf(label, sizeof label, "%s r=%d", rs[v].schedule, rs[v].chunks);
    printf(" %14s", label);
  }
  printf("\n");
  for (int c = 0; c < n_configs; c++) {
    const ep_result *r = rs + (size_t)c * (size_t)per_config;
    char f[16];
    if (cfgs[c].capacity_factor > 0) {
      snprintf(f, sizeof f, "%g", cfgs[c].capacity_factor);
    } else {
      snprintf(f, sizeof f, "dropless");
    }
    printf("%6d %5d %5d %8s %10.2f", cfgs[c].tokens, cfgs[c].model_dim, cfgs[c].hidden_dim, f,
           r[0].total_ms);
    for (int v = 1; v < n_sv; v++) printf(" %14.3f", r[v].speedup);
    printf("\n");
  }
  printf("\n");
}

// Checks that need the world size, the profile and the node count: the same
// on every rank, printed by rank 0. CLI_OK or CLI_USAGE.
static int check_world(moe_ctx *ctx, ep_opts *o, int rank, int world, int *nodes) {
  if (o->ep == 0) o->ep = world;
  if (o->cfg.num_experts == 0) o->cfg.num_experts = 2 * world;  // neither --experts nor --config
  int rc = CLI_OK;
  if (o->ep > world || world % o->ep != 0) {
    if (rank == 0) cli_error("--ep (%d) must divide the number of ranks (%d)", o->ep, world);
    rc = CLI_USAGE;
  } else if (o->cfg.num_experts % o->ep != 0) {
    if (rank == 0) {
      cli_error("--experts (%d) must be divisible by the EP size (%d)", o->cfg.num_experts, o->ep);
    }
    rc = CLI_USAGE;
  } else if (o->cfg.top_k > o->cfg.num_experts) {
    if (rank == 0) {
      cli_error("--topk (%d) must be in [1, %d] (the number of experts)", o->cfg.top_k,
                o->cfg.num_experts);
    }
    rc = CLI_USAGE;
  } else if (o->ranks_per_node > 0 && world % o->ranks_per_node != 0) {
    if (rank == 0) {
      cli_error("--ranks-per-node (%d) must divide the number of ranks (%d)", o->ranks_per_node,
                world);
    }
    rc = CLI_USAGE;

  } else if ((o->n_bal > 1 || strcmp(o->bals[0], "none") != 0) &&  // catalogue: no balancing
             o->ep < 2) {
    if (rank == 0) cli_error("--balance needs an EP size of at least 2 (got %d)", o->ep);
    rc = CLI_USAGE;
  } else if ((o->n_bal > 1 || strcmp(o->bals[0], "none") != 0) &&  // catalogue: no balancing
             o->warmup < 1) {
    if (rank == 0) {
      cli_error(
          "--balance needs --warmup 1 or more (got %d): the first iteration measures the rates "
          "the policies plan with, and runs without copies",
          o->warmup);
    }
    rc = CLI_USAGE;
  } else if (o->balance_slots > o->cfg.num_experts - o->cfg.num_experts / o->ep) {
    if (rank == 0) {
      cli_error("--balance-slots (%d) must be in [0, %d] (the experts an EP rank does not hold)",
                o->balance_slots, o->cfg.num_experts - o->cfg.num_experts / o->ep);
    }
    rc = CLI_USAGE;
  } else if (!o->grid && moe_layer_config_validate(ctx, &o->cfg) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("%s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
  }
  if (rc == CLI_OK && o->profile_path) {
    rc = cli_profile_load_for(ctx, o->profile_path, world, o->ep, rank, &o->profile);
  }
  const int any_auto = o->auto_a2a || o->auto_comp || o->auto_sched || o->auto_chunks;
  if (rc == CLI_OK && any_auto &&
      (o->n_a2a != 1 || o->n_comp != 1 || o->n_sched != 1 || o->n_chunks != 1)) {
    if (rank == 0) {
      cli_error(
          "with 'auto', give one value (or auto) for each of --a2a, --compress, "
          "--schedule and --chunks");
    }
    rc = CLI_USAGE;
  }
  if (rc == CLI_OK && o->skew.kind == MOE_SKEW_TRACE) {
    // every rank reads the trace (each fits the bias): agree on the verdict
    int ok = cli_check_skew(&o->skew, o->cfg.num_experts, o->cfg.top_k, rank == 0) == CLI_OK;
    const int mine = ok;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok && rank == 0 && mine)
      cli_error("--skew: another rank cannot read the routing trace '%s'", o->skew.path);
    if (!ok) rc = CLI_USAGE;
  }
  if (rc != CLI_OK) return rc;
  *nodes = 1;
  int *node_of = moe_malloc((size_t)world * sizeof(int));
  if (node_of &&
      moe_topology_nodes(ctx, MPI_COMM_WORLD, o->ranks_per_node, node_of) == MOE_STATUS_OK) {
    for (int r = 0; r < world; r++) *nodes = node_of[r] + 1 > *nodes ? node_of[r] + 1 : *nodes;
  }
  moe_free(node_of);
  if (o->profile_path && o->profile.cluster.nodes != *nodes) {
    if (rank == 0) {
      cli_error(
          "--profile '%s' was calibrated on %d node(s); this run has %d (--ranks-per-node "
          "must match the calibration's)",
          o->profile.name, o->profile.cluster.nodes, *nodes);
    }
    return CLI_USAGE;
  }
  return CLI_OK;
}

// The configs: --grid's 24, or the one given.
static void make_configs(const ep_opts *o, moe_layer_config *cfgs) {
  if (!o->grid) {
    cfgs[0] = o->cfg;
    return;
  }
  static const int tokens[2] = {256, 512}, model[2] = {256, 512}, hidden[2] = {512, 1024};
  static const double f[3] = {1.0, 1.2, 0.0};
  int c = 0;
  for (int ti = 0; ti < 2; ti++) {
    for (int mi = 0; mi < 2; mi++) {
      for (int hi = 0; hi < 2; hi++) {
        for (int fi = 0; fi < 3; fi++, c++) {
          cfgs[c] = o->cfg;
          cfgs[c].tokens = tokens[ti];
          cfgs[c].model_dim = model[mi];
          cfgs[c].hidden_dim = hidden[hi];
          cfgs[c].capacity_factor = f[fi];
        }
      }
    }
  }
}

// Rank 0 opens --json and probes --trace, so an unwritable path fails before
// the long run; every rank learns the outcome. CLI_OK or CLI_FAILED.
static int open_outputs(const ep_opts *o, int rank, cli_out *json) {
  int rc = CLI_OK;
  if (rank == 0 && o->json_path) rc = cli_out_open(json, o->json_path);
  if (rank == 0 && rc == CLI_OK && o->trace_path) {
    cli_out probe = {0};
    rc = cli_out_open(&probe, o->trace_path);
    cli_out_abort(&probe);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}

// 'auto': the planner's choice for config c (number index) replaces the
// single a2a and compressor of o and the second (schedule, r) variant.
static int plan_config(moe_ctx *ctx, ep_opts *o, const moe_layer_config *cfg, int index, int rank,
                       sched_variant *sv) {
  moe_plan_request q;
  memset(&q, 0, sizeof q);
  q.cfg = *cfg;
  snprintf(q.a2a, sizeof q.a2a, "%s", o->auto_a2a ? "auto" : o->a2as[0]);
  snprintf(q.compress, sizeof q.compress, "%s", o->auto_comp ? "auto" : o->comps[0]);
  snprintf(q.schedule, sizeof q.schedule, "%s", o->auto_sched ? "auto" : o->scheds[0]);
  q.chunks = o->auto_chunks ? 0 : o->chunk_list[0];
  q.allow_lossy = o->allow_lossy;
  q.compress_backward = o->compress_backward;
  q.profile = &o->profile;
  moe_plan plan;
  if (moe_plan_layer(ctx, &o->profile.cluster, &q, &plan) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("planner: %s", moe_ctx_error(ctx));
    return CLI_FAILED;
  }
  snprintf(o->a2as[0], sizeof o->a2as[0], "%s", plan.best.a2a);
  snprintf(o->comps[0], sizeof o->comps[0], "%s", plan.best.compress);
  snprintf(sv[1].schedule, sizeof sv[1].schedule, "%s", plan.best.schedule);
  sv[1].chunks = plan.best.chunks;
  if (rank == 0) {
    printf(
        "plan (config %d): a2a %s, compress %s, schedule %s, r=%d: predicted %.2f ms, "
        "best of %d candidates\n",
        index + 1, plan.best.a2a, plan.best.compress, plan.best.schedule, plan.predicted.chunks,
        plan.predicted.total_ms, plan.candidates);
  }
  return CLI_OK;
}

// With --profile, every variant's predicted total (moe_simulate_layer).
static void predict(moe_ctx *ctx, const ep_opts *o, const moe_layer_config *cfg, ep_result *crs,
                    int n) {
  for (int i = 0; i < n; i++) {
    crs[i].predicted_ms = NAN;
    if (!o->profile_path) continue;
    moe_sim_variant v;
    memset(&v, 0, sizeof v);
    v.cfg = *cfg;
    snprintf(v.a2a, sizeof v.a2a, "%s", crs[i].a2a);
    snprintf(v.schedule, sizeof v.schedule, "%s", crs[i].schedule);
    v.chunks = crs[i].chunks_req;
    snprintf(v.compress, sizeof v.compress, "%s", crs[i].compress);
    v.compress_backward = o->compress_backward;
    v.profile = &o->profile;
    moe_sim_result sr;
    if (moe_simulate_layer(ctx, &o->profile.cluster, &v, &sr) == MOE_STATUS_OK) {
      crs[i].predicted_ms = sr.total_ms;
    }
  }
}

// One config: its variants (a2a x compressor x (schedule, r), each group's
// baseline first), run, predicted, derived and printed. trace: write the last
// variant's last iteration. CLI_OK or CLI_FAILED on every rank.
static int run_config(moe_ctx *ctx, ep_opts *o, const moe_layer_config *cfg, int index, int rank,
                      int world, sched_variant *sv, int n_sv, ep_result *crs, int per_config,
                      const char *trace) {
  const int any_auto = o->auto_a2a || o->auto_comp || o->auto_sched || o->auto_chunks;
  if (any_auto && plan_config(ctx, o, cfg, index, rank, sv) != CLI_OK) return CLI_FAILED;
  int k = 0;
  for (int bi = 0; bi < o->n_bal; bi++) {
    for (int a = 0; a < o->n_a2a; a++) {
      for (int z = 0; z < o->n_comp; z++) {
        const int base = k;
        for (int s = 0; s < n_sv; s++, k++) {
          ep_result *r = &crs[k];
          r->balance = o->bals[bi];
          r->a2a = o->a2as[a];
          r->compress = o->comps[z];
          r->schedule = sv[s].schedule;
          r->chunks_req = sv[s].chunks;
          r->baseline = base;
          r->planned = any_auto && s == 1;
        }
      }
    }
  }
  // Run the config's variants interleaved: all of them when they are few
  // (every ratio then compares measurements taken side by side), else one
  // (a2a, compress) group at a time (bounded memory).
  const int unit = per_config <= 32 ? per_config : n_sv;
  for (int g0 = 0; g0 < per_config; g0 += unit) {
    const char *t = g0 + unit == per_config ? trace : NULL;
    const int g = run_group(ctx, o, cfg, rank, &crs[g0], unit, g0, t);
    if (g != CLI_OK) return g;  // CLI_USAGE: refused by the memory bound
  }
  predict(ctx, o, cfg, crs, per_config);
  derive(crs, per_config);
  if (rank == 0) {
    config_line(stdout, index, o->grid ? GRID_CONFIGS : 1, cfg, world, o->ep);
    print_table(crs, per_config, o->profile_path != NULL);
    fflush(stdout);
  }
  return CLI_OK;
}

int cmd_bench_layer_ep(int argc, char **argv) {
  ep_opts o;
  int provided = 0, rank = 0, world = 1;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // Every rank parses the same argv, so all agree on the outcome; only rank 0
  // prints (help and errors). Parsing after MPI_Init lets every rank finalize
  // together: a rank exiting early would make mpirun kill rank 0 before its
  // message is out.
  int rc;
  {
    int saved[2];
    cli_silence_begin(rank != 0, saved);
    rc = parse_opts(argc, argv, &o);
    cli_silence_end(saved);
  }
  moe_ctx *ctx = NULL;
  cli_out json = {0};
  moe_layer_config *cfgs = NULL;
  ep_result *rs = NULL;
  sched_variant sv[MAX_LIST * MAX_LIST + 1];
  int n_configs = 0, per_config = 0, nodes = 1;
  const uint64_t t_start = moe_time_ns();
  moe_watchdog *wd = NULL;
  if (rc != CLI_OK) {
    if (rc < 0) rc = CLI_OK;  // --help
    goto done;
  }
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("cannot create a context");
    rc = CLI_FAILED;
    goto done;
  }
  if (moe_launch_check(ctx) != MOE_STATUS_OK) {
    cli_error("bench layer: %s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  rc = check_world(ctx, &o, rank, world, &nodes);
  if (rc != CLI_OK) goto done;
  if (cli_watchdog_start(ctx, o.hang_timeout, rank, &wd) != CLI_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  char backend_desc[160];
  rc = cli_use_compute(o.backend, o.threads, o.precision, backend_desc, sizeof backend_desc);
  if (rc != CLI_OK) goto done;  // every rank parsed the same name: all leave here

  n_configs = o.grid ? GRID_CONFIGS : 1;
  cfgs = moe_calloc((size_t)n_configs, sizeof *cfgs);
  int n_sv = make_sched_variants(&o, sv, (int)(sizeof sv / sizeof sv[0]));
  if (o.auto_a2a || o.auto_comp || o.auto_sched || o.auto_chunks)
    n_sv = 2;  // sequential r=1, then the plan (filled per config)
  per_config = o.n_bal * o.n_a2a * o.n_comp * n_sv;
  rs = moe_calloc((size_t)n_configs * (size_t)per_config, sizeof *rs);
  if (!cfgs || !rs) {
    cli_error("rank %d: cannot allocate the result tables", rank);
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  make_configs(&o, cfgs);
  rc = open_outputs(&o, rank, &json);
  if (rc != CLI_OK) goto done;
  if (rank == 0) {
    printf(
        "moe bench layer (distributed): %d rank%s on %d node%s, EP=%d x DP=%d, wait %s, "
        "backend %s per rank\n",
        world, world == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s", o.ep, world / o.ep,
        moe_wait_policy_name(o.wait), backend_desc);
    if (o.skew.kind != MOE_SKEW_NONE) {
      char spec[MOE_SKEW_SPEC_MAX];
      moe_skew_to_string(&o.skew, spec, sizeof spec);
      printf("skew %s: a router bias fitted on the seed's tokens, the same on every rank\n", spec);
    }
    printf(
        "%d config%s x %d variant%s, median of %d iteration%s after %d warm-up; every number is "
        "the slowest rank's\n\n",
        n_configs, n_configs == 1 ? "" : "s", per_config, per_config == 1 ? "" : "s", o.iters,
        o.iters == 1 ? "" : "s", o.warmup);
    fflush(stdout);
  }
  for (int c = 0; c < n_configs; c++) {
    const char *trace = c == n_configs - 1 ? o.trace_path : NULL;
    rc = run_config(ctx, &o, &cfgs[c], c, rank, world, sv, n_sv,
                    rs + (size_t)c * (size_t)per_config, per_config, trace);
    if (rc != CLI_OK) goto done;
  }
  if (rank == 0 && o.grid) print_grid_summary(cfgs, n_configs, rs, per_config, n_sv);
  if (rank == 0) {
    if (o.trace_path) {
      const ep_result *r = &rs[(size_t)n_configs * (size_t)per_config - 1];
      printf("wrote %s (%s %s %s r=%d of config %d: the last iteration's passes)\n", o.trace_path,
             r->a2a, r->compress, r->schedule, r->chunks, n_configs);
    }
    printf("wall time %.2f s\n", (double)(moe_time_ns() - t_start) / 1e9);
    if (o.json_path) {
      rc = write_json(&json, ctx, &o, world, nodes, cfgs, n_configs, rs, per_config);
      if (rc == CLI_OK) printf("wrote %s\n", o.json_path);
    }
  }
  MOE_MPI_WATCHED("broadcast of the exit status", MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
done:
  moe_watchdog_stop(wd);
  cli_out_abort(&json);
  moe_free(cfgs);
  moe_free(rs);
  moe_ctx_destroy(ctx);
  fflush(stdout);
  fflush(stderr);
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0's messages are out before any rank exits
  MPI_Finalize();
  return rc;
}

#else  // !MOE_CLI_MPI

int cmd_bench_layer_ep(int argc, char **argv) {
  (void)argc;
  (void)argv;
  cli_error("this moe was built without MPI: the distributed 'bench layer' is not available");
  return CLI_FAILED;
}

#endif
