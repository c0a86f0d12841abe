/* partition_round.c - a partitioned round over HTTP (docs/formats/loco-payload.md
 * "Partitioned averaging", partition_impl.h). Per attempt, three phases so
 * that nobody waits on a blob that waits on it:
 *
 *   1. publish this trainer's slice of every range; fetch the slices of
 *      the range it owns and of the ranges it checks this round
 *   2. reduce, publish its reduced range; fetch the other owners'
 *   3. check them (decode, own receipt, recomputation), publish a verdict;
 *      fetch everyone's; drop the offenders and run again, or finish
 *
 * Paths (GET, this trainer's server): /v1/loco/part/R/A/slice/OWNER,
 * /v1/loco/part/R/A/reduced, /v1/loco/part/R/A/verdict. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loco_impl.h"
#include "manifest_impl.h"
#include "partition_blob_impl.h"
#include "partition_impl.h"
#include "payload_impl.h"
#include "pulse_log.h"
#include "status_impl.h"

uint32_t loco_partition_test_stall_id;
uint64_t loco_partition_test_stall_round;
int loco_partition_test_stall_phase;

#define PART_PREFIX "/v1/loco/part/"
#define URL_CAP 200u
#define VERDICT_CAP (64u + 16u * PULSE_LOCO_PART_MAX)

/* The contributors of one attempt (C minus the offenders so far). */
typedef struct {
  size_t n;
  uint32_t ids[PULSE_LOCO_PART_MAX];
  const char *urls[PULSE_LOCO_PART_MAX];
  uint64_t samples[PULSE_LOCO_PART_MAX];
  uint64_t weights[PULSE_LOCO_PART_MAX];
  uint8_t serving[PULSE_LOCO_PART_MAX];
} roster;

/* Everything one attempt holds. */
typedef struct {
  const loco_partition_in *in;
  loco_partition_out *out;
  uint64_t round;
  uint32_t attempt;
  int self;  /* index in the roster */
  roster c;
  pulse_loco_plan plan;
  uint64_t deadline;
  pulse_buffer blobs[PULSE_LOCO_PART_MAX]; /* reduced range of each owner */
  pulse_loco_reducer *chk[PULSE_LOCO_PART_MAX];
  pulse_loco_verdict *verdicts; /* [n] */
  size_t nverdicts;
  uint32_t missing; /* verdicts that did not come (lenient_verdicts) */
} attempt_state;

/* The test hook (partition_impl.h): stop here for good, or (phase 3)
 * for a while. */
static void test_stall(const attempt_state *s, int phase) {
  if (loco_partition_test_stall_phase != phase || s->attempt != 0 ||
      s->round != loco_partition_test_stall_round ||
      s->in->ctx->opts.trainer_id != loco_partition_test_stall_id)
    return;
  if (phase == 3) {
    loco_sleep_ms(1500);
    return;
  }
  for (;;)
    loco_sleep_ms(1000);
}

static size_t slice_cap(const pulse_loco *ctx) {
  uint64_t chunks = (ctx->n >> LOCO_CHUNK_LOG2_MIN) + 1u;
  return (size_t)(LOCO_HEADER_SIZE + 32u * chunks + 16u * ctx->n + 1024u);
}

static size_t blob_cap(const pulse_loco *ctx) {
  return 64u + 28u * PULSE_LOCO_PART_MAX + slice_cap(ctx);
}

static void path_of(char *dst, size_t cap, const char *base,
                    const attempt_state *s, const char *what) {
  snprintf(dst, cap, "%s" PART_PREFIX "%llu/%u/%s", base,
           (unsigned long long)s->round, s->attempt, what);
}

/* Whether trainer j's blobs can be fetched: a serving trainer's at its
 * URL, a client's at its host, under its hosted URL (client mode with
 * upload). */
static int publishes(const attempt_state *s, uint32_t j) {
  return s->c.urls[j][0] != '\0';
}

static pulse_status publish(attempt_state *s, pulse_loco_auth_kind kind,
                            const char *what, const pulse_buffer *b) {
  char path[URL_CAP];
  path_of(path, sizeof path, "", s, what);
  loco_sig sig;
  memset(&sig, 0, sizeof sig);
  if (s->in->sign != NULL) /* auth hook */
    s->in->sign(s->in->auth_user, kind, s->round, path, b->data, b->size,
                &sig);
  if (!s->c.serving[s->self])
    return s->in->upload(s->in->upload_user, path, b->data, b->size, &sig);
  return loco_server_put_signed(s->in->srv, path, b->data, b->size, &sig);
}

