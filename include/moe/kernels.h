// libmoe CPU kernels. Every op has a forward, a backward next to it and a naive
// `_ref` forward used by the tests. Kernels never allocate and never fail: the
// caller passes outputs first, then const inputs, then sizes; scratch comes from
// the caller. All matrices are row-major and dense (leading dimension = columns)
// unless an ld argument says otherwise. Backward functions ACCUMULATE (+=) into
// their gradient outputs; zeroing is the caller's job.
//
// Shapes use the letters of core.h; N is a generic row count, D a generic width.
#ifndef MOE_KERNELS_H
#define MOE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- BLAS control --------------------------------------------------------------

// Sets the number of threads the BLAS library uses (1 = single-threaded, the
// libmoe default for compute threads). No effect if the library cannot be told.
void moe_blas_set_threads(int n);
// The BLAS library in use as it describes itself, e.g. "OpenBLAS 0.3.21
// NO_LAPACKE DYNAMIC_ARCH ... SkylakeX MAX_THREADS=64", or "CBLAS".
const char *moe_blas_name(void);
// Compiled-in features, e.g. "mpi=yes blas=OpenBLAS-0.3.21 zfp=yes onednn=yes
// bf16=native cuda=no" (bf16: native with AVX512_BF16, else emulated).
// Returns a static buffer rewritten on every call: not thread-safe.
const char *moe_features(void);
// The CPU kernel set the BLAS library selected at load time ("SkylakeX",
// "Haswell", ...), or "unknown".
const char *moe_blas_core(void);
// OpenBLAS built with DYNAMIC_ARCH falls back to its slowest x86-64 kernels
// ("Prescott") on CPUs it does not recognise (seen with OpenBLAS 0.3.21 on
// Sapphire Rapids under a hypervisor: ~5x slower SGEMM). If the selected kernel
// set is weaker than what this CPU supports, returns the core type to put in
// OPENBLAS_CORETYPE before the library loads ("SkylakeX" or "Haswell");
// otherwise NULL. The moe CLI does this itself (see cli/main.c).
const char *moe_blas_better_core(void);

// ---- GEMM ------------------------------------------------------------------------

// ---- compute backends: the GEMM seam -----------------------------------------------

// moe_gemm, and with it every kernel, expert and layer above, runs on one
// compute backend, chosen for the whole process (every thread of it) before
// work starts. The catalogue (moe_backend_list, src/kernels/backend.c):
//   fixed    the batch-invariant fixed-order kernel (moe_gemm_fixed below; a
//            row's bits do not depend on the other rows, so the
//            expert-parallel layer and training give the same bits at any
//            rank count, docs/reliability.md); single-threaded; the default
//   openblas OpenBLAS's cblas_sgemm (its kernels and summation order change
//            with the shape)
//   onednn   oneDNN's matmul primitive, one per shape and thread, created on
//            first use and cached (needs a build with libdnnl-dev)
// A backend's gemm has moe_gemm's contract (below). Its `unavailable` says
// why it cannot run in this build or on this CPU (NULL: it can).
typedef void (*moe_gemm_fn)(int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta, float *c,
                            int ldc);
typedef struct moe_backend {
  const char *name;
  const char *summary;  // one line for help texts
  int batch_invariant;  // 1: a row's bits do not depend on the other rows
  const char *(*unavailable)(void);
  moe_gemm_fn gemm;
  void (*set_threads)(int n);     // compute threads of this backend (NULL: one)
  const char *(*describe)(void);  // e.g. "OpenBLAS 0.3.21 ... SkylakeX", for reports
  // moe_gemm's contract with op(A), alpha * op(B) rounded to bf16 and fp32
  // accumulation (moe_precision_use(MOE_PRECISION_BF16)); NULL: no bf16 GEMM.
  moe_gemm_fn gemm_bf16;
} moe_backend;

// Every backend of the catalogue, also those this build or CPU cannot run.
const moe_backend *const *moe_backend_list(int *count);
// "fixed, openblas, onednn": the names this build can run, for messages.
const char *moe_backend_names(void);
// The backend called `name`. Fails (INVALID_ARG) naming the valid ones when
// there is none, or saying why when it cannot run here.
moe_status moe_backend_find(moe_ctx *ctx, const char *name, const moe_backend **out);
// Makes b the backend of moe_gemm (NULL: fixed) and sets its threads (n >= 1).
// Set it before starting work: not while other threads compute.
void moe_backend_use(const moe_backend *b, int threads);
// The backend moe_gemm runs now (never NULL).
const moe_backend *moe_backend_current(void);

