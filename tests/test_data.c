// Tests of the training data (include/moe/data.h) and the training outputs
// (include/moe/progress.h): corpus loading and its errors, the interleaved
// split, batch determinism and DP sharding against a reference sampler written
// here from the documented formula, windows that never cross train/val text,
// the metrics JSON lines, the progress line and the gnuplot loss plot.
#define _POSIX_C_SOURCE 200809L
#include <cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/data.h"
#include "moe/progress.h"
#include "testutil.h"

static char g_tmp[256];  // a fresh directory for this run's files

static void tmp_path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", g_tmp, name);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
  fclose(f);
}

// Whole file into a malloc'd NUL-terminated buffer (NULL if missing).
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  rewind(f);
  char *buf = malloc((size_t)n + 1);
  const size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = '\0';
  fclose(f);
  if (len) *len = got;
  return buf;
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// ---- loading ---------------------------------------------------------------------

// Reference for the default corpus: regular files other than *.dat, *.u8 and
// dot files, counted and summed here independently of the library.
static int fortunes_reference(const char *dir, int *files, size_t *bytes) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  *files = 0;
  *bytes = 0;
  char path[4096];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const char *n = e->d_name;
    const size_t len = strlen(n);
    if (n[0] == '.' || (len > 4 && strcmp(n + len - 4, ".dat") == 0) ||
        (len > 3 && strcmp(n + len - 3, ".u8") == 0))
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, n);
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
      (*files)++;
      *bytes += (size_t)sb.st_size;
    }
  }
  closedir(d);
  return *files > 0;
}

static void test_generated(moe_ctx *ctx) {
  moe_text *a = NULL, *b = NULL;
  TU_CHECK(moe_text_load(ctx, "generated:", 0, &a) == MOE_STATUS_OK, "generated: %s",
           moe_ctx_error(ctx));
  TU_CHECK(moe_text_load(ctx, "generated:", 0, &b) == MOE_STATUS_OK, "generated again");
  if (!a || !b) goto done;
  const size_t n = moe_text_size(a);
  const uint8_t *p = moe_text_data(a);
  TU_CHECK(n == MOE_TEXT_GENERATED_BYTES, "generated size %zu != %zu", n, MOE_TEXT_GENERATED_BYTES);
  TU_CHECK(n == moe_text_size(b) && memcmp(p, moe_text_data(b), n) == 0,
           "two loads of the generated text differ");
  // The fallback is one fixed text: a change to the generator shows here.
  const uint64_t h = fnv1a(p, n);
  TU_CHECK(h == 0xf07bbf8f857117f1ull, "generated text hash 0x%016llx (the generator changed?)",
           (unsigned long long)h);
  int bad = 0, seps = 0, distinct = 0, seen[256] = {0};
  for (size_t i = 0; i < n; i++) {
    if (!((p[i] >= 32 && p[i] < 127) || p[i] == '\n' || p[i] == '\t')) bad++;
    if (!seen[p[i]]++) distinct++;
    if (i + 2 < n && p[i] == '\n' && p[i + 1] == '%' && p[i + 2] == '\n') seps++;
  }
  TU_CHECK(bad == 0, "%d bytes of the generated text are not printable ASCII", bad);
  TU_CHECK(seps > 5000, "generated text has only %d '%%' separators", seps);
  TU_CHECK(distinct >= 40, "generated text uses only %d distinct bytes", distinct);
  TU_CHECK(strcmp(moe_text_source(a), "generated: 2621440 bytes") == 0, "source '%s'",
           moe_text_source(a));
  printf("generated text: %zu bytes, %d entries, %d distinct bytes, starts:\n%.200s\n", n, seps,
         distinct, (const char *)p);
done:
  moe_text_free(a);
  moe_text_free(b);
}

