// Checkpoint files (include/moe/checkpoint.h; byte layout in docs/checkpoint.md).
//
// What: a streaming writer that fills "<path>.tmp.<pid>" strictly front to
// back (header, config, tensor data, table, trailer: the table comes after the
// data because its CRCs are known only then, so the writer never seeks), keeps
// running CRC-32s, and publishes with fsync + rename + directory fsync; and a
// reader that validates every byte of a file before handing out anything.
// Not: a parser of the config (opaque text), a memory map (the reader checks
// what it reads instead of trusting the page cache's view of a file that may
// change), or a parallel writer (one process writes; ranks read slices).
//
// Every multi-byte field is encoded and decoded byte by byte as
// little-endian, so files do not depend on host byte order and nothing is read
// unaligned.
#define _POSIX_C_SOURCE 200809L  // fsync, pread, nanosleep, O_CLOEXEC
#define _FILE_OFFSET_BITS 64

#include "moe/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

// ---- format constants ----------------------------------------------------------

#define CK_MAGIC "MOECKPT\0"
#define CK_END_MAGIC "MOEEND\0\0"
#define CK_HEADER_BYTES 64u
#define CK_ENTRY_BYTES 128u               // one tensor table entry
#define CK_TABLE_TAIL_BYTES 8u            // table CRC + reserved
#define CK_TRAILER_BYTES 16u              // file CRC + reserved + end magic
#define CK_MAX_BYTES (UINT64_C(1) << 62)  // any size field: far above real files, no overflow
#define CK_IO_CHUNK ((size_t)4 << 20)     // reader's validation chunk
#define CK_WRITE_BUF ((size_t)1 << 20)    // writer's buffer
#define CK_PAUSE_ENV "MOE_CKPT_TEST_PAUSE_AFTER_BYTES"
#define CK_PAUSE_SECONDS 60

static uint64_t align64_u64(uint64_t x) { return (x + 63u) & ~(uint64_t)63u; }

// ---- CRC-32 (IEEE, reflected 0xEDB88320, as zlib) ----------------------------------

// Slicing-by-8 (Intel's, as in zlib and the Linux kernel): eight bytes per step
// through eight 256-entry tables, about 4x the byte-at-a-time loop, which
// matters because open checks every byte of files of hundreds of MB. Table k
// advances the CRC of one byte followed by k zero bytes. Built once, on first
// use, by whichever thread gets there first.
static uint32_t crc_tables[8][256];
static pthread_once_t crc_tables_once = PTHREAD_ONCE_INIT;

static void crc_tables_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int b = 0; b < 8; b++) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
    crc_tables[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++) {
    for (int k = 1; k < 8; k++) {
      const uint32_t prev = crc_tables[k - 1][i];
      crc_tables[k][i] = crc_tables[0][prev & 0xFFu] ^ (prev >> 8);
    }
  }
}

