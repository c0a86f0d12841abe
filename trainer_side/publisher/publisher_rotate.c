/* publisher_rotate.c - key rotation (docs/protocols/sync.md, "Key
 * rotation"): the key that signed the store's heads names a new key as its
 * successor in a record it signs, and every head from then on is signed by
 * the new key and carries that record, so a worker that trusts the old key
 * follows to the new one and from then on refuses heads of the old. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fail_impl.h"
#include "publisher_impl.h"
#include "pulse_log.h"
#include "status_impl.h"

pulse_status pub_rotation_fields(const pulse_pub *pub, store_head_fields *f) {
  memset(&f->rotation, 0, sizeof f->rotation);
  if (pub->opts.key == NULL)
    return PULSE_OK;
  uint8_t ours[PULSE_KEY_BYTES];
  pulse_sign_key_public(pub->opts.key, ours);
  if (pub->rotating_from != NULL)
    return store_rotation_sign(pub->rotating_from, ours, f->run, f->step,
                               &f->rotation);
  /* Carried on only while the heads are the new key's (a head signed by
   * a key the record does not name would not check) and of its run. */
  uint8_t signer[PULSE_KEY_BYTES], run[PULSE_STORE_RUN_BYTES];
  const pulse_store_head *h = pub->head;
  if (h != NULL && h->rotation.present && pulse_store_head_signer(h, signer) &&
      memcmp(signer, ours, sizeof ours) == 0 &&
      pulse_store_head_run(h, run) && memcmp(run, f->run, sizeof run) == 0)
    f->rotation = h->rotation;
  return PULSE_OK;
}

pulse_status pub_key_check(const pulse_pub *pub) {
  uint8_t ours[PULSE_KEY_BYTES], from[PULSE_KEY_BYTES],
      signer[PULSE_KEY_BYTES];
  uint64_t at = 0;
  if (pub->opts.key == NULL || pub->head == NULL ||
      !pulse_store_head_rotation(pub->head, from, &at))
    return PULSE_OK;
  pulse_sign_key_public(pub->opts.key, ours);
  if (memcmp(ours, from, sizeof ours) != 0)
    return PULSE_OK;
  char hex[65];
  pulse_store_head_signer(pub->head, signer);
  store_hex(signer, sizeof signer, hex);
  return pulse_fail(PULSE_ERR_ARG,
                    "publisher: %s: its key was rotated at step %" PRIu64
                    " from this key to %s: sign with the new key (workers "
                    "refuse the old one)",
                    pub->dir, at, hex);
}

pulse_status pulse_pub_rotate_key(pulse_pub *pub,
                                  const pulse_sign_key *new_key,
                                  pulse_pub_figures *figures) {
  if (figures != NULL)
    memset(figures, 0, sizeof *figures);
  if (pub == NULL || new_key == NULL)
    return pulse_fail(PULSE_ERR_ARG, "publisher: rotate key: NULL argument");
  if (pub->opts.key == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "publisher: rotate key: the store's heads are not "
                      "signed, so no key can name a successor");
  if (pub->head == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "publisher: rotate key: nothing published yet: "
                      "publish with the new key from the start");
  uint8_t old_pub[PULSE_KEY_BYTES], new_pub[PULSE_KEY_BYTES];
  pulse_sign_key_public(pub->opts.key, old_pub);
  pulse_sign_key_public(new_key, new_pub);
  if (memcmp(old_pub, new_pub, sizeof old_pub) == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "publisher: rotate key: the new key is the current one");
  /* A background anchor is named first: the rotation head then names
   * everything the store holds. */
  PULSE_TRY(pulse_pub_flush(pub, NULL));
  const pulse_store_head *h = pub->head;
  uint64_t step = pulse_store_head_step(h);
  const pulse_sign_key *old_key = pub->opts.key;
  pub->rotating_from = old_key;
  pub->opts.key = new_key;
  pulse_status st = pub_head_write(pub, step, &pub->state_digest, h->patches,
                                   h->npatches, h->anchors, h->nanchors);
  pub->rotating_from = NULL;
  if (st != PULSE_OK) {
    pub->opts.key = old_key;
    return pulse_fail_context(st, "publisher: rotate key");
  }
  char from_hex[65], to_hex[65];
  store_hex(old_pub, sizeof old_pub, from_hex);
  store_hex(new_pub, sizeof new_pub, to_hex);
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "publisher: %s: key rotated at step %" PRIu64 ": %s -> %s",
               pub->dir, step, from_hex, to_hex);
  pulse_pub_figures f;
  memset(&f, 0, sizeof f);
  f.step = f.base_step = step;
  f.params = pub->params;
  f.flush = 1;
  pulse_state_digest_hex(&pub->state_digest, f.state_digest);
  if (figures != NULL)
    *figures = f;
  if (pub->opts.on_head != NULL)
    pub->opts.on_head(pub->opts.on_head_ctx, &f);
  pub_remove_garbage(pub);
  return PULSE_OK;
}
