/* bench_sync_pull.c - the file workers of `pulse-bench sync`: the real
 * `pulse-pull --out FILE --json` program, run as a child process.
 *
 * long-lived: one `pulse-pull --follow` for all the steps of a link, as a
 * worker that follows a trainer runs; it long-polls the head, and the bench
 * reads its `synced` events (their figures, and the time from the head's
 * move until the event arrives). Its first step after the start is not
 * timed (see bs_pull_long_lived_steps).
 * one-shot: a new `pulse-pull` per step, which loads the file, syncs one
 * step and exits; timed from outside, from its start to its exit.
 *
 * Both keep the same file (the run's folder), which a first pull over
 * loopback fills with the anchor, untimed. The children are started from
 * the thread that syncs, after it joined the client namespace (setns), so
 * they run in it as under `ip netns exec`. They are stopped and reaped
 * before the function that started them returns, also on a stop signal. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_sync_impl.h"
#include "json_impl.h"
#include "cli_time.h"

/* Longest wait for one event (a step, or a first sync that loads the
 * file), in seconds: a hung worker ends the bench instead of hanging it. */
#define BS_PULL_WAIT_S 900.0

/* A pulse-pull child and the unread part of its stdout. */
typedef struct {
  pid_t pid;
  int fd; /* read end of its stdout, -1 when closed */
  char buf[1 << 16];
  size_t len;
  int eof;
} bs_child;

/* What a `synced` event says. */
typedef struct {
  uint64_t step, bytes;
  double transfer, verify, decode, apply, total;
  double write; /* -1: the event has no write_s */
  int class_index; /* its "class_index" was "on" */
} bs_synced;

int bs_pull_find(bs_run *r) {
  if (r->a->pull != NULL) {
    snprintf(r->pull_bin, sizeof r->pull_bin, "%s", r->a->pull);
  } else {
    char self[2048];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
      fprintf(stderr, "pulse-bench sync: cannot find my own path: %s\n",
              strerror(errno));
      return 1;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL)
      slash[1] = '\0';
    snprintf(r->pull_bin, sizeof r->pull_bin, "%spulse-pull", self);
  }
  if (access(r->pull_bin, X_OK) != 0) {
    fprintf(stderr,
            "pulse-bench sync: %s is not an executable (the file workers run "
            "pulse-pull; --pull PATH names it)\n",
            r->pull_bin);
    return 1;
  }
  return 0;
}

/* Starts `pulse-pull URL --out FILE --json ...` (+ --follow), in the
 * calling thread's network namespace, its stdout to a pipe. */