uint32_t moe_crc32(uint32_t crc, const void *data, size_t bytes) {
  pthread_once(&crc_tables_once, crc_tables_init);
  const unsigned char *p = (const unsigned char *)data;
  uint32_t c = crc ^ 0xFFFFFFFFu;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    const uint32_t lo = c ^ ((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                             ((uint32_t)p[3] << 24));
    const uint32_t hi =
        (uint32_t)p[4] | ((uint32_t)p[5] << 8) | ((uint32_t)p[6] << 16) | ((uint32_t)p[7] << 24);
    c = crc_tables[7][lo & 0xFFu] ^ crc_tables[6][(lo >> 8) & 0xFFu] ^
        crc_tables[5][(lo >> 16) & 0xFFu] ^ crc_tables[4][lo >> 24] ^ crc_tables[3][hi & 0xFFu] ^
        crc_tables[2][(hi >> 8) & 0xFFu] ^ crc_tables[1][(hi >> 16) & 0xFFu] ^
        crc_tables[0][hi >> 24];
  }
  for (; bytes > 0; bytes--, p++) c = crc_tables[0][(c ^ *p) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// ---- dtypes and descs -----------------------------------------------------------------

size_t moe_ckpt_dtype_size(int dtype) {
  switch (dtype) {
    case MOE_CKPT_F32:
    case MOE_CKPT_I32:
      return 4;
    case MOE_CKPT_U8:
      return 1;
    default:
      return 0;
  }
}

const char *moe_ckpt_dtype_name(int dtype) {
  switch (dtype) {
    case MOE_CKPT_F32:
      return "f32";
    case MOE_CKPT_I32:
      return "i32";
    case MOE_CKPT_U8:
      return "u8";
    default:
      return "?";
  }
}

int64_t moe_ckpt_desc_numel(const moe_ckpt_tensor_desc *d) {
  int64_t n = 1;
  for (int k = 0; k < d->ndim && k < MOE_CKPT_MAX_DIMS; k++) n *= d->dims[k];
  return n;
}

// Checks one desc and returns its byte size. `who` prefixes messages (the path);
// `i` names the tensor when its name is unusable.
static moe_status check_desc(moe_ctx *ctx, moe_status code, const char *who, int i,
                             const moe_ckpt_tensor_desc *d, uint64_t *bytes) {
  moe_status st = MOE_STATUS_OK;
  const size_t len = strnlen(d->name, sizeof d->name);
  MOE_FAIL_IF(ctx, len == 0, code, "%s: tensor %d has an empty name", who, i);
  MOE_FAIL_IF(ctx, len > MOE_CKPT_MAX_NAME, code,
              "%s: tensor %d: name '%.63s...' is longer than %d characters", who, i, d->name,
              MOE_CKPT_MAX_NAME);
  const size_t esize = moe_ckpt_dtype_size(d->dtype);
  MOE_FAIL_IF(ctx, esize == 0, code, "%s: tensor '%s': unknown dtype %d (f32=1, i32=2, u8=3)", who,
              d->name, d->dtype);
  MOE_FAIL_IF(ctx, d->ndim < 1 || d->ndim > MOE_CKPT_MAX_DIMS, code,
              "%s: tensor '%s': ndim (%d) must be in [1, %d]", who, d->name, d->ndim,
              MOE_CKPT_MAX_DIMS);
  uint64_t total = esize;
  for (int k = 0; k < d->ndim; k++) {
    MOE_FAIL_IF(ctx, d->dims[k] <= 0, code, "%s: tensor '%s': dims[%d] (%" PRId64 ") must be > 0",
                who, d->name, k, d->dims[k]);
    MOE_FAIL_IF(ctx, (uint64_t)d->dims[k] > CK_MAX_BYTES / total, code,
                "%s: tensor '%s': size overflow (dims[%d] = %" PRId64
                " makes it 2^62 bytes or more)",
                who, d->name, k, d->dims[k]);
    total *= (uint64_t)d->dims[k];
  }
  *bytes = total;
done:
  return st;
}

// The file layout implied by a config length and descs (the writer's plan, and
// what the reader requires the header and table to match exactly):
//   [0, 64) header; [64, 64 + config_len) config; zero padding to data_offset =
//   align64(64 + config_len); tensor i at offsets[i], the first at data_offset,
//   each next one at align64(end of the previous); table at table_offset =
//   align64(end of the last tensor) (data_offset when n = 0); n entries of 128
//   bytes and an 8-byte table tail; a 16-byte trailer; file_size after it.
typedef struct {
  uint64_t data_offset, table_offset, trailer_offset, file_size;
} ck_layout;

static moe_status plan_layout(moe_ctx *ctx, moe_status code, const char *who, uint64_t config_len,
                              const moe_ckpt_tensor_desc *descs, int n, uint64_t *offsets,
                              uint64_t *nbytes, ck_layout *lay) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, config_len >= CK_MAX_BYTES, code, "%s: config of %" PRIu64 " bytes is too large",
              who, config_len);
  uint64_t pos = align64_u64(CK_HEADER_BYTES + config_len);
  lay->data_offset = pos;
  for (int i = 0; i < n; i++) {
    MOE_TRY(check_desc(ctx, code, who, i, &descs[i], &nbytes[i]));
    for (int j = 0; j < i; j++) {
      MOE_FAIL_IF(ctx, strcmp(descs[i].name, descs[j].name) == 0, code,
                  "%s: duplicate tensor name '%s' (tensors %d and %d)", who, descs[i].name, j, i);
    }
    offsets[i] = pos;
    MOE_FAIL_IF(ctx, nbytes[i] >= CK_MAX_BYTES - pos, code,
                "%s: size overflow: tensors up to '%s' total 2^62 bytes or more", who,
                descs[i].name);
    pos = align64_u64(pos + nbytes[i]);
  }
  lay->table_offset = pos;
  const uint64_t tail = (uint64_t)n * CK_ENTRY_BYTES + CK_TABLE_TAIL_BYTES;
  MOE_FAIL_IF(ctx, tail + CK_TRAILER_BYTES >= CK_MAX_BYTES - pos, code,
              "%s: size overflow: the file would be 2^62 bytes or more", who);
  lay->trailer_offset = pos + tail;
  lay->file_size = lay->trailer_offset + CK_TRAILER_BYTES;
done:
  return st;
}

static void encode_header(unsigned char h[CK_HEADER_BYTES], uint64_t config_len, int n,
                          const ck_layout *lay) {
  memset(h, 0, CK_HEADER_BYTES);
  memcpy(h, CK_MAGIC, 8);
  moe_le_put_u32(h + 8, MOE_CKPT_VERSION);
  moe_le_put_u32(h + 12, 0);  // flags
  moe_le_put_u64(h + 16, config_len);
  moe_le_put_u32(h + 24, (uint32_t)n);
  moe_le_put_u32(h + 28, CK_HEADER_BYTES);
  moe_le_put_u64(h + 32, lay->data_offset);
  moe_le_put_u64(h + 40, lay->table_offset);
  moe_le_put_u64(h + 48, lay->file_size);
  moe_le_put_u32(h + 56, 0);  // reserved
  moe_le_put_u32(h + 60, moe_crc32(0, h, 60));
}

static void encode_entry(unsigned char e[CK_ENTRY_BYTES], const moe_ckpt_tensor_desc *d,
                         uint64_t offset, uint64_t bytes, uint32_t crc) {
  memset(e, 0, CK_ENTRY_BYTES);
  memcpy(e, d->name, strnlen(d->name, MOE_CKPT_MAX_NAME));
  moe_le_put_u32(e + 64, (uint32_t)d->dtype);
  moe_le_put_u32(e + 68, (uint32_t)d->ndim);
  for (int k = 0; k < d->ndim; k++) moe_le_put_u64(e + 72 + 8 * k, (uint64_t)d->dims[k]);
  moe_le_put_u64(e + 104, offset);
  moe_le_put_u64(e + 112, bytes);
  moe_le_put_u32(e + 120, crc);
  moe_le_put_u32(e + 124, 0);  // reserved
}

// ---- writer ------------------------------------------------------------------------------

struct moe_ckpt_writer {
  moe_ctx *ctx;
  char *path, *tmp_path;
  int fd;
  int n;
  moe_ckpt_tensor_desc *descs;
  uint64_t *offsets, *nbytes;
  uint32_t *crcs;
  ck_layout lay;
  int cur;               // tensor being written (n when there are none)
  uint64_t cur_written;  // bytes of tensor cur written so far
  uint64_t pos;          // bytes handed to the file so far (buffered ones included)
  uint32_t file_crc;     // CRC of bytes [0, pos)
  int failed;            // an I/O error happened: only abort or a failing commit remain
  unsigned char *buf;
  size_t buf_used;
  uint64_t pause_at;  // test hook: byte count at which to pause (UINT64_MAX: never)
};

