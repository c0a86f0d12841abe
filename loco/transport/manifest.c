/* manifest.c - JSON of round manifests and membership views
 * (manifest_impl.h), parsed with codec's strict JSON parser. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_impl.h"
#include "manifest_impl.h"
#include "status_impl.h"

int loco_take_decimal(const char **p, unsigned digits, char stop,
                      uint64_t *out) {
  const char *q = *p;
  size_t k = 0;
  while (q[k] >= '0' && q[k] <= '9')
    k++;
  if (k == 0 || k > digits || (q[0] == '0' && k > 1) || q[k] != stop)
    return 0;
  uint64_t v = 0;
  for (size_t i = 0; i < k; i++)
    v = v * 10u + (uint64_t)(q[i] - '0');
  *out = v;
  *p = q + k + (stop != '\0');
  return 1;
}

int loco_parse_id(const char *s, uint32_t *id) {
  uint64_t v;
  if (s == NULL || !loco_take_decimal(&s, 10, '\0', &v) || v > UINT32_MAX)
    return 0;
  *id = (uint32_t)v;
  return 1;
}

int loco_url_parse(const char *url, uint32_t *addr, uint16_t *port) {
  static const char prefix[] = "http://";
  if (url == NULL || strncmp(url, prefix, sizeof prefix - 1) != 0)
    return 0;
  const char *p = url + sizeof prefix - 1;
  uint32_t a = 0;
  /* Four plain decimal octets (no leading zeros), then ":PORT". */
  for (int k = 0; k < 4; k++) {
    char part[4];
    size_t n = 0;
    while (p[n] >= '0' && p[n] <= '9' && n < 3)
      part[n] = p[n], n++;
    part[n] = '\0';
    uint32_t v;
    if (n == 0 || p[n] != (k < 3 ? '.' : ':') || !loco_parse_id(part, &v) ||
        v > 255)
      return 0;
    a = a << 8 | v;
    p += n + 1;
  }
  uint32_t v;
  if (!loco_parse_id(p, &v) || v < 1 || v > 65535 || a == 0)
    return 0;
  if (addr)
    *addr = a;
  if (port)
    *port = (uint16_t)v;
  return 1;
}

int loco_url_valid(const char *url) {
  return loco_url_parse(url, NULL, NULL);
}

int loco_url_hosted(const char *url, char *base, size_t cap, uint32_t *id) {
  static const char mark[] = "/v1/hosted/";
  const char *p = url != NULL ? strstr(url, mark) : NULL;
  char head[64];
  uint32_t v;
  size_t n = p != NULL ? (size_t)(p - url) : 0;
  if (p == NULL || n >= sizeof head || !loco_parse_id(p + sizeof mark - 1, &v))
    return 0;
  memcpy(head, url, n);
  head[n] = '\0';
  if (!loco_url_valid(head))
    return 0;
  if (base != NULL && cap > 0)
    snprintf(base, cap, "%s", head);
  if (id != NULL)
    *id = v;
  return 1;
}

int loco_member_url_valid(const char *url, uint32_t id) {
  uint32_t hosted;
  if (loco_url_hosted(url, NULL, 0, &hosted))
    return hosted == id; /* a client is hosted under its own id */
  return loco_url_valid(url);
}

uint64_t loco_bandwidth_quantize(uint64_t v) {
  if (v == 0)
    return 0;
  v = v < LOCO_BW_MIN ? LOCO_BW_MIN : v > LOCO_BW_MAX ? LOCO_BW_MAX : v;
  unsigned bits = 0;
  while ((v >> bits) >= 16u)
    bits++;
  return (v >> bits) << bits;
}

