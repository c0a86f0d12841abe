/* http_serve.c - the HTTP serving layer's daemon (http_serve_impl.h):
 * listen address, threads, limits, labels, and a clean stop. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http_serve_core_impl.h"
#include "parallel_impl.h"
#include "pulse_log.h"
#include "status_impl.h"

double pulse_serve_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  const pulse_serve *s = cls;
  if (PULSE_LOG_INFO > pulse_log_level_get())
    return;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
    line[--n] = '\0';
  pulse_log_write(PULSE_LOG_INFO, "%s: microhttpd: %s", s->opts.name, line);
}

/* Resolves host:port into a socket address. */
static pulse_status resolve(const char *name, const char *host, uint16_t port,
                            struct sockaddr_storage *ss, int *ipv6) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  /* "[::1]" is how an IPv6 address is written next to a port. */
  char buf[256];
  size_t len = strlen(host);
  if (len >= 2 && host[0] == '[' && host[len - 1] == ']' &&
      len - 2 < sizeof buf) {
    memcpy(buf, host + 1, len - 2);
    buf[len - 2] = '\0';
    host = buf;
  }
  int rc = getaddrinfo(host[0] ? host : NULL, "0", &hints, &res);
  if (rc != 0 || res == NULL)
    return pulse_fail(PULSE_ERR_ARG, "%s: cannot resolve '%s': %s", name, host,
                      gai_strerror(rc));
  memset(ss, 0, sizeof *ss);
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  *ipv6 = res->ai_family == AF_INET6;
  if (*ipv6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
  else
    ((struct sockaddr_in *)ss)->sin_port = htons(port);
  freeaddrinfo(res);
  return PULSE_OK;
}

/* Adds a label once; returns its index, or SERVE_LABELS when full. */
static unsigned add_label(pulse_serve *s, const char *label) {
  for (unsigned i = 0; i < s->nlabels; i++)
    if (strcmp(s->labels[i], label) == 0)
      return i;
  if (s->nlabels == SERVE_LABELS)
    return SERVE_LABELS;
  s->labels[s->nlabels] = label;
  return s->nlabels++;
}

/* The metric labels: the user's order, then the routes', then the layer's. */
static pulse_status set_labels(pulse_serve *s) {
  const pulse_serve_opts *o = &s->opts;
  int full = 0;
  for (size_t i = 0; i < o->label_count; i++)
    full |= add_label(s, o->labels[i]) == SERVE_LABELS;
  for (size_t i = 0; i < o->route_count; i++) {
    const char *l = o->routes[i].label ? o->routes[i].label : "other";
    full |= (s->route_label[i] = add_label(s, l)) == SERVE_LABELS;
    s->all_methods |= o->routes[i].methods;
  }
  full |= (s->label_metrics = add_label(s, "metrics")) == SERVE_LABELS;
  full |= (s->label_healthz = add_label(s, "healthz")) == SERVE_LABELS;
  full |= (s->label_other = add_label(s, "other")) == SERVE_LABELS;
  if (full)
    return pulse_fail(PULSE_ERR_ARG, "%s: more than %u route labels", o->name,
                      SERVE_LABELS);
  s->all_methods |= PULSE_SERVE_READ; /* /metrics and /healthz */
  return PULSE_OK;
}

static pulse_status check_opts(const pulse_serve_opts *o) {
  if (o->max_connections == 0)
    return pulse_fail(PULSE_ERR_ARG, "%s: max_connections must be > 0",
                      o->name);
  if (o->route_count > 64 || (o->route_count > 0 && o->routes == NULL) ||
      (o->label_count > 0 && o->labels == NULL))
    return pulse_fail(PULSE_ERR_ARG, "%s: bad route table", o->name);
  for (size_t i = 0; i < o->route_count; i++)
    if (o->routes[i].path == NULL || o->routes[i].path[0] != '/' ||
        o->routes[i].handler == NULL || o->routes[i].methods == 0 ||
        (o->routes[i].methods & ~(PULSE_SERVE_READ | PULSE_SERVE_POST)))
      return pulse_fail(PULSE_ERR_ARG, "%s: bad route %zu", o->name, i);
  return PULSE_OK;
}

/* The cap on connections (http_serve_deadline.c enforces it) and what
 * microhttpd may hold: twice the cap, so that it keeps accepting while the
 * cap evicts (its limit is split between the pool's threads, each of which
 * stops accepting at its share), within the descriptors the process may
 * open (RLIMIT_NOFILE, less 64 and 4 per thread for files being served,
 * epoll and the rest). With too few descriptors the cap is lowered, and
 * said. */
static void set_limits(pulse_serve *s, unsigned threads) {
  unsigned cap = s->opts.max_connections;
  uint64_t room = UINT32_MAX, want = 2 * (uint64_t)cap + threads;
  unsigned long long nofile = 0;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    uint64_t spare = 64 + 4 * (uint64_t)threads;
    nofile = (unsigned long long)rl.rlim_cur;
    room = nofile > spare + 16 ? nofile - spare : 16;
  }
  if (want > room) {
    want = room;
    if (cap > room * 2 / 3) {
      cap = (unsigned)(room * 2 / 3);
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "%s: %u connections at once, not %u: the process may "
                   "open %llu descriptors (raise ulimit -n)",
                   s->opts.name, cap, s->opts.max_connections, nofile);
    }
  }
  s->cap = cap;
  s->mhd_limit = (unsigned)want;
}

