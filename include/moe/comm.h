// libmoe communication over MPI: process groups with their node topology,
// grow-on-demand workspaces, and the all-to-all algorithms (one file each in src/comm/,
// selected by name through a registry; their catalogue, include/moe/a2a_catalog.h,
// is readable without MPI).
//
// Only usable when MPI is found (moe_has_mpi()). Works with Open MPI and MPICH.
//
// Threading: a moe_group is used by one thread at a time (the
// communication thread during a pass). MPI must be initialised by the caller,
// with MPI_THREAD_MULTIPLE if several threads will call MPI.
#ifndef MOE_COMM_H
#define MOE_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "moe/a2a_catalog.h"
#include "moe/core.h"
#include "moe/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- groups and topology ------------------------------------------------------------

// A communicator plus where its members live. Nodes are numbered densely
// 0..num_nodes-1 in the order of their lowest member rank, so node ids are the
// same on every member.
struct moe_group {
  MPI_Comm comm;       // the group (owned: freed by moe_group_free)
  int rank;            // my rank in comm
  int size;            // P: members
  int node;            // my node id
  int num_nodes;       // nodes the group spans
  int local_rank;      // my index among the members on my node (by group rank)
  int local_size;      // members on my node
  int *node_of;        // (P): node id of each member
  int *local_rank_of;  // (P): index of each member on its node
  int *node_size;      // (num_nodes): members on each node
  // 1 when every node holds the same number G of members and members are
  // node-contiguous: member r sits on node r / G as local rank r % G. The
  // hierarchical algorithms (1dh, 2dh) need this; pipe and grouped do not.
  int uniform;
  // Group size g of the `grouped` algorithm (every member must set the same value) (FasterMoE's
  // FMOE_FASTER_GROUP_SIZE): members form ceil(P / g) groups of consecutive ranks. 0 (the default)
  // means the members of one node (local_size when uniform, else 1).
  int grouped_size;
  MPI_Comm intra;  // members on my node, ordered by group rank (owned)
  MPI_Comm inter;  // members with my local_rank, one per node, ordered by node (owned)
};

// Builds a group over comm (duplicated, with MPI_ERRORS_RETURN, so the caller
// keeps its own communicator and MPI errors come back as statuses). my_node is
// any integer that is equal on the members sharing a node (for example this
// rank's entry of moe_topology_nodes); the group numbers nodes densely.
// Collective over comm.
moe_status moe_group_init(moe_ctx *ctx, moe_group *g, MPI_Comm comm, int my_node);
void moe_group_free(moe_group *g);  // NULL or zeroed is a no-op; collective over g->comm

// Node id of every rank of comm (out: comm-size ints, indexed by rank in
// comm). ranks_per_node > 0 forces node = rank / ranks_per_node (one host
// acting as several nodes; must divide the size of comm); 0 uses
// MOE_RANKS_PER_NODE from the environment if set, else
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Collective over comm; a bad or
// differing value on any rank fails on every rank.
moe_status moe_topology_nodes(moe_ctx *ctx, MPI_Comm comm, int ranks_per_node, int *out);
// moe_group_init over comm with this rank's node from moe_topology_nodes(comm,
// ranks_per_node). Collective over comm; fails on every rank alike.
moe_status moe_group_init_topology(moe_ctx *ctx, moe_group *g, MPI_Comm comm, int ranks_per_node);

// ---- launch ------------------------------------------------------------------------------

