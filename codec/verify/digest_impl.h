/* digest_impl.h - the additive digest's bulk loops (digest.c), vectorised
 * with AVX-512 where the CPU has it (8 elements per instruction; the 64-bit
 * multiplies of the two lane mixers are what a scalar loop waits on) and
 * scalar otherwise. Integer arithmetic only: both give the same sums. */
#ifndef PULSE_DIGEST_IMPL_H
#define PULSE_DIGEST_IMPL_H

#include "pulse_codec.h"

/* Sum over j < n of lane(key(pos[j], new_bits[j])) - lane(key(pos[j],
 * old_bits[j])) for both lanes: the digest change of a change list. */
pulse_tensor_digest pulse_digest_change_sum(const uint64_t *pos, const uint16_t *old_bits,
                                            const uint16_t *new_bits, uint64_t n);

/* What elements first..first+n-1 of a tensor (bits points at element
 * `first`) add to its digest: ranges' digests add up to the tensor's, so
 * threads can each take one. */
pulse_tensor_digest pulse_digest_bf16_at(const uint16_t *bits, uint64_t n, uint64_t first);

/* The scalar forms, the specification of the above and of
 * pulse_digest_bf16 (tests compare them). */
pulse_tensor_digest pulse_digest_bf16_scalar(const uint16_t *bits, uint64_t n);
pulse_tensor_digest pulse_digest_bf16_scalar_at(const uint16_t *bits, uint64_t n,
                                                uint64_t first);
pulse_tensor_digest pulse_digest_change_sum_scalar(const uint64_t *pos, const uint16_t *old_bits,
                                                   const uint16_t *new_bits, uint64_t n);

#endif
