/* bench_serve_nginx.c - nginx for the throughput comparison of
 * `pulse-bench serve`: found, then run as a child with a generated
 * configuration doing the same work as pulse (sendfile, keep-alive, no
 * logging) over the same files. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_serve_impl.h"

static uint16_t free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

const char *bench_serve_find_nginx(const char *given) {
  if (given != NULL)
    return access(given, X_OK) == 0 ? given : NULL;
  if (access("/usr/sbin/nginx", X_OK) == 0)
    return "/usr/sbin/nginx";
  static char found[4096];
  const char *path = getenv("PATH");
  while (path != NULL && *path) {
    const char *colon = strchr(path, ':');
    size_t n = colon ? (size_t)(colon - path) : strlen(path);
    snprintf(found, sizeof found, "%.*s/nginx", (int)n, path);
    if (access(found, X_OK) == 0)
      return found;
    path = colon ? colon + 1 : NULL;
  }
  return NULL;
}

/* Starts nginx serving dir/objects at /v1/objects/ on a free port. */
pid_t bench_serve_start_nginx(const char *bin, const char *work,
                              const char *store, int workers,
                              uint16_t *port_out) {
  char conf[4200], prefix[4096];
  snprintf(prefix, sizeof prefix, "%s/nginx", work);
  mkdir(prefix, 0755);
  snprintf(conf, sizeof conf, "%s/nginx.conf", prefix);
  uint16_t port = free_port();
  FILE *f = fopen(conf, "w");
  if (f == NULL || port == 0)
    return -1;
  /* The same work as pulse: sendfile, keep-alive, no logging. */
  fprintf(f,
          "daemon off;\nmaster_process on;\nworker_processes %d;\npid "
          "%s/nginx.pid;\n"
          "error_log %s/error.log warn;\n"
          "events { worker_connections 4096; }\n"
          "http {\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  "
          "tcp_nodelay on;\n"
          "  keepalive_requests 1000000;\n  keepalive_timeout 65;\n"
          "  client_body_temp_path %s/body;\n  proxy_temp_path %s/proxy;\n"
          "  fastcgi_temp_path %s/fastcgi;\n  uwsgi_temp_path %s/uwsgi;\n  "
          "scgi_temp_path %s/scgi;\n"
          "  default_type application/octet-stream;\n"
          "  server {\n    listen 127.0.0.1:%u;\n"
          "    location /v1/objects/ { alias %s/objects/; }\n  }\n}\n",
          workers, prefix, prefix, prefix, prefix, prefix, prefix, prefix,
          (unsigned)port, store);
  fclose(f);
  char errlog[4300];
  snprintf(errlog, sizeof errlog, "%s/error.log", prefix);
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0), dup2(devnull, 1);
    }
    execl(bin, "nginx", "-p", prefix, "-c", conf, "-e", errlog, (char *)NULL);
    _exit(127);
  }
  if (pid < 0)
    return -1;
  for (int i = 0; i < 300; i++) {
    int fd = bench_serve_connect_local(port);
    if (fd >= 0) {
      close(fd);
      *port_out = port;
      return pid;
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid)
      return -1;
    usleep(10000);
  }
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  return -1;
}
