// moe train: MoE-GPT training under mpirun (data x expert parallelism, the
// MoE layers on the task engine). Parses the options on every rank (only rank
// 0 prints), runs moe_train_run, prints a summary and draws the loss plot.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stddef.h>
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
  fprintf(f,
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
          "  --model-config FILE   model JSON (docs/model.md), applied before the flags\n");
  fprintf(
      f,
      "training:\n"
      "  --steps N             length of the run: the lr schedule ends at step N [200;\n"
      "                        with --resume, the checkpoint's: its schedule is kept, and\n"
      "                        steps past its end run at min-lr]\n"
      "  --stop-at N           stop (validate, save) after step N < steps; --resume then\n"
      "                        continues exactly as an uninterrupted run [steps]\n"
      "  --batch B             global sequences per step, divisible by P [16]\n"
      "  --lr X, --min-lr X    peak and final learning rate [3e-3, 3e-4]\n"
      "  --warmup N            linear warm-up steps [100; at most steps/5 by default]\n"
      "                        (--lr, --min-lr, --warmup with --resume: the checkpoint's;\n"
      "                        other values are refused)\n"
      "  --weight-decay X      AdamW weight decay [0.1]\n"
      "  --clip X              gradient-norm clip, <= 0 off [1.0]\n"
      "  --seed S              parameters and batches [1]\n"
      "  --threads N           compute threads per rank [1] (the fixed backend runs on\n"
      "                        one)\n"
      "  --deterministic on|off\n"
      "                        on: fixed-order GEMMs and sums, so losses and parameters\n"
      "                        are bitwise the same on any number of ranks when B/P is\n"
      "                        a power of two, EP = P, chunks 1, no lossy compression\n"
      "                        (docs/reliability.md); off: --backend's GEMMs and MPI's\n"
      "                        sums [on]\n"
      "  --backend NAME        compute backend of every GEMM: %s [fixed;\n"
      "                        with --deterministic off, openblas]; on needs fixed\n"  // catalogue:
                                                                                       // defaults
      "  --precision fp32|bf16 GEMM precision: bf16 rounds the GEMMs' inputs to bf16,\n"
      "                        accumulating in fp32; master weights, gradients, AdamW,\n"
      "                        router and checkpoints stay fp32; needs AVX512_BF16 and\n"
      "                        the fixed backend [fp32]\n" CLI_MAX_MEMORY_HELP,
      moe_backend_names());
  fprintf(
      f,
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
      "                        MoE layer's shape: B/P x S tokens per rank); with Parm,\n"
      "                        --parm auto reads its layout's terms from it\n"
      "  --allow-lossy         let --compress auto pick lossy compressors\n"
      "  --balance POLICY      load balancing by expert copies: none, shadow, prophet,\n"
      "                        eplb, auto (docs/balance.md); after each step it plans\n"
      "                        the next step's copies from the all-gathered load; losses\n"
      "                        equal to rounding (not bitwise across rank counts);\n"
      "                        needs EP >= 2 [none]\n"
      "  --balance-slots N     copy slots per rank and MoE layer, 0..E-E/EP [E/EP]\n"
      "  --replan-every N      plan every N steps, keep the plan between [1]\n"
      "  --balance-blockwise on|off\n"
      "                        Pro-Prophet's block-wise scheduler: each MoE layer's\n"
      "                        comm stream progresses the other layers' copy transfers\n"
      "                        (Trans, Agg) while it waits; same losses [on]\n"
      "  --gate plain|topo[:R] FasterMoE's topology-aware gate: at most R/M x T x K of a\n"
      "                        rank's choices go to experts on other nodes (R =\n"
      "                        W_net/W_local in (0, 1], topo alone R = 0.25; M ranks per\n"
      "                        node), the rest re-select local experts; changes the\n"
      "                        routing, so the losses (docs/balance.md) [plain]\n"
      "  --ranks-per-node N    pretend every N consecutive ranks share a node (the\n"
      "                        topology of --gate topo and of the all-to-alls) [detected]\n"
      "  --router-bias-update RATE\n"
      "                        DeepSeek-V3's aux-loss-free balancing: after each step\n"
      "                        every router bias moves by RATE toward even expert load\n"
      "                        (changes routing; saved in checkpoints); 0..1, 0 = off\n"
      "                        (DeepSeek-V3 used 0.001) [0]\n"
      "",
      moe_schedule_algo_names(), moe_compressor_names());
  fputs(
      "  --grad-bucket-mb MB   sum the dense gradients over the ranks in buckets of about\n"
      "                        MB MiB, each started as soon as the backward has\n"
      "                        finished its tensors and advanced during the rest of\n"
      "                        the backward (in the MoE layers' all-to-all gaps); the\n"
      "                        same bits when deterministic (else within rounding);\n"
      "                        0..4096, 0 = one packed all-reduce after the backward [0]\n"
      "  --micro-op-kb KB      with buckets: sum each bucket in micro-ops of at most KB\n"
      "                        KiB, one at a time; 0..1048576, 0 = a bucket per\n"
      "                        operation [256: ~2 ms of a 1 Gbit/s link, as Lina's\n"
      "                        30 MB is of 100 Gb/s]\n"
      "  --comm-priority fifo|lina\n"
      "                        with buckets: fifo starts a micro-op as soon as its\n"
      "                        bucket is ready; lina lets the all-to-alls go first (no\n"
      "                        new micro-op during an MoE layer's backward, except\n"
      "                        while its all-to-all stream waits for the experts) [fifo]\n"
      "  --expert-packing off|lina|N\n"
      "                        Lina's expert packing: more experts per rank during the\n"
      "                        run (EP shrinks, the experts' data parallelism grows;\n"
      "                        parameters and AdamW moments move with them): N times\n"
      "                        as many after step --packing-start - 1 (N divides the\n"
      "                        EP size), or lina: twice as many whenever an expert\n"
      "                        micro-op is shorter than an all-to-all one, checked\n"
      "                        then and every --packing-every steps; not with\n"
      "                        --balance [off]\n"
      "  --packing-start S     the first step run packed (lina: at least 2) [10]\n"
      "  --packing-every K     lina: steps between checks [4]\n",
      f);
  fputs(
      "Parm (docs/parm.md; --mp, --esp or --parm turns it on):\n"
      "  --mp N                tensor parallelism: attention heads and dense FFNs split\n"
      "                        over N consecutive ranks that train on the same sequences\n"
      "                        (the batch divides over P / N data parts) [1]\n"
      "  --esp N               experts sharded along their hidden size over N ranks [1]\n"
      "                        (world = DP x MP x EP x ESP; --ep N: EP, else P / (MP ESP))\n"
      "  --parm baseline|s1|s2|auto\n"
      "                        the MoE blocks' schedule: DeepSpeed-MoE's baseline, Parm's\n"
      "                        s1 or s2, or auto: Parm's Algorithm 1 on alpha-beta terms\n"
      "                        from --profile (moe calibrate's, for this layout) or\n"
      "                        measured at the start [s2]\n"
      "  --saa on|off          s2: overlap the MP-AllGather with the all-to-all back [on]\n"
      "                        --chunks R, --schedule NAME and --compress SPEC apply to s1\n"
      "                        and s2's EP&ESP pass (R > 1 and lossy SPECs need\n"
      "                        --deterministic off; not schedules cut by peer groups)\n"
      "                        Parm does not combine with --balance, --expert-packing,\n"
      "                        --grad-bucket-mb, --comm-priority lina, --gate topo,\n"
      "                        --router-bias-update, --routing-trace, --trace, or 'auto'\n"
      "                        for --a2a, --schedule, --chunks or --compress\n"
      "failures:\n" CLI_HANG_TIMEOUT_HELP
      "checkpoints and outputs:\n"
      "  --checkpoint FILE     save here (atomically) at the end and every --save-every\n"
      "  --save-every N        steps between saves [0: only at the end]\n"
      "  --resume FILE         continue from a checkpoint (any P and EP) with its model\n"
      "                        and lr schedule\n"
      "  --metrics FILE        one JSON object per step (rank 0)\n"
      "  --routing-trace FILE  per step and MoE layer, the (source rank x expert) matrix\n"
      "                        of rows routed, as JSON lines (rank 0; docs/balance.md)\n"
      "  --plot FILE           loss plot via gnuplot (.png, .svg, else text); needs --metrics\n"
      "  --trace FILE          Chrome trace of one step's MoE passes, every rank\n"
      "  --trace-step N        the step traced [the last]\n"
      "  --log-every N         progress line every N steps [1]\n"
      "  --progress MODE       auto|line|redraw [auto: redraw on a terminal]\n"
      "  --quiet               no progress line\n"
      "\n"
      "Exit status: 0 success, 1 runtime failure, 2 invalid arguments or input.\n",
      f);
}

