/* forge_testutil.h - forged heads for the hostile-source tests: a store's
 * head rewritten with other object sizes and signed again with the
 * publisher's key, so a subscriber that pins the key takes it. */
#ifndef PULSE_FORGE_TESTUTIL_H
#define PULSE_FORGE_TESTUTIL_H

#include <string.h>

#include "inf_testutil.h"
#include "store_impl.h"

/* Rewrites the head of store `dir`: every anchor's size, and every
 * patch's when `patches_too`, becomes `size`; signed again by `key`. */
static inline void forge_object_sizes(const char *dir, const pulse_sign_key *key,
                                      int patches_too, uint64_t size) {
  pulse_store_head *h;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK, "%s",
               pulse_error_detail());
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.step = h->step;
  f.digest = h->digest;
  for (size_t i = 0; patches_too && i < h->npatches; i++)
    h->patches[i].size = size;
  for (size_t i = 0; i < h->nanchors; i++)
    h->anchors[i].size = size;
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
  pulse_buffer json = {NULL, 0};
  cr_assert_eq(store_head_serialize(&f, key, &json), PULSE_OK, "%s",
               pulse_error_detail());
  char path[4096];
  snprintf(path, sizeof path, "%s/head.json", dir);
  cr_assert_eq(tu_write(path, json.data, json.size), 0);
  pulse_buffer_free(&json);
  pulse_store_head_free(h);
}

#endif
