/* test_head.c - the head's version 2 (docs/protocols/sync.md): the run
 * identity, publication time and link to the previous head are signed (an
 * edit of any of them fails the signature), version-1 heads still parse
 * and verify, and what a version-1 head does not sign is never read. */
#include <criterion/criterion.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_sign.h"
#include "pulse_store.h"
#include "store_impl.h"

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

typedef struct {
  pulse_store_object p[1], a[1];
  store_head_fields f;
} head_fx;

/* A head at step 8 (patch 7 -> 8, anchor at 7) of `version`. */
static void fx_fields(head_fx *x, unsigned version) {
  object(&x->p[0], PULSE_STORE_PATCH, 8, 7, 0x22, 100);
  object(&x->a[0], PULSE_STORE_ANCHOR, 7, 7, 0x33, 200);
  memset(&x->f, 0, sizeof x->f);
  x->f.step = 8;
  memset(x->f.digest.bytes, 0x11, 32);
  x->f.patches = x->p;
  x->f.npatches = 1;
  x->f.anchors = x->a;
  x->f.nanchors = 1;
  x->f.version = version;
  if (version >= 2) {
    memset(x->f.run, 0xab, sizeof x->f.run);
    x->f.published = 1764633600;
    x->f.has_previous = 1;
    x->f.previous_step = 7;
    memset(x->f.previous_sha256, 0x44, 32);
  }
}

/* 1 when the head's bytes (not NUL-terminated) contain `text`. */
static int head_has(const pulse_buffer *b, const char *text) {
  size_t n = strlen(text);
  for (size_t at = 0; at + n <= b->size; at++)
    if (memcmp(b->data + at, text, n) == 0)
      return 1;
  return 0;
}

/* Replaces the first `from` in the head's text by `to` and parses it. */
static pulse_status parse_edited(const pulse_buffer *b, const char *from,
                                 const char *to) {
  char *text = calloc(1, b->size + strlen(to) + 1);
  cr_assert_not_null(text);
  memcpy(text, b->data, b->size);
  char *at = strstr(text, from);
  cr_assert_not_null(at, "'%s' not in the head:\n%s", from, text);
  size_t lf = strlen(from), lt = strlen(to);
  memmove(at + lt, at + lf, b->size - (size_t)(at - text) - lf + 1);
  memcpy(at, to, lt);
  pulse_store_head *h = NULL;
  pulse_status st =
      pulse_store_head_parse((const uint8_t *)text, strlen(text), &h);
  pulse_store_head_free(h);
  free(text);
  return st;
}

Test(head, version_2_signs_run_time_and_previous_link) {
  pulse_sign_key *key;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  head_fx x;
  fx_fields(&x, 2);
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(store_head_serialize(&x.f, key, &b), PULSE_OK);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_parse(b.data, b.size, &h), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_store_head_version(h), 2);
  uint8_t run[PULSE_STORE_RUN_BYTES], want[PULSE_STORE_RUN_BYTES], sha[32];
  memset(want, 0xab, sizeof want);
  cr_assert_eq(pulse_store_head_run(h, run), 1);
  cr_assert_arr_eq(run, want, sizeof run);
  cr_assert_eq(pulse_store_head_published(h), 1764633600);
  uint64_t prev = 0;
  cr_assert_eq(pulse_store_head_previous(h, &prev, sha), 1);
  cr_assert_eq(prev, 7);
  cr_assert_eq(sha[0], 0x44);
  pulse_store_head_free(h);
  cr_assert(head_has(&b, "\"format\":\"pulse-head/2\""));
  /* Each of the new fields is covered by the signature. */
  cr_assert_eq(parse_edited(&b, "\"run\":\"ab", "\"run\":\"ac"),
               PULSE_ERR_CORRUPT, "the run is signed");
  cr_assert_eq(parse_edited(&b, "\"published\":1764633600",
                            "\"published\":1764633601"),
               PULSE_ERR_CORRUPT, "the time is signed");
  cr_assert_eq(
      parse_edited(&b, "\"previous\":{\"step\":7", "\"previous\":{\"step\":6"),
      PULSE_ERR_CORRUPT, "the link's step is signed");
  cr_assert_eq(parse_edited(&b, "\"sha256\":\"4444", "\"sha256\":\"4445"),
               PULSE_ERR_CORRUPT, "the link's hash is signed");
  /* Shape errors come before the signature. */
  cr_assert_eq(parse_edited(&b, "\"run\":\"ab", "\"run\":\"AB"),
               PULSE_ERR_JSON);
  cr_assert_eq(parse_edited(&b, "\"previous\":{\"step\":7",
                            "\"previous\":{\"step\":9"),
               PULSE_ERR_CORRUPT, "a previous head above the head");
  cr_assert_eq(parse_edited(&b, "\"previous\":{", "\"previous\":[{"),
               PULSE_ERR_JSON);
  pulse_buffer_free(&b);
  /* The first head of a run links to nothing. */
  x.f.has_previous = 0;
  cr_assert_eq(store_head_serialize(&x.f, key, &b), PULSE_OK);
  cr_assert(head_has(&b, "\"previous\":null"));
  cr_assert_eq(pulse_store_head_parse(b.data, b.size, &h), PULSE_OK);
  cr_assert_eq(pulse_store_head_previous(h, NULL, NULL), 0);
  pulse_store_head_free(h);
  cr_assert_eq(parse_edited(&b, "\"previous\":null,", ""), PULSE_ERR_JSON,
               "version 2 needs the member");
  pulse_buffer_free(&b);
  pulse_sign_key_free(key);
}

Test(head, version_1_heads_still_verify_and_name_no_run) {
  pulse_sign_key *key;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  head_fx x;
  fx_fields(&x, 1);
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(store_head_serialize(&x.f, key, &b), PULSE_OK);
  cr_assert(head_has(&b, "\"format\":\"pulse-head/1\""));
  cr_assert(!head_has(&b, "\"run\""));
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_parse(b.data, b.size, &h), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_store_head_version(h), 1);
  cr_assert_eq(pulse_store_head_signer(h, NULL), 1);
  cr_assert_eq(pulse_store_head_run(h, NULL), 0);
  cr_assert_eq(pulse_store_head_published(h), 0);
  cr_assert_eq(pulse_store_head_previous(h, NULL, NULL), 0);
  pulse_store_head_free(h);
  /* Version 2's members in a version-1 head are unsigned: not read. */
  char run[80];
  snprintf(run, sizeof run,
           "\"run\":\"%032d\",\"published\":9,\"state_digest\"", 0);
  cr_assert_eq(parse_edited(&b, "\"state_digest\"", run), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_buffer_free(&b);
  pulse_sign_key_free(key);
}

Test(head, run_identities_are_random) {
  uint8_t a[PULSE_STORE_RUN_BYTES], b[PULSE_STORE_RUN_BYTES];
  cr_assert_eq(store_run_new(a), PULSE_OK);
  cr_assert_eq(store_run_new(b), PULSE_OK);
  cr_assert(memcmp(a, b, sizeof a) != 0);
}
