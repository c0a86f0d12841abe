/* test_json.c - the strict JSON parser (codec/store/json_impl.h). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdlib.h>
#include <string.h>

#include "json_impl.h"

/* Parses `len` bytes from an exact-size heap copy, so ASan catches any read
 * past the end. */
static pulse_status parse_n(const char *text, size_t len,
                            const pulse_json_limits *limits,
                            pulse_json_doc **doc) {
  char *copy = malloc(len > 0 ? len : 1);
  cr_assert_not_null(copy);
  memcpy(copy, text, len);
  pulse_status st = pulse_json_parse(copy, len, limits, doc);
  free(copy);
  return st;
}

static pulse_status parse(const char *text, pulse_json_doc **doc) {
  return parse_n(text, strlen(text), NULL, doc);
}

static pulse_status parse_status(const char *text) {
  pulse_json_doc *doc = NULL;
  pulse_status st = parse(text, &doc);
  if (st != PULSE_OK)
    cr_assert_null(doc);
  pulse_json_doc_free(doc);
  return st;
}

Test(json, parses_every_value_type) {
  pulse_json_doc *doc;
  cr_assert_eq(parse(" {\"n\": null, \"t\": true, \"f\": false, \"i\": 42, "
                     "\"x\": -1.5e-3, \"s\": \"hi\", \"a\": [1, [2], {}], "
                     "\"o\": {\"k\": \"v\"}} \r\n\t",
                     &doc),
               PULSE_OK, "%s", pulse_error_detail());
  const pulse_json *root = pulse_json_doc_root(doc);
  cr_assert_eq(root->type, PULSE_JSON_OBJECT);
  cr_assert_eq(pulse_json_count(root), 8);
  cr_assert_eq(pulse_json_get(root, "n")->type, PULSE_JSON_NULL);
  cr_assert_eq(pulse_json_get(root, "t")->type, PULSE_JSON_TRUE);
  cr_assert_eq(pulse_json_get(root, "f")->type, PULSE_JSON_FALSE);
  const pulse_json *x = pulse_json_get(root, "x");
  cr_assert_eq(x->type, PULSE_JSON_NUMBER);
  cr_assert_str_eq(x->text, "-1.5e-3");
  uint64_t v;
  cr_assert_eq(pulse_json_u64(pulse_json_get(root, "i"), &v), PULSE_OK);
  cr_assert_eq(v, 42);
  const char *s;
  size_t len;
  cr_assert(pulse_json_string(pulse_json_get(root, "s"), &s, &len));
  cr_assert_str_eq(s, "hi");
  cr_assert_eq(len, 2);
  const pulse_json *a = pulse_json_get(root, "a");
  cr_assert_eq(pulse_json_count(a), 3);
  cr_assert_eq(pulse_json_at(a, 1)->type, PULSE_JSON_ARRAY);
  cr_assert_eq(pulse_json_count(pulse_json_at(a, 2)), 0);
  cr_assert_null(pulse_json_at(a, 3));
  cr_assert_null(pulse_json_at(a, 0)->key);
  cr_assert_str_eq(pulse_json_get(pulse_json_get(root, "o"), "k")->text, "v");
  cr_assert_null(pulse_json_get(root, "missing"));
  cr_assert_null(pulse_json_get(a, "n"), "arrays have no members");
  /* Iteration keeps document order and carries the keys. */
  const char *keys[] = {"n", "t", "f", "i", "x", "s", "a", "o"};
  for (size_t i = 0; i < 8; i++)
    cr_assert_str_eq(pulse_json_at(root, i)->key, keys[i]);
  pulse_json_doc_free(doc);
}

Test(json, parses_scalar_roots) {
  const char *ok[] = {"0",    "-0", "1e5", "\"\"",     "true",
                      "null", "[]", "{}",  " 12.5E+2 "};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    cr_assert_eq(parse_status(ok[i]), PULSE_OK, "'%s': %s", ok[i],
                 pulse_error_detail());
}

