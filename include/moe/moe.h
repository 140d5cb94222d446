// libmoe: a distributed Mixture-of-Experts runtime. Umbrella header.
#ifndef MOE_MOE_H
#define MOE_MOE_H

#include "moe/checkpoint.h"
#include "moe/core.h"
#include "moe/data.h"
#include "moe/expert.h"
#include "moe/gpt_io.h"
#include "moe/kernels.h"
#include "moe/layer.h"
#include "moe/model.h"
#include "moe/progress.h"
#include "moe/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

// Version string, e.g. "0.1.0".
const char *moe_version(void);
// Compiled-in features, e.g. "mpi=yes blas=OpenBLAS-0.3.21 zfp=yes cuda=no".
// Returns a static buffer rewritten on every call: not thread-safe.
const char *moe_features(void);
int moe_has_mpi(void);
int moe_has_zfp(void);
int moe_has_cuda(void);

#ifdef __cplusplus
}
#endif
#endif
