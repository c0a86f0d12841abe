/* manifest_impl.h - private to loco/: the JSON documents of the exchange
 * (docs/protocols/loco-exchange.md, "Exchange"): a round's manifest, decided by its coordinator
 * (who contributed, with sizes and SHA-256 of their payloads, and the
 * members of the next round), and a node's view of the membership. */
#ifndef PULSE_LOCO_MANIFEST_IMPL_H
#define PULSE_LOCO_MANIFEST_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bytebuf_impl.h"
#include "peer_http_impl.h"
#include "pulse_loco.h"

#define LOCO_MAX_MEMBERS 1024u

typedef struct {
  uint32_t id;
  uint64_t bytes;
  uint8_t sha256[32];
  /* The payload's sample count, written only when non-zero ("samples",
   * what a collaboration's writer granted; members reducing partitioned
   * ranges check slices against it); 0 when absent. */
  uint64_t samples;
  /* The contributor's download rate in bytes per second as its writer
   * lists it ("bandwidth", docs/protocols/loco-collaboration.md "Collaboration"): what partitioned
   * range sizes follow; loco_bandwidth_quantize's form, 0 when absent. */
  uint64_t bandwidth;
} loco_contrib_ref;

/* A reported rate as a manifest lists it: clamped to [LOCO_BW_MIN,
 * LOCO_BW_MAX] bytes/s and cut to its 4 leading bits (steps of at most
 * 1/8: round-to-round noise rarely moves a range), so that the writer
 * writes, and every member plans from, one exact integer. 0 (not
 * measured) stays 0. A manifest's non-zero "bandwidth" must be in this
 * form. */
#define LOCO_BW_MIN 1024ull
#define LOCO_BW_MAX (1ull << 40)
uint64_t loco_bandwidth_quantize(uint64_t bytes_per_s);

/* A manifest (contributors present) or a membership view (none). */
typedef struct {
  uint64_t round; /* manifest: the round decided; view: the next round */
  uint32_t coordinator;
  int has_contributors;
  loco_contrib_ref *contrib; /* increasing ids */
  size_t ncontrib;
  pulse_loco_member *members; /* manifest: of round + 1; increasing ids */
  size_t nmembers;
} loco_manifest;

/* "http://A.B.C.D:PORT": an IPv4 address (not 0.0.0.0) and PORT 1..65535,
 * every number written plainly (trainers on 127.0.0.1, or on the
 * addresses of other hosts or network namespaces). */
int loco_url_valid(const char *url);

/* A collaboration member in client mode (docs/protocols/loco-collaboration.md "Collaboration"):
 * "http://A.B.C.D:PORT/v1/hosted/ID", the URL of the serving member that
 * hosts it (into base, cap bytes, when not NULL) and its id (*id). 0 for
 * anything else. */
int loco_url_hosted(const char *url, char *base, size_t cap, uint32_t *id);

/* A member's URL in a manifest or membership view: loco_url_valid, or
 * loco_url_hosted naming the member's own id. */
int loco_member_url_valid(const char *url, uint32_t id);

/* loco_url_valid, giving the address (host order) and the port. */
int loco_url_parse(const char *url, uint32_t *addr, uint16_t *port);

/* The one rule for a number in a URL, a path or an id: decimal digits
 * only (no sign, no leading zero), at most `digits` of them, ended by
 * `stop` ('\0' or '/'). loco_take_decimal reads one at *p and moves *p
 * past its stop; 0 (and *p unmoved) when the text breaks the rule. */
int loco_take_decimal(const char **p, unsigned digits, char stop,
                      uint64_t *out);

/* A whole string that is one such number <= UINT32_MAX. */
int loco_parse_id(const char *s, uint32_t *id);

pulse_status loco_manifest_write(const loco_manifest *m, pulse_bytebuf *out);

/* Parses untrusted JSON; every id, count, URL and hash is checked (ids
 * strictly increasing, at most LOCO_MAX_MEMBERS). m owns its arrays on
 * success; free with loco_manifest_free. */
pulse_status loco_manifest_parse(const uint8_t *data, size_t size,
                                 loco_manifest *m);
void loco_manifest_free(loco_manifest *m);

/* Members (the exchange's node, the collaboration peer): the index of
 * `id` in m[0, n), or -1; and a qsort comparison by id. */
int loco_member_find(const pulse_loco_member *m, size_t n, uint32_t id);
int loco_member_by_id(const void *a, const void *b);

/* A run's founding members, as pulse_loco_coord_start and
 * pulse_loco_collab_start take them: count (1..LOCO_MAX_MEMBERS) members
 * copied into sorted (room for count) in increasing id, each with a valid
 * URL and a distinct id, `self` among them. Errors name `who` ("loco
 * node") and what `self` is ("node"); hosted_ok: client-mode members'
 * URLs (loco_url_hosted) are fine too. @return PULSE_OK or PULSE_ERR_ARG. */
pulse_status loco_members_founding(const pulse_loco_member *members, size_t count,
                                   uint32_t self, const char *who, const char *self_is,
                                   int hosted_ok, pulse_loco_member *sorted);

/* What every kind of node serves for joiners and re-syncs (pulse_loco_coord,
 * coordinator.c; the collaboration peer, collab.c): the membership view of the
 * round `round` at /v1/loco/members, and the context's state at
 * /v1/loco/state/ROUND, the previous round's kept too (a member re-syncing
 * from round r - 1 may ask after this node moved on). */
pulse_status loco_serve_view(loco_server *srv, uint64_t round, uint32_t coordinator,
                             pulse_loco_member *members, size_t count);
pulse_status loco_serve_state(loco_server *srv, const pulse_loco *ctx);

#endif
