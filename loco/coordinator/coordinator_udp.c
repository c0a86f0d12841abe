/* coordinator_udp.c - the exchange's round over datagrams (pulse_loco.h
 * PULSE_LOCO_TRANSPORT_UDP, docs/protocols/loco-datagrams.md "Exchange over datagrams"). For the
 * members M of round r and coordinator c = min(M):
 *
 *   every member   cuts its payload into PLCK chunks (one datagram each)
 *                  and sends each to every other member once; a lost one
 *                  is never resent
 *                  then END_COPIES end markers (PLCE) to each
 *                  takes chunks into its inbox until every sender's cells
 *                  are all here or its end marker came, or every sender
 *                  said it sent all (GET .../sent after quiet_ms without
 *                  a chunk), or the deadline; finishes per cell over what
 *                  arrived (the drop rule)
 *   c              publishes the manifest over HTTP (contributors: who was
 *                  heard, with the cells that reached c and the SHA-256 of
 *                  their arrival map; the members of r + 1) and, as the
 *                  reference replica, the digest of every range of its
 *                  theta_g and b and their values
 *   the others     fetch the manifest (membership), compare their range
 *                  digests with c's; in a re-sync round (the period) fetch
 *                  the ranges that differ and copy them; in between
 *                  estimate their drift from c's range sketches, and
 *                  re-sync only when it exceeds the budget
 *
 * Datagrams that are cut, not from the socket of the member they name,
 * malformed, of another round or base, or duplicates are dropped and
 * counted; those of the next rounds that come early are kept for them. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_loco_testing.h"
#include "endian_impl.h"
#include "coordinator_auth_impl.h"
#include "coordinator_impl.h"
#include "pulse_log.h"

#define EARLY_MAX 16384u /* datagrams of later rounds kept */
#define DIGESTS_HEADER 24u
#define END_MAGIC LOCO_END_MAGIC /* "PLCE" */
#define END_SIZE LOCO_END_SIZE
#define END_COPIES 3u /* all lost at 10% loss: once in 1,000 */
#define YIELD_EVERY 8u /* chunks sent to every member between yields */

/* ------------------------------------------------------------- socket */

pulse_status loco_node_udp_start(pulse_loco_coord *n) {
  uint32_t addr;
  if (!loco_url_parse(n->url, &addr, NULL))
    return pulse_fail(PULSE_ERR_ARG, "loco udp: %s", n->url);
  PULSE_TRY(loco_udp_open(addr, n->opts.udp_port, &n->udp));
  return loco_node_udp_publish_port(n);
}

pulse_status loco_node_udp_publish_port(pulse_loco_coord *n) {
  /* Signed (auth hook) and naming this trainer and its URL: a port served
   * for another member, or by an earlier run of this one, is refused. */
  char text[160];
  int len = snprintf(text, sizeof text, "{\"port\":%u,\"id\":%u,\"url\":\"%s\"}",
                     (unsigned)loco_udp_port(n->udp), n->id, n->url);
  return loco_auth_put(n, "/v1/loco/udp", PULSE_LOCO_AUTH_PORT,
                       pulse_loco_round(n->ctx), text, (size_t)len);
}

uint16_t pulse_loco_coord_udp_port(const pulse_loco_coord *n) {
  return n && n->udp ? loco_udp_port(n->udp) : 0;
}

void loco_node_udp_stop(pulse_loco_coord *n) {
  loco_udp_close(n->udp);
  n->udp = NULL;
  for (loco_datagram *d = n->early, *next; d; d = next) {
    next = d->next;
    free(d);
  }
  n->early = NULL;
  n->nearly = 0;
  free(n->drifted);
  n->drifted = NULL;
}

/* The datagram endpoint of member m: its URL's address, and its port asked
 * once over HTTP. */
static pulse_status peer_port(pulse_loco_coord *n, const pulse_loco_member *m,
                              uint32_t *addr, uint16_t *port) {
  for (size_t i = 0; i < n->npeers; i++)
    if (n->peers[i].id == m->id && strcmp(n->peers[i].url, m->url) == 0)
      return *addr = n->peers[i].addr, *port = n->peers[i].port, PULSE_OK;
  if (!loco_url_parse(m->url, addr, NULL))
    return pulse_fail(PULSE_ERR_ARG, "loco udp: member URL %s", m->url);
  char url[160];
  loco_node_url_fmt(url, sizeof url, m->url, "/v1/loco/udp");
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  /* Signed by that member, any round (auth hook). */
  pulse_status st = loco_auth_get(n, url, n->opts.manifest_timeout_ms, 160,
                                  PULSE_LOCO_AUTH_PORT, 0, UINT64_MAX, m->id,
                                  &b);
  unsigned p = 0, id = 0;
  if (st == PULSE_OK) {
    n->fetched += b.size;
    char text[161], at[72] = "";
    memcpy(text, b.data, b.size);
    text[b.size] = '\0';
    int k = sscanf(text, "{\"port\":%u,\"id\":%u,\"url\":\"%71[^\"]\"}", &p,
                   &id, at);
    /* An older node's {"port":P} names nobody: taken unless this node
     * checks signatures (then it names the member it is for). */
    int named = k == 3 && id == m->id && strcmp(at, m->url) == 0;
    if (k < 1 || p == 0 || p > 65535) {
      st = pulse_fail(PULSE_ERR_CORRUPT, "loco udp: %s: a bad port", url);
    } else if (n->auth != NULL && !named) {
      /* Signed, but by another member or for another URL (an earlier
       * run's): served here again, a replay. */
      loco_auth_count_replayed(n, PULSE_LOCO_AUTH_PORT);
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco udp: %s: a port for another member or URL: a "
                      "replay, refused",
                      url);
    }
  }
  pulse_bytebuf_free(&b);
  if (st != PULSE_OK)
    return st;
  /* The cache keeps the newest entries: a member that left and came back
   * (another URL) replaces an old one at worst. */
  size_t i = n->npeers < LOCO_MAX_MEMBERS ? n->npeers++ : m->id % LOCO_MAX_MEMBERS;
  n->peers[i].id = m->id;
  snprintf(n->peers[i].url, sizeof n->peers[i].url, "%s", m->url);
  n->peers[i].port = (uint16_t)p;
  n->peers[i].addr = *addr;
  *port = (uint16_t)p;
  return PULSE_OK;
}

