/* server.c - starting and stopping the store's HTTP server (pulse_server.h):
 * its routes on the serving layer (http_serve_impl.h), the head watcher and
 * the catch-up cache. */
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_impl.h"
#include "status_impl.h"

void pulse_server_opts_init(pulse_server_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_SERVER_OPTS_VERSION;
  o->max_connections = 1024;
  o->max_per_ip = 128;
  o->idle_timeout_s = 60;
  o->max_waiters = 512;
  o->max_poll_ms = 60000;
  o->watch = 1;
  o->catchup_builds = 1;
  o->catchup_queue = 16;
  o->catchup_wait_ms = 10000;
  o->header_timeout_s = 10;
}

pulse_status pulse_server_create(const pulse_server_opts *opts,
                                 pulse_server **out) {
  if (opts == NULL || out == NULL || opts->store_dir == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "server: NULL argument or no store folder");
  *out = NULL;
  PULSE_TRY(PULSE_OPTS_CHECK("server", opts, PULSE_SERVER_OPTS_VERSION));
  if (opts->max_connections == 0 || opts->max_waiters == 0 ||
      opts->max_poll_ms == 0 || opts->threads < 0 || opts->catchup_threads < 0)
    return pulse_fail(
        PULSE_ERR_ARG,
        "server: max_connections, max_waiters and max_poll_ms must be > 0, "
        "threads >= 0");
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
  pthread_cond_init(&srv->build_cv, NULL);
  pthread_mutex_init(&srv->catchup_files_lock, NULL);
  pthread_mutex_init(&srv->objects_lock, NULL);
  pthread_mutex_init(&srv->history_lock, NULL);
  char objs[4096];
  snprintf(objs, sizeof objs, "%s/" PULSE_STORE_OBJECTS_DIR, srv->dir);
  /* objects/ may not exist yet (an empty store): opened on first use. */
  srv->objects_fd = open(objs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

  srv_reload(srv, 1);
  pulse_status st = srv_builders_start(srv);
  if (st == PULSE_OK)
    st = srv_watcher_start(srv);
  if (st == PULSE_OK) {
    pulse_serve_opts ho;
    pulse_serve_opts_init(&ho);
    ho.name = "server";
    ho.host = opts->host;
    ho.port = opts->port;
    ho.threads = (unsigned)opts->threads;
    ho.max_connections = opts->max_connections;
    ho.max_per_ip = opts->max_per_ip;
    ho.idle_timeout_s = opts->idle_timeout_s;
    ho.header_timeout_s = srv->opts.header_timeout_s;
    ho.routes = srv_routes;
    ho.route_count = srv_route_count;
    ho.labels = srv_labels;
    ho.label_count = srv_label_count;
    ho.user = srv;
    ho.healthz = srv_healthz;
    ho.metrics = srv_metrics_text;
    ho.wake_all = srv_wake_all;
    st = pulse_serve_create(&ho, &srv->http);
  }
  if (st != PULSE_OK) {
    pulse_server_free(srv);
    return st;
  }
  *out = srv;
  return PULSE_OK;
}

void pulse_server_free(pulse_server *srv) {
  if (srv == NULL)
    return;
  pthread_mutex_lock(&srv->lock);
  srv->stopping = 1;
  pthread_mutex_unlock(&srv->lock);
  /* Waiting long-polls answer with the current head as they are woken. */
  pulse_serve_free(srv->http);
  srv_builders_stop(srv);
  srv_watcher_stop(srv);
  srv_catchup_free(srv);
  if (srv->head != NULL)
    srv_head_release(srv->head);
  if (srv->objects_fd >= 0)
    close(srv->objects_fd);
  pthread_mutex_destroy(&srv->lock);
  pthread_mutex_destroy(&srv->reload_lock);
  pthread_mutex_destroy(&srv->catchup_lock);
  pthread_cond_destroy(&srv->build_cv);
  pthread_mutex_destroy(&srv->catchup_files_lock);
  srv_objects_free(srv);
  pthread_mutex_destroy(&srv->objects_lock);
  srv_history_free(srv);
  pthread_mutex_destroy(&srv->history_lock);
  free(srv->dir);
  free(srv);
}

pulse_status pulse_server_parse_listen(const char *spec, char *host, size_t cap,
                                       uint16_t *port) {
  return pulse_serve_parse_listen(spec, host, cap, port);
}

uint16_t pulse_server_port(const pulse_server *srv) {
  return srv ? pulse_serve_port(srv->http) : 0;
}

void pulse_server_notify(pulse_server *srv, double commit_seconds) {
  if (srv == NULL)
    return;
  if (commit_seconds >= 0)
    pulse_serve_histogram_add(&srv->metrics.commit, commit_seconds);
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
  return pulse_serve_metrics_text(srv->http, out);
}
