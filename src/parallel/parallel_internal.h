// Private state of the expert-parallel layer, shared by src/parallel/ep_layer.c
// (setup, parameters, replicas, gradient reductions) and src/parallel/ep_pass.c
// (the chunked forward and backward passes on the executor). Not installed.
#ifndef MOE_PARALLEL_INTERNAL_H
#define MOE_PARALLEL_INTERNAL_H

#include "moe/compress.h"
#include "moe/expert.h"
#include "moe/layer_ops.h"
#include "moe/parallel.h"
#include "moe/sched.h"

// FNV-1a of n bytes after h (configurations compared across ranks).
uint64_t moe_parallel_fnv1a_(const void *data, size_t n, uint64_t h);
// The hash of a layer config (its JSON text), to extend with a layer's own fields.
uint64_t moe_parallel_layer_hash_(const moe_layer_config *cfg);
// Every rank's h equal to rank 0's, else INVALID_ARG on every rank naming the
// first rank that differs (`what`: "parallel", "Parm"). Collective over world.
moe_status moe_parallel_same_config_(moe_ctx *ctx, MPI_Comm world, uint64_t h, const char *what);

// The deterministic mode's loss statistics (pc.slice_tokens > 0): the
// probability and lse^2 sums of stats (MOE_LOSS_STATS(E), after their
// all-reduce) replaced by per-slice sums of sl tokens added over comm's
// slices in rank order (moe_sum_slices_ordered); the counts (integers, exact
// in any order) stay the all-reduce's. slice_sums holds (max_slices + 1) x
// (E + 1) doubles; tokens / sl <= max_slices. Collective over comm.
moe_status moe_parallel_ordered_gate_sums_(moe_ctx *ctx, const moe_gate_buffers *gb, int E, int sl,
                                           int tokens, double *slice_sums, int max_slices,
                                           double *stats, MPI_Comm comm);

// What one task of a pass works on.
typedef struct {
  struct moe_ep_layer *L;
  int chunk;
  int backward;
  int compressed;  // this pass compresses its payloads
} moe_ep_task_arg;

// Byte counts and displacements of one side's blocks of a chunked exchange,
// per (chunk c, peer), index c * P + peer; displacements relative to the
// chunk's base.
typedef struct {
  size_t *bytes, *displ;
} moe_ep_blocks;

// The chunk plan: which rows of which (peer, expert) block travel in which of
// the r chunks, and where they sit on both sides. Made by the forward from
// the exchanged counts (ep_pass.c, plan_chunks), identical on both sides of
// every exchange.
typedef struct {
  // Per (c, peer, e), index (c * P + peer) * E + e:
  int *send_rows;     // rows of my block for (peer, e) in chunk c
  int *send_first;    // its first row within the block (slot)
  int *recv_rows;     // rows of peer's block for e that I receive in chunk c
  size_t *send_at;    // row of that send block in sendbuf
  size_t *recv_at;    // row of that receive block in bufa
  size_t *expert_at;  // row of that receive block in the expert-major buffers
  // Per (c, e), index c * E + e: rows of expert e in chunk c, expert-major
  size_t *expert_start, *expert_rows;
  // Per (c, peer): the payloads' bytes, raw and compressed, and their rows
  moe_ep_blocks raw_send, raw_recv, comp_send, comp_recv;
  size_t *send_block_rows, *recv_block_rows;
  size_t *send_chunk_row, *recv_chunk_row;  // (r): first row of chunk c in sendbuf / bufa
  size_t *comp_send_chunk_byte, *comp_recv_chunk_byte;  // (r + 1): byte offset of chunk c
                                                        // in csend / crecv
} moe_ep_chunk_plan;