/* The known endpoint of member `id` of this round, NULL when not known. */
static const loco_udp_peer *known_peer(const pulse_loco_coord *n, uint32_t id) {
  int m = loco_member_find(n->members, n->nmembers, id);
  if (m < 0)
    return NULL;
  for (size_t i = 0; i < n->npeers; i++)
    if (n->peers[i].id == id && strcmp(n->peers[i].url, n->members[m].url) == 0)
      return &n->peers[i];
  return NULL;
}

/* The checks a datagram passes before the inbox decodes it (r: the round
 * being received): it came whole and from the socket of the member it
 * names as its sender (its port learned over HTTP); and, when the node
 * authenticates, its SHA-256 is in the list its sender signed for its
 * round (coordinator_auth.c; an older round's is a replay). A refused datagram
 * is dropped and counted (*auth_refused tells which check) before it can
 * reach the aggregate. A datagram too short to name a sender goes on to
 * the inbox, which counts it. */
static int datagram_admit(pulse_loco_coord *n, uint64_t r,
                          const loco_datagram *d, int *auth_refused) {
  *auth_refused = 0;
  if (d->cut)
    return 0;
  /* End markers pass the same checks as chunks: a marker from anyone
   * else's socket, or not in its sender's signed list, would end a wait
   * for chunks still on their way. */
  int end = d->size == END_SIZE && pulse_load_le32(d->data) == END_MAGIC;
  if (d->size < PULSE_LOCO_CHUNK_HEADER && !end)
    return 1;
  uint32_t sender = pulse_load_le32(d->data + 8);
  const loco_udp_peer *p = known_peer(n, sender);
  if (p == NULL) /* not a member: the inbox counts a chunk's unknown sender */
    return !end;
  if (d->addr != p->addr || d->port != p->port)
    return 0;
  if (!loco_auth_udp_admit(n, r, d))
    return *auth_refused = 1, 0;
  return 1;
}

/* The round a chunk or an end marker names, or UINT64_MAX when it is
 * neither. */
static uint64_t chunk_round(const loco_datagram *d) {
  if (d->size >= END_SIZE && pulse_load_le32(d->data) == END_MAGIC)
    return pulse_load_le64(d->data + 12);
  if (d->size < PULSE_LOCO_CHUNK_HEADER ||
      pulse_load_le32(d->data) != 0x4B434C50u /* "PLCK" */)
    return UINT64_MAX;
  return pulse_load_le64(d->data + 12);
}

/* ------------------------------------------------------- end markers */

/* An end marker (docs/protocols/loco-datagrams.md "Exchange over datagrams"): sender `id` sent
 * all `nchunks` chunks of round r to this receiver. 36 bytes: "PLCE",
 * version 1, 3 zero bytes, u32 sender, u64 round, u64 chunks, u64 the
 * first 8 bytes (LE) of SHA-256 of the marker with this field zeroed. It
 * changes no weight, but one forged and sent first would end a wait for
 * chunks still on their way: with authentication its SHA-256 is the last
 * entry of its sender's signed chunk list. */
static void end_marker(uint8_t out[END_SIZE], uint32_t id, uint64_t r,
                       uint64_t nchunks) {
  uint8_t sha[32];
  memset(out, 0, END_SIZE);
  pulse_store_le32(out, END_MAGIC);
  out[4] = 1;
  pulse_store_le32(out + 8, id);
  pulse_store_le64(out + 12, r);
  pulse_store_le64(out + 20, nchunks);
  loco_sha256(out, END_SIZE, sha);
  memcpy(out + 28, sha, 8);
}

/* Whether d is a well-formed end marker. */
static int end_valid(const loco_datagram *d) {
  if (d->size != END_SIZE || pulse_load_le32(d->data) != END_MAGIC)
    return 0;
  uint8_t want[END_SIZE];
  end_marker(want, pulse_load_le32(d->data + 8), pulse_load_le64(d->data + 12),
             pulse_load_le64(d->data + 20));
  return memcmp(want, d->data, END_SIZE) == 0;
}

/* One datagram for round r: admitted, kept for a later round, an end
 * marker (ended[j] set for member j: it sent all it will), or given to
 * the inbox (which keeps it or counts why not). Frees it unless kept.
 * @return 1 when the inbox kept it, 2 for a member's first end marker. */
