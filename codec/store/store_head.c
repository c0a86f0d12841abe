/* store_head.c - the head: parsing and checking, canonical form, JSON
 * writer, signatures (pulse_store.h, docs/protocols/sync.md). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "bytebuf_impl.h"
#include "fail_impl.h"
#include "json_impl.h"
#include "status_impl.h"
#include "store_impl.h"

static const char *kind_ext(pulse_store_kind kind) {
  return kind == PULSE_STORE_ANCHOR ? ".safetensors" : ".pulse";
}

void store_object_set_path(pulse_store_object *obj) {
  char hex[65];
  store_hex(obj->sha256, 32, hex);
  snprintf(obj->path, sizeof obj->path, PULSE_STORE_OBJECTS_DIR "/%s%s", hex,
           kind_ext(obj->kind));
}

pulse_status store_head_canonical(const store_head_fields *f,
                                  const uint8_t *pub, pulse_buffer *out) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  char hex[129];
  int v2 = f->version >= 2;
  pulse_bytebuf_printf(&b, "pulse-head-signature/%d\nstep %" PRIu64 "\n",
                       v2 ? 2 : 1, f->step);
  store_hex(f->digest.bytes, 32, hex);
  pulse_bytebuf_printf(&b, "state_digest %s\n", hex);
  if (v2) {
    store_hex(f->run, PULSE_STORE_RUN_BYTES, hex);
    pulse_bytebuf_printf(&b, "run %s\npublished %" PRIu64 "\n", hex,
                         f->published);
    if (f->has_previous) {
      store_hex(f->previous_sha256, 32, hex);
      pulse_bytebuf_printf(&b, "previous %" PRIu64 " %s\n", f->previous_step,
                           hex);
    } else {
      pulse_bytebuf_printf(&b, "previous none\n");
    }
  }
  store_hex(pub, PULSE_KEY_BYTES, hex);
  pulse_bytebuf_printf(&b, "public_key %s\npatches %zu\n", hex, f->npatches);
  for (size_t i = 0; i < f->npatches; i++) {
    const pulse_store_object *o = &f->patches[i];
    store_hex(o->sha256, 32, hex);
    pulse_bytebuf_printf(&b,
                         "patch %" PRIu64 " %" PRIu64 " %" PRIu64 " %s %s\n",
                         o->step, o->base_step, o->size, hex, o->path);
  }
  pulse_bytebuf_printf(&b, "anchors %zu\n", f->nanchors);
  for (size_t i = 0; i < f->nanchors; i++) {
    const pulse_store_object *o = &f->anchors[i];
    store_hex(o->sha256, 32, hex);
    pulse_bytebuf_printf(&b, "anchor %" PRIu64 " %" PRIu64 " %s %s\n", o->step,
                         o->size, hex, o->path);
  }
  if (pulse_bytebuf_take(&b, out) != PULSE_OK)
    return pulse_fail(PULSE_ERR_NOMEM, "head: canonical form");
  return PULSE_OK;
}

/* The head's layout (docs/protocols/sync.md): one top-level member per line,
 * one object per line in the lists. */
static void write_objects(pulse_json_writer *w, const char *name,
                          const pulse_store_object *objs, size_t n) {
  char hex[65], url[4 + PULSE_STORE_PATH_MAX];
  pulse_json_write_newline(w, 0);
  pulse_json_write_key(w, name);
  pulse_json_write_array(w);
  for (size_t i = 0; i < n; i++) {
    const pulse_store_object *o = &objs[i];
    store_hex(o->sha256, 32, hex);
    snprintf(url, sizeof url, "/v1/%s", o->path);
    pulse_json_write_newline(w, 1);
    pulse_json_write_object(w);
    pulse_json_write_key(w, "step");
    pulse_json_write_u64(w, o->step);
    if (o->kind == PULSE_STORE_PATCH) {
      pulse_json_write_key(w, "base_step");
      pulse_json_write_u64(w, o->base_step);
    }
    pulse_json_write_key(w, "path");
    pulse_json_write_string(w, o->path);
    pulse_json_write_key(w, "url");
    pulse_json_write_string(w, url);
    pulse_json_write_key(w, "sha256");
    pulse_json_write_string(w, hex);
    pulse_json_write_key(w, "size");
    pulse_json_write_u64(w, o->size);
    pulse_json_write_end(w);
  }
  if (n)
    pulse_json_write_newline(w, 0);
  pulse_json_write_end(w);
}