static void test_default_corpus(moe_ctx *ctx) {
  const char *env = getenv("MOE_FORTUNES_DIR");
  const char *dir = env && env[0] ? env : MOE_FORTUNES_DIR;
  moe_text *t = NULL, *g = NULL;
  TU_CHECK(moe_text_load(ctx, NULL, 0, &t) == MOE_STATUS_OK, "default corpus: %s",
           moe_ctx_error(ctx));
  if (!t) return;
  int files = 0;
  size_t bytes = 0;
  if (fortunes_reference(dir, &files, &bytes)) {
    char want[600];
    snprintf(want, sizeof want, "fortunes: %s (%d files, %zu bytes)", dir, files, bytes);
    TU_CHECK(strcmp(moe_text_source(t), want) == 0, "source '%s', want '%s'", moe_text_source(t),
             want);
    TU_CHECK(moe_text_size(t) == bytes, "fortunes size %zu != %zu", moe_text_size(t), bytes);
    printf("default corpus: %s\n", moe_text_source(t));
  } else {
    printf("fortunes not installed at %s: the default corpus is the generated fallback\n", dir);
    TU_CHECK(strncmp(moe_text_source(t), "generated: ", 11) == 0 &&
                 strstr(moe_text_source(t), "fallback") != NULL,
             "default without fortunes: source '%s'", moe_text_source(t));
  }
  moe_text_free(t);
  t = NULL;

  // Whether or not fortunes is installed: a missing directory gives the
  // fallback, with the reason in the source line.
  char *saved = env ? strdup(env) : NULL;
  setenv("MOE_FORTUNES_DIR", "/nonexistent/fortunes", 1);
  TU_CHECK(moe_text_load(ctx, NULL, 0, &t) == MOE_STATUS_OK, "fallback: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_text_load(ctx, "generated:", 0, &g) == MOE_STATUS_OK, "generated");
  if (t && g) {
    TU_CHECK(moe_text_size(t) == moe_text_size(g) &&
                 memcmp(moe_text_data(t), moe_text_data(g), moe_text_size(g)) == 0,
             "the fallback is not the generated text");
    TU_CHECK(strstr(moe_text_source(t), "fallback") &&
                 strstr(moe_text_source(t), "/nonexistent/fortunes"),
             "fallback source '%s' does not say why", moe_text_source(t));
    printf("fallback source: %s\n", moe_text_source(t));
  }
  if (saved) {
    setenv("MOE_FORTUNES_DIR", saved, 1);
    free(saved);
  } else {
    unsetenv("MOE_FORTUNES_DIR");
  }
  moe_text_free(t);
  moe_text_free(g);
}

// A fortunes-style directory: only regular files other than *.dat, *.u8 and
// dot files, sorted by name.
static void test_fortunes_dir(moe_ctx *ctx) {
  char dir[512], p[600], spec[700];
  tmp_path(dir, sizeof dir, "fort");
  mkdir(dir, 0700);
  snprintf(p, sizeof p, "%s/b", dir);
  write_file(p, "BBB\n%\n", 6);
  snprintf(p, sizeof p, "%s/a", dir);
  write_file(p, "AAAA\n", 5);
  snprintf(p, sizeof p, "%s/a.dat", dir);
  write_file(p, "\1\2\3", 3);
  snprintf(p, sizeof p, "%s/.hidden", dir);
  write_file(p, "hidden", 6);
  snprintf(p, sizeof p, "%s/sub", dir);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/b.u8", dir);
  TU_CHECK(symlink("b", p) == 0, "symlink");
  snprintf(p, sizeof p, "%s/c", dir);
  TU_CHECK(symlink("a", p) == 0, "symlink");

  moe_text *t = NULL;
  snprintf(spec, sizeof spec, "fortunes:%s", dir);
  TU_CHECK(moe_text_load(ctx, spec, 0, &t) == MOE_STATUS_OK, "%s: %s", spec, moe_ctx_error(ctx));
  if (t) {
    TU_CHECK(moe_text_size(t) == 11 && memcmp(moe_text_data(t), "AAAA\nBBB\n%\n", 11) == 0,
             "fortunes dir text '%.*s'", (int)moe_text_size(t), (const char *)moe_text_data(t));
    char want[700];
    snprintf(want, sizeof want, "fortunes: %s (2 files, 11 bytes)", dir);
    TU_CHECK(strcmp(moe_text_source(t), want) == 0, "source '%s'", moe_text_source(t));
  }
  moe_text_free(t);
  t = NULL;
  // min_bytes applies to every source.
  TU_CHECK(moe_text_load(ctx, spec, 12, &t) == MOE_STATUS_INVALID_ARG && !t &&
               strstr(moe_ctx_error(ctx), "11 bytes") && strstr(moe_ctx_error(ctx), "12"),
           "short fortunes dir: '%s'", moe_ctx_error(ctx));
  // A directory without fortune files, and a missing one, when asked for explicitly.
  tmp_path(dir, sizeof dir, "fort_empty");
  mkdir(dir, 0700);
  snprintf(p, sizeof p, "%s/x.dat", dir);
  write_file(p, "x", 1);
  snprintf(spec, sizeof spec, "fortunes:%s", dir);
  TU_CHECK(moe_text_load(ctx, spec, 0, &t) == MOE_STATUS_IO && !t &&
               strstr(moe_ctx_error(ctx), "no fortune file"),
           "empty fortunes dir: '%s'", moe_ctx_error(ctx));
  TU_CHECK(moe_text_load(ctx, "fortunes:/nonexistent/dir", 0, &t) == MOE_STATUS_IO && !t &&
               strstr(moe_ctx_error(ctx), "/nonexistent/dir"),
           "missing fortunes dir: '%s'", moe_ctx_error(ctx));
}

static void test_user_file(moe_ctx *ctx) {
  char path[512], empty[512];
  static const char text[] = "The quick brown fox\njumps over the lazy dog.\n\xff\x00\x01";
  const size_t n = sizeof text - 1;  // raw bytes, NUL included
  tmp_path(path, sizeof path, "user.txt");
  write_file(path, text, n);
  moe_text *t = NULL;
  TU_CHECK(moe_text_load(ctx, path, n, &t) == MOE_STATUS_OK, "user file: %s", moe_ctx_error(ctx));
  if (t) {
    TU_CHECK(moe_text_size(t) == n && memcmp(moe_text_data(t), text, n) == 0,
             "user file bytes differ");
    char want[700];
    snprintf(want, sizeof want, "file: %s (%zu bytes)", path, n);
    TU_CHECK(strcmp(moe_text_source(t), want) == 0, "source '%s'", moe_text_source(t));
  }
  moe_text_free(t);
  t = NULL;

  // Errors: each with its status, *out NULL, and a message naming the problem.
  TU_CHECK(moe_text_load(ctx, path, n + 1, &t) == MOE_STATUS_INVALID_ARG && !t,
           "too short: no error");
  char want[64];
  snprintf(want, sizeof want, "has %zu bytes; at least %zu", n, n + 1);
  TU_CHECK(strstr(moe_ctx_error(ctx), want) != NULL, "too short: '%s'", moe_ctx_error(ctx));
  tmp_path(empty, sizeof empty, "empty.txt");
  write_file(empty, "", 0);
  TU_CHECK(moe_text_load(ctx, empty, 0, &t) == MOE_STATUS_INVALID_ARG && !t &&
               strstr(moe_ctx_error(ctx), "is empty"),
           "empty: '%s'", moe_ctx_error(ctx));
  TU_CHECK(moe_text_load(ctx, "/nonexistent/corpus.txt", 0, &t) == MOE_STATUS_IO && !t &&
               strstr(moe_ctx_error(ctx), "/nonexistent/corpus.txt") &&
               strstr(moe_ctx_error(ctx), "No such file"),
           "missing: '%s'", moe_ctx_error(ctx));
  TU_CHECK(moe_text_load(ctx, g_tmp, 0, &t) == MOE_STATUS_IO && !t &&
               strstr(moe_ctx_error(ctx), "not a regular file"),
           "directory: '%s'", moe_ctx_error(ctx));
  // The early check of a source (what moe train does before anything else).
  TU_CHECK(moe_text_check_source(ctx, NULL) == MOE_STATUS_OK &&
               moe_text_check_source(ctx, "generated:") == MOE_STATUS_OK &&
               moe_text_check_source(ctx, empty) == MOE_STATUS_OK,
           "valid sources: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_text_check_source(ctx, g_tmp) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "not a regular file"),
           "a directory: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_text_check_source(ctx, "/nonexistent/corpus.txt") == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "No such file"),
           "a missing file: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_text_check_source(ctx, "fortunes:/nonexistent/dir") == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "not a readable directory"),
           "a missing fortunes directory: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_text_load(ctx, "", 0, &t) == MOE_STATUS_INVALID_ARG && !t, "empty path");
  TU_CHECK(moe_text_load(ctx, "generated:", MOE_TEXT_GENERATED_BYTES + 1, &t) ==
                   MOE_STATUS_INVALID_ARG &&
               !t,
           "generated shorter than min_bytes");
  TU_CHECK(moe_text_load(ctx, path, 0, NULL) == MOE_STATUS_INVALID_ARG, "NULL out");
}

// ---- split -------------------------------------------------------------------------

// Checks the spans against the documented rule for `groups` groups: train and
// val segments alternate and tile the text exactly, in order.
static void check_split_rule(const moe_text *t, double f, int groups, const moe_text_span *tr,
                             const moe_text_span *va) {
  const uint8_t *base = moe_text_data(t);
  const size_t n = moe_text_size(t);
  TU_CHECK(tr->nseg == groups && va->nseg == groups, "segments %d/%d, want %d", tr->nseg, va->nseg,
           groups);
  if (tr->nseg != groups || va->nseg != groups) return;
  size_t at = 0, ts = 0, vs = 0;
  int bad = 0;
  for (int g = 0; g < groups; g++) {
    const size_t a = (size_t)g * n / (size_t)groups, b = (size_t)(g + 1) * n / (size_t)groups;
    const size_t v = (size_t)llround((double)(b - a) * f);
    if (tr->seg[g].data != base + a || tr->seg[g].size != b - a - v ||
        va->seg[g].data != base + b - v || va->seg[g].size != v || a != at) {
      if (bad++ < 5)
        printf("  group %d: train [%td, +%zu) val [%td, +%zu), want [%zu, +%zu) [%zu, +%zu)\n", g,
               tr->seg[g].data - base, tr->seg[g].size, va->seg[g].data - base, va->seg[g].size, a,
               b - a - v, b - v, v);
    }
    at = b;
    ts += tr->seg[g].size;
    vs += va->seg[g].size;
  }
  TU_CHECK(bad == 0, "%d groups differ from the rule", bad);
  TU_CHECK(at == n && ts == tr->size && vs == va->size && ts + vs == n,
           "spans do not tile the text: train %zu + val %zu vs %zu", tr->size, va->size, n);
}

static void test_split(moe_ctx *ctx) {
  moe_text *t = NULL, *small = NULL, *mid = NULL;
  moe_text_span tr, va;
  TU_CHECK(moe_text_load(ctx, "generated:", 0, &t) == MOE_STATUS_OK, "generated");
  if (!t) return;
  const size_t n = moe_text_size(t);
  TU_CHECK(moe_text_split(ctx, t, 0.1, 64, &tr, &va) == MOE_STATUS_OK, "split: %s",
           moe_ctx_error(ctx));
  check_split_rule(t, 0.1, 64, &tr, &va);
  TU_CHECK(fabs((double)va.size - 0.1 * (double)n) <= 64, "val %zu bytes, want about %.0f", va.size,
           0.1 * (double)n);
  TU_CHECK(moe_text_split(ctx, t, 0.5, 1024, &tr, &va) == MOE_STATUS_OK, "split 0.5");
  check_split_rule(t, 0.5, 64, &tr, &va);

  // Bad fractions and lengths.
  const double bad_f[] = {0.0, -0.1, 0.51, 1.0, NAN};
  for (int i = 0; i < 5; i++) {
    TU_CHECK(moe_text_split(ctx, t, bad_f[i], 64, &tr, &va) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "val_fraction"),
             "val_fraction %g accepted ('%s')", bad_f[i], moe_ctx_error(ctx));
  }
  TU_CHECK(moe_text_split(ctx, t, 0.1, 0, &tr, &va) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "seq_len"),
           "seq_len 0 accepted");

  // A small text: one group; too small for a validation window at 0.1.
  char path[512];
  uint8_t buf[100000];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)('a' + i % 26);
  tmp_path(path, sizeof path, "small.txt");
  write_file(path, buf, 100);
  TU_CHECK(moe_text_load(ctx, path, 0, &small) == MOE_STATUS_OK, "small");
  if (small) {
    TU_CHECK(moe_text_split(ctx, small, 0.1, 10, &tr, &va) == MOE_STATUS_INVALID_ARG &&
                 strstr(moe_ctx_error(ctx), "100 bytes") &&
                 strstr(moe_ctx_error(ctx), "90 training and 10 validation") &&
                 strstr(moe_ctx_error(ctx), "11 bytes"),
             "small split: '%s'", moe_ctx_error(ctx));
    TU_CHECK(moe_text_split(ctx, small, 0.2, 10, &tr, &va) == MOE_STATUS_OK, "small 0.2: %s",
             moe_ctx_error(ctx));
    check_split_rule(small, 0.2, 1, &tr, &va);
  }
  // 100000 bytes: 3 groups by size, but S = 4000 needs groups of >= 40010 bytes
  // at 0.1 for a validation window each: 2 groups.
  tmp_path(path, sizeof path, "mid.txt");
  write_file(path, buf, sizeof buf);
  TU_CHECK(moe_text_load(ctx, path, 0, &mid) == MOE_STATUS_OK, "mid");
  if (mid) {
    TU_CHECK(moe_text_split(ctx, mid, 0.1, 4000, &tr, &va) == MOE_STATUS_OK, "mid split");
    check_split_rule(mid, 0.1, 2, &tr, &va);
    TU_CHECK(moe_text_split(ctx, mid, 0.1, 64, &tr, &va) == MOE_STATUS_OK, "mid split 64");
    check_split_rule(mid, 0.1, 3, &tr, &va);
  }
  moe_text_free(t);
  moe_text_free(small);
  moe_text_free(mid);
}