static int take_datagram(pulse_loco_coord *n, pulse_loco_inbox *in, uint64_t r,
                          loco_datagram *d, pulse_loco_coord_step_figures *info,
                          uint8_t *ended) {
  int kept = 0, auth_refused;
  uint64_t round = chunk_round(d);
  if (!datagram_admit(n, r, d, &auth_refused)) {
    if (!auth_refused) /* counted in info->datagrams_refused_auth */
      info->datagrams_refused_source++;
  } else if (round != UINT64_MAX && round > r && round <= r + 2 &&
             known_peer(n, pulse_load_le32(d->data + 8)) != NULL &&
             n->nearly < EARLY_MAX) {
    /* A faster member's next round (its chunks are not resent); only
     * from a member's own socket, and bounded: junk cannot pile up. */
    d->next = n->early;
    n->early = d;
    n->nearly++;
    info->datagrams_early++;
    return 0;
  } else if (d->size >= 4 && pulse_load_le32(d->data) == END_MAGIC) {
    /* An end marker; one of an earlier round is late (its receiver had
     * every chunk already) and says nothing. */
    int m = loco_member_find(n->members, n->nmembers,
                             d->size >= 12 ? pulse_load_le32(d->data + 8) : 0);
    if (!end_valid(d))
      info->datagrams_refused_source++; /* a marker that does not fit */
    else if (round == r && m >= 0 && !ended[m])
      kept = 2, ended[m] = 1;
  } else { /* counted by reason when refused */
    kept = pulse_loco_inbox_add(in, d->data, d->size) == PULSE_OK;
  }
  free(d);
  return kept;
}

/* ------------------------------------------------------------ sending */

/* Sends every chunk once to every other member, then END_COPIES end
 * markers to each. Chunk-major, each sender starting with the member after
 * itself: a receiver gets a sender's datagrams spread over its whole burst,
 * and the senders of a round do not all aim at the same member first (on
 * a loaded host a receiver's socket buffer overflows under such a burst:
 * loss nobody injected; at 1M parameters, 8 trainers on 2 cores, 31% of
 * the datagrams of a lossless run when sent member after member). */
static pulse_status send_chunks(pulse_loco_coord *n, uint64_t r,
                                uint64_t end_round, const pulse_buffer *chunks,
                                uint64_t nchunks,
                                pulse_loco_coord_step_figures *info) {
  size_t M = n->nmembers, self = 0;
  uint32_t *addr = calloc(M ? M : 1, sizeof *addr);
  uint16_t *port = calloc(M ? M : 1, sizeof *port); /* 0: not sent to */
  if (addr == NULL || port == NULL) {
    free(addr), free(port);
    return pulse_fail(PULSE_ERR_NOMEM, "loco udp: send");
  }
  for (size_t j = 0; j < M; j++) {
    const pulse_loco_member *m = &n->members[j];
    if (m->id == n->id) {
      self = j;
      continue;
    }
    if (peer_port(n, m, &addr[j], &port[j]) != PULSE_OK) {
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco round %llu: no datagram port for trainer %u: %s",
                   (unsigned long long)r, m->id, pulse_error_detail());
      port[j] = 0; /* as if all its datagrams were lost */
    }
  }
  pulse_status st = PULSE_OK;
  const uint8_t *p = chunks->data;
  size_t left = chunks->size;
  /* Datagrams nchunks, nchunks + 1, ... of each receiver are the end
   * markers: a receiver missing some chunks need not wait to learn that
   * they were lost. */
  uint8_t end[END_SIZE], bad[END_SIZE];
  end_marker(end, n->id, end_round, nchunks);
  /* Fault injection (tests): a marker the receivers must refuse, first,
   * where it would end their wait before any chunk came. */
  unsigned tamper = loco_auth_tamper_end(n);
  if (tamper == LOCO_AUTH_TAMPER_REPLAYED && r >= 3)
    end_marker(bad, n->id, r - 3, nchunks);
  else if (tamper == LOCO_AUTH_TAMPER_FOREIGN)
    end_marker(bad, 0xFFFFFFF0u, r, nchunks);
  else if (tamper != 0 && tamper != LOCO_AUTH_TAMPER_REPLAYED)
    end_marker(bad, n->id, r, nchunks + 1);
  else
    tamper = 0;
  for (size_t t = 1; t < M && tamper != 0 && st == PULSE_OK; t++) {
    size_t j = (self + t) % M;
    int lost = 0;
    if (port[j] != 0)
      st = loco_udp_send(n->udp, addr[j], port[j], bad, END_SIZE, &lost);
  }
  for (uint64_t k = 0; k < nchunks + END_COPIES && st == PULSE_OK; k++) {
    size_t cs = END_SIZE;
    const uint8_t *data = end;
    if (k < nchunks) {
      st = pulse_loco_chunk_size(p, left, &cs);
      data = p;
    }
    for (size_t t = 1; t < M && st == PULSE_OK; t++) {
      size_t j = (self + t) % M;
      if (port[j] == 0)
        continue;
      /* Loss injected below the protocol: the datagram never leaves. */
      if (n->hooks.datagram_drop > 0.0 &&
          pulse_loco_datagram_draw(n->hooks.drop_seed, r, n->id,
                                   n->members[j].id, k) <
              n->hooks.datagram_drop) {
        info->datagrams_dropped += k < nchunks;
        continue;
      }
      int lost = 0; /* refused on the path below us: lost like on the wire */
      st = loco_udp_send(n->udp, addr[j], port[j], data, cs, &lost);
      info->datagrams_sent += k < nchunks;
    }
    if (k < nchunks)
      p += cs, left -= cs;
    /* Every few chunks, the CPU to whoever waits for it: on a host shared
     * by the members, their receive threads drain their sockets before
     * the next burst overflows them. */
    if (k % YIELD_EVERY == YIELD_EVERY - 1)
      sched_yield();
  }
  free(addr), free(port);
  return st;
}

/* ---------------------------------------------------------- receiving */

/* Whether every member whose cells are not all here has sent all its
 * chunks of round r (GET /v1/loco/round/R/sent on it, published after its
 * last datagram; known[j] remembers a yes): what is still missing from it
 * was lost, not late. A sender preempted in the middle of its burst, or
 * still in its inner steps, is told from one whose datagrams were lost
 * without waiting for the deadline. */
