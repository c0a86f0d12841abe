/* pulse_subscriber.h - the inference side of pulse: follow a publisher over
 * HTTP(S) (docs/protocols/sync.md) and keep BF16 target tensors equal, bit
 * for bit, to the trainer's newest published step.
 *
 *   static const char *urls[] = {"https://trainer.example:8080"};
 *   pulse_sub_opts o; pulse_sub_opts_init(&o);
 *   o.urls = urls; o.url_count = 1;
 *   o.cache_dir = "/var/cache/pulse"; o.public_key = pinned_key;  // 32 bytes
 *   pulse_sub *sub;
 *   pulse_sub_create(&o, &sub);
 *   pulse_sub_attach_host(sub, "layer.0.weight", 2, shape, weights_bf16);
 *   ...                                            // or pulse_sub_attach_file
 *   pulse_sub_sync(sub);                           // up to the newest step
 *   pulse_sub_follow(sub);                         // until pulse_sub_stop
 *   pulse_sub_free(sub);
 *
 * What a sync does: fetch the head and check its Ed25519 signature against
 * the pinned key; choose the route to the head that downloads the fewest
 * bytes (the retained patch chain from the targets' step, one squashed
 * catch-up patch, or the newest anchor plus the patches after it); download
 * what it needs into the cache folder, resuming partial downloads with Range
 * requests (also after a restart; a catch-up too: its signed SHA-256 names
 * it in the cache, and If-Range keeps a newer one from continuing it) and
 * retrying network errors and 5xx answers with exponential backoff and
 * jitter (a try that moved forward does not count); a route that still
 * fails gives way to the next (catch-up, then the chain, then an anchor),
 * and an object collected while the head moved on makes the sync plan
 * again against the newer head; check every object's SHA-256
 * and size against the signed head before reading it; then apply each step
 * transactionally: every patch is decoded and checked against the base and
 * target digests before the first target element is written, and an anchor
 * is checked against its state digest before anything is copied. Patches
 * are decoded while they download (each chunk as soon as its bytes are
 * there, on opts.threads threads, into staging only; for device targets the
 * device then places and checks the changes) and committed once the whole
 * object matched its signed SHA-256 and the staged changes the target
 * digests; opts.no_streaming turns this off. Host and file targets may
 * keep a class index of their weights (opts.class_index: by default only
 * where it fits opts.memory_budget_bytes). A patch
 * whose base does not match the targets is never applied: the sync then takes
 * the anchor route. Whatever fails, the targets either hold exactly the
 * trainer's weights of a step or keep their previous step, and the status and
 * pulse_sub_error() say why.
 *
 * The cache folder is laid out as a store (docs/protocols/sync.md): objects/<sha256>.*
 * as downloaded and verified, head.json as fetched with its signature intact,
 * so a pulse server can re-serve it (a relay; see opts.mirror). Partial
 * downloads live in objects/.<sha256>.part* and survive restarts. Also kept
 * there: trusted-key (the publisher key trusted on first use, with
 * opts.trust_first_use, when no key is pinned; a key rotation moves it).
 *
 * Readers: a reader that holds pulse_sub_read_lock sees one whole step; the
 * subscriber writes target memory only while no reader holds it.
 *
 * Thread-safety: create, attach, sync, follow and free are called from one
 * thread at a time (the syncing thread). pulse_sub_stop, pulse_sub_step,
 * pulse_sub_figures_get, pulse_sub_read_lock/unlock and pulse_sub_tensor may be
 * called from any thread at any time. Nothing here prints to stdout; errors
 * are pulse_status codes with the detail in pulse_error_detail() (on the
 * calling thread) and pulse_sub_error() (on the handle). */
#ifndef PULSE_SUBSCRIBER_H
#define PULSE_SUBSCRIBER_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_fp8.h"
#include "pulse_region.h"
#include "pulse_sign.h" /* PULSE_KEY_BYTES */
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How far in the future a head's publication time may lie (the clocks of
 * trainer and worker differ) when a maximum age is set (max_head_age_s). */
