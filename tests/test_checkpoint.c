// Tests of checkpoint files (include/moe/checkpoint.h, docs/checkpoint.md):
// CRC-32 known vectors; round trips of f32/i32/u8 tensors of 1-4 dims with an
// empty, a small and a multi-MiB config (crossing the reader's chunks);
// piecewise writes byte-identical to single writes; partial (slice) reads; the
// documented byte layout; every truncation and every single-byte flip of a file
// refused with the right words; wrong magic, version 2, trailing data; writer
// misuse and failed commits leaving the previous file byte-identical and no
// temp file behind; unwritable directories.
//
// Also the driver of tests/checkpoint_kill_test.sh (the CLI is not involved):
//   test_checkpoint --write PATH SEED    writes the checkpoint of SEED
//   test_checkpoint --verify PATH SEED   exits 0 iff PATH opens and holds SEED's
// Normal mode: test_checkpoint DATA_DIR (unused) as every test.
#define _POSIX_C_SOURCE 200809L  // mkdtemp, setenv

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe/checkpoint.h"
#include "moe/core.h"
#include "testutil.h"

static char g_dir[256];  // scratch directory, removed at the end

// ---- helpers ------------------------------------------------------------------

typedef struct {
  int n;
  moe_ckpt_tensor_desc descs[8];
  unsigned char *data[8];
  size_t bytes[8];
  char *config;
} model;

static void model_free(model *m) {
  for (int i = 0; i < m->n; i++) free(m->data[i]);
  free(m->config);
  memset(m, 0, sizeof *m);
}

static void add_tensor(model *m, const char *name, int dtype, int ndim, const int64_t *dims,
                       uint64_t seed) {
  moe_ckpt_tensor_desc *d = &m->descs[m->n];
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->dtype = dtype;
  d->ndim = ndim;
  size_t numel = 1;
  for (int k = 0; k < ndim; k++) {
    d->dims[k] = dims[k];
    numel *= (size_t)dims[k];
  }
  const size_t bytes = numel * moe_ckpt_dtype_size(dtype);
  unsigned char *p = malloc(bytes);
  moe_rng rng;
  moe_rng_init(&rng, seed, (uint64_t)m->n);
  if (dtype == MOE_CKPT_F32) {
    moe_rng_fill_normal(&rng, (float *)p, numel, 0.0f, 1.0f);
  } else if (dtype == MOE_CKPT_I32) {
    for (size_t e = 0; e < numel; e++) {
      const uint32_t u = moe_rng_u32(&rng);
      memcpy(p + 4 * e, &u, 4);
    }
  } else {
    for (size_t e = 0; e < numel; e++) p[e] = (unsigned char)moe_rng_u32(&rng);
  }
  m->data[m->n] = p;
  m->bytes[m->n] = bytes;
  m->n++;
}

// kind 0: small (empty config); 1: small with a short config; 2: big (a 5 MiB
// config and an 8.4 MB tensor, both across the reader's 4 MiB chunks).
static void make_model(model *m, uint64_t seed, int kind) {
  memset(m, 0, sizeof *m);
  if (kind == 2) {
    const size_t len = (size_t)5 << 20;
    m->config = malloc(len + 1);
    size_t pos = (size_t)snprintf(m->config, len + 1, "{\"pad\": \"");
    for (; pos < len - 2; pos++) m->config[pos] = (char)('a' + (pos * 7 + seed) % 26);
    m->config[pos++] = '"';
    m->config[pos++] = '}';
    m->config[pos] = '\0';
  } else {
    m->config = malloc(96);
    if (kind == 0) {
      m->config[0] = '\0';
    } else {
      snprintf(m->config, 96, "{\"seed\": \"%010" PRIu64 "\", \"model\": \"moe-gpt-test\"}", seed);
    }
  }
  const int64_t d_wte[2] = {50, 16}, d_w1[3] = {4, 16, 32}, d_b[1] = {4}, d_4d[4] = {2, 3, 4, 5};
  const int64_t d_step[1] = {1}, d_ids[2] = {3, 7}, d_mask[1] = {13};
  add_tensor(m, "tok_emb", MOE_CKPT_F32, 2, d_wte, seed);
  add_tensor(m, "layers.0.experts.w1", MOE_CKPT_F32, 3, d_w1, seed);  // (E, M, H)
  add_tensor(m, "layers.0.gate.bias", MOE_CKPT_F32, 1, d_b, seed);
  add_tensor(m, "conv4d", MOE_CKPT_F32, 4, d_4d, seed);
  add_tensor(m, "step", MOE_CKPT_I32, 1, d_step, seed);
  add_tensor(m, "ids", MOE_CKPT_I32, 2, d_ids, seed);
  add_tensor(m, "mask", MOE_CKPT_U8, 1, d_mask, seed);
  if (kind == 2) {
    const int64_t d_big[2] = {3, 700001};
    add_tensor(m, "big", MOE_CKPT_F32, 2, d_big, seed);
  }
}

// Writes m to path in pieces of `piece` bytes (0: one write per tensor).
static moe_status save_model(moe_ctx *ctx, const char *path, const model *m, size_t piece) {
  moe_ckpt_writer *w = NULL;
  moe_status st = moe_ckpt_writer_open(ctx, path, m->config, m->descs, m->n, &w);
  if (st != MOE_STATUS_OK) return st;
  for (int i = 0; i < m->n; i++) {
    const size_t step = piece ? piece : m->bytes[i];
    for (size_t off = 0; off < m->bytes[i]; off += step) {
      const size_t len = m->bytes[i] - off < step ? m->bytes[i] - off : step;
      st = moe_ckpt_writer_write(w, i, m->data[i] + off, len);
      if (st != MOE_STATUS_OK) {
        moe_ckpt_writer_abort(w);
        return st;
      }
    }
  }
  return moe_ckpt_writer_commit(w);
}