// The precision of moe_gemm, process-wide like the backend: fp32 (the
// default), or bf16 (mixed precision: the GEMMs' inputs rounded to bf16,
// products accumulated in fp32; everything outside the GEMMs, the master
// weights, gradients' accumulation and optimizer state stay fp32).
typedef enum { MOE_PRECISION_FP32 = 0, MOE_PRECISION_BF16 = 1 } moe_precision;
// "fp32" or "bf16"; and back (INVALID_ARG naming the valid ones).
const char *moe_precision_name(moe_precision p);
moe_status moe_precision_parse(moe_ctx *ctx, const char *text, moe_precision *out);
// Whether backend b computes precision p on this CPU: bf16 needs a backend
// with a bf16 GEMM and (for speed) a CPU with AVX512_BF16; else fails
// (UNSUPPORTED) saying which is missing.
moe_status moe_compute_check(moe_ctx *ctx, const moe_backend *b, moe_precision p);
// Makes p moe_gemm's precision (set it before starting work). A backend
// without a bf16 GEMM computes in fp32 whatever the precision.
void moe_precision_use(moe_precision p);
moe_precision moe_precision_current(void);

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, row-major.
// op(A) = A if !trans_a (A is (m, k), lda >= k) else A^T (A is (k, m), lda >= m).
// op(B) = B if !trans_b (B is (k, n), ldb >= n) else B^T (B is (n, k), ldb >= k).
// m, n or k may be 0 (with k == 0, C = beta * C). As in BLAS, beta == 0 does not
// read C: NaN or Inf already in C do not survive.
void moe_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);
// moe_gemm in fp32 whatever the precision (the router's GEMMs: routing
// decisions and the gate's gradient stay fp32, as DeepSpeed's and Megatron's
// fp32 routers do).
void moe_gemm_fp32(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc);
void moe_gemm_ref(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc);

// The batch-invariant GEMM: same arguments and result as moe_gemm (up to
// rounding), but every element of C is one fused multiply-add chain
//     s = beta * C_ij (exactly C_ij when beta == 1, 0 when beta == 0);
//     for p = 0, 1, ..., k-1:  s = fma(op(A)_ip, alpha * op(B)_pj, s)
// with alpha * op(B)_pj rounded to float first. Consequences, all bitwise:
//   - a row of C depends only on its row of op(A), op(B) and its row of C: not
//     on m, n, the other rows or the row's place in the call;
//   - k split over consecutive calls (beta = 1 after the first) gives the same
//     C as one call: sums over tokens can be accumulated chunk by chunk;
//   - the AVX2+FMA path and the portable path (fmaf) agree, so the bits do not
//     depend on the CPU's vector width either.
// Single-threaded. Speed: close to OpenBLAS's single-threaded sgemm on AVX2
// and AVX-512 machines (`moe bench layer --backend fixed|openblas`,
// bench/compute_bench.sh, docs/benchmarks.md), far below it without FMA
// (software fmaf).
void moe_gemm_fixed(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                    int lda, const float *b, int ldb, float beta, float *c, int ldc);
// The path moe_gemm_fixed runs on this CPU: "avx512", "avx2+fma" or
// "portable (fmaf)" (a narrower one forced by MOE_GEMM_FIXED_ISA=avx2 or
// portable in the environment, read once; all give the same bits).
const char *moe_gemm_fixed_isa(void);

// ---- bf16 mixed precision -------------------------------------------------------------

// float -> bfloat16 (its top 16 bits) rounded to nearest-even; NaN stays a
// quiet NaN, values past the largest bf16 become +-Inf. And back (exact).
uint16_t moe_bf16_round(float f);
float moe_bf16_to_float(uint16_t h);