#if MOE_CLI_MPI
#include <mpi.h>

typedef struct {
  moe_train_config tc;
  double hang_timeout;                            // --hang-timeout, seconds (0: off)
  int warmup_set, lr_set, min_lr_set, steps_set;  // given on the command line
  const char *plot;
  const char *model_config;
  int model_flags;           // a model flag was given
  const char *profile_path;  // --profile: predictions, and the planner for auto
  int balance_slots;         // --balance-slots, -1: E / EP
  int deterministic_set;     // --deterministic given
  int micro_op_set;          // --micro-op-kb given
} train_opts;

static int any_auto(const moe_train_config *tc) {
  return strcmp(tc->par.a2a, "auto") == 0 || strcmp(tc->par.schedule, "auto") == 0 ||
         strcmp(tc->par.compress, "auto") == 0 || tc->par.chunks == 0;
}

// Model options, applied after --model-config (negative / NAN: not given).
typedef struct {
  long layers, d_model, heads, seq_len, experts, topk, expert_hidden, moe_every, dense_hidden;
  double capacity_factor, aux_coef;
} model_flags;

// Consumes the current argument when it is a model option: 1, else 0.
static int parse_model_opt(cli_args *a, model_flags *mf, train_opts *o) {
  static const struct {
    const char *name;
    long lo, hi;
    size_t off;
  } ints[] = {{"--layers", 1, MOE_GPT_MAX_LAYERS, offsetof(model_flags, layers)},
              {"--d-model", 1, 65536, offsetof(model_flags, d_model)},
              {"--heads", 1, 65536, offsetof(model_flags, heads)},
              {"--seq-len", 1, 65536, offsetof(model_flags, seq_len)},
              {"--experts", 1, MOE_MAX_EXPERTS, offsetof(model_flags, experts)},
              {"--topk", 1, MOE_MAX_EXPERTS, offsetof(model_flags, topk)},
              {"--expert-hidden", 1, MOE_MAX_DIM, offsetof(model_flags, expert_hidden)},
              {"--moe-every", 0, MOE_GPT_MAX_LAYERS, offsetof(model_flags, moe_every)},
              {"--dense-hidden", 1, MOE_MAX_DIM, offsetof(model_flags, dense_hidden)}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    if (!cli_opt(a, ints[i].name)) continue;
    int iv = 0;
    cli_parse_int(a, ints[i].name, ints[i].lo, ints[i].hi, &iv);
    *(long *)((char *)mf + ints[i].off) = iv;
    return 1;
  }
  if (cli_opt(a, "--capacity-factor")) {
    cli_parse_double(a, "--capacity-factor", -1e6, 1e6, &mf->capacity_factor);
  } else if (cli_opt(a, "--aux-coef")) {
    cli_parse_double(a, "--aux-coef", 0, 1e6, &mf->aux_coef);
  } else if (cli_opt(a, "--model-config")) {
    o->model_config = a->value;
  } else {
    return 0;
  }
  return 1;
}

