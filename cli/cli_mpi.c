// Pieces of the moe command-line tool that only MPI commands use.
#include "cli.h"

#if MOE_CLI_MPI
#include <mpi.h>
#include <string.h>

#include "moe/comm.h"
#include "moe/infer.h"

int cli_out_open_root(cli_out *o, const char *path, int rank) {
  int rc = CLI_OK;
  if (rank == 0 && path) rc = cli_out_open(o, path);
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}

int cli_out_probe_root(const char *path, int rank) {
  cli_out probe = {0};
  const int rc = cli_out_open_root(&probe, path, rank);
  cli_out_abort(&probe);
  return rc;
}

int cli_memory_check_world(moe_ctx *ctx, moe_status estimate, moe_memory_need *need,
                           size_t max_memory, const char *hint, int rank) {
  need->bytes[MOE_MEM_BASELINE] = (double)moe_memory_baseline_bytes();
  moe_status st = moe_comm_agree(ctx, MPI_COMM_WORLD, estimate, "the memory estimate");
  if (st == MOE_STATUS_OK) st = moe_comm_memory_check(ctx, MPI_COMM_WORLD, need, max_memory, hint);
  if (st == MOE_STATUS_OK) return CLI_OK;
  if (rank == 0) cli_error("%s", moe_ctx_error(ctx));
  return CLI_USAGE;
}

