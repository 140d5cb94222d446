// Calibrated profiles (include/moe/perf.h): what `moe calibrate` measured,
// as JSON, read back strictly (every error names the key).
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "moe/perf.h"
#include "perf/perf_internal.h"

static moe_status parse_fit(moe_ctx *ctx, const cJSON *obj, const char *where, moe_linear_fit *f) {
  moe_status st = MOE_STATUS_OK;
  int have = 0;
  MOE_FAIL_IF(ctx, !cJSON_IsObject(obj), MOE_STATUS_INVALID_ARG,
              "profile: '%s' must be an object {alpha_s, beta_s, r2, points}", where);
  memset(f, 0, sizeof *f);
  for (const cJSON *it = obj->child; it; it = it->next) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", where, it->string);
    for (const cJSON *p = obj->child; p != it; p = p->next) {
      MOE_FAIL_IF(ctx, strcmp(p->string, it->string) == 0, MOE_STATUS_INVALID_ARG,
                  "profile: key '%s' appears twice", key);
    }
    if (strcmp(it->string, "alpha_s") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &f->alpha));
      have |= 1;
    } else if (strcmp(it->string, "beta_s") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &f->beta));
      have |= 2;
    } else if (strcmp(it->string, "r2") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &f->r2));
      have |= 4;
    } else if (strcmp(it->string, "points") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, key, &f->n));
      have |= 8;
    } else if (strcmp(it->string, "rmse_s") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &f->rmse));
    } else if (strcmp(it->string, "gamma_s") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &f->gamma));
      MOE_FAIL_IF(ctx, !isfinite(f->gamma), MOE_STATUS_INVALID_ARG, "profile: '%s' must be finite",
                  key);
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
               "profile: unknown key '%s' (valid: alpha_s, beta_s, gamma_s, r2, points, rmse_s)",
               key);
    }
  }
  MOE_FAIL_IF(ctx, have != 15, MOE_STATUS_INVALID_ARG, "profile: '%s' lacks %s", where,
              !(have & 1)   ? "alpha_s"
              : !(have & 2) ? "beta_s"
              : !(have & 4) ? "r2"
                            : "points");
  MOE_FAIL_IF(
      ctx, !isfinite(f->alpha) || !(f->beta > 0.0) || !isfinite(f->beta), MOE_STATUS_INVALID_ARG,
      "profile: '%s' needs a finite alpha_s and beta_s > 0 (got %g, %g)", where, f->alpha, f->beta);
  MOE_FAIL_IF(
      ctx,
      !(f->r2 <= 1.0) || !isfinite(f->r2) || f->n < 2 || !(f->rmse >= 0.0) || !isfinite(f->rmse),
      MOE_STATUS_INVALID_ARG,
      "profile: '%s' needs a finite r2 <= 1, points >= 2 and a finite rmse_s >= 0 (got "
      "%g, %d, %g)",
      where, f->r2, f->n, f->rmse);
done:
  return st;
}