static void write_hex_member(pulse_json_writer *w, const char *key,
                             const uint8_t *bytes, size_t n) {
  char hex[129];
  store_hex(bytes, n, hex);
  pulse_json_write_newline(w, 0);
  pulse_json_write_key(w, key);
  pulse_json_write_string(w, hex);
}

/* Version 2's members: run, publication time, link to the previous head. */
static void write_identity(pulse_json_writer *w, const store_head_fields *f) {
  write_hex_member(w, "run", f->run, PULSE_STORE_RUN_BYTES);
  pulse_json_write_newline(w, 0);
  pulse_json_write_key(w, "published");
  pulse_json_write_u64(w, f->published);
  pulse_json_write_newline(w, 0);
  pulse_json_write_key(w, "previous");
  if (!f->has_previous) {
    pulse_json_write_null(w);
    return;
  }
  char hex[65];
  store_hex(f->previous_sha256, 32, hex);
  pulse_json_write_object(w);
  pulse_json_write_key(w, "step");
  pulse_json_write_u64(w, f->previous_step);
  pulse_json_write_key(w, "sha256");
  pulse_json_write_string(w, hex);
  pulse_json_write_end(w);
}

int store_rotation_canonical(const uint8_t run[PULSE_STORE_RUN_BYTES],
                             uint64_t step,
                             const uint8_t from[PULSE_KEY_BYTES],
                             const uint8_t to[PULSE_KEY_BYTES],
                             char out[STORE_ROTATION_CANON_MAX]) {
  char run_hex[2 * PULSE_STORE_RUN_BYTES + 1], from_hex[65], to_hex[65];
  store_hex(run, PULSE_STORE_RUN_BYTES, run_hex);
  store_hex(from, PULSE_KEY_BYTES, from_hex);
  store_hex(to, PULSE_KEY_BYTES, to_hex);
  return snprintf(out, STORE_ROTATION_CANON_MAX,
                  "pulse-key-rotation/1\nrun %s\nstep %" PRIu64
                  "\nfrom %s\nto %s\n",
                  run_hex, step, from_hex, to_hex);
}

pulse_status store_rotation_sign(const pulse_sign_key *from,
                                 const uint8_t to[PULSE_KEY_BYTES],
                                 const uint8_t run[PULSE_STORE_RUN_BYTES],
                                 uint64_t step, store_rotation *out) {
  memset(out, 0, sizeof *out);
  pulse_sign_key_public(from, out->from);
  if (memcmp(out->from, to, PULSE_KEY_BYTES) == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "key rotation: the new key is the current one");
  char canon[STORE_ROTATION_CANON_MAX];
  int n = store_rotation_canonical(run, step, out->from, to, canon);
  PULSE_TRY(pulse_sign(from, canon, (size_t)n, out->signature));
  out->step = step;
  out->present = 1;
  return PULSE_OK;
}

/* "rotation": {"step", "from", "to", "signature"} (docs/protocols/sync.md). */
static void write_rotation(pulse_json_writer *w, const store_rotation *r,
                           const uint8_t to[PULSE_KEY_BYTES]) {
  char hex[129];
  pulse_json_write_newline(w, 0);
  pulse_json_write_key(w, "rotation");
  pulse_json_write_object(w);
  pulse_json_write_key(w, "step");
  pulse_json_write_u64(w, r->step);
  store_hex(r->from, PULSE_KEY_BYTES, hex);
  pulse_json_write_key(w, "from");
  pulse_json_write_string(w, hex);
  store_hex(to, PULSE_KEY_BYTES, hex);
  pulse_json_write_key(w, "to");
  pulse_json_write_string(w, hex);
  store_hex(r->signature, PULSE_SIGN_SIGNATURE_BYTES, hex);
  pulse_json_write_key(w, "signature");
  pulse_json_write_string(w, hex);
  pulse_json_write_end(w);
}

