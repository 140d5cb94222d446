// Training MoE-GPT under MPI: data parallelism x expert parallelism, the MoE
// layers on the task engine, AdamW with warm-up and cosine decay, gradient
// clipping, validation, checkpoints (save, resume, redistribution to another
// world size), progress line, metrics and traces.
//
// Layout: every rank of `world` processes B / P of the global batch's B
// sequences (rank r the r-th slice, so the global batch is the same for every
// P). The MoE layers are expert-parallel over EP ranks (pc.ep_size; DP = P /
// EP); dense parameters are replicated and their gradients summed over the
// world. The math is the single-process model's on the global batch: with no
// dropped tokens every layout gives the same losses up to float summation
// order (tests/test_train.c).
//
// Threading: one thread per rank; MPI initialised with MPI_THREAD_MULTIPLE (the
// MoE layers' all-to-alls run on the executor's communication thread).
#ifndef MOE_TRAIN_H
#define MOE_TRAIN_H

#include <mpi.h>

#include "moe/balance.h"
#include "moe/gpt_io.h"
#include "moe/model.h"
#include "moe/parallel.h"
#include "moe/parm.h"
#include "moe/perf.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- MoE-GPT's expert-parallel FFN backend -------------------------------------

// The moe_gpt_moe_ops that runs a model's MoE blocks as moe_ep_layer over
// `world` with `par` (the trainer's backend; the inference engine uses it too).
// Its user is a moe_train_ep_user that outlives the model; create fills impl
// with each MoE block's instance (NULL for dense blocks). Every call is
// collective over world, in the same order on every rank.
typedef struct {
  MPI_Comm world;
  moe_parallel_config par;
  void *impl[MOE_GPT_MAX_LAYERS];
  // Optional (NULL: none): called on every rank just before block `block`'s
  // MoE forward of `tokens` tokens (this rank's), at the same point of the
  // model's forward on every rank, so it may make collective calls (the
  // inference engine places expert copies there: Lina's phase 1). A status
  // other than OK fails the forward.
  moe_status (*pre_forward)(void *arg, int block, int tokens);
  void *pre_forward_arg;
} moe_train_ep_user;
extern const moe_gpt_moe_ops moe_train_ep_ops;
// The layer of a backend instance (moe_train_ep_user.impl[block]) and when its
// last forward / backward began (either pointer may be NULL).
moe_ep_layer *moe_train_ep_layer(void *impl, uint64_t *fwd_start_ns, uint64_t *bwd_start_ns);

typedef struct {
  int step;              // 1-based step just finished
  double loss;           // global mean cross-entropy of the step's batch (nats per token)
  double aux;            // sum over MoE layers of the aux loss (global)
  double val_loss;       // validation cross-entropy, NAN when not measured at this step
  double lr;             // learning rate used
  double grad_norm;      // global L2 norm before clipping
  double step_s;         // wall time of the step (rank 0), validation excluded
  double tokens_per_s;   // global tokens / step_s
  double a2a_share;      // all-to-all busy time / step time (rank 0, every MoE pass)
  double exposed_share;  // all-to-all time not hidden by compute / step time (rank 0)
  double moe_pass_ms;    // forward + backward pass makespans per MoE layer, ms (rank 0)
  int dropped;           // dropped choices over the world
  int rerouted;  // choices the topology-aware gate re-selected over the world (par.topo_gate)
  // load balancing (tc->balance; zeros without): over the MoE layers, the
  // mean balance ratio of the step's load without copies and under the
  // placement planned for the next step, the copies placed, and the time of
  // the balancing (load, plan, Trans) in step_s
  double balance_before, balance_after;
  int copies;
  double balance_ms;
  // ... and, summed over the MoE layers, the time of the copies' transfers
  // that no compute hid on rank 0: the forward's wait for the Trans posted
  // after the last step (its posting is in balance_ms) and the Agg of the
  // copies' gradients (moe_ep_layer_agg_ms)
  double trans_wait_ms, agg_ms;
  // router-bias update (tc->router_bias_rate > 0; zero without): over the
  // MoE layers, the mean of the step's expert load ratio (the busiest
  // expert's kept rows over the mean per expert; 1 = even) and the largest
  // |router bias| after the update
  double expert_load_ratio, router_bias_max;
  // the time rank 0 waited after its backward for the dense gradients' sum
  // (the whole all-reduce without buckets; the part the backward did not
  // hide with them), ms
  double grad_wait_ms;
} moe_train_step_info;

