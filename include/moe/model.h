// MoE-GPT: a GPT-2-style byte-level language model whose feed-forward layers
// are MoE layers, with its forward, backward and optimizer.
//
// Architecture (docs/model.md): token embedding wte (V, M) + learned position
// embedding wpe (S, M); L pre-LN blocks
//     x = x + proj(attn(ln1(x)))        causal multi-head self-attention
//     x = x + ffn(ln2(x))               MoE layer, or a dense FFN (moe_every)
// final layernorm lnf; logits = lnf(x) wte^T (tied LM head); loss = mean
// cross-entropy + sum over MoE layers of aux_loss_coef * aux + z_loss_coef * z
// (the MoE layers add their auxiliary gradients themselves).
//
// The MoE FFNs go through a backend (moe_gpt_moe_ops): the default one is the
// single-process moe_layer (every expert local); the trainer plugs in the
// expert-parallel layer (MPI) without this header depending on MPI.
//
// Dimension letters: B sequences, S sequence length, V vocabulary, M model
// dim (d_model), L layers, NH heads, E experts, K top-k, H expert hidden dim.
//
// Threading: a moe_gpt is used by one thread at a time with its moe_ctx.
#ifndef MOE_MODEL_H
#define MOE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "moe/core.h"
#include "moe/kernels.h"
#include "moe/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- configuration ----------------------------------------------------------------

#define MOE_GPT_MAX_LAYERS 256

typedef struct {
  int vocab_size;    // V, [2, 65536]; 256 for bytes
  int seq_len;       // S: context length (wpe rows), [1, 65536]
  int n_layer;       // L, [1, MOE_GPT_MAX_LAYERS]
  int n_head;        // NH, divides d_model
  int d_model;       // M, [1, MOE_MAX_DIM]
  int moe_every;     // block i has an MoE FFN iff (i + 1) % moe_every == 0; 1 = every block,
                     // 2 = every other block (dense FFN in blocks 0, 2, ...); 0 = no MoE (dense)
  int dense_hidden;  // hidden width of the dense FFN blocks (GELU), [1, MOE_MAX_DIM]
  float ln_eps;      // layernorm epsilon (> 0)
  float init_std;    // std of the normal init of weights (GPT-2: 0.02)
  // The MoE layers: moe.model_dim is forced to d_model and moe.tokens to the
  // batch's B * S by moe_gpt_create; the other fields (experts, top_k,
  // hidden_dim, capacity_factor, act, renormalize, aux/z coefficients,
  // expert kind) are the MoE layer's.
  moe_layer_config moe;
} moe_gpt_config;

// Defaults: V 256, S 128, L 4, NH 4, M 128, moe_every 1, dense_hidden 512,
// ln_eps 1e-5, init_std 0.02, MoE: E 8, K 2, H 256, dropless (f = -1), gelu,
// renormalize, aux 0.01, z 0.
void moe_gpt_config_default(moe_gpt_config *cfg);
// INVALID_ARG naming the field, its value and the valid range.
moe_status moe_gpt_config_validate(moe_ctx *ctx, const moe_gpt_config *cfg);
// Overrides fields from a JSON object with keys vocab_size, seq_len, n_layer,
// n_head, d_model, moe_every, dense_hidden, ln_eps, init_std and "moe": {layer
// config keys, see moe_layer_config_from_json}. Strict: unknown/repeated keys,
// wrong types, malformed JSON are errors; cfg unchanged on error.
moe_status moe_gpt_config_from_json(moe_ctx *ctx, const char *json, moe_gpt_config *cfg);
// Writes every field as one JSON object (readable by moe_gpt_config_from_json).
moe_status moe_gpt_config_to_json(moe_ctx *ctx, const moe_gpt_config *cfg, char *buf, size_t len);
// 1 when block i has an MoE FFN.
int moe_gpt_block_is_moe(const moe_gpt_config *cfg, int block);

// ---- MoE FFN backends ---------------------------------------------------------------------

