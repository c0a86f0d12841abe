/* sub_cache.c - the cache folder, laid out as a store (docs/protocols/sync.md) so that
 * a pulse server can serve it: objects/<sha256>.* (verified downloads),
 * head.json (the newest verified head, bytes as fetched, written after the
 * objects it needs and atomically), plus trusted-key (trust on first use)
 * and the partial downloads objects/.<sha256>.part*. The server's own
 * catch-up cache (catchup/) is left to the server. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_file.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "sub_impl.h"

static void load_trusted_key(pulse_sub *sub) {
  char path[4096], line[128];
  snprintf(path, sizeof path, "%s/trusted-key", sub->cache_dir);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return;
  if (fgets(line, sizeof line, f) != NULL) {
    size_t n = strcspn(line, "\r\n");
    if (sub_unhex(line, n, sub->key, 32) == 0)
      sub->have_key = 1;
    else
      PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s is not a key: ignored",
                   path);
  }
  fclose(f);
}

/* Removes temporary files an interrupted atomic write left next to
 * head.json (".head.json.tmp-*"). */
static void remove_temporaries(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, ".head.json.", 11) == 0 ||
        strncmp(e->d_name, ".trusted-key.", 13) == 0)
      unlinkat(dirfd(d), e->d_name, 0);
  closedir(d);
}

pulse_status sub_cache_open(pulse_sub *sub) {
  char path[4096];
  PULSE_TRY(sub_mkdir(sub->cache_dir));
  snprintf(path, sizeof path, "%s/" PULSE_STORE_OBJECTS_DIR, sub->cache_dir);
  PULSE_TRY(sub_mkdir(path));
  remove_temporaries(sub->cache_dir);
  if (!sub->have_key && sub->opts.trust_first_use)
    load_trusted_key(sub);
  sub->cache_head_step = PULSE_SUB_NO_STEP;
  pulse_store_head *h = NULL;
  pulse_status st = pulse_store_head_load(sub->cache_dir, &h);
  if (st == PULSE_OK) {
    if (sub->have_key && sub_head_key_check(sub, h) != PULSE_OK)
      PULSE_LOG_AT(
          PULSE_LOG_WARN,
          "subscriber: %s/head.json is not signed by the publisher key: "
          "ignored",
          sub->cache_dir);
    else {
      sub->cache_head_step = pulse_store_head_step(h);
      sub_head_hold_run(sub, h);
      /* A rotation the worker took before a restart holds again. */
      sub_head_follow_key(sub, h);
    }
    pulse_store_head_free(h);
  } else if (st != PULSE_ERR_NOT_FOUND) {
    PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s/head.json: %s: ignored",
                 sub->cache_dir, pulse_error_detail());
  }
  return PULSE_OK;
}

/* 1 when the head names the object with this hex hash. */
static int named_hex(const pulse_store_head *h, const char *hex) {
  char mine[65];
  for (size_t i = 0; i < pulse_store_head_patch_count(h); i++) {
    store_hex(pulse_store_head_patch(h, i)->sha256, 32, mine);
    if (strncmp(mine, hex, 64) == 0)
      return 1;
  }
  for (size_t i = 0; i < pulse_store_head_anchor_count(h); i++) {
    store_hex(pulse_store_head_anchor(h, i)->sha256, 32, mine);
    if (strncmp(mine, hex, 64) == 0)
      return 1;
  }
  return 0;
}

static int is_hex64(const char *s) {
  for (int i = 0; i < 64; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return 0;
  return 1;
}

/* Removes objects and partial downloads the head no longer names. */
static void prune(pulse_sub *sub) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/" PULSE_STORE_OBJECTS_DIR, sub->cache_dir);
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const char *name = e->d_name;
    const char *hex = NULL;
    if (strlen(name) > 64 && is_hex64(name) &&
        (strcmp(name + 64, ".pulse") == 0 ||
         strcmp(name + 64, ".safetensors") == 0))
      hex = name;
    else if (name[0] == '.' && strlen(name) >= 70 && is_hex64(name + 1) &&
             strncmp(name + 65, ".part", 5) == 0)
      hex = name + 1;
    if (hex != NULL && !named_hex(sub->head, hex))
      unlinkat(dirfd(d), name, 0);
  }
  closedir(d);
  /* A relay's section indexes (sections/<sha256>, sub_partial.c). */
  snprintf(dir, sizeof dir, "%s/sections", sub->cache_dir);
  if ((d = opendir(dir)) != NULL) {
    for (struct dirent *e; (e = readdir(d)) != NULL;)
      if (strlen(e->d_name) == 64 && is_hex64(e->d_name) && !named_hex(sub->head, e->d_name))
        unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
  }
  sub_object_forget(sub);
}

pulse_status sub_cache_save_head(pulse_sub *sub) {
  if (sub->head == NULL)
    return PULSE_OK;
  uint64_t step = pulse_store_head_step(sub->head);
  char path[4096];
  snprintf(path, sizeof path, "%s/" PULSE_STORE_HEAD_FILE, sub->cache_dir);
  size_t n;
  const uint8_t *bytes = pulse_store_head_bytes(sub->head, &n);
  /* Unchanged: nothing to write (a cheap check: same size and bytes). */
  FILE *f = fopen(path, "rb");
  if (f != NULL) {
    uint8_t *old = malloc(n + 1);
    size_t got = old ? fread(old, 1, n + 1, f) : 0;
    int same = old != NULL && got == n && memcmp(old, bytes, n) == 0;
    free(old);
    fclose(f);
    if (same) {
      sub->cache_head_step = step;
      return PULSE_OK;
    }
  }
  PULSE_TRY(pulse_file_write_atomic(path, bytes, n));
  sub->cache_head_step = step;
  prune(sub);
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_HEAD_SAVED;
  sub_emit(sub, &ev);
  return PULSE_OK;
}