// ---- batches -----------------------------------------------------------------------

// The documented sampler, written again: start of global sequence j at `step`.
static const uint8_t *ref_start(const moe_text_span *sp, uint64_t seed, uint64_t step, int j,
                                int S) {
  uint64_t starts = 0;
  for (int s = 0; s < sp->nseg; s++)
    if (sp->seg[s].size >= (size_t)S + 1) starts += sp->seg[s].size - (size_t)S;
  const uint64_t key64 = seed ^ MOE_DATA_KEY_TAG;
  const uint32_t key[2] = {(uint32_t)key64, (uint32_t)(key64 >> 32)};
  const uint64_t below = (0 - starts) % starts;  // 2^64 mod starts: rejected draws
  uint64_t u = 0;
  for (uint32_t a = 0;; a++) {
    const uint32_t ctr[4] = {(uint32_t)j, a, (uint32_t)step, (uint32_t)(step >> 32)};
    uint32_t r[4];
    moe_philox4x32_10(ctr, key, r);
    const uint64_t x0 = (uint64_t)r[0] | (uint64_t)r[1] << 32;
    const uint64_t x1 = (uint64_t)r[2] | (uint64_t)r[3] << 32;
    if (x0 >= below || x1 >= below) {
      u = (x0 >= below ? x0 : x1) % starts;
      break;
    }
  }
  for (int s = 0; s < sp->nseg; s++) {
    const uint64_t here = sp->seg[s].size >= (size_t)S + 1 ? sp->seg[s].size - (size_t)S : 0;
    if (u < here) return sp->seg[s].data + u;
    u -= here;
  }
  return NULL;
}

