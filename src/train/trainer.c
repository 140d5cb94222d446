// moe_train_run: MoE-GPT training under MPI (data parallelism x expert
// parallelism), the main job of libmoe.
//
// One step (every rank, collective):
//   1. the rank's B/P sequences of the step's global batch (moe_batch_train:
//      the same global batch for every P);
//   2. forward and backward; the MoE blocks are moe_ep_layer's (task engine:
//      schedule, chunks, all-to-all, compression), which sum the gate's
//      gradient over the world and each expert's over its DP replicas;
//   3. the dense gradients summed over the world (one packed MPI_Allreduce);
//   4. the global gradient norm (dense and gate counted once, experts summed
//      over the EP group), clipping, AdamW with warm-up + cosine decay;
//   5. global loss (MPI_Allreduce of the CE sum), progress, metrics,
//      validation, checkpoint, trace.
// The loss is the mean over the GLOBAL batch: each rank divides its CE sum by
// B*S, so summed gradients are the global batch's.
//
// Not here: the model (src/model/gpt.c), the file format (checkpoint.c), the
// data (data.c), the progress line and metrics (progress.c).
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/checkpoint.h"
#include "moe/compress.h"
#include "moe/data.h"
#include "moe/gpt_io.h"
#include "moe/measure_mpi.h"
#include "moe/progress.h"
#include "train/train_internal.h"

void moe_train_config_default(moe_train_config *tc) {
  memset(tc, 0, sizeof *tc);
  moe_gpt_config_default(&tc->model);
  moe_optim_config_default(&tc->optim);
  moe_parallel_config_default(&tc->par);
  tc->par.ep_size = 0;
  moe_balance_config_default(&tc->balance, MOE_BALANCE_NONE, tc->model.d_model,
                             tc->model.moe.hidden_dim, 0);
  tc->balance.cost.flops_per_s = 0;  // measured on the first step
  tc->balance_blockwise = 1;
  tc->batch = 16;
  tc->steps = 200;
  tc->seed = 1;
  tc->val_fraction = 0.1;
  tc->eval_every = 50;
  tc->eval_batches = 4;
  tc->progress = 1;
  tc->progress_tty = -1;
  tc->log_every = 1;
  tc->deterministic = 1;
  tc->threads = 1;
  tc->micro_op_kb = 256;
  tc->comm_priority = MOE_COMM_PRIORITY_FIFO;
  tc->packing_start = 10;
  tc->packing_every = 4;
  tc->mp = tc->esp = 1;
  tc->parm_schedule = MOE_PARM_S2;
  tc->parm_saa = 1;
}

int moe_train_bitwise_across_p(const moe_train_config *tc, int world, char *why, size_t why_size) {
  char buf[160] = "";
  // Parm: MP peers hold the same sequences; its layer's chains make any EP and
  // DP bitwise (docs/parm.md "Deterministic mode")
  const int parts = tc->parm_on && tc->mp > 0 ? world / tc->mp : world;
  const int bl = parts > 0 && tc->batch % parts == 0 ? tc->batch / parts : 0;
  moe_compressor comp;
  const int lossless =
      moe_compressor_get(NULL, tc->par.compress, &comp) == MOE_STATUS_OK && comp.lossless;
  if (!tc->deterministic) {
    snprintf(buf, sizeof buf, "deterministic mode is off");
  } else if (bl < 1 || (bl & (bl - 1)) != 0) {
    if (parts != world)  // Parm: the data parts, P / MP
      snprintf(buf, sizeof buf, "B/(P/MP) = %d/%d is not a power of two", tc->batch, parts);
    else
      snprintf(buf, sizeof buf, "B/P = %d/%d is not a power of two", tc->batch, parts);
  } else if (!tc->parm_on && tc->model.moe_every > 0 && tc->par.ep_size > 0 &&
             tc->par.ep_size != world) {
    snprintf(buf, sizeof buf, "EP %d is not the rank count %d", tc->par.ep_size, world);
  } else if (tc->par.chunks != 1 ||
             strcmp(tc->par.schedule, "smart") == 0) {  // catalogue: cuts passes by peer group
    snprintf(buf, sizeof buf, "a pass is cut into chunks (chunks %d, schedule %s)", tc->par.chunks,
             tc->par.schedule);
  } else if (!lossless) {
    snprintf(buf, sizeof buf, "compressor %s is lossy (or auto)", tc->par.compress);
  } else if (tc->model.moe_every > 0 && tc->balance.policy != MOE_BALANCE_NONE) {
    snprintf(buf, sizeof buf, "load balancing (%s) sums expert gradients over copies",
             moe_balance_policy_name(tc->balance.policy)
                 ? moe_balance_policy_name(tc->balance.policy)
                 : "?");
  } else if (tc->model.moe_every > 0 && moe_train_packing_on(tc)) {
    snprintf(buf, sizeof buf, "expert packing brings EP below the rank count");
  } else if (tc->model.moe_every > 0 && tc->par.topo_gate > 0) {
    snprintf(buf, sizeof buf, "the topology-aware gate routes by node (the layout changes it)");
  } else if (tc->model.moe_every > 0 && tc->model.moe.capacity_factor > 0) {
    snprintf(buf, sizeof buf, "capacity factor %g drops tokens per source rank",
             tc->model.moe.capacity_factor);
  }
  if (why && why_size) snprintf(why, why_size, "%s", buf);
  return buf[0] == 0;
}

// ---- the learning-rate schedule ----------------------------------------------------------------

moe_status moe_train_schedule_resolve(moe_ctx *ctx, const moe_train_config *tc,
                                      const moe_gpt_ckpt_info *info, moe_train_schedule *out) {
  moe_status st = MOE_STATUS_OK;
  memset(out, 0, sizeof *out);
  out->resumed_step = info ? info->step : 0;
  if (!info || !info->has_schedule) {
    out->lr = tc->optim.lr;
    out->min_lr = tc->optim.min_lr;
    out->warmup_steps = tc->optim.warmup_steps;
    out->total_steps = tc->steps;
    return st;
  }
  const moe_gpt_ckpt_schedule *k = &info->schedule;
  const char *path = tc->resume ? tc->resume : "the checkpoint";
  char stored[200];
  snprintf(stored, sizeof stored, "warm-up %d steps to lr %g, cosine decay to min_lr %g at step %d",
           k->warmup_steps, (double)k->lr, (double)k->min_lr, k->total_steps);
  MOE_FAIL_IF(ctx, tc->optim.lr != k->lr, MOE_STATUS_INVALID_ARG,
              "%s: the learning-rate schedule is kept on resume (%s); this run asks for lr %g: "
              "leave --lr out or give the stored value",
              path, stored, (double)tc->optim.lr);
  MOE_FAIL_IF(ctx, tc->optim.min_lr != k->min_lr, MOE_STATUS_INVALID_ARG,
              "%s: the learning-rate schedule is kept on resume (%s); this run asks for min_lr "
              "%g: leave --min-lr out or give the stored value",
              path, stored, (double)tc->optim.min_lr);
  MOE_FAIL_IF(ctx, tc->optim.warmup_steps != k->warmup_steps, MOE_STATUS_INVALID_ARG,
              "%s: the learning-rate schedule is kept on resume (%s); this run asks for warmup "
              "%d: leave --warmup out or give the stored value",
              path, stored, tc->optim.warmup_steps);
  MOE_FAIL_IF(ctx, tc->steps < k->total_steps, MOE_STATUS_INVALID_ARG,
              "%s: the learning-rate schedule is kept on resume (%s); --steps %d would end it "
              "early: use --stop-at %d to stop at step %d, or steps >= %d (steps past %d run at "
              "min_lr)",
              path, stored, tc->steps, tc->steps, tc->steps, k->total_steps, k->total_steps);
  out->lr = k->lr;
  out->min_lr = k->min_lr;
  out->warmup_steps = k->warmup_steps;
  out->total_steps = k->total_steps;
  out->from_checkpoint = 1;
  out->extended = tc->steps > k->total_steps;
done:
  return st;
}

// ---- state of one run ------------------------------------------------------------------------

typedef struct {
  moe_ctx *ctx;
  MPI_Comm world;
  int rank, size;
  const moe_train_config *tc;
  int bl;  // B / P: this rank's sequences
  int s;   // S
  moe_text *text;
  moe_text_span train, val;
  int val_batches;  // global validation batches actually used
  moe_train_ep_user *user;
  moe_gpt *model;
  moe_optim *opt;
  int32_t *tokens, *targets;  // (bl, S)
  float *dense_buf;           // packed dense gradients (without buckets)
  moe_fixed_sum dense_fixed;  // deterministic: their fixed-order all-reduce's receive buffer
  size_t dense_n;
  // tc->grad_bucket_mb > 0 (several ranks): the dense gradients' buckets, and
  // for each event of the model's grad hook its tensors' range in the
  // reducer's order: [block + 1][0] the block's ffn.* (ready 2), [block + 1][1]
  // its other tensors (ready 1); block -1 is wte/wpe, n_layer lnf
  moe_grad_reducer *grad_red;
  int grad_first[MOE_GPT_MAX_LAYERS + 2][2], grad_count[MOE_GPT_MAX_LAYERS + 2][2];
  MPI_Comm ep_comm;  // the EP group of this rank (MPI_COMM_NULL without MoE blocks)
  int in_group0;     // 1 when world rank 0 is in this rank's EP group
  int ep;            // the EP size now (expert packing changes it)
  int ep_base;       // the EP size the run was configured with
  int ep_min;        // the smallest EP expert packing may reach (its layouts checked at setup)
  double pack_ffn, pack_a2a;  // Lina's packing rule: the step's micro-op times (ms)
  moe_progress *progress;
  moe_metrics *metrics;
  moe_routing_trace *routing;  // tc->routing_trace, NULL: none
  // load balancing (tc->balance): one balancer per MoE block, made on the
  // block's first step (its rates measured then), and the load and plan tables
  moe_balancer *bal[MOE_GPT_MAX_LAYERS];
  int64_t *bal_load;              // (EP, E)
  uint8_t *bal_replica;           // (E, EP)
  double *bias_load;              // (E): the router-bias update's load per expert
  moe_gpt_ckpt_info resume_info;  // the checkpoint resumed from (tc->resume)
  moe_train_schedule schedule;    // the learning-rate schedule used
  // Parm (tc->parm_on): the MP group, the ranks with this rank's mp (one copy
  // of the global batch: the loss and dense gradient sums), the ranks with dp
  // 0 (together they hold every slice: checkpoints), the first MoE block's
  // EP x ESP group (the experts' norm); the data part this rank trains on and
  // the parts' count (without Parm: its rank and the world size)
  MPI_Comm mp_comm, data_comm, group0_comm, parm_a2a;
  int part, parts;
  moe_train_parm_user *parm_user;
  moe_parm_schedule parm_pick;  // the schedule run (Algorithm 1's with parm_auto)
  double parm_t1_ms, parm_t2_ms;
  int parm_terms_profile;     // auto's terms came from tc->profile (else measured at the start)
  moe_chain_state tp_chains;  // deterministic MP: the model's chains' requests (mp_chain)
  moe_memory_need need;       // this rank's memory estimate (baseline included)
  double need_max[2];         // the largest total and expected figure over the ranks
} run_state;

// The ranks whose sums make the global batch's: Parm's data group (MP peers
// hold the same sequences), else the world.
static MPI_Comm sum_comm(const run_state *r) {
  return r->data_comm != MPI_COMM_NULL && r->data_comm != 0 ? r->data_comm : r->world;
}

// MPI counts are int: large arrays move in pieces.
#define MPI_PIECE ((size_t)1 << 30)

// Every rank contributes its status; all fail together (no hang).
static moe_status agree(run_state *r, moe_status local, const char *what) {
  return moe_comm_agree(r->ctx, r->world, local, what);
}

// ---- checks ----------------------------------------------------------------------------------

moe_status moe_train_backend(moe_ctx *ctx, const moe_train_config *tc, const moe_backend **out) {
  moe_status st = MOE_STATUS_OK;
  const char *name = tc->backend         ? tc->backend
                     : tc->deterministic ? "fixed"      // catalogue: the default
                                         : "openblas";  // catalogue: the default when off
  MOE_TRY(moe_backend_find(ctx, name, out));
  MOE_FAIL_IF(ctx, tc->deterministic && !(*out)->batch_invariant, MOE_STATUS_INVALID_ARG,
              "deterministic mode needs a batch-invariant compute backend: '%s' is not "
              "(use fixed, or turn deterministic mode off)",
              name);
done:
  return st;
}

