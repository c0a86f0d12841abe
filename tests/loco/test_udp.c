/* test_udp.c - PULSELoCo over datagrams (pulse_loco_coord_opts.transport
 * UDP, docs/protocols/loco-datagrams.md "Exchange over datagrams") between trainers in threads of
 * this process, each with its HTTP server and its datagram socket on
 * 127.0.0.1 (port 0): without loss the run equals the in-process HTTP run
 * bit for bit; with datagrams lost it equals the in-process chunked replay
 * bit for bit (the same draws), the drift stays under its budget, and every
 * replica is the same bits after each re-sync; hostile datagrams from
 * another socket are dropped, counted, and change nothing. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pulse_loco_testing.h"
#include "loco_testutil.h"
#include "manifest_impl.h"
#include "sim_trainers.h"

#define UT 4
#define ROUNDS 6
#define INNER 3

typedef struct {
  const pulse_sim_problem *p;
  uint32_t id;
  pulse_loco *ctx;
  pulse_loco_coord *node;
  const pulse_loco_member *members;
  size_t nmembers;
  pulse_status st;
  char detail[256];
  /* per round, after it */
  double drift[ROUNDS];
  uint64_t digest[ROUNDS];
  uint64_t resync_bytes[ROUNDS];
  uint64_t dropped, sent, accepted, refused, resynced;
  pulse_loco_inbox_figures why; /* summed over rounds */
  uint64_t refused_source;
  /* Bytes over the steps: sent, received, received in the last step. */
  uint64_t bytes_sent, fetched, fetched_last;
} utrainer;

static void *run_utrainer(void *arg) {
  utrainer *t = arg;
  uint64_t P = pulse_sim_problem_param_count(t->p);
  float *local = malloc(P * sizeof *local);
  memcpy(local, pulse_loco_global(t->ctx), P * sizeof *local);
  pulse_sim_learner *l = NULL;
  t->st = pulse_sim_learner_create(t->p, t->id, &l);
  if (t->st == PULSE_OK)
    t->st = pulse_loco_coord_start(t->node, t->members, t->nmembers);
  for (uint32_t r = 0; t->st == PULSE_OK && r < ROUNDS; r++) {
    for (uint32_t h = 0; h < INNER; h++)
      pulse_sim_learner_step(l, local);
    pulse_loco_coord_step_figures info;
    t->st = pulse_loco_coord_step(t->node, local,
                                 (uint64_t)INNER * pulse_sim_problem_batch(t->p),
                                 0, &info);
    if (t->st != PULSE_OK)
      break;
    t->bytes_sent += info.bytes_sent;
    t->fetched += info.fetched_bytes;
    t->fetched_last = info.fetched_bytes;
    t->drift[r] = info.drift;
    t->resync_bytes[r] = info.resync_bytes;
    t->digest[r] = pulse_loco_global_digest(t->ctx);
    t->dropped += info.datagrams_dropped;
    t->sent += info.datagrams_sent;
    t->accepted += info.chunks.accepted;
    t->refused += info.chunks.truncated + info.chunks.bad_checksum +
                  info.chunks.malformed + info.chunks.unknown_sender +
                  info.chunks.other_round + info.chunks.other_base +
                  info.chunks.duplicate + info.datagrams_refused_source;
    t->resynced += info.resynced_ranges;
    t->why.truncated += info.chunks.truncated;
    t->why.bad_checksum += info.chunks.bad_checksum;
    t->why.malformed += info.chunks.malformed;
    t->why.unknown_sender += info.chunks.unknown_sender;
    t->why.other_round += info.chunks.other_round;
    t->why.duplicate += info.chunks.duplicate;
    t->refused_source += info.datagrams_refused_source;
  }
  if (t->st == PULSE_OK)
    t->st = pulse_loco_coord_linger(t->node, 30000);
  if (t->st != PULSE_OK)
    snprintf(t->detail, sizeof t->detail, "%s", pulse_error_detail());
  pulse_sim_learner_free(l);
  free(local);
  return NULL;
}

