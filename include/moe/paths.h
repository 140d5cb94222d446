// Lina's expert paths (ATC'23, section 5, inference; docs/inference.md
// "Path profiles"): the experts a token chose in the previous MoE blocks (its
// sample path) predict which experts it chooses in the next one, so the
// popularity of a block's experts in a batch can be estimated before its gate
// runs. A profile holds, per MoE block b and path j, the counts of the
// choices at block b of the tokens whose path was j: Psi_j^b(e) = count_j(e)
// / the path's choices. Pure C, no MPI; a profile is used by one thread at a
// time.
//
// The path of a token at block b: its first choices at blocks b - l .. b - 1
// (the earlier ones when b < l; block 0's tokens all share the empty path).
// Every choice of the token at block b (its top_k) counts. Memory is bounded:
// at most max_paths paths per block, allocated at create; a token whose path
// is new when the block holds max_paths already counts only in the block's
// marginal (all of its tokens) and in `unkept`, and the estimate gives such a
// path the marginal distribution (documented policy for unseen paths).
#ifndef MOE_PATHS_H
#define MOE_PATHS_H

#include <stddef.h>
#include <stdint.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_PATHS_MAX_LEN 8      // the longest path l
#define MOE_PATHS_MAX_BLOCKS 64  // MoE blocks a profile covers at most
#define MOE_PATHS_DEFAULT_LEN 3  // Lina's l
#define MOE_PATHS_DEFAULT_MAX 4096
#define MOE_PATHS_MAX_BYTES ((size_t)256 << 20)  // the most one profile may allocate

typedef struct {
  int n_blocks;     // MoE blocks, [1, MOE_PATHS_MAX_BLOCKS]
  int num_experts;  // E, [1, 65535]
  int top_k;        // K, [1, E]
  int path_len;     // l, [1, MOE_PATHS_MAX_LEN] [3]; (E + 1)^l must fit 63 bits
  int max_paths;    // paths kept per block, [1, 1 << 20] [4096]
} moe_path_config;

typedef struct moe_path_profile moe_path_profile;

// INVALID_ARG naming the field and its range, or when the profile would
// allocate more than MOE_PATHS_MAX_BYTES (256 MiB); OUT_OF_MEMORY. Allocates
// n_blocks x max_paths x (E x 8 + 24) bytes and the tables (moe_path_profile_bytes).
moe_status moe_path_profile_create(moe_ctx *ctx, const moe_path_config *cfg,
                                   moe_path_profile **out);
void moe_path_profile_destroy(moe_path_profile *p);  // NULL is a no-op
size_t moe_path_profile_bytes(const moe_path_config *cfg);
const moe_path_config *moe_path_profile_config(const moe_path_profile *p);

// Adds T tokens: choices[b] is MoE block b's (T, K) experts, best first (a
// value outside [0, E), e.g. -1 for a dropped choice, does not count; as a
// first choice on a path it is its own step "none"). INVALID_ARG for NULL
// arrays or T < 0; the profile is then unchanged.
moe_status moe_path_profile_add(moe_path_profile *p, const int32_t *const *choices, int tokens);

// Sums src into dst (the same config: INVALID_ARG otherwise, dst unchanged):
// the marginals, and each path's counts (a path dst does not hold and has no
// room for goes to unkept). Paths are merged in src's order of first sight.
moe_status moe_path_profile_merge(moe_ctx *ctx, moe_path_profile *dst, const moe_path_profile *src);

// The estimated popularity of block b's experts for T tokens whose choices at
// blocks 0 .. b - 1 are choices[0 .. b - 1] (later ones are not read):
// pop[e] = sum over the tokens of K x Psi_{path(t)}^b(e), the expected
// choices of e (Lina eq. 1 up to its factor N / N_t). A path without counts
// uses the block's marginal distribution; a block without any: uniform.
// *known (may be NULL): the tokens whose path the profile held.
moe_status moe_path_profile_estimate(const moe_path_profile *p, int block,
                                     const int32_t *const *choices, int tokens, double *pop,
                                     int *known);

// The m most popular experts (descending; ties: lowest index) into top (m <=
// E).
void moe_path_top(const double *pop, int num_experts, int m, int *top);
// The top-m experts of an estimate and of the actual popularity compared
// (Lina's phase-2 test; m is capped at MOE_PATHS_MAX_TOP): *ordered = 1 when
// the lists are equal in order (its estimation accuracy), *same_set = 1 when
// they hold the same experts (else phase 2 re-plans: its fine-tune).
#define MOE_PATHS_MAX_TOP 128
void moe_path_compare(const double *est, const double *act, int num_experts, int m, int *ordered,
                      int *same_set);

typedef struct {
  int64_t tokens;  // tokens added (block 0's count)
  int64_t paths;   // paths held, over the blocks
  int64_t unkept;  // tokens of paths not held (no room), over the blocks
} moe_path_profile_stats;
moe_path_profile_stats moe_path_profile_get_stats(const moe_path_profile *p);

// JSON text (malloc'd into *out; free with moe_free): {"format":
// "libmoe-paths", "version": 1, the config, and per block its tokens, unkept,
// marginal and paths [{"path": [...], "tokens": n, "counts": [...]}] in order of first
// sight}. OUT_OF_MEMORY.
moe_status moe_path_profile_to_json(moe_ctx *ctx, const moe_path_profile *p, char **out);
// Parses such a text (len bytes): BAD_FORMAT naming what is wrong (not JSON,
// another format or version, a field missing, out of range or of the wrong
// type, a path of the wrong length, a count below 0, more paths than
// max_paths, a path twice); OUT_OF_MEMORY.
moe_status moe_path_profile_from_json(moe_ctx *ctx, const char *text, size_t len,
                                      moe_path_profile **out);
// Reads a file written from moe_path_profile_to_json: IO when it cannot be
// read, else as _from_json with the file named.
moe_status moe_path_profile_load(moe_ctx *ctx, const char *path, moe_path_profile **out);

#ifdef __cplusplus
}
#endif

#endif  // MOE_PATHS_H
