/* test_json_write.c - the JSON writer (codec/store/json_impl.h) and the documents
 * written with it whose bytes must never change: the store's head (its
 * layout is specified in docs/protocols/sync.md) and safetensors headers. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "json_impl.h"
#include "pulse_safetensors.h"
#include "store_impl.h"

/* The writer's text, NUL-terminated, after a successful finish. */
static char *finish_text(pulse_json_writer *w, pulse_bytebuf *b) {
  cr_assert_eq(pulse_json_write_finish(w), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_bytebuf_byte(b, 0);
  cr_assert(!b->failed);
  return (char *)b->data;
}

Test(json_write, places_commas_colons_and_escapes) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_json_writer w;
  pulse_json_write_init(&w, &b);
  pulse_json_write_object(&w);
  pulse_json_write_key(&w, "a\"b");
  pulse_json_write_array(&w);
  pulse_json_write_u64(&w, UINT64_MAX);
  pulse_json_write_i64(&w, INT64_MIN);
  pulse_json_write_double(&w, 0.1);
  pulse_json_write_bool(&w, 1);
  pulse_json_write_bool(&w, 0);
  pulse_json_write_null(&w);
  pulse_json_write_string_n(&w, "x\0y\n\\", 5);
  pulse_json_write_array(&w);
  pulse_json_write_end(&w);
  pulse_json_write_object(&w);
  pulse_json_write_end(&w);
  pulse_json_write_end(&w);
  pulse_json_write_key(&w, "s");
  pulse_json_write_string(&w, "\xc3\xa9\x01");
  pulse_json_write_end(&w);
  const char *want = "{\"a\\\"b\":[18446744073709551615,-9223372036854775808,"
                     "0.10000000000000001,true,false,null,"
                     "\"x\\u0000y\\n\\\\\",[],{}],\"s\":\"\xc3\xa9\\u0001\"}";
  char *text = finish_text(&w, &b);
  cr_assert_str_eq(text, want);
  /* And the strict parser reads it back. */
  pulse_json_doc *doc = NULL;
  cr_assert_eq(pulse_json_parse(text, strlen(text), NULL, &doc), PULSE_OK);
  const pulse_json *arr = pulse_json_get(pulse_json_doc_root(doc), "a\"b");
  cr_assert_eq(pulse_json_count(arr), 9);
  const char *s;
  size_t len;
  cr_assert(pulse_json_string(pulse_json_at(arr, 6), &s, &len));
  cr_assert_eq(len, 5);
  cr_assert_eq(memcmp(s, "x\0y\n\\", 5), 0);
  pulse_json_doc_free(doc);
  pulse_bytebuf_free(&b);
}

Test(json_write, newlines_go_after_the_comma_or_before_the_bracket) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_json_writer w;
  pulse_json_write_init(&w, &b);
  pulse_json_write_object(&w);
  pulse_json_write_key(&w, "a");
  pulse_json_write_u64(&w, 1);
  pulse_json_write_newline(&w, 0);
  pulse_json_write_key(&w, "l");
  pulse_json_write_array(&w);
  for (int i = 0; i < 2; i++) {
    pulse_json_write_newline(&w, 2);
    pulse_json_write_u64(&w, (uint64_t)i);
  }
  pulse_json_write_newline(&w, 0);
  pulse_json_write_end(&w);
  pulse_json_write_end(&w);
  pulse_json_write_newline(&w, 0);
  cr_assert_str_eq(finish_text(&w, &b), "{\"a\":1,\n\"l\":[\n  0,\n  1\n]}\n");
  pulse_bytebuf_free(&b);
}

/* Each misuse is reported by finish, whatever follows it. */
static void misuse_case(int which) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_json_writer w;
  pulse_json_write_init(&w, &b);
  switch (which) {
  case 0: /* a value in an object without its key */
    pulse_json_write_object(&w);
    pulse_json_write_u64(&w, 1);
    pulse_json_write_end(&w);
    break;
  case 1: /* a key in an array */
    pulse_json_write_array(&w);
    pulse_json_write_key(&w, "k");
    pulse_json_write_end(&w);
    break;
  case 2: /* closing what is not open */
    pulse_json_write_null(&w);
    pulse_json_write_end(&w);
    break;
  case 3: /* not closed */
    pulse_json_write_array(&w);
    break;
  case 4: /* nothing at all */
    break;
  case 5: /* two documents */
    pulse_json_write_null(&w);
    pulse_json_write_null(&w);
    break;
  case 6: /* a key without its value */
    pulse_json_write_object(&w);
    pulse_json_write_key(&w, "k");
    pulse_json_write_end(&w);
    break;
  case 7: /* not a finite number */
    pulse_json_write_double(&w, NAN);
    break;
  case 8: /* too deep */
    for (int i = 0; i <= PULSE_JSON_WRITE_MAX_DEPTH; i++)
      pulse_json_write_array(&w);
    for (int i = 0; i <= PULSE_JSON_WRITE_MAX_DEPTH; i++)
      pulse_json_write_end(&w);
    break;
  }
  cr_assert_eq(pulse_json_write_finish(&w), PULSE_ERR_INTERNAL, "case %d",
               which);
  cr_assert(strstr(pulse_error_detail(), "json writer") != NULL);
  pulse_bytebuf_free(&b);
}

