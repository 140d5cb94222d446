// The catalogue of all-to-all algorithms, readable without MPI: each algorithm's
// file (src/comm/alltoall_<name>.c) defines ONE moe_a2a_algo holding its name,
// source, cost formula (text and the function the performance model calls),
// restrictions and, in MPI builds, its run/start functions; the registry
// (src/comm/alltoall_registry.c) lists them in one array. perf/ (the layer
// simulator, the planner) and the CLI read the same entries in every build, so
// a new algorithm is one file plus one registry line.
//
// Not MPI: this header names the MPI-side types (moe_group, moe_workspace,
// moe_a2a_pending) only as incomplete structs; include/moe/comm.h defines them
// in MPI builds. Without MPI, run and start are NULL.
#ifndef MOE_A2A_CATALOG_H
#define MOE_A2A_CATALOG_H

#include <stddef.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_group moe_group;              // include/moe/comm.h (MPI builds)
typedef struct moe_workspace moe_workspace;      // include/moe/comm.h
typedef struct moe_a2a_pending moe_a2a_pending;  // include/moe/comm.h
typedef struct moe_a2a_cost_params moe_a2a_cost_params;

// The shared signature of every all-to-all algorithm: MPI_Alltoallv over g->comm
// with byte counts and byte displacements. Member r's send block for member d is
// send_counts[d] bytes at send + send_displs[d]; the block from member s lands
// at recv + recv_displs[s] (recv_counts[s] bytes). recv_counts must match what
// the peers send (as after a counts exchange). Collective over g->comm; every
// member must use the same algorithm. ws is scratch (may grow).
typedef moe_status (*moe_alltoallv_fn)(moe_ctx *ctx, const moe_group *g, const void *send,
                                       const size_t *send_counts, const size_t *send_displs,
                                       void *recv, const size_t *recv_counts,
                                       const size_t *recv_displs, moe_workspace *ws);

// The optional nonblocking form of an algorithm: posts the exchange and returns
// with *out pending. Buffers, counts, displacements and ws must stay untouched
// until it completes.
typedef moe_status (*moe_alltoallv_start_fn)(moe_ctx *ctx, const moe_group *g, const void *send,
                                             const size_t *send_counts, const size_t *send_displs,
                                             void *recv, const size_t *recv_counts,
                                             const size_t *recv_displs, moe_workspace *ws,
                                             moe_a2a_pending *out);

// What an algorithm's cost model reads: the exchange on a described cluster of
// P = nodes x ranks_per_node devices, reduced to the quantities the alpha-beta
// formulas use. perf/model.c fills it (moe_model_a2a_algo_s) from its directed
// link model; comm needs nothing of perf.
struct moe_a2a_cost_params {
  int P, nodes, ranks_per_node;
  double intra_bytes_per_s;  // one device's link into its node's fabric
  double intra_latency_s;    // alpha_intra
  double inter_bytes_per_s;  // one node's NICs together
  double inter_latency_s;    // alpha_inter
  // The link model's time of the intra-node pairs alone and of the inter-node
  // pairs alone: busiest directed link's load / bandwidth + the latency (0 when
  // that part is empty). A sequential exchange costs their sum (ScheMoE eq. 17),
  // Pipe-A2A their maximum (eq. 16).
  double t_intra_s, t_inter_s;
  // Largest volume one device sends or receives to or from the other devices,
  // and the same over one node's devices together (bytes).
  double max_device_bytes, max_node_bytes;
};

// Modelled seconds of the exchange described by p.
typedef double (*moe_a2a_cost_fn)(const moe_a2a_cost_params *p);

// One catalogue entry. Plain constant data, defined once in the algorithm's file.
typedef struct moe_a2a_algo {
  const char *name;              // what --a2a selects
  const char *source;            // where it comes from ("ScheMoE Pipe-A2A", ...)
  const char *cost;              // alpha-beta cost, as in the file header
  int needs_uniform_nodes;       // 1: requires g->uniform (else INVALID_ARG)
  int plannable;                 // 1: the planner (`auto`) considers it
  moe_a2a_cost_fn model;         // the cost model of `moe simulate` and the planner
  moe_alltoallv_fn run;          // MPI builds: the blocking form; NULL without MPI
  moe_alltoallv_start_fn start;  // nonblocking form, or NULL (blocking only)
  // Memory bound (moe_ep_layer_memory): the most bytes the algorithm's
  // workspace holds, as a multiple of G x n (G ranks per node, n = the larger
  // of the bytes one rank sends and receives in one call); its small tables
  // of counts and requests are not counted. 0: only those tables (it sends
  // from and receives into the caller's buffers).
  int workspace_copies;
} moe_a2a_algo;

// Registered algorithms, in a fixed order (the registry's): an array of *count
// pointers. Available in every build (run/start NULL without MPI).
const moe_a2a_algo *const *moe_a2a_list(int *count);
// Looks an algorithm up by name; INVALID_ARG naming the valid names otherwise.
moe_status moe_a2a_find(moe_ctx *ctx, const char *name, const moe_a2a_algo **out);
// Writes the registered names, comma-separated ("mpi, pairwise, ..."), into buf;
// with any_layout, only those that run on every node layout.
void moe_a2a_names(char *buf, size_t len, int any_layout);

#ifdef __cplusplus
}
#endif
#endif  // MOE_A2A_CATALOG_H
