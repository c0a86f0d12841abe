/* pulse-pull URL... --out FILE: keeps a local safetensors checkpoint
 * bit-identical to a publisher's head (pulse_subscriber.h), once or
 * following each new step (--follow), and optionally re-serves what it
 * holds to other pullers (--serve: a relay; every receiver still verifies
 * every object). Events go to stdout as text (with a progress bar on a
 * terminal) or as JSON lines (--json). */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json_impl.h"
#include "pulse_log.h"
#include "pulse_server.h"
#include "pulse_subscriber.h"
#include "cli_args.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: pulse-pull URL [URL...] --out FILE [options]\n"
      "       pulse-pull URL [URL...] --cache DIR --serve HOST:PORT [options]\n"
      "  URL                 a pulse server (http:// or https://, e.g. "
      "http://trainer:8080);\n"
      "                      with several, every one is asked and the newest "
      "valid head\n"
      "                      is followed (a source that lags is reported)\n"
      "  --out FILE          safetensors file kept bit-identical to the "
      "publisher's head\n"
      "                      (resumed from the step it names); each step is "
      "written in place\n"
      "                      through a journal (.FILE.journal): durable when "
      "synced, and after a\n"
      "                      crash the next run repairs it to the last step "
      "synced; a reader of\n"
      "                      FILE during a sync may see two steps mixed (see "
      "--snapshot-every)\n"
      "  --snapshot-every K  also keep FILE.snapshot, replaced atomically "
      "every K steps in the\n"
      "                      background: always one whole, durable step for "
      "readers (costs the\n"
      "                      model's size in memory while it is written)\n"
      "  --cache DIR         downloads and partial downloads, laid out as a "
      "store\n"
      "                      (default FILE.pulse-cache)\n"
      "  --key HEX           the publisher's Ed25519 public key (64 hex "
      "digits, the head's\n"
      "                      \"public_key\"; `pulse-publish --store DIR "
      "--public-key` prints it);\n"
      "                      required unless --trust-first-use or "
      "--insecure-unsigned; a head\n"
      "                      that rotates the key (pulse-publish "
      "--rotate-key) is followed\n"
      "  --trust-first-use   no --key: trust the key of the first head "
      "taken, keep it in the\n"
      "                      cache and require it from then on (a warning "
      "says so)\n"
      "  --follow            keep syncing each new step (long-polls) until "
      "SIGINT/SIGTERM\n"
      "  --serve HOST:PORT   re-serve the cache with the pulse server (port 0: "
      "a free one,\n"
      "                      printed); mirrors every object the head names; "
      "until SIGINT/SIGTERM\n"
      "  --json              one JSON object per event on stdout\n"
      "  --timeout S         seconds for head requests, and for a transfer "
      "that stalls\n"
      "                      (default 30)\n"
      "  --retries N         retries on network errors and 5xx, with backoff "
      "(default 6)\n"
      "  --parallel N        range requests at once for large objects (default "
      "4)\n"
      "  --min-rate BYTES    each object must come at this average rate at "
      "least\n"
      "                      (plus --grace-s; at most half --limit-rate), "
      "else the next URL\n"
      "                      is tried, unless it still comes at an eighth of "
      "it: its deadline\n"
      "                      then follows the rate measured (default 256K; "
      "0: no deadline)\n"
      "  --grace-s S         seconds added to each object's deadline "
      "(default 30)\n"
      "  --cacert FILE       CA certificates (PEM) for https:// URLs (a "
      "private CA);\n"
      "                      certificates are always verified\n"
      "  --limit-rate BYTES  download at most BYTES per second per request "
      "(e.g. 2M)\n"
      "  --max-object-size BYTES  refuse, before downloading it, an object "
      "the head says is\n"
      "                      larger (default 1 TiB: 1099511627776; e.g. 200G)\n"
      "  --follow-redirects-to HOST[:PORT]  follow a source's redirects to "
      "this origin too\n"
      "                      (repeatable; by default a redirect is followed "
      "within the source's\n"
      "                      own scheme, host and port only, never to http "
      "from https;\n"
      "                      http://HOST[:PORT] allows that downgrade); name "
      "mirrors as URLs\n"
      "  --no-catchup        never use the server's squashed catch-up patches\n"
      "  --insecure-unsigned accept heads that are not signed, and signed "
      "ones by any key\n"
      "                      (no authenticity; with --trust-first-use, "
      "a signed head's key is\n"
      "                      kept and required)\n"
      "  --max-age SECONDS   refuse a head published longer ago than this "
      "(or one that\n"
      "                      does not say when: format 1, or one dated more "
      "than 60 s ahead)\n"
      "  --allow-rollback    take a head older than the step FILE or the "
      "cache holds\n"
      "                      (default: refused)\n"
      "  --switch-run        take a head of another run (another store "
      "under the same\n"
      "                      key) than the one FILE or the cache holds "
      "(default: refused)\n"
      "  --threads N         decode threads (default: one per core)\n"
      "  --no-stream         download each patch whole before decoding it "
      "(default: decode\n"
      "                      while it downloads, commit once it verified)\n"
      "  --class-index MODE  auto, on or off: whether to keep a class index of the\n"
      "                      weights (2.13 bytes per parameter: class-model patches\n"
      "                      then decode without a pass over the weights, 1.2-6x\n"
      "                      faster once built; same result). auto (the default with\n"
      "                      --follow or --serve): only where it fits --memory-budget\n"
      "                      and the patches change at most 5%% of the weights, built\n"
      "                      between steps, never waited for; each synced event says\n"
      "                      what was chosen and why. Without --follow or --serve the\n"
      "                      default is off: one step, no next one to index for\n"
      "  --no-class-index    the same as --class-index off\n"
      "  --memory-budget BYTES  memory the worker may keep beside FILE's weights and the\n"
      "                      step it applies, for the class index (default a tenth of\n"
      "                      the weights' bytes, which the index never fits: peak\n"
      "                      memory stays within the weights + 10%% + the patch;\n"
      "                      e.g. 4G)\n"
      "Exit status: 0 synced (or stopped cleanly), 1 error, 2 usage.\n");
}

