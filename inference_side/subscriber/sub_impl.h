/* sub_impl.h - private to pulse_inference: the subscriber's state and the
 * functions its files share. Module map:
 *   subscriber.c   create/free, options, figures, events, the readers' lock
 *   sub_targets.c  attaching host and device targets, pulse_sub_tensor
 *   sub_index.c    the targets' class indexes: kept or not (per step), built
 *                  in the background
 *   sub_file.c     the safetensors file target (load, save; sub_file_impl.h)
 *   sub_journal.c  its in-place writer and journal
 *   sub_file_snapshot.c  its optional consistent snapshot
 *   sub_http.c     the subscriber over the fetching layer (http_fetch.c):
 *                  figures, retry events, GETs into memory
 *   sub_object.c   object downloads: resume, parallel ranges, verify, install
 *   sub_head.c     fetching and trusting heads, long-polls
 *   sub_cache.c    the cache folder as a store: head.json, pruning
 *   sub_plan.c     choosing the route to the head
 *   sub_catchup.c  what a server says of its catch-up (a signed probe)
 *   sub_apply.c    staged, transactional application of patches and anchors
 *   sub_region.c   region targets (blocks of tensors, pulse_region.h) and
 *                  the publisher's table
 *   sub_stream.c   applying a patch while it downloads
 *   sub_fp8.c      FP8 targets: quantizations of BF16 shadows kept with
 *                  every step (pulse_sub_bind_fp8)
 *   sub_partial.c  the partial route: only the sections of the tensors
 *                  the targets hold, each verified (sub_partial_impl.h)
 *   sub_sync.c     sync and follow
 *   sub_util.c     hex, SHA-256 of files, clocks */
#ifndef PULSE_SUB_IMPL_H
#define PULSE_SUB_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "http_fetch_impl.h"
#include "pulse_codec.h"
#include "pulse_codec_stream.h"
#include "pulse_cuda.h"
#include "pulse_store.h"
#include "pulse_safetensors.h"
#include "pulse_subscriber.h"
#include "store_impl.h" /* store_hex, store_sha256 */

typedef enum {
  SUB_MEM_NONE = 0,
  SUB_MEM_HOST,
  SUB_MEM_DEVICE,
  SUB_MEM_FILE,
  SUB_MEM_REGION /* blocks of tensors in host memory (sub_region.c) */
} sub_mem;

/* One target tensor. */
typedef struct {
  char *name;
  uint32_t ndim;
  uint64_t shape[PULSE_MAX_DIMS];
  uint64_t numel;
  uint16_t *data;   /* host memory (the caller's, or owned for a file) */
  uint16_t *data_d; /* device memory (the caller's) */
  pulse_tensor_digest digest; /* of the current contents, kept current */
  pulse_class_index *index;   /* host targets: class index (sub_index.c),
                                 rebuilt when its digest is not `digest` */
  /* Region targets: data holds this block of the tensor (element (r, c)
   * at data[r * stride + c]) and digest is the block's (pulse_region.h);
   * halo (owned) the tensor's bits around it that class-model patches
   * need, halo_digest theirs. */
  uint64_t row0, rows, col0, cols, stride;
  uint32_t halo_log2;
  uint16_t *halo;
  pulse_tensor_digest halo_digest;
} sub_target;

/* A cached object this process hashed, and the file it hashed: a file
 * whose identity changed since (rewritten, replaced, truncated) is hashed
 * again before it is used or mirrored. */
typedef struct {
  uint8_t sha256[32];
  uint64_t dev, ino, size;
  int64_t mtime_ns, ctime_ns;
} sub_verified;

/* Where an object is downloaded from when it is not the store's
 * v1/<path> on every URL: a catch-up (sub_catchup.c), which one server
 * builds at v1/catchup/<from>?to=<step>, pinned to the step the plan was
 * made against (a server from before ?to= ignores it: its catch-up then
 * changes when its head moves, which the ETag tells). */
