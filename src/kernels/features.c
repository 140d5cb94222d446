// The compiled-in feature list (moe_features): MPI, the BLAS in use, zfp, CUDA.
// Here rather than in core/ because it names the BLAS, which kernels/ owns.
#include <stdio.h>

#include "moe/core.h"
#include "moe/kernels.h"

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
  snprintf(text, sizeof text, "mpi=%s blas=%s zfp=%s cuda=%s", moe_has_mpi() ? "yes" : "no", blas,
           moe_has_zfp() ? "yes" : "no", moe_has_cuda() ? "yes" : "no");
  return text;
}
