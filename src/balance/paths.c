// Lina's expert paths (include/moe/paths.h): the profile's tables, adding and
// merging counts, the popularity estimate, JSON.
//
// A path of up to l first choices is a key, the digits c_i + 1 in base E + 2
// (digits 1 .. E: experts 0 .. E - 1; E + 1: a first choice outside [0, E);
// 0 does not occur, so paths of different lengths never share a key);
// each block has an open-addressing table of 2 x max_paths slots (a power of
// two) from key to entry, and entries in order of first sight: the key and E
// counts. Everything is allocated at create.
#include "moe/paths.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"

typedef struct {
  int64_t tokens, unkept;
  int64_t *marginal;  // (E)
  int n;              // entries held
  uint64_t *key;      // (max_paths)
  int64_t *ntok;      // (max_paths): tokens of the path
  int64_t *counts;    // (max_paths, E)
  int32_t *slot;      // (table): entry + 1, 0 = empty
  uint32_t mask;      // table size - 1
} path_block;

struct moe_path_profile {
  moe_path_config cfg;
  path_block blk[MOE_PATHS_MAX_BLOCKS];
};

static size_t table_size(int max_paths) {
  size_t t = 2;
  while (t < 2 * (size_t)max_paths) t <<= 1;
  return t;
}

static moe_status check_config(moe_ctx *ctx, const moe_path_config *c) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !c, MOE_STATUS_INVALID_ARG, "path profile: a config is needed");
  MOE_FAIL_IF(ctx, c->n_blocks < 1 || c->n_blocks > MOE_PATHS_MAX_BLOCKS, MOE_STATUS_INVALID_ARG,
              "path profile: MoE blocks (%d) must be in [1, %d]", c->n_blocks,
              MOE_PATHS_MAX_BLOCKS);
  MOE_FAIL_IF(ctx, c->num_experts < 1 || c->num_experts > 65535, MOE_STATUS_INVALID_ARG,
              "path profile: experts (%d) must be in [1, 65535]", c->num_experts);
  MOE_FAIL_IF(ctx, c->top_k < 1 || c->top_k > c->num_experts, MOE_STATUS_INVALID_ARG,
              "path profile: top_k (%d) must be in [1, %d] (the experts)", c->top_k,
              c->num_experts);
  MOE_FAIL_IF(ctx, c->path_len < 1 || c->path_len > MOE_PATHS_MAX_LEN, MOE_STATUS_INVALID_ARG,
              "path profile: path length (%d) must be in [1, %d]", c->path_len, MOE_PATHS_MAX_LEN);
  {
    double bits = c->path_len * log2((double)c->num_experts + 2.0);
    MOE_FAIL_IF(ctx, bits >= 63.0, MOE_STATUS_INVALID_ARG,
                "path profile: paths of %d steps over %d experts do not fit a 63-bit key "
                "(shorten the path)",
                c->path_len, c->num_experts);
  }
  MOE_FAIL_IF(ctx, c->max_paths < 1 || c->max_paths > (1 << 20), MOE_STATUS_INVALID_ARG,
              "path profile: paths per block (%d) must be in [1, %d]", c->max_paths, 1 << 20);
  // finding 11: a file's config alone could ask for gigabytes
  MOE_FAIL_IF(ctx, moe_path_profile_bytes(c) > MOE_PATHS_MAX_BYTES, MOE_STATUS_INVALID_ARG,
              "path profile: %d blocks x %d paths x %d experts need %.1f MiB, more than the %zu "
              "MiB a profile may take (lower the paths per block)",
              c->n_blocks, c->max_paths, c->num_experts,
              (double)moe_path_profile_bytes(c) / (1 << 20), MOE_PATHS_MAX_BYTES >> 20);
done:
  return st;
}

size_t moe_path_profile_bytes(const moe_path_config *c) {
  const size_t E = (size_t)c->num_experts, m = (size_t)c->max_paths;
  return sizeof(moe_path_profile) +
         (size_t)c->n_blocks * (E * 8 + m * 16 + m * E * 8 + table_size(c->max_paths) * 4);
}