// "parm": [{"mp": 2, "ep": 2, "esp": 1, "a2a": "mpi", "alpha_a2a": s, "beta_a2a": s, ...}]
static moe_status parse_parm(moe_ctx *ctx, const cJSON *arr, moe_profile *p) {
  moe_status st = MOE_STATUS_OK;
  static const char *const terms[6] = {"alpha_a2a", "beta_a2a", "alpha_mp",
                                       "beta_mp",   "alpha_o",  "beta_o"};
  MOE_FAIL_IF(ctx, !cJSON_IsArray(arr), MOE_STATUS_INVALID_ARG,
              "profile: 'parm' must be an array of {mp, ep, esp, a2a, alpha_a2a, beta_a2a, "
              "alpha_mp, beta_mp, alpha_o, beta_o}");
  MOE_FAIL_IF(ctx, cJSON_GetArraySize(arr) > MOE_PROFILE_MAX, MOE_STATUS_INVALID_ARG,
              "profile: 'parm' has %d entries (at most %d)", cJSON_GetArraySize(arr),
              MOE_PROFILE_MAX);
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    moe_parm_terms *t = &p->parm[i];
    char key[64];
    MOE_FAIL_IF(ctx, !cJSON_IsObject(e) || cJSON_GetArraySize(e) != 10, MOE_STATUS_INVALID_ARG,
                "profile: parm[%d] must be an object of exactly mp, ep, esp, a2a, alpha_a2a, "
                "beta_a2a, alpha_mp, beta_mp, alpha_o, beta_o",
                i);
    int *sizes[3] = {&t->mp, &t->ep, &t->esp};
    const char *names[3] = {"mp", "ep", "esp"};
    for (int k = 0; k < 3; k++) {
      snprintf(key, sizeof key, "parm[%d].%s", i, names[k]);
      const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, names[k]);
      MOE_FAIL_IF(ctx, !v, MOE_STATUS_INVALID_ARG, "profile: '%s' is missing", key);
      MOE_TRY(moe_json_get_int(ctx, v, key, sizes[k]));
      MOE_FAIL_IF(ctx, *sizes[k] < 1 || *sizes[k] > (1 << 20), MOE_STATUS_INVALID_ARG,
                  "profile: '%s' (%d) must be in [1, %d]", key, *sizes[k], 1 << 20);
    }
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "a2a");
    MOE_FAIL_IF(ctx, !cJSON_IsString(a) || strlen(a->valuestring) >= sizeof t->a2a,
                MOE_STATUS_INVALID_ARG, "profile: parm[%d].a2a must be a string of < %zu bytes", i,
                sizeof t->a2a);
    snprintf(t->a2a, sizeof t->a2a, "%s", a->valuestring);
    double *vals[6] = {&t->ab.alpha_a2a, &t->ab.beta_a2a, &t->ab.alpha_mp,
                       &t->ab.beta_mp,   &t->ab.alpha_o,  &t->ab.beta_o};
    for (int k = 0; k < 6; k++) {
      snprintf(key, sizeof key, "parm[%d].%s", i, terms[k]);
      const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, terms[k]);
      MOE_FAIL_IF(ctx, !v, MOE_STATUS_INVALID_ARG, "profile: '%s' is missing", key);
      MOE_TRY(moe_json_get_double(ctx, v, key, vals[k]));
      // a least-squares intercept may be below 0 (it is not a latency), a slope hardly
      MOE_FAIL_IF(ctx, !(fabs(*vals[k]) <= 1e3), MOE_STATUS_INVALID_ARG,
                  "profile: '%s' (%g) must be a finite number of seconds in [-1000, 1000]", key,
                  *vals[k]);
    }
    for (int j = 0; j < i; j++)
      MOE_FAIL_IF(ctx,
                  p->parm[j].mp == t->mp && p->parm[j].ep == t->ep && p->parm[j].esp == t->esp &&
                      strcmp(p->parm[j].a2a, t->a2a) == 0,
                  MOE_STATUS_INVALID_ARG,
                  "profile: parm[%d] repeats parm[%d]'s layout %d x %d x %d with '%s'", i, j, t->mp,
                  t->ep, t->esp, t->a2a);
  }
  p->n_parm = i;
done:
  return st;
}

static moe_status parse_named(moe_ctx *ctx, const cJSON *obj, const char *where, int codec,
                              moe_profile *p) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cJSON_IsObject(obj), MOE_STATUS_INVALID_ARG, "profile: '%s' must be an object",
              where);
  for (const cJSON *it = obj->child; it; it = it->next) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", where, it->string);
    MOE_FAIL_IF(ctx, strlen(it->string) >= sizeof p->a2a[0].name, MOE_STATUS_INVALID_ARG,
                "profile: name '%s' is too long", key);
    int *n = codec ? &p->n_codec : &p->n_a2a;
    MOE_FAIL_IF(ctx, *n >= MOE_PROFILE_MAX, MOE_STATUS_INVALID_ARG,
                "profile: '%s' has more than %d entries", where, MOE_PROFILE_MAX);
    for (int i = 0; i < *n; i++) {
      const char *have = codec ? p->codec_c[i].name : p->a2a[i].name;
      MOE_FAIL_IF(ctx, strcmp(have, it->string) == 0, MOE_STATUS_INVALID_ARG,
                  "profile: key '%s' appears twice", key);
    }
    if (!codec) {
      snprintf(p->a2a[*n].name, sizeof p->a2a[*n].name, "%s", it->string);
      MOE_TRY(parse_fit(ctx, it, key, &p->a2a[*n].fit));
    } else {
      const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "compress");
      const cJSON *d = cJSON_GetObjectItemCaseSensitive(it, "decompress");
      MOE_FAIL_IF(ctx, !c || !d || cJSON_GetArraySize(it) != 2, MOE_STATUS_INVALID_ARG,
                  "profile: '%s' must hold exactly 'compress' and 'decompress'", key);
      char kc[200], kd[200];
      snprintf(kc, sizeof kc, "%s.compress", key);
      snprintf(kd, sizeof kd, "%s.decompress", key);
      snprintf(p->codec_c[*n].name, sizeof p->codec_c[*n].name, "%s", it->string);
      snprintf(p->codec_d[*n].name, sizeof p->codec_d[*n].name, "%s", it->string);
      MOE_TRY(parse_fit(ctx, c, kc, &p->codec_c[*n].fit));
      MOE_TRY(parse_fit(ctx, d, kd, &p->codec_d[*n].fit));
    }
    (*n)++;
  }
done:
  return st;
}

