// Parm (INFOCOM'24): the MoE layer under tensor (model) parallelism with
// sharded experts, and its three schedules (docs/parm.md).
//
// Layout: world = DP x MP x EP x ESP ranks. Rank
//   r = ((dp * EP + ep) * ESP + esp) * MP + mp,
// so an MP group is MP consecutive ranks and an ESP group the next level of
// consecutive ranks (both inside a node when they fit: Parm's placement).
//   - MP peers (same dp, ep, esp) hold IDENTICAL tokens (Megatron's tensor
//     parallelism: the layers before the MoE layer give every MP rank the same
//     activations) and get identical outputs and input gradients.
//   - Each (dp, ep, esp) holds its own tokens: the global batch is their
//     concatenation in the order of d = (dp * EP + ep) * ESP + esp.
//   - Experts: EP rank ep holds experts ep x E/EP .. (ep + 1) x E/EP - 1, each
//     sharded along H over the ESP group: shard s holds w1's columns and b1's
//     entries s x H/ESP .. (s + 1) x H/ESP - 1 and the same rows of w2; b2 is
//     held whole by every shard and added by shard 0. Every MP and DP rank
//     with the same (ep, esp) holds the same shards.
//   - The all-to-alls run in the group of the EP x ESP ranks with the same
//     (dp, mp), member q = ep * ESP + esp.
//
// Schedules (moe_parm_schedule):
//   baseline  DeepSpeed-MoE: gate on the T tokens on every MP rank;
//             ESP-AllGather of the dispatched rows; EP all-to-all; expert
//             shards; ESP-AllReduce of the partial outputs; EP all-to-all
//             back; ESP-Split; combine. Every token is computed MP times.
//   s1        MP paused before the gate: MP rank m takes tokens
//             [m T / MP, (m + 1) T / MP); gate; EP&ESP all-to-all (Dump: each
//             row goes to every shard of its expert, one all-to-all over the
//             EP x ESP group); shards; all-to-all back; local combine (the sum
//             of the ESP partial outputs); combine; MP-AllGather of the outputs.
//             The capacity is applied to the T / MP tokens of the slice.
//   s2        MP paused after the gate: gate on the T tokens; MP rank m takes
//             rows [m n_e / MP, (m + 1) n_e / MP) of each expert's n_e rows;
//             EP&ESP all-to-all, shards, all-to-all back, local combine;
//             MP-AllGather of the expert outputs (with saa, overlapped with the
//             all-to-all back: SAA); combine. The same routing and drops as
//             baseline.
// Backward: every schedule's is derived in docs/parm.md; gradients of the
// parameters are those of the global batch (summed over every rank's
// tokens, each counted once), complete on every rank that holds them.
//
// Math: outputs, dx, aux and z losses and every gradient equal the
// single-process layer's on the global batch when nothing is dropped
// (tests/test_parm_layer.c). With a capacity, baseline and s2 drop per source
// rank (as moe_ep_layer), s1 per MP slice.
//
// Threading: one thread per rank; MPI initialised by the caller. With chunks
// > 1 or a compressor (moe_parm_config) the EP&ESP pass runs its all-to-alls
// and SAA's gathers on a communication thread of the executor: MPI must then
// be initialised with MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE.
#ifndef MOE_PARM_H
#define MOE_PARM_H

#include <mpi.h>