void pulse_serve_opts_init(pulse_serve_opts *o) {
  memset(o, 0, sizeof *o);
  o->name = "server";
  o->max_connections = 1024;
  o->idle_timeout_s = 60;
  o->header_timeout_s = 10;
}

pulse_status pulse_serve_create(const pulse_serve_opts *opts,
                                pulse_serve **out) {
  if (opts == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "serve: NULL argument");
  *out = NULL;
  pulse_serve_opts o = *opts;
  if (o.name == NULL)
    o.name = "server";
  PULSE_TRY(check_opts(&o));
  pulse_serve *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "%s", o.name);
  s->opts = o;
  s->opts.host = NULL; /* read here only */
  struct sockaddr_storage ss;
  int ipv6 = 0;
  const char *host = o.host ? o.host : "127.0.0.1";
  pulse_status st = set_labels(s);
  if (st == PULSE_OK)
    st = resolve(o.name, host, o.port, &ss, &ipv6);
  if (st != PULSE_OK) {
    free(s);
    return st;
  }
  if (serve_deadline_start(s) != 0) {
    serve_deadline_stop(s);
    free(s);
    return pulse_fail(PULSE_ERR_NOMEM, "%s: header deadline thread", o.name);
  }
  unsigned threads = o.threads ? o.threads : (unsigned)pulse_cpu_count();
  if (threads < 2)
    threads = 2;
  set_limits(s, threads);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                   MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                   MHD_USE_TURBO | (ipv6 ? MHD_USE_IPv6 : 0);
  s->daemon = MHD_start_daemon(
      flags, 0, NULL, NULL, serve_access, s, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE, threads,
      MHD_OPTION_CONNECTION_LIMIT, s->mhd_limit,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, o.max_per_ip,
      MHD_OPTION_CONNECTION_TIMEOUT, o.idle_timeout_s,
      MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      (size_t)64 * 1024, MHD_OPTION_URI_LOG_CALLBACK, serve_uri_log, s,
      MHD_OPTION_NOTIFY_COMPLETED, serve_completed, s,
      MHD_OPTION_NOTIFY_CONNECTION, serve_conn_notify, s,
      MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
  if (s->daemon == NULL) {
    serve_deadline_stop(s);
    free(s);
    return pulse_fail(PULSE_ERR_IO,
                      "%s: cannot listen on %s:%u (address in use, or not "
                      "permitted)",
                      o.name, host, (unsigned)o.port);
  }
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = info != NULL ? info->port : o.port;
  *out = s;
  return PULSE_OK;
}

void pulse_serve_free(pulse_serve *s) {
  if (s == NULL)
    return;
  atomic_store(&s->stopping, 1);
  /* Suspended connections must be resumed before the daemon stops; they
   * answer at once now that stopping is set. Give them a moment. The
   * daemon keeps accepting meanwhile (a request that arrives now is
   * answered at once too): MHD_quiesce_daemon would stop that, but with a
   * thread pool on epoll it races the workers' own removal of the listen
   * socket and can abort the process ("Failed to remove listen FD from
   * epoll set", seen once under ASan). */
  if (s->opts.wake_all != NULL) {
    for (int i = 0; i < 200 && atomic_load(&s->suspended) > 0; i++) {
      s->opts.wake_all(s->opts.user);
      usleep(5000);
    }
  }
  MHD_stop_daemon(s->daemon); /* closes the listen socket too */
  serve_deadline_stop(s);
  free(s);
}

uint16_t pulse_serve_port(const pulse_serve *s) {
  return s ? s->port : 0;
}

int pulse_serve_stopping(const pulse_serve *s) {
  return atomic_load(&((pulse_serve *)s)->stopping);
}

pulse_status pulse_serve_parse_listen(const char *spec, char *host, size_t cap,
                                      uint16_t *port) {
  if (spec == NULL || host == NULL || port == NULL)
    return pulse_fail(PULSE_ERR_ARG, "server: NULL argument");
  const char *colon = strrchr(spec, ':');
  if (colon == NULL || (size_t)(colon - spec) >= cap)
    return pulse_fail(PULSE_ERR_ARG, "server: '%s' is not HOST:PORT", spec);
  /* An IPv6 address has colons of its own: it must be bracketed. */
  if (memchr(spec, ':', (size_t)(colon - spec)) != NULL && spec[0] != '[')
    return pulse_fail(PULSE_ERR_ARG,
                      "server: write an IPv6 address as [ADDR]:PORT");
  const char *p = colon + 1;
  unsigned long v = 0;
  if (*p == '\0')
    return pulse_fail(PULSE_ERR_ARG, "server: '%s' has no port", spec);
  for (; *p; p++) {
    if (*p < '0' || *p > '9' ||
        (v = v * 10 + (unsigned long)(*p - '0')) > 65535)
      return pulse_fail(PULSE_ERR_ARG, "server: port of '%s' is not 0..65535",
                        spec);
  }
  memcpy(host, spec, (size_t)(colon - spec));
  host[colon - spec] = '\0';
  *port = (uint16_t)v;
  return PULSE_OK;
}
