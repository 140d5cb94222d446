// The batch-invariant GEMM (moe_gemm_fixed, see kernels.h): every element of C
// is one fused multiply-add chain
//     s = C_ij (after beta);  for p = 0, 1, ..., k-1:  s = fma(op(A)_ip, alpha * op(B)_pj, s)
// and nothing else. The chain does not depend on m, n, the row's or column's
// place in the call, the cache blocking or the vector width, so:
//   - a row of C has the same bits whatever the other rows are (batch invariance);
//   - splitting the k dimension over consecutive calls with beta = 1 gives the
//     same bits as one call (k-continuation: a weight gradient summed over
//     tokens chunk by chunk equals the gradient of all tokens in one call);
//   - the AVX2/AVX-512 and portable paths agree bit for bit (fma is correctly
//     rounded everywhere; the portable path calls fmaf).
//
// Layout (a Goto-style blocking, simplified): for each block of NC columns and
// KC steps of k, op(B) (times alpha) is packed into panels of nr columns
// (kc x nr, zero-padded at the right edge); every mr-row strip of op(A) is read
// in place (strips at the bottom edge, and all strips of a transposed A, are
// copied into a zero-padded contiguous buffer) and multiplied into an mr x nr
// tile of C held in registers (AVX-512: 8 x 32, AVX2: 6 x 16, portable:
// 6 x 16). Edge tiles go through a scratch tile. The padding only ever feeds
// rows and columns that are thrown away.
//
// Single-threaded: the callers' parallelism is ranks and the executor's threads.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_internal.h"
#include "moe/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOE_FIXED_X86 1
#include <immintrin.h>
#else
#define MOE_FIXED_X86 0
#endif

// Tile shapes: each kernel computes an mr x nr tile of C; MRMAX x NRMAX bounds them.
enum { MRMAX = 8, NRMAX = 32, KC = 256, NC = 512 };

// op(A)_ip = a[i * rsa + p * csa]
typedef struct {
  const float *a;
  ptrdiff_t rsa, csa;
} a_view;

// c (mr x nr, row stride ldc) = chain over p of fma(a_ip, bp[p * nr + j], c).
// `a` is a strip of mr rows: a[i * rsa + p * csa].
typedef void (*ukernel_fn)(int kc, const float *a, ptrdiff_t rsa, ptrdiff_t csa, const float *bp,
                           float *c, ptrdiff_t ldc);

typedef struct {
  ukernel_fn fn;
  int mr, nr;
  const char *name;
} ukernel;

enum { PMR = 6, PNR = 16 };  // the portable kernel's tile

static void ukernel_portable(int kc, const float *a, ptrdiff_t rsa, ptrdiff_t csa, const float *bp,
                             float *c, ptrdiff_t ldc) {
  for (int i = 0; i < PMR; i++) {
    float acc[PNR];
    float *ci = c + (ptrdiff_t)i * ldc;
    for (int j = 0; j < PNR; j++) acc[j] = ci[j];
    const float *ai = a + (ptrdiff_t)i * rsa;
    for (int p = 0; p < kc; p++) {
      const float av = ai[(ptrdiff_t)p * csa];
      const float *bq = bp + (ptrdiff_t)p * PNR;
      for (int j = 0; j < PNR; j++) acc[j] = fmaf(av, bq[j], acc[j]);
    }
    for (int j = 0; j < PNR; j++) ci[j] = acc[j];
  }
}

#if MOE_FIXED_X86
__attribute__((target("avx2,fma"))) static void ukernel_avx2(int kc, const float *a, ptrdiff_t rsa,
                                                             ptrdiff_t csa, const float *bp,
                                                             float *c, ptrdiff_t ldc) {
  __m256 c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
  __m256 c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
  __m256 c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
  __m256 c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
  __m256 c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
  __m256 c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
  const float *a0 = a, *a1 = a + rsa, *a2 = a + 2 * rsa, *a3 = a + 3 * rsa, *a4 = a + 4 * rsa,
              *a5 = a + 5 * rsa;
  for (int p = 0; p < kc; p++) {
    const ptrdiff_t o = (ptrdiff_t)p * csa;
    const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
    bp += 16;
    __m256 av = _mm256_broadcast_ss(a0 + o);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a1 + o);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a2 + o);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a3 + o);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(a4 + o);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(a5 + o);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  _mm256_storeu_ps(c, c00);
  _mm256_storeu_ps(c + 8, c01);
  _mm256_storeu_ps(c + ldc, c10);
  _mm256_storeu_ps(c + ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20);
  _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30);
  _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40);
  _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50);
  _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