// Parameters one backend instance holds (the gate is always whole; experts
// home_first .. home_first + home_count - 1 of E). Shapes as moe_layer_tensors,
// with home_count in place of E for the experts. router_bias (E, whole on
// every rank): the layer's router bias (moe_layer_tensors.router_bias), not a
// parameter (no gradient, no optimizer state); DeepSeek-V3's aux-loss-free
// update writes it in training (moe_train_config.router_bias_rate) and the
// checkpoint stores it.
// Experts sharded along H (Parm's ESP, include/moe/parm.h): shards > 1 when
// this instance holds shard `shard` of each home expert: w1's columns and
// b1's entries shard H/shards .. (shard + 1) H/shards - 1 and those rows of
// w2 (w1 (home_count, M, H/shards), b1 (home_count, H/shards), w2
// (home_count, H/shards, M)); b2 whole. The gradients are complete (the
// backend sums them). shards 0 or 1: whole experts.
typedef struct {
  int home_first, home_count;
  float *wg, *w1, *b1, *w2, *b2;
  float *dwg, *dw1, *db1, *dw2, *db2;
  float *router_bias;
  int shard, shards;
} moe_gpt_moe_tensors;

// One MoE FFN implementation. `user` is the pointer given to moe_gpt_create.
// Every function of a distributed backend may be collective: the model calls
// them in the same order on every rank.
typedef struct {
  const char *name;
  moe_status (*create)(void *user, moe_ctx *ctx, const moe_layer_config *cfg, int block,
                       void **impl);
  void (*destroy)(void *impl);
  // The same values as moe_layer_init_params(seed) on the whole layer.
  void (*init_params)(void *impl, uint64_t seed);
  void (*zero_grad)(void *impl);
  moe_gpt_moe_tensors (*tensors)(void *impl);
  // x (T, M) -> y (T, M); stats as moe_layer_forward (global aux/z for a distributed backend).
  moe_status (*forward)(void *impl, const float *x, int tokens, float *y, moe_layer_stats *stats);
  // dy (T, M) -> dx (T, M) +=; parameter gradients +=.
  moe_status (*backward)(void *impl, const float *dy, float *dx);
} moe_gpt_moe_ops;

// The single-process backend (moe_layer).
extern const moe_gpt_moe_ops moe_gpt_moe_local;

// ---- the model -----------------------------------------------------------------------------

typedef struct moe_gpt moe_gpt;

typedef enum {
  MOE_GPT_PARAM_DENSE = 0,   // embeddings, attention, LN, dense FFN: replicated over DP (and
                             // over MP unless tp_dim >= 0: see moe_gpt_param.tp_dim)
  MOE_GPT_PARAM_GATE = 1,    // an MoE gate wg (replicated)
  MOE_GPT_PARAM_EXPERT = 2,  // expert tensors w1/b1/w2/b2 of the home experts
} moe_gpt_param_kind;

// One parameter tensor of the model (view; the model owns the memory).
typedef struct {
  char name[64];            // e.g. "wte", "h0.ln1.g", "h1.attn.w_qkv", "h1.moe.w1"
  moe_gpt_param_kind kind;  //
  float *data, *grad;       // numel floats each
  size_t numel;             // elements held here
  int ndim;                 // of the WHOLE tensor
  int64_t dims[4];          // WHOLE tensor's shape (experts: E first)
  int decay;                // 1: AdamW weight decay applies: the weight matrices (wte, wpe,
                            // w_qkv, w_proj, w_fc, w_fc2, wg, w1, w2); 0 for biases, LN and
                            // the expert biases b1 (E, H), b2 (E, M) (ndim 2, still biases)
  int block;                // block index, -1 for wte/wpe/lnf
  int expert_first;         // EXPERT: first home expert; dims[0] = E; numel = count * rest
  int expert_count;         // EXPERT: home experts held here
  // Tensor parallelism (moe_gpt_tp, MP size > 1): the dimension this tensor is
  // split along over the MP ranks, or -1 when every MP rank holds it whole
  // (then tp_parts 1, tp_first 0, tp_count 0). A split dimension is packed from
  // tp_parts equal parts (3 for attn.w_qkv's and attn.b_qkv's q|k|v, else 1);
  // this rank holds indices tp_first .. tp_first + tp_count - 1 of each part,
  // the parts' pieces concatenated in order (w_qkv here: (M, 3 tp_count), its
  // q, k, v columns). numel counts the slice. A split tensor's gradient holds
  // only this rank's contribution: sum it over DP, never over MP; a tensor with
  // tp_dim -1 has the same full gradient on every MP rank.
  // An EXPERT tensor of a backend with sharded experts (moe_gpt_moe_tensors.shards
  // > 1) uses the same fields for its shard (w1: dim 2, b1 and w2: dim 1); its
  // gradient is complete (the backend's sums).
  int tp_dim;
  int tp_parts;
  int tp_first, tp_count;
} moe_gpt_param;