static void test_batch_train(moe_ctx *ctx) {
  moe_text *t = NULL;
  moe_text_span tr, va;
  TU_CHECK(moe_text_load(ctx, "generated:", 0, &t) == MOE_STATUS_OK, "generated");
  if (!t) return;
  TU_CHECK(moe_text_split(ctx, t, 0.1, 64, &tr, &va) == MOE_STATUS_OK, "split");
  enum { B = 16, S = 64 };
  static int32_t tok[B * S], tgt[B * S], tok2[B * S], tgt2[B * S], rtok[B * S], rtgt[B * S];

  for (uint64_t step = 0; step < 3; step++) {
    moe_batch_train(&tr, 1234, step, 0, B, S, tok, tgt);
    // The reference from the documented formula.
    for (int j = 0; j < B; j++) {
      const uint8_t *p = ref_start(&tr, 1234, step, j, S);
      for (int i = 0; i < S; i++) {
        rtok[j * S + i] = p ? p[i] : -1;
        rtgt[j * S + i] = p ? p[i + 1] : -1;
      }
    }
    tu_equal_i32("train tokens vs reference", tok, rtok, B * S);
    tu_equal_i32("train targets vs reference", tgt, rtgt, B * S);
    // Determinism: the same call again.
    moe_batch_train(&tr, 1234, step, 0, B, S, tok2, tgt2);
    tu_equal_i32("train tokens repeat", tok2, tok, B * S);
    tu_equal_i32("train targets repeat", tgt2, tgt, B * S);
    // DP: 2 ranks of B/2 and 4 ranks of B/4 fill the same global batch.
    for (int P = 2; P <= 4; P *= 2) {
      memset(tok2, 0xff, sizeof tok2);
      memset(tgt2, 0xff, sizeof tgt2);
      for (int r = 0; r < P; r++)
        moe_batch_train(&tr, 1234, step, r * B / P, B / P, S, tok2 + r * (B / P) * S,
                        tgt2 + r * (B / P) * S);
      char name[64];
      snprintf(name, sizeof name, "DP P=%d tokens (step %d)", P, (int)step);
      tu_equal_i32(name, tok2, tok, B * S);
      snprintf(name, sizeof name, "DP P=%d targets (step %d)", P, (int)step);
      tu_equal_i32(name, tgt2, tgt, B * S);
    }
    // Targets are the tokens shifted by one.
    int shifted = 1;
    for (int j = 0; j < B; j++)
      for (int i = 0; i + 1 < S; i++) shifted &= tgt[j * S + i] == tok[j * S + i + 1];
    TU_CHECK(shifted, "targets are not tokens shifted by one");
  }
  // Another step and another seed give other batches.
  moe_batch_train(&tr, 1234, 0, 0, B, S, tok, tgt);
  moe_batch_train(&tr, 1234, 1, 0, B, S, tok2, tgt2);
  TU_CHECK(memcmp(tok, tok2, sizeof tok) != 0, "steps 0 and 1 give the same batch");
  moe_batch_train(&tr, 1235, 0, 0, B, S, tok2, tgt2);
  TU_CHECK(memcmp(tok, tok2, sizeof tok) != 0, "seeds 1234 and 1235 give the same batch");
  moe_text_free(t);
}