// 8 x 32: 16 accumulators of 16 floats.
__attribute__((target("avx512f,avx2,fma"))) static void ukernel_avx512(int kc, const float *a,
                                                                       ptrdiff_t rsa, ptrdiff_t csa,
                                                                       const float *bp, float *c,
                                                                       ptrdiff_t ldc) {
  __m512 acc[8][2];
  for (int i = 0; i < 8; i++) {
    acc[i][0] = _mm512_loadu_ps(c + i * ldc);
    acc[i][1] = _mm512_loadu_ps(c + i * ldc + 16);
  }
  for (int p = 0; p < kc; p++) {
    const ptrdiff_t o = (ptrdiff_t)p * csa;
    const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
    bp += 32;
    for (int i = 0; i < 8; i++) {
      const __m512 av = _mm512_set1_ps(a[i * rsa + o]);
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
    }
  }
  for (int i = 0; i < 8; i++) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}
#endif

// ---- dispatch ---------------------------------------------------------------------

static const ukernel k_portable = {ukernel_portable, PMR, PNR, "portable (fmaf)"};

static ukernel pick_kernel(void) {
#if MOE_FIXED_X86
  const char *force = getenv("MOE_GEMM_FIXED_PORTABLE");
  if (!(force && force[0] == '1')) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      if (__builtin_cpu_supports("avx512f")) return (ukernel){ukernel_avx512, 8, 32, "avx512"};
      return (ukernel){ukernel_avx2, 6, 16, "avx2+fma"};
    }
  }
#endif
  return k_portable;
}

static ukernel g_kernel;
static int g_kernel_ready;

static const ukernel *kernel(void) {
  // Racy first use is benign: every thread computes the same values.
  if (!__atomic_load_n(&g_kernel_ready, __ATOMIC_ACQUIRE)) {
    g_kernel = pick_kernel();
    __atomic_store_n(&g_kernel_ready, 1, __ATOMIC_RELEASE);
  }
  return &g_kernel;
}

const char *moe_gemm_fixed_isa(void) { return kernel()->name; }

// ---- packing ----------------------------------------------------------------------

// op(B) rows [p0, p0 + kc) and columns [j0, j0 + nc), times alpha, into
// ceil(nc / NR) panels of kc x NR (zero-padded past column nc).
static void pack_b(float *restrict dst, const float *b, int ldb, int trans_b, int p0, int kc,
                   int j0, int nc, float alpha, int NR) {
  for (int jp = 0; jp < nc; jp += NR) {
    const int nr = nc - jp < NR ? nc - jp : NR;
    for (int p = 0; p < kc; p++) {
      float *restrict d = dst + (size_t)p * NR;
      if (!trans_b) {
        const float *restrict s = b + (size_t)(p0 + p) * (size_t)ldb + (size_t)(j0 + jp);
        if (alpha == 1.0f) {
          for (int j = 0; j < nr; j++) d[j] = s[j];
        } else {
          for (int j = 0; j < nr; j++) d[j] = alpha * s[j];
        }
      } else {
        const float *s = b + (size_t)(j0 + jp) * (size_t)ldb + (size_t)(p0 + p);
        for (int j = 0; j < nr; j++) d[j] = alpha * s[(size_t)j * (size_t)ldb];
      }
      for (int j = nr; j < NR; j++) d[j] = 0.0f;
    }
    dst += (size_t)kc * NR;
  }
}

// ---- driver -----------------------------------------------------------------------

static void scale_or_zero(float *c, int m, int n, int ldc, float beta) {
  if (beta == 1.0f) return;
  for (int i = 0; i < m; i++) {
    float *restrict row = c + (size_t)i * (size_t)ldc;
    if (beta == 0.0f) {
      for (int j = 0; j < n; j++) row[j] = 0.0f;
    } else {
      for (int j = 0; j < n; j++) row[j] *= beta;
    }
  }
}

