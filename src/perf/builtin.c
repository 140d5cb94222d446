// The cluster descriptions shipped in clusters/*.json, compiled into the
// library by CMake (moe_clusters_builtin.h is generated), so `moe simulate`
// finds them without the source tree.
#include <stdio.h>
#include <string.h>

#include "moe/perf.h"

static const struct {
  const char *name;
  const char *json;
} k_builtin[] = {
#include "moe_clusters_builtin.h"
    {NULL, NULL}};

#define N_BUILTIN ((int)(sizeof k_builtin / sizeof k_builtin[0]) - 1)

int moe_cluster_builtin_count(void) { return N_BUILTIN; }

const char *moe_cluster_builtin_name(int i) {
  return i >= 0 && i < N_BUILTIN ? k_builtin[i].name : NULL;
}

moe_status moe_cluster_builtin(moe_ctx *ctx, const char *name, moe_cluster *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !name || !out, MOE_STATUS_INVALID_ARG, "cluster: name and out must be set");
  for (int i = 0; i < N_BUILTIN; i++) {
    if (strcmp(k_builtin[i].name, name) == 0) {
      MOE_TRY(moe_cluster_from_json(ctx, k_builtin[i].json, out));
      goto done;
    }
  }
  {
    char names[1024];
    size_t used = 0;
    names[0] = '\0';
    for (int i = 0; i < N_BUILTIN && used < sizeof names; i++) {
      const int w =
          snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", k_builtin[i].name);
      if (w < 0) break;
      used += (size_t)w;
    }
    MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
             "cluster '%s' is not a shipped description (shipped: %s); pass a JSON file instead",
             name, names);
  }
done:
  return st;
}