// Where this rank's slice of p sits in the whole tensor (row-major, dims):
// the slice (numel elements, in its own order) is moe_gpt_param_runs(p)
// contiguous runs of the whole tensor, run k of moe_gpt_param_run(p, k,
// &offset) elements starting at element offset; runs follow the slice's
// order. Covers the home experts (EXPERT), the MP split and the expert shard.
size_t moe_gpt_param_runs(const moe_gpt_param *p);
size_t moe_gpt_param_run(const moe_gpt_param *p, size_t k, size_t *offset);

// Creates the model for batches of up to max_batch sequences of up to
// cfg->seq_len tokens. ops NULL = moe_gpt_moe_local. Allocates every buffer;
// forward and backward allocate nothing afterwards. Parameters start at zero:
// call moe_gpt_init_params.
moe_status moe_gpt_create(moe_ctx *ctx, const moe_gpt_config *cfg, int max_batch,
                          const moe_gpt_moe_ops *ops, void *ops_user, moe_gpt **out);
void moe_gpt_destroy(moe_gpt *model);  // NULL is a no-op

// Tensor (model) parallelism, Megatron-LM style (Shoeybi et al. 2019;
// docs/model.md "Tensor parallelism"): the collectives of the MP group, given by
// the caller so that the model stays free of MPI. Every MP rank runs the same
// forward and backward on the same tokens.
typedef struct {
  int size;  // MP ranks, >= 1 (1: no tensor parallelism)
  int rank;  // this rank's index in the MP group, [0, size)
  // buf (n floats) = its sum over the MP group's ranks, in place; collective
  // (every MP rank calls it in the same order with the same n). A non-OK status
  // stops the forward or backward and is returned (the callee sets ctx's message).
  moe_status (*allreduce_sum)(void *user, float *buf, size_t n);
  void *user;
  // Deterministic mode under MP (moe_gpt_set_deterministic): runs chain ch
  // (kernels.h) over the MP group, ch->owner naming MP ranks (moe_chain_run
  // over the MP communicator); collective like allreduce_sum. NULL: deterministic
  // mode is refused with MP > 1.
  moe_status (*chain)(void *user, const moe_chain *ch);
} moe_gpt_tp;

// moe_gpt_create with tensor parallelism over tp's MP group. tp NULL or
// tp->size 1: moe_gpt_create, bit for bit. With size P > 1 (n_head and, when a
// block is dense, dense_hidden divisible by P, else INVALID_ARG naming the
// field), this rank holds heads [rank NH/P, (rank + 1) NH/P): attn.w_qkv's and
// attn.b_qkv's q, k and v columns of those heads (column-parallel) and
// attn.w_proj's rows of those heads (row-parallel); a dense FFN's w_fc columns
// and b_fc entries [rank Hd/P, (rank + 1) Hd/P) and those rows of w_fc2. The
// embeddings, layernorms, attn.b_proj, ffn.b_fc2, the MoE blocks (through
// their backend, fed the whole ln2 output on every MP rank) and the tied head
// are whole on every MP rank: every rank computes the whole logits and loss.
// The forward sums the attention projection's and the dense FFN's partial
// outputs over MP before adding b_proj / b_fc2 (Megatron's g); the backward
// sums the gradient entering ln1's and (dense blocks) ln2's backward (Megatron's
// f). In deterministic mode those sums are not all-reduced: each is one
// fixed-order chain continued from MP rank to MP rank (tp->chain), so the
// model has the single-process model's bits. Refused with MP > 1:
// moe_gpt_kv_create, and moe_gpt_set_deterministic(model, 1) without a
// tp->chain (INVALID_ARG). tp is copied; its user must outlive the model.
moe_status moe_gpt_create_tp(moe_ctx *ctx, const moe_gpt_config *cfg, int max_batch,
                             const moe_gpt_moe_ops *ops, void *ops_user, const moe_gpt_tp *tp,
                             moe_gpt **out);
