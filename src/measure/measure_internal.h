// Shared by the single-process and the MPI measurements (src/measure/).
#ifndef MOE_MEASURE_INTERNAL_H
#define MOE_MEASURE_INTERNAL_H

#include "moe/measure.h"
#include "moe_build_config.h"

// The router bias (E) for mc->skew: shares of the named distribution, fitted
// on the T tokens of input stream 100 of mc->seed with the gate wg (M, E).
// Every rank computes the same bits. *tv = the fit's total variation. With
// MOE_SKEW_NONE: bias untouched, *tv = 0. Allocates temporaries only.
moe_status moe_measure_skew_bias(moe_ctx *ctx, const moe_layer_config *cfg,
                                 const moe_measure_config *mc, const float *wg, float *bias,
                                 double *tv);
// Bytes moe_measure_skew_bias allocates at most (0 without a skew).
double moe_measure_skew_bytes(const moe_layer_config *cfg, const moe_measure_config *mc);

#if MOE_HAVE_MPI
#include "moe/parm.h"
// Bytes moe_measure_parm_alpha_beta(pc, model_dim, rows_hi, points, rounds)
// allocates on one rank of world_size, by category, without allocating: its
// layer of the smallest shape (moe_parm_layer_memory), the all-to-all's send
// and receive buffers and its algorithm's workspace (moe_measure_a2a_memory),
// the gathered and partial rows and the tables. Local; INVALID_ARG for a
// layout the layer refuses.
moe_status moe_measure_parm_alpha_beta_memory(moe_ctx *ctx, const moe_parm_config *pc,
                                              int world_size, int model_dim, int rows_hi,
                                              int points, int rounds, moe_memory_need *out);
#endif

#endif  // MOE_MEASURE_INTERNAL_H