/* The same message again within PULL_REPEAT_S is counted, not printed
 * (a source alternating a good head with a foreign one once printed two
 * lines per refusal, several a second): the first time, then once per
 * PULL_REPEAT_S with how many were held back, as the library's own log
 * does. The last PULL_RECENT messages are remembered. */
#define PULL_REPEAT_S 30.0
#define PULL_RECENT 8

typedef struct {
  char detail[512]; /* "" when free */
  double at;        /* when it was last printed */
  unsigned held;    /* repeats not printed since */
} recent_line;

typedef struct {
  int json, tty, bar_shown;
  pulse_server *srv;
  pulse_sub *sub;
  recent_line recent[PULL_RECENT];
} out_ctx;

static double mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Prints "pulse-pull: KIND: DETAIL" on stderr unless the same detail (of
 * whatever kind: a refusal and the sync error it causes say the same) was
 * printed less than PULL_REPEAT_S ago. */
static void say_throttled(out_ctx *c, const char *kind, const char *detail) {
  double now = mono_s();
  recent_line *r = NULL, *oldest = &c->recent[0];
  for (int i = 0; i < PULL_RECENT; i++) {
    recent_line *l = &c->recent[i];
    if (l->detail[0] != '\0' && strncmp(l->detail, detail, sizeof l->detail - 1) == 0)
      r = l;
    if (l->detail[0] == '\0' || l->at < oldest->at)
      oldest = l;
  }
  if (r != NULL && now - r->at < PULL_REPEAT_S) {
    r->held++;
    return;
  }
  if (r != NULL && r->held > 0)
    fprintf(stderr, "pulse-pull: %s: %s (%u more times in %.0f s)\n", kind,
            detail, r->held, now - r->at);
  else
    fprintf(stderr, "pulse-pull: %s: %s\n", kind, detail);
  if (r == NULL) {
    r = oldest;
    snprintf(r->detail, sizeof r->detail, "%s", detail);
  }
  r->at = now;
  r->held = 0;
}

static void json_str(const char *key, const char *s) {
  size_t n = strlen(s);
  char *e = malloc(6 * n + 1);
  if (e == NULL)
    return;
  size_t m = pulse_json_escape(e, s, n);
  printf(",\"%s\":\"%.*s\"", key, (int)m, e);
  free(e);
}

static void json_step(const char *key, uint64_t s) {
  if (s == PULSE_SUB_NO_STEP)
    printf(",\"%s\":null", key);
  else
    printf(",\"%s\":%" PRIu64, key, s);
}

