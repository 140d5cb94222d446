// libFuzzer harness: the text loader, moe_text_load and moe_text_check_source
// (include/moe/data.h), and what the trainer does next with a loaded text
// (moe_text_split, moe_batch_train, moe_batch_val).
//
// Input: 6 parameter bytes, then content.
//   byte 0   bit 0: 0 = one text file, 1 = a fortunes-style directory
//   byte 1   val_fraction = byte / 400 (0 .. 0.6375: invalid values included)
//   byte 2-3 seq_len = 1 + (little-endian 16 bits) % 512
//   byte 4   the content is repeated 1 + byte times (texts beyond one split
//            group of 32 KiB, up to 256 KiB)
//   byte 5   min_bytes = byte * 16
// A file text is the repeated content. A directory gets the content cut at
// NUL bytes into at most 8 pieces, piece i written to a file named by its
// first byte: "f<i>" normally, "f<i>.dat", "f<i>.u8" or ".f<i>" (which the
// loader must skip) when that byte is 'd', 'u' or '.'; plus a symlink and a
// subfolder, also to be skipped.
// Invariants checked:
//   - moe_text_check_source accepts what was written ("fortunes:DIR" for the
//     directory) and refuses, with a message, a missing file, a folder given
//     as a file, a file given as a folder;
//   - moe_text_load gives exactly the expected bytes (the pieces kept, in
//     name order) and fails, with a message, exactly when that is empty
//     (INVALID_ARG for a file, IO for a directory with nothing to read) or
//     shorter than min_bytes;
//   - moe_text_split, on success: train and validation have the same
//     number of segments in [1, 64], in text order, inside the text, not
//     overlapping, together covering it, each at least seq_len + 1 bytes; on
//     failure a message;
//   - moe_batch_train: every sequence is a window of one training segment,
//     targets the tokens shifted by one; moe_batch_val: window k of the
//     validation span is at k * seq_len of its segment, computed here.
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "moe/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TEXT ((size_t)256 << 10)

static char g_path[512];

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  FUZZ_CHECK(f != NULL, "cannot create %s: %s", path, strerror(errno));
  FUZZ_CHECK(n == 0 || fwrite(p, 1, n, f) == n, "short write to %s", path);
  FUZZ_CHECK(fclose(f) == 0, "close %s", path);
}

// Removes what the last input left in the scratch directory.
static void clean_dir(const char *dir) {
  static const char *const names[] = {"text", "sub", "link", "f0",  "f1",  "f2",  "f3",
                                      "f4",   "f5",  "f6",   "f7",  ".f0", ".f1", ".f2",
                                      ".f3",  ".f4", ".f5",  ".f6", ".f7"};
  char p[600];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    if (strcmp(names[i], "sub") == 0) {
      rmdir(p);
    } else {
      unlink(p);
    }
  }
  for (int i = 0; i < 8; i++) {
    snprintf(p, sizeof p, "%s/f%d.dat", dir, i);
    unlink(p);
    snprintf(p, sizeof p, "%s/f%d.u8", dir, i);
    unlink(p);
  }
}

// Writes the fortunes-style directory; returns the expected text (malloc'd),
// its length and the number of files the loader must read.
static unsigned char *write_fortunes(const char *dir, const uint8_t *c, size_t n, size_t *len,
                                     int *files) {
  unsigned char *want = malloc(n + 1);
  FUZZ_CHECK(want != NULL, "out of memory");
  *len = 0;
  *files = 0;
  char p[600];
  size_t at = 0;
  for (int i = 0; i < 8 && at <= n; i++) {
    const uint8_t *nul = i < 7 ? memchr(c + at, 0, n - at) : NULL;
    const size_t end = nul ? (size_t)(nul - c) : n;
    const uint8_t first = end > at ? c[at] : 0;
    const char *pre = first == '.' ? "." : "";
    const char *suf = first == 'd' ? ".dat" : first == 'u' ? ".u8" : "";
    snprintf(p, sizeof p, "%s/%sf%d%s", dir, pre, i, suf);
    write_file(p, c + at, end - at);
    if (first != 'd' && first != 'u' && first != '.') {  // a fortune file: read
      memcpy(want + *len, c + at, end - at);
      *len += end - at;
      ++*files;
    }
    at = end + 1;
  }
  snprintf(p, sizeof p, "%s/link", dir);
  FUZZ_CHECK(symlink("f0", p) == 0, "symlink %s: %s", p, strerror(errno));
  snprintf(p, sizeof p, "%s/sub", dir);
  FUZZ_CHECK(mkdir(p, 0700) == 0, "mkdir %s: %s", p, strerror(errno));
  return want;
}