typedef struct {
  size_t url;     /* the only URL asked */
  char rel[64];   /* "v1/catchup/<from>?to=<step>" */
  char etag[100]; /* the version the probe saw: ranged tries carry If-Range
                     with it, and an answer under another ETag is a newer
                     catch-up (PULSE_ERR_NOT_FOUND: plan again) */
  pulse_state_digest target; /* the patch must lead to this state */
} sub_source;

/* A route to the head (sub_plan.c). */
typedef struct {
  pulse_sub_route route;
  uint64_t from; /* the targets' step, or PULSE_SUB_NO_STEP */
  const pulse_store_object *anchor; /* ANCHOR */
  size_t first_patch;               /* index of the first head patch to apply */
  size_t patch_count;               /* patches from first_patch on */
  uint64_t bytes;                   /* still to download */
  /* CATCHUP: the catch-up as a patch object (its SHA-256 and size signed,
   * cached as objects/<sha256>.pulse like any patch) and its source */
  pulse_store_object catchup;
  sub_source catchup_src;
} sub_plan;

/* Routes a sync does not take again (they failed): bits 1 << route. */
#define SUB_BAD_MAX 16
#define SUB_AVOID(route) (1u << (unsigned)(route))

struct pulse_sub {
  pulse_sub_opts opts; /* urls, cache_dir, public_key point at copies */
  char **urls;
  size_t nurls;
  char *cache_dir;
  uint8_t key[PULSE_KEY_BYTES];
  int have_key;   /* key is the one to require (pinned or trusted) */
  int key_pinned; /* given in the options */

  /* HTTP: every request runs on this engine, which watches `stop` */
  pulse_fetch *http;
  atomic_int stop;

  /* heads */
  pulse_store_head *head;   /* newest verified head (owned) */
  uint64_t cache_head_step; /* step of cache_dir/head.json, or NO_STEP */
  char head_etag[100];      /* of the head's bytes, for If-None-Match */
  sub_verified *verified;   /* cached objects hashed by this process */
  size_t nverified, verified_cap;
  /* sources and runs (sub_head.c) */
  size_t head_url;       /* the source sub->head came from */
  uint64_t *lag_step;    /* per URL: the step reported lagging, or NO_STEP */
  double sources_asked;  /* sub_now() when every source was last asked */
  uint8_t run[PULSE_STORE_RUN_BYTES]; /* the run the worker holds, when */
  int have_run;          /* known (cache head, file metadata, head taken) */
  /* hostile sources (sub_head.c, pulse_sub_follow): heads refused since
   * the last new head taken (the follower backs off on them), what the
   * last failed long-poll's Retry-After asked, and the last head refusal
   * logged (repeats within SUB_WARN_REPEAT_S are counted, not logged) */
  unsigned head_rejects;
  /* per URL: 1 for a static copy of a store (a bucket, a CDN, a file
   * server: <url>/head.json and <url>/objects/..., GET and HEAD only), found
   * when its v1/head is not there but its head.json is; no long-polls (the
   * head is polled with If-None-Match) and no catch-ups there */
  unsigned char *url_static;
  unsigned poll_retry_after_ms;
  char warned[256];
  double warned_at;
  unsigned warned_more;
  /* Objects a source served bytes of that did not verify, twice (sha,
   * URL, and the head they were named by): not asked of that source again
   * until the head changes (sub_object.c); the oldest entry gives way. */
  struct {
    uint8_t sha256[32];
    size_t url;
    char head_etag[100];
  } bad[SUB_BAD_MAX];
  size_t nbad;

