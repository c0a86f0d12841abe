/* graph_file.c - gossip graphs read from text (pulse_gossip.h,
 * pulse_gossip_graph_parse). The text is untrusted: every number is parsed
 * strictly, every node id checked, and the graph refused with the reason
 * (and its line) when it is not one the gossip can mix over. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_impl.h"
#include "status_impl.h"

#define GRAPH_FILE_MAX (16u << 20)
#define GRAPH_SUM_TOL 1e-9

/* One line split into at most 4 words (NUL-terminated in place). */
static int split(char *line, char **w, int max) {
  int n = 0;
  char *p = line;
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\r')
      p++;
    if (*p == '\0' || *p == '#')
      return n;
    if (n == max)
      return max + 1;
    w[n++] = p;
    while (*p && *p != ' ' && *p != '\t' && *p != '\r' && *p != '#')
      p++;
    if (*p == '#') {
      *p = '\0';
      return n;
    }
    if (*p)
      *p++ = '\0';
  }
}

static int parse_u32(const char *s, uint32_t *out) {
  if (*s < '0' || *s > '9')
    return -1;
  errno = 0;
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *end || v > UINT32_MAX)
    return -1;
  *out = (uint32_t)v;
  return 0;
}

static int parse_weight(const char *s, double *out) {
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v))
    return -1;
  *out = v;
  return 0;
}

typedef struct {
  graph_edges l;
  double *self;
  uint8_t *self_seen;
  int weighted; /* -1 unknown, 0 no, 1 yes */
} parse_state;

static pulse_status bad(unsigned line, const char *what) {
  return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: %s", line, what);
}

static pulse_status parse_line(parse_state *ps, char *text, unsigned ln,
                               int *seen_magic) {
  char *w[4];
  int n = split(text, w, 4);
  if (n == 0)
    return PULSE_OK;
  if (n > 4)
    return bad(ln, "too many words");
  if (!*seen_magic) {
    if (n != 2 || strcmp(w[0], "pulse-graph") != 0)
      return bad(ln, "expected 'pulse-graph 1' first");
    if (strcmp(w[1], "1") != 0)
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: version %s "
                        "unknown (this reads 1)", ln, w[1]);
    *seen_magic = 1;
    return PULSE_OK;
  }
  if (strcmp(w[0], "nodes") == 0) {
    uint32_t v;
    if (ps->l.n != 0)
      return bad(ln, "a second 'nodes' line");
    if (n != 2 || parse_u32(w[1], &v) || v == 0 || v > PULSE_GOSSIP_MAX_NODES)
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: 'nodes N' "
                        "needs N in 1..%u", ln, PULSE_GOSSIP_MAX_NODES);
    ps->l.n = v;
    ps->self = calloc(v, sizeof *ps->self);
    ps->self_seen = calloc(v, 1);
    if (ps->self == NULL || ps->self_seen == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "graph file");
    return PULSE_OK;
  }
  if (ps->l.n == 0)
    return bad(ln, "'nodes N' must come before edges");
  if (strcmp(w[0], "edge") == 0) {
    uint32_t a, b;
    double wt = 0.0;
    if ((n != 3 && n != 4) || parse_u32(w[1], &a) || parse_u32(w[2], &b))
      return bad(ln, "'edge I J [W]' needs two node ids");
    int has_w = n == 4;
    if (has_w && parse_weight(w[3], &wt))
      return bad(ln, "the weight is not a finite number");
    if (ps->weighted >= 0 && ps->weighted != has_w)
      return bad(ln, "either every edge has a weight or none");
    ps->weighted = has_w;
    if (has_w && !(wt > 0.0))
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: weight %g of "
                        "edge %u-%u is not positive", ln, wt, a, b);
    if (a >= ps->l.n || b >= ps->l.n)
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: unknown node "
                        "%u (nodes are 0..%u)", ln, a >= ps->l.n ? a : b,
                        ps->l.n - 1u);
    if (a == b)
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: self-loop at "
                        "node %u (a node's own weight is a 'self' line)", ln, a);
    pulse_status st = graph_edges_add(&ps->l, a, b, wt);
    return st == PULSE_ERR_NOMEM ? st : st == PULSE_OK ? PULSE_OK
                                                       : bad(ln, "bad edge");
  }
  if (strcmp(w[0], "self") == 0) {
    uint32_t a;
    double wt;
    if (n != 3 || parse_u32(w[1], &a) || parse_weight(w[2], &wt))
      return bad(ln, "'self I W' needs a node id and a weight");
    if (a >= ps->l.n)
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: unknown node "
                        "%u (nodes are 0..%u)", ln, a, ps->l.n - 1u);
    if (ps->self_seen[a])
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: a second "
                        "'self' line for node %u", ln, a);
    if (!(wt >= 0.0))
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: self weight "
                        "%g of node %u is negative", ln, wt, a);
    ps->self_seen[a] = 1;
    ps->self[a] = wt;
    return PULSE_OK;
  }
  return pulse_fail(PULSE_ERR_CORRUPT, "graph file line %u: unknown keyword "
                    "'%.32s'", ln, w[0]);
}