// MP ranks the model was created with (1 without tensor parallelism).
int moe_gpt_tp_size(const moe_gpt *model);

const moe_gpt_config *moe_gpt_get_config(const moe_gpt *model);
int moe_gpt_num_params(const moe_gpt *model);  // number of tensors
moe_gpt_param moe_gpt_get_param(moe_gpt *model, int i);
// Block `block`'s router bias (num_experts floats, writable), NULL when the
// block is dense or out of range. Every rank holds the whole bias.
float *moe_gpt_router_bias(moe_gpt *model, int block);
// Elements of the whole model (every expert counted once) and of what one
// token activates (K experts per MoE layer).
size_t moe_gpt_total_elements(const moe_gpt *model);
size_t moe_gpt_active_elements(const moe_gpt *model);
// Bytes of activations and backward scratch for max_batch x seq_len tokens: the
// model's arena plus the MoE layers' working buffers (the single-process
// layer's formula; docs/model.md "Memory").
size_t moe_gpt_activation_bytes(const moe_gpt *model);

// The bytes moe_gpt_create(cfg, max_batch) allocates on one rank, by category,
// computed without allocating the model (include/moe/core.h): the dense
// parameters and their gradients, the activation arena (kept activations and
// backward scratch), tables (workspace); plus each MoE block's FFN: per_moe
// when given (what the backend's create allocates per block, e.g.
// moe_ep_layer_memory's), else the local backend's (moe_layer_memory of the
// block's layer config). With with_optim, AdamW's state for the tensors this
// rank holds (moe_optim_create: expert tensors of E / ep_size experts) in the
// optimizer category. INVALID_ARG for an invalid cfg or max_batch.
moe_status moe_gpt_memory(moe_ctx *ctx, const moe_gpt_config *cfg, int max_batch, int ep_size,
                          const moe_memory_need *per_moe, int with_optim, moe_memory_need *out);
// moe_gpt_memory for a model of moe_gpt_create_tp with mp_size MP ranks: the
// split tensors, their gradients, AdamW state and the activations of this
// rank's heads and dense hidden columns count as slices. mp_size 1: the same
// bytes as moe_gpt_memory. INVALID_ARG as moe_gpt_create_tp for mp_size.
moe_status moe_gpt_memory_tp(moe_ctx *ctx, const moe_gpt_config *cfg, int max_batch, int ep_size,
                             int mp_size, const moe_memory_need *per_moe, int with_optim,
                             moe_memory_need *out);

