// Private pieces shared by the files of src/perf/. Not installed.
#ifndef MOE_PERF_INTERNAL_H
#define MOE_PERF_INTERNAL_H

#include <cJSON.h>

#include "moe/perf.h"

// A cluster description from a parsed JSON object (moe_cluster_from_json
// without the text): the profile reader uses it on its "cluster" member, so
// the numbers are the ones in the file, bit for bit (printing the member back
// to text with cJSON would round some of them to 15 digits).
moe_status moe_cluster_from_object_(moe_ctx *ctx, const cJSON *obj, moe_cluster *out);

#endif  // MOE_PERF_INTERNAL_H
