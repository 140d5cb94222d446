// Cluster descriptions (include/moe/perf.h): strict JSON parsing with errors
// that name the key and its valid range, validation, and scaling to another
// device count. The shipped descriptions live in clusters/*.json.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "moe/perf.h"
#include "perf/perf_internal.h"

#define MAX_NODES 65536
#define MAX_DPN 1024
#define MAX_DEVICES (1 << 20)

static moe_status link_validate(moe_ctx *ctx, const moe_link_spec *l, const char *what) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !(l->gbit_per_s > 0.0) || !(l->gbit_per_s <= 1e6), MOE_STATUS_INVALID_ARG,
              "cluster: %s.gbit_per_s (%g) must be in (0, 1e6] Gbit/s", what, l->gbit_per_s);
  MOE_FAIL_IF(ctx, !(l->latency_us >= 0.0) || !(l->latency_us <= 1e6), MOE_STATUS_INVALID_ARG,
              "cluster: %s.latency_us (%g) must be in [0, 1e6] microseconds", what, l->latency_us);
done:
  return st;
}

moe_status moe_cluster_validate(moe_ctx *ctx, const moe_cluster *c) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !c, MOE_STATUS_INVALID_ARG, "cluster must not be NULL");
  MOE_FAIL_IF(ctx, c->nodes < 1 || c->nodes > MAX_NODES, MOE_STATUS_INVALID_ARG,
              "cluster: nodes (%d) must be in [1, %d]", c->nodes, MAX_NODES);
  MOE_FAIL_IF(ctx, c->devices_per_node < 1 || c->devices_per_node > MAX_DPN, MOE_STATUS_INVALID_ARG,
              "cluster: devices_per_node (%d) must be in [1, %d]", c->devices_per_node, MAX_DPN);
  MOE_FAIL_IF(ctx, (long long)c->nodes * c->devices_per_node > MAX_DEVICES, MOE_STATUS_INVALID_ARG,
              "cluster: nodes x devices_per_node (%lld) must be <= %d",
              (long long)c->nodes * c->devices_per_node, MAX_DEVICES);
  MOE_FAIL_IF(ctx, !(c->gemm_tflops > 0.0) || !(c->gemm_tflops <= 1e6), MOE_STATUS_INVALID_ARG,
              "cluster: gemm_tflops (%g) must be in (0, 1e6] TFLOP/s", c->gemm_tflops);
  MOE_TRY(link_validate(ctx, &c->intra, "intra"));
  MOE_TRY(link_validate(ctx, &c->inter, "inter"));
  MOE_FAIL_IF(ctx, c->nics_per_node < 1 || c->nics_per_node > c->devices_per_node,
              MOE_STATUS_INVALID_ARG, "cluster: nics_per_node (%d) must be in [1, %d]",
              c->nics_per_node, c->devices_per_node);
  MOE_FAIL_IF(ctx, c->inter_uses_intra != 0 && c->inter_uses_intra != 1, MOE_STATUS_INVALID_ARG,
              "cluster: inter_uses_intra (%d) must be 0 or 1", c->inter_uses_intra);
done:
  return st;
}

// Copies a JSON string into buf (len bytes) or fails naming the key.
static moe_status get_string(moe_ctx *ctx, const cJSON *it, const char *key, char *buf,
                             size_t len) {
  moe_status st = MOE_STATUS_OK;
  MOE_FAIL_IF(ctx, !cJSON_IsString(it), MOE_STATUS_INVALID_ARG, "cluster: '%s' must be a string",
              key);
  MOE_FAIL_IF(ctx, strlen(it->valuestring) >= len, MOE_STATUS_INVALID_ARG,
              "cluster: '%s' is longer than %zu bytes", key, len - 1);
  snprintf(buf, len, "%s", it->valuestring);
done:
  return st;
}

static moe_status duplicate_check(moe_ctx *ctx, const cJSON *obj, const cJSON *it,
                                  const char *where) {
  moe_status st = MOE_STATUS_OK;
  for (const cJSON *p = obj->child; p != it; p = p->next) {
    MOE_FAIL_IF(ctx, strcmp(p->string, it->string) == 0, MOE_STATUS_INVALID_ARG,
                "cluster: key '%s' appears twice in %s", it->string, where);
  }
done:
  return st;
}

static moe_status parse_link(moe_ctx *ctx, const cJSON *obj, const char *name, moe_link_spec *l) {
  moe_status st = MOE_STATUS_OK;
  int have_bw = 0, have_lat = 0;
  MOE_FAIL_IF(ctx, !cJSON_IsObject(obj), MOE_STATUS_INVALID_ARG,
              "cluster: '%s' must be an object with gbit_per_s, latency_us and optionally kind",
              name);
  memset(l, 0, sizeof *l);
  for (const cJSON *it = obj->child; it; it = it->next) {
    MOE_TRY(duplicate_check(ctx, obj, it, name));
    char key[64];
    snprintf(key, sizeof key, "%s.%s", name, it->string);
    if (strcmp(it->string, "gbit_per_s") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &l->gbit_per_s));
      have_bw = 1;
    } else if (strcmp(it->string, "latency_us") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, key, &l->latency_us));
      have_lat = 1;
    } else if (strcmp(it->string, "kind") == 0) {
      MOE_TRY(get_string(ctx, it, key, l->kind, sizeof l->kind));
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
               "cluster: unknown key '%s' (valid in %s: gbit_per_s, latency_us, kind)", key, name);
    }
  }
  MOE_FAIL_IF(ctx, !have_bw || !have_lat, MOE_STATUS_INVALID_ARG, "cluster: '%s' lacks %s", name,
              !have_bw ? "gbit_per_s" : "latency_us");
