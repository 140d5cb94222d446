// moe simulate: predicted forward + backward time of the expert-parallel layer
// on a described cluster (a shipped one or a JSON file), for every variant
// all-to-all x compressor x (schedule, chunks), from the same task graphs and
// schedules the real layer runs, with modelled task durations
// (moe_simulate_layer, include/moe/perf.h). No MPI, no measurement.
#define _POSIX_C_SOURCE 200809L  // strtok_r
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moe/compress.h"
#include "moe/perf.h"
#include "moe/progress.h"

#define SIM_MAX_LIST 16

typedef struct {
  moe_layer_config cfg;
  const char *cluster, *profile;
  int cluster_set, a2a_set, a2a_all, sched_set, devices, list_clusters, group_size,
      compress_backward;
  unsigned layer_set;  // CLI_LAYER_* bits of the layer options given
  double cgbs, dgbs;
  char a2as[SIM_MAX_LIST][32];
  int n_a2a;
  char scheds[SIM_MAX_LIST][16];
  int n_sched;
  int chunks[SIM_MAX_LIST];
  int n_chunks;
  char comps[SIM_MAX_LIST][32];
  int n_comp;
  const char *json_path;
  int roofline;           // moe roofline: the DDL-roofline point of every variant
  const char *plot_path;  // roofline: gnuplot output (.png, .svg, else text)
  // --balance: the load-balancing policies' plans instead of the schedules
  int bal[8], n_bal;
  moe_skew skew;      // --skew [zipf:1.2 with --balance]
  int balance_slots;  // --balance-slots, -1: E / devices
  // --lina: Lina's inference scheduling replayed on a serving trace
  const char *lina_trace;
  moe_lina_sim_config lina;
  // --lina-train: Lina's training step under four policies
  int lina_train;
  moe_lina_train_config lt;
  int contention_set;          // --contention given
  const char *lt_opt;          // the last --lina-train option given (NULL: none)
  double lt_profile_slowdown;  // --profile's a2a_allreduce_slowdown (0: none)
  // --parm: Parm's schedules over a grid of configurations
  int parm;
  int parm_mp[SIM_MAX_LIST], n_parm_mp, parm_esp[SIM_MAX_LIST], n_parm_esp, parm_ep;
  const char *parm_opt;   // the last --mp, --esp or --ep given (NULL: none)
  const char *sched_opt;  // the last option of the schedule simulation given (NULL: none)
  const char *bal_opt;    // the last --skew or --balance-slots given (NULL: none)
  const char *lina_opt;   // the last --lina-* option given (NULL: none)
  int act_bytes_set;      // --act-bytes given
} sim_opts;

typedef struct {
  const char *a2a, *compress, *schedule;
  int chunks_req;
  moe_sim_result r;
  double speedup;
} sim_row;

static const char k_default_a2a[] = "mpi,pipe";  // catalogue: the default --a2a

static void simulate_usage(FILE *f) {
  char a2a[256];
  moe_a2a_names(a2a, sizeof a2a, 0);
  fprintf(f,
          "usage: moe simulate [options]\n"
          "\n"
          "Predicts the expert-parallel MoE layer's forward and backward time on a\n"
          "described cluster: the layer's own task graphs and schedules run with modelled\n"
          "durations (all-to-all from the directed link model, experts from the GEMM\n"
          "rate, compression from codec throughput; uniform routing). EP spans every\n"
          "device; tokens are per device. Prints one row per variant\n"
          "all-to-all x compressor x (schedule, chunks); docs/performance-model.md has the\n"
          "model and its limits.\n"
          "\n"
          "options (default in brackets):\n"
          "  --cluster NAME|FILE    a shipped cluster or a cluster JSON file\n"
          "                         [schemoe-8x4-rtx2080ti]\n"
          "  --list-clusters        print the shipped clusters and exit\n"
          "  --profile FILE         a profile from 'moe calibrate': its cluster and measured\n"
          "                         all-to-all, GEMM and codec models (not with --cluster or\n"
          "                         --devices)\n"
          "  --devices N            scale the cluster to N devices (whole nodes)\n"
          "  --tokens T             tokens per device [4096]\n"
          "  --model M              model dimension [1024]\n"
          "  --hidden H             expert hidden dimension [4096]\n"
          "  --experts E            experts, divisible by the devices [devices]\n"
          "  --topk K               experts per token [2]\n"
          "  --capacity-factor F    capacity C = ceil(F*K*T/E) per device; <= 0 dropless [1.2]\n"
          "  --a2a LIST|all         all-to-all models: %s\n"
          "                         [%s; with --profile, the profile's algorithms]\n"
          "  --schedule LIST|all    %s [all]\n"
          "  --chunks LIST          chunks r, 1..64 [2]; sequential also runs at r=1 as the\n"
          "                         baseline; smart uses its peer groups\n"
          "  --group-size G         smart's peer group size [devices per node]\n"
          "  --compress LIST        %s [none]\n"
          "  --compress-backward    also compress the backward's gradients\n"
          "  --codec-gbs C,D        compressor throughput per device, GB/s [this machine's\n"
          "                         one-core numbers, docs/compression.md]\n"
          "  --json FILE            write every variant's numbers as JSON (also with\n"
          "                         --balance and --parm; not with --lina, --lina-train)\n"
          "\n"
          "columns: fwd/bwd/total ms predicted; speedup over sequential r=1 with the same\n"
          "all-to-all and compressor; comm, comp = summed task times of both passes;\n"
          "exposed = comm not overlapped by compute in the simulated schedule.\n",
          a2a, k_default_a2a, moe_schedule_algo_names(), moe_compressor_names());
  fprintf(f,
          "\n"
          "load balancing (instead of the schedules; docs/balance.md):\n"
          "  --balance LIST|all     plan these policies (%s) on a skewed load\n"
          "                         and print each plan's copies, balance ratio and time\n"
          "                         under FasterMoE's (eq. 7/8) and Pro-Prophet's (eq. 6)\n"
          "                         models next to no copies\n"
          "  --skew SPEC            the expert popularity every device routes with:\n"
          "                         uniform, zipf:S, hot:F, trace:FILE[#LAYER][@A-B]\n"
          "                         (a moe train --routing-trace file) [zipf:1.2]\n"
          "  --balance-slots N      copy slots per device, 0..E-E/devices [E/devices]\n"
          "\n"
          "Lina's inference scheduling (instead of the schedules; docs/inference.md):\n"
          "  --lina TRACE           replay a serving trace (moe generate --paths P\n"
          "                         --routing-trace TRACE): per step and MoE block, the\n"
          "                         layer's forward with Lina's devices per expert from the\n"
          "                         actual popularity (ideal), from the path estimate (phase\n"
          "                         1), corrected after the gate (two phases), and static;\n"
          "                         p50/p95 over the steps, normalised to ideal (Lina's\n"
          "                         Table 5). Uses --tokens, --model, --hidden; the trace\n"
          "                         gives E and K [cluster lina-4x4-a100]\n"
          "  --lina-from-block B    skip the MoE blocks before B (Lina schedules from its\n"
          "                         4th layer) [0]\n"
          "  --lina-pack N          experts a device serves at most [4]\n"
          "  --lina-replan-ms X     a re-plan's blocking cost [a small collective on the\n"
          "                         cluster: log2(devices) latencies plus the bytes]\n"
          "  --lina-check-ms X      phase 2's check on every step [the same collective]\n"
          "  --act-bytes N          bytes of an activation on the wire [2: fp16]\n"
          "\n"
          "Lina's training step (instead of the schedules; docs/lina.md):\n"
          "  --lina-train           a GPT-style MoE model's step under four policies for\n"
          "                         the dense gradients' all-reduce: packed after the\n"
          "                         backward, fifo beside the all-to-alls (DeepSpeed),\n"
          "                         Lina's priority micro-ops with pipelined all-to-all\n"
          "                         micro-ops, and the same with expert packing. Uses\n"
          "                         --tokens, --model, --hidden, --experts, --topk,\n"
          "                         --act-bytes [cluster lina-4x4-a100; GPT-2 small: M 768,\n"
          "                         H 3072, 12 blocks]\n"
          "  --layers L             blocks [12]\n"
          "  --moe-every K          every K-th block is MoE [2]\n"
          "  --seq-len S            attention length [1024]\n"
          "  --vocab V              embedding rows [50257]\n"
          "  --micro-op-mb X        Lina's micro-op [30]\n"
          "  --contention X         an all-to-all's slowdown beside an all-reduce, >= 1\n"
          "                         [--profile's, measured by moe calibrate; else 1.83:\n"
          "                         Lina's median]\n"
          "  --packing N            the packing variant's experts-per-device factor [2]\n",
          moe_balance_policy_names());
  fprintf(f,
          "\n"
          "Parm's schedules (instead of the above; docs/parm.md):\n"
          "  --parm                 one MoE layer's forward + backward under DeepSpeed-MoE's\n"
          "                         baseline, Parm's S1 and S2 (SAA) for a grid modelled on\n"
          "                         Parm's Table III, with S1's and S2's speedups, Algorithm\n"
          "                         1's pick from alpha-beta terms fitted to the model, and\n"
          "                         the speedup ranges beside the paper's. Layout: devices =\n"
          "                         DP x MP x EP x ESP, MP groups of consecutive devices, ESP\n"
          "                         groups next. Uniform routing; no memory limit\n"
          "                         [cluster parm-1x8-rtx4090-pcie (testbed A); testbed B:\n"
          "                         parm-8x4-rtx2080ti-100g with --devices 8, 16 or 32]\n"
          "  --mp LIST              N_MP values [1,2,4]\n"
          "  --esp LIST             N_ESP values, each dividing every H [1,2,4]\n"
          "  --ep N                 N_EP [devices / (MP x ESP): DP = 1]\n"
          "  grid: --tokens [2048,8192], --model and --hidden [1024,4096 each],\n"
          "  --capacity-factor [1.2,2.4] (<= 0: dropless), each a single value when given;\n"
          "  --topk [2], --experts [the least multiple of EP >= K], --act-bytes element\n"
          "  bytes [4: fp32, as the clusters' GEMM rates]; --json FILE writes every row.\n"
          "  Unless both --mp and --esp are given, the layouts that do not divide the\n"
          "  devices are skipped; otherwise they, and any other bad value, are errors\n"
          "  (exit 2). ok: Algorithm 1 picked the faster of s1 and s2.\n");
}