/* The weighted case: every node needs its self line, and each row must sum
 * to one (W is symmetric by construction, so columns then do too). */
static pulse_status check_weights(const parse_state *ps,
                                  const pulse_gossip_graph *g) {
  for (uint32_t i = 0; i < g->n; i++) {
    if (!ps->self_seen[i])
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file: weighted edges but no "
                        "'self' line for node %u", i);
    double sum = g->self[i];
    for (uint64_t k = g->start[i]; k < g->start[i + 1]; k++)
      sum += g->w[k];
    if (!(fabs(sum - 1.0) <= GRAPH_SUM_TOL))
      return pulse_fail(PULSE_ERR_CORRUPT, "graph file: the weights of node %u "
                        "sum to %.17g, not one", i, sum);
  }
  return PULSE_OK;
}

pulse_status pulse_gossip_graph_parse(const char *text, size_t size,
                                      pulse_gossip_weights wmode,
                                      pulse_gossip_graph **out) {
  if (out == NULL || (text == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "graph file: NULL argument");
  *out = NULL;
  if (size > GRAPH_FILE_MAX)
    return pulse_fail(PULSE_ERR_CORRUPT, "graph file: %zu bytes (at most %u)",
                      size, GRAPH_FILE_MAX);
  char *copy = malloc(size + 1);
  if (copy == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "graph file");
  if (size > 0)
    memcpy(copy, text, size);
  copy[size] = '\0';
  parse_state ps = {{0, 0, 0, NULL, NULL, 0}, NULL, NULL, -1};
  pulse_status st = PULSE_OK;
  int magic = 0;
  unsigned ln = 0;
  char *p = copy, *end = copy + size;
  while (st == PULSE_OK && p < end) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (nl)
      *nl = '\0';
    ln++;
    if (strlen(p) != (size_t)((nl ? nl : end) - p))
      st = bad(ln, "a NUL byte in the text");
    else
      st = parse_line(&ps, p, ln, &magic);
    p = nl ? nl + 1 : end;
  }
  if (st == PULSE_OK && (!magic || ps.l.n == 0))
    st = pulse_fail(PULSE_ERR_CORRUPT, "graph file: no 'pulse-graph 1' and "
                    "'nodes N' lines");
  if (st == PULSE_OK && ps.weighted != 1)
    for (uint32_t i = 0; i < ps.l.n && st == PULSE_OK; i++)
      if (ps.self_seen[i])
        st = pulse_fail(PULSE_ERR_CORRUPT, "graph file: a 'self' line for node "
                        "%u but the edges have no weights", i);
  pulse_gossip_graph *g = NULL;
  if (st == PULSE_OK) {
    ps.l.weighted = ps.weighted == 1;
    st = graph_build(&ps.l, wmode, ps.self, 1, &g);
    if (st == PULSE_ERR_ARG) { /* duplicate or disconnected: the file's fault */
      char why[256];
      snprintf(why, sizeof why, "%s", pulse_error_detail());
      st = pulse_fail(PULSE_ERR_CORRUPT, "graph file: %s", why);
    }
  }
  if (st == PULSE_OK && ps.l.weighted)
    st = check_weights(&ps, g);
  if (st == PULSE_OK)
    *out = g;
  else
    pulse_gossip_graph_free(g);
  graph_edges_free(&ps.l);
  free(ps.self), free(ps.self_seen);
  free(copy);
  return st;
}

pulse_status pulse_gossip_graph_load(const char *path, pulse_gossip_weights w,
                                     pulse_gossip_graph **out) {
  if (out == NULL || path == NULL)
    return pulse_fail(PULSE_ERR_ARG, "graph file: NULL argument");
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return pulse_fail(PULSE_ERR_IO, "graph file %s: %s", path, strerror(errno));
  char *buf = malloc(GRAPH_FILE_MAX + 1u);
  if (buf == NULL) {
    fclose(f);
    return pulse_fail(PULSE_ERR_NOMEM, "graph file");
  }
  size_t n = fread(buf, 1, GRAPH_FILE_MAX + 1u, f);
  int err = ferror(f);
  fclose(f);
  pulse_status st;
  if (err)
    st = pulse_fail(PULSE_ERR_IO, "graph file %s: read failed", path);
  else
    st = pulse_gossip_graph_parse(buf, n, w, out);
  free(buf);
  return st;
}