// The batch-invariant bf16 GEMM: moe_gemm's arguments and contract, computed
// with op(A) and alpha * op(B) rounded to bf16 (subnormals flushed to zero)
// and fp32 accumulation. Every element of C is one chain over the pairs of k
// (src/kernels/gemm_bf16.c has it exactly): what AVX512_BF16's VDPBF16PS
// computes, so the AVX512_BF16 kernel and the portable one (fmaf) give the
// same bits. A row's bits do not depend on the other rows, and k split over
// calls at even points (beta = 1 after the first) equals one call. Results
// within bf16 rounding of moe_gemm: |error| <~ 2^-8 * sum_p |a_ip b_pj|.
void moe_gemm_bf16(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc);
// "avx512_bf16" or "portable (fmaf)" (forced by MOE_GEMM_FIXED_ISA=portable
// or avx2, as for moe_gemm_fixed).
const char *moe_gemm_bf16_isa(void);
// 1 when moe_gemm_bf16 runs on bf16 instructions here (AVX512_BF16); 0 when
// it emulates them (correct, but slower than fp32).
int moe_bf16_native(void);

// ---- pairwise (tree) sums in a fixed order ----------------------------------------------

// Sums leaves (vectors of n floats) pushed one at a time as the pairwise tree
// over their index: (l0 + l1) + (l2 + l3), ...; with a count that is not a
// power of two, the missing leaves are absent (a node with one child is that
// child). The bits depend only on the leaves and their order, so the sum over
// 2^j consecutive leaves is one node of the tree over any larger aligned set:
// moe_allreduce_fixed (comm.h) continues the same tree over ranks.
// Memory: (ceil(log2(max_leaves)) + 2) * n floats.
typedef struct {
  float *buf;
  size_t n, n_cap;  // floats per leaf now, and at most (the init's n)
  int cap, top, max_leaves;
  int size[32];
} moe_pairwise;
moe_status moe_pairwise_init(moe_ctx *ctx, moe_pairwise *pw, size_t n, int max_leaves);
void moe_pairwise_free(moe_pairwise *pw);
// Bytes moe_pairwise_init allocates (as moe_alloc_bytes counts them).
size_t moe_pairwise_bytes(size_t n, int max_leaves);
// Forgets the leaves pushed so far; the next leaves have n floats (at most the
// n given to init; larger is cut to it).
void moe_pairwise_reset(moe_pairwise *pw, size_t n);
// The buffer to fill with the next leaf (n floats, not zeroed), then push it.
// At most max_leaves pushes between resets.
float *moe_pairwise_leaf(moe_pairwise *pw);
void moe_pairwise_push(moe_pairwise *pw);
// The sum of the leaves pushed since the last reset (zeros if none); valid
// until the next push or reset.
const float *moe_pairwise_result(moe_pairwise *pw);

// A weight gradient as a fixed-order sum over slices of rows: dw (din, dout) += x^T dy and, when
// db is not NULL, db (dout) += the column sums of dy, where x is (slices * rows, din) and dy
// (slices * rows, dout). Each slice of `rows` consecutive rows gives one leaf (its own product,
// moe_gemm with beta 0, then its own column sums, moe_bias_add_backward, after the din * dout
// weights), the leaves are summed by pw (reset here; init'ed with n >= din * dout (+ dout with
// db) and max_leaves >= slices), and the root is added into dw and db. So a caller holding 2^j
// slices holds one node of the tree over every rank's slices (the deterministic mode's dense
// and gate weight gradients). Leaves pw's previous leaves and result undefined. gemm computes
// the leaves' products: NULL is moe_gemm (the process's precision); the router passes
// moe_gemm_fp32.
void moe_pairwise_wgrad(moe_pairwise *pw, moe_gemm_fn gemm, float *dw, float *db, const float *x,
                        const float *dy, int slices, int rows, int din, int dout);

// ---- fixed-order chains over ranks (moe_chain_run, comm.h) -----------------------------

// A computation whose every element is one chain of operations in a fixed
// order (moe_gemm_fixed's fused multiply-adds over k, moe_bias_add_backward's
// rows), cut into pieces that several ranks hold: C is cut into `blocks`
// independent blocks, and each block goes through the segments 0 .. segs - 1
// in order. Segment s of every block is computed by rank owner(s) of a group;
// it continues the block in place (compute), from what the previous segment's
// owner left there (segment 0: from what its owner's block holds). So the
// result has the bits of the whole chain computed on one rank. The MPI side
// is moe_chain_run (comm.h); this description is MPI-free so that the model
// can pass it to the callbacks of its tensor parallelism.
#define MOE_CHAIN_SPANS 4
typedef struct {
  int blocks, segs;
  // The group rank that computes segment `seg` (the same answer on every rank).
  int (*owner)(void *user, int seg);
  // This rank's segment `seg` of block `block` (called on its owner only).
  void (*compute)(void *user, int block, int seg);
  // The float ranges that make up block `block` on this rank (every rank's
  // are the same sizes): writes ptr[i], n[i] (each at most INT_MAX floats)
  // and returns their count, at most MOE_CHAIN_SPANS.
  int (*spans)(void *user, int block, float **ptr, size_t *n);
  void *user;
} moe_chain;

