/* test_auth_udp_notes.c - the small notes of the exchange over datagrams,
 * signed (issue 35 item 7, docs/protocols/loco-exchange.md
 * "Authentication"): a trainer's "all my datagrams of round R are sent"
 * (/v1/loco/round/R/sent) and its datagram port (/v1/loco/udp). Trainer 2
 * serves them unsigned, forged, replayed or signed by a stranger: the
 * others refuse them (a refused note ends no wait; a refused port is no
 * port: its datagrams are as lost), count them by reason and kind, and
 * end with the same bits. */
#include "auth_testutil.h"
#include "coordinator_impl.h"

static void bad_notes(pulse_loco_auth_kind kind, const char *word,
                      unsigned mode) {
  pulse_sim_problem *p = aproblem();
  atrainer t[AT];
  pulse_loco_member m[AT];
  pulse_loco_member_key pins[AT];
  pulse_loco_coord_opts no = aopts(PULSE_LOCO_TRANSPORT_UDP);
  /* A refused note leaves a receiver waiting for the deadline. */
  no.deadline_ms = 1500;
  pulse_loco_test_hooks hooks;
  memset(&hooks, 0, sizeof hooks);
  /* Most end markers lost too: a receiver asks the senders whether they
   * sent all (the same draws in every run). */
  hooks.datagram_drop = kind == PULSE_LOCO_AUTH_SENT ? 0.9 : 0.0;
  hooks.drop_seed = 5;
  no.test_hooks = &hooks;
  no.resync_period = 1;
  astart(t, AT, p, no, m, pins);
  cr_assert_eq(loco_auth_tamper(t[2].node, mode, LOCO_AUTH_TAMPER_KIND(kind)),
               PULSE_OK);
  for (int i = 0; i < AT; i++)
    t[i].rounds = 4;
  arun(t, AT);
  uint64_t refused = 0, reasons = 0;
  for (int i = 0; i < AT; i++) {
    cr_assert_eq(t[i].st, PULSE_OK, "%s %s: trainer %d: %s", word, reason[mode],
                 i, t[i].detail);
    cr_assert_eq(pulse_loco_round(t[i].ctx), 4, "%s %s", word, reason[mode]);
  }
  for (int i = 0; i < 2; i++) {
    refused += at_refused_kind(pulse_loco_coord_url(t[i].node), word);
    reasons += at_refused(pulse_loco_coord_url(t[i].node), reason[mode]);
  }
  cr_assert_geq(refused, 1, "%s %s", word, reason[mode]);
  cr_assert_geq(reasons, 1, "%s %s", word, reason[mode]);
  cr_assert_eq(pulse_loco_global_digest(t[1].ctx),
               pulse_loco_global_digest(t[0].ctx), "%s %s", word, reason[mode]);
  afree(t, AT);
  pulse_sim_problem_free(p);
}

Test(loco_auth_udp_notes, bad_sent_notes_are_refused, .timeout = 180) {
  for (unsigned mode = LOCO_AUTH_TAMPER_UNSIGNED;
       mode <= LOCO_AUTH_TAMPER_FOREIGN; mode++)
    bad_notes(PULSE_LOCO_AUTH_SENT, "sent", mode);
}

Test(loco_auth_udp_notes, bad_ports_are_refused, .timeout = 120) {
  bad_notes(PULSE_LOCO_AUTH_PORT, "port", LOCO_AUTH_TAMPER_UNSIGNED);
  bad_notes(PULSE_LOCO_AUTH_PORT, "port", LOCO_AUTH_TAMPER_FORGED);
  bad_notes(PULSE_LOCO_AUTH_PORT, "port", LOCO_AUTH_TAMPER_FOREIGN);
}

/* Ports signed but served where they do not belong: trainer 1's signed
 * port at trainer 2's URL (as a hostile host on the path would replay it:
 * not signed by the trainer it is served for, forged), or trainer 2's own
 * signed port naming another URL (an earlier run's: replayed). Trainer 0
 * refuses it, counts it, and ends with trainer 1's bits. */
static void misplaced_port(int earlier_run) {
  pulse_sim_problem *p = aproblem();
  atrainer t[AT];
  pulse_loco_member m[AT];
  pulse_loco_member_key pins[AT];
  astart(t, AT, p, aopts(PULSE_LOCO_TRANSPORT_UDP), m, pins);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  loco_sig sig;
  if (earlier_run) {
    pulse_bytebuf_printf(&b, "{\"port\":%u,\"id\":2,\"url\":\"%s\"}",
                         (unsigned)pulse_loco_coord_udp_port(t[2].node),
                         "http://127.0.0.1:9");
    sig = at_sign(t[2].key, PULSE_LOCO_AUTH_PORT, 0, b.data, b.size);
  } else {
    char url[160];
    snprintf(url, sizeof url, "%s/v1/loco/udp",
             pulse_loco_coord_url(t[1].node));
    long status = 0;
    cr_assert_eq(loco_http_get_signed(url, 3000, 512, &b, &status, &sig),
                 PULSE_OK);
    cr_assert_eq(status, 200);
    cr_assert(sig.present);
  }
  cr_assert_eq(loco_server_put_signed(t[2].node->srv, "/v1/loco/udp", b.data,
                                      b.size, &sig),
               PULSE_OK);
  pulse_bytebuf_free(&b);
  for (int i = 0; i < AT; i++)
    t[i].rounds = 2;
  arun(t, AT);
  for (int i = 0; i < AT; i++)
    cr_assert_eq(t[i].st, PULSE_OK, "trainer %d: %s", i, t[i].detail);
  const char *base = pulse_loco_coord_url(t[0].node);
  cr_assert_geq(at_refused_kind(base, "port"), 1);
  cr_assert_geq(at_refused(base, earlier_run ? "replayed" : "forged"), 1);
  cr_assert_eq(pulse_loco_global_digest(t[1].ctx),
               pulse_loco_global_digest(t[0].ctx));
  afree(t, AT);
  pulse_sim_problem_free(p);
}

Test(loco_auth_udp_notes, a_port_served_for_another_member_is_refused,
     .timeout = 60) {
  misplaced_port(0);
}

Test(loco_auth_udp_notes, a_port_of_an_earlier_run_is_refused, .timeout = 60) {
  misplaced_port(1);
}
