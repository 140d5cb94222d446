// The MoE layer (single process; every expert local): configuration, routing
// plan, placement, and the layer's forward and backward.
//
// The exact math is defined in docs/moe-layer.md and checked against PyTorch.
// The routing plan (which expert and slot every token choice goes to) and the
// placement (which rank computes an expert's tokens) are separate structures:
// distribution and load balancing change the placement, never the routing.
//
// Threading: a moe_layer is used by one thread at a time, with the moe_ctx it
// was created with.
#ifndef MOE_LAYER_H
#define MOE_LAYER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- configuration ----------------------------------------------------------------

typedef enum { MOE_ACT_GELU = 0, MOE_ACT_RELU = 1 } moe_activation;

const char *moe_activation_name(moe_activation act);  // "gelu", "relu"

// How the gate counts the load-balancing loss and renormalises the weights,
// after the systems users migrate from (docs/moe-layer.md, "Gate conventions"):
//   MOE_GATE_LIBMOE     aux over all K choices (f_e = choices of e / (T K),
//                       as Megatron-Core's switch loss); renormalize divides
//                       the top-k probabilities by their sum before dropping
//   MOE_GATE_DEEPSPEED  aux over the first choice only (f_e = tokens whose
//                       first choice is e / T, GShard / DeepSpeed-MoE);
//                       renormalize divides the kept choices' probabilities
//                       by their sum after capacity dropping (a dropped
//                       choice weighs 0)
typedef enum { MOE_GATE_LIBMOE = 0, MOE_GATE_DEEPSPEED = 1 } moe_gate_convention;
// "libmoe", "deepspeed"
const char *moe_gate_convention_name(moe_gate_convention c);
// "libmoe" (or its alias "megatron"), "deepspeed"; INVALID_ARG naming them.
moe_status moe_gate_convention_parse(moe_ctx *ctx, const char *text, moe_gate_convention *out);
// Parses "gelu" or "relu"; otherwise INVALID_ARG naming the valid values.
moe_status moe_activation_parse(moe_ctx *ctx, const char *text, moe_activation *out);

// Limits checked by moe_layer_config_validate.
#define MOE_MAX_EXPERTS 65536
#define MOE_MAX_DIM (1 << 20)
#define MOE_MAX_TOKENS (1 << 26)
#define MOE_MAX_ROWS (1 << 30)  // bound on tokens x top_k (dispatched rows)

typedef struct {
  int tokens;              // T: most tokens one forward call may pass, [1, MOE_MAX_TOKENS]
  int model_dim;           // M, [1, MOE_MAX_DIM]
  int hidden_dim;          // H, [1, MOE_MAX_DIM]
  int num_experts;         // E, [1, MOE_MAX_EXPERTS]
  int top_k;               // K, [1, E]
  double capacity_factor;  // f: C = ceil(f*K*T/E); f <= 0 means dropless; finite, <= 1e6
  moe_activation act;      // expert activation
  int renormalize;         // 1: kept top-k weights renormalised to sum to 1
  float aux_loss_coef;     // >= 0, weight of the load-balancing loss in backward
  float z_loss_coef;       // >= 0, weight of the z-loss in backward
  int check_finite;        // 1: forward/backward reject NaN/Inf in x and dy
  char expert[16];         // expert kind (include/moe/expert.h): "ffn" (default) or "ffn-ref"
  int gate_convention;     // moe_gate_convention [MOE_GATE_LIBMOE]
} moe_layer_config;

