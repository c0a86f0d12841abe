/* sub_partial.c - the partial route of a patch (issue 34): a worker whose
 * targets hold some of the patch's tensors fetches only their sections.
 *
 * The patch's section index (sections/<sha256>, written by the
 * publisher, codec/store/store_sections_impl.h) is signed by the
 * publisher's key and names the patch's SHA-256 and size, the hash of its
 * header and table, and the hash of every tensor's section. The worker
 * takes it from the head's source, checks its signature (by the key the
 * head was trusted with, or the key that head rotated from: a patch
 * written before a rotation), fetches the header and table with one Range
 * and checks their hash, then the sections of the tensors its targets
 * hold (adjacent ones in one Range, up to PARTIAL_PARALLEL requests at
 * once) and checks each before anything decodes it. The bytes go into an
 * anonymous mapping laid out as the whole patch, so the table's offsets
 * hold and pages of sections never fetched are never touched.
 *
 * Taken when nothing of the patch is cached, the targets hold fewer
 * tensors than the table, and the header, table and needed sections are
 * at most PARTIAL_SHARE_PCT % of the patch. Any failure (no index: a store
 * from before it, or a relay without it; a bad signature or hash; a short
 * or wrong range) falls back to the whole object, verified whole; a server
 * that ignores Range answers the first range with the whole patch, which
 * is then verified whole and used. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pulse_file.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "store_sections_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"
#include "sub_partial_impl.h"

/* The share of the patch, header and table included, under which the
 * partial route is taken: it costs two round trips more than a whole
 * fetch (the index, then the header and table), worth it from a fifth of
 * the bytes saved. An EP rank of a model that is mostly experts needs
 * about 1/EP of them plus the rest (test_moe.py: about 70% at EP=2). */
#define PARTIAL_SHARE_PCT 80u
/* Below this size a patch is fetched whole: the extra requests cost more
 * than the bytes they save. */
#define PARTIAL_MIN_BYTES ((uint64_t)16 << 10)
/* Range requests in flight at once. */
#define PARTIAL_PARALLEL 4u
/* After a patch whose needed share was over the threshold (or whose table
 * the targets may hold whole), the next ones are fetched whole without
 * asking for their index (the targets did not change). */
#define PARTIAL_SKIP_AFTER_DECLINE 16u

int sub_partial_wanted(pulse_sub *sub, const pulse_store_object *o, int count_down) {
  if (sub->opts.mirror || sub->ntargets == 0 ||
      (sub->mem != SUB_MEM_HOST && sub->mem != SUB_MEM_REGION) ||
      o->size < PARTIAL_MIN_BYTES || sub_object_have(sub, o) != 0)
    return 0;
  if (sub->partial_skip > 0) {
    sub->partial_skip -= count_down ? 1 : 0;
    return 0;
  }
  return 1;
}

void sub_partial_free(sub_partial *part) {
  if (part->map != NULL)
    munmap(part->map, part->size);
  part->map = NULL;
  part->size = 0;
}

/* Why the route was not taken, logged; 0 (the caller fetches whole). */
static int decline(const pulse_store_object *o, const char *why) {
  PULSE_LOG_AT(PULSE_LOG_INFO, "subscriber: %s: fetched whole (%s)", o->path, why);
  return 0;
}

static void rel_of(const pulse_sub *sub, size_t u, const char *path, char *out,
                   size_t cap) {
  snprintf(out, cap, "%s%s", sub->url_static[u] ? "" : "v1/", path);
}

/* The index: parsed, signed by a key the head lets it be signed by, and
 * naming this patch. raw (may be NULL): its bytes (the caller frees). */
