/* shard_anchor.c - a sharded step's state digest and its anchor, written
 * by every rank into one file (pulse_pub_shard.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytebuf_impl.h"
#include "endian_impl.h"
#include "safetensors_impl.h"
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

pulse_status pulse_pub_shard_anchor_write(const pulse_pub_shard *s, const char *path,
                                          uint64_t step, const pulse_state_digest *digest,
                                          int pending) {
  if (s == NULL || path == NULL || digest == NULL || !s->have_snapshot ||
      (pending && !s->pending))
    return pulse_fail(PULSE_ERR_ARG, "shard: anchor: NULL, no snapshot or nothing pending");
  /* The header of the single publisher's anchor (publisher_head.c). */
  static const uint16_t dummy = 0;
  pulse_st_write_tensor *t = calloc(s->count, sizeof *t);
  uint64_t *offset = calloc(s->count, sizeof *offset);
  if (t == NULL || offset == NULL) {
    free(t), free(offset);
    return pulse_fail(PULSE_ERR_NOMEM, "shard: anchor");
  }
  uint64_t at = 0;
  for (size_t i = 0; i < s->count; i++) {
    t[i].name = s->info[i].name;
    t[i].dtype = PULSE_DTYPE_BF16;
    t[i].ndim = s->info[i].ndim;
    memcpy(t[i].shape, s->info[i].shape, sizeof t[i].shape);
    t[i].data = &dummy; /* not read */
    uint64_t n = 0;
    (void)pulse_shape_numel(s->info[i].shape, s->info[i].ndim, &n);
    offset[i] = at;
    at += 2 * n;
  }
  char step_s[32], digest_s[65];
  snprintf(step_s, sizeof step_s, "%" PRIu64, step);
  pulse_state_digest_hex(digest, digest_s);
  pulse_st_kv meta[2] = {{"step", step_s}, {"state_digest", digest_s}};
  pulse_bytebuf head = PULSE_BYTEBUF_INIT;
  uint64_t data_size = 0;
  pulse_status st = st_header_build(t, s->count, meta, 2, 0, &head, &data_size);
  free(t);
  int fd = -1;
  if (st == PULSE_OK && (fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) < 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: anchor %s: %s", path, strerror(errno));
  if (st == PULSE_OK && ftruncate(fd, (off_t)(head.size + data_size)) != 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: anchor %s: %s", path, strerror(errno));
  if (st == PULSE_OK)
    st = pwrite_all(fd, head.data, head.size, 0, path);
  /* This rank's blocks, run by run; the pending step's values over the
   * snapshot's where asked (a run is copied to a buffer first). */
  uint16_t *buf = NULL;
  for (size_t b = 0; b < s->nblocks && st == PULSE_OK; b++) {
    const shard_geom *g = &s->geom[b];
    shard_own_cursor c;
    shard_own_open(&c, g, &s->changes[b]);
    if (pending && g->run_len > 0 &&
        (buf = realloc(buf, g->run_len * 2)) == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: anchor");
      break;
    }
    for (uint64_t r = 0; r < g->runs && st == PULSE_OK; r++) {
      const uint16_t *src = s->snap[b] + r * g->run_len;
      if (pending) { /* the changes are in block order: run order */
        uint64_t at = r * g->run_len;
        memcpy(buf, src, g->run_len * 2);
        for (; c.has && c.idx < at + g->run_len; shard_own_next(&c))
          buf[c.idx - at] = (uint16_t)(buf[c.idx - at] + c.delta);
        src = buf;
      }
      st = pwrite_all(fd, src, g->run_len * 2,
                      head.size + offset[g->tensor] + 2 * shard_run_pos(g, r), path);
    }
  }
  free(buf);
  if (st == PULSE_OK && fdatasync(fd) != 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: anchor %s: %s", path, strerror(errno));
  if (fd >= 0)
    close(fd);
  free(head.data), free(offset);
  return st;
}