// "layer_fit" (after 'a2a' is known): {"samples": n, "compute_scale": s,
// "compute_task_s": t, "outside": FIT, "a2a": {name: {"scale": s, "exchange_s": t}}}
static moe_status parse_layer_fit(moe_ctx *ctx, const cJSON *obj, moe_profile *p) {
  moe_status st = MOE_STATUS_OK;
  int have = 0;
  MOE_FAIL_IF(ctx, !cJSON_IsObject(obj), MOE_STATUS_INVALID_ARG,
              "profile: 'layer_fit' must be an object");
  for (const cJSON *it = obj->child; it; it = it->next) {
    const char *k = it->string;
    char key[160];
    snprintf(key, sizeof key, "layer_fit.%s", k);
    for (const cJSON *q = obj->child; q != it; q = q->next) {
      MOE_FAIL_IF(ctx, strcmp(q->string, k) == 0, MOE_STATUS_INVALID_ARG,
                  "profile: key '%s' appears twice", key);
    }
    if (strcmp(k, "samples") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, key, &p->layer_fit.samples));
      MOE_FAIL_IF(ctx, p->layer_fit.samples < 2, MOE_STATUS_INVALID_ARG,
                  "profile: '%s' (%d) must be >= 2", key, p->layer_fit.samples);
      have |= 1;
    } else if (strcmp(k, "compute_scale") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &p->layer_fit.compute_scale));
      MOE_FAIL_IF(ctx, !(p->layer_fit.compute_scale > 0.0) || p->layer_fit.compute_scale > 100.0,
                  MOE_STATUS_INVALID_ARG, "profile: '%s' (%g) must be in (0, 100]", key,
                  p->layer_fit.compute_scale);
      have |= 2;
    } else if (strcmp(k, "compute_task_s") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &p->layer_fit.compute_task_s));
      MOE_FAIL_IF(
          ctx,
          !(p->layer_fit.compute_task_s >= -p->task_overhead) || p->layer_fit.compute_task_s > 1.0,
          MOE_STATUS_INVALID_ARG, "profile: '%s' (%g) must be in [-task_overhead_s, 1] = [%g, 1]",
          key, p->layer_fit.compute_task_s, -p->task_overhead);
      have |= 4;
    } else if (strcmp(k, "outside") == 0) {
      MOE_TRY(parse_fit(ctx, it, key, &p->layer_fit.outside));
      have |= 8;
    } else if (strcmp(k, "a2a") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsObject(it), MOE_STATUS_INVALID_ARG,
                  "profile: '%s' must be an object {algorithm: {scale, exchange_s}}", key);
      for (const cJSON *al = it->child; al; al = al->next) {
        int idx = -1;
        for (int i = 0; i < p->n_a2a; i++) {
          if (strcmp(p->a2a[i].name, al->string) == 0) idx = i;
        }
        MOE_FAIL_IF(ctx, idx < 0, MOE_STATUS_INVALID_ARG,
                    "profile: layer_fit.a2a.%s has no model in 'a2a'", al->string);
        MOE_FAIL_IF(ctx, p->layer_fit.a2a_scale[idx] > 0, MOE_STATUS_INVALID_ARG,
                    "profile: key 'layer_fit.a2a.%s' appears twice", al->string);
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(al, "scale");
        const cJSON *ex = cJSON_GetObjectItemCaseSensitive(al, "exchange_s");
        const cJSON *c1 = cJSON_GetObjectItemCaseSensitive(al, "compute_slowdown");
        const cJSON *c2 = cJSON_GetObjectItemCaseSensitive(al, "comm_slowdown");
        const cJSON *s1 = cJSON_GetObjectItemCaseSensitive(al, "smart_compute_slowdown");
        const cJSON *s2 = cJSON_GetObjectItemCaseSensitive(al, "smart_comm_slowdown");
        MOE_FAIL_IF(ctx,
                    !cJSON_IsObject(al) || !sc || !ex || !c1 != !c2 || !s1 != !s2 ||
                        cJSON_GetArraySize(al) != 2 + (c1 ? 2 : 0) + (s1 ? 2 : 0),
                    MOE_STATUS_INVALID_ARG,
                    "profile: layer_fit.a2a.%s must be {\"scale\": s, \"exchange_s\": t} and "
                    "optionally \"compute_slowdown\": x, \"comm_slowdown\": y and "
                    "\"smart_compute_slowdown\": x, \"smart_comm_slowdown\": y (each pair both or "
                    "neither)",
                    al->string);
        char ks[200];
        snprintf(ks, sizeof ks, "layer_fit.a2a.%s", al->string);
        MOE_TRY(moe_json_get_double(ctx, sc, ks, &p->layer_fit.a2a_scale[idx]));
        MOE_TRY(moe_json_get_double(ctx, ex, ks, &p->layer_fit.a2a_exchange_s[idx]));
        MOE_FAIL_IF(ctx,
                    !(p->layer_fit.a2a_scale[idx] > 0.0) || p->layer_fit.a2a_scale[idx] > 100.0 ||
                        !(p->layer_fit.a2a_exchange_s[idx] >= -p->task_overhead) ||
                        p->layer_fit.a2a_exchange_s[idx] > 1.0,
                    MOE_STATUS_INVALID_ARG,
                    "profile: %s needs scale in (0, 100] and exchange_s in [-task_overhead_s, 1] "
                    "= [%g, 1] (got %g, %g)",
                    ks, -p->task_overhead, p->layer_fit.a2a_scale[idx],
                    p->layer_fit.a2a_exchange_s[idx]);
        for (int f = 0; f < 2; f++) {
          const cJSON *a = f ? s1 : c1, *b = f ? s2 : c2;
          if (!a) continue;
          double *sl = f ? p->layer_fit.a2a_smart_slow[idx] : p->layer_fit.a2a_slow[idx];
          MOE_TRY(moe_json_get_double(ctx, a, ks, &sl[0]));
          MOE_TRY(moe_json_get_double(ctx, b, ks, &sl[1]));
          MOE_FAIL_IF(ctx, !(sl[0] >= 1.0) || !(sl[1] >= 1.0) || sl[0] > 100.0 || sl[1] > 100.0,
                      MOE_STATUS_INVALID_ARG,
                      "profile: %s %sslowdowns (%g, %g) must be in [1, 100]", ks, f ? "smart " : "",
                      sl[0], sl[1]);
        }
      }
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
               "profile: unknown key '%s' (valid: samples, compute_scale, compute_task_s, "
               "outside, a2a)",
               key);
    }
  }
  MOE_FAIL_IF(ctx, (have & 15) != 15, MOE_STATUS_INVALID_ARG, "profile: 'layer_fit' lacks '%s'",
              !(have & 1)   ? "samples"
              : !(have & 2) ? "compute_scale"
              : !(have & 4) ? "compute_task_s"
                            : "outside");
  p->layer_fit.have = 1;