static pulse_sim_problem *uproblem(void) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.hidden = 40;
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK);
  return p;
}

static void ustart(utrainer *t, size_t n, const pulse_sim_problem *p,
                   const pulse_loco_coord_opts *no, pulse_loco_member *m) {
  uint64_t P = pulse_sim_problem_param_count(p);
  float *init = malloc(P * sizeof *init);
  pulse_sim_problem_init(p, init);
  for (uint32_t i = 0; i < n; i++) {
    t[i].p = p;
    t[i].id = i;
    t[i].ctx = lt_ctx(P, i, init);
    cr_assert_eq(pulse_loco_coord_create(no, t[i].ctx, &t[i].node), PULSE_OK,
                 "%s", pulse_error_detail());
    cr_assert_neq(pulse_loco_coord_udp_port(t[i].node), 0);
    m[i].id = i;
    snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_coord_url(t[i].node));
  }
  for (uint32_t i = 0; i < n; i++)
    t[i].members = m, t[i].nmembers = n;
  free(init);
}

static void urun(utrainer *t, size_t n) {
  pthread_t th[UT];
  for (size_t i = 0; i < n; i++)
    pthread_create(&th[i], NULL, run_utrainer, &t[i]);
  for (size_t i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(t[i].st, PULSE_OK, "trainer %u: %s (%s)", t[i].id,
                 pulse_status_name(t[i].st), t[i].detail);
}

static void ufree(utrainer *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    pulse_loco_coord_free(t[i].node);
    pulse_loco_free(t[i].ctx);
  }
}

static pulse_loco_coord_opts udp_opts(double drop) {
  pulse_loco_coord_opts no;
  pulse_loco_coord_opts_init(&no);
  no.transport = PULSE_LOCO_TRANSPORT_UDP;
  no.deadline_ms = 8000; /* loaded CI machines: only a cap */
  no.manifest_timeout_ms = 30000;
  /* A receiver ends its wait only once every incomplete sender said it
   * sent all (GET .../sent), so a sender preempted in the middle of its
   * burst is not taken for loss: the comparison with the replay needs
   * exactly the injected losses. */
  no.quiet_ms = 50;
  no.max_datagram = 1200; /* several chunks per sender at this size */
  no.resync_range = 256;
  /* Copied at create, which every caller runs before it asks again. */
  static pulse_loco_test_hooks hooks;
  hooks.datagram_drop = drop;
  hooks.drop_seed = 7;
  no.test_hooks = &hooks;
  return no;
}

/* The in-process run of the same rounds (sim options as the nodes'). */
static float *replay_period(const pulse_sim_problem *p, int chunked,
                            double drop, uint32_t period, double *max_drift) {
  uint64_t P = pulse_sim_problem_param_count(p);
  pulse_sim_opts so;
  pulse_sim_opts_init(&so);
  so.trainers = UT;
  so.rounds = ROUNDS;
  so.inner = INNER;
  so.chunked = chunked;
  so.datagram_drop = drop;
  so.drop_seed = 7;
  so.max_datagram = 1200;
  so.resync_range = 256;
  so.resync_period = period;
  float *want = malloc(P * 4);
  *max_drift = 0.0;
  cr_assert_eq(pulse_sim_run(p, &so, NULL, NULL, want), PULSE_OK, "%s",
               pulse_error_detail());
  return want;
}

static float *replay(const pulse_sim_problem *p, int chunked, double drop,
                     double *max_drift) {
  return replay_period(p, chunked, drop, 1, max_drift);
}