// GPT-2 init: weights N(0, init_std), the residual projections (attn.w_proj,
// ffn.w_fc2) N(0, init_std / sqrt(2 L)), biases 0, LN gains 1, each tensor its
// own RNG stream of seed (layout-independent: under MP a slice gets exactly the
// whole tensor's values there); MoE layers through the backend's
// init_params(seed + 1000 + block).
void moe_gpt_init_params(moe_gpt *model, uint64_t seed);
void moe_gpt_zero_grad(moe_gpt *model);
// Deterministic mode (on = 1; off by default): the dense weight gradients are
// the pairwise sum over the batch's sequences of each sequence's own gradient
// (moe_pairwise_*), so the gradient of sequences [k 2^j, (k+1) 2^j) is one node
// of the tree over a larger batch, and ranks that each hold 2^j consecutive
// sequences reach the single-process bits with moe_allreduce_fixed. Costs
// (log2(max_batch) + 2) leaves of the largest weight (the tied embedding plus
// the positions, usually) and a (max_batch * seq_len, vocab) dlogits buffer.
// With moe_gemm on its fixed path (kernels.h) a sequence's gradient does not
// depend on the other sequences either. Invalidates a pending backward.
// With MP > 1 (moe_gpt_create_tp) the attention projection's and the dense
// FFN's partial products, and the input gradients of w_qkv and w_fc, go
// through the tp's chain in head (hidden column) order instead of an
// all-reduce: the same bits as one rank's (docs/model.md). INVALID_ARG when
// the model has MP > 1, on = 1 and no tp->chain.
moe_status moe_gpt_set_deterministic(moe_gpt *model, int on);
// Bytes moe_gpt_set_deterministic(model, 1) allocates for a model of cfg and max_batch.
size_t moe_gpt_deterministic_bytes(const moe_gpt_config *cfg, int max_batch);

typedef struct {
  double loss;    // sum of the cross-entropy over this call's tokens / loss_denominator
  double ce_sum;  // sum of the cross-entropy over this call's tokens (nats)
  // (B) the cross-entropy sum of each sequence; ce_sum is their sum in order.
  // Valid until the next forward.
  const double *ce_seq;
  int tokens;    // tokens with a target in this call
  double aux;    // sum over MoE layers of their aux loss (unscaled)
  double z;      // sum over MoE layers of their z-loss (unscaled)
  int dropped;   // dropped choices over the MoE layers (this rank)
  int rerouted;  // choices the topology-aware gate re-selected over the MoE layers (this rank)
} moe_gpt_loss;

// tokens (B, S) in [0, V) -> logits (B, S, V) (moe_gpt_logits). targets (B, S)
// in [0, V) or -1 (ignored), or NULL (no loss; backward then invalid).
// loss_denominator > 0 divides the summed CE (data parallelism: the global
// number of target tokens), <= 0 means this call's target count. 1 <= B <=
// max_batch, 1 <= S <= cfg.seq_len. Collective when the backend is.
// INVALID_ARG for out-of-range sizes or token ids (named).
moe_status moe_gpt_forward(moe_gpt *model, const int32_t *tokens, const int32_t *targets, int b,
                           int s, double loss_denominator, moe_gpt_loss *out);
// The logits of the last forward, (B, S, V). Valid until the next forward.
const float *moe_gpt_logits(const moe_gpt *model);
// Gradients of the last forward's loss (+ the MoE auxiliary terms) +=. Collective.
moe_status moe_gpt_backward(moe_gpt *model);
// Called by moe_gpt_backward as dense gradients become final, so that their
// sum over ranks can start while the backward goes on: block = n_layer with
// ready = 1 once lnf.g and lnf.b are; then for block = n_layer - 1 down to 0,
// ready = 2 once a dense block's feed-forward tensors (ffn.*) are, and
// ready = 1 once the block's other dense tensors (those whose
// moe_gpt_param.block is it: ln1, attn, ln2; an MoE block's gate and experts
// are its backend's) are; then block = -1 with ready = 1 once wte and wpe are
// (the tied head adds to wte's early, so it is final last). Between the
// kernels of block `block`'s backward it is called with ready = 0 (nothing
// new is final: a chance to progress the sums in flight). Around an MoE
// block's feed-forward backward it is called with ready = 3 just before (its
// all-to-alls are imminent: Lina holds new sums back) and ready = 4 just
// after (nothing new is final). Under MP (moe_gpt_create_tp) block l's
// ready = 1 comes after the all-reduce of the gradient entering ln1's
// backward, so it still means final. A hook error stops
// the backward and is returned. fn NULL: none (the default).
typedef moe_status (*moe_gpt_grad_hook)(void *user, int block, int ready);
void moe_gpt_set_grad_hook(moe_gpt *model, moe_gpt_grad_hook fn, void *user);

// ---- incremental decoding with a KV cache ----------------------------------------------