static void gemm_fixed_with(const ukernel *kern, int trans_a, int trans_b, int m, int n, int k,
                            float alpha, const float *a, int lda, const float *b, int ldb,
                            float beta, float *c, int ldc) {
  const ukernel_fn uk = kern->fn;
  const int MR = kern->mr, NR = kern->nr;
  if (m <= 0 || n <= 0) return;
  scale_or_zero(c, m, n, ldc, beta);
  if (k <= 0 || alpha == 0.0f) return;
  const a_view av = {a, trans_a ? 1 : lda, trans_a ? lda : 1};

  const int ncmax = n < NC ? n : NC;
  const int kcmax = k < KC ? k : KC;
  const size_t panels = (size_t)(ncmax + NR - 1) / NR;
  float *bpack = malloc(panels * (size_t)kcmax * NR * sizeof(float));
  float *apad = malloc((size_t)MR * (size_t)kcmax * sizeof(float));
  if (!bpack || !apad) {
    // Out of memory for a scratch of at most 2 MB: fall back to the same
    // chains one element at a time (slow, identical bits).
    free(bpack);
    free(apad);
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < n; j++) {
        float s = c[(size_t)i * (size_t)ldc + (size_t)j];
        for (int p = 0; p < k; p++) {
          const float bv = trans_b ? b[(size_t)j * (size_t)ldb + (size_t)p]
                                   : b[(size_t)p * (size_t)ldb + (size_t)j];
          s = fmaf(av.a[(ptrdiff_t)i * av.rsa + (ptrdiff_t)p * av.csa], alpha * bv, s);
        }
        c[(size_t)i * (size_t)ldc + (size_t)j] = s;
      }
    }
    return;
  }
  float tile[MRMAX * NRMAX];

  for (int j0 = 0; j0 < n; j0 += NC) {
    const int nc = n - j0 < NC ? n - j0 : NC;
    for (int p0 = 0; p0 < k; p0 += KC) {
      const int kc = k - p0 < KC ? k - p0 : KC;
      pack_b(bpack, b, ldb, trans_b, p0, kc, j0, nc, alpha, NR);
      for (int i0 = 0; i0 < m; i0 += MR) {
        const int mr = m - i0 < MR ? m - i0 : MR;
        const float *astrip = av.a + (ptrdiff_t)i0 * av.rsa + (ptrdiff_t)p0 * av.csa;
        ptrdiff_t rsa = av.rsa, csa = av.csa;
        // Copied into a contiguous strip: at the bottom edge (the rows there
        // are, zeros for the rest) and when op(A) is transposed (its strip is
        // 6 floats out of every row of A: poor locality in place).
        if (mr < MR || trans_a) {
          for (int p = 0; p < kc; p++) {
            for (int i = 0; i < MR; i++) {
              apad[(size_t)p * MR + (size_t)i] =
                  i < mr ? astrip[(ptrdiff_t)i * av.rsa + (ptrdiff_t)p * av.csa] : 0.0f;
            }
          }
          astrip = apad;
          rsa = 1;
          csa = MR;
        }
        for (int jp = 0; jp < nc; jp += NR) {
          const int nr = nc - jp < NR ? nc - jp : NR;
          const float *bp = bpack + (size_t)(jp / NR) * (size_t)kc * NR;
          float *ct = c + (size_t)i0 * (size_t)ldc + (size_t)(j0 + jp);
          if (mr == MR && nr == NR) {
            uk(kc, astrip, rsa, csa, bp, ct, ldc);
          } else {
            for (int i = 0; i < MR; i++) {
              for (int j = 0; j < NR; j++) {
                tile[i * NR + j] =
                    i < mr && j < nr ? ct[(size_t)i * (size_t)ldc + (size_t)j] : 0.0f;
              }
            }
            uk(kc, astrip, rsa, csa, bp, tile, NR);
            for (int i = 0; i < mr; i++) {
              for (int j = 0; j < nr; j++)
                ct[(size_t)i * (size_t)ldc + (size_t)j] = tile[i * NR + j];
            }
          }
        }
      }
    }
  }
  free(bpack);
  free(apad);
}

void moe_gemm_fixed(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                    int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  gemm_fixed_with(kernel(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void moe_gemm_fixed_portable(int trans_a, int trans_b, int m, int n, int k, float alpha,
                             const float *a, int lda, const float *b, int ldb, float beta, float *c,
                             int ldc) {
  gemm_fixed_with(&k_portable, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