static int all_sent(pulse_loco_coord *n, uint64_t r, const pulse_loco_inbox *in,
                    uint8_t *known) {
  uint64_t cells = (n->ctx->n + PULSE_LOCO_CHUNK_CELL - 1) / PULSE_LOCO_CHUNK_CELL;
  for (size_t j = 0; j < n->nmembers; j++) {
    uint8_t sha[32];
    if (known[j] || n->members[j].id == n->id ||
        loco_inbox_arrival(in, n->members[j].id, sha) == cells)
      continue;
    char url[160];
    loco_node_url_fmt(url, sizeof url, n->members[j].url,
                      "/v1/loco/round/%llu/sent", (unsigned long long)r);
    pulse_bytebuf b = PULSE_BYTEBUF_INIT;
    long status = 0;
    loco_sig sig;
    loco_http_get_signed(url, 200, 64, &b, &status, &sig);
    n->fetched += b.size;
    /* Signed by that member for round r (auth hook): a forged or replayed
     * one would end the wait for chunks still on their way. */
    int ok = status == 200 && loco_auth_accept(n, PULSE_LOCO_AUTH_SENT, r,
                                               n->members[j].id, &sig, b.data,
                                               b.size);
    pulse_bytebuf_free(&b);
    if (!ok)
      return 0;
    known[j] = 1;
  }
  return 1;
}

/* Whether every member whose cells are not all here is known to have sent
 * all (its end marker, or its /sent). */
static int all_known(const pulse_loco_coord *n, const pulse_loco_inbox *in,
                     const uint8_t *known) {
  uint64_t cells = (n->ctx->n + PULSE_LOCO_CHUNK_CELL - 1) / PULSE_LOCO_CHUNK_CELL;
  for (size_t j = 0; j < n->nmembers; j++) {
    uint8_t sha[32];
    if (!known[j] && n->members[j].id != n->id &&
        loco_inbox_arrival(in, n->members[j].id, sha) != cells)
      return 0;
  }
  return 1;
}

/* Takes what the socket holds now (after the receive thread drained the
 * kernel's buffer). @return 1 when a chunk was kept. */
static int take_rest(pulse_loco_coord *n, pulse_loco_inbox *in, uint64_t r,
                     pulse_loco_coord_step_figures *info, uint8_t *known) {
  loco_udp_flush(n->udp);
  loco_datagram *d;
  int more = 0;
  while ((d = loco_udp_take(n->udp, 0)) != NULL) {
    n->fetched += d->size;
    info->datagrams_received++;
    more |= take_datagram(n, in, r, d, info, known) == 1;
  }
  return more;
}