  /* targets */
  sub_mem mem;
  sub_target *targets;
  size_t ntargets, cap;
  struct sub_region_index *region_index; /* region targets' names and spans (sub_region_index.c) */
  char *file_path;
  int file_dirty; /* the file must be written whole (an anchor, a new table) */
  struct sub_file *file; /* the file target's writer (sub_file_impl.h) */
  pulse_cuda_workspace *ws;
  struct sub_fp8 *fp8; /* FP8 targets over shadows (sub_fp8.c), or NULL */
  uint64_t step;            /* PULSE_SUB_NO_STEP: unknown */
  int step_claimed;         /* step not yet checked against the publisher */
  /* A step whose weights these targets refuse (a NaN or infinity bound for
   * an FP8 target: sub_fp8.c sets `refusing` when it refuses a value while
   * the route applies `applying_step`). Routes through it are not planned
   * (sub_plan.c): the targets keep the step before it, a sync to the same
   * head ends at once with the refusal, and the follower waits for a newer
   * head (sub_sync.c). Until the targets pass it or FP8 targets are bound. */
  int have_refused, refusing;
  uint64_t refused_step, applying_step;
  uint8_t refused_run[PULSE_STORE_RUN_BYTES]; /* of the run it was refused in */
  int refused_have_run;
  pulse_status refused_status;
  char refused_detail[1024];
  pulse_state_digest state; /* of step, when have_state */
  int have_state;
  pthread_rwlock_t rw; /* readers vs commits */
  /* class indexes built in the background (sub_index.c) */
  pthread_t indexer;
  int indexer_running;  /* started and not yet joined */
  atomic_int indexer_stop;
  int index_wanted; /* the last decision keeps indexes (sub_index.c) */

  /* figures, read from any thread */
  pthread_mutex_t fig_lock;
  pulse_sub_figures fig;
  char err[512];

  /* the running sync's clocks */
  double t_transfer, t_verify, t_decode, t_apply;
  double t_write; /* making the file target durable */
  double t_decode_overlap; /* decoding that ran while downloads went on */
  double t_cb; /* spent in download callbacks (hashing, opening, feeding
                  a streamed patch): not counted as transfer */
  uint64_t sync_bytes_start;
  /* the partial route (sub_partial.c): patches to fetch whole before
   * asking again, and patches taken partially */
  unsigned partial_skip;
  uint64_t partial_fetches;
};

/* ---------------------------------------------------------- subscriber.c */

/** Sends an event (fills step and head_step). */
void sub_emit(pulse_sub *sub, pulse_sub_event *ev);
void sub_emit_simple(pulse_sub *sub, pulse_sub_event_type type, pulse_status st,
                     const char *detail);
/** Records the targets' step (state: its digest when the targets hold the
 * whole table, else NULL). Called with the writers' lock held, so that a
 * reader sees the step with the data. */
void sub_set_step(pulse_sub *sub, uint64_t step,
                  const pulse_state_digest *state);
/** The targets hold no known step any more (takes the writers' lock). */
void sub_forget_step(pulse_sub *sub);
/** Adds to a counter of the figures under their lock. */
void sub_count(pulse_sub *sub, uint64_t *field, uint64_t n);
/** Keeps the detail of a failed call in sub->err and returns st. */
pulse_status sub_keep_error(pulse_sub *sub, pulse_status st);

/* ----------------------------------------------------------- sub_file.c */

/** Loads the file target's contents (attach time). */
pulse_status sub_file_load(pulse_sub *sub);
/** Writes the file target when it lags the memory state. */
pulse_status sub_file_save(pulse_sub *sub);
/** Frees the file target's writer (a clean close: nothing left to replay). */
void sub_file_free(pulse_sub *sub);
/** A patch was committed to the file target's memory: records its changes
 * (staged or stream, whichever committed it) for the next save (sub_journal.c). */
void sub_file_note_patch(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                         const pulse_patch_staged *staged,
                         const pulse_patch_stream *stream);

/* ---------------------------------------------------------- sub_object.c */

/** Path of the cache copy of an object. */
void sub_object_path(const pulse_sub *sub, const pulse_store_object *o,
                     char *out, size_t cap);
/** PULSE_OK when an object of o->size bytes may be downloaded: no larger
 * than a file can be, nor than opts.max_object_bytes; else
 * PULSE_ERR_OVERFLOW saying so. Checked before anything is fetched or
 * reserved for it. */
pulse_status sub_object_size_check(const pulse_sub *sub,
                                   const pulse_store_object *o);