// Tiny spans: exactly one window; two starts; a segment too short for any.
static void test_batch_tiny(void) {
  enum { S = 8, N = 4000 };
  uint8_t buf[64];
  for (int i = 0; i < 64; i++) buf[i] = (uint8_t)(100 + i);
  static int32_t tok[N * S], tgt[N * S];

  moe_text_span sp = moe_text_span_of(buf, S + 1);
  moe_batch_train(&sp, 7, 3, 0, N, S, tok, tgt);
  int ok = 1;
  for (int j = 0; j < N; j++)
    for (int i = 0; i < S; i++) ok &= tok[j * S + i] == 100 + i && tgt[j * S + i] == 101 + i;
  TU_CHECK(ok, "span of S+1 bytes: not every sequence is the whole span");

  // Two segments: the first of S bytes holds no window, the second S+10: ten
  // starts, about uniform.
  moe_text_span two;
  memset(&two, 0, sizeof two);
  two.nseg = 2;
  two.seg[0].data = buf;
  two.seg[0].size = S;
  two.seg[1].data = buf + 20;
  two.seg[1].size = S + 10;
  two.size = 2 * S + 10;
  moe_batch_train(&two, 7, 3, 0, N, S, tok, tgt);
  int count[10] = {0}, out = 0;
  for (int j = 0; j < N; j++) {
    const int start = tok[j * S] - 120;
    if (start < 0 || start >= 10 || tgt[j * S + S - 1] != 120 + start + S) {
      out++;
    } else {
      count[start]++;
    }
  }
  TU_CHECK(out == 0, "%d sequences outside the valid starts of the span", out);
  for (int k = 0; k < 10; k++)
    TU_CHECK(count[k] > N / 10 - 4 * 20 && count[k] < N / 10 + 4 * 20,
             "start %d drawn %d times of %d (not uniform)", k, count[k], N);
}

// Validation windows: in order, non-overlapping, covering each segment.
static void test_batch_val(moe_ctx *ctx) {
  moe_text *t = NULL;
  moe_text_span tr, va;
  TU_CHECK(moe_text_load(ctx, "generated:", 0, &t) == MOE_STATUS_OK, "generated");
  if (!t) return;
  enum { S = 100 };
  TU_CHECK(moe_text_split(ctx, t, 0.1, S, &tr, &va) == MOE_STATUS_OK, "split");
  int want = 0;
  for (int s = 0; s < va.nseg; s++) want += (int)((va.seg[s].size - 1) / S);
  const int nw = moe_batch_val_windows(&va, S);
  TU_CHECK(nw == want && nw > 2000, "val windows %d, want %d", nw, want);
  TU_CHECK(moe_batch_val_windows(&va, 0) == 0, "windows for seq_len 0");

  int32_t *tok = malloc(sizeof(int32_t) * (size_t)nw * S);
  int32_t *tgt = malloc(sizeof(int32_t) * (size_t)nw * S);
  int32_t *ref_tok = malloc(sizeof(int32_t) * (size_t)nw * S);
  int32_t *ref_tgt = malloc(sizeof(int32_t) * (size_t)nw * S);
  int w = 0;
  for (int s = 0; s < va.nseg; s++) {
    for (size_t k = 0; k * S + S < va.seg[s].size; k++, w++) {
      for (int i = 0; i < S; i++) {
        ref_tok[(size_t)w * S + i] = va.seg[s].data[k * S + i];
        ref_tgt[(size_t)w * S + i] = va.seg[s].data[k * S + i + 1];
      }
    }
  }
  TU_CHECK(w == nw, "reference counted %d windows, library %d", w, nw);
  moe_batch_val(&va, 0, nw, S, tok, tgt);
  tu_equal_i32("val tokens (all windows)", tok, ref_tok, (size_t)nw * S);
  tu_equal_i32("val targets (all windows)", tgt, ref_tgt, (size_t)nw * S);
  // Slices that start mid-segment and run over segment ends, as ranks take them.
  const int firsts[] = {0, 1, 30, nw / 3, nw - 7};
  for (int k = 0; k < 5; k++) {
    const int cnt = firsts[k] + 37 <= nw ? 37 : nw - firsts[k];
    moe_batch_val(&va, firsts[k], cnt, S, tok, tgt);
    char name[64];
    snprintf(name, sizeof name, "val tokens from window %d", firsts[k]);
    tu_equal_i32(name, tok, ref_tok + (size_t)firsts[k] * S, (size_t)cnt * S);
    snprintf(name, sizeof name, "val targets from window %d", firsts[k]);
    tu_equal_i32(name, tgt, ref_tgt + (size_t)firsts[k] * S, (size_t)cnt * S);
  }
  free(tok);
  free(tgt);
  free(ref_tok);
  free(ref_tgt);
  moe_text_free(t);
}