// Parm's layout and what it does not combine with (tc->parm_on); *ep its EP.
static moe_status parm_checks(moe_ctx *ctx, const moe_train_config *tc, int size, int *ep) {
  moe_status st = MOE_STATUS_OK;
  const int mp = tc->mp, esp = tc->esp;
  MOE_FAIL_IF(ctx, mp < 1 || esp < 1 || (long long)mp * esp > size || size % (mp * esp) != 0,
              MOE_STATUS_INVALID_ARG,
              "Parm: MP (%d) x ESP (%d) must divide the number of ranks (%d), each at least 1", mp,
              esp, size);
  *ep = tc->par.ep_size > 0 ? tc->par.ep_size : size / (mp * esp);
  MOE_FAIL_IF(ctx, (long long)mp * *ep * esp > size || size % (mp * *ep * esp) != 0,
              MOE_STATUS_INVALID_ARG,
              "Parm: MP x EP x ESP = %d x %d x %d must divide the number of ranks (%d)", mp, *ep,
              esp, size);
  MOE_FAIL_IF(ctx, tc->batch % (size / mp) != 0, MOE_STATUS_INVALID_ARG,
              "batch (%d sequences) must be divisible by the data parts (%d ranks / MP %d = %d)",
              tc->batch, size, mp, size / mp);
  // s1 in deterministic mode cuts a data part's sequences over its MP ranks
  MOE_FAIL_IF(ctx,
              tc->deterministic && !tc->parm_auto && tc->parm_schedule == MOE_PARM_S1 &&
                  tc->model.moe_every > 0 && (tc->batch / (size / mp)) % mp != 0,
              MOE_STATUS_INVALID_ARG,
              "Parm s1 in deterministic mode cuts each data part's %d sequences over the %d MP "
              "ranks: the batch (%d) must be a multiple of %d (data parts x MP); or use s2 or "
              "baseline, or --deterministic off",
              tc->batch / (size / mp), mp, tc->batch, (size / mp) * mp);
  MOE_FAIL_IF(ctx, tc->model.moe_every > 0 && tc->model.moe.hidden_dim % esp != 0,
              MOE_STATUS_INVALID_ARG,
              "Parm: the expert hidden size (%d) must be divisible by ESP (%d)",
              tc->model.moe.hidden_dim, esp);
  MOE_FAIL_IF(ctx,
              (int)tc->parm_schedule < 0 || (int)tc->parm_schedule >= MOE_PARM_SCHEDULES ||
                  (tc->parm_saa != 0 && tc->parm_saa != 1),
              MOE_STATUS_INVALID_ARG, "Parm: schedule %d or SAA %d out of range",
              (int)tc->parm_schedule, tc->parm_saa);
  // what the Parm layer and the tensor-parallel model do not (yet) combine with
  const moe_schedule_algo *ts = NULL;
  const int peer_groups = moe_schedule_algo_find(NULL, tc->par.schedule, &ts) == MOE_STATUS_OK &&
                          ts->chunking != MOE_CHUNK_ROWS;
  const char *no = tc->balance.policy != MOE_BALANCE_NONE ? "load balancing (--balance)"
                   : moe_train_packing_on(tc)             ? "expert packing (--expert-packing)"
                   : tc->grad_bucket_mb > 0               ? "gradient buckets (--grad-bucket-mb)"
                   : tc->comm_priority != MOE_COMM_PRIORITY_FIFO
                       ? "Lina's priority (--comm-priority)"
                   : tc->par.topo_gate > 0                 ? "the topology-aware gate (--gate)"
                   : tc->router_bias_rate > 0              ? "the router-bias update"
                   : tc->routing_trace                     ? "routing traces (--routing-trace)"
                   : tc->trace                             ? "step traces (--trace)"
                   : strcmp(tc->par.compress, "auto") == 0 ? "--compress auto"
                   : strcmp(tc->par.a2a, "auto") == 0      ? "--a2a auto"
                   : tc->par.chunks == 0                   ? "--chunks auto"
                   : strcmp(tc->par.schedule, "auto") == 0 ? "--schedule auto"
                   : peer_groups ? "a task schedule whose chunks are peer groups (--schedule)"
                                 : NULL;
  MOE_FAIL_IF(ctx, no != NULL, MOE_STATUS_INVALID_ARG,
              "Parm (--mp / --esp / --parm) does not combine with %s yet (docs/parm.md)", no);
  // s1 / s2's chunked EP&ESP pass keeps no fixed order of the expert gradients' sums
  MOE_FAIL_IF(ctx, tc->par.chunks > 1 && tc->deterministic, MOE_STATUS_INVALID_ARG,
              "Parm's chunked pass (--chunks %d) does not run in deterministic mode; add "
              "--deterministic off, or use --chunks 1",
              tc->par.chunks);
  {
    moe_compressor comp;
    MOE_TRY(moe_compressor_get(ctx, tc->par.compress, &comp));
    MOE_FAIL_IF(ctx, !moe_compressor_is_identity(&comp) && tc->deterministic,
                MOE_STATUS_INVALID_ARG,
                "Parm's compressed pass (--compress %s) does not run in deterministic mode; add "
                "--deterministic off",
                tc->par.compress);
  }
done:
  return st;
}

static moe_status check_config(moe_ctx *ctx, const moe_train_config *tc, int size, int *ep) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_gpt_config_validate(ctx, &tc->model));
  MOE_FAIL_IF(ctx, tc->batch < 1 || tc->batch > (1 << 20), MOE_STATUS_INVALID_ARG,
              "batch %d out of range [1, %d]", tc->batch, 1 << 20);
  if (tc->parm_on) {
    MOE_TRY(parm_checks(ctx, tc, size, ep));
  } else {
    MOE_FAIL_IF(ctx, tc->batch % size != 0, MOE_STATUS_INVALID_ARG,
                "batch (%d sequences) must be divisible by the number of ranks (%d)", tc->batch,
                size);
  }
  MOE_FAIL_IF(ctx, tc->steps < 1, MOE_STATUS_INVALID_ARG, "steps %d must be >= 1", tc->steps);
  MOE_FAIL_IF(ctx, tc->stop_step < 0, MOE_STATUS_INVALID_ARG, "stop step %d must be >= 0",
              tc->stop_step);
  MOE_FAIL_IF(ctx, !(tc->val_fraction > 0 && tc->val_fraction <= 0.5), MOE_STATUS_INVALID_ARG,
              "val fraction %g out of range (0, 0.5]", tc->val_fraction);
  MOE_FAIL_IF(ctx, tc->eval_every < 0 || tc->save_every < 0 || tc->eval_batches < 0,
              MOE_STATUS_INVALID_ARG, "eval-every, save-every and eval-batches must be >= 0");
  MOE_FAIL_IF(ctx, tc->log_every < 1, MOE_STATUS_INVALID_ARG, "log-every %d must be >= 1",
              tc->log_every);
  MOE_FAIL_IF(ctx, tc->save_every > 0 && !tc->checkpoint, MOE_STATUS_INVALID_ARG,
              "save-every needs a checkpoint path");
  MOE_FAIL_IF(ctx, !(tc->optim.lr > 0), MOE_STATUS_INVALID_ARG, "lr (%g) must be > 0",
              (double)tc->optim.lr);
  moe_optim_config oc = tc->optim;
  oc.total_steps = tc->steps;  // the run's length is the schedule's
  MOE_TRY(moe_optim_config_validate(ctx, &oc));
  const moe_backend *be = NULL;
  MOE_TRY(moe_train_backend(ctx, tc, &be));
  MOE_TRY(moe_compute_check(ctx, be, tc->precision));
  MOE_FAIL_IF(ctx, tc->threads < 0 || tc->threads > 256, MOE_STATUS_INVALID_ARG,
              "compute threads %d out of range [1, 256] (0: 1)", tc->threads);
  if (!tc->parm_on) *ep = tc->par.ep_size > 0 ? tc->par.ep_size : size;
  MOE_FAIL_IF(ctx, *ep > size || size % *ep != 0, MOE_STATUS_INVALID_ARG,
              "EP size %d must divide the number of ranks (%d)", *ep, size);
  if (tc->model.moe_every > 0)
    MOE_FAIL_IF(ctx, tc->model.moe.num_experts % *ep != 0, MOE_STATUS_INVALID_ARG,
                "experts (%d) must be divisible by the EP size (%d)", tc->model.moe.num_experts,
                *ep);
  {  // what acts on MoE layers only: refused on a dense model, not silently a no-op
    const char *moe_only =
        tc->balance.policy != MOE_BALANCE_NONE ? "load balancing (--balance)"
        : tc->routing_trace                    ? "a routing trace (--routing-trace)"
        : tc->router_bias_rate > 0             ? "the router-bias update"
        : tc->par.topo_gate > 0                ? "the topology-aware gate (--gate)"
        : moe_train_packing_on(tc)             ? "expert packing (--expert-packing)"
        : tc->parm_on && tc->esp > 1           ? "expert sharding (--esp)"
        : tc->parm_on && (tc->parm_auto || tc->parm_schedule != MOE_PARM_S2 || !tc->parm_saa)
            ? "a Parm schedule (--parm, --saa; --mp alone splits the attention)"
            : NULL;
    MOE_FAIL_IF(ctx, tc->model.moe_every <= 0 && moe_only, MOE_STATUS_INVALID_ARG,
                "%s needs MoE layers; this model has none (moe_every 0)", moe_only);
  }
  if (tc->balance.policy != MOE_BALANCE_NONE && tc->model.moe_every > 0) {
    const int E = tc->model.moe.num_experts;
    MOE_FAIL_IF(ctx, !moe_balance_policy_name(tc->balance.policy), MOE_STATUS_INVALID_ARG,
                "balance policy %d is unknown (valid: %s)", tc->balance.policy,
                moe_balance_policy_names());
    MOE_FAIL_IF(ctx, *ep < 2, MOE_STATUS_INVALID_ARG,
                "load balancing (%s) needs an EP size of at least 2 (got %d)",
                moe_balance_policy_name(tc->balance.policy), *ep);
    MOE_FAIL_IF(ctx, tc->balance.slots < 0 || tc->balance.slots > E - E / *ep,
                MOE_STATUS_INVALID_ARG,
                "balance slots (%d) must be in [0, %d] (the experts an EP rank does not hold)",
                tc->balance.slots, E - E / *ep);
    MOE_FAIL_IF(ctx, tc->balance.replan_every < 1 || tc->balance.window < 1, MOE_STATUS_INVALID_ARG,
                "balance replan_every (%d) and window (%d) must be at least 1",
                tc->balance.replan_every, tc->balance.window);
  }
  MOE_FAIL_IF(ctx, !(tc->grad_bucket_mb >= 0 && tc->grad_bucket_mb <= 4096), MOE_STATUS_INVALID_ARG,
              "grad_bucket_mb (%g) must be in [0, 4096] MiB", tc->grad_bucket_mb);
  MOE_FAIL_IF(ctx, !(tc->micro_op_kb >= 0 && tc->micro_op_kb <= 1048576), MOE_STATUS_INVALID_ARG,
              "micro_op_kb (%g) must be in [0, 1048576] KiB", tc->micro_op_kb);
  MOE_FAIL_IF(ctx, tc->comm_priority == MOE_COMM_PRIORITY_LINA && !(tc->grad_bucket_mb > 0),
              MOE_STATUS_INVALID_ARG,
              "Lina's priority (--comm-priority lina) orders the gradient buckets' all-reduce "
              "micro-ops: give --grad-bucket-mb > 0 too");
  MOE_FAIL_IF(
      ctx,
      tc->comm_priority != MOE_COMM_PRIORITY_FIFO && tc->comm_priority != MOE_COMM_PRIORITY_LINA,
      MOE_STATUS_INVALID_ARG, "comm_priority (%d) must be fifo (0) or lina (1)",
      (int)tc->comm_priority);
  MOE_FAIL_IF(ctx, tc->packing < MOE_TRAIN_PACKING_LINA || tc->packing > 1024,
              MOE_STATUS_INVALID_ARG, "expert packing %d must be lina (%d), off (0) or 1..1024",
              tc->packing, MOE_TRAIN_PACKING_LINA);
  MOE_FAIL_IF(ctx, tc->packing > 1 && *ep % tc->packing != 0, MOE_STATUS_INVALID_ARG,
              "expert packing %d must divide the EP size (%d)", tc->packing, *ep);
  MOE_FAIL_IF(ctx, moe_train_packing_on(tc) && tc->balance.policy != MOE_BALANCE_NONE,
              MOE_STATUS_INVALID_ARG,
              "expert packing and load balancing (%s) cannot be combined (both move experts)",
              moe_balance_policy_name(tc->balance.policy));
  MOE_FAIL_IF(ctx, tc->packing_start < 1 || tc->packing_every < 1, MOE_STATUS_INVALID_ARG,
              "packing start (%d) and packing interval (%d) must be at least 1", tc->packing_start,
              tc->packing_every);
  MOE_FAIL_IF(ctx, tc->packing == MOE_TRAIN_PACKING_LINA && tc->packing_start < 2,
              MOE_STATUS_INVALID_ARG,
              "Lina's packing decides from a step's measured micro-ops: its packing start (%d) "
              "must be at least 2",
              tc->packing_start);
  MOE_FAIL_IF(ctx, !(tc->router_bias_rate >= 0 && tc->router_bias_rate <= 1),
              MOE_STATUS_INVALID_ARG, "router-bias update rate %g out of range [0, 1] (0: off)",
              (double)tc->router_bias_rate);
done:
  return st;
}

// ---- memory bound ----------------------------------------------------------------------------