#define PULSE_SUB_CLOCK_SKEW_S 60u

/* A step that is not known (no state yet, or a state that failed a check). */
#define PULSE_SUB_NO_STEP UINT64_MAX

/* How a sync reached the head. */
typedef enum {
  PULSE_SUB_ROUTE_NONE = 0,    /* already at the head */
  PULSE_SUB_ROUTE_CHAIN = 1,   /* retained patches, one after the other */
  PULSE_SUB_ROUTE_CATCHUP = 2, /* one squashed patch from the server */
  PULSE_SUB_ROUTE_ANCHOR = 3   /* the newest suitable anchor, then patches */
} pulse_sub_route;

/** "none", "chain", "catchup", "anchor". */
const char *pulse_sub_route_name(pulse_sub_route route);

/* What happens during a sync, for progress bars and logs. */
typedef enum {
  PULSE_SUB_EV_HEAD = 1,  /* a head was verified: head_step */
  PULSE_SUB_EV_PLAN,      /* route chosen: route, from_step -> head_step, bytes
                             still to download */
  PULSE_SUB_EV_DOWNLOAD,  /* an object download starts: object, total,
                             resumed (bytes already on disk) */
  PULSE_SUB_EV_PROGRESS,  /* object, bytes held so far of total (a few per
                             second at most) */
  PULSE_SUB_EV_OBJECT,    /* an object was verified: object, total */
  PULSE_SUB_EV_RETRY,     /* a request failed and is retried after delay_ms:
                             attempt, status, detail */
  PULSE_SUB_EV_REJECTED,  /* a head, object or base failed a check: status,
                             detail (nothing was applied from it) */
  PULSE_SUB_EV_APPLIED,   /* the targets moved to step */
  PULSE_SUB_EV_SYNCED,    /* a sync ended at the head: step */
  PULSE_SUB_EV_ERROR,     /* a sync failed: status, detail; step is what the
                             targets still hold */
  PULSE_SUB_EV_WARNING,   /* detail (trust on first use, a stale head, ...) */
  PULSE_SUB_EV_HEAD_SAVED, /* the cache's head.json moved to head_step (a
                             server over the cache may wake its long-polls) */
  PULSE_SUB_EV_LAGGING    /* a source serves an older head than the newest:
                             object (its URL), from_step (its head's step),
                             detail; sent when that step changes, not on
                             every check */
} pulse_sub_event_type;

/* One event. Pointers are valid during the callback only. */
typedef struct {
  pulse_sub_event_type type;
  uint64_t step;      /* the targets' step now (PULSE_SUB_NO_STEP: none) */
  uint64_t head_step; /* the newest verified head (PULSE_SUB_NO_STEP: none) */
  uint64_t from_step; /* PLAN: where the route starts */
  pulse_sub_route route;
  const char *object; /* "objects/<sha>.pulse", "catchup/<from>", ... */
  uint64_t bytes;     /* PLAN: to download; PROGRESS: held of total */
  uint64_t total;     /* object size */
  uint64_t resumed;   /* DOWNLOAD: bytes found on disk, not downloaded again */
  unsigned attempt;   /* RETRY */
  unsigned delay_ms;  /* RETRY */
  pulse_status status;
  const char *detail;
} pulse_sub_event;

/* Called on the syncing thread. Must not call the subscriber, except
 * pulse_sub_step, pulse_sub_figures_get and pulse_sub_stop. */
typedef void (*pulse_sub_event_fn)(void *ctx, const pulse_sub_event *event);

/* Whether host and file targets keep a class index of their weights
 * (pulse_class_index: 2.13 bytes per element, more than the weights' own
 * 2). Through it a class-model patch (the publisher's default) decodes
 * without a pass over the weights; without it each changed chunk's base
 * is read once. Either way the result is the same, bit for bit. */