// ---- linear: y = x W + b ------------------------------------------------------------

// y is (N, Dout), x is (N, Din), w is (Din, Dout), b is (Dout) or NULL. Overwrites y.
void moe_linear_forward(float *y, const float *x, const float *w, const float *b, int n, int din,
                        int dout);
void moe_linear_forward_ref(float *y, const float *x, const float *w, const float *b, int n,
                            int din, int dout);
// dx (N, Din) += dy W^T (dx may be NULL); dw (Din, Dout) += x^T dy; db (Dout) +=
// column sums of dy (db may be NULL).
void moe_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                         const float *w, int n, int din, int dout);

// ---- vector add -------------------------------------------------------------------

// dst (n) += src (n), element by element (each element one IEEE addition: the bits
// do not depend on vectorization). dst and src must not overlap.
void moe_add_inplace(float *dst, const float *src, size_t n);

// ---- bias add ---------------------------------------------------------------------

// y (N, D) += b (D) broadcast over rows.
void moe_bias_add_forward(float *y, const float *b, int n, int d);
void moe_bias_add_forward_ref(float *y, const float *b, int n, int d);
// db (D) += column sums of dy (N, D), one addition per element in row order
// (rows split over consecutive calls give the same bits as one call).
// (dy passes through to dx unchanged.)
void moe_bias_add_backward(float *db, const float *dy, int n, int d);

// ---- activations ------------------------------------------------------------------

// GELU, the exact form x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's
// default nn.GELU). y and x are (n); y may alias x.
void moe_gelu_forward(float *y, const float *x, size_t n);
void moe_gelu_forward_ref(float *y, const float *x, size_t n);
// dx (n) += dy * gelu'(x); x is the forward INPUT.
void moe_gelu_backward(float *dx, const float *dy, const float *x, size_t n);

// ReLU max(x, 0); y may alias x.
void moe_relu_forward(float *y, const float *x, size_t n);
void moe_relu_forward_ref(float *y, const float *x, size_t n);
// dx += dy * (x > 0); x is the forward input (or output: same sign test).
void moe_relu_backward(float *dx, const float *dy, const float *x, size_t n);

// ---- softmax over rows ---------------------------------------------------------------

// y (N, D) = softmax(x) per row (max-subtracted). y may alias x.
void moe_softmax_forward(float *y, const float *x, int n, int d);
void moe_softmax_forward_ref(float *y, const float *x, int n, int d);
// dx (N, D) += y * (dy - sum_j dy_j y_j), y the forward output.
void moe_softmax_backward(float *dx, const float *dy, const float *y, int n, int d);
// lse (N) = log sum_j exp(x_ij), computed stably.
void moe_logsumexp_forward(float *lse, const float *x, int n, int d);

// ---- top-k over rows -------------------------------------------------------------------

// For each row of x (N, D): the k largest values in descending order, idx (N, k)
// and val (N, k). Ties go to the lower index. NaN never wins against a number.
// 1 <= k <= d.
void moe_topk_forward(int32_t *idx, float *val, const float *x, int n, int d, int k);
void moe_topk_forward_ref(int32_t *idx, float *val, const float *x, int n, int d, int k);
// dx (N, D) += dval (N, k) scattered to the positions idx.
void moe_topk_backward(float *dx, const float *dval, const int32_t *idx, int n, int d, int k);

// ---- layernorm ----------------------------------------------------------------------------

// y (N, D) = (x - mean) * rstd * gamma + beta per row; mean (N) and rstd (N) are
// saved for backward. rstd = 1/sqrt(var + eps), var the biased variance.
void moe_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                           const float *beta, int n, int d, float eps);
void moe_layernorm_forward_ref(float *y, float *mean, float *rstd, const float *x,
                               const float *gamma, const float *beta, int n, int d, float eps);
