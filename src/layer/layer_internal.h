// Private declarations of src/layer/. The expert kinds, one per file
// src/layer/expert_<name>.c, are declared and listed by the catalogue in
// src/layer/expert_registry.c (MOE_EXPERT_CATALOG).
#ifndef MOE_LAYER_INTERNAL_H
#define MOE_LAYER_INTERNAL_H

#include "moe/expert.h"

#endif
