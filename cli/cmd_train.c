// moe train: MoE-GPT training under mpirun (data x expert parallelism, the
// MoE layers on the task engine). Parses the options on every rank (only rank
// 0 prints), runs moe_train_run, prints a summary and draws the loss plot.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#if MOE_CLI_MPI
#include "moe/data.h"
#include "moe/gpt_io.h"
#include "moe/perf.h"
#include "moe/progress.h"
#include "moe/train.h"
#endif

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: mpirun -n P moe train [options]\n"
      "\n"
      "Trains MoE-GPT, a byte-level GPT whose feed-forward layers are MoE layers, with\n"
      "data parallelism x expert parallelism over the P ranks (P = 1 without mpirun).\n"
      "Every rank takes B/P sequences of each global batch, so the losses do not depend\n"
      "on P. Validation loss is printed in nats and bits/byte.\n"
      "\n"
      "model (ignored with --resume, which uses the checkpoint's):\n"
      "  --layers L            transformer blocks [4]\n"
      "  --d-model M           model width [128]\n"
      "  --heads NH            attention heads, divides M [4]\n"
      "  --seq-len S           context length [128]\n"
      "  --experts E           experts per MoE layer [8]\n"
      "  --topk K              experts per token [2]\n"
      "  --expert-hidden H     expert FFN width [256]\n"
      "  --moe-every N         MoE FFN in every N-th block, dense in the others;\n"
      "                        0 = dense model [1]\n"
      "  --dense-hidden N      dense FFN width [512]\n"
      "  --capacity-factor F   expert capacity factor; <= 0 dropless [dropless]\n"
      "  --aux-coef C          load-balancing loss weight [0.01]\n"
      "  --model-config FILE   model JSON (docs/model.md), applied before the flags\n"
      "training:\n"
      "  --steps N             length of the run: the lr schedule ends at step N [200]\n"
      "  --stop-at N           stop (validate, save) after step N < steps; --resume then\n"
      "                        continues exactly as an uninterrupted run [steps]\n"
      "  --batch B             global sequences per step, divisible by P [16]\n"
      "  --lr X, --min-lr X    peak and final learning rate [3e-3, 3e-4]\n"
      "  --warmup N            linear warm-up steps [100; at most steps/5 by default]\n"
      "  --weight-decay X      AdamW weight decay [0.1]\n"
      "  --clip X              gradient-norm clip, <= 0 off [1.0]\n"
      "  --seed S              parameters and batches [1]\n"
      "  --threads N           BLAS threads per rank [1]\n"
      "data:\n"
      "  --data FILE           your own text (bytes); default: the fortunes corpus\n"
      "                        (Debian package fortunes), else a generated text\n"
      "  --val-fraction X      held-out share of the text (0, 0.5] [0.1]\n"
      "  --eval-every N        validate every N steps and at the end; 0 = only at the end [50]\n"
      "  --eval-batches N      global batches per validation [4]\n"
      "expert parallelism and the task engine:\n"
      "  --ep N                ranks the experts are spread over; DP = P / N [P]\n"
      "  --a2a NAME            all-to-all algorithm, or auto [mpi]\n"
      "  --schedule NAME       %s, or auto [sequential]\n"
      "  --chunks R            chunks per all-to-all, or auto [1]\n"
      "  --compress SPEC       %s (lossy ones change results),\n"
      "                        or auto (lossless only, unless --allow-lossy) [none]\n"
      "  --compress-backward   also compress the backward's gradients\n"
      "  --profile FILE        a profile from 'moe calibrate' on these P ranks (EP = P):\n"
      "                        predicts the MoE layer's passes, reported next to the\n"
      "                        measured ones, and lets the four options above be auto\n"
      "                        (the planner picks the least predicted time for the\n"
      "                        MoE layer's shape: B/P x S tokens per rank)\n"
      "  --allow-lossy         let --compress auto pick lossy compressors\n"
      "checkpoints and outputs:\n"
      "  --checkpoint FILE     save here (atomically) at the end and every --save-every\n"
      "  --save-every N        steps between saves [0: only at the end]\n"
      "  --resume FILE         continue from a checkpoint (any P and EP)\n"
      "  --metrics FILE        one JSON object per step (rank 0)\n"
      "  --plot FILE           loss plot via gnuplot (.png, .svg, else text); needs --metrics\n"
      "  --trace FILE          Chrome trace of one step's MoE passes, every rank\n"
      "  --trace-step N        the step traced [the last]\n"
      "  --log-every N         progress line every N steps [1]\n"
      "  --progress MODE       auto|line|redraw [auto: redraw on a terminal]\n"
      "  --quiet               no progress line\n"
      "\n"
      "Exit status: 0 success, 1 runtime failure, 2 invalid arguments or input.\n",
      moe_schedule_algo_names(), moe_compressor_names());
}

