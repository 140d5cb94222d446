// Private to src/model/: the MoE-GPT object's layout, shared by the training
// forward/backward (gpt.c) and the KV-cache decode (gpt_decode.c).
#ifndef MOE_MODEL_GPT_INTERNAL_H
#define MOE_MODEL_GPT_INTERNAL_H

#include "moe/kernels.h"
#include "moe/model.h"

// Dense parameters of one block (data or gradients). With tensor parallelism
// (MP size P) this rank's slices: Ma = M / P attention columns (its NH / P
// heads), Hl = Hd / P dense hidden columns; P = 1: Ma = M, Hl = Hd.
typedef struct {
  float *ln1_g, *ln1_b;    // (M)
  float *w_qkv, *b_qkv;    // (M, 3 Ma), (3 Ma): q | k | v of this rank's heads
  float *w_proj, *b_proj;  // (Ma, M), (M)
  float *ln2_g, *ln2_b;    // (M)
  float *w_fc, *b_fc;      // (M, Hl), (Hl): dense blocks only
  float *w_fc2, *b_fc2;    // (Hl, M), (M): dense blocks only
} gpt_block_params;

typedef struct {
  int is_moe;
  void *moe;  // backend instance (MoE blocks)
  moe_gpt_moe_tensors mt;
  gpt_block_params p, g;
  // activations, for N = max_batch * S rows
  float *ln1, *ln1_mean, *ln1_rstd;  // (N, M), (N), (N)
  float *qkv;                        // (N, 3 Ma)
  float *att;                        // (B, NH / P, S, S)
  float *atty;                       // (N, Ma): attention output before w_proj
  float *resid2;                     // (N, M): x_l + attention branch
  float *ln2, *ln2_mean, *ln2_rstd;  // (N, M), (N), (N)
  float *fch, *fch_gelu;             // (N, Hl) each: dense blocks only
} gpt_block;

struct moe_gpt {
  moe_ctx *ctx;
  moe_gpt_config cfg;
  int max_batch;
  const moe_gpt_moe_ops *ops;
  void *ops_user;
  moe_gpt_tp tp;                // tensor parallelism (size 1: none)
  int nh_local;                 // heads held here: NH / P
  int m_local, hd_local;        // Ma = M / P attention columns, Hl = Hd / P dense hidden columns
  moe_gpt_grad_hook grad_hook;  // moe_gpt_set_grad_hook (NULL: none)
  void *grad_hook_user;
  int n_blocks_created;  // backends created (for destroy)
  gpt_block *blocks;     // (L)
  // parameter table
  int n_params;
  moe_gpt_param *params;
  moe_arena param_arena;  // dense data then dense gradients
  size_t dense_floats;    // floats of dense data (= of dense grads), padding included
  float *dense_data, *dense_grad;
  float *wte, *wpe, *lnf_g, *lnf_b;      // (V, M), (S, M), (M), (M)
  float *dwte, *dwpe, *dlnf_g, *dlnf_b;  // same shapes
  // activations
  moe_arena act_arena;
  float **resid;                     // (L + 1) pointers to (N, M): x_0 .. x_L
  float *lnf, *lnf_mean, *lnf_rstd;  // (N, M), (N), (N)
  float *logits;                     // (N, V)
  float *lse;                        // (N): logsumexp of each logits row
  int32_t *tokens, *targets;         // (N) copies of the last forward's inputs
  // backward scratch
  float *dresid;     // (N, M): gradient of the residual stream
  float *dln;        // (N, M): gradient of a layernorm output
  float *dlogits;    // (N, V): shares memory with the block scratch below
  float *dqkv;       // (N, 3 Ma)
  float *datty;      // (N, Ma)
  float *dh, *dfch;  // (N, Hl) each
  float *att_scratch;
  size_t moe_work_bytes;  // estimate of the MoE layers' own buffers (activation_bytes)
  // state of the last forward
  int have_forward;  // 1 after a forward with targets
  int b_last, s_last;
  double denom_last;
  double *ce_seq;  // (max_batch): the last forward's cross-entropy sum of each sequence
  // fixed-order weight gradients (moe_gpt_set_deterministic): one leaf per sequence
  int deterministic;
  moe_pairwise pw;
  float *dlogits_own;  // (N, V): dlogits kept to the end of the backward (not shared)
};

#endif  // MOE_MODEL_GPT_INTERNAL_H
