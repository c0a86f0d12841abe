/* upload_s3.c - the S3 uploader's configuration (options, then the AWS
 * CLI's environment variables) and its requests: path-style URLs, libcurl's
 * SigV4 with the payload's SHA-256 in x-amz-content-sha256 (libcurl 7.88
 * signs S3 requests correctly only when it is given), several at once on
 * one multi handle, each retried with backoff. */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "store_impl.h"
#include "upload_impl.h"

/* ------------------------------------------------------------ configuration */

static char *pick(const char *given, const char *env1, const char *env2,
                  const char *dflt) {
  const char *v = given;
  if (v == NULL && env1 != NULL)
    v = getenv(env1);
  if ((v == NULL || v[0] == '\0') && env2 != NULL)
    v = getenv(env2);
  if (v == NULL || v[0] == '\0')
    v = dflt;
  return v != NULL ? strdup(v) : NULL;
}

static int plain(const char *s) {
  for (; s != NULL && *s; s++)
    if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e || *s == ':')
      return 0;
  return 1;
}

void pulse_upload_opts_init(pulse_upload_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_UPLOAD_OPTS_VERSION;
  o->multipart_bytes = (uint64_t)64 << 20;
  o->part_bytes = (uint64_t)16 << 20;
  o->parallel = 4;
  o->retries = 5;
  o->keep_anchors = 2;
  o->grace_seconds = 600;
}

pulse_status pulse_upload_create(const pulse_upload_opts *opts,
                                 pulse_upload **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "upload: NULL output");
  PULSE_TRY(PULSE_OPTS_CHECK("upload", opts, PULSE_UPLOAD_OPTS_VERSION));
  *out = NULL;
  const char *t = opts->target;
  if (t == NULL || strncmp(t, "s3://", 5) != 0 || t[5] == '\0' || t[5] == '/')
    return pulse_fail(PULSE_ERR_ARG, "upload: '%s' is not s3://BUCKET[/PREFIX]",
                      t ? t : "(null)");
  if (opts->part_bytes < ((uint64_t)5 << 20) ||
      opts->part_bytes > ((uint64_t)5 << 30) || opts->parallel == 0 ||
      opts->parallel > 64 || opts->retries > 100)
    return pulse_fail(PULSE_ERR_ARG,
                      "upload: parts of 5 MiB..5 GiB, 1..64 at once, retries "
                      "0..100");
  pulse_upload *up = calloc(1, sizeof *up);
  if (up == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "upload");
  up->opts = *opts;
  up->stale_due = 1; /* the first call looks for stale uploads */
  const char *slash = strchr(t + 5, '/');
  size_t blen = slash ? (size_t)(slash - (t + 5)) : strlen(t + 5);
  up->bucket = strndup(t + 5, blen);
  const char *p = slash ? slash + 1 : "";
  size_t plen = strlen(p);
  while (plen > 0 && p[plen - 1] == '/')
    plen--;
  up->prefix = malloc(plen + 2);
  if (up->prefix != NULL)
    snprintf(up->prefix, plen + 2, "%.*s%s", (int)plen, p, plen ? "/" : "");
  up->region = pick(opts->region, "AWS_REGION", "AWS_DEFAULT_REGION",
                    "us-east-1");
  char dflt[256];
  snprintf(dflt, sizeof dflt, "https://s3.%s.amazonaws.com",
           up->region ? up->region : "us-east-1");
  up->endpoint =
      pick(opts->endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", dflt);
  up->access_key = pick(opts->access_key, "AWS_ACCESS_KEY_ID", NULL, NULL);
  up->secret_key = pick(opts->secret_key, "AWS_SECRET_ACCESS_KEY", NULL, NULL);
  up->session_token =
      pick(opts->session_token, "AWS_SESSION_TOKEN", NULL, NULL);
  up->cacert = opts->cacert ? strdup(opts->cacert) : NULL;
  if (up->bucket == NULL || up->prefix == NULL || up->region == NULL ||
      up->endpoint == NULL || (opts->cacert && up->cacert == NULL)) {
    pulse_upload_free(up);
    return pulse_fail(PULSE_ERR_NOMEM, "upload");
  }
  size_t elen = strlen(up->endpoint);
  while (elen > 0 && up->endpoint[elen - 1] == '/')
    up->endpoint[--elen] = '\0';
  if (!(strncmp(up->endpoint, "http://", 7) == 0 ||
        strncmp(up->endpoint, "https://", 8) == 0) ||
      !plain(up->region) || !plain(up->access_key) ||
      strlen(up->region) > 64 ||
      (up->access_key != NULL) != (up->secret_key != NULL) ||
      (up->access_key && strlen(up->access_key) + strlen(up->secret_key) >
                             sizeof up->userpwd - 2)) {
    pulse_upload_free(up);
    return pulse_fail(PULSE_ERR_ARG,
                      "upload: endpoint must be http(s)://, region and access "
                      "key plain text, and an access key needs its secret");
  }
  snprintf(up->sigv4, sizeof up->sigv4, "aws:amz:%s:s3", up->region);
  if (up->access_key != NULL)
    snprintf(up->userpwd, sizeof up->userpwd, "%s:%s", up->access_key,
             up->secret_key);
  up->opts.target = NULL;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  *out = up;
  return PULSE_OK;
}

