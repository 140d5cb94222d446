// Training text for MoE-GPT: loading (fortunes directory, generated fallback,
// user file), the interleaved train/validation split and the deterministic
// batch samplers declared in include/moe/data.h.
//
// Not a tokenizer (bytes are tokens) and not an epoch shuffler: every training
// sequence is an independent counter-based draw, so a batch depends only on
// (span, seed, step, global index) and DP sharding cannot change it.
#define _POSIX_C_SOURCE 200809L
#include "moe/data.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/json.h"

struct moe_text {
  uint8_t *data;  // size + 1 bytes (a NUL after the text, for convenience)
  size_t size;
  char source[512];
};

// ---- generated fallback --------------------------------------------------------
//
// A small template grammar in the style of a fortune file: entries separated
// by "%" lines, each a proverb, a quotation with an attribution, a riddle or a
// definition, word-wrapped at 72 columns. Driven by moe_rng with a fixed seed
// (not the training seed), so the fallback corpus is one fixed text.

typedef struct {
  const char *base, *third, *past;  // "eat", "eats", "ate"
} verb_forms;

static const char *const k_nouns[] = {
    "cat",      "computer", "program", "philosopher", "river",    "mountain", "teacher",
    "dragon",   "garden",   "kernel",  "compiler",    "sailor",   "library",  "bicycle",
    "merchant", "poet",     "machine", "window",      "question", "answer",   "friend",
    "stranger", "king",     "farmer",  "engineer",    "cook",     "child",    "owl",
    "lamp",     "clock",    "road",    "forest",      "idea",     "mistake",  "lawyer",
    "doctor",   "penguin",  "wizard",  "bug",         "manual",   "server",   "robot",
    "teapot",   "elephant", "village", "student",     "dream",    "ghost",    "spider"};
static const char *const k_adjs[] = {
    "wise",     "foolish", "quiet",   "ancient", "curious", "lazy",    "clever",   "broken",
    "patient",  "hungry",  "strange", "honest",  "tired",   "gentle",  "stubborn", "happy",
    "small",    "great",   "old",     "young",   "silent",  "noisy",   "golden",   "empty",
    "faithful", "modest",  "proud",   "brave",   "careful", "restless"};
static const char *const k_advs[] = {"slowly",  "quietly",   "never",    "always",    "gladly",
                                     "rarely",  "twice",     "loudly",   "wisely",    "often",
                                     "happily", "carefully", "suddenly", "eventually"};
static const verb_forms k_verbs[] = {{"eat", "eats", "ate"},
                                     {"find", "finds", "found"},
                                     {"love", "loves", "loved"},
                                     {"forget", "forgets", "forgot"},
                                     {"build", "builds", "built"},
                                     {"fix", "fixes", "fixed"},
                                     {"read", "reads", "read"},
                                     {"follow", "follows", "followed"},
                                     {"teach", "teaches", "taught"},
                                     {"chase", "chases", "chased"},
                                     {"trust", "trusts", "trusted"},
                                     {"debug", "debugs", "debugged"},
                                     {"sell", "sells", "sold"},
                                     {"keep", "keeps", "kept"},
                                     {"borrow", "borrows", "borrowed"},
                                     {"answer", "answers", "answered"},
                                     {"remember", "remembers", "remembered"},
                                     {"carry", "carries", "carried"},
                                     {"watch", "watches", "watched"},
                                     {"write", "writes", "wrote"}};
static const char *const k_names[] = {
    "Ada Lovelace", "Old Tom",      "Confucius",   "Mark Twain",    "Grandma Moses", "Dr. Zed",
    "Anonymous",    "Ken Thompson", "The Oracle",  "Aunt Agatha",   "Captain Nemo",  "Socrates",
    "Lao Tsu",      "Murphy",       "Brother Ivo", "Professor Plum"};
static const char *const k_books[] = {"The Book of Small Things", "Collected Sayings",
                                      "Notes from the Garden",    "The Art of Waiting",
                                      "A Manual for Kernels",     "Letters to a Young Cook"};

#define COUNT(arr) (sizeof(arr) / sizeof((arr)[0]))