// 0 if the checkpoint at path holds exactly m; else prints why and returns 1.
static int check_model(moe_ctx *ctx, const char *path, const model *m) {
  moe_ckpt_reader *r = NULL;
  if (moe_ckpt_reader_open(ctx, path, &r) != MOE_STATUS_OK) {
    fprintf(stderr, "cannot open %s: %s\n", path, moe_ctx_error(ctx));
    return 1;
  }
  int bad = 0;
  if (strcmp(moe_ckpt_reader_config(r), m->config) != 0 ||
      moe_ckpt_reader_config_len(r) != strlen(m->config)) {
    fprintf(stderr, "%s: config differs (%zu vs %zu bytes)\n", path, moe_ckpt_reader_config_len(r),
            strlen(m->config));
    bad = 1;
  }
  if (moe_ckpt_reader_num_tensors(r) != m->n) {
    fprintf(stderr, "%s: %d tensors, want %d\n", path, moe_ckpt_reader_num_tensors(r), m->n);
    bad = 1;
  }
  for (int i = 0; !bad && i < m->n; i++) {
    const moe_ckpt_tensor_desc *d = moe_ckpt_reader_desc(r, i);
    const moe_ckpt_tensor_desc *e = &m->descs[i];
    int same = d && strcmp(d->name, e->name) == 0 && d->dtype == e->dtype && d->ndim == e->ndim;
    for (int k = 0; same && k < 4; k++) same = d->dims[k] == (k < e->ndim ? e->dims[k] : 0);
    if (!same || moe_ckpt_reader_find(r, e->name) != i) {
      fprintf(stderr, "%s: tensor %d desc differs from '%s'\n", path, i, e->name);
      bad = 1;
      break;
    }
    const size_t numel = (size_t)moe_ckpt_desc_numel(d);
    unsigned char *got = malloc(m->bytes[i]);
    if (moe_ckpt_reader_read(r, i, 0, numel, got) != MOE_STATUS_OK ||
        memcmp(got, m->data[i], m->bytes[i]) != 0) {
      fprintf(stderr, "%s: tensor '%s' data differs (%s)\n", path, e->name, moe_ctx_error(ctx));
      bad = 1;
    }
    free(got);
  }
  moe_ckpt_reader_close(r);
  return bad;
}

static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
  *len = fread(buf, 1, (size_t)n, f);
  fclose(f);
  return buf;
}

static void spit(const char *path, const unsigned char *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
    exit(1);
  }
  if (len) fwrite(buf, 1, len, f);
  fclose(f);
}

static int exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

static int no_temp_left(const char *path) {
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  return !exists(tmp);
}

static void scratch(char *out, size_t len, const char *name) {
  snprintf(out, len, "%s/%s", g_dir, name);
}

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const unsigned char *p) {
  return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}
static void put32(unsigned char *p, uint32_t v) {
  for (int b = 0; b < 4; b++) p[b] = (unsigned char)(v >> (8 * b));
}

// Checks that an open of path fails with BAD_FORMAT and a message containing
// the path and `word`. Returns 1 if so.
static int expect_open_fails(moe_ctx *ctx, const char *path, const char *word, const char *what) {
  moe_ckpt_reader *r = (moe_ckpt_reader *)&r;  // must be reset to NULL on failure
  const moe_status st = moe_ckpt_reader_open(ctx, path, &r);
  const char *msg = moe_ctx_error(ctx);
  const int ok = st == MOE_STATUS_BAD_FORMAT && r == NULL && strstr(msg, word) != NULL &&
                 strstr(msg, path) != NULL;
  TU_CHECK(ok, "%s: want BAD_FORMAT with '%s' and the path, got %s: %s", what, word,
           moe_status_str(st), msg);
  if (st == MOE_STATUS_OK) moe_ckpt_reader_close(r);
  return ok;
}

// ---- tests --------------------------------------------------------------------

static void test_crc32(void) {
  static const struct {
    const char *text;
    uint32_t crc;
  } v[] = {{"123456789", 0xCBF43926u},
           {"", 0x00000000u},
           {"a", 0xE8B7BE43u},
           {"abc", 0x352441C2u},
           {"The quick brown fox jumps over the lazy dog", 0x414FA339u}};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    const uint32_t got = moe_crc32(0, v[i].text, strlen(v[i].text));
    TU_CHECK(got == v[i].crc, "crc32('%s') = 0x%08" PRIx32 ", want 0x%08" PRIx32, v[i].text, got,
             v[i].crc);
  }
  unsigned char zeros[32] = {0}, ramp[256];
  for (int i = 0; i < 256; i++) ramp[i] = (unsigned char)i;
  TU_CHECK(moe_crc32(0, zeros, 32) == 0x190A55ADu, "crc32(32 zero bytes)");
  TU_CHECK(moe_crc32(0, ramp, 256) == 0x29058C73u, "crc32(0..255)");
  // The 8-bytes-at-a-time path against a bit-at-a-time reference, at every
  // alignment and length near the 8-byte steps.
  unsigned char buf[1200];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131u + 7u);
  for (size_t start = 0; start < 8; start++) {
    for (size_t n = 0; n < sizeof buf - 8; n += (n < 40 ? 1 : 97)) {
      uint32_t ref = 0xFFFFFFFFu;
      for (size_t i = 0; i < n; i++) {
        ref ^= buf[start + i];
        for (int b = 0; b < 8; b++) ref = (ref & 1u) ? (0xEDB88320u ^ (ref >> 1)) : (ref >> 1);
      }
      ref ^= 0xFFFFFFFFu;
      const uint32_t got = moe_crc32(0, buf + start, n);
      TU_CHECK(got == ref, "crc32 of %zu bytes at offset %zu: 0x%08" PRIx32 ", want 0x%08" PRIx32,
               n, start, got, ref);
    }
  }
  for (size_t cut = 0; cut <= 256; cut += 37) {
    TU_CHECK(moe_crc32(moe_crc32(0, ramp, cut), ramp + cut, 256 - cut) == 0x29058C73u,
             "crc32 continued at %zu", cut);
  }
}