static moe_status write_fd(moe_ckpt_writer *w, const unsigned char *p, size_t len) {
  moe_status st = MOE_STATUS_OK;
  while (len > 0) {
    const ssize_t k = write(w->fd, p, len);
    if (k < 0 && errno == EINTR) continue;
    MOE_FAIL_IF(w->ctx, k <= 0, MOE_STATUS_IO,
                "checkpoint %s: writing %s failed: %s; nothing saved, %s unchanged", w->path,
                w->tmp_path, k < 0 ? strerror(errno) : "no progress", w->path);
    p += k;
    len -= (size_t)k;
  }
done:
  if (st != MOE_STATUS_OK) w->failed = 1;
  return st;
}

static moe_status flush_buf(moe_ckpt_writer *w) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(write_fd(w, w->buf, w->buf_used));
  w->buf_used = 0;
done:
  return st;
}

// The test hook: the first N bytes are in the file and on disk; wait to be killed.
static moe_status test_pause(moe_ckpt_writer *w) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(flush_buf(w));
  MOE_FAIL_IF(w->ctx, fsync(w->fd) != 0, MOE_STATUS_IO, "checkpoint %s: fsync failed: %s",
              w->tmp_path, strerror(errno));
  fputs("moe_ckpt: paused\n", stderr);
  fflush(stderr);
  for (int s = 0; s < CK_PAUSE_SECONDS * 10; s++) {
    const struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
done:
  return st;
}

// Appends len bytes (NULL: zeros) to the file through the buffer.
static moe_status out_bytes(moe_ckpt_writer *w, const void *data, size_t len) {
  static const unsigned char zeros[64] = {0};
  moe_status st = MOE_STATUS_OK;
  const unsigned char *p = (const unsigned char *)data;
  while (len > 0) {
    size_t chunk = len;
    if (!p && chunk > sizeof zeros) chunk = sizeof zeros;
    if (chunk > CK_WRITE_BUF - w->buf_used) chunk = CK_WRITE_BUF - w->buf_used;
    if (w->pos < w->pause_at && w->pause_at - w->pos < chunk)
      chunk = (size_t)(w->pause_at - w->pos);
    const unsigned char *src = p ? p : zeros;
    memcpy(w->buf + w->buf_used, src, chunk);
    w->file_crc = moe_crc32(w->file_crc, src, chunk);
    w->buf_used += chunk;
    w->pos += chunk;
    if (p) p += chunk;
    len -= chunk;
    if (w->buf_used == CK_WRITE_BUF) MOE_TRY(flush_buf(w));
    if (w->pos == w->pause_at) MOE_TRY(test_pause(w));
  }
done:
  return st;
}

static moe_status pad_to(moe_ckpt_writer *w, uint64_t offset) {
  return out_bytes(w, NULL, (size_t)(offset - w->pos));
}

static moe_status read_pause_env(moe_ctx *ctx, uint64_t *out) {
  moe_status st = MOE_STATUS_OK;
  *out = UINT64_MAX;
  const char *env = getenv(CK_PAUSE_ENV);
  if (!env || !*env) goto done;
  char *end = NULL;
  errno = 0;
  const unsigned long long v = strtoull(env, &end, 10);
  MOE_FAIL_IF(ctx, errno != 0 || *end != '\0' || env[0] == '-', MOE_STATUS_INVALID_ARG,
              "%s='%s' must be a byte count", CK_PAUSE_ENV, env);
  *out = (uint64_t)v;
done:
  return st;
}