// One pick each; callers pick into locals, one statement each, because the
// order in which C evaluates function arguments is unspecified and the text
// must not depend on the compiler.
static const char *noun(moe_rng *r) { return k_nouns[moe_rng_u32(r) % COUNT(k_nouns)]; }
static const char *adj(moe_rng *r) { return k_adjs[moe_rng_u32(r) % COUNT(k_adjs)]; }
static const char *adv(moe_rng *r) { return k_advs[moe_rng_u32(r) % COUNT(k_advs)]; }
static const verb_forms *verb(moe_rng *r) { return &k_verbs[moe_rng_u32(r) % COUNT(k_verbs)]; }
static const char *name(moe_rng *r) { return k_names[moe_rng_u32(r) % COUNT(k_names)]; }
static const char *book(moe_rng *r) { return k_books[moe_rng_u32(r) % COUNT(k_books)]; }

typedef struct {
  uint8_t *buf;
  size_t cap, len;  // bytes written; stops growing at cap
  int col;          // current column, for word wrap
} gen_out;

static void gen_raw(gen_out *o, const char *s) {
  for (; *s && o->len < o->cap; s++) {
    o->buf[o->len++] = (uint8_t)*s;
    o->col = *s == '\n' ? 0 : o->col + 1;
  }
}

// Appends a sentence word by word, wrapping before column 72.
static void gen_words(gen_out *o, const char *text) {
  char word[128];
  const char *p = text;
  while (*p) {
    size_t n = 0;
    while (p[n] && p[n] != ' ' && n + 1 < sizeof word) n++;
    memcpy(word, p, n);
    word[n] = '\0';
    p += n;
    while (*p == ' ') p++;
    if (o->col > 0 && o->col + 1 + (int)n > 72) {
      gen_raw(o, "\n");
    } else if (o->col > 0) {
      gen_raw(o, " ");
    }
    gen_raw(o, word);
  }
}

static void capitalise(char *s) {
  if (s[0] >= 'a' && s[0] <= 'z') s[0] = (char)(s[0] - 'a' + 'A');
}

// One clause such as "the lazy owl rarely reads the manual".
static void gen_clause(moe_rng *r, char *out, size_t cap) {
  const verb_forms *v = verb(r);
  const unsigned form = moe_rng_u32(r) % 4;
  const char *a1 = adj(r);
  const char *n1 = noun(r);
  const char *n2 = noun(r);
  const char *d1 = adv(r);
  switch (form) {
    case 0:
      snprintf(out, cap, "the %s %s %s %s the %s", a1, n1, d1, v->third, n2);
      break;
    case 1:
      snprintf(out, cap, "every %s %s a %s %s", n1, v->third, a1, n2);
      break;
    case 2:
      snprintf(out, cap, "a %s who %s %s is a %s %s", n1, v->past, d1, a1, n2);
      break;
    default:
      snprintf(out, cap, "no %s can %s a %s %s", n1, v->base, a1, n2);
      break;
  }
}

static void gen_entry(moe_rng *r, gen_out *o) {
  char s[512], c1[200], c2[200];
  const unsigned kind = moe_rng_u32(r) % 5;
  if (kind == 0) {  // proverb of one or two sentences
    gen_clause(r, c1, sizeof c1);
    capitalise(c1);
    snprintf(s, sizeof s, "%s.", c1);
    gen_words(o, s);
    if (moe_rng_u32(r) % 2) {
      const verb_forms *v1 = verb(r);
      const char *n1 = noun(r);
      const verb_forms *v2 = verb(r);
      const char *d1 = adv(r);
      snprintf(s, sizeof s, "Never %s a %s that %s %s.", v1->base, n1, v2->third, d1);
      gen_words(o, s);
    }
  } else if (kind == 1) {  // quotation with an attribution
    gen_clause(r, c1, sizeof c1);
    gen_clause(r, c2, sizeof c2);
    capitalise(c1);
    const verb_forms *v1 = verb(r);
    const char *n1 = noun(r);
    const char *n2 = noun(r);
    const verb_forms *v2 = verb(r);
    snprintf(s, sizeof s, "%s, but %s. If you %s the %s, the %s will %s you.", c1, c2, v1->base, n1,
             n2, v2->base);
    gen_words(o, s);
    gen_raw(o, "\n\t\t-- ");
    gen_raw(o, name(r));
    if (moe_rng_u32(r) % 3 == 0) {
      gen_raw(o, ", \"");
      gen_raw(o, book(r));
      gen_raw(o, "\"");
    }
  } else if (kind == 2) {  // riddle
    const char *a1 = adj(r);
    const char *n1 = noun(r);
    const verb_forms *v1 = verb(r);
    const char *n2 = noun(r);
    snprintf(s, sizeof s, "Q: Why did the %s %s %s the %s?", a1, n1, v1->base, n2);
    gen_words(o, s);
    gen_raw(o, "\n");
    gen_clause(r, c1, sizeof c1);
    snprintf(s, sizeof s, "A: Because %s.", c1);
    gen_words(o, s);
  } else if (kind == 3) {  // definition
    char head[64];
    snprintf(head, sizeof head, "%s, n.:", noun(r));
    capitalise(head);
    gen_raw(o, head);
    gen_raw(o, "\n\t");
    o->col = 8;
    gen_clause(r, c1, sizeof c1);
    capitalise(c1);
    snprintf(s, sizeof s, "%s, %s.", c1, adv(r));
    gen_words(o, s);
  } else {  // a short story of three sentences
    const char *who = name(r);
    const char *a1 = adj(r);
    const char *n1 = noun(r);
    const char *n2 = noun(r);
    snprintf(s, sizeof s, "%s once met a %s %s in the %s.", who, a1, n1, n2);
    gen_words(o, s);
    gen_clause(r, c1, sizeof c1);
    snprintf(s, sizeof s, "\"I have heard that %s,\" said the %s.", c1, noun(r));
    gen_words(o, s);
    gen_clause(r, c2, sizeof c2);
    const char *d1 = adv(r);
    const verb_forms *v1 = verb(r);
    snprintf(s, sizeof s, "%s %s %s and answered that %s.", who, d1, v1->past, c2);
    gen_words(o, s);
  }
  gen_raw(o, "\n%\n");
}

