// The expert-parallel MoE layer over MPI: DP x EP process layout, placement of
// experts on the ranks of an EP group (home ranks plus optional replicas),
// counts exchange, all-to-all dispatch and combine with a selectable
// algorithm, and the gradient reductions.
//
// The math is the single-process layer's (docs/moe-layer.md) on the global
// batch = the concatenation of every rank's tokens in rank order: outputs,
// aux and z losses and every gradient equal moe_layer's on that batch when no
// token is dropped. Capacity is applied per source rank (docs/distributed.md).
//
// Threading: one thread per rank calls these, with the moe_ctx the layer was
// created with. MPI must be initialised by the caller.
#ifndef MOE_PARALLEL_H
#define MOE_PARALLEL_H

#include <mpi.h>

#include "moe/comm.h"
#include "moe/layer.h"
#include "moe/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int ep_size;         // EP: ranks an expert set is spread over; DP = world / EP. [1, world]
  int ep_strided;      // 0: EP groups are consecutive ranks; 1: ranks d, d+DP, d+2DP, ...
  int ranks_per_node;  // topology override (see moe_topology_nodes); 0 = automatic
  char a2a[32];        // all-to-all algorithm name (moe_a2a_find), default "mpi"
  int grouped_size;  // group size of `grouped` and `smart`; 0 = ranks per node when uniform, else 1
  // Task scheduling (docs/scheduling.md): the expert all-to-alls and experts of
  // a pass are cut into `chunks` chunks and run by a two-stream executor.
  char schedule[16];         // moe_schedule_algo_find name, default "sequential"
  int chunks;                // r, 1..MOE_MAX_CHUNKS (default 1); ignored by `smart` (r = groups)
  char compress[32];         // compressor spec for the all-to-all payloads (moe_compressor_get),
                             // default "none"; lossy ones change the results
  int compress_backward;     // 1: also compress the backward's gradients (default 0)
  moe_executor_config exec;  // wait policy of the communication thread
  // Fixed-order sums (docs/reliability.md), 0 = off (default): the gate's
  // weight gradient is the pairwise sum over slices of slice_tokens
  // consecutive tokens, summed over the world with moe_allreduce_fixed, and the
  // aux/z statistics are per-slice sums added in global slice order. Every
  // rank's token count must then be a multiple of slice_tokens. With moe_gemm
  // on its fixed path, EP = world, one chunk and a power-of-two number of
  // slices per rank, the gate's gradient and the losses have the same bits
  // at any rank count. [0, cfg.tokens]
  int slice_tokens;
  // Expert copies for load balancing (moe_ep_layer_set_placement, docs/balance.md):
  // slots per rank, each holding one copy's parameters and gradients,
  // allocated at create so that switching placements allocates nothing.
  // [0, E - E/EP], 0 = none (default).
  int copy_slots;
  // FasterMoE's topology-aware gate (docs/balance.md "Topology-aware gate";
  // opt-in: it changes the routing, so outputs, losses and gradients are not
  // the plain gate's): 0 = off (default); in (0, 1]: the bandwidth ratio
  // W_net / W_local. Each rank lets at most floor(topo_gate / M x T x K) of
  // its T x K choices go to experts whose home is on another node of its EP
  // group (M: the group's ranks on its node); the others re-select among the
  // experts of its node (moe_topo_gate_reselect). An EP group on one node
  // routes as without it. Copies placed by balancing do not count as local.
  double topo_gate;
  // Agg deferred (docs/balance.md "The run-time mechanism"; with copy_slots):
  // 0 = the backward returns the expert gradients complete (default); 1 = the
  // backward posts Agg (the copies' gradients to their homes) as non-blocking
  // transfers and returns, and moe_ep_layer_grads_wait completes it, adds them
  // and reduces the home experts' gradients over the DP group, so that what
  // runs in between (a model's earlier blocks' backward) hides the transfer.
  // The same bits as 0. Until the wait, the expert gradients are incomplete
  // and the layer refuses a new backward or placement.
  int defer_agg;
  // Frozen parameters (inference; with copy_slots): 0 = every set_placement
  // sends every copy its home's current parameters (training: they change
  // each step; default); 1 = the home parameters never change while the
  // layer lives, so set_placement sends them only to the copies it places
  // anew, and a copy kept from the last placement keeps its own (a
  // placement re-planned every few steps then moves only what changed). The
  // caller must not change the home parameters (no optimizer step) while on.
  int frozen_params;
} moe_parallel_config;