// The keys and values of up to `slots` sequences of up to seq_len positions
// each, for every block, and the buffers of one decode step of up to max_rows
// rows: everything is allocated by moe_gpt_kv_create, decoding allocates
// nothing. One model can serve several caches; a cache belongs to one model.
typedef struct moe_gpt_kv moe_gpt_kv;

// Bytes moe_gpt_kv_create allocates for cfg, slots and max_rows (0 when an
// argument is out of range): 2 L slots S M floats of cache, plus the step's
// buffers.
size_t moe_gpt_kv_bytes(const moe_gpt_config *cfg, int slots, int max_rows);
// slots in [1, 65536]; max_rows in [1, the model's max_batch x seq_len] (the
// MoE layers were created for that many tokens). INVALID_ARG naming the range,
// or when the model has MP > 1 (moe_gpt_create_tp: not supported); OUT_OF_MEMORY
// with the bytes.
moe_status moe_gpt_kv_create(moe_ctx *ctx, const moe_gpt *model, int slots, int max_rows,
                             moe_gpt_kv **out);
void moe_gpt_kv_destroy(moe_gpt_kv *kv);  // NULL is a no-op
int moe_gpt_kv_slots(const moe_gpt_kv *kv);
int moe_gpt_kv_max_rows(const moe_gpt_kv *kv);
// Positions a slot holds (0 for a new or reset slot).
int moe_gpt_kv_length(const moe_gpt_kv *kv, int slot);
// Forgets a slot's positions (a finished sequence; the next one starts at 0).
void moe_gpt_kv_reset(moe_gpt_kv *kv, int slot);

// One row of a decode step: the token at position pos of the sequence in slot.
typedef struct {
  int32_t slot;         // [0, slots)
  int32_t pos;          // [0, seq_len); see moe_gpt_decode
  int32_t token;        // [0, V)
  int32_t want_logits;  // 1: the step returns this row's logits
} moe_gpt_decode_row;

// One step of incremental decoding: the rows of any number of sequences
// (prefill chunks and single decode tokens mixed, in any order of slots) go
// through the model at once: every GEMM over all n rows, attention of each
// row against its slot's cached keys and values (moe_attention_decode), the
// MoE layers through the model's backend as in moe_gpt_forward. Positions:
// the first row of a slot in the call has pos <= moe_gpt_kv_length(slot) (pos
// below the length rewinds the slot: later positions are dropped), and each
// further row of that slot has the next position; afterwards the slot holds
// its last row's pos + 1 positions. logits: (rows with want_logits, V), in row
// order (may be NULL when none wants them). A row's logits equal those of
// moe_gpt_forward on its sequence's tokens 0..pos (up to rounding: 1e-5), and
// with a batch-invariant compute backend (the default "fixed") and a dropless
// MoE layer they do not depend on the other rows of the step, on how the
// sequence was cut into steps, or (with the expert-parallel backend) on the
// rank count. 0 <= n <= max_rows; n = 0 still runs the MoE layers with no
// tokens (a distributed backend's collectives: every rank calls every step).
// Collective when the backend is. INVALID_ARG naming the first bad row (the
// cache is unchanged then). Invalidates a pending backward.
moe_status moe_gpt_decode(moe_gpt *model, moe_gpt_kv *kv, const moe_gpt_decode_row *rows, int n,
                          float *logits);

// ---- optimizer ------------------------------------------------------------------------------

typedef struct {
  float lr;          // peak learning rate
  float min_lr;      // floor of the cosine decay
  int warmup_steps;  // linear warm-up from lr/warmup to lr over steps 1..warmup
  int total_steps;   // cosine decay from lr (end of warm-up) to min_lr at total_steps
  float beta1, beta2, eps;
  float weight_decay;  // on tensors with decay = 1
  float grad_clip;     // clip the global L2 norm to this (<= 0: no clipping)
} moe_optim_config;