#include "moe/comm.h"
#include "moe/layer.h"
#include "moe/perf.h"  // moe_parm_schedule
#include "moe/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int mp, ep, esp;             // group sizes, each >= 1; mp x ep x esp divides the world
  moe_parm_schedule schedule;  // [MOE_PARM_S2]
  char a2a[32];  // all-to-all algorithm (moe_a2a_find) of the EP and EP&ESP all-to-alls ["mpi"]
  int saa;       // s2: 1 = the MP-AllGather overlapped with the all-to-all back (SAA), 0 = after
                 // it [1]
  int ranks_per_node;  // topology override (moe_topology_nodes); 0 = automatic [0]
  int intra_node;      // 1 = refuse a layout whose MP or ESP groups cross nodes [0]
  // Deterministic mode (docs/parm.md "Deterministic mode"), 0 = off [0]: the
  // gate's weight gradient is the pairwise sum over slices of slice_tokens
  // tokens summed with moe_allreduce_fixed, the aux/z statistics are per-slice
  // sums added in global slice order, and each expert's gradients are one
  // fixed-order chain over its rows in global token order, continued from
  // holder to holder (moe_chain_run) instead of summed. With moe_gemm on its
  // fixed path, a power-of-two number of slices per rank and nothing dropped,
  // outputs, losses and gradients have the single-process layer's bits (the
  // expert-parallel layer's with slice_tokens, at 1 rank). With ESP > 1 the
  // shards' sums over H (the output's second GEMM, the input gradient's last)
  // are chains over the ESP group too, for the 'ffn' expert (others are
  // refused). Every rank's gate tokens (s1: its MP slice) must be a multiple
  // of slice_tokens. [0, cfg.tokens]
  int slice_tokens;
  // s1 and s2's EP&ESP pass (Dump + all-to-all, shards, all-to-all back) cut
  // into `chunks` chunks (each (member, expert) block's rows split evenly)
  // and run as tasks on the two-stream executor (moe/sched.h) in the order
  // of `task_schedule`, so the all-to-all of one chunk overlaps the shards of
  // another (ScheMoE's schedules, composed with Parm's pass). chunks 1 runs
  // the pass without the executor. The baseline's passes are not chunked.
  // Not with slice_tokens > 0. With chunks > 1 and saa, s2's MP-AllGather is
  // a task per chunk after its all-to-all back (SAA in chunks: the gather of
  // one chunk overlaps the shards of the next). [1, 1..MOE_MAX_CHUNKS]
  int chunks;
  char task_schedule[16];    // moe_schedule_algo_find name, row-chunked ones ["sequential"]
  moe_executor_config exec;  // the executor's wait policy [moe_executor_config_default()]
  // Compression of the EP&ESP pass's payloads (moe_compressor_get spec, e.g.
  // "fp16", "zfp:12"): C1 / D1 / C2 / D2 tasks around its all-to-alls (the
  // Dump's rows compressed once per EP rank), so s1 and s2 run on the
  // executor (with `chunks` chunks, 1 included). Lossy compressors change the
  // results (opt-in). The baseline's passes are not compressed. Not with
  // slice_tokens > 0. ["none"]
  char compress[32];
  int compress_backward;  // 1: the backward's gradients too [0]
} moe_parm_config;

// The defaults in brackets above: MP = EP = ESP = 1.
void moe_parm_config_default(moe_parm_config *pc);

typedef struct {
  int dp, mp, ep, esp;
} moe_parm_coords;

// Where world rank `rank` sits (pc's sizes; DP = world / (MP x EP x ESP)).
moe_parm_coords moe_parm_coords_of(const moe_parm_config *pc, int world, int rank);
// The index of that rank's tokens in the global batch: (dp x EP + ep) x ESP + esp
// (MP peers share it); the batch has world / MP such parts.
int moe_parm_data_index(const moe_parm_config *pc, int world, int rank);

typedef struct moe_parm_layer moe_parm_layer;

// What this rank holds. wg (M, E) and router_bias (E): every rank. Experts
// home_first .. home_first + home_count - 1, shard `shard` of ESP, hidden
// slice hs = H / ESP wide: w1 (home_count, M, hs), b1 (home_count, hs), w2
// (home_count, hs, M), b2 (home_count, M) whole. d*: the same shapes.
typedef struct {
  int home_first, home_count, shard, hs;
  float *wg, *w1, *b1, *w2, *b2;
  float *dwg, *dw1, *db1, *dw2, *db2;
  float *router_bias;
} moe_parm_tensors;

// Collective over world. INVALID_ARG on every rank (no hang) when: a size is
// below 1; mp x ep x esp does not divide the world; E is not divisible by
// EP; H is not divisible by ESP; the all-to-all is unknown or cannot run on
// its group's nodes; ranks_per_node does not divide the world; intra_node is
// set and an MP or ESP group spans two nodes; chunks is out of range, the
// task schedule unknown or cut by peer groups, the compressor unknown;
// chunks > 1 or a lossy compressor with slice_tokens; MPI below
// MPI_THREAD_SERIALIZED with chunks or a compressor; the configurations
// differ between ranks.
moe_status moe_parm_layer_create(moe_ctx *ctx, MPI_Comm world, const moe_layer_config *cfg,
                                 const moe_parm_config *pc, moe_parm_layer **out);