static const char *ev_name(pulse_sub_event_type t) {
  switch (t) {
  case PULSE_SUB_EV_HEAD:
    return "head";
  case PULSE_SUB_EV_PLAN:
    return "plan";
  case PULSE_SUB_EV_DOWNLOAD:
    return "download";
  case PULSE_SUB_EV_PROGRESS:
    return "progress";
  case PULSE_SUB_EV_OBJECT:
    return "object";
  case PULSE_SUB_EV_RETRY:
    return "retry";
  case PULSE_SUB_EV_REJECTED:
    return "rejected";
  case PULSE_SUB_EV_APPLIED:
    return "applied";
  case PULSE_SUB_EV_SYNCED:
    return "synced";
  case PULSE_SUB_EV_ERROR:
    return "error";
  case PULSE_SUB_EV_WARNING:
    return "warning";
  case PULSE_SUB_EV_HEAD_SAVED:
    return "head_saved";
  case PULSE_SUB_EV_LAGGING:
    return "lagging";
  }
  return "?";
}

static void print_figures_json(const pulse_sub_figures *f) {
  printf(",\"state_digest\":\"%s\",\"route\":\"%s\",\"bytes\":%" PRIu64
         ",\"bytes_downloaded\":%" PRIu64 ",\"bytes_resumed\":%" PRIu64
         ",\"objects_fetched\":%" PRIu64 ",\"retries\":%" PRIu64
         ",\"rejected\":%" PRIu64
         ",\"transfer_s\":%.6f,\"verify_s\":%.6f,\"decode_s\":%.6f"
         ",\"apply_s\":%.6f,\"write_s\":%.6f,\"total_s\":%.6f"
         ",\"file_bytes_written\":%" PRIu64 ",\"class_index\":\"%s\"",
         f->state_digest, pulse_sub_route_name(f->last_route), f->last_bytes,
         f->bytes_downloaded, f->bytes_resumed, f->objects_fetched, f->retries,
         f->rejected, f->last_transfer_s, f->last_verify_s, f->last_decode_s,
         f->last_apply_s, f->last_write_s, f->last_total_s, f->file_bytes_written,
         f->class_index_kept ? "on" : "off");
  json_str("class_index_why", f->class_index_why);
}

static void clear_bar(out_ctx *c) {
  if (c->bar_shown) {
    printf("\r\033[K");
    c->bar_shown = 0;
  }
}

static void bar(out_ctx *c, const char *object, uint64_t have, uint64_t total) {
  if (!c->tty || c->json || total == 0)
    return;
  int width = 30, fill = (int)((double)have / (double)total * width);
  if (fill > width)
    fill = width;
  char b[64];
  for (int i = 0; i < width; i++)
    b[i] = i < fill ? '#' : '.';
  b[width] = '\0';
  const char *name = strrchr(object, '/');
  name = name ? name + 1 : object;
  printf("\r\033[K[%s] %3.0f%% %.16s... %.1f/%.1f MB", b,
         100.0 * (double)have / (double)total, name, (double)have / 1e6,
         (double)total / 1e6);
  fflush(stdout);
  c->bar_shown = 1;
}