// Consumes the current argument when it is a training, data or parallelism
// option: 1, else 0.
static int parse_run_opt(cli_args *a, train_opts *o) {
  moe_train_config *tc = &o->tc;
  double dv = 0;
  if (cli_opt(a, "--steps")) {
    cli_parse_int(a, "--steps", 1, 1 << 30, &tc->steps);
    o->steps_set = 1;
  } else if (cli_opt(a, "--stop-at")) {
    cli_parse_int(a, "--stop-at", 1, 1 << 30, &tc->stop_step);
  } else if (cli_opt(a, "--batch")) {
    cli_parse_int(a, "--batch", 1, 1 << 20, &tc->batch);
  } else if (cli_opt(a, "--lr")) {
    cli_parse_double(a, "--lr", 1e-12, 10, &dv);
    tc->optim.lr = (float)dv;
    o->lr_set = 1;
  } else if (cli_opt(a, "--min-lr")) {
    cli_parse_double(a, "--min-lr", 0, 10, &dv);
    tc->optim.min_lr = (float)dv;
    o->min_lr_set = 1;
  } else if (cli_opt(a, "--warmup")) {
    cli_parse_int(a, "--warmup", 0, 1 << 30, &tc->optim.warmup_steps);
    o->warmup_set = 1;
  } else if (cli_opt(a, "--weight-decay")) {
    cli_parse_double(a, "--weight-decay", 0, 10, &dv);
    tc->optim.weight_decay = (float)dv;
  } else if (cli_opt(a, "--clip")) {
    cli_parse_double(a, "--clip", -1, 1e9, &dv);
    tc->optim.grad_clip = (float)dv;
  } else if (cli_opt(a, "--seed")) {
    unsigned long long s = 0;
    cli_parse_u64(a, "--seed", &s);
    tc->seed = s;
  } else if (cli_opt(a, "--max-memory")) {
    cli_parse_size(a, "--max-memory", &o->tc.max_memory);
  } else if (cli_opt(a, "--threads")) {
    cli_parse_int(a, "--threads", 1, 256, &o->tc.threads);
  } else if (cli_opt(a, "--backend")) {
    cli_parse_backend(a, "--backend", &o->tc.backend);
  } else if (cli_opt(a, "--precision")) {
    int p = 0;
    cli_parse_precision(a, "--precision", &p);
    o->tc.precision = (moe_precision)p;
  } else if (cli_hang_timeout_opt(a, &o->hang_timeout)) {
  } else if (cli_opt(a, "--data")) {
    tc->data = a->value;
  } else if (cli_opt(a, "--val-fraction")) {
    cli_parse_double(a, "--val-fraction", 1e-9, 0.5, &tc->val_fraction);
  } else if (cli_opt(a, "--eval-every")) {
    cli_parse_int(a, "--eval-every", 0, 1 << 30, &tc->eval_every);
  } else if (cli_opt(a, "--eval-batches")) {
    cli_parse_int(a, "--eval-batches", 0, 1 << 20, &tc->eval_batches);
  } else if (cli_opt(a, "--ep")) {
    cli_parse_int(a, "--ep", 1, 1 << 20, &tc->par.ep_size);
  } else if (cli_opt(a, "--a2a")) {
    snprintf(tc->par.a2a, sizeof tc->par.a2a, "%s", a->value);
  } else if (cli_opt(a, "--schedule")) {
    snprintf(tc->par.schedule, sizeof tc->par.schedule, "%s", a->value);
  } else if (cli_opt(a, "--chunks")) {
    if (a->value && strcmp(a->value, "auto") == 0) {
      tc->par.chunks = 0;  // the planner's
    } else {
      cli_parse_int(a, "--chunks", 1, MOE_MAX_CHUNKS, &tc->par.chunks);
    }
  } else if (cli_opt(a, "--profile")) {
    o->profile_path = a->value;
  } else if (cli_flag(a, "--allow-lossy")) {
    tc->allow_lossy = 1;
  } else if (cli_opt(a, "--compress")) {
    snprintf(tc->par.compress, sizeof tc->par.compress, "%s", a->value);
  } else if (cli_flag(a, "--compress-backward")) {
    tc->par.compress_backward = 1;
  } else if (cli_opt(a, "--balance")) {
    if (a->value) {
      const int p = moe_balance_policy_find(a->value);
      if (p < 0) {
        cli_error("--balance: policy '%s' is unknown (valid: %s)", a->value,
                  moe_balance_policy_names());
        a->bad = 1;
      } else {  // the policy's own defaults (eplb's 10-step window); options keep theirs
        moe_balance_config d;
        moe_balance_config_default(&d, p, tc->model.d_model, tc->model.moe.hidden_dim, 0);
        tc->balance.policy = p;
        tc->balance.window = d.window;
      }
    }
  } else if (cli_opt(a, "--balance-slots")) {
    cli_parse_int(a, "--balance-slots", 0, 1 << 20, &o->balance_slots);
  } else if (cli_opt(a, "--replan-every")) {
    cli_parse_int(a, "--replan-every", 1, 1000000, &tc->balance.replan_every);
  } else if (cli_opt(a, "--balance-blockwise")) {
    cli_parse_on_off(a, "--balance-blockwise", &tc->balance_blockwise);
  } else if (cli_opt(a, "--gate")) {
    if (a->value) {
      moe_ctx *ectx = NULL;
      if (moe_ctx_create(&ectx) != MOE_STATUS_OK) {
        cli_error("--gate: out of memory");
        a->bad = 1;
      } else if (moe_gate_spec_parse(ectx, a->value, &tc->par.topo_gate) != MOE_STATUS_OK) {
        cli_error("--gate: %s", moe_ctx_error(ectx));
        a->bad = 1;
      }
      moe_ctx_destroy(ectx);
    }
  } else if (cli_opt(a, "--ranks-per-node")) {
    cli_parse_int(a, "--ranks-per-node", 0, 1 << 20, &tc->par.ranks_per_node);
  } else if (cli_opt(a, "--router-bias-update")) {
    double rate = 0;
    cli_parse_double(a, "--router-bias-update", 0, 1, &rate);
    tc->router_bias_rate = (float)rate;
  } else if (cli_opt(a, "--grad-bucket-mb")) {
    cli_parse_double(a, "--grad-bucket-mb", 0, 4096, &tc->grad_bucket_mb);
  } else if (cli_opt(a, "--micro-op-kb")) {
    int kb = 0;
    cli_parse_int(a, "--micro-op-kb", 0, 1048576, &kb);
    tc->micro_op_kb = kb;
    o->micro_op_set = 1;
  } else if (cli_opt(a, "--mp")) {
    cli_parse_int(a, "--mp", 1, 1 << 20, &tc->mp);
    tc->parm_on = 1;
  } else if (cli_opt(a, "--esp")) {
    cli_parse_int(a, "--esp", 1, 1 << 20, &tc->esp);
    tc->parm_on = 1;
  } else if (cli_opt(a, "--parm")) {
    tc->parm_on = 1;
    if (a->value && strcmp(a->value, "auto") == 0) {
      tc->parm_auto = 1;
    } else if (a->value) {
      moe_ctx *ectx = NULL;
      if (moe_ctx_create(&ectx) != MOE_STATUS_OK) {
        cli_error("--parm: out of memory");
        a->bad = 1;
      } else if (moe_parm_schedule_parse(ectx, a->value, &tc->parm_schedule) != MOE_STATUS_OK) {
        cli_error("--parm: %s, or auto", moe_ctx_error(ectx));
        a->bad = 1;
      }
      moe_ctx_destroy(ectx);
    }
  } else if (cli_opt(a, "--saa")) {
    cli_parse_on_off(a, "--saa", &tc->parm_saa);
  } else if (cli_opt(a, "--expert-packing")) {
    if (a->value && strcmp(a->value, "off") == 0) {
      tc->packing = 0;
    } else if (a->value && strcmp(a->value, "lina") == 0) {
      tc->packing = MOE_TRAIN_PACKING_LINA;
    } else {
      cli_parse_int(a, "--expert-packing (off, lina or a degree)", 1, 1024, &tc->packing);
    }
  } else if (cli_opt(a, "--packing-start")) {
    cli_parse_int(a, "--packing-start", 1, 100000000, &tc->packing_start);
  } else if (cli_opt(a, "--packing-every")) {
    cli_parse_int(a, "--packing-every", 1, 100000000, &tc->packing_every);
  } else if (cli_opt(a, "--comm-priority")) {
    if (a->value) {
      moe_ctx *ectx = NULL;
      if (moe_ctx_create(&ectx) != MOE_STATUS_OK) {
        cli_error("--comm-priority: out of memory");
        a->bad = 1;
      } else if (moe_comm_priority_parse(ectx, a->value, &tc->comm_priority) != MOE_STATUS_OK) {
        cli_error("--comm-priority: %s", moe_ctx_error(ectx));
        a->bad = 1;
      }
      moe_ctx_destroy(ectx);
    }
  } else {
    return 0;
  }
  return 1;
}

