/* serve_testutil.h - what the serving layer's hostile-client tests share:
 * a store the server can serve heads from. */
#ifndef PULSE_SERVE_TESTUTIL_H
#define PULSE_SERVE_TESTUTIL_H

#include <criterion/criterion.h>
#include <string.h>

#include "files_testutil.h"
#include "store_impl.h"

/* A store whose head names one (absent) anchor: the server serves heads
 * without looking at objects. */
static inline char *ts_store_with_head(void) {
  char *dir = tu_make_dir();
  pulse_store_object a;
  memset(&a, 0, sizeof a);
  a.kind = PULSE_STORE_ANCHOR;
  a.size = 1000;
  a.sha256[0] = 1;
  store_object_set_path(&a);
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.anchors = &a;
  f.nanchors = 1;
  f.version = 2;
  f.run[0] = 7;
  f.published = 1764633600;
  pulse_buffer json = {NULL, 0};
  cr_assert_eq(store_head_serialize(&f, NULL, &json), PULSE_OK, "%s",
               pulse_error_detail());
  char path[4096];
  snprintf(path, sizeof path, "%s/head.json", dir);
  cr_assert_eq(tu_write(path, json.data, json.size), 0);
  pulse_buffer_free(&json);
  return dir;
}

#endif