// No window crosses between train and val text: a copy of the text whose
// validation bytes have the top bit set and training bytes not, sampled
// through spans with the same segments.
static void test_no_crossing(moe_ctx *ctx) {
  moe_text *t = NULL;
  moe_text_span tr, va;
  TU_CHECK(moe_text_load(ctx, "generated:", 0, &t) == MOE_STATUS_OK, "generated");
  if (!t) return;
  enum { S = 256, B = 64 };
  TU_CHECK(moe_text_split(ctx, t, 0.25, S, &tr, &va) == MOE_STATUS_OK, "split");
  const uint8_t *base = moe_text_data(t);
  const size_t n = moe_text_size(t);
  uint8_t *tag = malloc(n);
  for (size_t i = 0; i < n; i++) tag[i] = base[i] & 0x7f;
  moe_text_span ttr = tr, tva = va;
  for (int s = 0; s < va.nseg; s++) {
    const size_t off = (size_t)(va.seg[s].data - base);
    for (size_t i = 0; i < va.seg[s].size; i++) tag[off + i] |= 0x80;
    tva.seg[s].data = tag + off;
    ttr.seg[s].data = tag + (tr.seg[s].data - base);
  }
  static int32_t tok[B * S], tgt[B * S];
  int bad_train = 0, bad_val = 0;
  for (uint64_t step = 0; step < 200; step++) {
    moe_batch_train(&ttr, 99, step, 0, B, S, tok, tgt);
    for (int i = 0; i < B * S; i++) bad_train += (tok[i] | tgt[i]) >= 0x80;
  }
  const int nw = moe_batch_val_windows(&tva, S);
  for (int w = 0; w < nw; w += B) {
    const int cnt = w + B <= nw ? B : nw - w;
    moe_batch_val(&tva, w, cnt, S, tok, tgt);
    for (int i = 0; i < cnt * S; i++) bad_val += tok[i] < 0x80 || tgt[i] < 0x80;
  }
  TU_CHECK(bad_train == 0, "%d training tokens read validation text", bad_train);
  TU_CHECK(bad_val == 0, "%d validation tokens read training text", bad_val);
  free(tag);
  moe_text_free(t);
}

// ---- outputs ---------------------------------------------------------------------------

static void test_metrics(moe_ctx *ctx) {
  char path[512];
  tmp_path(path, sizeof path, "metrics.jsonl");
  moe_metrics *m = NULL;
  TU_CHECK(moe_metrics_open(ctx, path, 0, &m) == MOE_STATUS_OK, "open: %s", moe_ctx_error(ctx));
  if (!m) return;
  const char *names[] = {"aux_loss", "we\"ird\\name"};
  const double values[] = {0.0125, NAN};
  TU_CHECK(moe_metrics_write(m, 1, 5.4321, NAN, 12345.678, 0.25, 3e-4, 1.5, names, values, 2) ==
               MOE_STATUS_OK,
           "write 1");
  TU_CHECK(
      moe_metrics_write(m, 2, 4.125, 4.5, INFINITY, 0.3, 3e-4, 2.5, NULL, NULL, 0) == MOE_STATUS_OK,
      "write 2");
  const char *dup[] = {"loss"};
  TU_CHECK(moe_metrics_write(m, 3, 1, 1, 1, 1, 1, 1, dup, values, 1) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "'loss'"),
           "duplicate key accepted: '%s'", moe_ctx_error(ctx));
  moe_metrics_close(m);
  m = NULL;
  TU_CHECK(moe_metrics_open(ctx, path, 1, &m) == MOE_STATUS_OK, "append");
  TU_CHECK(
      moe_metrics_write(m, 3, 1.0 / 3.0, NAN, 1e9, NAN, 0, 3.5, NULL, NULL, 0) == MOE_STATUS_OK,
      "write 3");
  moe_metrics_close(m);
  moe_metrics_close(NULL);

  char *text = slurp(path, NULL);
  TU_CHECK(text != NULL, "metrics file missing");
  if (!text) return;
  int lines = 0;
  const double want_loss[] = {5.4321, 4.125, 1.0 / 3.0};
  for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    cJSON *o = cJSON_Parse(l);
    TU_CHECK(o && cJSON_IsObject(o), "line %d is not a JSON object: %s", lines + 1, l);
    if (!o) continue;
    const char *keys[] = {"step", "loss", "tokens_per_s", "a2a_share", "lr", "time_s"};
    for (int k = 0; k < 6; k++)
      TU_CHECK(cJSON_HasObjectItem(o, keys[k]), "line %d lacks \"%s\": %s", lines + 1, keys[k], l);
    const cJSON *step = cJSON_GetObjectItem(o, "step");
    const cJSON *loss = cJSON_GetObjectItem(o, "loss");
    TU_CHECK(cJSON_IsNumber(step) && step->valueint == lines + 1, "step in line %d", lines + 1);
    if (lines < 3)
      TU_CHECK(cJSON_IsNumber(loss) &&
                   fabs(loss->valuedouble - want_loss[lines]) <= 1e-8 * fabs(want_loss[lines]),
               "loss in line %d: %s", lines + 1, l);
    const int has_val = cJSON_HasObjectItem(o, "val_loss");
    TU_CHECK(has_val == (lines == 1), "val_loss present=%d in line %d: %s", has_val, lines + 1, l);
    if (lines == 0) {
      TU_CHECK(cJSON_IsNumber(cJSON_GetObjectItem(o, "aux_loss")) &&
                   cJSON_GetObjectItem(o, "aux_loss")->valuedouble == 0.0125,
               "extra field aux_loss: %s", l);
      TU_CHECK(cJSON_IsNull(cJSON_GetObjectItem(o, "we\"ird\\name")), "escaped NaN extra: %s", l);
    }
    if (lines == 1) {
      TU_CHECK(cJSON_IsNull(cJSON_GetObjectItem(o, "tokens_per_s")), "inf as null: %s", l);
      TU_CHECK(cJSON_GetObjectItem(o, "val_loss")->valuedouble == 4.5, "val_loss: %s", l);
    }
    if (lines == 2) TU_CHECK(cJSON_IsNull(cJSON_GetObjectItem(o, "a2a_share")), "NaN a2a: %s", l);
    cJSON_Delete(o);
    lines++;
  }
  TU_CHECK(lines == 3, "metrics file has %d lines, want 3", lines);
  free(text);

  TU_CHECK(moe_metrics_open(ctx, "/nonexistent/dir/m.jsonl", 0, &m) == MOE_STATUS_IO && !m &&
               strstr(moe_ctx_error(ctx), "/nonexistent/dir/m.jsonl"),
           "unwritable metrics path: '%s'", moe_ctx_error(ctx));
}