Test(loco, udp_run_without_loss_equals_the_http_run_bit_for_bit,
     .timeout = 300) {
  pulse_sim_problem *p = uproblem();
  uint64_t P = pulse_sim_problem_param_count(p);
  utrainer t[UT];
  memset(t, 0, sizeof t);
  pulse_loco_member m[UT];
  pulse_loco_coord_opts no = udp_opts(0.0);
  ustart(t, UT, p, &no, m);
  urun(t, UT);
  double d;
  float *want = replay(p, 0, 0.0, &d);
  for (uint32_t i = 0; i < UT; i++) {
    cr_assert_eq(memcmp(pulse_loco_global(t[i].ctx), want, P * 4), 0,
                 "trainer %u differs from the in-process HTTP run", i);
    cr_assert_eq(t[i].dropped, 0);
    cr_assert_eq(t[i].refused, 0);
    cr_assert_eq(t[i].resynced, 0, "no loss, nothing to re-sync");
    cr_assert(t[i].sent > 3 * ROUNDS, "%llu datagrams",
              (unsigned long long)t[i].sent);
  }
  /* bytes_sent counts the datagrams where they leave (each at least an
   * end marker's 36 bytes) and the HTTP answers: what the others took in
   * (fetched_bytes: HTTP bodies and datagrams) was sent by someone, and
   * little else was (POSTs' answers, polls' 404s, end markers not taken);
   * the last step's intake may be served after the server's last step. */
  uint64_t sent = 0, fetched = 0, fetched_last = 0;
  for (uint32_t i = 0; i < UT; i++) {
    cr_assert_geq(t[i].bytes_sent, 36u * t[i].sent);
    sent += t[i].bytes_sent;
    fetched += t[i].fetched;
    fetched_last += t[i].fetched_last;
  }
  cr_log_info("all: sent %llu, fetched %llu (last step %llu)",
              (unsigned long long)sent, (unsigned long long)fetched,
              (unsigned long long)fetched_last);
  cr_assert_geq(sent + fetched_last, fetched, "sent %llu, fetched %llu",
                (unsigned long long)sent, (unsigned long long)fetched);
  cr_assert_leq(sent, fetched + 4096u * ROUNDS * UT, "sent %llu, fetched %llu",
                (unsigned long long)sent, (unsigned long long)fetched);
  free(want);
  ufree(t, UT);
  pulse_sim_problem_free(p);
}

Test(loco, udp_loss_drift_stays_in_budget_and_resync_restores_the_bits,
     .timeout = 300) {
  pulse_sim_problem *p = uproblem();
  uint64_t P = pulse_sim_problem_param_count(p);
  utrainer t[UT];
  memset(t, 0, sizeof t);
  pulse_loco_member m[UT];
  pulse_loco_coord_opts no = udp_opts(0.2);
  ustart(t, UT, p, &no, m);
  urun(t, UT);
  uint64_t dropped = 0, resynced = 0;
  double worst = 0.0;
  for (uint32_t i = 0; i < UT; i++) {
    dropped += t[i].dropped, resynced += t[i].resynced;
    for (uint32_t r = 0; r < ROUNDS; r++) {
      cr_assert(t[i].drift[r] <= no.drift_budget,
                "trainer %u round %u: drift %g over the budget", i, r,
                t[i].drift[r]);
      worst = t[i].drift[r] > worst ? t[i].drift[r] : worst;
      /* Re-synced every round (period 1): the same bits as the reference
       * after each. */
      cr_assert_eq(t[i].digest[r], t[0].digest[r],
                   "trainer %u differs from the reference after round %u", i,
                   r);
    }
    cr_assert_eq(t[i].refused, 0,
                 "trainer %u refused: truncated %llu, checksum %llu, malformed "
                 "%llu, unknown %llu, other round %llu, duplicate %llu, source "
                 "%llu",
                 i, (unsigned long long)t[i].why.truncated,
                 (unsigned long long)t[i].why.bad_checksum,
                 (unsigned long long)t[i].why.malformed,
                 (unsigned long long)t[i].why.unknown_sender,
                 (unsigned long long)t[i].why.other_round,
                 (unsigned long long)t[i].why.duplicate,
                 (unsigned long long)t[i].refused_source);
  }
  cr_assert(dropped > 0, "no datagram was lost");
  cr_assert(resynced > 0, "loss left nothing to re-sync");
  cr_assert(worst > 0.0, "loss made no drift");
  /* The same draws in one process: the same bits. */
  double d;
  float *want = replay(p, 1, 0.2, &d);
  cr_assert_eq(memcmp(pulse_loco_global(t[0].ctx), want, P * 4), 0,
               "the UDP run differs from its in-process chunked replay");
  free(want);
  /* And loss changed something: not the lossless run. */
  want = replay(p, 0, 0.0, &d);
  cr_assert_neq(memcmp(pulse_loco_global(t[0].ctx), want, P * 4), 0);
  free(want);
  ufree(t, UT);
  pulse_sim_problem_free(p);
}

