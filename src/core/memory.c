// Counted, aligned heap allocation; arenas; tables of named tensors.
// Every byte libmoe takes from the heap goes through moe_malloc, so a test can
// assert that a forward/backward pass allocates nothing after the first call.
// Not a general-purpose allocator: arenas are bump allocators that are freed
// (or reset) as a whole.
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_usable_size: live-byte accounting
#define MOE_USABLE(p) malloc_usable_size(p)
#else
#define MOE_USABLE(p) ((size_t)0)  // live and peak bytes stay 0
#endif

#include "moe/core.h"

static atomic_uint_fast64_t g_alloc_count = 0;
static atomic_uint_fast64_t g_alloc_bytes = 0;
static atomic_uint_fast64_t g_live_bytes = 0;  // usable bytes of blocks not yet freed
static atomic_uint_fast64_t g_peak_bytes = 0;  // the most g_live_bytes has been

static void live_add(size_t n) {
  const uint_fast64_t now = atomic_fetch_add(&g_live_bytes, (uint_fast64_t)n) + n;
  uint_fast64_t peak = atomic_load(&g_peak_bytes);
  while (now > peak && !atomic_compare_exchange_weak(&g_peak_bytes, &peak, now)) {
  }
}

void *moe_malloc(size_t bytes) {
  if (bytes == 0 || bytes > SIZE_MAX - 64) return NULL;
  void *p = aligned_alloc(64, moe_align64(bytes));
  if (p) {
    atomic_fetch_add(&g_alloc_count, 1);
    atomic_fetch_add(&g_alloc_bytes, (uint_fast64_t)moe_align64(bytes));
    live_add(MOE_USABLE(p));
  }
  return p;
}

void *moe_calloc(size_t count, size_t size) {
  if (count == 0 || size == 0 || count > SIZE_MAX / size) return NULL;
  void *p = moe_malloc(count * size);
  if (p) memset(p, 0, count * size);
  return p;
}

void moe_free(void *p) {
  if (p) atomic_fetch_sub(&g_live_bytes, (uint_fast64_t)MOE_USABLE(p));
  free(p);
}

uint64_t moe_alloc_count(void) { return (uint64_t)atomic_load(&g_alloc_count); }
uint64_t moe_alloc_bytes(void) { return (uint64_t)atomic_load(&g_alloc_bytes); }
uint64_t moe_alloc_live_bytes(void) { return (uint64_t)atomic_load(&g_live_bytes); }
uint64_t moe_alloc_peak_bytes(void) { return (uint64_t)atomic_load(&g_peak_bytes); }
void moe_alloc_peak_reset(void) { atomic_store(&g_peak_bytes, atomic_load(&g_live_bytes)); }

void moe_heap_trim(void) {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// ---- arenas -------------------------------------------------------------------

moe_status moe_arena_init(moe_ctx *ctx, moe_arena *arena, size_t capacity) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !arena, MOE_STATUS_INVALID_ARG, "arena must not be NULL");
  memset(arena, 0, sizeof *arena);
  if (capacity == 0) goto done;
  // Not zeroed here: moe_arena_alloc zeroes what it hands out.
  arena->base = moe_malloc(moe_align64(capacity));
  MOE_FAIL_IF(ctx, !arena->base, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate an arena of %zu bytes",
              capacity);
  arena->capacity = moe_align64(capacity);
done:
  return st;
}

void moe_arena_free(moe_arena *arena) {
  if (!arena) return;
  moe_free(arena->base);
  memset(arena, 0, sizeof *arena);
}

void *moe_arena_alloc(moe_arena *arena, size_t bytes) {
  if (!arena || !arena->base || bytes == 0) return NULL;
  const size_t need = moe_align64(bytes);
  if (need < bytes || need > arena->capacity - arena->used) return NULL;
  void *p = arena->base + arena->used;
  arena->used += need;
  memset(p, 0, bytes);
  return p;
}

void moe_arena_reset(moe_arena *arena) {
  if (arena) arena->used = 0;
}

// ---- tensor tables ------------------------------------------------------------

size_t moe_tensor_table_bytes(const moe_tensor_spec *specs, int n) {
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (specs[i].count > (SIZE_MAX - total) / sizeof(float) - 64) return SIZE_MAX;
    total += moe_align64(specs[i].count * sizeof(float));
  }
  return total;
}

moe_status moe_tensor_table_carve(moe_ctx *ctx, moe_arena *arena, const moe_tensor_spec *specs,
                                  int n) {
  moe_status st = MOE_STATUS_OK;
  for (int i = 0; i < n; i++) {
    float *p = NULL;
    if (specs[i].count > 0) {
      MOE_FAIL_IF(ctx, specs[i].count > SIZE_MAX / sizeof(float), MOE_STATUS_OUT_OF_MEMORY,
                  "tensor '%s' is too large (%zu floats)", specs[i].name, specs[i].count);
      p = moe_arena_alloc(arena, specs[i].count * sizeof(float));
      MOE_FAIL_IF(ctx, !p, MOE_STATUS_OUT_OF_MEMORY,
                  "arena full: tensor '%s' (%zu floats) does not fit (%zu of %zu bytes used)",
                  specs[i].name, specs[i].count, arena ? arena->used : 0,
                  arena ? arena->capacity : 0);
    }
    *specs[i].out = p;
  }
done:
  return st;
}
