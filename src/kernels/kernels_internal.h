// Private interface of src/kernels for libmoe's own tests (not installed; users
// see only include/moe/kernels.h).
//
// GELU is compiled once per instruction set (activation.c: baseline, and on
// x86-64 with GCC or clang also AVX2+FMA and AVX-512) and the public
// moe_gelu_forward/backward run the widest copy the CPU supports. These hooks
// let test_kernels run and check every copy the CPU can execute, not only the
// one it picks.
#ifndef MOE_KERNELS_INTERNAL_H
#define MOE_KERNELS_INTERNAL_H

#include <stddef.h>

// Instruction-set copies, in increasing width (bit numbers of the mask below).
enum {
  MOE_GELU_ISA_BASE = 0,
  MOE_GELU_ISA_AVX2 = 1,
  MOE_GELU_ISA_AVX512 = 2,
  MOE_GELU_ISA_COUNT = 3
};

// What moe_gelu_run_isa runs: moe_gelu_forward (in place when out == x) or
// moe_gelu_backward (out is dx, accumulated into).
enum { MOE_GELU_FORWARD = 0, MOE_GELU_BACKWARD = 1 };

// Bit (1u << MOE_GELU_ISA_x) set for each GELU copy that is compiled in and that
// this CPU supports; MOE_GELU_ISA_BASE is always set (and is the only one on
// non-x86 builds). The public functions use the highest set bit.
unsigned moe_gelu_isa_mask(void);

// "baseline", "avx2+fma", "avx512", or "unknown".
const char *moe_gelu_isa_name(int isa);

// The public GELU forward or backward, with the same arguments and contract
// (dy is ignored by the forward), run on the copy for `isa`. Returns 0; or -1,
// touching nothing, when `isa` is not in moe_gelu_isa_mask() or `op` is unknown.
int moe_gelu_run_isa(int isa, int op, float *out, const float *dy, const float *x, size_t n);

// C (m, n; row stride ldc) = beta * C; beta == 0 writes exact zeros (C is not
// read), beta == 1 leaves C alone. The GEMM backends' shared first step.
void moe_gemm_scale_c(float *c, int m, int n, int ldc, float beta);

// The fixed-order kernels' packing buffer (gemm_fixed.c, gemm_bf16.c): one
// per thread, MOE_GEMM_SCRATCH_BYTES, 64-byte aligned, made on the thread's
// first call and freed when it ends; NULL when it cannot be allocated. One
// buffer serves both kernels: a GEMM never calls another.
#define MOE_GEMM_SCRATCH_BYTES ((size_t)(512 * 512 + 128 * 512) * 4)
void *moe_gemm_scratch(void);

// moe_gemm_bf16 on its portable path (fmaf and flushes), whatever the CPU.
void moe_gemm_bf16_portable(int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta, float *c,
                            int ldc);

// moe_gemm_fixed on its portable path (fmaf), whatever the CPU: the tests
// check that it gives the same bits as the path moe_gemm_fixed picks.
void moe_gemm_fixed_portable(int trans_a, int trans_b, int m, int n, int k, float alpha,
                             const float *a, int lda, const float *b, int ldb, float beta, float *c,
                             int ldc);

#endif
