// libmoe training data: a byte-level text corpus, its train/validation split
// and deterministic batches for MoE-GPT training (vocabulary V = 256: every
// byte is a token).
//
// What it is: loading (the Debian `fortunes` corpus, a generated fallback, or
// the user's file), a split that interleaves validation text through the
// corpus, and batch functions whose output depends only on (text, seed, step,
// global sequence index): the global batch of a step is the same whatever the
// number of data-parallel ranks, each rank filling its own slice of it.
// What it is not: a tokenizer (bytes are tokens), a streaming loader (the text
// is held in memory) or a shuffler over epochs (sequences are sampled with
// replacement, one independent draw per (step, sequence)). See docs/data.md.
//
// Threading: a moe_text is read-only after moe_text_load and may be shared by
// threads; the batch functions are pure (no state, no allocation).
#ifndef MOE_DATA_H
#define MOE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "moe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- text --------------------------------------------------------------------

typedef struct moe_text moe_text;

// Where the default corpus is read from (the Debian package `fortunes`). The
// environment variable MOE_FORTUNES_DIR, when set, replaces it.
#define MOE_FORTUNES_DIR "/usr/share/games/fortunes"
// Size in bytes of the generated fallback corpus (2.5 MiB).
#define MOE_TEXT_GENERATED_BYTES ((size_t)2621440)

// Loads a text. path selects the source:
//   NULL            the default corpus: the fortunes directory (every regular
//                   file in it except *.dat, *.u8, dot files and symlinks,
//                   sorted by name with strcmp, concatenated); when the
//                   directory is missing or holds no such file, the generated
//                   fallback, with a warning log line giving the reason;
//   "generated:"    the generated fallback (deterministic English-like text of
//                   MOE_TEXT_GENERATED_BYTES bytes, the same on every machine);
//   "fortunes:"     the fortunes directory, an error when it is missing;
//   "fortunes:DIR"  a fortunes-style directory DIR (same file rules);
//   anything else   a file, read as raw bytes (write "./generated:" for a file
//                   of that name).
// Errors: IO for a missing or unreadable file or directory (with the reason);
// INVALID_ARG for an empty text or one shorter than min_bytes (the message
// gives the size and the size needed). min_bytes 0 means no minimum beyond
// non-empty. On failure *out is NULL. Free with moe_text_free.
moe_status moe_text_load(moe_ctx *ctx, const char *path, size_t min_bytes, moe_text **out);
// Checks a text source without reading it (for an early, clear refusal):
// NULL and "generated:" are fine; "fortunes:DIR" needs a readable directory;
// a path needs an existing, readable regular file. INVALID_ARG naming the
// problem otherwise (a missing file, a directory, no permission).
moe_status moe_text_check_source(moe_ctx *ctx, const char *path);
void moe_text_free(moe_text *t);  // NULL is a no-op
// The bytes (size moe_text_size), owned by t.
const uint8_t *moe_text_data(const moe_text *t);
size_t moe_text_size(const moe_text *t);
// One line describing the source, owned by t, e.g.
//   "fortunes: /usr/share/games/fortunes (43 files, 2576674 bytes)"
//   "generated: 2621440 bytes (fallback: '/usr/share/games/fortunes': No such file or directory)"
//   "file: input.txt (1048576 bytes)"
const char *moe_text_source(const moe_text *t);

// ---- split -------------------------------------------------------------------

// A span is an ordered list of disjoint contiguous segments of a text. Windows
// (sequences) are always taken inside one segment, never across two, so no
// window of the training span ever reads validation text and vice versa.
#define MOE_SPAN_MAX_SEGMENTS 64
typedef struct {
  const uint8_t *data;  // points into the text (not owned)
  size_t size;          // bytes
} moe_text_segment;
typedef struct {
  int nseg;                                     // segments in use, [0, 64]
  size_t size;                                  // total bytes of the segments
  moe_text_segment seg[MOE_SPAN_MAX_SEGMENTS];  // in text order
} moe_text_span;

// A span of one segment over data (size bytes; size 0 gives an empty span).
moe_text_span moe_text_span_of(const uint8_t *data, size_t size);

// Splits t into a training and a validation span, interleaved: the text is cut
// into G equal groups (G = min(64, size / 32 KiB), at least 1), and the last
// round(len * val_fraction) bytes of each group go to validation, the rest to
// training. G is lowered (down to 1: one contiguous split) until every piece
// holds at least seq_len + 1 bytes. Validation text thus comes from 64 places
// spread over the corpus rather than from its last files only.
// Errors (INVALID_ARG): val_fraction outside (0, 0.5], seq_len < 1, or a text
// too small for one window in each part (the message names the sizes).
// The spans point into t: valid while t lives.
moe_status moe_text_split(moe_ctx *ctx, const moe_text *t, double val_fraction, int seq_len,
                          moe_text_span *train, moe_text_span *val);

// ---- batches -----------------------------------------------------------------

// Training batch of step `step`: global sequences first_seq .. first_seq+nseq-1
// of the step's global batch. Global sequence j starts at a position drawn
// uniformly among all valid starts of the span (positions p of a segment with
// p + seq_len + 1 <= segment size, segments weighted by their number of
// starts), from Philox4x32-10 with key = seed ^ MOE_DATA_KEY_TAG, counter =
// {j, a, step low, step high}: block a = 0, 1, ... gives two 64-bit draws
// x = lanes 0|1<<32 and 2|3<<32; the first x >= 2^64 mod n (n = number of
// starts) gives start number x mod n (exact rejection sampling).
// tokens[i] = data[start + i], targets[i] = data[start + i + 1], i < seq_len.
// With DP ranks, rank r of P takes first_seq = r * B / P, nseq = B / P: the
// union is bitwise the batch one rank with nseq = B sees.
// tokens and targets are (nseq, seq_len). Requires a span holding at least
// one window (moe_text_split guarantees it); nseq >= 0, seq_len >= 1.
#define MOE_DATA_KEY_TAG 0x6461746173616d70ull  // "datasamp": apart from weight init
void moe_batch_train(const moe_text_span *span, uint64_t seed, uint64_t step, int first_seq,
                     int nseq, int seq_len, int32_t *tokens, int32_t *targets);

// Validation: a fixed list of non-overlapping windows. Segment by segment in
// order, window k of a segment starts at k * seq_len in it (it reads seq_len + 1
// bytes: the last target is the next window's first token), so a segment of n
// bytes holds (n - 1) / seq_len windows. moe_batch_val_windows returns their
// total (0 for seq_len < 1); moe_batch_val fills windows first_win ..
// first_win + nseq - 1 (the caller keeps them within range; shard them over
// ranks like training sequences). tokens and targets are (nseq, seq_len).
int moe_batch_val_windows(const moe_text_span *span, int seq_len);
void moe_batch_val(const moe_text_span *span, int first_win, int nseq, int seq_len, int32_t *tokens,
                   int32_t *targets);

#ifdef __cplusplus
}
#endif
#endif  // MOE_DATA_H