typedef enum {
  /* Decided per step (the synced event's detail and
   * pulse_sub_figures.class_index_why say what and why): kept only when it
   * fits opts.memory_budget_bytes (by default a tenth of the targets'
   * bytes: so by default never) and the patches are sparse enough for its
   * build to pay back (at most 5% of the weights changed); built in the
   * background between steps, and a step never waits for a build. */
  PULSE_SUB_CLASS_INDEX_AUTO = 0,
  PULSE_SUB_CLASS_INDEX_OFF = 1, /* never */
  /* Always, whatever it costs: a step that arrives while the index is
   * being built waits for the build. */
  PULSE_SUB_CLASS_INDEX_ON = 2
} pulse_sub_class_index;

/* Subscriber options; start from pulse_sub_opts_init. Strings and arrays are
 * copied by pulse_sub_create. */
typedef struct {
  uint32_t struct_version; /* PULSE_SUB_OPTS_VERSION */
  /* Base URLs of pulse servers ("http://host:port" or "https://..."; a path
   * prefix is kept). Every one is asked for its head, and the newest valid
   * head is followed (a source serving an older one is reported with a
   * PULSE_SUB_EV_LAGGING event); objects are tried in this order. */
  const char *const *urls;
  size_t url_count;
  const char *cache_dir; /* required; created when missing */
  /* The publisher's Ed25519 public key (32 bytes), pinned. NULL is refused
   * by pulse_sub_create unless trust_first_use (version 6) or
   * allow_unsigned says otherwise. A head that rotates the key
   * (docs/protocols/sync.md, "Key rotation") moves the key required from then on. */
  const uint8_t *public_key;
  int allow_unsigned;            /* accept unsigned heads (no authenticity) */
  int allow_unsigned_catchup;    /* use catch-ups a server did not sign
                                    (protected by digests only) */
  uint32_t connect_timeout_ms;   /* default 10000 */
  uint32_t request_timeout_ms;   /* heads and catch-up probes; default 30000 */
  uint32_t low_speed_bytes;      /* a transfer slower than this many bytes/s
                                    (at most half max_recv_bytes_per_s) */
  uint32_t low_speed_seconds;    /* for this long fails (and is retried) */
  unsigned retries;              /* after the first attempt; default 6 */
  uint32_t backoff_ms;           /* first retry delay, doubled each time,
                                    with jitter; default 200 */
  uint32_t backoff_max_ms;       /* default 5000 */
  unsigned parallel;             /* range requests at once for one large
                                    object; default 4 */
  uint64_t parallel_min_bytes;   /* objects at least this large are split;
                                    default 32 MiB */
  uint64_t max_recv_bytes_per_s; /* per request, kept evenly (never seen
                                    as a stall); 0: no limit */
  int use_catchup;               /* consider /v1/catchup; default 1 */
  /* Download every object the head names, not only what the targets need,
   * so that a pulse server over cache_dir serves the whole store (a relay).
   * Cached objects whose file changed since they were hashed are hashed
   * again at each sync and, when following, at each long-poll's end, and
   * fetched again when they went bad. */
  int mirror;
  int threads;              /* decode and digest threads; 0: per core */
  uint32_t poll_timeout_ms; /* long-poll length for follow; default 30000 */
  void *cuda_stream;        /* stream for device targets (NULL: pulse's own
                               stream of their device, see pulse_cuda.h) */
  pulse_sub_event_fn on_event;
  void *on_event_ctx;
  /* 0 (default): a patch is decoded while it downloads, on `threads`
   * threads, each chunk as soon as its bytes are there (for device targets
   * the host decodes the chunk streams and the device then places, checks
   * and writes), and committed once the whole object verified; 1: each
   * patch is downloaded whole first. */
  int no_streaming;
  /* Version 8 (an int no_class_index before, whose 1 is OFF's value):
   * whether host and file targets keep a class index (see the type;
   * default PULSE_SUB_CLASS_INDEX_AUTO). It is built in the background
   * after the first class-model patch (which decodes by the pass) and after
   * an anchor, on half the threads, while the receiver waits for its next
   * step. */
  pulse_sub_class_index class_index;
  /* Version 3: what a head must be besides signed (docs/protocols/sync.md, "What a
   * subscriber refuses"). Options of versions 1 and 2 get the defaults. */
  /* 0 (default): a head older than the newest step the worker knows (the
   * cache's head, the head it follows, the step its targets hold, e.g. a
   * file target's metadata) is refused; 1: it is taken, and the targets
   * go back to its step (from its anchor). */
  int allow_rollback;
  /* 0 (default): a head of another run than the one the worker knows (from
   * the cache's head, the head it follows or a file target's metadata), or
   * of no run (format 1), is refused; 1: it is taken, from its anchor. */
  int switch_run;
  /* Refuse heads published more than this many seconds ago, heads that
   * do not say when (format 1), and heads dated more than
   * PULSE_SUB_CLOCK_SKEW_S in the future (a head from the future would
   * pass any age); 0 (default): no limit. */
  uint32_t max_head_age_s;
  /* Version 4: each object's download from one URL has a deadline of
   * download_grace_ms plus its size at min_bytes_per_s (defaults 30000 ms
   * and 262144 B/s: 38 s for 2 MB, 15 h for 14 GB; the rate is at most
   * half max_recv_bytes_per_s when that is set). Past it, a URL that
   * delivered at least an eighth of that rate goes on, its deadline moved
   * to when the rest arrives at the rate measured plus the grace (at most
   * the size at an eighth of the rate plus the grace): a slow link is not
   * a dripping source. Else the next URL is tried (the bytes held are kept
   * and resumed), then the sync fails saying so. A slow drip that the
   * low-speed limit lets through cannot hold a worker for ever.
   * min_bytes_per_s 0: no deadline. */
  uint32_t min_bytes_per_s;
  uint32_t download_grace_ms;
  /* Version 5: PEM file of the CAs that https:// sources' certificates
   * must chain to (a private CA); NULL: the system's. Certificates are
   * always verified, names included. Copied. */
  const char *cacert;
  /* Version 6: with no public_key, 1 trusts the key of the first head
   * taken (trust on first use: kept in cache_dir/trusted-key and required
   * from then on; a PULSE_SUB_EV_WARNING says so). 0 (default, and for
   * options of versions 1 to 5): a subscriber without public_key is
   * refused, unless allow_unsigned. Trust on first use is never implied. */
  int trust_first_use;
  /* Version 7: redirects are followed within the origin (scheme, host,
   * port) of the source asked only; a redirect to another origin, or from
   * https to http, fails with an error naming its target (mirrors are
   * named in urls, not reached by redirect), unless its origin is listed
   * here: "HOST[:PORT]" (https, or http when the source is http; no PORT:
   * the scheme's default) or "SCHEME://HOST[:PORT]" (that scheme only, the
   * way to allow a downgrade). NULL/0 (default): none. Copied. */
  const char *const *redirect_origins;
  size_t redirect_origin_count;
  /* Version 7: the largest object a head may name that is downloaded;
   * a larger one is refused before any byte of it is fetched or any memory
   * reserved for it (a head is signed, but a signing key can leak or be
   * misused). Default 2^40 (1 TiB); at most 2^63 - 1. */
  uint64_t max_object_bytes;
  /* Version 8: memory the subscriber may keep, beside its targets and the
   * step it applies (whose staging is the size of the patch), for what
   * only makes it faster: the class index (class_index AUTO). 0 (default):
   * a tenth of the targets' bytes, so that a worker's peak resident memory
   * stays within its targets' bytes + 10% + the patch; UINT64_MAX: no
   * limit. */
  uint64_t memory_budget_bytes;
} pulse_sub_opts;