// Fills buf (size bytes) with the generated text, cut at exactly size bytes.
static void generate_text(uint8_t *buf, size_t size) {
  moe_rng r;
  moe_rng_init(&r, 0x666f7274756e6573ull /* "fortunes" */, 0);
  gen_out o = {buf, size, 0, 0};
  while (o.len < o.cap) gen_entry(&r, &o);
}

// ---- loading -------------------------------------------------------------------

static int has_suffix(const char *s, const char *suffix) {
  const size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Reads a fortunes-style directory: regular files (not symlinks, not *.dat /
// *.u8 / dot files) sorted by name, concatenated. Fails with IO (reason in
// ctx) when the directory cannot be read or holds no such file.
static moe_status load_fortunes_dir(moe_ctx *ctx, const char *dir, moe_text *t) {
  moe_status st = MOE_STATUS_OK;
  DIR *d = NULL;
  char **names = NULL;
  int nnames = 0, cap = 0;
  char path[4096];
  FILE *f = NULL;
  size_t total = 0;

  d = opendir(dir);
  MOE_FAIL_IF(ctx, !d, MOE_STATUS_IO, "cannot read the fortunes directory '%s': %s", dir,
              strerror(errno));
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const char *n = e->d_name;
    if (n[0] == '.' || has_suffix(n, ".dat") || has_suffix(n, ".u8")) continue;
    MOE_FAIL_IF(ctx, snprintf(path, sizeof path, "%s/%s", dir, n) >= (int)sizeof path,
                MOE_STATUS_IO, "path too long in '%s'", dir);
    struct stat sb;
    if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;  // symlinks, folders
    if (nnames == cap) {
      const int ncap = cap ? 2 * cap : 64;
      char **grown = moe_malloc((size_t)ncap * sizeof *grown);
      MOE_FAIL_IF(ctx, !grown, MOE_STATUS_OUT_OF_MEMORY, "out of memory listing '%s'", dir);
      if (nnames) memcpy(grown, names, (size_t)nnames * sizeof *grown);
      moe_free(names);
      names = grown;
      cap = ncap;
    }
    const size_t len = strlen(n);
    names[nnames] = moe_malloc(len + 1);
    MOE_FAIL_IF(ctx, !names[nnames], MOE_STATUS_OUT_OF_MEMORY, "out of memory listing '%s'", dir);
    memcpy(names[nnames++], n, len + 1);
    total += (size_t)sb.st_size;
  }
  MOE_FAIL_IF(ctx, nnames == 0, MOE_STATUS_IO,
              "the fortunes directory '%s' holds no fortune file (regular files other than "
              "*.dat and *.u8)",
              dir);
  qsort(names, (size_t)nnames, sizeof *names, cmp_names);

  t->data = moe_malloc(total + 1);
  MOE_FAIL_IF(ctx, !t->data, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes for '%s'",
              total + 1, dir);
  size_t at = 0;
  for (int i = 0; i < nnames; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    f = fopen(path, "rb");
    MOE_FAIL_IF(ctx, !f, MOE_STATUS_IO, "cannot open '%s': %s", path, strerror(errno));
    // Read what is there now (bounded by the listed total), so a file that
    // changed size since the listing cannot overflow the buffer.
    const size_t got = fread(t->data + at, 1, total - at, f);
    MOE_FAIL_IF(ctx, ferror(f), MOE_STATUS_IO, "cannot read '%s'", path);
    fclose(f);
    f = NULL;
    at += got;
  }
  t->data[at] = 0;
  t->size = at;
  snprintf(t->source, sizeof t->source, "fortunes: %s (%d files, %zu bytes)", dir, nnames, at);
done:
  if (f) fclose(f);
  if (d) closedir(d);
  for (int i = 0; i < nnames; i++) moe_free(names[i]);
  moe_free(names);
  return st;
}

static moe_status load_generated(moe_ctx *ctx, const char *why, moe_text *t) {
  moe_status st = MOE_STATUS_OK;
  t->data = moe_malloc(MOE_TEXT_GENERATED_BYTES + 1);
  MOE_FAIL_IF(ctx, !t->data, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate the generated text");
  generate_text(t->data, MOE_TEXT_GENERATED_BYTES);
  t->data[MOE_TEXT_GENERATED_BYTES] = 0;
  t->size = MOE_TEXT_GENERATED_BYTES;
  if (why) {
    snprintf(t->source, sizeof t->source, "generated: %zu bytes (fallback: %s)", t->size, why);
  } else {
    snprintf(t->source, sizeof t->source, "generated: %zu bytes", t->size);
  }
done:
  return st;
}

static moe_status load_file(moe_ctx *ctx, const char *path, moe_text *t) {
  moe_status st = MOE_STATUS_OK;
  char *buf = NULL;
  size_t len = 0;
  st = moe_read_file(ctx, path, (size_t)LONG_MAX, &buf, &len);
  if (st != MOE_STATUS_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", moe_ctx_error(ctx));
    MOE_FAIL(ctx, st, "text file: %s", msg);
  }
  t->data = (uint8_t *)buf;
  t->size = len;
  snprintf(t->source, sizeof t->source, "file: %s (%zu bytes)", path, len);
done:
  return st;
}

moe_status moe_text_load(moe_ctx *ctx, const char *path, size_t min_bytes, moe_text **out) {
  moe_status st = MOE_STATUS_OK;
  moe_text *t = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "moe_text_load: out is NULL");
  *out = NULL;
  t = moe_calloc(1, sizeof *t);
  MOE_FAIL_IF(ctx, !t, MOE_STATUS_OUT_OF_MEMORY, "cannot allocate a text");

  if (!path) {
    const char *env = getenv("MOE_FORTUNES_DIR");
    const char *dir = env && env[0] ? env : MOE_FORTUNES_DIR;
    st = load_fortunes_dir(ctx, dir, t);
    if (st == MOE_STATUS_IO) {  // not installed: the fallback, saying why
      char why[400];
      snprintf(why, sizeof why, "%s", moe_ctx_error(ctx));
      moe_ctx_clear_error(ctx);
      MOE_WARN(
          "training text: %s; using the generated fallback text (%zu bytes) instead "
          "(install the Debian package 'fortunes', or pass a text file)",
          why, MOE_TEXT_GENERATED_BYTES);
      MOE_TRY(load_generated(ctx, why, t));
    } else {
      MOE_TRY(st);
    }
    path = "the default corpus";
  } else if (strcmp(path, "generated:") == 0) {
    MOE_TRY(load_generated(ctx, NULL, t));
  } else if (strncmp(path, "fortunes:", 9) == 0) {
    MOE_TRY(load_fortunes_dir(ctx, path[9] ? path + 9 : MOE_FORTUNES_DIR, t));
  } else {
    MOE_FAIL_IF(ctx, path[0] == '\0', MOE_STATUS_INVALID_ARG, "text file: the path is empty");
    MOE_TRY(load_file(ctx, path, t));
  }
  MOE_FAIL_IF(ctx, t->size == 0, MOE_STATUS_INVALID_ARG,
              "text '%s' is empty: a training text needs at least %zu bytes", path,
              min_bytes > 0 ? min_bytes : 1);
  MOE_FAIL_IF(ctx, t->size < min_bytes, MOE_STATUS_INVALID_ARG,
              "text '%s' has %zu bytes; at least %zu are needed", path, t->size, min_bytes);
  *out = t;
  t = NULL;
done:
  moe_text_free(t);
  return st;
}

moe_status moe_text_check_source(moe_ctx *ctx, const char *path) {
  moe_status st = MOE_STATUS_OK;
  struct stat sb;
  if (!path || strcmp(path, "generated:") == 0) goto done;
  if (strncmp(path, "fortunes:", 9) == 0) {
    const char *dir = path[9] ? path + 9 : MOE_FORTUNES_DIR;
    MOE_FAIL_IF(ctx, stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode), MOE_STATUS_INVALID_ARG,
                "'%s': '%s' is not a readable directory of fortune files", path, dir);
    goto done;
  }
  MOE_FAIL_IF(ctx, path[0] == '\0', MOE_STATUS_INVALID_ARG, "text file: the path is empty");
  MOE_FAIL_IF(ctx, stat(path, &sb) != 0, MOE_STATUS_INVALID_ARG, "cannot open '%s': %s", path,
              strerror(errno));
  MOE_FAIL_IF(ctx, !S_ISREG(sb.st_mode), MOE_STATUS_INVALID_ARG,
              "'%s' is not a regular file (give a text file, 'generated:' or 'fortunes:DIR')",
              path);
  FILE *f = fopen(path, "rb");
  MOE_FAIL_IF(ctx, !f, MOE_STATUS_INVALID_ARG, "cannot open '%s': %s", path, strerror(errno));
  fclose(f);
done:
  return st;
}

