/* shard_step_anchor.c - a step's anchor made in the bucket by every rank
 * (shard_bucket_anchor_make, shard_step_impl.h), for ranks that share no
 * folder: the plan of python/pulse/shard_parts.py, with the step's files in
 * the bucket as the channel. The file is cut in file order into parts of
 * part_bytes; each is assembled at the rank owning most of its bytes (rank
 * 0 holds the header, ties to the lowest rank) from the bytes the others
 * own of it, which they put as "bytes-K-R" before anything else (so no rank
 * waits on one that waits on it). Pass 1 hashes the parts in file order,
 * the SHA-256 state going from a part's rank to the next part's through
 * "sha-K-R"; S3 names an upload when it begins, and the name is the hash.
 * Pass 2: rank 0 begins the upload at objects/<sha256>.safetensors and says
 * its id ("upload-0"); each rank assembles its parts again (from the same
 * bytes files) and puts them, then says their ETags ("etags-R"); rank 0
 * completes it and checks its size. A rank holds one part at a time beside
 * its blocks. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_sha256.h"
#include "shard_impl.h"
#include "shard_step_impl.h"
#include "status_impl.h"

#define MAX_PARTS 10000u /* S3's limit on the parts of one upload */

typedef struct {
  uint64_t off, len;
  int up; /* the rank that assembles and puts it */
} anchor_part;

typedef struct {
  const shard_attempt *a;
  const pulse_pub_shard *s;
  pulse_upload *bucket;
  int pending;
  pulse_buffer header;
  uint64_t file_size;
  pulse_pub_block **blocks; /* per rank, from the step's parts */
  size_t *nblocks;
  anchor_part *parts;
  uint64_t *owned; /* owned[k * world + r] */
  size_t nparts;
} anchor_job;

static uint64_t header_in(const anchor_job *j, const anchor_part *p) {
  uint64_t end = p->off + p->len;
  uint64_t h = j->header.size;
  return p->off >= h ? 0 : (end < h ? end : h) - p->off;
}

/* The same on every rank: it follows from the table, every rank's blocks
 * and the header's size. */