done:
  return st;
}

moe_status moe_profile_from_json(moe_ctx *ctx, const char *json, moe_profile *out) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  moe_profile p;
  memset(&p, 0, sizeof p);
  p.slow_compute = p.slow_comm = 1.0;
  int have_version = 0, have_cluster = 0, have_gemm = 0, have_a2a = 0;
  const cJSON *a2a_points = NULL, *layer_fit = NULL;
  MOE_FAIL_IF(ctx, !json || !out, MOE_STATUS_INVALID_ARG, "profile: json and out must be set");
  MOE_TRY(moe_json_parse_object(ctx, json, "profile", &root));
  for (const cJSON *it = root->child; it; it = it->next) {
    const char *k = it->string;
    for (const cJSON *q = root->child; q != it; q = q->next) {
      MOE_FAIL_IF(ctx, strcmp(q->string, k) == 0, MOE_STATUS_INVALID_ARG,
                  "profile: key '%s' appears twice", k);
    }
    if (strcmp(k, "profile_version") == 0) {
      int v = 0;
      MOE_TRY(moe_json_get_int(ctx, it, k, &v));
      MOE_FAIL_IF(ctx, v != 1, MOE_STATUS_INVALID_ARG,
                  "profile: profile_version %d is not supported (this libmoe reads 1)", v);
      have_version = 1;
    } else if (strcmp(k, "name") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsString(it) || strlen(it->valuestring) >= sizeof p.name,
                  MOE_STATUS_INVALID_ARG, "profile: 'name' must be a string of < %zu bytes",
                  sizeof p.name);
      snprintf(p.name, sizeof p.name, "%s", it->valuestring);
    } else if (strcmp(k, "created_by") == 0 || strcmp(k, "note") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsString(it), MOE_STATUS_INVALID_ARG,
                  "profile: '%s' must be a string", k);
    } else if (strcmp(k, "cluster") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsObject(it), MOE_STATUS_INVALID_ARG,
                  "profile: 'cluster' must be a cluster description object");
      MOE_TRY(moe_cluster_from_object_(ctx, it, &p.cluster));
      have_cluster = 1;
    } else if (strcmp(k, "gemm") == 0) {
      MOE_TRY(parse_fit(ctx, it, "gemm", &p.gemm));
      have_gemm = 1;
    } else if (strcmp(k, "a2a") == 0) {
      MOE_TRY(parse_named(ctx, it, "a2a", 0, &p));
      have_a2a = 1;
    } else if (strcmp(k, "codecs") == 0) {
      MOE_TRY(parse_named(ctx, it, "codecs", 1, &p));
    } else if (strcmp(k, "expert_fwd") == 0) {
      MOE_TRY(parse_fit(ctx, it, k, &p.expert_fwd));
      p.have_step_fits |= 1;
    } else if (strcmp(k, "expert_bwd") == 0) {
      MOE_TRY(parse_fit(ctx, it, k, &p.expert_bwd));
      p.have_step_fits |= 2;
    } else if (strcmp(k, "expert_points") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsArray(it), MOE_STATUS_INVALID_ARG,
                  "profile: 'expert_points' must be an array of [rows, M, H, fwd_s, bwd_s]");
      const int np = cJSON_GetArraySize(it);
      MOE_FAIL_IF(ctx, np > MOE_PROFILE_MAX * 2, MOE_STATUS_INVALID_ARG,
                  "profile: 'expert_points' has %d entries (at most %d)", np, MOE_PROFILE_MAX * 2);
      int i = 0;
      for (const cJSON *e = it->child; e; e = e->next, i++) {
        MOE_FAIL_IF(ctx, !cJSON_IsArray(e) || cJSON_GetArraySize(e) != 5, MOE_STATUS_INVALID_ARG,
                    "profile: expert_points[%d] must be [rows, M, H, fwd_s, bwd_s]", i);
        int j = 0;
        for (const cJSON *v = e->child; v; v = v->next, j++) {
          MOE_FAIL_IF(ctx, !cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble),
                      MOE_STATUS_INVALID_ARG,
                      "profile: expert_points[%d][%d] must be a positive number", i, j);
          p.expert_points[i][j] = v->valuedouble;
        }
      }
      p.n_expert_points = np;
    } else if (strcmp(k, "overlap") == 0) {
      const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "compute_slowdown");
      const cJSON *m = cJSON_GetObjectItemCaseSensitive(it, "comm_slowdown");
      MOE_FAIL_IF(ctx, !cJSON_IsObject(it) || !c || !m || cJSON_GetArraySize(it) != 2,
                  MOE_STATUS_INVALID_ARG,
                  "profile: 'overlap' must be {\"compute_slowdown\": x, \"comm_slowdown\": y}");
      MOE_TRY(moe_json_get_double(ctx, c, "overlap.compute_slowdown", &p.slow_compute));
      MOE_TRY(moe_json_get_double(ctx, m, "overlap.comm_slowdown", &p.slow_comm));
      MOE_FAIL_IF(ctx,
                  !(p.slow_compute >= 1.0) || !(p.slow_comm >= 1.0) || p.slow_compute > 100.0 ||
                      p.slow_comm > 100.0,
                  MOE_STATUS_INVALID_ARG, "profile: overlap slowdowns (%g, %g) must be in [1, 100]",
                  p.slow_compute, p.slow_comm);
    } else if (strcmp(k, "task_overhead_s") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, k, &p.task_overhead));
      MOE_FAIL_IF(ctx, !(p.task_overhead >= 0.0) || p.task_overhead > 1.0, MOE_STATUS_INVALID_ARG,
                  "profile: task_overhead_s (%g) must be in [0, 1]", p.task_overhead);
    } else if (strcmp(k, "small_collective_s") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, k, &p.small_collective));
      MOE_FAIL_IF(ctx, !(p.small_collective >= 0.0) || p.small_collective > 1.0,
                  MOE_STATUS_INVALID_ARG, "profile: small_collective_s (%g) must be in [0, 1]",
                  p.small_collective);
    } else if (strcmp(k, "a2a_allreduce_slowdown") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, k, &p.a2a_allreduce_slowdown));
      MOE_FAIL_IF(ctx, !(p.a2a_allreduce_slowdown >= 1.0) || p.a2a_allreduce_slowdown > 100.0,
                  MOE_STATUS_INVALID_ARG,
                  "profile: a2a_allreduce_slowdown (%g) must be in [1, 100]",
                  p.a2a_allreduce_slowdown);
    } else if (strcmp(k, "copy_gbs") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, k, &p.copy_gbs));
      MOE_FAIL_IF(ctx, !(p.copy_gbs > 0.0) || p.copy_gbs > 1e6, MOE_STATUS_INVALID_ARG,
                  "profile: copy_gbs (%g) must be in (0, 1e6]", p.copy_gbs);
    } else if (strcmp(k, "a2a_points") == 0) {
      MOE_FAIL_IF(ctx, !cJSON_IsObject(it), MOE_STATUS_INVALID_ARG,
                  "profile: 'a2a_points' must be an object {algorithm: [[bytes, s], ...]}");
      a2a_points = it;  // resolved after 'a2a' is known
    } else if (strcmp(k, "layer_fit") == 0) {
      layer_fit = it;  // resolved after 'a2a' is known
    } else if (strcmp(k, "parm") == 0) {
      MOE_TRY(parse_parm(ctx, it, &p));
    } else if (strcmp(k, "outside") == 0) {
      MOE_TRY(parse_fit(ctx, it, k, &p.outside));
      p.have_step_fits |= 4;
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
               "profile: unknown key '%s' (valid: profile_version, name, created_by, note, "
               "cluster, gemm, a2a, codecs, expert_fwd, expert_bwd, outside, expert_points, "
               "overlap, a2a_points, task_overhead_s, small_collective_s, copy_gbs, "
               "a2a_allreduce_slowdown, layer_fit, parm)",
               k);
    }
  }
  MOE_FAIL_IF(ctx, !have_version || !have_cluster || !have_gemm || !have_a2a,
              MOE_STATUS_INVALID_ARG, "profile: required key '%s' is missing",
              !have_version   ? "profile_version"
              : !have_cluster ? "cluster"
              : !have_gemm    ? "gemm"
                              : "a2a");
  MOE_FAIL_IF(ctx, p.n_a2a == 0, MOE_STATUS_INVALID_ARG,
              "profile: 'a2a' holds no all-to-all model");
  MOE_FAIL_IF(ctx, p.have_step_fits != 0 && p.have_step_fits != 7, MOE_STATUS_INVALID_ARG,
              "profile: expert_fwd, expert_bwd and outside come together (found only some)");
  p.have_step_fits = p.have_step_fits == 7;
  for (const cJSON *al = a2a_points ? a2a_points->child : NULL; al; al = al->next) {
    int idx = -1;
    for (int i = 0; i < p.n_a2a; i++) {
      if (strcmp(p.a2a[i].name, al->string) == 0) idx = i;
    }
    MOE_FAIL_IF(ctx, idx < 0, MOE_STATUS_INVALID_ARG,
                "profile: a2a_points.%s has no model in 'a2a'", al->string);
    MOE_FAIL_IF(ctx, p.n_a2a_points[idx] != 0, MOE_STATUS_INVALID_ARG,
                "profile: key 'a2a_points.%s' appears twice", al->string);
    const int np = cJSON_GetArraySize(al);
    MOE_FAIL_IF(ctx, !cJSON_IsArray(al) || np < 1 || np > 24, MOE_STATUS_INVALID_ARG,
                "profile: a2a_points.%s must be 1..24 points [bytes, s]", al->string);
    int i = 0;
    double last = 0;
    for (const cJSON *e = al->child; e; e = e->next, i++) {
      const cJSON *x = cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 ? e->child : NULL;
      MOE_FAIL_IF(ctx,
                  !x || !cJSON_IsNumber(x) || !cJSON_IsNumber(x->next) ||
                      !(x->valuedouble > last) || !(x->next->valuedouble > 0) ||
                      !isfinite(x->valuedouble) || !isfinite(x->next->valuedouble),
                  MOE_STATUS_INVALID_ARG,
                  "profile: a2a_points.%s[%d] must be [bytes, seconds], positive, bytes "
                  "increasing",
                  al->string, i);
      p.a2a_points[idx][i][0] = last = x->valuedouble;
      p.a2a_points[idx][i][1] = x->next->valuedouble;
    }
    p.n_a2a_points[idx] = np;
  }
  if (layer_fit) MOE_TRY(parse_layer_fit(ctx, layer_fit, &p));
  *out = p;
