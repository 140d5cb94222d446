// Private helpers of src/core shared by the other modules of libmoe.
// Not installed; the CLI and users see only include/moe.
#ifndef MOE_CORE_INTERNAL_H
#define MOE_CORE_INTERNAL_H

#include "moe/core.h"

// Round bytes up to the 64-byte alignment every libmoe buffer has.
static inline size_t moe_align64(size_t bytes) { return (bytes + 63u) & ~(size_t)63u; }

#endif
