// Private state of Parm's layer, shared by src/parallel/parm_layer.c (setup,
// schedules, the unchunked passes) and src/parallel/parm_chunks.c (s1 and
// s2's EP&ESP pass cut into chunks and run as tasks on the two-stream
// executor). Not installed.
#ifndef MOE_PARM_INTERNAL_H
#define MOE_PARM_INTERNAL_H

#include "moe/expert.h"
#include "moe/kernels.h"
#include "moe/layer_ops.h"
#include "moe/parm.h"
#include "moe/sched.h"
#include "parallel/parallel_internal.h"

#define MOE_PARM_CH_ARRAYS 10  // the chunk plan's (r x P) arrays (parm_chunks.c)

// What one task of a chunked EP&ESP pass works on.
typedef struct {
  struct moe_parm_layer *L;
  int chunk;
  int backward;
  int compressed;  // this pass compresses its payloads
} moe_parm_task_arg;

struct moe_parm_layer {
  moe_ctx *ctx;
  moe_layer_config cfg;   // the layer
  moe_layer_config scfg;  // the same with hidden_dim = hs (one shard)
  moe_parm_config pc;
  const moe_a2a_algo *algo;
  const moe_expert_kind *expert;
  MPI_Comm world;   // duplicate, errors return
  MPI_Comm mp;      // same (dp, ep, esp): MP peers, ordered by mp
  MPI_Comm esp;     // same (dp, mp, ep): the shards of one expert set, by esp
  MPI_Comm data;    // same mp: one copy of the global batch
  MPI_Comm rep;     // same (ep, esp): every holder of my shards (DP x MP)
  MPI_Comm rep_dp;  // same (mp, ep, esp): holders over DP only (baseline)
  moe_group a2a;    // same (dp, mp): EP x ESP members, q = ep x ESP + esp
  moe_group ep;     // same (dp, mp, esp): EP members, by ep
  int W, DP, MP, EP, ESP, P, E, Eh, M, H, hs;
  moe_parm_coords me;
  // parameters (wg | w1 | b1 | w2 | b2), gradients in the same order, and the
  // backward's own gradients before their sums (same order)
  float *params, *grads, *gscratch, *router_bias, *zero_b2;
  size_t n_gate, n_expert;  // floats of wg and of the expert shards
  moe_parm_tensors t;
  // gate and routing (T tokens)
  float *logits, *probs, *lse, *topk_p, *scores, *dprobs, *dlogits, *dweight;
  moe_route route;
  double *stats;
  // rows: R = rows of T tokens' gate, RI = the most rows an expert rank receives
  int R;
  size_t RI;
  float *xe, *ye, *dye, *dxe;  // (R, M) route order
  float *dx_add;               // (T, M): backward_add's dx, added to the caller's
  float *xs;                   // (ESP R, M): part packed (EP&ESP) / rows gathered (baseline)
  float *xb;                   // (ESP R, M): the baseline's send rows; the rows coming back
  float *sum;                  // (R, M): local combines, packed
  float *stg;                  // (R, M): the MP-AllGather's rows
  float *xr, *yr, *pre, *h, *dh, *dpre;  // received: (RI, M) and (RI, hs)
  int *part_lo, *part_n;                 // (E): my part of each expert's rows
  int *gfirst, *grows;                   // (EP): the part of EP rank g's experts, packed
  int *cnt_send, *cnt_recv;              // (P x ESP x Eh) counts exchanges
  int *gcnt;                             // (ESP x E): rows per expert of each ESP member
  int *member_rows;                      // (P): rows per member (received / sent back)
  size_t *sc, *sd, *rc, *rd;             // (P) byte counts and displacements
  int *mcnt, *mdis;                      // (max(MP, ESP)) counts of the gathers
  size_t *dump_counts, *back_displs;     // (4 P), (P): the EP&ESP all-to-all's byte counts
  int *saa_cnt;                          // (2 MP EP): SAA's gathers' counts and displacements
  MPI_Status *statuses;                  // (2 P + EP): SAA's waits (MPI_STATUSES_IGNORE is
                                         // (MPI_Status *)1, which GCC 12 flags in MPI_Waitall)
  MPI_Request *reqs;                     // (2 P + EP)
  moe_workspace ws;
  // the pass
  moe_parm_schedule sched;
  int saa;
  const float *x_last;
  int tokens_last, gate_first, gate_tokens, have_forward, recv_total;
  moe_layer_stats last;
  moe_parm_timing tf, tb;
  // deterministic mode (pc.slice_tokens > 0)
  int sl, max_slices;
  moe_pairwise gate_pw;      // the gate's per-slice leaves
  double *slice_sums;        // (max_slices + 1) x (E + 1): the ordered loss statistics
  moe_fixed_sum fixed_gate;  // moe_allreduce_fixed's receive buffer (the gate's gradient)
  size_t *blk_at;            // (P Eh + 1): where each received block (member, expert) starts
  moe_chain_state chains;    // moe_chain_run's requests (grown at the first backward)
  moe_layer_timing *ch_tm;   // the chain's expert timing (during the backward)
  // the chunked EP&ESP pass (pc.chunks > 1, parm_chunks.c)
  int r;                            // chunks (1: the unchunked path)
  const moe_schedule_algo *tsched;  // the task schedule
  moe_task_graph graph[2][2];       // [backward][saa]: s2 with SAA adds a gather per chunk
  moe_schedule order[2][2];         // their stream orders
  moe_executor *ex;                 // the two streams
  moe_parm_task_arg *targ;          // (2 r): forward's chunks, then backward's
  moe_a2a_pending pending;          // the comm stream's all-to-all in flight
  moe_workspace a2a_ws;             // its workspace (the comm thread's)
  size_t *ch;                       // (CH_ARRAYS r P): per chunk and member, bytes: parm_chunks.c
  float *ch_back;                   // the pass's destination of the way back
  const size_t *ch_back_at;         // where member q's partials start in it (rows)
  // SAA in chunks (s2 with saa): G^c sums chunk c's ESP partials and
  // all-gathers them over MP while other chunks still compute
  int *saa_rows;                 // (MP x EP): rows of MP peer m's part of EP rank g's experts
  int *ch_gcnt, *ch_gdis;        // (r x MP): chunk c's gather counts, displacements (floats)
  size_t *ch_gsend;              // (r): where my chunk c's summed rows start in saa_buf (rows)
  float *saa_buf;                // (R, M): my summed rows, chunk by chunk
  MPI_Request ch_greq;           // the gather in flight
  int ch_gwatch;                 // its hang watchdog token
  moe_layer_timing *ch_pass_tm;  // the expert tasks' timing (during a pass)
  uint64_t ch_expert_ns;         // their time in this pass
  int broken;                    // a pass failed with an all-to-all in flight
  // compression of the chunked pass (pc.compress; parm_chunks.c)
  moe_compressor comp;
  int compress_on;      // comp is not the identity
  moe_workspace csend;  // (chunk, EP rank) compressed blocks of my part
  moe_workspace crecv;  // (chunk, member) compressed blocks received (and sent back)
  moe_workspace cback;  // (chunk, member) compressed partials coming back
  int soft_failed;      // a compression task failed this pass (its output zeroed)
  char soft_msg[256];   // the first failure
};

