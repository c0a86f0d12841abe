/* shard_patch.c - lays out a sharded step's patch from chunk streams that
 * several ranks coded (docs/formats/patch.md, "Layout"): the header and
 * tensor table written as pulse_patch_encode writes them, the streams in
 * table then chunk order, into memory or straight into a file (so that
 * the encoding rank never holds the streams and the patch together). The
 * bytes equal a single publisher's because each stream does (the tests
 * compare them). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "patch_impl.h"
#include "shard_impl.h"
#include "status_impl.h"

static void write_entry(pulse_bytebuf *table, const pulse_tensor_info *info, uint64_t numel,
                        uint32_t log2, const pulse_tensor_digest *base,
                        const pulse_tensor_digest *target, const shard_coded *items, size_t n,
                        uint64_t changed, uint64_t section) {
  size_t name_len = strlen(info->name);
  pulse_bytebuf_varint(table, name_len);
  pulse_bytebuf_put(table, info->name, name_len);
  pulse_bytebuf_byte(table, (uint8_t)PULSE_DTYPE_BF16);
  pulse_bytebuf_byte(table, (uint8_t)info->ndim);
  for (uint32_t d = 0; d < info->ndim; d++)
    pulse_bytebuf_varint(table, info->shape[d]);
  pulse_bytebuf_varint(table, changed);
  pulse_bytebuf_varint(table, section);
  pulse_bytebuf_u64(table, base->a);
  pulse_bytebuf_u64(table, base->b);
  pulse_bytebuf_u64(table, target->a);
  pulse_bytebuf_u64(table, target->b);
  if (changed == 0)
    return;
  uint64_t chunks = ((numel - 1) >> log2) + 1;
  size_t next = 0;
  for (uint64_t c = 0; c < chunks; c++) {
    int here = next < n && items[next].chunk == c;
    pulse_bytebuf_varint(table, here ? items[next].changes : 0);
    pulse_bytebuf_varint(table, here ? items[next].size : 0);
    next += here;
  }
}

/* Where the patch goes: memory (buf) or a file (fd >= 0). */
typedef struct {
  pulse_bytebuf *buf;
  int fd;
  const char *path;
} patch_sink;

static pulse_status sink_put(patch_sink *k, const void *data, size_t n) {
  if (k->fd < 0) {
    pulse_bytebuf_put(k->buf, data, n);
    return k->buf->failed ? pulse_fail(PULSE_ERR_NOMEM, "shard: patch") : PULSE_OK;
  }
  const uint8_t *p = data;
  while (n > 0) {
    ssize_t w = write(k->fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return pulse_fail(PULSE_ERR_IO, "shard: patch %s: %s", k->path, strerror(errno));
    p += w, n -= (size_t)w;
  }
  return PULSE_OK;
}

static pulse_status patch_write(const pulse_encode_opts *opts, unsigned version,
                                const pulse_tensor_info *table, size_t count,
                                const pulse_tensor_digest *base,
                                const pulse_tensor_digest *target, const shard_coded *items,
                                size_t nitems, patch_sink *sink, uint64_t *size) {
  pulse_tensor_info *infos = malloc((count ? count : 1) * sizeof *infos);
  if (infos == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: patch");
  pulse_bytebuf tab = PULSE_BYTEBUF_INIT, head = PULSE_BYTEBUF_INIT;
  uint64_t body = 0, total = 0;
  size_t at = 0;
  pulse_status st = PULSE_OK;
  for (size_t t = 0; t < count && st == PULSE_OK; t++) {
    infos[t] = table[t];
    infos[t].dtype = PULSE_DTYPE_BF16;
    uint64_t numel = 0, changed = 0, section = 0;
    st = pulse_shape_numel(table[t].shape, table[t].ndim, &numel);
    size_t first = at;
    for (; at < nitems && items[at].tensor == t; at++)
      changed += items[at].changes, section += items[at].size;
    if (st == PULSE_OK)
      write_entry(&tab, &table[t], numel, opts->chunk_log2, &base[t], &target[t], items + first,
                  at - first, changed, section);
    body += section, total += changed;
  }
  if (st == PULSE_OK && (tab.failed || tab.size > UINT32_MAX))
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: the patch's tensor table");
  pulse_state_digest base_state, target_state;
  if (st == PULSE_OK)
    st = pulse_state_digest_compute(infos, base, count, &base_state);
  if (st == PULSE_OK)
    st = pulse_state_digest_compute(infos, target, count, &target_state);
  if (st == PULSE_OK) {
    size_t whole = PULSE_PATCH_FIXED_HEADER + tab.size + (size_t)body;
    *size = whole;
    if (sink->fd < 0) /* the whole patch at once: no copies while it grows */
      (void)pulse_bytebuf_reserve(sink->buf, whole, whole); /* a failure shows below */
    pulse_bytebuf_put(&head, PULSE_PATCH_MAGIC, 8);
    pulse_bytebuf_u16(&head, (uint16_t)version);
    pulse_bytebuf_byte(&head, (uint8_t)opts->pos_model);
    pulse_bytebuf_byte(&head, (uint8_t)opts->chunk_log2);
    pulse_bytebuf_u32(&head, (uint32_t)tab.size);
    pulse_bytebuf_u64(&head, opts->step);
    pulse_bytebuf_u64(&head, opts->base_step);
    pulse_bytebuf_put(&head, base_state.bytes, 32);
    pulse_bytebuf_put(&head, target_state.bytes, 32);
    pulse_bytebuf_u64(&head, (uint64_t)count);
    pulse_bytebuf_u64(&head, total);
    pulse_bytebuf_u64(&head, body);
    st = head.failed ? pulse_fail(PULSE_ERR_NOMEM, "shard: patch") : PULSE_OK;
  }
  if (st == PULSE_OK)
    st = sink_put(sink, head.data, head.size);
  if (st == PULSE_OK)
    st = sink_put(sink, tab.data, tab.size);
  for (size_t i = 0; i < nitems && st == PULSE_OK; i++)
    st = sink_put(sink, items[i].bytes, items[i].size);
  pulse_bytebuf_free(&tab);
  pulse_bytebuf_free(&head);
  free(infos);
  return st;
}

pulse_status shard_patch_write(const pulse_encode_opts *opts, unsigned version,
                               const pulse_tensor_info *table, size_t count,
                               const pulse_tensor_digest *base, const pulse_tensor_digest *target,
                               const shard_coded *items, size_t nitems, const char *path,
                               pulse_buffer *patch) {
  pulse_bytebuf buf = PULSE_BYTEBUF_INIT;
  patch_sink sink = {&buf, -1, path};
  if (path != NULL &&
      (sink.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
    return pulse_fail(PULSE_ERR_IO, "shard: patch %s: %s", path, strerror(errno));
  uint64_t size = 0;
  pulse_status st = patch_write(opts, version, table, count, base, target, items, nitems, &sink,
                                &size);
  if (sink.fd >= 0) {
    if (st == PULSE_OK && fdatasync(sink.fd) != 0)
      st = pulse_fail(PULSE_ERR_IO, "shard: patch %s: %s", path, strerror(errno));
    close(sink.fd);
    if (st != PULSE_OK)
      unlink(path);
  }
  if (st == PULSE_OK) {
    patch->data = buf.data; /* NULL for a file */
    patch->size = (size_t)size;
  } else {
    pulse_bytebuf_free(&buf);
  }
  return st;
}