static char *dup_str(const char *s) {
  const size_t n = strlen(s) + 1;
  char *d = moe_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static void writer_free(moe_ckpt_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  moe_free(w->path);
  moe_free(w->tmp_path);
  moe_free(w->descs);
  moe_free(w->offsets);
  moe_free(w->nbytes);
  moe_free(w->crcs);
  moe_free(w->buf);
  moe_free(w);
}

void moe_ckpt_writer_abort(moe_ckpt_writer *w) {
  if (!w) return;
  if (w->fd >= 0) {
    close(w->fd);
    w->fd = -1;
    unlink(w->tmp_path);
  }
  writer_free(w);
}

moe_status moe_ckpt_writer_open(moe_ctx *ctx, const char *path, const char *config_json,
                                const moe_ckpt_tensor_desc *descs, int n, moe_ckpt_writer **out) {
  moe_status st = MOE_STATUS_OK;
  moe_ckpt_writer *w = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "checkpoint writer: out is NULL");
  *out = NULL;
  MOE_FAIL_IF(ctx, !path || !*path, MOE_STATUS_INVALID_ARG, "checkpoint writer: empty path");
  MOE_FAIL_IF(ctx, n < 0 || (n > 0 && !descs), MOE_STATUS_INVALID_ARG,
              "checkpoint %s: %d tensors%s", path, n,
              n < 0 ? " (must be >= 0)" : " but descs is NULL");
  MOE_FAIL_IF(ctx, (uint64_t)n > (UINT64_C(1) << 24), MOE_STATUS_INVALID_ARG,
              "checkpoint %s: %d tensors (at most 2^24)", path, n);
  if (!config_json) config_json = "";
  const size_t config_len = strlen(config_json);
  uint64_t pause_at;
  MOE_TRY(read_pause_env(ctx, &pause_at));

  w = moe_calloc(1, sizeof *w);
  MOE_FAIL_IF(ctx, !w, MOE_STATUS_OUT_OF_MEMORY, "checkpoint %s: out of memory", path);
  w->fd = -1;
  w->ctx = ctx;
  w->n = n;
  w->pause_at = pause_at;
  w->path = dup_str(path);
  const size_t tmp_len = strlen(path) + 32;
  w->tmp_path = moe_malloc(tmp_len);
  w->buf = moe_malloc(CK_WRITE_BUF);
  const size_t nn = n > 0 ? (size_t)n : 1;
  w->descs = moe_calloc(nn, sizeof *w->descs);
  w->offsets = moe_calloc(nn, sizeof *w->offsets);
  w->nbytes = moe_calloc(nn, sizeof *w->nbytes);
  w->crcs = moe_calloc(nn, sizeof *w->crcs);
  MOE_FAIL_IF(
      ctx,
      !w->path || !w->tmp_path || !w->buf || !w->descs || !w->offsets || !w->nbytes || !w->crcs,
      MOE_STATUS_OUT_OF_MEMORY, "checkpoint %s: out of memory", path);
  snprintf(w->tmp_path, tmp_len, "%s.tmp.%ld", path, (long)getpid());
  if (n > 0) memcpy(w->descs, descs, (size_t)n * sizeof *descs);
  for (int i = 0; i < n; i++) {  // canonical: unused dims 0, name NUL-padded
    moe_ckpt_tensor_desc *d = &w->descs[i];
    for (int k = (d->ndim >= 0 && d->ndim <= MOE_CKPT_MAX_DIMS ? d->ndim : MOE_CKPT_MAX_DIMS);
         k < MOE_CKPT_MAX_DIMS; k++) {
      d->dims[k] = 0;
    }
  }
  char who[1100];
  snprintf(who, sizeof who, "checkpoint %s", path);
  MOE_TRY(plan_layout(ctx, MOE_STATUS_INVALID_ARG, who, config_len, w->descs, n, w->offsets,
                      w->nbytes, &w->lay));
  for (int i = 0; i < n; i++) {
    char name[64] = {0};
    memcpy(name, w->descs[i].name, strnlen(w->descs[i].name, MOE_CKPT_MAX_NAME));
    memcpy(w->descs[i].name, name, sizeof name);
  }

  // A temp file with our pid can only be left by a dead process that had our
  // pid (containers restart with the same pids): replace it.
  for (int attempt = 0; attempt < 2 && w->fd < 0; attempt++) {
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0 && errno == EEXIST && attempt == 0)
      unlink(w->tmp_path);
    else if (w->fd < 0)
      break;
  }
  MOE_FAIL_IF(ctx, w->fd < 0, MOE_STATUS_IO, "checkpoint %s: cannot create temp file %s: %s", path,
              w->tmp_path, strerror(errno));

  if (w->pause_at == 0) MOE_TRY(test_pause(w));
  unsigned char h[CK_HEADER_BYTES];
  encode_header(h, config_len, n, &w->lay);
  MOE_TRY(out_bytes(w, h, sizeof h));
  MOE_TRY(out_bytes(w, config_json, config_len));
  MOE_TRY(pad_to(w, w->lay.data_offset));
  w->cur = 0;
  w->cur_written = 0;
  *out = w;
  w = NULL;
done:
  moe_ckpt_writer_abort(w);
  return st;
}

moe_status moe_ckpt_writer_write(moe_ckpt_writer *w, int i, const void *data, size_t bytes) {
  moe_status st = MOE_STATUS_OK;
  if (!w) return MOE_STATUS_INVALID_ARG;
  moe_ctx *ctx = w->ctx;
  MOE_FAIL_IF(ctx, w->failed, MOE_STATUS_IO,
              "checkpoint %s: an earlier write failed; abort this writer", w->path);
  MOE_FAIL_IF(ctx, i < 0 || i >= w->n, MOE_STATUS_INVALID_ARG,
              "checkpoint %s: tensor index %d out of range [0, %d)", w->path, i, w->n);
  if (bytes == 0) goto done;
  MOE_FAIL_IF(ctx, !data, MOE_STATUS_INVALID_ARG, "checkpoint %s: tensor %d ('%s'): data is NULL",
              w->path, i, w->descs[i].name);
  // Moving on to the next tensor: only once the current one is complete.
  if (i == w->cur + 1 && w->cur_written == w->nbytes[w->cur]) {
    MOE_TRY(pad_to(w, w->offsets[i]));
    w->cur = i;
    w->cur_written = 0;
  }
  MOE_FAIL_IF(ctx, i < w->cur, MOE_STATUS_INVALID_ARG,
              "checkpoint %s: tensor %d ('%s') written out of order, after tensor %d ('%s'): "
              "tensors are written in order",
              w->path, i, w->descs[i].name, w->cur, w->descs[w->cur].name);
  MOE_FAIL_IF(ctx, i > w->cur, MOE_STATUS_INVALID_ARG,
              "checkpoint %s: tensor %d ('%s') written out of order: tensor %d ('%s') is "
              "incomplete (%" PRIu64 " of %" PRIu64 " bytes)",
              w->path, i, w->descs[i].name, w->cur, w->descs[w->cur].name, w->cur_written,
              w->nbytes[w->cur]);
  const uint64_t left = w->nbytes[i] - w->cur_written;
  MOE_FAIL_IF(ctx, (uint64_t)bytes > left, MOE_STATUS_INVALID_ARG,
              "checkpoint %s: %zu bytes for tensor %d ('%s') go past its size (%" PRIu64
              " of %" PRIu64 " bytes written)",
              w->path, bytes, i, w->descs[i].name, w->cur_written, w->nbytes[i]);
  w->crcs[i] = moe_crc32(w->crcs[i], data, bytes);
  w->cur_written += bytes;
  MOE_TRY(out_bytes(w, data, bytes));
done:
  return st;
}