#if MOE_CLI_MPI
#include <mpi.h>

typedef struct {
  moe_train_config tc;
  int threads;
  int warmup_set;
  const char *plot;
  const char *model_config;
  int model_flags;           // a model flag was given
  const char *profile_path;  // --profile: predictions, and the planner for auto
  int allow_lossy;
} train_opts;

static int any_auto(const moe_train_config *tc) {
  return strcmp(tc->par.a2a, "auto") == 0 || strcmp(tc->par.schedule, "auto") == 0 ||
         strcmp(tc->par.compress, "auto") == 0 || tc->par.chunks == 0;
}

static int parse(int argc, char **argv, train_opts *o, moe_ctx *ctx) {
  cli_args a;
  moe_train_config *tc = &o->tc;
  cli_args_init(&a, argc, argv, 2);
  moe_gpt_config *m = &tc->model;
  // Model flags are applied after --model-config: remember them and apply at the end.
  long v_layers = -1, v_d = -1, v_heads = -1, v_s = -1, v_e = -1, v_k = -1, v_h = -1, v_me = -1,
       v_dh = -1;
  double v_f = NAN, v_aux = NAN;
  while (!cli_args_done(&a) && !a.bad) {
    int iv = 0;
    double dv = 0;
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      usage(stdout);
      return -1;
    } else if (cli_opt(&a, "--layers")) {
      cli_parse_int(&a, "--layers", 1, MOE_GPT_MAX_LAYERS, &iv);
      v_layers = iv;
    } else if (cli_opt(&a, "--d-model")) {
      cli_parse_int(&a, "--d-model", 1, 65536, &iv);
      v_d = iv;
    } else if (cli_opt(&a, "--heads")) {
      cli_parse_int(&a, "--heads", 1, 65536, &iv);
      v_heads = iv;
    } else if (cli_opt(&a, "--seq-len")) {
      cli_parse_int(&a, "--seq-len", 1, 65536, &iv);
      v_s = iv;
    } else if (cli_opt(&a, "--experts")) {
      cli_parse_int(&a, "--experts", 1, MOE_MAX_EXPERTS, &iv);
      v_e = iv;
    } else if (cli_opt(&a, "--topk")) {
      cli_parse_int(&a, "--topk", 1, MOE_MAX_EXPERTS, &iv);
      v_k = iv;
    } else if (cli_opt(&a, "--expert-hidden")) {
      cli_parse_int(&a, "--expert-hidden", 1, MOE_MAX_DIM, &iv);
      v_h = iv;
    } else if (cli_opt(&a, "--moe-every")) {
      cli_parse_int(&a, "--moe-every", 0, MOE_GPT_MAX_LAYERS, &iv);
      v_me = iv;
    } else if (cli_opt(&a, "--dense-hidden")) {
      cli_parse_int(&a, "--dense-hidden", 1, MOE_MAX_DIM, &iv);
      v_dh = iv;
    } else if (cli_opt(&a, "--capacity-factor")) {
      cli_parse_double(&a, "--capacity-factor", -1e6, 1e6, &v_f);
    } else if (cli_opt(&a, "--aux-coef")) {
      cli_parse_double(&a, "--aux-coef", 0, 1e6, &v_aux);
    } else if (cli_opt(&a, "--model-config")) {
      o->model_config = a.value;
    } else if (cli_opt(&a, "--steps")) {
      cli_parse_int(&a, "--steps", 1, 1 << 30, &tc->steps);
    } else if (cli_opt(&a, "--stop-at")) {
      cli_parse_int(&a, "--stop-at", 1, 1 << 30, &tc->stop_step);
    } else if (cli_opt(&a, "--batch")) {
      cli_parse_int(&a, "--batch", 1, 1 << 20, &tc->batch);
    } else if (cli_opt(&a, "--lr")) {
      cli_parse_double(&a, "--lr", 1e-12, 10, &dv);
      tc->optim.lr = (float)dv;
    } else if (cli_opt(&a, "--min-lr")) {
      cli_parse_double(&a, "--min-lr", 0, 10, &dv);
      tc->optim.min_lr = (float)dv;
    } else if (cli_opt(&a, "--warmup")) {
      cli_parse_int(&a, "--warmup", 0, 1 << 30, &tc->optim.warmup_steps);
      o->warmup_set = 1;
    } else if (cli_opt(&a, "--weight-decay")) {
      cli_parse_double(&a, "--weight-decay", 0, 10, &dv);
      tc->optim.weight_decay = (float)dv;
    } else if (cli_opt(&a, "--clip")) {
      cli_parse_double(&a, "--clip", -1, 1e9, &dv);
      tc->optim.grad_clip = (float)dv;
    } else if (cli_opt(&a, "--seed")) {
      unsigned long long s = 0;
      cli_parse_u64(&a, "--seed", &s);
      tc->seed = s;
    } else if (cli_opt(&a, "--threads")) {
      cli_parse_int(&a, "--threads", 1, 256, &o->threads);
    } else if (cli_opt(&a, "--data")) {
      tc->data = a.value;
    } else if (cli_opt(&a, "--val-fraction")) {
      cli_parse_double(&a, "--val-fraction", 1e-9, 0.5, &tc->val_fraction);
    } else if (cli_opt(&a, "--eval-every")) {
      cli_parse_int(&a, "--eval-every", 0, 1 << 30, &tc->eval_every);
    } else if (cli_opt(&a, "--eval-batches")) {
      cli_parse_int(&a, "--eval-batches", 0, 1 << 20, &tc->eval_batches);
    } else if (cli_opt(&a, "--ep")) {
      cli_parse_int(&a, "--ep", 1, 1 << 20, &tc->par.ep_size);
    } else if (cli_opt(&a, "--a2a")) {
      snprintf(tc->par.a2a, sizeof tc->par.a2a, "%s", a.value);
    } else if (cli_opt(&a, "--schedule")) {
      snprintf(tc->par.schedule, sizeof tc->par.schedule, "%s", a.value);
    } else if (cli_opt(&a, "--chunks")) {
      if (a.value && strcmp(a.value, "auto") == 0) {
        tc->par.chunks = 0;  // the planner's
      } else {
        cli_parse_int(&a, "--chunks", 1, MOE_MAX_CHUNKS, &tc->par.chunks);
      }
    } else if (cli_opt(&a, "--profile")) {
      o->profile_path = a.value;
    } else if (cli_flag(&a, "--allow-lossy")) {
      o->allow_lossy = 1;
    } else if (cli_opt(&a, "--compress")) {
      snprintf(tc->par.compress, sizeof tc->par.compress, "%s", a.value);
    } else if (cli_flag(&a, "--compress-backward")) {
      tc->par.compress_backward = 1;
    } else if (cli_opt(&a, "--checkpoint")) {
      tc->checkpoint = a.value;
    } else if (cli_opt(&a, "--save-every")) {
      cli_parse_int(&a, "--save-every", 0, 1 << 30, &tc->save_every);
    } else if (cli_opt(&a, "--resume")) {
      tc->resume = a.value;
    } else if (cli_opt(&a, "--metrics")) {
      tc->metrics = a.value;
    } else if (cli_opt(&a, "--plot")) {
      o->plot = a.value;
    } else if (cli_opt(&a, "--trace")) {
      tc->trace = a.value;
    } else if (cli_opt(&a, "--trace-step")) {
      cli_parse_int(&a, "--trace-step", 0, 1 << 30, &tc->trace_step);
    } else if (cli_opt(&a, "--log-every")) {
      cli_parse_int(&a, "--log-every", 1, 1 << 30, &tc->log_every);
    } else if (cli_opt(&a, "--progress")) {
      if (strcmp(a.value, "auto") == 0) {
        tc->progress_tty = -1;
      } else if (strcmp(a.value, "line") == 0) {
        tc->progress_tty = 0;
      } else if (strcmp(a.value, "redraw") == 0) {
        tc->progress_tty = 1;
      } else {
        cli_error("--progress: '%s' is not one of auto, line, redraw", a.value);
        return CLI_USAGE;
      }
    } else if (cli_flag(&a, "--quiet")) {
      tc->progress = 0;
    } else {
      cli_error("train: unknown option '%s' (see moe train --help)", cli_args_peek(&a));
      return CLI_USAGE;
    }
  }
  if (a.bad) return CLI_USAGE;
  o->model_flags = v_layers >= 0 || v_d >= 0 || v_heads >= 0 || v_s >= 0 || v_e >= 0 || v_k >= 0 ||
                   v_h >= 0 || v_me >= 0 || v_dh >= 0 || !isnan(v_f) || !isnan(v_aux) ||
                   o->model_config;
  if (tc->data) {
    FILE *f = fopen(tc->data, "rb");
    if (!f) {
      cli_error("--data: cannot open '%s': %s", tc->data, strerror(errno));
      return CLI_USAGE;
    }
    fclose(f);
  }
  if (tc->resume) {
    // The model is the checkpoint's.
    moe_gpt_ckpt_info info;
    if (moe_gpt_ckpt_read_info(ctx, tc->resume, &info) != MOE_STATUS_OK) {
      cli_error("--resume: %s", moe_ctx_error(ctx));
      return CLI_USAGE;
    }
    *m = info.model;
    if (o->model_flags)
      fprintf(stderr,
              "moe: warning: --resume: model options are ignored (the checkpoint's "
              "model is used)\n");
  } else {
    if (o->model_config && moe_gpt_config_load_file(ctx, o->model_config, m) != MOE_STATUS_OK) {
      cli_error("--model-config: %s", moe_ctx_error(ctx));
      return CLI_USAGE;
    }
    if (v_layers >= 0) m->n_layer = (int)v_layers;
    if (v_d >= 0) m->d_model = (int)v_d;
    if (v_heads >= 0) m->n_head = (int)v_heads;
    if (v_s >= 0) m->seq_len = (int)v_s;
    if (v_e >= 0) m->moe.num_experts = (int)v_e;
    if (v_k >= 0) m->moe.top_k = (int)v_k;
    if (v_h >= 0) m->moe.hidden_dim = (int)v_h;
    if (v_me >= 0) m->moe_every = (int)v_me;
    if (v_dh >= 0) m->dense_hidden = (int)v_dh;
    if (!isnan(v_f)) m->moe.capacity_factor = v_f;
    if (!isnan(v_aux)) m->moe.aux_loss_coef = (float)v_aux;
  }
  if (moe_gpt_config_validate(ctx, m) != MOE_STATUS_OK) {
    cli_error("model: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  if (!o->warmup_set && tc->optim.warmup_steps > tc->steps / 5)
    tc->optim.warmup_steps = tc->steps / 5;
  if (o->plot && !tc->metrics) {
    cli_error("--plot needs --metrics FILE (the plot is drawn from it)");
    return CLI_USAGE;
  }
  if (tc->save_every > 0 && !tc->checkpoint) {
    cli_error("--save-every needs --checkpoint FILE");
    return CLI_USAGE;
  }
  if (tc->resume && tc->metrics) tc->metrics_append = 1;
  if (any_auto(tc) && !o->profile_path) {
    cli_error("'auto' needs a calibrated profile: --profile FILE (from 'moe calibrate')");
    return CLI_USAGE;
  }
  if (o->allow_lossy && strcmp(tc->par.compress, "auto") != 0) {
    cli_error("--allow-lossy only applies to --compress auto");
    return CLI_USAGE;
  }
  return CLI_OK;
}

// Loads the profile on every rank and checks that it describes these ranks;
// plans the auto choices of tc->par (printing the plan on rank 0) and
// predicts the MoE layer's forward + backward passes (*pred_ms). CLI_OK, or
// CLI_USAGE with the message printed on rank 0 (every rank agrees: the
// inputs are the same everywhere).
static int plan_train(moe_ctx *ctx, train_opts *o, int rank, int world, double *pred_ms) {
  moe_train_config *tc = &o->tc;
  moe_profile prof;
  const int ep = tc->par.ep_size > 0 ? tc->par.ep_size : world;
  const int rc = cli_profile_load_for(ctx, o->profile_path, world, ep, rank, &prof);
  if (rc != CLI_OK) return rc;
  if (tc->batch % world != 0) {
    if (rank == 0) cli_error("--batch (%d) must be divisible by the %d ranks", tc->batch, world);
    return CLI_USAGE;
  }
  moe_plan_request q;
  memset(&q, 0, sizeof q);
  q.cfg = tc->model.moe;
  q.cfg.model_dim = tc->model.d_model;
  q.cfg.tokens = tc->batch / world * tc->model.seq_len;
  snprintf(q.a2a, sizeof q.a2a, "%s", tc->par.a2a);
  snprintf(q.schedule, sizeof q.schedule, "%s", tc->par.schedule);
  snprintf(q.compress, sizeof q.compress, "%s", tc->par.compress);
  q.chunks = tc->par.chunks;
  q.allow_lossy = o->allow_lossy;
  q.compress_backward = tc->par.compress_backward;
  q.profile = &prof;
  moe_plan plan;
  if (moe_plan_layer(ctx, &prof.cluster, &q, &plan) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("--profile: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  if (rank == 0 && any_auto(tc)) {
    printf(
        "plan: a2a %s, compress %s, schedule %s, r=%d for T=%d tokens per rank, M=%d, H=%d, "
        "E=%d, K=%d: predicted %.2f ms per MoE layer (forward + backward), best of %d "
        "candidates\n",
        plan.best.a2a, plan.best.compress, plan.best.schedule, plan.predicted.chunks, q.cfg.tokens,
        q.cfg.model_dim, q.cfg.hidden_dim, q.cfg.num_experts, q.cfg.top_k, plan.predicted.total_ms,
        plan.candidates);
    fflush(stdout);
  }
  snprintf(tc->par.a2a, sizeof tc->par.a2a, "%s", plan.best.a2a);
  snprintf(tc->par.schedule, sizeof tc->par.schedule, "%s", plan.best.schedule);
  snprintf(tc->par.compress, sizeof tc->par.compress, "%s", plan.best.compress);
  tc->par.chunks = plan.best.chunks;
  *pred_ms = plan.predicted.pass_ms[0] + plan.predicted.pass_ms[1];
  return CLI_OK;
}

static void print_summary(const moe_train_config *tc, const moe_train_result *r, int world,
                          const double peak_rss_mib[2]) {
  const double ln2 = log(2.0);
  printf("trained MoE-GPT: steps %d..%d, %d rank(s), global batch %d x %d bytes\n", r->first_step,
         r->last_step, world, tc->batch, tc->model.seq_len);
  printf("  data: %s\n", r->source);
  printf("  parameters: %zu total, %zu active per token\n", r->params_total, r->params_active);
  printf("  train loss: %.4f -> %.4f nats (%.3f -> %.3f bits/byte)\n", r->first_loss, r->final_loss,
         r->first_loss / ln2, r->final_loss / ln2);
  if (!isnan(r->final_val_loss))
    printf("  val loss:   %.4f -> %.4f nats (%.3f -> %.3f bits/byte)\n", r->first_val_loss,
           r->final_val_loss, r->first_val_loss / ln2, r->final_val_loss / ln2);
  printf("  median tokens/s %.0f, all-to-all share %.1f%%, exposed %.1f%%, wall %.1f s\n",
         r->tokens_per_s, 100 * r->a2a_share, 100 * r->exposed_share, r->train_s);
  const double model_mib = (double)(r->state_bytes + r->activation_bytes) / (1 << 20);
  printf(
      "  memory, rank 0: peak RSS %.1f MiB (max over ranks %.1f MiB); from the config: "
      "%.1f MiB = params+grads+AdamW %.1f + activations %.1f (RSS/config %.2f)\n",
      peak_rss_mib[0], peak_rss_mib[1], model_mib, (double)r->state_bytes / (1 << 20),
      (double)r->activation_bytes / (1 << 20), peak_rss_mib[0] / model_mib);
}

// VmHWM of this process in MiB (0 when unknown).
static double peak_rss_mib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  double kib = 0;
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "VmHWM:", 6) == 0) kib = atof(line + 6);
  fclose(f);
  return kib / 1024.0;
}