// The number of processes the launcher says it started, from the environment
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_SIZE, SLURM_STEP_NUM_TASKS, the first
// set to a positive integer), or 1 when none is. *var (if var is not NULL) is
// that variable's name, or NULL. Reads the environment only: callable before
// MPI_Init, from any thread.
int moe_launcher_size(const char **var);
// This process's rank as the launcher says (OMPI_COMM_WORLD_RANK, PMI_RANK,
// PMIX_RANK, SLURM_PROCID, the first set to a non-negative integer), or 0: so
// that only one process prints what every process would find before MPI_Init
// (the options' errors).
int moe_launcher_rank(void);
// INVALID_ARG, naming the fix, when the launcher started several processes but
// MPI_COMM_WORLD has one rank: the program was started by a launcher of another
// MPI, or by srun with a PMI plug-in its MPI does not speak, and every process
// would run alone. Local (no communication); call after MPI_Init.
moe_status moe_launch_check(moe_ctx *ctx);
// The MPI library, one line ("Open MPI v4.1.4", "MPICH Version: 4.0.2"; from
// MPI_Get_library_version). A static buffer: not thread-safe on first call.
const char *moe_mpi_library_name(void);

// ---- workspace ---------------------------------------------------------------------------

// Scratch memory that grows on demand and is reused: after the first call of a
// given size, collectives using it allocate nothing.
struct moe_workspace {
  void *buf;
  size_t capacity;
};

// Ensures ws->buf holds at least `bytes` (contents are not kept on growth).
moe_status moe_workspace_reserve(moe_ctx *ctx, moe_workspace *ws, size_t bytes);
// Same, keeping the first `keep` bytes when the buffer has to grow.
moe_status moe_workspace_reserve_keep(moe_ctx *ctx, moe_workspace *ws, size_t bytes, size_t keep);
void moe_workspace_free(moe_workspace *ws);  // NULL or zeroed is a no-op

// ---- all-to-all ----------------------------------------------------------------------------

// The algorithm type (moe_a2a_algo), its function types and the catalogue
// (moe_a2a_list, moe_a2a_find, moe_a2a_names) are in include/moe/a2a_catalog.h.

// A started nonblocking all-to-all (moe_a2a_start), completed by moe_a2a_test
// or moe_a2a_wait. active == 0 (a zeroed struct): nothing pending.
struct moe_a2a_pending {
  MPI_Request req;  // valid only while active
  int active;       // 1 while an exchange is in flight
  int watch;        // the hang watchdog's token of the exchange (0: none)
};

// INVALID_ARG naming the alternatives when algo cannot run on g's node layout.
moe_status moe_a2a_check_topology(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g);
// Runs algo after checking its restrictions (uniform nodes) and that the
// non-empty blocks' counts (and, for `mpi`, displacements) fit MPI's int counts.
// These checks are local, like MPI's own argument checks: the caller must give
// every rank valid arguments (moe_ep_layer agrees on them before calling).
moe_status moe_a2a_run(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g, const void *send,
                       const size_t *send_counts, const size_t *send_displs, void *recv,
                       const size_t *recv_counts, const size_t *recv_displs, moe_workspace *ws);

// Like moe_a2a_run, but nonblocking when the algorithm has a start function:
// then the exchange is pending on return (complete it with moe_a2a_test or
// moe_a2a_wait before touching any of the arguments). Algorithms without one
// run to completion here and leave nothing pending. INVALID_ARG if `pending`
// still holds an exchange in flight (complete it first). Used by the
// executor's communication thread so it can poll with back-off instead of
// blocking.
moe_status moe_a2a_start(moe_ctx *ctx, const moe_a2a_algo *algo, const moe_group *g,
                         const void *send, const size_t *send_counts, const size_t *send_displs,
                         void *recv, const size_t *recv_counts, const size_t *recv_displs,
                         moe_workspace *ws, moe_a2a_pending *pending);
// *done = 1 once the pending exchange has completed (or nothing was pending).
moe_status moe_a2a_test(moe_ctx *ctx, moe_a2a_pending *pending, int *done);
// Blocks until the pending exchange completes.
moe_status moe_a2a_wait(moe_ctx *ctx, moe_a2a_pending *pending);

// The `mpi` algorithm's function (the one that needs int displacements).
moe_alltoallv_fn moe_alltoallv_mpi_fn(void);