static moe_status fsync_dir(moe_ckpt_writer *w) {
  moe_status st = MOE_STATUS_OK;
  char *dir = dup_str(w->path);
  MOE_FAIL_IF(w->ctx, !dir, MOE_STATUS_OUT_OF_MEMORY, "checkpoint %s: out of memory", w->path);
  char *slash = strrchr(dir, '/');
  if (!slash) {
    strcpy(dir, ".");
  } else if (slash == dir) {
    dir[1] = '\0';
  } else {
    *slash = '\0';
  }
  const int dfd = open(dir, O_RDONLY | O_CLOEXEC);
  int err = dfd < 0 ? errno : 0;
  if (dfd >= 0) {
    if (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS) err = errno;  // not supported: fine
    close(dfd);
  }
  MOE_FAIL_IF(w->ctx, err != 0, MOE_STATUS_IO,
              "checkpoint %s: saved and renamed into place, but syncing directory %s failed (%s): "
              "the rename may not survive a power loss",
              w->path, dir, strerror(err));
done:
  moe_free(dir);
  return st;
}

// After a successful save: removes "<path>.tmp.<pid>" files that a killed
// save of the same path left, when <pid> is no live process on this host
// (kill(pid, 0) fails with ESRCH); a save in progress elsewhere is left
// alone. Best effort: a failure here loses nothing.
static void remove_stale_tmps(const moe_ckpt_writer *w) {
  const char *slash = strrchr(w->path, '/');
  const char *base = slash ? slash + 1 : w->path;
  char dir[4096];
  if (!slash) {
    snprintf(dir, sizeof dir, ".");
  } else if (slash == w->path) {
    snprintf(dir, sizeof dir, "/");
  } else {
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - w->path), w->path);
  }
  char prefix[1200];
  const int plen = snprintf(prefix, sizeof prefix, "%s.tmp.", base);
  if (plen <= 0 || (size_t)plen >= sizeof prefix) return;
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strncmp(e->d_name, prefix, (size_t)plen) != 0) continue;
    char *end = NULL;
    errno = 0;
    const long pid = strtol(e->d_name + plen, &end, 10);
    if (errno || !end || *end != '\0' || end == e->d_name + plen || pid <= 0) continue;
    if (pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to know)
    char stale[5400];
    if (snprintf(stale, sizeof stale, "%s/%s", dir, e->d_name) < (int)sizeof stale) unlink(stale);
  }
  closedir(d);
}

moe_status moe_ckpt_writer_commit(moe_ckpt_writer *w) {
  moe_status st = MOE_STATUS_OK;
  int renamed = 0;
  if (!w) return MOE_STATUS_INVALID_ARG;
  moe_ctx *ctx = w->ctx;
  MOE_FAIL_IF(ctx, w->failed, MOE_STATUS_IO,
              "checkpoint %s: an earlier write failed; nothing saved, %s unchanged", w->path,
              w->path);
  for (int i = 0; i < w->n; i++) {
    const uint64_t done_bytes = i < w->cur ? w->nbytes[i] : i == w->cur ? w->cur_written : 0;
    MOE_FAIL_IF(ctx, done_bytes != w->nbytes[i], MOE_STATUS_INVALID_ARG,
                "checkpoint %s: tensor %d ('%s') is incomplete (%" PRIu64 " of %" PRIu64
                " bytes written); nothing saved, %s unchanged",
                w->path, i, w->descs[i].name, done_bytes, w->nbytes[i], w->path);
  }
  // step 1: table (with the data CRCs now known), its CRC, the trailer.
  MOE_TRY(pad_to(w, w->lay.table_offset));
  uint32_t table_crc = 0;
  for (int i = 0; i < w->n; i++) {
    unsigned char e[CK_ENTRY_BYTES];
    encode_entry(e, &w->descs[i], w->offsets[i], w->nbytes[i], w->crcs[i]);
    table_crc = moe_crc32(table_crc, e, sizeof e);
    MOE_TRY(out_bytes(w, e, sizeof e));
  }
  unsigned char tail[CK_TABLE_TAIL_BYTES] = {0};
  moe_le_put_u32(tail, table_crc);
  MOE_TRY(out_bytes(w, tail, sizeof tail));
  unsigned char trailer[CK_TRAILER_BYTES] = {0};
  moe_le_put_u32(trailer, w->file_crc);
  memcpy(trailer + 8, CK_END_MAGIC, 8);
  MOE_TRY(out_bytes(w, trailer, sizeof trailer));
  MOE_FAIL_IF(ctx, w->pos != w->lay.file_size, MOE_STATUS_INTERNAL,
              "checkpoint %s: wrote %" PRIu64 " bytes, planned %" PRIu64, w->path, w->pos,
              w->lay.file_size);
  // step 2: the bytes on disk, then the name: fsync before rename, or a crash
  // could leave path naming a file whose data never reached the disk.
  MOE_TRY(flush_buf(w));
  MOE_FAIL_IF(ctx, fsync(w->fd) != 0, MOE_STATUS_IO, "checkpoint %s: fsync of %s failed: %s",
              w->path, w->tmp_path, strerror(errno));
  const int rc = close(w->fd);
  w->fd = -1;
  MOE_FAIL_IF(ctx, rc != 0, MOE_STATUS_IO, "checkpoint %s: closing %s failed: %s", w->path,
              w->tmp_path, strerror(errno));
  MOE_FAIL_IF(ctx, rename(w->tmp_path, w->path) != 0, MOE_STATUS_IO,
              "checkpoint %s: renaming %s over it failed: %s; %s unchanged", w->path, w->tmp_path,
              strerror(errno), w->path);
  renamed = 1;
  remove_stale_tmps(w);  // a killed earlier save's leftovers
  // step 3: the rename on disk.
  MOE_TRY(fsync_dir(w));
done:
  if (!renamed) {
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    unlink(w->tmp_path);
  }
  writer_free(w);
  return st;
}

// ---- reader ------------------------------------------------------------------------------

