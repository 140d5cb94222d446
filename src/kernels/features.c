// The compiled-in feature list (moe_features): MPI, the BLAS in use, zfp, CUDA.
// Here rather than in core/ because it names the BLAS, which kernels/ owns.
#include <stdio.h>
#include <string.h>

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
  int nb = 0;
  const moe_backend *const *backends = moe_backend_list(&nb);
  int dnnl = 0;
  for (int i = 0; i < nb; i++) {
    dnnl |= strcmp(backends[i]->name, "onednn") == 0 &&
            !backends[i]->unavailable();  // catalogue: named in the feature list
  }
  snprintf(text, sizeof text,
           "mpi=%s blas=%s zfp=%s onednn=%s bf16=%s cuda=%s http=%s",  // catalogue: feature keys
           moe_has_mpi() ? "yes" : "no", blas, moe_has_zfp() ? "yes" : "no", dnnl ? "yes" : "no",
           moe_bf16_native() ? "native" : "emulated", moe_has_cuda() ? "yes" : "no",
           moe_has_http() ? "yes" : "no");
  return text;
}