Test(json_write, misuse_is_reported_not_written) {
  for (int which = 0; which <= 8; which++)
    misuse_case(which);
}

Test(json_write, bytebuf_text_and_take) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  char big[600];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  pulse_bytebuf_str(&b, "a");
  pulse_bytebuf_printf(&b, "%d-%s", 42, big); /* longer than printf's stack */
  pulse_buffer out = {NULL, 0};
  cr_assert_eq(pulse_bytebuf_take(&b, &out), PULSE_OK);
  cr_assert_eq(out.size, 1 + 3 + sizeof big - 1);
  cr_assert_eq(memcmp(out.data, "a42-xxx", 7), 0);
  cr_assert_null(b.data);
  pulse_buffer_free(&out);
  b.failed = 1; /* as after an allocation failure */
  pulse_bytebuf_str(&b, "lost");
  cr_assert_eq(pulse_bytebuf_take(&b, &out), PULSE_ERR_NOMEM);
  cr_assert_null(out.data);
  cr_assert_eq(out.size, 0);
}

Test(json_write, bytebuf_adopted_storage_stays_while_it_fits) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  uint8_t *mine = malloc(8);
  cr_assert_not_null(mine);
  b.size = 3; /* dropped by adopt */
  b.failed = 1;
  pulse_bytebuf_adopt(&b, mine, 8);
  cr_assert_eq(b.size, 0);
  cr_assert_eq(b.failed, 0);
  pulse_bytebuf_put(&b, "abcd", 4);
  pulse_bytebuf_put(&b, "efgh", 4); /* exactly full */
  cr_assert_eq(b.data, mine);
  cr_assert_eq(b.capacity, 8);
  cr_assert_eq(memcmp(mine, "abcdefgh", 8), 0);
  pulse_bytebuf_byte(&b, 'i'); /* one more: it grows, doubling */
  cr_assert_eq(b.size, 9);
  cr_assert_eq(b.capacity, 16);
  cr_assert_eq(memcmp(b.data, "abcdefghi", 9), 0);
  pulse_bytebuf_free(&b); /* frees the adopted storage (ASan checks) */
  cr_assert_null(b.data);
}

Test(json_write, bytebuf_reserve_doubles_from_the_first_capacity_asked) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert(pulse_bytebuf_reserve(&b, 10, 1000));
  cr_assert_eq(b.capacity, 1000);
  cr_assert_eq(b.size, 0);
  uint8_t *first = b.data;
  cr_assert(pulse_bytebuf_reserve(&b, 1000, 4)); /* fits: not moved */
  cr_assert_eq(b.data, first);
  cr_assert(pulse_bytebuf_reserve(&b, 3500, 4)); /* 1000 -> 2000 -> 4000 */
  cr_assert_eq(b.capacity, 4000);
  pulse_bytebuf_free(&b);
  cr_assert(pulse_bytebuf_reserve(&b, 1, 0)); /* 0: the default start */
  cr_assert_eq(b.capacity, 256);
  b.failed = 1;
  cr_assert_not(pulse_bytebuf_reserve(&b, 1000, 0));
  cr_assert_eq(b.capacity, 256);
  pulse_bytebuf_free(&b);
  pulse_bytebuf_byte(&b, 1);
  cr_assert_not(pulse_bytebuf_reserve(&b, SIZE_MAX, 0)); /* size overflow */
  cr_assert(b.failed);
  pulse_bytebuf_free(&b);
}

/* ------------------------------------------- documents that never change */

static void object(pulse_store_object *o, pulse_store_kind kind, uint64_t step,
                   uint64_t base, int fill, uint64_t size) {
  memset(o, 0, sizeof *o);
  o->kind = kind;
  o->step = step;
  o->base_step = base;
  memset(o->sha256, fill, 32);
  o->size = size;
  store_object_set_path(o);
}