// Defaults: T 1024, M 256, H 1024, E 8, K 2, f 1.25, gelu, no renormalisation,
// aux 0.01, z 0, check_finite 1, expert "ffn".
void moe_layer_config_default(moe_layer_config *cfg);
// INVALID_ARG with a message naming the field, its value and the valid range.
moe_status moe_layer_config_validate(moe_ctx *ctx, const moe_layer_config *cfg);
// Overrides fields of cfg with the keys of a JSON object: tokens, model_dim,
// hidden_dim, num_experts, top_k, capacity_factor, activation ("gelu"|"relu"),
// renormalize, aux_loss_coef, z_loss_coef, check_finite (renormalize and
// check_finite are JSON true/false), expert (a string), gate_convention
// ("libmoe", "megatron" or "deepspeed"). Unknown or repeated keys, wrong types,
// malformed JSON and trailing text are errors (BAD_FORMAT / INVALID_ARG); cfg
// is left unchanged on error. Does not validate ranges (call moe_layer_config_validate).
moe_status moe_layer_config_from_json(moe_ctx *ctx, const char *json, moe_layer_config *cfg);
// Same, reading a file.
moe_status moe_layer_config_load(moe_ctx *ctx, const char *path, moe_layer_config *cfg);
// Writes the config as one JSON object (no trailing newline) into buf.
// INVALID_ARG if it does not fit in len bytes.
moe_status moe_layer_config_to_json(moe_ctx *ctx, const moe_layer_config *cfg, char *buf,
                                    size_t len);
// C for T tokens, or -1 when dropless (f <= 0).
int moe_layer_capacity(const moe_layer_config *cfg, int tokens);

// ---- placement --------------------------------------------------------------------

// Which rank computes the tokens of each expert: its home rank, unless the
// token's source rank holds a replica. Single-process layers use P = 1.
typedef struct {
  int num_experts;   // E
  int num_ranks;     // P
  int32_t *home;     // (E): home rank of each expert
  uint8_t *replica;  // (E, P): 1 where rank p holds a replica of expert e
} moe_placement;

// Block placement: expert e lives on rank e / (E / P). E must be divisible by P.
moe_status moe_placement_init(moe_ctx *ctx, moe_placement *pl, int num_experts, int num_ranks);
void moe_placement_free(moe_placement *pl);  // NULL or zeroed is a no-op
// Bytes moe_placement_init allocates (as moe_alloc_bytes counts them).
size_t moe_placement_bytes(int num_experts, int num_ranks);
// Marks (on = 1) or unmarks a replica of expert e on rank p.
moe_status moe_placement_set_replica(moe_ctx *ctx, moe_placement *pl, int expert, int rank, int on);
// The rank that computes expert e's tokens coming from src_rank.
int moe_placement_target(const moe_placement *pl, int expert, int src_rank);

// ---- routing plan -----------------------------------------------------------------------

typedef struct {
  int tokens;           // T of the last build
  int top_k;            // K
  int num_experts;      // E
  int capacity;         // C, or -1 when dropless
  int rows;             // kept choices = rows dispatched to experts
  int dropped;          // dropped choices
  int max_tokens;       // allocated T
  int max_rows;         // allocated rows
  int32_t *expert;      // (T, K): expert of each choice, best first
  int32_t *slot;        // (T, K): row within the expert's block, -1 when dropped
                        // (kept choices of an expert numbered in token order)
  float *weight;        // (T, K): gate weight of each choice
  int32_t *count;       // (E): kept rows per expert
  int32_t *count_all;   // (E): choices per expert before dropping
  int32_t *offset;      // (E + 1): first row of each expert in expert-ordered buffers
  int32_t *row_token;   // (rows): token of each dispatched row
  int32_t *row_choice;  // (rows): choice index k of each dispatched row
} moe_route;

moe_status moe_route_init(moe_ctx *ctx, moe_route *route, int max_tokens, int top_k,
                          int num_experts, int max_rows);
void moe_route_free(moe_route *route);  // NULL or zeroed is a no-op
// Bytes moe_route_init allocates (as moe_alloc_bytes counts them).
size_t moe_route_bytes(int max_tokens, int top_k, int num_experts, int max_rows);
// Given route->expert and route->weight for T tokens, decides which choices
// are kept in GShard order (all first choices before any second choice, token
// order within a choice) with capacity C (-1: dropless), then numbers each
// expert's kept choices in token order (so a sum over an expert's rows runs in
// token order), and fills count, count_all, offset, row_token, row_choice,
// rows and dropped. Allocates nothing.
moe_status moe_route_assign(moe_ctx *ctx, moe_route *route, int tokens, int capacity);
// counts (P, E) = rows this plan sends from src_rank to each rank p for expert e.
void moe_route_count_by_rank(const moe_route *route, const moe_placement *pl, int src_rank,
                             int32_t *counts);