/* Whether a fetched blob of `kind` is trainer id's, signed for the round
 * (always without authentication). */
static int signed_by(const attempt_state *s, pulse_loco_auth_kind kind,
                     uint32_t id, const loco_fetch *f) {
  /* Signed with its path (a client's whole payload: its bytes alone). */
  const char *path =
      kind == PULSE_LOCO_AUTH_PAYLOAD ? NULL : strstr(f->url, PART_PREFIX);
  return s->in->accept == NULL ||
         s->in->accept(s->in->auth_user, kind, s->round, id, path, &f->sig,
                       f->body.data, f->body.size);
}

/* Who recomputes range k this round (-1: nobody). */
static int checker_of(const attempt_state *s, uint32_t k) {
  if (s->in->receipts_only)
    return -1;
  return pulse_loco_plan_round_checker(&s->plan, s->round, s->attempt,
                                       s->in->check_period, k, s->c.serving);
}

/* Phase 1: slices out, the slices of the owned and checked ranges in. */
static pulse_status exchange_slices(attempt_state *s,
                                    pulse_loco_reducer *own) {
  const loco_partition_in *in = s->in;
  pulse_status st = PULSE_OK;
  uint32_t N = s->plan.count;
  for (uint32_t k = 0; k < N && st == PULSE_OK && publishes(s, (uint32_t)s->self);
       k++) {
    if (s->plan.start[k] == s->plan.start[k + 1])
      continue;
    pulse_buffer b;
    st = pulse_loco_slice_encode(in->ctx, s->plan.start[k],
                                 s->plan.start[k + 1], &b);
    char what[48];
    snprintf(what, sizeof what, "slice/%u", s->plan.ids[k]);
    if (st == PULSE_OK)
      st = publish(s, PULSE_LOCO_AUTH_SLICE, what, &b);
    /* This trainer's own part of the ranges it reduces or checks. */
    pulse_loco_reducer *r = (int)k == s->self ? own : s->chk[k];
    if (st == PULSE_OK && r)
      st = pulse_loco_reducer_add(r, b.data, b.size);
    pulse_buffer_free(&b);
  }
  if (st != PULSE_OK)
    return st;
  test_stall(s, 1);
  /* Client mode: its own part from its whole payload. */
  for (uint32_t k = 0; k < N && !publishes(s, (uint32_t)s->self); k++)
    if (s->chk[k])
      PULSE_TRY(pulse_loco_reducer_add(s->chk[k], in->ctx->payload.data,
                                       in->ctx->payload.size));
  /* Targets: (range, sender) for every range reduced or checked here. */
  size_t cap = (size_t)N * N, t = 0;
  loco_fetch *f = calloc(cap ? cap : 1, sizeof *f);
  char(*urls)[URL_CAP] = calloc(cap ? cap : 1, sizeof *urls);
  pulse_loco_reducer **into = calloc(cap ? cap : 1, sizeof *into);
  uint32_t *from = calloc(cap ? cap : 1, sizeof *from);
  if (!f || !urls || !into || !from) {
    free(f), free(urls), free(into), free(from);
    return pulse_fail(PULSE_ERR_NOMEM, "loco partition: fetch list");
  }
  for (uint32_t k = 0; k < N; k++) {
    pulse_loco_reducer *r = (int)k == s->self ? own : s->chk[k];
    if (r == NULL)
      continue;
    for (uint32_t j = 0; j < N; j++) {
      if ((int)j == s->self)
        continue;
      char what[48];
      snprintf(what, sizeof what, "slice/%u", s->plan.ids[k]);
      /* A client's slice at its host (under its hosted URL), or, a
       * client without one, its whole payload at the relay. */
      if (publishes(s, j))
        path_of(urls[t], URL_CAP, s->c.urls[j], s, what);
      else
        snprintf(urls[t], URL_CAP, "%s/v1/loco/round/%llu/from/%u",
                 in->relay_url ? in->relay_url : "", (unsigned long long)s->round,
                 s->plan.ids[j]);
      f[t].url = urls[t];
      f[t].max_bytes = slice_cap(in->ctx);
      from[t] = j;
      into[t++] = r;
    }
  }
  if (t > 0)
    st = loco_http_gather(f, t, s->deadline);
  for (size_t i = 0; i < t; i++) {
    if (!f[i].done) {
      if (st == PULSE_OK)
        st = pulse_fail(PULSE_ERR_IO, "loco partition: round %llu: no slice "
                                      "from %s in time",
                        (unsigned long long)s->round, f[i].url);
      continue;
    }
    s->out->bytes_in += f[i].body.size;
    if (into[i] == own)
      s->out->slice_bytes_in += f[i].body.size;
    else
      s->out->check_bytes_in += f[i].body.size;
    /* Its sender's (auth hook): a slice it published, or its whole
     * payload at the relay. Refused: as one that never came. */
    uint32_t j = from[i];
    if (st == PULSE_OK &&
        !signed_by(s, publishes(s, j) ? PULSE_LOCO_AUTH_SLICE
                                      : PULSE_LOCO_AUTH_PAYLOAD,
                   s->plan.ids[j], &f[i]))
      st = pulse_fail(PULSE_ERR_IO,
                      "loco partition: round %llu: the slice from %s is "
                      "refused",
                      (unsigned long long)s->round, f[i].url);
    if (st == PULSE_OK)
      st = pulse_loco_reducer_add(into[i], f[i].body.data, f[i].body.size);
  }
  for (size_t i = 0; i < t; i++)
    pulse_bytebuf_free(&f[i].body);
  free(f), free(urls), free(into), free(from);
  return st;
}