// Consumes the current argument when it is an output option: 1, else 0
// (a bad --progress value sets a->bad).
static int parse_output_opt(cli_args *a, train_opts *o) {
  moe_train_config *tc = &o->tc;
  if (cli_opt(a, "--checkpoint")) {
    tc->checkpoint = a->value;
  } else if (cli_opt(a, "--save-every")) {
    cli_parse_int(a, "--save-every", 0, 1 << 30, &tc->save_every);
  } else if (cli_opt(a, "--resume")) {
    tc->resume = a->value;
  } else if (cli_opt(a, "--metrics")) {
    tc->metrics = a->value;
  } else if (cli_opt(a, "--routing-trace")) {
    tc->routing_trace = a->value;
  } else if (cli_opt(a, "--plot")) {
    o->plot = a->value;
  } else if (cli_opt(a, "--trace")) {
    tc->trace = a->value;
  } else if (cli_opt(a, "--trace-step")) {
    cli_parse_int(a, "--trace-step", 0, 1 << 30, &tc->trace_step);
  } else if (cli_opt(a, "--log-every")) {
    cli_parse_int(a, "--log-every", 1, 1 << 30, &tc->log_every);
  } else if (cli_opt(a, "--progress")) {
    if (strcmp(a->value, "auto") == 0) {
      tc->progress_tty = -1;
    } else if (strcmp(a->value, "line") == 0) {
      tc->progress_tty = 0;
    } else if (strcmp(a->value, "redraw") == 0) {
      tc->progress_tty = 1;
    } else {
      cli_error("--progress: '%s' is not one of auto, line, redraw", a->value);
      a->bad = 1;
    }
  } else if (cli_opt(a, "--deterministic")) {
    cli_parse_on_off(a, "--deterministic", &tc->deterministic);
    o->deterministic_set = 1;
  } else if (cli_flag(a, "--quiet")) {
    tc->progress = 0;
  } else {
    return 0;
  }
  return 1;
}