Test(json, decodes_escapes_to_utf8) {
  pulse_json_doc *doc;
  cr_assert_eq(parse("[\"\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"\\u00e9\\u20AC\", "
                     "\"\\ud83d\\ude00\", \"a\\u0000b\", \"caf\xc3\xa9\"]",
                     &doc),
               PULSE_OK, "%s", pulse_error_detail());
  const pulse_json *root = pulse_json_doc_root(doc);
  cr_assert_str_eq(pulse_json_at(root, 0)->text, "\"\\/\b\f\n\r\t");
  cr_assert_str_eq(pulse_json_at(root, 1)->text, "\xc3\xa9\xe2\x82\xac");
  cr_assert_str_eq(pulse_json_at(root, 2)->text, "\xf0\x9f\x98\x80");
  const pulse_json *nul = pulse_json_at(root, 3);
  cr_assert_eq(nul->len, 3);
  cr_assert_eq(memcmp(nul->text, "a\0b", 4), 0);
  cr_assert_str_eq(pulse_json_at(root, 4)->text, "caf\xc3\xa9");
  pulse_json_doc_free(doc);
}

/* The text is held inline: Criterion may run each parameter in a freshly
 * started process, where pointers into the parent would dangle. */
typedef struct {
  char text[24];
  size_t len; /* 0: strlen */
} bad_case;