static char *read_stream(FILE *f) {
  fflush(f);
  const long n = ftell(f);
  rewind(f);
  char *buf = calloc((size_t)n + 1, 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) buf[0] = '\0';
  return buf;
}

static void test_progress(moe_ctx *ctx) {
  // Plain lines.
  FILE *f = tmpfile();
  moe_progress *p = NULL;
  TU_CHECK(moe_progress_create(ctx, f, 0, 10, &p) == MOE_STATUS_OK, "create");
  if (!p) return;
  moe_progress_update(p, 1, 2.0 * log(2.0), 2.5, 52300, 0.234, 1.0);  // 2 bits/byte
  moe_progress_update(p, 2, 1.5, NAN, 1.5e6, NAN, 1.5);
  moe_progress_update(p, 3, 1.25, NAN, 800, 0.5, 2.0);
  moe_progress_finish(p);
  moe_progress_free(p);
  char *out = read_stream(f);
  fclose(f);
  printf("progress (plain):\n%s", out);
  const char *want[3][6] = {
      {"step 1/10 ", "loss 1.3863 (2.000 bpb)", "val 2.5000 (3.607 bpb) |", "52.3k tok/s",
       "a2a 23.4%", "ETA -"},
      {"step 2/10 ", "loss 1.5000", "val 2.5000 (3.607 bpb)@1", "1.50M tok/s", "a2a -",
       "ETA 4.0 s"},
      {"step 3/10 ", "loss 1.2500", "@1", "800 tok/s", "a2a 50.0%", "ETA 3.5 s"}};
  int lines = 0;
  for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (lines < 3)
      for (int k = 0; k < 6; k++)
        TU_CHECK(strstr(l, want[lines][k]) != NULL, "line %d lacks '%s': %s", lines + 1,
                 want[lines][k], l);
    TU_CHECK(!strchr(l, '\r') && !strchr(l, '\033'), "control characters in a plain line");
    lines++;
  }
  TU_CHECK(lines == 3, "%d plain lines for 3 updates", lines);
  free(out);

  // In place: "\r" per update, no "\n" until finish, then one.
  f = tmpfile();
  TU_CHECK(moe_progress_create(ctx, f, 1, 10, &p) == MOE_STATUS_OK, "create tty");
  if (!p) return;
  moe_progress_update(p, 1, 2.0, NAN, 1000, 0.1, 1.0);
  moe_progress_update(p, 2, 1.9, 2.1, 1000, 0.1, 2.0);
  out = read_stream(f);
  int cr = 0;
  for (char *c = out; *c; c++) cr += *c == '\r';
  TU_CHECK(cr == 2 && !strchr(out, '\n') && strstr(out, "\033[K"),
           "tty before finish: %d '\\r', newline %s", cr, strchr(out, '\n') ? "present" : "absent");
  free(out);
  fseek(f, 0, SEEK_END);
  moe_progress_finish(p);
  moe_progress_free(p);
  out = read_stream(f);
  const size_t len = strlen(out);
  TU_CHECK(len > 0 && out[len - 1] == '\n' && strchr(out, '\n') == out + len - 1,
           "tty after finish: not exactly one final newline");
  free(out);
  fclose(f);
  moe_progress_free(NULL);
  TU_CHECK(moe_progress_create(ctx, stderr, 0, 0, &p) == MOE_STATUS_INVALID_ARG && !p &&
               strstr(moe_ctx_error(ctx), "total steps"),
           "0 total steps accepted");
}