static pulse_status receive_round(pulse_loco_coord *n, uint64_t r,
                                  pulse_loco_inbox *in,
                                  pulse_loco_coord_step_figures *info) {
  /* known[j]: member j sent all its chunks of round r (its end marker or
   * its /sent said so). */
  uint8_t *known = calloc(n->nmembers ? n->nmembers : 1, 1);
  if (known == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco udp: receive");
  /* Chunks of this round that came while the last one ran. */
  loco_datagram *early = n->early;
  n->early = NULL;
  n->nearly = 0;
  while (early) {
    loco_datagram *d = early;
    early = d->next;
    d->next = NULL;
    n->fetched += d->size;
    info->datagrams_received++;
    take_datagram(n, in, r, d, info, known);
  }
  uint64_t start = loco_now_ms(), deadline = start + n->opts.deadline_ms;
  uint64_t last = start;
  int ends = 1; /* an end marker came: see whether all are known */
  for (;;) {
    size_t senders, heard, complete;
    loco_inbox_progress(in, &senders, &heard, &complete);
    if (complete == senders)
      break;
    uint64_t now = loco_now_ms();
    if (now >= deadline)
      break;
    /* Every incomplete sender's end marker came: what is missing was
     * lost (once what the socket holds is in); no quiet wait. */
    if (ends && all_known(n, in, known)) {
      if (!take_rest(n, in, r, info, known))
        break;
      continue; /* chunks came with the rest: look again */
    }
    ends = 0;
    if (now >= last + n->opts.quiet_ms) {
      /* Nothing kept for a while (end markers lost too): done when every
       * incomplete sender has sent all it will (and what the socket
       * holds is in). */
      if (all_sent(n, r, in, known) && !take_rest(n, in, r, info, known))
        break;
      last = loco_now_ms(); /* ask again after another quiet wait */
      continue;
    }
    uint64_t until = last + n->opts.quiet_ms < deadline
                         ? last + n->opts.quiet_ms
                         : deadline;
    loco_datagram *d = loco_udp_take(n->udp, until);
    if (d == NULL)
      continue;
    n->fetched += d->size;
    info->datagrams_received++;
    /* Only a kept chunk restarts the quiet wait: a stream of junk must
     * not hold the round open until the deadline. */
    int took = take_datagram(n, in, r, d, info, known);
    if (took == 1)
      last = loco_now_ms();
    ends |= took == 2;
  }
  free(known);
  info->wait_ms = loco_now_ms() - start;
  size_t senders, heard, complete;
  loco_inbox_progress(in, &senders, &heard, &complete);
  PULSE_LOG_AT(PULSE_LOG_DEBUG,
               "loco udp round %llu: trainer %u waited %llu ms: %zu of %zu "
               "senders heard, %zu complete",
               (unsigned long long)r, n->id,
               (unsigned long long)info->wait_ms, heard, senders, complete);
  return PULSE_OK;
}

/* ------------------------------------------------- drift and re-sync */

/* Range k's bytes in the sync blob (theta_g then b of the range, LE FP32):
 * where they start and how many. */
static void sync_span(uint64_t k, uint64_t L, uint64_t P, uint64_t *from,
                      uint64_t *len) {
  *from = 8u * k * L;
  *len = 8u * (P - k * L < L ? P - k * L : L);
}

/* The signed list of the SHA-256 of each range of the sync blob of round
 * r (/v1/loco/round/R/syncsums): what a member checks each range it
 * copies against. */
static pulse_status publish_sync_sums(pulse_loco_coord *n, uint64_t r,
                                      const uint8_t *sync, uint64_t count) {
  uint8_t *sums = malloc((size_t)count * 32u);
  if (sums == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco udp: sync sums");
  for (uint64_t k = 0; k < count; k++) {
    uint64_t from, len;
    sync_span(k, n->opts.resync_range, n->ctx->n, &from, &len);
    loco_sha256(sync + from, (size_t)len, sums + 32u * k);
  }
  char path[96];
  snprintf(path, sizeof path, "/v1/loco/round/%llu/syncsums",
           (unsigned long long)r);
  pulse_status st = loco_auth_put(n, path, PULSE_LOCO_AUTH_SYNC, r, sums,
                                  (size_t)count * 32u);
  free(sums);
  return st;
}

/* The reference replica's view of its state after round r: the digest of
 * every range (and of its whole theta_g: the next round's base), every
 * range's theta_g then b (LE FP32), back to back, so a run of ranges is one
 * byte range of one blob, and with a period above 1 every range's sketch
 * (drift estimated between re-syncs without the values). */
static pulse_status publish_reference(pulse_loco_coord *n, uint64_t r) {
  const pulse_loco *ctx = n->ctx;
  uint64_t L = n->opts.resync_range, P = ctx->n;
  uint64_t count = (P + L - 1) / L;
  size_t dsize = DIGESTS_HEADER + 8u * (size_t)count;
  uint8_t *dg = malloc(dsize);
  uint8_t *sync = malloc((size_t)(8u * P));
  int sketched = n->opts.resync_period > 1;
  size_t ssize = sketched ? 8u * PULSE_LOCO_SKETCH * (size_t)count : 1u;
  uint8_t *sk = malloc(ssize);
  pulse_status st = PULSE_OK;
  if (dg == NULL || sync == NULL || sk == NULL) {
    free(dg), free(sync), free(sk);
    return pulse_fail(PULSE_ERR_NOMEM, "loco udp: reference");
  }
  pulse_store_le32(dg, (uint32_t)L);
  pulse_store_le32(dg + 4, 0);
  pulse_store_le64(dg + 8, count);
  pulse_store_le64(dg + 16, ctx->digest);
  uint8_t *q = sync;
  for (uint64_t k = 0; k < count; k++) {
    uint64_t a = k * L, len = P - a < L ? P - a : L, digest;
    pulse_loco_range_digest(ctx, a, len, &digest);
    pulse_store_le64(dg + DIGESTS_HEADER + 8u * k, digest);
    if (sketched) {
      double v[PULSE_LOCO_SKETCH];
      pulse_loco_range_sketch(ctx, a, len, v);
      for (unsigned j = 0; j < PULSE_LOCO_SKETCH; j++) {
        uint64_t bits;
        memcpy(&bits, &v[j], 8);
        pulse_store_le64(sk + 8u * (PULSE_LOCO_SKETCH * k + j), bits);
      }
    }
    const float *src[2] = {ctx->theta_g + a, ctx->b + a};
    for (int s = 0; s < 2; s++)
      for (uint64_t i = 0; i < len; i++, q += 4) {
        uint32_t bits;
        memcpy(&bits, &src[s][i], 4);
        pulse_store_le32(q, bits);
      }
  }
  /* Digests and sketches signed as they are; the sync blob is read by
   * ranges, so the SHA-256 of each range's bytes is signed instead, in
   * one list (auth hooks). */
  char path[96];
  snprintf(path, sizeof path, "/v1/loco/round/%llu/digests",
           (unsigned long long)r);
  st = loco_auth_put(n, path, PULSE_LOCO_AUTH_DIGESTS, r, dg, dsize);
  snprintf(path, sizeof path, "/v1/loco/round/%llu/sync",
           (unsigned long long)r);
  if (st == PULSE_OK)
    st = loco_server_put(n->srv, path, sync, (size_t)(8u * P));
  snprintf(path, sizeof path, "/v1/loco/round/%llu/sketch",
           (unsigned long long)r);
  if (st == PULSE_OK && sketched)
    st = loco_auth_put(n, path, PULSE_LOCO_AUTH_SKETCH, r, sk, ssize);
  if (st == PULSE_OK && n->auth != NULL)
    st = publish_sync_sums(n, r, sync, count);
  free(dg), free(sync), free(sk);
  return st;
}

static double sum_sq(const float *x, uint64_t n) {
  double s = 0.0;
  for (uint64_t i = 0; i < n; i++)
    s += (double)x[i] * (double)x[i];
  return s;
}

/* The reference's sketches of round r (PULSE_LOCO_SKETCH doubles a range,
 * count ranges) into out. */
static pulse_status fetch_sketch(pulse_loco_coord *n, const char *coord,
                                 uint32_t coord_id, uint64_t r, uint64_t count,
                                 double *out, uint64_t *fetched) {
  char url[160];
  loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/round/%llu/sketch",
                    (unsigned long long)r);
  size_t want = 8u * PULSE_LOCO_SKETCH * (size_t)count;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_status st =
      loco_auth_get(n, url, n->opts.manifest_timeout_ms, want,
                    PULSE_LOCO_AUTH_SKETCH, r, r, coord_id, &b); /* auth hook */
  if (st == PULSE_OK) {
    *fetched += b.size;
    if (b.size != want)
      st = pulse_fail(PULSE_ERR_CORRUPT, "loco udp: the reference's sketch "
                                         "does not fit");
    for (size_t i = 0; st == PULSE_OK && i < want / 8u; i++) {
      uint64_t bits = pulse_load_le64(b.data + 8u * i);
      memcpy(&out[i], &bits, 8);
      if (!isfinite(out[i]))
        st = pulse_fail(PULSE_ERR_CORRUPT, "loco udp: sketch not finite");
    }
  }
  pulse_bytebuf_free(&b);
  return st;
}

/* A member after round r: compares its range digests with the reference's
 * (coordinator `coord`). In a re-sync round ((r + 1) a multiple of the
 * period) it fetches the ranges that differ, measures its drift and copies
 * them; in between it estimates its drift from the reference's sketches
 * and keeps the differing ranges (the base of its next chunks is then the
 * reference's digest, and those ranges are flagged), unless the estimate
 * exceeds the budget, which re-syncs as in a re-sync round. */
static pulse_status check_drift(pulse_loco_coord *n, const char *coord,
                                uint32_t coord_id, uint64_t r, float *theta_r,
                                pulse_loco_coord_step_figures *info) {
  pulse_loco *ctx = n->ctx;
  uint64_t L = n->opts.resync_range, P = ctx->n;
  uint64_t count = (P + L - 1) / L;
  if (n->hooks.drift_probe != NULL) /* before anything is re-synced */
    n->hooks.drift_probe(n->hooks.drift_probe_user, r, ctx->theta_g);
  char url[160];
  loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/round/%llu/digests",
                    (unsigned long long)r);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  uint8_t *differ = NULL;
  float *ref = NULL;
  double *sketch = NULL;
  uint64_t fetched = 0;
  uint8_t *sums = NULL; /* the signed SHA-256 of each sync range */
  pulse_status st = loco_auth_get(n, url, n->opts.manifest_timeout_ms,
                                  DIGESTS_HEADER + 8u * (size_t)count,
                                  PULSE_LOCO_AUTH_DIGESTS, r, r, coord_id,
                                  &b); /* auth hook */
  if (st != PULSE_OK)
    goto done;
  fetched += b.size;
  if (b.size != DIGESTS_HEADER + 8u * count || pulse_load_le32(b.data) != L ||
      pulse_load_le64(b.data + 8) != count) {
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco udp: the reference's digests do not fit (ranges of "
                    "%llu)",
                    (unsigned long long)L);
    goto done;
  }
  uint64_t base = pulse_load_le64(b.data + 16);
  differ = calloc((size_t)count, 1);
  if (differ == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco udp: drift check");
    goto done;
  }
  uint32_t ndiff = 0;
  for (uint64_t k = 0; k < count; k++) {
    uint64_t a = k * L, len = P - a < L ? P - a : L, digest;
    pulse_loco_range_digest(ctx, a, len, &digest);
    differ[k] = digest != pulse_load_le64(b.data + DIGESTS_HEADER + 8u * k);
    ndiff += differ[k];
  }
  info->drift_ranges = ndiff;
  free(n->drifted);
  n->drifted = NULL;
  if (ndiff == 0)
    goto done; /* the same bits as the reference */
  if ((r + 1) % n->opts.resync_period != 0) {
    sketch = malloc((size_t)count * PULSE_LOCO_SKETCH * sizeof *sketch);
    st = sketch ? fetch_sketch(n, coord, coord_id, r, count, sketch, &fetched)
                : pulse_fail(PULSE_ERR_NOMEM, "loco udp: drift check");
    if (st != PULSE_OK)
      goto done;
    info->drift = pulse_loco_drift_estimate(ctx, L, differ, sketch);
    if (info->drift <= n->opts.drift_budget) {
      n->drifted = differ; /* kept until the next check */
      n->ref_base = base;
      differ = NULL;
      goto done;
    }
  }
  ref = malloc((size_t)(2u * P) * sizeof *ref); /* by range: theta, b */
  if (ref == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco udp: drift check");
    goto done;
  }
  if (n->auth != NULL) { /* auth hook: the ranges' signed SHA-256 */
    loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/round/%llu/syncsums",
                      (unsigned long long)r);
    st = loco_auth_get(n, url, n->opts.manifest_timeout_ms,
                       (size_t)count * 32u, PULSE_LOCO_AUTH_SYNC, r, r,
                       coord_id, &b);
    if (st == PULSE_OK && b.size != count * 32u)
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco udp: the reference's sync sums do not fit");
    if (st == PULSE_OK)
      sums = malloc((size_t)count * 32u);
    if (st == PULSE_OK && sums == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "loco udp: drift check");
    if (st != PULSE_OK)
      goto done;
    fetched += b.size;
    loco_auth_count_bytes(n, b.size);
    memcpy(sums, b.data, (size_t)count * 32u);
  }
  /* Each run of differing ranges in one request of the sync blob. */
  loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/round/%llu/sync",
                    (unsigned long long)r);
  for (uint64_t k = 0; k < count && st == PULSE_OK;) {
    if (!differ[k]) {
      k++;
      continue;
    }
    uint64_t k1 = k;
    while (k1 < count && differ[k1])
      k1++;
    uint64_t from = 8u * k * L, to = 8u * (k1 * L < P ? k1 * L : P);
    st = loco_http_get_range(url, from, to - from, n->opts.manifest_timeout_ms,
                             &b);
    /* Each range's bytes are the ones the reference signed (auth). */
    for (uint64_t j = k; st == PULSE_OK && sums != NULL && j < k1; j++) {
      uint64_t at, len;
      uint8_t sha[32];
      sync_span(j, L, P, &at, &len);
      loco_sha256(b.data + (at - from), (size_t)len, sha);
      if (memcmp(sha, sums + 32u * j, 32) != 0)
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "loco udp: re-sync range %llu of round %llu is not "
                        "the one the reference signed: refused",
                        (unsigned long long)j, (unsigned long long)r);
    }
    if (st == PULSE_OK) {
      fetched += b.size;
      for (uint64_t i = 0; i < (to - from) / 4u; i++) {
        uint32_t bits = pulse_load_le32(b.data + 4u * i);
        memcpy(&ref[2u * k * L + i], &bits, 4);
      }
    }
    k = k1;
  }
  if (st != PULSE_OK)
    goto done;
  /* Drift against the reference: only the differing ranges differ. */
  double diff = 0.0, own = sum_sq(ctx->theta_g, P), norm = own;
  for (uint64_t k = 0; k < count; k++) {
    if (!differ[k])
      continue;
    uint64_t a = k * L, len = P - a < L ? P - a : L;
    const float *rt = ref + 2u * a;
    for (uint64_t i = 0; i < len; i++) {
      double d = (double)ctx->theta_g[a + i] - (double)rt[i];
      diff += d * d;
    }
    norm += sum_sq(rt, len) - sum_sq(ctx->theta_g + a, len);
  }
  info->drift = norm > 0.0 ? sqrt(diff / norm) : 0.0;
  for (uint64_t k = 0; k < count && st == PULSE_OK; k++) {
    if (!differ[k])
      continue;
    uint64_t a = k * L, len = P - a < L ? P - a : L;
    st = pulse_loco_resync_range(ctx, a, len, ref + 2u * a, ref + 2u * a + len);
    info->resynced_ranges += st == PULSE_OK;
  }
  if (st == PULSE_OK)
    memcpy(theta_r, ctx->theta_g, (size_t)P * sizeof *theta_r);