#define PULSE_SUB_OPTS_VERSION 8u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_sub_opts_init(pulse_sub_opts *opts);

typedef struct pulse_sub pulse_sub;

/** Creates a subscriber. Nothing is fetched yet. Reads cache_dir/head.json
 * (the newest head seen: the subscriber never goes back to an older one, nor
 * to another run, unless opts allow it) and, with trust_first_use,
 * cache_dir/trusted-key when present.
 * @return PULSE_OK and *out (free with pulse_sub_free); PULSE_ERR_ARG (no
 * URL, a URL that is not http(s), no cache_dir, bad options, unsigned heads
 * allowed together with a pinned key or trust on first use, no public key
 * without trust_first_use or allow_unsigned); PULSE_ERR_IO (cache_dir cannot be
 * made); PULSE_ERR_NOMEM. */
pulse_status pulse_sub_create(const pulse_sub_opts *opts, pulse_sub **out);

/** Stops and frees a subscriber; target memory attached by the caller is
 * left as it is. NULL is fine. */
void pulse_sub_free(pulse_sub *sub);

/** Attaches a BF16 tensor in host memory: `data` holds numel(shape) elements
 * that the subscriber keeps equal to the trainer's tensor `name` (names are
 * matched with the publisher's table; its shape must be this one). The
 * memory is borrowed until pulse_sub_free and must not be written by anyone
 * else; it is read once here (its digest). Targets may be a subset of the
 * table (a shard). Until pulse_sub_assume_step the contents are unknown, so
 * the first sync takes the anchor route.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, bad shape, a name attached twice,
 * after pulse_sub_attach_file or device targets); PULSE_ERR_OVERFLOW;
 * PULSE_ERR_NOMEM. */