// "all" of --a2a: every algorithm of the catalogue.
static void all_a2a(char *buf, size_t len) { moe_a2a_names(buf, len, 0); }

// "all" of --compress: every compressor of the catalogue compiled into this
// build, with its default parameter ("zfp:8").
static void all_compressors(char *buf, size_t len) {
  int n = 0;
  const moe_compressor_entry *const *list = moe_compressor_list(&n);
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && used < len; i++) {
    if (!list[i]->available) continue;
    char spec[64];
    moe_compressor_default_spec(list[i], spec, sizeof spec);
    const int w = snprintf(buf + used, len - used, "%s%s", used ? "," : "", spec);
    if (w > 0) used += (size_t)w;
  }
}

// Splits a comma-separated list into items of width w; "all" expands to `all`.
static int parse_names(cli_args *a, const char *opt, const char *text, const char *all, char *items,
                       size_t w, int *n) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", strcmp(text, "all") == 0 ? all : text);
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
    if (*n >= SIM_MAX_LIST || strlen(t) >= w) {
      cli_error("%s: too many items or '%s' too long (at most %d items)", opt, t, SIM_MAX_LIST);
      a->bad = 1;
      return 0;
    }
    snprintf(items + (size_t)(*n) * w, w, "%s", t);
    (*n)++;
  }
  if (*n == 0) {
    cli_error("%s: empty list", opt);
    a->bad = 1;
  }
  return *n;
}

// A comma-separated list of integers in [lo, hi].
static void parse_ints(cli_args *a, const char *opt, const char *text, long lo, long hi, int *out,
                       int *n) {
  char items[SIM_MAX_LIST][16];
  if (!parse_names(a, opt, text, "", &items[0][0], 16, n)) return;
  for (int i = 0; i < *n && !a->bad; i++) {
    char *end = NULL;
    const long v = strtol(items[i], &end, 10);
    if (!end || *end || v < lo || v > hi) {
      cli_error("%s: '%s' must be an integer in [%ld, %ld]", opt, items[i], lo, hi);
      a->bad = 1;
    }
    out[i] = (int)v;
  }
}

static void roofline_usage(FILE *f) {
  fprintf(f,
          "usage: moe roofline [options]\n"
          "\n"
          "The DDL-roofline point (FasterMoE eq. 3-6) of the expert-parallel layer for every\n"
          "variant, from the same simulation as 'moe simulate' (which documents the layer,\n"
          "cluster and variant options; all of them apply here):\n"
          "  R_CC = comp / comm (the passes' compute and communication task time),\n"
          "  achieved = expert FLOPs / (devices x total time), ideal = peak x min(1, R_CC),\n"
          "  semi-ideal = peak x R_CC / (R_CC + 1), each as a fraction of the device peak\n"
          "  (the cluster's GEMM rate).\n"
          "\n"
          "extra option:\n"
          "  --plot FILE            plot the points over the ideal and semi-ideal curves with\n"
          "                         gnuplot (FILE.png or FILE.svg, else a text plot in FILE);\n"
          "                         the data and script are written next to it as FILE.dat and\n"
          "                         FILE.gp, and gnuplot is run when it is installed\n");
}