pulse_status store_head_serialize(const store_head_fields *f,
                                  const pulse_sign_key *key,
                                  pulse_buffer *out) {
  out->data = NULL;
  out->size = 0;
  uint8_t pub[PULSE_KEY_BYTES], sig[PULSE_SIGN_SIGNATURE_BYTES];
  if (key != NULL) {
    pulse_sign_key_public(key, pub);
    pulse_buffer canon = {NULL, 0};
    pulse_status st = store_head_canonical(f, pub, &canon);
    if (st == PULSE_OK)
      st = pulse_sign(key, canon.data, canon.size, sig);
    pulse_buffer_free(&canon);
    if (st != PULSE_OK)
      return st;
  }
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_json_writer w;
  pulse_json_write_init(&w, &b);
  pulse_json_write_object(&w);
  pulse_json_write_key(&w, "format");
  pulse_json_write_string(&w, f->version >= 2 ? PULSE_STORE_HEAD_FORMAT
                                              : PULSE_STORE_HEAD_FORMAT_V1);
  pulse_json_write_newline(&w, 0);
  pulse_json_write_key(&w, "step");
  pulse_json_write_u64(&w, f->step);
  write_hex_member(&w, "state_digest", f->digest.bytes, 32);
  if (f->version >= 2)
    write_identity(&w, f);
  write_objects(&w, "patches", f->patches, f->npatches);
  write_objects(&w, "anchors", f->anchors, f->nanchors);
  /* Only a signed version-2 head carries one (its signer is the new key);
   * pulse_store_head_parse of the result checks the rest. */
  if (key != NULL && f->version >= 2 && f->rotation.present)
    write_rotation(&w, &f->rotation, pub);
  if (key != NULL) {
    write_hex_member(&w, "public_key", pub, sizeof pub);
    write_hex_member(&w, "signature", sig, sizeof sig);
  }
  pulse_json_write_end(&w);
  pulse_json_write_newline(&w, 0);
  pulse_status st = pulse_json_write_finish(&w);
  if (st == PULSE_OK)
    st = pulse_bytebuf_take(&b, out);
  pulse_bytebuf_free(&b);
  if (st == PULSE_ERR_NOMEM)
    return pulse_fail(PULSE_ERR_NOMEM, "head: JSON");
  return st;
}

/* ---------------------------------------------------------------- parsing */

static pulse_status get_u64(const pulse_json *obj, const char *key,
                            const char *where, uint64_t *out) {
  const pulse_json *v = pulse_json_get(obj, key);
  if (v == NULL)
    return pulse_fail(PULSE_ERR_JSON, "head: %s: no \"%s\"", where, key);
  pulse_status st = pulse_json_u64(v, out);
  if (st != PULSE_OK)
    return pulse_fail(st, "head: %s: \"%s\" is not an unsigned 64-bit integer",
                      where, key);
  return PULSE_OK;
}

static pulse_status get_str(const pulse_json *obj, const char *key,
                            const char *where, const char **s, size_t *len) {
  const pulse_json *v = pulse_json_get(obj, key);
  if (v == NULL || !pulse_json_string(v, s, len))
    return pulse_fail(PULSE_ERR_JSON,
                      "head: %s: \"%s\" missing or not a string", where, key);
  return PULSE_OK;
}

static pulse_status get_hex(const pulse_json *obj, const char *key,
                            const char *where, uint8_t *out, size_t n) {
  const char *s;
  size_t len;
  PULSE_TRY(get_str(obj, key, where, &s, &len));
  if (store_unhex(s, len, out, n) != 0)
    return pulse_fail(PULSE_ERR_JSON,
                      "head: %s: \"%s\" is not %zu lower-case hex digits",
                      where, key, 2 * n);
  return PULSE_OK;
}

static pulse_status no_duplicates(const pulse_json *obj, const char *where) {
  const pulse_json *dup = NULL;
  PULSE_TRY(pulse_json_find_duplicate(obj, &dup));
  if (dup != NULL)
    return pulse_fail(PULSE_ERR_JSON, "head: %s: member \"%s\" appears twice",
                      where, dup->key);
  return PULSE_OK;
}

