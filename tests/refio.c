// Reader for MoE layer reference files (see refio.h, tests/data/README.md).
// The whole file is read into memory, then parsed with bounds checks; every
// multi-byte field is decoded byte by byte as little-endian, so there are no
// unaligned reads and the result does not depend on host byte order.
#include "refio.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_MAGIC "MOEREF\0\0"
#define REF_MAGIC_LEN 8
#define REF_HEADER_BYTES 128
#define REF_RECORD_BYTES 72             // name 32 + dtype 4 + ndim 4 + dims 32
#define REF_MAX_FILE ((size_t)1 << 28)  // 256 MiB: far above any test file
#define REF_MAX_TENSORS 4096
#define REF_MAX_DIM ((int64_t)1 << 31)
#define REF_MAX_SHAPE_PARAM (1 << 24)

#if defined(__GNUC__)
#define REF_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define REF_PRINTF(a, b)
#endif

static void set_err(char *err, size_t errlen, const char *fmt, ...) REF_PRINTF(3, 4);
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  if (!err || errlen == 0) return;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

uint32_t ref_crc32(const void *data, size_t n) {
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int b = 0; b < 8; b++) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
    table[i] = c;
  }
  const unsigned char *p = (const unsigned char *)data;
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

// ---- little-endian decoding -------------------------------------------------

static uint32_t le_u32(const unsigned char *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t le_u64(const unsigned char *p) {
  return (uint64_t)le_u32(p) | ((uint64_t)le_u32(p + 4) << 32);
}

static int32_t le_i32(const unsigned char *p) {
  const uint32_t u = le_u32(p);
  int32_t v;
  memcpy(&v, &u, sizeof v);  // two's complement bit pattern, no UB
  return v;
}

static int64_t le_i64(const unsigned char *p) {
  const uint64_t u = le_u64(p);
  int64_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}

static float le_f32(const unsigned char *p) {
  const uint32_t u = le_u32(p);
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

static double le_f64(const unsigned char *p) {
  const uint64_t u = le_u64(p);
  double v;
  memcpy(&v, &u, sizeof v);
  return v;
}

// ---- bounded cursor -----------------------------------------------------------

typedef struct {
  const unsigned char *buf;
  size_t len, pos;
  const char *path;
  char *err;
  size_t errlen;
} cursor;

// Returns a pointer to the next n bytes and advances, or NULL (with the error
// set) when the file ends first.
static const unsigned char *take(cursor *c, size_t n, const char *what) {
  if (n > c->len - c->pos) {
    set_err(c->err, c->errlen,
            "%s: truncated at byte %zu (%s needs %zu bytes at offset %zu, file has %zu bytes)",
            c->path, c->len, what, n, c->pos, c->len);
    return NULL;
  }
  const unsigned char *p = c->buf + c->pos;
  c->pos += n;
  return p;
}

// 1 if the fixed-size field holds a NUL-terminated string.
static int has_nul(const unsigned char *p, size_t n) { return memchr(p, 0, n) != NULL; }

// ---- file reading -------------------------------------------------------------

static int read_all(const char *path, unsigned char **out, size_t *out_len, char *err,
                    size_t errlen) {
  *out = NULL;
  *out_len = 0;
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    const int e = errno;
    set_err(err, errlen, "%s: cannot open (missing or unreadable file): %s", path, strerror(e));
    return 1;
  }
  size_t cap = 1 << 16, len = 0;
  unsigned char *buf = malloc(cap);
  if (!buf) {
    fclose(fp);
    set_err(err, errlen, "%s: out of memory", path);
    return 1;
  }
  for (;;) {
    if (len == cap) {
      if (cap >= REF_MAX_FILE) {
        free(buf);
        fclose(fp);
        set_err(err, errlen, "%s: file too large (over %zu bytes)", path, REF_MAX_FILE);
        return 1;
      }
      unsigned char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        fclose(fp);
        set_err(err, errlen, "%s: out of memory", path);
        return 1;
      }
      buf = nb;
      cap *= 2;
    }
    const size_t got = fread(buf + len, 1, cap - len, fp);
    len += got;
    if (got == 0) break;
  }
  const int bad = ferror(fp);
  fclose(fp);
  if (bad) {
    free(buf);
    set_err(err, errlen, "%s: read error", path);
    return 1;
  }
  *out = buf;
  *out_len = len;
  return 0;
}

// ---- parsing --------------------------------------------------------------------