static int parse_sim(int argc, char **argv, sim_opts *o) {
  const int roofline = o->roofline;
  memset(o, 0, sizeof *o);
  o->roofline = roofline;
  moe_layer_config_default(&o->cfg);
  o->cfg.tokens = 4096;
  o->cfg.model_dim = 1024;
  o->cfg.hidden_dim = 4096;
  o->cfg.top_k = 2;
  o->cfg.capacity_factor = 1.2;
  o->cluster = "schemoe-8x4-rtx2080ti";
  memset(&o->skew, 0, sizeof o->skew);
  o->skew.kind = MOE_SKEW_ZIPF;
  o->skew.param = 1.2;
  o->balance_slots = -1;
  moe_lina_sim_config_default(&o->lina);
  moe_lina_train_config_default(&o->lt);
  snprintf(o->a2as[0], sizeof o->a2as[0], "mpi");   // catalogue: default
  snprintf(o->a2as[1], sizeof o->a2as[1], "pipe");  // catalogue: default
  o->n_a2a = 2;
  const moe_schedule_algo *list = moe_schedule_algo_list(&o->n_sched);
  for (int i = 0; i < o->n_sched; i++) snprintf(o->scheds[i], 16, "%s", list[i].name);
  o->chunks[0] = 2;
  o->n_chunks = 1;
  snprintf(o->comps[0], sizeof o->comps[0], "none");  // catalogue: default
  o->n_comp = 1;
  cli_args a;
  cli_args_init(&a, argc, argv, 2);
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      if (o->roofline) {
        roofline_usage(stdout);
      } else {
        simulate_usage(stdout);
      }
      exit(CLI_OK);
    } else if (cli_flag(&a, "--list-clusters")) {
      o->list_clusters = 1;
    } else if (cli_opt(&a, "--cluster")) {
      o->cluster = a.value;
      o->cluster_set = 1;
    } else if (cli_opt(&a, "--profile")) {
      o->profile = a.value;
    } else if (cli_opt(&a, "--devices")) {
      cli_parse_int(&a, "--devices", 1, 1 << 20, &o->devices);
    } else if (cli_layer_shape_opt(&a, &o->cfg, &o->layer_set)) {
    } else if (cli_opt(&a, "--a2a")) {
      o->sched_opt = "--a2a";
      o->a2a_set = 1;
      o->a2a_all = a.value && strcmp(a.value, "all") == 0;
      if (a.value) {
        char all[256];
        all_a2a(all, sizeof all);
        parse_names(&a, "--a2a", a.value, all, &o->a2as[0][0], 32, &o->n_a2a);
      }
    } else if (cli_opt(&a, "--schedule")) {
      o->sched_opt = "--schedule";
      if (a.value) {
        o->sched_set = strcmp(a.value, "all") != 0;
        parse_names(&a, "--schedule", a.value, moe_schedule_algo_names(), &o->scheds[0][0], 16,
                    &o->n_sched);
      }
    } else if (cli_opt(&a, "--compress")) {
      o->sched_opt = "--compress";
      if (a.value) {
        char all[256];
        all_compressors(all, sizeof all);
        parse_names(&a, "--compress", a.value, all, &o->comps[0][0], 32, &o->n_comp);
      }
    } else if (cli_opt(&a, "--chunks")) {
      o->sched_opt = "--chunks";
      char items[SIM_MAX_LIST][16];
      if (a.value && parse_names(&a, "--chunks", a.value, "", &items[0][0], 16, &o->n_chunks)) {
        for (int i = 0; i < o->n_chunks && !a.bad; i++) {
          char *end = NULL;
          const long v = strtol(items[i], &end, 10);
          if (!end || *end || v < 1 || v > 64) {
            cli_error("--chunks: '%s' must be an integer in [1, 64]", items[i]);
            a.bad = 1;
          }
          o->chunks[i] = (int)v;
        }
      }
    } else if (cli_opt(&a, "--group-size")) {
      o->sched_opt = "--group-size";
      cli_parse_int(&a, "--group-size", 1, 1 << 20, &o->group_size);
    } else if (cli_flag(&a, "--compress-backward")) {
      o->sched_opt = "--compress-backward";
      o->compress_backward = 1;
    } else if (cli_opt(&a, "--codec-gbs")) {
      o->sched_opt = "--codec-gbs";
      char tail = 0;
      if (a.value && (sscanf(a.value, "%lf,%lf%c", &o->cgbs, &o->dgbs, &tail) != 2 ||
                      !(o->cgbs > 0) || !(o->dgbs > 0) || o->cgbs > 1e6 || o->dgbs > 1e6)) {
        cli_error("--codec-gbs '%s' must be C,D: two throughputs in (0, 1e6] GB/s", a.value);
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--json")) {
      o->json_path = a.value;
    } else if (o->roofline && cli_opt(&a, "--plot")) {
      o->plot_path = a.value;
    } else if (!o->roofline && cli_opt(&a, "--balance")) {
      char items[SIM_MAX_LIST][16];
      int n = 0;
      char all[128];
      snprintf(all, sizeof all, "%s", moe_balance_policy_names());
      if (a.value && parse_names(&a, "--balance", a.value, all, &items[0][0], 16, &n)) {
        o->n_bal = 0;
        for (int i = 0; i < n && !a.bad; i++) {
          const int p = moe_balance_policy_find(items[i]);
          if (p < 0) {
            cli_error("--balance: policy '%s' is unknown (valid: %s, all)", items[i],
                      moe_balance_policy_names());
            a.bad = 1;
          } else if (o->n_bal < 8) {
            int seen = 0;  // a policy named twice is planned once
            for (int k = 0; k < o->n_bal; k++) seen |= o->bal[k] == p;
            if (!seen) o->bal[o->n_bal++] = p;
          }
        }
      }
    } else if (!o->roofline && cli_opt(&a, "--skew")) {
      o->bal_opt = "--skew";
      cli_parse_skew(&a, "--skew", &o->skew);
    } else if (!o->roofline && cli_opt(&a, "--balance-slots")) {
      o->bal_opt = "--balance-slots";
      cli_parse_int(&a, "--balance-slots", 0, 1 << 20, &o->balance_slots);
    } else if (!o->roofline && cli_opt(&a, "--lina")) {
      o->lina_trace = a.value;
    } else if (!o->roofline && cli_opt(&a, "--lina-from-block")) {
      o->lina_opt = "--lina-from-block";
      cli_parse_int(&a, "--lina-from-block", 0, 255, &o->lina.from_block);
    } else if (!o->roofline && cli_opt(&a, "--lina-pack")) {
      o->lina_opt = "--lina-pack";
      cli_parse_int(&a, "--lina-pack", 1, 65536, &o->lina.max_pack);
    } else if (!o->roofline && cli_opt(&a, "--lina-replan-ms")) {
      o->lina_opt = "--lina-replan-ms";
      cli_parse_double(&a, "--lina-replan-ms", 0, 1e6, &o->lina.replan_ms);
    } else if (!o->roofline && cli_opt(&a, "--lina-check-ms")) {
      o->lina_opt = "--lina-check-ms";
      cli_parse_double(&a, "--lina-check-ms", 0, 1e6, &o->lina.check_ms);
    } else if (!o->roofline && cli_opt(&a, "--act-bytes")) {
      cli_parse_int(&a, "--act-bytes", 1, 8, &o->lina.act_bytes);
      o->lt.elem_bytes = o->lina.act_bytes;
      o->act_bytes_set = 1;
    } else if (!o->roofline && cli_flag(&a, "--parm")) {
      o->parm = 1;
    } else if (!o->roofline && cli_opt(&a, "--mp")) {
      o->parm_opt = "--mp";
      if (a.value) parse_ints(&a, "--mp", a.value, 1, 1 << 20, o->parm_mp, &o->n_parm_mp);
    } else if (!o->roofline && cli_opt(&a, "--esp")) {
      o->parm_opt = "--esp";
      if (a.value) parse_ints(&a, "--esp", a.value, 1, 1 << 20, o->parm_esp, &o->n_parm_esp);
    } else if (!o->roofline && cli_opt(&a, "--ep")) {
      o->parm_opt = "--ep";
      cli_parse_int(&a, "--ep", 1, 1 << 20, &o->parm_ep);
    } else if (!o->roofline && cli_flag(&a, "--lina-train")) {
      o->lina_train = 1;
    } else if (!o->roofline && cli_opt(&a, "--layers")) {
      o->lt_opt = "--layers";
      cli_parse_int(&a, "--layers", 1, 1024, &o->lt.layers);
    } else if (!o->roofline && cli_opt(&a, "--moe-every")) {
      o->lt_opt = "--moe-every";
      cli_parse_int(&a, "--moe-every", 1, 1024, &o->lt.moe_every);
    } else if (!o->roofline && cli_opt(&a, "--seq-len")) {
      o->lt_opt = "--seq-len";
      cli_parse_int(&a, "--seq-len", 1, 1 << 20, &o->lt.seq_len);
    } else if (!o->roofline && cli_opt(&a, "--vocab")) {
      o->lt_opt = "--vocab";
      cli_parse_int(&a, "--vocab", 0, 1 << 24, &o->lt.vocab);
    } else if (!o->roofline && cli_opt(&a, "--micro-op-mb")) {
      o->lt_opt = "--micro-op-mb";
      double mb = 30;
      cli_parse_double(&a, "--micro-op-mb", 0.001, 65536, &mb);
      o->lt.micro_op_bytes = mb * 1e6;
    } else if (!o->roofline && cli_opt(&a, "--contention")) {
      o->lt_opt = "--contention";
      cli_parse_double(&a, "--contention", 1, 100, &o->lt.contention);
      o->contention_set = 1;
    } else if (!o->roofline && cli_opt(&a, "--packing")) {
      o->lt_opt = "--packing";
      cli_parse_int(&a, "--packing", 1, 1024, &o->lt.packing);
    } else {
      cli_error("unknown option '%s' (see moe simulate --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
  }
  return a.bad ? CLI_USAGE : CLI_OK;
}

// The cluster by shipped name, else as a file.
static int load_cluster(moe_ctx *ctx, const char *what, moe_cluster *c) {
  if (moe_cluster_builtin(ctx, what, c) == MOE_STATUS_OK) return CLI_OK;
  if (!strchr(what, '/') && !strstr(what, ".json")) {
    cli_error("--cluster: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  if (moe_cluster_load(ctx, what, c) != MOE_STATUS_OK) {
    cli_error("--cluster: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  return CLI_OK;
}

static int write_json(const char *path, const sim_opts *o, const moe_cluster *c,
                      const sim_row *rows, int n) {
  cli_out out;
  const int opened = cli_out_open(&out, path);  // CLI_USAGE: a bad path
  if (opened != CLI_OK) return opened;
  FILE *f = out.f;
  char safe_name[sizeof c->name];  // the name without characters JSON would need escaped
  size_t k = 0;
  for (const char *q = c->name; *q && k + 1 < sizeof safe_name; q++) {
    if (*q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) safe_name[k++] = *q;
  }
  safe_name[k] = '\0';
  char cfg[1024];
  if (moe_layer_config_to_json(NULL, &o->cfg, cfg, sizeof cfg) != MOE_STATUS_OK) cfg[0] = 0;
  fprintf(f,
          "{\"tool\": \"moe simulate\", \"cluster\": \"%s\", \"nodes\": %d, "
          "\"devices_per_node\": %d, \"layer\": %s, \"compress_backward\": %s,\n \"variants\": [\n",
          safe_name, c->nodes, c->devices_per_node, cfg[0] ? cfg : "null",
          o->compress_backward ? "true" : "false");
  for (int i = 0; i < n; i++) {
    const sim_row *r = &rows[i];
    const moe_pass_breakdown *b = r->r.breakdown;
    fprintf(f,
            "  {\"a2a\": \"%s\", \"compress\": \"%s\", \"schedule\": \"%s\", \"chunks\": %d, "
            "\"fwd_ms\": %.6g, \"bwd_ms\": %.6g, \"total_ms\": %.6g, \"speedup\": %.6g, "
            "\"comm_ms\": %.6g, \"comp_ms\": %.6g, \"exposed_comm_ms\": %.6g, "
            "\"a2a_ms\": %.6g, \"expert_ms\": %.6g}%s\n",
            r->a2a, r->compress, r->schedule, r->r.chunks, r->r.fwd_ms, r->r.bwd_ms, r->r.total_ms,
            r->speedup, (double)(b[0].comm_ns + b[1].comm_ns) / 1e6,
            (double)(b[0].compute_ns + b[1].compute_ns) / 1e6,
            (double)(b[0].exposed_comm_ns + b[1].exposed_comm_ns) / 1e6, r->r.a2a_ms,
            r->r.expert_ms, i + 1 < n ? "," : "");
  }
  fputs(" ]\n}\n", f);
  return cli_out_commit(&out);
}

// Writes FILE.dat and FILE.gp and runs gnuplot when it is installed.
static int plot_roofline(const char *path, const moe_cluster *c, const moe_layer_config *cfg,
                         const sim_row *rows, int n) {
  char dat[4096], gp[4096];
  if (!moe_gnuplot_path_ok(path)) {
    cli_error("--plot '%s': the path may not contain quotes, backslashes or newlines", path);
    return CLI_USAGE;
  }
  snprintf(dat, sizeof dat, "%s.dat", path);
  snprintf(gp, sizeof gp, "%s.gp", path);
  FILE *f = fopen(dat, "w");
  if (!f) {
    cli_error("--plot: cannot write '%s'", dat);
    return CLI_FAILED;
  }
  // Variants often land on nearly the same point: each point is labelled with
  // its number, points closer than a label's size share one label ("1,4"), and
  // the numbers are listed with their variants beside the plot.
  double *px = calloc((size_t)(n > 0 ? n : 1), sizeof *px);
  double *py = calloc((size_t)(n > 0 ? n : 1), sizeof *py);
  int *owner = calloc((size_t)(n > 0 ? n : 1), sizeof *owner);
  if (!px || !py || !owner) {
    free(px), free(py), free(owner), fclose(f);
    cli_error("out of memory");
    return CLI_FAILED;
  }
  for (int i = 0; i < n; i++) {
    moe_roofline p;
    moe_roofline_of_layer(c, cfg, &rows[i].r, &p);
    px[i] = p.r_cc;
    py[i] = p.achieved_flops / p.peak_flops;
    owner[i] = i;
    for (int j = 0; j < i; j++) {
      if (owner[j] == j && px[j] > 0 && px[i] > 0 && fabs(log10(px[i] / px[j])) < 0.06 &&
          fabs(py[i] - py[j]) < 0.03) {
        owner[i] = j;
        break;
      }
    }
  }
  fprintf(f, "# R_CC achieved/peak label\n");
  for (int i = 0; i < n; i++) {
    char label[256] = "";
    size_t len = 0;
    if (owner[i] == i)
      for (int j = i; j < n && len + 8 < sizeof label; j++)
        if (owner[j] == i)
          len += (size_t)snprintf(label + len, sizeof label - len, "%s%d", len ? "," : "", j + 1);
    fprintf(f, "%.6g %.6g \"%s\"\n", px[i], py[i], label);
  }
  fclose(f);
  f = fopen(gp, "w");
  if (!f) {
    free(px), free(py), free(owner);
    cli_error("--plot: cannot write '%s'", gp);
    return CLI_FAILED;
  }
  moe_gnuplot_set_output(f, path);
  fprintf(f,
          "set logscale x\nset xlabel 'R_{CC} = comp / comm'\n"
          "set ylabel 'FLOP/s per device / peak'\nset yrange [0:1.05]\nset key top left\n"
          "set title 'DDL-roofline, %s'\nset rmargin at screen 0.70\n",
          c->name);
  const double step = n > 0 && 0.80 / n < 0.035 ? 0.80 / n : 0.035;
  for (int i = 0; i < n; i++)
    fprintf(f, "set label %d '%d: %s/%s r=%d' at screen 0.72, screen %.4f font ',%d'\n", i + 1,
            i + 1, rows[i].schedule, rows[i].a2a, rows[i].r.chunks, 0.90 - i * step,
            step < 0.025 ? 6 : 8);
  fprintf(f,
          "plot [0.01:100] (x < 1 ? x : 1) title 'ideal', x / (x + 1) title 'semi-ideal', "
          "'%s' using 1:2 with points pt 7 title 'variants', '%s' using 1:2:3 with labels "
          "offset 0.8,0.6 font ',8' notitle\n",
          dat, dat);
  fclose(f);
  free(px), free(py), free(owner);
  if (!moe_gnuplot_available()) {
    printf("gnuplot is not installed: wrote %s and %s (run 'gnuplot %s')\n", dat, gp, gp);
    return CLI_OK;
  }
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return CLI_FAILED;
  const moe_status st = moe_gnuplot_run(ctx, gp);
  if (st != MOE_STATUS_OK) cli_error("--plot: %s", moe_ctx_error(ctx));
  moe_ctx_destroy(ctx);
  if (st != MOE_STATUS_OK) return CLI_FAILED;
  printf("plotted %s (data %s, script %s)\n", path, dat, gp);
  return CLI_OK;
}

// --balance: each policy's plan on the skewed load, under both models.
// --balance's rows as JSON (--json).
static int balance_json(const char *path, const sim_opts *o, const moe_cluster *c, const char *skew,
                        int slots, const moe_balance_sim_result *res) {
  cli_out out;
  const int opened = cli_out_open(&out, path);  // CLI_USAGE: a bad path
  if (opened != CLI_OK) return opened;
  FILE *f = out.f;
  char cfg[1024];
  if (moe_layer_config_to_json(NULL, &o->cfg, cfg, sizeof cfg) != MOE_STATUS_OK) cfg[0] = 0;
  fputs("{\"tool\": \"moe simulate --balance\", \"cluster\": ", f);
  cli_json_string(f, c->name);
  fprintf(f, ", \"nodes\": %d, \"devices_per_node\": %d, \"layer\": %s, \"skew\": ", c->nodes,
          c->devices_per_node, cfg[0] ? cfg : "null");
  cli_json_string(f, skew);
  fprintf(f, ", \"slots\": %d,\n \"policies\": [\n", slots);
  for (int i = 0; i < o->n_bal; i++) {
    const moe_balance_sim_result *r = &res[i];
    fprintf(f,
            "  {\"policy\": \"%s\", \"copies\": %d, \"ratio_before\": %.6g, "
            "\"ratio_after\": %.6g, \"fastermoe_none_ms\": %.6g, \"fastermoe_ms\": %.6g, "
            "\"prophet_none_ms\": %.6g, \"prophet_ms\": %.6g}%s\n",
            moe_balance_policy_name(r->policy), r->copies, r->ratio_before, r->ratio_after,
            r->none_fastermoe, r->ms_fastermoe, r->none_prophet, r->ms_prophet,
            i + 1 < o->n_bal ? "," : "");
  }
  fputs(" ]\n}\n", f);
  return cli_out_commit(&out);
}

static int simulate_balance(moe_ctx *ctx, const sim_opts *o, const moe_cluster *c) {
  const int D = moe_cluster_devices(c), E = o->cfg.num_experts;
  if (E % D != 0) {
    cli_error("--experts (%d) must be divisible by the devices (%d) for --balance", E, D);
    return CLI_USAGE;
  }
  const int most = E - E / D;
  const int slots = o->balance_slots >= 0 ? o->balance_slots : (E / D < most ? E / D : most);
  if (slots > most) {
    cli_error("--balance-slots (%d) must be in [0, %d] (the experts a device does not hold)", slots,
              most);
    return CLI_USAGE;
  }
  if (o->skew.kind == MOE_SKEW_NONE) {  // a router, not shares: bench layer's
    cli_error(
        "--skew none is the router as initialised (moe bench layer); moe simulate routes by "
        "shares: give uniform, zipf:S, hot:F or trace:FILE");
    return CLI_USAGE;
  }
  if (cli_check_skew(&o->skew, E, o->cfg.top_k, 1) != CLI_OK) return CLI_USAGE;
  double *shares = malloc((size_t)E * sizeof(double));
  moe_balance_sim_result res[8];
  int rc = CLI_OK;
  if (!shares) return CLI_FAILED;
  if (moe_skew_shares(ctx, &o->skew, E, o->cfg.top_k, shares) != MOE_STATUS_OK ||
      moe_balance_simulate(ctx, c, &o->cfg, shares, o->bal, o->n_bal, slots, res) !=
          MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    free(shares);
    return CLI_USAGE;
  }
  char spec[MOE_SKEW_SPEC_MAX];
  moe_skew_to_string(&o->skew, spec, sizeof spec);
  moe_balance_cost cost;
  moe_balance_cost_of_cluster(c, o->cfg.model_dim, o->cfg.hidden_dim, &cost);
  printf(
      "moe simulate --balance: %s (%d x %d %s), T=%d per device, M=%d, H=%d, E=%d, K=%d, "
      "skew %s, %d copy slots per device\n",
      c->name, c->nodes, c->devices_per_node, c->device, o->cfg.tokens, o->cfg.model_dim,
      o->cfg.hidden_dim, E, o->cfg.top_k, spec, slots);
  printf(
      "rates: GEMM %.2f TFLOP/s per device, %.2f GB/s per device for the all-to-all and the "
      "copies\n\n",
      cost.flops_per_s / 1e12, cost.net_bytes_per_s / 1e9);
  printf("%-8s %6s %8s %8s %12s %12s %9s %12s %12s %9s\n", "policy", "copies", "ratio", "after",
         "FMoE none", "FMoE plan", "speedup", "Prophet none", "Prophet plan", "speedup");
  for (int i = 0; i < o->n_bal; i++) {
    const moe_balance_sim_result *r = &res[i];
    printf("%-8s %6d %8.3f %8.3f %12.3f %12.3f %8.3fx %12.3f %12.3f %8.3fx\n",
           moe_balance_policy_name(r->policy), r->copies, r->ratio_before, r->ratio_after,
           r->none_fastermoe, r->ms_fastermoe, r->none_fastermoe / r->ms_fastermoe, r->none_prophet,
           r->ms_prophet, r->none_prophet / r->ms_prophet);
  }
  printf(
      "\n(ms: one layer's forward + backward under each model: FasterMoE eq. 7 without\n"
      "copies, eq. 8 with; Pro-Prophet eq. 6, Trans and Agg exposed. ratio: the busiest\n"
      "device's rows over the mean, without and with the plan's copies.)\n");
  free(shares);
  if (o->json_path) {
    rc = balance_json(o->json_path, o, c, spec, slots, res);
    if (rc == CLI_OK) printf("wrote %s\n", o->json_path);
  }
  return rc;
}

// --lina: Lina's scheduling replayed on a serving trace, beside Table 5.
static int simulate_lina(moe_ctx *ctx, sim_opts *o, const moe_cluster *c) {
  moe_routing_trace_data tr;
  moe_lina_sim_result r;
  if (moe_routing_trace_load(ctx, o->lina_trace, &tr) != MOE_STATUS_OK) {
    cli_error("--lina: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  o->lina.tokens = o->cfg.tokens;
  o->lina.model_dim = o->cfg.model_dim;
  o->lina.hidden_dim = o->cfg.hidden_dim;
  const moe_status st = moe_lina_simulate(ctx, c, &o->lina, &tr, &r);
  const int E = tr.experts, K = tr.top_k, lines = tr.n;
  moe_routing_trace_data_free(&tr);
  if (st != MOE_STATUS_OK) {
    cli_error("--lina: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  moe_balance_cost cost;
  moe_balance_cost_of_cluster(c, o->cfg.model_dim, o->cfg.hidden_dim, &cost);
  printf(
      "moe simulate --lina: %s (%d x %d %s), trace %s (%d lines; E=%d, K=%d), T=%d per "
      "device, M=%d, H=%d, %d-byte activations, at most %d experts a device, from MoE block "
      "%d\n",
      c->name, c->nodes, c->devices_per_node, c->device, o->lina_trace, lines, E, K, o->cfg.tokens,
      o->cfg.model_dim, o->cfg.hidden_dim, o->lina.act_bytes, o->lina.max_pack, o->lina.from_block);
  printf(
      "rates: GEMM %.2f TFLOP/s per device, %.2f GB/s per device; phase-2 check %.3f ms, "
      "re-plan %.3f ms\n\n",
      cost.flops_per_s / 1e12, cost.net_bytes_per_s / 1e9, r.check_ms, r.replan_ms);
  static const char *const names[MOE_LINA_SCENARIOS] = {"ideal", "static", "lina phase 1",
                                                        "lina (two phases)"};
  printf("| scenario | p50 ms | p95 ms | p50 / ideal | p95 / ideal |\n|---|---|---|---|---|\n");
  for (int s = 0; s < MOE_LINA_SCENARIOS; s++)
    printf("| %s | %.3f | %.3f | %.2f | %.2f |\n", names[s], r.p50[s], r.p95[s],
           r.p50[s] / r.p50[MOE_LINA_IDEAL], r.p95[s] / r.p95[MOE_LINA_IDEAL]);
  printf(
      "\n%d samples (MoE block steps): estimate accuracy %.1f%% (top-%d equal in order), "
      "fine-tune rate %.1f%% (not equal as sets: phase 2 re-plans)\n",
      r.samples, 100 * r.accuracy, 2 * K < E ? 2 * K : E, 100 * r.finetune);
  printf(
      "Lina Table 5 (16 A100s; two phases, normalised to ideal): l=1: p50 1.41 / 1.34, p95 "
      "1.32 / 1.35, fine-tune 76.5%% / 71.3%%, accuracy 31.6%% / 28.3%% (TXL / BERT); l=3: "
      "1.16 / 1.07, 1.04 / 1.04, 25.7%% / 32.2%%, 60.4%% / 63.5%%; l=6: 1.19 / 1.09, 1.11 / "
      "1.11, 22.5%% / 27.1%%, 71.4%% / 66.0%%\n");
  return CLI_OK;
}

// --lina-train: Lina's training step under the four policies (moe_lina_train_simulate).
static int simulate_lina_train(moe_ctx *ctx, sim_opts *o, const moe_cluster *c) {
  moe_lina_train_config *lt = &o->lt;
  if (o->layer_set & CLI_LAYER_TOKENS) lt->tokens = o->cfg.tokens;
  lt->model_dim = o->layer_set & CLI_LAYER_MODEL ? o->cfg.model_dim : 768;
  lt->hidden_dim = o->layer_set & CLI_LAYER_HIDDEN ? o->cfg.hidden_dim : 3072;
  lt->experts = o->cfg.num_experts;
  lt->top_k = o->cfg.top_k;
  moe_lina_train_result r[MOE_LINA_TRAIN_VARIANTS];
  if (o->profile && !o->contention_set && o->lt_profile_slowdown >= 1.0)
    lt->contention = o->lt_profile_slowdown;  // measured by moe calibrate
  if (moe_lina_train_simulate(ctx, c, lt, r) != MOE_STATUS_OK) {
    cli_error("--lina-train: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  const int n_moe = r[MOE_LINA_TRAIN_FIFO].moe_blocks;
  printf(
      "moe simulate --lina-train: %s (%d x %d %s), %d blocks (%d MoE), M %d, H %d, E %d, K %d, "
      "%d tokens per device, seq %d, vocab %d, %g-byte elements; all-to-all %.2fx slower beside "
      "an all-reduce, micro-op %g MB, packing x%d\n\n",
      c->name, c->nodes, c->devices_per_node, c->device, lt->layers, n_moe, lt->model_dim,
      lt->hidden_dim, lt->experts, lt->top_k, lt->tokens, lt->seq_len, lt->vocab, lt->elem_bytes,
      lt->contention, lt->micro_op_bytes / 1e6, lt->packing);
  printf("%-9s %4s %6s %9s %9s %14s %10s %9s %9s %8s\n", "variant", "EP", "chunks", "fwd(ms)",
         "bwd(ms)", "sum left(ms)", "step(ms)", "a2a(ms)", "sum(ms)", "vs fifo");
  for (int v = 0; v < MOE_LINA_TRAIN_VARIANTS; v++)
    printf("%-9s %4d %6d %9.2f %9.2f %14.2f %10.2f %9.2f %9.2f %7.2fx\n",
           moe_lina_train_variant_name(v), r[v].ep, r[v].chunks, r[v].fwd_ms, r[v].bwd_ms,
           r[v].ar_exposed_ms, r[v].step_ms, r[v].a2a_ms, r[v].ar_ms,
           r[MOE_LINA_TRAIN_FIFO].step_ms / r[v].step_ms);
  printf(
      "\n[R] reconstructed model (docs/lina.md#simulated-steps); Lina reports 1.37-1.73x for "
      "its full scheduler over DeepSpeed on 4 x 4 A100\n");
  return CLI_OK;
}

// --parm: one row of the grid.
typedef struct {
  moe_parm_sim_config c;
  moe_parm_sim_result r;
  double t1_ms, t2_ms;  // Algorithm 1's comparison (eq. 13-14), ms
  int pick, faster;     // Algorithm 1's schedule; the faster simulated one
} parm_row;

static void parm_range(const parm_row *rows, int n, int s, double *lo, double *hi) {
  *lo = INFINITY;
  *hi = 0;
  for (int i = 0; i < n; i++) {
    if (rows[i].c.mp * rows[i].c.esp == 1) continue;  // one schedule: nothing to compare
    const moe_parm_sim_times *t = rows[i].r.sched;
    const int k = s >= 0 ? s : rows[i].pick;
    const double x = t[MOE_PARM_BASELINE].total_ms / t[k].total_ms;
    *lo = x < *lo ? x : *lo;
    *hi = x > *hi ? x : *hi;
  }
}

static int parm_json(const char *path, const moe_cluster *c, const parm_row *rows, int n) {
  cli_out out;
  const int opened = cli_out_open(&out, path);  // CLI_USAGE: a bad path
  if (opened != CLI_OK) return opened;
  FILE *f = out.f;
  fprintf(f,
          "{\"tool\": \"moe simulate --parm\", \"cluster\": \"%s\", \"nodes\": %d, "
          "\"devices_per_node\": %d,\n \"rows\": [\n",
          c->name, c->nodes, c->devices_per_node);
  for (int i = 0; i < n; i++) {
    const parm_row *w = &rows[i];
    fprintf(f,
            "  {\"tokens\": %d, \"model_dim\": %d, \"hidden_dim\": %d, \"experts\": %d, "
            "\"top_k\": %d, \"capacity_factor\": %.6g, \"elem_bytes\": %.6g, \"dp\": %d, "
            "\"mp\": %d, \"ep\": %d, \"esp\": %d, \"mp_intra\": %s, \"esp_intra\": %s, "
            "\"v_elems\": %.6g, \"alg1\": \"%s\", \"alg1_t1_ms\": %.6g, \"alg1_t2_ms\": %.6g, "
            "\"faster\": \"%s\",\n   \"schedules\": {",
            w->c.tokens, w->c.model_dim, w->c.hidden_dim, w->r.experts, w->c.top_k,
            w->c.capacity_factor, w->c.elem_bytes, w->r.dp, w->c.mp, w->c.ep, w->c.esp,
            w->r.mp_intra ? "true" : "false", w->r.esp_intra ? "true" : "false", w->r.v_elems,
            moe_parm_schedule_name(w->pick), w->t1_ms, w->t2_ms, moe_parm_schedule_name(w->faster));
    for (int s = 0; s < MOE_PARM_SCHEDULES; s++) {
      const moe_parm_sim_times *t = &w->r.sched[s];
      fprintf(f,
              "%s\"%s\": {\"fwd_ms\": %.6g, \"bwd_ms\": %.6g, \"total_ms\": %.6g, "
              "\"speedup\": %.6g, \"compute_ms\": %.6g, \"a2a_ms\": %.6g, \"esp_ms\": %.6g, "
              "\"mp_ms\": %.6g, \"saa_saved_ms\": %.6g}",
              s ? ", " : "", moe_parm_schedule_name(s), t->fwd_ms, t->bwd_ms, t->total_ms,
              w->r.sched[MOE_PARM_BASELINE].total_ms / t->total_ms, t->compute_ms, t->a2a_ms,
              t->esp_ms, t->mp_ms, t->saa_saved_ms);
    }
    fprintf(f, "}}%s\n", i + 1 < n ? "," : "");
  }
  fputs(" ]\n}\n", f);
  return cli_out_commit(&out);
}

// --parm: baseline, s1 and s2 over the grid (moe_parm_simulate), with
// Algorithm 1's pick from alpha-beta terms fitted to the same model.
static int simulate_parm(moe_ctx *ctx, const sim_opts *o, const moe_cluster *c) {
  const int D = moe_cluster_devices(c);
  // the grid: a subset of Parm's Table III (B L, M, H, f; MP, ESP in {1, 2, 4})
  const int def_tokens[] = {2048, 8192}, def_dim[] = {1024, 4096}, def_layout[] = {1, 2, 4};
  const double def_f[] = {1.2, 2.4};
  const int given_t = (o->layer_set & CLI_LAYER_TOKENS) != 0;
  const int given_m = (o->layer_set & CLI_LAYER_MODEL) != 0;
  const int given_h = (o->layer_set & CLI_LAYER_HIDDEN) != 0;
  const int given_f = (o->layer_set & CLI_LAYER_CAPACITY) != 0;
  const int nt = given_t ? 1 : 2, nm = given_m ? 1 : 2, nh = given_h ? 1 : 2, nf = given_f ? 1 : 2;
  const int *mps = o->n_parm_mp ? o->parm_mp : def_layout;
  const int *esps = o->n_parm_esp ? o->parm_esp : def_layout;
  const int nmp = o->n_parm_mp ? o->n_parm_mp : 3, nesp = o->n_parm_esp ? o->n_parm_esp : 3;
  const int strict = o->n_parm_mp && o->n_parm_esp;  // both lists given: no skipping
  const int max_rows = nt * nm * nh * nf * nmp * nesp;
  parm_row *rows = calloc((size_t)max_rows, sizeof *rows);
  int n = 0, skipped = 0, rc = CLI_OK;
  if (!rows) {
    cli_error("out of memory");
    return CLI_FAILED;
  }
  for (int im = 0; im < nmp; im++) {
    for (int ie = 0; ie < nesp; ie++) {
      const int mp = mps[im], esp = esps[ie];
      const long long me = (long long)mp * esp;
      const long long all = me * (o->parm_ep ? o->parm_ep : 1);
      if (!strict && (all > D || D % all != 0)) {
        skipped++;
        continue;
      }
      for (int it = 0; it < nt; it++)
        for (int ix = 0; ix < nm; ix++)
          for (int ih = 0; ih < nh; ih++)
            for (int jf = 0; jf < nf; jf++) {
              parm_row *w = &rows[n];
              moe_parm_sim_config_default(&w->c);
              w->c.mp = mp;
              w->c.esp = esp;
              w->c.ep = o->parm_ep ? o->parm_ep : (me <= D && D % me == 0 ? (int)(D / me) : 1);
              w->c.tokens = given_t ? o->cfg.tokens : def_tokens[it];
              w->c.model_dim = given_m ? o->cfg.model_dim : def_dim[ix];
              w->c.hidden_dim = given_h ? o->cfg.hidden_dim : def_dim[ih];
              w->c.capacity_factor = given_f ? o->cfg.capacity_factor : def_f[jf];
              w->c.experts = o->layer_set & CLI_LAYER_EXPERTS ? o->cfg.num_experts : 0;
              w->c.top_k = o->cfg.top_k;
              w->c.elem_bytes = o->act_bytes_set ? o->lina.act_bytes : 4;
              moe_parm_alpha_beta ab;
              if (moe_parm_choose(ctx, c, &w->c, &w->faster, &w->r) != MOE_STATUS_OK ||
                  moe_parm_fit_alpha_beta(ctx, c, &w->c, &ab) != MOE_STATUS_OK) {
                cli_error("--parm (MP %d, EP %d, ESP %d on %d devices): %s", w->c.mp, w->c.ep,
                          w->c.esp, D, moe_ctx_error(ctx));
                rc = CLI_USAGE;
                goto done;
              }
              w->pick = moe_parm_alg1(&ab, &w->c, &w->t1_ms, &w->t2_ms);
              w->t1_ms *= 1e3;
              w->t2_ms *= 1e3;
              n++;
            }
    }
  }
  if (n == 0) {
    cli_error("--parm: no layout of --mp x --esp divides the devices (%d)", D);
    rc = CLI_USAGE;
    goto done;
  }
  printf(
      "moe simulate --parm: %s (%d x %d %s, %.1f TFLOP/s, intra %g Gb/s %s, inter %g Gb/s x %d "
      "%s)\n",
      c->name, c->nodes, c->devices_per_node, c->device, c->gemm_tflops, c->intra.gbit_per_s,
      c->intra.kind, c->inter.gbit_per_s, c->nics_per_node, c->inter.kind);
  printf(
      "one MoE layer, forward + backward per device, ms; K=%d, E=%s, %g-byte elements, uniform "
      "routing; T = B L tokens per device\n\n",
      o->cfg.top_k, o->layer_set & CLI_LAYER_EXPERTS ? "--experts" : "a multiple of EP",
      o->act_bytes_set ? (double)o->lina.act_bytes : 4.0);
  printf("%6s %5s %5s %4s %3s %3s %3s %3s %11s %10s %10s %7s %7s %5s %7s %4s\n", "T", "M", "H", "f",
         "DP", "MP", "EP", "ESP", "baseline", "s1", "s2", "s1 x", "s2 x", "alg1", "faster", "ok");
  int agree = 0, compared = 0;
  for (int i = 0; i < n; i++) {
    const parm_row *w = &rows[i];
    const moe_parm_sim_times *t = w->r.sched;
    const double b = t[MOE_PARM_BASELINE].total_ms;
    const int ok = w->pick == w->faster;
    if (w->c.mp > 1) {
      compared++;
      agree += ok;
    }
    printf("%6d %5d %5d %4.1f %3d %3d %3d %3d %11.3f %10.3f %10.3f %6.2fx %6.2fx %5s %7s %4s\n",
           w->c.tokens, w->c.model_dim, w->c.hidden_dim, w->c.capacity_factor, w->r.dp, w->c.mp,
           w->c.ep, w->c.esp, b, t[MOE_PARM_S1].total_ms, t[MOE_PARM_S2].total_ms,
           b / t[MOE_PARM_S1].total_ms, b / t[MOE_PARM_S2].total_ms,
           moe_parm_schedule_name(w->pick), moe_parm_schedule_name(w->faster), ok ? "yes" : "NO");
  }
  double lo[3], hi[3];
  parm_range(rows, n, MOE_PARM_S1, &lo[0], &hi[0]);
  parm_range(rows, n, MOE_PARM_S2, &lo[1], &hi[1]);
  parm_range(rows, n, -1, &lo[2], &hi[2]);
  printf("\n%d configurations", n);
  if (skipped) printf(" (%d layouts skipped: they do not divide %d devices)", skipped, D);
  printf("; speedups over the baseline where MP x ESP > 1 (MP = ESP = 1 is one schedule):\n");
  if (hi[0] > 0) {
    printf("  s1    %.2f-%.2fx   (paper: 2.1-4.19x testbed A, 2.46-5.77x testbed B)\n", lo[0],
           hi[0]);
    printf("  s2    %.2f-%.2fx   (paper: 1.99-4.12x A, 2.2-5.38x B)\n", lo[1], hi[1]);
    printf("  Parm  %.2f-%.2fx   (Algorithm 1's pick; paper: 2.1-4.2x A, 2.46-5.77x B)\n", lo[2],
           hi[2]);
  } else {
    printf("  none: every row has MP = ESP = 1\n");
  }
  printf(
      "Algorithm 1 (alpha-beta terms fitted to this model) picked the faster of s1 and s2 in %d "
      "of %d rows with MP > 1\n",
      agree, compared);
  printf("[R] reconstructed model (docs/parm.md); the paper's tables compare measured runs\n");
  if (o->json_path) {
    const int jrc = parm_json(o->json_path, c, rows, n);
    if (jrc != CLI_OK) rc = jrc;
    if (jrc == CLI_OK) printf("wrote %s\n", o->json_path);
  }
done:
  free(rows);
  return rc;
}

static int simulate_main(int argc, char **argv, int roofline);

int cmd_simulate(int argc, char **argv) { return simulate_main(argc, argv, 0); }
int cmd_roofline(int argc, char **argv) { return simulate_main(argc, argv, 1); }

static int simulate_main(int argc, char **argv, int roofline) {
  sim_opts o;
  o.roofline = roofline;
  int rc = parse_sim(argc, argv, &o);
  if (rc != CLI_OK) return rc;
  if (o.list_clusters) {
    moe_ctx *ctx = NULL;
    moe_ctx_create(&ctx);
    // the device description last and whole (it is free text of any length)
    printf("%-26s %6s %5s %9s %10s %10s  %s\n", "cluster", "nodes", "dev", "TFLOP/s", "intra Gb/s",
           "inter Gb/s", "device");
    for (int i = 0; i < moe_cluster_builtin_count(); i++) {
      moe_cluster c;
      if (moe_cluster_builtin(ctx, moe_cluster_builtin_name(i), &c) != MOE_STATUS_OK) continue;
      printf("%-26s %6d %5d %9.2f %10.0f %10.0f  %s\n", c.name, c.nodes, c.devices_per_node,
             c.gemm_tflops, c.intra.gbit_per_s, c.inter.gbit_per_s * c.nics_per_node, c.device);
    }
    moe_ctx_destroy(ctx);
    return CLI_OK;
  }
  if (o.lina_trace && o.n_bal > 0) {
    cli_error("--lina and --balance are two different simulations: give one");
    return CLI_USAGE;
  }
  if (o.lt_opt && !o.lina_train) {
    cli_error("%s belongs to --lina-train (give --lina-train, or leave it out)", o.lt_opt);
    return CLI_USAGE;
  }
  if (o.lina_train && (o.lina_trace || o.n_bal > 0)) {
    cli_error("--lina-train, --lina and --balance are different simulations: give one");
    return CLI_USAGE;
  }
  if (o.parm_opt && !o.parm) {
    cli_error("%s belongs to --parm (give --parm, or leave it out)", o.parm_opt);
    return CLI_USAGE;
  }
  if (o.parm && (o.lina_train || o.lina_trace || o.n_bal > 0)) {
    cli_error("--parm, --lina-train, --lina and --balance are different simulations: give one");
    return CLI_USAGE;
  }
  if (o.bal_opt && !o.n_bal) {
    cli_error("%s belongs to --balance (give --balance, or leave it out)", o.bal_opt);
    return CLI_USAGE;
  }
  if (o.lina_opt && !o.lina_trace) {
    cli_error("%s belongs to --lina (give --lina, or leave it out)", o.lina_opt);
    return CLI_USAGE;
  }
  if (o.sched_opt && (o.parm || o.lina_train || o.lina_trace || o.n_bal > 0)) {
    cli_error("%s belongs to the schedules' simulation; --%s simulates without it (leave it out)",
              o.sched_opt,
              o.parm         ? "parm"
              : o.lina_train ? "lina-train"
              : o.lina_trace ? "lina"
                             : "balance");
    return CLI_USAGE;
  }
  if (o.n_bal > 0 && (o.layer_set & CLI_LAYER_CAPACITY)) {
    cli_error(
        "--capacity-factor does not apply to --balance: its load is every device's T x K rows "
        "shared by the skew, dropless (leave it out)");
    return CLI_USAGE;
  }
  if (o.json_path && (o.lina_train || o.lina_trace)) {
    cli_error("--json is not written by --%s (its table is the output; leave --json out)",
              o.lina_train ? "lina-train" : "lina");
    return CLI_USAGE;
  }
  if (o.parm && o.profile) {
    cli_error("--parm models a described cluster (--cluster); it does not use --profile");
    return CLI_USAGE;
  }
  if ((o.lina_trace || o.lina_train) && !o.cluster_set)
    o.cluster = "lina-4x4-a100";  // Lina's testbed
  if (o.parm && !o.cluster_set) {
    o.cluster = "parm-1x8-rtx4090-pcie";  // Parm's testbed A
  }
  moe_ctx *ctx = NULL;
  sim_row *rows = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return CLI_FAILED;
  moe_cluster c;
  moe_profile prof;
  if (o.profile) {
    if (o.cluster_set || o.devices > 0) {
      cli_error(
          "--profile brings its own cluster: it cannot be combined with --cluster or "
          "--devices (its fits hold for the calibrated ranks only)");
      rc = CLI_USAGE;
      goto done;
    }
    if (moe_profile_load(ctx, o.profile, &prof) != MOE_STATUS_OK) {
      cli_error("--profile: %s", moe_ctx_error(ctx));
      rc = CLI_USAGE;
      goto done;
    }
    c = prof.cluster;
    o.lt_profile_slowdown = prof.a2a_allreduce_slowdown;
    if (!o.a2a_set || o.a2a_all) {  // default and "all": the algorithms the profile measured
      o.n_a2a = 0;
      for (int i = 0; i < prof.n_a2a && o.n_a2a < SIM_MAX_LIST; i++) {
        snprintf(o.a2as[o.n_a2a++], sizeof o.a2as[0], "%s", prof.a2a[i].name);
      }
    }
  } else {
    rc = load_cluster(ctx, o.cluster, &c);
  }
  if (rc == CLI_OK && o.devices > 0) {
    moe_cluster s;
    if (moe_cluster_scale(ctx, &c, o.devices, &s) != MOE_STATUS_OK) {
      cli_error("--devices: %s", moe_ctx_error(ctx));
      rc = CLI_USAGE;
    } else {
      c = s;
    }
  }
  if (rc != CLI_OK) goto done;
  if (o.parm) {
    rc = simulate_parm(ctx, &o, &c);
    goto done;
  }
  const int D = moe_cluster_devices(&c);
  if (!(o.layer_set & CLI_LAYER_EXPERTS)) o.cfg.num_experts = D;
  if (moe_layer_config_validate(ctx, &o.cfg) != MOE_STATUS_OK) {
    cli_error("%s", moe_ctx_error(ctx));
    rc = CLI_USAGE;
    goto done;
  }
  if (o.lina_trace) {
    rc = simulate_lina(ctx, &o, &c);
    goto done;
  }
  if (o.lina_train) {
    rc = simulate_lina_train(ctx, &o, &c);
    goto done;
  }
  if (o.n_bal > 0) {
    rc = simulate_balance(ctx, &o, &c);
    goto done;
  }
  // variants: per (a2a, compress): sequential r=1, then every (schedule, r)
  const int per = 1 + o.n_sched * o.n_chunks, max_rows = o.n_a2a * o.n_comp * per;
  rows = calloc((size_t)max_rows, sizeof *rows);
  if (!rows) {
    cli_error("out of memory");
    rc = CLI_FAILED;
    goto done;
  }
  const uint64_t t0 = moe_time_ns();
  int n = 0;
  // each row's baseline: the first schedule of the catalogue (sequential) at r=1
  int n_sched_all = 0;
  const char *baseline = moe_schedule_algo_list(&n_sched_all)[0].name;
  for (int a = 0; a < o.n_a2a; a++) {
    for (int z = 0; z < o.n_comp; z++) {
      const int base = n;
      for (int s = -1; s < o.n_sched; s++) {
        for (int k = 0; k < (s < 0 ? 1 : o.n_chunks); k++) {
          const char *sched = s < 0 ? baseline : o.scheds[s];
          const int r = s < 0 ? 1 : o.chunks[k];
          if (s >= 0 && strcmp(sched, baseline) == 0 && r == 1) continue;
          const moe_schedule_algo *al = NULL;
          if (moe_schedule_algo_find(ctx, sched, &al) != MOE_STATUS_OK) {
            cli_error("--schedule: %s", moe_ctx_error(ctx));
            rc = CLI_USAGE;
            goto done;
          }
          if (s >= 0 && al->chunking == MOE_CHUNK_PEER_GROUPS && k > 0) continue;
          moe_sim_variant v;
          memset(&v, 0, sizeof v);
          v.cfg = o.cfg;
          snprintf(v.a2a, sizeof v.a2a, "%s", o.a2as[a]);
          snprintf(v.schedule, sizeof v.schedule, "%s", sched);
          v.chunks = r;
          snprintf(v.compress, sizeof v.compress, "%s", o.comps[z]);
          v.compress_backward = o.compress_backward;
          v.group_size = o.group_size;
          v.compress_gbs = o.cgbs;
          v.decompress_gbs = o.dgbs;
          v.profile = o.profile ? &prof : NULL;
          sim_row *row = &rows[n];
          row->a2a = o.a2as[a];
          row->compress = o.comps[z];
          row->schedule = al->name;
          row->chunks_req = r;
          const moe_status st = moe_simulate_layer(ctx, &c, &v, &row->r);
          if (st != MOE_STATUS_OK && !o.sched_set &&
              al->chunking == MOE_CHUNK_PEER_GROUPS) {  // "all" skips what cannot run here
            printf("note: skipping %s: %s\n", al->name, moe_ctx_error(ctx));
            continue;
          }
          if (st != MOE_STATUS_OK) {
            cli_error("%s", moe_ctx_error(ctx));
            rc = st == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
            goto done;
          }
          row->speedup = rows[base].r.total_ms / row->r.total_ms;
          n++;
        }
      }
    }
  }
  const double sim_ms = moe_time_ms_since(t0);
  if (o.profile) {
    printf(
        "moe simulate: profile %s (%s: %d x %d ranks; measured GEMM, all-to-all and codec "
        "models)\n",
        o.profile, prof.name, c.nodes, c.devices_per_node);
  } else {
    printf(
        "moe simulate: %s (%d x %d %s, %.1f TFLOP/s, intra %g Gb/s %s, inter %g Gb/s x %d "
        "%s)\n",
        c.name, c.nodes, c.devices_per_node, c.device, c.gemm_tflops, c.intra.gbit_per_s,
        c.intra.kind, c.inter.gbit_per_s, c.nics_per_node, c.inter.kind);
  }
  printf("layer: T=%d per device (%lld in all) M=%d H=%d E=%d K=%d ", o.cfg.tokens,
         (long long)o.cfg.tokens * D, o.cfg.model_dim, o.cfg.hidden_dim, o.cfg.num_experts,
         o.cfg.top_k);
  if (o.cfg.capacity_factor > 0) {
    printf("f=%g (C=%d)", o.cfg.capacity_factor, moe_layer_capacity(&o.cfg, o.cfg.tokens));
  } else {
    printf("dropless");
  }
  printf(", uniform routing; one forward all-to-all (unchunked) %.3f ms, experts %.3f ms\n\n",
         rows[0].r.a2a_ms, rows[0].r.expert_ms);
  printf("%-8s %-8s %-10s %3s %10s %10s %10s %8s %9s %9s %9s\n", "a2a", "compress", "schedule", "r",
         "fwd ms", "bwd ms", "total ms", "speedup", "comm ms", "comp ms", "exposed");
  for (int i = 0; i < n; i++) {
    const sim_row *r = &rows[i];
    const moe_pass_breakdown *b = r->r.breakdown;
    printf("%-8s %-8s %-10s %3d %10.3f %10.3f %10.3f %8.3f %9.3f %9.3f %9.3f\n", r->a2a,
           r->compress, r->schedule, r->r.chunks, r->r.fwd_ms, r->r.bwd_ms, r->r.total_ms,
           r->speedup, (double)(b[0].comm_ns + b[1].comm_ns) / 1e6,
           (double)(b[0].compute_ns + b[1].compute_ns) / 1e6,
           (double)(b[0].exposed_comm_ns + b[1].exposed_comm_ns) / 1e6);
  }
  if (o.roofline) {
    printf("\nDDL-roofline (FasterMoE eq. 3-6), per device, fractions of the peak %.1f TFLOP/s:\n",
           c.gemm_tflops);
    printf("%-8s %-8s %-10s %3s %8s %9s %9s %9s %14s\n", "a2a", "compress", "schedule", "r", "R_CC",
           "achieved", "ideal", "semi", "achieved/ideal");
    for (int i = 0; i < n; i++) {
      moe_roofline p;
      moe_roofline_of_layer(&c, &o.cfg, &rows[i].r, &p);
      printf("%-8s %-8s %-10s %3d %8.3f %9.3f %9.3f %9.3f %14.3f\n", rows[i].a2a, rows[i].compress,
             rows[i].schedule, rows[i].r.chunks, p.r_cc, p.achieved_flops / p.peak_flops,
             p.ideal_flops / p.peak_flops, p.semi_flops / p.peak_flops,
             p.achieved_flops / p.ideal_flops);
    }
    if (o.plot_path) {
      const int prc = plot_roofline(o.plot_path, &c, &o.cfg, rows, n);
      if (prc != CLI_OK) rc = prc;
    }
  }
  printf("\n%d variants simulated in %.1f ms\n", n, sim_ms);
  if (o.json_path) {
    const int jrc = write_json(o.json_path, &o, &c, rows, n);
    if (jrc != CLI_OK) rc = jrc;
    if (jrc == CLI_OK) printf("wrote %s\n", o.json_path);
  }
done:
  free(rows);
  moe_ctx_destroy(ctx);
  return rc;
}
