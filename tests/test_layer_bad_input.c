// Bad input to the MoE layer: every config error and every bad call returns
// MOE_STATUS_INVALID_ARG with a message that names the field (or tensor) and
// its valid range, and leaves no layer behind.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe/moe.h"
#include "testutil.h"

static moe_layer_config small_config(void) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.tokens = 16;
  c.model_dim = 8;
  c.hidden_dim = 12;
  c.num_experts = 4;
  c.top_k = 2;
  return c;
}

// Creating a layer from cfg must fail with INVALID_ARG, *out left NULL, and a
// message containing every string in expect (NULL-terminated).
static void expect_create_fails(const char *what, moe_layer_config cfg, const char *const *expect) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer *layer = (moe_layer *)ctx;  // poison: must be reset to NULL
  const moe_status st = moe_layer_create(ctx, &cfg, &layer);
  TU_CHECK(st == MOE_STATUS_INVALID_ARG, "%s: status %s", what, moe_status_str(st));
  TU_CHECK(layer == NULL, "%s: out not NULL on failure", what);
  for (int i = 0; expect[i]; i++) {
    TU_CHECK(strstr(moe_ctx_error(ctx), expect[i]) != NULL, "%s: message '%s' lacks '%s'", what,
             moe_ctx_error(ctx), expect[i]);
  }
  moe_layer_destroy(layer);
  moe_ctx_destroy(ctx);
}

static void mut_cf_nan(moe_layer_config *c) { c->capacity_factor = NAN; }
static void mut_cf_inf(moe_layer_config *c) { c->capacity_factor = INFINITY; }
static void mut_cf_huge(moe_layer_config *c) { c->capacity_factor = 2e6; }
static void mut_aux_neg(moe_layer_config *c) { c->aux_loss_coef = -1.0f; }
static void mut_aux_nan(moe_layer_config *c) { c->aux_loss_coef = NAN; }
static void mut_z_inf(moe_layer_config *c) { c->z_loss_coef = INFINITY; }
static void mut_tokens_zero(moe_layer_config *c) { c->tokens = 0; }
static void mut_tokens_huge(moe_layer_config *c) { c->tokens = MOE_MAX_TOKENS + 1; }
static void mut_m_huge(moe_layer_config *c) { c->model_dim = MOE_MAX_DIM + 1; }
static void mut_h_huge(moe_layer_config *c) { c->hidden_dim = MOE_MAX_DIM + 1; }
static void mut_e_huge(moe_layer_config *c) { c->num_experts = MOE_MAX_EXPERTS + 1; }
static void mut_renorm(moe_layer_config *c) { c->renormalize = 2; }
static void mut_check(moe_layer_config *c) { c->check_finite = 2; }
static void mut_rows(moe_layer_config *c) {
  c->tokens = MOE_MAX_TOKENS;
  c->num_experts = 32;
  c->top_k = 32;
}