void moe_text_free(moe_text *t) {
  if (!t) return;
  moe_free(t->data);
  moe_free(t);
}

const uint8_t *moe_text_data(const moe_text *t) { return t->data; }
size_t moe_text_size(const moe_text *t) { return t->size; }
const char *moe_text_source(const moe_text *t) { return t->source; }

// ---- split ---------------------------------------------------------------------

moe_text_span moe_text_span_of(const uint8_t *data, size_t size) {
  moe_text_span s;
  memset(&s, 0, sizeof s);
  if (size > 0) {
    s.nseg = 1;
    s.size = size;
    s.seg[0].data = data;
    s.seg[0].size = size;
  }
  return s;
}

// Group g of G covers [g*n/G, (g+1)*n/G); its last round(len*f) bytes are
// validation. Fills the spans when given; returns the smallest piece.
static size_t split_groups(const uint8_t *data, size_t n, int groups, double f,
                           moe_text_span *train, moe_text_span *val) {
  size_t smallest = SIZE_MAX;
  for (int g = 0; g < groups; g++) {
    // g * n cannot overflow: n < 2^58 on any machine that holds the text.
    const size_t a = (size_t)g * n / (size_t)groups, b = (size_t)(g + 1) * n / (size_t)groups;
    const size_t len = b - a, v = (size_t)llround((double)len * f), tr = len - v;
    if (v < smallest) smallest = v;
    if (tr < smallest) smallest = tr;
    if (train) {
      train->seg[g].data = data + a;
      train->seg[g].size = tr;
      train->size += tr;
      val->seg[g].data = data + a + tr;
      val->seg[g].size = v;
      val->size += v;
    }
  }
  return smallest;
}