static int bs_child_start(bs_child *c, const bs_run *r, const char *url,
                          int follow) {
  const bs_args *a = r->a;
  char threads[16], budget[32];
  snprintf(threads, sizeof threads, "%d", a->threads);
  snprintf(budget, sizeof budget, "%" PRIu64, a->memory_budget);
  static const char *index_mode[] = {"auto", "off", "on"}; /* pulse_sub_class_index */
  const char *argv[28];
  size_t n = 0;
  argv[n++] = r->pull_bin;
  argv[n++] = url;
  argv[n++] = "--out";
  argv[n++] = r->file;
  argv[n++] = "--cache";
  argv[n++] = r->pull_cache;
  argv[n++] = "--json";
  argv[n++] = "--insecure-unsigned"; /* the bench publisher does not sign */
  argv[n++] = "--no-catchup";        /* as the in-process worker */
  if (follow)
    argv[n++] = "--follow";
  if (a->threads > 0)
    argv[n++] = "--threads", argv[n++] = threads;
  if (a->no_stream)
    argv[n++] = "--no-stream";
  /* The mode asked (auto by default, as the library's: a one-shot pull
   * otherwise keeps none). */
  argv[n++] = "--class-index", argv[n++] = index_mode[a->index];
  if (a->memory_budget > 0)
    argv[n++] = "--memory-budget", argv[n++] = budget;
  argv[n] = NULL;

  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    fprintf(stderr, "pulse-bench sync: pipe: %s\n", strerror(errno));
    return 1;
  }
  memset(c, 0, sizeof *c);
  c->fd = -1;
  c->pid = fork();
  if (c->pid == 0) { /* the child: async-signal-safe calls only */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* the bench blocks its stops */
    signal(SIGPIPE, SIG_DFL);
    if (dup2(p[1], STDOUT_FILENO) < 0)
      _exit(127);
    execv(r->pull_bin, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  if (c->pid < 0) {
    fprintf(stderr, "pulse-bench sync: fork: %s\n", strerror(errno));
    close(p[0]);
    return 1;
  }
  c->fd = p[0];
  return 0;
}

/* The next line of the child's stdout (NUL-terminated, in c->buf; valid
 * until the next call). @return 1 a line, 0 end of output, -1 no line
 * within timeout_s or a stop signal. */
static int bs_child_line(bs_child *c, double timeout_s, char **line,
                         size_t *consumed) {
  double t0 = pulse_cli_now();
  if (*consumed > 0) { /* drop the line returned last time */
    memmove(c->buf, c->buf + *consumed, c->len - *consumed);
    c->len -= *consumed;
    *consumed = 0;
  }
  for (;;) {
    char *nl = memchr(c->buf, '\n', c->len);
    if (nl != NULL) {
      *nl = '\0';
      *line = c->buf;
      *consumed = (size_t)(nl - c->buf) + 1;
      return 1;
    }
    if (c->len == sizeof c->buf - 1) { /* a line longer than any event */
      c->buf[c->len] = '\0';
      *line = c->buf;
      *consumed = c->len;
      return 1;
    }
    if (c->eof || c->fd < 0)
      return 0;
    if (atomic_load(&bs_stop) || pulse_cli_since(t0) > timeout_s)
      return -1;
    struct pollfd pf = {c->fd, POLLIN, 0};
    if (poll(&pf, 1, 200) <= 0)
      continue;
    ssize_t got = read(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      c->eof = 1;
    else
      c->len += (size_t)got;
  }
}

/* Stops the child (SIGTERM; SIGKILL when it does not end within 30 s) and
 * reaps it. @return its exit status, or -1 when it did not exit by itself. */
static int bs_child_end(bs_child *c, int terminate) {
  if (c->pid <= 0)
    return -1;
  if (terminate)
    kill(c->pid, SIGTERM);
  int status = 0;
  double t0 = pulse_cli_now();
  for (;;) {
    pid_t w = waitpid(c->pid, &status, WNOHANG);
    if (w == c->pid || (w < 0 && errno != EINTR))
      break;
    if (pulse_cli_since(t0) > 30) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &status, 0);
      break;
    }
    /* drain its output, so that it never blocks writing it */
    char sink[4096];
    struct pollfd pf = {c->fd, POLLIN, 0};
    if (c->fd >= 0 && poll(&pf, 1, 20) > 0 &&
        read(c->fd, sink, sizeof sink) <= 0) {
      close(c->fd);
      c->fd = -1;
    } else if (c->fd < 0) {
      usleep(20000);
    }
  }
  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
  c->pid = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static double bs_json_num(const pulse_json *o, const char *key,
                          double missing) {
  const pulse_json *v = pulse_json_get(o, key);
  return v != NULL && v->type == PULSE_JSON_NUMBER ? strtod(v->text, NULL)
                                                   : missing;
}

/* Reads one event line. @return 1 a `synced` event (*out filled), 0 another
 * event (an `error` event is printed to stderr), -1 not an event. */
static int bs_event_parse(const char *line, bs_synced *out) {
  pulse_json_doc *doc = NULL;
  if (pulse_json_parse(line, strlen(line), NULL, &doc) != PULSE_OK)
    return -1;
  const pulse_json *o = pulse_json_doc_root(doc);
  const char *ev = NULL;
  int rc = pulse_json_string(pulse_json_get(o, "event"), &ev, NULL) ? 0 : -1;
  if (rc == 0 && strcmp(ev, "error") == 0) {
    const char *detail = "";
    pulse_json_string(pulse_json_get(o, "detail"), &detail, NULL);
    fprintf(stderr, "pulse-bench sync: pulse-pull: error: %s\n", detail);
  } else if (rc == 0 && strcmp(ev, "synced") == 0) {
    uint64_t step = 0;
    if (pulse_json_u64(pulse_json_get(o, "step"), &step) == PULSE_OK) {
      out->step = step;
      out->bytes = (uint64_t)bs_json_num(o, "bytes", 0);
      out->transfer = bs_json_num(o, "transfer_s", 0);
      out->verify = bs_json_num(o, "verify_s", 0);
      out->decode = bs_json_num(o, "decode_s", 0);
      out->apply = bs_json_num(o, "apply_s", 0);
      out->total = bs_json_num(o, "total_s", 0);
      out->write = bs_json_num(o, "write_s", -1);
      const char *ci = "";
      pulse_json_string(pulse_json_get(o, "class_index"), &ci, NULL);
      out->class_index = strcmp(ci, "on") == 0;
      rc = 1;
    }
  }
  pulse_json_doc_free(doc);
  return rc;
}

/* Reads events until a `synced` one at step `want`. @return 0, or 1 (the
 * child ended, stopped or timed out: printed). */
static int bs_child_wait_step(bs_child *c, uint64_t want, bs_synced *out,
                              size_t *consumed) {
  char *line;
  int got;
  while ((got = bs_child_line(c, BS_PULL_WAIT_S, &line, consumed)) == 1)
    if (bs_event_parse(line, out) == 1 && out->step == want)
      return 0;
  if (got == 0)
    fprintf(stderr,
            "pulse-bench sync: pulse-pull ended before step %" PRIu64 "\n",
            want);
  else if (!atomic_load(&bs_stop))
    fprintf(stderr,
            "pulse-bench sync: pulse-pull sent no step %" PRIu64
            " within %.0f s\n",
            want, BS_PULL_WAIT_S);
  return 1;
}

/* One `pulse-pull` to the head, in the calling thread's namespace: its
 * synced event in *out, its time from start to exit in *wall_s.
 * @return 0 or 1 (printed). */
static int bs_pull_once(bs_run *r, const char *url, bs_synced *out,
                        double *wall_s, uint64_t *peak) {
  bs_child c;
  if (bs_child_start(&c, r, url, 0) != 0)
    return 1;
  double t0 = pulse_cli_now();
  size_t consumed = 0;
  int rc = bs_child_wait_step(&c, r->step, out, &consumed);
  /* Its peak so far (loading the file, the sync, the file's write: all
   * done before the synced event). Not its rusage: a child forked from
   * this process counts this process's pages until its exec. */
  if (peak != NULL)
    *peak = rc == 0 ? bs_mem_kib((int)c.pid, "VmHWM") * 1024 : 0;
  char *line;
  while (rc == 0 && bs_child_line(&c, BS_PULL_WAIT_S, &line, &consumed) == 1)
    ; /* the exit event */
  int status = bs_child_end(&c, rc != 0 || atomic_load(&bs_stop));
  *wall_s = pulse_cli_since(t0);
  if (rc == 0 && status != 0) {
    fprintf(stderr, "pulse-bench sync: pulse-pull exited %d\n", status);
    rc = 1;
  }
  if (rc == 0)
    r->file_step = r->step;
  return rc;
}

int bs_pull_prepare(bs_run *r) {
  snprintf(r->file, sizeof r->file, "%s/worker.safetensors", r->dir);
  snprintf(r->pull_cache, sizeof r->pull_cache, "%s/worker-cache", r->dir);
  r->file_step = UINT64_MAX;
  bs_synced s;
  double wall;
  return bs_pull_once(r, r->url0, &s, &wall, NULL);
}

/* A pulse-pull worker's peak resident bytes less the file's tensors it
 * holds in memory (0 when not measured). */
static uint64_t bs_above_targets(const bs_run *r, uint64_t peak) {
  uint64_t targets = r->m.total * 2;
  return peak > targets ? peak - targets : 0;
}

static bs_sample bs_sample_of(const pulse_pub_figures *pf, const bs_synced *s,
                              double total, double seen, double end_to_end) {
  bs_sample x;
  memset(&x, 0, sizeof x);
  x.commit = pf->total_seconds;
  x.seconds = total;
  x.seen = seen;
  x.end_to_end = end_to_end;
  x.worker_sync = s->total;
  x.transfer = s->transfer;
  x.verify = s->verify;
  x.decode = s->decode;
  x.apply = s->apply;
  x.write = s->write;
  x.overlap = -1; /* pulse-pull does not report it */
  x.bytes = s->bytes;
  x.patch_bytes = pf->patch_bytes;
  x.changed = pf->changed;
  x.class_index = s->class_index;
  return x;
}

int bs_pull_one_shot_steps(bs_run *r, const bs_link *lk, const char *base,
                           bs_sample *s, size_t *ns) {
  bs_synced ev;
  double wall;
  *ns = 0;
  /* The file behind the head (other workers ran): brought there, untimed. */
  if (r->file_step != r->step && bs_pull_once(r, base, &ev, &wall, NULL) != 0)
    return fprintf(stderr, "pulse-bench sync: %s: one-shot catch-up failed\n",
                   lk->name),
           1;
  for (uint64_t k = 0; k < r->a->steps && !atomic_load(&bs_stop); k++) {
    pulse_pub_figures pf;
    pulse_status st = bs_commit_next(r, &pf);
    if (st != PULSE_OK)
      return bs_fail(lk->name, st);
    uint64_t peak = 0;
    if (bs_pull_once(r, base, &ev, &wall, &peak) != 0)
      return fprintf(stderr,
                     "pulse-bench sync: %s: one-shot step %" PRIu64 " failed\n",
                     lk->name, r->step),
             1;
    bs_sample *x = &s[(*ns)++];
    *x = bs_sample_of(&pf, &ev, wall, wall, pf.total_seconds + wall);
    x->peak_extra = bs_above_targets(r, peak);
  }
  return 0;
}

int bs_pull_long_lived_steps(bs_run *r, const bs_link *lk, const char *base,
                             bs_sample *s, size_t *ns) {
  bs_child c;
  bs_synced ev;
  size_t consumed = 0;
  int peak_ok = 0;
  *ns = 0;
  if (bs_child_start(&c, r, base, 1) != 0)
    return 1;
  /* Its first sync: it loaded the file and holds the head. Then one step
   * untimed (its total in r->first_step_s): the first patch after a start
   * decodes by the pass and, where the rule keeps one, starts the class
   * index's build, which a worker that has been following pays no more. */
  int rc = bs_child_wait_step(&c, r->step, &ev, &consumed);
  if (rc == 0)
    r->file_step = r->step;
  for (uint64_t k = 0; rc == 0 && k < r->a->steps + 1 && !atomic_load(&bs_stop);
       k++) {
    pulse_pub_figures pf;
    pulse_status st = bs_commit_next(r, &pf);
    if (st != PULSE_OK) {
      rc = bs_fail(lk->name, st);
      break;
    }
    rc = bs_child_wait_step(&c, r->step, &ev, &consumed);
    if (rc != 0)
      break;
    double now = pulse_cli_now();
    r->file_step = r->step;
    if (k == 0) {
      r->first_step_s = ev.total;
      /* Its peak from here on: the timed steps' (not loading the file). */
      peak_ok = bs_mem_reset_peak((int)c.pid) == 0;
    } else {
      s[(*ns)++] =
          bs_sample_of(&pf, &ev, ev.total, now - atomic_load(&r->head_at),
                       now - r->commit_at);
    }
  }
  uint64_t peak = peak_ok ? bs_mem_kib((int)c.pid, "VmHWM") * 1024 : 0;
  for (size_t i = 0; i < *ns; i++)
    s[i].peak_extra = bs_above_targets(r, peak);
  int status = bs_child_end(&c, 1);
  if (rc == 0 && status != 0) {
    fprintf(stderr, "pulse-bench sync: pulse-pull --follow exited %d\n",
            status);
    rc = 1;
  }
  if (rc != 0)
    r->file_step = UINT64_MAX; /* what it holds is for the next one to see */
  return rc;
}
