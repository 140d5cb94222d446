// moe generate: batch generation from a JSONL file of prompts to a JSONL file
// of completions, on the inference engine (continuous batching over KV-cache
// slots; under mpirun the MoE layers run expert-parallel over the ranks).
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe generate --checkpoint FILE --input PROMPTS.jsonl [options]\n"
          "       mpirun -n P moe generate ...   (the MoE layers expert-parallel over P ranks)\n"
          "\n"
          "Generates a completion for every line of PROMPTS.jsonl, many at once (continuous\n"
          "batching with a KV cache), and writes one JSON line per prompt, in input order.\n"
          "A line is an object with \"prompt\" (string) and optionally \"max_tokens\",\n"
          "\"temperature\" (0 = greedy), \"top_k\", \"top_p\", \"seed\", \"stop\" (a string or\n"
          "up to 4) and \"id\" (echoed). Tokens are bytes. The output is the same run to run\n"
          "and at any rank count for the same seeds (docs/inference.md).\n"
          "\n"
          "options:\n"
          "  --checkpoint FILE     a checkpoint written by 'moe train' (required)\n"
          "  --input FILE          the prompts, one JSON object per line; '-' reads stdin\n"
          "                        (required)\n"
          "  --output FILE         the completions; '-' is stdout [-]\n"
          "  --max-tokens N        default for lines without max_tokens [64]\n"
          "  --temperature T       default temperature, [0, 100] [0.8]\n"
          "  --top-k K             default top-k, 0 = all [40]\n"
          "  --top-p P             default top-p, 1e-9..1 [1]\n"
          "  --seed S              a line without \"seed\" uses S + its line index "
          "[1]\n" CLI_INFER_ENGINE_HELP
          "  --timings             add queue_ms, first_token_ms and total_ms to each line\n"
          "                        (they vary run to run)\n"
          "  --quiet               no progress line on stderr\n" CLI_HANG_TIMEOUT_HELP
              CLI_MAX_MEMORY_HELP
          "\n"
          "Output line: {\"index\", [\"id\",] \"text\", \"finish_reason\" (length|stop),\n"
          "\"prompt_tokens\", \"completion_tokens\"}. Prints a throughput summary on stderr.\n"
          "Exit status: 0 success, 1 runtime failure, 2 invalid arguments or input.\n");
}

#if MOE_CLI_MPI
#include <mpi.h>

#include "moe/comm.h"
#include "moe/infer.h"

typedef struct {
  moe_infer_request *reqs;
  int n;
  // results, written in input order
  char **text;
  size_t *text_len;
  moe_infer_result *res;
  int *done;
  int next_out;
  int64_t *ids;  // engine id of each line (ids are 1, 2, ... in submit order)
  int64_t first_id;
  FILE *out;
  int timings;
  int write_failed;
} gen_state;

static void write_ready(gen_state *g) {
  while (g->next_out < g->n && g->done[g->next_out]) {
    const int i = g->next_out;
    const moe_infer_result *r = &g->res[i];
    fprintf(g->out, "{\"index\":%d", i);
    if (g->reqs[i].id_json) fprintf(g->out, ",\"id\":%s", g->reqs[i].id_json);
    fputs(",\"text\":", g->out);
    char *js = moe_infer_json_string(g->text[i], g->text_len[i]);
    if (js) fputs(js, g->out);
    if (!js) g->write_failed = 1;
    moe_free(js);
    fprintf(g->out, ",\"finish_reason\":\"%s\",\"prompt_tokens\":%d,\"completion_tokens\":%d",
            moe_infer_finish_name(r->finish), r->prompt_tokens, r->completion_tokens);
    if (g->timings)
      fprintf(g->out, ",\"queue_ms\":%.3f,\"first_token_ms\":%.3f,\"total_ms\":%.3f", r->queue_ms,
              r->first_token_ms, r->total_ms);
    fputs("}\n", g->out);
    if (ferror(g->out)) g->write_failed = 1;
    free(g->text[i]);
    g->text[i] = NULL;
    g->next_out++;
  }
}