static void on_event(void *ctx, const pulse_sub_event *ev) {
  out_ctx *c = ctx;
  if (ev->type == PULSE_SUB_EV_HEAD_SAVED && c->srv != NULL)
    pulse_server_notify(c->srv, -1.0); /* downstream long-polls wake now */
  if (c->json) {
    if (ev->type == PULSE_SUB_EV_PROGRESS && !c->tty)
      return; /* too chatty for scripts, but for the last one of each object */
    printf("{\"event\":\"%s\"", ev_name(ev->type));
    json_step("step", ev->step);
    json_step("head_step", ev->head_step);
    switch (ev->type) {
    case PULSE_SUB_EV_PLAN:
      printf(",\"route\":\"%s\"", pulse_sub_route_name(ev->route));
      json_step("from_step", ev->from_step);
      printf(",\"bytes\":%" PRIu64, ev->bytes);
      break;
    case PULSE_SUB_EV_DOWNLOAD:
      json_str("object", ev->object);
      printf(",\"total\":%" PRIu64 ",\"resumed\":%" PRIu64, ev->total,
             ev->resumed);
      break;
    case PULSE_SUB_EV_PROGRESS:
      json_str("object", ev->object);
      printf(",\"bytes\":%" PRIu64 ",\"total\":%" PRIu64, ev->bytes, ev->total);
      break;
    case PULSE_SUB_EV_OBJECT:
      json_str("object", ev->object);
      printf(",\"total\":%" PRIu64, ev->total);
      break;
    case PULSE_SUB_EV_RETRY:
      json_str("object", ev->object ? ev->object : "");
      printf(",\"attempt\":%u,\"delay_ms\":%u", ev->attempt, ev->delay_ms);
      json_str("detail", ev->detail ? ev->detail : "");
      break;
    case PULSE_SUB_EV_REJECTED:
      json_str("object", ev->object ? ev->object : "");
      printf(",\"status\":\"%s\"", pulse_status_name(ev->status));
      json_str("detail", ev->detail ? ev->detail : "");
      break;
    case PULSE_SUB_EV_APPLIED:
      printf(",\"route\":\"%s\"", pulse_sub_route_name(ev->route));
      break;
    case PULSE_SUB_EV_LAGGING:
      json_str("url", ev->object ? ev->object : "");
      json_step("source_step", ev->from_step);
      json_str("detail", ev->detail ? ev->detail : "");
      break;
    case PULSE_SUB_EV_SYNCED: {
      pulse_sub_figures f;
      pulse_sub_figures_get(c->sub, &f);
      json_step("from_step", ev->from_step);
      print_figures_json(&f);
      break;
    }
    case PULSE_SUB_EV_ERROR:
    case PULSE_SUB_EV_WARNING:
      if (ev->type == PULSE_SUB_EV_ERROR)
        printf(",\"status\":\"%s\"", pulse_status_name(ev->status));
      json_str("detail", ev->detail ? ev->detail : "");
      break;
    default:
      break;
    }
    printf("}\n");
    fflush(stdout);
    return;
  }
  switch (ev->type) {
  case PULSE_SUB_EV_DOWNLOAD:
    bar(c, ev->object, ev->resumed, ev->total);
    break;
  case PULSE_SUB_EV_PROGRESS:
    bar(c, ev->object, ev->bytes, ev->total);
    break;
  case PULSE_SUB_EV_OBJECT:
    clear_bar(c);
    break;
  case PULSE_SUB_EV_REJECTED:
  case PULSE_SUB_EV_WARNING:
  case PULSE_SUB_EV_LAGGING:
  case PULSE_SUB_EV_RETRY:
  case PULSE_SUB_EV_ERROR:
    clear_bar(c);
    fflush(stdout);
    say_throttled(c, ev_name(ev->type), ev->detail ? ev->detail : "");
    break;
  case PULSE_SUB_EV_SYNCED: {
    clear_bar(c);
    pulse_sub_figures f;
    pulse_sub_figures_get(c->sub, &f);
    char from[32] = "none";
    if (ev->from_step != PULSE_SUB_NO_STEP)
      snprintf(from, sizeof from, "%" PRIu64, ev->from_step);
    printf("pulse-pull: step %" PRIu64
           " (%s route from %s, %.3f MB in %.3f s: transfer %.3f s, "
           "verify %.3f s, decode %.3f s, apply %.3f s, write %.3f s; class index %s), "
           "state %s\n",
           ev->step, pulse_sub_route_name(f.last_route), from,
           (double)f.last_bytes / 1e6, f.last_total_s, f.last_transfer_s,
           f.last_verify_s, f.last_decode_s, f.last_apply_s, f.last_write_s,
           f.class_index_kept ? "on" : "off", f.state_digest);
    fflush(stdout);
    break;
  }
  default:
    break;
  }
}

/* ------------------------------------------------------------- signals */

typedef struct {
  sigset_t set;
  pulse_sub *sub;
  atomic_int stopped;
  pthread_t thread;
  int running;
} stopper;

static void *stop_wait(void *arg) {
  stopper *s = arg;
  int sig = 0;
  sigwait(&s->set, &sig);
  if (sig != SIGUSR1) /* SIGUSR1: the program ends anyway */
    atomic_store(&s->stopped, 1);
  pulse_sub_stop(s->sub);
  return NULL;
}