moe_status moe_train_memory(moe_ctx *ctx, const moe_train_config *tc, int world_size,
                            moe_memory_need *out) {
  moe_status st = MOE_STATUS_OK;
  int ep = 1;
  MOE_FAIL_IF(ctx, !tc || !out || world_size < 1, MOE_STATUS_INVALID_ARG,
              "tc and out must be given, world_size >= 1");
  memset(out, 0, sizeof *out);
  MOE_TRY(check_config(ctx, tc, world_size, &ep));
  if (tc->parm_on) {  // the Parm layer per MoE block, the tensor-parallel model
    const int bl = tc->batch / (world_size / tc->mp), S = tc->model.seq_len;
    moe_parm_config pc;
    moe_parm_config_default(&pc);
    pc.mp = tc->mp;
    pc.ep = ep;
    pc.esp = tc->esp;
    snprintf(pc.a2a, sizeof pc.a2a, "%s", tc->par.a2a);
    pc.ranks_per_node = tc->par.ranks_per_node;
    pc.chunks = tc->par.chunks;  // as parm_model sets them
    snprintf(pc.task_schedule, sizeof pc.task_schedule, "%s", tc->par.schedule);
    snprintf(pc.compress, sizeof pc.compress, "%s", tc->par.compress);
    pc.compress_backward = tc->par.compress_backward;
    pc.slice_tokens = tc->deterministic ? S : 0;
    moe_layer_config lc = tc->model.moe;  // as moe_gpt_create passes it to the backend
    lc.model_dim = tc->model.d_model;
    lc.tokens = bl * S;
    moe_memory_need block;
    memset(&block, 0, sizeof block);
    if (tc->model.moe_every > 0) MOE_TRY(moe_parm_layer_memory(ctx, &lc, &pc, world_size, &block));
    MOE_TRY(moe_gpt_memory_tp(ctx, &tc->model, bl, ep, tc->mp, &block, 1, out));
    int n_moe = 0;
    for (int l = 0; l < tc->model.n_layer; l++) n_moe += moe_gpt_block_is_moe(&tc->model, l);
    // the user structs, the token buffers, the packed dense gradients
    out->bytes[MOE_MEM_WORKSPACE] +=
        (double)(moe_align64(sizeof(moe_train_ep_user)) + moe_align64(sizeof(moe_train_parm_user)) +
                 2 * moe_align64((size_t)bl * S * sizeof(int32_t)));
    out->bytes[MOE_MEM_GRADS] += out->bytes[MOE_MEM_PARAMS] - n_moe * block.bytes[MOE_MEM_PARAMS];
    goto done;
  }
  // expert packing: the most experts per rank it can reach (a fixed degree, or
  // Lina's halving while even)
  const int packs = moe_train_packing_on(tc) && tc->model.moe_every > 0;
  if (tc->packing > 1) ep /= tc->packing;
  if (packs && tc->packing == MOE_TRAIN_PACKING_LINA)
    while (ep % 2 == 0) ep /= 2;
  {
    const int bl = tc->batch / world_size, S = tc->model.seq_len;
    moe_parallel_config pc = tc->par;
    pc.ep_size = ep;
    pc.slice_tokens = tc->deterministic ? S : 0;  // as setup() sets it
    pc.copy_slots = tc->balance.policy != MOE_BALANCE_NONE ? tc->balance.slots : 0;
    pc.defer_agg = pc.copy_slots > 0;     // as setup() sets it
    moe_layer_config lc = tc->model.moe;  // as moe_gpt_create passes it to the backend
    lc.model_dim = tc->model.d_model;
    lc.tokens = bl * S;
    moe_memory_need block;
    memset(&block, 0, sizeof block);
    if (tc->model.moe_every > 0) {
      MOE_TRY(moe_ep_layer_memory(ctx, &lc, &pc, world_size, pc.ranks_per_node, &block));
      block.bytes[MOE_MEM_WORKSPACE] += (double)moe_train_ep_block_bytes_();
    }
    MOE_TRY(moe_gpt_memory(ctx, &tc->model, bl, ep, &block, 1, out));
    // setup(): the run's user struct, the token buffers, the packed dense gradients
    // (the dense gradient elements = the dense parameters' without padding: bounded by them)
    out->bytes[MOE_MEM_WORKSPACE] += (double)(moe_align64(sizeof(moe_train_ep_user)) +
                                              2 * moe_align64((size_t)bl * S * sizeof(int32_t)));
    if (tc->deterministic)  // the per-sequence sums' buffers
      out->bytes[MOE_MEM_WORKSPACE] += (double)moe_gpt_deterministic_bytes(&tc->model, bl);
    int n_moe = 0;
    for (int l = 0; l < tc->model.n_layer; l++) n_moe += moe_gpt_block_is_moe(&tc->model, l);
    const double dense = out->bytes[MOE_MEM_PARAMS] - n_moe * block.bytes[MOE_MEM_PARAMS];
    // the packed dense gradients, and (deterministic, several ranks) the fixed-order
    // all-reduce's receive buffer for them (dense_fixed)
    out->bytes[MOE_MEM_GRADS] += (tc->deterministic && world_size > 1 ? 2 : 1) * dense;
    // packing holds a copy of every parameter and moment, the experts whole
    if (packs)
      out->bytes[MOE_MEM_WORKSPACE] += 3.0 * (dense + n_moe * block.bytes[MOE_MEM_PARAMS] * ep);
  }
done:
  return st;
}

// ---- gradients -------------------------------------------------------------------------------

// The model's grad hook: the event's tensors go to the buckets (each mark
// also progresses the sums already started).
static moe_status grad_ready(void *user, int block, int ready) {
  moe_status st = MOE_STATUS_OK;
  run_state *r = user;
  const int ev = block + 1;
  if (ready == 3 || ready == 4) moe_grad_reducer_hold(r->grad_red, ready == 3);
  if (ready != 1 && ready != 2) return moe_grad_reducer_progress(r->grad_red, r->ctx, NULL);
  const int part = ready == 2 ? 0 : 1;
  for (int k = 0; k < r->grad_count[ev][part]; k++)
    MOE_TRY(moe_grad_reducer_ready(r->grad_red, r->ctx, r->grad_first[ev][part] + k));
done:
  return st;
}

// The MoE layers' comm streams progress the buckets while they would wait
// (for expert compute: Lina's gaps).
static moe_status grad_background(void *arg, moe_ctx *ctx, moe_task_state *state) {
  int all = 1;
  const moe_status st = moe_grad_reducer_progress_gap(arg, ctx, &all);
  *state = all ? MOE_TASK_DONE : MOE_TASK_PENDING;
  return st;
}

// Every MoE layer's comm stream progresses test(arg) while it would wait (NULL: stops).
static void set_layers_background(run_state *r, moe_task_test_fn test, void *arg) {
  for (int b = 0; b < r->tc->model.n_layer; b++)
    if (r->user->impl[b])
      moe_ep_layer_set_background_extra(moe_train_ep_layer(r->user->impl[b], NULL, NULL), test,
                                        arg);
}

// The buckets of tc->grad_bucket_mb: the dense tensors in the order the
// backward finishes them (lnf; the blocks from the last, each's ffn.* before
// its attention and layernorms; then wte and wpe).
static moe_status grad_buckets_create(run_state *r) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const int n = moe_gpt_num_params(r->model), L = r->tc->model.n_layer;
  float **grads = moe_calloc((size_t)n, sizeof *grads);
  size_t *numel = moe_calloc((size_t)n, sizeof *numel);
  MOE_TRY(agree(r,
                grads && numel ? MOE_STATUS_OK
                               : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                              "gradient buckets: out of memory"),
                "gradient buckets"));
  int k = 0;
  for (int ev = L + 1; ev >= 0; ev--) {
    for (int part = 0; part < 2; part++) {  // a block's ffn.* are final before the rest
      r->grad_first[ev][part] = k;
      for (int i = 0; i < n; i++) {
        const moe_gpt_param p = moe_gpt_get_param(r->model, i);
        if (p.kind != MOE_GPT_PARAM_DENSE) continue;
        const int lnf = p.block < 0 && strncmp(p.name, "lnf.", 4) == 0;
        const char *dot = strchr(p.name, '.');
        const int ffn = p.block >= 0 && dot && strncmp(dot + 1, "ffn.", 4) == 0;
        if ((lnf ? L + 1 : p.block + 1) != ev || (ffn ? 0 : 1) != part) continue;
        grads[k] = p.grad;
        numel[k++] = p.numel;
      }
      r->grad_count[ev][part] = k - r->grad_first[ev][part];
    }
  }
  moe_grad_reducer_config gc;
  moe_grad_reducer_config_default(&gc);
  gc.bucket_bytes = (size_t)(r->tc->grad_bucket_mb * 1048576.0);
  if (gc.bucket_bytes < sizeof(float)) gc.bucket_bytes = sizeof(float);  // a tensor per bucket
  gc.deterministic = r->tc->deterministic;
  gc.overlap = 1;
  gc.priority = r->tc->comm_priority;
  gc.micro_op_bytes = (size_t)(r->tc->micro_op_kb * 1024.0);
  if (r->tc->micro_op_kb > 0 && gc.micro_op_bytes < sizeof(float))
    gc.micro_op_bytes = sizeof(float);
  MOE_TRY(moe_grad_reducer_create(ctx, r->world, k, grads, numel, &gc, &r->grad_red));
  moe_gpt_set_grad_hook(r->model, grad_ready, r);
  set_layers_background(r, grad_background, r->grad_red);
done:
  moe_free(grads);
  moe_free(numel);
  return st;
}

// Sums the dense gradients over the world, packed into one buffer.
static moe_status allreduce_dense(run_state *r) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  int sum_size = 1;
  MPI_Comm_size(sum_comm(r), &sum_size);
  if (sum_size == 1 || r->dense_n == 0) return st;
  const int n = moe_gpt_num_params(r->model);
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    if (p.kind != MOE_GPT_PARAM_DENSE) continue;
    memcpy(r->dense_buf + off, p.grad, p.numel * sizeof(float));
    off += p.numel;
  }
  for (size_t i = 0; i < r->dense_n; i += MPI_PIECE) {
    const size_t c = r->dense_n - i < MPI_PIECE ? r->dense_n - i : MPI_PIECE;
    if (!r->tc->deterministic)
      MOE_MPI_TRY_OP(
          ctx, "all-reduce of the dense gradients",
          MPI_Allreduce(MPI_IN_PLACE, r->dense_buf + i, (int)c, MPI_FLOAT, MPI_SUM, sum_comm(r)));
  }
  if (r->tc->deterministic)
    MOE_TRY(moe_allreduce_fixed(ctx, &r->dense_fixed, r->dense_buf, r->dense_n, sum_comm(r),
                                "all-reduce of the dense gradients"));
  off = 0;
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    if (p.kind != MOE_GPT_PARAM_DENSE) continue;
    memcpy(p.grad, r->dense_buf + off, p.numel * sizeof(float));
    off += p.numel;
  }
done:
  return st;
}

// ---- the global L2 gradient norm ----
// Dense and gate gradients are identical on every rank after their
// reductions; each expert lives once per EP group.
//
// The deterministic mode's is exact:
// Each element's square (exact in double) is scaled by one power of two, the
// same at every layout (from the largest square over the world and the model's
// element count), and truncated to a 128-bit integer; integers add exactly in
// any order, so the norm has the same bits however the tensors are sliced over
// ranks (MP slices, expert homes) and in whatever order the slices are added.
#if defined(__SIZEOF_INT128__)
__extension__ typedef __int128 sq_acc;
#else
typedef double sq_acc;  // no 128-bit integers: a plain double sum (order-dependent)
#endif

static double max_sq(const moe_gpt_param *p) {
  double m = 0.0;
  for (size_t k = 0; k < p->numel; k++) {
    const double v = (double)p->grad[k] * (double)p->grad[k];
    m = v > m ? v : m;
  }
  return m;
}

// trunc(s) for 0 <= s < 2^126 as hi * 2^63 + lo with hi = trunc(s / 2^63) and
// lo = trunc(s - hi * 2^63): the subtraction is exact (both are multiples of
// s's ulp, or s is a multiple of 2^63 and lo = 0), and both parts convert with
// one 64-bit instruction instead of libgcc's double to 128-bit call (which
// cost 7% of a 1-rank training step). Same integer, same bits.
static sq_acc exact_sq(const moe_gpt_param *p, double scale) {
  sq_acc a = 0;
  for (size_t k = 0; k < p->numel; k++) {
    const double s = (double)p->grad[k] * (double)p->grad[k] * scale;
#if defined(__SIZEOF_INT128__)
    const long long hi = (long long)(s * 0x1p-63);
    const long long lo = (long long)(s - (double)hi * 0x1p63);
    a += ((sq_acc)hi << 63) + (sq_acc)lo;
#else
    a += s;
#endif
  }
  return a;
}

// *acc (>= 0) summed over comm, exactly: as three 64-bit integer pieces (bits
// 0-31, 32-63 and the rest), each small enough that MPI's sum of them over
// up to 2^31 ranks cannot overflow.
static moe_status sum_acc(run_state *r, sq_acc *acc, MPI_Comm comm) {
  moe_status st = MOE_STATUS_OK;
  if (comm == MPI_COMM_NULL) return st;
#if defined(__SIZEOF_INT128__)
  long long v[3] = {(long long)(*acc & 0xffffffff), (long long)((*acc >> 32) & 0xffffffff),
                    (long long)(*acc >> 64)};
  MOE_MPI_TRY_OP(r->ctx, "all-reduce of the gradient norm",
                 MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_LONG_LONG, MPI_SUM, comm));
  *acc = ((sq_acc)v[2] << 64) + ((sq_acc)v[1] << 32) + (sq_acc)v[0];
#else
  MOE_MPI_TRY_OP(r->ctx, "all-reduce of the gradient norm",
                 MPI_Allreduce(MPI_IN_PLACE, acc, 1, MPI_DOUBLE, MPI_SUM, comm));
#endif
done:
  return st;
}

// which(p): 0 whole on every rank of the sum (counted once, locally), 1 a
// slice summed over `slices`, 2 an expert tensor summed over `experts`, -1 not
// counted on this rank (a copy held twice).
typedef int (*norm_part_fn)(const run_state *r, const moe_gpt_param *p);

static moe_status grad_norm_exact(run_state *r, norm_part_fn which, MPI_Comm slices,
                                  MPI_Comm experts, double *norm) {
  moe_status st = MOE_STATUS_OK;
  const int n = moe_gpt_num_params(r->model);
  double m = 0.0;
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    const double v = max_sq(&p);
    m = v > m ? v : m;
  }
  MOE_MPI_TRY_OP(r->ctx, "all-reduce of the gradient norm",
                 MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, r->world));
  *norm = 0.0;
  if (!isfinite(m) || m == 0.0) {  // an inf or NaN gradient gives that norm; all zero, 0
    *norm = m;
    return st;
  }
  // every square < 2^e; fewer than 2^b elements: the sum < 2^(e + b) <= 2^126 after scaling
  int e = 0, b = 0;
  (void)frexp(m, &e);
  (void)frexp((double)moe_gpt_total_elements(r->model) + 1.0, &b);
  const int shift = 125 - e - b;
#if defined(__SIZEOF_INT128__)
  const double scale = ldexp(1.0, shift);
#else
  const double scale = 1.0;
#endif
  sq_acc acc[3] = {0, 0, 0};
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    const int w = which(r, &p);
    if (w >= 0) acc[w] += exact_sq(&p, scale);
  }
  MOE_TRY(sum_acc(r, &acc[1], slices));
  MOE_TRY(sum_acc(r, &acc[2], experts));
  *norm = sqrt((double)(acc[0] + acc[1] + acc[2]) / scale);
done:
  return st;
}

static int norm_part_ep(const run_state *r, const moe_gpt_param *p) {
  (void)r;
  return p->kind == MOE_GPT_PARAM_EXPERT ? 2 : 0;
}

// Parm: MP slices over MP; expert shards over the EP x ESP group (b2 whole on
// every shard: counted on shard 0).
static int norm_part_parm(const run_state *r, const moe_gpt_param *p) {
  if (p->kind == MOE_GPT_PARAM_EXPERT) {
    const int shard0 = moe_parm_coords_of(&r->parm_user->parm, r->size, r->rank).esp == 0;
    return p->tp_dim >= 0 || shard0 ? 2 : -1;
  }
  return p->tp_dim >= 0 ? 1 : 0;
}

