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

// Translates an MPI error code into MOE_STATUS_COMM with MPI's text in ctx.
moe_status moe_mpi_error(moe_ctx *ctx, int mpi_code, const char *what, const char *file, int line);
// Every rank of comm contributes its local status; returns OK only if all are
// OK. On failure every rank returns an error: its own status and message, or
// INVALID_ARG naming `what` and the first failing rank. Collective over comm.
moe_status moe_comm_agree(moe_ctx *ctx, MPI_Comm comm, moe_status local, const char *what);

#define MOE_MPI_TRY(ctx, call)                                       \
  do {                                                               \
    const int mpi_rc_ = (call);                                      \
    if (mpi_rc_ != MPI_SUCCESS) {                                    \
      st = moe_mpi_error((ctx), mpi_rc_, #call, __FILE__, __LINE__); \
      goto done;                                                     \
    }                                                                \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif  // MOE_COMM_H