moe_status moe_path_profile_create(moe_ctx *ctx, const moe_path_config *cfg,
                                   moe_path_profile **out) {
  moe_status st = MOE_STATUS_OK;
  moe_path_profile *p = NULL;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "path profile: out must not be NULL");
  *out = NULL;
  MOE_TRY(check_config(ctx, cfg));
  p = moe_calloc(1, sizeof *p);
  MOE_FAIL_IF(ctx, !p, MOE_STATUS_OUT_OF_MEMORY, "path profile: out of memory");
  p->cfg = *cfg;
  {
    const size_t E = (size_t)cfg->num_experts, m = (size_t)cfg->max_paths;
    const size_t t = table_size(cfg->max_paths);
    for (int b = 0; b < cfg->n_blocks; b++) {
      path_block *k = &p->blk[b];
      k->marginal = moe_calloc(E, sizeof(int64_t));
      k->key = moe_calloc(m, sizeof(uint64_t));
      k->ntok = moe_calloc(m, sizeof(int64_t));
      k->counts = moe_calloc(m * E, sizeof(int64_t));
      k->slot = moe_calloc(t, sizeof(int32_t));
      k->mask = (uint32_t)(t - 1);
      MOE_FAIL_IF(ctx, !k->marginal || !k->key || !k->ntok || !k->counts || !k->slot,
                  MOE_STATUS_OUT_OF_MEMORY,
                  "path profile: cannot allocate %zu bytes for %d blocks of %d paths",
                  moe_path_profile_bytes(cfg), cfg->n_blocks, cfg->max_paths);
    }
  }
  *out = p;
  p = NULL;
done:
  moe_path_profile_destroy(p);
  return st;
}

void moe_path_profile_destroy(moe_path_profile *p) {
  if (!p) return;
  for (int b = 0; b < MOE_PATHS_MAX_BLOCKS; b++) {
    moe_free(p->blk[b].marginal);
    moe_free(p->blk[b].key);
    moe_free(p->blk[b].ntok);
    moe_free(p->blk[b].counts);
    moe_free(p->blk[b].slot);
  }
  moe_free(p);
}

const moe_path_config *moe_path_profile_config(const moe_path_profile *p) {
  return p ? &p->cfg : NULL;
}

// The path key of token t at block b.
static uint64_t path_key(const moe_path_config *c, int b, const int32_t *const *choices, int t) {
  const uint64_t base = (uint64_t)c->num_experts + 2;
  uint64_t key = 0;
  const int first = b - c->path_len > 0 ? b - c->path_len : 0;
  for (int i = first; i < b; i++) {
    const int32_t e = choices[i][(size_t)t * c->top_k];
    const uint64_t d = e >= 0 && e < c->num_experts ? (uint64_t)e : (uint64_t)c->num_experts;
    key = key * base + d + 1;
  }
  return key;
}

static uint32_t hash_key(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (uint32_t)k;
}

// The entry of key in block k, or -1; with `add`, a new one when there is room
// (-1 when full).
static int find_entry(path_block *k, int max_paths, int E, uint64_t key, int add) {
  uint32_t h = hash_key(key) & k->mask;
  for (;;) {
    const int32_t s = k->slot[h];
    if (s == 0) break;
    if (k->key[s - 1] == key) return s - 1;
    h = (h + 1) & k->mask;
  }
  if (!add || k->n >= max_paths) return -1;
  const int i = k->n++;
  k->key[i] = key;
  k->ntok[i] = 0;
  memset(k->counts + (size_t)i * E, 0, (size_t)E * sizeof(int64_t));
  k->slot[h] = i + 1;
  return i;
}

moe_status moe_path_profile_add(moe_path_profile *p, const int32_t *const *choices, int tokens) {
  if (!p || !choices || tokens < 0) return MOE_STATUS_INVALID_ARG;
  const moe_path_config *c = &p->cfg;
  const int E = c->num_experts, K = c->top_k;
  for (int b = 0; b < c->n_blocks; b++)
    if (!choices[b]) return MOE_STATUS_INVALID_ARG;
  for (int b = 0; b < c->n_blocks; b++) {
    path_block *k = &p->blk[b];
    for (int t = 0; t < tokens; t++) {
      const int32_t *ch = choices[b] + (size_t)t * K;
      const int i = find_entry(k, c->max_paths, E, path_key(c, b, choices, t), 1);
      k->tokens++;
      if (i < 0) k->unkept++;
      if (i >= 0) k->ntok[i]++;
      for (int j = 0; j < K; j++) {
        if (ch[j] < 0 || ch[j] >= E) continue;
        k->marginal[ch[j]]++;
        if (i >= 0) k->counts[(size_t)i * E + ch[j]]++;
      }
    }
  }
  return MOE_STATUS_OK;
}