static void on_done(void *user, int64_t id, const moe_infer_result *r) {
  gen_state *g = user;
  const int i = (int)(id - g->first_id);
  if (i < 0 || i >= g->n) return;
  g->res[i] = *r;
  g->text[i] = malloc(r->text_len + 1);
  if (g->text[i]) memcpy(g->text[i], r->text, r->text_len + 1);
  g->text_len[i] = g->text[i] ? r->text_len : 0;
  g->res[i].text = NULL;
  g->done[i] = 1;
  write_ready(g);
}

// Reads and checks every line of the input (rank 0), before any work starts.
static int read_input(moe_ctx *ctx, const char *path, const moe_infer_params *defaults,
                      unsigned long long seed, gen_state *g) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
  if (!f) {
    cli_error("generate: cannot open --input %s", path);
    return CLI_USAGE;
  }
  int rc = CLI_OK, cap = 0;
  char *line = NULL;
  size_t lcap = 0;
  ssize_t len;
  long lineno = 0;
  while ((len = getline(&line, &lcap, f)) >= 0) {
    lineno++;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    int blank = 1;
    for (ssize_t i = 0; i < len && blank; i++) blank = line[i] == ' ' || line[i] == '\t';
    if (blank) continue;
    if (g->n == cap) {
      cap = cap ? 2 * cap : 64;
      moe_infer_request *nr = realloc(g->reqs, (size_t)cap * sizeof *nr);
      if (!nr) {
        cli_error("out of memory");
        rc = CLI_FAILED;
        break;
      }
      g->reqs = nr;
    }
    moe_infer_request *r = &g->reqs[g->n];
    if (moe_infer_request_from_json(ctx, line, (size_t)len, defaults, MOE_INFER_JSON_ID, r) !=
        MOE_STATUS_OK) {
      cli_error("generate: %s line %ld: %s", path, lineno, moe_ctx_error(ctx));
      rc = CLI_USAGE;
      break;
    }
    if (!r->has_seed) r->params.seed = seed + (unsigned long long)g->n;
    g->n++;
  }
  if (rc == CLI_OK && ferror(f)) {
    cli_error("generate: reading %s failed", path);
    rc = CLI_USAGE;
  }
  if (rc == CLI_OK && g->n == 0) {
    cli_error("generate: %s holds no prompt (one JSON object per line)", path);
    rc = CLI_USAGE;
  }
  free(line);
  if (f != stdin) fclose(f);
  return rc;
}

