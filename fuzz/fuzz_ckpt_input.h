// The input of the checkpoint harnesses: one flag byte, then the file.
//
// A checkpoint is CRC-checked in four places (header, every tensor's data,
// the table, the whole file), so a mutated file almost never gets past the
// first check and the fuzzer would only ever explore the checksum errors.
// The flag byte lets it ask for a mutated file with consistent checksums (the
// layout of docs/checkpoint.md), so that the decoding behind them is
// explored too:
//   bit 0  recompute every CRC the layout allows (each tensor's data CRC in
//          its table entry when its offset and size lie in the file, the
//          table's, the header's, the file's)
//   bit 1  set the header's file size to the input's length
//   bit 2  set the header's table offset to where n entries end the file
// Other bits are ignored. With flags 0 the file is taken as it is.
#ifndef MOE_FUZZ_CKPT_INPUT_H
#define MOE_FUZZ_CKPT_INPUT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "moe/checkpoint.h"

// Sizes of docs/checkpoint.md's layout.
#define FUZZ_CK_HEADER 64u
#define FUZZ_CK_ENTRY 128u
#define FUZZ_CK_TAIL 8u
#define FUZZ_CK_TRAILER 16u

static inline uint32_t fuzz_get_u32(const unsigned char *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t fuzz_get_u64(const unsigned char *p) {
  return (uint64_t)fuzz_get_u32(p) | ((uint64_t)fuzz_get_u32(p + 4) << 32);
}
static inline void fuzz_put_u32(unsigned char *p, uint32_t v) {
  for (int b = 0; b < 4; b++) p[b] = (unsigned char)(v >> (8 * b));
}
static inline void fuzz_put_u64(unsigned char *p, uint64_t v) {
  for (int b = 0; b < 8; b++) p[b] = (unsigned char)(v >> (8 * b));
}

// Applies the flags to f (len bytes) in place.
static inline void fuzz_ckpt_repair(unsigned flags, unsigned char *f, size_t len) {
  if (len < FUZZ_CK_HEADER) return;
  const uint64_t n = fuzz_get_u32(f + 24);
  const uint64_t tail = n * FUZZ_CK_ENTRY + FUZZ_CK_TAIL + FUZZ_CK_TRAILER;
  if (flags & 2u) fuzz_put_u64(f + 48, len);
  if ((flags & 4u) && tail <= len) fuzz_put_u64(f + 40, len - tail);
  if (!(flags & 1u)) return;
  const uint64_t table = fuzz_get_u64(f + 40);
  if (fuzz_get_u64(f + 48) == len && table <= len && len - table == tail) {
    unsigned char *entries = f + table;
    for (uint64_t i = 0; i < n; i++) {
      unsigned char *e = entries + i * FUZZ_CK_ENTRY;
      const uint64_t off = fuzz_get_u64(e + 104), nb = fuzz_get_u64(e + 112);
      if (off <= len && nb <= len - off) fuzz_put_u32(e + 120, moe_crc32(0, f + off, (size_t)nb));
    }
    unsigned char *ttail = entries + n * FUZZ_CK_ENTRY;
    fuzz_put_u32(ttail, moe_crc32(0, entries, (size_t)(n * FUZZ_CK_ENTRY)));
  }
  fuzz_put_u32(f + 60, moe_crc32(0, f, 60));
  if (len >= FUZZ_CK_HEADER + FUZZ_CK_TRAILER) {
    fuzz_put_u32(f + len - FUZZ_CK_TRAILER, moe_crc32(0, f, len - FUZZ_CK_TRAILER));
  }
}

// The checkpoint file of an input, in memory: its path (fuzz_memfile).
static inline const char *fuzz_ckpt_file(const uint8_t *data, size_t size) {
  if (size == 0) return fuzz_memfile("", 0);
  unsigned char *f = malloc(size);
  FUZZ_CHECK(f != NULL, "out of memory");
  memcpy(f, data + 1, size - 1);
  fuzz_ckpt_repair(data[0], f, size - 1);
  const char *path = fuzz_memfile(f, size - 1);
  free(f);
  return path;
}

#endif  // MOE_FUZZ_CKPT_INPUT_H
