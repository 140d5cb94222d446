// Private declarations shared by the files of src/sched (not installed).
#ifndef MOE_SCHED_INTERNAL_H
#define MOE_SCHED_INTERNAL_H

#include "moe/sched.h"

// Schedule validation (membership and the deadlock simulation) with
// caller-provided scratch of 2 * graph->n_tasks ints, so the executor can
// validate every pass without allocating. Defined in task_graph.c.
moe_status moe_sched_validate_scratch_(moe_ctx *ctx, const moe_task_graph *graph,
                                       const moe_schedule *sched, int *scratch);

#endif
