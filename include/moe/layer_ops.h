// Building blocks of the MoE layer, shared by the single-process layer
// (src/layer/layer.c), the expert-parallel layer (src/parallel/) and the model's
// local MoE FFN (src/model/), and usable by anyone writing a layer of their own
// (a new parallel scheme uses these and keeps the math): gate and
// routing, loss statistics, dispatch/combine, one expert's FFN, each with its
// backward. Buffers are the caller's; nothing here allocates.
//
// Losses over several ranks: moe_gate_loss_stats gives per-rank sums which,
// added over the ranks of the global batch, make moe_gate_losses and
// moe_gate_backward produce exactly the single-process aux and z losses and
// their gradients (docs/moe-layer.md step 7).
#ifndef MOE_LAYER_OPS_H
#define MOE_LAYER_OPS_H

#include "moe/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// Gate buffers for T tokens.
typedef struct {
  float *logits;  // (T, E)
  float *probs;   // (T, E)
  float *lse;     // (T): logsumexp of logits
  float *topk_p;  // (T, K): probabilities of the chosen experts
  // Router bias (DeepSeek-V3's aux-loss-free balancing bias; libmoe's
  // synthetic skew): NULL = none. When given, experts are CHOSEN by
  // logits + bias, while the weights stay the unbiased probabilities of the
  // chosen experts (the bias gets no gradient and changes no loss formula).
  const float *bias;  // (E) or NULL
  float *scores;      // (T, E) scratch for logits + bias; needed when bias is given
  // FasterMoE's topology-aware gate (moe_topo_gate_reselect; opt-in, it
  // changes the routing): NULL = off. topo_local (E): 1 for the experts on
  // this rank's node; topo_share: the share of the T x K choices allowed to
  // leave the node; topo_scratch: MOE_TOPO_SCRATCH_BYTES(T, K) bytes.
  const uint8_t *topo_local;
  double topo_share;
  void *topo_scratch;
  int topo_rerouted;  // out: choices the last moe_gate_route re-selected
} moe_gate_buffers;

// FasterMoE's topology-aware gate (section 5.3; docs/balance.md "Topology-aware
// gate"), applied to a top-k routing of T tokens: at most
// floor(share x T x K) choices may go to experts outside the node (local[e]
// 0). When more want to, the ones with the highest selection scores (scores
// (T, E): the scores the top-k ranked, logits + bias or probabilities) go,
// ties to the earlier choice (token-major); every other one re-selects the
// best-scoring local expert its token has not chosen (ties to the lower
// expert), or keeps its remote expert when the token has no local expert
// left. expert (T, K) is changed in place and topk_p (T, K) set to the new
// experts' probabilities (probs (T, E)). scratch: MOE_TOPO_SCRATCH_BYTES(T,
// K) bytes. Returns the number of re-selected choices. Deterministic: the
// result depends only on the inputs' values.
#define MOE_TOPO_SCRATCH_BYTES(T, K) ((size_t)(T) * (size_t)(K)*8u)
int moe_topo_gate_reselect(int32_t *expert, float *topk_p, const float *scores, const float *probs,
                           int tokens, int num_experts, int top_k, const uint8_t *local,
                           double share, void *scratch);

// bias when any of its E entries is nonzero, else NULL (plain top-k, the
// exact routing of a layer without a bias).
const float *moe_router_bias_active(const float *bias, int num_experts);

// Number of doubles in a loss-statistics vector: count_all (E), probability
// sums (E), sum of lse^2, token count.
#define MOE_LOSS_STATS(E) (2 * (size_t)(E) + 2)

// Rows the expert buffers of a layer need for cfg->tokens tokens:
// min(T*K, E*C) with capacity, T*K dropless.
size_t moe_layer_max_rows(const moe_layer_config *cfg);

// Parameter initialisation (moe_layer_init_params): each tensor is a uniform
// fill of its own RNG stream of the seed. Element i of a tensor is value i of
// its stream, so a rank holding a slice of the experts fills exactly the
// values the single-process layer has there.
enum { MOE_STREAM_WG = 1, MOE_STREAM_W1, MOE_STREAM_B1, MOE_STREAM_W2, MOE_STREAM_B2 };
// x (n) = values first .. first+n-1 of `stream`, uniform in [-bound, bound).
void moe_init_uniform_slice(float *x, size_t n, uint64_t seed, uint64_t stream, size_t first,
                            float bound);

// Checks of a forward call a rank can make alone: 0 <= T <= cfg->tokens,
// non-NULL x and y, y not overlapping x (backward reads x again), and finite
// x when cfg->check_finite.
moe_status moe_forward_checks(moe_ctx *ctx, const moe_layer_config *cfg, const float *x, int tokens,
                              const float *y);

// Timed GEMM: adds its wall time to *ms.
void moe_timed_gemm(double *ms, int ta, int tb, int m, int n, int k, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc);

// INVALID_ARG naming the token and column of the first NaN/Inf in x (T, cols).
moe_status moe_check_finite(moe_ctx *ctx, const char *name, const float *x, int tokens, int cols);

// x (T, M), wg (M, E) -> gate buffers, route->expert/weight, and slots with
// capacity C(T) (per call, i.e. per source rank). Times into tm->gate_gemm_ms.
moe_status moe_gate_route(moe_ctx *ctx, const moe_layer_config *cfg, const float *wg,
                          const float *x, int tokens, moe_gate_buffers *gb, moe_route *route,
                          moe_layer_timing *tm);
// stats (MOE_LOSS_STATS(E)) = this call's sums (overwritten).
void moe_gate_loss_stats(const moe_layer_config *cfg, const moe_gate_buffers *gb,
                         const moe_route *route, int tokens, double *stats);
// aux and z losses from (global) stats.
void moe_gate_losses(const moe_layer_config *cfg, const double *stats, float *aux, float *z);
// Gate backward: dweight (T, K) of the combine -> dwg (M, E) +=, dx (T, M) +=,
// plus the aux and z gradients computed from the (global) stats. dprobs and
// dlogits (T, E) are scratch; dlogits holds the logits' gradient on return.
// dwg may be NULL: no weight gradient (the caller sums it from dlogits).
void moe_gate_backward(const moe_layer_config *cfg, const moe_gate_buffers *gb,
                       const moe_route *route, int tokens, const double *stats,
                       const float *dweight, float *dprobs, float *dlogits, const float *x,
                       const float *wg, float *dwg, float *dx, moe_layer_timing *tm);

// xe[row] = x[route->row_token[row]]: x (T, M) -> xe (rows, M), expert order.
void moe_dispatch_forward(const moe_route *route, const float *x, int M, float *xe);
// dx[route->row_token[row]] += dxe[row].
void moe_dispatch_backward(const moe_route *route, const float *dxe, int M, float *dx);
// y (T, M) = sum over kept choices of weight * ye[row] (overwrites y).
void moe_combine_forward(const moe_route *route, const float *ye, int M, int tokens, float *y);
// dye[row] = weight * dy[t]; dweight (T, K) = dy[t] . ye[row] (0 when dropped).
void moe_combine_backward(const moe_route *route, const float *dy, const float *ye, int M,
                          int tokens, float *dye, float *dweight);

#ifdef __cplusplus
}
#endif

#endif  // MOE_LAYER_OPS_H