int cmd_train(int argc, char **argv) {
  int provided = 0, rank = 0, world = 1, rc = CLI_OK;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  moe_ctx *ctx = NULL;
  train_opts o;
  memset(&o, 0, sizeof o);
  moe_train_config_default(&o.tc);
  o.threads = 1;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("out of memory");
    MPI_Finalize();
    return CLI_FAILED;
  }
  int saved[2];
  cli_silence_begin(rank != 0, saved);
  rc = parse(argc, argv, &o, ctx);
  cli_silence_end(saved);
  if (rc != CLI_OK) {
    moe_ctx_destroy(ctx);
    MPI_Finalize();
    return rc < 0 ? CLI_OK : rc;
  }
  if (provided < MPI_THREAD_MULTIPLE && rank == 0)
    fprintf(stderr, "moe: warning: MPI provides thread level %d < MULTIPLE\n", provided);
  double pred_ms = NAN;
  if (o.profile_path) {
    rc = plan_train(ctx, &o, rank, world, &pred_ms);
    if (rc != CLI_OK) {
      moe_ctx_destroy(ctx);
      MPI_Finalize();
      return rc;
    }
  }
  moe_blas_set_threads(o.threads);
  if (rank != 0) o.tc.progress = 0;
  moe_train_result res;
  const moe_status st = moe_train_run(ctx, MPI_COMM_WORLD, &o.tc, &res);
  double rss[2] = {peak_rss_mib(), 0};  // rank 0's, max over ranks
  MPI_Allreduce(&rss[0], &rss[1], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (st != MOE_STATUS_OK) {
    if (rank == 0) cli_error("train: %s", moe_ctx_error(ctx));
    rc = st == MOE_STATUS_INVALID_ARG || st == MOE_STATUS_BAD_FORMAT ? CLI_USAGE : CLI_FAILED;
  } else if (rank == 0) {
    print_summary(&o.tc, &res, world, rss);
    if (!isnan(pred_ms) && !isnan(res.moe_pass_ms)) {
      printf(
          "  MoE layer passes (forward + backward, per layer): measured %.2f ms (median, rank 0), "
          "predicted %.2f ms (%s), error %+.1f%%\n",
          res.moe_pass_ms, pred_ms, o.profile_path,
          100.0 * (pred_ms - res.moe_pass_ms) / res.moe_pass_ms);
    }
    if (o.tc.checkpoint) printf("  checkpoint: %s\n", o.tc.checkpoint);
  }
  fflush(stdout);
  MPI_Finalize();
  // gnuplot runs as a child process: after MPI is done.
  if (rc == CLI_OK && rank == 0 && o.plot) {
    if (moe_plot_loss(ctx, o.tc.metrics, o.plot) == MOE_STATUS_OK) {
      printf("  loss plot: %s\n", o.plot);
    } else {
      fprintf(stderr, "moe: warning: --plot: %s\n", moe_ctx_error(ctx));
    }
  }
  moe_ctx_destroy(ctx);
  return rc;
}
#else
int cmd_train(int argc, char **argv) {
  if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
    usage(stdout);
    return CLI_OK;
  }
  cli_error("train needs MPI; this build has none (install libopenmpi-dev and rebuild)");
  return CLI_FAILED;
}
#endif
