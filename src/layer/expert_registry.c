// The registry of expert kinds. A new kind is one file src/layer/expert_<name>.c
// defining `const moe_expert_kind moe_expert_<id>` plus one X(<id>) line in
// MOE_EXPERT_CATALOG (id: the name as a C identifier, "ffn-ref" -> ffn_ref).
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "layer/layer_internal.h"
#include "moe/expert.h"

// The catalogue, in this order (moe_expert_kind_get, name lists).
#define MOE_EXPERT_CATALOG(X) \
  X(ffn)                      \
  X(ffn_ref)

#define MOE_EXPERT_DECLARE(id) extern const moe_expert_kind moe_expert_##id;
#define MOE_EXPERT_REF(id) &moe_expert_##id,
MOE_EXPERT_CATALOG(MOE_EXPERT_DECLARE)
static const moe_expert_kind *const k_kinds[] = {MOE_EXPERT_CATALOG(MOE_EXPERT_REF)};

#define N_KINDS ((int)(sizeof k_kinds / sizeof k_kinds[0]))

int moe_expert_kind_count(void) { return N_KINDS; }

const moe_expert_kind *moe_expert_kind_get(int i) {
  return i >= 0 && i < N_KINDS ? k_kinds[i] : NULL;
}

static char g_names[256];
static pthread_once_t g_names_once = PTHREAD_ONCE_INIT;

static void build_names(void) {
  size_t used = 0;
  for (int i = 0; i < N_KINDS && used < sizeof g_names; i++) {
    const int w =
        snprintf(g_names + used, sizeof g_names - used, "%s%s", i ? ", " : "", k_kinds[i]->name);
    if (w < 0) break;
    used += (size_t)w;
  }
}

const char *moe_expert_kind_names(void) {
  pthread_once(&g_names_once, build_names);
  return g_names;
}

moe_status moe_expert_kind_find(moe_ctx *ctx, const char *name, const moe_expert_kind **out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "out must not be NULL");
  for (int i = 0; name && i < N_KINDS; i++) {
    if (strcmp(k_kinds[i]->name, name) == 0) {
      *out = k_kinds[i];
      goto done;
    }
  }
  MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG, "expert kind '%s' is unknown (valid: %s)",
           name ? name : "(null)", moe_expert_kind_names());
done:
  return st;
}
