/* publisher_sections_impl.h - private to pulse_trainer: the section index
 * written beside each patch (codec/store/store_sections_impl.h). */
#ifndef PULSE_PUBLISHER_SECTIONS_IMPL_H
#define PULSE_PUBLISHER_SECTIONS_IMPL_H

#include "publisher_impl.h"

/** Writes sections/<patch sha256> for the patch `patch` (object
 * `obj`, whose sha256 is set), signed by the publisher's key, durable under
 * its name when this returns; nothing when fewer than two tensors have
 * changes. Called before the head that names the patch is published: a
 * head never names a patch whose index is still to come. A failure leaves
 * no file (or one the head does not name: recovery and GC remove it). */
pulse_status pub_sections_write(const pulse_pub *pub, const pulse_buffer *patch,
                                const pulse_store_object *obj);

#endif /* PULSE_PUBLISHER_SECTIONS_IMPL_H */
