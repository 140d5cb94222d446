// Private JSON helpers over cJSON: read a file, typed field access with errors
// that name the key. Used by configuration parsers in every module.
#ifndef MOE_CORE_JSON_H
#define MOE_CORE_JSON_H

#include <cJSON.h>

#include "moe/core.h"

// Parses text into *out (caller cJSON_Delete()s it). BAD_FORMAT names the
// position of the first error; the root must be an object.
moe_status moe_json_parse_object(moe_ctx *ctx, const char *text, const char *what, cJSON **out);
// Reads a whole file (at most max_bytes) into a NUL-terminated moe_malloc'd
// buffer. IO error names the path and the reason.
moe_status moe_read_file(moe_ctx *ctx, const char *path, size_t max_bytes, char **out, size_t *len);
// Reads path (at most max_bytes) and passes its text to parse(ctx, text, out);
// a parse error keeps its status and gets the path in front of its message.
typedef moe_status (*moe_json_text_parser)(moe_ctx *ctx, const char *text, void *out);
moe_status moe_json_load_file(moe_ctx *ctx, const char *path, size_t max_bytes,
                              moe_json_text_parser parse, void *out);
// Typed reads; INVALID_ARG names the key and the expected type.
moe_status moe_json_get_int(moe_ctx *ctx, const cJSON *item, const char *what, int *out);
moe_status moe_json_get_double(moe_ctx *ctx, const cJSON *item, const char *what, double *out);
moe_status moe_json_get_bool(moe_ctx *ctx, const cJSON *item, const char *what, int *out);

#endif