pulse_status pulse_sub_attach_host(pulse_sub *sub, const char *name,
                                   uint32_t ndim, const uint64_t *shape,
                                   uint16_t *data);

/** Attaches a BF16 tensor in CUDA device memory (data_d, 2-byte aligned),
 * applied with the CUDA kernels on opts.cuda_stream. Same contract as
 * pulse_sub_attach_host; host and device targets do not mix.
 * @return as pulse_sub_attach_host, plus PULSE_ERR_NOT_BUILT (pulse built
 * without CUDA) and PULSE_ERR_CUDA (no usable device). */
pulse_status pulse_sub_attach_device(pulse_sub *sub, const char *name,
                                     uint32_t ndim, const uint64_t *shape,
                                     uint16_t *data_d);

/** Attaches a block of a BF16 tensor in host memory (a tensor-parallel
 * rank's part: rows of a column-parallel weight inside its fused buffer,
 * columns of a row-parallel one; pulse_region.h): region->name is the
 * publisher's tensor, `shape` its whole shape (checked against the
 * publisher's table), region->row0/rows/col0/cols the block of its 2-D view
 * and region->data/stride where the block lives (borrowed until
 * pulse_sub_free, written by nobody else; blocks of several regions may sit
 * in one buffer but must not overlap). region->digest and the halo fields
 * are ignored: the subscriber keeps its own halo of the block (the
 * tensor's bits around it inside its span at 2^PULSE_CHUNK_LOG2_DEFAULT,
 * pulse_region.h: at most two partial spans for a row block, for a column
 * block the rest of the rows it meets), filled from the anchor, so that
 * class-model patches (the publisher's default) decode; plain-position
 * patches decode too, and class-model ones with chunks larger than the
 * default are refused. A subscriber with region targets takes no other
 * kind; patches are staged whole (no streaming, no class index: a
 * class-model patch costs a pass over each changed chunk's base bits), and
 * each block is verified: where block and halo are the whole tensor
 * against the patch's own digests, else against a digest derived from the
 * verified anchor and the signed patches (pulse_region.h). An anchor is
 * verified whole, then only the blocks and halos are copied. Extra memory
 * of a sync: O(patch). The first sync takes the anchor route
 * (pulse_sub_assume_step does not help: a claim is checked against
 * whole-tensor digests).
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, a block outside the shape, stride
 * below cols, unaligned data, a name attached twice, a block overlapping
 * another's memory, other kinds of targets attached); PULSE_ERR_OVERFLOW;
 * PULSE_ERR_NOMEM. */
pulse_status pulse_sub_attach_region(pulse_sub *sub, uint32_t ndim, const uint64_t *shape,
                                     const pulse_region *region);

