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
// (kc x nr, zero-padded at the right edge); the rows go in blocks of MC, panel
// by panel, and every mr-row strip of op(A) is read in place (only the bottom
// strip is copied into a zero-padded buffer) and multiplied into an mr x nr
// tile of C held in registers (AVX-512: 8 x 32, AVX2: 6 x 16, portable:
// 6 x 16). Edge tiles go through a scratch tile. The padding only ever feeds
// rows and columns that are thrown away. The AVX2 path has a kernel for every
// partial tile (1-6 rows by 8 or 16 columns): the bottom strip is read in place
// and only a column edge that is not a multiple of 8 needs the scratch tile
// (at libmoe's shapes, e.g. attention's 32-row tiles, the padded rows were
// 11% of the products). With beta = 0 the first block of k
// starts its chains at 0 instead of reading C (the same value: C after beta).
//
// Single-threaded: the callers' parallelism is ranks and the executor's threads.
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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
// KC is each kernel's own (below; at most KCMAX): the AVX2 kernel's 512 halves
// the passes over C of the 256 the others take (C's tile is read and written
// once per block of k). Its panel of B, 32 KiB, is as large as an AVX2 EPYC's
// L1; blocks of 1024 measured no better there.
enum { MRMAX = 8, NRMAX = 32, KCMAX = 512, NC = 512 };
// A transposed A is packed when a block of op(B) has at least this many panels.
enum { PACK_A_PANELS = 4 };

// op(A)_ip = a[i * rsa + p * csa]
typedef struct {
  const float *a;
  ptrdiff_t rsa, csa;
} a_view;

// c (mr x nr, row stride ldc) = chain over p of fma(a_ip, bp[p * nr + j], c).
// `a` is a strip of mr rows: a[i * rsa + p * csa].
// zero: the chains start at 0 instead of at c (beta = 0, the first block of k).
typedef void (*ukernel_fn)(int kc, const float *a, ptrdiff_t rsa, ptrdiff_t csa, const float *bp,
                           float *c, ptrdiff_t ldc, int zero);

typedef struct {
  ukernel_fn fn;
  int mr, nr;
  int kc;  // the block of k (at most KCMAX)
  const char *name;
  // NULL, or the partial tiles: parts[(mr - 1) * 2 + nv - 1] computes mr <= MR
  // rows and nv * NR / 2 columns reading only those rows of A (nr = 16 kernels).
  const ukernel_fn *parts;
} ukernel;

enum { PMR = 6, PNR = 16 };  // the portable kernel's tile

