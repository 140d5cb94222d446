// libmoe checkpoints: one self-checking file holding a config JSON text and a
// table of named tensors, written atomically and validated whole on open.
//
// What: format v1 (byte layout in docs/checkpoint.md): a 64-byte header (magic
// "MOECKPT\0", version, sizes, header CRC-32), the config JSON, the tensor data
// (each 64-byte aligned), the tensor table (name, dtype, dims, offset, size,
// CRC-32 of the data) with its CRC-32, and a trailer (CRC-32 of every byte
// before it, magic "MOEEND\0\0"). Little-endian, host independent.
// Why: the trainer saves and resumes through it; a crash during a save must
// leave the previous checkpoint intact, and a damaged file must be refused with
// a message naming the file and the problem, never half-loaded.
// Not: a general container or a parallel writer. One process (rank 0) writes,
// streaming tensor pieces in order so it never holds the whole model; every
// rank may read its own slice. The config text is opaque here (not parsed).
//
// Atomicity: the writer fills "<path>.tmp.<pid>" next to path, fsyncs it,
// renames it over path and fsyncs the directory. Until the rename, path keeps
// its previous content; a killed writer leaves at most a stale temp file,
// which readers never look at and which may be deleted. Two writers to the
// same path from one process at the same time are not supported.
//
// Test hook: if the environment variable MOE_CKPT_TEST_PAUSE_AFTER_BYTES=N is
// set when a writer is opened, the writer, once N bytes of the temp file are
// written (N = file size pauses after the last byte, before the rename),
// fsyncs, prints "moe_ckpt: paused\n" to stderr and sleeps up to 60 s so a
// test can kill it (tests/checkpoint_kill_test.sh). For tests only.
//
// Threading: a writer or reader belongs to one thread at a time; errors go to
// the ctx given at open, which must outlive the object.
#ifndef MOE_CHECKPOINT_H
#define MOE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_CKPT_VERSION 1
#define MOE_CKPT_MAX_NAME 63  // characters of a tensor name (the NUL excluded)
#define MOE_CKPT_MAX_DIMS 4

// Element types (values are stored in the file; 0 is invalid on purpose).
typedef enum {
  MOE_CKPT_F32 = 1,  // IEEE binary32
  MOE_CKPT_I32 = 2,  // two's complement int32
  MOE_CKPT_U8 = 3    // bytes
} moe_ckpt_dtype;

// One tensor: a NUL-terminated name of 1..63 characters, unique in a file; dtype
// a moe_ckpt_dtype; ndim in 1..4; dims[0..ndim) > 0 (row-major, dims[ndim-1]
// fastest); dims[ndim..4) are ignored on write and 0 on read.
typedef struct {
  char name[64];
  int dtype;
  int ndim;
  int64_t dims[4];
} moe_ckpt_tensor_desc;

// Bytes per element of dtype (4, 4, 1), or 0 if dtype is not a moe_ckpt_dtype.
size_t moe_ckpt_dtype_size(int dtype);
// "f32", "i32", "u8", or "?".
const char *moe_ckpt_dtype_name(int dtype);
// Number of elements of a (valid) desc: product of dims[0..ndim).
int64_t moe_ckpt_desc_numel(const moe_ckpt_tensor_desc *d);

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320; the same as zlib's
// crc32). Start with crc = 0 and pass the previous result to continue:
// moe_crc32(moe_crc32(0, a, n), b, m) == CRC of a followed by b.
// moe_crc32(0, "123456789", 9) == 0xCBF43926.
uint32_t moe_crc32(uint32_t crc, const void *data, size_t bytes);

// ---- writer ---------------------------------------------------------------

typedef struct moe_ckpt_writer moe_ckpt_writer;