// MoE-GPT's Parm backend (docs/parm.md): the MoE blocks as moe_parm_layer
// over `world` with `parm` (MP x EP x ESP, the schedule); MP peers feed it the
// same tokens (the model's tensor parallelism). Its user outlives the model;
// create fills impl. Every call is collective over world.
typedef struct {
  MPI_Comm world;
  moe_parm_config parm;
  void *impl[MOE_GPT_MAX_LAYERS];
} moe_train_parm_user;
extern const moe_gpt_moe_ops moe_train_parm_ops;
moe_parm_layer *moe_train_parm_layer(void *impl);

typedef struct {
  moe_gpt_config model;
  moe_optim_config optim;   // optim.total_steps is forced to `steps` (fresh runs;
                            // resumed: see moe_train_schedule_resolve)
  moe_parallel_config par;  // par.ep_size 0 = the world size
  // 'auto' in par.a2a, par.schedule or par.compress, or par.chunks 0, is chosen
  // by the planner for the MoE layer's shape (moe_train_plan) from this
  // profile ('moe calibrate' on these ranks, EP over all of them). NULL:
  // 'auto' is an error. The caller keeps it alive during moe_train_run.
  const moe_profile *profile;
  int allow_lossy;  // 1: compress 'auto' may pick lossy compressors
  // 1 (default): deterministic mode (docs/reliability.md): moe_gemm on the
  // fixed backend (set process-wide by moe_train_run), dense and gate weight
  // gradients summed per sequence in a pairwise tree and over ranks with
  // moe_allreduce_fixed, the loss and the gate statistics summed per
  // sequence in global order, the gradient norm per expert. The losses and
  // parameters are then bitwise the same at any rank count when B / P is a
  // power of two, EP = P, chunks = 1 and no lossy compressor is used
  // (moe_train_bitwise_across_p says why not otherwise). 0: `backend`
  // (default openblas) and MPI's own reductions (bits vary with P).
  int deterministic;
  int batch;               // B, global sequences per step; divisible by the world size
  int steps;               // the schedule's length: lr decays to min_lr at this step
  int stop_step;           // stop (validate, save) after this step; 0 = steps. A run
                           // resumed from it continues exactly as if never stopped
  uint64_t seed;           // parameters and batches
  double val_fraction;     // share of the text held out for validation, (0, 0.5]
  int eval_every;          // validate every N steps and at the last (0: only at the last)
  int eval_batches;        // global batches of B validation windows per validation
  int save_every;          // save every N steps (0: only at the end); needs checkpoint
  const char *data;        // text file, NULL: the default corpus (moe_text_load)
  const char *checkpoint;  // where to save (NULL: never)
  const char *resume;      // checkpoint to start from (NULL: fresh); its learning-rate
                           // schedule is kept (moe_train_schedule_resolve)
  const char *metrics;     // JSON lines (rank 0), NULL: none
  int metrics_append;      // 1: append to metrics (a resumed run)
  const char *trace;       // merged Chrome trace of one step's MoE passes, NULL: none
  int trace_step;          // the step traced (0: the last)
  int progress;            // 1: progress line on rank 0 (stderr)
  int progress_tty;        // -1 detect, 0 plain lines, 1 redraw in place
  int log_every;           // progress line every N steps (>= 1)
  // Called on every rank after every step (may be NULL).
  void (*on_step)(void *user, const moe_train_step_info *info);
  void *on_step_user;
  // Memory bound: per-rank limit in bytes for moe_train_run's check before it
  // allocates the model (0: the node's available memory / its ranks; see
  // moe_comm_memory_check). Appended last, so zeroed configs keep working.
  size_t max_memory;
  // Compute backend of moe_gemm (moe_backend_find's names), set process-wide
  // by moe_train_run with `threads` compute threads (>= 1; 0 means 1). NULL:
  // fixed when deterministic, else openblas. Deterministic mode needs a
  // batch-invariant backend (fixed); another one is refused.
  const char *backend;
  int threads;
  // Precision of the GEMMs (moe_precision_use, process-wide): fp32 (default)
  // or bf16 mixed precision (fp32 masters, gradients, optimizer, router;
  // checkpoints the same in both). bf16 needs a backend with a bf16 GEMM
  // (fixed) and a CPU with AVX512_BF16 (moe_compute_check).
  moe_precision precision;
  // Routing trace (docs/balance.md): per step and MoE layer, the (source rank
  // x expert) matrix of kept rows, JSON lines written by rank 0; appended to
  // when metrics_append (a resumed run). NULL: none.
  const char *routing_trace;
  // Load balancing (docs/balance.md): with balance.policy other than none,
  // every MoE layer gets balance.slots copy slots per rank (par.copy_slots is
  // set from it) and its own moe_balancer; after every optimizer step the
  // layer's load is all-gathered, the policy plans the next step's placement
  // and the copies receive their homes' updated parameters. The losses are
  // those of training without it to rounding (expert gradients are summed in
  // another order), so not bitwise across rank counts. balance.cost with
  // flops_per_s <= 0: the rates come from `profile` when given; else, in
  // deterministic mode, the fixed MOE_TRAIN_BALANCE_FLOPS and _NET (so two
  // runs of one config plan alike and give the same bits); else they are
  // measured on each layer's first step (moe_ep_layer_rates). Needs EP >= 2.
  // Checkpoints also hold each MoE block's balancer state
  // (MOE_TRAIN_BALANCE_STATE_NAME); a run resumed with the same balancing
  // config and EP size restores it and continues bitwise. Default: none.
  moe_balance_config balance;
  // With balancing: 1 = Pro-Prophet's block-wise scheduler (the MoE layers
  // linked, moe_ep_layer_link: each one's comm stream progresses the other
  // layers' Trans and Agg while it waits); 0 = the transfers progress only
  // inside other MPI calls. Same bits either way. Default 1.
  int balance_blockwise;
  // DeepSeek-V3's auxiliary-loss-free load balancing (docs/balance.md
  // "Router bias"): > 0: after every optimizer step each MoE layer's router
  // bias moves by this rate, b_e += rate * sign(mean load - load_e), from the
  // step's kept rows per expert summed over the world (the same integers on
  // every rank, so every rank, world size and rerun holds the same bias).
  // Experts are then chosen by logits + bias and weighed without it. The
  // bias is saved in checkpoints. 0 (default): off. Range [0, 1].
  float router_bias_rate;
  // The dense gradients' sum over the world (docs/training.md "Gradient
  // buckets"): > 0: buckets of about this many MiB, in the order the backward
  // finishes the tensors, each started as soon as its tensors are final and
  // advanced while the backward goes on (moe_grad_reducer: at each block's end
  // and by the MoE layers' comm streams whenever they would wait). 0
  // (default): one packed all-reduce after the backward. The same bits either way when
  // deterministic (the fixed-order sum is elementwise); otherwise MPI's order may differ in the
  // last bits. Range [0, 4096].
  double grad_bucket_mb;
  // With buckets: each bucket's sum in micro-ops of at most this many KiB (one
  // in flight, never two buckets in one), 0: a bucket per operation. Default
  // 256 (Lina's 30 MB on 100 Gb/s is 2.4 ms of the link; 256 KiB is about
  // 2 ms of 1 Gbit/s, docs/lina.md). Range [0, 1048576].
  double micro_op_kb;
  // With buckets: MOE_COMM_PRIORITY_FIFO (default) starts a micro-op as soon
  // as its bucket is ready; _LINA holds new ones back during each MoE layer's
  // backward except in its all-to-all stream's gaps (docs/lina.md).
  moe_comm_priority comm_priority;
  // Expert packing (Lina; docs/lina.md): a run-time change of the EP degree
  // that puts more experts on each rank (EP halves, the experts' data
  // parallelism doubles), their parameters and AdamW moments moved with
  // them. 0 (default): off. N >= 2: the experts per rank multiplied by N
  // after step packing_start - 1 (N must divide the EP size). MOE_TRAIN_PACKING_LINA:
  // Lina's rule: after step packing_start - 1 and then every packing_every
  // steps, double the experts per rank while an expert micro-op (one chunk's
  // FFN task) is shorter than an all-to-all micro-op (one chunk's
  // all-to-all), measured on the step just run (the slowest rank's means).
  // Not with load balancing. Defaults 10 and 4 (Lina's).
  int packing;
  int packing_start, packing_every;
  // Parm (docs/parm.md), on when parm_on: tensor parallelism of the dense
  // parts over MP ranks (moe_gpt_create_tp) and the MoE blocks on
  // moe_parm_layer with experts sharded over ESP ranks; world = DP x MP x EP x
  // ESP with EP = par.ep_size, or world / (MP ESP) when 0; MP peers train on
  // the same sequences (batch divisible by world / MP). par.a2a and
  // par.ranks_per_node apply. Not with deterministic mode, load balancing,
  // expert packing, gradient buckets, the topology-aware gate, the router-bias
  // update, traces, schedules other than sequential, chunks or compression.
  int parm_on;
  int mp, esp;                      // [1, 1]
  moe_parm_schedule parm_schedule;  // [MOE_PARM_S2]
  int parm_saa;                     // s2's SAA [1]
  int parm_auto;  // 1: Parm's Algorithm 1 picks s1 or s2 per run from alpha-beta terms
                  // measured at setup on the layout (moe_measure_parm_alpha_beta) [0]
} moe_train_config;

