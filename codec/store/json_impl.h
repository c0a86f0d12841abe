/* json_impl.h - a small strict JSON parser (RFC 8259), private to pulse.
 *
 * pulse_json_parse turns a buffer into a read-only tree whose nodes, strings
 * and arrays all live in one arena owned by a pulse_json_doc: one
 * pulse_json_doc_free releases everything. The input is never modified nor
 * borrowed after the call, and never read beyond `len` bytes.
 *
 * Strict means: one value with optional surrounding whitespace (space, tab,
 * LF, CR) and nothing else; no comments, trailing commas, single quotes, NaN,
 * leading zeros, leading '+' or byte-order mark; raw control characters in
 * strings are rejected; strings must be valid UTF-8 (no overlong forms, no
 * encoded surrogates); \uXXXX escapes must pair surrogates correctly and are
 * decoded to UTF-8. A string may hold U+0000 (through \u0000), so string
 * lengths are explicit, but a member name never does: NUL in a key is an
 * error, and keys can be used as C strings.
 *
 * Memory is bounded: parsing needs about 11 bytes per input byte for typical
 * documents and at most about 60 in the worst case ("[0,0,0,...]");
 * pulse_json_limits.max_bytes caps it.
 *
 * Thread-safety: parsing is reentrant; a parsed document may be read from
 * several threads at once. */
#ifndef PULSE_JSON_IMPL_H
#define PULSE_JSON_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bytebuf_impl.h"
#include "pulse_status.h"

typedef enum {
  PULSE_JSON_NULL = 0,
  PULSE_JSON_FALSE,
  PULSE_JSON_TRUE,
  PULSE_JSON_NUMBER,
  PULSE_JSON_STRING,
  PULSE_JSON_ARRAY,
  PULSE_JSON_OBJECT
} pulse_json_type;

/* One value. Every pointer borrows from the document that holds the node. */
typedef struct pulse_json pulse_json;
struct pulse_json {
  pulse_json_type type;
  /* Member name when this value sits in an object (NUL-terminated, holds no
   * NUL), else NULL. */
  const char *key;
  size_t key_len;
  /* STRING: the decoded UTF-8, NUL-terminated (may hold NUL bytes: use len).
   * NUMBER: the literal as written, NUL-terminated. Else NULL. */
  const char *text;
  /* STRING, NUMBER: bytes of text. ARRAY, OBJECT: number of items. */
  size_t len;
  /* ARRAY, OBJECT: the items (object members) in document order. */
  const pulse_json *items;
};

typedef struct pulse_json_doc pulse_json_doc;

/* Parser limits; 0 in a field picks its default. */
typedef struct {
  size_t max_depth; /* nesting of arrays and objects; default 64, at most
                       PULSE_JSON_MAX_DEPTH_CAP (the parser recurses) */
  size_t max_bytes; /* memory for the whole tree; default: no cap beyond the
                       one proportional to the input */
} pulse_json_limits;

#define PULSE_JSON_MAX_DEPTH_DEFAULT 64u
#define PULSE_JSON_MAX_DEPTH_CAP 1000u
#define PULSE_JSON_LIMITS_INIT                                                 \
  { 0, 0 }

/** Parses `len` bytes of JSON text (not NUL-terminated; NUL bytes are errors
 * outside strings). `limits` may be NULL for the defaults. On success *out
 * owns the tree; free it with pulse_json_doc_free.
 * @return PULSE_OK; PULSE_ERR_JSON for malformed text or nesting deeper than
 * the limit (the detail names the byte offset); PULSE_ERR_OVERFLOW when the
 * tree would need more than limits->max_bytes; PULSE_ERR_NOMEM;
 * PULSE_ERR_ARG for NULL text (with len > 0) or out. */
pulse_status pulse_json_parse(const char *text, size_t len,
                              const pulse_json_limits *limits,
                              pulse_json_doc **out);

/** Releases a document and every node in it. NULL is fine. */
void pulse_json_doc_free(pulse_json_doc *doc);

/** The root value (never NULL for a parsed document). Valid until the
 * document is freed. */
const pulse_json *pulse_json_doc_root(const pulse_json_doc *doc);

/** Number of items of an array or members of an object; 0 for anything else
 * (and for NULL). */
size_t pulse_json_count(const pulse_json *v);

/** Item i of an array or object (object items carry their key), or NULL
 * when v is not a container or i is out of range. */
const pulse_json *pulse_json_at(const pulse_json *v, size_t i);

/** The first member of object `obj` named `key` (compared byte for byte), or
 * NULL when there is none or obj is not an object. Linear in the members:
 * index large objects yourself. With duplicate keys the first one wins; use
 * pulse_json_find_duplicate to reject such objects. */
const pulse_json *pulse_json_get(const pulse_json *obj, const char *key);

/** Non-zero when v is a string; then *s (if s) is its text and *len (if len)
 * its length. */
int pulse_json_string(const pulse_json *v, const char **s, size_t *len);

