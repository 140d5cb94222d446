// Version and compiled-in features.
#include <stdio.h>

#include "moe/moe.h"
#include "moe_build_config.h"

const char *moe_version(void) { return MOE_VERSION_STRING; }
int moe_has_mpi(void) { return MOE_HAVE_MPI; }
int moe_has_zfp(void) { return MOE_HAVE_ZFP; }
int moe_has_cuda(void) { return MOE_HAVE_CUDA; }

const char *moe_features(void) {
  static char text[256];
  snprintf(text, sizeof text, "mpi=%s blas=%s zfp=%s cuda=%s", MOE_HAVE_MPI ? "yes" : "no",
           moe_blas_name(), MOE_HAVE_ZFP ? "yes" : "no", MOE_HAVE_CUDA ? "yes" : "no");
  return text;
}