int cli_profile_load_for(moe_ctx *ctx, const char *path, int world, int ep, int rank,
                         moe_profile *out) {
  if (moe_profile_load(ctx, path, out) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("--profile: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  if (moe_profile_check_ranks(ctx, out, world, ep) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("--%s", moe_ctx_error(ctx));  // "profile ..."
    return CLI_USAGE;
  }
  return CLI_OK;
}

int cli_watchdog_start(moe_ctx *ctx, double seconds, int rank, struct moe_watchdog **wd) {
  *wd = NULL;
  if (!(seconds > 0)) return CLI_OK;
  moe_watchdog_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.timeout_s = seconds;
  cfg.hint = "--hang-timeout SECONDS sets this limit (0 turns the watchdog off)";
  if (moe_watchdog_start(ctx, MPI_COMM_WORLD, &cfg, wd) != MOE_STATUS_OK) {
    cli_error("rank %d: hang watchdog: %s", rank, moe_ctx_error(ctx));
    return CLI_FAILED;
  }
  if (moe_watchdog_probing(*wd) == 0 && rank == 0)
    fprintf(stderr,
            "moe: warning: MPI gives no MPI_THREAD_MULTIPLE: the hang watchdog cannot probe "
            "the ranks, so --hang-timeout %g aborts any wait that long (slow or hung)\n",
            seconds);
  return CLI_OK;
}

int cli_infer_create(moe_ctx *ctx, const moe_infer_config *ic, int rank, const char *cmd,
                     moe_infer **out) {
  const moe_status st = moe_infer_create(ctx, MPI_COMM_WORLD, ic, out);
  if (st == MOE_STATUS_OK) return CLI_OK;
  if (rank == 0) cli_error("%s: %s", cmd, moe_ctx_error(ctx));
  return st == MOE_STATUS_OUT_OF_MEMORY || st == MOE_STATUS_INTERNAL || st == MOE_STATUS_COMM
             ? CLI_FAILED
             : CLI_USAGE;
}

int cli_infer_engine_opt(cli_args *a, moe_infer_config *ic, const char **record_file, int rank,
                         const char *cmd) {
  if (cli_opt(a, "--slots")) {
    cli_parse_int(a, "--slots", 1, 4096, &ic->slots);
  } else if (cli_opt(a, "--step-rows")) {
    cli_parse_int(a, "--step-rows", 1, 65536, &ic->step_rows);
  } else if (cli_opt(a, "--prefill-chunk")) {
    cli_parse_int(a, "--prefill-chunk", 1, 65536, &ic->prefill_chunk);
  } else if (cli_opt(a, "--a2a")) {
    if (strlen(a->value) >= sizeof ic->par.a2a) {
      if (rank == 0) cli_error("%s: --a2a name '%s' is too long", cmd, a->value);
      a->bad = 1;
    } else {
      snprintf(ic->par.a2a, sizeof ic->par.a2a, "%s", a->value);
    }
  } else if (cli_opt(a, "--placement")) {
    const int p = moe_infer_placement_find(a->value);
    if (p < 0) {
      if (rank == 0)
        cli_error("%s: --placement '%s' is unknown (valid: %s)", cmd, a->value,
                  moe_infer_placement_names());
      a->bad = 1;
    } else {
      ic->placement = p;
    }
  } else if (cli_opt(a, "--place-slots")) {
    cli_parse_int(a, "--place-slots", 1, 4096, &ic->place_slots);
  } else if (cli_opt(a, "--place-window")) {
    cli_parse_int(a, "--place-window", 1, 10000, &ic->place_window);
  } else if (cli_opt(a, "--place-every")) {
    cli_parse_int(a, "--place-every", 1, 1 << 20, &ic->place_every);
  } else if (cli_opt(a, "--place-replan")) {
    cli_parse_on_off(a, "--place-replan", &ic->place_phase2);
  } else if (cli_opt(a, "--record-paths")) {
    *record_file = a->value;
    ic->record_paths = 1;
  } else if (cli_opt(a, "--path-len")) {
    cli_parse_int(a, "--path-len", 1, MOE_PATHS_MAX_LEN, &ic->path_len);
  } else if (cli_opt(a, "--max-paths")) {
    cli_parse_int(a, "--max-paths", 1, 1 << 20, &ic->max_paths);
  } else if (cli_opt(a, "--routing-trace")) {
    ic->routing_trace = a->value;
  } else if (cli_opt(a, "--paths")) {
    ic->paths = a->value;
  } else {
    return 0;
  }
  return 1;
}

void cli_infer_placement_report(moe_infer *eng, const moe_infer_stats *s,
                                const moe_infer_config *ic, const char *cmd) {
  if (ic->placement == MOE_INFER_PLACE_UNIFORM || s->plans == 0) return;
  fprintf(stderr,
          "%s: placement %s: balance ratio %.3f without copies, %.3f as placed (mean over the "
          "plans); %lld plans, %lld copies sent, %d in force; %.1f ms in placement\n",
          cmd, moe_infer_placement_name(ic->placement), s->balance_uniform, s->balance_placed,
          (long long)s->plans, (long long)s->copies_sent, s->copies, s->place_ms);
  if (ic->placement == MOE_INFER_PLACE_LINA && ic->place_phase2)
    fprintf(stderr, "%s: lina phase 2: %lld re-plans (the estimated top-2K missed), %.1f ms\n", cmd,
            (long long)s->replans, s->replan_ms);
  const moe_gpt_config *mc = moe_infer_model_config(eng);
  fprintf(stderr, "%s: placement time per MoE block:", cmd);
  for (int b = 0; b < mc->n_layer; b++) {
    double mm = 0, pm = 0;
    moe_infer_layer_times(eng, b, &mm, NULL, &pm);
    if (mm > 0) fprintf(stderr, " %d: %.1f ms", b, pm);
  }
  fputc('\n', stderr);
}

int cli_infer_paths_write(moe_ctx *ctx, moe_infer *eng, const char *record_file, int rank, int keep,
                          const char *cmd) {
  if (!record_file) return CLI_OK;
  char *text = NULL;
  const moe_status st = moe_infer_paths_json(eng, &text);
  if (st != MOE_STATUS_OK) {
    if (rank == 0) cli_error("%s: the path profile: %s", cmd, moe_ctx_error(ctx));
    moe_free(text);
    return CLI_FAILED;
  }
  int rc = CLI_OK;
  if (rank == 0 && keep) {
    cli_out o;
    rc = cli_out_open(&o, record_file);
    if (rc == CLI_OK) {
      if (fputs(text, o.f) < 0) {
        cli_error("%s: writing %s failed", cmd, record_file);
        cli_out_abort(&o);
        rc = CLI_FAILED;
      } else {
        rc = cli_out_commit(&o);
      }
    }
    moe_path_profile *p = NULL;
    if (rc == CLI_OK && moe_path_profile_from_json(ctx, text, strlen(text), &p) == MOE_STATUS_OK) {
      const moe_path_profile_stats ps = moe_path_profile_get_stats(p);
      fprintf(stderr,
              "%s: path profile %s: %lld tokens, %lld paths over the MoE blocks, %lld tokens of "
              "paths not kept (--max-paths)\n",
              cmd, record_file, (long long)ps.tokens, (long long)ps.paths, (long long)ps.unkept);
    }
    moe_path_profile_destroy(p);
  }
  moe_free(text);
  return rc;
}

void cli_infer_paths_report(moe_infer *eng, const moe_infer_config *ic, const char *cmd) {
  if (!ic->paths) return;
  const moe_gpt_config *mc = moe_infer_model_config(eng);
  int64_t te = 0, ta = 0, tf = 0;
  for (int b = 0; b < mc->n_layer; b++) {
    int64_t ev = 0, ac = 0, ft = 0;
    moe_infer_path_stats(eng, b, &ev, &ac, &ft);
    if (ev == 0) continue;
    fprintf(stderr,
            "%s: paths %s, block %d: estimated top-%d equal to the gate's in %.1f%% of %lld "
            "steps (accuracy), as a set in %.1f%% (fine-tune rate %.1f%%)\n",
            cmd, ic->paths, b,
            2 * mc->moe.top_k < mc->moe.num_experts ? 2 * mc->moe.top_k : mc->moe.num_experts,
            100.0 * (double)ac / (double)ev, (long long)ev, 100.0 * (double)(ev - ft) / (double)ev,
            100.0 * (double)ft / (double)ev);
    te += ev;
    ta += ac;
    tf += ft;
  }
  if (te > 0)
    fprintf(stderr, "%s: paths %s, all MoE blocks: accuracy %.1f%%, fine-tune rate %.1f%%\n", cmd,
            ic->paths, 100.0 * (double)ta / (double)te, 100.0 * (double)tf / (double)te);
}

#endif