static void test_roundtrip(moe_ctx *ctx) {
  for (int kind = 0; kind < 3; kind++) {
    model m;
    make_model(&m, 11 + (uint64_t)kind, kind);
    char path[512];
    scratch(path, sizeof path, "rt.ckpt");
    const moe_status st = save_model(ctx, path, &m, 0);
    TU_CHECK(st == MOE_STATUS_OK, "save kind %d: %s", kind, moe_ctx_error(ctx));
    TU_CHECK(check_model(ctx, path, &m) == 0, "round trip kind %d", kind);
    TU_CHECK(no_temp_left(path), "temp file left after commit (kind %d)", kind);
    model_free(&m);
  }
  // No tensors at all: a config-only checkpoint.
  char path[512];
  scratch(path, sizeof path, "empty.ckpt");
  moe_ckpt_writer *w = NULL;
  TU_CHECK(moe_ckpt_writer_open(ctx, path, "{}", NULL, 0, &w) == MOE_STATUS_OK, "open n=0: %s",
           moe_ctx_error(ctx));
  TU_CHECK(moe_ckpt_writer_commit(w) == MOE_STATUS_OK, "commit n=0: %s", moe_ctx_error(ctx));
  moe_ckpt_reader *r = NULL;
  TU_CHECK(moe_ckpt_reader_open(ctx, path, &r) == MOE_STATUS_OK, "read n=0: %s",
           moe_ctx_error(ctx));
  if (r) {
    TU_CHECK(moe_ckpt_reader_num_tensors(r) == 0 && strcmp(moe_ckpt_reader_config(r), "{}") == 0,
             "n=0 content");
    TU_CHECK(moe_ckpt_reader_desc(r, 0) == NULL && moe_ckpt_reader_find(r, "x") == -1,
             "n=0 lookups");
  }
  moe_ckpt_reader_close(r);
  moe_ckpt_reader_close(NULL);
}

// The byte layout docs/checkpoint.md promises, read back with plain decoding.
static void test_layout(moe_ctx *ctx) {
  model m;
  make_model(&m, 5, 1);
  char path[512];
  scratch(path, sizeof path, "layout.ckpt");
  TU_CHECK(save_model(ctx, path, &m, 0) == MOE_STATUS_OK, "save: %s", moe_ctx_error(ctx));
  size_t len = 0;
  unsigned char *f = slurp(path, &len);
  TU_CHECK(f && len > 64 + 16, "file read back");
  if (!f || len <= 80) return;
  const uint64_t config_len = le64(f + 16), data_off = le64(f + 32), table_off = le64(f + 40);
  const uint32_t n = le32(f + 24);
  TU_CHECK(memcmp(f, "MOECKPT\0", 8) == 0 && le32(f + 8) == 1 && le32(f + 12) == 0, "magic");
  TU_CHECK(config_len == strlen(m.config) && memcmp(f + 64, m.config, config_len) == 0, "config");
  TU_CHECK(n == (uint32_t)m.n && le32(f + 28) == 64 && le64(f + 48) == len, "header sizes");
  TU_CHECK(le32(f + 60) == moe_crc32(0, f, 60), "header crc");
  TU_CHECK(data_off == ((64 + config_len + 63) & ~(uint64_t)63), "data offset %" PRIu64, data_off);
  TU_CHECK(table_off + n * 128u + 8 + 16 == len, "table offset");
  for (uint32_t i = 0; i < n && table_off + n * 128u + 8 <= len; i++) {
    const unsigned char *e = f + table_off + 128 * i;
    const uint64_t off = le64(e + 104), nb = le64(e + 112);
    TU_CHECK(strcmp((const char *)e, m.descs[i].name) == 0, "entry %u name", i);
    TU_CHECK(off % 64 == 0 && nb == m.bytes[i] && memcmp(f + off, m.data[i], nb) == 0,
             "entry %u data at %" PRIu64, i, off);
    TU_CHECK(le32(e + 120) == moe_crc32(0, m.data[i], m.bytes[i]), "entry %u crc", i);
  }
  TU_CHECK(le32(f + table_off + 128 * n) == moe_crc32(0, f + table_off, 128 * n), "table crc");
  TU_CHECK(le32(f + len - 16) == moe_crc32(0, f, len - 16), "file crc");
  TU_CHECK(memcmp(f + len - 8, "MOEEND\0\0", 8) == 0, "end magic");
  free(f);
  model_free(&m);
}

static void test_pieces(moe_ctx *ctx) {
  model m;
  make_model(&m, 21, 1);
  char whole[512], part[512];
  scratch(whole, sizeof whole, "whole.ckpt");
  TU_CHECK(save_model(ctx, whole, &m, 0) == MOE_STATUS_OK, "save whole: %s", moe_ctx_error(ctx));
  size_t n0 = 0;
  unsigned char *ref = slurp(whole, &n0);
  const size_t pieces[] = {1, 3, 7, 64, 1000};
  for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
    scratch(part, sizeof part, "part.ckpt");
    TU_CHECK(save_model(ctx, part, &m, pieces[p]) == MOE_STATUS_OK, "save pieces of %zu: %s",
             pieces[p], moe_ctx_error(ctx));
    size_t n1 = 0;
    unsigned char *got = slurp(part, &n1);
    TU_CHECK(got && n1 == n0 && memcmp(got, ref, n0) == 0,
             "pieces of %zu bytes: file differs from the single-write file", pieces[p]);
    free(got);
  }
  // Zero-byte writes are no-ops, even between pieces.
  moe_ckpt_writer *w = NULL;
  TU_CHECK(moe_ckpt_writer_open(ctx, part, m.config, m.descs, m.n, &w) == MOE_STATUS_OK, "open");
  for (int i = 0; w && i < m.n; i++) {
    TU_CHECK(moe_ckpt_writer_write(w, i, NULL, 0) == MOE_STATUS_OK, "empty write");
    TU_CHECK(moe_ckpt_writer_write(w, i, m.data[i], m.bytes[i]) == MOE_STATUS_OK, "write");
  }
  TU_CHECK(moe_ckpt_writer_commit(w) == MOE_STATUS_OK, "commit: %s", moe_ctx_error(ctx));
  size_t n2 = 0;
  unsigned char *got = slurp(part, &n2);
  TU_CHECK(got && n2 == n0 && memcmp(got, ref, n0) == 0, "zero-byte writes changed the file");
  free(got);
  free(ref);
  model_free(&m);
}