// Validates descs (n >= 0; names non-empty, at most 63 characters, unique; dtype
// known; ndim in 1..4; dims > 0; total size below 2^62 bytes: each problem is an
// INVALID_ARG naming the tensor), creates "<path>.tmp.<pid>" (a stale one with
// that name is replaced) and writes the header and the config. config_json is
// NUL-terminated text stored as is (NULL is ""). descs is copied. On failure
// *out is NULL and nothing is left on disk; an unwritable or missing directory
// is an IO error naming the temp path.
moe_status moe_ckpt_writer_open(moe_ctx *ctx, const char *path, const char *config_json,
                                const moe_ckpt_tensor_desc *descs, int n, moe_ckpt_writer **out);

// Appends `bytes` bytes of tensor i. Tensors are written in order (tensor 0
// fully, then 1, ...), each in one or more consecutive pieces. Writing tensor i
// while an earlier tensor is incomplete, writing a complete or earlier tensor
// again, or going past tensor i's size is an INVALID_ARG that writes nothing;
// the writer stays usable. An I/O failure (disk full) is an IO error after which
// only commit (which then fails) or abort is useful. bytes == 0 is a no-op.
moe_status moe_ckpt_writer_write(moe_ckpt_writer *w, int i, const void *data, size_t bytes);

// Checks that every tensor is complete (else INVALID_ARG naming the first
// incomplete one), writes the table and the trailer, fsyncs the file, renames
// it over path and fsyncs the directory. On any failure before the rename the
// temp file is removed and path is left as it was. If only the directory fsync
// fails, path already holds the new checkpoint and an IO error says so.
// Frees w in all cases (w NULL: INVALID_ARG, no ctx to report to).
moe_status moe_ckpt_writer_commit(moe_ckpt_writer *w);

// Closes and removes the temp file; path is untouched. NULL is a no-op.
void moe_ckpt_writer_abort(moe_ckpt_writer *w);

// ---- reader ---------------------------------------------------------------

typedef struct moe_ckpt_reader moe_ckpt_reader;

// Opens path and validates the whole file before returning (reads it once, in
// chunks): magic, version ("checkpoint version N, this build reads version 1"),
// the header's sizes against the file length ("truncated: expected X bytes,
// file has Y"), the header, table and trailer checksums, the table's entries,
// and every tensor's data CRC (a mismatch names the tensor). Errors name the
// path; BAD_FORMAT for a damaged or foreign file, IO when it cannot be read.
// Loads the config. The file stays open: later reads see this file even if a
// new checkpoint is renamed over path meanwhile. On failure *out is NULL.
moe_status moe_ckpt_reader_open(moe_ctx *ctx, const char *path, moe_ckpt_reader **out);
void moe_ckpt_reader_close(moe_ckpt_reader *r);  // NULL is a no-op

// The config JSON, NUL-terminated; owned by r (valid until close).
const char *moe_ckpt_reader_config(const moe_ckpt_reader *r);
// Its length in bytes (without the NUL).
size_t moe_ckpt_reader_config_len(const moe_ckpt_reader *r);
int moe_ckpt_reader_num_tensors(const moe_ckpt_reader *r);
// Desc of tensor i (owned by r), or NULL if i is out of range.
const moe_ckpt_tensor_desc *moe_ckpt_reader_desc(const moe_ckpt_reader *r, int i);
// Index of the tensor with this name, or -1.
int moe_ckpt_reader_find(const moe_ckpt_reader *r, const char *name);

// Reads elements [first_elem, first_elem + count) of tensor i, flattened
// row-major, into dst (count * dtype size bytes), e.g. experts 4..7 of an
// (E, M, H) tensor are first_elem = 4*M*H, count = 4*M*H. A bad i or a range
// past the tensor is an INVALID_ARG; count == 0 reads nothing. The data was
// checked at open and is not re-checked.
moe_status moe_ckpt_reader_read(moe_ckpt_reader *r, int i, size_t first_elem, size_t count,
                                void *dst);

#ifdef __cplusplus
}
#endif
#endif  // MOE_CHECKPOINT_H
