/* The store: heads (parse, signature, hostile input), recovery after a
 * crash, verification, state rebuild, signing keys. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>

#include "pulse_publisher.h"
#include "pulse_sign.h"
#include "pulse_store.h"
#include "pulse_store_writer.h"
#include "store_impl.h"
#include "trainer_testutil.h"

/* A store with `steps` commits after the first state. */
static char *make_store(int steps, const pulse_sign_key *key, tu_model *m) {
  char *dir = tu_make_dir();
  tu_model_init(m, 11, 2);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m->info;
  o.tensor_count = TU_TENSORS;
  o.key = key;
  o.anchor_every = 3;
  o.anchor_sync = 1;
  o.threads = 1;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(m, t);
  for (int s = 0; s <= steps; s++) {
    if (s > 0)
      tu_model_step(m, 0.02);
    cr_assert_eq(pulse_pub_commit(pub, (uint64_t)s, t, TU_TENSORS, NULL),
                 PULSE_OK, "%s", pulse_error_detail());
  }
  pulse_pub_free(pub);
  return dir;
}

static uint8_t *head_bytes(const char *dir, size_t *n) {
  char path[512];
  tt_path(path, sizeof path, dir, "head.json");
  uint8_t *b = tu_read(path, n);
  cr_assert_not_null(b);
  return b;
}

/* Replaces the first occurrence of `from` with `to` in a head's text and
 * parses the result. */
static pulse_status parse_edited(const uint8_t *bytes, size_t n,
                                 const char *from, const char *to) {
  char *text = tu_alloc(n + strlen(to) + 1);
  memcpy(text, bytes, n);
  char *at = strstr(text, from);
  cr_assert_not_null(at, "'%s' not in the head", from);
  size_t lf = strlen(from), lt = strlen(to);
  memmove(at + lt, at + lf, n - (size_t)(at - text) - lf + 1);
  memcpy(at, to, lt);
  pulse_store_head *h = NULL;
  pulse_status st =
      pulse_store_head_parse((const uint8_t *)text, strlen(text), &h);
  pulse_store_head_free(h);
  free(text);
  return st;
}

