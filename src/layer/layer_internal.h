// The registered expert kinds, one per file src/layer/expert_<name>.c, listed by
// src/layer/expert_registry.c. Private to libmoe.
#ifndef MOE_LAYER_INTERNAL_H
#define MOE_LAYER_INTERNAL_H

#include "moe/expert.h"

extern const moe_expert_kind moe_expert_ffn;      // expert_ffn.c
extern const moe_expert_kind moe_expert_ffn_ref;  // expert_ffn_ref.c

#endif
