// moe bench serve: a load generator against a running `moe serve` (the
// library's moe_loadgen_run): throughput, time to first token, inter-token
// latency and end-to-end latency percentiles, and each MoE block's
// all-to-all share of the engine's step time (from the server's /metrics),
// as a table and optionally JSON. With --placement LIST and --launch CMD it
// starts the server once per expert placement (CMD --placement NAME), runs
// the same load against each and compares them in one table.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "moe/infer_request.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe bench serve --url URL [options]\n"
          "\n"
          "Sends streamed completion requests to a running 'moe serve' and measures them:\n"
          "open loop (--rate R: Poisson arrivals, latency counted from each arrival) or\n"
          "closed loop (--concurrency N requests in flight). Prints requests/s, tokens/s,\n"
          "time to first token (TTFT), inter-token latency (ITL) and end-to-end latency\n"
          "p50/p95/p99, and each MoE block's all-to-all share of the server's step time.\n"
          "\n"
          "options:\n"
          "  --url URL           the server [http://127.0.0.1:8080]\n"
          "  --requests N        requests to send [64]\n"
          "  --rate R            requests/s, open loop; 0 = closed loop [0]\n"
          "  --concurrency N     closed loop: in flight; open loop: client workers [8]\n"
          "  --prompt-len N|A-B  prompt bytes, fixed or uniform in [A, B] [32]\n"
          "  --output-len N|A-B  tokens to generate per request [64]\n"
          "  --temperature T     [0.8]\n"
          "  --chat              use /v1/chat/completions (default /v1/completions)\n"
          "  --seed S            lengths, arrivals and prompts [1]\n"
          "  --json FILE         also write the results as JSON\n"
          "\n"
          "Comparing expert placements under the same load (docs/inference.md):\n"
          "  --placement LIST    comma-separated placements (%s): for each,\n"
          "                      start --launch CMD with '--placement NAME' appended, wait\n"
          "                      for --url's /health, run the load (same seed), read\n"
          "                      /metrics (MoE layer and all-to-all p50/p95, balance\n"
          "                      ratios, phase-2 re-plans), stop the server (SIGTERM)\n"
          "  --launch CMD        the server command, run with /bin/sh -c; it must listen\n"
          "                      at --url, e.g. \"mpirun -n 4 moe serve --checkpoint C\n"
          "                      --paths P --port 8080\"\n"
          "  --rounds N          rounds, the placements interleaved in each; medians [1]\n"
          "  --launch-timeout S  seconds a server may take to answer /health [300]\n"
          "\n"
          "Exit status: 0 when every request was answered, 1 when some failed or the\n"
          "server cannot be reached, 2 invalid arguments.\n",
          moe_infer_placement_names());
}

// ---- comparing placements (--placement LIST --launch CMD) ------------------------------

#define MAX_PLACEMENTS 8
#define MAX_ROUNDS 64

typedef struct {
  moe_loadgen_result r;
  moe_server_metrics m;  // the server's /metrics after the run
} run_row;

static double now_s(void) { return 1e-9 * (double)moe_time_ns(); }

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

// 1 when url answers /health.
static int healthy(moe_ctx *ctx, const char *url) {
  char *out = NULL;
  const int ok = moe_http_get(ctx, url, "/health", &out) == MOE_STATUS_OK;
  moe_free(out);
  return ok;
}

// The server's whole process tree stopped (moe_proc_tree_stop: SIGTERM, moe
// serve drains and exits 0; SIGKILL after 60 s), then until url stops
// answering (at most 30 s): the next placement's server starts on idle cores
// and a free port.
static void stop_server(moe_ctx *ctx, pid_t pid, const char *url) {
  if (pid <= 0) return;
  const int how = moe_proc_tree_stop((int)pid, 60, 30);
  if (how >= 1)
    cli_error("bench serve: the server did not stop in 60 s after SIGTERM: killed it%s",
              how == 2 ? "; some of its processes outlived SIGKILL by 30 s" : "");
  for (int i = 0; i < 300 && healthy(ctx, url); i++) sleep_ms(100);
}