// Blocking point-to-point transfer of n floats (any n: sent in pieces that fit MPI's int
// counts) to / from rank `to` / `from` of comm with message tag `tag`; both sides pass the
// same n and tag. Marked for the hang watchdog as operation `op` (a string literal: errors
// and the watchdog's message name it).
moe_status moe_send_floats(moe_ctx *ctx, const float *buf, size_t n, int to, int tag, MPI_Comm comm,
                           const char *op);
moe_status moe_recv_floats(moe_ctx *ctx, float *buf, size_t n, int from, int tag, MPI_Comm comm,
                           const char *op);

// Translates an MPI error code into MOE_STATUS_COMM with MPI's text in ctx.
moe_status moe_mpi_error(moe_ctx *ctx, int mpi_code, const char *what, const char *file, int line);
// Every rank of comm contributes its local status; returns OK only if all are
// OK. On failure every rank returns an error: its own status and message, or
// INVALID_ARG naming `what` and the first failing rank. Collective over comm.
moe_status moe_comm_agree(moe_ctx *ctx, MPI_Comm comm, moe_status local, const char *what);

// ---- hang watchdog ---------------------------------------------------------------------

// Bounded failure for a hung rank (src/comm/watchdog.c). The library marks every place where
// a rank waits on others (collectives, all-to-alls, point-to-point transfers, agreements)
// with moe_watchdog_op_begin / moe_watchdog_op_end: an atomic store of a pointer and a
// timestamp into a slot (a relaxed load and nothing else while no watchdog runs). A running
// watchdog has one thread per rank that wakes every 100 ms; when an operation of its rank has
// waited timeout_s, it probes every other rank (point-to-point messages on the communicator,
// tag MOE_WATCHDOG_TAG; no collective call, so that starting it cannot hang on a rank that is
// stopped already): each rank's watchdog thread answers with what its rank is doing (the operation
// it waits in and for how long, and how many operations it has begun). Then:
//   - ranks that do not answer within grace_s are stopped or hung as a whole (SIGSTOP, a
//     frozen node): MOE_HANG_NO_ANSWER, the job is aborted naming them;
//   - every rank answers and waits (each for timeout_s or more), and a second probe grace_s
//     later finds no rank has begun an operation since: a deadlock (MOE_HANG_DEADLOCK), aborted
//     naming the ranks whose operation differs from the others';
//   - every rank answers and some are busy outside communication (a slow step, rank 0 writing
//     a checkpoint): MOE_HANG_SLOW, a warning once per wait, no abort; the probe is repeated
//     every timeout_s (a busy rank that later stops answering is still caught).
// Without MPI_THREAD_MULTIPLE the thread cannot probe: an operation that waits timeout_s
// aborts the job (MOE_HANG_UNPROBED), slow or hung alike. Assumption of the deadlock verdict:
// no single transfer legitimately takes timeout_s.
typedef struct moe_watchdog moe_watchdog;

typedef enum {
  MOE_HANG_SLOW = 0,       // every rank answers, some are busy: a warning, the job goes on
  MOE_HANG_NO_ANSWER = 1,  // ranks that did not answer the probe (suspects): aborted
  MOE_HANG_DEADLOCK = 2,   // every rank waits and none progresses: aborted
  MOE_HANG_UNPROBED = 3    // the timeout alone (no MPI_THREAD_MULTIPLE): aborted
} moe_hang_kind;

#define MOE_WATCHDOG_OP_LEN 64
#define MOE_WATCHDOG_TAG 7391  // reserved on the watchdog's communicator while it runs
#define MOE_WATCHDOG_MAX_SUSPECTS 8

typedef struct {
  moe_hang_kind kind;
  int rank, size;                // this rank in the watchdog's communicator, and its size
  char op[MOE_WATCHDOG_OP_LEN];  // the operation this rank waits in
  double waited_s;               // for how long
  long step;                     // the last moe_watchdog_note_step (0: none)
  int n_suspects;                // ranks named (the first MOE_WATCHDOG_MAX_SUSPECTS listed)
  int suspects[MOE_WATCHDOG_MAX_SUSPECTS];
  // what each suspect answered: its operation, "" when busy outside communication or silent
  char suspect_op[MOE_WATCHDOG_MAX_SUSPECTS][MOE_WATCHDOG_OP_LEN];
  char message[1024];  // one line saying all of the above (and cfg.hint)
} moe_watchdog_report;