static void ukernel_portable(int kc, const float *a, ptrdiff_t rsa, ptrdiff_t csa, const float *bp,
                             float *c, ptrdiff_t ldc, int zero) {
  for (int i = 0; i < PMR; i++) {
    float acc[PNR];
    float *ci = c + (ptrdiff_t)i * ldc;
    for (int j = 0; j < PNR; j++) acc[j] = zero ? 0.0f : ci[j];
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
// The AVX2 tile, for any mr <= 6 rows and nv = 1 or 2 vectors of 8 columns
// (the panel is 16 wide whatever nv): always inlined with constant shapes, so
// each variant below is fully unrolled with its accumulators in registers.
// Every element is the same chain whatever the variant.
__attribute__((target("avx2,fma"), always_inline)) static inline void avx2_tile(
    const int mr, const int nv, int kc, const float *a, ptrdiff_t rsa, ptrdiff_t csa,
    const float *bp, float *c, ptrdiff_t ldc, int zero) {
  // Named accumulators, not an array: GCC keeps an array of vectors on the
  // stack (a store per FMA), named ones in registers. Rows >= mr and the
  // second vector when nv == 1 are dead code for the constant shapes.
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define AVX2_ROWS(X) \
  X(0, c00, c01) X(1, c10, c11) X(2, c20, c21) X(3, c30, c31) X(4, c40, c41) X(5, c50, c51)
#define AVX2_LOAD(I, A0, A1)                           \
  if (mr > I && !zero) {                               \
    A0 = _mm256_loadu_ps(c + I * ldc);                 \
    if (nv > 1) A1 = _mm256_loadu_ps(c + I * ldc + 8); \
  }
  AVX2_ROWS(AVX2_LOAD)
  // The driver's next tile is the strip below (the same columns): its rows of
  // C are fetched while this one computes, so that its first read (or its
  // stores, with zero) does not wait for memory (at 1024 x 2048, C is 8 MiB,
  // beyond L2). Past the last strip this fetches lines that are never used; a
  // prefetch never faults, and the address is made as an integer so that no
  // pointer leaves its array.
#define AVX2_PREFETCH(I, A0, A1)                                                   \
  if (mr > I) {                                                                    \
    const uintptr_t r = (uintptr_t)c + (uintptr_t)((6 + I) * ldc) * sizeof(float); \
    _mm_prefetch((const char *)r, _MM_HINT_T0);                                    \
    _mm_prefetch((const char *)(r + 15 * sizeof(float)), _MM_HINT_T0);             \
  }
  AVX2_ROWS(AVX2_PREFETCH)
#undef AVX2_PREFETCH
  for (int p = 0; p < kc; p++) {
    const ptrdiff_t o = (ptrdiff_t)p * csa;
    const __m256 b0 = _mm256_loadu_ps(bp);
    const __m256 b1 = nv > 1 ? _mm256_loadu_ps(bp + 8) : b0;
    bp += 16;
#define AVX2_FMA(I, A0, A1)                                 \
  if (mr > I) {                                             \
    const __m256 av = _mm256_broadcast_ss(a + I * rsa + o); \
    A0 = _mm256_fmadd_ps(av, b0, A0);                       \
    if (nv > 1) A1 = _mm256_fmadd_ps(av, b1, A1);           \
  }
    AVX2_ROWS(AVX2_FMA)
  }
#define AVX2_STORE(I, A0, A1)                          \
  if (mr > I) {                                        \
    _mm256_storeu_ps(c + I * ldc, A0);                 \
    if (nv > 1) _mm256_storeu_ps(c + I * ldc + 8, A1); \
  }
  AVX2_ROWS(AVX2_STORE)
#undef AVX2_STORE
#undef AVX2_FMA
#undef AVX2_LOAD
#undef AVX2_ROWS
}

#define AVX2_VARIANT(MR_, NV_)                                                         \
  __attribute__((target("avx2,fma"))) static void ukernel_avx2_##MR_##x##NV_(          \
      int kc, const float *a, ptrdiff_t rsa, ptrdiff_t csa, const float *bp, float *c, \
      ptrdiff_t ldc, int zero) {                                                       \
    avx2_tile(MR_, NV_, kc, a, rsa, csa, bp, c, ldc, zero);                            \
  }
AVX2_VARIANT(1, 1)
AVX2_VARIANT(2, 1)
AVX2_VARIANT(3, 1)
AVX2_VARIANT(4, 1)
AVX2_VARIANT(5, 1)
AVX2_VARIANT(6, 1)
AVX2_VARIANT(1, 2)
AVX2_VARIANT(2, 2)
AVX2_VARIANT(3, 2)
AVX2_VARIANT(4, 2)
AVX2_VARIANT(5, 2)
AVX2_VARIANT(6, 2)
#undef AVX2_VARIANT

// part[(mr - 1) * 2 + nv - 1]: the tile of mr rows and 8 * nv columns.
static const ukernel_fn avx2_parts[12] = {ukernel_avx2_1x1, ukernel_avx2_1x2, ukernel_avx2_2x1,
                                          ukernel_avx2_2x2, ukernel_avx2_3x1, ukernel_avx2_3x2,
                                          ukernel_avx2_4x1, ukernel_avx2_4x2, ukernel_avx2_5x1,
                                          ukernel_avx2_5x2, ukernel_avx2_6x1, ukernel_avx2_6x2};
#define ukernel_avx2 ukernel_avx2_6x2

// 8 x 32: 16 accumulators of 16 floats.
__attribute__((target("avx512f,avx2,fma"))) static void ukernel_avx512(int kc, const float *a,
                                                                       ptrdiff_t rsa, ptrdiff_t csa,
                                                                       const float *bp, float *c,
                                                                       ptrdiff_t ldc, int zero) {
  __m512 acc[8][2];
  for (int i = 0; i < 8; i++) {
    acc[i][0] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc);
    acc[i][1] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16);
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

static const ukernel k_portable = {ukernel_portable, PMR, PNR, 256, "portable (fmaf)", NULL};

// MOE_GEMM_FIXED_ISA=portable or avx2 in the environment (read once) picks a
// narrower kernel than the CPU's best: the tests run the AVX2 kernel on an
// AVX-512 machine that way. Other values, and avx2 on a CPU without it, are
// ignored.
static ukernel pick_kernel(void) {
#if MOE_FIXED_X86
  const char *force = getenv("MOE_GEMM_FIXED_ISA");
  if (!(force && strcmp(force, "portable") == 0)) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      if (__builtin_cpu_supports("avx512f") && !(force && strcmp(force, "avx2") == 0)) {
        return (ukernel){ukernel_avx512, 8, 32, 256, "avx512", NULL};
      }
      return (ukernel){ukernel_avx2, 6, 16, 512, "avx2+fma", avx2_parts};
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

// ---- scratch ----------------------------------------------------------------------

// The packed panels live in the per-thread buffer moe_gemm_scratch (gemm.c,
// shared with the bf16 kernel), made on a thread's first call and freed when
// the thread ends (a GEMM per call to malloc cost more
// than the small GEMMs themselves, and a large block came from mmap, so every
// call faulted its pages in again).
enum { BPACK_FLOATS = NC * KCMAX, APACK_FLOATS = 128 * KCMAX };

static float *scratch(void) {
  _Static_assert((size_t)(BPACK_FLOATS + APACK_FLOATS) * sizeof(float) <= MOE_GEMM_SCRATCH_BYTES,
                 "the fixed kernel's packing exceeds the shared scratch");
  return moe_gemm_scratch();
}

// ---- packing ----------------------------------------------------------------------

// op(B) rows [p0, p0 + kc) and columns [j0, j0 + nc), times alpha, into
// ceil(nc / NR) panels of kc x NR (zero-padded past column nc).
static void pack_b(float *restrict dst, const float *b, int ldb, int trans_b, int p0, int kc,
                   int j0, int nc, float alpha, int NR) {
  const size_t panel = (size_t)kc * (size_t)NR;  // floats in one packed panel
  if (!trans_b) {
    // op(B) = B: row by row of B, each read once along its nc columns and
    // dealt out to the panels (panel by panel instead, every step of k read 64
    // bytes from another row, ldb apart: a page each at ldb = 1024 floats,
    // 5% of the layer's GEMM time on an AVX2 EPYC).
    const int full = nc / NR, rest = nc - full * NR;
    for (int p = 0; p < kc; p++) {
      const float *restrict s = b + (size_t)(p0 + p) * (size_t)ldb + (size_t)j0;
      float *restrict d = dst + (size_t)p * NR;
      for (int q = 0; q < full; q++) {
        float *restrict dq = d + (size_t)q * panel;
        const float *restrict sq = s + (size_t)q * NR;
        for (int j = 0; j < NR; j++) dq[j] = alpha * sq[j];
      }
      if (rest) {
        float *restrict dq = d + (size_t)full * panel;
        const float *restrict sq = s + (size_t)full * NR;
        for (int j = 0; j < rest; j++) dq[j] = alpha * sq[j];
        for (int j = rest; j < NR; j++) dq[j] = 0.0f;
      }
    }
    return;
  }
  // op(B) column j is row j of B: read along it, write down the panel
  for (int jp = 0; jp < nc; jp += NR) {
    const int nr = nc - jp < NR ? nc - jp : NR;
    for (int j = 0; j < nr; j++) {
      const float *restrict s = b + (size_t)(j0 + jp + j) * (size_t)ldb + (size_t)p0;
      for (int p = 0; p < kc; p++) dst[(size_t)p * NR + j] = alpha * s[p];
    }
    if (nr < NR) {
      for (int p = 0; p < kc; p++) {
        for (int j = nr; j < NR; j++) dst[(size_t)p * NR + j] = 0.0f;
      }
    }
    dst += panel;
  }
}

// op(A) rows [i0, i0 + mr) (mr <= MR) and k [p0, p0 + kc) into one strip of
// kc x MR (row i of the strip at dst[p * MR + i], zero past row mr).
static void pack_a_strip(float *restrict dst, a_view av, int i0, int mr, int p0, int kc, int MR) {
  const float *a = av.a + (ptrdiff_t)i0 * av.rsa + (ptrdiff_t)p0 * av.csa;
  if (av.csa == 1) {  // op(A) = A: row i contiguous along p
    for (int i = 0; i < mr; i++) {
      const float *restrict s = a + (ptrdiff_t)i * av.rsa;
      for (int p = 0; p < kc; p++) dst[(size_t)p * MR + i] = s[p];
    }
  } else {  // op(A) = A^T: the strip's rows are contiguous along i
    for (int p = 0; p < kc; p++) {
      const float *restrict s = a + (ptrdiff_t)p * av.csa;
      for (int i = 0; i < mr; i++) dst[(size_t)p * MR + i] = s[i];
    }
  }
  if (mr < MR) {
    for (int p = 0; p < kc; p++) {
      for (int i = mr; i < MR; i++) dst[(size_t)p * MR + i] = 0.0f;
    }
  }
}

// ---- driver -----------------------------------------------------------------------

// The same chains one element at a time (slow, identical bits): the path
// when a thread's scratch cannot be allocated.
static void gemm_fixed_elementwise(int trans_b, int m, int n, int k, float alpha, a_view av,
                                   const float *b, int ldb, float *c, int ldc) {
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
}

// One mr x nr tile (mr <= MR, nr <= NR) of C: in place when whole, else
// through a zero-padded scratch tile. zero: the chains start at 0 (beta = 0,
// first block of k) instead of reading C.
static void tile(const ukernel *kern, int kc, const float *ap, ptrdiff_t rsa, ptrdiff_t csa,
                 const float *bp, float *c, int ldc, int mr, int nr, int zero) {
  const int MR = kern->mr, NR = kern->nr;
  if (mr == MR && nr == NR) {
    kern->fn(kc, ap, rsa, csa, bp, c, ldc, zero);
    return;
  }
  float t[MRMAX * NRMAX];
  if (kern->parts) {  // mr rows of A only; the columns in halves of the panel
    const int half = NR / 2, nv = (nr + half - 1) / half;
    const ukernel_fn fn = kern->parts[(mr - 1) * 2 + nv - 1];
    if (nr % half == 0) {
      fn(kc, ap, rsa, csa, bp, c, ldc, zero);
      return;
    }
    for (int i = 0; i < mr; i++) {
      for (int j = 0; j < NR; j++)
        t[i * NR + j] = !zero && j < nr ? c[(size_t)i * (size_t)ldc + (size_t)j] : 0.0f;
    }
    fn(kc, ap, rsa, csa, bp, t, NR, zero);
    for (int i = 0; i < mr; i++) {
      for (int j = 0; j < nr; j++) c[(size_t)i * (size_t)ldc + (size_t)j] = t[i * NR + j];
    }
    return;
  }
  for (int i = 0; i < MR; i++) {
    for (int j = 0; j < NR; j++) {
      t[i * NR + j] = !zero && i < mr && j < nr ? c[(size_t)i * (size_t)ldc + (size_t)j] : 0.0f;
    }
  }
  kern->fn(kc, ap, rsa, csa, bp, t, NR, zero);
  for (int i = 0; i < mr; i++) {
    for (int j = 0; j < nr; j++) c[(size_t)i * (size_t)ldc + (size_t)j] = t[i * NR + j];
  }
}

// Goto's loop order: for each NC x KC block of op(B) (packed into panels),
// the rows go in blocks of MC, and within a block panel by panel, strip by
// strip, so that a panel of B stays in L1 while the strips of A stream from
// L2. The strips of an untransposed A are read in place (with their strides):
// packing them cost more than it saved at the shapes libmoe runs. A transposed
// A's are packed when enough panels reuse them (above). Without partial-tile
// kernels, the bottom strip, whose rows past m must not be read, is copied
// into a zero-padded buffer.
static void gemm_fixed_with(const ukernel *kern, int trans_a, int trans_b, int m, int n, int k,
                            float alpha, const float *a, int lda, const float *b, int ldb,
                            float beta, float *c, int ldc) {
  const int MR = kern->mr, NR = kern->nr, KC = kern->kc, MC = MR * (128 / MR);
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f || beta != 0.0f) moe_gemm_scale_c(c, m, n, ldc, beta);
  if (k <= 0 || alpha == 0.0f) return;
  const a_view av = {a, trans_a ? 1 : lda, trans_a ? lda : 1};
  float *bpack = scratch();
  if (!bpack) {
    if (beta == 0.0f) moe_gemm_scale_c(c, m, n, ldc, 0.0f);  // the chains start at 0
    gemm_fixed_elementwise(trans_b, m, n, k, alpha, av, b, ldb, c, ldc);
    return;
  }
  float *apack = bpack + BPACK_FLOATS;  // a block's packed strips, or the padded bottom strip

  for (int j0 = 0; j0 < n; j0 += NC) {
    const int nc = n - j0 < NC ? n - j0 : NC;
    // A transposed A's strip takes MR floats from each of kc rows lda apart
    // (at lda = 1024 floats every step of k falls into the same L1 set): with
    // enough panels to reuse them, its strips are packed (1.2-1.3x at the
    // 1024-2048 expert weight gradients on an AVX2 EPYC).
    const int packed = av.csa != 1 && nc >= PACK_A_PANELS * NR;
    for (int p0 = 0; p0 < k; p0 += KC) {
      const int kc = k - p0 < KC ? k - p0 : KC;
      const int zero = beta == 0.0f && p0 == 0;
      pack_b(bpack, b, ldb, trans_b, p0, kc, j0, nc, alpha, NR);
      for (int i0 = 0; i0 < m; i0 += MC) {
        const int mc = m - i0 < MC ? m - i0 : MC;
        const int mfull = mc / MR * MR;  // rows in whole strips
        if (packed) {
          for (int ir = 0; ir < mc; ir += MR) {
            pack_a_strip(apack + (size_t)ir * (size_t)kc, av, i0 + ir, mc - ir < MR ? mc - ir : MR,
                         p0, kc, MR);
          }
        } else if (mfull < mc && !kern->parts) {
          pack_a_strip(apack, av, i0 + mfull, mc - mfull, p0, kc, MR);
        }
        for (int jp = 0; jp < nc; jp += NR) {
          const int nr = nc - jp < NR ? nc - jp : NR;
          const float *bp = bpack + (size_t)(jp / NR) * (size_t)kc * NR;
          for (int ir = 0; ir < mc; ir += MR) {
            const int mr = mc - ir < MR ? mc - ir : MR;
            float *ct = c + (size_t)(i0 + ir) * (size_t)ldc + (size_t)(j0 + jp);
            // the strip: in place, packed, or (a bottom strip without a
            // partial-tile kernel) the padded copy
            const int in_place = !packed && (mr == MR || kern->parts);
            const float *as = in_place
                                  ? av.a + (ptrdiff_t)(i0 + ir) * av.rsa + (ptrdiff_t)p0 * av.csa
                              : packed ? apack + (size_t)ir * (size_t)kc
                                       : apack;
            tile(kern, kc, as, in_place ? av.rsa : 1, in_place ? av.csa : MR, bp, ct, ldc, mr, nr,
                 zero);
          }
        }
      }
    }
  }
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

static const char *fixed_unavailable(void) { return NULL; }

static char g_describe[64];
static pthread_once_t g_describe_once = PTHREAD_ONCE_INIT;

static void describe_make(void) {
  snprintf(g_describe, sizeof g_describe, "fixed-order kernel (%s)", moe_gemm_fixed_isa());
}

static const char *fixed_describe(void) {
  pthread_once(&g_describe_once, describe_make);
  return g_describe;
}

const moe_backend moe_backend_fixed = {
    .name = "fixed",
    .summary = "fixed-order batch-invariant kernel (same bits at any batch size and rank count)",
    .batch_invariant = 1,
    .unavailable = fixed_unavailable,
    .gemm = moe_gemm_fixed,
    .set_threads = NULL,
    .describe = fixed_describe,
    .gemm_bf16 = moe_gemm_bf16,
};