/** Exact value of a number written as a non-negative integer (digits only,
 * no sign, fraction or exponent).
 * @return PULSE_OK; PULSE_ERR_JSON (no detail) when v is not such a number;
 * PULSE_ERR_OVERFLOW (no detail) when it exceeds UINT64_MAX. Callers add the
 * detail, since they know what the number means. */
pulse_status pulse_json_u64(const pulse_json *v, uint64_t *out);

/** Looks for members of object `obj` with the same key. *dup is set to the
 * first member, in document order, whose key repeats an earlier member's, or
 * NULL when all keys are distinct or obj is not an object. O(n log n);
 * allocates a temporary index.
 * @return PULSE_OK (whether or not a duplicate exists) or PULSE_ERR_NOMEM. */
pulse_status pulse_json_find_duplicate(const pulse_json *obj,
                                       const pulse_json **dup);

/* ---------------------------------------------------------------- writing */

/** Non-zero when s[0..len) is well-formed UTF-8 (no overlong forms, encoded
 * surrogates or code points past U+10FFFF), the same rule the parser applies
 * to strings. */
int pulse_json_utf8_valid(const char *s, size_t len);

/** Writes s[0..len) as the inside of a JSON string (no quotes) to dst,
 * escaping '"', '\\' and control characters (U+0000 included); other bytes
 * are copied. With dst NULL only counts.
 * @return bytes written (at most 6 * len). */
size_t pulse_json_escape(char *dst, const char *s, size_t len);

/* ------------------------------------------------------------- the writer */

/* The one JSON writer of pulse's library code (the store's head, safetensors
 * headers, the PULSELoCo manifest, server replies), on a pulse_bytebuf. It
 * places the commas and colons, escapes strings (pulse_json_escape: the
 * caller makes sure they are UTF-8, pulse_json_utf8_valid) and writes
 * integers exactly; it adds whitespace only where asked
 * (pulse_json_write_newline), so a document with a fixed layout (the head)
 * comes out byte for byte as specified. A misuse (a value where a key is
 * due, a key outside an object, closing what is not open, nesting deeper
 * than PULSE_JSON_WRITE_MAX_DEPTH, a number that is not finite) stops the
 * writer and pulse_json_write_finish reports it; so does an allocation
 * failure of the buffer. Not thread-safe: one writer per document. */
#define PULSE_JSON_WRITE_MAX_DEPTH 32

typedef struct {
  pulse_bytebuf *out; /* borrowed */
  const char *misuse; /* the first misuse, or NULL */
  unsigned depth;     /* open containers */
  int after_key;      /* a key was written, its value is due */
  int done;           /* the top-level value is written */
  int newline;        /* whitespace asked for, not written yet */
  unsigned indent;    /* spaces after that newline */
  uint8_t kind[PULSE_JSON_WRITE_MAX_DEPTH];  /* '{' or '[' per level */
  uint8_t items[PULSE_JSON_WRITE_MAX_DEPTH]; /* 1 once a level has an item */
} pulse_json_writer;

/** Starts a document that will be appended to `out` (which the writer
 * borrows until pulse_json_write_finish). */
void pulse_json_write_init(pulse_json_writer *w, pulse_bytebuf *out);

/** Opens an object or an array, as a value (after a key inside an object). */
void pulse_json_write_object(pulse_json_writer *w);
void pulse_json_write_array(pulse_json_writer *w);

/** Closes the innermost open object or array. */
void pulse_json_write_end(pulse_json_writer *w);

/** The next member's name, inside an object (escaped like a string). */
void pulse_json_write_key(pulse_json_writer *w, const char *key);

/** Values. Strings are quoted and escaped; _n takes an explicit length (the
 * text may hold NUL). Numbers in decimal: integers exactly, doubles with 17
 * significant digits (they read back to the same double). */
void pulse_json_write_string(pulse_json_writer *w, const char *s);
void pulse_json_write_string_n(pulse_json_writer *w, const char *s, size_t len);
void pulse_json_write_u64(pulse_json_writer *w, uint64_t v);
void pulse_json_write_i64(pulse_json_writer *w, int64_t v);
void pulse_json_write_double(pulse_json_writer *w, double v);
void pulse_json_write_bool(pulse_json_writer *w, int v);
void pulse_json_write_null(pulse_json_writer *w);

/** Asks for a line break and `indent` spaces before what comes next: after
 * the comma of the next item, or before the next closing bracket, or at the
 * end of the document (pulse_json_write_finish). */
void pulse_json_write_newline(pulse_json_writer *w, unsigned indent);

/** Appends s[0..len) escaped as the inside of a JSON string (no quotes). */
void pulse_json_write_escaped(pulse_bytebuf *out, const char *s, size_t len);

/** Ends the document: writes any whitespace still asked for and checks that
 * exactly one complete value was written.
 * @return PULSE_OK; PULSE_ERR_INTERNAL (a misuse: a bug of the caller, the
 * detail says which); PULSE_ERR_NOMEM (the buffer's allocation failed). */
pulse_status pulse_json_write_finish(pulse_json_writer *w);

#endif /* PULSE_JSON_IMPL_H */
