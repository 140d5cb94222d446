// Shared parts of the randomized equivalence campaign (tests/campaign.c: the
// expert-parallel layer; tests/campaign_parm.c: Parm's layer): the random
// draws, the comparisons against the single-process reference and the
// coverage counts. Not a library header: the campaign's own.
#ifndef MOE_TESTS_CAMPAIGN_H
#define MOE_TESTS_CAMPAIGN_H

#include <stddef.h>
#include <stdint.h>

#include "moe/moe.h"

#define REL_TOL 2e-5
#define ABS_TOL 1e-6
#define MAX_P 64
#define MAX_PASSES 2

extern int g_rank, g_world, g_verbose;

int draw(moe_rng *r, int lo, int hi);  // uniform in [lo, hi]
int chance(moe_rng *r, double p);      // 1 with probability p

// Compared quantities (the worst error of each is reported at the end).
enum { Q_Y, Q_DX, Q_AUX, Q_Z, Q_DWG, Q_DW1, Q_DB1, Q_DW2, Q_DB2, Q_W, Q_COUNT };

typedef struct {
  int failed;
  char first[512];  // the first failure of this rank
} verdict;

void fail(verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// max |got - ref| <= REL_TOL * max |ref| + ABS_TOL over the tensor (quantity q).
void close_to(verdict *v, int q, const char *what, const float *got, const float *ref, size_t n);
void equal_int(verdict *v, const char *what, long got, long ref);
float *fzero(size_t n);            // calloc'd floats (at least 1)
void set_hot(float *wg, int hot);  // feature 0 pulls to expert `hot` (>= 0)
void cov(const char *name);        // counts a covered catalogue entry or condition
// A pass's global batch: x and dy (Tg, M) from the case seed (feature 0 set
// to 1 with a hot expert); calloc'd.
void pass_inputs(uint64_t seed, int pass, int Tg, int M, int hot, float **x, float **dy);
// The reference layers of a case (initialised from seed, hot, gradients
// zeroed): dropless, *R on the global batch of up to Tg_max tokens; with a
// capacity, *G (dropless, for the losses) and *B (the capacity, aux = z = 0,
// run per source). The others stay NULL.
moe_status reference_layers(moe_ctx *ctx, const moe_layer_config *cfg, int Tg_max, uint64_t seed,
                            int hot, moe_layer **R, moe_layer **G, moe_layer **B);
// One pass's y, dx (n floats each), aux, z, rows and drops against the reference.
void compare_pass(verdict *v, int pass, const float *y, const float *dx, const moe_layer_stats *s,
                  const float *y_ref, const float *dx_ref, float aux, float z, int rows,
                  int dropped, size_t n);
// The case's verdict agreed over the world (and *dropped_any maxed); each
// failing rank prints its first failure, rank by rank. 1 when any rank failed.
int verdict_agree(const verdict *v, int *dropped_any);

// Parm's cases (campaign_parm.c): draws case `seed` into an opaque case,
// describes it, runs it; 1 when it matched on every rank.
typedef struct parm_case parm_case;
parm_case *parm_case_draw(uint64_t seed);
void parm_case_describe(const parm_case *c, char *buf, size_t len);
void parm_case_count(const parm_case *c);
int parm_case_run(const parm_case *c, int *dropped_any);
void parm_case_free(parm_case *c);

#endif  // MOE_TESTS_CAMPAIGN_H