/* An owner's wrong reduction (tests): one average changed, receipts kept. */
static pulse_status falsify(attempt_state *s, uint32_t k, pulse_buffer *blob) {
  pulse_loco_reduced d = PULSE_LOCO_REDUCED_INIT;
  PULSE_TRY(pulse_loco_reduced_decode(s->in->ctx, &s->plan, k, NULL,
                                      blob->data, blob->size, &d));
  loco_reduced_head h = {d.owner, d.members, d.ncontrib, d.round,
                         d.param_count, d.base_digest, d.start, d.end, 0};
  for (uint32_t i = 0; i < d.ncontrib; i++)
    h.weight += d.contrib[i].samples;
  if (d.avg.count > 0)
    d.avg.val[0] = d.avg.val[0] * 2.0f + 1e-3f;
  pulse_buffer wrong = {NULL, 0};
  pulse_status st = loco_reduced_encode(s->in->ctx, &h, d.contrib, d.avg.pos,
                                        d.avg.val, d.avg.count, &wrong);
  pulse_loco_reduced_free(&d);
  if (st == PULSE_OK) {
    pulse_buffer_free(blob);
    *blob = wrong;
  }
  return st;
}

/* Phase 2: this trainer's reduced range out, the other owners' in. */
static pulse_status exchange_blobs(attempt_state *s, pulse_loco_reducer *own) {
  const loco_partition_in *in = s->in;
  uint32_t N = s->plan.count;
  if (own) {
    PULSE_TRY(pulse_loco_reducer_finish(own, &s->blobs[s->self]));
    if (in->test_wrong_reduction)
      PULSE_TRY(falsify(s, (uint32_t)s->self, &s->blobs[s->self]));
    PULSE_TRY(publish(s, PULSE_LOCO_AUTH_REDUCED, "reduced",
                      &s->blobs[s->self]));
    test_stall(s, 2);
  }
  test_stall(s, 3);
  loco_fetch *f = calloc(N, sizeof *f);
  char(*urls)[URL_CAP] = calloc(N, sizeof *urls);
  uint32_t *idx = calloc(N, sizeof *idx);
  size_t t = 0;
  pulse_status st = PULSE_OK;
  if (!f || !urls || !idx)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco partition: fetch list");
  for (uint32_t k = 0; k < N && st == PULSE_OK; k++) {
    if (s->plan.start[k] == s->plan.start[k + 1]) {
      st = loco_reduced_empty(in->ctx, &s->plan, k, s->c.samples,
                              &s->blobs[k]);
      continue;
    }
    if ((int)k == s->self)
      continue;
    path_of(urls[t], URL_CAP, s->c.urls[k], s, "reduced");
    f[t].url = urls[t];
    f[t].max_bytes = blob_cap(in->ctx);
    idx[t++] = k;
  }
  if (st == PULSE_OK && t > 0)
    st = loco_http_gather(f, t, s->deadline);
  for (size_t i = 0; i < t; i++) {
    /* Its owner's (auth hook); refused: as one that never came. */
    if (f[i].done &&
        !signed_by(s, PULSE_LOCO_AUTH_REDUCED, s->plan.ids[idx[i]], &f[i])) {
      s->out->bytes_in += f[i].body.size;
      if (st == PULSE_OK)
        st = pulse_fail(PULSE_ERR_IO,
                        "loco partition: round %llu: the reduced range of "
                        "owner %u is refused",
                        (unsigned long long)s->round, s->plan.ids[idx[i]]);
    } else if (f[i].done) {
      s->out->bytes_in += f[i].body.size;
      s->out->reduced_bytes_in += f[i].body.size;
      s->blobs[idx[i]] = (pulse_buffer){f[i].body.data, f[i].body.size};
      f[i].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
    } else if (st == PULSE_OK) {
      st = pulse_fail(PULSE_ERR_IO,
                      "loco partition: round %llu: no reduced range from "
                      "owner %u in time",
                      (unsigned long long)s->round, s->plan.ids[idx[i]]);
    }
    pulse_bytebuf_free(&f[i].body);
  }
  free(f), free(urls), free(idx);
  return st;
}

