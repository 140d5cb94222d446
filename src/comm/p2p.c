// Blocking point-to-point transfers of float arrays of any length (moe_send_floats,
// moe_recv_floats in comm.h), shared by the fixed-order sums, the expert replicas
// and the checkpoint's expert gather.
#include "moe_build_config.h"

#if MOE_HAVE_MPI
#include <mpi.h>

#include "moe/comm.h"
#include "moe/core.h"

// MPI counts are int: a transfer goes in pieces of at most 2^28 floats (1 GiB),
// the same on both sides, so the receiver's pieces match the sender's.
#define PIECE ((size_t)1 << 28)

moe_status moe_send_floats(moe_ctx *ctx, const float *buf, size_t n, int to, int tag, MPI_Comm comm,
                           const char *op) {
  moe_status st = MOE_STATUS_OK;
  for (size_t i = 0; i < n; i += PIECE) {
    const size_t c = n - i < PIECE ? n - i : PIECE;
    MOE_MPI_TRY_OP(ctx, op, MPI_Send(buf + i, (int)c, MPI_FLOAT, to, tag, comm));
  }
done:
  return st;
}

moe_status moe_recv_floats(moe_ctx *ctx, float *buf, size_t n, int from, int tag, MPI_Comm comm,
                           const char *op) {
  moe_status st = MOE_STATUS_OK;
  for (size_t i = 0; i < n; i += PIECE) {
    const size_t c = n - i < PIECE ? n - i : PIECE;
    MOE_MPI_TRY_OP(ctx, op,
                   MPI_Recv(buf + i, (int)c, MPI_FLOAT, from, tag, comm, MPI_STATUS_IGNORE));
  }
done:
  return st;
}
#else
typedef int moe_comm_p2p_needs_mpi;
#endif  // MOE_HAVE_MPI