/** The publisher's tensor table at its head (names, dtypes and shapes in
 * table order), for a caller that lays out targets from it (a tensor-
 * parallel rank maps its fused buffers to blocks of the published tensors).
 * Verifies the head and fetches the head's newest anchor into the cache
 * when it is not there (the object the first sync of new targets reads
 * anyway), then reads its header. Only before any target is attached.
 * @return PULSE_OK and *table (count entries, one allocation: free with
 * pulse_sub_table_free); PULSE_ERR_ARG (targets attached, NULL); the
 * errors of pulse_sub_sync. */
pulse_status pulse_sub_table(pulse_sub *sub, pulse_tensor_info **table, size_t *count);

/** Frees a table from pulse_sub_table. NULL is fine. */
void pulse_sub_table_free(pulse_tensor_info *table);

/** Keeps the safetensors file `path` equal to the trainer's state: the
 * subscriber holds every tensor of the table in host memory and, after each
 * sync that moved, brings the file to the new step in place: the step's
 * changes and the new header (metadata {"step", "state_digest", "run"}; the header
 * is padded with spaces so the claim can be rewritten in place) go first
 * into a journal next to the file (`.NAME.journal`, synced), then into the
 * file, so a step costs what changed, not the model's size. An anchor (a
 * new table, or a file that is missing, damaged or not laid out as pulse
 * writes it) replaces the file whole and atomically instead, with the
 * tensors in table order like an anchor.
 * Durability: a sync that returned PULSE_OK is durable (journal synced);
 * the file's own pages are synced at checkpoints (when the journal outgrows
 * the file, before a whole rewrite, and at the next attach: pulse_sub_free
 * leaves them to the kernel's write-back and keeps the journal). Crashes: after a
 * kill -9 or a power cut at any moment, the next attach replays the
 * journal's whole transactions and drops a torn one, so the file holds
 * exactly the last step synced (or the one before), repaired before it is
 * read. Readers of the file itself: between syncs it holds one whole step;
 * while a sync writes, and after a crash until the next attach, a reader
 * may see a mix of two steps. A reader that needs a consistent file at all
 * times reads the snapshot (pulse_sub_file_snapshot).
 * An existing file is read now (after the repair, and after removing the
 * temporary files that writers killed during a whole rewrite left next to
 * it): when its data matches its metadata's state digest (or it has none)
 * and names a step, the subscriber resumes from that step (checked against
 * the publisher's digests before any patch is applied); otherwise it starts
 * from the anchor route. The file's tensors are then readable through
 * pulse_sub_tensor. The step and run the file names count as held even
 * when the cache is gone: an older head or another run is refused
 * (opts.allow_rollback, opts.switch_run).
 * @return PULSE_OK (also for a missing file, or one that is replaced later:
 * a warning event says why); PULSE_ERR_ARG (other targets attached);
 * PULSE_ERR_IO (a journal that cannot be replayed: the file is left as it
 * is); PULSE_ERR_NOMEM. */
pulse_status pulse_sub_attach_file(pulse_sub *sub, const char *path);

/** With a file target: every `every` steps (counted from the last
 * snapshot; 0 turns it off), after the sync that reached such a step, also
 * write PATH.snapshot (PATH the file target's path), a safetensors file of
 * the same layout and metadata that is replaced atomically (temporary file,
 * fsync, rename): a reader always finds one whole, durable step in it. It is
 * written on a thread of its own from a copy of the state taken under the
 * readers' lock (the next commit waits for the copy, not for the disk; the
 * copy costs the model's size in memory while it is written); a step
 * reached while one is still being written is skipped. A snapshot that
 * fails is reported as a warning event and tried again at the next due
 * step.
 * @return PULSE_OK; PULSE_ERR_ARG (no file target). */
pulse_status pulse_sub_file_snapshot(pulse_sub *sub, uint64_t every);

/** Declares that the attached host or device targets hold step `step`. It
 * is checked against the publisher's digests before it is relied upon; a
 * wrong claim leads to the anchor route, never to a wrong state.
 * @return PULSE_OK or PULSE_ERR_ARG (no targets, or a file target). */
pulse_status pulse_sub_assume_step(pulse_sub *sub, uint64_t step);