moe_status moe_path_profile_merge(moe_ctx *ctx, moe_path_profile *dst,
                                  const moe_path_profile *src) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !dst || !src, MOE_STATUS_INVALID_ARG, "path profile merge: NULL profile");
  MOE_FAIL_IF(ctx, memcmp(&dst->cfg, &src->cfg, sizeof dst->cfg) != 0, MOE_STATUS_INVALID_ARG,
              "path profile merge: the profiles have other configs");
  {
    const int E = dst->cfg.num_experts;
    for (int b = 0; b < dst->cfg.n_blocks; b++) {
      path_block *d = &dst->blk[b];
      const path_block *s = &src->blk[b];
      d->tokens += s->tokens;
      d->unkept += s->unkept;
      for (int e = 0; e < E; e++) d->marginal[e] += s->marginal[e];
      for (int i = 0; i < s->n; i++) {
        const int j = find_entry(d, dst->cfg.max_paths, E, s->key[i], 1);
        const int64_t *sc = s->counts + (size_t)i * E;
        if (j < 0) {  // no room: the path's tokens are unkept
          d->unkept += s->ntok[i];
          continue;
        }
        d->ntok[j] += s->ntok[i];
        for (int e = 0; e < E; e++) d->counts[(size_t)j * E + e] += sc[e];
      }
    }
  }
done:
  return st;
}

moe_status moe_path_profile_estimate(const moe_path_profile *p, int block,
                                     const int32_t *const *choices, int tokens, double *pop,
                                     int *known) {
  if (known) *known = 0;
  if (!p || !pop || tokens < 0 || block < 0 || block >= p->cfg.n_blocks ||
      (block > 0 && tokens > 0 && !choices))
    return MOE_STATUS_INVALID_ARG;
  for (int b = 0; b < block && tokens > 0; b++)
    if (!choices[b]) return MOE_STATUS_INVALID_ARG;
  const moe_path_config *c = &p->cfg;
  const int E = c->num_experts, K = c->top_k;
  path_block *k = (path_block *)&p->blk[block];  // find_entry without `add` writes nothing
  int64_t msum = 0;
  for (int e = 0; e < E; e++) msum += k->marginal[e];
  for (int e = 0; e < E; e++) pop[e] = 0.0;
  int hits = 0;
  for (int t = 0; t < tokens; t++) {
    const int i = find_entry(k, c->max_paths, E, path_key(c, block, choices, t), 0);
    const int64_t *cnt = i >= 0 ? k->counts + (size_t)i * E : NULL;
    int64_t n = 0;
    if (cnt)
      for (int e = 0; e < E; e++) n += cnt[e];
    if (n > 0) {
      hits++;
    } else {
      cnt = msum > 0 ? k->marginal : NULL;
      n = msum;
    }
    for (int e = 0; e < E; e++)
      pop[e] += cnt ? (double)K * (double)cnt[e] / (double)n : (double)K / E;
  }
  if (known) *known = hits;
  return MOE_STATUS_OK;
}

void moe_path_top(const double *pop, int E, int m, int *top) {
  for (int j = 0; j < m; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      int used = 0;
      for (int q = 0; q < j && !used; q++) used = top[q] == e;
      if (!used && (best < 0 || pop[e] > pop[best])) best = e;
    }
    top[j] = best;
  }
}

void moe_path_compare(const double *est, const double *act, int E, int m, int *ordered,
                      int *same_set) {
  int te[MOE_PATHS_MAX_TOP], ta[MOE_PATHS_MAX_TOP];
  m = m < E ? m : E;
  m = m < MOE_PATHS_MAX_TOP ? m : MOE_PATHS_MAX_TOP;
  moe_path_top(est, E, m, te);
  moe_path_top(act, E, m, ta);
  int o = 1, s = 1;
  for (int j = 0; j < m; j++) {
    o &= te[j] == ta[j];
    int in = 0;
    for (int q = 0; q < m && !in; q++) in = te[j] == ta[q];
    s &= in;
  }
  *ordered = o;
  *same_set = s;
}

