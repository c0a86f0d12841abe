/* s3rver_testutil.h - the S3 stand-in of the suites that upload: s3rver
 * with S3's multipart answers (tests/cli/lib/s3rver_multipart.js), started
 * per test on 127.0.0.1 port 0 in a folder of its own, the uploaders'
 * environment pointed at it. */
#ifndef PULSE_S3RVER_TESTUTIL_H
#define PULSE_S3RVER_TESTUTIL_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "files_testutil.h"

typedef struct {
  pid_t pid;     /* 0: not started */
  uint16_t port; /* where it listens */
  char *dir;     /* its folder: s3.log, the bucket's data under s3/ */
} s3rver_tu;

/* Starts the stand-in (skips the test where node or s3rver is missing)
 * and sets AWS_ENDPOINT_URL and the keys for it. head_fault: NULL, or a
 * file name under its folder while which head.json PUTs fail
 * (S3_FAIL_HEAD_FILE). */
static inline void s3rver_tu_start(s3rver_tu *s, const char *head_fault) {
  const char *node_path = getenv("NODE_PATH");
  if (node_path == NULL || node_path[0] == '\0')
    node_path = "/usr/lib/node_modules";
  char probe[1024];
  snprintf(probe, sizeof probe, "%s/s3rver/package.json", node_path);
  if (system("command -v node >/dev/null 2>&1") != 0 ||
      access(probe, R_OK) != 0)
    cr_skip_test("node or s3rver (%s) is not installed", probe);
  s->dir = tu_make_dir();
  char log[1024], data[1024];
  snprintf(log, sizeof log, "%s/s3.log", s->dir);
  snprintf(data, sizeof data, "%s/s3", s->dir);
  s->pid = fork();
  cr_assert_geq(s->pid, 0);
  if (s->pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1), dup2(fd, 2);
    setenv("NODE_PATH", node_path, 1);
    if (head_fault != NULL) {
      char fault[1100];
      snprintf(fault, sizeof fault, "%s/%s", s->dir, head_fault);
      setenv("S3_FAIL_HEAD_FILE", fault, 1);
    }
    execlp("node", "node", PULSE_TEST_S3RVER_MULTIPART, data, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 400 && s->port == 0; i++) {
    size_t n = 0;
    uint8_t *text = tu_read(log, &n);
    const char *at = text ? strstr((const char *)text, "127.0.0.1:") : NULL;
    if (at != NULL && strchr(at, '\n') != NULL)
      s->port = (uint16_t)atoi(at + 10);
    free(text);
    if (s->port == 0)
      usleep(50 * 1000);
  }
  cr_assert_neq(s->port, 0, "the S3 stand-in did not start (see %s)", log);
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%u", (unsigned)s->port);
  setenv("AWS_ENDPOINT_URL", endpoint, 1);
  setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  setenv("AWS_REGION", "us-east-1", 1);
}

/* Kills the stand-in and removes its folder (either may be missing). */
static inline void s3rver_tu_stop(s3rver_tu *s) {
  if (s->pid > 0) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
  }
  if (s->dir != NULL)
    tu_rm_rf(s->dir);
}

#endif /* PULSE_S3RVER_TESTUTIL_H */