void pulse_upload_free(pulse_upload *up) {
  if (up == NULL)
    return;
  free(up->bucket), free(up->prefix), free(up->endpoint), free(up->region);
  free(up->access_key), free(up->secret_key), free(up->session_token);
  free(up->cacert);
  if (up->multi != NULL && up->multi_pid == (long)getpid())
    curl_multi_cleanup(up->multi);
  free(up);
}

/* ---------------------------------------------------------------- helpers */

void upload_uri_encode(const char *s, int keep_slash, char *out, size_t cap) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  for (; *s && o + 4 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
        (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
        c == '~' || (keep_slash && c == '/')) {
      out[o++] = (char)c;
    } else {
      out[o++] = '%';
      out[o++] = hex[c >> 4];
      out[o++] = hex[c & 15];
    }
  }
  out[o] = '\0';
}

int upload_xml_tag(const char *xml, size_t len, size_t *from, const char *tag,
                   char *out, size_t cap) {
  char open[64], close[64];
  snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close, sizeof close, "</%s>", tag);
  size_t ol = strlen(open), cl = strlen(close);
  for (size_t i = *from; i + ol <= len; i++) {
    if (memcmp(xml + i, open, ol) != 0)
      continue;
    size_t a = i + ol;
    for (size_t j = a; j + cl <= len; j++) {
      if (memcmp(xml + j, close, cl) != 0)
        continue;
      size_t o = 0;
      for (size_t k = a; k < j; k++) {
        static const char *const ent[][2] = {{"&amp;", "&"},  {"&lt;", "<"},
                                             {"&gt;", ">"},   {"&quot;", "\""},
                                             {"&apos;", "'"}, {"&#34;", "\""}};
        char c = xml[k];
        for (size_t e = 0; e < sizeof ent / sizeof *ent; e++) {
          size_t el = strlen(ent[e][0]);
          if (k + el <= j && memcmp(xml + k, ent[e][0], el) == 0) {
            c = ent[e][1][0];
            k += el - 1;
            break;
          }
        }
        if (o + 1 >= cap)
          return 0;
        out[o++] = c;
      }
      out[o] = '\0';
      *from = j + cl;
      return 1;
    }
    return 0;
  }
  return 0;
}

void upload_req_init(upload_req *r, const char *method) {
  memset(r, 0, sizeof *r);
  r->method = method;
  r->fd = -1;
  r->reply = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
}

void upload_req_release(upload_req *r) {
  pulse_bytebuf_free(&r->reply);
}

