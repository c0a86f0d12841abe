/* shard_anchor.c - a sharded step's state digest and its anchor: written
 * by every rank into one file, or read by every rank part by part (its
 * bytes of each part of the file, for a multipart upload), both along the
 * one layout of shard_anchor_impl.h (pulse_pub_shard.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytebuf_impl.h"
#include "shard_anchor_impl.h"
#include "shard_impl.h"
#include "status_impl.h"

pulse_status pulse_pub_shard_state_digest(const pulse_tensor_info *table, size_t tensor_count,
                                          uint32_t chunk_log2, const pulse_buffer *parts,
                                          size_t nparts, int target, pulse_state_digest *out) {
  if (table == NULL || tensor_count == 0 || out == NULL || (parts == NULL && nparts))
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  uint8_t id[32];
  PULSE_TRY(shard_table_id(table, tensor_count, id));
  pulse_tensor_digest *d = calloc(tensor_count, sizeof *d);
  pulse_tensor_info *info = malloc(tensor_count * sizeof *info);
  if (d == NULL || info == NULL) {
    free(d), free(info);
    return pulse_fail(PULSE_ERR_NOMEM, "shard: state digest");
  }
  shard_parts_view v;
  pulse_status st = shard_view_parts(parts, nparts, table, tensor_count, id, chunk_log2, &v);
  for (size_t b = 0; st == PULSE_OK && b < v.nblocks; b++) {
    const shard_part_block *x = &v.blocks[b];
    d[x->tensor].a += target ? x->target.a : x->base.a;
    d[x->tensor].b += target ? x->target.b : x->base.b;
  }
  if (st == PULSE_OK)
    shard_view_free(&v);
  for (size_t t = 0; t < tensor_count; t++)
    info[t] = table[t], info[t].dtype = PULSE_DTYPE_BF16;
  if (st == PULSE_OK)
    st = pulse_state_digest_compute(info, d, tensor_count, out);
  free(d), free(info);
  return st;
}

/* Where this rank's bytes come from: the snapshot, with the pending
 * step's deltas over it where asked (one cursor per block: a block's
 * pieces come in increasing order, so each cursor only moves forward). */
typedef struct {
  const pulse_pub_shard *s;
  int pending;
  shard_own_cursor *cur;
} anchor_source;