static void test_config_errors(void) {
  moe_layer_config c = small_config();
  c.num_experts = 0;
  expect_create_fails("E = 0", c, (const char *const[]){"num_experts (0)", "[1, 65536]", NULL});
  c = small_config();
  c.top_k = 5;
  expect_create_fails("K > E", c, (const char *const[]){"top_k (5)", "[1, 4]", NULL});
  c = small_config();
  c.top_k = 0;
  expect_create_fails("K < 1", c, (const char *const[]){"top_k (0)", "[1, 4]", NULL});
  c = small_config();
  c.model_dim = 0;
  expect_create_fails("M = 0", c, (const char *const[]){"model_dim (0)", "[1, 1048576]", NULL});
  c = small_config();
  c.hidden_dim = 0;
  expect_create_fails("H = 0", c, (const char *const[]){"hidden_dim (0)", "[1, 1048576]", NULL});
  c = small_config();
  c.tokens = -5;
  expect_create_fails("negative tokens", c, (const char *const[]){"tokens (-5)", "[1, ", NULL});
  c = small_config();
  c.act = (moe_activation)7;
  expect_create_fails("unknown activation", c,
                      (const char *const[]){"activation (7)", "gelu, relu", NULL});
  // The remaining fields, table-driven: (mutation, substrings the message must hold).
  struct {
    const char *what;
    void (*mutate)(moe_layer_config *);
    const char *expect[3];
  } const cases[] = {
      {"NaN capacity factor",
       mut_cf_nan,
       {"capacity_factor (nan)", "finite and at most 1e6", NULL}},
      {"infinite capacity factor", mut_cf_inf, {"capacity_factor (inf)", "at most 1e6", NULL}},
      {"huge capacity factor", mut_cf_huge, {"capacity_factor (2e+06)", "at most 1e6", NULL}},
      {"negative aux coef", mut_aux_neg, {"aux_loss_coef (-1)", "finite and >= 0", NULL}},
      {"NaN aux coef", mut_aux_nan, {"aux_loss_coef (nan)", "finite and >= 0", NULL}},
      {"infinite z coef", mut_z_inf, {"z_loss_coef (inf)", "finite and >= 0", NULL}},
      {"zero tokens", mut_tokens_zero, {"tokens (0)", "[1, 67108864]", NULL}},
      {"too many tokens", mut_tokens_huge, {"tokens (67108865)", "[1, 67108864]", NULL}},
      {"M too large", mut_m_huge, {"model_dim (1048577)", "[1, 1048576]", NULL}},
      {"H too large", mut_h_huge, {"hidden_dim (1048577)", "[1, 1048576]", NULL}},
      {"E too large", mut_e_huge, {"num_experts (65537)", "[1, 65536]", NULL}},
      {"renormalize not 0/1", mut_renorm, {"renormalize (2)", "0 or 1", NULL}},
      {"check_finite not 0/1", mut_check, {"check_finite (2)", "0 or 1", NULL}},
      {"tokens x top_k too large",
       mut_rows,
       {"tokens x top_k (2147483648)", "<= 1073741824", NULL}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    c = small_config();
    cases[i].mutate(&c);
    expect_create_fails(cases[i].what, c, cases[i].expect);
  }
  {
    moe_ctx *vctx = NULL;
    moe_ctx_create(&vctx);
    TU_CHECK(moe_layer_config_validate(vctx, NULL) == MOE_STATUS_INVALID_ARG, "validate(NULL)");
    moe_ctx_destroy(vctx);
  }

  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_activation act;
  TU_CHECK(moe_activation_parse(ctx, "swish", &act) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "'swish'") && strstr(moe_ctx_error(ctx), "gelu, relu"),
           "unknown activation name: %s", moe_ctx_error(ctx));
  moe_placement pl;
  TU_CHECK(moe_placement_init(ctx, &pl, 6, 4) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "experts (6) must be divisible by EP ranks (4)"),
           "placement divisibility: %s", moe_ctx_error(ctx));
  moe_ctx_destroy(ctx);
}

static void test_call_errors(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_layer_config c = small_config();
  moe_layer *layer = NULL;
  TU_CHECK(moe_layer_create(ctx, &c, &layer) == MOE_STATUS_OK, "create");
  moe_layer_init_params(layer, 3);
  float x[16 * 8], y[16 * 8], dy[16 * 8], dx[16 * 8];
  tu_fill(x, 16 * 8, 1, -1.0f, 1.0f);
  tu_fill(dy, 16 * 8, 2, -1.0f, 1.0f);
  memset(dx, 0, sizeof dx);

  TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "forward first"),
           "backward before forward: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_layer_forward(layer, x, -1, y, NULL) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "tokens (-1) must be in [0, 16]"),
           "negative tokens: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_layer_forward(layer, x, 17, y, NULL) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "tokens (17) must be in [0, 16]"),
           "too many tokens: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_layer_forward(layer, NULL, 4, y, NULL) == MOE_STATUS_INVALID_ARG, "NULL x rejected");

  x[5 * 8 + 3] = NAN;
  TU_CHECK(moe_layer_forward(layer, x, 16, y, NULL) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "input x") && strstr(moe_ctx_error(ctx), "token 5") &&
               strstr(moe_ctx_error(ctx), "column 3"),
           "NaN in x: %s", moe_ctx_error(ctx));
  x[5 * 8 + 3] = INFINITY;
  TU_CHECK(moe_layer_forward(layer, x, 16, y, NULL) == MOE_STATUS_INVALID_ARG, "Inf in x rejected");
  TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_INVALID_ARG,
           "failed forward leaves no state for backward");
  x[5 * 8 + 3] = 0.5f;
  TU_CHECK(moe_layer_forward(layer, x, 16, y, NULL) == MOE_STATUS_OK, "finite x accepted");
  dy[7] = -INFINITY;
  TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "gradient dy"),
           "Inf in dy: %s", moe_ctx_error(ctx));
  dy[7] = 0.25f;
  TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_OK, "finite dy accepted");

  // Zero tokens is valid: nothing routed, zero losses.
  moe_layer_stats s;
  TU_CHECK(moe_layer_forward(layer, x, 0, y, &s) == MOE_STATUS_OK && s.rows == 0 &&
               s.aux_loss == 0.0f && s.z_loss == 0.0f,
           "zero tokens");
  {
    float dx_before[16 * 8], dwg_before[8 * 4];
    moe_layer_tensors tz = moe_layer_get_tensors(layer);
    memcpy(dx_before, dx, sizeof dx_before);
    memcpy(dwg_before, tz.dwg, sizeof dwg_before);
    TU_CHECK(moe_layer_backward(layer, dy, dx) == MOE_STATUS_OK, "zero-token backward");
    TU_CHECK(memcmp(dx_before, dx, sizeof dx_before) == 0 &&
                 memcmp(dwg_before, tz.dwg, sizeof dwg_before) == 0,
             "zero-token backward changes nothing");
  }
  // NULL gradients and overlapping x / y.
  TU_CHECK(moe_layer_forward(layer, x, 16, y, NULL) == MOE_STATUS_OK, "forward again");
  TU_CHECK(moe_layer_backward(layer, NULL, dx) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "dy and dx must not be NULL"),
           "NULL dy: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_layer_backward(layer, dy, NULL) == MOE_STATUS_INVALID_ARG, "NULL dx rejected");
  TU_CHECK(moe_layer_forward(layer, x, 16, NULL, NULL) == MOE_STATUS_INVALID_ARG, "NULL y");
  TU_CHECK(moe_layer_forward(layer, x, 16, x, NULL) == MOE_STATUS_INVALID_ARG &&
               strstr(moe_ctx_error(ctx), "x and y must not overlap"),
           "in-place forward: %s", moe_ctx_error(ctx));
  TU_CHECK(moe_layer_forward(layer, x, 16, x + 8, NULL) == MOE_STATUS_INVALID_ARG,
           "partially overlapping y rejected");
  moe_layer_destroy(layer);

  // With check_finite off, NaN is the caller's business: it is not rejected.
  c.check_finite = 0;
  TU_CHECK(moe_layer_create(ctx, &c, &layer) == MOE_STATUS_OK, "create unchecked");
  moe_layer_init_params(layer, 3);
  x[0] = NAN;
  TU_CHECK(moe_layer_forward(layer, x, 16, y, NULL) == MOE_STATUS_OK,
           "check_finite = 0 accepts NaN");
  moe_layer_destroy(layer);
  moe_ctx_destroy(ctx);
}