pulse_status upload_req_fail(const upload_req *r, const char *what) {
  char code[128] = "", msg[256] = "";
  size_t at = 0;
  upload_xml_tag((const char *)r->reply.data, r->reply.size, &at, "Code", code,
                 sizeof code);
  at = 0;
  upload_xml_tag((const char *)r->reply.data, r->reply.size, &at, "Message",
                 msg, sizeof msg);
  if (r->status == 0)
    return pulse_fail(PULSE_ERR_IO, "upload: %s: %s %s: no answer (%s)", what,
                      r->method, r->key, r->error);
  return pulse_fail(PULSE_ERR_IO, "upload: %s: %s %s: HTTP %ld%s%s%s%s", what,
                    r->method, r->key, r->status, code[0] ? " " : "", code,
                    msg[0] ? ": " : "", msg);
}

/* ------------------------------------------------------------ requests */

typedef struct {
  pulse_upload *up;
  upload_req *r;
  CURL *h;
  struct curl_slist *headers;
  uint64_t sent;   /* body bytes handed to libcurl in this try */
  uint64_t due_ms; /* when the next try may start */
  int running, done;
  char errbuf[CURL_ERROR_SIZE];
} job;

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static size_t on_read(char *buf, size_t size, size_t nmemb, void *ctx) {
  job *j = ctx;
  upload_req *r = j->r;
  size_t want = size * nmemb;
  uint64_t left = r->body_len - j->sent;
  if (want > left)
    want = (size_t)left;
  if (want == 0)
    return 0;
  if (r->fd >= 0) {
    ssize_t n = pread(r->fd, buf, want, (off_t)(r->offset + j->sent));
    if (n <= 0)
      return CURL_READFUNC_ABORT;
    want = (size_t)n;
  } else {
    memcpy(buf, r->body + j->sent, want);
  }
  j->sent += want;
  return want;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *ctx) {
  job *j = ctx;
  size_t n = size * nmemb;
  long status = 0;
  if (j->r->sink != NULL &&
      curl_easy_getinfo(j->h, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK &&
      status >= 200 && status < 300) {
    if (j->r->sink(j->r->sink_ctx, data, n) != 0) {
      j->r->sink_refused = 1;
      return 0;
    }
    return n;
  }
  if (j->r->reply.size + n > (64u << 20)) /* listings are paged: never this */
    return 0;
  pulse_bytebuf_put(&j->r->reply, data, n);
  return j->r->reply.failed ? 0 : n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ctx) {
  job *j = ctx;
  size_t n = size * nmemb;
  if (n > 5 && strncasecmp(data, "ETag:", 5) == 0) {
    const char *v = data + 5;
    while (*v == ' ')
      v++;
    size_t len = (size_t)(data + n - v);
    while (len > 0 && (v[len - 1] == '\r' || v[len - 1] == '\n'))
      len--;
    if (len < sizeof j->r->etag) {
      memcpy(j->r->etag, v, len);
      j->r->etag[len] = '\0';
    }
  }
  return n;
}

/* The SHA-256 of a file range, in hex. */
static int sha_of_range(int fd, uint64_t off, uint64_t len, char hex[65]) {
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  size_t cap = (size_t)1 << 20;
  uint8_t *buf = malloc(cap), sha[32];
  int ok = md != NULL && buf != NULL &&
           EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1;
  while (ok && len > 0) {
    size_t want = len < cap ? (size_t)len : cap;
    ssize_t n = pread(fd, buf, want, (off_t)off);
    if (n < 0 && errno == EINTR)
      continue;
    ok = n > 0 && EVP_DigestUpdate(md, buf, (size_t)n) == 1;
    off += (uint64_t)(n > 0 ? n : 0), len -= (uint64_t)(n > 0 ? n : 0);
  }
  unsigned sl = 32;
  ok = ok && EVP_DigestFinal_ex(md, sha, &sl) == 1;
  if (ok)
    store_hex(sha, 32, hex);
  EVP_MD_CTX_free(md);
  free(buf);
  return ok ? 0 : -1;
}

static int start(CURLM *m, job *j) {
  pulse_upload *up = j->up;
  upload_req *r = j->r;
  if (r->payload_sha256[0] == '\0') {
    if (r->fd >= 0) {
      if (sha_of_range(r->fd, r->offset, r->body_len, r->payload_sha256) != 0)
        return -1;
    } else {
      uint8_t sha[32];
      store_sha256(r->body, (size_t)r->body_len, sha);
      store_hex(sha, 32, r->payload_sha256);
    }
  }
  if (r->sink_restart != NULL && r->sink_restart(r->sink_ctx) != 0) {
    r->sink_refused = 1;
    return -1;
  }
  char url[16384], key[3700];
  upload_uri_encode(r->key, 1, key, sizeof key);
  snprintf(url, sizeof url, "%s/%s%s%s%s%s", up->endpoint, up->bucket,
           key[0] ? "/" : "", key, r->query[0] ? "?" : "", r->query);
  j->h = curl_easy_init();
  if (j->h == NULL)
    return -1;
  CURL *h = j->h;
  r->status = 0;
  r->etag[0] = '\0';
  r->error[0] = '\0';
  j->errbuf[0] = '\0';
  r->reply.size = 0;
  r->reply.failed = 0;
  j->sent = 0;
  char line[512];
  snprintf(line, sizeof line, "x-amz-content-sha256: %s", r->payload_sha256);
  j->headers = curl_slist_append(NULL, line);
  if (up->session_token != NULL && strlen(up->session_token) < 4000) {
    char tok[4100];
    snprintf(tok, sizeof tok, "x-amz-security-token: %s", up->session_token);
    j->headers = curl_slist_append(j->headers, tok);
  }
  if (r->cache_control != NULL) {
    snprintf(line, sizeof line, "Cache-Control: %s", r->cache_control);
    j->headers = curl_slist_append(j->headers, line);
  }
  if (r->content_type != NULL) {
    snprintf(line, sizeof line, "Content-Type: %s", r->content_type);
    j->headers = curl_slist_append(j->headers, line);
  }
  if (r->if_match != NULL) {
    snprintf(line, sizeof line, "If-Match: %s", r->if_match);
    j->headers = curl_slist_append(j->headers, line);
  }
  if (r->if_none_match != NULL) {
    snprintf(line, sizeof line, "If-None-Match: %s", r->if_none_match);
    j->headers = curl_slist_append(j->headers, line);
  }
  j->headers = curl_slist_append(j->headers, "Expect:");
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, j->headers);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, j->errbuf);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, j);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, j);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 20L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  if (up->cacert != NULL)
    curl_easy_setopt(h, CURLOPT_CAINFO, up->cacert);
  if (up->access_key != NULL) {
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, up->sigv4);
    curl_easy_setopt(h, CURLOPT_USERPWD, up->userpwd);
  }
  const char *m_ = r->method;
  if (strcmp(m_, "PUT") == 0) {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, j);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
  } else if (strcmp(m_, "POST") == 0) {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, j);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
  } else if (strcmp(m_, "HEAD") == 0) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (strcmp(m_, "DELETE") == 0) {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
  r->tries++;
  if (curl_multi_add_handle(m, h) != CURLM_OK)
    return -1;
  j->running = 1;
  return 0;
}