struct moe_ep_layer {
  moe_ctx *ctx;
  moe_layer_config cfg;
  moe_parallel_config pc;
  MPI_Comm world;  // duplicate of the caller's communicator (errors return)
  MPI_Comm dp;     // ranks holding the same experts
  moe_group ep;    // the EP group with its topology
  const moe_a2a_algo *a2a;
  const moe_expert_kind *expert;
  int E, El, P, me;  // experts, home experts per rank, EP size, my EP rank
  int max_rows;
  moe_placement placement;
  // topology-aware gate (pc.topo_gate; NULL when off or every expert is local)
  uint8_t *topo_local;  // (E): expert's home on this rank's node
  double topo_share;    // share of the T x K choices allowed off the node
  void *topo_scratch;   // MOE_TOPO_SCRATCH_BYTES(cfg.tokens, K)
  moe_route route;
  // parameters: gate and home experts in one arena, replicas allocated apart
  moe_arena params;
  moe_ep_tensors t;
  float **w1_of, **b1_of, **w2_of, **b2_of;      // (E): where each expert computed here lives
  float **dw1_of, **db1_of, **dw2_of, **db2_of;  // (E): where its gradients go this pass
  float **replica_mem;                           // (E): replica storage (params + grads)
  float *grad_scratch;  // dwg | home dw1 | db1 | dw2 | db2 of one backward, reduced then added
  size_t grad_gate_n, grad_home_n;
  // source side, route (expert) order, R rows
  moe_arena work;
  float *logits, *probs, *lse, *topk_p, *xe, *ye, *dye, *dweight, *dprobs, *dlogits;
  float *sendbuf;  // (R, M): rows in (chunk, destination, expert) order
  // receive side, grown on demand: bufa (chunk, source, expert) order; ex_x,
  // bufb, pre, h, dh, dpre (chunk, expert, source) order
  moe_workspace bufa, bufb, ex_x, pre, h, dh, dpre, a2a_ws;
  moe_workspace csend, crecv;  // compressed payloads, (chunk, peer) blocks
  int recv_rows;
  double compute_slots;  // moe_ep_layer_compute_slots, once known (0: not yet)
  // counts exchange: (P, E + 1) ints, rows per expert then the sender's capacity
  int *cnt_send, *cnt_recv;
  moe_ep_chunk_plan plan;      // of the last forward (the backward reuses it)
  double *stats;               // MOE_LOSS_STATS(E) + 1 (error flag) + E (choices per expert)
  moe_ep_gate_hook gate_hook;  // after the gate, before the dispatch (NULL: none)
  void *gate_hook_arg;
  // fixed-order sums (pc.slice_tokens > 0): per-slice gate sums (slices, E + 1)
  // and the pairwise sum of the gate's weight gradient over slices
  double *slice_sums;  // (max_slices + 1, E + 1): the last row is the total
  int max_slices;
  moe_pairwise gate_pw;
  // the fixed-order all-reduces' receive buffers (home experts over DP, gate over the world)
  moe_fixed_sum fixed_home, fixed_gate;
  // scheduling
  const moe_schedule_algo *sched;
  moe_compressor comp;
  int compress_on;                   // compressor is not "none"
  int r;                             // chunks
  int groups, group_size, my_group;  // peer groups (smart)
  moe_executor *ex;
  moe_a2a_pending pending;  // the all-to-all in flight on the communication stream
  moe_task_graph graph[2];  // forward, backward
  moe_schedule order[2];
  moe_task_record *rec[2];  // (7 r) each: copies of the executor's records
  int have_rec[2];
  moe_ep_task_arg *targ;  // (2 r)
  // A compute task that fails (a compressor refusing NaN, say) records its
  // error here and lets the pass finish, so no peer waits in an all-to-all;
  // the ranks then agree on the failure.
  int soft_failed;
  char soft_msg[512];
  int broken;  // a pass failed with an all-to-all in flight: no further passes
  char broken_msg[640];
  const float *x_last;
  int tokens_last, have_forward;
  moe_layer_stats last;
  moe_layer_timing fwd_timing, bwd_timing;
  moe_workspace rep_tmp;  // one expert's gradients received from a replica
  // Expert copies of load balancing (pc.copy_slots, ep_placement.c): slots
  // allocated at create, each one expert's parameters then gradients; a copy
  // placed by moe_ep_layer_set_placement lives in a slot (replica_mem[e]
  // points into copy_mem and is not freed on its own).
  float *copy_mem;          // (copy_slots, 2 nf)
  int *slot_expert;         // (copy_slots): expert in the slot, -1 free
  uint8_t *trans_mask;      // (E, EP): the copies the last set_placement sent parameters to
  int *expert_slot;         // (E): slot of expert e's copy here, -1 none
  MPI_Request *reqs;        // Trans requests: at most 4 x (E x P) at once
  MPI_Status *trans_stats;  // their statuses (a real array: MPICH's MPI_STATUSES_IGNORE
                            // is (MPI_Status *)1, which GCC 12 flags in MPI_Waitall)
  int n_placed;             // copies placed by set_placement over the EP group (0: none)
  int n_reqs;               // Trans requests posted and not yet completed
  // Trans's state (MOE_EP_TRANS_*; __atomic loads and stores: the comm
  // stream's background task completes Trans while the compute stream's
  // expert task waits for it)
  int trans_state;
  uint64_t trans_spin_ns;  // this forward's expert tasks waited for Trans (compute stream)
  double trans_post_ms;    // posting the last placement's Trans
  double trans_wait_ms;    // waiting for it to complete (the part no compute hid)
  // Trans and Agg as tasks of a trace (moe_ep_layer_balance_pass): a graph of
  // two comm-stream tasks, "Trans" and "Agg", and their records of the last
  // forward (Trans: waiting for it after the gate) and backward (Agg: the
  // copies' gradients to their homes), in ns from the pass's start
  moe_task_graph bal_graph;
  // deferred Agg (pc.defer_agg): the copies' gradients arriving at this home,
  // one buffer per incoming copy, and the requests of the pending Agg
  float *agg_buf;                 // (agg_max, nf)
  int agg_max;                    // incoming copies the buffer holds
  MPI_Request *agg_reqs;          // (E * EP)
  MPI_Status *agg_stats;          // (E * EP)
  int n_agg;                      // requests posted
  int agg_pending;                // 1 between a deferred backward and moe_ep_layer_grads_wait
  uint64_t agg_t0;                // when the pending Agg was posted (for its trace record)
  moe_task_record bal_rec[2][2];  // [backward][task]
  double agg_wait_ms;             // the last Agg's time no compute hid (moe_ep_layer_agg_ms)
  // the layers linked with this one (moe_ep_layer_link): their pending Trans
  // and deferred Agg progress on this layer's comm stream while it waits
  struct moe_ep_layer **peers;  // (n_peers)
  int n_peers;
  // moe_ep_layer_set_background_extra: more work the comm stream's background
  // task progresses (NULL: none)
  moe_task_test_fn bg_extra;
  void *bg_extra_arg;
  moe_executor_background bg_stats[2];  // the last forward's and backward's polls of them
  uint64_t pass_t0[2];                  // their executors' starts (moe_time_ns)
  uint64_t fwd_start_ns, bwd_start_ns;
};