pulse_status loco_manifest_write(const loco_manifest *m, pulse_bytebuf *out) {
  pulse_json_writer w;
  pulse_json_write_init(&w, out);
  pulse_json_write_object(&w);
  pulse_json_write_key(&w, "round");
  pulse_json_write_u64(&w, m->round);
  pulse_json_write_key(&w, "coordinator");
  pulse_json_write_u64(&w, m->coordinator);
  if (m->has_contributors) {
    pulse_json_write_key(&w, "contributors");
    pulse_json_write_array(&w);
    for (size_t i = 0; i < m->ncontrib; i++) {
      char hex[65];
      for (int k = 0; k < 32; k++)
        snprintf(hex + 2 * k, 3, "%02x", m->contrib[i].sha256[k]);
      pulse_json_write_object(&w);
      pulse_json_write_key(&w, "id");
      pulse_json_write_u64(&w, m->contrib[i].id);
      pulse_json_write_key(&w, "bytes");
      pulse_json_write_u64(&w, m->contrib[i].bytes);
      pulse_json_write_key(&w, "sha256");
      pulse_json_write_string(&w, hex);
      if (m->contrib[i].samples > 0) {
        pulse_json_write_key(&w, "samples");
        pulse_json_write_u64(&w, m->contrib[i].samples);
      }
      if (m->contrib[i].bandwidth > 0) {
        pulse_json_write_key(&w, "bandwidth");
        pulse_json_write_u64(&w, m->contrib[i].bandwidth);
      }
      pulse_json_write_end(&w);
    }
    pulse_json_write_end(&w);
  }
  pulse_json_write_key(&w, "members");
  pulse_json_write_array(&w);
  for (size_t i = 0; i < m->nmembers; i++) {
    pulse_json_write_object(&w);
    pulse_json_write_key(&w, "id");
    pulse_json_write_u64(&w, m->members[i].id);
    pulse_json_write_key(&w, "url");
    pulse_json_write_string(&w, m->members[i].url);
    pulse_json_write_end(&w);
  }
  pulse_json_write_end(&w); /* members */
  pulse_json_write_end(&w);
  pulse_status st = pulse_json_write_finish(&w);
  if (st == PULSE_ERR_NOMEM)
    return pulse_fail(PULSE_ERR_NOMEM, "loco manifest: output");
  return st;
}

void loco_manifest_free(loco_manifest *m) {
  if (m == NULL)
    return;
  free(m->contrib);
  free(m->members);
  memset(m, 0, sizeof *m);
}

static int get_u64(const pulse_json *obj, const char *key, uint64_t *v) {
  const pulse_json *x = pulse_json_get(obj, key);
  return x != NULL && pulse_json_u64(x, v) == PULSE_OK;
}

static int hex_nibble(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : -1;
}