typedef struct {
  double timeout_s;  // > 0: how long an operation may wait before the ranks are probed
  double grace_s;    // how long a probe waits for answers; 0: timeout_s / 2 within [2, 30]
  const char *hint;  // ends the message (e.g. which option sets the timeout); may be NULL
  // Called on the watchdog thread for every report. NULL: the message goes to stderr, and
  // every kind but MOE_HANG_SLOW then calls MPI_Abort(comm, 1). A callback that returns
  // keeps the watchdog running (the same wait is not reported twice).
  void (*on_hang)(void *user, const moe_watchdog_report *report);
  void *user;
} moe_watchdog_config;

// Starts the watchdog over comm (every rank of comm should start one; local: no collective
// call). While it runs, tag MOE_WATCHDOG_TAG on comm is its own: do not receive on comm with
// that tag or MPI_ANY_TAG. One watchdog per process at a time (INVALID_ARG otherwise). With
// one rank, or MPI not initialised with MPI_THREAD_MULTIPLE, see moe_watchdog_probing. The
// config's strings must outlive it; comm too.
moe_status moe_watchdog_start(moe_ctx *ctx, MPI_Comm comm, const moe_watchdog_config *cfg,
                              moe_watchdog **out);
// Stops the thread, joins it and frees everything (local). NULL: no-op. Call it before
// MPI_Finalize (and before freeing comm).
void moe_watchdog_stop(moe_watchdog *wd);
// 1: peers are probed (MPI_THREAD_MULTIPLE); 0: the timeout alone (MOE_HANG_UNPROBED);
// -1: nothing to watch (one rank: no thread runs).
int moe_watchdog_probing(const moe_watchdog *wd);

// Marks the start of a wait on other ranks; returns a token for moe_watchdog_op_end (0 when
// no watchdog runs). op and detail (may be NULL) must stay valid until the end of the
// program (string literals). Any thread; cheap (no lock, no system call but the clock).
int moe_watchdog_op_begin(const char *op, const char *detail);
void moe_watchdog_op_end(int token);  // 0: no-op
// The training step this rank is in, for the message (0: none). Any thread.
void moe_watchdog_note_step(long step);

// ---- fixed-order sums (the deterministic mode, docs/reliability.md) ----------------

// What moe_allreduce_fixed keeps from one call to the next at one call site: the
// buffer a rank receives its partner's sum in, and the communicator and size of
// the last call whose arguments and buffer the ranks agreed on. Zero it before
// the first call; moe_fixed_sum_free frees it (local).
typedef struct {
  float *tmp;       // the receive buffer (ranks that add a partner's sum), cap floats
  size_t cap;       //
  MPI_Comm comm;    // the last agreed call's communicator and size (n 0: none yet)
  size_t agreed_n;  //
} moe_fixed_sum;
void moe_fixed_sum_free(moe_fixed_sum *fs);  // NULL or zeroed is a no-op; zeroes it

// buf (n floats) = the sum of every rank's buf, on every rank, added in one
// fixed order: the pairwise tree over rank index (rank 2i's value + rank
// 2i+1's, then pairs of pairs, ...; a rank without a partner passes its value
// up). When each rank holds the pairwise sum of an equal power-of-two number of
// consecutive slices (moe_pairwise_*), the result is the pairwise sum over all
// slices: the same bits at any rank count. Collective: every rank passes the
// same n. `what` names the sum in errors and for the hang watchdog (a string
// literal: it must outlive the program).
// fs (may be NULL: a state of this call alone) holds the receive buffer between
// calls. A call whose (comm, n) differs from fs's last agreed one first agrees
// over comm (two small collectives, marked 'agreement: <what>'): every rank
// passes the same n (else INVALID_ARG naming both sizes) and every rank that
// needs a larger buffer got it (else OUT_OF_MEMORY), so a failure is returned on
// every rank and none is left waiting. The calls after it with the same (comm,
// n) allocate nothing and send only the sum's own messages; they trust that
// the ranks still pass the same n. A state belongs to one call site: its ranks
// make the same sequence of calls with it.
moe_status moe_allreduce_fixed(moe_ctx *ctx, moe_fixed_sum *fs, float *buf, size_t n, MPI_Comm comm,
                               const char *what);
