// Completion text as JSON strings (moe_infer_json_string): the engine's text
// is bytes, JSON's is Unicode. Valid UTF-8 passes through, invalid bytes
// become U+FFFD (as llama.cpp and the OpenAI API do), control bytes are escaped.
#include <stdio.h>
#include <string.h>

#include "moe/infer_request.h"

// Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid.
static size_t utf8_len(const unsigned char *s, size_t n) {
  size_t len;
  unsigned cp;
  if (s[0] < 0x80) return 1;
  if ((s[0] & 0xE0) == 0xC0) {
    len = 2;
    cp = s[0] & 0x1F;
  } else if ((s[0] & 0xF0) == 0xE0) {
    len = 3;
    cp = s[0] & 0x0F;
  } else if ((s[0] & 0xF8) == 0xF0) {
    len = 4;
    cp = s[0] & 0x07;
  } else {
    return 0;
  }
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

char *moe_infer_json_string(const char *s, size_t n) {
  // worst case: every byte as \ufffd (6 bytes), quotes, NUL
  char *out = moe_malloc(6 * n + 3);
  if (!out) return NULL;
  const unsigned char *b = (const unsigned char *)s;
  size_t o = 0;
  out[o++] = '"';
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    if (c == '"' || c == '\\') {
      out[o++] = '\\';
      out[o++] = (char)c;
      i++;
    } else if (c == '\n' || c == '\t' || c == '\r') {
      out[o++] = '\\';
      out[o++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
      i++;
    } else if (c < 0x20 || c == 0x7F) {
      o += (size_t)snprintf(out + o, 7, "\\u%04x", c);
      i++;
    } else {
      const size_t len = utf8_len(b + i, n - i);
      if (len == 0) {
        memcpy(out + o, "\\ufffd", 6);
        o += 6;
        i++;
      } else {
        memcpy(out + o, b + i, len);
        o += len;
        i += len;
      }
    }
  }
  out[o++] = '"';
  out[o] = '\0';
  return out;
}
