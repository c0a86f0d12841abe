/* sub_region_index.c - what pulse_sub_attach_region checks each new block
 * against: is its tensor attached already, does its memory overlap another
 * block's. An engine's mixture-of-experts layers give tens of thousands of
 * blocks (layers x experts x 3 projections), so a scan of every attached
 * block per attach (O(n^2) in all) is too slow: the blocks attached so far
 * are kept sorted by name and by address (binary search), except a short
 * tail of the newest ones (a linear scan), merged into the sorted arrays
 * whenever it reaches TAIL. In all O(n log n + n * TAIL + n^2 / TAIL)
 * steps, the last term integer compares and copies of 16 or 24 bytes in
 * the merges: 44,544 blocks (DeepSeek-V3's 58 layers x 256 experts x 3)
 * attach in a quarter of a second on a 2-core machine
 * (tests/inference_side/test_region_index.c).
 *
 * Invariant: the sorted blocks never overlap one another (each was checked
 * before it was attached), so sorted by start they are sorted by end too,
 * and a new block can overlap only the last one starting at or before its
 * start or the first one starting after it. Empty blocks own no memory and
 * are not in the address order. */
#include <stdlib.h>
#include <string.h>

#include "status_impl.h"
#include "sub_impl.h"

#define TAIL 64

typedef struct {
  uintptr_t lo, hi; /* bytes [lo, hi) of a block */
  const char *name;
} span;

/* Names sort by a hash first, so that the merges compare integers, not
 * names that share long prefixes (model.layers.N.mlp.experts.). */
typedef struct {
  uint64_t hash;
  const char *name;
} key;

struct sub_region_index {
  key *names;         /* of targets [0, merged), by (hash, name) */
  span *spans;        /* of the non-empty ones among them, by lo */
  size_t nspans;
  size_t merged;
};

void sub_region_block_span(const sub_target *t, uintptr_t *lo, uintptr_t *hi) {
  *lo = (uintptr_t)t->data;
  *hi = t->rows && t->cols ? (uintptr_t)(t->data + (t->rows - 1) * t->stride + t->cols) : *lo;
}

static uint64_t name_hash(const char *name) { /* FNV-1a */
  uint64_t h = 14695981039346656037ull;
  for (const unsigned char *c = (const unsigned char *)name; *c; c++)
    h = (h ^ *c) * 1099511628211ull;
  return h;
}

static int key_cmp(const void *a, const void *b) {
  const key *x = a, *y = b;
  if (x->hash != y->hash)
    return x->hash < y->hash ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int overlap(uintptr_t lo, uintptr_t hi, const span *s) {
  return lo < hi && s->lo < s->hi && lo < s->hi && s->lo < hi;
}

pulse_status sub_region_index_check(const pulse_sub *sub, const char *name, uintptr_t lo,
                                    uintptr_t hi) {
  const struct sub_region_index *ix = sub->region_index;
  size_t merged = ix != NULL ? ix->merged : 0;
  key k = {name_hash(name), name};
  if (ix != NULL && merged > 0 &&
      bsearch(&k, ix->names, merged, sizeof *ix->names, key_cmp) != NULL)
    return pulse_fail(PULSE_ERR_ARG, "attach region: '%s' is attached already", name);
  if (ix != NULL && lo < hi) {
    size_t a = 0, b = ix->nspans; /* the first span starting after lo */
    while (a < b) {
      size_t mid = a + (b - a) / 2;
      if (ix->spans[mid].lo <= lo)
        a = mid + 1;
      else
        b = mid;
    }
    const span *hit = a > 0 && overlap(lo, hi, &ix->spans[a - 1]) ? &ix->spans[a - 1]
                      : a < ix->nspans && overlap(lo, hi, &ix->spans[a]) ? &ix->spans[a]
                                                                         : NULL;
    if (hit != NULL)
      return pulse_fail(PULSE_ERR_ARG, "attach region '%s': its block overlaps the one of '%s'",
                        name, hit->name);
  }
  for (size_t i = merged; i < sub->ntargets; i++) {
    const sub_target *o = &sub->targets[i];
    if (strcmp(o->name, name) == 0)
      return pulse_fail(PULSE_ERR_ARG, "attach region: '%s' is attached already", name);
    span s = {0, 0, o->name};
    sub_region_block_span(o, &s.lo, &s.hi);
    if (overlap(lo, hi, &s))
      return pulse_fail(PULSE_ERR_ARG, "attach region '%s': its block overlaps the one of '%s'",
                        name, o->name);
  }
  return PULSE_OK;
}

/* Sorts `tail` (count entries of `size` bytes) and merges it with the
 * sorted `base` (n entries) into `out` (room for n + count). */
static void merge(char *out, const char *base, size_t n, char *tail, size_t count, size_t size,
                  int (*cmp)(const void *, const void *)) {
  if (count > 1)
    qsort(tail, count, size, cmp);
  size_t i = 0, j = 0, k = 0;
  while (i < n || j < count) {
    int from_base = j == count || (i < n && cmp(base + i * size, tail + j * size) <= 0);
    memcpy(out + k++ * size, from_base ? base + i++ * size : tail + j++ * size, size);
  }
}

void sub_region_index_note(pulse_sub *sub) {
  struct sub_region_index *ix = sub->region_index;
  if (ix == NULL && (ix = sub->region_index = calloc(1, sizeof *ix)) == NULL)
    return; /* short of memory: the tail scan still checks every block, slower */
  size_t count = sub->ntargets - ix->merged;
  if (count < TAIL)
    return;
  key *names = malloc(count * sizeof *names);
  span *spans = malloc(count * sizeof *spans);
  key *all_names = malloc((ix->merged + count) * sizeof *all_names);
  span *all_spans = malloc((ix->nspans + count) * sizeof *all_spans);
  if (names == NULL || spans == NULL || all_names == NULL || all_spans == NULL) {
    free(names), free(spans), free(all_names), free(all_spans);
    return; /* as above: the tail stays, and is merged at a later attach */
  }
  size_t nspans = 0;
  for (size_t i = 0; i < count; i++) {
    const sub_target *t = &sub->targets[ix->merged + i];
    names[i] = (key){name_hash(t->name), t->name};
    span s = {0, 0, t->name};
    sub_region_block_span(t, &s.lo, &s.hi);
    if (s.lo < s.hi)
      spans[nspans++] = s;
  }
  merge((char *)all_names, (const char *)ix->names, ix->merged, (char *)names, count,
        sizeof *names, key_cmp);
  merge((char *)all_spans, (const char *)ix->spans, ix->nspans, (char *)spans, nspans,
        sizeof *spans, span_cmp);
  free(ix->names), free(ix->spans), free(names), free(spans);
  ix->names = all_names;
  ix->spans = all_spans;
  ix->merged += count;
  ix->nspans += nspans;
}

void sub_region_index_free(struct sub_region_index *ix) {
  if (ix == NULL)
    return;
  free(ix->names);
  free(ix->spans);
  free(ix);
}