done:
  info->resync_bytes += fetched;
  n->fetched += fetched;
  pulse_bytebuf_free(&b);
  free(differ), free(ref), free(sketch), free(sums);
  return st;
}

/* -------------------------------------------------------------- round */

/* The coordinator's end of round r: manifest and reference. */
static pulse_status close_round(pulse_loco_coord *n, uint64_t r, int leaving,
                                const pulse_loco_inbox *in,
                                pulse_loco_coord_step_figures *info) {
  size_t M = n->nmembers, c = 0;
  loco_contrib_ref *refs = calloc(M, sizeof *refs);
  if (refs == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco udp: manifest");
  for (size_t j = 0; j < M; j++) {
    uint32_t id = n->members[j].id;
    if (id == n->id) {
      refs[c].id = id;
      refs[c].bytes = (n->ctx->n + PULSE_LOCO_CHUNK_CELL - 1) /
                      PULSE_LOCO_CHUNK_CELL; /* all its own cells */
      memset(refs[c++].sha256, 0, 32);
      continue;
    }
    uint8_t sha[32];
    uint64_t cells = loco_inbox_arrival(in, id, sha);
    /* Silence (not one datagram in the round) counts as a miss. */
    n->misses[j] = cells == 0 ? n->misses[j] + 1 : 0;
    if (cells == 0)
      continue;
    refs[c].id = id;
    refs[c].bytes = cells;
    memcpy(refs[c++].sha256, sha, 32);
  }
  info->contributors = (uint32_t)c;
  pulse_loco_member next[LOCO_MAX_MEMBERS];
  size_t nn = 0;
  pulse_status st = publish_reference(n, r);
  if (st == PULSE_OK)
    st = loco_node_close_round(n, r, leaving, refs, c, next, &nn);
  free(refs);
  if (st != PULSE_OK)
    return st;
  n->coordinated = 1;
  n->coordinated_round = r;
  free(n->drifted); /* the reference now, whatever it was before */
  n->drifted = NULL;
  memcpy(n->owed, next, nn * sizeof *next);
  n->nowed = nn;
  loco_node_set_members(n, next, nn);
  st = loco_node_publish_state(n);
  if (st == PULSE_OK && leaving) /* the others still need this round's data */
    pulse_loco_coord_linger(n, n->opts.manifest_timeout_ms);
  return st;
}

/* A member's end of round r: the manifest (members of r + 1), the drift
 * check, the state, the acknowledgement. */
static pulse_status follow_round(pulse_loco_coord *n, const char *coord,
                                 uint64_t r, float *theta_r,
                                 pulse_loco_coord_step_figures *info) {
  uint32_t coord_id = n->members[0].id; /* before the members change */
  char url[160];
  loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/round/%llu/manifest",
                    (unsigned long long)r);
  loco_manifest man;
  memset(&man, 0, sizeof man);
  pulse_status st = loco_auth_get_manifest(n, url, r, n->members[0].id,
                                           &man); /* checked (auth hook) */
  if (st == PULSE_OK &&
      (man.round != r || man.coordinator != n->members[0].id ||
       !man.has_contributors || man.ncontrib == 0))
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco udp: manifest of round %llu does not fit",
                    (unsigned long long)r);
  if (st == PULSE_OK) {
    info->contributors = (uint32_t)man.ncontrib;
    for (size_t k = 0; k < man.ncontrib; k++)
      info->self_included |= man.contrib[k].id == n->id;
    loco_node_set_members(n, man.members, man.nmembers);
    st = check_drift(n, coord, man.coordinator, r, theta_r, info);
  }
  loco_manifest_free(&man);
  if (st != PULSE_OK) {
    /* No manifest or no reference: take the reference's whole state (the
     * round's aggregate is already in; e is kept). */
    PULSE_LOG_AT(PULSE_LOG_WARN, "loco udp round %llu: trainer %u: %s; "
                 "re-syncing the whole state",
                 (unsigned long long)r, n->id, pulse_error_detail());
    free(n->drifted); /* the reference's state */
    n->drifted = NULL;
    st = loco_node_catch_up(n, coord, coord_id, r + 1, theta_r,
                            loco_now_ms() + n->opts.manifest_timeout_ms);
    info->resynced = st == PULSE_OK;
  }
  if (st == PULSE_OK)
    st = loco_node_publish_state(n); /* for joiners that ask this member */
  if (st == PULSE_OK) /* signed (auth hook) */
    loco_auth_post(n, coord, PULSE_LOCO_AUTH_DONE, r,
                   n->opts.manifest_timeout_ms);
  return st;
}