/* The command line, read by parse_args. */
typedef struct {
  const char *out, *cache, *key_hex, *serve;
  int follow, json, unsigned_, tofu, no_catchup, threads, no_stream;
  int index_mode; /* --class-index: -1 not given, else pulse_sub_class_index */
  uint64_t memory_budget; /* 0: the library's default */
  int allow_rollback, switch_run, max_age_s;
  int retries, parallel, timeout_s;
  int min_rate, grace_s; /* the download deadline */
  const char *cacert;
  uint64_t rate, snapshot_every;
  uint64_t max_object; /* 0: the library's default */
  const char *redirect_to[64]; /* --follow-redirects-to */
  size_t nredirect;
  const char *urls[64];
  size_t nurls;
  uint8_t key[PULSE_KEY_BYTES];
  char cache_buf[4096];
} pull_args;

/* Reads argv into *a. Returns -1 to go on, else the exit code (0 for
 * --help, 2 for bad usage, with the message printed). */
static int parse_args(int argc, char **argv, pull_args *a) {
  const char *v;
  memset(a, 0, sizeof *a);
  a->index_mode = -1;
  a->retries = 6, a->parallel = 4, a->timeout_s = 30;
  a->min_rate = 262144, a->grace_s = 30;
  for (int i = 1; i < argc; i++) {
    int r;
    if (pulse_cli_opt_flag(argv[i], "--help") ||
        pulse_cli_opt_flag(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--out", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->out = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--cache", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->cache = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--key", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->key_hex = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--serve", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->serve = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--timeout", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 86400, &a->timeout_s) != 0)
        return fprintf(stderr,
                       "pulse-pull: --timeout needs 1..86400 seconds\n"),
               2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--retries", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 1000, &a->retries) != 0)
        return fprintf(stderr, "pulse-pull: --retries needs 0..1000\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--min-rate", &v)) !=
               0) {
      uint64_t rate = 0;
      if (r < 0 || pulse_cli_parse_u64(v, &rate) != 0 || rate > INT32_MAX)
        return fprintf(stderr,
                       "pulse-pull: --min-rate needs BYTES per second "
                       "(0..2G)\n"),
               2;
      a->min_rate = (int)rate;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--cacert", &v)) != 0) {
      if (r < 0)
        return fprintf(stderr, "pulse-pull: --cacert needs a file\n"), 2;
      a->cacert = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--grace-s", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 86400, &a->grace_s) != 0)
        return fprintf(stderr, "pulse-pull: --grace-s needs 0..86400\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--parallel", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 16, &a->parallel) != 0)
        return fprintf(stderr, "pulse-pull: --parallel needs 1..16\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 256, &a->threads) != 0)
        return fprintf(stderr, "pulse-pull: --threads needs 0..256\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--limit-rate", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->rate) != 0)
        return fprintf(
                   stderr,
                   "pulse-pull: --limit-rate needs a byte count (e.g. 2M)\n"),
               2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--snapshot-every", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->snapshot_every) != 0 || a->snapshot_every == 0)
        return fprintf(stderr, "pulse-pull: --snapshot-every needs a step count of at least 1\n"),
               2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--max-age", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 2000000000, &a->max_age_s) != 0)
        return fprintf(stderr,
                       "pulse-pull: --max-age needs a number of seconds\n"),
               2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--follow-redirects-to",
                                        &v)) != 0) {
      if (r < 0 || v[0] == '\0')
        return fprintf(stderr, "pulse-pull: --follow-redirects-to needs "
                               "HOST[:PORT]\n"),
               2;
      if (a->nredirect == sizeof a->redirect_to / sizeof a->redirect_to[0])
        return fprintf(stderr, "pulse-pull: at most 64 "
                               "--follow-redirects-to\n"),
               2;
      a->redirect_to[a->nredirect++] = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--max-object-size",
                                        &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->max_object) != 0 ||
          a->max_object == 0 || a->max_object > (uint64_t)INT64_MAX)
        return fprintf(stderr, "pulse-pull: --max-object-size needs a byte "
                               "count (e.g. 200G)\n"),
               2;
    } else if (pulse_cli_opt_flag(argv[i], "--allow-rollback")) {
      a->allow_rollback = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--switch-run")) {
      a->switch_run = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--follow")) {
      a->follow = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--json")) {
      a->json = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--no-catchup")) {
      a->no_catchup = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--no-stream")) {
      a->no_stream = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--no-class-index")) {
      a->index_mode = PULSE_SUB_CLASS_INDEX_OFF;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--class-index", &v)) != 0) {
      if (r >= 0 && strcmp(v, "auto") == 0)
        a->index_mode = PULSE_SUB_CLASS_INDEX_AUTO;
      else if (r >= 0 && strcmp(v, "on") == 0)
        a->index_mode = PULSE_SUB_CLASS_INDEX_ON;
      else if (r >= 0 && strcmp(v, "off") == 0)
        a->index_mode = PULSE_SUB_CLASS_INDEX_OFF;
      else
        return fprintf(stderr, "pulse-pull: --class-index needs auto, on or off\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--memory-budget", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->memory_budget) != 0 || a->memory_budget == 0)
        return fprintf(stderr, "pulse-pull: --memory-budget needs a byte count of at least 1 "
                               "(e.g. 4G)\n"),
               2;
    } else if (pulse_cli_opt_flag(argv[i], "--insecure-unsigned")) {
      a->unsigned_ = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--trust-first-use")) {
      a->tofu = 1;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "pulse-pull: unknown option '%s'\n", argv[i]);
      return usage(stderr), 2;
    } else if (a->nurls == sizeof a->urls / sizeof a->urls[0]) {
      return fprintf(stderr, "pulse-pull: at most 64 URLs\n"), 2;
    } else {
      a->urls[a->nurls++] = argv[i];
    }
  }
  if (a->nurls == 0 || (a->out == NULL && a->serve == NULL) ||
      (a->out == NULL && a->snapshot_every > 0) ||
      (a->out == NULL && a->cache == NULL) ||
      (a->key_hex != NULL && a->unsigned_))
    return usage(stderr), 2;
  if (a->key_hex != NULL && a->tofu)
    return fprintf(stderr, "pulse-pull: --key and --trust-first-use exclude "
                           "each other\n"),
           2;
  if (a->key_hex == NULL && !a->tofu && !a->unsigned_)
    return fprintf(stderr,
                   "pulse-pull: no publisher key: pin it with --key HEX (the "
                   "head's \"public_key\",\n"
                   "  printed by `pulse-publish --store DIR --public-key`), or "
                   "trust the first\n"
                   "  head's key explicitly with --trust-first-use\n"),
           2;
  if (a->key_hex != NULL && pulse_sub_key_from_hex(a->key_hex, a->key) != PULSE_OK)
    return fprintf(stderr, "pulse-pull: --key needs 64 hex digits\n"), 2;
  if (a->cache == NULL) {
    snprintf(a->cache_buf, sizeof a->cache_buf, "%s.pulse-cache", a->out);
    a->cache = a->cache_buf;
  }
  return -1;
}