static pulse_status get_index(pulse_sub *sub, size_t u, const pulse_store_object *o,
                              store_sections *s, pulse_buffer *raw) {
  char path[PULSE_STORE_PATH_MAX + 16], rel[PULSE_STORE_PATH_MAX + 32];
  store_sections_path(o->sha256, path, sizeof path);
  rel_of(sub, u, path, rel, sizeof rel);
  pulse_fetch_xfer *x = malloc(sizeof *x);
  if (x == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "%s", path);
  pulse_fetch_xfer_init(x, NULL);
  x->max_bytes = store_sections_size(o->size / 32 + 1);
  pulse_status st = sub_fetch_mem(sub, u, rel, x, path);
  if (st == PULSE_OK && x->mem.failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "%s", path);
  if (st == PULSE_OK)
    st = store_sections_parse(x->mem.data, x->mem.size, s);
  if (st == PULSE_OK && raw != NULL) {
    raw->size = x->mem.size;
    raw->data = malloc(raw->size);
    if (raw->data == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "%s", path);
    else
      memcpy(raw->data, x->mem.data, raw->size);
  }
  pulse_fetch_xfer_release(x);
  free(x);
  if (st != PULSE_OK) {
    store_sections_free(s);
    return st;
  }
  uint8_t signer[PULSE_KEY_BYTES], from[PULSE_KEY_BYTES];
  int head_signed = pulse_store_head_signer(sub->head, signer);
  int rotated = pulse_store_head_rotation(sub->head, from, NULL);
  if (head_signed && !s->is_signed)
    st = pulse_fail(PULSE_ERR_CORRUPT, "%s is not signed", path);
  else if (head_signed && memcmp(s->pub, signer, PULSE_KEY_BYTES) != 0 &&
           !(rotated && memcmp(s->pub, from, PULSE_KEY_BYTES) == 0))
    st = pulse_fail(PULSE_ERR_CORRUPT, "%s is signed by a key the head does not name",
                    path);
  else if (!head_signed && sub->have_key)
    st = pulse_fail(PULSE_ERR_CORRUPT, "%s: the head is not signed", path);
  else if (memcmp(s->patch_sha256, o->sha256, 32) != 0 || s->patch_size != o->size)
    st = pulse_fail(PULSE_ERR_CORRUPT, "%s names another patch", path);
  if (st != PULSE_OK) {
    store_sections_free(s);
    if (raw != NULL)
      pulse_buffer_free(raw);
  }
  return st;
}

/* A range of the patch [from, to) with the sections k0..k1-1 it holds. */
typedef struct {
  uint64_t from, to;
  size_t k0, k1;
} part_range;

/* Fetches ranges r[0..n) of the patch into part->map, each checked against
 * its hashes (sections k0..k1-1; the prefix when k1 == 0) before it is
 * copied. *whole: a server that ignored the Range sent the whole patch
 * (only asked of the first range, with `allow_whole`), now in the map
 * and verified whole. */
static pulse_status get_ranges(pulse_sub *sub, size_t u, const pulse_store_object *o,
                               const store_sections *s, const uint64_t *off,
                               const part_range *r, size_t n, sub_partial *part,
                               int allow_whole, int *whole) {
  char rel[PULSE_STORE_PATH_MAX + 32];
  rel_of(sub, u, o->path, rel, sizeof rel);
  pulse_fetch_xfer *xs = calloc(PARTIAL_PARALLEL, sizeof *xs);
  if (xs == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "%s: ranges", o->path);
  pulse_status st = PULSE_OK;
  for (size_t b = 0; b < n && st == PULSE_OK; b += PARTIAL_PARALLEL) {
    size_t m = n - b < PARTIAL_PARALLEL ? n - b : PARTIAL_PARALLEL;
    pulse_fetch_xfer *run[PARTIAL_PARALLEL];
    for (size_t j = 0; j < m; j++) {
      pulse_fetch_xfer *x = &xs[j];
      pulse_fetch_xfer_init(x, NULL);
      sub_url(sub, u, rel, x->url, sizeof x->url);
      x->ranged = 1;
      x->range_from = r[b + j].from;
      x->range_to = r[b + j].to - 1;
      x->expect_total = o->size;
      x->max_bytes = allow_whole ? o->size : r[b + j].to - r[b + j].from;
      run[j] = x;
    }
    st = sub_http_run(sub, run, m, NULL);
    for (size_t j = 0; j < m && st == PULSE_OK; j++) {
      pulse_fetch_xfer *x = &xs[j];
      const part_range *g = &r[b + j];
      uint64_t len = g->to - g->from;
      if (!pulse_fetch_xfer_ok(x) || x->mem.failed) {
        /* One more try, retried as the options say. */
        pulse_fetch_xfer_release(x);
        pulse_fetch_xfer_init(x, NULL);
        x->ranged = 1;
        x->range_from = g->from;
        x->range_to = g->to - 1;
        x->expect_total = o->size;
        x->max_bytes = allow_whole ? o->size : len;
        st = sub_fetch_mem(sub, u, rel, x, o->path);
        if (st == PULSE_OK && x->mem.failed)
          st = pulse_fail(PULSE_ERR_NOMEM, "%s: range", o->path);
        if (st != PULSE_OK)
          break;
      }
      uint8_t sha[32];
      double t0 = sub_now();
      if (x->status == 200 && allow_whole && x->mem.size == o->size) {
        /* No Range support: the whole patch, verified whole. */
        store_sha256(x->mem.data, x->mem.size, sha);
        if (memcmp(sha, o->sha256, 32) != 0)
          st = pulse_fail(PULSE_ERR_CORRUPT, "%s: the body does not match its SHA-256",
                          o->path);
        else
          memcpy(part->map, x->mem.data, x->mem.size), *whole = 1;
        sub->t_verify += sub_now() - t0;
        break;
      }
      if (x->status != 206 || x->mem.size != len) {
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "%s: bytes %" PRIu64 "-%" PRIu64 ": HTTP %ld with %zu bytes",
                        o->path, g->from, g->to - 1, x->status, x->mem.size);
        break;
      }
      if (g->k1 == 0) {
        store_sha256(x->mem.data, (size_t)len, sha);
        if (memcmp(sha, s->prefix_sha256, 32) != 0)
          st = pulse_fail(PULSE_ERR_CORRUPT,
                          "%s: the header and table do not match the section index",
                          o->path);
      }
      for (size_t k = g->k0; k < g->k1 && st == PULSE_OK; k++) {
        store_sha256(x->mem.data + (off[k] - g->from), (size_t)(off[k + 1] - off[k]), sha);
        if (memcmp(sha, s->section_sha256[k], 32) != 0)
          st = pulse_fail(PULSE_ERR_CORRUPT,
                          "%s: tensor %zu's section does not match the section index",
                          o->path, k);
      }
      sub->t_verify += sub_now() - t0;
      if (st == PULSE_OK)
        memcpy(part->map + g->from, x->mem.data, (size_t)len);
    }
    for (size_t j = 0; j < m; j++)
      pulse_fetch_xfer_release(&xs[j]);
    if (*whole)
      break;
  }
  free(xs);
  return st;
}