// Gate specs of the command lines: "plain" (topo 0) or "topo" /
// "topo:RATIO" (FasterMoE's topology-aware gate with W_net / W_local =
// RATIO in (0, 1]; "topo" alone: MOE_TOPO_GATE_DEFAULT). INVALID_ARG naming
// the valid forms.
#define MOE_TOPO_GATE_DEFAULT 0.25
moe_status moe_gate_spec_parse(moe_ctx *ctx, const char *spec, double *topo_gate);
// "plain" or "topo:R" (R with %g) into buf.
void moe_gate_spec_to_string(double topo_gate, char *buf, size_t len);

#define MOE_MAX_CHUNKS 64

// Defaults: EP = 1 (pure data parallelism), contiguous, automatic topology, "mpi",
// schedule "sequential" with 1 chunk, no compression, the executor's defaults.
void moe_parallel_config_default(moe_parallel_config *pc);

typedef struct moe_ep_layer moe_ep_layer;

// Parameters this rank holds and their gradients. The gate is replicated on
// every rank; experts home_first .. home_first + home_count - 1 live here
// (E / EP of them). Shapes: wg (M, E); w1 (home_count, M, H); b1 (home_count, H);
// w2 (home_count, H, M); b2 (home_count, M); d* the same. router_bias (E) as in
// moe_layer_tensors: zero at create; it must hold the same values on every
// rank (the routing of a token must not depend on where it is).
typedef struct {
  int home_first, home_count;
  float *wg, *w1, *b1, *w2, *b2;
  float *dwg, *dw1, *db1, *dw2, *db2;
  float *router_bias;
} moe_ep_tensors;

// The bytes one rank of moe_ep_layer_create(world of world_size ranks, cfg,
// pc) allocates, by category, computed locally without allocating (no MPI
// call): parameters (gate + E/EP home experts), gradients (theirs, the
// reduction scratch, one expert's received replica gradients), activations
// (gate buffers and the rank's routed rows, the rows its experts receive and
// their hidden activations kept for backward, the backward scratch), all-to-all
// buffers (send rows, receive buffers, compressed payloads, the algorithm's
// workspace: its workspace_copies x G x payload, G = ranks_per_node or, when
// 0, the whole EP group), workspace (routing plan, placement, counts, chunk
// plan, task records). The receive side grows with the routing, so its size
// is data dependent; it is taken at the most rows that can arrive: P sources x
// T x min(K, E/EP) (dropless: every source's tokens choose this rank's
// experts), or P x min(T x min(K, E/EP), E/EP x C) with a capacity C per
// source and expert. Why not balanced routing (each rank receives what it
// sends, R = T x K or E x C): measured on the default training model, the
// busiest rank's receive buffers reach 2.9x R within 5 steps and 3.75x R
// (of at most 4x) within 60 (docs/reliability.md, "Memory bound"), so a
// balanced estimate would let a run start that then runs out of memory.
// skew_bytes holds what a balanced routing would not need. Replicas
// (moe_ep_layer_set_replica) are not counted: each adds 2 experts' floats.
// Small fixed structures (the task graphs, the executor, MPI communicators)
// are outside the count: below 64 KiB for r <= 8 chunks (tests check the
// total against moe_alloc_bytes). INVALID_ARG for an invalid cfg, an unknown
// all-to-all or compressor, or E not divisible by ep_size.
moe_status moe_ep_layer_memory(moe_ctx *ctx, const moe_layer_config *cfg,
                               const moe_parallel_config *pc, int world_size, int ranks_per_node,
                               moe_memory_need *out);

// Collective over world. Fails on EVERY rank (no hang) with INVALID_ARG when:
// the layer config is invalid or differs between ranks; world is not divisible
// by ep_size; E is not divisible by ep_size; the all-to-all name is unknown or
// the algorithm cannot run on this topology; ranks_per_node does not divide
// the world; the schedule or compressor is unknown; chunks is out of range;
// MPI was initialised below MPI_THREAD_SERIALIZED (the all-to-alls run on the
// executor's communication thread).
moe_status moe_ep_layer_create(moe_ctx *ctx, MPI_Comm world, const moe_layer_config *cfg,
                               const moe_parallel_config *pc, moe_ep_layer **out);
void moe_ep_layer_destroy(moe_ep_layer *layer);  // NULL is a no-op; collective