done:
  cJSON_Delete(root);
  return st;
}

static moe_status parse_profile(moe_ctx *ctx, const char *text, void *out) {
  return moe_profile_from_json(ctx, text, out);
}

moe_status moe_profile_load(moe_ctx *ctx, const char *path, moe_profile *out) {
  return moe_json_load_file(ctx, path, 4u << 20, parse_profile, out);
}

// Appends printf output to a growing buffer.
typedef struct {
  char *buf;
  size_t len, cap;
  int failed;
} strbuf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
sb_printf(strbuf *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = 1;
      return;
    }
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    const size_t cap = (b->cap + (size_t)n + 1) * 2;
    char *nb = moe_malloc(cap);
    if (!nb) {
      b->failed = 1;
      return;
    }
    memcpy(nb, b->buf, b->len + 1);
    moe_free(b->buf);
    b->buf = nb;
    b->cap = cap;
  }
}

static void sb_fit(strbuf *b, const moe_linear_fit *f) {
  sb_printf(b, "{\"alpha_s\": %.17g, \"beta_s\": %.17g, ", f->alpha, f->beta);
  if (f->gamma != 0.0) sb_printf(b, "\"gamma_s\": %.17g, ", f->gamma);
  // every number %.17g, r2 included: a profile reads back bitwise (fuzz/fuzz_profile.c
  // found r2 printed with 6 decimals, expert rows and a2a bytes rounded to integers)
  sb_printf(b, "\"r2\": %.17g, \"points\": %d, \"rmse_s\": %.17g}", f->r2, f->n, f->rmse);
}

