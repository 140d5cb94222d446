// Reader for the MoE layer reference files written by tests/gen_layer_ref.py
// (format: tests/data/README.md). Test-only code: plain malloc/free, no torch.
#ifndef MOE_REFIO_H
#define MOE_REFIO_H

#include <stddef.h>
#include <stdint.h>

#define REF_DTYPE_F32 0
#define REF_DTYPE_I32 1
#define REF_VERSION 1u

typedef struct {
  char name[32];    // NUL-terminated
  int dtype;        // REF_DTYPE_F32 or REF_DTYPE_I32
  int ndim;         // 1..4
  int64_t dims[4];  // unused = 1
  size_t count;     // product of dims
  void *data;       // count floats or int32s, host order, malloc'ed
} ref_tensor;

typedef struct {
  uint32_t version;
  char case_name[64];                                 // NUL-terminated
  int32_t T, M, H, E, K, act, renormalize, capacity;  // act 0 gelu 1 relu; capacity -1 = dropless
  double capacity_factor;
  float aux_loss_coef, z_loss_coef;
  int n_tensors;
  ref_tensor *tensors;
} ref_file;

// Loads and validates a reference file. Returns 0 on success; on failure
// returns non-zero, leaves *out zeroed, and writes a message into err naming
// the problem ("cannot open", "bad magic", "unsupported version",
// "truncated at byte N", "bad dims", "CRC mismatch", ...).
int ref_load(const char *path, ref_file *out, char *err, size_t errlen);
// The tensor with that name, or NULL.
const ref_tensor *ref_get(const ref_file *f, const char *name);
// Data of a float32 / int32 tensor with exactly expect_count elements; NULL if
// absent, of the other dtype, or of another element count.
const float *ref_f32(const ref_file *f, const char *name, size_t expect_count);
const int32_t *ref_i32(const ref_file *f, const char *name, size_t expect_count);
// Frees and zeroes *f; a zeroed struct or NULL is fine.
void ref_free(ref_file *f);

// Standard CRC-32 (reflected polynomial 0xEDB88320, init and final xor
// 0xFFFFFFFF), the same as zlib's crc32() / Python's zlib.crc32().
uint32_t ref_crc32(const void *data, size_t n);

#endif