moe_path_profile_stats moe_path_profile_get_stats(const moe_path_profile *p) {
  moe_path_profile_stats s = {0, 0, 0};
  if (!p) return s;
  s.tokens = p->blk[0].tokens;
  for (int b = 0; b < p->cfg.n_blocks; b++) {
    s.paths += p->blk[b].n;
    s.unkept += p->blk[b].unkept;
  }
  return s;
}

// ---- JSON --------------------------------------------------------------------------------

// The path of key at block b as its experts (-1 = a first choice outside the
// experts), into out (its length returned).
static int key_path(const moe_path_config *c, int b, uint64_t key, int *out) {
  const int len = b < c->path_len ? b : c->path_len;
  const uint64_t base = (uint64_t)c->num_experts + 2;
  for (int i = len - 1; i >= 0; i--) {
    const int d = (int)(key % base) - 1;
    out[i] = d == c->num_experts ? -1 : d;
    key /= base;
  }
  return len;
}

static cJSON *int64_array(const int64_t *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < n; i++) {
    cJSON *x = cJSON_CreateNumber((double)v[i]);
    if (!x || !cJSON_AddItemToArray(a, x)) {
      cJSON_Delete(x);
      cJSON_Delete(a);
      return NULL;
    }
  }
  return a;
}

moe_status moe_path_profile_to_json(moe_ctx *ctx, const moe_path_profile *p, char **out) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  MOE_FAIL_IF(ctx, !p || !out, MOE_STATUS_INVALID_ARG, "path profile: NULL argument");
  *out = NULL;
  {
    const moe_path_config *c = &p->cfg;
    const int E = c->num_experts;
    int ok = 1;
    root = cJSON_CreateObject();
    ok = root && cJSON_AddStringToObject(root, "format", "libmoe-paths") &&
         cJSON_AddNumberToObject(root, "version", 1) &&
         cJSON_AddNumberToObject(root, "moe_blocks", c->n_blocks) &&
         cJSON_AddNumberToObject(root, "num_experts", E) &&
         cJSON_AddNumberToObject(root, "top_k", c->top_k) &&
         cJSON_AddNumberToObject(root, "path_len", c->path_len) &&
         cJSON_AddNumberToObject(root, "max_paths", c->max_paths);
    cJSON *blocks = ok ? cJSON_AddArrayToObject(root, "blocks") : NULL;
    ok = ok && blocks;
    for (int b = 0; ok && b < c->n_blocks; b++) {
      const path_block *k = &p->blk[b];
      cJSON *o = cJSON_CreateObject();
      ok = o && cJSON_AddItemToArray(blocks, o);
      if (!ok) {
        cJSON_Delete(o);
        break;
      }
      cJSON *m = int64_array(k->marginal, E);
      ok = cJSON_AddNumberToObject(o, "tokens", (double)k->tokens) &&
           cJSON_AddNumberToObject(o, "unkept", (double)k->unkept) && m &&
           cJSON_AddItemToObject(o, "marginal", m);
      if (!ok) cJSON_Delete(m);
      cJSON *paths = ok ? cJSON_AddArrayToObject(o, "paths") : NULL;
      ok = ok && paths;
      for (int i = 0; ok && i < k->n; i++) {
        int steps[MOE_PATHS_MAX_LEN];
        const int len = key_path(c, b, k->key[i], steps);
        cJSON *e = cJSON_CreateObject();
        cJSON *pa = cJSON_CreateIntArray(steps, len);
        cJSON *cn = int64_array(k->counts + (size_t)i * E, E);
        ok = e && pa && cn && cJSON_AddItemToArray(paths, e);
        if (ok) {
          ok = cJSON_AddItemToObject(e, "path", pa);
          pa = NULL;
          ok = ok && cJSON_AddNumberToObject(e, "tokens", (double)k->ntok[i]);
          ok = ok && cJSON_AddItemToObject(e, "counts", cn);
          if (ok) cn = NULL;
        } else {
          cJSON_Delete(e);
        }
        cJSON_Delete(pa);
        cJSON_Delete(cn);
      }
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    MOE_FAIL_IF(ctx, !text, MOE_STATUS_OUT_OF_MEMORY, "path profile: out of memory writing JSON");
    const size_t n = strlen(text);
    *out = moe_malloc(n + 2);
    if (*out) {
      memcpy(*out, text, n);
      (*out)[n] = '\n';
      (*out)[n + 1] = '\0';
    }
    cJSON_free(text);
    MOE_FAIL_IF(ctx, !*out, MOE_STATUS_OUT_OF_MEMORY, "path profile: out of memory writing JSON");
  }
done:
  cJSON_Delete(root);
  return st;
}