// Parm: tensors whole on every MP rank once; MP slices summed over MP; the
// experts' slices (shards, b2 once per ESP group) over the EP x ESP group.
static moe_status grad_norm_parm(run_state *r, double *norm) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  if (r->tc->deterministic)
    return grad_norm_exact(r, norm_part_parm, r->mp_comm, r->parm_a2a, norm);
  double whole = 0, sq[2] = {0, 0};  // sq: MP slices, expert slices
  const int n = moe_gpt_num_params(r->model);
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    double a = 0;
    for (size_t k = 0; k < p.numel; k++) a += (double)p.grad[k] * (double)p.grad[k];
    const int w = norm_part_parm(r, &p);
    if (w == 2) sq[1] += a;
    if (w == 1) sq[0] += a;
    if (w == 0) whole += a;
  }
  MOE_MPI_TRY_OP(ctx, "all-reduce of the gradient norm",
                 MPI_Allreduce(MPI_IN_PLACE, &sq[0], 1, MPI_DOUBLE, MPI_SUM, r->mp_comm));
  if (r->parm_a2a != MPI_COMM_NULL)
    MOE_MPI_TRY_OP(ctx, "all-reduce of the gradient norm",
                   MPI_Allreduce(MPI_IN_PLACE, &sq[1], 1, MPI_DOUBLE, MPI_SUM, r->parm_a2a));
  *norm = sqrt(whole + sq[0] + sq[1]);
done:
  return st;
}

static moe_status grad_norm(run_state *r, double *norm) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  if (r->parm_user) return grad_norm_parm(r, norm);
  if (r->tc->deterministic)
    return grad_norm_exact(r, norm_part_ep, MPI_COMM_NULL, r->ep_comm, norm);
  double sq[3];
  moe_optim_grad_sq(r->model, sq);
  if (r->ep_comm != MPI_COMM_NULL) {
    MOE_MPI_TRY_OP(ctx, "all-reduce of the gradient norm",
                   MPI_Allreduce(MPI_IN_PLACE, &sq[2], 1, MPI_DOUBLE, MPI_SUM, r->ep_comm));
  }
  *norm = sqrt(sq[0] + sq[1] + sq[2]);
done:
  return st;
}

// ---- validation -------------------------------------------------------------------------------

static moe_status validate(run_state *r, double *val_loss) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  double acc[2] = {0, 0};
  *val_loss = NAN;
  if (r->val_batches == 0) return st;
  for (int k = 0; k < r->val_batches; k++) {
    const int first = k * r->tc->batch + r->part * r->bl;
    moe_batch_val(&r->val, first, r->bl, r->s, r->tokens, r->targets);
    moe_gpt_loss l;
    MOE_TRY(moe_gpt_forward(r->model, r->tokens, r->targets, r->bl, r->s, 0, &l));
    if (r->tc->deterministic) {  // this batch's sequences in global order, on every rank
      double b = 0.0;
      MOE_TRY(moe_sum_slices_ordered(ctx, l.ce_seq, r->bl, 1, &b, sum_comm(r),
                                     "all-reduce of the validation loss"));
      acc[0] += b;
    } else {
      acc[0] += l.ce_sum;
    }
    acc[1] += l.tokens;
  }
  if (r->tc->deterministic) {
    MOE_MPI_TRY_OP(ctx, "all-reduce of the validation loss",
                   MPI_Allreduce(MPI_IN_PLACE, &acc[1], 1, MPI_DOUBLE, MPI_SUM, sum_comm(r)));
  } else {
    MOE_MPI_TRY_OP(ctx, "all-reduce of the validation loss",
                   MPI_Allreduce(MPI_IN_PLACE, acc, 2, MPI_DOUBLE, MPI_SUM, sum_comm(r)));
  }
  *val_loss = acc[1] > 0 ? acc[0] / acc[1] : NAN;
done:
  return st;
}

// ---- checkpoints ------------------------------------------------------------------------------

// Tensor k of the checkpoint: parameter k % n, kind k / n (0 data, 1 m, 2 v).
static float *ckpt_source(run_state *r, const moe_gpt_param *p, int i, int which) {
  if (which == 0) return p->data;
  return which == 1 ? moe_optim_m(r->opt, i) : moe_optim_v(r->opt, i);
}

// Parm's checkpoint gather of one tensor split over ranks (MP slices, expert
// homes and shards): the ranks with dp 0 (group0_comm, rank 0 first) hold
// every slice; each sends its slice and where it sits, rank 0 places them
// into full (the whole tensor; slices held twice hold the same values).
// Collective over group0_comm; the other ranks do nothing.
// Rank 0's buffers (all: 5 group0 sizes, tmp: the largest slice) are the
// caller's, allocated before any collective.
static moe_status parm_gather(run_state *r, const moe_gpt_param *p, const float *src, float *full,
                              int64_t *all, float *tmp) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  int g = 1, me = 0;
  MOE_MPI_TRY(ctx, MPI_Comm_size(r->group0_comm, &g));
  MOE_MPI_TRY(ctx, MPI_Comm_rank(r->group0_comm, &me));
  const int64_t mine[5] = {p->expert_first, p->expert_count, p->tp_first, p->tp_count,
                           (int64_t)p->numel};
  MOE_MPI_TRY_OP(ctx, "checkpoint: gather of slices",
                 MPI_Gather(mine, 5, MPI_INT64_T, all, 5, MPI_INT64_T, 0, r->group0_comm));
  if (me != 0) {
    MOE_TRY(
        moe_send_floats(ctx, src, p->numel, 0, 8, r->group0_comm, "checkpoint: send of slices"));
    goto done;
  }
  for (int q = 0; q < g; q++) {
    moe_gpt_param s = *p;
    s.expert_first = (int)all[5 * q];
    s.expert_count = (int)all[5 * q + 1];
    s.tp_first = (int)all[5 * q + 2];
    s.tp_count = (int)all[5 * q + 3];
    s.numel = (size_t)all[5 * q + 4];
    const float *slice = src;
    if (q > 0) {
      MOE_TRY(moe_recv_floats(ctx, tmp, s.numel, q, 8, r->group0_comm,
                              "checkpoint: receive of slices"));
      slice = tmp;
    }
    const size_t runs = moe_gpt_param_runs(&s);
    for (size_t k = 0, at = 0; k < runs; k++) {
      size_t off = 0;
      const size_t len = moe_gpt_param_run(&s, k, &off);
      memcpy(full + off, slice + at, len * sizeof(float));
      at += len;
    }
  }
done:
  return st;
}

// Elements of p's whole tensor.
static size_t whole_numel(const moe_gpt_param *p) {
  size_t n = 1;
  for (int d = 0; d < p->ndim; d++) n *= (size_t)p->dims[d];
  return n;
}

// Collective. Rank 0 writes; the members of rank 0's EP group send their
// experts. A failure on rank 0 is reported on every rank after every rank has
// finished its part; the previous file at path stays intact.
static moe_status save_checkpoint(run_state *r, const char *path, int step) {
  moe_status st = MOE_STATUS_OK, wst = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const int n = moe_gpt_num_params(r->model);
  moe_ckpt_tensor_desc *descs = NULL;
  moe_ckpt_writer *w = NULL;
  char *config = NULL;
  float *full = NULL, *gather_tmp = NULL;
  int64_t *gather_at = NULL;
  size_t full_n = 0;
  char msg[512] = "";
  int ok = 1;

  // after the 3 n parameter and moment tensors, each MoE block's router bias
  // and, when balancing, its balancer's state (the same on every rank: rank 0's)
  const int L = r->tc->model.n_layer;
  int n_bias = 0, n_bal = 0;
  for (int b = 0; b < L; b++) {
    n_bias += moe_gpt_router_bias(r->model, b) != NULL;
    n_bal += r->bal[b] != NULL;
  }
  uint8_t *bal_state = NULL;
  if (r->rank == 0) {
    descs = moe_calloc((size_t)3 * n + n_bias + n_bal, sizeof *descs);
    wst = descs ? MOE_STATUS_OK
                : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                               "checkpoint: out of memory");
    for (int k = 0; wst == MOE_STATUS_OK && k < 3 * n; k++) {
      const moe_gpt_param p = moe_gpt_get_param(r->model, k % n);
      static const char *const prefix[3] = {"", "adam.m.", "adam.v."};
      snprintf(descs[k].name, sizeof descs[k].name, "%s%s", prefix[k / n], p.name);
      descs[k].dtype = MOE_CKPT_F32;
      descs[k].ndim = p.ndim;
      for (int d = 0; d < 4; d++) descs[k].dims[d] = d < p.ndim ? p.dims[d] : 1;
    }
    for (int b = 0, k = 3 * n; wst == MOE_STATUS_OK && b < L; b++) {
      if (!moe_gpt_router_bias(r->model, b)) continue;
      snprintf(descs[k].name, sizeof descs[k].name, MOE_GPT_ROUTER_BIAS_NAME, b);
      descs[k].dtype = MOE_CKPT_F32;
      descs[k].ndim = 1;
      descs[k++].dims[0] = r->tc->model.moe.num_experts;
    }
    size_t bal_bytes = 0;
    for (int b = 0, k = 3 * n + n_bias; wst == MOE_STATUS_OK && b < L; b++) {
      if (!r->bal[b]) continue;
      snprintf(descs[k].name, sizeof descs[k].name, MOE_TRAIN_BALANCE_STATE_NAME, b);
      descs[k].dtype = MOE_CKPT_U8;
      descs[k].ndim = 1;
      descs[k++].dims[0] = (int64_t)moe_balancer_state_bytes(r->bal[b]);
      if (moe_balancer_state_bytes(r->bal[b]) > bal_bytes)
        bal_bytes = moe_balancer_state_bytes(r->bal[b]);
    }
    if (wst == MOE_STATUS_OK && bal_bytes && !(bal_state = moe_malloc(bal_bytes)))
      wst = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                         "checkpoint: out of memory (balancer state)");
    if (wst == MOE_STATUS_OK)
      wst =
          moe_gpt_ckpt_config_json(ctx, r->model, r->opt, step, r->tc->seed, r->tc->batch, &config);
    if (wst == MOE_STATUS_OK)
      wst = moe_ckpt_writer_open(ctx, path, config, descs, 3 * n + n_bias + n_bal, &w);
  }
  // Rank 0 assembles each expert tensor whole: one buffer for the largest.
  int ep_size = 1;
  if (r->in_group0) MPI_Comm_size(r->ep_comm, &ep_size);
  for (int i = 0; i < n; i++) {
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    if (p.kind == MOE_GPT_PARAM_EXPERT && p.numel * (size_t)ep_size > full_n)
      full_n = p.numel * (size_t)ep_size;
    if (r->parm_user && (p.kind == MOE_GPT_PARAM_EXPERT || p.tp_dim >= 0) &&
        whole_numel(&p) > full_n)
      full_n = whole_numel(&p);
  }
  if (r->rank == 0 && full_n) full = moe_malloc(full_n * sizeof(float));
  int ok_buf = r->rank != 0 || !full_n || full;
  if (r->rank == 0 && r->parm_user && ok_buf) {  // parm_gather's: the slices' places, one slice
    int g = 1;
    size_t most = 0;
    MPI_Comm_size(r->group0_comm, &g);
    for (int i = 0; i < n; i++) {
      const moe_gpt_param p = moe_gpt_get_param(r->model, i);
      if ((p.kind == MOE_GPT_PARAM_EXPERT || p.tp_dim >= 0) && p.numel > most) most = p.numel;
    }
    gather_at = moe_malloc((size_t)5 * g * sizeof(int64_t));
    gather_tmp = moe_malloc((most + 1) * sizeof(float));
    ok_buf = gather_at && gather_tmp;
  }
  MOE_TRY(agree(r,
                ok_buf ? MOE_STATUS_OK
                       : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                      "checkpoint: out of memory (%zu floats)", full_n),
                "checkpoint buffer"));
  for (int k = 0; k < 3 * n; k++) {
    const int i = k % n;
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    const float *src = ckpt_source(r, &p, i, k / n);
    if (r->parm_user && (p.kind == MOE_GPT_PARAM_EXPERT || p.tp_dim >= 0)) {
      if (moe_parm_coords_of(&r->parm_user->parm, r->size, r->rank).dp != 0) continue;
      MOE_TRY(parm_gather(r, &p, src, full, gather_at, gather_tmp));
      if (r->rank == 0 && wst == MOE_STATUS_OK)
        wst = moe_ckpt_writer_write(w, k, full, whole_numel(&p) * sizeof(float));
      continue;
    }
    if (p.kind != MOE_GPT_PARAM_EXPERT) {
      if (r->rank == 0 && wst == MOE_STATUS_OK)
        wst = moe_ckpt_writer_write(w, k, src, p.numel * sizeof(float));
      continue;
    }
    if (!r->in_group0) continue;
    // Experts are in EP-rank order (block placement): EP rank q's slice goes at q * numel.
    if (r->rank == 0) {
      memcpy(full, src, p.numel * sizeof(float));
      for (int q = 1; q < ep_size; q++)
        MOE_TRY(moe_recv_floats(ctx, full + (size_t)q * p.numel, p.numel, q, 7, r->ep_comm,
                                "checkpoint: receive of experts"));
      if (wst == MOE_STATUS_OK)
        wst = moe_ckpt_writer_write(w, k, full, p.numel * (size_t)ep_size * sizeof(float));
    } else {
      MOE_TRY(moe_send_floats(ctx, src, p.numel, 0, 7, r->ep_comm, "checkpoint: send of experts"));
    }
  }
  for (int b = 0, k = 3 * n; r->rank == 0 && b < L; b++) {
    const float *bias = moe_gpt_router_bias(r->model, b);
    if (!bias) continue;
    if (wst == MOE_STATUS_OK)
      wst = moe_ckpt_writer_write(w, k, bias, (size_t)r->tc->model.moe.num_experts * sizeof(float));
    k++;
  }
  for (int b = 0, k = 3 * n + n_bias; r->rank == 0 && b < L; b++) {
    if (!r->bal[b]) continue;
    moe_balancer_state_save(r->bal[b], bal_state);
    if (wst == MOE_STATUS_OK)
      wst = moe_ckpt_writer_write(w, k, bal_state, moe_balancer_state_bytes(r->bal[b]));
    k++;
  }
  if (r->rank == 0) {
    if (wst == MOE_STATUS_OK) {
      wst = moe_ckpt_writer_commit(w);
    } else {
      moe_ckpt_writer_abort(w);
    }
    w = NULL;
    if (wst != MOE_STATUS_OK) {
      ok = 0;
      snprintf(msg, sizeof msg, "%s", moe_ctx_error(ctx));
    }
  }
  MOE_MPI_TRY_OP(ctx, "checkpoint: rank 0's verdict", MPI_Bcast(&ok, 1, MPI_INT, 0, r->world));
  if (!ok) {
    MOE_MPI_TRY_OP(ctx, "checkpoint: rank 0's verdict",
                   MPI_Bcast(msg, sizeof msg, MPI_CHAR, 0, r->world));
    if (r->rank == 0) {
      st = wst;
    } else {
      MOE_FAIL(ctx, MOE_STATUS_IO, "checkpoint save failed on rank 0: %s", msg);
    }
  }