static void check_sources(moe_ctx *ctx, const char *dir, const char *file) {
  char p[600];
  moe_status st = moe_text_check_source(ctx, "generated:");
  FUZZ_CHECK(st == MOE_STATUS_OK, "generated: refused: %s", moe_ctx_error(ctx));
  snprintf(p, sizeof p, "%s/missing", dir);
  st = moe_text_check_source(ctx, p);
  FUZZ_CHECK(st == MOE_STATUS_INVALID_ARG, "missing file gave %s", moe_status_str(st));
  fuzz_check_failure(ctx, st, "check_source of a missing file");
  st = moe_text_check_source(ctx, dir);
  FUZZ_CHECK(st == MOE_STATUS_INVALID_ARG, "a folder as a file gave %s", moe_status_str(st));
  fuzz_check_failure(ctx, st, "check_source of a folder");
  if (file) {
    st = moe_text_check_source(ctx, file);
    FUZZ_CHECK(st == MOE_STATUS_OK, "existing file refused: %s", moe_ctx_error(ctx));
    snprintf(p, sizeof p, "fortunes:%s", file);
    st = moe_text_check_source(ctx, p);
    FUZZ_CHECK(st == MOE_STATUS_INVALID_ARG, "a file as fortunes:DIR gave %s", moe_status_str(st));
    fuzz_check_failure(ctx, st, "check_source of fortunes:FILE");
  } else {
    snprintf(p, sizeof p, "fortunes:%s", dir);
    st = moe_text_check_source(ctx, p);
    FUZZ_CHECK(st == MOE_STATUS_OK, "fortunes:DIR refused: %s", moe_ctx_error(ctx));
  }
}

// Segments of a span: in order, inside [base, base + n), each >= need bytes.
static void check_span(const moe_text_span *s, const uint8_t *base, size_t n, size_t need,
                       const char *what) {
  FUZZ_CHECK(s->nseg >= 1 && s->nseg <= MOE_SPAN_MAX_SEGMENTS, "%s: %d segments", what, s->nseg);
  size_t sum = 0;
  for (int i = 0; i < s->nseg; i++) {
    const moe_text_segment *g = &s->seg[i];
    FUZZ_CHECK(g->data >= base && g->size <= n && (size_t)(g->data - base) <= n - g->size,
               "%s: segment %d outside the text", what, i);
    FUZZ_CHECK(g->size >= need, "%s: segment %d has %zu bytes, a window needs %zu", what, i,
               g->size, need);
    if (i > 0) {
      FUZZ_CHECK(g->data >= s->seg[i - 1].data + s->seg[i - 1].size,
                 "%s: segment %d overlaps or precedes segment %d", what, i, i - 1);
    }
    sum += g->size;
  }
  FUZZ_CHECK(sum == s->size, "%s: segments sum to %zu, size says %zu", what, sum, s->size);
}

