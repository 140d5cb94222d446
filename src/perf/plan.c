// The planner: for a layer configuration, simulate every candidate (all-to-all
// algorithm, compressor, schedule, chunks) with moe_simulate_layer and keep the
// fastest. Lossy compressors are candidates only when the request allows them.
#include <stdio.h>
#include <string.h>

#include "moe/a2a_catalog.h"
#include "moe/compress.h"
#include "moe/perf.h"

static const int k_chunks[] = {1, 2, 4, 8};

moe_status moe_plan_layer(moe_ctx *ctx, const moe_cluster *c, const moe_plan_request *req,
                          moe_plan *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !c || !req || !out, MOE_STATUS_INVALID_ARG,
              "plan: cluster, request and out must not be NULL");
  MOE_FAIL_IF(ctx, req->allow_lossy != 0 && req->allow_lossy != 1, MOE_STATUS_INVALID_ARG,
              "plan: allow_lossy (%d) must be 0 or 1", req->allow_lossy);
  // candidate lists
  const char *a2as[MOE_PROFILE_MAX + 8];
  int na = 0;
  if (strcmp(req->a2a, "auto") != 0) {
    a2as[na++] = req->a2a;
  } else if (req->profile) {
    for (int i = 0; i < req->profile->n_a2a; i++) a2as[na++] = req->profile->a2a[i].name;
  } else {  // the catalogue's plannable algorithms
    int count = 0;
    const moe_a2a_algo *const *algos = moe_a2a_list(&count);
    for (int i = 0; i < count && na < MOE_PROFILE_MAX + 8; i++) {
      if (algos[i]->plannable) a2as[na++] = algos[i]->name;
    }
  }
  // the catalogue's plannable compressors, each with its default parameter
  // ("zfp:8"); lossy ones only when allowed
  char specs[16][32];
  const char *codecs[16];
  int nz = 0;
  if (strcmp(req->compress, "auto") != 0) {
    codecs[nz++] = req->compress;
  } else {
    int count = 0;
    const moe_compressor_entry *const *list = moe_compressor_list(&count);
    for (int i = 0; i < count && nz < 16; i++) {
      if (!list[i]->plannable || (!list[i]->codec.lossless && !req->allow_lossy)) continue;
      moe_compressor_default_spec(list[i], specs[nz], sizeof specs[nz]);
      codecs[nz] = specs[nz];
      nz++;
    }
  }
  int ns = 0;
  const moe_schedule_algo *all = moe_schedule_algo_list(&ns);
  const moe_schedule_algo *scheds[16];
  int nsc = 0;
  if (strcmp(req->schedule, "auto") != 0) {
    MOE_TRY(moe_schedule_algo_find(ctx, req->schedule, &scheds[0]));
    nsc = 1;
  } else {
    for (int i = 0; i < ns && nsc < 16; i++) scheds[nsc++] = &all[i];
  }
  MOE_FAIL_IF(ctx, req->chunks < 0 || req->chunks > 64, MOE_STATUS_INVALID_ARG,
              "plan: chunks (%d) must be in [1, 64], or 0 for auto", req->chunks);
  memset(out, 0, sizeof *out);
  double best = -1.0;
  char last_error[512] = "";
  for (int a = 0; a < na; a++) {
    for (int z = 0; z < nz; z++) {
      for (int s = 0; s < nsc; s++) {
        const int peer = scheds[s]->chunking == MOE_CHUNK_PEER_GROUPS;
        const int nr = req->chunks > 0 || peer ? 1 : (int)(sizeof k_chunks / sizeof k_chunks[0]);
        for (int k = 0; k < nr; k++) {
          moe_sim_variant v;
          memset(&v, 0, sizeof v);
          v.cfg = req->cfg;
          snprintf(v.a2a, sizeof v.a2a, "%s", a2as[a]);
          snprintf(v.schedule, sizeof v.schedule, "%s", scheds[s]->name);
          v.chunks = req->chunks > 0 ? req->chunks : (peer ? 1 : k_chunks[k]);
          snprintf(v.compress, sizeof v.compress, "%s", codecs[z]);
          v.compress_backward = req->compress_backward;
          v.group_size = req->group_size;
          v.profile = req->profile;
          moe_sim_result r;
          if (moe_simulate_layer(ctx, c, &v, &r) != MOE_STATUS_OK) {
            snprintf(last_error, sizeof last_error, "%s", moe_ctx_error(ctx));
            continue;
          }
          out->candidates++;
          if (best < 0 || r.total_ms < best) {
            best = r.total_ms;
            out->best = v;
            out->predicted = r;
          }
        }
      }
    }
  }
  MOE_FAIL_IF(ctx, out->candidates == 0, MOE_STATUS_INVALID_ARG,
              "plan: no candidate could be simulated (%s)", last_error);
done:
  return st;
}
