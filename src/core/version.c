// Version and compiled-in features (moe_features, which names the BLAS, is in
// src/kernels/features.c).
#include "moe/core.h"
#include "moe_build_config.h"

const char *moe_version(void) { return MOE_VERSION_STRING; }
int moe_has_mpi(void) { return MOE_HAVE_MPI; }
int moe_has_zfp(void) { return MOE_HAVE_ZFP; }
int moe_has_http(void) { return MOE_HAVE_MHD; }
int moe_has_cuda(void) { return MOE_HAVE_CUDA; }
