/* json.c - strict JSON parser into an arena-allocated tree (json_impl.h). */
#include "json_impl.h"
#include "status_impl.h"

#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ arena */

typedef struct arena_block {
  struct arena_block *next;
  size_t used;
  size_t cap;
  alignas(max_align_t) unsigned char data[];
} arena_block;

struct pulse_json_doc {
  arena_block *blocks;
  size_t bytes;     /* arena blocks plus parser scratch, for max_bytes */
  size_t max_bytes; /* 0: no cap */
  pulse_json root;
};

#define ARENA_BLOCK_MIN ((size_t)64 * 1024)
#define NODE_ALIGN (alignof(pulse_json))

/* Counts `n` more bytes against the document's cap. */
static pulse_status doc_charge(pulse_json_doc *doc, size_t n) {
  if (n > SIZE_MAX - doc->bytes ||
      (doc->max_bytes != 0 && doc->bytes + n > doc->max_bytes))
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "json: document needs more than %zu bytes of memory",
                      doc->max_bytes);
  doc->bytes += n;
  return PULSE_OK;
}

/* `align` is 1 for text, NODE_ALIGN for nodes: text is packed tight, so
 * numbers and short strings cost their length plus one. */
static pulse_status arena_alloc(pulse_json_doc *doc, size_t size, size_t align,
                                void **out) {
  arena_block *b = doc->blocks;
  size_t pad = b == NULL ? 0 : (align - b->used % align) % align;
  if (size > SIZE_MAX - NODE_ALIGN)
    return pulse_fail(PULSE_ERR_OVERFLOW, "json: allocation overflows");
  if (b == NULL || b->cap - b->used < size || b->cap - b->used - size < pad) {
    pad = 0;
    size_t cap = size > ARENA_BLOCK_MIN ? size : ARENA_BLOCK_MIN;
    if (cap > SIZE_MAX - sizeof *b)
      return pulse_fail(PULSE_ERR_OVERFLOW, "json: allocation overflows");
    PULSE_TRY(doc_charge(doc, sizeof *b + cap));
    arena_block *nb = malloc(sizeof *nb + cap);
    if (nb == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "json: %zu bytes", cap);
    nb->used = 0;
    nb->cap = cap;
    /* A block bigger than the minimum goes behind the current one, so the
     * current block's free room stays usable. */
    if (b != NULL && cap > ARENA_BLOCK_MIN) {
      nb->next = b->next;
      b->next = nb;
    } else {
      nb->next = b;
      doc->blocks = nb;
    }
    b = nb;
  }
  *out = b->data + b->used + pad;
  b->used += pad + size;
  return PULSE_OK;
}

void pulse_json_doc_free(pulse_json_doc *doc) {
  if (doc == NULL)
    return;
  arena_block *b = doc->blocks;
  while (b != NULL) {
    arena_block *next = b->next;
    free(b);
    b = next;
  }
  free(doc);
}

/* ----------------------------------------------------------------- parser */

typedef struct {
  const unsigned char *p;
  size_t len;
  size_t pos;
  size_t depth;
  size_t max_depth;
  pulse_json_doc *doc;
  /* Items of the open containers; a container's items move into the arena
   * when it closes, so each array there is allocated once at its size. */
  pulse_json *stack;
  size_t stack_len;
  size_t stack_cap;
} parser;

static pulse_status syntax(const parser *ps, const char *what) {
  if (ps->pos >= ps->len)
    return pulse_fail(PULSE_ERR_JSON, "json: offset %zu: %s (end of input)",
                      ps->pos, what);
  return pulse_fail(PULSE_ERR_JSON, "json: offset %zu: %s (byte 0x%02x)",
                    ps->pos, what, ps->p[ps->pos]);
}

