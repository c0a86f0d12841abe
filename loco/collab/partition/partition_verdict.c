/* partition_verdict.c - what each trainer saw of each reduced range of a
 * partitioned round (PLVD, docs/protocols/loco-collaboration.md "Partitioned averaging"), and the
 * rule every trainer applies to all of them to drop the same owners. */
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "pulse_loco_partition.h"
#include "status_impl.h"

#define VERDICT_MAGIC 0x44564C50u /* "PLVD" */
#define VERDICT_HEADER 28u
#define VERDICT_ITEM 13u

pulse_status pulse_loco_verdict_encode(const pulse_loco_verdict *v,
                                       pulse_buffer *out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco verdict: NULL output");
  out->data = NULL, out->size = 0;
  if (v == NULL || v->count > PULSE_LOCO_PART_MAX)
    return pulse_fail(PULSE_ERR_ARG, "loco verdict: bad verdict");
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_bytebuf_u32(&b, VERDICT_MAGIC);
  pulse_bytebuf_byte(&b, PULSE_LOCO_VERDICT_VERSION);
  pulse_bytebuf_byte(&b, 0);
  pulse_bytebuf_u16(&b, 0);
  pulse_bytebuf_u32(&b, v->peer);
  pulse_bytebuf_u32(&b, v->attempt);
  pulse_bytebuf_u64(&b, v->round);
  pulse_bytebuf_u32(&b, v->count);
  for (uint32_t k = 0; k < v->count; k++) {
    if (v->items[k].flags & ~PULSE_LOCO_VERDICT_FLAGS_KNOWN) {
      pulse_bytebuf_free(&b);
      return pulse_fail(PULSE_ERR_ARG, "loco verdict: unknown flags");
    }
    pulse_bytebuf_u32(&b, v->items[k].owner);
    pulse_bytebuf_byte(&b, v->items[k].flags);
    pulse_bytebuf_u64(&b, v->items[k].blob_digest);
  }
  if (b.failed) {
    pulse_bytebuf_free(&b);
    return pulse_fail(PULSE_ERR_NOMEM, "loco verdict");
  }
  out->data = b.data, out->size = b.size;
  return PULSE_OK;
}

pulse_status pulse_loco_verdict_decode(const uint8_t *data, size_t size,
                                       pulse_loco_verdict *out) {
  if (out == NULL || (data == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "loco verdict: NULL argument");
  if (size < 4)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco verdict: %zu bytes", size);
  pulse_reader r = pulse_reader_make(data, size);
  if ((uint32_t)pulse_reader_le(&r, 4) != VERDICT_MAGIC)
    return pulse_fail(PULSE_ERR_MAGIC, "loco verdict: bad magic");
  if (size < VERDICT_HEADER)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco verdict: header of %zu bytes",
                      size);
  unsigned version = pulse_reader_u8(&r);
  uint64_t reserved = pulse_reader_le(&r, 3);
  uint32_t peer = (uint32_t)pulse_reader_le(&r, 4),
           attempt = (uint32_t)pulse_reader_le(&r, 4);
  uint64_t round = pulse_reader_le(&r, 8);
  uint64_t count = pulse_reader_le(&r, 4);
  if (version != PULSE_LOCO_VERDICT_VERSION)
    return pulse_fail(PULSE_ERR_VERSION, "loco verdict: version %u", version);
  if (reserved != 0 || count > PULSE_LOCO_PART_MAX)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco verdict: reserved bits or %llu ranges",
                      (unsigned long long)count);
  if (r.left != count * VERDICT_ITEM)
    return pulse_fail(r.left < count * VERDICT_ITEM ? PULSE_ERR_TRUNCATED
                                                    : PULSE_ERR_TRAILING,
                      "loco verdict: %zu bytes for %llu ranges", r.left,
                      (unsigned long long)count);
  out->peer = peer, out->attempt = attempt, out->round = round;
  out->count = (uint32_t)count;
  for (uint32_t k = 0; k < count; k++) {
    out->items[k].owner = (uint32_t)pulse_reader_le(&r, 4);
    out->items[k].flags = pulse_reader_u8(&r);
    out->items[k].blob_digest = pulse_reader_le(&r, 8);
    if (out->items[k].flags & ~PULSE_LOCO_VERDICT_FLAGS_KNOWN)
      return pulse_fail(PULSE_ERR_CORRUPT, "loco verdict: unknown flags");
  }
  return PULSE_OK;
}

pulse_status pulse_loco_verdicts_offenders(const pulse_loco_plan *plan,
                                           uint64_t round, uint32_t attempt,
                                           const pulse_loco_verdict *v,
                                           size_t n, uint32_t *offenders,
                                           size_t *noff) {
  if (plan == NULL || (v == NULL && n > 0) || offenders == NULL ||
      noff == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco verdicts: NULL argument");
  *noff = 0;
  uint8_t seen[PULSE_LOCO_PART_MAX];
  memset(seen, 0, sizeof seen);
  for (size_t i = 0; i < n; i++) {
    int p = pulse_loco_plan_index(plan, v[i].peer);
    if (v[i].round != round || v[i].attempt != attempt ||
        v[i].count != plan->count || p < 0 || seen[p])
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco verdicts: verdict of peer %u does not fit "
                        "round %llu attempt %u",
                        v[i].peer, (unsigned long long)round, attempt);
    seen[p] = 1;
    for (uint32_t k = 0; k < plan->count; k++)
      if (v[i].items[k].owner != plan->ids[k])
        return pulse_fail(PULSE_ERR_CORRUPT,
                          "loco verdicts: peer %u names other owners",
                          v[i].peer);
  }
  for (uint32_t k = 0; k < plan->count; k++) {
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
      const pulse_loco_verdict_item *it = &v[i].items[k];
      bad = (it->flags & (PULSE_LOCO_VERDICT_BAD_BLOB |
                          PULSE_LOCO_VERDICT_BAD_RECEIPT |
                          PULSE_LOCO_VERDICT_MISMATCH)) != 0 ||
            it->blob_digest != v[0].items[k].blob_digest;
    }
    if (bad)
      offenders[(*noff)++] = plan->ids[k];
  }
  return PULSE_OK;
}