/* With a re-sync every 3 rounds (rounds 2 and 5): in between the replicas
 * differ, yet every chunk of a drifted replica is taken (the base its
 * chunks name is the reference's, its drifted ranges flagged), only the
 * digests and sketches travel (no values), the estimated drift stays under
 * the budget; after each re-sync round every replica is the reference's
 * bits; and the run equals its in-process replay bit for bit. */
Test(loco, udp_resync_period_3_keeps_drifted_chunks_and_equals_its_replay,
     .timeout = 300) {
  pulse_sim_problem *p = uproblem();
  uint64_t P = pulse_sim_problem_param_count(p);
  utrainer t[UT];
  memset(t, 0, sizeof t);
  pulse_loco_member m[UT];
  pulse_loco_coord_opts no = udp_opts(0.2);
  no.resync_period = 3;
  ustart(t, UT, p, &no, m);
  urun(t, UT);
  uint64_t count = (P + no.resync_range - 1) / no.resync_range;
  /* The digests (24-byte header, 8 a range) and sketches (8 doubles a
   * range): a round that fetched more fetched values. */
  uint64_t checks = 24u + 8u * count + 64u * count;
  int drifted_between = 0;
  for (uint32_t i = 1; i < UT; i++) {
    cr_assert_eq(t[i].refused, 0,
                 "trainer %u refused chunks: malformed %llu (gate), other "
                 "base?",
                 i, (unsigned long long)t[i].why.malformed);
    for (uint32_t r = 0; r < ROUNDS; r++) {
      cr_assert(t[i].drift[r] <= no.drift_budget,
                "trainer %u round %u: drift %g over the budget", i, r,
                t[i].drift[r]);
      if ((r + 1) % 3 == 0) {
        cr_assert_eq(t[i].digest[r], t[0].digest[r],
                     "trainer %u differs from the reference after re-sync "
                     "round %u",
                     i, r);
      } else {
        cr_assert(t[i].resync_bytes[r] <= checks,
                  "trainer %u round %u fetched %llu bytes (values?)", i, r,
                  (unsigned long long)t[i].resync_bytes[r]);
        drifted_between |= t[i].digest[r] != t[0].digest[r];
      }
    }
    cr_assert(t[i].resynced > 0, "trainer %u never re-synced", i);
  }
  cr_assert(drifted_between, "no replica drifted between re-syncs");
  double d;
  float *want = replay_period(p, 1, 0.2, 3, &d);
  cr_assert_eq(memcmp(pulse_loco_global(t[0].ctx), want, P * 4), 0,
               "the UDP run differs from its in-process chunked replay");
  free(want);
  ufree(t, UT);
  pulse_sim_problem_free(p);
}

/* ---------------------------------------------------- hostile datagrams */

typedef struct {
  const uint16_t *ports;
  size_t nports;
  uint64_t P;
  volatile int stop;
  uint64_t sent;
} attacker;

/* A chunk from `sender` of `round` with one entry, valid in form. */
static size_t forged_chunk(uint8_t *buf, uint64_t P, uint32_t sender,
                           uint64_t round, uint64_t base) {
  pulse_loco_payload_header h;
  memset(&h, 0, sizeof h);
  h.sender = sender;
  h.round = round;
  h.samples = 1;
  h.base_digest = base;
  uint64_t pos = 5;
  float val = 1e-3f;
  pulse_buffer out = {NULL, 0};
  uint64_t n;
  cr_assert_eq(pulse_loco_chunks_encode(&h, P, &pos, &val, 1, 1400, &out, &n),
               PULSE_OK);
  size_t cs;
  cr_assert_eq(pulse_loco_chunk_size(out.data, out.size, &cs), PULSE_OK);
  memcpy(buf, out.data, cs);
  pulse_buffer_free(&out);
  return cs;
}

