// moe bench serve: a load generator against a running `moe serve` (the
// library's moe_loadgen_run): throughput, time to first token, inter-token
// latency and end-to-end latency percentiles, and each MoE block's
// all-to-all share of the engine's step time (from the server's /metrics),
// as a table and optionally JSON.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
          "Exit status: 0 when every request was answered, 1 when some failed or the\n"
          "server cannot be reached, 2 invalid arguments.\n");
}

// One metric's value from a Prometheus text (the line "NAME VALUE"); NAN when absent.
static double metric(const char *text, const char *name) {
  const size_t n = strlen(name);
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    if (strncmp(p, name, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  }
  return NAN;
}

int cmd_bench_serve(int argc, char **argv) {
  moe_loadgen_config c;
  moe_loadgen_config_default(&c);
  const char *json = NULL;
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
      c.url = a.value;
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
    } else {
      cli_error("bench serve: unknown option '%s' (see moe bench serve --help)", cli_args_peek(&a));
      a.bad = 1;
    }
  }
  if (a.bad) {
    moe_ctx_destroy(ctx);
    return CLI_USAGE;
  }
  c.seed = seed;
  cli_out jo;
  memset(&jo, 0, sizeof jo);
  if (json && cli_out_open(&jo, json) != CLI_OK) {
    moe_ctx_destroy(ctx);
    return CLI_FAILED;
  }
  // the server's counters before and after (its step time and each block's all-to-all)
  char *m0 = NULL, *m1 = NULL;
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
  const double step_s =
      metric(m1, "moe_engine_step_seconds_total") - metric(m0, "moe_engine_step_seconds_total");
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
    const double m = metric(m1, nm), al = metric(m1, na);
    if (isnan(m)) {
      if (l > 256) break;
      continue;
    }
    const double dm = m - (isnan(metric(m0, nm)) ? 0 : metric(m0, nm));
    const double da = al - (isnan(metric(m0, na)) ? 0 : metric(m0, na));
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
  if (jo.f) {
    fprintf(jo.f,
            "{\"url\":\"%s\",\"chat\":%d,\"requests\":%d,\"rate\":%g,\"concurrency\":%d,"
            "\"prompt_len\":[%d,%d],\"output_len\":[%d,%d],\"ok\":%d,\"failed\":%d,\"wall_s\":%.4f,"
            "\"requests_per_s\":%.4f,\"tokens_per_s\":%.3f,\"ttft_ms\":[%.3f,%.3f,%.3f],"
            "\"itl_ms\":[%.4f,%.4f,%.4f],\"latency_ms\":[%.3f,%.3f,%.3f],\"step_s\":%.4f,"
            "\"moe_share\":%.4f,\"a2a_share\":%.4f}\n",
            c.url, c.chat, c.requests, c.rate, c.concurrency, c.prompt_min, c.prompt_max,
            c.output_min, c.output_max, r.ok, r.failed, r.wall_s, r.requests_per_s, r.tokens_per_s,
            r.ttft_ms[0], r.ttft_ms[1], r.ttft_ms[2], r.itl_ms[0], r.itl_ms[1], r.itl_ms[2],
            r.latency_ms[0], r.latency_ms[1], r.latency_ms[2], step_s,
            step_s > 0 ? moe_total / step_s : 0, step_s > 0 ? a2a_total / step_s : 0);
    if (cli_out_commit(&jo) != CLI_OK && rc == CLI_OK) rc = CLI_FAILED;
  }
done:
  cli_out_abort(&jo);
  moe_free(m0);
  moe_free(m1);
  moe_ctx_destroy(ctx);
  return rc;
}