static uint64_t blob_digest(const pulse_buffer *b) {
  uint8_t sha[32];
  loco_sha256(b->data, b->size, sha);
  return pulse_load_le64(sha);
}

/* Phase 3a: what this trainer saw of every range. */
static pulse_status judge(attempt_state *s, pulse_loco_verdict *v) {
  const loco_partition_in *in = s->in;
  uint32_t N = s->plan.count;
  memset(v, 0, sizeof *v);
  v->peer = s->c.ids[s->self];
  v->round = s->round;
  v->attempt = s->attempt;
  v->count = N;
  for (uint32_t k = 0; k < N; k++) {
    pulse_loco_verdict_item *it = &v->items[k];
    it->owner = s->plan.ids[k];
    it->blob_digest = blob_digest(&s->blobs[k]);
    pulse_loco_reduced d = PULSE_LOCO_REDUCED_INIT;
    pulse_status st =
        pulse_loco_reduced_decode(in->ctx, &s->plan, k, s->c.samples,
                                  s->blobs[k].data, s->blobs[k].size, &d);
    if (st == PULSE_ERR_NOMEM)
      return st;
    if (st != PULSE_OK) {
      it->flags |= PULSE_LOCO_VERDICT_BAD_BLOB;
    } else if (d.contrib[s->self].receipt !=
               pulse_loco_own_receipt(in->ctx, s->plan.start[k],
                                      s->plan.start[k + 1])) {
      it->flags |= PULSE_LOCO_VERDICT_BAD_RECEIPT;
    }
    pulse_loco_reduced_free(&d);
    if (s->chk[k]) {
      pulse_buffer mine;
      PULSE_TRY(pulse_loco_reducer_finish(s->chk[k], &mine));
      it->flags |= PULSE_LOCO_VERDICT_CHECKED;
      if (mine.size != s->blobs[k].size ||
          memcmp(mine.data, s->blobs[k].data, mine.size) != 0)
        it->flags |= PULSE_LOCO_VERDICT_MISMATCH;
      pulse_buffer_free(&mine);
    }
  }
  return PULSE_OK;
}