done:
  if (w) moe_ckpt_writer_abort(w);
  moe_free(bal_state);
  moe_free(full);
  moe_free(gather_tmp);
  moe_free(gather_at);
  moe_free(config);
  moe_free(descs);
  return st;
}

// ---- trace -------------------------------------------------------------------------------------

static moe_status write_trace(run_state *r, uint64_t step_start_ns) {
  moe_status st = MOE_STATUS_OK;
  moe_trace_pass passes[4 * MOE_GPT_MAX_LAYERS];
  char labels[MOE_GPT_MAX_LAYERS][16];
  int np = 0;
  for (int b = 0; b < r->tc->model.n_layer; b++) {
    if (!r->user->impl[b]) continue;
    uint64_t f0 = 0, b0 = 0;
    moe_ep_layer *l = moe_train_ep_layer(r->user->impl[b], &f0, &b0);
    snprintf(labels[b], sizeof labels[b], "h%d", b);  // the block, as in its parameters' names
    for (int dir = 0; dir < 2; dir++) {
      const uint64_t t0 = dir ? b0 : f0;
      // the block's pass, then Trans (forward) or Agg (backward) of load
      // balancing on the comm stream, both placed from the pass's start
      for (int which = 0; which < 2; which++) {
        const moe_task_graph *g = NULL;
        const moe_task_record *rec = NULL;
        if (which == 0) {
          moe_ep_layer_last_pass(l, dir, &g, &rec);
        } else {
          moe_ep_layer_balance_pass(l, dir, &g, &rec);
        }
        if (!g || !rec) break;
        passes[np].rank = r->rank;
        passes[np].graph = g;
        passes[np].records = rec;
        passes[np].offset_ns = t0 > step_start_ns ? t0 - step_start_ns : 0;
        passes[np].label = labels[b];
        np++;
      }
    }
  }
  st = moe_trace_write_ranks(r->ctx, r->world, r->tc->trace, passes, np);
  return st;
}

// Sum over the MoE blocks' last forward and backward passes (this rank):
// all-to-all busy and exposed time, and the mean over the blocks of the
// forward + backward pass makespans (NAN without MoE blocks).
static void comm_times(run_state *r, double *comm_s, double *exposed_s, double *pass_ms) {
  *comm_s = *exposed_s = 0;
  double passes_s = 0;
  int blocks = 0;
  if (r->parm_user) {  // the Parm layer runs its collectives itself: none hidden
    for (int b = 0; b < r->tc->model.n_layer; b++) {
      if (!r->parm_user->impl[b]) continue;
      blocks++;
      for (int dir = 0; dir < 2; dir++) {
        const moe_parm_timing t = moe_parm_layer_timing(r->parm_user->impl[b], dir);
        *comm_s += (t.a2a_ms + t.esp_ms + t.mp_ms) * 1e-3;
        passes_s += t.total_ms * 1e-3;
      }
    }
    *exposed_s = *comm_s;
    *pass_ms = blocks ? passes_s * 1e3 / blocks : NAN;
    return;
  }
  for (int b = 0; b < r->tc->model.n_layer; b++) {
    if (!r->user->impl[b]) continue;
    moe_ep_layer *l = moe_train_ep_layer(r->user->impl[b], NULL, NULL);
    blocks++;
    for (int dir = 0; dir < 2; dir++) {
      const moe_task_graph *g = NULL;
      const moe_task_record *rec = NULL;
      moe_ep_layer_last_pass(l, dir, &g, &rec);
      if (!g || !rec) continue;
      moe_pass_breakdown bd;
      moe_pass_breakdown_compute(rec, g->n_tasks, &bd);
      *comm_s += (double)bd.comm_ns * 1e-9;
      *exposed_s += (double)bd.exposed_comm_ns * 1e-9;
      passes_s += (double)bd.total_ns * 1e-9;
    }
  }
  *pass_ms = blocks ? passes_s * 1e3 / blocks : NAN;
}

// The median of v (sorts it), NAN when empty.
static double median(double *v, int n) { return n > 0 ? moe_median(v, n) : NAN; }

// ---- setup and teardown -----------------------------------------------------------------------

// The model on the expert-parallel backend with EP size ep, its optimizer,
// the gradient buckets or packed buffer and the EP group; parameters at zero.
// Collective. free_model undoes it (also after a failure part way).
// Parm: the MP group's sum for the model's tensor parallelism.
static moe_status mp_allreduce(void *user, float *buf, size_t n) {
  moe_status st = MOE_STATUS_OK;
  run_state *r = user;
  for (size_t i = 0; i < n; i += MPI_PIECE) {
    const size_t c = n - i < MPI_PIECE ? n - i : MPI_PIECE;
    MOE_MPI_TRY_OP(r->ctx, "tensor parallelism's all-reduce",
                   MPI_Allreduce(MPI_IN_PLACE, buf + i, (int)c, MPI_FLOAT, MPI_SUM, r->mp_comm));
  }
done:
  return st;
}

// Parm in deterministic mode: the MP sums as fixed-order chains over the MP group.
static moe_status mp_chain(void *user, const moe_chain *ch) {
  run_state *r = user;
  return moe_chain_run(r->ctx, r->mp_comm, ch, &r->tp_chains, "tensor parallelism's chain");
}

// Parm's model: tensor-parallel over MP, the MoE blocks on the Parm layer
// with EP ep; with parm_auto the schedule is Algorithm 1's pick from terms
// measured now on the layout (the rows per EP rank of this batch around
// their expected count). Collective.
static moe_status parm_model(run_state *r, int ep, moe_gpt_config *mc) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const moe_train_config *tc = r->tc;
  r->parm_user = moe_calloc(1, sizeof *r->parm_user);
  MOE_TRY(agree(r,
                r->parm_user ? MOE_STATUS_OK
                             : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                            "out of memory"),
                "allocation"));
  moe_parm_config *pc = &r->parm_user->parm;
  moe_parm_config_default(pc);
  pc->mp = tc->mp;
  pc->ep = ep;
  pc->esp = tc->esp;
  pc->schedule = tc->parm_schedule;
  pc->saa = tc->parm_saa;
  pc->chunks = tc->par.chunks;
  snprintf(pc->task_schedule, sizeof pc->task_schedule, "%s", tc->par.schedule);
  pc->exec = tc->par.exec;
  snprintf(pc->compress, sizeof pc->compress, "%s", tc->par.compress);
  pc->compress_backward = tc->par.compress_backward;
  pc->ranks_per_node = tc->par.ranks_per_node;
  snprintf(pc->a2a, sizeof pc->a2a, "%s", tc->par.a2a);
  r->parm_user->world = r->world;
  if (tc->parm_auto && tc->model.moe_every > 0 && tc->mp > 1) {
    const moe_layer_config *lc = &tc->model.moe;
    const double f = lc->capacity_factor > 0 ? lc->capacity_factor : 1.0;
    const double rows = f * lc->top_k * (double)r->bl * r->s / ((double)ep * tc->mp);
    // x 0.5 .. x 2 of the expected rows, within the measurement's 2^28 floats
    const double cap = (double)(1 << 28) / ((double)tc->model.d_model * ep * tc->esp * tc->mp);
    int hi = (int)(rows * 2 < cap ? rows * 2 : cap);
    hi = hi < 2 ? 2 : hi;
    const int lo = hi / 4 < 1 ? 1 : hi / 4;
    // the profile's terms when it has this layout (moe calibrate measures DP 1)
    const moe_parm_alpha_beta *cal =
        r->size == tc->mp * ep * tc->esp
            ? moe_profile_parm(tc->profile, tc->mp, ep, tc->esp, pc->a2a)
            : NULL;
    // (a profile fitted before the fits were held non-negative may hold a
    // negative latency or slope: measured afresh instead)
    if (cal && (cal->alpha_a2a < 0 || cal->beta_a2a < 0 || cal->alpha_mp < 0 || cal->beta_mp < 0 ||
                cal->alpha_o < 0 || cal->beta_o < 0))
      cal = NULL;
    moe_parm_alpha_beta ab;
    if (cal) {
      ab = *cal;
      r->parm_terms_profile = 1;
    } else {
      MOE_TRY(moe_measure_parm_alpha_beta(ctx, r->world, pc, tc->model.d_model, lo, hi, 4, 5, &ab,
                                          NULL));
    }
    moe_layer_config layer = *lc;  // as the model passes it to the backend
    layer.model_dim = tc->model.d_model;
    layer.tokens = r->bl * r->s;
    pc->schedule = moe_parm_pick(&ab, &layer, pc, &r->parm_t1_ms, &r->parm_t2_ms);
    // s1 in deterministic mode needs each MP rank to hold whole sequences
    if (tc->deterministic && r->bl % tc->mp != 0) {
      r->parm_t1_ms = NAN;
      if (pc->schedule == MOE_PARM_S1) pc->schedule = MOE_PARM_S2;
    }
  }
  r->parm_pick = pc->schedule;
  pc->slice_tokens = tc->deterministic ? r->s : 0;  // after auto's measurements (no slices)
  const moe_gpt_tp tp = {tc->mp, moe_parm_coords_of(pc, r->size, r->rank).mp, mp_allreduce, r,
                         mp_chain};
  MOE_TRY(moe_gpt_create_tp(ctx, mc, r->bl, &moe_train_parm_ops, r->parm_user, &tp, &r->model));
  // the first MoE block's EP x ESP group: its members hold every expert slice once
  r->parm_a2a = MPI_COMM_NULL;
  for (int b = 0; b < tc->model.n_layer; b++) {
    if (!r->parm_user->impl[b]) continue;
    r->parm_a2a = moe_parm_layer_a2a_group(r->parm_user->impl[b])->comm;
    break;
  }
done:
  return st;
}

static moe_status build_model(run_state *r, int ep) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const moe_train_config *tc = r->tc;
  // Model on the expert-parallel backend.
  r->user = moe_calloc(1, sizeof *r->user);
  local = r->user
              ? MOE_STATUS_OK
              : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__, "out of memory");
  MOE_TRY(agree(r, local, "allocation"));
  r->user->world = r->world;
  r->user->par = tc->par;
  r->user->par.ep_size = ep;
  // deterministic: fixed-order GEMMs everywhere and fixed-order sums (slices
  // = sequences); else the chosen backend and MPI's reductions
  const moe_backend *be = NULL;
  MOE_TRY(moe_train_backend(ctx, tc, &be));  // checked by check_config: cannot fail here
  moe_backend_use(be, tc->threads);
  moe_precision_use(tc->precision);
  r->user->par.slice_tokens = tc->deterministic ? r->s : 0;
  r->user->par.copy_slots = tc->balance.policy != MOE_BALANCE_NONE ? tc->balance.slots : 0;
  // Agg of the copies' gradients deferred to after the whole backward, so the
  // earlier blocks' backward hides it (grads_wait below)
  r->user->par.defer_agg = r->user->par.copy_slots > 0;
  moe_gpt_config mc = tc->model;
  if (tc->parm_on) {
    MOE_TRY(parm_model(r, ep, &mc));
  } else {
    MOE_TRY(moe_gpt_create(ctx, &mc, r->bl, &moe_train_ep_ops, r->user, &r->model));
  }
  local = tc->deterministic ? moe_gpt_set_deterministic(r->model, 1) : MOE_STATUS_OK;
  MOE_TRY(agree(r, local, "deterministic mode"));
  moe_optim_config oc = tc->optim;
  oc.lr = r->schedule.lr;
  oc.min_lr = r->schedule.min_lr;
  oc.warmup_steps = r->schedule.warmup_steps;
  oc.total_steps = r->schedule.total_steps;
  local = moe_optim_create(ctx, r->model, &oc, &r->opt);
  int buckets = 0;  // the dense gradients in buckets (tc->grad_bucket_mb) instead of dense_buf
  if (local == MOE_STATUS_OK) {
    r->tokens = moe_malloc((size_t)r->bl * r->s * sizeof(int32_t));
    r->targets = moe_malloc((size_t)r->bl * r->s * sizeof(int32_t));
    const int n = moe_gpt_num_params(r->model);
    for (int i = 0; i < n; i++) {
      const moe_gpt_param p = moe_gpt_get_param(r->model, i);
      if (p.kind == MOE_GPT_PARAM_DENSE) r->dense_n += p.numel;
    }
    buckets = tc->grad_bucket_mb > 0 && r->size > 1 && r->dense_n > 0;
    if (!buckets) r->dense_buf = moe_malloc(r->dense_n * sizeof(float));
    if (!r->tokens || !r->targets || (r->dense_n && !buckets && !r->dense_buf))
      local = moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                           "training buffers: out of memory");
  }
  MOE_TRY(agree(r, local, "optimizer and buffers"));
  if (buckets) MOE_TRY(grad_buckets_create(r));

  // The EP group (for the expert part of the gradient norm and checkpoint gathers).
  r->ep_comm = MPI_COMM_NULL;
  for (int b = 0; b < tc->model.n_layer; b++) {
    if (!r->user->impl[b]) continue;
    const moe_group *g = moe_ep_layer_ep_group(moe_train_ep_layer(r->user->impl[b], NULL, NULL));
    r->ep_comm = g->comm;
    MPI_Group wg, eg;
    int zero = 0, in = MPI_UNDEFINED;
    MPI_Comm_group(r->world, &wg);
    MPI_Comm_group(g->comm, &eg);
    MPI_Group_translate_ranks(wg, 1, &zero, eg, &in);
    MPI_Group_free(&wg);
    MPI_Group_free(&eg);
    r->in_group0 = in == 0;  // rank 0 must also be EP rank 0 (it is: groups keep world order)
    break;
  }