struct moe_ckpt_reader {
  moe_ctx *ctx;
  char *path;
  int fd;
  int n;
  char *config;
  size_t config_len;
  moe_ckpt_tensor_desc *descs;
  uint64_t *offsets, *nbytes;
};

void moe_ckpt_reader_close(moe_ckpt_reader *r) {
  if (!r) return;
  if (r->fd >= 0) close(r->fd);
  moe_free(r->path);
  moe_free(r->config);
  moe_free(r->descs);
  moe_free(r->offsets);
  moe_free(r->nbytes);
  moe_free(r);
}

// Reads exactly len bytes at offset; a short read means the file shrank.
static moe_status read_at(moe_ctx *ctx, int fd, const char *path, uint64_t offset, void *dst,
                          size_t len) {
  moe_status st = MOE_STATUS_OK;
  unsigned char *p = dst;
  while (len > 0) {
    const ssize_t k = pread(fd, p, len, (off_t)offset);
    if (k < 0 && errno == EINTR) continue;
    MOE_FAIL_IF(ctx, k < 0, MOE_STATUS_IO, "%s: read failed at byte %" PRIu64 ": %s", path, offset,
                strerror(errno));
    MOE_FAIL_IF(ctx, k == 0, MOE_STATUS_BAD_FORMAT,
                "%s: truncated: file ended at byte %" PRIu64 " while reading (changed while open?)",
                path, offset);
    p += k;
    offset += (uint64_t)k;
    len -= (size_t)k;
  }
done:
  return st;
}

// Decodes and checks table entry i against the layout rebuilt from the
// previous entries; fills r->descs[i], offsets[i], nbytes[i], *crc.
static moe_status decode_entry(moe_ckpt_reader *r, int i, const unsigned char *e,
                               uint64_t expect_off, uint32_t *crc) {
  moe_status st = MOE_STATUS_OK;
  moe_ctx *ctx = r->ctx;
  const moe_status bad = MOE_STATUS_BAD_FORMAT;
  moe_ckpt_tensor_desc *d = &r->descs[i];
  MOE_FAIL_IF(ctx, memchr(e, 0, 64) == NULL, bad, "%s: table entry %d: name is not terminated",
              r->path, i);
  memcpy(d->name, e, 64);
  const size_t len = strlen(d->name);
  for (size_t k = len; k < 64; k++) {
    MOE_FAIL_IF(ctx, e[k] != 0, bad, "%s: table entry %d ('%s'): nonzero bytes after the name",
                r->path, i, d->name);
  }
  const uint32_t dtype = moe_le_get_u32(e + 64), ndim = moe_le_get_u32(e + 68);
  d->dtype = dtype <= 255 ? (int)dtype : 0;
  d->ndim = ndim <= MOE_CKPT_MAX_DIMS ? (int)ndim : 0;
  for (int k = 0; k < MOE_CKPT_MAX_DIMS; k++) {
    const uint64_t v = moe_le_get_u64(e + 72 + 8 * k);
    MOE_FAIL_IF(ctx, v >= CK_MAX_BYTES, bad, "%s: tensor '%s': dims[%d] = %" PRIu64 " is too large",
                r->path, d->name, k, v);
    MOE_FAIL_IF(ctx, k >= d->ndim && d->ndim > 0 && v != 0, bad,
                "%s: tensor '%s': dims[%d] must be 0 past ndim %d", r->path, d->name, k, d->ndim);
    d->dims[k] = (int64_t)v;
  }
  uint64_t bytes = 0;
  MOE_TRY(check_desc(ctx, bad, r->path, i, d, &bytes));
  for (int j = 0; j < i; j++) {
    MOE_FAIL_IF(ctx, strcmp(r->descs[j].name, d->name) == 0, bad,
                "%s: duplicate tensor name '%s' (tensors %d and %d)", r->path, d->name, j, i);
  }
  const uint64_t off = moe_le_get_u64(e + 104), nb = moe_le_get_u64(e + 112);
  MOE_FAIL_IF(ctx, nb != bytes, bad,
              "%s: tensor '%s': table says %" PRIu64 " bytes, its dims make %" PRIu64, r->path,
              d->name, nb, bytes);
  MOE_FAIL_IF(ctx, off != expect_off, bad,
              "%s: tensor '%s': data offset %" PRIu64 ", the layout puts it at %" PRIu64, r->path,
              d->name, off, expect_off);
  MOE_FAIL_IF(ctx, moe_le_get_u32(e + 124) != 0, bad, "%s: tensor '%s': nonzero reserved field",
              r->path, d->name);
  r->offsets[i] = off;
  r->nbytes[i] = nb;
  *crc = moe_le_get_u32(e + 120);
done:
  return st;
}