static int parse(cursor *c, ref_file *f) {
  const char *path = c->path;
  const unsigned char *p;

  if (!(p = take(c, REF_MAGIC_LEN, "magic"))) return 1;
  if (memcmp(p, REF_MAGIC, REF_MAGIC_LEN) != 0) {
    set_err(c->err, c->errlen, "%s: bad magic (not a MOEREF file)", path);
    return 1;
  }
  if (!(p = take(c, 4, "version"))) return 1;
  f->version = le_u32(p);
  if (f->version != REF_VERSION) {
    set_err(c->err, c->errlen, "%s: unsupported version %" PRIu32 " (expected %u)", path,
            f->version, REF_VERSION);
    return 1;
  }
  if (!(p = take(c, REF_HEADER_BYTES - REF_MAGIC_LEN - 4, "header"))) return 1;
  if (!has_nul(p, 64)) {
    set_err(c->err, c->errlen, "%s: bad header: case_name not NUL-terminated", path);
    return 1;
  }
  memcpy(f->case_name, p, 64);
  p += 64;
  int32_t iv[8];
  for (int i = 0; i < 8; i++) iv[i] = le_i32(p + 4 * i);
  p += 32;
  f->T = iv[0];
  f->M = iv[1];
  f->H = iv[2];
  f->E = iv[3];
  f->K = iv[4];
  f->act = iv[5];
  f->renormalize = iv[6];
  f->capacity = iv[7];
  f->capacity_factor = le_f64(p);
  f->aux_loss_coef = le_f32(p + 8);
  f->z_loss_coef = le_f32(p + 12);
  const uint32_t n_tensors = le_u32(p + 16);

  for (int i = 0; i < 5; i++) {
    if (iv[i] < 1 || iv[i] > REF_MAX_SHAPE_PARAM) {
      set_err(c->err, c->errlen, "%s: bad header: %s = %" PRId32 " out of range", path,
              (const char *[]){"T", "M", "H", "E", "K"}[i], iv[i]);
      return 1;
    }
  }
  if (f->K > f->E) {
    set_err(c->err, c->errlen, "%s: bad header: K = %" PRId32 " > E = %" PRId32, path, f->K, f->E);
    return 1;
  }
  if ((f->act != 0 && f->act != 1) || (f->renormalize != 0 && f->renormalize != 1)) {
    set_err(c->err, c->errlen, "%s: bad header: act = %" PRId32 ", renormalize = %" PRId32, path,
            f->act, f->renormalize);
    return 1;
  }
  if (!isfinite(f->capacity_factor) || f->capacity_factor < 0.0 ||
      (f->capacity == -1) != (f->capacity_factor == 0.0) || f->capacity < -1 || f->capacity == 0) {
    set_err(c->err, c->errlen, "%s: bad header: capacity = %" PRId32 " with capacity_factor = %g",
            path, f->capacity, f->capacity_factor);
    return 1;
  }
  if (!isfinite(f->aux_loss_coef) || !isfinite(f->z_loss_coef) || f->aux_loss_coef < 0.0f ||
      f->z_loss_coef < 0.0f) {
    set_err(c->err, c->errlen, "%s: bad header: loss coefficients %g, %g", path,
            (double)f->aux_loss_coef, (double)f->z_loss_coef);
    return 1;
  }
  if (n_tensors > REF_MAX_TENSORS) {
    set_err(c->err, c->errlen, "%s: bad header: n_tensors = %" PRIu32 " (max %d)", path, n_tensors,
            REF_MAX_TENSORS);
    return 1;
  }
  if (n_tensors > 0) {
    f->tensors = calloc(n_tensors, sizeof *f->tensors);
    if (!f->tensors) {
      set_err(c->err, c->errlen, "%s: out of memory", path);
      return 1;
    }
    f->n_tensors = (int)n_tensors;  // entries not yet read have data == NULL
  }

  for (uint32_t ti = 0; ti < n_tensors; ti++) {
    ref_tensor *t = &f->tensors[ti];
    if (!(p = take(c, REF_RECORD_BYTES, "tensor record header"))) return 1;
    if (!has_nul(p, 32) || p[0] == 0) {
      set_err(c->err, c->errlen, "%s: tensor %" PRIu32 ": bad name (empty or not NUL-terminated)",
              path, ti);
      return 1;
    }
    memcpy(t->name, p, 32);
    for (uint32_t tj = 0; tj < ti; tj++) {
      if (strcmp(f->tensors[tj].name, t->name) == 0) {
        set_err(c->err, c->errlen, "%s: duplicate tensor '%s'", path, t->name);
        return 1;
      }
    }
    const uint32_t dtype = le_u32(p + 32), ndim = le_u32(p + 36);
    if (dtype != REF_DTYPE_F32 && dtype != REF_DTYPE_I32) {
      set_err(c->err, c->errlen, "%s: tensor '%s': bad dtype %" PRIu32, path, t->name, dtype);
      return 1;
    }
    if (ndim < 1 || ndim > 4) {
      set_err(c->err, c->errlen, "%s: tensor '%s': bad dims: ndim = %" PRIu32, path, t->name, ndim);
      return 1;
    }
    t->dtype = (int)dtype;
    t->ndim = (int)ndim;
    size_t count = 1;
    for (int d = 0; d < 4; d++) {
      const int64_t v = le_i64(p + 40 + 8 * d);
      t->dims[d] = v;
      const int ok = d < t->ndim ? (v >= 1 && v <= REF_MAX_DIM) : (v == 1);
      if (!ok) {
        set_err(c->err, c->errlen, "%s: tensor '%s': bad dims: dims[%d] = %" PRId64, path, t->name,
                d, v);
        return 1;
      }
      // count * v <= REF_MAX_FILE / 4 without overflow (both factors bounded)
      if ((size_t)v > (REF_MAX_FILE / 4) / count) {
        set_err(c->err, c->errlen, "%s: tensor '%s': bad dims: too many elements", path, t->name);
        return 1;
      }
      count *= (size_t)v;
    }
    t->count = count;
    if (!(p = take(c, count * 4, "tensor data"))) return 1;
    t->data = malloc(count * 4);
    if (!t->data) {
      set_err(c->err, c->errlen, "%s: out of memory", path);
      return 1;
    }
    if (t->dtype == REF_DTYPE_F32) {
      float *dst = t->data;
      for (size_t i = 0; i < count; i++) dst[i] = le_f32(p + 4 * i);
    } else {
      int32_t *dst = t->data;
      for (size_t i = 0; i < count; i++) dst[i] = le_i32(p + 4 * i);
    }
  }

  const size_t body = c->pos;
  if (!(p = take(c, 4, "CRC trailer"))) return 1;
  if (c->pos != c->len) {
    set_err(c->err, c->errlen,
            "%s: file longer than declared: %zu bytes after the CRC trailer at byte %zu", path,
            c->len - c->pos, body);
    return 1;
  }
  const uint32_t stored = le_u32(p), computed = ref_crc32(c->buf, body);
  if (stored != computed) {
    set_err(c->err, c->errlen,
            "%s: CRC mismatch (stored 0x%08" PRIx32 ", computed 0x%08" PRIx32 ")", path, stored,
            computed);
    return 1;
  }
  return 0;
}