static pulse_status parse_object(const pulse_json *v, pulse_store_kind kind,
                                 size_t i, pulse_store_object *o) {
  char where[48];
  snprintf(where, sizeof where, "%s %zu",
           kind == PULSE_STORE_PATCH ? "patch" : "anchor", i);
  if (v->type != PULSE_JSON_OBJECT)
    return pulse_fail(PULSE_ERR_JSON, "head: %s is not an object", where);
  PULSE_TRY(no_duplicates(v, where));
  memset(o, 0, sizeof *o);
  o->kind = kind;
  PULSE_TRY(get_u64(v, "step", where, &o->step));
  if (kind == PULSE_STORE_PATCH)
    PULSE_TRY(get_u64(v, "base_step", where, &o->base_step));
  else
    o->base_step = o->step;
  PULSE_TRY(get_u64(v, "size", where, &o->size));
  PULSE_TRY(get_hex(v, "sha256", where, o->sha256, 32));
  store_object_set_path(o);
  const char *path, *url;
  size_t path_len, url_len;
  PULSE_TRY(get_str(v, "path", where, &path, &path_len));
  PULSE_TRY(get_str(v, "url", where, &url, &url_len));
  /* Content addressing: the path is derived from the hash, so a head can
   * never point a client anywhere else (no "..", no absolute path). */
  if (path_len != strlen(o->path) || memcmp(path, o->path, path_len) != 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "head: %s: path is not \"%s\"", where,
                      o->path);
  if (url_len != path_len + 4 || memcmp(url, "/v1/", 4) != 0 ||
      memcmp(url + 4, o->path, path_len) != 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "head: %s: url is not \"/v1/%s\"",
                      where, o->path);
  if (kind == PULSE_STORE_PATCH && o->base_step >= o->step)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head: %s: base step %" PRIu64
                      " is not below step %" PRIu64,
                      where, o->base_step, o->step);
  if (o->size == 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "head: %s: empty object", where);
  return PULSE_OK;
}

static pulse_status parse_list(const pulse_json *root, const char *key,
                               pulse_store_kind kind, pulse_store_object **out,
                               size_t *count) {
  const pulse_json *arr = pulse_json_get(root, key);
  if (arr == NULL || arr->type != PULSE_JSON_ARRAY)
    return pulse_fail(PULSE_ERR_JSON, "head: \"%s\" missing or not an array",
                      key);
  size_t n = pulse_json_count(arr);
  if (n > PULSE_STORE_MAX_OBJECTS)
    return pulse_fail(PULSE_ERR_OVERFLOW, "head: %zu %s (at most %u)", n, key,
                      PULSE_STORE_MAX_OBJECTS);
  *out = calloc(n + 1, sizeof **out);
  if (*out == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "head: %zu %s", n, key);
  *count = n;
  for (size_t i = 0; i < n; i++)
    PULSE_TRY(parse_object(pulse_json_at(arr, i), kind, i, &(*out)[i]));
  return PULSE_OK;
}

static int is_retained(const pulse_store_head *h, uint64_t step) {
  if (h->npatches == 0)
    return step == h->step;
  if (step == h->patches[0].base_step)
    return 1;
  /* Patch steps increase: binary search. */
  size_t lo = 0, hi = h->npatches;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (h->patches[mid].step < step)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < h->npatches && h->patches[lo].step == step;
}

/* The relations between fields: a chain of patches ending at the head, and
 * anchors on retained steps with the oldest at the chain's start. */