// The model: the checkpoint's when resuming (and what of its learning-rate
// schedule the command line leaves out), else --model-config and the model
// flags over the defaults. CLI_OK or CLI_USAGE (printed).
static int resolve_model(train_opts *o, const model_flags *mf, moe_ctx *ctx,
                         moe_gpt_ckpt_info *info) {
  moe_train_config *tc = &o->tc;
  moe_gpt_config *m = &tc->model;
  memset(info, 0, sizeof *info);
  if (tc->resume) {
    // The model is the checkpoint's.
    if (moe_gpt_ckpt_read_info(ctx, tc->resume, info) != MOE_STATUS_OK) {
      cli_error("--resume: %s", moe_ctx_error(ctx));
      return CLI_USAGE;
    }
    *m = info->model;
    // So is the learning-rate schedule: what is not given is the checkpoint's
    // (moe_train_schedule_resolve refuses a different one later).
    if (info->has_schedule) {
      if (!o->lr_set) tc->optim.lr = info->schedule.lr;
      if (!o->min_lr_set) tc->optim.min_lr = info->schedule.min_lr;
      if (!o->warmup_set) tc->optim.warmup_steps = info->schedule.warmup_steps;
      if (!o->steps_set) tc->steps = info->schedule.total_steps;
      o->warmup_set = 1;  // not the fresh run's default
    }
    if (o->model_flags)
      fprintf(stderr,
              "moe: warning: --resume: model options are ignored (the checkpoint's "
              "model is used)\n");
  } else {
    if (o->model_config && moe_gpt_config_load_file(ctx, o->model_config, m) != MOE_STATUS_OK) {
      cli_error("--model-config: %s", moe_ctx_error(ctx));
      return CLI_USAGE;
    }
    if (mf->layers >= 0) m->n_layer = (int)mf->layers;
    if (mf->d_model >= 0) m->d_model = (int)mf->d_model;
    if (mf->heads >= 0) m->n_head = (int)mf->heads;
    if (mf->seq_len >= 0) m->seq_len = (int)mf->seq_len;
    if (mf->experts >= 0) m->moe.num_experts = (int)mf->experts;
    if (mf->topk >= 0) m->moe.top_k = (int)mf->topk;
    if (mf->expert_hidden >= 0) m->moe.hidden_dim = (int)mf->expert_hidden;
    if (mf->moe_every >= 0) m->moe_every = (int)mf->moe_every;
    if (mf->dense_hidden >= 0) m->dense_hidden = (int)mf->dense_hidden;
    if (!isnan(mf->capacity_factor)) m->moe.capacity_factor = mf->capacity_factor;
    if (!isnan(mf->aux_coef)) m->moe.aux_loss_coef = (float)mf->aux_coef;
  }
  if (moe_gpt_config_validate(ctx, m) != MOE_STATUS_OK) {
    cli_error("model: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  return CLI_OK;
}

// Prints where the run resumes and with which learning-rate schedule (rank 0:
// the others are silenced). CLI_OK, or CLI_USAGE when the schedule is refused.
static int print_resume(const train_opts *o, moe_ctx *ctx, const moe_gpt_ckpt_info *info) {
  const moe_train_config *tc = &o->tc;
  moe_train_schedule sch;
  if (moe_train_schedule_resolve(ctx, tc, info, &sch) != MOE_STATUS_OK) {
    cli_error("--resume %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  printf(
      "resume: %s at step %d (continuing at step %d); lr schedule %s: warm-up %d steps to lr "
      "%.4g, cosine decay to min_lr %.4g at step %d",
      tc->resume, info->step, info->step + 1,
      sch.from_checkpoint ? "kept from the checkpoint" : "of this run", sch.warmup_steps,
      (double)sch.lr, (double)sch.min_lr, sch.total_steps);
  if (sch.extended)
    printf("; steps %d..%d (past its end) at min_lr %.4g", sch.total_steps + 1, tc->steps,
           (double)sch.min_lr);
  if (!sch.from_checkpoint)
    printf(
        " (the checkpoint stores no schedule: written before libmoe stored it, content "
        "version %d; the schedule follows this run's --steps, --lr, --min-lr, --warmup, "
        "which must be the original run's for the same learning rates)",
        info->version);
  printf("\n");
  fflush(stdout);
  return CLI_OK;
}

// Options that only make sense together. CLI_OK or CLI_USAGE (printed).
static int check_combinations(train_opts *o) {
  moe_train_config *tc = &o->tc;
  if (o->plot && !tc->metrics) {
    cli_error("--plot needs --metrics FILE (the plot is drawn from it)");
    return CLI_USAGE;
  }
  if (tc->save_every > 0 && !tc->checkpoint) {
    cli_error("--save-every needs --checkpoint FILE");
    return CLI_USAGE;
  }
  if (tc->resume && (tc->metrics || tc->routing_trace)) tc->metrics_append = 1;
  if (any_auto(tc) && !o->profile_path) {
    cli_error("'auto' needs a calibrated profile: --profile FILE (from 'moe calibrate')");
    return CLI_USAGE;
  }
  if (tc->allow_lossy && strcmp(tc->par.compress, "auto") != 0) {
    cli_error("--allow-lossy only applies to --compress auto");
    return CLI_USAGE;
  }
  if (o->micro_op_set && !(tc->grad_bucket_mb > 0)) {
    cli_error("--micro-op-kb cuts the gradient buckets' sums: give --grad-bucket-mb > 0 too");
    return CLI_USAGE;
  }
  return CLI_OK;
}

static int parse(int argc, char **argv, train_opts *o, moe_ctx *ctx) {
  cli_args a;
  moe_train_config *tc = &o->tc;
  cli_args_init(&a, argc, argv, 2);
  model_flags mf = {-1, -1, -1, -1, -1, -1, -1, -1, -1, NAN, NAN};
  while (!cli_args_done(&a) && !a.bad) {
    if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
      usage(stdout);
      return -1;
    }
    if (parse_model_opt(&a, &mf, o) || parse_run_opt(&a, o) || parse_output_opt(&a, o)) continue;
    cli_error("train: unknown option '%s' (see moe train --help)", cli_args_peek(&a));
    return CLI_USAGE;
  }
  if (a.bad) return CLI_USAGE;
  o->model_flags = mf.layers >= 0 || mf.d_model >= 0 || mf.heads >= 0 || mf.seq_len >= 0 ||
                   mf.experts >= 0 || mf.topk >= 0 || mf.expert_hidden >= 0 || mf.moe_every >= 0 ||
                   mf.dense_hidden >= 0 || !isnan(mf.capacity_factor) || !isnan(mf.aux_coef) ||
                   o->model_config;
  if (moe_text_check_source(ctx, tc->data) != MOE_STATUS_OK) {
    cli_error("--data: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  moe_gpt_ckpt_info info;
  if (resolve_model(o, &mf, ctx, &info) != CLI_OK) return CLI_USAGE;
  if (!o->warmup_set && tc->optim.warmup_steps > tc->steps / 5)
    tc->optim.warmup_steps = tc->steps / 5;
  if (tc->resume && print_resume(o, ctx, &info) != CLI_OK) return CLI_USAGE;
  return check_combinations(o);
}

// Loads the profile (every rank) into *prof and hands it to the library; with
// 'auto' left, plans now (moe_train_plan) and prints the plan on rank 0 before
// training starts. CLI_OK, or CLI_USAGE with the message printed on rank 0
// (every rank agrees: the inputs are the same everywhere).
static int plan_train(moe_ctx *ctx, train_opts *o, int rank, int world, moe_profile *prof) {
  moe_train_config *tc = &o->tc;
  // (Parm reads only the profile's "parm" terms, of its own layout: the ranks must match)
  const int ep = tc->par.ep_size > 0 && !tc->parm_on ? tc->par.ep_size : world;
  const int rc = cli_profile_load_for(ctx, o->profile_path, world, ep, rank, prof);
  if (rc != CLI_OK) return rc;
  tc->profile = prof;
  if (!any_auto(tc)) return CLI_OK;  // moe_train_run predicts the fixed choice
  moe_plan plan;
  if (moe_train_plan(ctx, MPI_COMM_WORLD, tc, &plan) != MOE_STATUS_OK) {
    if (rank == 0) cli_error("--profile: %s", moe_ctx_error(ctx));
    return CLI_USAGE;
  }
  // Two predictions, each with its own label: the whole layer (what the
  // planner minimises: passes + the layer's work outside them), and its
  // passes alone (what the summary compares with the measured pass makespans).
  const double passes_ms = plan.predicted.pass_ms[0] + plan.predicted.pass_ms[1];
  if (rank == 0) {
    printf(
        "plan: a2a %s, compress %s, schedule %s, r=%d for T=%d tokens per rank, M=%d, H=%d, "
        "E=%d, K=%d, best of %d candidates: predicted per MoE layer, forward + backward: "
        "layer time %.2f ms = pass makespans %.2f ms + outside the passes (gate, routing) "
        "%.2f ms\n",
        plan.best.a2a, plan.best.compress, plan.best.schedule, plan.predicted.chunks,
        plan.best.cfg.tokens, plan.best.cfg.model_dim, plan.best.cfg.hidden_dim,
        plan.best.cfg.num_experts, plan.best.cfg.top_k, plan.candidates, plan.predicted.total_ms,
        passes_ms, plan.predicted.total_ms - passes_ms);
    fflush(stdout);
  }
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
    printf("  val loss:   %.4f -> %.4f nats (%.3f -> %.3f bits/byte) at steps %d -> %d%s\n",
           r->first_val_loss, r->final_val_loss, r->first_val_loss / ln2, r->final_val_loss / ln2,
           r->first_val_step, r->final_val_step,
           r->first_val_step == r->first_step - 1 && r->first_step > 1
               ? " (the first: the resumed checkpoint)"
               : "");
  printf("  median tokens/s %.0f, %s share %.1f%%, exposed %.1f%%, wall %.1f s\n", r->tokens_per_s,
         tc->parm_on ? "MoE collectives' (all-to-alls, MP and ESP)" : "all-to-all",
         100 * r->a2a_share, 100 * r->exposed_share, r->train_s);
  if (world > 1) {
    char how[128] = "one packed all-reduce after the backward";
    if (r->grad_buckets > 0)
      snprintf(how, sizeof how, "%d bucket%s of %g MiB during the backward, %s", r->grad_buckets,
               r->grad_buckets == 1 ? "" : "s", tc->grad_bucket_mb,
               tc->comm_priority == MOE_COMM_PRIORITY_LINA ? "lina priority" : "fifo");
    printf("  dense gradients' sum (%s): median %.2f ms per step not hidden\n", how,
           r->grad_wait_ms);
  }
  if (moe_train_packing_on(tc)) {
    printf("  expert packing (%s): EP %d at step %d, %d at step %d",
           tc->packing > 1 ? "fixed" : "lina", r->ep_first, r->first_step, r->ep_last,
           r->last_step);
    for (int i = 0; i < r->packing_n; i++) {
      const int ch = r->packing_log[i].ep_to != r->packing_log[i].ep_from;
      if (tc->packing > 1)
        printf("; after step %d: EP %d -> %d", r->packing_log[i].step, r->packing_log[i].ep_from,
               r->packing_log[i].ep_to);
      else if (ch)
        printf(
            "; after step %d: expert micro-op %.2f ms < all-to-all micro-op %.2f ms: EP %d -> %d",
            r->packing_log[i].step, r->packing_log[i].ffn_ms, r->packing_log[i].a2a_ms,
            r->packing_log[i].ep_from, r->packing_log[i].ep_to);
      else
        printf(
            "; after step %d: expert micro-op %.2f ms %s all-to-all micro-op %.2f ms: EP %d "
            "kept%s",
            r->packing_log[i].step, r->packing_log[i].ffn_ms,
            r->packing_log[i].ffn_ms < r->packing_log[i].a2a_ms ? "<" : ">=",
            r->packing_log[i].a2a_ms, r->packing_log[i].ep_from,
            r->packing_log[i].ffn_ms < r->packing_log[i].a2a_ms &&
                    r->packing_log[i].ep_from <= r->ep_min
                ? " (the smallest EP the all-to-all runs on)"
                : "");
    }
    printf("\n");
  }
  if (tc->balance.policy != MOE_BALANCE_NONE)
    printf(
        "  balance: %s (load window %d steps, re-plan every %d, %d copy slots per rank), mean "
        "over steps and MoE layers: balance ratio %.3f without copies, %.3f with; %.1f copies\n"
        "  balance overhead not hidden, ms per step: %.2f load, plan and Trans posting, %.2f "
        "Trans wait, %.2f Agg (%.1f%% of the step; block-wise scheduler %s)\n",
        moe_balance_policy_name(tc->balance.policy), tc->balance.window, tc->balance.replan_every,
        tc->balance.slots, r->balance_before, r->balance_after, r->balance_copies, r->balance_ms,
        r->trans_wait_ms, r->agg_ms, 100.0 * r->balance_exposed_share,
        tc->balance_blockwise ? "on" : "off");
  if (tc->par.topo_gate > 0 && tc->model.moe_every > 0) {  // a dense model has no gate
    char gate[32];
    moe_gate_spec_to_string(tc->par.topo_gate, gate, sizeof gate);
    printf(
        "  gate %s: %.1f%% of the choices re-selected to experts on their node (mean over "
        "steps and MoE layers)\n",
        gate, 100 * r->rerouted_share);
  }
  if (tc->router_bias_rate > 0 && tc->model.moe_every > 0)
    printf(
        "  router-bias update %g: expert load ratio (busiest expert over the mean, over the "
        "MoE layers) %.3f at step %d -> %.3f at step %d; largest |bias| %.4f\n",
        (double)tc->router_bias_rate, r->expert_load_ratio_first, r->first_step,
        r->expert_load_ratio_last, r->last_step, r->router_bias_max);
  if (tc->parm_on) {
    printf("  parm: MP %d x EP %d x ESP %d (DP %d), schedule %s%s", tc->mp, r->ep_first, tc->esp,
           world / (tc->mp * r->ep_first * tc->esp), moe_parm_schedule_name(r->parm_schedule),
           r->parm_schedule == MOE_PARM_S2 ? (tc->parm_saa ? " with SAA" : " without SAA") : "");
    if (tc->par.chunks > 1 && r->parm_schedule != MOE_PARM_BASELINE)
      printf(", EP&ESP pass in %d chunks (task schedule %s)", tc->par.chunks, tc->par.schedule);
    moe_compressor comp;
    if (r->parm_schedule != MOE_PARM_BASELINE &&
        moe_compressor_get(NULL, tc->par.compress, &comp) == MOE_STATUS_OK &&
        !moe_compressor_is_identity(&comp))
      printf(", its payloads compressed with %s%s", tc->par.compress,
             tc->par.compress_backward ? " (the backward's too)" : " (forward only)");
    if (tc->parm_auto && tc->mp > 1 && tc->model.moe_every > 0 && isnan(r->parm_t1_ms))
      printf(
          " (Algorithm 1 on alpha-beta terms %s: s2 %.2f ms of communication per MoE forward; "
          "s1 cannot run deterministically here: a data part's sequences do not divide over "
          "the MP ranks)",
          r->parm_terms_profile ? "from the profile" : "measured at the start", r->parm_t2_ms);
    else if (tc->parm_auto && tc->mp > 1 && tc->model.moe_every > 0)
      printf(
          " (Algorithm 1 on alpha-beta terms %s: s1 %.2f ms, s2 %.2f ms of communication per "
          "MoE forward)",
          r->parm_terms_profile ? "from the profile" : "measured at the start", r->parm_t1_ms,
          r->parm_t2_ms);
    printf("\n");
  }
  const moe_backend *be = moe_backend_current();
  const moe_precision prec = moe_precision_current();
  char prec_desc[64];
  snprintf(prec_desc, sizeof prec_desc, prec == MOE_PRECISION_BF16 ? "bf16 (%s kernel)" : "fp32",
           moe_gemm_bf16_isa());
  printf("  compute: backend %s (%s), %s, %d thread%s per rank\n", be->name, be->describe(),
         prec_desc, be->set_threads ? tc->threads : 1,
         (be->set_threads ? tc->threads : 1) == 1 ? "" : "s");
  char why[160];
  if (moe_train_bitwise_across_p(tc, world, why, sizeof why)) {
    printf(
        "  deterministic: on; bitwise the same losses and parameters on any rank count%s with "
        "%s a power of two\n",
        tc->parm_on ? " and Parm layout" : "", tc->parm_on ? "B/(P/MP)" : "B/P");
  } else {
    printf("  deterministic: %s; bits vary with the rank count (%s)\n",
           tc->deterministic ? "on" : "off", why);
  }
  // The memory computed from the config (rank 0's; baseline measured before
  // the model was allocated) next to the measured peak RSS: the expected
  // figure, a prediction of the peak, and the upper bound the memory check
  // used, which sizes the receive side for the most rows that can arrive.
  // Which rank receives the most depends on the routing: the max over ranks
  // is the comparison that holds for any rank.
  const double mib = 1 << 20, bound = moe_memory_need_total(&r->memory) / mib;
  const double expect = moe_memory_need_expected(&r->memory) / mib;
  const double bound_max = r->memory_max_total / mib, expect_max = r->memory_max_expected / mib;
  char by[512];
  moe_memory_need_format(&r->memory, by, sizeof by);
  printf(
      "  memory, rank 0: peak RSS %.1f MiB (max over ranks %.1f MiB); expected from the config "
      "%.1f MiB (max over ranks %.1f MiB); RSS/expected %.2f (max over ranks %.2f)\n",
      peak_rss_mib[0], peak_rss_mib[1], expect, expect_max, peak_rss_mib[0] / expect,
      peak_rss_mib[1] / expect_max);
  printf(
      "  memory bound, rank 0 (the memory check's figure: worst-case routing): %s (max over ranks "
      "%.1f MiB); RSS/bound %.2f (max over ranks %.2f); routing-dependent: %.1f MiB of it, none "
      "with balanced routing, half expected\n",
      by, bound_max, peak_rss_mib[0] / bound, peak_rss_mib[1] / bound_max,
      r->memory.skew_bytes / mib);
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
  o.tc.threads = 1;
  o.hang_timeout = CLI_HANG_TIMEOUT_DEFAULT;
  o.balance_slots = -1;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) {
    cli_error("out of memory");
    MPI_Finalize();
    return CLI_FAILED;
  }
  if (moe_launch_check(ctx) != MOE_STATUS_OK) {
    cli_error("train: %s", moe_ctx_error(ctx));
    moe_ctx_destroy(ctx);
    MPI_Finalize();
    return CLI_USAGE;
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
  if (o.tc.balance.policy != MOE_BALANCE_NONE) {
    // copy slots: --balance-slots, or as many as a rank's home experts (the
    // library checks the range against E - E/EP and says so on every rank)
    const int ep = o.tc.par.ep_size > 0 ? o.tc.par.ep_size : world;
    o.tc.balance.slots = o.balance_slots >= 0 ? o.balance_slots : o.tc.model.moe.num_experts / ep;
  }
  if (provided < MPI_THREAD_MULTIPLE && rank == 0)
    fprintf(stderr, "moe: warning: MPI provides thread level %d < MULTIPLE\n", provided);
  moe_watchdog *wd = NULL;
  if (cli_watchdog_start(ctx, o.hang_timeout, rank, &wd) != CLI_OK) {
    moe_ctx_destroy(ctx);
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  moe_profile prof;  // --profile: lives until moe_train_run returns
  if (o.profile_path) {
    rc = plan_train(ctx, &o, rank, world, &prof);
    if (rc != CLI_OK) {
      moe_watchdog_stop(wd);
      moe_ctx_destroy(ctx);
      MPI_Finalize();
      return rc;
    }
  }
  if (rank != 0) o.tc.progress = 0;
  moe_train_result res;
  const moe_status st = moe_train_run(ctx, MPI_COMM_WORLD, &o.tc, &res);
  double rss[2] = {(double)moe_peak_rss_bytes() / (1 << 20), 0};  // MiB: rank 0's, max over ranks
  MOE_MPI_WATCHED("all-reduce of the peak memory",
                  MPI_Allreduce(&rss[0], &rss[1], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  moe_watchdog_stop(wd);
  if (st != MOE_STATUS_OK) {
    if (rank == 0) cli_error("train: %s", moe_ctx_error(ctx));
    rc = st == MOE_STATUS_INVALID_ARG || st == MOE_STATUS_BAD_FORMAT || st == MOE_STATUS_UNSUPPORTED
             ? CLI_USAGE
             : CLI_FAILED;
  } else if (rank == 0) {
    print_summary(&o.tc, &res, world, rss);
    if (!isnan(res.predicted_pass_ms) && !isnan(res.moe_pass_ms)) {
      printf(
          "  pass makespans per MoE layer (forward + backward): measured %.2f ms (median, "
          "rank 0), predicted %.2f ms (%s), error %+.1f%%\n",
          res.moe_pass_ms, res.predicted_pass_ms, o.profile_path,
          100.0 * (res.predicted_pass_ms - res.moe_pass_ms) / res.moe_pass_ms);
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