// Starts `cmd --placement name` (sh -c, its own process group, its stdout to
// our stderr) and waits until url answers /health. CLI_OK with *pid, or
// CLI_FAILED (the server exited, or did not answer within timeout_s).
static int start_server(moe_ctx *ctx, const char *cmd, const char *name, const char *url,
                        double timeout_s, pid_t *pid) {
  *pid = -1;
  if (healthy(ctx, url)) {
    cli_error(
        "bench serve: a server already answers at %s; stop it (or give another --url) "
        "before --launch starts one per placement",
        url);
    return CLI_FAILED;
  }
  const size_t n = strlen(cmd) + strlen(name) + 32;
  char *full = malloc(n);
  if (!full) {
    cli_error("bench serve: out of memory");
    return CLI_FAILED;
  }
  snprintf(full, n, "%s --placement %s", cmd, name);
  fflush(stdout);
  fflush(stderr);
  const pid_t p = fork();
  if (p < 0) {
    cli_error("bench serve: cannot start the server: %s", strerror(errno));
    free(full);
    return CLI_FAILED;
  }
  if (p == 0) {
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);  // ignored here: not for the server
    dup2(2, 1);
    for (int fd = 3; fd < 1024; fd++) close(fd);  // ours (the JSON file): not the server's
    execl("/bin/sh", "sh", "-c", full, (char *)NULL);
    _exit(127);
  }
  setpgid(p, p);
  fprintf(stderr, "bench serve: started %s (pid %d)\n", full, (int)p);
  free(full);
  *pid = p;
  const double t0 = now_s();
  for (;;) {
    int status = 0;
    if (waitpid(p, &status, WNOHANG) == p) {
      *pid = -1;
      cli_error("bench serve: the server (placement %s) exited (%s %d) before answering %s/health",
                name, WIFEXITED(status) ? "status" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), url);
      return CLI_FAILED;
    }
    if (healthy(ctx, url)) return CLI_OK;
    if (now_s() - t0 > timeout_s) {
      cli_error(
          "bench serve: the server (placement %s) did not answer %s/health within %.0f s "
          "(--launch-timeout)",
          name, url, timeout_s);
      stop_server(ctx, p, url);
      *pid = -1;
      return CLI_FAILED;
    }
    sleep_ms(200);
  }
}

// The load against a fresh server, and its /metrics afterwards.
static int run_placement(moe_ctx *ctx, const moe_loadgen_config *c, run_row *row) {
  if (moe_loadgen_run(ctx, c, &row->r) != MOE_STATUS_OK ||
      moe_server_metrics_get(ctx, c->url, &row->m) != MOE_STATUS_OK) {
    cli_error("bench serve: %s", moe_ctx_error(ctx));
    return CLI_FAILED;
  }
  if (row->r.failed > 0) {  // counted, reported; the comparison goes on
    cli_error("bench serve: %d of %d requests failed (first: %s)", row->r.failed, c->requests,
              row->r.first_error);
    return CLI_FAILED;
  }
  return CLI_OK;
}