// The bytes one rank of moe_parm_layer_create(world of world_size ranks)
// allocates, by category, without allocating (no MPI call): parameters and
// gradients (twice: the backward's own before the sums), activations (gate
// buffers, the rows of the rank's gate and their copies), all-to-all buffers
// (the packed and gathered rows, the rows received at the expert shards: the
// most that can arrive, P sources x T x min(K, E / EP) rows, or Eh
// capacities each; what balanced routing would not need is skew_bytes) and
// their hidden activations. INVALID_ARG for an invalid cfg or layout.
moe_status moe_parm_layer_memory(moe_ctx *ctx, const moe_layer_config *cfg,
                                 const moe_parm_config *pc, int world_size, moe_memory_need *out);
void moe_parm_layer_destroy(moe_parm_layer *layer);  // NULL is a no-op; collective

moe_parm_tensors moe_parm_layer_get_tensors(moe_parm_layer *layer);
// The values moe_layer_init_params(seed) gives, sliced to what this rank holds.
void moe_parm_layer_init_params(moe_parm_layer *layer, uint64_t seed);
void moe_parm_layer_zero_grad(moe_parm_layer *layer);
// Switches the schedule between passes (every rank alike; a pending backward
// is dropped). INVALID_ARG for an unknown one.
moe_status moe_parm_layer_set_schedule(moe_parm_layer *layer, moe_parm_schedule s, int saa);

// x (T, M) -> y (T, M), T <= cfg.tokens tokens of this rank, the same x on
// every MP peer (T may differ between data parts). Collective over world.
// stats: the global aux and z losses; rows and drops of this rank's gate.
moe_status moe_parm_layer_forward(moe_parm_layer *layer, const float *x, int tokens, float *y,
                                  moe_layer_stats *stats);
// dy (T, M), the same on every MP peer -> dx (T, M) (overwritten); parameter
// gradients added (+=). Collective over world.
moe_status moe_parm_layer_backward(moe_parm_layer *layer, const float *dy, float *dx);
// The same with dx += (a model's residual stream: moe_gpt_moe_ops.backward),
// through the layer's own (T, M) buffer.
moe_status moe_parm_layer_backward_add(moe_parm_layer *layer, const float *dy, float *dx);
// ESP: the shards each expert is split into.
int moe_parm_layer_shards(const moe_parm_layer *layer);

// Times of the last forward (backward = 0) or backward (1) on this rank, ms.
typedef struct {
  double total_ms;
  double a2a_ms;     // the EP / EP&ESP all-to-alls (with SAA: the all-to-all and the gather)
  double esp_ms;     // ESP-AllGather, ESP-AllReduce / ReduceScatter (baseline)
  double mp_ms;      // MP-AllGather (s1, s2 without SAA)
  double expert_ms;  // the expert shards
  double reduce_ms;  // the backward's gradient sums over the replicas
} moe_parm_timing;
moe_parm_timing moe_parm_layer_timing(const moe_parm_layer *layer, int backward);

// The layer's groups, for measurements of its collectives: the EP x ESP
// all-to-all group (member q = ep x ESP + esp), the MP communicator (by mp),
// and the all-to-all algorithm.
const moe_group *moe_parm_layer_a2a_group(const moe_parm_layer *layer);
MPI_Comm moe_parm_layer_mp_comm(const moe_parm_layer *layer);
const moe_a2a_algo *moe_parm_layer_algo(const moe_parm_layer *layer);

// Parm's Algorithm 1 (moe_parm_alg1) for the layer cfg (its tokens per data
// part, M, K, capacity) on pc's layout: MOE_PARM_S1 or MOE_PARM_S2; t1_ms and
// t2_ms (may be NULL) get its two predictions in ms. Local.
moe_parm_schedule moe_parm_pick(const moe_parm_alpha_beta *ab, const moe_layer_config *cfg,
                                const moe_parm_config *pc, double *t1_ms, double *t2_ms);

// ---- the collectives of Parm, exposed for their tests ----------------------

// EP&ESP all-to-all (Dump + one all-to-all): in the EP x ESP group g
// (member q = ep x ESP + esp), member q sends every member (ep', s) the same
// block: rows[ep'] rows of `width` floats at send + first[ep'] x width (the
// Dump, without a copy). recv_rows[q'] (known to the caller from a counts
// exchange) rows arrive from member q', stored in member order at recv.
// counts: 4 g->size entries of the caller's (the byte counts and
// displacements; nothing is allocated). Collective over g.
moe_status moe_parm_dump_a2a(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g, int esp,
                             const float *send, const int *rows, const int *first, int width,
                             float *recv, const int *recv_rows, size_t *counts, moe_workspace *ws);

#ifdef __cplusplus
}
#endif

#endif  // MOE_PARM_H