static void test_partial_reads(moe_ctx *ctx) {
  model m;
  make_model(&m, 31, 2);
  char path[512];
  scratch(path, sizeof path, "slices.ckpt");
  TU_CHECK(save_model(ctx, path, &m, 0) == MOE_STATUS_OK, "save: %s", moe_ctx_error(ctx));
  moe_ckpt_reader *r = NULL;
  TU_CHECK(moe_ckpt_reader_open(ctx, path, &r) == MOE_STATUS_OK, "open: %s", moe_ctx_error(ctx));
  if (!r) return;
  // Experts 1..2 of the (E=4, M=16, H=32) tensor, as a rank with 2 experts reads them.
  const int w1 = moe_ckpt_reader_find(r, "layers.0.experts.w1");
  TU_CHECK(w1 == 1, "find w1: %d", w1);
  const size_t mh = 16 * 32;
  float slice[2 * 16 * 32];
  TU_CHECK(moe_ckpt_reader_read(r, w1, 1 * mh, 2 * mh, slice) == MOE_STATUS_OK, "slice: %s",
           moe_ctx_error(ctx));
  tu_allclose("experts 1..2", slice, (const float *)m.data[1] + mh, 2 * mh, 0.0, 0.0);
  // Random ranges of every tensor, byte-compared.
  moe_rng rng;
  moe_rng_init(&rng, 99, 0);
  for (int i = 0; i < m.n; i++) {
    const size_t es = moe_ckpt_dtype_size(m.descs[i].dtype);
    const size_t numel = m.bytes[i] / es;
    unsigned char *buf = malloc(m.bytes[i]);
    for (int trial = 0; trial < 8; trial++) {
      const size_t first = moe_rng_u32(&rng) % (numel + 1);
      const size_t count = moe_rng_u32(&rng) % (numel - first + 1);
      const moe_status st = moe_ckpt_reader_read(r, i, first, count, count ? buf : NULL);
      TU_CHECK(st == MOE_STATUS_OK && memcmp(buf, m.data[i] + first * es, count * es) == 0,
               "tensor %d elements [%zu, +%zu): %s", i, first, count, moe_ctx_error(ctx));
    }
    // Out of range: past the end, overlapping the end, a bad index.
    TU_CHECK(moe_ckpt_reader_read(r, i, numel + 1, 0, buf) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "out of range"),
             "first past the end accepted: %s", moe_ctx_error(ctx));
    TU_CHECK(moe_ckpt_reader_read(r, i, numel - 1, 2, buf) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), m.descs[i].name),
             "range over the end accepted: %s", moe_ctx_error(ctx));
    TU_CHECK(moe_ckpt_reader_read(r, i, 1, SIZE_MAX, buf) == MOE_STATUS_INVALID_ARG,
             "huge count accepted");
    free(buf);
  }
  float x;
  TU_CHECK(moe_ckpt_reader_read(r, m.n, 0, 1, &x) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "out of range"),
           "bad tensor index accepted");
  TU_CHECK(moe_ckpt_reader_read(r, -1, 0, 1, &x) == MOE_STATUS_INVALID_ARG, "index -1 accepted");
  moe_ckpt_reader_close(r);
  model_free(&m);
}

// The reader keeps reading the file it validated when a new one is renamed over
// the path (a rank reading while rank 0 saves the next checkpoint).
static void test_reader_keeps_file(moe_ctx *ctx) {
  model a, b;
  make_model(&a, 41, 1);
  make_model(&b, 42, 1);
  char path[512];
  scratch(path, sizeof path, "keep.ckpt");
  TU_CHECK(save_model(ctx, path, &a, 0) == MOE_STATUS_OK, "save a");
  moe_ckpt_reader *r = NULL;
  TU_CHECK(moe_ckpt_reader_open(ctx, path, &r) == MOE_STATUS_OK, "open a");
  TU_CHECK(save_model(ctx, path, &b, 0) == MOE_STATUS_OK, "save b over a");
  if (r) {
    float got[50 * 16];
    TU_CHECK(moe_ckpt_reader_read(r, 0, 0, 50 * 16, got) == MOE_STATUS_OK, "read");
    TU_CHECK(memcmp(got, a.data[0], sizeof got) == 0, "the open reader sees the old file");
  }
  moe_ckpt_reader_close(r);
  TU_CHECK(check_model(ctx, path, &b) == 0, "path holds b");
  model_free(&a);
  model_free(&b);
}

// Byte positions to damage in a file: all of them for a small file; for a big
// one, the first 80 and the last 40 bytes (header, config start, table end,
// trailer), and the first, middle and last bytes of the config, of every
// tensor, of the padding after it and of every table entry.
static size_t sample_positions(const unsigned char *f, size_t len, int all, size_t *pos) {
  size_t n = 0;
  if (all) {
    for (size_t at = 0; at < len; at++) pos[n++] = at;
    return n;
  }
  const uint64_t cfg_end = 64 + le64(f + 16), data_off = le64(f + 32), table_off = le64(f + 40);
  const uint32_t nt = le32(f + 24);
  for (size_t at = 0; at < 80; at++) pos[n++] = at;
  for (size_t at = len - 40; at < len; at++) pos[n++] = at;
  pos[n++] = (size_t)(64 + cfg_end) / 2;
  pos[n++] = (size_t)cfg_end - 1;
  if (data_off > cfg_end) pos[n++] = (size_t)cfg_end;  // padding
  for (uint32_t i = 0; i < nt; i++) {
    const unsigned char *e = f + table_off + 128u * i;
    const uint64_t off = le64(e + 104), nb = le64(e + 112);
    pos[n++] = (size_t)off;
    pos[n++] = (size_t)(off + nb / 2);
    pos[n++] = (size_t)(off + nb - 1);
    if ((off + nb) % 64) pos[n++] = (size_t)(off + nb);  // padding after it
    pos[n++] = (size_t)(table_off + 128u * i);
    pos[n++] = (size_t)(table_off + 128u * i + 100);
  }
  return n;
}

static void copy_file(const char *from, const char *to) {
  size_t len = 0;
  unsigned char *f = slurp(from, &len);
  spit(to, f, len);
  free(f);
}

