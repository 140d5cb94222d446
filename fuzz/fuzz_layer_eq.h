// Field-by-field comparison of layer configs for the harnesses that read them
// (layer config, model config, layer samples), and a config whose every
// written field holds a value no parser produces, to read a text over.
#ifndef MOE_FUZZ_LAYER_EQ_H
#define MOE_FUZZ_LAYER_EQ_H

#include <stdio.h>
#include <string.h>

#include "fuzz_util.h"
#include "moe/layer.h"

// Every field a valid config never holds, except gate_convention: the writer
// leaves out the default (libmoe), so a read-back keeps the base's value.
static inline void fuzz_layer_config_other(moe_layer_config *c) {
  memset(c, 0, sizeof *c);
  c->tokens = c->model_dim = c->hidden_dim = c->num_experts = c->top_k = -7;
  c->capacity_factor = -12345.25;
  c->act = (moe_activation)7;
  c->renormalize = c->check_finite = 5;
  c->aux_loss_coef = c->z_loss_coef = -3.5f;
  snprintf(c->expert, sizeof c->expert, "<unset>");
  c->gate_convention = MOE_GATE_LIBMOE;
}

// Aborts naming the first field where a and b differ (text: the JSON read).
static inline void fuzz_layer_config_check_equal(const moe_layer_config *a,
                                                 const moe_layer_config *b, const char *text) {
#define FUZZ_EQ_FIELD(f, fmt, cast)                                                             \
  FUZZ_CHECK(a->f == b->f, "field " #f ": " fmt " became " fmt " via %s", cast a->f, cast b->f, \
             text)
  FUZZ_EQ_FIELD(tokens, "%d", (int));
  FUZZ_EQ_FIELD(model_dim, "%d", (int));
  FUZZ_EQ_FIELD(hidden_dim, "%d", (int));
  FUZZ_EQ_FIELD(num_experts, "%d", (int));
  FUZZ_EQ_FIELD(top_k, "%d", (int));
  FUZZ_EQ_FIELD(capacity_factor, "%.17g", (double));
  FUZZ_EQ_FIELD(act, "%d", (int));
  FUZZ_EQ_FIELD(renormalize, "%d", (int));
  FUZZ_EQ_FIELD(aux_loss_coef, "%.9g", (double));
  FUZZ_EQ_FIELD(z_loss_coef, "%.9g", (double));
  FUZZ_EQ_FIELD(check_finite, "%d", (int));
  FUZZ_EQ_FIELD(gate_convention, "%d", (int));
#undef FUZZ_EQ_FIELD
  FUZZ_CHECK(strcmp(a->expert, b->expert) == 0, "field expert: '%s' became '%s' via %s", a->expert,
             b->expert, text);
}

#endif  // MOE_FUZZ_LAYER_EQ_H