/** Bytes of the object already in the cache (whole or partial). */
uint64_t sub_object_have(const pulse_sub *sub, const pulse_store_object *o);
/** Makes sure the object is in the cache, verified: downloads what is
 * missing (resuming, in parallel ranges when large, from each URL in turn
 * when one fails or sends bytes that do not verify). */
pulse_status sub_object_fetch(pulse_sub *sub, const pulse_store_object *o);
/** The same for an object downloaded from src (a catch-up; NULL: the
 * store's). PULSE_ERR_NOT_FOUND when src's content changed (a newer
 * catch-up): its partial files are then removed. */
pulse_status sub_object_fetch_from(pulse_sub *sub, const pulse_store_object *o,
                                   const sub_source *src);
/* Takes an object's bytes while they are downloaded. */
typedef struct sub_sink {
  /* The object's size (at least 1 byte), the caller's: address space
   * reserved, whose pages take memory only as bytes arrive there. */
  uint8_t *buf;
  /* Bytes [0, prefix) of buf are the object's as received: not verified
   * yet. Called on the syncing thread, from download callbacks. */
  void (*on_prefix)(struct sub_sink *sink, uint64_t prefix);
  /* buf is filled again from the start (bytes that did not verify were
   * dropped): forget what was made of it. */
  void (*on_restart)(struct sub_sink *sink);
  /* Optional: buf holds the whole object and its SHA-256 matched the signed
   * head; called before the cache copy is made durable and named, so the
   * bytes can be used at once. */
  void (*on_verified)(struct sub_sink *sink);
} sub_sink;

/** sub_object_fetch that also assembles the object in sink->buf as it
 * arrives (bytes already on disk first, or a whole cached copy) and hashes
 * it as its contiguous prefix grows, so it is not read back to be checked.
 * On PULSE_OK buf holds the verified object and the last on_prefix call
 * had its whole size. */
pulse_status sub_object_fetch_sink(pulse_sub *sub, const pulse_store_object *o,
                                   const sub_source *src, sub_sink *sink);
/** Forgets verified objects the head no longer names. */
void sub_object_forget(pulse_sub *sub);
/** Reads a cached object into memory and checks its size and SHA-256
 * (a cache can rot). */
pulse_status sub_object_read(pulse_sub *sub, const pulse_store_object *o,
                             pulse_buffer *out);

/* ------------------------------------------------------------ sub_head.c */

/** Asks every URL for its head, verifies each, and makes the newest valid
 * one sub->head (reporting sources that lag). *moved (may be NULL) is set
 * when the head's bytes changed. */
pulse_status sub_head_fetch(pulse_sub *sub, int *moved);
/** Records the run a head names as the one the worker holds (none for a
 * format-1 head). */
void sub_head_hold_run(pulse_sub *sub, const pulse_store_head *h);
/** Whether a signed head's key is the one to trust: the pinned or
 * trusted key, or a key that a rotation record in the head names as the
 * successor of that key (docs/protocols/sync.md, "Key rotation"). PULSE_OK, or
 * PULSE_ERR_CORRUPT with the detail set. */
pulse_status sub_head_key_check(const pulse_sub *sub,
                                const pulse_store_head *h);
/** After a head passed sub_head_key_check was taken: when it rotated the
 * key, the new key is the one required from then on (kept in trusted-key
 * when it was trusted on first use). */
void sub_head_follow_key(pulse_sub *sub, const pulse_store_head *h);
/** Verifies head bytes fetched from anywhere; on success *out is the
 * parsed head. */
pulse_status sub_head_verify(pulse_sub *sub, const uint8_t *bytes, size_t n,
                             pulse_store_head **out);
/** Waits for a head above `after`: long-polls the source of sub->head and
 * asks every source again once per poll interval; *got is 1 when sub->head
 * moved. */
pulse_status sub_head_poll(pulse_sub *sub, uint64_t after, int *got);

/* ----------------------------------------------------------- sub_cache.c */

pulse_status sub_cache_open(pulse_sub *sub);
/** Writes the head into the cache (atomically) and removes what it no
 * longer names. */