// Every prefix of a small file, and sampled prefixes of a big one (cut from
// the end, in place), is refused as truncated: never a crash or a partial load.
static void test_truncation(moe_ctx *ctx) {
  for (int kind = 0; kind < 3; kind += 2) {
    model m;
    make_model(&m, 51, kind);
    char path[512], cut[512];
    scratch(path, sizeof path, "trunc.ckpt");
    scratch(cut, sizeof cut, "trunc_cut.ckpt");
    TU_CHECK(save_model(ctx, path, &m, 0) == MOE_STATUS_OK, "save");
    size_t len = 0;
    unsigned char *f = slurp(path, &len);
    size_t *pos = malloc((len + 1000) * sizeof *pos);
    const size_t np = sample_positions(f, len, kind == 0, pos);
    copy_file(path, cut);
    const int failures_before = tu_failures;
    size_t done = 0;
    for (size_t j = np; j-- > 0 && tu_failures - failures_before < 5;) {
      if (j + 1 < np && pos[j] >= pos[j + 1]) continue;  // descending, distinct
      TU_CHECK(truncate(cut, (off_t)pos[j]) == 0, "truncate: %s", strerror(errno));
      char what[64];
      snprintf(what, sizeof what, "truncated to %zu of %zu bytes", pos[j], len);
      expect_open_fails(ctx, cut, "truncated", what);
      if (pos[j] >= 64) {
        char want[128];
        snprintf(want, sizeof want, "truncated: expected %zu bytes, file has %zu", len, pos[j]);
        TU_CHECK(strstr(moe_ctx_error(ctx), want) != NULL, "message: %s", moe_ctx_error(ctx));
      }
      done++;
    }
    TU_CHECK(done > (kind == 0 ? len - 1 : 100), "only %zu truncations tried", done);
    // Trailing garbage is refused as well.
    copy_file(path, cut);
    FILE *a = fopen(cut, "ab");
    fputc(0, a);
    fclose(a);
    expect_open_fails(ctx, cut, "trailing data", "one byte appended");
    free(pos);
    free(f);
    model_free(&m);
  }
}

static void flip_byte(const char *path, size_t at, unsigned mask) {
  FILE *f = fopen(path, "r+b");
  fseek(f, (long)at, SEEK_SET);
  const int c = fgetc(f);
  fseek(f, (long)at, SEEK_SET);
  fputc((int)((unsigned)c ^ mask), f);
  fclose(f);
}

// Flips one byte at every position of a small file (sampled positions of a big
// one) and checks the error names the part that is damaged.
static void test_corruption(moe_ctx *ctx) {
  for (int kind = 1; kind < 3; kind++) {
    model m;
    make_model(&m, 61, kind);
    char path[512], bad[512];
    scratch(path, sizeof path, "flip.ckpt");
    scratch(bad, sizeof bad, "flip_bad.ckpt");
    TU_CHECK(save_model(ctx, path, &m, 0) == MOE_STATUS_OK, "save");
    size_t len = 0;
    unsigned char *f = slurp(path, &len);
    const uint64_t table_off = le64(f + 40);
    const uint64_t cfg_end = 64 + le64(f + 16);
    size_t *pos = malloc((len + 1000) * sizeof *pos);
    const size_t np = sample_positions(f, len, kind == 1, pos);
    copy_file(path, bad);
    const int failures_before = tu_failures;
    for (size_t j = 0; j < np && tu_failures - failures_before < 5; j++) {
      const size_t at = pos[j];
      // What the error must say about a flip at `at`.
      const char *word = "file checksum";  // config, padding, trailer CRC
      char tensor_word[128];
      if (at < 8) {
        word = "bad magic";
      } else if (at < 12) {
        word = "checkpoint version";
      } else if (at < 64) {
        word = "header checksum";
      } else if (at >= table_off && at < table_off + 128u * (size_t)m.n + 4) {
        word = "table checksum";
      } else if (at >= table_off + 128u * (size_t)m.n + 4 && at < len - 16) {
        word = "table tail";
      } else if (at >= len - 12 && at < len - 8) {
        word = "bad trailer";
      } else if (at >= len - 8) {
        word = "trailer magic";
      } else if (at >= cfg_end && at < table_off) {
        for (int i = 0; i < m.n; i++) {
          const uint64_t off = le64(f + table_off + 128u * (size_t)i + 104);
          if (at >= off && at < off + m.bytes[i]) {
            snprintf(tensor_word, sizeof tensor_word, "checksum mismatch in tensor '%s'",
                     m.descs[i].name);
            word = tensor_word;
          }
        }
      }
      flip_byte(bad, at, 0x01);
      char what[96];
      snprintf(what, sizeof what, "byte %zu of %zu flipped", at, len);
      expect_open_fails(ctx, bad, word, what);
      flip_byte(bad, at, 0x01);
    }
    TU_CHECK(check_model(ctx, bad, &m) == 0, "every flip was undone");
    // A whole byte inverted in the middle of the last tensor.
    const size_t mid =
        (size_t)le64(f + table_off + 128u * (size_t)(m.n - 1) + 104) + m.bytes[m.n - 1] / 2;
    flip_byte(bad, mid, 0xFF);
    expect_open_fails(ctx, bad, m.descs[m.n - 1].name, "byte inverted in the last tensor");
    free(pos);
    free(f);
    model_free(&m);
  }
}

static void test_foreign_files(moe_ctx *ctx) {
  model m;
  make_model(&m, 71, 1);
  char path[512], bad[512];
  scratch(path, sizeof path, "foreign.ckpt");
  scratch(bad, sizeof bad, "foreign_bad.ckpt");
  TU_CHECK(save_model(ctx, path, &m, 0) == MOE_STATUS_OK, "save");
  size_t len = 0;
  unsigned char *f = slurp(path, &len);
  // Wrong magic (a different file type with a valid everything else).
  unsigned char *g = malloc(len);
  memcpy(g, f, len);
  memcpy(g, "GGUF\0\0\0\0", 8);
  spit(bad, g, len);
  expect_open_fails(ctx, bad, "bad magic", "wrong magic");
  spit(bad, (const unsigned char *)"hello", 5);
  expect_open_fails(ctx, bad, "bad magic", "short text file");
  spit(bad, (const unsigned char *)"MOEC", 4);
  expect_open_fails(ctx, bad, "truncated", "4 bytes of magic");
  spit(bad, NULL, 0);
  expect_open_fails(ctx, bad, "truncated", "empty file");
  // Version 2 with a correct header checksum: a future file.
  memcpy(g, f, len);
  put32(g + 8, 2);
  put32(g + 60, moe_crc32(0, g, 60));
  spit(bad, g, len);
  expect_open_fails(ctx, bad, "checkpoint version 2, this build reads version 1", "version 2");
  // Unknown flags with a correct header checksum.
  memcpy(g, f, len);
  put32(g + 12, 1);
  put32(g + 60, moe_crc32(0, g, 60));
  spit(bad, g, len);
  expect_open_fails(ctx, bad, "flags", "flags 1");
  free(g);
  free(f);
  // Missing file and a directory: IO errors naming the path.
  char missing[512];
  scratch(missing, sizeof missing, "no_such.ckpt");
  moe_ckpt_reader *r = NULL;
  TU_CHECK(moe_ckpt_reader_open(ctx, missing, &r) == MOE_STATUS_IO && !r &&
               strstr(moe_ctx_error(ctx), missing) && strstr(moe_ctx_error(ctx), "cannot open"),
           "missing file: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_ckpt_reader_open(ctx, g_dir, &r) == MOE_STATUS_IO && !r &&
               strstr(moe_ctx_error(ctx), "not a regular file"),
           "directory: %s", moe_ctx_error(ctx));
  model_free(&m);
}

