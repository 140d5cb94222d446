// The registered expert kinds, one per file src/moe/expert_<name>.c, listed by
// src/moe/expert_registry.c. Private to libmoe.
#ifndef MOE_EXPERT_KINDS_H
#define MOE_EXPERT_KINDS_H

#include "moe/expert.h"

extern const moe_expert_kind moe_expert_ffn;      // expert_ffn.c
extern const moe_expert_kind moe_expert_ffn_ref;  // expert_ffn_ref.c

#endif