static void finish(CURLM *m, job *j, CURLcode cc) {
  upload_req *r = j->r;
  long status = 0;
  curl_easy_getinfo(j->h, CURLINFO_RESPONSE_CODE, &status);
  curl_off_t cl = -1;
  curl_easy_getinfo(j->h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
  r->status = cc == CURLE_OK ? status : 0;
  r->length = cl > 0 ? (uint64_t)cl : 0;
  snprintf(r->error, sizeof r->error, "%s",
           j->errbuf[0] ? j->errbuf : curl_easy_strerror(cc));
  if (strcmp(r->method, "PUT") == 0 || strcmp(r->method, "POST") == 0)
    j->up->fig.bytes_uploaded += j->sent;
  curl_multi_remove_handle(m, j->h);
  curl_easy_cleanup(j->h);
  curl_slist_free_all(j->headers);
  j->h = NULL;
  j->headers = NULL;
  j->running = 0;
  /* A service error may pass; "not implemented" (501) is the service's
   * answer for good (s3rver's to ListMultipartUploads): retrying it cost
   * each first upload of a run 3 to 6 s of backoff. */
  int retry = (r->status == 0 || (r->status >= 500 && r->status != 501) ||
               r->status == 429 || r->status == 408) &&
              !r->sink_refused;
  if (!retry || r->tries > j->up->opts.retries) {
    j->done = 1;
    return;
  }
  j->up->fig.retries++;
  uint64_t d = 200ull << (r->tries - 1 < 6 ? r->tries - 1 : 6);
  j->due_ms = now_ms() + d / 2 + (uint64_t)rand() % (d / 2 + 1);
  PULSE_LOG_AT(PULSE_LOG_INFO, "upload: %s %s: %s%ld; try %u in %" PRIu64 " ms",
               r->method, r->key, r->status ? "HTTP " : "", r->status,
               r->tries + 1, j->due_ms - now_ms());
}

/* The handle's multi, made on first use in this process (see
 * pulse_upload.multi); NULL when it cannot be made. */
static CURLM *multi_of(pulse_upload *up) {
  long pid = (long)getpid();
  if (up->multi != NULL && up->multi_pid == pid)
    return up->multi;
  /* Made in a parent before fork: its connections are the parent's. */
  up->multi = curl_multi_init();
  up->multi_pid = pid;
  if (up->multi != NULL)
    curl_multi_setopt(up->multi, CURLMOPT_MAX_HOST_CONNECTIONS,
                      (long)up->opts.parallel);
  return up->multi;
}

pulse_status upload_run(pulse_upload *up, upload_req **reqs, size_t n) {
  if (n == 0)
    return PULSE_OK;
  CURLM *m = multi_of(up);
  job *jobs = calloc(n, sizeof *jobs);
  if (m == NULL || jobs == NULL) {
    free(jobs);
    return pulse_fail(PULSE_ERR_NOMEM, "upload");
  }
  for (size_t i = 0; i < n; i++) {
    jobs[i].up = up;
    jobs[i].r = reqs[i];
    reqs[i]->tries = 0;
  }
  pulse_status st = PULSE_OK;
  size_t done = 0;
  while (done < n && st == PULSE_OK) {
    size_t running = 0;
    uint64_t now = now_ms();
    for (size_t i = 0; i < n; i++)
      running += jobs[i].running;
    for (size_t i = 0; i < n && running < up->opts.parallel; i++) {
      job *j = &jobs[i];
      if (j->running || j->done || j->due_ms > now)
        continue;
      if (start(m, j) != 0) {
        st = pulse_fail(PULSE_ERR_NOMEM, "upload: %s %s: cannot start",
                        j->r->method, j->r->key);
        break;
      }
      running++;
    }
    int still = 0, finished = 0;
    curl_multi_perform(m, &still);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)) != NULL) {
      if (msg->msg != CURLMSG_DONE)
        continue;
      for (size_t i = 0; i < n; i++)
        if (jobs[i].h == msg->easy_handle) {
          finish(m, &jobs[i], msg->data.result);
          done += jobs[i].done;
          finished = 1;
          break;
        }
    }
    /* A request that ended frees its slot for the next at once: waiting
     * here would wait for another request's answer, or, with none left in
     * flight, the whole timeout (many small requests went at a third of
     * the speed opts.parallel allows). */
    if (done < n && !finished)
      curl_multi_poll(m, NULL, 0, running ? 50 : 20, NULL);
  }
  for (size_t i = 0; i < n; i++)
    if (jobs[i].running) {
      curl_multi_remove_handle(m, jobs[i].h);
      curl_easy_cleanup(jobs[i].h);
      curl_slist_free_all(jobs[i].headers);
    }
  for (size_t i = 0; i < n && st == PULSE_OK; i++)
    if (reqs[i]->status == 0)
      st = upload_req_fail(reqs[i], "after its retries");
  free(jobs);
  return st;
}
