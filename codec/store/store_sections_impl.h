/* store_sections_impl.h - internal to pulse (pulse_codec_internal): the
 * section index of a patch, sections/<patch sha256>, which lets a worker
 * that holds some of a patch's tensors fetch and verify only their
 * sections (issue 34). Written by the publisher beside each patch with
 * changes in more than one tensor; named by its patch, so heads do not
 * change and a store without it is still complete. It lives in a folder
 * of its own, not in objects/, where every file is named by its own
 * SHA-256 (servers, relays, verification and recovery rely on that).
 *
 * Layout (little-endian), STORE_SECTIONS_FIXED + 32 * count + 96 bytes:
 *   0   8  magic "PULSESEC"
 *   8   2  version (1)
 *   10  2  flags: bit 0 signed; others must be 0
 *   12  4  reserved, 0
 *   16  32 the patch's SHA-256 (its name)
 *   48  8  the patch's size
 *   56  8  prefix: bytes of the patch's fixed header and tensor table
 *          (120 + table_size)
 *   64  32 SHA-256 of those bytes
 *   96  8  tensor count (the patch's)
 *   104 32 * count  SHA-256 of each tensor's section, table order (a tensor
 *          without changes has an empty section: the SHA-256 of no bytes)
 *   ..  32 the signer's Ed25519 public key (zeros when unsigned)
 *   ..  64 its signature over "pulse-sections/1" followed by every byte
 *          before the signature (zeros when unsigned) */
#ifndef PULSE_STORE_SECTIONS_IMPL_H
#define PULSE_STORE_SECTIONS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_sign.h"
#include "pulse_status.h"

#define STORE_SECTIONS_MAGIC "PULSESEC"
#define STORE_SECTIONS_VERSION 1u
#define STORE_SECTIONS_DOMAIN "pulse-sections/1"
#define STORE_SECTIONS_FIXED 104u
#define STORE_SECTIONS_TAIL (PULSE_KEY_BYTES + PULSE_SIGN_SIGNATURE_BYTES)
#define STORE_SECTIONS_DIR "sections"
/* The patch format's fixed header (docs/formats/patch.md). */
#define STORE_SECTIONS_PATCH_HEADER 120u

/* A parsed, signature-checked section index (borrows nothing). */
typedef struct {
  uint8_t patch_sha256[32];
  uint64_t patch_size;
  uint64_t prefix;
  uint8_t prefix_sha256[32];
  uint64_t count;
  uint8_t (*section_sha256)[32]; /* count entries (owned) */
  int is_signed;
  uint8_t pub[PULSE_KEY_BYTES];
} store_sections;

/** Bytes of a section index for `count` tensors, or 0 when it overflows. */
size_t store_sections_size(uint64_t count);

/** 1 and the patch's SHA-256 when `name` is an index's file name (64
 * lower-case hex digits), else 0. */
int store_sections_parse_name(const char *name, uint8_t patch_sha256[32]);

/** Whether a patch gets a section index: more than one tensor has changes. */
int store_sections_wanted(const pulse_patch *p);

/** Builds the section index of the patch `bytes` (`size` bytes, SHA-256
 * `sha256`), signed by `key` (NULL: unsigned). */
pulse_status store_sections_build(const uint8_t *bytes, size_t size,
                                  const uint8_t sha256[32],
                                  const pulse_sign_key *key, pulse_buffer *out);

/** Parses an untrusted section index: exact size, magic, version, flags,
 * counts, and the signature when it is signed. Which key to trust is the
 * caller's (out->pub). @return PULSE_OK and *out (free with
 * store_sections_free); PULSE_ERR_TRUNCATED / PULSE_ERR_TRAILING (size),
 * PULSE_ERR_MAGIC, PULSE_ERR_VERSION, PULSE_ERR_CORRUPT (fields or
 * signature), PULSE_ERR_NOMEM. */
pulse_status store_sections_parse(const uint8_t *bytes, size_t n,
                                  store_sections *out);
void store_sections_free(store_sections *s); /* NULL is fine */

/** Checks a whole patch against its index: its SHA-256 and size as named,
 * the prefix's hash, the table's tensor count, every section's hash. */
pulse_status store_sections_check_patch(const store_sections *s,
                                        const uint8_t *bytes, size_t size);

/** Offsets of each tensor's section in the patch p (opened over at least
 * its header and table): off[i] (count + 1 entries: off[count] is the
 * patch size). Checked against p's own sizes. */
pulse_status store_sections_offsets(const pulse_patch *p, uint64_t prefix,
                                    uint64_t *off);

/** Path "sections/<hex>" of a patch's index into out. */
void store_sections_path(const uint8_t patch_sha256[32], char *out, size_t cap);

#endif /* PULSE_STORE_SECTIONS_IMPL_H */