#define MOE_TRAIN_PACKING_LINA (-1)
// 1 when tc->packing may change the EP size: a degree >= 2 or Lina's rule
// (0 and 1 leave it as it is).
static inline int moe_train_packing_on(const moe_train_config *tc) {
  return tc->packing == MOE_TRAIN_PACKING_LINA || tc->packing > 1;
}

// The planners' rates in deterministic training without a profile: one CPU
// core's fp32 GEMM and a shared-memory MPI link (measured on the development
// machine, docs/balance.md).
// The checkpoint tensor (u8) of MoE block b's balancer state
// (moe_balancer_state_save), written when training balances.
#define MOE_TRAIN_BALANCE_STATE_NAME "h%d.balance.state"
#define MOE_TRAIN_BALANCE_FLOPS 5e10
#define MOE_TRAIN_BALANCE_NET 5e9

// 1 when a run of tc on `world` ranks gives the same bits (losses, parameters,
// checkpoints) as on any other rank count meeting the same conditions:
// deterministic on, B / world a power of two, EP = world, one chunk per pass
// (chunks 1, not the smart schedule), a lossless compressor, dropless experts
// (capacity is applied per source rank). With Parm (tc->parm_on): B / (world /
// MP) a power of two, at any EP, ESP and DP (its layer chains the expert
// gradients and the shards' sums; docs/parm.md). Else 0 with the first reason that
// fails in why (may be NULL). 'auto' choices are judged as given (chunks 0
// or compress auto: not known to hold).
int moe_train_bitwise_across_p(const moe_train_config *tc, int world, char *why, size_t why_size);