pulse_status loco_node_udp_round(pulse_loco_coord *n, uint64_t r, int leaving,
                                 float *theta_r, pulse_loco_coord_step_figures *info) {
  pulse_loco *ctx = n->ctx;
  char coord[sizeof n->members[0].url];
  snprintf(coord, sizeof coord, "%s", n->members[0].url);
  int coordinator = n->members[0].id == n->id;
  if (leaving && !coordinator) /* signed (auth hook) */
    loco_auth_post(n, coord, PULSE_LOCO_AUTH_LEAVE, r,
                   n->opts.manifest_timeout_ms);
  /* The prepared payload's entries as chunks. */
  pulse_loco_payload_header h;
  pulse_buffer chunks = {NULL, 0};
  uint64_t nchunks = 0;
  pulse_loco_inbox *in = NULL;
  uint32_t *ids = malloc((n->nmembers ? n->nmembers : 1) * sizeof *ids);
  pulse_status st =
      ids ? pulse_loco_payload_peek(ctx->payload.data, ctx->payload.size, &h)
          : pulse_fail(PULSE_ERR_NOMEM, "loco udp: members");
  /* A replica left drifted since its last re-sync names the reference's
   * base and flags the ranges where it differs (docs/formats/loco-chunks.md "Drift"). */
  if (st == PULSE_OK && n->drifted)
    h.base_digest = n->ref_base;
  if (st == PULSE_OK)
    st = pulse_loco_chunks_encode(&h, ctx->n, ctx->sent_pos, ctx->sent_val,
                                  ctx->sent_count, n->opts.max_datagram,
                                  &chunks, &nchunks);
  if (st == PULSE_OK && n->drifted)
    st = pulse_loco_chunks_mark_drifted(&chunks, nchunks, ctx->n, n->drifted,
                                        n->opts.resync_range);
  if (st == PULSE_OK) {
    info->payload_bytes = chunks.size;
    for (size_t j = 0; j < n->nmembers; j++)
      ids[j] = n->members[j].id;
    st = pulse_loco_inbox_create(ctx, ids, n->nmembers, &in);
  }
  if (st == PULSE_OK && n->drifted)
    st = pulse_loco_inbox_set_drift(in, n->ref_base, n->drifted,
                                    n->opts.resync_range);
  /* The signed list of the chunks' digests goes first: a receiver checks
   * every chunk against it (auth hook). */
  if (st == PULSE_OK) {
    uint8_t end[END_SIZE];
    end_marker(end, n->id, r, nchunks); /* listed too: sent after them */
    st = loco_auth_udp_publish(n, r, &chunks, nchunks, end, END_SIZE);
  }
  if (st == PULSE_OK) {
    uint64_t nsend = nchunks;
    const pulse_buffer *out = loco_auth_udp_outgoing(n, &chunks, &nsend);
    /* Under the REPLAYED fault, the last round's datagrams, its end
     * markers included. */
    st = send_chunks(n, r, out == &chunks ? r : r - 1, out, nsend, info);
  }
  if (st == PULSE_OK) {
    /* Sent (some maybe lost): a receiver that heard nothing from this
     * trainer learns here that it need not wait. */
    char path[64], text[48];
    snprintf(path, sizeof path, "/v1/loco/round/%llu/sent",
             (unsigned long long)r);
    int len = snprintf(text, sizeof text, "{\"chunks\":%llu}",
                       (unsigned long long)nchunks);
    st = loco_auth_put(n, path, PULSE_LOCO_AUTH_SENT, r, text, (size_t)len);
  }
  if (st == PULSE_OK)
    st = receive_round(n, r, in, info);
  if (st == PULSE_OK) {
    pulse_loco_inbox_figures_get(in, &info->chunks);
    info->self_included = 1;
    st = pulse_loco_finish_inbox(ctx, in, theta_r, NULL);
  }
  if (st == PULSE_OK)
    st = coordinator ? close_round(n, r, leaving, in, info)
                     : follow_round(n, coord, r, theta_r, info);
  PULSE_LOG_AT(PULSE_LOG_DEBUG,
               "loco udp round %llu: trainer %u %s: %s, drift %g, %u ranges "
               "differ, %u re-synced",
               (unsigned long long)r, n->id,
               coordinator ? "closed the round" : "followed",
               pulse_status_name(st), info->drift, info->drift_ranges,
               info->resynced_ranges);
  pulse_loco_inbox_free(in);
  pulse_buffer_free(&chunks);
  free(ids);
  return st;
}