done:
  return st;
}

static void free_model(run_state *r) {
  moe_free(r->dense_buf);
  r->dense_buf = NULL;
  r->dense_n = 0;
  if (r->grad_red && r->user) set_layers_background(r, NULL, NULL);  // before it goes
  moe_grad_reducer_destroy(r->grad_red);
  r->grad_red = NULL;
  moe_free(r->targets);
  moe_free(r->tokens);
  r->targets = r->tokens = NULL;
  moe_optim_destroy(r->opt);
  r->opt = NULL;
  moe_gpt_destroy(r->model);  // collective: destroys the EP layers
  r->model = NULL;
  moe_free(r->parm_user);
  r->parm_user = NULL;
  moe_chain_state_free(&r->tp_chains);
  r->parm_a2a = MPI_COMM_NULL;
  moe_free(r->user);
  r->user = NULL;
  r->ep_comm = MPI_COMM_NULL;
  r->in_group0 = 0;
}

// ---- expert packing ----------------------------------------------------------------------------

// Lina's packing rule's inputs from the step just run: the mean expert
// micro-op (one chunk's FFN task, kind E) and all-to-all micro-op (kinds A1,
// A2) over every MoE block's forward and backward pass, the slowest rank's
// (so every rank decides alike). Collective.
static moe_status packing_times(run_state *r, double *ffn_ms, double *a2a_ms) {
  moe_status st = MOE_STATUS_OK;
  double t[2] = {0, 0}, n[2] = {0, 0};  // [0] expert, [1] all-to-all
  for (int b = 0; b < r->tc->model.n_layer; b++) {
    if (!r->user->impl[b]) continue;
    const moe_ep_layer *l = moe_train_ep_layer(r->user->impl[b], NULL, NULL);
    for (int dir = 0; dir < 2; dir++) {
      const moe_task_graph *g = NULL;
      const moe_task_record *rec = NULL;
      moe_ep_layer_last_pass(l, dir, &g, &rec);
      for (int k = 0; g && rec && k < g->n_tasks; k++) {
        const int kind = g->tasks[k].kind;
        const int which = kind == MOE_CT_E ? 0 : kind == MOE_CT_A1 || kind == MOE_CT_A2 ? 1 : -1;
        if (which < 0 || !rec[k].ran) continue;
        t[which] += (double)(rec[k].end_ns - rec[k].start_ns) * 1e-6;
        n[which] += 1;
      }
    }
  }
  double m[2] = {n[0] > 0 ? t[0] / n[0] : 0, n[1] > 0 ? t[1] / n[1] : 0};
  MOE_MPI_TRY_OP(r->ctx, "all-reduce of the packing times",
                 MPI_Allreduce(MPI_IN_PLACE, m, 2, MPI_DOUBLE, MPI_MAX, r->world));
  *ffn_ms = m[0];
  *a2a_ms = m[1];
done:
  return st;
}

// Expert packing: the EP size becomes new_ep. Every expert tensor and its
// AdamW moments are all-gathered over the EP group (each rank then holds the
// whole layer's), the model and optimizer are made again for the new layout
// and take their home slices; the dense tensors, their moments, the router
// biases and the step count carry over. No value changes. Collective.
static moe_status pack_experts(run_state *r, int new_ep, int step) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const int n = moe_gpt_num_params(r->model), L = r->tc->model.n_layer;
  const int E = r->tc->model.moe.num_experts;
  float **keep = moe_calloc((size_t)3 * n + (size_t)L, sizeof *keep);  // data, m, v; biases
  int ok = keep != NULL;
  for (int k = 0; ok && k < 3 * n; k++) {
    const moe_gpt_param p = moe_gpt_get_param(r->model, k % n);
    const size_t whole = p.kind == MOE_GPT_PARAM_EXPERT ? p.numel * (size_t)r->ep : p.numel;
    ok = (keep[k] = moe_malloc((whole ? whole : 1) * sizeof(float))) != NULL;
  }
  for (int b = 0; ok && b < L; b++)
    if (moe_gpt_router_bias(r->model, b))
      ok = (keep[3 * n + b] = moe_malloc((size_t)E * sizeof(float))) != NULL;
  MOE_TRY(agree(r,
                ok ? MOE_STATUS_OK
                   : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                  "expert packing: out of memory for a copy of the model"),
                "expert packing"));
  for (int k = 0; k < 3 * n; k++) {
    const int i = k % n;
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    const float *src = ckpt_source(r, &p, i, k / n);
    if (p.kind != MOE_GPT_PARAM_EXPERT) {
      memcpy(keep[k], src, p.numel * sizeof(float));
      continue;
    }
    // EP rank q holds experts [q E / ep, (q + 1) E / ep): the gather is in expert order
    MOE_FAIL_IF(ctx, p.numel > (size_t)INT_MAX, MOE_STATUS_INVALID_ARG,
                "expert packing: %s holds %zu floats on one rank (MPI's int limit)", p.name,
                p.numel);
    MOE_MPI_TRY_OP(
        ctx, "expert packing: all-gather of the experts",
        MPI_Allgather(src, (int)p.numel, MPI_FLOAT, keep[k], (int)p.numel, MPI_FLOAT, r->ep_comm));
  }
  for (int b = 0; b < L; b++)
    if (keep[3 * n + b])
      memcpy(keep[3 * n + b], moe_gpt_router_bias(r->model, b), (size_t)E * sizeof(float));
  const int steps = moe_optim_step_count(r->opt);
  // a failure while rebuilding would lose the model: its state is saved first
  if (r->tc->checkpoint) MOE_TRY(save_checkpoint(r, r->tc->checkpoint, step));

  free_model(r);
  MOE_TRY(build_model(r, new_ep));
  r->ep = new_ep;
  MOE_FAIL_IF(ctx, moe_gpt_num_params(r->model) != n, MOE_STATUS_INTERNAL,
              "expert packing: the model has %d tensors after, %d before",
              moe_gpt_num_params(r->model), n);
  for (int k = 0; k < 3 * n; k++) {
    const int i = k % n;
    const moe_gpt_param p = moe_gpt_get_param(r->model, i);
    float *dst = ckpt_source(r, &p, i, k / n);
    const size_t first = p.kind == MOE_GPT_PARAM_EXPERT && p.expert_count > 0
                             ? (size_t)p.expert_first * (p.numel / (size_t)p.expert_count)
                             : 0;
    memcpy(dst, keep[k] + first, p.numel * sizeof(float));
  }
  for (int b = 0; b < L; b++)
    if (keep[3 * n + b])
      memcpy(moe_gpt_router_bias(r->model, b), keep[3 * n + b], (size_t)E * sizeof(float));
  moe_optim_set_step_count(r->opt, steps);
done:
  for (int k = 0; keep && k < 3 * n + L; k++) moe_free(keep[k]);
  moe_free(keep);
  return st;
}

// Whether step `step` is followed by a packing check or change.
static int packing_due(const run_state *r, int step) {
  const moe_train_config *tc = r->tc;
  if (!moe_train_packing_on(tc) || tc->model.moe_every == 0 || !r->user ||
      step < tc->packing_start - 1)
    return 0;
  if (tc->packing > 1) return step == tc->packing_start - 1;
  return (step - (tc->packing_start - 1)) % tc->packing_every == 0;
}

// Right after the step's backward (before a validation's forward replaces
// the passes' records): Lina's rule's micro-op times, when a check follows.
static moe_status packing_measure(run_state *r, int step) {
  if (r->tc->packing != MOE_TRAIN_PACKING_LINA || !packing_due(r, step)) return MOE_STATUS_OK;
  return packing_times(r, &r->pack_ffn, &r->pack_a2a);
}

// After step `step`: the packing change due then, if any (logged in out).
static moe_status packing_step(run_state *r, int step, moe_train_result *out) {
  moe_status st = MOE_STATUS_OK;
  const moe_train_config *tc = r->tc;
  if (!packing_due(r, step)) return st;
  int to = r->ep;
  double ffn = 0, a2a = 0;
  if (tc->packing > 1) {  // a fixed degree, once
    to = r->ep_base / tc->packing;
  } else {  // Lina: double while the expert micro-op is shorter than the all-to-all's
    ffn = r->pack_ffn;
    a2a = r->pack_a2a;
    if (ffn < a2a && r->ep > r->ep_min) to = r->ep / 2;
  }
  if (out->packing_n < (int)(sizeof out->packing_log / sizeof out->packing_log[0])) {
    out->packing_log[out->packing_n].step = step;
    out->packing_log[out->packing_n].ep_from = r->ep;
    out->packing_log[out->packing_n].ep_to = to;
    out->packing_log[out->packing_n].ffn_ms = ffn;
    out->packing_log[out->packing_n].a2a_ms = a2a;
    out->packing_n++;
  }
  if (to != r->ep) MOE_TRY(pack_experts(r, to, step));
done:
  return st;
}

// Whether the all-to-all can run with EP groups of ep consecutive ranks
// (uneven nodes refuse some algorithms): OK, or INVALID_ARG naming why, the
// same on every rank. Collective.
static moe_status packing_layout_check(run_state *r, int ep) {
  moe_status st = MOE_STATUS_OK, mine = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  MPI_Comm sub = MPI_COMM_NULL;
  moe_group g;
  memset(&g, 0, sizeof g);
  int have = 0;
  const moe_a2a_algo *algo = NULL;
  MOE_MPI_TRY(ctx, MPI_Comm_split(r->world, r->rank / ep, r->rank, &sub));
  mine = moe_group_init_topology(ctx, &g, sub, r->tc->par.ranks_per_node);
  have = mine == MOE_STATUS_OK;
  if (mine == MOE_STATUS_OK) mine = moe_a2a_find(ctx, r->tc->par.a2a, &algo);
  if (mine == MOE_STATUS_OK) mine = moe_a2a_check_topology(ctx, algo, &g);
  st = moe_comm_agree(ctx, r->world, mine, "the packed layout");
done:
  if (have) moe_group_free(&g);
  if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
  return st;
}

// The layouts expert packing may reach, checked before the run: a fixed
// degree's (refused when the all-to-all cannot run on it), or Lina's
// halvings while they can (ep_min: the last one that can).
static moe_status packing_layouts(run_state *r) {
  moe_status st = MOE_STATUS_OK;
  const moe_train_config *tc = r->tc;
  r->ep_min = r->ep;
  if (!moe_train_packing_on(tc) || tc->model.moe_every == 0) return st;
  if (tc->packing > 1) {
    const int to = r->ep_base / tc->packing;
    if (packing_layout_check(r, to) != MOE_STATUS_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", moe_ctx_error(r->ctx));
      MOE_FAIL(r->ctx, MOE_STATUS_INVALID_ARG,
               "expert packing %d: the packed layout (EP %d) cannot run: %s", tc->packing, to, why);
    }
    r->ep_min = to;
  } else {
    while (r->ep_min % 2 == 0 && packing_layout_check(r, r->ep_min / 2) == MOE_STATUS_OK)
      r->ep_min /= 2;
    moe_ctx_clear_error(r->ctx);
  }
done:
  return st;
}

static moe_status setup(run_state *r, int *start_step) {
  moe_status st = MOE_STATUS_OK, local = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const moe_train_config *tc = r->tc;
  int ep = 1;

  local = check_config(ctx, tc, r->size, &ep);
  MOE_TRY(agree(r, local, "training config"));
  r->part = r->rank;
  r->parts = r->size;
  if (tc->parm_on) {  // data parts: MP peers train on the same sequences
    moe_parm_config pc;
    moe_parm_config_default(&pc);
    pc.mp = tc->mp;
    pc.ep = ep;
    pc.esp = tc->esp;
    const moe_parm_coords c = moe_parm_coords_of(&pc, r->size, r->rank);
    r->part = moe_parm_data_index(&pc, r->size, r->rank);
    r->parts = r->size / tc->mp;
    MOE_MPI_TRY(ctx, MPI_Comm_split(r->world, r->part, c.mp, &r->mp_comm));
    MOE_MPI_TRY(ctx, MPI_Comm_split(r->world, c.mp, r->rank, &r->data_comm));
    MOE_MPI_TRY(ctx, MPI_Comm_split(r->world, c.dp == 0 ? 0 : 1, r->rank, &r->group0_comm));
  }
  r->bl = tc->batch / r->parts;
  r->s = tc->model.seq_len;

  // Text: every rank reads it (a shared file system, or the same package on every node).
  local = moe_text_load(ctx, tc->data, (size_t)r->s * 4 + 2, &r->text);
  if (local == MOE_STATUS_OK)
    local = moe_text_split(ctx, r->text, tc->val_fraction, r->s, &r->train, &r->val);
  MOE_TRY(agree(r, local, "loading the training text"));
  const int windows = moe_batch_val_windows(&r->val, r->s);
  r->val_batches = windows / tc->batch < tc->eval_batches ? windows / tc->batch : tc->eval_batches;
  if (r->val_batches < tc->eval_batches && r->rank == 0)
    MOE_WARN("validation: %d windows of %d bytes give %d batches of %d (asked for %d)", windows,
             r->s, r->val_batches, tc->batch, tc->eval_batches);

  // The learning-rate schedule: a resumed run keeps its checkpoint's.
  local = MOE_STATUS_OK;
  if (tc->resume) local = moe_gpt_ckpt_read_info(ctx, tc->resume, &r->resume_info);
  if (local == MOE_STATUS_OK)
    local = moe_train_schedule_resolve(ctx, tc, tc->resume ? &r->resume_info : NULL, &r->schedule);
  MOE_TRY(agree(r, local, "the checkpoint's learning-rate schedule"));

  // The memory bound: every rank's need against its limit before the model is
  // allocated; the baseline is what this process holds now (text included),
  // plus OpenBLAS's GEMM buffers unless the run is deterministic: its
  // fixed-order GEMMs never call OpenBLAS, which then touches none of them.
  local = moe_train_memory(ctx, tc, r->size, &r->need);
  MOE_TRY(agree(r, local, "the memory estimate"));
  r->need.bytes[MOE_MEM_BASELINE] =
      (double)(moe_rss_bytes() + (tc->deterministic ? 0 : MOE_MEM_BLAS_BYTES));
  MOE_TRY(moe_comm_memory_check(ctx, r->world, &r->need, tc->max_memory,
                                "use a smaller model (--d-model, --experts, --expert-hidden, "
                                "--layers) or batch, more ranks, or raise --max-memory"));
  r->need_max[0] = moe_memory_need_total(&r->need);
  r->need_max[1] = moe_memory_need_expected(&r->need);
  MOE_MPI_TRY(ctx, MPI_Allreduce(MPI_IN_PLACE, r->need_max, 2, MPI_DOUBLE, MPI_MAX, r->world));

  // Expert packing due before the first step run here (a fixed degree with
  // --packing-start 1, or resumed past its change): the packed layout from
  // the start (Lina's rule decides again from measured steps)
  r->ep = r->ep_base = ep;
  if (tc->packing > 1 && tc->model.moe_every > 0 &&
      (tc->resume ? r->resume_info.step : 0) >= tc->packing_start - 1)
    r->ep /= tc->packing;
  MOE_TRY(packing_layouts(r));  // before the model: a packed layout that cannot run is named
  MOE_TRY(build_model(r, r->ep));

  // Parameters: fresh or from a checkpoint (every rank reads its slice).
  *start_step = 1;
  if (tc->resume) {
    const moe_gpt_ckpt_info info = r->resume_info;
    local = moe_gpt_ckpt_load(ctx, tc->resume, r->model, r->opt);
    MOE_TRY(agree(r, local, "loading the checkpoint"));
    *start_step = info.step + 1;
    if (r->rank == 0) {
      if (info.seed != tc->seed || info.batch != tc->batch)
        MOE_WARN(
            "resuming %s saved with seed %llu batch %d under seed %llu batch %d: the run "
            "continues, but not as the original run would have",
            tc->resume, (unsigned long long)info.seed, info.batch, (unsigned long long)tc->seed,
            tc->batch);
    }
  } else {
    moe_gpt_init_params(r->model, tc->seed);
  }

  // Outputs on rank 0.
  local = MOE_STATUS_OK;
  if (r->rank == 0 && tc->metrics)
    local = moe_metrics_open(ctx, tc->metrics, tc->metrics_append, &r->metrics);
  if (local == MOE_STATUS_OK && r->rank == 0 && tc->progress)
    local = moe_progress_create(ctx, stderr, tc->progress_tty, tc->steps, &r->progress);
  MOE_TRY(agree(r, local, "opening the outputs"));
  if (tc->routing_trace)
    MOE_TRY(moe_routing_trace_open_(ctx, r->world, tc->routing_trace, tc->metrics_append,
                                    tc->resume ? r->resume_info.step : 0, &tc->model,
                                    tc->batch / r->size * tc->model.seq_len, &r->routing));
done:
  return st;
}