// Shard block: rows at .. at + n of the received rows (xr; pre, h, dh, dpre
// at the same rows), local expert el: forward (xr -> pre, h, yr) or backward
// (dy in dyx -> dx in dyx, gradients added to the scratch).
void moe_parm_shard_block_(moe_parm_layer *L, int backward, size_t at, size_t n, size_t el,
                           float *dyx, moe_layer_timing *tm);

// Bytes of the compressed buffers of a chunked pass (r chunks, EP ranks, P
// members), bounds for any routing: b[0] csend (my part: at most part_rows),
// b[1] crecv (recv_rows), b[2] cback (back_rows); each block rounded to 64 bytes.
void moe_parm_compressed_bounds_(const moe_compressor *comp, int r, int EP, int P, size_t part_rows,
                                 size_t recv_rows, size_t back_rows, size_t M, size_t b[3]);

// The executor's pass (pc.chunks > 1 or compression): graphs, schedules and executor (allocated
// by moe_parm_layer_create; freed by destroy; NULL-safe).
moe_status moe_parm_chunks_init_(moe_parm_layer *L);
void moe_parm_chunks_free_(moe_parm_layer *L);
// s1 / s2's way there, shards and way back in L->r chunks: my part (xs,
// gfirst / grows) goes to every shard of its experts (forward: into xr;
// backward: the gradients into yr), the shards run on each chunk as it
// arrives, their outputs come back into `back` (member q's at back_at[q]
// rows); with a compressor (pc.compress, pc.compress_backward for the
// backward) the payloads travel compressed (C and D tasks). Needs the
// forward's counts (cnt_recv, member_rows). *expert_ms gets the expert
// tasks' time.
// With saa (s2, MP > 1): the partials are summed and all-gathered over MP
// chunk by chunk (SAA's tasks), into stg; moe_parm_saa_unpack_ then puts
// them in route order.
moe_status moe_parm_chunked_pass_(moe_parm_layer *L, int backward, int saa, float *back,
                                  const size_t *back_at, moe_layer_timing *tm, double *expert_ms);
// dst (route order) <- every MP peer's rows of every expert, from stg after
// a chunked pass with saa.
void moe_parm_saa_unpack_(moe_parm_layer *L, float *dst);

#endif  // MOE_PARM_INTERNAL_H