// out (n) = the sum over every slice of every rank, slices in rank order then
// local order, added left to right in double: rank r holds `slices` slices
// (any count, 0 included) of n doubles each in `mine`. Small vectors only
// (every rank receives every slice). Collective; `what` as above.
moe_status moe_sum_slices_ordered(moe_ctx *ctx, const double *mine, int slices, int n, double *out,
                                  MPI_Comm comm, const char *what);

// What moe_chain_run keeps from one call to the next at one call site: its
// request and status storage (grown on demand). Zero it before the first call;
// moe_chain_state_free frees it (local).
typedef struct {
  MPI_Request *req;
  MPI_Status *sts;  // not MPI_STATUSES_IGNORE: GCC 12 flags MPICH's in MPI_Waitall
  size_t cap;       // entries of each
} moe_chain_state;
void moe_chain_state_free(moe_chain_state *cs);  // NULL or zeroed is a no-op; zeroes it

// Runs chain ch (kernels.h) over comm, whose ranks all pass the same blocks,
// segs and owner (owner(user, s) in [0, size)): on return every rank's blocks hold
// the last segment's result. Blocks go through the segments as a wavefront
// (block b's segment s beside block b + 1's segment s - 1), so the owners
// compute in parallel; a block moves between consecutive owners that differ
// (point-to-point, non-blocking sends), and the last segment's owner
// broadcasts each block at the end. cs (may be NULL: a state of this call
// alone) keeps the request storage: a call with more blocks than it holds
// grows it and agrees over comm first (OUT_OF_MEMORY on every rank if one
// failed); later calls allocate nothing. INVALID_ARG for a bad description
// (every rank reaches the same verdict); `what` names the chain in errors and
// for the hang watchdog (a string literal). Collective.
moe_status moe_chain_run(moe_ctx *ctx, MPI_Comm comm, const moe_chain *ch, moe_chain_state *cs,
                         const char *what);

// ---- gradient buckets overlapped with the backward (src/comm/grad_reducer.c) --------

// Sums a fixed list of gradient tensors over the ranks of a communicator, bucket
// by bucket, while the caller still computes: the caller marks each tensor
// ready as soon as its gradient is final (moe_grad_reducer_ready), a bucket's
// sum starts once all its tensors are marked, and moe_grad_reducer_finish
// waits for the last bucket and writes the sums back. The tensors are given in
// the order they become final (the reverse of the forward); a bucket is a run
// of whole tensors of at least bucket_bytes, so a bucket is ready once its last
// tensor is. Buckets are summed in order, in micro-ops of at most
// micro_op_bytes that never span two buckets, one in flight at a time, on a
// duplicate of the communicator (no message meets the caller's). The reducer
// has no thread: its non-blocking MPI operations advance when a mark, a
// moe_grad_reducer_progress call (e.g. from a communication stream that would
// otherwise wait) or finish tests them, so its MPI calls never run beside
// another thread's (MPI_THREAD_SERIALIZED is enough when those calls come
// from several threads one at a time).
// How gradient sums share the network with the MoE layers' all-to-alls
// (docs/lina.md): FIFO starts each micro-op as soon as its bucket is ready,
// whatever else is on the wire; LINA (Lina, ATC'23) starts one only when no
// all-to-all is waiting or running: never while an MoE layer's backward is
// under way (its all-to-alls are imminent or running), except in the gaps
// where its all-to-all stream waits for expert compute.
typedef enum { MOE_COMM_PRIORITY_FIFO = 0, MOE_COMM_PRIORITY_LINA = 1 } moe_comm_priority;
// "fifo" or "lina"; "?" otherwise.
const char *moe_comm_priority_name(moe_comm_priority p);
// Parses "fifo" or "lina"; INVALID_ARG naming both otherwise.
moe_status moe_comm_priority_parse(moe_ctx *ctx, const char *text, moe_comm_priority *out);