done:
  return st;
}

moe_status moe_cluster_from_object_(moe_ctx *ctx, const cJSON *root, moe_cluster *out) {
  moe_status st = MOE_STATUS_OK;
  moe_cluster c;
  memset(&c, 0, sizeof c);
  c.nics_per_node = 1;
  enum { K_NAME, K_DEVICE, K_NODES, K_DPN, K_TFLOPS, K_INTRA, K_INTER, K_REQUIRED };
  static const char *const required[K_REQUIRED] = {
      "name", "device", "nodes", "devices_per_node", "gemm_tflops", "intra", "inter"};
  int have[K_REQUIRED] = {0};
  MOE_FAIL_IF(ctx, !root || !out || !cJSON_IsObject(root), MOE_STATUS_INVALID_ARG,
              "cluster: a JSON object and out must be given");
  for (const cJSON *it = root->child; it; it = it->next) {
    MOE_TRY(duplicate_check(ctx, root, it, "the cluster description"));
    const char *k = it->string;
    if (strcmp(k, "name") == 0) {
      MOE_TRY(get_string(ctx, it, k, c.name, sizeof c.name));
      have[K_NAME] = 1;
    } else if (strcmp(k, "device") == 0) {
      MOE_TRY(get_string(ctx, it, k, c.device, sizeof c.device));
      have[K_DEVICE] = 1;
    } else if (strcmp(k, "source") == 0) {
      MOE_TRY(get_string(ctx, it, k, c.source, sizeof c.source));
    } else if (strcmp(k, "nodes") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &c.nodes));
      have[K_NODES] = 1;
    } else if (strcmp(k, "devices_per_node") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &c.devices_per_node));
      have[K_DPN] = 1;
    } else if (strcmp(k, "gemm_tflops") == 0) {
      MOE_TRY(moe_json_get_double(ctx, it, k, &c.gemm_tflops));
      have[K_TFLOPS] = 1;
    } else if (strcmp(k, "intra") == 0) {
      MOE_TRY(parse_link(ctx, it, "intra", &c.intra));
      have[K_INTRA] = 1;
    } else if (strcmp(k, "inter") == 0) {
      MOE_TRY(parse_link(ctx, it, "inter", &c.inter));
      have[K_INTER] = 1;
    } else if (strcmp(k, "nics_per_node") == 0) {
      MOE_TRY(moe_json_get_int(ctx, it, k, &c.nics_per_node));
    } else if (strcmp(k, "inter_uses_intra") == 0) {
      MOE_TRY(moe_json_get_bool(ctx, it, k, &c.inter_uses_intra));
    } else {
      MOE_FAIL(ctx, MOE_STATUS_INVALID_ARG,
               "cluster: unknown key '%s' (valid: name, device, source, nodes, devices_per_node, "
               "gemm_tflops, intra, inter, nics_per_node, inter_uses_intra)",
               k);
    }
  }
  for (int i = 0; i < K_REQUIRED; i++) {
    MOE_FAIL_IF(ctx, !have[i], MOE_STATUS_INVALID_ARG, "cluster: required key '%s' is missing",
                required[i]);
  }
  MOE_TRY(moe_cluster_validate(ctx, &c));
  *out = c;
done:
  return st;
}

moe_status moe_cluster_from_json(moe_ctx *ctx, const char *json, moe_cluster *out) {
  moe_status st = MOE_STATUS_OK;
  cJSON *root = NULL;
  MOE_FAIL_IF(ctx, !json || !out, MOE_STATUS_INVALID_ARG, "cluster: json and out must be set");
  MOE_TRY(moe_json_parse_object(ctx, json, "cluster description", &root));
  MOE_TRY(moe_cluster_from_object_(ctx, root, out));
done:
  cJSON_Delete(root);
  return st;
}

static moe_status parse_cluster(moe_ctx *ctx, const char *text, void *out) {
  return moe_cluster_from_json(ctx, text, out);
}

moe_status moe_cluster_load(moe_ctx *ctx, const char *path, moe_cluster *out) {
  return moe_json_load_file(ctx, path, 1u << 20, parse_cluster, out);
}

moe_status moe_cluster_scale(moe_ctx *ctx, const moe_cluster *c, int devices, moe_cluster *out) {
  moe_status st = MOE_STATUS_OK;
  MOE_TRY(moe_cluster_validate(ctx, c));
  MOE_FAIL_IF(ctx, !out, MOE_STATUS_INVALID_ARG, "cluster scale: out must not be NULL");
  MOE_FAIL_IF(ctx, devices < 1 || devices > MAX_DEVICES, MOE_STATUS_INVALID_ARG,
              "devices (%d) must be in [1, %d]", devices, MAX_DEVICES);
  const int G = c->devices_per_node;
  MOE_FAIL_IF(ctx, devices > G && devices % G != 0, MOE_STATUS_INVALID_ARG,
              "devices (%d) must be at most one node (%d) or a multiple of %d (the devices per "
              "node of '%s')",
              devices, G, G, c->name);
  moe_cluster s = *c;
  if (devices <= G) {
    s.nodes = 1;
    s.devices_per_node = devices;
    if (s.nics_per_node > devices) s.nics_per_node = devices;
  } else {
    s.nodes = devices / G;
  }
  MOE_TRY(moe_cluster_validate(ctx, &s));
  *out = s;
done:
  return st;
}
