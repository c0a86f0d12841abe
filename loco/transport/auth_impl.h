/* auth_impl.h - private to loco/: pulse_loco_auth_check for a body known
 * by its size and SHA-256 only (pulse_loco_auth.h's text signs nothing
 * else): a collaboration writer that reads only a payload's header checks
 * its signature with the size and digest its server's answer gave, which
 * the manifest then lists for everyone to check the bytes against. */
#ifndef PULSE_LOCO_AUTH_IMPL_H
#define PULSE_LOCO_AUTH_IMPL_H

#include <stdint.h>

#include "pulse_loco_auth.h"

/* Same answers and counters as pulse_loco_auth_check. */
pulse_status loco_auth_check_digest(pulse_loco_auth *auth,
                                    pulse_loco_auth_kind kind, uint64_t round,
                                    const uint8_t *signer, uint64_t n,
                                    const uint8_t sha[32], const uint8_t *sig);

/* The word of a kind in its signed text and in /metrics ("payload", ...). */
const char *loco_auth_kind_word(pulse_loco_auth_kind kind);

#endif