#define H64(c) c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c

Test(json_write, head_bytes_are_the_specified_layout) {
  pulse_store_object p[2], a[1];
  object(&p[0], PULSE_STORE_PATCH, 7, 6, 0x22, 100);
  object(&p[1], PULSE_STORE_PATCH, 8, 7, 0x23, 101);
  object(&a[0], PULSE_STORE_ANCHOR, 6, 6, 0x33, 200);
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.step = 8;
  memset(f.digest.bytes, 0x11, 32);
  f.patches = p;
  f.npatches = 2;
  f.anchors = a;
  f.nanchors = 1;
  const char *anchors =
      "\"anchors\":[\n"
      " {\"step\":6,\"path\":\"objects/" H64(
          "33") ".safetensors\","
                "\"url\":\"/v1/objects/" H64(
                    "33") ".safetensors\","
                          "\"sha256\":\"" H64("33") "\",\"size\":200}\n]}\n";
  const char *top = "{\"format\":\"pulse-head/1\",\n\"step\":8,\n"
                    "\"state_digest\":\"" H64("11") "\",\n";
  const char *patches =
      "\"patches\":[\n"
      " {\"step\":7,\"base_step\":6,\"path\":\"objects/" H64(
          "22") ".pulse\","
                "\"url\":\"/v1/objects/" H64(
                    "22") ".pulse\","
                          "\"sha256\":\"" H64(
                              "22") "\",\"size\":100},\n"
                                    " {\"step\":8,\"base_step\":7,\"path\":"
                                    "\"objects/" H64(
                                        "23") ".pulse\","
                                              "\"url\":\"/v1/objects/" H64(
                                                  "23") ".pulse\","
                                                        "\"sha256\":\"" H64(
                                                            "23") "\",\"size\":"
                                                                  "101}\n],\n";
  char want[4096];
  pulse_buffer out = {NULL, 0};
  cr_assert_eq(store_head_serialize(&f, NULL, &out), PULSE_OK);
  snprintf(want, sizeof want, "%s%s%s", top, patches, anchors);
  cr_assert_eq(out.size, strlen(want));
  cr_assert_eq(memcmp(out.data, want, out.size), 0, "%.*s", (int)out.size,
               (const char *)out.data);
  pulse_buffer_free(&out);
  /* No patches: an empty list on its line. */
  f.npatches = 0;
  cr_assert_eq(store_head_serialize(&f, NULL, &out), PULSE_OK);
  snprintf(want, sizeof want, "%s\"patches\":[],\n%s", top, anchors);
  cr_assert_eq(out.size, strlen(want));
  cr_assert_eq(memcmp(out.data, want, out.size), 0, "%.*s", (int)out.size,
               (const char *)out.data);
  pulse_buffer_free(&out);
}

Test(json_write, safetensors_header_bytes_are_unchanged) {
  uint16_t d1[6] = {1, 2, 3, 4, 5, 6};
  float d2[3] = {1, 2, 3};
  pulse_st_write_tensor t[2] = {
      {"a.weight\"q\\", PULSE_DTYPE_BF16, 2, {2, 3}, d1},
      {"b\xc3\xa9", PULSE_DTYPE_F32, 1, {3}, d2}};
  pulse_st_kv kv[2] = {{"format", "pt"}, {"k\n", "v\x01"}};
  pulse_buffer out = {NULL, 0};
  cr_assert_eq(pulse_st_serialize(t, 2, kv, 2, &out), PULSE_OK);
  const char json[] =
      "{\"__metadata__\":{\"format\":\"pt\",\"k\\n\":\"v\\u0001\"},"
      "\"a.weight\\\"q\\\\\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
      "\"data_offsets\":[0,12]},\"b\xc3\xa9\":{\"dtype\":\"F32\","
      "\"shape\":[3],\"data_offsets\":[12,24]}}  ";
  size_t hlen = sizeof json - 1;
  cr_assert_eq(hlen % 8, 0);
  cr_assert_eq(out.size, 8 + hlen + 24);
  cr_assert_eq(out.data[0], hlen);
  cr_assert_eq(memcmp(out.data + 8, json, hlen), 0, "%.*s", (int)hlen,
               (const char *)out.data + 8);
  cr_assert_eq(memcmp(out.data + 8 + hlen, d1, 12), 0);
  pulse_buffer_free(&out);
}