// The compute backend tc asks for (its `backend`, or the default for its
// deterministic setting). Fails naming the valid backends for an unknown or
// unavailable one, and for deterministic mode on a backend that is not
// batch-invariant.
moe_status moe_train_backend(moe_ctx *ctx, const moe_train_config *tc, const moe_backend **out);

// The bytes one rank of a run of tc on world_size ranks allocates, by
// category, without allocating: the model (moe_gpt_memory: dense parameters,
// gradients, activations), its MoE blocks on the expert-parallel backend
// (moe_ep_layer_memory per block, with B / P tokens per rank, EP = par.ep_size
// or world_size, the receive side at the most rows that can arrive, what a
// balanced routing would not need in skew_bytes), AdamW's state, the trainer's gradient buffer
// (gradients) and token buffers (workspace). The ranks per node of the 1dh/2dh bound are
// par.ranks_per_node or, when 0, the EP size (an upper bound). The process
// baseline (code, libraries, MPI, the loaded text) is not included: moe_train_run
// adds the resident set measured before it allocates, plus MOE_MEM_BLAS_BYTES
// when the run is not deterministic (only then does it call OpenBLAS). INVALID_ARG
// when tc is invalid for world_size ranks, or 'auto' is left in par.
moe_status moe_train_memory(moe_ctx *ctx, const moe_train_config *tc, int world_size,
                            moe_memory_need *out);