// A JSON string literal of s: quotes and backslashes escaped, control
// characters as \u00XX (the reader accepts them, so the text reads back as
// s; dropping them lost characters of a name: found by fuzz/fuzz_profile.c).
static void sb_string(strbuf *b, const char *s) {
  sb_printf(b, "\"");
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') {
      sb_printf(b, "\\%c", *s);
    } else if ((unsigned char)*s < 0x20) {
      sb_printf(b, "\\u%04x", (unsigned)(unsigned char)*s);
    } else {
      sb_printf(b, "%c", *s);
    }
  }
  sb_printf(b, "\"");
}

moe_status moe_profile_to_json(moe_ctx *ctx, const moe_profile *p, char **out) {
  moe_status st = MOE_STATUS_OK;
  strbuf b = {moe_malloc(4096), 0, 4096, 0};
  MOE_FAIL_IF(ctx, !p || !out, MOE_STATUS_INVALID_ARG, "profile: p and out must be set");
  MOE_FAIL_IF(ctx, !b.buf, MOE_STATUS_OUT_OF_MEMORY, "profile: cannot allocate");
  b.buf[0] = '\0';
  const moe_cluster *c = &p->cluster;
  sb_printf(&b, "{\n  \"profile_version\": 1,\n  \"name\": ");
  sb_string(&b, p->name);
  sb_printf(&b, ",\n  \"created_by\": \"moe calibrate\",\n  \"cluster\": {\"name\": ");
  sb_string(&b, c->name);
  sb_printf(&b, ", \"device\": ");
  sb_string(&b, c->device);
  sb_printf(&b, ", \"source\": ");
  sb_string(&b, c->source);
  sb_printf(&b,
            ",\n    \"nodes\": %d, \"devices_per_node\": %d, \"gemm_tflops\": %.17g,\n"
            "    \"intra\": {\"gbit_per_s\": %.17g, \"latency_us\": %.17g, \"kind\": ",
            c->nodes, c->devices_per_node, c->gemm_tflops, c->intra.gbit_per_s,
            c->intra.latency_us);
  sb_string(&b, c->intra.kind);
  sb_printf(&b, "},\n    \"inter\": {\"gbit_per_s\": %.17g, \"latency_us\": %.17g, \"kind\": ",
            c->inter.gbit_per_s, c->inter.latency_us);
  sb_string(&b, c->inter.kind);
  sb_printf(&b, "},\n    \"nics_per_node\": %d, \"inter_uses_intra\": %s},\n  \"gemm\": ",
            c->nics_per_node, c->inter_uses_intra ? "true" : "false");
  sb_fit(&b, &p->gemm);
  if (p->have_step_fits) {
    sb_printf(&b, ",\n  \"expert_fwd\": ");
    sb_fit(&b, &p->expert_fwd);
    sb_printf(&b, ",\n  \"expert_bwd\": ");
    sb_fit(&b, &p->expert_bwd);
    sb_printf(&b, ",\n  \"outside\": ");
    sb_fit(&b, &p->outside);
  }
  if (p->task_overhead > 0) sb_printf(&b, ",\n  \"task_overhead_s\": %.17g", p->task_overhead);
  if (p->small_collective > 0) {
    sb_printf(&b, ",\n  \"small_collective_s\": %.17g", p->small_collective);
  }
  if (p->copy_gbs > 0) sb_printf(&b, ",\n  \"copy_gbs\": %.17g", p->copy_gbs);
  if (p->a2a_allreduce_slowdown >= 1.0)
    sb_printf(&b, ",\n  \"a2a_allreduce_slowdown\": %.17g", p->a2a_allreduce_slowdown);
  {
    int any = 0;
    for (int i = 0; i < p->n_a2a; i++) any |= p->n_a2a_points[i] > 0;
    if (any) {
      sb_printf(&b, ",\n  \"a2a_points\": {");
      int first = 1;
      for (int i = 0; i < p->n_a2a; i++) {
        if (p->n_a2a_points[i] == 0) continue;
        sb_printf(&b, "%s\n    ", first ? "" : ",");
        sb_string(&b, p->a2a[i].name);
        sb_printf(&b, ": [");
        for (int j = 0; j < p->n_a2a_points[i]; j++) {
          sb_printf(&b, "%s[%.17g, %.17g]", j ? ", " : "", p->a2a_points[i][j][0],
                    p->a2a_points[i][j][1]);
        }
        sb_printf(&b, "]");
        first = 0;
      }
      sb_printf(&b, "\n  }");
    }
  }
  if (p->slow_compute > 1.0 || p->slow_comm > 1.0) {
    sb_printf(&b, ",\n  \"overlap\": {\"compute_slowdown\": %.17g, \"comm_slowdown\": %.17g}",
              p->slow_compute, p->slow_comm);
  }
  if (p->n_expert_points > 0) {
    sb_printf(&b, ",\n  \"expert_points\": [");
    for (int i = 0; i < p->n_expert_points; i++) {
      const double *e = p->expert_points[i];
      sb_printf(&b, "%s\n    [%.17g, %.17g, %.17g, %.17g, %.17g]", i ? "," : "", e[0], e[1], e[2],
                e[3], e[4]);
    }
    sb_printf(&b, "\n  ]");
  }
  if (p->layer_fit.have) {
    sb_printf(&b,
              ",\n  \"layer_fit\": {\"samples\": %d, \"compute_scale\": %.17g, "
              "\"compute_task_s\": %.17g,\n    \"outside\": ",
              p->layer_fit.samples, p->layer_fit.compute_scale, p->layer_fit.compute_task_s);
    sb_fit(&b, &p->layer_fit.outside);
    sb_printf(&b, ",\n    \"a2a\": {");
    int first = 1;
    for (int i = 0; i < p->n_a2a; i++) {
      if (!(p->layer_fit.a2a_scale[i] > 0)) continue;
      sb_printf(&b, "%s", first ? "" : ", ");
      sb_string(&b, p->a2a[i].name);
      sb_printf(&b, ": {\"scale\": %.17g, \"exchange_s\": %.17g", p->layer_fit.a2a_scale[i],
                p->layer_fit.a2a_exchange_s[i]);
      if (p->layer_fit.a2a_slow[i][0] >= 1.0) {
        sb_printf(&b, ", \"compute_slowdown\": %.17g, \"comm_slowdown\": %.17g",
                  p->layer_fit.a2a_slow[i][0], p->layer_fit.a2a_slow[i][1]);
      }
      if (p->layer_fit.a2a_smart_slow[i][0] >= 1.0) {
        sb_printf(&b, ", \"smart_compute_slowdown\": %.17g, \"smart_comm_slowdown\": %.17g",
                  p->layer_fit.a2a_smart_slow[i][0], p->layer_fit.a2a_smart_slow[i][1]);
      }
      sb_printf(&b, "}");
      first = 0;
    }
    sb_printf(&b, "}}");
  }
  if (p->n_parm > 0) {
    sb_printf(&b, ",\n  \"parm\": [");
    for (int i = 0; i < p->n_parm; i++) {
      const moe_parm_terms *t = &p->parm[i];
      sb_printf(&b, "%s\n    {\"mp\": %d, \"ep\": %d, \"esp\": %d, \"a2a\": ", i ? "," : "", t->mp,
                t->ep, t->esp);
      sb_string(&b, t->a2a);
      sb_printf(&b,
                ",\n     \"alpha_a2a\": %.17g, \"beta_a2a\": %.17g, \"alpha_mp\": %.17g, "
                "\"beta_mp\": %.17g,\n     \"alpha_o\": %.17g, \"beta_o\": %.17g}",
                t->ab.alpha_a2a, t->ab.beta_a2a, t->ab.alpha_mp, t->ab.beta_mp, t->ab.alpha_o,
                t->ab.beta_o);
    }
    sb_printf(&b, "\n  ]");
  }
  sb_printf(&b, ",\n  \"a2a\": {");
  for (int i = 0; i < p->n_a2a; i++) {
    sb_printf(&b, "%s\n    ", i ? "," : "");
    sb_string(&b, p->a2a[i].name);
    sb_printf(&b, ": ");
    sb_fit(&b, &p->a2a[i].fit);
  }
  sb_printf(&b, "\n  },\n  \"codecs\": {");
  for (int i = 0; i < p->n_codec; i++) {
    sb_printf(&b, "%s\n    ", i ? "," : "");
    sb_string(&b, p->codec_c[i].name);
    sb_printf(&b, ": {\"compress\": ");
    sb_fit(&b, &p->codec_c[i].fit);
    sb_printf(&b, ",\n      \"decompress\": ");
    sb_fit(&b, &p->codec_d[i].fit);
    sb_printf(&b, "}");
  }
  sb_printf(&b, "\n  }\n}\n");
  MOE_FAIL_IF(ctx, b.failed, MOE_STATUS_OUT_OF_MEMORY, "profile: cannot format the JSON");
  *out = b.buf;
  b.buf = NULL;
done:
  moe_free(b.buf);
  return st;
}