/** Brings the targets to the newest step the publisher has (with no target
 * attached: only verifies the head and, with opts.mirror, mirrors the
 * store). Returns when the targets hold the head's step or on an error
 * (after the retries): the targets then hold the last step they reached
 * (an older step, never a mix).
 * @return PULSE_OK; PULSE_ERR_IO (network or cache I/O failure, or
 * interrupted by pulse_sub_stop); PULSE_ERR_NOT_FOUND (the server has no
 * head, or lost an object the head names); PULSE_ERR_CORRUPT (a head,
 * signature or object that does not verify, from every URL); PULSE_ERR_*
 * of the codec for a state that cannot be brought to the head (e.g.
 * PULSE_ERR_SIZE_MISMATCH: a target's shape differs from the publisher's);
 * PULSE_ERR_CUDA; PULSE_ERR_NOMEM. */
pulse_status pulse_sub_sync(pulse_sub *sub);

/** Syncs, then waits for new steps with long-polls and syncs each, until
 * pulse_sub_stop. Failures are reported as PULSE_SUB_EV_ERROR events and
 * retried with backoff; only argument and memory errors end it.
 * @return PULSE_OK when stopped; PULSE_ERR_ARG; PULSE_ERR_NOMEM. */
pulse_status pulse_sub_follow(pulse_sub *sub);

/** Asks a sync or follow running on another thread to stop soon (transfers
 * are aborted, partial downloads kept for the next run). Thread-safe. */
void pulse_sub_stop(pulse_sub *sub);

/** The step the targets hold (PULSE_SUB_NO_STEP when none). Thread-safe. */
uint64_t pulse_sub_step(const pulse_sub *sub);

/* Counters since create and the split of the last sync. */
typedef struct {
  uint64_t step;         /* the targets' step, PULSE_SUB_NO_STEP: none */
  uint64_t head_step;    /* newest verified head, PULSE_SUB_NO_STEP */
  char state_digest[65]; /* hex state digest of step ("" when unknown) */
  uint64_t syncs;        /* sync calls that ended at the head */
  uint64_t sync_failures;
  uint64_t bytes_downloaded; /* response bodies received, every request */
  uint64_t bytes_resumed;    /* object bytes found on disk, not downloaded */
  uint64_t objects_fetched;  /* objects downloaded and verified */
  uint64_t requests;
  uint64_t retries;
  uint64_t rejected; /* heads, objects, catch-ups or bases refused */
  uint64_t patches_applied;
  uint64_t anchors_applied;
  uint64_t catchups_applied;
  /* The last sync that ended at the head (or failed). */
  pulse_sub_route last_route;
  pulse_status last_status;
  uint64_t last_from_step;
  uint64_t last_bytes;    /* bytes downloaded by it */
  double last_transfer_s; /* waiting for the network */
  double last_verify_s;   /* signatures, SHA-256, digests */
  double last_decode_s;   /* decoding patches, reading anchors: the part
                             not hidden behind downloads */
  double last_apply_s;    /* writing targets (in memory) */
  double last_total_s;
  /* Decoding (wall time) that ran while patches were still downloading,
   * hidden behind the transfer and not in last_decode_s. */
  double last_decode_overlap_s;
  uint64_t class_index_builds; /* class indexes built (opts.class_index) */
  uint64_t class_index_bytes;  /* memory the targets' class indexes hold */
  /* The file target: time the last sync spent making it durable (its
   * journal and in-place writes, or a whole rewrite after an anchor), and
   * bytes written to it and its journal since create. */
  double last_write_s;
  uint64_t file_bytes_written;
  /* Sources whose head was older than the newest at the last time every
   * source was asked (PULSE_SUB_EV_LAGGING). */
  uint64_t lagging_sources;
  /* The class index's choice at the last patch (opts.class_index): 1 when
   * the targets keep class indexes (held, or built between steps), 0 when
   * not; class_index_why says why in words (also the detail of the synced
   * event); "" before the first patch, and for device and region targets
   * (which keep none). */
  int class_index_kept;
  char class_index_why[192];
  /* Patches fetched by their sections alone, each checked against the
   * patch's signed section index (docs/protocols/sync.md "Partial
   * fetches"): targets that hold some of the published tensors. */
  uint64_t partial_fetches;
} pulse_sub_figures;