static pulse_status check_shape(const pulse_store_head *h) {
  for (size_t i = 0; i < h->npatches; i++)
    if (i > 0 && h->patches[i].base_step != h->patches[i - 1].step)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "head: patch %zu applies to step %" PRIu64
                        ", not to the previous "
                        "patch's step %" PRIu64,
                        i, h->patches[i].base_step, h->patches[i - 1].step);
  if (h->npatches > 0 && h->patches[h->npatches - 1].step != h->step)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head: the last patch ends at step %" PRIu64
                      ", not at the head step %" PRIu64,
                      h->patches[h->npatches - 1].step, h->step);
  if (h->nanchors == 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "head: names no anchor");
  uint64_t first = h->npatches ? h->patches[0].base_step : h->step;
  if (h->anchors[0].step != first)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head: the oldest anchor is at step %" PRIu64
                      ", not at the oldest "
                      "retained step %" PRIu64,
                      h->anchors[0].step, first);
  for (size_t i = 0; i < h->nanchors; i++) {
    if (i > 0 && h->anchors[i].step <= h->anchors[i - 1].step)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "head: anchors are not in increasing step order");
    if (!is_retained(h, h->anchors[i].step))
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "head: anchor at step %" PRIu64
                        " is not a retained step",
                        h->anchors[i].step);
  }
  return PULSE_OK;
}

/* Version 2's members (a version-1 head's are unsigned: never read). */
static pulse_status parse_identity(const pulse_json *root,
                                   pulse_store_head *h) {
  PULSE_TRY(get_hex(root, "run", "head", h->run, PULSE_STORE_RUN_BYTES));
  PULSE_TRY(get_u64(root, "published", "head", &h->published));
  const pulse_json *prev = pulse_json_get(root, "previous");
  if (prev == NULL)
    return pulse_fail(PULSE_ERR_JSON, "head: no \"previous\"");
  if (prev->type == PULSE_JSON_NULL)
    return PULSE_OK;
  if (prev->type != PULSE_JSON_OBJECT)
    return pulse_fail(PULSE_ERR_JSON,
                      "head: \"previous\" is neither null nor an object");
  PULSE_TRY(no_duplicates(prev, "previous"));
  PULSE_TRY(get_u64(prev, "step", "previous", &h->previous_step));
  PULSE_TRY(get_hex(prev, "sha256", "previous", h->previous_sha256, 32));
  /* The head it replaced is at most at its step (the same step when an
   * anchor was added to it). */
  if (h->previous_step > h->step)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head: the previous head's step %" PRIu64
                      " is above the head's step %" PRIu64,
                      h->previous_step, h->step);
  h->has_previous = 1;
  return PULSE_OK;
}

/* The key rotation record, read after the head's own signature checked
 * (docs/protocols/sync.md, "Key rotation"): only in a signed version-2 head, naming
 * the head's signer as the new key, at most at the head's step, and signed
 * by the old key over the run, the step and both keys. */
static pulse_status parse_rotation(const pulse_json *root,
                                   pulse_store_head *h) {
  const pulse_json *r = pulse_json_get(root, "rotation");
  if (r == NULL)
    return PULSE_OK;
  if (!h->is_signed || h->version < 2)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head: a key rotation in an unsigned or pulse-head/1 "
                      "head");
  if (r->type != PULSE_JSON_OBJECT)
    return pulse_fail(PULSE_ERR_JSON, "head: \"rotation\" is not an object");
  PULSE_TRY(no_duplicates(r, "rotation"));
  store_rotation *rot = &h->rotation;
  uint8_t to[PULSE_KEY_BYTES];
  PULSE_TRY(get_u64(r, "step", "rotation", &rot->step));
  PULSE_TRY(get_hex(r, "from", "rotation", rot->from, sizeof rot->from));
  PULSE_TRY(get_hex(r, "to", "rotation", to, sizeof to));
  PULSE_TRY(get_hex(r, "signature", "rotation", rot->signature,
                    sizeof rot->signature));
  if (memcmp(to, h->pub, sizeof to) != 0)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head: the key rotation names another key than the "
                      "head's signer");
  if (memcmp(rot->from, to, sizeof to) == 0)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head: a key rotation from a key to itself");
  if (rot->step > h->step)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head: a key rotation at step %" PRIu64
                      ", after the head's step %" PRIu64,
                      rot->step, h->step);
  char canon[STORE_ROTATION_CANON_MAX];
  int n = store_rotation_canonical(h->run, rot->step, rot->from, to, canon);
  pulse_status st =
      pulse_sign_verify(rot->from, canon, (size_t)n, rot->signature);
  if (st != PULSE_OK)
    return pulse_fail_context(st, "head: key rotation signature");
  rot->present = 1;
  return PULSE_OK;
}