moe_ep_tensors moe_ep_layer_get_tensors(moe_ep_layer *layer);
const moe_group *moe_ep_layer_ep_group(const moe_ep_layer *layer);
const moe_placement *moe_ep_layer_get_placement(const moe_ep_layer *layer);
const moe_route *moe_ep_layer_get_route(const moe_ep_layer *layer);

// The same values moe_layer_init_params(seed) gives, sliced to what this rank
// holds; replicas get their home's values.
void moe_ep_layer_init_params(moe_ep_layer *layer, uint64_t seed);
void moe_ep_layer_zero_grad(moe_ep_layer *layer);

// Marks (on = 1) a replica of expert e on EP rank p (within every EP group):
// tokens of p for e are then computed on p with the replica's parameters, and
// the replica's gradients are added to the home rank's. Collective over world;
// the arguments must be the same everywhere (else INVALID_ARG on every rank).
// Allocates the replica's storage and copies the home's current parameters.
// A pending backward is invalidated: run a new forward first.
moe_status moe_ep_layer_set_replica(moe_ep_layer *layer, int expert, int ep_rank, int on);
// Copies every home expert's parameters to its replicas (after an optimizer
// step). Collective; invalidates a pending backward.
moe_status moe_ep_layer_sync_replicas(moe_ep_layer *layer);

// ---- placements of expert copies (load balancing, docs/balance.md) --------------------
//
// A placement is a bitmap replica (E, EP): replica[e * EP + p] = 1 when EP
// rank p holds a copy of expert e (never its home; the same placement in
// every EP group). A copy computes its own rank's tokens for e; its
// parameters come from the home (Trans, here) and its gradients go back to
// the home in the backward (Agg). The math is the layer's without copies.

// Makes replica the placement from the next forward on: frees the copies it
// drops, puts new ones in free slots (no allocation), and sends every copy
// its home's current parameters (Trans: non-blocking sends and receives in
// the EP group, posted in the next forward's pass once its first dispatch
// chunk is exchanged, or before by a linked layer's pass, and waited for
// only before a copy's rows are computed, so the home experts' compute
// hides the transfer; the home's parameters must not change until that
// forward). Collective over world; every
// rank must pass the same bitmap. INVALID_ARG on every rank (no hang) for a
// NULL bitmap, a copy on its home, more copies on a rank than
// pc.copy_slots, bitmaps that differ between ranks, or replicas made with
// moe_ep_layer_set_replica (the two cannot be mixed). Invalidates a pending
// backward. An all-zero bitmap removes every copy.
moe_status moe_ep_layer_set_placement(moe_ep_layer *layer, const uint8_t *replica);
// moe_ep_layer_set_placement of n layers on the same ranks, replicas[i] layer
// i's bitmap, with one agreement (a single all-reduce) for all of them: a
// model's layers placed each step without a collective per layer.
moe_status moe_ep_layers_set_placement(moe_ep_layer *const *layers, int n,
                                       const uint8_t *const *replicas);
// Copies the last set_placement sent parameters to, over the EP group (all
// of them; with pc.frozen_params the new ones only). 0 before any.
int moe_ep_layer_trans_copies(const moe_ep_layer *layer);

// A hook inside moe_ep_layer_forward, on every rank after the gate and the
// all-reduce of its statistics and before the dispatch (Lina's phase 2,
// src/infer/engine.c). rows[e] = expert e's choices (all top_k, before the
// capacity's drops) summed over the world, the same on every rank; tokens =
// this rank's. It runs as part of the collective forward: it may make
// collectives and set this layer's placement (moe_ep_layer_set_placement),
// which the dispatch then uses; an error fails the forward and must be the
// same on every rank. NULL removes it.
typedef moe_status (*moe_ep_gate_hook)(void *arg, moe_ep_layer *layer, int tokens,
                                       const double *rows);