static pulse_status plan_make(anchor_job *j, uint64_t part_bytes) {
  int world = j->a->world;
  uint64_t min = (j->file_size + MAX_PARTS - 1) / MAX_PARTS;
  if (part_bytes < min)
    part_bytes = min;
  j->nparts = (size_t)((j->file_size + part_bytes - 1) / part_bytes);
  j->parts = calloc(j->nparts ? j->nparts : 1, sizeof *j->parts);
  j->owned =
      calloc(j->nparts ? j->nparts * (size_t)world : 1, sizeof *j->owned);
  if (j->parts == NULL || j->owned == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: the anchor's plan");
  for (size_t k = 0; k < j->nparts; k++) {
    anchor_part *p = &j->parts[k];
    p->off = (uint64_t)k * part_bytes;
    p->len =
        j->file_size - p->off < part_bytes ? j->file_size - p->off : part_bytes;
    uint64_t *owned = &j->owned[k * (size_t)world], sum = header_in(j, p);
    for (int r = 0; r < world; r++) {
      PULSE_TRY(pulse_pub_anchor_owned(j->s->info, j->s->count, j->blocks[r],
                                       j->nblocks[r], j->header.size, p->off,
                                       p->len, &owned[r]));
      sum += owned[r];
    }
    if (sum != p->len)
      return pulse_fail(
          PULSE_ERR_ARG,
          "shard: the ranks' blocks own %" PRIu64 " of the %" PRIu64
          " bytes of the anchor at %" PRIu64 " (a tiling error)",
          sum - header_in(j, p), p->len - header_in(j, p), p->off);
    p->up = 0;
    for (int r = 1; r < world; r++)
      if (owned[r] > owned[p->up] + (p->up == 0 ? header_in(j, p) : 0))
        p->up = r;
  }
  return PULSE_OK;
}

/* This rank's bytes of part k, checked against the plan. */
static pulse_status own_bytes(const anchor_job *j, size_t k,
                              pulse_buffer *out) {
  const anchor_part *p = &j->parts[k];
  PULSE_TRY(pulse_pub_shard_anchor_read(j->s, j->pending, j->header.size,
                                        p->off, p->len, out));
  uint64_t want = j->owned[k * (size_t)j->a->world + (size_t)j->a->rank];
  if (out->size != want) {
    pulse_buffer_free(out);
    return pulse_fail(
        PULSE_ERR_ARG,
        "shard: this rank read %zu bytes of the anchor at %" PRIu64
        ", its blocks own %" PRIu64,
        out->size, p->off, want);
  }
  return PULSE_OK;
}

/* Part k on its rank: the header's bytes, its own and every owner's. */
static pulse_status assemble(const anchor_job *j, size_t k, uint8_t *buf) {
  const anchor_part *p = &j->parts[k];
  const shard_attempt *a = j->a;
  uint64_t h = header_in(j, p);
  if (h > 0)
    memcpy(buf, j->header.data + p->off, (size_t)h);
  pulse_status st = PULSE_OK;
  for (int r = 0; r < a->world && st == PULSE_OK; r++) {
    if (j->owned[k * (size_t)a->world + (size_t)r] == 0)
      continue;
    pulse_buffer got = {0};
    if (r == a->rank) {
      st = own_bytes(j, k, &got);
    } else {
      char what[64], name[128];
      snprintf(what, sizeof what, "bytes-%zu-%d", k, r);
      shard_attempt_name(a, name, sizeof name, what);
      st = shard_attempt_wait(a, name, &got);
    }
    if (st == PULSE_OK)
      st = pulse_pub_anchor_place(j->s->info, j->s->count, j->blocks[r],
                                  j->nblocks[r], j->header.size, p->off, p->len,
                                  got.data, got.size, buf);
    pulse_buffer_free(&got);
  }
  return st;
}

static pulse_status put_named(const anchor_job *j, const char *what,
                              const void *data, size_t n) {
  char name[128];
  shard_attempt_name(j->a, name, sizeof name, what);
  return j->a->m->put(j->a->m, name, data, n);
}

static pulse_status get_named(const anchor_job *j, const char *what,
                              pulse_buffer *out) {
  char name[128];
  shard_attempt_name(j->a, name, sizeof name, what);
  return shard_attempt_wait(j->a, name, out);
}

/* Pass 1: the SHA-256 of the file, on rank 0 at the end. */
static pulse_status hash_parts(const anchor_job *j, uint8_t *buf,
                               uint8_t sha[32]) {
  const shard_attempt *a = j->a;
  pulse_sha256_state state;
  pulse_sha256_begin(&state);
  pulse_status st = PULSE_OK;
  char what[64];
  int last_up = j->parts[j->nparts - 1].up;
  for (size_t k = 0; k < j->nparts && st == PULSE_OK; k++) {
    const anchor_part *p = &j->parts[k];
    if (p->up != a->rank)
      continue;
    if (k > 0 && j->parts[k - 1].up != a->rank) {
      pulse_buffer got = {0};
      snprintf(what, sizeof what, "sha-%zu-%d", k - 1, j->parts[k - 1].up);
      st = get_named(j, what, &got);
      if (st == PULSE_OK && got.size != sizeof state.bytes)
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "shard: the anchor's hash state after part %zu "
                        "has %zu bytes",
                        k - 1, got.size);
      if (st == PULSE_OK)
        memcpy(state.bytes, got.data, sizeof state.bytes);
      pulse_buffer_free(&got);
    }
    if (st == PULSE_OK)
      st = assemble(j, k, buf);
    if (st == PULSE_OK)
      st = pulse_sha256_add(&state, buf, (size_t)p->len);
    int next = k + 1 < j->nparts ? j->parts[k + 1].up : 0; /* rank 0 ends it */
    if (st == PULSE_OK && next != a->rank) {
      snprintf(what, sizeof what, "sha-%zu-%d", k, a->rank);
      st = put_named(j, what, state.bytes, sizeof state.bytes);
    }
  }
  if (st == PULSE_OK && a->rank == 0) {
    if (last_up != 0) {
      pulse_buffer got = {0};
      snprintf(what, sizeof what, "sha-%zu-%d", j->nparts - 1, last_up);
      st = get_named(j, what, &got);
      if (st == PULSE_OK && got.size != sizeof state.bytes)
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "shard: the anchor's last hash state has %zu bytes",
                        got.size);
      if (st == PULSE_OK)
        memcpy(state.bytes, got.data, sizeof state.bytes);
      pulse_buffer_free(&got);
    }
    if (st == PULSE_OK)
      st = pulse_sha256_end(&state, sha);
  }
  return st;
}