// An integer field of o in [lo, hi] (BAD_FORMAT naming it otherwise).
static moe_status get_int(moe_ctx *ctx, const cJSON *o, const char *key, double lo, double hi,
                          double *out) {
  moe_status st = MOE_STATUS_OK;
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
  MOE_FAIL_IF(ctx, !it, MOE_STATUS_BAD_FORMAT, "path profile: \"%s\" is missing", key);
  MOE_FAIL_IF(ctx,
              !cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
                  !(it->valuedouble >= lo && it->valuedouble <= hi),
              MOE_STATUS_BAD_FORMAT, "path profile: \"%s\" must be an integer in [%.0f, %.0f]", key,
              lo, hi);
  *out = it->valuedouble;
done:
  return st;
}

// An array of n integers in [lo, hi] (BAD_FORMAT naming where).
static moe_status get_ints(moe_ctx *ctx, const cJSON *a, int n, double lo, double hi,
                           const char *what, int b, int64_t *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cJSON_IsArray(a) || cJSON_GetArraySize(a) != n, MOE_STATUS_BAD_FORMAT,
              "path profile: block %d: \"%s\" must be an array of %d integers", b, what, n);
  {
    int i = 0;
    for (const cJSON *x = a->child; x; x = x->next, i++) {
      MOE_FAIL_IF(ctx,
                  !cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
                      !(x->valuedouble >= lo && x->valuedouble <= hi),
                  MOE_STATUS_BAD_FORMAT,
                  "path profile: block %d: \"%s\" entry %d must be an integer in [%.0f, %.0f]", b,
                  what, i, lo, hi);
      out[i] = (int64_t)x->valuedouble;
    }
  }
done:
  return st;
}