// Floats of one expert's parameters (w1 b1 w2 b2).
size_t moe_ep_expert_floats_(const moe_ep_layer *L);
// Allocates the copy slots and their tables (ep_placement.c); local.
moe_status moe_ep_copies_init_(moe_ep_layer *L);
void moe_ep_copies_free_(moe_ep_layer *L);  // also unlinks L (moe_ep_layer_link)
// Completes a pending Trans (a no-op without one); its wait time goes to
// trans_wait_ms. Every rank with requests calls it at the same point.
moe_status moe_ep_trans_wait_(moe_ep_layer *L);
// Trans: nothing pending; posted and not complete; failed.
enum { MOE_EP_TRANS_DONE = 0, MOE_EP_TRANS_PENDING = 1, MOE_EP_TRANS_FAILED = 2 };
// The executor's background task of L's passes (moe_executor_set_background):
// tests L's own pending Trans and its linked layers' Trans and deferred Agg
// (ep_placement.c).
moe_status moe_ep_background_(void *arg, moe_ctx *ctx, moe_task_state *state);
// Records Trans (backward 0) or Agg (1) of the current pass for traces
// (absolute moe_time_ns times).
void moe_ep_balance_record_(moe_ep_layer *L, int backward, uint64_t start_ns, uint64_t end_ns);
// Kept rows of the last forward this rank sent away: to ranks on other nodes
// (across_nodes 1) or to any other rank (0).
long long moe_ep_rows_sent_away_(const moe_ep_layer *L, int across_nodes);
// Rows of the last forward this rank received from ranks on other nodes
// (across_nodes 1) or from any other rank (0), over every chunk.
long long moe_ep_rows_received_from_away_(const moe_ep_layer *L, int across_nodes);
// Allocates the chunk plan, task graphs and executor (ep_pass.c); local.
moe_status moe_ep_pass_init_(moe_ep_layer *L);
void moe_ep_pass_free_(moe_ep_layer *L);
// Backward step 5: replica gradients to their home, home experts over DP,
// gate over the world, then added to the parameter gradients (ep_layer.c).
moe_status moe_ep_reduce_grads_(moe_ep_layer *L);

#endif  // MOE_PARALLEL_INTERNAL_H
