/* Authenticated PULSELoCo (issue 15, pulse_loco_auth.h): a member's signed
 * payload and manifest pass; an unsigned, forged, replayed (older round) or
 * foreign one is refused with its reason counted; a signature of one kind
 * or round never passes as another; a member admits a newcomer by its
 * signature, a non-member cannot. */
#include <criterion/criterion.h>
#include <string.h>

#include "pulse_loco_auth.h"

typedef struct {
  pulse_sign_key *key;
  uint8_t pub[32];
  pulse_loco_auth *auth;
} trainer;

/* A trainer whose members are the public keys in `members`. */
static void trainer_up(trainer *t, const uint8_t *members, size_t n) {
  cr_assert_eq(pulse_sign_key_generate(&t->key), PULSE_OK);
  pulse_sign_key_public(t->key, t->pub);
  pulse_loco_auth_opts o;
  pulse_loco_auth_opts_init(&o);
  o.key = t->key;
  o.members = members;
  o.member_count = n;
  cr_assert_eq(pulse_loco_auth_create(&o, &t->auth), PULSE_OK, "%s",
               pulse_error_detail());
}

static void trainer_down(trainer *t) {
  pulse_loco_auth_free(t->auth);
  pulse_sign_key_free(t->key);
}

static pulse_loco_auth_figures counters(const trainer *t) {
  pulse_loco_auth_figures c;
  pulse_loco_auth_figures_get(t->auth, &c);
  return c;
}

Test(loco_auth, members_pass_and_every_bad_body_is_refused_and_counted) {
  trainer a, b, x;
  trainer_up(&b, NULL, 0);
  trainer_up(&a, b.pub, 1); /* a pins b */
  trainer_up(&x, NULL, 0);  /* a stranger */
  uint8_t payload[300], sig[64], pub[32];
  for (size_t i = 0; i < sizeof payload; i++)
    payload[i] = (uint8_t)(i * 7 + 1);
  pulse_loco_auth_round(a.auth, 5);
  cr_assert_eq(pulse_loco_auth_sign(b.auth, PULSE_LOCO_AUTH_PAYLOAD, 5,
                                    payload, sizeof payload, sig, pub),
               PULSE_OK);
  cr_assert(memcmp(pub, b.pub, 32) == 0);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 5, pub,
                                     payload, sizeof payload, sig),
               PULSE_OK, "%s", pulse_error_detail());
  /* The same body again (from a relay) is fine. */
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 5, pub,
                                     payload, sizeof payload, sig),
               PULSE_OK);
  /* Unsigned. */
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 5, NULL,
                                     payload, sizeof payload, NULL),
               PULSE_ERR_CORRUPT);
  /* Forged: one byte of the body, the round, or the kind changed. */
  payload[100] ^= 1;
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 5, pub,
                                     payload, sizeof payload, sig),
               PULSE_ERR_CORRUPT);
  payload[100] ^= 1;
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 6, pub,
                                     payload, sizeof payload, sig),
               PULSE_ERR_CORRUPT);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_MANIFEST, 5, pub,
                                     payload, sizeof payload, sig),
               PULSE_ERR_CORRUPT);
  /* A stranger's signature claimed for the member: forged. */
  uint8_t xsig[64];
  cr_assert_eq(pulse_loco_auth_sign(x.auth, PULSE_LOCO_AUTH_PAYLOAD, 5,
                                    payload, sizeof payload, xsig, NULL),
               PULSE_OK);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 5, b.pub,
                                     payload, sizeof payload, xsig),
               PULSE_ERR_CORRUPT);
  /* Foreign: validly signed by a key that is not a member. */
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 5, x.pub,
                                     payload, sizeof payload, xsig),
               PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "not a member") != NULL, "%s",
            pulse_error_detail());
  /* Replayed: round 4's valid payload in round 5, and after round 7 was
   * accepted from b, round 6's. */
  cr_assert_eq(pulse_loco_auth_sign(b.auth, PULSE_LOCO_AUTH_PAYLOAD, 4,
                                    payload, sizeof payload, sig, NULL),
               PULSE_OK);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 4, b.pub,
                                     payload, sizeof payload, sig),
               PULSE_ERR_BASE_STEP);
  uint8_t sig6[64], sig7[64];
  pulse_loco_auth_sign(b.auth, PULSE_LOCO_AUTH_PAYLOAD, 6, payload,
                       sizeof payload, sig6, NULL);
  pulse_loco_auth_sign(b.auth, PULSE_LOCO_AUTH_PAYLOAD, 7, payload,
                       sizeof payload, sig7, NULL);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 7, b.pub,
                                     payload, sizeof payload, sig7),
               PULSE_OK);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 6, b.pub,
                                     payload, sizeof payload, sig6),
               PULSE_ERR_BASE_STEP);
  /* A manifest is its own kind: its rounds are counted apart. */
  uint8_t msig[64];
  pulse_loco_auth_sign(b.auth, PULSE_LOCO_AUTH_MANIFEST, 6, "m", 1, msig, NULL);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_MANIFEST, 6,
                                     b.pub, "m", 1, msig),
               PULSE_OK, "%s", pulse_error_detail());

  pulse_loco_auth_figures c = counters(&a);
  cr_assert_eq(c.accepted, 4);
  cr_assert_eq(c.unsigned_bodies, 1);
  cr_assert_eq(c.forged, 4);
  cr_assert_eq(c.foreign, 1);
  cr_assert_eq(c.replayed, 2);
  trainer_down(&a), trainer_down(&b), trainer_down(&x);
}