const moe_parm_alpha_beta *moe_profile_parm(const moe_profile *p, int mp, int ep, int esp,
                                            const char *algo) {
  for (int i = 0; p && algo && i < p->n_parm; i++) {
    const moe_parm_terms *t = &p->parm[i];
    if (t->mp == mp && t->ep == ep && t->esp == esp && strcmp(t->a2a, algo) == 0) return &t->ab;
  }
  return NULL;
}

const moe_linear_fit *moe_profile_a2a(const moe_profile *p, const char *algo) {
  for (int i = 0; p && algo && i < p->n_a2a; i++) {
    if (strcmp(p->a2a[i].name, algo) == 0) return &p->a2a[i].fit;
  }
  return NULL;
}

int moe_profile_codec(const moe_profile *p, const char *name, const moe_linear_fit **compress,
                      const moe_linear_fit **decompress) {
  const size_t len = name ? strcspn(name, ":") : 0;
  for (int i = 0; p && name && i < p->n_codec; i++) {
    if (strlen(p->codec_c[i].name) == len && strncmp(p->codec_c[i].name, name, len) == 0) {
      if (compress) *compress = &p->codec_c[i].fit;
      if (decompress) *decompress = &p->codec_d[i].fit;
      return 1;
    }
  }
  return 0;
}

moe_status moe_profile_check_ranks(moe_ctx *ctx, const moe_profile *prof, int ranks, int ep) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, moe_cluster_devices(&prof->cluster) != ranks || ep != ranks,
              MOE_STATUS_INVALID_ARG,
              "profile '%s' was calibrated on %d ranks; predictions need the same ranks (%d "
              "here) and EP over all of them (EP %d)",
              prof->name, moe_cluster_devices(&prof->cluster), ranks, ep);
done:
  return st;
}