// Opens a writer with one bad desc; checks the message and that nothing is left.
static void expect_bad_descs(moe_ctx *ctx, const char *path, const moe_ckpt_tensor_desc *descs,
                             int n, const char *word, const char *what) {
  moe_ckpt_writer *w = (moe_ckpt_writer *)&w;
  const moe_status st = moe_ckpt_writer_open(ctx, path, "{}", descs, n, &w);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG && w == NULL && strstr(moe_ctx_error(ctx), word),
           "%s: want INVALID_ARG with '%s', got %s: %s", what, word, moe_status_str(st),
           moe_ctx_error(ctx));
  TU_CHECK(no_temp_left(path), "%s: temp file left", what);
  if (st == MOE_STATUS_OK) moe_ckpt_writer_abort(w);
}

static void test_bad_descs(moe_ctx *ctx) {
  char path[512];
  scratch(path, sizeof path, "descs.ckpt");
  moe_ckpt_tensor_desc d[2];
  const moe_ckpt_tensor_desc good = {"w", MOE_CKPT_F32, 2, {3, 4, 0, 0}};
  d[0] = good;
  d[1] = good;
  snprintf(d[1].name, sizeof d[1].name, "v");
  d[1].name[0] = '\0';
  expect_bad_descs(ctx, path, d, 2, "tensor 1 has an empty name", "empty name");
  d[1] = good;
  expect_bad_descs(ctx, path, d, 2, "duplicate tensor name 'w'", "duplicate");
  d[1] = good;
  memset(d[1].name, 'x', sizeof d[1].name);  // 64 characters, no NUL
  expect_bad_descs(ctx, path, d, 2, "longer than 63", "too long name");
  d[1] = good;
  d[1].ndim = 0;
  expect_bad_descs(ctx, path, d, 2, "ndim (0) must be in [1, 4]", "ndim 0");
  d[1].ndim = 5;
  expect_bad_descs(ctx, path, d, 2, "ndim (5)", "ndim 5");
  d[1] = good;
  d[1].dims[1] = 0;
  expect_bad_descs(ctx, path, d, 2, "dims[1] (0) must be > 0", "dim 0");
  d[1].dims[1] = -3;
  expect_bad_descs(ctx, path, d, 2, "dims[1] (-3)", "negative dim");
  d[1] = good;
  d[1].dtype = 0;
  expect_bad_descs(ctx, path, d, 2, "unknown dtype 0", "dtype 0");
  d[1] = good;
  d[1].ndim = 3;
  d[1].dims[0] = d[1].dims[1] = d[1].dims[2] = (int64_t)1 << 30;
  expect_bad_descs(ctx, path, d, 2, "size overflow", "overflowing dims");
  d[1] = good;
  expect_bad_descs(ctx, path, d, -1, "must be >= 0", "negative count");
  expect_bad_descs(ctx, path, NULL, 2, "descs is NULL", "NULL descs");
  // A 63-character name is fine, and dims past ndim are ignored.
  d[1] = good;
  memset(d[1].name, 'y', 63);
  d[1].name[63] = '\0';
  d[1].ndim = 1;
  d[1].dims[1] = -7;
  moe_ckpt_writer *w = NULL;
  TU_CHECK(moe_ckpt_writer_open(ctx, path, NULL, d, 2, &w) == MOE_STATUS_OK, "63-char name: %s",
           moe_ctx_error(ctx));
  float data[12] = {0};
  TU_CHECK(moe_ckpt_writer_write(w, 0, data, sizeof data) == MOE_STATUS_OK, "write 0");
  TU_CHECK(moe_ckpt_writer_write(w, 1, data, 3 * sizeof(float)) == MOE_STATUS_OK, "write 1");
  TU_CHECK(moe_ckpt_writer_commit(w) == MOE_STATUS_OK, "commit: %s", moe_ctx_error(ctx));
  moe_ckpt_reader *r = NULL;
  TU_CHECK(moe_ckpt_reader_open(ctx, path, &r) == MOE_STATUS_OK, "reopen: %s", moe_ctx_error(ctx));
  if (r) {
    const moe_ckpt_tensor_desc *e = moe_ckpt_reader_desc(r, 1);
    TU_CHECK(strlen(e->name) == 63 && e->ndim == 1 && e->dims[0] == 3 && e->dims[1] == 0,
             "63-char tensor desc read back");
    TU_CHECK(strcmp(moe_ckpt_reader_config(r), "") == 0, "NULL config reads as empty");
  }
  moe_ckpt_reader_close(r);
}