static pulse_status parse_tree(const pulse_json *root, loco_manifest *m) {
  uint64_t round, coord;
  if (root->type != PULSE_JSON_OBJECT || !get_u64(root, "round", &round) ||
      !get_u64(root, "coordinator", &coord) || coord > UINT32_MAX)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco manifest: round or coordinator missing");
  m->round = round;
  m->coordinator = (uint32_t)coord;
  const pulse_json *mem = pulse_json_get(root, "members");
  if (mem == NULL || mem->type != PULSE_JSON_ARRAY ||
      pulse_json_count(mem) > LOCO_MAX_MEMBERS)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco manifest: members missing or too many");
  size_t n = pulse_json_count(mem);
  m->members = calloc(n ? n : 1, sizeof *m->members);
  if (m->members == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco manifest: members");
  for (size_t i = 0; i < n; i++) {
    const pulse_json *it = pulse_json_at(mem, i);
    uint64_t id;
    const char *url;
    size_t len;
    if (it->type != PULSE_JSON_OBJECT || !get_u64(it, "id", &id) ||
        id > UINT32_MAX ||
        !pulse_json_string(pulse_json_get(it, "url"), &url, &len) ||
        len >= sizeof m->members[i].url || strlen(url) != len ||
        !loco_member_url_valid(url, (uint32_t)id) ||
        (i > 0 && id <= m->members[i - 1].id))
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco manifest: member %zu is malformed", i);
    m->members[i].id = (uint32_t)id;
    memcpy(m->members[i].url, url, len + 1);
  }
  m->nmembers = n;
  const pulse_json *con = pulse_json_get(root, "contributors");
  if (con == NULL)
    return PULSE_OK;
  if (con->type != PULSE_JSON_ARRAY || pulse_json_count(con) > LOCO_MAX_MEMBERS)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco manifest: contributors malformed");
  n = pulse_json_count(con);
  m->has_contributors = 1;
  m->contrib = calloc(n ? n : 1, sizeof *m->contrib);
  if (m->contrib == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco manifest: contributors");
  for (size_t i = 0; i < n; i++) {
    const pulse_json *it = pulse_json_at(con, i);
    uint64_t id, bytes, samples = 0, bw = 0;
    const char *hex;
    size_t len;
    if (it->type != PULSE_JSON_OBJECT || !get_u64(it, "id", &id) ||
        id > UINT32_MAX || !get_u64(it, "bytes", &bytes) ||
        (pulse_json_get(it, "samples") != NULL &&
         (!get_u64(it, "samples", &samples) || samples == 0)) ||
        (pulse_json_get(it, "bandwidth") != NULL &&
         (!get_u64(it, "bandwidth", &bw) || bw == 0 ||
          loco_bandwidth_quantize(bw) != bw)) ||
        !pulse_json_string(pulse_json_get(it, "sha256"), &hex, &len) ||
        len != 64 || (i > 0 && id <= m->contrib[i - 1].id))
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco manifest: contributor %zu is malformed", i);
    for (int k = 0; k < 32; k++) {
      int hi = hex_nibble(hex[2 * k]), lo = hex_nibble(hex[2 * k + 1]);
      if (hi < 0 || lo < 0)
        return pulse_fail(PULSE_ERR_CORRUPT,
                          "loco manifest: bad hash of contributor %zu", i);
      m->contrib[i].sha256[k] = (uint8_t)(hi << 4 | lo);
    }
    m->contrib[i].id = (uint32_t)id;
    m->contrib[i].bytes = bytes;
    m->contrib[i].samples = samples;
    m->contrib[i].bandwidth = bw;
  }
  m->ncontrib = n;
  return PULSE_OK;
}

pulse_status loco_manifest_parse(const uint8_t *data, size_t size,
                                 loco_manifest *m) {
  memset(m, 0, sizeof *m);
  pulse_json_doc *doc = NULL;
  pulse_json_limits lim = {8, 1u << 22};
  pulse_status st = pulse_json_parse((const char *)data, size, &lim, &doc);
  if (st != PULSE_OK)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco manifest: %s",
                      pulse_error_detail());
  st = parse_tree(pulse_json_doc_root(doc), m);
  pulse_json_doc_free(doc);
  if (st != PULSE_OK)
    loco_manifest_free(m);
  return st;
}

pulse_status loco_serve_view(loco_server *srv, uint64_t round, uint32_t coordinator,
                             pulse_loco_member *members, size_t count) {
  loco_manifest v = {0};
  v.round = round;
  v.coordinator = coordinator;
  v.members = members;
  v.nmembers = count;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_status st = loco_manifest_write(&v, &b);
  if (st == PULSE_OK)
    st = loco_server_put(srv, "/v1/loco/members", b.data, b.size);
  pulse_bytebuf_free(&b);
  return st;
}

pulse_status loco_serve_state(loco_server *srv, const pulse_loco *ctx) {
  pulse_buffer st = {NULL, 0};
  PULSE_TRY(pulse_loco_state_export(ctx, &st));
  char path[64];
  uint64_t r = pulse_loco_round(ctx);
  snprintf(path, sizeof path, "/v1/loco/state/%llu", (unsigned long long)r);
  pulse_status s = loco_server_put(srv, path, st.data, st.size);
  pulse_buffer_free(&st);
  loco_server_drop(srv, "/v1/loco/state/", r > 0 ? r - 1 : 0);
  return s;
}

int loco_member_find(const pulse_loco_member *m, size_t n, uint32_t id) {
  for (size_t i = 0; i < n; i++)
    if (m[i].id == id)
      return (int)i;
  return -1;
}

int loco_member_by_id(const void *a, const void *b) {
  uint32_t x = ((const pulse_loco_member *)a)->id, y = ((const pulse_loco_member *)b)->id;
  return (x > y) - (x < y);
}

pulse_status loco_members_founding(const pulse_loco_member *members, size_t count,
                                   uint32_t self, const char *who, const char *self_is,
                                   int hosted_ok, pulse_loco_member *sorted) {
  memcpy(sorted, members, count * sizeof *members);
  qsort(sorted, count, sizeof *sorted, loco_member_by_id);
  for (size_t i = 0; i < count; i++)
    if (!(hosted_ok ? loco_member_url_valid(sorted[i].url, sorted[i].id)
                    : loco_url_valid(sorted[i].url)) ||
        (i > 0 && sorted[i].id == sorted[i - 1].id))
      return pulse_fail(PULSE_ERR_ARG, "%s: member %u: bad URL or duplicate id", who,
                        sorted[i].id);
  if (loco_member_find(sorted, count, self) < 0)
    return pulse_fail(PULSE_ERR_ARG, "%s: this %s (%u) is not a member", who, self_is, self);
  return PULSE_OK;
}