void moe_ep_layer_set_gate_hook(moe_ep_layer *layer, moe_ep_gate_hook hook, void *arg);
// Wall time (ms) of the last set_placement's parameter transfer on this rank
// that no compute hid: posting it, plus waiting for it in the forward.
double moe_ep_layer_trans_ms(const moe_ep_layer *layer);
// Its part spent waiting in the forward (after posting): 0 until a forward
// after the last set_placement waited.
double moe_ep_layer_trans_wait_ms(const moe_ep_layer *layer);
// Wall time (ms) of the last backward's Agg on this rank that no compute hid:
// the blocking path's whole transfer and sum in the backward, or, with
// pc.defer_agg, the wait in moe_ep_layer_grads_wait. 0 without copies.
double moe_ep_layer_agg_ms(const moe_ep_layer *layer);
// Pro-Prophet's block-wise scheduler: links the n EP layers of one model
// (all on the same ranks), so that each one's executor polls the others'
// pending Trans (set_placement) and deferred Agg (pc.defer_agg) on its comm
// stream whenever that stream would wait (moe_executor_set_background): a
// later block's parameters travel beside this block's forward compute, its
// gradients beside this block's backward compute. The math is unchanged
// (only when transfers complete). Replaces earlier links of these layers;
// n 0 or 1 unlinks. A destroyed layer leaves its links. INVALID_ARG for a
// NULL or repeated layer, or one with transfers pending (link first).
// Local (no communication).
moe_status moe_ep_layer_link(moe_ep_layer *const *layers, int n);
// More work for this layer's comm stream to progress whenever it would wait
// (beside the linked layers' transfers): test(arg) is polled on the comm
// thread during the layer's passes until it reports MOE_TASK_DONE, e.g. the
// dense gradients' buckets (moe_grad_reducer_progress), so that their sums
// fill the all-to-all's gaps and never run beside it (Lina). test must not
// block; its failure ends its own polling for the pass (the linked layers'
// transfers go on being polled; its owner meets the error itself). NULL: none
// (the default). Between passes; local.
void moe_ep_layer_set_background_extra(moe_ep_layer *layer, moe_task_test_fn test, void *arg);
// The last forward's (backward 0) or backward's (1) polls of the linked
// layers' transfers on this rank (zeros unlinked or before a pass); done: every
// linked layer's pending Trans and Agg completed during that pass.
moe_executor_background moe_ep_layer_background(const moe_ep_layer *layer, int backward);
// The machine's rates seen by the last forward and backward, for the
// balancing planners (moe_balance_cost): *flops_per_s = the experts' GEMM
// FLOPs over their time on the slowest rank (on the fastest when ranks share
// cores, moe_ep_layer_compute_slots: a core to itself is the rate the model's
// compute_slots term divides by); *net_bytes_per_s = one link's
// rate: the bytes the busiest link carried in the four all-to-alls (per pass,
// the most rows any rank sent away or received: from other ranks, or from
// other nodes when the EP group spans several, M fp32 values each) over the
// sum, per all-to-all, of the least time a rank spent in it (a rank that
// arrived early waits inside for the last one: load imbalance, not transfer).
// 0 when not measurable (no pass yet, no rows). Collective over world.
moe_status moe_ep_layer_rates(moe_ep_layer *layer, double *flops_per_s, double *net_bytes_per_s);
// The EP group's ranks per node for the balancing models
// (moe_balance_cost.ranks_per_node): g when the group spans several nodes of
// g members each with EP rank p on the (p / g)-th node, and every EP group of
// the world has that g; 0 otherwise (one node, unequal nodes, another order,
// or groups laid out differently: the models' flat form). The same on every
// rank. Collective over world.
moe_status moe_ep_layer_ranks_per_node(moe_ep_layer *layer, int *ranks_per_node);
// The EP group's ranks that compute at once (moe_balance_cost.compute_slots):
// the sum over its ranks of each one's share of a core among the world's
// ranks on its machine (moe_comm_cpu_share), the least over the world's EP
// groups (the same on every rank): P when every rank has a core of its own,
// 2 for an EP group of 4 ranks on a 2-core machine. Collective over world on
// the layer's first call (every rank's first call is the same one); later
// calls return the value kept then, without communicating.
moe_status moe_ep_layer_compute_slots(moe_ep_layer *layer, double *slots);
// The load of the last forward: counts (EP, E) = rows EP rank p's tokens
// kept for expert e, summed over the DP groups (int64), the same on every
// rank. Collective over world (an all-gather in the EP group and a sum over
// the DP groups). Zeros before the first forward.
moe_status moe_ep_layer_load(moe_ep_layer *layer, int64_t *counts);
// moe_ep_layer_load of n layers of one model (the same EP group and E) in
// one all-gather and one sum: counts (n, EP, E), layer i's at i x EP x E.
// INVALID_ARG (local, alike on every rank) for a NULL or mismatched layer.
moe_status moe_ep_layers_load(moe_ep_layer *const *layers, int n, int64_t *counts);