// Defaults: the default model and optimizer, EP = world, B 16, 200 steps, seed
// 1, val 0.1, eval every 50, 4 eval batches, no files, progress on, log every 1.
void moe_train_config_default(moe_train_config *tc);

// The learning-rate schedule a run uses (moe_optim_lr: linear warm-up to lr,
// cosine decay to min_lr at total_steps, min_lr after it).
typedef struct {
  float lr, min_lr;
  int warmup_steps, total_steps;
  int from_checkpoint;  // 1: the resumed checkpoint's, kept; 0: this run's config
                        // (a fresh run, or a checkpoint that stores none: version 1)
  int resumed_step;     // the checkpoint's step (0 for a fresh run)
  int extended;         // steps total_steps + 1 .. tc->steps run at min_lr (resumed with
                        // steps beyond the stored schedule's end), 0 otherwise
} moe_train_schedule;

// The schedule of a run of tc (no MPI; every rank computes the same). Fresh
// (info NULL) or a checkpoint without a stored schedule (info->has_schedule
// 0: the behaviour of libmoe before it stored one): tc->optim's lr, min_lr,
// warmup_steps, with total_steps = tc->steps. Resumed from a checkpoint that
// stores its schedule: that schedule, unchanged, so the learning rate of
// every step is the one the original run would have used. INVALID_ARG when
// tc asks for another one: tc->optim.lr, min_lr or warmup_steps differ from
// the stored values, or tc->steps ends before the stored total_steps (stop
// earlier with stop_step instead). tc->steps beyond total_steps is allowed:
// the extra steps run at min_lr (out->extended).
moe_status moe_train_schedule_resolve(moe_ctx *ctx, const moe_train_config *tc,
                                      const moe_gpt_ckpt_info *info, moe_train_schedule *out);