static void check_split(moe_ctx *ctx, const moe_text *t, double f, int seq_len) {
  moe_text_span train, val;
  const moe_status st = moe_text_split(ctx, t, f, seq_len, &train, &val);
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_text_split");
    return;
  }
  FUZZ_CHECK(f > 0 && f <= 0.5, "split accepted val_fraction %g", f);
  const uint8_t *base = moe_text_data(t);
  const size_t n = moe_text_size(t), need = (size_t)seq_len + 1;
  check_span(&train, base, n, need, "train");
  check_span(&val, base, n, need, "val");
  FUZZ_CHECK(train.nseg == val.nseg, "%d train, %d validation segments", train.nseg, val.nseg);
  FUZZ_CHECK(train.size + val.size == n, "split covers %zu of %zu bytes", train.size + val.size, n);
  for (int i = 0; i < train.nseg; i++) {  // interleaved: train i, val i, train i + 1
    FUZZ_CHECK(val.seg[i].data == train.seg[i].data + train.seg[i].size,
               "validation segment %d does not follow training segment %d", i, i);
  }

  enum { NSEQ = 4 };
  int32_t *tok = malloc(NSEQ * (size_t)seq_len * sizeof *tok);
  int32_t *tgt = malloc(NSEQ * (size_t)seq_len * sizeof *tgt);
  uint8_t *window = malloc(need);
  FUZZ_CHECK(tok && tgt && window, "out of memory");
  moe_batch_train(&train, (uint64_t)n * 31 + (uint64_t)seq_len, 7, 3, NSEQ, seq_len, tok, tgt);
  for (int q = 0; q < NSEQ; q++) {
    const int32_t *a = tok + (size_t)q * seq_len, *b = tgt + (size_t)q * seq_len;
    for (int i = 0; i + 1 < seq_len; i++) {
      FUZZ_CHECK(b[i] == a[i + 1], "sequence %d: target %d is not the next token", q, i);
    }
    for (int i = 0; i < seq_len; i++) window[i] = (uint8_t)a[i];
    window[seq_len] = (uint8_t)b[seq_len - 1];
    int found = 0;  // the window's seq_len + 1 bytes lie in one training segment
    for (int s = 0; s < train.nseg && !found; s++) {
      found = memmem(train.seg[s].data, train.seg[s].size, window, need) != NULL;
    }
    FUZZ_CHECK(found, "training sequence %d is not a window of a training segment", q);
  }
  const int nwin = moe_batch_val_windows(&val, seq_len);
  size_t expect = 0;
  for (int s = 0; s < val.nseg; s++) expect += (val.seg[s].size - 1) / (size_t)seq_len;
  FUZZ_CHECK((size_t)nwin == expect, "%d validation windows, %zu expected", nwin, expect);
  const int first = nwin > NSEQ ? nwin - NSEQ : 0, count = nwin - first;
  moe_batch_val(&val, first, count, seq_len, tok, tgt);
  for (int q = 0; q < count; q++) {
    size_t w = (size_t)(first + q);
    int s = 0;
    while ((val.seg[s].size - 1) / (size_t)seq_len <= w) w -= (val.seg[s++].size - 1) / seq_len;
    const uint8_t *p = val.seg[s].data + w * (size_t)seq_len;
    for (int i = 0; i < seq_len; i++) {
      FUZZ_CHECK(tok[(size_t)q * seq_len + i] == p[i] && tgt[(size_t)q * seq_len + i] == p[i + 1],
                 "validation window %d differs at %d", first + q, i);
    }
  }
  free(window);
  free(tok);
  free(tgt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 6) return 0;
  const int fortunes = data[0] & 1;
  const double f = data[1] / 400.0;
  const int seq_len = 1 + (int)((data[2] | (unsigned)data[3] << 8) % 512u);
  const size_t reps = 1 + (size_t)data[4], min_bytes = (size_t)data[5] * 16;
  const uint8_t *c = data + 6;
  const size_t n = size - 6;

  moe_ctx *ctx = fuzz_ctx();
  const char *dir = fuzz_dir();
  clean_dir(dir);
  unsigned char *want = NULL;
  size_t want_len = 0;
  int files = 1;
  if (fortunes) {
    want = write_fortunes(dir, c, n, &want_len, &files);
    snprintf(g_path, sizeof g_path, "fortunes:%s", dir);
    check_sources(ctx, dir, NULL);
  } else {
    const size_t r = n ? (reps < MAX_TEXT / n ? reps : MAX_TEXT / n) : 1;
    want_len = n * (r ? r : 1);
    want = malloc(want_len + 1);
    FUZZ_CHECK(want != NULL, "out of memory");
    for (size_t k = 0; k * n < want_len; k++) memcpy(want + k * n, c, n);
    snprintf(g_path, sizeof g_path, "%s/text", dir);
    write_file(g_path, want, want_len);
    check_sources(ctx, dir, g_path);
  }

  moe_text *t = NULL;
  const moe_status st = moe_text_load(ctx, g_path, min_bytes, &t);
  const int should_fail = files == 0 || want_len == 0 || want_len < min_bytes;
  if (st != MOE_STATUS_OK) {
    fuzz_check_failure(ctx, st, "moe_text_load");
    FUZZ_CHECK(t == NULL, "failed load left a text");
    FUZZ_CHECK(should_fail, "loading %zu bytes (min %zu) failed: %s", want_len, min_bytes,
               moe_ctx_error(ctx));
    // no file to read: IO; an empty or short text: INVALID_ARG
    const moe_status expect = files == 0 ? MOE_STATUS_IO : MOE_STATUS_INVALID_ARG;
    FUZZ_CHECK(st == expect, "%zu bytes (min %zu): %s, expected %s", want_len, min_bytes,
               moe_status_str(st), moe_status_str(expect));
  } else {
    FUZZ_CHECK(!should_fail, "loaded %zu bytes with min %zu", want_len, min_bytes);
    FUZZ_CHECK(moe_text_size(t) == want_len, "loaded %zu bytes, wrote %zu", moe_text_size(t),
               want_len);
    FUZZ_CHECK(memcmp(moe_text_data(t), want, want_len) == 0, "loaded other bytes");
    FUZZ_CHECK(moe_text_source(t)[0] != '\0', "empty source line");
    check_split(ctx, t, f, seq_len);
  }
  moe_text_free(t);
  free(want);
  clean_dir(dir);
  moe_ctx_destroy(ctx);
  return 0;
}