// A number as JSON: null when not finite (nothing was measured).
static void json_value(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fputs("null", f);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// The median of n values at stride (NAN when any is NAN).
static double median_of(const double *v, int n, size_t stride) {
  double t[MAX_ROUNDS];
  for (int i = 0; i < n; i++) {
    t[i] = *(const double *)((const char *)v + (size_t)i * stride);
    if (isnan(t[i])) return NAN;
  }
  qsort(t, (size_t)n, sizeof t[0], cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static int compare_placements(moe_ctx *ctx, const moe_loadgen_config *c, const char *launch,
                              char names[][32], int n, int rounds, double timeout_s, FILE *jf) {
  static run_row rows[MAX_ROUNDS][MAX_PLACEMENTS];
  int rc = CLI_OK;
  int failed = 0;  // failed requests: reported, the table still printed
  for (int k = 0; k < rounds && rc == CLI_OK; k++) {
    for (int i = 0; i < n && rc == CLI_OK; i++) {
      pid_t pid = -1;
      rc = start_server(ctx, launch, names[i], c->url, timeout_s, &pid);
      if (rc == CLI_OK) {
        fprintf(stderr, "bench serve: round %d of %d, placement %s: %d requests\n", k + 1, rounds,
                names[i], c->requests);
        const int r = run_placement(ctx, c, &rows[k][i]);
        if (r != CLI_OK && rows[k][i].r.failed > 0)
          failed = 1;
        else
          rc = r;
      }
      stop_server(ctx, pid, c->url);
    }
  }
  if (rc != CLI_OK) return rc;
  printf("moe bench serve: placements compared under the same load: %s%s, %d requests, %s", c->url,
         c->chat ? "/v1/chat/completions" : "/v1/completions", c->requests,
         c->rate > 0 ? "open loop" : "closed loop");
  if (c->rate > 0)
    printf(" at %.3g requests/s", c->rate);
  else
    printf(" with %d in flight", c->concurrency);
  printf(", prompt %d-%d bytes, output %d-%d tokens; %d round(s), medians\n\n", c->prompt_min,
         c->prompt_max, c->output_min, c->output_max, rounds);
  printf(
      "| placement | tokens/s | TTFT p50 ms | TTFT p95 ms | end to end p50 ms | p95 ms | MoE "
      "layer p50 ms | p95 ms | all-to-all p50 ms | p95 ms | balance ratio (none -> placed) | "
      "re-plans | MoE p95 vs %s |\n",
      names[0]);
  printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const size_t st = sizeof rows[0];
  double base = NAN;
  for (int i = 0; i < n; i++) {
#define MED(field) median_of(&rows[0][i].field, rounds, st)
    const double tok = MED(r.tokens_per_s), t50 = MED(r.ttft_ms[0]), t95 = MED(r.ttft_ms[1]);
    const double e50 = MED(r.latency_ms[0]), e95 = MED(r.latency_ms[1]);
    const double m50 = MED(m.moe_ms[0]), m95 = MED(m.moe_ms[1]), a50 = MED(m.a2a_ms[0]),
                 a95 = MED(m.a2a_ms[1]);
    const double b0 = MED(m.balance[0]), b1 = MED(m.balance[1]), rp = MED(m.replans);
#undef MED
    if (i == 0) base = m95;
    char bal[48] = "-", rep[24] = "-";
    if (!isnan(b0) && !isnan(b1) && (b0 > 0 || b1 > 0))
      snprintf(bal, sizeof bal, "%.2f -> %.2f", b0, b1);
    if (!isnan(rp) && strcmp(names[i], "lina") == 0) snprintf(rep, sizeof rep, "%.0f", rp);
    char vs[24] = "-";
    if (!isnan(base) && m95 > 0) snprintf(vs, sizeof vs, "%.2fx", base / m95);
    printf("| %s | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %s | %s | %s |\n",
           names[i], tok, t50, t95, e50, e95, m50, m95, a50, a95, bal, rep, vs);
    if (jf) {  // a value the server did not report is null
      const double v[12] = {tok, t50, t95, e50, e95, m50, m95, a50, a95, b0, b1, rp};
      static const char *const keys[12] = {
          "tokens_per_s",     "ttft_p50_ms",      "ttft_p95_ms",      "latency_p50_ms",
          "latency_p95_ms",   "moe_layer_p50_ms", "moe_layer_p95_ms", "a2a_layer_p50_ms",
          "a2a_layer_p95_ms", "balance_none",     "balance_placed",   "replans"};
      fprintf(jf, "{\"placement\":\"%s\",\"rounds\":%d", names[i], rounds);
      for (int k = 0; k < 12; k++) {
        fprintf(jf, ",\"%s\":", keys[k]);
        json_value(jf, v[k]);
      }
      fprintf(jf, "}\n");
    }
  }
  printf(
      "\n(MoE layer and all-to-all times: the server's rank 0, one sample per step and MoE "
      "block, from its /metrics; each placement ran on a fresh server.)\n");
  if (failed)
    printf("\nsome requests failed (see the errors above): the table counts the answered ones\n");
  return failed ? CLI_FAILED : rc;
}

int cmd_bench_serve(int argc, char **argv) {
  moe_loadgen_config c;
  moe_loadgen_config_default(&c);
  const char *json = NULL, *launch = NULL, *place_opt = NULL;
  char url[512];
  char place[MAX_PLACEMENTS][32];
  int n_place = 0, rounds = 1;
  double launch_timeout = 300;
  unsigned long long seed = 1;
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("out of memory");
    return CLI_FAILED;
  }
  cli_args a;
  cli_args_init(&a, argc, argv, 3);
  int rc = CLI_OK;
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      usage(stdout);
      moe_ctx_destroy(ctx);
      return CLI_OK;
    } else if (cli_opt(&a, "--url")) {
      if (a.value && strlen(a.value) < sizeof url) {  // without trailing slashes: URL + PATH
        snprintf(url, sizeof url, "%s", a.value);
        for (size_t n = strlen(url); n > 0 && url[n - 1] == '/'; n--) url[n - 1] = '\0';
        c.url = url;
      } else if (a.value) {
        cli_error("bench serve: --url of %zu bytes (at most %zu)", strlen(a.value), sizeof url - 1);
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--requests")) {
      cli_parse_int(&a, "--requests", 1, 1000000, &c.requests);
    } else if (cli_opt(&a, "--rate")) {
      cli_parse_double(&a, "--rate", 0, 1e6, &c.rate);
    } else if (cli_opt(&a, "--concurrency")) {
      cli_parse_int(&a, "--concurrency", 1, 4096, &c.concurrency);
    } else if (cli_opt(&a, "--prompt-len")) {
      if (moe_loadgen_range_parse(ctx, a.value, 0, 65536, &c.prompt_min, &c.prompt_max) !=
          MOE_STATUS_OK) {
        cli_error("--prompt-len: %s", moe_ctx_error(ctx));
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--output-len")) {
      if (moe_loadgen_range_parse(ctx, a.value, 1, 65536, &c.output_min, &c.output_max) !=
          MOE_STATUS_OK) {
        cli_error("--output-len: %s", moe_ctx_error(ctx));
        a.bad = 1;
      }
    } else if (cli_opt(&a, "--temperature")) {
      cli_parse_double(&a, "--temperature", 0, 100, &c.temperature);
    } else if (cli_flag(&a, "--chat")) {
      c.chat = 1;
    } else if (cli_opt(&a, "--seed")) {
      cli_parse_u64(&a, "--seed", &seed);
    } else if (cli_opt(&a, "--json")) {
      json = a.value;
    } else if (cli_opt(&a, "--placement")) {
      n_place = 0;
      const char *p = a.value;
      for (;;) {
        const char *q = strchr(p, ',');
        const size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == 0) {
          cli_error("bench serve: --placement '%s': an empty name (valid: %s)", a.value,
                    moe_infer_placement_names());
        } else if (n_place == MAX_PLACEMENTS) {
          cli_error("bench serve: --placement '%s': at most %d names", a.value, MAX_PLACEMENTS);
        } else if (len >= sizeof place[0]) {
          cli_error("bench serve: --placement: a name of %zu characters (valid: %s)", len,
                    moe_infer_placement_names());
        } else {
          memcpy(place[n_place], p, len);
          place[n_place][len] = '\0';
          if (moe_infer_placement_find(place[n_place]) >= 0) {
            n_place++;
            if (!q) break;
            p = q + 1;
            continue;
          }
          cli_error("bench serve: --placement '%s' is unknown (valid: %s)", place[n_place],
                    moe_infer_placement_names());
        }
        a.bad = 1;
        break;
      }
    } else if (cli_opt(&a, "--launch")) {
      launch = a.value;
    } else if (cli_opt(&a, "--rounds")) {
      place_opt = "--rounds";
      cli_parse_int(&a, "--rounds", 1, MAX_ROUNDS, &rounds);
    } else if (cli_opt(&a, "--launch-timeout")) {
      place_opt = "--launch-timeout";
      cli_parse_double(&a, "--launch-timeout", 1, 86400, &launch_timeout);
    } else {
      cli_error("bench serve: unknown option '%s' (see moe bench serve --help)", cli_args_peek(&a));
      a.bad = 1;
    }
  }
  if (!a.bad && (n_place > 0) != (launch != NULL)) {
    cli_error(
        "bench serve: --placement and --launch go together (the command that starts the "
        "server once per placement)");
    a.bad = 1;
  }
  if (!a.bad && place_opt && n_place == 0) {
    cli_error("bench serve: %s belongs to --placement and --launch (give them, or leave it out)",
              place_opt);
    a.bad = 1;
  }
  if (a.bad) {
    moe_ctx_destroy(ctx);
    return CLI_USAGE;
  }
  c.seed = seed;
  cli_out jo;
  memset(&jo, 0, sizeof jo);
  if (json && (rc = cli_out_open(&jo, json)) != CLI_OK) {
    moe_ctx_destroy(ctx);
    return rc;
  }
  char *m0 = NULL, *m1 = NULL;
  if (n_place > 0) {
    signal(SIGPIPE, SIG_IGN);
    rc = compare_placements(ctx, &c, launch, place, n_place, rounds, launch_timeout, jo.f);
    if (jo.f && rc == CLI_OK && cli_out_commit(&jo) != CLI_OK) rc = CLI_FAILED;
    goto done;
  }
  // the server's counters before and after (its step time and each block's all-to-all)
  if (moe_http_get(ctx, c.url, "/metrics", &m0) != MOE_STATUS_OK) {
    cli_error("bench serve: %s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
    goto done;
  }
  moe_loadgen_result r;
  if (moe_loadgen_run(ctx, &c, &r) != MOE_STATUS_OK) {
    cli_error("bench serve: %s", moe_ctx_error(ctx));
    rc = moe_ctx_status(ctx) == MOE_STATUS_INVALID_ARG ? CLI_USAGE : CLI_FAILED;
    goto done;
  }
  if (moe_http_get(ctx, c.url, "/metrics", &m1) != MOE_STATUS_OK) {
    cli_error("bench serve: %s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
    goto done;
  }
  const double step_s = moe_prom_value(m1, "moe_engine_step_seconds_total") -
                        moe_prom_value(m0, "moe_engine_step_seconds_total");
  printf("moe bench serve: %s%s, %d requests, %s", c.url,
         c.chat ? "/v1/chat/completions" : "/v1/completions", c.requests,
         c.rate > 0 ? "open loop" : "closed loop");
  if (c.rate > 0)
    printf(" at %.3g requests/s (%d workers)", c.rate, c.concurrency);
  else
    printf(" with %d in flight", c.concurrency);
  printf(", prompt %d-%d bytes, output %d-%d tokens\n\n", c.prompt_min, c.prompt_max, c.output_min,
         c.output_max);
  printf("| requests ok | failed | wall s | requests/s | tokens/s |\n|---|---|---|---|---|\n");
  printf("| %d | %d | %.2f | %.2f | %.1f |\n\n", r.ok, r.failed, r.wall_s, r.requests_per_s,
         r.tokens_per_s);
  printf("| ms | p50 | p95 | p99 |\n|---|---|---|---|\n");
  printf("| time to first token | %.1f | %.1f | %.1f |\n", r.ttft_ms[0], r.ttft_ms[1],
         r.ttft_ms[2]);
  printf("| inter-token latency | %.2f | %.2f | %.2f |\n", r.itl_ms[0], r.itl_ms[1], r.itl_ms[2]);
  printf("| end to end | %.1f | %.1f | %.1f |\n", r.latency_ms[0], r.latency_ms[1],
         r.latency_ms[2]);
  printf("\nserver (rank 0), over the run: %.2f s in engine steps\n", step_s);
  printf("| MoE block | MoE forward share | all-to-all share |\n|---|---|---|\n");
  double a2a_total = 0, moe_total = 0;
  for (int l = 0; l < 4096; l++) {
    char nm[96], na[96];
    snprintf(nm, sizeof nm, "moe_engine_moe_seconds_total{block=\"%d\"}", l);
    snprintf(na, sizeof na, "moe_engine_a2a_seconds_total{block=\"%d\"}", l);
    const double m = moe_prom_value(m1, nm), al = moe_prom_value(m1, na);
    if (isnan(m)) {
      if (l > 256) break;
      continue;
    }
    const double dm = m - (isnan(moe_prom_value(m0, nm)) ? 0 : moe_prom_value(m0, nm));
    const double da = al - (isnan(moe_prom_value(m0, na)) ? 0 : moe_prom_value(m0, na));
    moe_total += dm;
    a2a_total += da;
    printf("| %d | %.1f%% | %.1f%% |\n", l, step_s > 0 ? 100 * dm / step_s : 0,
           step_s > 0 ? 100 * da / step_s : 0);
  }
  printf("| all | %.1f%% | %.1f%% |\n", step_s > 0 ? 100 * moe_total / step_s : 0,
         step_s > 0 ? 100 * a2a_total / step_s : 0);
  if (r.failed > 0) {
    printf("\nfailed requests:");
    for (int k = 0; k < 8 && r.fail_counts[k]; k++)
      printf(" %d x %s%ld", r.fail_counts[k], r.fail_codes[k] < 0 ? "no answer " : "HTTP ",
             r.fail_codes[k] < 0 ? 0L : r.fail_codes[k]);
    printf(" (first: %s)\n", r.first_error);
    rc = CLI_FAILED;
  }
  if (jo.f) {  // a value not measured (no request answered) is null
    FILE *f = jo.f;
    fputs("{\"url\":", f);
    cli_json_string(f, c.url);
    fprintf(f,
            ",\"chat\":%d,\"requests\":%d,\"rate\":%g,\"concurrency\":%d,\"prompt_len\":[%d,%d],"
            "\"output_len\":[%d,%d],\"ok\":%d,\"failed\":%d",
            c.chat, c.requests, c.rate, c.concurrency, c.prompt_min, c.prompt_max, c.output_min,
            c.output_max, r.ok, r.failed);
    const double one[3] = {r.wall_s, r.requests_per_s, r.tokens_per_s};
    static const char *const one_keys[3] = {"wall_s", "requests_per_s", "tokens_per_s"};
    for (int k = 0; k < 3; k++) {
      fprintf(f, ",\"%s\":", one_keys[k]);
      json_value(f, one[k]);
    }
    const double *three[3] = {r.ttft_ms, r.itl_ms, r.latency_ms};
    static const char *const three_keys[3] = {"ttft_ms", "itl_ms", "latency_ms"};
    for (int k = 0; k < 3; k++) {
      fprintf(f, ",\"%s\":[", three_keys[k]);
      for (int q = 0; q < 3; q++) {
        json_value(f, three[k][q]);
        fputs(q < 2 ? "," : "]", f);
      }
    }
    fputs(",\"step_s\":", f);
    json_value(f, step_s);
    fputs(",\"moe_share\":", f);
    json_value(f, step_s > 0 ? moe_total / step_s : NAN);
    fputs(",\"a2a_share\":", f);
    json_value(f, step_s > 0 ? a2a_total / step_s : NAN);
    fputs("}\n", f);
    if (cli_out_commit(&jo) != CLI_OK && rc == CLI_OK) rc = CLI_FAILED;
  }
done:
  cli_out_abort(&jo);
  moe_free(m0);
  moe_free(m1);
  moe_ctx_destroy(ctx);
  return rc;
}
