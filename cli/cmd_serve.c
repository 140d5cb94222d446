// moe serve: an OpenAI-compatible HTTP server over a MoE-GPT checkpoint (the
// inference engine and its HTTP front, include/moe/infer.h). Under mpirun rank
// 0 listens and steps the engine; the other ranks take part in every step.
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: moe serve --checkpoint FILE [options]\n"
          "       mpirun -n P moe serve ...   (the MoE layers expert-parallel over P ranks)\n"
          "\n"
          "Serves a checkpoint written by 'moe train' over HTTP with the OpenAI API shapes:\n"
          "  POST /v1/completions        {\"prompt\": ..., \"max_tokens\", \"temperature\",\n"
          "                              \"top_p\", \"top_k\", \"seed\", \"stop\", \"stream\"}\n"
          "  POST /v1/chat/completions   {\"messages\": [{\"role\", \"content\"}], ...}\n"
          "  GET /v1/models, GET /health, GET /metrics (Prometheus text)\n"
          "\"stream\": true answers with server-sent events. Tokens are bytes. Requests are\n"
          "batched continuously over KV-cache slots (docs/inference.md). SIGINT, SIGTERM or\n"
          "SIGUSR1 (under mpirun: SIGUSR1 to Open MPI's mpirun, which forwards it to every\n"
          "rank; or SIGTERM to every rank): new requests get 503, those in flight finish\n"
          "(after --drain-timeout they end as \"cancelled\"), exit 0.\n"
          "\n"
          "options:\n"
          "  --checkpoint FILE     the checkpoint (required)\n"
          "  --host ADDR           IPv4 address to listen on [127.0.0.1]\n"
          "  --port N              TCP port; 0 picks a free one (printed) [8080]\n"
          "  --model NAME          the model name of /v1/models and the responses\n"
          "                        [the checkpoint's file name]\n"
          "  --queue N             requests waiting for a slot at most; more get 503 [256]\n"
          "  --max-body SIZE       largest request body (e.g. 64K, 1M); larger get 413 [1M]\n"
          "  --max-connections N   open connections at most [256]\n"
          "  --drain-timeout S     seconds to let requests finish after a signal "
          "[30]\n" CLI_INFER_ENGINE_HELP CLI_HANG_TIMEOUT_HELP CLI_MAX_MEMORY_HELP
          "\n"
          "Defaults of a request: max_tokens 16, temperature 1, top_p 1, top_k 0 (all),\n"
          "seed 0. Exit status: 0 after a signal, 1 runtime failure, 2 invalid arguments\n"
          "or input (a missing or corrupt checkpoint, a port in use).\n");
}

#if MOE_CLI_MPI
#include <mpi.h>

#include "moe/comm.h"
#include "moe/infer.h"

static volatile sig_atomic_t g_stop = 0;
static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