moe_status moe_ckpt_reader_open(moe_ctx *ctx, const char *path, moe_ckpt_reader **out) {
  moe_status st = MOE_STATUS_OK;
  const moe_status bad = MOE_STATUS_BAD_FORMAT;
  moe_ckpt_reader *r = NULL;
  unsigned char *tab = NULL, *chunk = NULL;
  uint32_t *stored_crc = NULL, *data_crc = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "checkpoint reader: out is NULL");
  *out = NULL;
  MOE_FAIL_IF(ctx, !path || !*path, MOE_STATUS_INVALID_ARG, "checkpoint reader: empty path");
  r = moe_calloc(1, sizeof *r);
  MOE_FAIL_IF(ctx, !r, MOE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
  r->fd = -1;
  r->ctx = ctx;
  r->path = dup_str(path);
  MOE_FAIL_IF(ctx, !r->path, MOE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
  r->fd = open(path, O_RDONLY | O_CLOEXEC);
  MOE_FAIL_IF(ctx, r->fd < 0, MOE_STATUS_IO, "%s: cannot open checkpoint: %s", path,
              strerror(errno));
  struct stat sb;
  MOE_FAIL_IF(ctx, fstat(r->fd, &sb) != 0, MOE_STATUS_IO, "%s: cannot stat: %s", path,
              strerror(errno));
  MOE_FAIL_IF(ctx, !S_ISREG(sb.st_mode), MOE_STATUS_IO, "%s: not a regular file", path);
  const uint64_t have = (uint64_t)sb.st_size;

  // step 1: header: magic, version, checksum, then its sizes against the file.
  unsigned char h[CK_HEADER_BYTES];
  const size_t hlen = have < CK_HEADER_BYTES ? (size_t)have : CK_HEADER_BYTES;
  MOE_TRY(read_at(ctx, r->fd, path, 0, h, hlen));
  MOE_FAIL_IF(ctx, memcmp(h, CK_MAGIC, hlen < 8 ? hlen : 8) != 0, bad,
              "%s: not a libmoe checkpoint (bad magic)", path);
  MOE_FAIL_IF(ctx, have < CK_HEADER_BYTES, bad,
              "%s: truncated: expected at least %u bytes (the header), file has %" PRIu64, path,
              CK_HEADER_BYTES, have);
  const uint32_t version = moe_le_get_u32(h + 8);
  MOE_FAIL_IF(ctx, version != MOE_CKPT_VERSION, bad,
              "%s: checkpoint version %" PRIu32 ", this build reads version %d", path, version,
              MOE_CKPT_VERSION);
  const uint32_t hcrc = moe_crc32(0, h, 60);
  MOE_FAIL_IF(ctx, hcrc != moe_le_get_u32(h + 60), bad,
              "%s: header checksum mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32 ")",
              path, moe_le_get_u32(h + 60), hcrc);
  const uint32_t flags = moe_le_get_u32(h + 12), n = moe_le_get_u32(h + 24);
  const uint64_t config_len = moe_le_get_u64(h + 16);
  MOE_FAIL_IF(ctx, flags != 0, bad, "%s: unknown flags 0x%" PRIx32 " (version 1 has none)", path,
              flags);
  MOE_FAIL_IF(ctx, moe_le_get_u32(h + 28) != CK_HEADER_BYTES || moe_le_get_u32(h + 56) != 0, bad,
              "%s: bad header (header size %" PRIu32 ", reserved %" PRIu32 ")", path,
              moe_le_get_u32(h + 28), moe_le_get_u32(h + 56));
  const uint64_t file_size = moe_le_get_u64(h + 48);
  MOE_FAIL_IF(ctx, have < file_size, bad,
              "%s: truncated: expected %" PRIu64 " bytes, file has %" PRIu64, path, file_size,
              have);
  MOE_FAIL_IF(ctx, have > file_size, bad,
              "%s: trailing data: expected %" PRIu64 " bytes, file has %" PRIu64, path, file_size,
              have);
  MOE_FAIL_IF(ctx, config_len >= file_size || n > file_size / CK_ENTRY_BYTES || n > (1u << 24), bad,
              "%s: inconsistent header: config of %" PRIu64 " bytes and %" PRIu32
              " tensors in a file of %" PRIu64 " bytes",
              path, config_len, n, file_size);
  const uint64_t data_offset = moe_le_get_u64(h + 32), table_offset = moe_le_get_u64(h + 40);
  MOE_FAIL_IF(ctx, data_offset != align64_u64(CK_HEADER_BYTES + config_len), bad,
              "%s: inconsistent header: data offset %" PRIu64 " for a config of %" PRIu64 " bytes",
              path, data_offset, config_len);
  MOE_FAIL_IF(ctx,
              table_offset < data_offset ||
                  file_size - table_offset !=
                      (uint64_t)n * CK_ENTRY_BYTES + CK_TABLE_TAIL_BYTES + CK_TRAILER_BYTES,
              bad,
              "%s: inconsistent header: table at %" PRIu64 " for %" PRIu32
              " tensors in a file of %" PRIu64 " bytes",
              path, table_offset, n, file_size);
  r->n = (int)n;

  // step 2: table and trailer (at the end: they are written last).
  const uint64_t trailer_offset = file_size - CK_TRAILER_BYTES;
  const size_t tab_bytes = (size_t)(file_size - table_offset);
  const size_t nn = n > 0 ? n : 1;
  tab = moe_malloc(tab_bytes);
  r->descs = moe_calloc(nn, sizeof *r->descs);
  r->offsets = moe_calloc(nn, sizeof *r->offsets);
  r->nbytes = moe_calloc(nn, sizeof *r->nbytes);
  stored_crc = moe_calloc(nn, sizeof *stored_crc);
  data_crc = moe_calloc(nn, sizeof *data_crc);
  r->config = moe_malloc((size_t)config_len + 1);
  MOE_FAIL_IF(
      ctx, !tab || !r->descs || !r->offsets || !r->nbytes || !stored_crc || !data_crc || !r->config,
      MOE_STATUS_OUT_OF_MEMORY, "%s: out of memory for the table and config", path);
  MOE_TRY(read_at(ctx, r->fd, path, table_offset, tab, tab_bytes));
  const unsigned char *trailer = tab + (trailer_offset - table_offset);
  const unsigned char *ttail = trailer - CK_TABLE_TAIL_BYTES;
  MOE_FAIL_IF(ctx, memcmp(trailer + 8, CK_END_MAGIC, 8) != 0, bad,
              "%s: bad trailer magic (the file was not completely written)", path);
  MOE_FAIL_IF(ctx, moe_le_get_u32(trailer + 4) != 0, bad,
              "%s: bad trailer (nonzero reserved field)", path);
  const uint32_t tcrc = moe_crc32(0, tab, (size_t)n * CK_ENTRY_BYTES);
  MOE_FAIL_IF(ctx, tcrc != moe_le_get_u32(ttail), bad,
              "%s: tensor table checksum mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32
              ")",
              path, moe_le_get_u32(ttail), tcrc);
  MOE_FAIL_IF(ctx, moe_le_get_u32(ttail + 4) != 0, bad,
              "%s: bad table tail (nonzero reserved field)", path);
  uint64_t expect_off = data_offset;
  for (int i = 0; i < r->n; i++) {
    MOE_TRY(decode_entry(r, i, tab + (size_t)i * CK_ENTRY_BYTES, expect_off, &stored_crc[i]));
    expect_off = align64_u64(r->offsets[i] + r->nbytes[i]);
  }
  MOE_FAIL_IF(ctx, expect_off != table_offset, bad,
              "%s: inconsistent layout: tensor data ends at %" PRIu64 ", table at %" PRIu64, path,
              expect_off, table_offset);

  // step 3: every byte before the trailer once, in chunks: file CRC, each
  // tensor's CRC, and the config.
  chunk = moe_malloc(CK_IO_CHUNK);
  MOE_FAIL_IF(ctx, !chunk, MOE_STATUS_OUT_OF_MEMORY, "%s: out of memory", path);
  uint32_t file_crc = 0;
  int t = 0;  // first tensor not yet entirely behind the chunk
  for (uint64_t pos = 0; pos < trailer_offset;) {
    const uint64_t left = trailer_offset - pos;
    const size_t len = left < CK_IO_CHUNK ? (size_t)left : CK_IO_CHUNK;
    MOE_TRY(read_at(ctx, r->fd, path, pos, chunk, len));
    file_crc = moe_crc32(file_crc, chunk, len);
    const uint64_t end = pos + len;
    const uint64_t cfg_end = CK_HEADER_BYTES + config_len;
    if (pos < cfg_end && end > CK_HEADER_BYTES) {
      const uint64_t a = pos > CK_HEADER_BYTES ? pos : CK_HEADER_BYTES;
      const uint64_t b = end < cfg_end ? end : cfg_end;
      memcpy(r->config + (a - CK_HEADER_BYTES), chunk + (a - pos), (size_t)(b - a));
    }
    for (int i = t; i < r->n && r->offsets[i] < end; i++) {
      const uint64_t a = r->offsets[i] > pos ? r->offsets[i] : pos;
      const uint64_t tend = r->offsets[i] + r->nbytes[i];
      const uint64_t b = tend < end ? tend : end;
      if (b > a) data_crc[i] = moe_crc32(data_crc[i], chunk + (a - pos), (size_t)(b - a));
      if (tend <= end) t = i + 1;
    }
    pos = end;
  }
  for (int i = 0; i < r->n; i++) {
    MOE_FAIL_IF(ctx, data_crc[i] != stored_crc[i], bad,
                "%s: checksum mismatch in tensor '%s' (stored 0x%08" PRIx32
                ", computed 0x%08" PRIx32 "): its data is corrupted",
                path, r->descs[i].name, stored_crc[i], data_crc[i]);
  }
  MOE_FAIL_IF(ctx, file_crc != moe_le_get_u32(trailer), bad,
              "%s: file checksum mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32
              "): the config or padding is corrupted",
              path, moe_le_get_u32(trailer), file_crc);
  r->config[config_len] = '\0';
  r->config_len = (size_t)config_len;
  MOE_FAIL_IF(ctx, strlen(r->config) != r->config_len, bad, "%s: config contains a NUL byte", path);
  *out = r;
  r = NULL;
done:
  moe_free(tab);
  moe_free(chunk);
  moe_free(stored_crc);
  moe_free(data_crc);
  moe_ckpt_reader_close(r);
  return st;
}