/* Phase 3b: this trainer's verdict out, every serving trainer's in. */
static pulse_status exchange_verdicts(attempt_state *s) {
  uint32_t N = s->plan.count;
  s->nverdicts = 0;
  s->missing = 0;
  pulse_loco_verdict *own = &s->verdicts[s->nverdicts];
  PULSE_TRY(judge(s, own));
  if (publishes(s, (uint32_t)s->self)) {
    pulse_buffer b;
    PULSE_TRY(pulse_loco_verdict_encode(own, &b));
    pulse_status st = publish(s, PULSE_LOCO_AUTH_VERDICT, "verdict", &b);
    pulse_buffer_free(&b);
    PULSE_TRY(st);
    s->nverdicts++;
  }
  loco_fetch *f = calloc(N, sizeof *f);
  char(*urls)[URL_CAP] = calloc(N, sizeof *urls);
  uint32_t *who = calloc(N ? N : 1, sizeof *who);
  if (!f || !urls || !who) {
    free(f), free(urls), free(who);
    return pulse_fail(PULSE_ERR_NOMEM, "loco partition: fetch list");
  }
  size_t t = 0;
  for (uint32_t j = 0; j < N; j++) {
    if ((int)j == s->self || !publishes(s, j))
      continue;
    path_of(urls[t], URL_CAP, s->c.urls[j], s, "verdict");
    f[t].url = urls[t];
    f[t].max_bytes = VERDICT_CAP;
    who[t] = j;
    t++;
  }
  pulse_status st = t ? loco_http_gather(f, t, s->deadline) : PULSE_OK;
  for (size_t i = 0; i < t; i++) {
    /* Its peer's (auth hook); refused: as one that never came. */
    if (f[i].done &&
        !signed_by(s, PULSE_LOCO_AUTH_VERDICT, s->plan.ids[who[i]], &f[i])) {
      s->out->bytes_in += f[i].body.size;
      f[i].done = 0;
    }
    if (!f[i].done) {
      if (s->in->lenient_verdicts) {
        s->missing++;
        PULSE_LOG_AT(PULSE_LOG_WARN,
                     "loco partition round %llu: no verdict from %s, "
                     "finishing without it",
                     (unsigned long long)s->round, f[i].url);
      } else if (st == PULSE_OK) {
        st = pulse_fail(PULSE_ERR_IO, "loco partition: no verdict from %s",
                        f[i].url);
      }
    } else {
      s->out->bytes_in += f[i].body.size;
      s->out->verdict_bytes_in += f[i].body.size;
      if (st == PULSE_OK)
        st = pulse_loco_verdict_decode(f[i].body.data, f[i].body.size,
                                       &s->verdicts[s->nverdicts++]);
    }
    pulse_bytebuf_free(&f[i].body);
  }
  free(f), free(urls), free(who);
  return st;
}

static pulse_status run_attempt(attempt_state *s, uint32_t *offenders,
                                size_t *noff, int *finished) {
  const loco_partition_in *in = s->in;
  uint32_t N = (uint32_t)s->c.n;
  uint64_t w[PULSE_LOCO_PART_MAX];
  for (uint32_t j = 0; j < N; j++)
    w[j] = s->c.serving[j] ? s->c.weights[j] : 0; /* client mode: no range */
  /* Cut in the momentum's active entries (bytes), not parameters: every
   * trainer holds the same theta_g and b. */
  PULSE_TRY(pulse_loco_plan_make_active(in->ctx, s->c.ids, w, N, &s->plan));
  s->out->range_start = s->plan.start[s->self];
  s->out->range_end = s->plan.start[s->self + 1];
  pulse_loco_reducer *own = NULL;
  pulse_status st = PULSE_OK;
  uint32_t k_self = (uint32_t)s->self;
  if (s->plan.start[k_self] != s->plan.start[k_self + 1])
    st = pulse_loco_reducer_create(in->ctx, &s->plan, k_self, s->c.samples,
                                   &own);
  for (uint32_t k = 0; k < N && st == PULSE_OK; k++)
    if (checker_of(s, k) == s->self)
      st = pulse_loco_reducer_create(in->ctx, &s->plan, k, s->c.samples,
                                     &s->chk[k]);
  if (st == PULSE_OK)
    st = exchange_slices(s, own);
  if (st == PULSE_OK)
    st = exchange_blobs(s, own);
  if (st == PULSE_OK)
    st = exchange_verdicts(s);
  if (st == PULSE_OK)
    st = pulse_loco_verdicts_offenders(&s->plan, s->round, s->attempt,
                                       s->verdicts, s->nverdicts, offenders,
                                       noff);
  /* Offenders while a verdict is missing: the trainers that got it may
   * see others; no finish and no new attempt that they would not share. */
  if (st == PULSE_OK && *noff > 0 && s->missing > 0)
    st = pulse_fail(PULSE_ERR_IO,
                    "loco partition: round %llu: offenders while %u "
                    "verdicts are missing",
                    (unsigned long long)s->round, s->missing);
  if (st == PULSE_OK && *noff == 0)
    s->out->verdicts_missing = s->missing;
  if (st == PULSE_OK && *noff == 0) {
    pulse_loco_contribution set[PULSE_LOCO_PART_MAX];
    for (uint32_t k = 0; k < N; k++)
      set[k] = (pulse_loco_contribution){s->blobs[k].data, s->blobs[k].size};
    pulse_loco_finish_figures info;
    st = pulse_loco_finish_reduced(in->ctx, &s->plan, set, s->c.samples,
                                   in->theta_r, &info, NULL);
    if (st == PULSE_OK) {
      *finished = 1;
      s->out->contributors = info.contributors;
      s->out->self_included = info.self_included;
    }
  }
  pulse_loco_reducer_free(own);
  for (uint32_t k = 0; k < N; k++) {
    pulse_loco_reducer_free(s->chk[k]);
    s->chk[k] = NULL;
    pulse_buffer_free(&s->blobs[k]);
  }
  return st;
}