/* The partial route proper; PULSE_OK with *p, or *p NULL when declined. */
static pulse_status partial(pulse_sub *sub, const pulse_store_object *o,
                            sub_partial *part, pulse_patch **p, int *declined) {
  size_t u = sub->head_url < sub->nurls ? sub->head_url : 0;
  store_sections s;
  memset(&s, 0, sizeof s);
  PULSE_TRY(get_index(sub, u, o, &s, NULL));
  pulse_status st = PULSE_OK;
  uint64_t *off = NULL;
  part_range *r = NULL;
  if (sub->ntargets >= s.count) {
    *declined = 1; /* the targets may hold every tensor */
    sub->partial_skip = PARTIAL_SKIP_AFTER_DECLINE;
    goto done;
  }
  if ((uint64_t)(size_t)o->size != o->size) {
    st = pulse_fail(PULSE_ERR_OVERFLOW, "%s: too large", o->path);
    goto done;
  }
  part->size = (size_t)o->size;
  part->map = mmap(NULL, part->size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (part->map == MAP_FAILED) {
    part->map = NULL;
    st = pulse_fail(PULSE_ERR_NOMEM, "%s: %zu bytes of address space", o->path, part->size);
    goto done;
  }
  int whole = 0;
  part_range head = {0, s.prefix, 0, 0};
  st = get_ranges(sub, u, o, &s, NULL, &head, 1, part, 1, &whole);
  if (st == PULSE_OK)
    st = pulse_patch_open(part->map, part->size, p);
  if (st != PULSE_OK || whole) {
    if (whole)
      PULSE_LOG_AT(PULSE_LOG_INFO, "subscriber: %s: the server sent it whole", o->path);
    goto done;
  }
  size_t count = pulse_patch_tensor_count(*p);
  off = malloc((count + 1) * sizeof *off);
  r = malloc((count + 1) * sizeof *r);
  if (off == NULL || r == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "%s: sections", o->path);
    goto done;
  }
  if (count != s.count)
    st = pulse_fail(PULSE_ERR_CORRUPT, "%s: %zu tensors, its index names %" PRIu64,
                    o->path, count, s.count);
  if (st == PULSE_OK)
    st = store_sections_offsets(*p, s.prefix, off);
  if (st == PULSE_OK && off[count] != o->size)
    st = pulse_fail(PULSE_ERR_CORRUPT, "%s: its sections do not end it", o->path);
  if (st != PULSE_OK)
    goto done;
  /* The sections the targets hold, adjacent ones as one range. */
  unsigned char *need = calloc(count + 1, 1);
  if (need == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "%s: sections", o->path);
    goto done;
  }
  for (size_t t = 0; t < sub->ntargets; t++) {
    size_t i;
    if (pulse_patch_tensor_find(*p, sub->targets[t].name, &i) == PULSE_OK)
      need[i] = 1;
  }
  uint64_t bytes = s.prefix;
  size_t nr = 0;
  for (size_t i = 0; i < count; i++) {
    if (!need[i] || off[i + 1] == off[i])
      continue;
    bytes += off[i + 1] - off[i];
    if (nr > 0 && r[nr - 1].to == off[i]) {
      r[nr - 1].to = off[i + 1];
      r[nr - 1].k1 = i + 1;
    } else {
      r[nr++] = (part_range){off[i], off[i + 1], i, i + 1};
    }
  }
  free(need);
  if (bytes > o->size / 100 * PARTIAL_SHARE_PCT) {
    *declined = 1;
    sub->partial_skip = PARTIAL_SKIP_AFTER_DECLINE;
    goto done;
  }
  st = get_ranges(sub, u, o, &s, off, r, nr, part, 0, &whole);
  part->sections = st == PULSE_OK;
  if (st == PULSE_OK)
    PULSE_LOG_AT(PULSE_LOG_INFO,
                 "subscriber: %s: %" PRIu64 " of %" PRIu64 " bytes fetched (%zu ranges)",
                 o->path, bytes, o->size, nr);