pulse_status sub_cache_save_head(pulse_sub *sub);

/* ------------------------------------------------------------ sub_plan.c */

/** Chooses the cheapest route from the targets' step to the head, among
 * those not in `avoid` (SUB_AVOID bits) and not through a refused step.
 * PULSE_ERR_NOT_FOUND when none is left; the refusal's status when only
 * routes through the refused step were. */
pulse_status sub_plan_make(pulse_sub *sub, unsigned avoid, sub_plan *out);
/** Whether the step the targets refused, in this run, is in [lo, hi]. */
int sub_plan_refused(const pulse_sub *sub, uint64_t lo, uint64_t hi);

/* --------------------------------------------------------- sub_catchup.c */

/** Asks the head's URL (HEAD) for the catch-up from `from` to the head,
 * pinned to the head's step (?to=), and checks what it says: the steps
 * and state digest of the head, a strong ETag naming its SHA-256, and the
 * publisher's signature over them (unless unsigned catch-ups are
 * allowed). @return 1 with *o (a patch
 * object of the catch-up's signed SHA-256 and size) and *src filled when
 * it can be used, else 0. */
int sub_catchup_probe(pulse_sub *sub, uint64_t from, pulse_store_object *o,
                      sub_source *src);

/* ----------------------------------------------------------- sub_apply.c */

/** Applies a patch (opened, from verified bytes) to the targets: staged,
 * checked, then committed under the writers' lock. */
pulse_status sub_apply_patch(pulse_sub *sub, const pulse_patch *p);

/* Class indexes (sub_index.c). A build reads the whole model, so no
 * step waits for one that has not started: a patch decodes through the
 * indexes that are current and by a pass over the base elsewhere, and
 * after a commit the missing ones are built in the background, while the
 * receiver waits for its next step.
 * sub_targets_index, before a host-target patch p: ends a background build
 * (opts.class_index ON waits for it, at most one build's time once after a
 * start or an anchor; AUTO stops it, keeping the tensors indexed so far)
 * and decides whether the targets keep indexes from p on (the rule,
 * reported in the figures).
 * sub_index_wait: the first half of sub_targets_index, before a download
 * starts (a download callback must not wait).
 * sub_index_start, after a host commit: starts building the targets'
 * missing indexes, when the last decision kept them. sub_index_stop: stops
 * a build (before the targets' data or table change, or the subscriber
 * goes). Called on the sync's thread. */
void sub_targets_index(pulse_sub *sub, const pulse_patch *p);
void sub_index_wait(pulse_sub *sub);
void sub_index_start(pulse_sub *sub);
void sub_index_stop(pulse_sub *sub);
/** Matches the targets to a patch's table (tg: per table entry, NULL when
 * no target has it); *full: they hold the whole table. */
pulse_status sub_apply_match(pulse_sub *sub, const pulse_patch *p,
                             sub_target **tg, int *full);
/* The device stream's commit under the writers' lock: the scatter, then
 * the digests and step. A failed scatter leaves no known step. */
pulse_status sub_apply_commit_device(pulse_sub *sub, const pulse_patch *p,
                                     sub_target **tg, int full,
                                     pulse_cuda_patch_stream *cs);
/** The writers' half of a host patch: commit (staged or streamed), new
 * digests and step, under the writers' lock. Cannot fail. */
void sub_apply_commit(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                      int full, pulse_patch_staged *staged,
                      pulse_patch_stream *stream);
/** Applies a patch object while it downloads (host targets): decoded as its
 * bytes arrive, committed only once the object verified and its target
 * digests matched. src: where it comes from (NULL: the store); a patch
 * from src must also lead to src->target. */
pulse_status sub_apply_patch_streamed(pulse_sub *sub,
                                      const pulse_store_object *o,
                                      const sub_source *src);