// ---- the layer ---------------------------------------------------------------------------

typedef struct moe_layer moe_layer;

// Parameters and their gradients (owned by the layer). Shapes:
// wg (M, E); w1 (E, M, H); b1 (E, H); w2 (E, H, M); b2 (E, M); d* the same.
// router_bias (E): the router bias (moe_gate_buffers in layer_ops.h: experts
// are chosen by logits + bias, weighed by the unbiased probabilities). Zero at
// create, so routing is the plain top-k; the caller writes it (a synthetic
// skew, moe_router_bias_fit; DeepSeek-V3's update, moe_router_bias_update).
// Not a parameter: no gradient, untouched by init_params and zero_grad.
typedef struct {
  float *wg, *w1, *b1, *w2, *b2;
  float *dwg, *dw1, *db1, *dw2, *db2;
  float *router_bias;
} moe_layer_tensors;

typedef struct {
  float aux_loss;  // load-balancing loss of the last forward (unscaled)
  float z_loss;    // z-loss of the last forward (unscaled)
  int tokens;      // T
  int rows;        // kept choices
  int dropped;     // dropped choices
  int rerouted;    // choices the topology-aware gate re-selected (0 without it)
} moe_layer_stats;

// Wall time of the phases of the last forward and the last backward.
typedef struct {
  double total_ms;
  double gate_ms;          // gate GEMM, softmax, top-k, routing, aux losses (fwd);
                           // their backward (bwd)
  double gate_gemm_ms;     // the gate's GEMMs alone
  double dispatch_ms;      // gather rows (fwd) / scatter-add token grads (bwd)
  double expert_gemm_ms;   // the expert FFN GEMMs alone
  double expert_other_ms;  // bias, activation and their backward
  double combine_ms;       // weighted combine (fwd) / its backward (bwd)
  double expert_flops;     // FLOPs of the expert GEMMs
  double gate_flops;       // FLOPs of the gate GEMMs
} moe_layer_timing;

// Allocates every buffer for cfg->tokens tokens; forward and backward allocate
// nothing afterwards. Parameters start at zero: call moe_layer_init_params.
moe_status moe_layer_create(moe_ctx *ctx, const moe_layer_config *cfg, moe_layer **out);
void moe_layer_destroy(moe_layer *layer);  // NULL is a no-op
// FasterMoE's topology-aware gate as one rank of a multi-node job applies it
// to its own tokens (moe_topo_gate_reselect in layer_ops.h; the distributed
// layer's is moe_parallel_config.topo_gate): experts with local[e] 0 are on
// other nodes, and at most floor(share x T x K) of a forward's choices go to
// them. Changes the routing (opt-in). local NULL: off (the plain gate).
// share in [0, 1]. Copies local; allocates the gate's scratch here, not in
// the forward. INVALID_ARG for a share out of range.
moe_status moe_layer_set_topology(moe_layer *layer, const uint8_t *local, double share);

// The bytes moe_layer_create allocates for cfg, by category (include/moe/core.h:
// parameters, gradients, activations = forward activations and backward
// scratch for cfg->tokens tokens, workspace = routing plan, placement, the
// layer object), computed without allocating; the sizes do not depend on the
// data (capacity or not, every buffer is sized for the most rows, T x K or
// E x C). INVALID_ARG when cfg is invalid. Baseline not included.
moe_status moe_layer_memory(moe_ctx *ctx, const moe_layer_config *cfg, moe_memory_need *out);

const moe_layer_config *moe_layer_get_config(const moe_layer *layer);
moe_layer_tensors moe_layer_get_tensors(moe_layer *layer);
size_t moe_layer_num_params(const moe_layer *layer);
const moe_route *moe_layer_get_route(const moe_layer *layer);
const moe_placement *moe_layer_get_placement(const moe_layer *layer);