moe_status moe_text_split(moe_ctx *ctx, const moe_text *t, double val_fraction, int seq_len,
                          moe_text_span *train, moe_text_span *val) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !t || !train || !val, MOE_STATUS_INVALID_ARG,
              "moe_text_split: text and spans must not be NULL");
  MOE_FAIL_IF(ctx, !(val_fraction > 0.0 && val_fraction <= 0.5), MOE_STATUS_INVALID_ARG,
              "val_fraction (%g) must be in (0, 0.5]", val_fraction);
  MOE_FAIL_IF(ctx, seq_len < 1, MOE_STATUS_INVALID_ARG, "seq_len (%d) must be at least 1", seq_len);
  const size_t n = t->size, need = (size_t)seq_len + 1;
  size_t groups = n / 32768;
  if (groups > MOE_SPAN_MAX_SEGMENTS) groups = MOE_SPAN_MAX_SEGMENTS;
  if (groups < 1) groups = 1;
  while (groups > 1 && split_groups(t->data, n, (int)groups, val_fraction, NULL, NULL) < need) {
    groups--;
  }
  if (split_groups(t->data, n, (int)groups, val_fraction, NULL, NULL) < need) {
    const size_t v = (size_t)llround((double)n * val_fraction);
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "the text (%zu bytes) split with val_fraction %g gives %zu training and %zu "
             "validation bytes; each part needs at least seq_len + 1 = %zu bytes (use a "
             "longer text, a shorter sequence or another val_fraction)",
             n, val_fraction, n - v, v, need);
  }
  memset(train, 0, sizeof *train);
  memset(val, 0, sizeof *val);
  train->nseg = val->nseg = (int)groups;
  split_groups(t->data, n, (int)groups, val_fraction, train, val);