static void test_plot(moe_ctx *ctx) {
  char metrics[512], out[512], dat[600], gp[600], bad[512];
  tmp_path(metrics, sizeof metrics, "plot.jsonl");
  moe_metrics *m = NULL;
  TU_CHECK(moe_metrics_open(ctx, metrics, 0, &m) == MOE_STATUS_OK, "open");
  if (!m) return;
  for (int s = 1; s <= 50; s++)
    moe_metrics_write(m, s, 5.5 * exp(-s / 20.0) + 1.0,
                      s % 10 == 0 ? 5.6 * exp(-s / 20.0) + 1.1 : NAN, 1e4, 0.2, 1e-3, s * 0.1, NULL,
                      NULL, 0);
  moe_metrics_write(m, 51, NAN, NAN, 1e4, 0.2, 1e-3, 5.1, NULL, NULL, 0);  // null loss: skipped
  moe_metrics_close(m);

  tmp_path(out, sizeof out, "loss.txt");
  snprintf(dat, sizeof dat, "%s.dat", out);
  snprintf(gp, sizeof gp, "%s.gp", out);
  const moe_status st = moe_plot_loss(ctx, metrics, out);
  size_t n = 0;
  char *d = slurp(dat, NULL);
  int rows = 0;
  for (char *c = d; c && *c; c++) rows += *c == '\n';
  TU_CHECK(d && strstr(d, "# validation loss") && rows == 50 + 5 + 4,
           "data file: %d lines (want 50 train + 5 val + 4 comment/blank)", rows);
  free(d);
  if (moe_gnuplot_available()) {
    TU_CHECK(st == MOE_STATUS_OK, "plot: %s", moe_ctx_error(ctx));
    char *txt = slurp(out, &n);
    TU_CHECK(txt && n > 100 && strstr(txt, "train"), "text plot missing or empty (%zu bytes)", n);
    if (txt) printf("loss plot (dumb terminal):\n%s\n", txt);
    free(txt);
    tmp_path(out, sizeof out, "loss.svg");
    TU_CHECK(moe_plot_loss(ctx, metrics, out) == MOE_STATUS_OK, "svg: %s", moe_ctx_error(ctx));
    txt = slurp(out, &n);
    TU_CHECK(txt && n > 100 && strstr(txt, "<svg"), "svg plot missing or empty");
    free(txt);
  } else {
    printf("gnuplot is not installed: checking the UNSUPPORTED path only\n");
    TU_CHECK(st == MOE_STATUS_UNSUPPORTED && strstr(moe_ctx_error(ctx), "not installed"),
             "plot without gnuplot: %s", moe_ctx_error(ctx));
  }
  // Without gnuplot on PATH: UNSUPPORTED, saying so, script written.
  char *saved = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
  setenv("PATH", "/nonexistent", 1);
  tmp_path(out, sizeof out, "nognuplot.png");
  TU_CHECK(moe_plot_loss(ctx, metrics, out) == MOE_STATUS_UNSUPPORTED &&
               strstr(moe_ctx_error(ctx), "gnuplot is not installed"),
           "no gnuplot: '%s'", moe_ctx_error(ctx));
  if (saved) {
    setenv("PATH", saved, 1);
    free(saved);
  }
  snprintf(gp, sizeof gp, "%s.gp", out);
  char *script = slurp(gp, NULL);
  TU_CHECK(script && strstr(script, "pngcairo") && strstr(script, "index 1"), "png script: %s",
           script ? script : "(missing)");
  free(script);

  // Bad input.
  tmp_path(bad, sizeof bad, "bad.jsonl");
  write_file(bad, "{\"step\":1,\"loss\":2}\n\nnot json\n", 29);
  TU_CHECK(moe_plot_loss(ctx, bad, out) == MOE_STATUS_BAD_FORMAT &&
               strstr(moe_ctx_error(ctx), ":3: not a JSON object"),
           "bad metrics: '%s'", moe_ctx_error(ctx));
  write_file(bad, "{\"step\":1}\n", 11);
  TU_CHECK(moe_plot_loss(ctx, bad, out) == MOE_STATUS_BAD_FORMAT &&
               strstr(moe_ctx_error(ctx), "\"loss\""),
           "no loss: '%s'", moe_ctx_error(ctx));
  write_file(bad, "", 0);
  TU_CHECK(moe_plot_loss(ctx, bad, out) == MOE_STATUS_BAD_FORMAT &&
               strstr(moe_ctx_error(ctx), "no finite training loss"),
           "empty metrics: '%s'", moe_ctx_error(ctx));
  TU_CHECK(moe_plot_loss(ctx, "/nonexistent/m.jsonl", out) == MOE_STATUS_IO, "missing metrics");
  TU_CHECK(moe_plot_loss(ctx, metrics, "/tmp/it's.png") == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "quotes"),
           "quoted plot path: '%s'", moe_ctx_error(ctx));
}

// Removes the files this run made (one directory level below g_tmp at most).
static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  char p[1024];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      remove_tree(p);
    } else {
      unlink(p);
    }
  }
  closedir(d);
  rmdir(dir);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  const char *tmpdir = getenv("TMPDIR");
  snprintf(g_tmp, sizeof g_tmp, "%s/moe_test_data_XXXXXX", tmpdir && tmpdir[0] ? tmpdir : "/tmp");
  if (!mkdtemp(g_tmp)) {
    perror("mkdtemp");
    return 1;
  }
  moe_ctx *ctx = NULL;
  if (moe_ctx_create(&ctx) != MOE_STATUS_OK) return 1;
  test_generated(ctx);
  test_default_corpus(ctx);
  test_fortunes_dir(ctx);
  test_user_file(ctx);
  test_split(ctx);
  test_batch_train(ctx);
  test_batch_tiny();
  test_batch_val(ctx);
  test_no_crossing(ctx);
  test_metrics(ctx);
  test_progress(ctx);
  test_plot(ctx);
  moe_ctx_destroy(ctx);
  remove_tree(g_tmp);
  return tu_finish("test_data");
}