pulse_status loco_partition_round(const loco_partition_in *in,
                                  loco_partition_out *out) {
  if (in == NULL || out == NULL || in->ctx == NULL || in->ids == NULL ||
      in->urls == NULL || in->samples == NULL || in->count == 0 ||
      in->count > PULSE_LOCO_PART_MAX || !in->ctx->prepared)
    return pulse_fail(PULSE_ERR_ARG, "loco partition: bad arguments");
  memset(out, 0, sizeof *out);
  out->own_payload = in->ctx->payload.size;
  attempt_state *s = calloc(1, sizeof *s);
  pulse_loco_verdict *verdicts = calloc(in->count, sizeof *verdicts);
  if (s == NULL || verdicts == NULL) {
    free(s), free(verdicts);
    return pulse_fail(PULSE_ERR_NOMEM, "loco partition: round state");
  }
  s->in = in, s->out = out;
  s->round = in->ctx->round;
  s->deadline = loco_now_ms() + in->timeout_ms;
  s->verdicts = verdicts;
  uint64_t served0 = in->srv ? loco_server_bytes_served(in->srv) : 0;
  if (in->srv && s->round >= 2)
    loco_server_drop(in->srv, PART_PREFIX, s->round - 1);
  uint32_t max_attempts = in->max_attempts ? in->max_attempts : 2u;
  uint8_t dropped[PULSE_LOCO_PART_MAX];
  memset(dropped, 0, sizeof dropped);
  pulse_status st = PULSE_OK;
  int finished = 0;
  for (uint32_t a = 0; a < max_attempts && !finished && st == PULSE_OK; a++) {
    s->attempt = a;
    s->self = -1;
    s->c.n = 0;
    for (size_t j = 0; j < in->count; j++) {
      if (dropped[j])
        continue;
      size_t i = s->c.n++;
      s->c.ids[i] = in->ids[j];
      s->c.urls[i] = in->urls[j] ? in->urls[j] : "";
      /* Client mode (no URL, or a hosted one): no range, checks none. */
      s->c.serving[i] = s->c.urls[i][0] != '\0' &&
                        !loco_url_hosted(s->c.urls[i], NULL, 0, NULL);
      s->c.samples[i] = in->samples[j];
      s->c.weights[i] = in->weights ? in->weights[j] : 1u;
      if (in->ids[j] == in->ctx->opts.trainer_id)
        s->self = (int)i;
    }
    if (s->self < 0 || (s->c.serving[s->self] && in->srv == NULL) ||
        (!s->c.serving[s->self] && publishes(s, (uint32_t)s->self) &&
         in->upload == NULL)) {
      st = pulse_fail(s->self < 0 ? PULSE_ERR_CORRUPT : PULSE_ERR_ARG,
                      "loco partition: trainer %u %s round %llu",
                      in->ctx->opts.trainer_id,
                      s->self < 0 ? "was dropped as an offender of"
                                  : "has no server (or upload) to publish in",
                      (unsigned long long)s->round);
      break;
    }
    out->attempts = a + 1;
    uint32_t off[PULSE_LOCO_PART_MAX];
    size_t noff = 0;
    st = run_attempt(s, off, &noff, &finished);
    for (size_t i = 0; i < noff; i++) {
      if (out->noffenders < LOCO_PARTITION_MAX_OFFENDERS)
        out->offenders[out->noffenders++] = off[i];
      for (size_t j = 0; j < in->count; j++)
        dropped[j] |= in->ids[j] == off[i];
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco partition round %llu: owner %u returned a wrong "
                   "reduction, dropped from the round",
                   (unsigned long long)s->round, off[i]);
    }
  }
  if (st == PULSE_OK && !finished)
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco partition: round %llu still has offenders after "
                    "%u attempts",
                    (unsigned long long)s->round, max_attempts);
  if (in->srv)
    out->bytes_out = loco_server_bytes_served(in->srv) - served0;
  free(s), free(verdicts);
  return st;
}