static void *attack(void *arg) {
  attacker *a = arg;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  uint64_t rng = 3;
  uint8_t buf[1500];
  while (!a->stop) {
    for (size_t k = 0; k < a->nports; k++) {
      struct sockaddr_in to;
      memset(&to, 0, sizeof to);
      to.sin_family = AF_INET;
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      to.sin_port = htons(a->ports[k]);
      uint64_t round = pulse_rng_below(&rng, ROUNDS);
      size_t size;
      switch (pulse_rng_below(&rng, 6)) {
      case 0: /* a member's chunk from a foreign socket */
        size = forged_chunk(buf, a->P, (uint32_t)pulse_rng_below(&rng, UT),
                            round, pulse_rng_next(&rng));
        break;
      case 1: /* an unknown sender */
        size = forged_chunk(buf, a->P, 77, round, 0);
        break;
      case 2: /* a flipped bit */
        size = forged_chunk(buf, a->P, 77, round, 0);
        buf[70] ^= 4;
        break;
      case 3: /* truncated */
        size = forged_chunk(buf, a->P, 1, round, 0) - 3;
        break;
      case 4: /* too short for a header */
        size = 1 + pulse_rng_below(&rng, 60);
        memset(buf, 0x50, size);
        break;
      default: /* noise */
        size = 1 + pulse_rng_below(&rng, sizeof buf - 1);
        for (size_t i = 0; i < size; i++)
          buf[i] = (uint8_t)pulse_rng_next(&rng);
      }
      if (sendto(fd, buf, size, 0, (struct sockaddr *)&to, sizeof to) > 0)
        a->sent++;
    }
    usleep(300);
  }
  close(fd);
  return NULL;
}

Test(loco, hostile_datagrams_are_dropped_counted_and_change_nothing,
     .timeout = 300) {
  pulse_sim_problem *p = uproblem();
  uint64_t P = pulse_sim_problem_param_count(p);
  utrainer t[UT];
  memset(t, 0, sizeof t);
  pulse_loco_member m[UT];
  pulse_loco_coord_opts no = udp_opts(0.0);
  ustart(t, UT, p, &no, m);
  uint16_t ports[UT];
  for (uint32_t i = 0; i < UT; i++)
    ports[i] = pulse_loco_coord_udp_port(t[i].node);
  attacker a = {ports, UT, P, 0, 0};
  pthread_t th;
  pthread_create(&th, NULL, attack, &a);
  urun(t, UT);
  a.stop = 1;
  pthread_join(th, NULL);
  uint64_t refused = 0;
  for (uint32_t i = 0; i < UT; i++)
    refused += t[i].refused;
  cr_assert(a.sent > 100, "the attacker sent %llu", (unsigned long long)a.sent);
  cr_assert(refused > 0, "no hostile datagram was counted");
  double d;
  float *want = replay(p, 0, 0.0, &d);
  for (uint32_t i = 0; i < UT; i++)
    cr_assert_eq(memcmp(pulse_loco_global(t[i].ctx), want, P * 4), 0,
                 "trainer %u: hostile datagrams changed the weights", i);
  free(want);
  ufree(t, UT);
  pulse_sim_problem_free(p);
}

Test(loco, udp_options_are_checked) {
  uint64_t P = 1000;
  pulse_loco *ctx = lt_ctx(P, 0, NULL);
  pulse_loco_coord *n = NULL;
  pulse_loco_coord_opts no = udp_opts(0.0);
  no.max_datagram = 100; /* below a full cell */
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  no = udp_opts(0.0);
  no.resync_range = 100; /* not whole cells */
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  no = udp_opts(1.5);
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  no = udp_opts(0.0);
  no.transport = 9;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  cr_assert_null(n);
  uint32_t tr;
  cr_assert_eq(pulse_loco_transport_parse("udp", &tr), PULSE_OK);
  cr_assert_eq(tr, PULSE_LOCO_TRANSPORT_UDP);
  cr_assert_eq(pulse_loco_transport_parse("tcp", &tr), PULSE_ERR_ARG);
  no = udp_opts(0.0);
  no.host = "localhost"; /* an IPv4 address, not a name */
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  no.host = "127.0.0.1";
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_OK);
  cr_assert(strncmp(pulse_loco_coord_url(n), "http://127.0.0.1:", 17) == 0);
  pulse_loco_coord_free(n);
  pulse_loco_free(ctx);
}