// Writer misuse and failed commits: the previous file at the path is unchanged
// byte for byte and the temp file is gone.
static void test_writer_misuse(moe_ctx *ctx) {
  model m;
  make_model(&m, 81, 1);
  char path[512];
  scratch(path, sizeof path, "misuse.ckpt");
  TU_CHECK(save_model(ctx, path, &m, 0) == MOE_STATUS_OK, "save");
  size_t len0 = 0;
  unsigned char *before = slurp(path, &len0);
  moe_ckpt_writer *w = NULL;

  // Out of order, too many bytes, then commit with an incomplete tensor.
  TU_CHECK(moe_ckpt_writer_open(ctx, path, "{}", m.descs, m.n, &w) == MOE_STATUS_OK, "open");
  TU_CHECK(moe_ckpt_writer_write(w, 1, m.data[1], 4) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "out of order") &&
               strstr(moe_ctx_error(ctx), "('tok_emb') is incomplete (0 of 3200 bytes)"),
           "tensor 1 before tensor 0: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_ckpt_writer_write(w, 0, m.data[0], m.bytes[0] + 1) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "go past its size"),
           "too many bytes: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_ckpt_writer_write(w, 0, m.data[0], 100) == MOE_STATUS_OK, "first piece");
  TU_CHECK(moe_ckpt_writer_write(w, 0, m.data[0], m.bytes[0]) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "(100 of 3200 bytes written)"),
           "piece past the end: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_ckpt_writer_write(w, 0, m.data[0] + 100, m.bytes[0] - 100) == MOE_STATUS_OK,
           "rest of tensor 0 (the writer is still usable after misuse)");
  TU_CHECK(moe_ckpt_writer_write(w, 0, m.data[0], 1) == MOE_STATUS_INVALID_ARG,
           "tensor 0 past its size");
  TU_CHECK(moe_ckpt_writer_write(w, 1, m.data[1], 8) == MOE_STATUS_OK, "tensor 1 starts");
  TU_CHECK(moe_ckpt_writer_write(w, 0, m.data[0], 1) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "written out of order, after tensor 1"),
           "back to tensor 0: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_ckpt_writer_write(w, 9, m.data[0], 1) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "out of range"),
           "tensor 9: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_ckpt_writer_commit(w) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "tensor 1 ('layers.0.experts.w1') is incomplete") &&
               strstr(moe_ctx_error(ctx), "unchanged"),
           "commit with an incomplete tensor: %s", moe_ctx_error(ctx));
  size_t len1 = 0;
  unsigned char *after = slurp(path, &len1);
  TU_CHECK(after && len1 == len0 && memcmp(after, before, len0) == 0,
           "previous checkpoint changed by a failed commit");
  free(after);
  TU_CHECK(no_temp_left(path), "temp file left after a failed commit");

  // Commit with the last tensor missing entirely.
  TU_CHECK(moe_ckpt_writer_open(ctx, path, "{}", m.descs, m.n, &w) == MOE_STATUS_OK, "open");
  for (int i = 0; i + 1 < m.n; i++) moe_ckpt_writer_write(w, i, m.data[i], m.bytes[i]);
  TU_CHECK(moe_ckpt_writer_commit(w) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "('mask') is incomplete (0 of 13"),
           "commit without the last tensor: %s", moe_ctx_error(ctx));
  TU_CHECK(no_temp_left(path), "temp file left");

  // Abort: nothing changes.
  TU_CHECK(moe_ckpt_writer_open(ctx, path, "{}", m.descs, m.n, &w) == MOE_STATUS_OK, "open");
  moe_ckpt_writer_write(w, 0, m.data[0], m.bytes[0]);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  TU_CHECK(exists(tmp), "the temp file is where the header says: %s", tmp);
  moe_ckpt_writer_abort(w);
  moe_ckpt_writer_abort(NULL);
  TU_CHECK(no_temp_left(path), "temp file left after abort");
  after = slurp(path, &len1);
  TU_CHECK(after && len1 == len0 && memcmp(after, before, len0) == 0, "changed by abort");
  free(after);

  // A stale temp file of a dead process that had our pid is replaced.
  spit(tmp, (const unsigned char *)"stale", 5);
  TU_CHECK(save_model(ctx, path, &m, 0) == MOE_STATUS_OK, "save over a stale temp file: %s",
           moe_ctx_error(ctx));
  TU_CHECK(check_model(ctx, path, &m) == 0 && no_temp_left(path), "stale temp replaced");

  // Commit that fails at the rename (path is a directory): temp removed.
  char dirpath[512];
  scratch(dirpath, sizeof dirpath, "is_a_dir.ckpt");
  mkdir(dirpath, 0755);
  TU_CHECK(save_model(ctx, dirpath, &m, 0) == MOE_STATUS_IO &&
               strstr(moe_ctx_error(ctx), "renaming") && strstr(moe_ctx_error(ctx), "unchanged"),
           "rename over a directory: %s", moe_ctx_error(ctx));
  TU_CHECK(no_temp_left(dirpath), "temp file left after a failed rename");
  rmdir(dirpath);

  // Unwritable or missing directories.
  char sub[512];
  scratch(sub, sizeof sub, "no_such_dir/x.ckpt");
  TU_CHECK(moe_ckpt_writer_open(ctx, sub, "{}", m.descs, m.n, &w) == MOE_STATUS_IO && !w &&
               strstr(moe_ctx_error(ctx), "cannot create temp file") &&
               strstr(moe_ctx_error(ctx), sub),
           "missing directory: %s", moe_ctx_error(ctx));
  scratch(sub, sizeof sub, "misuse.ckpt/x.ckpt");  // under a regular file
  TU_CHECK(moe_ckpt_writer_open(ctx, sub, "{}", m.descs, m.n, &w) == MOE_STATUS_IO && !w,
           "directory that is a file: %s", moe_ctx_error(ctx));
  if (geteuid() != 0) {  // root writes anywhere
    char ro[512];
    scratch(ro, sizeof ro, "readonly");
    mkdir(ro, 0500);
    scratch(sub, sizeof sub, "readonly/x.ckpt");
    TU_CHECK(moe_ckpt_writer_open(ctx, sub, "{}", m.descs, m.n, &w) == MOE_STATUS_IO && !w,
             "read-only directory: %s", moe_ctx_error(ctx));
    rmdir(ro);
  }
  // The test hook's variable is checked.
  setenv("MOE_CKPT_TEST_PAUSE_AFTER_BYTES", "12x", 1);
  TU_CHECK(moe_ckpt_writer_open(ctx, path, "{}", m.descs, m.n, &w) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "MOE_CKPT_TEST_PAUSE_AFTER_BYTES"),
           "bad pause variable: %s", moe_ctx_error(ctx));
  unsetenv("MOE_CKPT_TEST_PAUSE_AFTER_BYTES");
  TU_CHECK(moe_ckpt_writer_commit(NULL) == MOE_STATUS_INVALID_ARG, "commit(NULL)");
  TU_CHECK(moe_ckpt_writer_write(NULL, 0, m.data[0], 1) == MOE_STATUS_INVALID_ARG, "write(NULL)");

  TU_CHECK(check_model(ctx, path, &m) == 0, "the checkpoint survived every misuse");
  free(before);
  model_free(&m);
}

