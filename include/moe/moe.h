// libmoe: a distributed Mixture-of-Experts runtime. Umbrella header: every
// public header that needs no MPI. With MPI, also include moe/comm.h,
// moe/parallel.h, moe/measure_mpi.h, moe/train.h and moe/infer.h (they include
// <mpi.h>).
#ifndef MOE_MOE_H
#define MOE_MOE_H

#include "moe/a2a_catalog.h"
#include "moe/balance.h"
#include "moe/checkpoint.h"
#include "moe/compress.h"
#include "moe/core.h"
#include "moe/data.h"
#include "moe/expert.h"
#include "moe/gpt_io.h"
#include "moe/infer_request.h"
#include "moe/kernels.h"
#include "moe/layer.h"
#include "moe/layer_ops.h"
#include "moe/measure.h"
#include "moe/model.h"
#include "moe/paths.h"
#include "moe/perf.h"
#include "moe/progress.h"
#include "moe/sched.h"

#endif  // MOE_MOE_H