ParameterizedTestParameters(json, rejects_malformed_text) {
  static bad_case cases[] = {
      {"", 0},
      {"   ", 0},
      {"{", 0},
      {"[1,]", 0},
      {"{\"a\":1,}", 0},
      {"{\"a\" 1}", 0},
      {"{a:1}", 0},
      {"{'a':1}", 0},
      {"[1] x", 0},
      {"[1][2]", 0},
      {"01", 0},
      {"-", 0},
      {"+1", 0},
      {".5", 0},
      {"1.", 0},
      {"1e", 0},
      {"1e+", 0},
      {"NaN", 0},
      {"Infinity", 0},
      {"tru", 0},
      {"nul", 0},
      {"truex", 0},
      {"[1 2]", 0},
      {"/* c */ 1", 0},
      {"\xef\xbb\xbf{}", 0},
      {"\"abc", 0},
      {"\"a\\\"", 0},
      {"\"\\x\"", 0},
      {"\"\\u12\"", 0},
      {"\"\\u12g4\"", 0},
      {"\"\\ud800\"", 0},
      {"\"\\udc00\"", 0},
      {"\"\\ud800\\u0041\"", 0},
      {"\"\\ud800x\"", 0},
      {"\"a\tb\"", 0},
      {"\"a\nb\"", 0},
      {"\"\x7f\xc0\x80\"", 0},
      {"\"\xc1\xbf\"", 0},
      {"\"\xe0\x80\x80\"", 0},
      {"\"\xed\xa0\x80\"", 0},
      {"\"\xf4\x90\x80\x80\"", 0},
      {"\"\xf5\x80\x80\x80\"", 0},
      {"\"\x80\"", 0},
      {"\"\xe2\x82\"", 0},
      {"\"\xff\"", 0},
      {"{\"a\\u0000\":1}", 0},
      {"[1]\0", 4},
      {"\0[1]", 4},
      {"[\"a\0b\"]", 7},
  };
  return cr_make_param_array(bad_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(bad_case *c, json, rejects_malformed_text) {
  size_t len = c->len != 0 ? c->len : strlen(c->text);
  pulse_json_doc *doc = NULL;
  pulse_status st = parse_n(c->text, len, NULL, &doc);
  cr_assert_eq(st, PULSE_ERR_JSON, "'%s' gave %s", c->text,
               pulse_status_name(st));
  cr_assert_null(doc);
  cr_assert_neq(pulse_error_detail()[0], '\0');
}

static char *nested(size_t depth) {
  char *s = malloc(2 * depth + 1);
  memset(s, '[', depth);
  memset(s + depth, ']', depth);
  s[2 * depth] = '\0';
  return s;
}

Test(json, limits_nesting_depth) {
  char *ok = nested(64), *deep = nested(65);
  cr_assert_eq(parse_status(ok), PULSE_OK);
  cr_assert_eq(parse_status(deep), PULSE_ERR_JSON);
  cr_assert(strstr(pulse_error_detail(), "nesting") != NULL);
  pulse_json_limits shallow = {3, 0};
  pulse_json_doc *doc = NULL;
  cr_assert_eq(parse_n("[[[]]]", 6, &shallow, &doc), PULSE_OK);
  pulse_json_doc_free(doc);
  cr_assert_eq(parse_n("[[[[]]]]", 8, &shallow, &doc), PULSE_ERR_JSON);
  free(ok);
  free(deep);
  /* Far deeper than any limit: still no stack overflow. */
  char *huge = nested(100000);
  cr_assert_eq(parse_status(huge), PULSE_ERR_JSON);
  free(huge);
}

Test(json, caps_memory_at_max_bytes) {
  size_t n = 100000;
  char *s = malloc(2 * n + 2);
  s[0] = '[';
  for (size_t i = 0; i < n; i++) {
    s[1 + 2 * i] = '0';
    s[2 + 2 * i] = ',';
  }
  s[2 * n] = ']';
  s[2 * n + 1] = '\0';
  pulse_json_limits small = {0, 1 << 20};
  pulse_json_doc *doc = NULL;
  cr_assert_eq(parse_n(s, strlen(s), &small, &doc), PULSE_ERR_OVERFLOW);
  cr_assert_null(doc);
  cr_assert_eq(parse_n(s, strlen(s), NULL, &doc), PULSE_OK);
  cr_assert_eq(pulse_json_count(pulse_json_doc_root(doc)), n);
  pulse_json_doc_free(doc);
  free(s);
}

Test(json, reads_u64_exactly) {
  pulse_json_doc *doc;
  cr_assert_eq(parse("[0, 18446744073709551615, 18446744073709551616, -1, 1.0,"
                     " 1e2, \"5\", 99999999999999999999999]",
                     &doc),
               PULSE_OK);
  const pulse_json *r = pulse_json_doc_root(doc);
  uint64_t v;
  cr_assert_eq(pulse_json_u64(pulse_json_at(r, 0), &v), PULSE_OK);
  cr_assert_eq(v, 0);
  cr_assert_eq(pulse_json_u64(pulse_json_at(r, 1), &v), PULSE_OK);
  cr_assert_eq(v, UINT64_MAX);
  cr_assert_eq(pulse_json_u64(pulse_json_at(r, 2), &v), PULSE_ERR_OVERFLOW);
  cr_assert_eq(pulse_json_u64(pulse_json_at(r, 3), &v), PULSE_ERR_JSON);
  cr_assert_eq(pulse_json_u64(pulse_json_at(r, 4), &v), PULSE_ERR_JSON);
  cr_assert_eq(pulse_json_u64(pulse_json_at(r, 5), &v), PULSE_ERR_JSON);
  cr_assert_eq(pulse_json_u64(pulse_json_at(r, 6), &v), PULSE_ERR_JSON);
  cr_assert_eq(pulse_json_u64(pulse_json_at(r, 7), &v), PULSE_ERR_OVERFLOW);
  pulse_json_doc_free(doc);
}

Test(json, finds_first_duplicate_key_in_document_order) {
  pulse_json_doc *doc;
  cr_assert_eq(parse("{\"b\":1,\"a\":2,\"c\":3,\"a\":4,\"b\":5}", &doc),
               PULSE_OK);
  const pulse_json *dup;
  cr_assert_eq(pulse_json_find_duplicate(pulse_json_doc_root(doc), &dup),
               PULSE_OK);
  cr_assert_not_null(dup);
  cr_assert_str_eq(dup->key, "a");
  cr_assert_str_eq(dup->text, "4");
  /* pulse_json_get returns the first of the pair. */
  cr_assert_str_eq(pulse_json_get(pulse_json_doc_root(doc), "a")->text, "2");
  pulse_json_doc_free(doc);

  cr_assert_eq(parse("{\"a\":1,\"ab\":2,\"\":3}", &doc), PULSE_OK);
  cr_assert_eq(pulse_json_find_duplicate(pulse_json_doc_root(doc), &dup),
               PULSE_OK);
  cr_assert_null(dup);
  pulse_json_doc_free(doc);
}

Test(json, every_prefix_is_rejected_without_reading_past_it) {
  const char *text = "{\"k\\u00e9y\": [1, -2.5e+3, \"\\ud83d\\ude00\", true,"
                     " false, null, {\"x\": \"caf\xc3\xa9\"}]}";
  size_t n = strlen(text);
  for (size_t len = 0; len < n; len++) {
    pulse_json_doc *doc = NULL;
    cr_assert_eq(parse_n(text, len, NULL, &doc), PULSE_ERR_JSON,
                 "prefix of %zu bytes", len);
  }
  pulse_json_doc *doc = NULL;
  cr_assert_eq(parse_n(text, n, NULL, &doc), PULSE_OK);
  pulse_json_doc_free(doc);
}

Test(json, escape_round_trips_through_the_parser) {
  const char raw[] = "q\"b\\s/\x01\x1f\n\t caf\xc3\xa9 \xf0\x9f\x98\x80";
  size_t n = sizeof raw - 1;
  cr_assert(pulse_json_utf8_valid(raw, n));
  size_t esc = pulse_json_escape(NULL, raw, n);
  char *json = malloc(esc + 3);
  json[0] = '"';
  cr_assert_eq(pulse_json_escape(json + 1, raw, n), esc);
  json[esc + 1] = '"';
  json[esc + 2] = '\0';
  pulse_json_doc *doc;
  cr_assert_eq(parse(json, &doc), PULSE_OK, "%s: %s", json,
               pulse_error_detail());
  const pulse_json *r = pulse_json_doc_root(doc);
  cr_assert_eq(r->len, n);
  cr_assert_eq(memcmp(r->text, raw, n), 0);
  pulse_json_doc_free(doc);
  free(json);
  cr_assert_not(pulse_json_utf8_valid("\xc0\x80", 2));
  cr_assert_not(pulse_json_utf8_valid("\xe2\x82", 2));
}

Test(json, handles_many_and_long_values) {
  /* Bigger than one arena block, with a string bigger than a block too. */
  size_t big = 200000;
  char *s = malloc(big + 64);
  strcpy(s, "{\"long\":\"");
  size_t at = strlen(s);
  memset(s + at, 'x', big);
  at += big;
  strcpy(s + at, "\",\"k\":[1,2,3]}");
  pulse_json_doc *doc;
  cr_assert_eq(parse(s, &doc), PULSE_OK);
  const pulse_json *r = pulse_json_doc_root(doc);
  cr_assert_eq(pulse_json_get(r, "long")->len, big);
  cr_assert_eq(pulse_json_count(pulse_json_get(r, "k")), 3);
  pulse_json_doc_free(doc);
  free(s);
}

Test(json, rejects_null_arguments) {
  pulse_json_doc *doc;
  cr_assert_eq(pulse_json_parse(NULL, 1, NULL, &doc), PULSE_ERR_ARG);
  cr_assert_eq(pulse_json_parse("1", 1, NULL, NULL), PULSE_ERR_ARG);
  pulse_json_doc_free(NULL);
  cr_assert_eq(pulse_json_count(NULL), 0);
  cr_assert_null(pulse_json_get(NULL, "a"));
}
