// Tests for the reference-file reader (refio.c): every committed
// tests/data/layer_*.bin loads and is self-consistent (shapes against its
// header, routing against the documented GShard slot order), and damaged
// copies (truncated, flipped byte, bad magic, wrong version, bad dims, extra
// bytes) are rejected with a message naming the problem.
// Usage: test_refio DATA_DIR
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "refio.h"
#include "testutil.h"

static const char *const k_cases[] = {
    "k1_gelu_e4_dropless",        "k2_gelu_e4_capacity_drop",   "k2_relu_e8_dropless",
    "k1_relu_e8_capacity_drop",   "k2_gelu_e8_renorm_zloss",    "k2_relu_e4_empty_expert",
    "k2_gelu_e4_capacity_nodrop", "k3_gelu_e8_renorm_capacity",
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

// ---- helpers ------------------------------------------------------------------

static unsigned char *slurp(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  *len = 0;
  if (!fp) return NULL;
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  while (buf) {
    if (n == cap) {
      unsigned char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    const size_t got = fread(buf + n, 1, cap - n, fp);
    n += got;
    if (got == 0) break;
  }
  fclose(fp);
  *len = n;
  return buf;
}

static int spit(const char *path, const unsigned char *buf, size_t len) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return 1;
  const int bad = (len && fwrite(buf, 1, len, fp) != len);
  return (fclose(fp) != 0) || bad;
}

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_i64(unsigned char *p, int64_t v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(u >> (8 * i));
}

// Recomputes the CRC trailer so that only the intended damage is seen.
static void fix_crc(unsigned char *buf, size_t len) {
  put_u32(buf + len - 4, ref_crc32(buf, len - 4));
}

// Loads path, expecting failure with a message containing want.
static void expect_fail(const char *what, const char *path, const char *want) {
  char err[512];
  ref_file f;
  memset(&f, 0x5a, sizeof f);  // must come back zeroed
  const int rc = ref_load(path, &f, err, sizeof err);
  TU_CHECK(rc != 0, "%s: load unexpectedly succeeded", what);
  TU_CHECK(strstr(err, want) != NULL, "%s: message '%s' does not contain '%s'", what, err, want);
  TU_CHECK(f.tensors == NULL && f.n_tensors == 0, "%s: output not zeroed on failure", what);
  if (rc == 0) ref_free(&f);
  ref_free(&f);  // zeroed struct: no-op
}

// Writes buf to the temp path and expects failure with want.
static void expect_fail_buf(const char *what, const char *tmp, const unsigned char *buf, size_t len,
                            const char *want) {
  TU_CHECK(spit(tmp, buf, len) == 0, "%s: cannot write %s", what, tmp);
  expect_fail(what, tmp, want);
}

// ---- consistency of one loaded file -------------------------------------------

typedef struct {
  const char *name;
  int dtype, ndim;
  int64_t d[4];
} shape_spec;

static void check_file(const ref_file *f, const char *fname) {
  const int64_t T = f->T, M = f->M, H = f->H, E = f->E, K = f->K;
  const shape_spec specs[] = {
      {"x", 0, 2, {T, M, 1, 1}},      {"wg", 0, 2, {M, E, 1, 1}},     {"w1", 0, 3, {E, M, H, 1}},
      {"b1", 0, 2, {E, H, 1, 1}},     {"w2", 0, 3, {E, H, M, 1}},     {"b2", 0, 2, {E, M, 1, 1}},
      {"dy", 0, 2, {T, M, 1, 1}},     {"y", 0, 2, {T, M, 1, 1}},      {"aux", 0, 1, {1, 1, 1, 1}},
      {"z", 0, 1, {1, 1, 1, 1}},      {"expert", 1, 2, {T, K, 1, 1}}, {"slot", 1, 2, {T, K, 1, 1}},
      {"weight", 0, 2, {T, K, 1, 1}}, {"count", 1, 1, {E, 1, 1, 1}},  {"dx", 0, 2, {T, M, 1, 1}},
      {"dwg", 0, 2, {M, E, 1, 1}},    {"dw1", 0, 3, {E, M, H, 1}},    {"db1", 0, 2, {E, H, 1, 1}},
      {"dw2", 0, 3, {E, H, M, 1}},    {"db2", 0, 2, {E, M, 1, 1}},
  };
  const size_t n_specs = sizeof specs / sizeof specs[0];

  // header
  char want_name[128];
  snprintf(want_name, sizeof want_name, "layer_%s.bin", f->case_name);
  TU_CHECK(strcmp(want_name, fname) == 0, "%s: case_name '%s' does not match the file name", fname,
           f->case_name);
  TU_CHECK(f->version == 1, "%s: version %u", fname, (unsigned)f->version);
  TU_CHECK(f->T >= 16 && f->T <= 40 && f->K >= 1 && f->K <= f->E, "%s: sizes T=%d K=%d E=%d", fname,
           (int)f->T, (int)f->K, (int)f->E);
  TU_CHECK(fabsf(f->aux_loss_coef - 0.01f) < 1e-9f, "%s: aux_loss_coef %g", fname,
           (double)f->aux_loss_coef);
  TU_CHECK(f->z_loss_coef >= 0.0f, "%s: z_loss_coef %g", fname, (double)f->z_loss_coef);
  TU_CHECK(f->n_tensors == (int)n_specs, "%s: %d tensors, expected %zu", fname, f->n_tensors,
           n_specs);

  // tensors and shapes
  int shapes_ok = 1;
  for (size_t i = 0; i < n_specs; i++) {
    const shape_spec *s = &specs[i];
    const ref_tensor *t = ref_get(f, s->name);
    TU_CHECK(t != NULL, "%s: tensor '%s' missing", fname, s->name);
    if (!t) {
      shapes_ok = 0;
      continue;
    }
    int same = t->dtype == s->dtype && t->ndim == s->ndim;
    size_t count = 1;
    for (int d = 0; d < 4; d++) {
      same = same && t->dims[d] == s->d[d];
      count *= (size_t)s->d[d];
    }
    same = same && t->count == count;
    TU_CHECK(same, "%s: tensor '%s' has dtype %d ndim %d dims %lld,%lld,%lld,%lld", fname, s->name,
             t->dtype, t->ndim, (long long)t->dims[0], (long long)t->dims[1], (long long)t->dims[2],
             (long long)t->dims[3]);
    if (!same) {
      shapes_ok = 0;
      continue;
    }
    if (t->dtype == REF_DTYPE_F32) {
      TU_CHECK(ref_f32(f, s->name, count) != NULL, "%s: ref_f32(%s)", fname, s->name);
      TU_CHECK(ref_f32(f, s->name, count + 1) == NULL, "%s: ref_f32(%s) wrong count", fname,
               s->name);
      TU_CHECK(ref_i32(f, s->name, count) == NULL, "%s: ref_i32(%s) on f32", fname, s->name);
      const float *v = t->data;
      size_t nonfinite = 0;
      for (size_t j = 0; j < count; j++) nonfinite += !isfinite(v[j]);
      TU_CHECK(nonfinite == 0, "%s: tensor '%s' has %zu non-finite values", fname, s->name,
               nonfinite);
    } else {
      TU_CHECK(ref_i32(f, s->name, count) != NULL, "%s: ref_i32(%s)", fname, s->name);
      TU_CHECK(ref_f32(f, s->name, count) == NULL, "%s: ref_f32(%s) on i32", fname, s->name);
    }
  }
  TU_CHECK(ref_get(f, "no_such_tensor") == NULL, "%s: ref_get of an absent name", fname);
  if (!shapes_ok) return;

  // routing: experts distinct and in range, slots reproduce GShard order
  const size_t tk = (size_t)(T * K);
  const int32_t *expert = ref_i32(f, "expert", tk), *slot = ref_i32(f, "slot", tk);
  const int32_t *count = ref_i32(f, "count", (size_t)E);
  const float *weight = ref_f32(f, "weight", tk);
  const int64_t C = f->capacity;
  if (C < 0) {
    TU_CHECK(f->capacity_factor == 0.0, "%s: dropless with capacity_factor %g", fname,
             f->capacity_factor);
  } else {
    const double c = ceil(((f->capacity_factor * (double)K) * (double)T) / (double)E);
    TU_CHECK((double)C == c, "%s: capacity %lld != ceil(f*K*T/E) = %g", fname, (long long)C, c);
  }
  int32_t *cnt = calloc((size_t)E, sizeof *cnt);
  int routing_ok = cnt != NULL, dropped = 0;
  for (int64_t k = 0; routing_ok && k < K; k++) {
    for (int64_t t = 0; t < T; t++) {
      const int32_t e = expert[t * K + k];
      if (e < 0 || e >= E) {
        routing_ok = 0;
        break;
      }
      for (int64_t j = 0; j < k; j++) routing_ok = routing_ok && expert[t * K + j] != e;
      int32_t want = -1;
      if (C < 0 || cnt[e] < C) want = cnt[e]++;
      routing_ok = routing_ok && slot[t * K + k] == want;
      dropped += want < 0;
    }
  }
  TU_CHECK(routing_ok, "%s: expert/slot do not follow the documented GShard order", fname);
  for (int64_t e = 0; routing_ok && e < E; e++) {
    TU_CHECK(count[e] == cnt[e], "%s: count[%lld] = %d, slots say %d", fname, (long long)e,
             (int)count[e], (int)cnt[e]);
  }
  if (C < 0) TU_CHECK(dropped == 0, "%s: dropless file with %d drops", fname, dropped);
  free(cnt);

  // gate weights: positive, descending per token, sum to 1 when renormalised
  int weights_ok = 1;
  for (int64_t t = 0; t < T; t++) {
    double s = 0;
    for (int64_t k = 0; k < K; k++) {
      const float w = weight[t * K + k];
      weights_ok = weights_ok && w > 0.0f && w <= 1.0f;
      if (k > 0) weights_ok = weights_ok && w <= weight[t * K + k - 1];
      s += w;
    }
    if (f->renormalize)
      weights_ok = weights_ok && fabs(s - 1.0) < 1e-6;
    else
      weights_ok = weights_ok && s <= 1.0 + 1e-6;
  }
  TU_CHECK(weights_ok, "%s: gate weights out of range, not descending or not normalised", fname);
  const float *aux = ref_f32(f, "aux", 1), *z = ref_f32(f, "z", 1);
  TU_CHECK(aux[0] > 0.0f && aux[0] <= (float)E, "%s: aux = %g", fname, (double)aux[0]);
  TU_CHECK(z[0] >= 0.0f, "%s: z = %g", fname, (double)z[0]);
}

static int load_and_check(const char *dir, const char *fname) {
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/%s", dir, fname);
  ref_file f;
  const int rc = ref_load(path, &f, err, sizeof err);
  TU_CHECK(rc == 0, "%s: %s", path, err);
  if (rc) return 1;
  check_file(&f, fname);
  ref_free(&f);
  TU_CHECK(f.tensors == NULL && f.n_tensors == 0, "ref_free does not zero");
  return 0;
}

// ---- damaged copies -------------------------------------------------------------

static void damaged_copies(const char *dir) {
  char path[4096], tmp[] = "/tmp/test_refio_XXXXXX", want[128];
  snprintf(path, sizeof path, "%s/layer_%s.bin", dir, k_cases[0]);
  size_t len;
  unsigned char *orig = slurp(path, &len);
  TU_CHECK(orig != NULL && len > 300, "cannot read %s", path);
  if (!orig || len <= 300) {
    free(orig);
    return;
  }
  unsigned char *buf = malloc(len + 16);
  const int fd = mkstemp(tmp);
  TU_CHECK(buf != NULL && fd >= 0, "cannot create a temp file %s", tmp);
  if (!buf || fd < 0) {
    free(buf);
    free(orig);
    return;
  }
  close(fd);

  // the untouched copy loads
  {
    char err[512];
    ref_file f;
    TU_CHECK(spit(tmp, orig, len) == 0, "write %s", tmp);
    TU_CHECK(ref_load(tmp, &f, err, sizeof err) == 0, "copy: %s", err);
    ref_free(&f);
  }

  // missing file
  expect_fail("missing", "/nonexistent_dir_test_refio/layer_none.bin", "cannot open");

  // truncated: half the file, and every shorter prefix of the file
  snprintf(want, sizeof want, "truncated at byte %zu", len / 2);
  expect_fail_buf("truncated half", tmp, orig, len / 2, want);
  {
    int all_ok = 1;
    for (size_t n = 0; n < len; n++) {
      char err[512] = "";
      ref_file f = {0};
      snprintf(want, sizeof want, "truncated at byte %zu ", n);
      if (spit(tmp, orig, n) != 0 || ref_load(tmp, &f, err, sizeof err) == 0 ||
          strstr(err, want) == NULL) {
        if (all_ok) fprintf(stderr, "  prefix of %zu bytes: '%s'\n", n, err);
        all_ok = 0;
        ref_free(&f);
      }
    }
    TU_CHECK(all_ok, "some truncated prefix was not reported as truncated at its length");
  }

  // flipped byte in the data of the first tensor (x) -> CRC mismatch
  memcpy(buf, orig, len);
  buf[128 + 72 + 13] ^= 0x01;
  expect_fail_buf("flipped data byte", tmp, buf, len, "CRC mismatch");
  // flipped byte in the CRC itself
  memcpy(buf, orig, len);
  buf[len - 1] ^= 0x80;
  expect_fail_buf("flipped CRC byte", tmp, buf, len, "CRC mismatch");
  // every single-bit flip anywhere in the file is rejected
  {
    int all_ok = 1;
    for (size_t i = 0; i < len; i++) {
      char err[512] = "";
      ref_file f = {0};
      memcpy(buf, orig, len);
      buf[i] ^= (unsigned char)(1u << (i % 8));
      if (spit(tmp, buf, len) != 0 || ref_load(tmp, &f, err, sizeof err) == 0) {
        if (all_ok) fprintf(stderr, "  flip at byte %zu was accepted\n", i);
        all_ok = 0;
        ref_free(&f);
      }
    }
    TU_CHECK(all_ok, "some single-bit flip was not detected");
  }

  // bad magic (CRC fixed, so the magic check itself must catch it)
  memcpy(buf, orig, len);
  buf[0] = 'X';
  fix_crc(buf, len);
  expect_fail_buf("bad magic", tmp, buf, len, "bad magic");

  // wrong version (CRC fixed)
  memcpy(buf, orig, len);
  put_u32(buf + 8, 2);
  fix_crc(buf, len);
  expect_fail_buf("wrong version", tmp, buf, len, "unsupported version 2");

  // bad dims of the first record (at byte 128): ndim 0, ndim 5, dims[0] = 0,
  // dims[0] = -3, an unused dim != 1, a huge dim
  const size_t rec = 128;
  memcpy(buf, orig, len);
  put_u32(buf + rec + 36, 0);
  fix_crc(buf, len);
  expect_fail_buf("ndim 0", tmp, buf, len, "bad dims");
  memcpy(buf, orig, len);
  put_u32(buf + rec + 36, 5);
  fix_crc(buf, len);
  expect_fail_buf("ndim 5", tmp, buf, len, "bad dims");
  memcpy(buf, orig, len);
  put_i64(buf + rec + 40, 0);
  fix_crc(buf, len);
  expect_fail_buf("dim 0", tmp, buf, len, "bad dims");
  memcpy(buf, orig, len);
  put_i64(buf + rec + 40, -3);
  fix_crc(buf, len);
  expect_fail_buf("negative dim", tmp, buf, len, "bad dims");
  memcpy(buf, orig, len);
  put_i64(buf + rec + 40 + 24, 2);
  fix_crc(buf, len);
  expect_fail_buf("unused dim", tmp, buf, len, "bad dims");
  memcpy(buf, orig, len);
  put_i64(buf + rec + 40, (int64_t)1 << 62);
  fix_crc(buf, len);
  expect_fail_buf("huge dim", tmp, buf, len, "bad dims");
  memcpy(buf, orig, len);
  put_i64(buf + rec + 40, (int64_t)1 << 30);
  put_i64(buf + rec + 48, (int64_t)1 << 30);
  fix_crc(buf, len);
  expect_fail_buf("overflowing dims", tmp, buf, len, "bad dims");
  // a larger but plausible dim runs past the end of the file
  memcpy(buf, orig, len);
  put_i64(buf + rec + 40, 100000);
  fix_crc(buf, len);
  expect_fail_buf("dim past end", tmp, buf, len, "truncated at byte");

  // bad dtype
  memcpy(buf, orig, len);
  put_u32(buf + rec + 32, 7);
  fix_crc(buf, len);
  expect_fail_buf("bad dtype", tmp, buf, len, "bad dtype");

  // a file longer than declared (extra bytes after the trailer)
  memcpy(buf, orig, len);
  buf[len] = 0;
  expect_fail_buf("extra byte", tmp, buf, len + 1, "longer than declared");

  // fewer declared tensors than present: the rest is trailing garbage
  memcpy(buf, orig, len);
  put_u32(buf + 124, 19);
  fix_crc(buf, len);
  expect_fail_buf("n_tensors too small", tmp, buf, len, "longer than declared");
  // more declared tensors than present
  memcpy(buf, orig, len);
  put_u32(buf + 124, 21);
  fix_crc(buf, len);
  expect_fail_buf("n_tensors too large", tmp, buf, len, "truncated at byte");

  // duplicate tensor name: rename the second tensor (wg) to x
  memcpy(buf, orig, len);
  {
    const size_t second = rec + 72 + 4 * (size_t)orig[rec + 40] * (size_t)orig[rec + 48];
    TU_CHECK(memcmp(buf + second, "wg", 3) == 0, "second record is not wg");
    memcpy(buf + second, "x\0", 3);
  }
  fix_crc(buf, len);
  expect_fail_buf("duplicate name", tmp, buf, len, "duplicate tensor");

  // bad header field: act = 9
  memcpy(buf, orig, len);
  put_u32(buf + 96, 9);
  fix_crc(buf, len);
  expect_fail_buf("bad act", tmp, buf, len, "bad header");

  unlink(tmp);
  free(buf);
  free(orig);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]);
    return 2;
  }
  const char *dir = argv[1];

  // CRC-32 check value of the standard ("123456789" -> 0xCBF43926)
  TU_CHECK(ref_crc32("123456789", 9) == 0xCBF43926u, "crc32 check value: 0x%08lx",
           (unsigned long)ref_crc32("123456789", 9));
  TU_CHECK(ref_crc32("", 0) == 0u, "crc32 of nothing");

  ref_free(NULL);
  {
    ref_file zero;
    memset(&zero, 0, sizeof zero);
    ref_free(&zero);
    TU_CHECK(ref_get(&zero, "x") == NULL && ref_f32(&zero, "x", 1) == NULL &&
                 ref_i32(&zero, "x", 1) == NULL,
             "lookups in an empty file");
  }

  // the expected cases are all there
  for (size_t i = 0; i < N_CASES; i++) {
    char fname[128];
    snprintf(fname, sizeof fname, "layer_%s.bin", k_cases[i]);
    load_and_check(dir, fname);
  }

  // and every layer_*.bin in the directory loads and is consistent
  DIR *d = opendir(dir);
  TU_CHECK(d != NULL, "cannot open directory %s", dir);
  size_t n_files = 0;
  if (d) {
    const struct dirent *de;
    while ((de = readdir(d)) != NULL) {
      const size_t n = strlen(de->d_name);
      if (n > 10 && strncmp(de->d_name, "layer_", 6) == 0 &&
          strcmp(de->d_name + n - 4, ".bin") == 0) {
        char fname[256];
        snprintf(fname, sizeof fname, "%s", de->d_name);
        load_and_check(dir, fname);
        n_files++;
      }
    }
    closedir(d);
  }
  TU_CHECK(n_files >= N_CASES, "found %zu layer_*.bin files, expected at least %zu", n_files,
           (size_t)N_CASES);

  damaged_copies(dir);
  return tu_finish("test_refio");
}
