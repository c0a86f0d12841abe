/* safetensors_impl.h - the safetensors writer's header alone; internal to
 * pulse (pulse_codec_internal). */
#ifndef PULSE_SAFETENSORS_IMPL_H
#define PULSE_SAFETENSORS_IMPL_H

#include "bytebuf_impl.h"
#include "pulse_safetensors.h"

/** Fills *head (empty) with the first bytes pulse_st_serialize would make for these
 * tensors and metadata (the 8-byte length and the header JSON), padded with
 * spaces to a multiple of 8 bytes, or to exactly min_size bytes when the
 * header is shorter than that (room kept for metadata that grows, so the
 * header can later be rewritten in place). The tensors' data is not read,
 * only checked for NULL. *data_size gets the bytes of data that follow.
 * @return as pulse_st_serialize. */
pulse_status st_header_build(const pulse_st_write_tensor *tensors, size_t count,
                             const pulse_st_kv *meta, size_t meta_count,
                             uint64_t min_size, pulse_bytebuf *head,
                             uint64_t *data_size);

#endif