// dx (N, D) +=, dgamma (D) +=, dbeta (D) +=.
void moe_layernorm_backward(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                            const float *mean, const float *rstd, const float *gamma, int n, int d);

// ---- cross-entropy -------------------------------------------------------------------------

// Mean over N rows of -log softmax(logits)[target]. logits (N, V), targets (N) in
// [0, V) or -1 to ignore the row (ignored rows count neither in the sum nor in
// the mean). probs (N, V) receives softmax(logits) for backward (may be NULL).
// Returns the loss (0 when every row is ignored).
float moe_cross_entropy_forward(float *probs, const float *logits, const int32_t *targets, int n,
                                int v);
float moe_cross_entropy_forward_ref(const float *logits, const int32_t *targets, int n, int v);
// dlogits (N, V) += dloss * (probs - onehot(target)) / n_valid.
void moe_cross_entropy_backward(float *dlogits, const float *probs, const int32_t *targets, int n,
                                int v, float dloss);

// ---- causal self-attention ----------------------------------------------------------------

// Causal multi-head self-attention core (the part between the qkv projection and
// the output projection; no dropout). d = NH * hd.
// qkv is (B, S, 3d): row (b, t) holds [q | k | v], each d wide, head h at
// columns h*hd .. h*hd+hd-1 of its part (GPT-2's c_attn layout).
// out is (B, S, d): out[b,t,h*hd+i] = sum_{u<=t} att[b,h,t,u] * v[b,u,h*hd+i].
// att is (B, NH, S, S): softmax over u <= t of q.k / sqrt(hd); entries u > t are
// written as 0. Saved for backward. Overwrites out and att.
// Any of b, s, nh, hd <= 0: nothing is done. Inputs are assumed finite (an inf
// in v at u > t can turn row t into NaN through 0 * inf).
void moe_attention_forward(float *out, float *att, const float *qkv, int b, int s, int nh, int hd);
void moe_attention_forward_ref(float *out, float *att, const float *qkv, int b, int s, int nh,
                               int hd);
// dqkv (B, S, 3d) += gradient of the forward w.r.t. qkv, given dout (B, S, d) and
// the forward's att and qkv. scratch holds at least moe_attention_scratch_floats()
// floats (B*NH*S*S is always enough), caller-provided, contents ignored; dqkv
// must not overlap qkv, att, dout or scratch.
void moe_attention_backward(float *dqkv, float *scratch, const float *dout, const float *att,
                            const float *qkv, int b, int s, int nh, int hd);
// Scratch floats moe_attention_backward needs for these sizes (currently S*S:
// one block reused per (b, h)); 0 when s <= 0.
size_t moe_attention_scratch_floats(int b, int s, int nh, int hd);

// One query row of causal attention against cached keys and values (the
// KV-cache decode of MoE-GPT): for each head h,
//     out[h*hd + i] = sum_{u < len} softmax_u(q_h . k_{u,h} / sqrt(hd)) v_{u,h}[i]
// where q and out are (nh * hd), k and v (len, ld) rows (head h at columns
// h*hd .. h*hd+hd-1; ld >= nh * hd) and scratch holds 2 * len floats. The
// products are moe_gemm_fp32 calls with m = 1 and the softmax is
// moe_softmax_forward's row, so on a batch-invariant backend the result depends
// only on q and the len cached rows. len >= 1; nothing is done when nh or hd <= 0.
void moe_attention_decode(float *out, const float *q, const float *k, const float *v, int ld,
                          int len, int nh, int hd, float *scratch);

// ---- AdamW -------------------------------------------------------------------------------

typedef struct {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;  // decoupled: p -= lr * wd * p
} moe_adamw_config;

// One AdamW step t (t >= 1, for bias correction) on n parameters, as
// torch.optim.AdamW: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
void moe_adamw_update(float *p, float *m, float *v, const float *g, size_t n,
                      const moe_adamw_config *cfg, int t);
void moe_adamw_update_ref(float *p, float *m, float *v, const float *g, size_t n,
                          const moe_adamw_config *cfg, int t);

#ifdef __cplusplus
}
#endif
#endif  // MOE_KERNELS_H