Test(loco_auth, a_member_admits_a_newcomer_and_a_stranger_cannot) {
  trainer a, b, n, x;
  trainer_up(&b, NULL, 0);
  trainer_up(&a, b.pub, 1);
  trainer_up(&n, NULL, 0); /* joins */
  trainer_up(&x, NULL, 0); /* a stranger */
  pulse_loco_auth_round(a.auth, 3);
  uint8_t payload[16] = {1, 2, 3}, sig[64], adm[64];
  pulse_loco_auth_sign(n.auth, PULSE_LOCO_AUTH_PAYLOAD, 3, payload,
                       sizeof payload, sig, NULL);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 3, n.pub,
                                     payload, sizeof payload, sig),
               PULSE_ERR_CORRUPT, "not a member yet");
  /* The stranger's admission of the newcomer counts for nothing. */
  cr_assert_eq(pulse_loco_auth_admit_sign(x.auth, 3, n.pub, adm), PULSE_OK);
  cr_assert_eq(pulse_loco_auth_admit(a.auth, 3, n.pub, x.pub, adm),
               PULSE_ERR_CORRUPT);
  /* Nor does it, claimed as b's. */
  cr_assert_eq(pulse_loco_auth_admit(a.auth, 3, n.pub, b.pub, adm),
               PULSE_ERR_CORRUPT);
  cr_assert_eq(pulse_loco_auth_is_member(a.auth, n.pub), 0);
  /* b's admission of an older round is a replay. */
  cr_assert_eq(pulse_loco_auth_admit_sign(b.auth, 2, n.pub, adm), PULSE_OK);
  cr_assert_eq(pulse_loco_auth_admit(a.auth, 2, n.pub, b.pub, adm),
               PULSE_ERR_BASE_STEP);
  cr_assert_eq(pulse_loco_auth_admit_sign(b.auth, 3, n.pub, adm), PULSE_OK);
  cr_assert_eq(pulse_loco_auth_admit(a.auth, 3, n.pub, b.pub, adm), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_eq(pulse_loco_auth_is_member(a.auth, n.pub), 1);
  cr_assert_eq(pulse_loco_auth_check(a.auth, PULSE_LOCO_AUTH_PAYLOAD, 3, n.pub,
                                     payload, sizeof payload, sig),
               PULSE_OK, "%s", pulse_error_detail());
  pulse_loco_auth_figures c = counters(&a);
  cr_assert_eq(c.admitted, 1);
  trainer_down(&a), trainer_down(&b), trainer_down(&n), trainer_down(&x);
}