int cmd_generate(int argc, char **argv) {
  int provided = 0, rank = 0, world = 1;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const char *ckpt = NULL, *input = NULL, *output = "-", *record_file = NULL;
  int quiet = 0, timings = 0, rc = CLI_OK;
  unsigned long long seed = 1;
  size_t max_memory = 0;
  double hang_timeout = CLI_HANG_TIMEOUT_DEFAULT;
  moe_watchdog *wd = NULL;
  moe_infer_config ic;
  moe_infer_config_default(&ic);
  moe_infer_params defaults;
  moe_infer_params_default(&defaults);
  defaults.max_tokens = 64;
  defaults.temperature = 0.8;
  defaults.top_k = 40;
  cli_args a;
  cli_args_init(&a, argc, argv, 2);
  int saved[2];  // the options' errors once, from rank 0
  cli_silence_begin(rank != 0, saved);
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      cli_silence_end(saved);
      if (rank == 0) usage(stdout);
      MPI_Finalize();
      return CLI_OK;
    } else if (cli_opt(&a, "--checkpoint")) {
      ckpt = a.value;
    } else if (cli_opt(&a, "--input")) {
      input = a.value;
    } else if (cli_opt(&a, "--output")) {
      output = a.value;
    } else if (cli_opt(&a, "--max-tokens")) {
      cli_parse_int(&a, "--max-tokens", 0, 1 << 20, &defaults.max_tokens);
    } else if (cli_opt(&a, "--temperature")) {
      cli_parse_double(&a, "--temperature", 0, 100, &defaults.temperature);
    } else if (cli_opt(&a, "--top-k")) {
      cli_parse_int(&a, "--top-k", 0, 65536, &defaults.top_k);
    } else if (cli_opt(&a, "--top-p")) {
      cli_parse_double(&a, "--top-p", 1e-9, 1, &defaults.top_p);
    } else if (cli_opt(&a, "--seed")) {
      cli_parse_u64(&a, "--seed", &seed);
    } else if (cli_infer_engine_opt(&a, &ic, &record_file, rank, "generate")) {
      // set (or a.bad)
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &max_memory);
    } else if (cli_hang_timeout_opt(&a, &hang_timeout)) {
      // set (or a.bad)
    } else if (cli_flag(&a, "--timings")) {
      timings = 1;
    } else if (cli_flag(&a, "--quiet")) {
      quiet = 1;
    } else {
      if (rank == 0)
        cli_error("generate: unknown option '%s' (see moe generate --help)", cli_args_peek(&a));
      a.bad = 1;
    }
  }
  cli_silence_end(saved);
  if (!a.bad && (!ckpt || !input)) {
    if (rank == 0) cli_error("generate: --checkpoint FILE and --input FILE are required");
    a.bad = 1;
  }
  if (!a.bad && ic.prefill_chunk > ic.step_rows) {
    if (rank == 0)
      cli_error("generate: --prefill-chunk (%d) must be at most --step-rows (%d)", ic.prefill_chunk,
                ic.step_rows);
    a.bad = 1;
  }
  if (a.bad) {
    MPI_Finalize();
    return CLI_USAGE;
  }
  ic.checkpoint = ckpt;

  moe_ctx *ctx = NULL;
  moe_infer *eng = NULL;
  gen_state g;
  memset(&g, 0, sizeof g);
  cli_out out;
  memset(&out, 0, sizeof out);
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("out of memory");
    MPI_Finalize();
    return CLI_FAILED;
  }
  if (cli_watchdog_start(ctx, hang_timeout, rank, &wd) != CLI_OK) {
    moe_ctx_destroy(ctx);
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  // the prompts first (rank 0), so that a bad line stops everything before any work
  int in_rc = rank == 0 ? read_input(ctx, input, &defaults, seed, &g) : CLI_OK;
  MPI_Bcast(&in_rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (in_rc != CLI_OK) {
    rc = in_rc;
    goto done;
  }
  // --record-paths is written at the end: a path that cannot be is refused now
  if ((rc = cli_out_probe_root(record_file, rank)) != CLI_OK) goto done;
  ic.max_memory = max_memory;  // the memory bound: checked by create before it allocates
  rc = cli_infer_create(ctx, &ic, rank, "generate", &eng);
  if (rc != CLI_OK) goto done;
  moe_status st = MOE_STATUS_OK;
  if ((rc = cli_out_open_root(&out, strcmp(output, "-") == 0 ? NULL : output, rank)) != CLI_OK) {
    if (rank == 0 && moe_infer_shutdown(eng) == MOE_STATUS_OK)
      cli_infer_paths_write(ctx, eng, record_file, rank, 0, "generate");
    else if (rank != 0 && moe_infer_follow(eng) == MOE_STATUS_OK)
      cli_infer_paths_write(ctx, eng, record_file, rank, 0, "generate");
    goto done;
  }
  if (rank != 0) {
    st = moe_infer_follow(eng);
    if (st != MOE_STATUS_OK) {
      cli_error("rank %d: generate: %s", rank, moe_ctx_error(ctx));
      rc = CLI_FAILED;
    } else {
      rc = cli_infer_paths_write(ctx, eng, record_file, rank, 1, "generate");
    }
    goto done;
  }
  {
    g.out = out.f ? out.f : stdout;
    g.timings = timings;
    g.text = calloc((size_t)g.n, sizeof *g.text);
    g.text_len = calloc((size_t)g.n, sizeof *g.text_len);
    g.res = calloc((size_t)g.n, sizeof *g.res);
    g.done = calloc((size_t)g.n, sizeof *g.done);
    if (!g.text || !g.text_len || !g.res || !g.done) {
      cli_error("out of memory");
      if (moe_infer_shutdown(eng) == MOE_STATUS_OK)
        cli_infer_paths_write(ctx, eng, record_file, rank, 0, "generate");
      rc = CLI_FAILED;
      goto done;
    }
    moe_infer_callbacks cb = {NULL, on_done, &g};
    const uint64_t t0 = moe_time_ns();
    double last_print = 0;
    int submitted = 0, step_failed = 0;
    st = MOE_STATUS_OK;
    while (st == MOE_STATUS_OK && (submitted < g.n || moe_infer_pending(eng) > 0)) {
      while (submitted < g.n) {
        int64_t id = 0;
        moe_infer_request *r = &g.reqs[submitted];
        const moe_status s2 =
            moe_infer_submit(eng, NULL, r->prompt, r->prompt_len, &r->params, &cb, &id);
        if (s2 == MOE_STATUS_BUSY) break;
        if (s2 != MOE_STATUS_OK) {
          st = s2;
          break;
        }
        if (submitted == 0) g.first_id = id;
        submitted++;
      }
      if (st == MOE_STATUS_OK) {
        st = moe_infer_step(eng);
        step_failed = st != MOE_STATUS_OK;  // agreed: the followers failed too
      }
      const double el = moe_time_ms_since(t0) / 1000;
      if (!quiet && el - last_print >= 2.0) {
        moe_infer_stats s;
        moe_infer_get_stats(eng, &s);
        fprintf(stderr, "generate: %d/%d done, %lld tokens, %.1f tok/s, %d running\n", g.next_out,
                g.n, (long long)s.tokens, (double)s.tokens / el, s.running);
        last_print = el;
      }
    }
    const moe_status stop_st = moe_infer_shutdown(eng);
    if (st == MOE_STATUS_OK) st = stop_st;
    if (st != MOE_STATUS_OK) {
      cli_error("generate: %s", moe_ctx_error(ctx));
      rc = CLI_FAILED;
      // the followers stopped without a failed step: they gather the profile
      if (!step_failed && stop_st == MOE_STATUS_OK)
        cli_infer_paths_write(ctx, eng, record_file, rank, 0, "generate");
      goto done;
    }
    if (cli_infer_paths_write(ctx, eng, record_file, rank, 1, "generate") != CLI_OK) {
      rc = CLI_FAILED;
      goto done;
    }
    const double secs = moe_time_ms_since(t0) / 1000;
    moe_infer_stats s;
    moe_infer_get_stats(eng, &s);
    if (g.write_failed) {
      cli_error("generate: writing %s failed", output);
      rc = CLI_FAILED;
      goto done;
    }
    if (out.f && cli_out_commit(&out) != CLI_OK) {
      rc = CLI_FAILED;
      goto done;
    }
    fflush(stdout);
    if (!quiet)
      fprintf(stderr,
              "generate: %d prompts, %lld tokens generated in %.2f s: %.1f tokens/s, %.2f "
              "requests/s; %lld steps, %lld rows (%lld prefill), at most %d sequences a step, "
              "%lld context refills; %d rank%s\n",
              g.n, (long long)s.tokens, secs, (double)s.tokens / secs, g.n / secs,
              (long long)s.steps, (long long)s.rows, (long long)s.prefill_rows, s.max_batch_seqs,
              (long long)s.context_shifts, world, world == 1 ? "" : "s");
    if (!quiet) {
      const double q[2] = {0.5, 0.95};
      double lm[2], am[2];
      if (moe_infer_layer_quantiles(eng, q, 2, lm, am) > 0)
        fprintf(stderr,
                "generate: MoE layer forward p50 %.3f ms, p95 %.3f ms; its all-to-alls p50 %.3f "
                "ms, p95 %.3f ms (rank 0, per step and MoE block)\n",
                lm[0], lm[1], am[0], am[1]);
      cli_infer_placement_report(eng, &s, &ic, "generate");
      cli_infer_paths_report(eng, &ic, "generate");
    }
  }
done:
  cli_out_abort(&out);
  for (int i = 0; i < g.n; i++) moe_infer_request_free(&g.reqs[i]);
  if (g.text)
    for (int i = 0; i < g.n; i++) free(g.text[i]);
  free(g.reqs);
  free(g.text);
  free(g.text_len);
  free(g.res);
  free(g.done);
  moe_watchdog_stop(wd);
  moe_infer_destroy(eng);
  moe_ctx_destroy(ctx);
  MPI_Finalize();
  return rc;
}
#else
int cmd_generate(int argc, char **argv) {
  if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
    usage(stdout);
    return CLI_OK;
  }
  cli_error("generate needs MPI; this build has none (install libopenmpi-dev and rebuild)");
  return CLI_FAILED;
}
#endif