static void teardown(run_state *r) {
  moe_progress_free(r->progress);
  moe_metrics_close(r->metrics);
  moe_routing_trace_close_(r->routing);
  for (int b = 0; b < MOE_GPT_MAX_LAYERS; b++) moe_balancer_destroy(r->bal[b]);
  moe_free(r->bal_load);
  moe_free(r->bal_replica);
  moe_free(r->bias_load);
  moe_fixed_sum_free(&r->dense_fixed);
  free_model(r);
  MPI_Comm *comms[] = {&r->mp_comm, &r->data_comm, &r->group0_comm};
  for (size_t i = 0; i < sizeof comms / sizeof comms[0]; i++)
    if (*comms[i] != MPI_COMM_NULL && *comms[i] != 0) MPI_Comm_free(comms[i]);
  moe_text_free(r->text);
}

// Test hook (tests/hang_test.sh): MOE_TEST_SLOW_RANK="R:SECONDS" makes rank R
// sleep SECONDS before step 2's gradient all-reduce, where the other ranks wait
// for it: a rank that is slow, not hung. Unset: nothing; malformed: a warning.
static void test_slow_rank(const run_state *r, int step) {
  const char *env = getenv("MOE_TEST_SLOW_RANK");
  if (!env || !*env || step != 2) return;
  int rank = -1;
  double seconds = 0;
  char tail = 0;
  if (sscanf(env, "%d:%lf%c", &rank, &seconds, &tail) != 2 || !(seconds >= 0 && seconds < 3600)) {
    if (r->rank == 0) MOE_WARN("MOE_TEST_SLOW_RANK='%s' is not RANK:SECONDS (ignored)", env);
    return;
  }
  if (rank != r->rank) return;
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

// ---- load balancing ------------------------------------------------------------------------

// DeepSeek-V3's router-bias update of block b from the step's load (EP, E):
// the same integers on every rank, so every rank computes the same bias.
// Adds the block's expert load ratio and largest |bias| to info.
static void router_bias_step(run_state *r, int b, const int64_t *load, int P,
                             moe_train_step_info *info) {
  const int E = r->tc->model.moe.num_experts;
  double *per_expert = r->bias_load;
  double total = 0, most = 0;
  for (int e = 0; e < E; e++) {
    int64_t n = 0;
    for (int p = 0; p < P; p++) n += load[(size_t)p * E + e];
    per_expert[e] = (double)n;
    total += (double)n;
    if ((double)n > most) most = (double)n;
  }
  float *bias = moe_gpt_router_bias(r->model, b);
  moe_router_bias_update(bias, per_expert, E, r->tc->router_bias_rate);
  double bmax = 0;
  for (int e = 0; e < E; e++) bmax = fabs(bias[e]) > bmax ? fabs(bias[e]) : bmax;
  info->expert_load_ratio += total > 0 ? most * E / total : 1.0;
  if (bmax > info->router_bias_max) info->router_bias_max = bmax;
}

// Block b's balancer (collective). The rates: a profile's when given; else,
// in deterministic mode, fixed ones (a plan decided by measured times would
// differ between two runs of the same config, and with it the summation
// order of the expert gradients); else, with `measure`, those of the layer's
// last step (moe_ep_layer_rates), without it the defaults (a resumed run
// takes its checkpoint's); with measured or resumed rates, the machine's
// layout (moe_ep_layer_ranks_per_node, moe_ep_layer_compute_slots).
static moe_status make_balancer(run_state *r, int b, moe_ep_layer *l, int measure) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const moe_train_config *tc = r->tc;
  moe_balance_config bc = tc->balance;
  if (!(bc.cost.flops_per_s > 0)) {
    moe_balance_cost_default(&bc.cost, tc->model.d_model, tc->model.moe.hidden_dim);
    if (tc->profile) {
      MOE_TRY(
          agree(r,
                moe_balance_cost_from_profile(ctx, tc->profile, r->user->par.a2a, tc->model.d_model,
                                              tc->model.moe.hidden_dim, &bc.cost),
                "the balancing rates from the profile"));
    } else if (tc->deterministic) {
      bc.cost.flops_per_s = MOE_TRAIN_BALANCE_FLOPS;
      bc.cost.net_bytes_per_s = MOE_TRAIN_BALANCE_NET;
    } else {
      if (measure) {
        double f = 0, n = 0;
        MOE_TRY(moe_ep_layer_rates(l, &f, &n));
        if (f > 0) bc.cost.flops_per_s = f;
        if (n > 0) bc.cost.net_bytes_per_s = n;
      }
      // the layout the measured rates belong to (the off-node link when the
      // group spans nodes; cores shared): also for a resumed run, whose
      // checkpoint holds the rates but not the layout
      MOE_TRY(moe_ep_layer_ranks_per_node(l, &bc.cost.ranks_per_node));
      MOE_TRY(moe_ep_layer_compute_slots(l, &bc.cost.compute_slots));
    }
  }
  MOE_TRY(agree(
      r, moe_balancer_create(ctx, &bc, tc->model.moe.num_experts, r->user->par.ep_size, &r->bal[b]),
      "the balancer"));
done:
  return st;
}

// A resumed run's balancers (collective): each MoE block's state from the
// checkpoint (MOE_TRAIN_BALANCE_STATE_NAME), and its placement set, so the
// run places the copies the uninterrupted one would have (and sums the
// expert gradients in its order: bitwise). A checkpoint without a state
// (written without balancing, or before this was saved) or with one of
// another shape, policy, window or slot count: the block plans afresh, as
// from step 1, with a notice. Every rank reads the same file, so they agree.
static moe_status restore_balancers(run_state *r) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const moe_train_config *tc = r->tc;
  moe_ckpt_reader *rd = NULL;
  uint8_t *buf = NULL;
  int afresh = 0, blocks = 0;  // MoE blocks planning afresh, of all
  char why[256] = "";          // the first one's reason
  MOE_TRY(agree(r, moe_ckpt_reader_open(ctx, tc->resume, &rd), "reading the balancers' state"));
  for (int b = 0; b < tc->model.n_layer; b++) {
    if (!r->user->impl[b]) continue;
    moe_ep_layer *l = moe_train_ep_layer(r->user->impl[b], NULL, NULL);
    char name[64];
    snprintf(name, sizeof name, MOE_TRAIN_BALANCE_STATE_NAME, b);
    const int i = moe_ckpt_reader_find(rd, name);
    const moe_ckpt_tensor_desc *d = i >= 0 ? moe_ckpt_reader_desc(rd, i) : NULL;
    blocks++;
    if (!d || d->dtype != MOE_CKPT_U8 || d->ndim != 1) {
      if (!afresh++) snprintf(why, sizeof why, "block %d has no balancer state", b);
      continue;
    }
    MOE_TRY(make_balancer(r, b, l, 0));
    const size_t bytes = (size_t)d->dims[0];
    moe_free(buf);
    buf = moe_malloc(bytes);
    moe_status local = buf ? moe_ckpt_reader_read(rd, i, 0, bytes, buf)
                           : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                          "cannot allocate %zu bytes of balancer state", bytes);
    MOE_TRY(agree(r, local, "reading the balancers' state"));
    if (moe_balancer_state_load(r->bal[b], buf, bytes) != MOE_STATUS_OK) {
      if (!afresh++) snprintf(why, sizeof why, "block %d's %s", b, moe_ctx_error(ctx));
      moe_ctx_clear_error(ctx);
      moe_balancer_destroy(r->bal[b]);
      r->bal[b] = NULL;
      continue;
    }
    MOE_TRY(moe_ep_layer_set_placement(l, moe_balancer_placement(r->bal[b])));
  }
  // a warning, so it is seen by default: the run is not the uninterrupted one
  if (afresh && r->rank == 0)
    MOE_WARN("%s: %d of %d MoE blocks plan their copies afresh from step %d (%s)", tc->resume,
             afresh, blocks, r->resume_info.step + 1, why);
done:
  moe_free(buf);
  moe_ckpt_reader_close(rd);
  return st;
}

// After the optimizer step, per MoE block: the load of the step (one
// all-gather), then DeepSeek-V3's router-bias update (tc->router_bias_rate)
// and the balancing policy's plan for the next step with its copies set
// (Trans of the updated parameters; tc->balance). Collective; every rank
// computes the same biases and plans.
static moe_status routing_step(run_state *r, moe_train_step_info *info) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const moe_train_config *tc = r->tc;
  const uint64_t t0 = moe_time_ns();
  const int E = tc->model.moe.num_experts, P = r->user->par.ep_size;
  const size_t PE = (size_t)E * (size_t)P;
  const int balancing = tc->balance.policy != MOE_BALANCE_NONE;
  moe_ep_layer *layers[MOE_GPT_MAX_LAYERS];
  const uint8_t *reps[MOE_GPT_MAX_LAYERS];
  int blk[MOE_GPT_MAX_LAYERS], n = 0;
  for (int b = 0; b < tc->model.n_layer; b++) {
    if (!r->user->impl[b]) continue;
    layers[n] = moe_train_ep_layer(r->user->impl[b], NULL, NULL);
    blk[n++] = b;
  }
  if (n == 0) goto done;
  if (!r->bal_load) {  // (blocks, EP, E) loads and (blocks, E, EP) plans
    r->bal_load = moe_calloc((size_t)n * PE, sizeof(int64_t));
    r->bal_replica = moe_calloc((size_t)n * PE, 1);
    r->bias_load = moe_calloc((size_t)E, sizeof(double));
    MOE_TRY(agree(r,
                  r->bal_load && r->bal_replica && r->bias_load
                      ? MOE_STATUS_OK
                      : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__,
                                     "cannot allocate the balancing tables"),
                  "balancing tables"));
  }
  // every block's load in one all-gather; the plans on every rank alike; every
  // block's placement in one agreement (a few collectives per step, not per block)
  MOE_TRY(moe_ep_layers_load(layers, n, r->bal_load));
  moe_status local = MOE_STATUS_OK;
  for (int i = 0; i < n; i++) {
    const int b = blk[i];
    const int64_t *load = r->bal_load + (size_t)i * PE;
    if (tc->router_bias_rate > 0) router_bias_step(r, b, load, P, info);
    if (!balancing) continue;
    if (!r->bal[b]) MOE_TRY(make_balancer(r, b, layers[i], 1));
    reps[i] = r->bal_replica + (size_t)i * PE;
    moe_balance_step_info bi;
    if (local == MOE_STATUS_OK)
      local = moe_balancer_step(r->bal[b], load, r->bal_replica + (size_t)i * PE, &bi);
    if (local != MOE_STATUS_OK) continue;
    info->balance_before += bi.ratio_before;
    info->balance_after += bi.ratio_after;
    info->copies += bi.copies;
  }
  if (balancing) {
    MOE_TRY(agree(r, local, "the balancing plan"));
    MOE_TRY(moe_ep_layers_set_placement(layers, n, reps));
  }
  info->balance_before /= n;
  info->balance_after /= n;
  info->expert_load_ratio /= n;
  if (balancing) info->balance_ms = moe_time_ms_since(t0);
done:
  return st;
}

// ---- the loop --------------------------------------------------------------------------------