done:
  return st;
}

// ---- batches -------------------------------------------------------------------

// Uniform in [0, bound) (bound >= 1), exact: rejection of the 64-bit draws
// below 2^64 mod bound. Draw a of sequence j at step `step` is Philox block
// {j, a, step lo, step hi}, two 64-bit candidates per block.
static uint64_t draw_start(uint64_t seed, uint64_t step, int j, uint64_t bound) {
  const uint64_t key64 = seed ^ MOE_DATA_KEY_TAG;
  const uint32_t key[2] = {(uint32_t)key64, (uint32_t)(key64 >> 32)};
  const uint64_t reject_below = (0 - bound) % bound;  // 2^64 mod bound
  for (uint32_t attempt = 0;; attempt++) {
    const uint32_t ctr[4] = {(uint32_t)j, attempt, (uint32_t)step, (uint32_t)(step >> 32)};
    uint32_t r[4];
    moe_philox4x32_10(ctr, key, r);
    const uint64_t x0 = (uint64_t)r[0] | (uint64_t)r[1] << 32;
    if (x0 >= reject_below) return x0 % bound;
    const uint64_t x1 = (uint64_t)r[2] | (uint64_t)r[3] << 32;
    if (x1 >= reject_below) return x1 % bound;
  }
}

static void copy_window(const uint8_t *p, int seq_len, int32_t *tokens, int32_t *targets) {
  for (int i = 0; i < seq_len; i++) {
    tokens[i] = p[i];
    targets[i] = p[i + 1];
  }
}

void moe_batch_train(const moe_text_span *span, uint64_t seed, uint64_t step, int first_seq,
                     int nseq, int seq_len, int32_t *tokens, int32_t *targets) {
  assert(span && seq_len >= 1 && nseq >= 0 && first_seq >= 0);
  const size_t need = (size_t)seq_len + 1;
  uint64_t starts = 0;  // valid window starts over all segments
  for (int s = 0; s < span->nseg; s++) {
    if (span->seg[s].size >= need) starts += span->seg[s].size - need + 1;
  }
  assert(starts > 0 && "the span holds no window of seq_len + 1 bytes");
  if (starts == 0) return;
  for (int q = 0; q < nseq; q++) {
    uint64_t u = draw_start(seed, step, first_seq + q, starts);
    int s = 0;
    for (;; s++) {  // segment holding start u
      const size_t sz = span->seg[s].size;
      const uint64_t here = sz >= need ? sz - need + 1 : 0;
      if (u < here) break;
      u -= here;
    }
    copy_window(span->seg[s].data + u, seq_len, tokens + (size_t)q * (size_t)seq_len,
                targets + (size_t)q * (size_t)seq_len);
  }
}

int moe_batch_val_windows(const moe_text_span *span, int seq_len) {
  if (!span || seq_len < 1) return 0;
  size_t total = 0;
  for (int s = 0; s < span->nseg; s++) {
    if (span->seg[s].size > 0) total += (span->seg[s].size - 1) / (size_t)seq_len;
  }
  return total > (size_t)INT_MAX ? INT_MAX : (int)total;
}

void moe_batch_val(const moe_text_span *span, int first_win, int nseq, int seq_len, int32_t *tokens,
                   int32_t *targets) {
  assert(span && seq_len >= 1 && nseq >= 0 && first_win >= 0);
  int s = 0;
  size_t w = (size_t)first_win, k = 0;  // window k of segment s is global window first_win
  for (; s < span->nseg; s++) {
    const size_t here = span->seg[s].size > 0 ? (span->seg[s].size - 1) / (size_t)seq_len : 0;
    if (w < here) break;
    w -= here;
  }
  k = w;
  for (int q = 0; q < nseq; q++) {
    while (s < span->nseg &&
           k >= (span->seg[s].size > 0 ? (span->seg[s].size - 1) / (size_t)seq_len : 0)) {
      s++;
      k = 0;
    }
    assert(s < span->nseg && "validation window out of range");
    if (s >= span->nseg) return;
    copy_window(span->seg[s].data + k * (size_t)seq_len, seq_len,
                tokens + (size_t)q * (size_t)seq_len, targets + (size_t)q * (size_t)seq_len);
    k++;
  }
}