// ---- driver for checkpoint_kill_test.sh -------------------------------------------------

// A disk that fills up while saving (emulated with RLIMIT_FSIZE in a child
// process: writes past the limit fail with EFBIG, as past a full file system
// with ENOSPC): the save fails with an IO error naming the problem, the
// previous checkpoint stays intact and no temporary file is left. Then stale
// temporaries of a killed save ("<path>.tmp.<pid>" of a dead process) are
// removed by the next successful save, while one of a live process is kept.
static void test_full_disk(moe_ctx *ctx) {
  char path[600];
  scratch(path, sizeof path, "full.ckpt");
  model good, big;
  make_model(&good, 41, 1);
  make_model(&big, 42, 2);  // > 8 MiB
  TU_CHECK(save_model(ctx, path, &good, 0) == MOE_STATUS_OK, "full disk: first save: %s",
           moe_ctx_error(ctx));
  fflush(NULL);
  const pid_t child = fork();
  if (child == 0) {
    struct rlimit lim = {1 << 20, 1 << 20};  // 1 MiB per file
    signal(SIGXFSZ, SIG_IGN);
    int code = 0;
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) code = 3;
    const moe_status st = code ? MOE_STATUS_OK : save_model(ctx, path, &big, 0);
    if (!code && st != MOE_STATUS_IO) code = 4;
    // the reason (EFBIG's "File too large") and what it means for the path
    if (!code &&
        (!strstr(moe_ctx_error(ctx), "File too large") ||
         !strstr(moe_ctx_error(ctx), "nothing saved") || !strstr(moe_ctx_error(ctx), "unchanged")))
      code = 5;
    if (code)
      fprintf(stderr, "full disk child: status %s, '%s'\n", moe_status_str(st), moe_ctx_error(ctx));
    _exit(code);
  }
  int wst = 0;
  TU_CHECK(child > 0 && waitpid(child, &wst, 0) == child && WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
           "full disk: the save past the limit did not fail cleanly (child status %d)", wst);
  TU_CHECK(check_model(ctx, path, &good) == 0, "full disk: the previous checkpoint is damaged");
  char tmp[700];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)child);
  TU_CHECK(!exists(tmp), "full disk: the failed save left %s", tmp);
  // stale temporaries: a dead process's is removed, a live one's kept
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, &wst, 0);
  char dead[700], live[700];
  snprintf(dead, sizeof dead, "%s.tmp.%ld", path, (long)gone);
  snprintf(live, sizeof live, "%s.tmp.%ld", path, (long)getppid());
  spit(dead, (const unsigned char *)"partial", 7);
  spit(live, (const unsigned char *)"in progress", 11);
  TU_CHECK(save_model(ctx, path, &good, 0) == MOE_STATUS_OK, "stale temporaries: save: %s",
           moe_ctx_error(ctx));
  TU_CHECK(!exists(dead), "the stale temporary %s of a dead save was not removed", dead);
  TU_CHECK(exists(live), "the temporary %s of a live process was removed", live);
  remove(live);
  remove(path);
  model_free(&good);
  model_free(&big);
}

static int driver(const char *mode, const char *path, const char *seed_text) {
  char *end = NULL;
  const unsigned long long seed = strtoull(seed_text, &end, 10);
  if (!*seed_text || *end) {
    fprintf(stderr, "test_checkpoint: bad seed '%s'\n", seed_text);
    return 2;
  }
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return 2;
  model m;
  make_model(&m, seed, 1);
  int rc = 0;
  if (strcmp(mode, "--write") == 0) {
    if (save_model(ctx, path, &m, 4096) != MOE_STATUS_OK) {
      fprintf(stderr, "test_checkpoint: save failed: %s\n", moe_ctx_error(ctx));
      rc = 1;
    }
  } else {
    rc = check_model(ctx, path, &m);
    if (rc == 0) printf("%s holds seed %llu\n", path, seed);
  }
  model_free(&m);
  moe_ctx_destroy(ctx);
  return rc;
}

static void remove_scratch(void) {
  // Only files this test made, then the directory itself.
  const char *names[] = {"rt.ckpt",          "empty.ckpt",  "layout.ckpt",   "whole.ckpt",
                         "part.ckpt",        "slices.ckpt", "keep.ckpt",     "trunc.ckpt",
                         "trunc_cut.ckpt",   "flip.ckpt",   "flip_bad.ckpt", "foreign.ckpt",
                         "foreign_bad.ckpt", "descs.ckpt",  "misuse.ckpt"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char p[512];
    scratch(p, sizeof p, names[i]);
    unlink(p);
  }
  if (rmdir(g_dir) != 0) fprintf(stderr, "note: could not remove %s: %s\n", g_dir, strerror(errno));
}

int main(int argc, char **argv) {
  if (argc == 4 && (strcmp(argv[1], "--write") == 0 || strcmp(argv[1], "--verify") == 0)) {
    return driver(argv[1], argv[2], argv[3]);
  }
  if (argc > 1 && strncmp(argv[1], "--", 2) == 0) {
    fprintf(stderr, "usage: test_checkpoint [DATA_DIR] | --write PATH SEED | --verify PATH SEED\n");
    return 2;
  }
  const char *tmpdir = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/moe_ckpt_XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
  if (!mkdtemp(g_dir)) {
    fprintf(stderr, "cannot create a scratch directory %s: %s\n", g_dir, strerror(errno));
    return 1;
  }
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return 1;
  test_crc32();
  test_roundtrip(ctx);
  test_layout(ctx);
  test_pieces(ctx);
  test_partial_reads(ctx);
  test_reader_keeps_file(ctx);
  test_truncation(ctx);
  test_corruption(ctx);
  test_foreign_files(ctx);
  test_bad_descs(ctx);
  test_writer_misuse(ctx);
  test_full_disk(ctx);
  moe_ctx_destroy(ctx);
  remove_scratch();
  return tu_finish("test_checkpoint");
}