typedef struct {
  size_t bucket_bytes;         // a bucket closes once it holds this many bytes (a tensor is
                               // never split); 0: one bucket of everything. Default 25 MiB
  size_t micro_op_bytes;       // floats summed per MPI operation, in bytes; 0: a bucket per
                               // operation (at most 2^28 floats). Default 0
  int deterministic;           // 1 (default): moe_allreduce_fixed's order, so the sums have the
                               // bits of one moe_allreduce_fixed of all tensors packed, whatever
                               // the buckets and micro-ops; 0: MPI_Iallreduce (MPI's order)
  int overlap;                 // 1 (default): marks and progress calls start and advance the
                               // sums; 0: everything in finish (marks only copy)
  moe_comm_priority priority;  // MOE_COMM_PRIORITY_FIFO (default): a micro-op starts as
                               // soon as its bucket is ready; _LINA: not while held
                               // (moe_grad_reducer_hold) except in an all-to-all's gap
} moe_grad_reducer_config;
void moe_grad_reducer_config_default(moe_grad_reducer_config *cfg);

// One micro-op of the last step (times from that step's first mark, which
// moe_grad_reducer_step_start_ns gives on moe_time_ns's clock).
typedef struct {
  int bucket;
  size_t first, count;  // floats [first, first + count) of the packed tensors
  uint64_t start_ns, end_ns;
  int held;  // started while held (moe_grad_reducer_hold)
  int gap;   // started by moe_grad_reducer_progress_gap
} moe_grad_op_record;

typedef struct moe_grad_reducer moe_grad_reducer;

// Collective over comm: every rank passes the same n, sizes and config (else
// INVALID_ARG on every rank). grads[i] (numel[i] floats) must stay valid until
// destroy. config NULL: the defaults. Allocates
// one packed copy of the tensors (and, deterministic, a micro-op's receive
// buffer on ranks that add a partner's sum).
moe_status moe_grad_reducer_create(moe_ctx *ctx, MPI_Comm comm, int n, float *const *grads,
                                   const size_t *numel, const moe_grad_reducer_config *config,
                                   moe_grad_reducer **out);
// NULL: no-op. Between steps. After a failure left an operation in flight, a
// receive is cancelled; a send's buffers are left to MPI (not freed).
void moe_grad_reducer_destroy(moe_grad_reducer *r);
// Tensor i's gradient is final this step: copied now into the packed buffer
// (the caller may reuse the tensor until finish); with overlap, then
// progresses like moe_grad_reducer_progress. Each tensor at most once per step
// (else INVALID_ARG).
moe_status moe_grad_reducer_ready(moe_grad_reducer *r, moe_ctx *ctx, int i);
// Tests the micro-op in flight, starts the next ones whose buckets are ready,
// never waits. *all_done (may be NULL): 1 when nothing is in flight and
// nothing marked waits to be summed (until the next mark). Any thread, one at
// a time with the reducer's other calls and with other MPI calls unless MPI
// gives MPI_THREAD_MULTIPLE (a call that finds another in progress returns at
// once with *all_done 0). A failure is kept: every later progress, mark and
// finish returns it with its message.
moe_status moe_grad_reducer_progress(moe_grad_reducer *r, moe_ctx *ctx, int *all_done);
// The same, called where an all-to-all stream waits for compute (no
// all-to-all waiting or running: an MoE layer's comm stream in its gaps): it
// starts micro-ops even while held.
moe_status moe_grad_reducer_progress_gap(moe_grad_reducer *r, moe_ctx *ctx, int *all_done);
// held 1: all-to-alls are imminent or running (the trainer holds from the
// start of each MoE layer's backward to its end); with priority LINA, marks
// and progress calls then advance the micro-op in flight but start no new
// one (progress_gap still does). FIFO: recorded only. Any thread.
void moe_grad_reducer_hold(moe_grad_reducer *r, int held);
// Marks the tensors not marked yet (in order), progresses and waits (MPI_Wait
// on each request, marked for the hang watchdog) until every bucket is summed, writes
// the sums into the tensors and starts the next step.
moe_status moe_grad_reducer_finish(moe_grad_reducer *r, moe_ctx *ctx);
int moe_grad_reducer_buckets(const moe_grad_reducer *r);
// Buckets of this step summed so far.
int moe_grad_reducer_done(moe_grad_reducer *r);
// Bucket b: its floats [first, first + count) of the packed tensors and its tensor count.
void moe_grad_reducer_bucket(const moe_grad_reducer *r, int b, size_t *first, size_t *count,
                             int *tensors);