/* Pass 2: this rank's parts into the upload; their ETags said. */
static pulse_status put_parts(const anchor_job *j, uint8_t *buf,
                              const char *rel, const char *id) {
  pulse_bytebuf etags = PULSE_BYTEBUF_INIT;
  pulse_status st = PULSE_OK;
  for (size_t k = 0; k < j->nparts && st == PULSE_OK; k++) {
    if (j->parts[k].up != j->a->rank)
      continue;
    char etag[256];
    st = assemble(j, k, buf);
    /* A test's fault: a part that fails once the upload has begun. */
    if (st == PULSE_OK && getenv("PULSE_TEST_SHARD_PART_FAIL") != NULL)
      st = pulse_fail(PULSE_ERR_IO,
                      "shard: part %zu of the anchor failed on purpose "
                      "(PULSE_TEST_SHARD_PART_FAIL)",
                      k + 1);
    if (st == PULSE_OK)
      st = pulse_upload_part_put(j->bucket, rel, id, (uint32_t)(k + 1), buf,
                                 (size_t)j->parts[k].len, etag, sizeof etag);
    if (st == PULSE_OK) {
      char line[300];
      int n = snprintf(line, sizeof line, "%zu %s\n", k + 1, etag);
      pulse_bytebuf_put(&etags, line, (size_t)n);
    }
  }
  if (st == PULSE_OK && etags.failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: the anchor's ETags");
  char what[32];
  snprintf(what, sizeof what, "etags-%d", j->a->rank);
  if (st == PULSE_OK)
    st = put_named(j, what,
                   etags.data != NULL ? etags.data : (const uint8_t *)"",
                   etags.size);
  pulse_bytebuf_free(&etags);
  return st;
}

/* Rank 0: every rank's ETags into etags[k] (strings in `text`, freed by
 * the caller). */
static pulse_status gather_etags(const anchor_job *j, char **etags,
                                 pulse_buffer *text) {
  pulse_status st = PULSE_OK;
  for (int r = 0; r < j->a->world && st == PULSE_OK; r++) {
    char what[32];
    snprintf(what, sizeof what, "etags-%d", r);
    st = get_named(j, what, &text[r]);
    /* Lines "K ETAG\n", made NUL-ended in place. */
    char *at = (char *)text[r].data, *end = at + text[r].size;
    while (st == PULSE_OK && at < end) {
      char *nl = memchr(at, '\n', (size_t)(end - at)),
           *sp = memchr(at, ' ', (size_t)(end - at));
      char *stop = NULL;
      unsigned long long k = sp != NULL ? strtoull(at, &stop, 10) : 0;
      if (nl == NULL || sp == NULL || sp > nl || stop != sp || k < 1 ||
          k > j->nparts || j->parts[k - 1].up != r || etags[k - 1] != NULL) {
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "shard: rank %d's ETags of the anchor's parts "
                        "do not parse",
                        r);
        break;
      }
      *nl = '\0';
      etags[k - 1] = sp + 1;
      at = nl + 1;
    }
  }
  for (size_t k = 0; k < j->nparts && st == PULSE_OK; k++)
    if (etags[k] == NULL)
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "shard: no ETag for part %zu of the anchor", k + 1);
  return st;
}

static pulse_status finish(const anchor_job *j, shard_bucket_anchor *out) {
  char **etags = calloc(j->nparts, sizeof *etags);
  pulse_buffer *text = calloc((size_t)j->a->world, sizeof *text);
  pulse_status st =
      etags && text ? PULSE_OK : pulse_fail(PULSE_ERR_NOMEM, "shard: finish");
  if (st == PULSE_OK)
    st = gather_etags(j, etags, text);
  if (st == PULSE_OK)
    st = pulse_upload_part_finish(j->bucket, out->rel, out->id,
                                  (const char *const *)etags, j->nparts);
  uint64_t there = 0;
  if (st == PULSE_OK)
    st = pulse_upload_object_size(j->bucket, out->rel, &there);
  if (st == PULSE_OK && there != j->file_size)
    st = pulse_fail(PULSE_ERR_IO,
                    "shard: the bucket holds %" PRIu64 " bytes of the anchor "
                    "%s, not %" PRIu64,
                    there, out->rel, j->file_size);
  for (int r = 0; text && r < j->a->world; r++)
    pulse_buffer_free(&text[r]);
  free(text), free(etags);
  return st;
}