// lr 3e-3, min_lr 3e-4, warmup 100, total 1000, betas 0.9/0.95, eps 1e-8, wd 0.1, clip 1.0.
void moe_optim_config_default(moe_optim_config *oc);
// INVALID_ARG naming the field: lr >= 0, 0 <= min_lr <= lr, warmup >= 0, total >= 1,
// betas in [0, 1), eps > 0, weight_decay >= 0, grad_clip finite. moe_optim_create calls it.
moe_status moe_optim_config_validate(moe_ctx *ctx, const moe_optim_config *oc);
// Learning rate of step t (1-based): t <= warmup: lr * t / warmup; then
// min_lr + 0.5 (lr - min_lr)(1 + cos(pi * (t - warmup) / (total - warmup))),
// min_lr after total. warmup 0: no warm-up (the cosine starts at step 0).
float moe_optim_lr(const moe_optim_config *oc, int step);
// The clip scale for a global gradient L2 norm: min(1, grad_clip / norm), or 1
// when grad_clip <= 0.
float moe_optim_clip_scale(const moe_optim_config *oc, double grad_norm);

// AdamW state (m, v) for every tensor of a model, in moe_gpt_get_param order.
typedef struct moe_optim moe_optim;
// Bytes moe_optim_create allocates for n tensors of numel[i] elements (m and v
// padded to 16 floats each, the tables, the object), as moe_alloc_bytes counts.
double moe_optim_memory_bytes(int n, const size_t *numel);
moe_status moe_optim_create(moe_ctx *ctx, moe_gpt *model, const moe_optim_config *oc,
                            moe_optim **out);
void moe_optim_destroy(moe_optim *opt);  // NULL is a no-op
// m and v of tensor i (numel floats each, as the tensor held here).
float *moe_optim_m(moe_optim *opt, int i);
float *moe_optim_v(moe_optim *opt, int i);
const moe_optim_config *moe_optim_get_config(const moe_optim *opt);  // as created
int moe_optim_step_count(const moe_optim *opt);                      // steps taken
void moe_optim_set_step_count(moe_optim *opt, int steps);            // for resuming
// Sum of squares of every gradient held here, split by kind (so that a
// distributed trainer can sum each over the right ranks).
void moe_optim_grad_sq(moe_gpt *model, double sq[3]);
// One step: t = steps + 1, lr = moe_optim_lr(t), every gradient scaled by
// clip_scale (the caller computes min(1, grad_clip / global_norm), or 1),
// then moe_adamw_update on every tensor (weight decay where decay = 1). The
// gradients are scaled IN PLACE. opt must have been created for this model.
// Returns the lr used.
float moe_optim_step(moe_optim *opt, moe_gpt *model, float clip_scale);

// ---- sampling ----------------------------------------------------------------

// An index drawn from logits (V) with temperature (> 0) and top-k (0 or >= V:
// every token; ties at the k-th largest logit are kept): the softmax of
// logits / temperature over the kept tokens, inverted at u in [0, 1).
// probs (V) is scratch. Deterministic in u.
int moe_sample_logits(const float *logits, int v, double temperature, int top_k, double u,
                      double *probs);

typedef struct {
  double temperature;  // > 0 [0.8]
  int top_k;           // 0: all tokens [40]
  uint64_t seed;       // the draws' RNG stream [1]
} moe_sample_config;
void moe_sample_config_default(moe_sample_config *sc);

// Appends max_new tokens to tokens[0 .. *n) (room for *n + max_new), each
// sampled from the model's logits at the last position with the context cut
// to its last S tokens (the whole forward recomputed per token: the simple
// reference; moe_gpt_decode and the engine of moe/infer.h use a KV cache); on_token(user, token)
// after each (may be NULL). *n grows with every token. ctx: the context the model was created with
// (its errors land there). Errors: arguments, the model's forward.
moe_status moe_gpt_generate(moe_ctx *ctx, moe_gpt *model, int32_t *tokens, size_t *n, int max_new,
                            const moe_sample_config *sc, void (*on_token)(void *user, int token),
                            void *user);

#ifdef __cplusplus
}
#endif
#endif  // MOE_MODEL_H
