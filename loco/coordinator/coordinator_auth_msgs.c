/* coordinator_auth_msgs.c - the exchange's signed messages other than
 * payloads and manifests (coordinator_auth_impl.h, docs/formats/loco-payload.md
 * "Authentication"): the membership view and the state a joiner or a
 * re-syncing member loads, signed by the node that serves them; leave and
 * done POSTs, signed by the trainer they speak for. Each is checked before
 * anything is taken from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator_auth_impl.h"
#include "coordinator_impl.h"
#include "loco_impl.h"
#include "status_impl.h"

/* As coordinator.c's MANIFEST_CAP: the largest view fetched. */
#define VIEW_MAX ((size_t)LOCO_MAX_MEMBERS * 256u + 4096u)

void loco_auth_post(pulse_loco_coord *n, const char *coord,
                    pulse_loco_auth_kind kind, uint64_t r,
                    unsigned timeout_ms) {
  char text[160], query[300], url[600];
  if (kind == PULSE_LOCO_AUTH_LEAVE)
    snprintf(text, sizeof text, "/v1/loco/leave?id=%u", n->id);
  else
    snprintf(text, sizeof text, "/v1/loco/round/%llu/done?id=%u",
             (unsigned long long)r, n->id);
  loco_auth_sign_query(n, kind, r, text, query, sizeof query, NULL);
  snprintf(url, sizeof url, "%s%s%s", coord, text, query);
  long status;
  loco_http_post(url, timeout_ms, &status);
}

pulse_status loco_auth_get(pulse_loco_coord *n, const char *url,
                           unsigned timeout_ms, size_t cap,
                           pulse_loco_auth_kind kind, uint64_t floor,
                           uint64_t ceiling, uint32_t id, pulse_bytebuf *body) {
  if (n->auth == NULL)
    return loco_http_wait(url, timeout_ms, cap, body);
  loco_sig sig;
  PULSE_TRY(loco_http_wait_signed(url, timeout_ms, cap, body, &sig));
  if (loco_auth_accept_window(n, kind, floor, ceiling, id, &sig, body->data,
                              body->size, NULL))
    return PULSE_OK;
  char why[256];
  snprintf(why, sizeof why, "%s", pulse_error_detail());
  return pulse_fail(PULSE_ERR_CORRUPT, "loco node: %s refused (%s)", url, why);
}

pulse_status loco_auth_get_view(pulse_loco_coord *n, const char *url,
                                unsigned timeout_ms, uint32_t signer,
                                loco_manifest *view) {
  if (n->auth == NULL)
    return loco_node_get_json(url, timeout_ms, view, &n->fetched);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  loco_sig sig;
  pulse_status st = loco_http_wait_signed(url, timeout_ms, VIEW_MAX, &b, &sig);
  if (st != PULSE_OK) {
    pulse_bytebuf_free(&b);
    return st;
  }
  n->fetched += b.size;
  /* Parsed first (checked, nothing taken from it yet) for the round it
   * names; the signature then binds it. */
  st = loco_manifest_parse(b.data, b.size, view);
  uint64_t floor = loco_auth_round_now(n);
  if (st == PULSE_OK &&
      !loco_auth_accept_window(n, PULSE_LOCO_AUTH_MEMBERS, floor, view->round,
                               signer, &sig, b.data, b.size, NULL)) {
    char why[256];
    snprintf(why, sizeof why, "%s", pulse_error_detail());
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco node: the view at %s is refused "
                    "(%s)",
                    url, why);
  } else if (st == PULSE_OK && sig.round != view->round) {
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco node: the view at %s names round "
                    "%llu, its signature round %llu",
                    url, (unsigned long long)view->round,
                    (unsigned long long)sig.round);
  }
  if (st != PULSE_OK)
    loco_manifest_free(view);
  pulse_bytebuf_free(&b);
  return st;
}

pulse_status loco_auth_put_view(pulse_loco_coord *n, uint64_t round,
                                uint32_t coordinator) {
  loco_manifest v;
  memset(&v, 0, sizeof v);
  v.round = round;
  v.coordinator = coordinator;
  v.members = n->members;
  v.nmembers = n->nmembers;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_status st = loco_manifest_write(&v, &b);
  if (st == PULSE_OK)
    st = loco_auth_put(n, "/v1/loco/members", PULSE_LOCO_AUTH_MEMBERS, round,
                       b.data, b.size);
  pulse_bytebuf_free(&b);
  return st;
}

pulse_status loco_auth_put_state(pulse_loco_coord *n) {
  pulse_buffer state = {NULL, 0};
  PULSE_TRY(pulse_loco_state_export(n->ctx, &state));
  char path[64];
  uint64_t r = pulse_loco_round(n->ctx);
  snprintf(path, sizeof path, "/v1/loco/state/%llu", (unsigned long long)r);
  pulse_status st =
      loco_auth_put(n, path, PULSE_LOCO_AUTH_STATE, r, state.data, state.size);
  pulse_buffer_free(&state);
  loco_server_drop(n->srv, "/v1/loco/state/", r > 0 ? r - 1 : 0);
  return st;
}

pulse_status loco_auth_put_admission(pulse_loco_coord *n, uint32_t id,
                                     uint64_t r) {
  char path[64], text[96];
  snprintf(path, sizeof path, "/v1/loco/join/%u", id);
  if (n->auth == NULL) {
    int len =
        snprintf(text, sizeof text, "{\"round\":%llu}", (unsigned long long)r);
    return loco_server_put(n->srv, path, text, (size_t)len);
  }
  int len = snprintf(
      text, sizeof text, "{\"round\":%llu,\"id\":%u,\"seq\":%llu}",
      (unsigned long long)r, id, (unsigned long long)loco_auth_join_seq(n, id));
  return loco_auth_put(n, path, PULSE_LOCO_AUTH_JOINED, r, text, (size_t)len);
}

pulse_status loco_auth_get_admission(pulse_loco_coord *n, const char *url,
                                     unsigned timeout_ms, uint32_t coordinator,
                                     uint64_t seq, uint64_t *round) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  /* Any round: a joiner runs none yet (the number binds it to its join). */
  pulse_status st =
      loco_auth_get(n, url, timeout_ms, 256, PULSE_LOCO_AUTH_JOINED, 0,
                    UINT64_MAX, coordinator, &b);
  char text[257];
  size_t k = b.size < sizeof text - 1 ? b.size : sizeof text - 1;
  if (st == PULSE_OK) {
    memcpy(text, b.data, k);
    text[k] = '\0';
  }
  pulse_bytebuf_free(&b);
  if (st != PULSE_OK)
    return st;
  unsigned long long r = 0, s = 0;
  unsigned id = 0;
  if (n->auth == NULL) {
    if (sscanf(text, "{\"round\":%llu", &r) != 1 || r == 0)
      return pulse_fail(PULSE_ERR_CORRUPT, "loco join: bad admission");
    *round = r;
    return PULSE_OK;
  }
  int used = 0;
  if (sscanf(text, "{\"round\":%llu,\"id\":%u,\"seq\":%llu}%n", &r, &id, &s,
             &used) != 3 ||
      used == 0 || text[used] != '\0' || r == 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco join: bad admission");
  if (id != n->id || s != seq) {
    /* Signed, but for another join (an earlier one of this trainer, or
     * another trainer's): not this join's answer. */
    loco_auth_count_replayed(n, PULSE_LOCO_AUTH_JOINED);
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco join: an admission for trainer %u's join %llu, "
                      "not this one's (%u, %llu): a replay, refused",
                      id, s, n->id, (unsigned long long)seq);
  }
  *round = r;
  return PULSE_OK;
}