// PyTorch nn.Linear-style init: wg, w1, b1 ~ U(-1/sqrt(M), 1/sqrt(M)),
// w2, b2 ~ U(-1/sqrt(H), 1/sqrt(H)), each tensor its own RNG stream of seed.
void moe_layer_init_params(moe_layer *layer, uint64_t seed);
void moe_layer_zero_grad(moe_layer *layer);

// x (T, M) -> y (T, M), 0 <= T <= cfg.tokens. Overwrites y, which must not
// overlap x (INVALID_ARG): backward reads x again. stats may be NULL.
moe_status moe_layer_forward(moe_layer *layer, const float *x, int tokens, float *y,
                             moe_layer_stats *stats);
// dy (T, M) of the last forward -> dx (T, M) += ; parameter gradients +=,
// including aux_loss_coef * d(aux) and z_loss_coef * d(z). Needs the x of the
// last forward to be unchanged.
moe_status moe_layer_backward(moe_layer *layer, const float *dy, float *dx);

// ---- router bias: reproducible skew, DeepSeek-V3's balancing update ---------------------
//
// Expert popularity for benchmarks is set through the router bias
// (moe_layer_tensors.router_bias): a named distribution gives target shares
// of the choices, and moe_router_bias_fit finds the bias under which the
// layer's own router, on given tokens, chooses experts in those shares.

typedef enum {
  MOE_SKEW_NONE = 0,  // no bias: the router as trained (or initialised)
  MOE_SKEW_UNIFORM,   // every expert 1/E of the choices
  MOE_SKEW_ZIPF,      // expert e's share proportional to (e + 1)^-S: expert 0 most popular
  MOE_SKEW_HOT,       // expert 0 chosen by a fraction F of the tokens, the rest uniform
  MOE_SKEW_TRACE,     // the shares of a recorded routing trace (moe_routing_trace_shares)
} moe_skew_kind;

typedef struct {
  moe_skew_kind kind;
  double param;                 // S of zipf, F of hot
  char path[512];               // trace: the routing trace file
  int trace_layer;              // trace: only this MoE block's lines; -1 = every layer
  int trace_first, trace_last;  // trace: only steps first..last; 0 = from the first / to the last
} moe_skew;

// "none", "uniform", "zipf:S" (S in (0, 10]), "hot:F" (F in (0, 1]),
// "trace:FILE[#LAYER][@FIRST-LAST]" (a routing trace written by moe train
// --routing-trace, optionally one MoE block's lines and a step range, e.g.
// trace:run.jsonl#1@101-300; the file is read by moe_skew_shares). The
// selectors are read after the path's last '/': a file whose name holds '#'
// or '@' needs them given (or a name without). INVALID_ARG naming the spec and
// the valid forms.
moe_status moe_skew_parse(moe_ctx *ctx, const char *spec, moe_skew *out);
// The spec back ("zipf:1.2"); snprintf's return value. MOE_SKEW_SPEC_MAX
// bytes hold any spec (a trace's path with its selectors).
#define MOE_SKEW_SPEC_MAX 600
int moe_skew_to_string(const moe_skew *skew, char *buf, size_t len);
// shares (E) = the distribution's fraction of all T x K choices per expert,
// summing to 1. A token chooses an expert at most once, so no share exceeds
// 1/K: larger ones are capped and the excess spread over the others in
// proportion to their shares. none is uniform here. trace reads the file
// (moe_routing_trace_shares: its errors).
moe_status moe_skew_shares(moe_ctx *ctx, const moe_skew *skew, int num_experts, int top_k,
                           double *shares);

// The shares of the choices per expert in a routing trace (written by moe
// train --routing-trace; docs/balance.md "Routing traces"): the kept rows per
// expert summed over the lines trace selects (its layer and steps; every
// source rank) over their total. Its header must name num_experts experts and top_k (INVALID_ARG
// otherwise: a trace of another shape); a malformed file is BAD_FORMAT
// naming the line, an unreadable one IO. *lines_read (may be NULL): the count
// lines used. Only the popularity per expert is kept, not which rank sent
// what (one router bias serves every rank).
moe_status moe_routing_trace_shares(moe_ctx *ctx, const moe_skew *trace, int num_experts, int top_k,
                                    double *shares, int *lines_read);