static store_head_fields fields_of(const pulse_store_head *h) {
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.step = h->step;
  f.digest = h->digest;
  f.patches = h->patches;
  f.npatches = h->npatches;
  f.anchors = h->anchors;
  f.nanchors = h->nanchors;
  f.version = h->version;
  memcpy(f.run, h->run, sizeof f.run);
  f.published = h->published;
  f.has_previous = h->has_previous;
  f.previous_step = h->previous_step;
  memcpy(f.previous_sha256, h->previous_sha256, 32);
  return f;
}

static pulse_status parse_into(pulse_store_head *h) {
  pulse_json_limits lim = PULSE_JSON_LIMITS_INIT;
  lim.max_depth = 8;
  lim.max_bytes = 64 * h->size + (1u << 20);
  pulse_json_doc *doc = NULL;
  pulse_status st =
      pulse_json_parse((const char *)h->bytes, h->size, &lim, &doc);
  if (st != PULSE_OK)
    return pulse_fail_context(st, "head");
  const pulse_json *root = pulse_json_doc_root(doc);
  const char *fmt;
  size_t fmt_len;
  if (root->type != PULSE_JSON_OBJECT) {
    st = pulse_fail(PULSE_ERR_JSON, "head: not a JSON object");
    goto done;
  }
  if ((st = no_duplicates(root, "head")) != PULSE_OK ||
      (st = get_str(root, "format", "head", &fmt, &fmt_len)) != PULSE_OK)
    goto done;
  if (fmt_len == strlen(PULSE_STORE_HEAD_FORMAT) &&
      memcmp(fmt, PULSE_STORE_HEAD_FORMAT, fmt_len) == 0) {
    h->version = 2;
  } else if (fmt_len == strlen(PULSE_STORE_HEAD_FORMAT_V1) &&
             memcmp(fmt, PULSE_STORE_HEAD_FORMAT_V1, fmt_len) == 0) {
    h->version = 1;
  } else {
    st = pulse_fail(PULSE_ERR_VERSION,
                    "head: format is not \"%s\" or \"%s\"",
                    PULSE_STORE_HEAD_FORMAT, PULSE_STORE_HEAD_FORMAT_V1);
    goto done;
  }
  if ((st = get_u64(root, "step", "head", &h->step)) != PULSE_OK ||
      (st = get_hex(root, "state_digest", "head", h->digest.bytes, 32)) !=
          PULSE_OK ||
      (h->version >= 2 && (st = parse_identity(root, h)) != PULSE_OK) ||
      (st = parse_list(root, "patches", PULSE_STORE_PATCH, &h->patches,
                       &h->npatches)) != PULSE_OK ||
      (st = parse_list(root, "anchors", PULSE_STORE_ANCHOR, &h->anchors,
                       &h->nanchors)) != PULSE_OK ||
      (st = check_shape(h)) != PULSE_OK)
    goto done;
  const pulse_json *pub = pulse_json_get(root, "public_key");
  const pulse_json *sig = pulse_json_get(root, "signature");
  if ((pub == NULL) != (sig == NULL)) {
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "head: a public key without a signature or the reverse");
    goto done;
  }
  if (pub != NULL) {
    if ((st = get_hex(root, "public_key", "head", h->pub, sizeof h->pub)) !=
            PULSE_OK ||
        (st = get_hex(root, "signature", "head", h->sig, sizeof h->sig)) !=
            PULSE_OK)
      goto done;
    store_head_fields f = fields_of(h);
    pulse_buffer canon = {NULL, 0};
    st = store_head_canonical(&f, h->pub, &canon);
    if (st == PULSE_OK)
      st = pulse_sign_verify(h->pub, canon.data, canon.size, h->sig);
    pulse_buffer_free(&canon);
    if (st != PULSE_OK) {
      st = pulse_fail_context(st, "head: signature");
      goto done;
    }
    h->is_signed = 1;
  }
  st = parse_rotation(root, h);
done:
  pulse_json_doc_free(doc);
  return st;
}