/** Copies the current figures. Thread-safe. */
void pulse_sub_figures_get(const pulse_sub *sub, pulse_sub_figures *out);

/** Detailed text of the handle's last error ("" when none). Valid until the
 * next call on the handle. */
const char *pulse_sub_error(const pulse_sub *sub);

/** Takes the readers' side of the targets' lock: until pulse_sub_read_unlock
 * the targets hold one whole step (*step, may be NULL) and are not written.
 * Hold it briefly (a forward pass): a sync waits for it before it commits.
 * Must not be held by the syncing thread when it calls sync or follow.
 * Thread-safe; readers do not block each other. */
void pulse_sub_read_lock(pulse_sub *sub, uint64_t *step);
void pulse_sub_read_unlock(pulse_sub *sub);

/** With a file target: tensor `name` as held in memory (data valid while
 * the caller holds the read lock, or until the next sync on the syncing
 * thread). Host targets answer with the caller's own buffer.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (no such tensor, or no state yet);
 * PULSE_ERR_UNSUPPORTED (device targets); PULSE_ERR_ARG. */
pulse_status pulse_sub_tensor(pulse_sub *sub, const char *name,
                              const uint16_t **data, uint64_t *numel);

/** Keeps an FP8 tensor of the engine equal, bit for bit, to the reference
 * block quantizer (pulse_fp8.h) of the trainer's weights at every step, in
 * the engine's layout: `shadow` is a BF16 tensor of fp8->rows x fp8->cols
 * elements (row-major, host memory) that the attached targets cover
 * exactly, one host target of that many elements (pulse_sub_attach_host)
 * or region blocks that tile it (pulse_sub_attach_region: a fused,
 * tensor-parallel weight as the engine loads it), attached before this
 * call. The shadow is quantized into fp8->q and fp8->scale_inv now (the
 * FP8 tensor is the shadow's quantization from then on); every later step
 * requantizes only the blocks its changes touch (a block whose scale stays,
 * only its changed elements), staged with the step and committed with it
 * under the writers' lock: whatever fails, shadow, q and scales hold the
 * same step. A step or anchor that would put a NaN or an infinity into a
 * shadow is refused (PULSE_ERR_UNSUPPORTED, the element named), nothing
 * changed. q and scale_inv are borrowed until pulse_sub_free and written
 * by the subscriber only; the shadow is the targets' memory (same rules).
 * Memory besides the shadow (2 bytes per element): 2 bytes per scale
 * block (each block's amax), and per step the staged FP8 bytes.
 * Device targets (pulse_sub_attach_device): `shadow` is device memory of
 * fp8->rows x fp8->cols elements that attached device targets cover
 * exactly (one tensor, or several side by side: a fused weight), and
 * fp8->q and fp8->scale_inv are device memory on its device
 * (pulse_cuda_fp8_track, pulse_cuda.h: 24 bytes of device memory per scale
 * block; a shadow of several targets also keeps 10 bytes per change of
 * the largest step so far); the FP8 work of a step is staged before the
 * patch's scatter and queued after it on opts.cuda_stream, so readers
 * order after the step as for the BF16 targets.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, no or other targets, a shadow the
 * targets do not cover exactly, one overlapping another shadow, an unknown
 * scale kind, device memory on another device); PULSE_ERR_UNSUPPORTED (the
 * shadow holds a NaN or infinity: nothing written); PULSE_ERR_OVERFLOW;
 * PULSE_ERR_NOMEM; PULSE_ERR_CUDA. */
pulse_status pulse_sub_bind_fp8(pulse_sub *sub, uint16_t *shadow, const pulse_fp8_tensor *fp8);

/** Parses 64 hex digits into a 32-byte public key.
 * @return PULSE_OK or PULSE_ERR_ARG. */
pulse_status pulse_sub_key_from_hex(const char *hex,
                                    uint8_t key[PULSE_KEY_BYTES]);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SUBSCRIBER_H */