// The routing-trace format's writer (src/layer/trace_shares.c has the format):
// the header line, then one line per step and MoE block with the (ranks x
// experts) kept rows, rank p's at counts + p * rank_stride, and, when estimate
// (experts) is not NULL, a path profile's estimate. Errors: the stream's
// (ferror) for the caller to check.
void moe_routing_trace_write_header(FILE *f, int ranks, int experts, int top_k, int tokens_per_rank,
                                    const int *moe_blocks, int n_blocks);
void moe_routing_trace_write_step(FILE *f, long long step, int block, const int32_t *counts,
                                  int ranks, int experts, size_t rank_stride,
                                  const double *estimate);
// A whole routing trace (moe simulate --lina): every body line's rows per
// expert summed over the source ranks, and its "estimate" (the popularity a
// path profile estimated for it: moe generate / moe serve --routing-trace
// with --paths) when present.
#define MOE_ROUTING_TRACE_MAX_VALUES ((size_t)1 << 26)  // lines x experts x 2 at most
typedef struct {
  int ranks, experts, top_k, tokens_per_rank;  // the header's
  int layers[256], n_layers;                   // its moe_layers
  int n, cap;                                  // lines read; allocated
  int with_estimate;                           // lines with an estimate
  int *step, *layer;                           // (n)
  double *rows;      // (n, experts): the kept rows per expert, every source rank's
  double *estimate;  // (n, experts): the estimate; estimate[i * experts] = NAN when absent
} moe_routing_trace_data;
// BAD_FORMAT naming the line for a malformed file, IO when unreadable,
// INVALID_ARG beyond MOE_ROUTING_TRACE_MAX_VALUES; *out zeroed on error.
moe_status moe_routing_trace_load(moe_ctx *ctx, const char *path, moe_routing_trace_data *out);
// Its header line only (ranks, experts, top_k, tokens_per_rank, layers; n = 0,
// nothing allocated): what a run appending to the file checks. Errors as above.
moe_status moe_routing_trace_load_header(moe_ctx *ctx, const char *path,
                                         moe_routing_trace_data *out);
void moe_routing_trace_data_free(moe_routing_trace_data *d);

#define MOE_ROUTER_FIT_ITERS 200  // most iterations of moe_router_bias_fit
#define MOE_ROUTER_FIT_TOL 0.005  // total variation at which it stops

typedef struct {
  double *achieved;        // (E) caller-owned or NULL: shares the fitted bias gives
  double total_variation;  // 1/2 sum |achieved - target|
  int iterations;
} moe_router_fit;

// bias (E) such that top-K of (x wg + bias) over the tokens x (T, M) chooses
// experts in the given shares (E, each in [0, 1/K], summing to 1): a damped
// fixed-point iteration on log shares (at most MOE_ROUTER_FIT_ITERS, stopping
// at total variation MOE_ROUTER_FIT_TOL), returning the best iterate. wg is
// (M, E) as in the layer. Deterministic: the same inputs give the same bias on
// every rank. fit may be NULL. Allocates temporaries (T x E floats).
moe_status moe_router_bias_fit(moe_ctx *ctx, const moe_layer_config *cfg, const float *wg,
                               const float *x, int tokens, const double *shares, float *bias,
                               moe_router_fit *fit);
// DeepSeek-V3's aux-loss-free update: bias[e] += rate * sign(mean - load[e])
// for the E experts' loads (rows routed to each over the global batch).
void moe_router_bias_update(float *bias, const double *load, int num_experts, float rate);

moe_layer_timing moe_layer_get_forward_timing(const moe_layer *layer);
moe_layer_timing moe_layer_get_backward_timing(const moe_layer *layer);

#ifdef __cplusplus
}
#endif
#endif  // MOE_LAYER_H