int ref_load(const char *path, ref_file *out, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!out) {
    set_err(err, errlen, "ref_load: NULL output");
    return 1;
  }
  memset(out, 0, sizeof *out);
  if (!path) {
    set_err(err, errlen, "ref_load: NULL path");
    return 1;
  }
  unsigned char *buf;
  size_t len;
  if (read_all(path, &buf, &len, err, errlen)) return 1;
  cursor c = {buf, len, 0, path, err, errlen};
  const int rc = parse(&c, out);
  free(buf);
  if (rc) {
    ref_free(out);  // frees whatever was decoded and zeroes *out
    return 1;
  }
  return 0;
}

const ref_tensor *ref_get(const ref_file *f, const char *name) {
  if (!f || !name || !f->tensors) return NULL;
  for (int i = 0; i < f->n_tensors; i++) {
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  }
  return NULL;
}

const float *ref_f32(const ref_file *f, const char *name, size_t expect_count) {
  const ref_tensor *t = ref_get(f, name);
  if (!t || t->dtype != REF_DTYPE_F32 || t->count != expect_count) return NULL;
  return (const float *)t->data;
}

const int32_t *ref_i32(const ref_file *f, const char *name, size_t expect_count) {
  const ref_tensor *t = ref_get(f, name);
  if (!t || t->dtype != REF_DTYPE_I32 || t->count != expect_count) return NULL;
  return (const int32_t *)t->data;
}

void ref_free(ref_file *f) {
  if (!f) return;
  if (f->tensors) {
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].data);
    free(f->tensors);
  }
  memset(f, 0, sizeof *f);
}
