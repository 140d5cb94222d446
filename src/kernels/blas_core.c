// Which CPU kernels the BLAS library runs, and whether this CPU could run
// faster ones. OpenBLAS's DYNAMIC_ARCH build picks kernels by CPU model at load
// time and falls back to "Prescott" (SSE3) for models it does not know, which
// costs ~5x on an AVX-512 machine. libmoe cannot change the choice after the
// library has loaded; it reports it so the caller (the CLI) can set
// OPENBLAS_CORETYPE and restart, and the layer can warn.
#include <string.h>

#include "moe/kernels.h"
#include "moe_build_config.h"

#if MOE_HAVE_OPENBLAS_CORENAME
#include <cblas.h>
#endif

const char *moe_blas_core(void) {
#if MOE_HAVE_OPENBLAS_CORENAME
  const char *name = openblas_get_corename();
  return name ? name : "unknown";
#else
  return "unknown";
#endif
}

#if MOE_HAVE_OPENBLAS_CORENAME && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Case-insensitive membership of name in a NULL-terminated list.
static int name_in(const char *name, const char *const *list) {
  for (int i = 0; list[i]; i++) {
    const char *a = name, *b = list[i];
    while (*a && *b && ((*a | 32) == (*b | 32))) a++, b++;
    if (*a == '\0' && *b == '\0') return 1;
  }
  return 0;
}
#endif

const char *moe_blas_better_core(void) {
#if MOE_HAVE_OPENBLAS_CORENAME && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const char *const avx512_cores[] = {"skylakex", "cooperlake", "sapphirerapids", NULL};
  static const char *const avx2_cores[] = {"haswell",        "zen", "skylakex", "cooperlake",
                                           "sapphirerapids", NULL};
  const char *core = moe_blas_core();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return name_in(core, avx512_cores) ? NULL : "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return name_in(core, avx2_cores) ? NULL : "Haswell";
  }
#endif
  return NULL;
}