/** Applies a verified anchor file (in the cache) to the targets. */
pulse_status sub_apply_anchor(pulse_sub *sub, const pulse_store_object *o);
/** The checks of an anchor before anything of it is copied: its metadata
 * names its step and a state digest; every tensor is BF16 and aligned;
 * the state digest of its tensors' digests is the one it names (which its
 * signed SHA-256 vouches for) and, at the head's step, the head's. Fills
 * the caller's arrays of n entries: t (the tensors, read through f's
 * mapping), info (their table), d (their digests), and *sd. Time reading
 * the table goes to *t_read, computing the digests to *t_digest. */
pulse_status sub_anchor_verify(pulse_sub *sub, const pulse_store_object *o,
                               const pulse_st_file *f, size_t n, pulse_st_tensor *t,
                               pulse_tensor_info *info, pulse_tensor_digest *d,
                               pulse_state_digest *sd, double *t_read, double *t_digest);

/* ----------------------------------------------------------- sub_region.c */

/** sub_apply_patch and sub_apply_anchor for region targets. */
pulse_status sub_region_apply_patch(pulse_sub *sub, const pulse_patch *p);
pulse_status sub_region_apply_anchor(pulse_sub *sub, const pulse_store_object *o);

/* ----------------------------------------------------- sub_region_index.c */

/** The bytes region target t's block spans: [lo, hi), empty for an empty block. */
void sub_region_block_span(const sub_target *t, uintptr_t *lo, uintptr_t *hi);
/** PULSE_ERR_ARG when `name` is attached already or bytes [lo, hi) overlap
 * an attached block; O(log n) plus a short scan. */
pulse_status sub_region_index_check(const pulse_sub *sub, const char *name, uintptr_t lo,
                                    uintptr_t hi);
/** Takes the targets appended since the last call into the index (cannot
 * fail: short of memory, the next check scans them). */
void sub_region_index_note(pulse_sub *sub);
void sub_region_index_free(struct sub_region_index *ix); /* NULL is fine */

/* -------------------------------------------------------------- sub_fp8.c */

/* The FP8 half of each step (no-ops without FP8 targets). A step stages
 * the FP8 bytes of the changes that fall in shadows after the BF16 stage
 * passed (an error, e.g. a NaN, leaves nothing staged), and commits them
 * under the writers' lock with the BF16 changes; sub_fp8_drop forgets a
 * stage that is not committed. An anchor checks every value that goes
 * into a shadow before its copy (sub_fp8_anchor_check: src, rows x cols
 * with row stride `stride`, is what target t takes), then requantizes the
 * shadows whole under the lock. */
pulse_status sub_fp8_stage_patch(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                                 const pulse_patch_staged *staged,
                                 const pulse_patch_stream *stream);
pulse_status sub_fp8_stage_regions(pulse_sub *sub, const pulse_region_staged *staged);
void sub_fp8_commit(pulse_sub *sub);
void sub_fp8_drop(pulse_sub *sub);
pulse_status sub_fp8_anchor_check(pulse_sub *sub, const sub_target *t, const uint16_t *src,
                                  uint64_t rows, uint64_t cols, uint64_t stride);
pulse_status sub_fp8_requantize(pulse_sub *sub);
void sub_fp8_free(pulse_sub *sub);
/* Device targets: the stage of every device shadow the patch changes, from
 * the finished patch stream's change lists (before its commit; an error
 * leaves nothing staged), and the commit queued after the stream's
 * scatter, under the writers' lock (a failure leaves the FP8 tensor's
 * contents unknown). */
pulse_status sub_fp8_stage_device(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                                  const pulse_cuda_patch_stream *cs);
pulse_status sub_fp8_commit_device(pulse_sub *sub);

/* ------------------------------------------------------------ sub_util.c */

int sub_unhex(const char *s, size_t len, uint8_t *out, size_t n);
/** SHA-256 and size of a file. */
pulse_status sub_sha256_file(const char *path, uint8_t out[32], uint64_t *size);
double sub_now(void);
/** mkdir -p of one level (EEXIST is fine). */
pulse_status sub_mkdir(const char *path);
/** fsync of a folder. */
void sub_fsync_dir(const char *path);

#endif /* PULSE_SUB_IMPL_H */