// x (T, M) -> y (T, M) for this rank's T tokens (0 <= T <= cfg.tokens; T may
// differ between ranks). Collective over world. stats report the GLOBAL aux
// and z losses and this rank's rows and drops.
moe_status moe_ep_layer_forward(moe_ep_layer *layer, const float *x, int tokens, float *y,
                                moe_layer_stats *stats);
// The task graph and the profiler records (indexed by task) of the last
// forward (backward = 0) or backward (1) pass; NULLs before one has run.
// Valid until the next pass of that direction.
// With pc.defer_agg: completes the last backward's Agg (waits for the copies'
// gradients, adds them at their homes in a fixed order) and the home
// experts' DP reduction. Collective over world; a no-op when nothing is
// pending (every rank alike). Call it before reading the expert gradients.
moe_status moe_ep_layer_grads_wait(moe_ep_layer *layer);

// Trans and Agg of the last forward (backward 0) or backward (1) as a pass
// for a trace (moe_trace_pass; moe_trace_write shows the tasks that ran on
// the comm stream): a graph of two tasks, "Trans" (the forward's wait for
// the copies' parameters: the part no compute hid) and "Agg"
// (the backward's sum of the copies' gradients at their homes); records in
// ns from the start of moe_ep_layer_forward / _backward. NULL when the layer
// has no copy slots and no replicas' graph yet.
void moe_ep_layer_balance_pass(const moe_ep_layer *layer, int backward,
                               const moe_task_graph **graph, const moe_task_record **records);
void moe_ep_layer_last_pass(const moe_ep_layer *layer, int backward, const moe_task_graph **graph,
                            const moe_task_record **records);
// When that pass's executor started, on moe_time_ns's clock: its records' zero (0 before one).
uint64_t moe_ep_layer_pass_start_ns(const moe_ep_layer *layer, int backward);
// The schedule (stream orders) of the forward (backward = 0) or backward pass.
const moe_schedule *moe_ep_layer_schedule(const moe_ep_layer *layer, int backward);
// Chunks a pass is cut into (pc.chunks, or the number of peer groups for smart).
int moe_ep_layer_chunks(const moe_ep_layer *layer);
// Rows this rank's experts (home experts and replicas) computed in the last
// forward: what it received from every source, itself included. 0 before one.
int moe_ep_layer_rows_computed(const moe_ep_layer *layer);
// Rows of the last forward this rank sent to ranks on other nodes of its EP
// group (kept choices whose expert, or the copy that computes it, is there).
long long moe_ep_layer_offnode_rows(const moe_ep_layer *layer);
// Per-phase times of the last forward and backward (ms; expert GEMMs included).
void moe_ep_layer_timing(const moe_ep_layer *layer, moe_layer_timing *fwd, moe_layer_timing *bwd);

// dy (T, M) -> dx (T, M) +=; gradients of the held parameters += (gate summed
// over the world, experts over their DP replicas and replicas). Collective.
moe_status moe_ep_layer_backward(moe_ep_layer *layer, const float *dy, float *dx);

// ---- merged multi-rank traces ----------------------------------------------------------

// Writes one Chrome trace (moe_trace_write) holding the passes of every rank of
// comm: one process per rank ("rank N", N = the rank in comm), one thread per
// stream. Collective over comm: every rank gives its own passes (graph +
// records + offset_ns; n_passes may differ between ranks and may be 0; the
// .rank field is ignored and set to the rank in comm). Rank 0 gathers every
// rank's task names, chunks, streams and records and writes path; the other
// ranks' path is ignored (may be NULL).
//
// Clocks: each rank's record times are relative to its own pass start, so the
// ranks are aligned at their pass starts, not on a common clock; offset_ns
// places a rank's passes one after another (e.g. the backward at the
// forward's length).
//
// If any part fails, every rank returns an error (INVALID_ARG, or its own
// status when the failure was its own, e.g. OUT_OF_MEMORY): rank 0's error text says what failed
// (an unwritable path, a rank that could not serialize its passes), the others
// say "trace write failed on rank 0" unless the failure was their own.
// Allocates only temporaries, freed before returning.
moe_status moe_trace_write_ranks(moe_ctx *ctx, MPI_Comm comm, const char *path,
                                 const moe_trace_pass *passes, int n_passes);

#ifdef __cplusplus
}
#endif
#endif  // MOE_PARALLEL_H