pulse_status shard_bucket_anchor_make(const shard_attempt *a,
                                      const pulse_pub_shard *s,
                                      pulse_upload *bucket, uint64_t part_bytes,
                                      const pulse_buffer *parts,
                                      const pulse_state_digest *target,
                                      int pending, shard_bucket_anchor *out) {
  memset(out, 0, sizeof *out);
  anchor_job j;
  memset(&j, 0, sizeof j);
  j.a = a;
  j.s = s;
  j.bucket = bucket;
  j.pending = pending;
  uint8_t *buf = NULL;
  pulse_status st = pulse_pub_shard_anchor_header(s, a->step, target, &j.header,
                                                  &j.file_size);
  if (st == PULSE_OK)
    st = shard_parts_blocks(s->info, s->count, parts, (size_t)a->world,
                            &j.blocks, &j.nblocks);
  if (st == PULSE_OK)
    st = plan_make(&j, part_bytes ? part_bytes
                                  : PULSE_PUB_SHARD_PART_BYTES_DEFAULT);
  /* Others' bytes first: an assembling rank then waits on no one who waits. */
  for (size_t k = 0; k < j.nparts && st == PULSE_OK; k++) {
    if (j.parts[k].up == a->rank ||
        j.owned[k * (size_t)a->world + (size_t)a->rank] == 0)
      continue;
    pulse_buffer mine = {0};
    char what[64];
    snprintf(what, sizeof what, "bytes-%zu-%d", k, a->rank);
    st = own_bytes(&j, k, &mine);
    if (st == PULSE_OK)
      st = put_named(&j, what,
                     mine.data != NULL ? mine.data : (const uint8_t *)"",
                     mine.size);
    pulse_buffer_free(&mine);
  }
  uint64_t most = 0;
  for (size_t k = 0; k < j.nparts; k++)
    most = j.parts[k].len > most ? j.parts[k].len : most;
  if (st == PULSE_OK && (buf = malloc(most ? (size_t)most : 1)) == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: a part of the anchor");
  if (st == PULSE_OK)
    st = hash_parts(&j, buf, out->sha256);
  /* Rank 0 names and begins the upload; the others learn its id. */
  pulse_buffer id = {0};
  if (st == PULSE_OK && a->rank == 0) {
    static const char hex[] = "0123456789abcdef";
    char sha_hex[65];
    for (int i = 0; i < 32; i++)
      sha_hex[2 * i] = hex[out->sha256[i] >> 4],
                  sha_hex[2 * i + 1] = hex[out->sha256[i] & 15];
    sha_hex[64] = '\0';
    snprintf(out->rel, sizeof out->rel, "objects/%s.safetensors", sha_hex);
    out->size = j.file_size;
    st = pulse_upload_part_begin(bucket, out->rel, out->id, sizeof out->id);
    if (st == PULSE_OK) {
      char text[sizeof out->rel + sizeof out->id + 2];
      int n = snprintf(text, sizeof text, "%s %s", out->rel, out->id);
      st = put_named(&j, "upload-0", text, (size_t)n);
    }
  } else if (st == PULSE_OK) {
    st = get_named(&j, "upload-0", &id);
    char *sp = st == PULSE_OK ? memchr(id.data, ' ', id.size) : NULL;
    size_t rl = sp != NULL ? (size_t)(sp - (char *)id.data) : 0;
    if (st == PULSE_OK &&
        (sp == NULL || rl >= sizeof out->rel ||
         id.size - rl - 1 >= sizeof out->id || id.size - rl - 1 == 0))
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "shard: rank 0's upload of the anchor does not parse");
    if (st == PULSE_OK) {
      memcpy(out->rel, id.data, rl);
      memcpy(out->id, sp + 1, id.size - rl - 1);
    }
  }
  pulse_buffer_free(&id);
  if (st == PULSE_OK)
    st = put_parts(&j, buf, out->rel, out->id);
  if (st == PULSE_OK && a->rank == 0)
    st = finish(&j, out);
  if (a->rank != 0)
    out->id[0] = '\0'; /* only rank 0 aborts */
  free(buf);
  free(j.parts), free(j.owned);
  shard_parts_blocks_free(j.blocks, j.nblocks, (size_t)a->world);
  pulse_buffer_free(&j.header);
  return st;
}
