/* auth_tamper.c - fault injection for the authentication tests
 * (auth_tamper_impl.h): the faults of one message, shared by the
 * coordinator exchange and the collaboration. */
#include <string.h>

#include "auth_tamper_impl.h"
#include "status_impl.h"

pulse_status loco_tamper_set(loco_tamper *t, unsigned mode, unsigned kinds) {
  if (mode > LOCO_AUTH_TAMPER_FOREIGN)
    return pulse_fail(PULSE_ERR_ARG, "loco auth: no tamper mode %u", mode);
  if (mode == LOCO_AUTH_TAMPER_FOREIGN && t->stranger == NULL) {
    PULSE_TRY(pulse_sign_key_generate(&t->stranger_key));
    pulse_loco_auth_opts o;
    pulse_loco_auth_opts_init(&o);
    o.key = t->stranger_key;
    PULSE_TRY(pulse_loco_auth_create(&o, &t->stranger));
  }
  t->mode = mode;
  t->kinds = kinds;
  return PULSE_OK;
}

void loco_tamper_clear(loco_tamper *t) {
  pulse_loco_auth_free(t->stranger);
  pulse_sign_key_free(t->stranger_key);
  for (unsigned k = 0; k < PULSE_LOCO_AUTH_KINDS; k++)
    pulse_bytebuf_free(&t->kept[k].body);
  memset(t, 0, sizeof *t);
}

unsigned loco_tamper_mode(const loco_tamper *t, pulse_loco_auth_kind kind) {
  if (kind < PULSE_LOCO_AUTH_PAYLOAD || (unsigned)kind > PULSE_LOCO_AUTH_KINDS)
    return LOCO_AUTH_TAMPER_NONE;
  return t->kinds & LOCO_AUTH_TAMPER_KIND(kind) ? t->mode
                                                : LOCO_AUTH_TAMPER_NONE;
}

pulse_status loco_tamper_sign(loco_tamper *t, pulse_loco_auth_kind kind,
                              uint64_t round, const void *data, size_t size,
                              loco_sig *sig) {
  switch (loco_tamper_mode(t, kind)) {
  case LOCO_AUTH_TAMPER_UNSIGNED:
    sig->present = 0;
    return PULSE_OK;
  case LOCO_AUTH_TAMPER_FORGED:
    sig->sig[17] ^= 0x10;
    return PULSE_OK;
  case LOCO_AUTH_TAMPER_FOREIGN:
    return pulse_loco_auth_sign(t->stranger, kind, round, data, size, sig->sig,
                                sig->key);
  default: /* none, or a replay: the body's, not the signature's */
    return PULSE_OK;
  }
}

static pulse_status keep(loco_tamper_kept *k, uint64_t round, const void *data,
                         size_t size, const loco_sig *sig) {
  pulse_bytebuf_free(&k->body);
  pulse_bytebuf_put(&k->body, data, size);
  if (k->body.failed || (size > 0 && k->body.data == NULL))
    return pulse_fail(PULSE_ERR_NOMEM, "loco auth: kept body");
  k->have = 1;
  k->round = round;
  k->sig = *sig;
  return PULSE_OK;
}

pulse_status loco_tamper_put(loco_tamper *t, loco_server *srv, const char *path,
                             pulse_loco_auth_kind kind, uint64_t round,
                             const void *data, size_t size,
                             const loco_sig *sig) {
  unsigned mode = loco_tamper_mode(t, kind);
  if (mode == LOCO_AUTH_TAMPER_REPLAYED) {
    loco_tamper_kept *k = &t->kept[kind - 1];
    if (k->have && k->round < round) {
      pulse_status st = loco_server_put_signed(srv, path, k->body.data,
                                               k->body.size, &k->sig);
      return st == PULSE_OK ? keep(k, round, data, size, sig) : st;
    }
    PULSE_TRY(keep(k, round, data, size, sig)); /* the first: as is */
    return loco_server_put_signed(srv, path, data, size, sig);
  }
  loco_sig bad = *sig;
  PULSE_TRY(loco_tamper_sign(t, kind, round, data, size, &bad));
  return loco_server_put_signed(srv, path, data, size, &bad);
}