// Routing without PyTorch: a hand-worked GShard example (E = 2, K = 2, C = 2):
// first choices of tokens 0..2 are kept before any second choice; the kept
// rows of an expert are then laid out in token order.
static void test_route_order(void) {
  moe_ctx *ctx = NULL;
  moe_ctx_create(&ctx);
  moe_route r;
  TU_CHECK(moe_route_init(ctx, &r, 3, 2, 2, 6) == MOE_STATUS_OK, "route init");
  const int32_t experts[6] = {0, 1, 0, 1, 1, 0};  // (T=3, K=2)
  memcpy(r.expert, experts, sizeof experts);
  for (int i = 0; i < 6; i++) r.weight[i] = 0.5f;
  TU_CHECK(moe_route_assign(ctx, &r, 3, 2) == MOE_STATUS_OK, "assign");
  // kept, in GShard priority: first choices t0->e0, t1->e0, t2->e1; second t0->e1;
  // t1->e1 and t2->e0 dropped. Slots then number each expert's kept choices in
  // token order: e0: t0 0, t1 1; e1: t0 0, t2 1.
  const int32_t want_slot[6] = {0, 0, 1, -1, 1, -1};
  tu_equal_i32("gshard kept set, token-order slots", r.slot, want_slot, 6);
  TU_CHECK(r.dropped == 2 && r.rows == 4 && r.count[0] == 2 && r.count[1] == 2,
           "dropped %d rows %d", r.dropped, r.rows);
  const int32_t want_row_token[4] = {0, 1, 0, 2};
  tu_equal_i32("row tokens", r.row_token, want_row_token, 4);
  TU_CHECK(moe_route_assign(ctx, &r, 3, -1) == MOE_STATUS_OK && r.dropped == 0 && r.rows == 6,
           "dropless keeps all");
  moe_placement pl;
  TU_CHECK(moe_placement_init(ctx, &pl, 2, 2) == MOE_STATUS_OK, "placement");
  int32_t counts[4];
  moe_route_count_by_rank(&r, &pl, 0, counts);
  TU_CHECK(counts[0] == 3 && counts[1] == 0 && counts[2] == 0 && counts[3] == 3, "counts by rank");
  moe_placement_set_replica(ctx, &pl, 1, 0, 1);  // replica of expert 1 on rank 0
  moe_route_count_by_rank(&r, &pl, 0, counts);
  TU_CHECK(counts[0] == 3 && counts[1] == 3 && counts[3] == 0, "replica keeps tokens local");
  TU_CHECK(moe_placement_set_replica(ctx, &pl, 2, 0, 1) == MOE_STATUS_INVALID_ARG,
           "replica of a missing expert");
  moe_placement_free(&pl);
  moe_route_free(&r);
  moe_ctx_destroy(ctx);
}

int main(void) {
  test_config_errors();
  test_call_errors();
  test_route_order();
  return tu_finish("test_layer_bad_input");
}
