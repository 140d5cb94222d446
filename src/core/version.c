// Version and compiled-in features.
#include <stdio.h>

#include "moe/moe.h"
#include "moe_build_config.h"

const char *moe_version(void) { return MOE_VERSION_STRING; }
int moe_has_mpi(void) { return MOE_HAVE_MPI; }
int moe_has_zfp(void) { return MOE_HAVE_ZFP; }
int moe_has_cuda(void) { return MOE_HAVE_CUDA; }

// "OpenBLAS 0.3.21 NO_LAPACKE ..." -> "OpenBLAS-0.3.21": the first two words,
// joined, so the feature list stays one space-separated key=value per feature.
static void short_blas_name(char *out, size_t len) {
  const char *src = moe_blas_name();
  size_t n = 0;
  int words = 0;
  for (; *src && n + 1 < len; src++) {
    if (*src == ' ') {
      if (++words == 2) break;
      out[n++] = '-';
    } else {
      out[n++] = *src;
    }
  }
  out[n] = '\0';
}

const char *moe_features(void) {
  static char text[256];
  char blas[64];
  short_blas_name(blas, sizeof blas);
  snprintf(text, sizeof text, "mpi=%s blas=%s zfp=%s cuda=%s", MOE_HAVE_MPI ? "yes" : "no", blas,
           MOE_HAVE_ZFP ? "yes" : "no", MOE_HAVE_CUDA ? "yes" : "no");
  return text;
}