int cmd_serve(int argc, char **argv) {
  int provided = 0, rank = 0, world = 1;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  moe_infer_config ic;
  moe_infer_config_default(&ic);
  moe_serve_config sc;
  moe_serve_config_default(&sc);
  const char *ckpt = NULL, *model = NULL, *record_file = NULL;
  double drain = 30;
  size_t max_memory = 0;
  double hang_timeout = CLI_HANG_TIMEOUT_DEFAULT;
  moe_watchdog *wd = NULL;
  int rc = CLI_OK;
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
    } else if (cli_opt(&a, "--host")) {
      sc.host = a.value;
    } else if (cli_opt(&a, "--port")) {
      cli_parse_int(&a, "--port", 0, 65535, &sc.port);
    } else if (cli_opt(&a, "--model")) {
      model = a.value;
    } else if (cli_infer_engine_opt(&a, &ic, &record_file, rank, "serve")) {
      // set (or a.bad)
    } else if (cli_opt(&a, "--queue")) {
      cli_parse_int(&a, "--queue", 1, 1 << 20, &ic.queue);
    } else if (cli_opt(&a, "--max-body")) {
      cli_parse_size(&a, "--max-body", &sc.max_body);
    } else if (cli_opt(&a, "--max-connections")) {
      cli_parse_int(&a, "--max-connections", 1, 65536, &sc.max_connections);
    } else if (cli_opt(&a, "--drain-timeout")) {
      cli_parse_double(&a, "--drain-timeout", 0, 86400, &drain);
    } else if (cli_opt(&a, "--max-memory")) {
      cli_parse_size(&a, "--max-memory", &max_memory);
    } else if (cli_hang_timeout_opt(&a, &hang_timeout)) {
      // set (or a.bad)
    } else {
      if (rank == 0)
        cli_error("serve: unknown option '%s' (see moe serve --help)", cli_args_peek(&a));
      a.bad = 1;
    }
  }
  cli_silence_end(saved);
  if (!a.bad && !ckpt) {
    if (rank == 0) cli_error("serve: --checkpoint FILE is required");
    a.bad = 1;
  }
  if (!a.bad && ic.prefill_chunk > ic.step_rows) {
    if (rank == 0)
      cli_error("serve: --prefill-chunk (%d) must be at most --step-rows (%d)", ic.prefill_chunk,
                ic.step_rows);
    a.bad = 1;
  }
  if (a.bad) {
    MPI_Finalize();
    return CLI_USAGE;
  }
  ic.checkpoint = ckpt;
  if (!model) {
    const char *slash = strrchr(ckpt, '/');
    model = slash ? slash + 1 : ckpt;
  }
  sc.model = model;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);  // Open MPI's mpirun forwards SIGUSR1 to every rank

  moe_ctx *ctx = NULL;
  moe_infer *eng = NULL;
  moe_server *srv = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("out of memory");
    MPI_Finalize();
    return CLI_FAILED;
  }
  if (cli_watchdog_start(ctx, hang_timeout, rank, &wd) != CLI_OK) {
    moe_ctx_destroy(ctx);
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  // --record-paths is written at shutdown: a path that cannot be is refused now
  if ((rc = cli_out_probe_root(record_file, rank)) != CLI_OK) goto done;
  ic.max_memory = max_memory;  // the memory bound: checked by create before it allocates
  rc = cli_infer_create(ctx, &ic, rank, "serve", &eng);
  if (rc != CLI_OK) goto done;
  moe_status st = MOE_STATUS_OK;
  // rank 0 listens; every rank learns whether it could
  int listening = 1;
  if (rank == 0) {
    st = moe_serve_start(ctx, eng, &sc, &srv);
    if (st != MOE_STATUS_OK) {
      cli_error("serve: %s", moe_ctx_error(ctx));
      listening = 0;
      rc = st == MOE_STATUS_UNSUPPORTED ? CLI_FAILED : CLI_USAGE;
    }
  }
  MPI_Bcast(&listening, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!listening) {
    if (rank != 0) rc = CLI_USAGE;
    goto done;
  }
  if (rank != 0) {
    st = moe_infer_follow(eng);
    if (st != MOE_STATUS_OK) {
      cli_error("rank %d: serve: %s", rank, moe_ctx_error(ctx));
      rc = CLI_FAILED;
    } else {
      rc = cli_infer_paths_write(ctx, eng, record_file, rank, 1, "serve");
    }
    goto done;
  }
  printf("moe serve: listening on http://%s:%d (model %s; %d rank%s x %d slots; Ctrl-C stops)\n",
         sc.host, moe_serve_port(srv), model, world, world == 1 ? "" : "s", ic.slots);
  fflush(stdout);
  st = MOE_STATUS_OK;
  while (!g_stop && st == MOE_STATUS_OK) {
    if (moe_infer_wait(eng, 100)) st = moe_infer_step(eng);
  }
  // drain: no new requests; those in flight finish within the timeout
  moe_serve_quiesce(srv);
  const uint64_t t0 = moe_time_ns();
  while (st == MOE_STATUS_OK && moe_infer_pending(eng) > 0 && moe_time_ms_since(t0) < drain * 1000)
    st = moe_infer_step(eng);
  moe_infer_stats s;
  moe_infer_get_stats(eng, &s);
  const int cancelled = s.running + s.waiting;
  const moe_status stop_st = moe_infer_shutdown(eng);
  moe_serve_stop(srv);
  srv = NULL;
  // the followers gather the path profile unless a step failed (on every rank alike)
  if (st == MOE_STATUS_OK && stop_st == MOE_STATUS_OK &&
      cli_infer_paths_write(ctx, eng, record_file, rank, 1, "serve") != CLI_OK)
    rc = CLI_FAILED;
  if (st == MOE_STATUS_OK) st = stop_st;
  if (st != MOE_STATUS_OK) {
    cli_error("serve: %s", moe_ctx_error(ctx));
    rc = CLI_FAILED;
    goto done;
  }
  moe_infer_get_stats(eng, &s);
  printf(
      "moe serve: stopped: %lld requests done (%d cancelled at shutdown), %lld tokens "
      "generated, %lld steps\n",
      (long long)s.requests_done, cancelled, (long long)s.tokens, (long long)s.steps);
  fflush(stdout);
  cli_infer_placement_report(eng, &s, &ic, "serve");
  cli_infer_paths_report(eng, &ic, "serve");
done:
  moe_serve_stop(srv);
  moe_watchdog_stop(wd);
  moe_infer_destroy(eng);
  moe_ctx_destroy(ctx);
  MPI_Finalize();
  return rc;
}
#else
int cmd_serve(int argc, char **argv) {
  if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
    usage(stdout);
    return CLI_OK;
  }
  cli_error("serve needs MPI; this build has none (install libopenmpi-dev and rebuild)");
  return CLI_FAILED;
}
#endif
