// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11; the Random123 family,
// also used by cuRAND and PyTorch's CUDA generator).
//
// Output u32 number i of stream s under seed k is lane (i % 4) of
//   philox(counter = {i/4 low, i/4 high, s low, s high}, key = {k low, k high}),
// so a value depends only on (seed, stream, i): every platform and every way of
// splitting a fill over threads or ranks gives the same numbers.
// Not cryptographic.
#define _POSIX_C_SOURCE 200809L
#include <math.h>

#include "moe/core.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u  // golden ratio
#define PHILOX_W1 0xBB67AE85u  // sqrt(3) - 1

static inline void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  const uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

void moe_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    if (round > 0) {  // key schedule: bump before every round but the first
      k0 += PHILOX_W0;
      k1 += PHILOX_W1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(PHILOX_M0, c0, &hi0, &lo0);
    mulhilo32(PHILOX_M1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

void moe_rng_init(moe_rng *rng, uint64_t seed, uint64_t stream) {
  rng->seed = seed;
  rng->stream = stream;
  rng->index = 0;
}

uint32_t moe_rng_u32(moe_rng *rng) {
  const uint64_t block = rng->index >> 2;
  const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)rng->stream,
                           (uint32_t)(rng->stream >> 32)};
  const uint32_t key[2] = {(uint32_t)rng->seed, (uint32_t)(rng->seed >> 32)};
  uint32_t out[4];
  moe_philox4x32_10(ctr, key, out);
  const uint32_t v = out[rng->index & 3u];
  rng->index++;
  return v;
}

float moe_rng_uniform(moe_rng *rng) {
  // The top 24 bits: every value is exactly representable, result in [0, 1).
  return (float)(moe_rng_u32(rng) >> 8) * (1.0f / 16777216.0f);
}

float moe_rng_normal(moe_rng *rng) {
  // Box-Muller with u1 in (0, 1] so log never sees 0.
  const float u1 = (float)((moe_rng_u32(rng) >> 8) + 1u) * (1.0f / 16777216.0f);
  const float u2 = moe_rng_uniform(rng);
  const double r = sqrt(-2.0 * log((double)u1));
  return (float)(r * cos(2.0 * 3.14159265358979323846 * (double)u2));
}

void moe_rng_fill_uniform(moe_rng *rng, float *x, size_t n, float lo, float hi) {
  const float span = hi - lo;
  for (size_t i = 0; i < n; i++) x[i] = lo + span * moe_rng_uniform(rng);
}

void moe_rng_fill_normal(moe_rng *rng, float *x, size_t n, float mean, float std) {
  for (size_t i = 0; i < n; i++) x[i] = mean + std * moe_rng_normal(rng);
}
