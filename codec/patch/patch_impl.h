/* patch_impl.h - the parsed form of a patch (docs/formats/patch.md). */
#ifndef PULSE_PATCH_IMPL_H
#define PULSE_PATCH_IMPL_H

#include "pulse_codec.h"

struct pulse_chunk_scratch; /* chunk_impl.h */
struct pulse_v3_model;      /* chunk_v3_impl.h */

#define PULSE_PATCH_MAGIC "PULSEPCH"
#define PULSE_PATCH_FIXED_HEADER 120u
#define PULSE_CHUNK_LOG2_MIN 10u
#define PULSE_CHUNK_LOG2_MAX 30u

typedef struct {
  pulse_tensor_info info; /* info.name points into pulse_patch.names */
  uint64_t numel;
  uint64_t changed;
  uint64_t section_offset; /* from the start of the patch */
  uint64_t section_size;
  uint64_t chunk_count;
  uint64_t chunk_first; /* index of its first chunk in the chunk arrays
                           (only when changed > 0) */
  pulse_tensor_digest base_digest, target_digest;
} patch_tensor;

struct pulse_patch {
  const uint8_t *bytes;
  size_t size;
  uint64_t step, base_step;
  unsigned version; /* format version, PULSE_PATCH_VERSION_MIN.. */
  pulse_pos_model model;
  uint32_t chunk_log2;
  pulse_state_digest base_digest, target_digest;
  uint64_t total_changed;
  size_t count;
  patch_tensor *tensors;
  char *names;             /* NUL-terminated copies of every name */
  const patch_tensor **by_name; /* the tensors in name order (pulse_patch_tensor_find) */
  uint64_t chunks;         /* entries in the chunk arrays */
  uint32_t *chunk_changed; /* changes in each chunk */
  uint64_t *chunk_offset;  /* from the start of the patch */
  uint64_t *chunk_size;
  uint64_t *chunk_before;  /* changes in earlier chunks of the same tensor */
  struct pulse_v3_model *values; /* version 3: the value model, else NULL */
  size_t values_size;            /* its bytes at the end of the table */
};

/* Elements in chunk j of tensor t. */
static inline uint32_t patch_chunk_elems(const struct pulse_patch *p,
                                         const patch_tensor *t, uint64_t j) {
  uint64_t first = j << p->chunk_log2;
  uint64_t left = t->numel - first;
  uint64_t full = 1ull << p->chunk_log2;
  return (uint32_t)(left < full ? left : full);
}

/* Decodes chunk j of tensor t into pos/delta (the chunk's slots of the
 * tensor's arrays). base: the tensor's base bits, or NULL for PULSE_POS_PLAIN
 * patches decoded without weights. ix: NULL, or a class index of the base
 * (checked by the caller to describe it), used when patch_can_use_index;
 * positions then come out class-major rather than in storage order. */
pulse_status patch_decode_chunk(const struct pulse_patch *p, size_t t,
                                uint64_t j, const uint16_t *base,
                                const pulse_class_index *ix, uint64_t *pos,
                                uint16_t *delta);

/* patch_decode_chunk working in `scratch` (the chunk's slices; NULL: the
 * decoder allocates its own). */
pulse_status patch_decode_chunk_in(const struct pulse_patch *p, size_t t, uint64_t j,
                                   const uint16_t *base, const pulse_class_index *ix,
                                   uint64_t *pos, uint16_t *delta,
                                   const struct pulse_chunk_scratch *scratch);

/* Whether a class index speeds up this patch: a class-model patch whose
 * chunks are whole index blocks. */
int patch_can_use_index(const struct pulse_patch *p);

/* The state digest of the patch's table with tensor digests d. */
pulse_status patch_state_digest_of(const struct pulse_patch *p, const pulse_tensor_digest *d,
                                   pulse_state_digest *out);

/* Fills entries [from, to) of c with their old bits (from base) and new
 * bits (c->new_bits holds the decoded deltas on entry) and returns their
 * digest change: what one decoded chunk adds to its tensor's digest. */
pulse_tensor_digest patch_resolve_chunk(const uint16_t *base, pulse_changes *c, uint64_t from,
                                        uint64_t to);

struct pulse_patch_stream;

/* pulse_patch_stream_begin; whole: every byte is there already, so the
 * caller's thread decodes too once it waits in finish (pulse_patch_stage). */
pulse_status patch_stream_begin(const struct pulse_patch *p, pulse_host_tensor *targets,
                                size_t count, const pulse_apply_opts *opts, int whole,
                                struct pulse_patch_stream **out);

/* pulse_patch_encode with the target digests given rather than derived
 * (squash knows them from the last patch but may not know the old bits). */
pulse_status patch_encode_digests(const pulse_encode_opts *opts,
                                  const pulse_encode_tensor *tensors, size_t count,
                                  const pulse_tensor_digest *target_digests,
                                  pulse_buffer *out);

#endif