const char *moe_ckpt_reader_config(const moe_ckpt_reader *r) { return r ? r->config : NULL; }
size_t moe_ckpt_reader_config_len(const moe_ckpt_reader *r) { return r ? r->config_len : 0; }
int moe_ckpt_reader_num_tensors(const moe_ckpt_reader *r) { return r ? r->n : 0; }

const moe_ckpt_tensor_desc *moe_ckpt_reader_desc(const moe_ckpt_reader *r, int i) {
  return r && i >= 0 && i < r->n ? &r->descs[i] : NULL;
}

int moe_ckpt_reader_find(const moe_ckpt_reader *r, const char *name) {
  if (!r || !name) return -1;
  for (int i = 0; i < r->n; i++) {
    if (strcmp(r->descs[i].name, name) == 0) return i;
  }
  return -1;
}

moe_status moe_ckpt_reader_read(moe_ckpt_reader *r, int i, size_t first_elem, size_t count,
                                void *dst) {
  moe_status st = MOE_STATUS_OK;
  if (!r) return MOE_STATUS_INVALID_ARG;
  moe_ctx *ctx = r->ctx;
  MOE_FAIL_IF(ctx, i < 0 || i >= r->n, MOE_STATUS_INVALID_ARG,
              "%s: tensor index %d out of range [0, %d)", r->path, i, r->n);
  const uint64_t esize = moe_ckpt_dtype_size(r->descs[i].dtype);
  const uint64_t numel = r->nbytes[i] / esize;
  MOE_FAIL_IF(ctx, first_elem > numel || count > numel - first_elem, MOE_STATUS_INVALID_ARG,
              "%s: tensor '%s': elements [%zu, %zu + %zu) out of range (it has %" PRIu64 ")",
              r->path, r->descs[i].name, first_elem, first_elem, count, numel);
  if (count == 0) goto done;
  MOE_FAIL_IF(ctx, !dst, MOE_STATUS_INVALID_ARG, "%s: tensor '%s': dst is NULL", r->path,
              r->descs[i].name);
  MOE_TRY(read_at(ctx, r->fd, r->path, r->offsets[i] + first_elem * esize, dst,
                  (size_t)(count * esize)));
done:
  return st;
}