/* The subscriber options of the command line (borrowing from *a). */
static pulse_sub_opts sub_opts_of(const pull_args *a, out_ctx *oc) {
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  o.urls = a->urls;
  o.url_count = a->nurls;
  o.cache_dir = a->cache;
  o.public_key = a->key_hex ? a->key : NULL;
  o.allow_unsigned = a->unsigned_;
  o.trust_first_use = a->tofu;
  o.request_timeout_ms = (uint32_t)a->timeout_s * 1000u;
  o.low_speed_seconds = (uint32_t)a->timeout_s;
  o.retries = (unsigned)a->retries;
  o.min_bytes_per_s = (uint32_t)a->min_rate;
  o.download_grace_ms = (uint32_t)a->grace_s * 1000u;
  o.cacert = a->cacert;
  o.parallel = (unsigned)a->parallel;
  o.max_recv_bytes_per_s = a->rate;
  o.use_catchup = !a->no_catchup;
  o.mirror = a->serve != NULL;
  o.threads = a->threads;
  o.no_streaming = a->no_stream;
  /* A one-shot pull has no next patch to decode faster with an index it
   * would build in the background, against the step's own writing. */
  if (a->index_mode >= 0)
    o.class_index = (pulse_sub_class_index)a->index_mode;
  else if (!a->follow && a->serve == NULL)
    o.class_index = PULSE_SUB_CLASS_INDEX_OFF;
  o.memory_budget_bytes = a->memory_budget;
  o.allow_rollback = a->allow_rollback;
  o.switch_run = a->switch_run;
  o.max_head_age_s = (uint32_t)a->max_age_s;
  o.redirect_origins = a->redirect_to;
  o.redirect_origin_count = a->nredirect;
  if (a->max_object != 0)
    o.max_object_bytes = a->max_object;
  o.on_event = on_event;
  o.on_event_ctx = oc;
  return o;
}