done:
  free(off);
  free(r);
  store_sections_free(&s);
  if (st != PULSE_OK || *declined) {
    pulse_patch_free(*p);
    *p = NULL;
    sub_partial_free(part);
  }
  return st;
}

int sub_partial_open(pulse_sub *sub, const pulse_store_object *o, sub_partial *part,
                     pulse_patch **p) {
  memset(part, 0, sizeof *part);
  *p = NULL;
  int declined = 0;
  pulse_status st = partial(sub, o, part, p, &declined);
  if (st == PULSE_OK && *p != NULL && (pulse_patch_step(*p) != o->step ||
                                       pulse_patch_base_step(*p) != o->base_step)) {
    pulse_patch_free(*p);
    *p = NULL;
    sub_partial_free(part);
    st = pulse_fail(PULSE_ERR_CORRUPT, "%s: its steps are not the head's", o->path);
  }
  if (st == PULSE_ERR_NOMEM || atomic_load(&sub->stop))
    return 0;
  if (st != PULSE_OK) {
    char why[600];
    snprintf(why, sizeof why, "%s", pulse_error_detail());
    return decline(o, why);
  }
  if (*p == NULL)
    return decline(o, "the targets need most of it");
  if (part->sections) {
    sub->partial_fetches++;
    pthread_mutex_lock(&sub->fig_lock);
    sub->fig.partial_fetches = sub->partial_fetches;
    pthread_mutex_unlock(&sub->fig_lock);
  }
  return 1;
}

void sub_partial_mirror(pulse_sub *sub, const pulse_store_object *o) {
  char rel[PULSE_STORE_PATH_MAX + 16], path[4096], folder[4096];
  store_sections_path(o->sha256, rel, sizeof rel);
  snprintf(path, sizeof path, "%s/%s", sub->cache_dir, rel);
  snprintf(folder, sizeof folder, "%s/" STORE_SECTIONS_DIR, sub->cache_dir);
  if (access(path, F_OK) == 0 || o->kind != PULSE_STORE_PATCH)
    return;
  size_t u = sub->head_url < sub->nurls ? sub->head_url : 0;
  store_sections s;
  pulse_buffer raw = {NULL, 0};
  pulse_status st = get_index(sub, u, o, &s, &raw);
  if (st == PULSE_OK) {
    store_sections_free(&s);
    st = sub_mkdir(folder);
  }
  if (st == PULSE_OK)
    st = pulse_file_write_atomic(path, raw.data, raw.size);
  if (st != PULSE_OK && st != PULSE_ERR_NOT_FOUND)
    PULSE_LOG_AT(PULSE_LOG_INFO, "subscriber: %s: not mirrored (%s)", rel, pulse_error_detail());
  pulse_buffer_free(&raw);
}