pulse_status pulse_store_head_parse(const uint8_t *bytes, size_t size,
                                    pulse_store_head **out) {
  if (out == NULL || (bytes == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "head: NULL argument");
  *out = NULL;
  if (size > PULSE_STORE_MAX_HEAD_BYTES)
    return pulse_fail(PULSE_ERR_OVERFLOW, "head: %zu bytes (at most %zu)", size,
                      PULSE_STORE_MAX_HEAD_BYTES);
  pulse_store_head *h = calloc(1, sizeof *h);
  if (h == NULL || (h->bytes = malloc(size + 1)) == NULL) {
    free(h);
    return pulse_fail(PULSE_ERR_NOMEM, "head: %zu bytes", size);
  }
  if (size)
    memcpy(h->bytes, bytes, size);
  h->bytes[size] = 0;
  h->size = size;
  pulse_status st = parse_into(h);
  if (st != PULSE_OK) {
    pulse_store_head_free(h);
    return st;
  }
  *out = h;
  return PULSE_OK;
}

void pulse_store_head_free(pulse_store_head *head) {
  if (head == NULL)
    return;
  free(head->bytes);
  free(head->patches);
  free(head->anchors);
  free(head);
}

uint64_t pulse_store_head_step(const pulse_store_head *head) {
  return head->step;
}

const pulse_state_digest *
pulse_store_head_state_digest(const pulse_store_head *head) {
  return &head->digest;
}

int pulse_store_head_signer(const pulse_store_head *head,
                            uint8_t pub[PULSE_KEY_BYTES]) {
  if (!head->is_signed)
    return 0;
  if (pub != NULL)
    memcpy(pub, head->pub, PULSE_KEY_BYTES);
  return 1;
}

unsigned pulse_store_head_version(const pulse_store_head *head) {
  return head->version;
}

int pulse_store_head_run(const pulse_store_head *head,
                         uint8_t run[PULSE_STORE_RUN_BYTES]) {
  if (head->version < 2)
    return 0;
  if (run != NULL)
    memcpy(run, head->run, PULSE_STORE_RUN_BYTES);
  return 1;
}

uint64_t pulse_store_head_published(const pulse_store_head *head) {
  return head->version >= 2 ? head->published : 0;
}

int pulse_store_head_rotation(const pulse_store_head *head,
                              uint8_t from[PULSE_KEY_BYTES],
                              uint64_t *step) {
  if (!head->rotation.present)
    return 0;
  if (from != NULL)
    memcpy(from, head->rotation.from, PULSE_KEY_BYTES);
  if (step != NULL)
    *step = head->rotation.step;
  return 1;
}

int pulse_store_head_previous(const pulse_store_head *head, uint64_t *step,
                              uint8_t sha256[32]) {
  if (!head->has_previous)
    return 0;
  if (step != NULL)
    *step = head->previous_step;
  if (sha256 != NULL)
    memcpy(sha256, head->previous_sha256, 32);
  return 1;
}

pulse_status store_run_new(uint8_t run[PULSE_STORE_RUN_BYTES]) {
  if (RAND_bytes(run, PULSE_STORE_RUN_BYTES) != 1)
    return pulse_fail(PULSE_ERR_INTERNAL,
                      "store: no random bytes for a run identity");
  return PULSE_OK;
}

size_t pulse_store_head_patch_count(const pulse_store_head *head) {
  return head->npatches;
}

const pulse_store_object *pulse_store_head_patch(const pulse_store_head *head,
                                                 size_t i) {
  return i < head->npatches ? &head->patches[i] : NULL;
}

size_t pulse_store_head_anchor_count(const pulse_store_head *head) {
  return head->nanchors;
}

const pulse_store_object *pulse_store_head_anchor(const pulse_store_head *head,
                                                  size_t i) {
  return i < head->nanchors ? &head->anchors[i] : NULL;
}

uint64_t pulse_store_head_oldest_step(const pulse_store_head *head) {
  return head->anchors[0].step;
}

int pulse_store_head_has_step(const pulse_store_head *head, uint64_t step) {
  return is_retained(head, step);
}

const uint8_t *pulse_store_head_bytes(const pulse_store_head *head,
                                      size_t *size) {
  if (size != NULL)
    *size = head->size;
  return head->bytes;
}