/* --serve: a relay of the cache, announced on stdout. */
static int start_relay(const pull_args *a, out_ctx *oc) {
  char host[256];
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  if (pulse_server_parse_listen(a->serve, host, sizeof host, &so.port) !=
      PULSE_OK) {
    fprintf(stderr, "pulse-pull: --serve needs HOST:PORT\n");
    return 2;
  }
  so.host = host;
  so.store_dir = a->cache;
  so.watch = 1;
  pulse_status st = pulse_server_create(&so, &oc->srv);
  if (st != PULSE_OK)
    return pulse_cli_fail("pulse-pull", a->serve, st);
  if (a->json)
    printf("{\"event\":\"serving\",\"url\":\"http://%s:%u\"}\n",
           host[0] ? host : "0.0.0.0", (unsigned)pulse_server_port(oc->srv));
  else
    printf("pulse-pull: serving %s on http://%s:%u\n", a->cache,
           host[0] ? host : "0.0.0.0", (unsigned)pulse_server_port(oc->srv));
  fflush(stdout);
  return 0;
}

/* Syncs once or follows; after a single sync with --serve, serves until a
 * stop signal. Returns the exit code. */
static int pull_run(const pull_args *a, pulse_sub *sub, stopper *stop) {
  int rc = 0;
  pulse_status st;
  stop->running = pthread_create(&stop->thread, NULL, stop_wait, stop) == 0;
  if (a->follow) {
    st = pulse_sub_follow(sub);
  } else {
    st = pulse_sub_sync(sub);
    if (st == PULSE_OK && a->serve != NULL && !atomic_load(&stop->stopped)) {
      if (!a->json)
        fprintf(stderr,
                "pulse-pull: synced; serving until SIGINT or SIGTERM\n");
      if (stop->running)
        pthread_join(stop->thread, NULL);
      stop->running = 0;
    }
  }
  if (st != PULSE_OK && !(atomic_load(&stop->stopped) && a->follow))
    rc = 1;
  if (st != PULSE_OK && !a->json)
    fprintf(stderr, "pulse-pull: %s (%s): %s\n", pulse_status_str(st),
            pulse_status_name(st), pulse_sub_error(sub));
  if (stop->running) {
    pthread_kill(stop->thread, SIGUSR1);
    pthread_join(stop->thread, NULL);
  }
  if (a->json) {
    pulse_sub_figures f;
    pulse_sub_figures_get(sub, &f);
    printf("{\"event\":\"exit\",\"code\":%d", rc);
    json_step("step", f.step);
    json_step("head_step", f.head_step);
    print_figures_json(&f);
    printf("}\n");
  }
  return rc;
}

int main(int argc, char **argv) {
  static pull_args a; /* static: its buffers outlive every borrower */
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;
  if (getenv("PULSE_LOG") == NULL)
    pulse_log_level_set(PULSE_LOG_ERROR); /* events say it all */

  /* Stop signals go to one thread; every thread inherits the mask. */
  stopper stop;
  memset(&stop, 0, sizeof stop);
  sigemptyset(&stop.set);
  sigaddset(&stop.set, SIGINT);
  sigaddset(&stop.set, SIGTERM);
  sigaddset(&stop.set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop.set, NULL);
  signal(SIGPIPE, SIG_IGN);

  out_ctx oc;
  memset(&oc, 0, sizeof oc);
  oc.json = a.json;
  oc.tty = isatty(STDOUT_FILENO);
  pulse_sub_opts o = sub_opts_of(&a, &oc);
  pulse_sub *sub = NULL;
  pulse_status st = pulse_sub_create(&o, &sub);
  if (st != PULSE_OK)
    return pulse_cli_fail("pulse-pull", a.cache, st);
  oc.sub = sub;
  stop.sub = sub;
  rc = 0;
  if (a.out != NULL && (st = pulse_sub_attach_file(sub, a.out)) != PULSE_OK)
    rc = pulse_cli_fail("pulse-pull", a.out, st);
  if (rc == 0 && a.snapshot_every > 0 &&
      (st = pulse_sub_file_snapshot(sub, a.snapshot_every)) != PULSE_OK)
    rc = pulse_cli_fail("pulse-pull", a.out, st);
  if (rc == 0 && a.serve != NULL)
    rc = start_relay(&a, &oc);
  if (rc == 0)
    rc = pull_run(&a, sub, &stop);
  pulse_server_free(oc.srv);
  pulse_sub_free(sub);
  return rc;
}