moe_status moe_path_profile_from_json(moe_ctx *ctx, const char *text, size_t len,
                                      moe_path_profile **out) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  moe_path_profile *p = NULL;
  MOE_FAIL_IF(ctx, !text || !out, MOE_STATUS_INVALID_ARG, "path profile: NULL argument");
  *out = NULL;
  root = cJSON_ParseWithLength(text, len);
  MOE_FAIL_IF(ctx, !cJSON_IsObject(root), MOE_STATUS_BAD_FORMAT, "path profile: not a JSON object");
  {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "format");
    MOE_FAIL_IF(ctx, !cJSON_IsString(f) || strcmp(f->valuestring, "libmoe-paths") != 0,
                MOE_STATUS_BAD_FORMAT, "path profile: \"format\" must be \"libmoe-paths\"");
    double v = 0, nb = 0, E = 0, K = 0, l = 0, m = 0;
    MOE_TRY(get_int(ctx, root, "version", 1, 1, &v));
    MOE_TRY(get_int(ctx, root, "moe_blocks", 1, MOE_PATHS_MAX_BLOCKS, &nb));
    MOE_TRY(get_int(ctx, root, "num_experts", 1, 65535, &E));
    MOE_TRY(get_int(ctx, root, "top_k", 1, E, &K));
    MOE_TRY(get_int(ctx, root, "path_len", 1, MOE_PATHS_MAX_LEN, &l));
    MOE_TRY(get_int(ctx, root, "max_paths", 1, 1 << 20, &m));
    const moe_path_config c = {(int)nb, (int)E, (int)K, (int)l, (int)m};
    moe_status cs = moe_path_profile_create(ctx, &c, &p);
    if (cs == MOE_STATUS_INVALID_ARG) {  // a config out of range: the file's fault
      char msg[512];
      snprintf(msg, sizeof msg, "%s", moe_ctx_error(ctx));
      cs = moe_error_at(ctx, MOE_STATUS_BAD_FORMAT, __FILE__, __LINE__, "%s", msg);
    }
    MOE_TRY(cs);
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(root, "blocks");
    MOE_FAIL_IF(ctx, !cJSON_IsArray(blocks) || cJSON_GetArraySize(blocks) != c.n_blocks,
                MOE_STATUS_BAD_FORMAT, "path profile: \"blocks\" must be an array of %d blocks",
                c.n_blocks);
    int b = 0;
    const double cmax = 9007199254740992.0;  // 2^53: exact in a double
    for (const cJSON *o = blocks->child; o; o = o->next, b++) {
      path_block *k = &p->blk[b];
      MOE_FAIL_IF(ctx, !cJSON_IsObject(o), MOE_STATUS_BAD_FORMAT,
                  "path profile: block %d must be an object", b);
      double t = 0, u = 0;
      MOE_TRY(get_int(ctx, o, "tokens", 0, cmax, &t));
      MOE_TRY(get_int(ctx, o, "unkept", 0, t, &u));
      k->tokens = (int64_t)t;
      k->unkept = (int64_t)u;
      MOE_TRY(get_ints(ctx, cJSON_GetObjectItemCaseSensitive(o, "marginal"), c.num_experts, 0, cmax,
                       "marginal", b, k->marginal));
      const cJSON *paths = cJSON_GetObjectItemCaseSensitive(o, "paths");
      MOE_FAIL_IF(ctx, !cJSON_IsArray(paths), MOE_STATUS_BAD_FORMAT,
                  "path profile: block %d: \"paths\" must be an array", b);
      MOE_FAIL_IF(ctx, cJSON_GetArraySize(paths) > c.max_paths, MOE_STATUS_BAD_FORMAT,
                  "path profile: block %d holds %d paths, more than max_paths (%d)", b,
                  cJSON_GetArraySize(paths), c.max_paths);
      const int plen = b < c.path_len ? b : c.path_len;
      int i = 0;
      for (const cJSON *e = paths->child; e; e = e->next, i++) {
        MOE_FAIL_IF(ctx, !cJSON_IsObject(e), MOE_STATUS_BAD_FORMAT,
                    "path profile: block %d: path %d must be an object", b, i);
        int64_t steps[MOE_PATHS_MAX_LEN];
        MOE_TRY(get_ints(ctx, cJSON_GetObjectItemCaseSensitive(e, "path"), plen, -1,
                         c.num_experts - 1, "path", b, steps));
        const uint64_t base = (uint64_t)c.num_experts + 2;
        uint64_t key = 0;
        for (int s = 0; s < plen; s++)
          key = key * base + (steps[s] < 0 ? (uint64_t)c.num_experts : (uint64_t)steps[s]) + 1;
        MOE_FAIL_IF(ctx, find_entry(k, c.max_paths, c.num_experts, key, 0) >= 0,
                    MOE_STATUS_BAD_FORMAT, "path profile: block %d: path %d is there twice", b, i);
        const int j = find_entry(k, c.max_paths, c.num_experts, key, 1);
        double nt = 0;
        MOE_TRY(get_int(ctx, e, "tokens", 0, cmax, &nt));
        k->ntok[j] = (int64_t)nt;
        MOE_TRY(get_ints(ctx, cJSON_GetObjectItemCaseSensitive(e, "counts"), c.num_experts, 0, cmax,
                         "counts", b, k->counts + (size_t)j * c.num_experts));
      }
    }
  }
  *out = p;
  p = NULL;
done:
  moe_path_profile_destroy(p);
  cJSON_Delete(root);
  return st;
}

moe_status moe_path_profile_load(moe_ctx *ctx, const char *path, moe_path_profile **out) {
  moe_status st = MOE_STATUS_OK;
  char *text = NULL;
  size_t len = 0;
  MOE_FAIL_IF(ctx, !path || !out, MOE_STATUS_INVALID_ARG, "path profile: NULL argument");
  *out = NULL;
  MOE_TRY(moe_read_file(ctx, path, (size_t)1 << 30, &text, &len));
  st = moe_path_profile_from_json(ctx, text, len, out);
  if (st != MOE_STATUS_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", moe_ctx_error(ctx));
    moe_error_at(ctx, st, __FILE__, __LINE__, "%s: %s", path, msg);
  }
done:
  moe_free(text);
  return st;
}