typedef struct {
  int first_step;            // 1, or the resumed step + 1
  int last_step;             // steps
  double first_loss;         // loss of the first step run
  double final_loss;         // loss of the last step
  double first_val_loss;     // first validation (NAN if none): a resumed run validates
                             // the checkpoint's parameters before its first step
  double final_val_loss;     // last validation (NAN if none)
  int first_val_step;        // step of first_val_loss (first_step - 1 when resumed; 0 if none)
  int final_val_step;        // step of final_val_loss (0 if none)
  double tokens_per_s;       // median over the steps after the first
  double a2a_share;          // median
  double exposed_share;      // median
  double moe_pass_ms;        // median of the steps' moe_pass_ms (NAN without MoE layers)
  double predicted_pass_ms;  // the profile's prediction of the same quantity (NAN: no profile)
  double train_s;            // wall time of the training loop (validation included)
  size_t params_total;       // elements of the model (experts once)
  size_t params_active;      // elements one token uses
  size_t state_bytes;        // rank 0: parameters + gradients + AdamW m and v it holds (16 B each)
  size_t activation_bytes;   // rank 0: moe_gpt_activation_bytes (activations and scratch)
  moe_memory_need memory;    // rank 0: moe_train_memory + the measured baseline, what
                             // the memory check compared with the limit (its total:
                             // the upper bound; moe_memory_need_expected: the prediction)
  double memory_max_total;   // the largest total of memory over the ranks (bytes)
  double memory_max_expected;   // the largest moe_memory_need_expected over the ranks (bytes)
  moe_train_schedule schedule;  // the learning-rate schedule used
  char source[256];             // the text's description
  // load balancing (tc->balance; zeros without): means over the steps of
  // the step infos' balance_before, balance_after, copies, balance_ms,
  // trans_wait_ms and agg_ms, and of their share of the step (balance_ms +
  // trans_wait_ms + agg_ms over step_s: the balancing no compute hid)
  double balance_before, balance_after, balance_copies, balance_ms;
  double trans_wait_ms, agg_ms, balance_exposed_share;
  // router-bias update (tc->router_bias_rate > 0; zeros without): the step
  // infos' expert_load_ratio on the first and the last step, and the last
  // router_bias_max
  double expert_load_ratio_first, expert_load_ratio_last, router_bias_max;
  // topology-aware gate (par.topo_gate > 0): the mean over the steps of the
  // share of the world's T x K choices per MoE layer that were re-selected
  double rerouted_share;
  double grad_wait_ms;  // median of the steps' grad_wait_ms (about 0 on one rank)
  int grad_buckets;     // the dense gradients' buckets (tc->grad_bucket_mb; 0: packed)
  // expert packing (tc->packing): the EP size at the first and the last step,
  // and each evaluation (up to 16): after which step, the EP size before and
  // after, the expert and all-to-all micro-op times it compared (ms; 0 for a
  // fixed degree)
  int ep_first, ep_last;
  int ep_min;  // expert packing: the smallest EP the all-to-all runs on (Lina stops there)
  // Parm (tc->parm_on): the schedule the MoE blocks ran (Algorithm 1's pick
  // with parm_auto) and Algorithm 1's two predictions (ms, 0 without auto;
  // parm_t1_ms NAN when s1 cannot run: deterministic mode, a data part's
  // sequences not divisible by MP)
  moe_parm_schedule parm_schedule;
  double parm_t1_ms, parm_t2_ms;
  // 1: auto's alpha-beta terms came from tc->profile (moe calibrate's "parm"
  // for this layout and all-to-all); 0: measured at the start
  int parm_terms_profile;
  int packing_n;
  struct {
    int step, ep_from, ep_to;
    double ffn_ms, a2a_ms;
  } packing_log[16];
} moe_train_result;

// Collective over world. Before allocating the model every rank computes its
// need (moe_train_memory + its measured baseline) and checks it against
// tc->max_memory or its share of the node's available memory
// (moe_comm_memory_check): a run that does not fit fails on every rank with
// INVALID_ARG naming the rank, its need by category and the limit.
// Errors (on every rank, no hang): invalid configs,
// B not divisible by P, E not divisible by EP, unreadable data, a checkpoint
// that cannot be read or does not match the model, a failed save (the
// previous checkpoint is kept).
moe_status moe_train_run(moe_ctx *ctx, MPI_Comm world, const moe_train_config *tc,
                         moe_train_result *out);

// Plans the MoE layers' 'auto' choices of tc->par (see tc->profile) and
// writes them into tc->par; plan (may be NULL) receives the planner's result:
// plan->best is the variant, plan->predicted its simulated times, whose
// pass_ms[0] + pass_ms[1] is the forward + backward makespan of one MoE layer
// (what moe_train_result.moe_pass_ms measures). Without 'auto' it predicts the
// fixed choice. Collective over world only in that every rank must call it
// with the same tc (no communication). Errors: no profile, a profile
// calibrated on another number of ranks or EP not over all of them, B not
// divisible by P, no candidate that runs. moe_train_run calls it itself when
// tc has 'auto' left.
moe_status moe_train_plan(moe_ctx *ctx, MPI_Comm world, moe_train_config *tc, moe_plan *plan);

// Reads the model config stored in a checkpoint written by moe_train_run (no
// MPI needed) and the step it was saved at (step may be NULL).
moe_status moe_train_checkpoint_config(moe_ctx *ctx, const char *path, moe_gpt_config *cfg,
                                       int *step);

#ifdef __cplusplus
}
#endif
#endif  // MOE_TRAIN_H
