// Shared by the single-process and the MPI measurements (src/measure/).
#ifndef MOE_MEASURE_INTERNAL_H
#define MOE_MEASURE_INTERNAL_H

#include "moe/measure.h"

// The router bias (E) for mc->skew: shares of the named distribution, fitted
// on the T tokens of input stream 100 of mc->seed with the gate wg (M, E).
// Every rank computes the same bits. *tv = the fit's total variation. With
// MOE_SKEW_NONE: bias untouched, *tv = 0. Allocates temporaries only.
moe_status moe_measure_skew_bias(moe_ctx *ctx, const moe_layer_config *cfg,
                                 const moe_measure_config *mc, const float *wg, float *bias,
                                 double *tv);
// Bytes moe_measure_skew_bias allocates at most (0 without a skew).
double moe_measure_skew_bytes(const moe_layer_config *cfg, const moe_measure_config *mc);

#endif  // MOE_MEASURE_INTERNAL_H