moe_status moe_train_run(moe_ctx *ctx, MPI_Comm world, const moe_train_config *tc,
                         moe_train_result *out) {
  moe_status st = MOE_STATUS_OK;
  run_state r;
  memset(&r, 0, sizeof r);
  r.ctx = ctx;
  r.world = world;
  r.tc = tc;
  MPI_Comm_rank(world, &r.rank);
  MPI_Comm_size(world, &r.size);
  double *tps = NULL, *a2a = NULL, *exposed = NULL, *pass_ms = NULL, *grad_wait = NULL;
  int n_timed = 0, start = 1;
  memset(out, 0, sizeof *out);
  out->first_val_loss = out->final_val_loss = NAN;
  moe_train_config planned;  // tc with its 'auto' choices made
  MOE_TRY(moe_train_plan_for_run_(ctx, world, tc, &planned, &out->predicted_pass_ms));
  tc = &planned;
  r.tc = tc;

  MOE_TRY(setup(&r, &start));
  if (tc->balance.policy != MOE_BALANCE_NONE && r.user->par.ep_size > 1) {
    if (tc->balance_blockwise) {  // Pro-Prophet's block-wise scheduler
      moe_ep_layer *layers[MOE_GPT_MAX_LAYERS];
      int n = 0;
      for (int b = 0; b < tc->model.n_layer; b++)
        if (r.user->impl[b]) layers[n++] = moe_train_ep_layer(r.user->impl[b], NULL, NULL);
      MOE_TRY(moe_ep_layer_link(layers, n));  // local, the same on every rank
    }
    if (tc->resume) MOE_TRY(restore_balancers(&r));
  }
  out->first_step = start;
  out->schedule = r.schedule;
  out->ep_first = r.ep;
  out->ep_min = r.ep_min;
  out->parm_schedule = r.parm_pick;
  out->parm_t1_ms = r.parm_t1_ms;
  out->parm_t2_ms = r.parm_t2_ms;
  out->parm_terms_profile = r.parm_terms_profile;
  const int end = tc->stop_step > 0 && tc->stop_step < tc->steps ? tc->stop_step : tc->steps;
  out->last_step = end;
  MOE_FAIL_IF(ctx, start > end, MOE_STATUS_INVALID_ARG,
              "%s is at step %d already: nothing to train up to step %d (raise --steps)",
              tc->resume, start - 1, end);
  out->params_total = moe_gpt_total_elements(r.model);
  out->params_active = moe_gpt_active_elements(r.model);
  for (int i = 0; i < moe_gpt_num_params(r.model); i++)
    out->state_bytes += 16 * moe_gpt_get_param(r.model, i).numel;
  out->activation_bytes = moe_gpt_activation_bytes(r.model);
  out->memory = r.need;
  out->memory_max_total = r.need_max[0];
  out->memory_max_expected = r.need_max[1];
  snprintf(out->source, sizeof out->source, "%s", moe_text_source(r.text));
  const int nsteps = end - start + 1;
  tps = moe_calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof *tps);
  a2a = moe_calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof *a2a);
  exposed = moe_calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof *exposed);
  pass_ms = moe_calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof *pass_ms);
  grad_wait = moe_calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof *grad_wait);
  MOE_TRY(
      agree(&r,
            tps && a2a && exposed && pass_ms && grad_wait
                ? MOE_STATUS_OK
                : moe_error_at(ctx, MOE_STATUS_OUT_OF_MEMORY, __FILE__, __LINE__, "out of memory"),
            "allocation"));

  // A resumed run starts from the checkpoint's parameters: validate them, so
  // that the run's first validation is its true starting point (not a repeat
  // of its own last one). Not a step: no metrics line, no on_step call.
  if (start > 1 && r.val_batches > 0) {
    double v = NAN;
    MOE_TRY(validate(&r, &v));
    out->first_val_loss = v;
    out->first_val_step = start - 1;
  }
  const uint64_t t_begin = moe_time_ns();
  const int gtokens = tc->batch * r.s;
  int n_moe = 0;  // MoE blocks (the topology gate's share of re-selected choices)
  for (int b = 0; b < tc->model.n_layer; b++) n_moe += moe_gpt_block_is_moe(&tc->model, b);
  for (int step = start; step <= end; step++) {
    moe_watchdog_note_step(step);
    // steps start together: clean per-step times
    MOE_MPI_TRY_OP(ctx, "barrier at the start of a step", MPI_Barrier(world));
    const uint64_t t0 = moe_time_ns();
    moe_batch_train(&r.train, tc->seed, (uint64_t)step, r.part * r.bl, r.bl, r.s, r.tokens,
                    r.targets);
    moe_gpt_zero_grad(r.model);
    moe_gpt_loss l;
    MOE_TRY(moe_gpt_forward(r.model, r.tokens, r.targets, r.bl, r.s, (double)gtokens, &l));
    MOE_TRY(moe_gpt_backward(r.model));
    if (r.user->par.defer_agg)  // the MoE blocks' deferred Agg, before any gradient is read
      for (int b = 0; b < tc->model.n_layer; b++)
        if (r.user->impl[b])
          MOE_TRY(moe_ep_layer_grads_wait(moe_train_ep_layer(r.user->impl[b], NULL, NULL)));
    MOE_TRY(packing_measure(&r, step));
    test_slow_rank(&r, step);
    const uint64_t t_red = moe_time_ns();
    if (r.grad_red) {
      MOE_TRY(moe_grad_reducer_finish(r.grad_red, ctx));
    } else {
      MOE_TRY(allreduce_dense(&r));
    }
    const double grad_wait_ms = (double)(moe_time_ns() - t_red) / 1e6;
    double norm = 0;
    MOE_TRY(grad_norm(&r, &norm));
    const float lr = moe_optim_step(r.opt, r.model, moe_optim_clip_scale(&tc->optim, norm));
    moe_train_step_info info;
    memset(&info, 0, sizeof info);
    info.grad_wait_ms = grad_wait_ms;
    if (tc->balance.policy != MOE_BALANCE_NONE)  // this step's Trans and Agg not hidden
      for (int b = 0; b < tc->model.n_layer; b++) {
        if (!r.user->impl[b]) continue;
        const moe_ep_layer *el = moe_train_ep_layer(r.user->impl[b], NULL, NULL);
        info.trans_wait_ms += moe_ep_layer_trans_wait_ms(el);
        info.agg_ms += moe_ep_layer_agg_ms(el);
      }
    // the next step's placement of expert copies, with the updated parameters
    if (tc->balance.policy != MOE_BALANCE_NONE || tc->router_bias_rate > 0)
      MOE_TRY(routing_step(&r, &info));
    double sums[3] = {l.ce_sum, (double)l.dropped, (double)l.rerouted};
    // Deterministic: the loss is the sequences' sums in global order (below), so MPI's
    // sum covers only the dropped and re-selected counts (integers: exact in any order).
    const int det = tc->deterministic ? 1 : 0;
    if (r.parm_user && r.parm_pick == MOE_PARM_S1)  // each MP rank gated its own slice
      MOE_MPI_TRY_OP(ctx, "all-reduce of the step's loss",
                     MPI_Allreduce(MPI_IN_PLACE, &sums[1], 1, MPI_DOUBLE, MPI_SUM, r.mp_comm));
    MOE_MPI_TRY_OP(
        ctx, "all-reduce of the step's loss",
        MPI_Allreduce(MPI_IN_PLACE, sums + det, 3 - det, MPI_DOUBLE, MPI_SUM, sum_comm(&r)));
    if (det)
      MOE_TRY(moe_sum_slices_ordered(ctx, l.ce_seq, r.bl, 1, &sums[0], sum_comm(&r),
                                     "all-reduce of the step's loss"));
    const double step_s = (double)(moe_time_ns() - t0) * 1e-9;

    info.step = step;
    info.loss = sums[0] / gtokens;
    info.aux = l.aux;
    info.dropped = (int)sums[1];
    info.rerouted = (int)sums[2];
    info.lr = lr;
    info.grad_norm = norm;
    info.step_s = step_s;
    info.tokens_per_s = gtokens / step_s;
    double comm_s = 0, exposed_s = 0;
    comm_times(&r, &comm_s, &exposed_s, &info.moe_pass_ms);
    info.a2a_share = comm_s / step_s;
    info.exposed_share = exposed_s / step_s;
    info.val_loss = NAN;

    if (r.routing)
      MOE_TRY(
          moe_routing_trace_step_(ctx, world, r.routing, step, r.user->impl, tc->model.n_layer));
    if (tc->trace && step == (tc->trace_step > 0 ? tc->trace_step : end))
      MOE_TRY(write_trace(&r, t0));
    const int last = step == end;
    if (last || (tc->eval_every > 0 && step % tc->eval_every == 0) ||
        (step == 1 && tc->eval_every > 0))
      MOE_TRY(validate(&r, &info.val_loss));

    if (tc->balance.policy != MOE_BALANCE_NONE) {
      const double k = (double)(step - start);  // steps averaged so far
      out->balance_before = (out->balance_before * k + info.balance_before) / (k + 1);
      out->balance_after = (out->balance_after * k + info.balance_after) / (k + 1);
      out->balance_copies = (out->balance_copies * k + info.copies) / (k + 1);
      out->balance_ms = (out->balance_ms * k + info.balance_ms) / (k + 1);
      out->trans_wait_ms = (out->trans_wait_ms * k + info.trans_wait_ms) / (k + 1);
      out->agg_ms = (out->agg_ms * k + info.agg_ms) / (k + 1);
      const double share = (info.balance_ms + info.trans_wait_ms + info.agg_ms) / (step_s * 1e3);
      out->balance_exposed_share = (out->balance_exposed_share * k + share) / (k + 1);
    }
    if (tc->par.topo_gate > 0 && n_moe > 0) {
      const double k = (double)(step - start);
      const double share = info.rerouted / ((double)gtokens * tc->model.moe.top_k * n_moe);
      out->rerouted_share = (out->rerouted_share * k + share) / (k + 1);
    }
    if (tc->router_bias_rate > 0) {
      if (step == start) out->expert_load_ratio_first = info.expert_load_ratio;
      out->expert_load_ratio_last = info.expert_load_ratio;
      out->router_bias_max = info.router_bias_max;
    }
    if (step == start) out->first_loss = info.loss;
    out->final_loss = info.loss;
    if (!isnan(info.val_loss)) {
      if (isnan(out->first_val_loss)) {
        out->first_val_loss = info.val_loss;
        out->first_val_step = step;
      }
      out->final_val_loss = info.val_loss;
      out->final_val_step = step;
    }
    if (step > start || nsteps == 1) {
      tps[n_timed] = info.tokens_per_s;
      a2a[n_timed] = info.a2a_share;
      exposed[n_timed] = info.exposed_share;
      pass_ms[n_timed] = info.moe_pass_ms;
      grad_wait[n_timed] = info.grad_wait_ms;
      n_timed++;
    }
    const double elapsed = (double)(moe_time_ns() - t_begin) * 1e-9;
    if (r.rank == 0) {
      if (r.progress && (step % tc->log_every == 0 || last || !isnan(info.val_loss)))
        moe_progress_update(r.progress, step, info.loss, info.val_loss, info.tokens_per_s,
                            info.a2a_share, elapsed);
      if (r.metrics) {
        const char *names[24] = {"aux", "grad_norm", "exposed_share", "dropped", "step_ms"};
        double vals[24] = {info.aux, info.grad_norm, info.exposed_share, info.dropped,
                           step_s * 1e3};
        int n_vals = 5;
        if (r.size > 1) {  // the dense gradients' sum not hidden by the backward
          names[n_vals] = "grad_wait_ms";
          vals[n_vals++] = info.grad_wait_ms;
        }
        // a dense model has no MoE pass; the balance values only when balancing,
        // the router-bias ones only with its update
        if (!isnan(info.moe_pass_ms)) {
          names[n_vals] = "moe_pass_ms";
          vals[n_vals++] = info.moe_pass_ms;
          if (tc->balance.policy != MOE_BALANCE_NONE) {
            names[n_vals] = "balance_ratio";
            vals[n_vals++] = info.balance_before;
            names[n_vals] = "balance_after";
            vals[n_vals++] = info.balance_after;
            names[n_vals] = "copies";
            vals[n_vals++] = info.copies;
            names[n_vals] = "balance_ms";
            vals[n_vals++] = info.balance_ms;
            names[n_vals] = "trans_wait_ms";
            vals[n_vals++] = info.trans_wait_ms;
            names[n_vals] = "agg_ms";
            vals[n_vals++] = info.agg_ms;
          }
          if (tc->par.topo_gate > 0) {
            names[n_vals] = "rerouted";
            vals[n_vals++] = info.rerouted;
          }
          if (tc->router_bias_rate > 0) {
            names[n_vals] = "expert_load_ratio";
            vals[n_vals++] = info.expert_load_ratio;
            names[n_vals] = "router_bias_max";
            vals[n_vals++] = info.router_bias_max;
          }
        }
        // A full disk must not stop training (nor leave the other ranks waiting).
        if (moe_metrics_write(r.metrics, step, info.loss, info.val_loss, info.tokens_per_s,
                              info.a2a_share, lr, elapsed, names, vals, n_vals) != MOE_STATUS_OK) {
          MOE_WARN("metrics: %s; no more metrics are written", moe_ctx_error(ctx));
          moe_metrics_close(r.metrics);
          r.metrics = NULL;
        }
      }
    }
    if (tc->on_step) tc->on_step(tc->on_step_user, &info);
    MOE_TRY(packing_step(&r, step, out));
    if (tc->checkpoint && (last || (tc->save_every > 0 && step % tc->save_every == 0)))
      MOE_TRY(save_checkpoint(&r, tc->checkpoint, step));
  }
  if (r.progress) moe_progress_finish(r.progress);
  out->train_s = (double)(moe_time_ns() - t_begin) * 1e-9;
  out->tokens_per_s = median(tps, n_timed);
  out->a2a_share = median(a2a, n_timed);
  out->exposed_share = median(exposed, n_timed);
  out->grad_wait_ms = median(grad_wait, n_timed);
  out->grad_buckets = moe_grad_reducer_buckets(r.grad_red);
  out->ep_last = r.ep;
  out->moe_pass_ms = n_timed > 0 && !isnan(pass_ms[0]) ? median(pass_ms, n_timed) : NAN;
done:
  moe_free(tps);
  moe_free(a2a);
  moe_free(exposed);
  moe_free(pass_ms);
  moe_free(grad_wait);
  teardown(&r);
  return st;
}