/* A port of 127.0.0.1 free a moment ago (bound with port 0, closed):
 * SOCK_STREAM or SOCK_DGRAM. */
static uint16_t free_port(int type) {
  int fd = socket(AF_INET, type, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

Test(loco, listen_ports_are_honoured_and_a_taken_one_is_refused) {
  pulse_loco *ctx = lt_ctx(1000, 0, NULL), *ctx2 = lt_ctx(1000, 1, NULL);
  pulse_loco_coord *n = NULL, *n2 = NULL;
  pulse_loco_coord_opts no = udp_opts(0.0);
  no.port = free_port(SOCK_STREAM);
  no.udp_port = free_port(SOCK_DGRAM);
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_OK, "%s",
               pulse_error_detail());
  char want[64];
  snprintf(want, sizeof want, "http://127.0.0.1:%u", (unsigned)no.port);
  cr_assert_str_eq(pulse_loco_coord_url(n), want);
  cr_assert_eq(pulse_loco_coord_udp_port(n), no.udp_port);
  /* A second member on the same HTTP port, then on the same datagram
   * port: a clear error, nothing left behind. */
  cr_assert_eq(pulse_loco_coord_create(&no, ctx2, &n2), PULSE_ERR_IO);
  cr_assert_null(n2);
  snprintf(want, sizeof want, ":%u", (unsigned)no.port);
  cr_assert(strstr(pulse_error_detail(), want) != NULL, "%s",
            pulse_error_detail());
  uint16_t http = no.port;
  no.port = 0;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx2, &n2), PULSE_ERR_IO);
  cr_assert_null(n2);
  snprintf(want, sizeof want, ":%u", (unsigned)no.udp_port);
  cr_assert(strstr(pulse_error_detail(), want) != NULL, "%s",
            pulse_error_detail());
  /* Port 0 (the default): the kernel's choice, another one. */
  no.udp_port = 0;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx2, &n2), PULSE_OK);
  cr_assert_neq(strcmp(pulse_loco_coord_url(n2), pulse_loco_coord_url(n)), 0);
  pulse_loco_coord_free(n2);
  /* A datagram port without datagrams: refused. */
  pulse_loco_coord_opts_init(&no);
  no.udp_port = 9;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx2, &n2), PULSE_ERR_ARG);
  /* The HTTP port is free again once its node is freed. */
  pulse_loco_coord_free(n);
  pulse_loco_coord_opts_init(&no);
  no.port = http;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx2, &n2), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_loco_coord_free(n2);
  pulse_loco_free(ctx);
  pulse_loco_free(ctx2);
}

Test(loco, member_urls_are_plain_ipv4_literals) {
  uint32_t addr;
  uint16_t port;
  cr_assert(loco_url_parse("http://10.213.0.2:8080", &addr, &port));
  cr_assert_eq(addr, 0x0AD50002u);
  cr_assert_eq(port, 8080);
  cr_assert(loco_url_valid("http://127.0.0.1:1"));
  static const char *bad[] = {
      "http://0.0.0.0:80",     "http://1.2.3:80",       "http://01.2.3.4:80",
      "http://1.2.3.4:0",      "http://256.1.1.1:1",    "http://1.2.3.4:80/x",
      "http://1.2.3.4:65536",  "https://1.2.3.4:80",    "http://1.2.3.4",
      "http://localhost:80",   "http://1.2.3.4.5:80",   "http://1.2.3.-4:80",
      "http://1.2.3.4:+80",    "http://1.2.3.4:080",    ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert(!loco_url_valid(bad[i]), "%s accepted", bad[i]);
}