// The last finished step's operations, in the order they ran (valid until the
// next step's first mark).
const moe_grad_op_record *moe_grad_reducer_records(const moe_grad_reducer *r, int *n);
// The last finished step's first mark, on moe_time_ns's clock (0 before any).
uint64_t moe_grad_reducer_step_start_ns(const moe_grad_reducer *r);

// The memory bound under MPI: every rank passes its own need (its baseline
// included); its limit is max_memory when > 0 (--max-memory, per rank), else
// the memory available on its node (moe_memory_available) divided by the
// ranks of comm on that node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)).
// OK on every rank when every rank's need fits its limit; otherwise
// INVALID_ARG on every rank with the same message (moe_memory_check's),
// naming the first rank that does not fit, its need by category, its limit
// and where the limit came from. what_to_change may be NULL. Collective over
// comm; allocates nothing the shape needs.
moe_status moe_comm_memory_check(moe_ctx *ctx, MPI_Comm comm, const moe_memory_need *need,
                                 size_t max_memory, const char *what_to_change);

// This rank's share of a CPU core: 1 when the ranks of comm on its machine
// (the same kernel boot id, else host name: network namespaces of one machine,
// such as the emulated cluster's nodes, count as one) have at least as many
// cores (the union of their affinity masks) as ranks, else cores / ranks (4
// ranks on 2 cores: 0.5 each, two compute at a time). Collective over comm.
moe_status moe_comm_cpu_share(moe_ctx *ctx, MPI_Comm comm, double *share);

#define MOE_MPI_TRY(ctx, call)                                       \
  do {                                                               \
    const int mpi_rc_ = (call);                                      \
    if (mpi_rc_ != MPI_SUCCESS) {                                    \
      st = moe_mpi_error((ctx), mpi_rc_, #call, __FILE__, __LINE__); \
      goto done;                                                     \
    }                                                                \
  } while (0)

// MOE_MPI_TRY with the call marked for the hang watchdog as operation `op` (a literal).
#define MOE_MPI_TRY_OP(ctx, op, call)                                \
  do {                                                               \
    const int wd_token_ = moe_watchdog_op_begin((op), NULL);         \
    const int mpi_rc_ = (call);                                      \
    moe_watchdog_op_end(wd_token_);                                  \
    if (mpi_rc_ != MPI_SUCCESS) {                                    \
      st = moe_mpi_error((ctx), mpi_rc_, #call, __FILE__, __LINE__); \
      goto done;                                                     \
    }                                                                \
  } while (0)

// An MPI call whose status the caller ignores, marked for the hang watchdog as `op`.
#define MOE_MPI_WATCHED(op, call)                            \
  do {                                                       \
    const int wd_token_ = moe_watchdog_op_begin((op), NULL); \
    (void)(call);                                            \
    moe_watchdog_op_end(wd_token_);                          \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif  // MOE_COMM_H