static void skip_ws(parser *ps) {
  while (ps->pos < ps->len) {
    unsigned char c = ps->p[ps->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      return;
    ps->pos++;
  }
}

static int peek(const parser *ps) {
  return ps->pos < ps->len ? ps->p[ps->pos] : -1;
}

static pulse_status stack_push(parser *ps, const pulse_json *v) {
  if (ps->stack_len == ps->stack_cap) {
    size_t cap = ps->stack_cap < 16 ? 16 : ps->stack_cap * 2;
    if (cap > SIZE_MAX / sizeof *ps->stack)
      return pulse_fail(PULSE_ERR_OVERFLOW, "json: too many values");
    PULSE_TRY(doc_charge(ps->doc, (cap - ps->stack_cap) * sizeof *ps->stack));
    pulse_json *s = realloc(ps->stack, cap * sizeof *s);
    if (s == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "json: %zu values", cap);
    ps->stack = s;
    ps->stack_cap = cap;
  }
  ps->stack[ps->stack_len++] = *v;
  return PULSE_OK;
}

static int hex_value(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Reads 4 hex digits at ps->pos (after "\u"). */
static pulse_status read_hex4(parser *ps, size_t end, uint32_t *out) {
  if (end - ps->pos < 4)
    return syntax(ps, "short \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hex_value(ps->p[ps->pos]);
    if (h < 0)
      return syntax(ps, "bad hex digit in \\u escape");
    v = v << 4 | (uint32_t)h;
    ps->pos++;
  }
  *out = v;
  return PULSE_OK;
}

static size_t utf8_put(unsigned char *d, uint32_t cp) {
  if (cp < 0x80) {
    d[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    d[0] = (unsigned char)(0xC0 | cp >> 6);
    d[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    d[0] = (unsigned char)(0xE0 | cp >> 12);
    d[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    d[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  d[0] = (unsigned char)(0xF0 | cp >> 18);
  d[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
  d[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
  d[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Length of the well-formed UTF-8 sequence at s (s < end, *s >= 0x80), or 0
 * (Unicode table 3-7: no overlong forms, surrogates or code points past
 * U+10FFFF). */
static size_t utf8_valid_len(const unsigned char *s, const unsigned char *end) {
  unsigned char c = s[0];
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0)
      lo = 0xA0;
    else if (c == 0xED)
      hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0)
      lo = 0x90;
    else if (c == 0xF4)
      hi = 0x8F;
  } else {
    return 0;
  }
  if ((size_t)(end - s) < n || s[1] < lo || s[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xBF)
      return 0;
  return n;
}

/* Parses a string at ps->pos (the opening quote) into the arena. */
static pulse_status parse_string(parser *ps, const char **out,
                                 size_t *out_len) {
  size_t start = ++ps->pos;
  /* Find the closing quote first so the decoded copy is allocated once;
   * decoding never lengthens a string. */
  size_t end = start;
  while (end < ps->len && ps->p[end] != '"')
    end += ps->p[end] == '\\' ? 2 : 1;
  if (end >= ps->len) {
    ps->pos = ps->len;
    return syntax(ps, "unterminated string");
  }
  unsigned char *dst;
  PULSE_TRY(arena_alloc(ps->doc, end - start + 1, 1, (void **)&dst));
  size_t n = 0;
  while (ps->pos < end) {
    unsigned char c = ps->p[ps->pos];
    if (c < 0x20)
      return syntax(ps, "control character in string");
    if (c >= 0x80) {
      size_t k = utf8_valid_len(ps->p + ps->pos, ps->p + end);
      if (k == 0)
        return syntax(ps, "invalid UTF-8 in string");
      memcpy(dst + n, ps->p + ps->pos, k);
      n += k;
      ps->pos += k;
      continue;
    }
    if (c != '\\') {
      dst[n++] = c;
      ps->pos++;
      continue;
    }
    ps->pos++; /* the escape letter is before `end` by the scan above */
    unsigned char e = ps->p[ps->pos++];
    switch (e) {
    case '"':
    case '\\':
    case '/':
      dst[n++] = e;
      break;
    case 'b':
      dst[n++] = '\b';
      break;
    case 'f':
      dst[n++] = '\f';
      break;
    case 'n':
      dst[n++] = '\n';
      break;
    case 'r':
      dst[n++] = '\r';
      break;
    case 't':
      dst[n++] = '\t';
      break;
    case 'u': {
      uint32_t cp;
      PULSE_TRY(read_hex4(ps, end, &cp));
      if (cp >= 0xDC00 && cp <= 0xDFFF)
        return syntax(ps, "unpaired low surrogate escape");
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (end - ps->pos < 2 || ps->p[ps->pos] != '\\' ||
            ps->p[ps->pos + 1] != 'u')
          return syntax(ps, "high surrogate escape without a low one");
        ps->pos += 2;
        uint32_t lo;
        PULSE_TRY(read_hex4(ps, end, &lo));
        if (lo < 0xDC00 || lo > 0xDFFF)
          return syntax(ps, "high surrogate escape without a low one");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      n += utf8_put(dst + n, cp);
      break;
    }
    default:
      ps->pos--;
      return syntax(ps, "unknown escape in string");
    }
  }
  dst[n] = '\0';
  ps->pos = end + 1;
  *out = (const char *)dst;
  *out_len = n;
  return PULSE_OK;
}

static int is_digit(int c) {
  return c >= '0' && c <= '9';
}

static pulse_status parse_number(parser *ps, pulse_json *v) {
  size_t start = ps->pos;
  if (peek(ps) == '-')
    ps->pos++;
  if (peek(ps) == '0') {
    ps->pos++;
  } else if (is_digit(peek(ps))) {
    while (is_digit(peek(ps)))
      ps->pos++;
  } else {
    return syntax(ps, "expected a digit");
  }
  if (peek(ps) == '.') {
    ps->pos++;
    if (!is_digit(peek(ps)))
      return syntax(ps, "expected a digit after '.'");
    while (is_digit(peek(ps)))
      ps->pos++;
  }
  if (peek(ps) == 'e' || peek(ps) == 'E') {
    ps->pos++;
    if (peek(ps) == '+' || peek(ps) == '-')
      ps->pos++;
    if (!is_digit(peek(ps)))
      return syntax(ps, "expected a digit in the exponent");
    while (is_digit(peek(ps)))
      ps->pos++;
  }
  size_t n = ps->pos - start;
  char *text;
  PULSE_TRY(arena_alloc(ps->doc, n + 1, 1, (void **)&text));
  memcpy(text, ps->p + start, n);
  text[n] = '\0';
  v->type = PULSE_JSON_NUMBER;
  v->text = text;
  v->len = n;
  return PULSE_OK;
}

static pulse_status parse_literal(parser *ps, const char *word,
                                  pulse_json_type type, pulse_json *v) {
  size_t n = strlen(word);
  if (ps->len - ps->pos < n || memcmp(ps->p + ps->pos, word, n) != 0)
    return syntax(ps, "unexpected character");
  ps->pos += n;
  v->type = type;
  return PULSE_OK;
}

static pulse_status parse_value(parser *ps, pulse_json *v);

/* Moves the items pushed since `base` into the arena as v's items. */
static pulse_status close_container(parser *ps, size_t base, pulse_json *v) {
  size_t count = ps->stack_len - base;
  v->len = count;
  v->items = NULL;
  if (count > 0) {
    pulse_json *items;
    PULSE_TRY(arena_alloc(ps->doc, count * sizeof *items, NODE_ALIGN,
                          (void **)&items));
    memcpy(items, ps->stack + base, count * sizeof *items);
    v->items = items;
  }
  ps->stack_len = base;
  return PULSE_OK;
}

static pulse_status parse_container(parser *ps, pulse_json *v) {
  int is_object = ps->p[ps->pos] == '{';
  int close = is_object ? '}' : ']';
  if (ps->depth >= ps->max_depth)
    return pulse_fail(PULSE_ERR_JSON,
                      "json: offset %zu: nesting deeper than %zu", ps->pos,
                      ps->max_depth);
  ps->depth++;
  ps->pos++;
  v->type = is_object ? PULSE_JSON_OBJECT : PULSE_JSON_ARRAY;
  size_t base = ps->stack_len;
  skip_ws(ps);
  if (peek(ps) == close) {
    ps->pos++;
  } else {
    for (;;) {
      pulse_json item = {0};
      if (is_object) {
        if (peek(ps) != '"')
          return syntax(ps, "expected a member name");
        size_t key_at = ps->pos;
        PULSE_TRY(parse_string(ps, &item.key, &item.key_len));
        if (memchr(item.key, '\0', item.key_len) != NULL)
          return pulse_fail(PULSE_ERR_JSON,
                            "json: offset %zu: NUL in a member name", key_at);
        skip_ws(ps);
        if (peek(ps) != ':')
          return syntax(ps, "expected ':'");
        ps->pos++;
        skip_ws(ps);
      }
      PULSE_TRY(parse_value(ps, &item));
      PULSE_TRY(stack_push(ps, &item));
      skip_ws(ps);
      int c = peek(ps);
      ps->pos++;
      if (c == close)
        break;
      if (c != ',') {
        ps->pos--;
        return syntax(ps, is_object ? "expected ',' or '}'"
                                    : "expected ',' or ']'");
      }
      skip_ws(ps);
    }
  }
  ps->depth--;
  return close_container(ps, base, v);
}

/* Parses the value at ps->pos (no leading whitespace) into v, keeping v's
 * key. */
static pulse_status parse_value(parser *ps, pulse_json *v) {
  switch (peek(ps)) {
  case '{':
  case '[':
    return parse_container(ps, v);
  case '"':
    v->type = PULSE_JSON_STRING;
    return parse_string(ps, &v->text, &v->len);
  case 't':
    return parse_literal(ps, "true", PULSE_JSON_TRUE, v);
  case 'f':
    return parse_literal(ps, "false", PULSE_JSON_FALSE, v);
  case 'n':
    return parse_literal(ps, "null", PULSE_JSON_NULL, v);
  default:
    if (peek(ps) == '-' || is_digit(peek(ps)))
      return parse_number(ps, v);
    return syntax(ps, "expected a value");
  }
}

pulse_status pulse_json_parse(const char *text, size_t len,
                              const pulse_json_limits *limits,
                              pulse_json_doc **out) {
  if (out == NULL || (text == NULL && len > 0))
    return pulse_fail(PULSE_ERR_ARG, "json: NULL argument");
  *out = NULL;
  pulse_json_doc *doc = calloc(1, sizeof *doc);
  if (doc == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "json: document");
  parser ps = {0};
  ps.p = (const unsigned char *)text;
  ps.len = len;
  ps.doc = doc;
  ps.max_depth = PULSE_JSON_MAX_DEPTH_DEFAULT;
  if (limits != NULL && limits->max_depth != 0)
    ps.max_depth = limits->max_depth < PULSE_JSON_MAX_DEPTH_CAP
                       ? limits->max_depth
                       : PULSE_JSON_MAX_DEPTH_CAP;
  if (limits != NULL)
    doc->max_bytes = limits->max_bytes;

  skip_ws(&ps);
  pulse_status st = parse_value(&ps, &doc->root);
  if (st == PULSE_OK) {
    skip_ws(&ps);
    if (ps.pos != ps.len)
      st = syntax(&ps, "trailing characters after the value");
  }
  free(ps.stack);
  if (st != PULSE_OK) {
    pulse_json_doc_free(doc);
    return st;
  }
  *out = doc;
  return PULSE_OK;
}

/* ---------------------------------------------------------------- queries */

const pulse_json *pulse_json_doc_root(const pulse_json_doc *doc) {
  return doc == NULL ? NULL : &doc->root;
}

static int is_container(const pulse_json *v) {
  return v != NULL &&
         (v->type == PULSE_JSON_ARRAY || v->type == PULSE_JSON_OBJECT);
}

size_t pulse_json_count(const pulse_json *v) {
  return is_container(v) ? v->len : 0;
}

const pulse_json *pulse_json_at(const pulse_json *v, size_t i) {
  if (!is_container(v) || i >= v->len)
    return NULL;
  return &v->items[i];
}

const pulse_json *pulse_json_get(const pulse_json *obj, const char *key) {
  if (obj == NULL || obj->type != PULSE_JSON_OBJECT || key == NULL)
    return NULL;
  size_t n = strlen(key);
  for (size_t i = 0; i < obj->len; i++) {
    const pulse_json *m = &obj->items[i];
    if (m->key_len == n && memcmp(m->key, key, n) == 0)
      return m;
  }
  return NULL;
}

int pulse_json_string(const pulse_json *v, const char **s, size_t *len) {
  if (v == NULL || v->type != PULSE_JSON_STRING)
    return 0;
  if (s != NULL)
    *s = v->text;
  if (len != NULL)
    *len = v->len;
  return 1;
}

pulse_status pulse_json_u64(const pulse_json *v, uint64_t *out) {
  if (v == NULL || v->type != PULSE_JSON_NUMBER || out == NULL)
    return PULSE_ERR_JSON;
  uint64_t x = 0;
  for (size_t i = 0; i < v->len; i++) {
    char c = v->text[i];
    if (!is_digit(c))
      return PULSE_ERR_JSON;
  }
  for (size_t i = 0; i < v->len; i++) {
    uint64_t d = (uint64_t)(v->text[i] - '0');
    if (x > (UINT64_MAX - d) / 10)
      return PULSE_ERR_OVERFLOW;
    x = x * 10 + d;
  }
  *out = x;
  return PULSE_OK;
}

static int member_cmp(const void *a, const void *b) {
  const pulse_json *x = *(const pulse_json *const *)a;
  const pulse_json *y = *(const pulse_json *const *)b;
  size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
  int c = memcmp(x->key, y->key, n);
  if (c != 0)
    return c;
  if (x->key_len != y->key_len)
    return x->key_len < y->key_len ? -1 : 1;
  /* Members share one array, so address order is document order. */
  return x < y ? -1 : (x > y);
}

pulse_status pulse_json_find_duplicate(const pulse_json *obj,
                                       const pulse_json **dup) {
  if (dup == NULL)
    return pulse_fail(PULSE_ERR_ARG, "json: NULL argument");
  *dup = NULL;
  if (obj == NULL || obj->type != PULSE_JSON_OBJECT || obj->len < 2)
    return PULSE_OK;
  const pulse_json **idx = malloc(obj->len * sizeof *idx);
  if (idx == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "json: index of %zu members", obj->len);
  for (size_t i = 0; i < obj->len; i++)
    idx[i] = &obj->items[i];
  qsort(idx, obj->len, sizeof *idx, member_cmp);
  const pulse_json *first = NULL;
  for (size_t i = 1; i < obj->len; i++) {
    const pulse_json *a = idx[i - 1], *b = idx[i];
    if (a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0 &&
        (first == NULL || b < first))
      first = b;
  }
  free(idx);
  *dup = first;
  return PULSE_OK;
}

/* ---------------------------------------------------------------- writing */

int pulse_json_utf8_valid(const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s, *end = p + len;
  while (p < end) {
    if (*p < 0x80) {
      p++;
      continue;
    }
    size_t k = utf8_valid_len(p, end);
    if (k == 0)
      return 0;
    p += k;
  }
  return 1;
}

size_t pulse_json_escape(char *dst, const char *s, size_t len) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    char short_esc = 0;
    switch (c) {
    case '"':
      short_esc = '"';
      break;
    case '\\':
      short_esc = '\\';
      break;
    case '\b':
      short_esc = 'b';
      break;
    case '\f':
      short_esc = 'f';
      break;
    case '\n':
      short_esc = 'n';
      break;
    case '\r':
      short_esc = 'r';
      break;
    case '\t':
      short_esc = 't';
      break;
    default:
      break;
    }
    if (short_esc != 0) {
      if (dst != NULL) {
        dst[n] = '\\';
        dst[n + 1] = short_esc;
      }
      n += 2;
    } else if (c < 0x20) {
      if (dst != NULL) {
        memcpy(dst + n, "\\u00", 4);
        dst[n + 4] = hex[c >> 4];
        dst[n + 5] = hex[c & 15];
      }
      n += 6;
    } else {
      if (dst != NULL)
        dst[n] = (char)c;
      n++;
    }
  }
  return n;
}