Test(store, signed_head_parses_and_names_its_signer) {
  pulse_sign_key *key = NULL;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  tu_model m;
  char *dir = make_store(5, key, &m);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_store_head_step(h), 5);
  uint8_t pub[32], want[32];
  pulse_sign_key_public(key, want);
  cr_assert_eq(pulse_store_head_signer(h, pub), 1);
  cr_assert_eq(memcmp(pub, want, 32), 0);
  pulse_state_digest d = tt_model_digest(&m);
  cr_assert_eq(memcmp(pulse_store_head_state_digest(h), &d, sizeof d), 0);
  cr_assert_eq(pulse_store_head_patch_count(h), 5);
  const pulse_store_object *last = pulse_store_head_patch(h, 4);
  cr_assert_eq(last->step, 5);
  cr_assert_eq(last->base_step, 4);
  cr_assert(strncmp(last->path, "objects/", 8) == 0);
  cr_assert_eq(pulse_store_head_anchor(h, 0)->step, 0);
  cr_assert_eq(pulse_store_head_oldest_step(h), 0);
  for (uint64_t s = 0; s <= 5; s++)
    cr_assert(pulse_store_head_has_step(h, s));
  cr_assert_not(pulse_store_head_has_step(h, 6));
  pulse_store_head_free(h);
  pulse_sign_key_free(key);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(store, any_edit_of_a_signed_field_breaks_the_signature) {
  pulse_sign_key *key = NULL;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  tu_model m;
  char *dir = make_store(2, key, &m);
  size_t n;
  uint8_t *b = head_bytes(dir, &n);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_parse(b, n, &h), PULSE_OK);
  char hexd[65], pubhex[65];
  store_hex(pulse_store_head_state_digest(h)->bytes, 32, hexd);
  uint8_t pub[32];
  pulse_store_head_signer(h, pub);
  store_hex(pub, 32, pubhex);
  const pulse_store_object *p = pulse_store_head_patch(h, 1);
  char sizes[64], size_edit[64];
  snprintf(sizes, sizeof sizes, "\"size\":%" PRIu64 "}", p->size);
  snprintf(size_edit, sizeof size_edit, "\"size\":%" PRIu64 "}", p->size + 1);
  /* step, digest, a size, the key: each edit must fail the signature. */
  cr_assert_eq(parse_edited(b, n, "\"step\":2,", "\"step\":3,"),
               PULSE_ERR_CORRUPT);
  char d2[65];
  memcpy(d2, hexd, 65);
  d2[0] = d2[0] == 'a' ? 'b' : 'a';
  cr_assert_eq(parse_edited(b, n, hexd, d2), PULSE_ERR_CORRUPT);
  cr_assert_eq(parse_edited(b, n, sizes, size_edit), PULSE_ERR_CORRUPT);
  char k2[65];
  memcpy(k2, pubhex, 65);
  k2[10] = k2[10] == '0' ? '1' : '0';
  cr_assert_eq(parse_edited(b, n, pubhex, k2), PULSE_ERR_CORRUPT);
  pulse_store_head_free(h);
  free(b);
  pulse_sign_key_free(key);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(store, hostile_heads_are_refused_with_clear_errors) {
  tu_model m;
  char *dir = make_store(2, NULL, &m); /* unsigned: structure checks alone */
  size_t n;
  uint8_t *b = head_bytes(dir, &n);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_parse(b, n, &h), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_store_head_signer(h, NULL), 0);
  const pulse_store_object *p0 = pulse_store_head_patch(h, 0);
  char path_json[160];
  snprintf(path_json, sizeof path_json, "\"path\":\"%s\"", p0->path);
  cr_assert_eq(
      parse_edited(b, n, path_json, "\"path\":\"objects/../../etc/passwd\""),
      PULSE_ERR_CORRUPT);
  cr_assert_eq(parse_edited(b, n, "\"url\":\"/v1/", "\"url\":\"/v2/"),
               PULSE_ERR_CORRUPT);
  cr_assert_eq(parse_edited(b, n, "pulse-head/2", "pulse-head/9"),
               PULSE_ERR_VERSION);
  cr_assert_eq(parse_edited(b, n, "\"base_step\":1", "\"base_step\":0"),
               PULSE_ERR_CORRUPT, "a broken chain");
  cr_assert_eq(parse_edited(b, n, "\"step\":2,", "\"step\":7,"),
               PULSE_ERR_CORRUPT, "the last patch must end at the head step");
  cr_assert_eq(parse_edited(b, n, "\"step\":2,", "\"step\":2,\"step\":2,"),
               PULSE_ERR_JSON, "duplicate members");
  cr_assert_eq(parse_edited(b, n, "\"step\":2,", "\"step\":-2,"),
               PULSE_ERR_JSON);
  cr_assert_eq(
      parse_edited(b, n, "\"step\":2,", "\"step\":99999999999999999999999,"),
      PULSE_ERR_OVERFLOW);
  cr_assert_eq(parse_edited(b, n, "\"anchors\":[", "\"anchors\":[],\"x\":["),
               PULSE_ERR_CORRUPT, "no anchor");
  cr_assert_eq(parse_edited(b, n, "\"sha256\":\"", "\"sha256\":\"A"),
               PULSE_ERR_JSON);
  cr_assert_eq(parse_edited(b, n, "\"state_digest\"",
                            "\"signature\":\"00\",\"state_digest\""),
               PULSE_ERR_CORRUPT, "a signature without a key");
  /* Every truncation and a sweep of byte flips: an error or a valid head,
   * never a crash. */
  for (size_t cut = 0; cut + 1 < n; cut++) { /* the last byte is a newline */
    pulse_store_head *x = NULL;
    cr_assert_neq(pulse_store_head_parse(b, cut, &x), PULSE_OK,
                  "a head cut at %zu parsed", cut);
    cr_assert_null(x);
  }
  uint64_t seed = 5;
  for (int k = 0; k < 2000; k++) {
    uint8_t *c = tu_alloc(n);
    memcpy(c, b, n);
    size_t at = pulse_rng_next(&seed) % n;
    c[at] ^= (uint8_t)(1u << (pulse_rng_next(&seed) % 8));
    pulse_store_head *x = NULL;
    if (pulse_store_head_parse(c, n, &x) == PULSE_OK)
      cr_assert_not_null(x);
    pulse_store_head_free(x);
    free(c);
  }
  pulse_store_head_free(h);
  cr_assert_eq(pulse_store_head_parse(NULL, 0, &h), PULSE_ERR_JSON);
  cr_assert_eq(pulse_store_head_parse(NULL, 5, &h), PULSE_ERR_ARG);
  free(b);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(store, recovery_removes_temporaries_and_unnamed_objects_only) {
  tu_model m;
  char *dir = make_store(4, NULL, &m);
  char objs[512], p[600];
  tt_path(objs, sizeof objs, dir, "objects");
  int named = tt_count(objs);
  snprintf(p, sizeof p, "%s/.%064d.pulse.tmp-1-2-3", objs, 0);
  cr_assert_eq(tu_write(p, "partial", 7), 0);
  snprintf(p, sizeof p, "%s/%064d.pulse", objs, 7);
  cr_assert_eq(tu_write(p, "an unnamed object", 17), 0);
  snprintf(p, sizeof p, "%s/.head.json.tmp-9-9-9", dir);
  cr_assert_eq(tu_write(p, "{", 1), 0);
  snprintf(p, sizeof p, "%s/catchup/%064d.pulse", dir, 1);
  cr_assert_eq(tu_write(p, "x", 1), 0);
  snprintf(p, sizeof p, "%s/README", objs);
  cr_assert_eq(tu_write(p, "not an object name", 18), 0);
  pulse_store_verify_figures r;
  cr_assert_eq(pulse_store_verify(dir, 0, NULL, &r), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(r.strays, 3);
  pulse_store_recovery rec;
  cr_assert_eq(pulse_store_recover(dir, &rec), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(rec.temporaries, 2);
  cr_assert_eq(rec.orphans, 1);
  cr_assert_eq(rec.catchups, 1);
  cr_assert_eq(tt_count(objs), named + 1,
               "named objects and the unknown file stay");
  cr_assert_eq(
      pulse_store_verify(
          dir, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE, NULL, &r),
      PULSE_OK, "%s", pulse_error_detail());
  cr_assert_eq(r.strays, 0);
  cr_assert_eq(r.head_step, 4);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(store,
     a_missing_or_resized_named_object_stops_recovery_before_any_removal) {
  tu_model m;
  char *dir = make_store(3, NULL, &m);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  char p[600], orphan[600];
  tt_path(p, sizeof p, dir, pulse_store_head_patch(h, 1)->path);
  snprintf(orphan, sizeof orphan, "%s/objects/%064d.pulse", dir, 3);
  cr_assert_eq(tu_write(orphan, "x", 1), 0);
  FILE *f = fopen(p, "ab");
  fputc(0, f);
  fclose(f);
  cr_assert_eq(pulse_store_recover(dir, NULL), PULSE_ERR_CORRUPT);
  cr_assert_eq(access(orphan, F_OK), 0, "nothing removed");
  cr_assert_eq(pulse_store_verify(dir, 0, NULL, NULL), PULSE_ERR_CORRUPT);
  unlink(p);
  cr_assert_eq(pulse_store_recover(dir, NULL), PULSE_ERR_CORRUPT);
  cr_assert_eq(pulse_store_verify(dir, 0, NULL, NULL), PULSE_ERR_NOT_FOUND);
  pulse_store_head_free(h);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(store, verify_finds_a_flipped_byte_in_any_object) {
  tu_model m;
  char *dir = make_store(4, NULL, &m);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  cr_assert_eq(pulse_store_verify(dir, PULSE_STORE_VERIFY_HASHES, NULL, NULL),
               PULSE_OK);
  char p[600];
  tt_path(p, sizeof p, dir, pulse_store_head_patch(h, 1)->path); /* step 2 */
  tu_flip(p, -3);
  cr_assert_eq(pulse_store_verify(dir, 0, NULL, NULL), PULSE_OK,
               "same size: only hashes see it");
  cr_assert_eq(pulse_store_verify(dir, PULSE_STORE_VERIFY_HASHES, NULL, NULL),
               PULSE_ERR_CORRUPT);
  cr_assert_neq(pulse_store_verify(dir, PULSE_STORE_VERIFY_STATE, NULL, NULL),
                PULSE_OK);
  pulse_store_state s = PULSE_STORE_STATE_INIT;
  cr_assert_eq(pulse_store_state_rebuild(dir, h, 2, 1, &s), PULSE_ERR_CORRUPT);
  cr_assert_eq(s.count, 0);
  tu_flip(p, -3);
  /* An anchor's tensors: digest check on rebuild. */
  tt_path(p, sizeof p, dir, pulse_store_head_anchor(h, 0)->path);
  tu_flip(p, -5);
  cr_assert_eq(pulse_store_state_rebuild(dir, h, 1, 1, &s), PULSE_ERR_CORRUPT);
  cr_assert_eq(pulse_store_verify(dir, PULSE_STORE_VERIFY_HASHES, NULL, NULL),
               PULSE_ERR_CORRUPT);
  pulse_store_head_free(h);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(store, every_retained_step_rebuilds_bit_for_bit) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 3, 2);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.anchor_every = 2;
  o.anchor_sync = 1;
  o.threads = 1;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK);
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  pulse_state_digest want[7];
  for (int s = 0; s < 7; s++) {
    if (s)
      tu_model_step(&m, 0.05);
    cr_assert_eq(pulse_pub_commit(pub, (uint64_t)(10 + s), t, TU_TENSORS, NULL),
                 PULSE_OK);
    want[s] = tt_model_digest(&m);
  }
  uint64_t total;
  uint16_t *last = tt_model_bf16(&m, &total);
  pulse_pub_free(pub);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  for (int s = 0; s < 7; s++) {
    pulse_store_state st = PULSE_STORE_STATE_INIT;
    cr_assert_eq(pulse_store_state_rebuild(dir, h, (uint64_t)(10 + s), 1, &st),
                 PULSE_OK, "step %d: %s", 10 + s, pulse_error_detail());
    cr_assert_eq(memcmp(&st.state_digest, &want[s], sizeof want[s]), 0,
                 "step %d", 10 + s);
    if (s == 6) {
      uint16_t *at = last;
      for (size_t i = 0; i < st.count; i++) {
        cr_assert_eq(memcmp(st.bits[i], at, st.numel[i] * 2), 0);
        at += st.numel[i];
      }
    }
    pulse_store_state_free(&st);
  }
  pulse_store_state st = PULSE_STORE_STATE_INIT;
  cr_assert_eq(pulse_store_state_rebuild(dir, h, 9, 1, &st),
               PULSE_ERR_NOT_FOUND);
  cr_assert_eq(pulse_store_state_rebuild(dir, h, 17, 1, &st),
               PULSE_ERR_NOT_FOUND);
  free(last);
  pulse_store_head_free(h);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(store, keys_round_trip_through_pem_and_verify_only_their_messages) {
  char *dir = tu_make_dir(), path[512], bad[512];
  tt_path(path, sizeof path, dir, "key.pem");
  pulse_sign_key *k = NULL, *k2 = NULL;
  cr_assert_eq(pulse_sign_key_generate(&k), PULSE_OK);
  cr_assert_eq(pulse_sign_key_save(k, path), PULSE_OK, "%s",
               pulse_error_detail());
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  cr_assert_eq(sb.st_mode & 0777, 0600,
               "a private key is not for others to read");
  cr_assert_eq(pulse_sign_key_save(k, path), PULSE_ERR_IO, "never replaced");
  cr_assert(strstr(pulse_error_detail(), "never replaced") != NULL);
  cr_assert_eq(pulse_sign_key_load(path, &k2), PULSE_OK, "%s",
               pulse_error_detail());
  uint8_t p1[32], p2[32], sig[64];
  pulse_sign_key_public(k, p1);
  pulse_sign_key_public(k2, p2);
  cr_assert_eq(memcmp(p1, p2, 32), 0);
  cr_assert_eq(pulse_sign(k2, "hello", 5, sig), PULSE_OK);
  cr_assert_eq(pulse_sign_verify(p1, "hello", 5, sig), PULSE_OK);
  cr_assert_eq(pulse_sign_verify(p1, "hellO", 5, sig), PULSE_ERR_CORRUPT);
  sig[3] ^= 1;
  cr_assert_eq(pulse_sign_verify(p1, "hello", 5, sig), PULSE_ERR_CORRUPT);
  tt_path(bad, sizeof bad, dir, "bad.pem");
  cr_assert_eq(
      tu_write(bad,
               "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
               58),
      0);
  pulse_sign_key *k3 = NULL;
  cr_assert_eq(pulse_sign_key_load(bad, &k3), PULSE_ERR_CORRUPT);
  cr_assert_null(k3);
  tt_path(bad, sizeof bad, dir, "none.pem");
  cr_assert_eq(pulse_sign_key_load(bad, &k3), PULSE_ERR_NOT_FOUND);
  pulse_sign_key_free(k);
  pulse_sign_key_free(k2);
  pulse_sign_key_free(NULL);
  tu_rm_rf(dir);
}

Test(store, verify_with_a_pinned_key_refuses_other_signers) {
  pulse_sign_key *k = NULL, *other = NULL;
  cr_assert_eq(pulse_sign_key_generate(&k), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&other), PULSE_OK);
  tu_model m;
  char *dir = make_store(1, k, &m);
  uint8_t pk[32], po[32];
  pulse_sign_key_public(k, pk);
  pulse_sign_key_public(other, po);
  cr_assert_eq(pulse_store_verify(dir, 0, pk, NULL), PULSE_OK);
  cr_assert_eq(pulse_store_verify(dir, 0, po, NULL), PULSE_ERR_CORRUPT);
  pulse_sign_key_free(k);
  pulse_sign_key_free(other);
  tu_model_free(&m);
  tu_rm_rf(dir);
}