static pulse_status source_open(anchor_source *src, const pulse_pub_shard *s,
                                int pending) {
  src->s = s;
  src->pending = pending;
  src->cur = NULL;
  if (!pending)
    return PULSE_OK;
  src->cur = malloc((s->nblocks ? s->nblocks : 1) * sizeof *src->cur);
  if (src->cur == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: anchor");
  for (size_t b = 0; b < s->nblocks; b++)
    shard_own_open(&src->cur[b], &s->geom[b], &s->changes[b]);
  return PULSE_OK;
}

/* Bytes [byte, byte + size) of block b's elements (row-major, as the
 * file holds them) into dst. */
static void source_fill(anchor_source *src, size_t b, uint64_t byte,
                        uint64_t size, uint8_t *dst) {
  const uint16_t *snap = src->s->snap[b];
  memcpy(dst, (const uint8_t *)snap + byte, size);
  if (!src->pending)
    return;
  shard_own_cursor *c = &src->cur[b];
  uint64_t end = byte + size;
  shard_own_seek(c, &src->s->changes[b], byte / 2);
  for (; c->has && 2 * c->idx < end; shard_own_next(c)) {
    uint16_t v = (uint16_t)(snap[c->idx] + c->delta);
    if (2 * c->idx >= byte &&
        2 * c->idx + 2 <= end) { /* the element is whole here */
      memcpy(dst + 2 * c->idx - byte, &v, 2);
      continue;
    }
    uint8_t two[2];
    memcpy(two, &v, 2); /* the snapshot's byte order, as copied above */
    for (uint64_t k = 0; k < 2; k++)
      if (2 * c->idx + k >= byte && 2 * c->idx + k < end)
        dst[2 * c->idx + k - byte] = two[k];
    if (2 * c->idx + 2 > end)
      break; /* its other byte starts the next piece */
  }
}

static void source_close(anchor_source *src) {
  free(src->cur);
  src->cur = NULL;
}

static pulse_status pwrite_all(int fd, const void *data, size_t n, uint64_t off,
                               const char *path) {
  const uint8_t *p = data;
  while (n > 0) {
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return pulse_fail(PULSE_ERR_IO, "shard: anchor %s: %s", path, strerror(errno));
    p += w, n -= (size_t)w, off += (uint64_t)w;
  }
  return PULSE_OK;
}

/* The pending step's values go out through a buffer of at most this. */
#define ANCHOR_WRITE_WINDOW ((uint64_t)4 << 20)

typedef struct {
  anchor_source src;
  int fd;
  const char *path;
  uint8_t *buf;
} anchor_writer;

static pulse_status write_piece(void *ctx, const shard_anchor_piece *p) {
  anchor_writer *w = ctx;
  if (!w->src.pending)
    return pwrite_all(w->fd,
                      (const uint8_t *)w->src.s->snap[p->block] + p->byte,
                      p->size, p->file_at, w->path);
  for (uint64_t done = 0; done < p->size;) {
    uint64_t n = p->size - done < ANCHOR_WRITE_WINDOW ? p->size - done
                                                      : ANCHOR_WRITE_WINDOW;
    source_fill(&w->src, p->block, p->byte + done, n, w->buf);
    PULSE_TRY(pwrite_all(w->fd, w->buf, n, p->file_at + done, w->path));
    done += n;
  }
  return PULSE_OK;
}

static pulse_status anchor_args(const pulse_pub_shard *s, int pending) {
  if (s == NULL || !s->have_snapshot || (pending && !s->pending))
    return pulse_fail(PULSE_ERR_ARG,
                      "shard: anchor: NULL, no snapshot or nothing pending");
  return PULSE_OK;
}

pulse_status pulse_pub_shard_anchor_write(const pulse_pub_shard *s, const char *path,
                                          uint64_t step, const pulse_state_digest *digest,
                                          int pending) {
  if (path == NULL || digest == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: anchor: NULL path or digest");
  PULSE_TRY(anchor_args(s, pending));
  pulse_bytebuf head = PULSE_BYTEBUF_INIT;
  uint64_t data_size = 0;
  shard_anchor_layout l;
  PULSE_TRY(shard_anchor_header_build(s->info, s->count, step, digest, &head,
                                      &data_size));
  pulse_status st =
      shard_anchor_layout_make(s->info, s->count, s->geom, s->nblocks, &l);
  if (st != PULSE_OK) {
    pulse_bytebuf_free(&head);
    return st;
  }
  anchor_writer w = {{0}, -1, path, NULL};
  st = source_open(&w.src, s, pending);
  if (st == PULSE_OK && pending &&
      (w.buf = malloc(ANCHOR_WRITE_WINDOW)) == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: anchor");
  if (st == PULSE_OK &&
      (w.fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) < 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: anchor %s: %s", path, strerror(errno));
  if (st == PULSE_OK && ftruncate(w.fd, (off_t)(head.size + data_size)) != 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: anchor %s: %s", path, strerror(errno));
  if (st == PULSE_OK)
    st = pwrite_all(w.fd, head.data, head.size, 0, path);
  /* This rank's blocks, run by run, at their places. */
  if (st == PULSE_OK)
    st =
        shard_anchor_walk(&l, head.size, head.size, data_size, write_piece, &w);
  if (st == PULSE_OK && fdatasync(w.fd) != 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: anchor %s: %s", path, strerror(errno));
  if (w.fd >= 0)
    close(w.fd);
  free(w.buf);
  source_close(&w.src);
  shard_anchor_layout_free(&l);
  pulse_bytebuf_free(&head);
  return st;
}

pulse_status pulse_pub_shard_anchor_header(const pulse_pub_shard *s,
                                           uint64_t step,
                                           const pulse_state_digest *digest,
                                           pulse_buffer *header,
                                           uint64_t *file_size) {
  if (s == NULL || digest == NULL || header == NULL || file_size == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: anchor header: NULL argument");
  pulse_bytebuf head = PULSE_BYTEBUF_INIT;
  uint64_t data_size = 0;
  PULSE_TRY(shard_anchor_header_build(s->info, s->count, step, digest, &head,
                                      &data_size));
  if (data_size > UINT64_MAX - head.size) {
    pulse_bytebuf_free(&head);
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "shard: anchor of more than 2^64 bytes");
  }
  *file_size = head.size + data_size;
  return pulse_bytebuf_take(&head, header);
}

typedef struct {
  anchor_source src;
  uint64_t size; /* counted, then filled */
  uint8_t *out;
} anchor_reader;

static pulse_status count_piece(void *ctx, const shard_anchor_piece *p) {
  ((anchor_reader *)ctx)->size += p->size;
  return PULSE_OK;
}

static pulse_status read_piece(void *ctx, const shard_anchor_piece *p) {
  anchor_reader *r = ctx;
  source_fill(&r->src, p->block, p->byte, p->size, r->out + r->size);
  r->size += p->size;
  return PULSE_OK;
}

pulse_status pulse_pub_shard_anchor_read(const pulse_pub_shard *s, int pending,
                                         uint64_t header_size, uint64_t off,
                                         uint64_t len, pulse_buffer *out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: anchor read: NULL out");
  PULSE_TRY(anchor_args(s, pending));
  shard_anchor_layout l;
  PULSE_TRY(
      shard_anchor_layout_make(s->info, s->count, s->geom, s->nblocks, &l));
  anchor_reader r;
  memset(&r, 0, sizeof r);
  pulse_status st =
      shard_anchor_walk(&l, header_size, off, len, count_piece, &r);
  if (st == PULSE_OK && r.size > SIZE_MAX)
    st = pulse_fail(PULSE_ERR_OVERFLOW,
                    "shard: anchor read of %" PRIu64 " bytes", r.size);
  uint64_t size = r.size;
  if (st == PULSE_OK && (r.out = malloc(size ? (size_t)size : 1)) == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: anchor read of %" PRIu64 " bytes",
                    size);
  if (st == PULSE_OK)
    st = source_open(&r.src, s, pending);
  r.size = 0;
  if (st == PULSE_OK)
    st = shard_anchor_walk(&l, header_size, off, len, read_piece, &r);
  source_close(&r.src);
  shard_anchor_layout_free(&l);
  if (st != PULSE_OK) {
    free(r.out);
    return st;
  }
  out->data = r.out;
  out->size = (size_t)size;
  return PULSE_OK;
}
