/* server.c - starting and stopping the HTTP server (pulse_server.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "parallel_impl.h"
#include "pulse_log.h"
#include "server_impl.h"
#include "status_impl.h"

double srv_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  if (PULSE_LOG_INFO > pulse_log_level_get())
    return;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
    line[--n] = '\0';
  pulse_log_write(PULSE_LOG_INFO, "server: microhttpd: %s", line);
}

/* Resolves host:port into a socket address. */
static pulse_status resolve(const char *host, uint16_t port,
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
    return pulse_fail(PULSE_ERR_ARG, "server: cannot resolve '%s': %s", host,
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

pulse_status pulse_server_create(const pulse_server_opts *opts,
                                 pulse_server **out) {
  if (opts == NULL || out == NULL || opts->store_dir == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "server: NULL argument or no store folder");
  *out = NULL;
  if (opts->struct_version != PULSE_SERVER_OPTS_VERSION)
    return pulse_fail(PULSE_ERR_VERSION,
                      "server: options version %u, expected %u",
                      opts->struct_version, PULSE_SERVER_OPTS_VERSION);
  if (opts->max_connections == 0 || opts->max_waiters == 0 ||
      opts->max_poll_ms == 0)
    return pulse_fail(
        PULSE_ERR_ARG,
        "server: max_connections, max_waiters and max_poll_ms must be > 0");
  struct stat sb;
  if (stat(opts->store_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return pulse_fail(PULSE_ERR_NOT_FOUND, "server: %s is not a folder",
                      opts->store_dir);
  pulse_server *srv = calloc(1, sizeof *srv);
  if (srv == NULL || (srv->dir = strdup(opts->store_dir)) == NULL) {
    free(srv);
    return pulse_fail(PULSE_ERR_NOMEM, "server");
  }
  srv->opts = *opts;
  srv->opts.store_dir = srv->dir;
  srv->opts.host = NULL; /* not kept */
  srv->wake_fd = srv->inotify_fd = -1;
  pthread_mutex_init(&srv->lock, NULL);
  pthread_mutex_init(&srv->reload_lock, NULL);
  pthread_mutex_init(&srv->catchup_lock, NULL);
  char objs[4096];
  snprintf(objs, sizeof objs, "%s/" PULSE_STORE_OBJECTS_DIR, srv->dir);
  /* objects/ may not exist yet (an empty store): opened on first use. */
  srv->objects_fd = open(objs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

  struct sockaddr_storage ss;
  int ipv6 = 0;
  pulse_status st =
      resolve(opts->host ? opts->host : "127.0.0.1", opts->port, &ss, &ipv6);
  if (st == PULSE_OK) {
    srv_reload(srv, 1);
    st = srv_watcher_start(srv);
  }
  if (st != PULSE_OK) {
    pulse_server_free(srv);
    return st;
  }
  unsigned threads =
      opts->threads ? opts->threads : (unsigned)pulse_cpu_count();
  if (threads < 2)
    threads = 2;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                   MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                   MHD_USE_TURBO | (ipv6 ? MHD_USE_IPv6 : 0);
  srv->daemon = MHD_start_daemon(
      flags, 0, NULL, NULL, srv_access, srv, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE, threads,
      MHD_OPTION_CONNECTION_LIMIT, opts->max_connections,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, opts->max_per_ip,
      MHD_OPTION_CONNECTION_TIMEOUT, opts->idle_timeout_s,
      MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      (size_t)64 * 1024, MHD_OPTION_URI_LOG_CALLBACK, srv_uri_log, srv,
      MHD_OPTION_NOTIFY_COMPLETED, srv_completed, srv,
      MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv, MHD_OPTION_END);
  if (srv->daemon == NULL) {
    pulse_server_free(srv);
    return pulse_fail(PULSE_ERR_IO,
                      "server: cannot listen on %s:%u (address in use, or not "
                      "permitted)",
                      opts->host ? opts->host : "127.0.0.1",
                      (unsigned)opts->port);
  }
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
  srv->port = info != NULL ? info->port : opts->port;
  *out = srv;
  return PULSE_OK;
}

void pulse_server_free(pulse_server *srv) {
  if (srv == NULL)
    return;
  pthread_mutex_lock(&srv->lock);
  srv->stopping = 1;
  pthread_mutex_unlock(&srv->lock);
  if (srv->daemon != NULL) {
    /* Suspended connections must be resumed before the daemon stops; they
     * answer with the current head. Give them a moment to be answered.
     * The daemon keeps accepting meanwhile (a long poll that arrives now
     * returns at once, as stopping is set): MHD_quiesce_daemon would stop
     * that, but with a thread pool on epoll it races the workers' own
     * removal of the listen socket and can abort the process ("Failed to
     * remove listen FD from epoll set", seen once under ASan). */
    srv_wake_all(srv);
    for (int i = 0; i < 200; i++) {
      pthread_mutex_lock(&srv->lock);
      size_t n = srv->nwaiters + srv->resumed;
      pthread_mutex_unlock(&srv->lock);
      if (n == 0)
        break;
      srv_wake_all(srv);
      usleep(5000);
    }
    MHD_stop_daemon(srv->daemon); /* closes the listen socket too */
  }
  srv_watcher_stop(srv);
  srv_catchup_free(srv);
  if (srv->head != NULL)
    srv_head_release(srv->head);
  if (srv->objects_fd >= 0)
    close(srv->objects_fd);
  pthread_mutex_destroy(&srv->lock);
  pthread_mutex_destroy(&srv->reload_lock);
  pthread_mutex_destroy(&srv->catchup_lock);
  free(srv->dir);
  free(srv);
}

pulse_status pulse_server_parse_listen(const char *spec, char *host, size_t cap,
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

uint16_t pulse_server_port(const pulse_server *srv) {
  return srv ? srv->port : 0;
}

void pulse_server_notify(pulse_server *srv, double commit_seconds) {
  if (srv == NULL)
    return;
  if (commit_seconds >= 0)
    srv_histogram_add(&srv->metrics.commit, commit_seconds);
  srv_reload(srv, 0);
}

void pulse_server_on_head(void *server, const pulse_pub_figures *figures) {
  pulse_server_notify(server, figures != NULL && !figures->flush
                                  ? figures->total_seconds
                                  : -1.0);
}

size_t pulse_server_waiters(const pulse_server *srv) {
  if (srv == NULL)
    return 0;
  pthread_mutex_lock((pthread_mutex_t *)&srv->lock);
  size_t n = srv->nwaiters;
  pthread_mutex_unlock((pthread_mutex_t *)&srv->lock);
  return n;
}

pulse_status pulse_server_metrics(pulse_server *srv, pulse_buffer *out) {
  if (srv == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "server: NULL argument");
  return srv_metrics_text(srv, out);
}
