/* pulse-publish --store DIR CKPT...: publishes a sequence of checkpoints
 * (safetensors: BF16, or FP32 master weights cast by the one rounding) into
 * a pulse store as consecutive steps, as a trainer's publisher would after
 * each optimizer step; optionally serves the store while it does
 * (--listen). `--verify` checks a store instead. */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pulse_publisher.h"
#include "pulse_safetensors.h"
#include "pulse_server.h"
#include "pulse_sign.h"
#include "pulse_store.h"
#include "pulse_store_writer.h"
#include "pulse_upload.h"
#include "cli_args.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: pulse-publish --store DIR [options] CKPT...\n"
      "       pulse-publish --store DIR --verify [--key KEY.pem]\n"
      "  CKPT                 safetensors checkpoints (file, index.json or "
      "folder), published\n"
      "                       in order as consecutive steps after the store's "
      "head\n"
      "  --store DIR          the store folder (created when missing; resumed "
      "when not)\n"
      "  --listen HOST:PORT   serve the store meanwhile (port 0: a free one, "
      "printed), and\n"
      "                       afterwards until SIGINT/SIGTERM\n"
      "  --exit-after-publish with --listen: stop once every checkpoint is "
      "published\n"
      "  --anchor-every K     anchor (whole state) every K steps (default 16; "
      "0: first only)\n"
      "  --keep M             keep at least the last M patches (default 32)\n"
      "  --keep-anchors A     anchors kept: the oldest needed, the next, and "
      "the newest\n"
      "                       A - 2 (A >= 2, default 3)\n"
      "  --grace SECONDS      objects that leave the head stay downloadable "
      "this long\n"
      "                       (default 600; 0: removed at once)\n"
      "  --key KEY.pem        sign heads with this Ed25519 key (PKCS#8 PEM)\n"
      "  --new-key            make a new key at --key's path, or at "
      "DIR/signing-key.pem\n"
      "                       (default without --key: DIR/signing-key.pem, "
      "made when missing;\n"
      "                       the server never serves it, keep it out of "
      "mirrors)\n"
      "  --rotate-key NEW.pem rotate the signing key to NEW.pem (made when "
      "missing): a head\n"
      "                       at the same step, signed by NEW.pem, carries a "
      "record signed\n"
      "                       by the current key (--key or the default) that "
      "names NEW.pem;\n"
      "                       workers that trust the old key follow it; "
      "later runs need\n"
      "                       --key NEW.pem (the old key is then refused)\n"
      "  --unsigned           write unsigned heads\n"
      "  --public-key         print the signing key's public key (64 hex "
      "digits, what\n"
      "                       `pulse-pull --key` pins) and exit\n"
      "  --first-step N       step of the first checkpoint of a new store "
      "(default: its\n"
      "                       metadata 'step', else 0)\n"
      "  --interval-ms N      pause between checkpoints, like a trainer's step "
      "time\n"
      "  --plain              plain position model: about 40%% more bytes, but "
      "CPU\n"
      "                       receivers apply it about 5x faster (no pass over "
      "their\n"
      "                       weights) and catch-ups squash without weights; "
      "for CPU\n"
      "                       receivers on fast links\n"
      "  --format N           patch format version: 2 (default), 3 (values "
      "against\n"
      "                       a per-patch model, ~4%% smaller) or 1\n"
      "  --sync-anchors       write anchors within the commit, not in the "
      "background\n"
      "  --threads N          threads (default: one per core)\n"
      "  --json               one JSON object per step instead of text\n"
      "  --upload s3://BUCKET/PREFIX  after each step, upload the objects "
      "the head names\n"
      "                       that the bucket lacks, then the head "
      "(AWS_ENDPOINT_URL,\n"
      "                       AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
      "AWS_SESSION_TOKEN,\n"
      "                       AWS_REGION as for the AWS CLI; path-style "
      "addressing);\n"
      "                       bucket retention: the head's objects, the "
      "newest\n"
      "                       --keep-anchors anchors, and --grace\n"
      "  --multipart-mb N     objects of N MiB or more go up as multipart "
      "uploads\n"
      "                       (default 64), in parallel parts of --part-mb "
      "MiB (default 16)\n"
      "  --cacert FILE        CA certificates (PEM) for the upload's HTTPS\n"
      "  --verify             check the store: signature, every object's size "
      "and SHA-256,\n"
      "                       the whole patch chain against the head's "
      "digest\n");
}

static int fail(const char *what, pulse_status st) {
  return pulse_cli_fail("pulse-publish", what, st);
}

/* The table of the first checkpoint, in its order. */
typedef struct {
  pulse_st_model *model;
  pulse_tensor_info *info;
  size_t count;
} table_src;

/* Fills t[] (table order) from a checkpoint; copies misaligned tensors into
 * `copies` (freed by the caller). */
static int load_step(const char *path, const pulse_tensor_info *info, size_t n,
                     pulse_st_model *m, pulse_pub_tensor *t, void **copies) {
  if (pulse_st_model_tensor_count(m) != n) {
    fprintf(stderr,
            "pulse-publish: %s has %zu tensors, the store %zu: not the same "
            "model\n",
            path, pulse_st_model_tensor_count(m), n);
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    pulse_st_tensor x;
    if (pulse_st_model_tensor_find(m, info[i].name, &x) != PULSE_OK) {
      fprintf(stderr, "pulse-publish: %s has no tensor '%s'\n", path,
              info[i].name);
      return 1;
    }
    if (x.ndim != info[i].ndim ||
        memcmp(x.shape, info[i].shape, x.ndim * sizeof x.shape[0]) != 0) {
      fprintf(stderr, "pulse-publish: %s: tensor '%s' has another shape\n",
              path, info[i].name);
      return 1;
    }
    if (x.dtype != PULSE_DTYPE_F32 && x.dtype != PULSE_DTYPE_BF16) {
      fprintf(stderr,
              "pulse-publish: %s: tensor '%s' is %s: publish BF16 or F32\n",
              path, info[i].name, pulse_dtype_name(x.dtype));
      return 1;
    }
    t[i].data = x.data;
    t[i].dtype = x.dtype;
    t[i].memory = PULSE_PUB_HOST;
    if ((uintptr_t)x.data % pulse_dtype_size(x.dtype) != 0) {
      copies[i] = malloc(x.nbytes + 4);
      if (copies[i] == NULL)
        return fail("memory", PULSE_ERR_NOMEM);
      memcpy(copies[i], x.data, x.nbytes);
      t[i].data = copies[i];
    }
  }
  return 0;
}

static void print_figures(const pulse_pub_figures *f, int json) {
  if (json) {
    printf("{\"step\":%" PRIu64 ",\"base_step\":%" PRIu64 ",\"params\":%" PRIu64
           ",\"changed\":%" PRIu64 ",\"patch_bytes\":%" PRIu64
           ",\"anchor_bytes\":%" PRIu64
           ",\"anchor_started\":%d,\"flush\":%d,\"detect_s\":%.6f,\"encode_s\":"
           "%.6f,\"write_s\":%.6f"
           ",\"total_s\":%.6f,\"state_digest\":\"%s\"}\n",
           f->step, f->base_step, f->params, f->changed, f->patch_bytes,
           f->anchor_bytes, f->anchor_started, f->flush, f->detect_seconds,
           f->encode_seconds, f->write_seconds, f->total_seconds,
           f->state_digest);
  } else if (f->flush) {
    printf("pulse-publish: step %" PRIu64 ": anchor named (%" PRIu64
           " bytes)\n",
           f->step, f->anchor_bytes);
  } else if (f->step == f->base_step) {
    printf("pulse-publish: step %" PRIu64 ": first state, anchor %" PRIu64
           " bytes (%" PRIu64 " parameters), %.1f ms, state %s\n",
           f->step, f->anchor_bytes, f->params, f->total_seconds * 1e3,
           f->state_digest);
  } else {
    printf("pulse-publish: step %" PRIu64 " <- %" PRIu64 ": %" PRIu64
           " of %" PRIu64 " changed (%.3f%%), patch %" PRIu64
           " bytes (%.2f B/changed)%s, detect %.1f ms, "
           "encode %.1f ms, write %.1f ms, total %.1f ms, state %s\n",
           f->step, f->base_step, f->changed, f->params,
           f->params ? 100.0 * (double)f->changed / (double)f->params : 0.0,
           f->patch_bytes,
           f->changed ? (double)f->patch_bytes / (double)f->changed : 0.0,
           f->anchor_started ? ", anchor started"
                             : (f->anchor_bytes ? ", anchor named" : ""),
           f->detect_seconds * 1e3, f->encode_seconds * 1e3,
           f->write_seconds * 1e3, f->total_seconds * 1e3, f->state_digest);
  }
  fflush(stdout);
}

static int verify(const char *store, const char *key_path) {
  uint8_t pinned[PULSE_KEY_BYTES];
  const uint8_t *pin = NULL;
  if (key_path != NULL) {
    pulse_sign_key *k = NULL;
    pulse_status st = pulse_sign_key_load(key_path, &k);
    if (st != PULSE_OK)
      return fail(key_path, st);
    pulse_sign_key_public(k, pinned);
    pulse_sign_key_free(k);
    pin = pinned;
  }
  pulse_store_verify_figures r;
  pulse_status st = pulse_store_verify(
      store, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE, pin, &r);
  if (st != PULSE_OK)
    return fail(store, st);
  printf("pulse-publish: %s is consistent: head step %" PRIu64
         ", retained steps %" PRIu64 "..%" PRIu64
         ", %zu patches, %zu anchors, %" PRIu64 " bytes, %s, %zu stray files, "
         "state %s\n",
         store, r.head_step, r.oldest_step, r.head_step, r.patches, r.anchors,
         r.object_bytes, r.head_signed ? "signed" : "unsigned", r.strays,
         r.state_digest_hex);
  return 0;
}

/* --public-key: the hex a puller pins (never makes a key). */
static int print_public_key(const char *store, const char *key_path) {
  char def[4096];
  snprintf(def, sizeof def, "%s/signing-key.pem", store);
  const char *path = key_path ? key_path : def;
  pulse_sign_key *k = NULL;
  pulse_status st = pulse_sign_key_load(path, &k);
  if (st != PULSE_OK)
    return fail(path, st);
  uint8_t pub[PULSE_KEY_BYTES];
  pulse_sign_key_public(k, pub);
  pulse_sign_key_free(k);
  for (size_t i = 0; i < sizeof pub; i++)
    printf("%02x", pub[i]);
  printf("\n");
  return 0;
}

static pulse_status get_key(const char *store, const char *key_path,
                            int new_key, int unsigned_, pulse_sign_key **key) {
  *key = NULL;
  if (unsigned_)
    return PULSE_OK;
  char def[4096];
  snprintf(def, sizeof def, "%s/signing-key.pem", store);
  const char *path = key_path ? key_path : def;
  if (!new_key) {
    pulse_status st = pulse_sign_key_load(path, key);
    if (st != PULSE_ERR_NOT_FOUND || key_path != NULL)
      return st;
  }
  pulse_status st = pulse_sign_key_generate(key);
  if (st == PULSE_OK)
    st = pulse_sign_key_save(*key, path);
  if (st != PULSE_OK) {
    pulse_sign_key_free(*key);
    *key = NULL;
    return st;
  }
  fprintf(stderr, "pulse-publish: new signing key %s\n", path);
  return PULSE_OK;
}

/* --rotate-key: the new key, loaded or made (never replacing a file). */
static pulse_status rotate_key_get(const char *path, pulse_sign_key **key) {
  pulse_status st = pulse_sign_key_load(path, key);
  if (st != PULSE_ERR_NOT_FOUND)
    return st;
  st = pulse_sign_key_generate(key);
  if (st == PULSE_OK)
    st = pulse_sign_key_save(*key, path);
  if (st != PULSE_OK) {
    pulse_sign_key_free(*key);
    *key = NULL;
    return st;
  }
  fprintf(stderr, "pulse-publish: new signing key %s\n", path);
  return PULSE_OK;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The command line, read by parse_args. */
typedef struct publish_args publish_args;
static int upload(const publish_args *a);

struct publish_args {
  const char *store, *listen, *key_path, *rotate_path;
  int new_key, unsigned_, exit_after, json, do_verify, print_key;
  int interval_ms, have_first;
  uint64_t first_step;
  pulse_pub_opts o;
  pulse_upload_opts up;   /* --upload */
  pulse_upload *uploader; /* made in main */
  char **ckpts; /* gathered at the front of argv, after argv[0] */
  size_t nckpts;
};

/* --upload: the store's head and what it names to the bucket. */
static int upload(const publish_args *a) {
  if (a->uploader == NULL)
    return 0;
  pulse_upload_figures f;
  pulse_status st = pulse_upload_store(a->uploader, a->store, &f);
  if (st != PULSE_OK)
    return fail("--upload", st);
  if (a->json)
    printf("{\"event\":\"upload\",\"step\":%" PRIu64
           ",\"objects_uploaded\":%" PRIu64 ",\"objects_present\":%" PRIu64
           ",\"bytes\":%" PRIu64 ",\"parts\":%" PRIu64 ",\"retries\":%" PRIu64
           ",\"deleted\":%" PRIu64 ",\"stale_aborted\":%" PRIu64
           ",\"seconds\":%.3f}\n",
           f.head_step, f.objects_uploaded, f.objects_present, f.bytes_uploaded,
           f.parts, f.retries, f.deleted,
           pulse_upload_stale_aborted(a->uploader), f.seconds);
  else
    printf("upload: step %" PRIu64 ": %" PRIu64 " objects put (%" PRIu64
           " there already), %" PRIu64 " bytes, %" PRIu64 " parts, %" PRIu64
           " retries, %" PRIu64 " deleted, %" PRIu64
           " stale multipart uploads aborted, %.3f s\n",
           f.head_step, f.objects_uploaded, f.objects_present, f.bytes_uploaded,
           f.parts, f.retries, f.deleted,
           pulse_upload_stale_aborted(a->uploader), f.seconds);
  fflush(stdout);
  return 0;
}

/* Rotates the store's key to `next` (before any checkpoint) and says so. */
static int rotate(const publish_args *a, pulse_pub *pub,
                  const pulse_sign_key *next) {
  pulse_pub_figures f;
  pulse_status st = pulse_pub_rotate_key(pub, next, &f);
  if (st != PULSE_OK)
    return fail("--rotate-key", st);
  uint8_t pk[PULSE_KEY_BYTES];
  char hex[2 * PULSE_KEY_BYTES + 1];
  pulse_sign_key_public(next, pk);
  for (size_t i = 0; i < sizeof pk; i++)
    snprintf(hex + 2 * i, 3, "%02x", pk[i]);
  if (a->json)
    printf("{\"event\":\"rotate\",\"step\":%" PRIu64
           ",\"public_key\":\"%s\"}\n",
           f.step, hex);
  else
    printf("pulse-publish: step %" PRIu64 ": key rotated to %s\n", f.step,
           hex);
  fflush(stdout);
  return upload(a);
}

/* Reads argv into *a. Returns -1 to go on, else the exit code (0 for
 * --help, 2 for bad usage, with the message printed). */
static int parse_args(int argc, char **argv, publish_args *a) {
  const char *v;
  int threads = 0;
  memset(a, 0, sizeof *a);
  pulse_pub_opts_init(&a->o);
  pulse_upload_opts_init(&a->up);
  /* Checkpoints are gathered at the front of argv (after argv[0]): they
   * are never more than the arguments already read. */
  a->ckpts = argv + 1;
  for (int i = 1; i < argc; i++) {
    int r;
    uint64_t u;
    if (pulse_cli_opt_flag(argv[i], "--help") ||
        pulse_cli_opt_flag(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--store", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->store = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--listen", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->listen = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--key", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->key_path = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--rotate-key", &v)) !=
               0) {
      if (r < 0)
        return usage(stderr), 2;
      a->rotate_path = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--anchor-every", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->o.anchor_every) != 0)
        return fprintf(stderr,
                       "pulse-publish: --anchor-every needs an integer\n"),
               2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--keep", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &u) != 0 || u < 1)
        return fprintf(stderr, "pulse-publish: --keep needs an integer >= 1\n"),
               2;
      a->o.keep_patches = u;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--keep-anchors", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_u64(v, &u) != 0 || u < 2)
        return fprintf(stderr,
                       "pulse-publish: --keep-anchors needs an integer >= 2\n"),
               2;
      a->o.keep_anchors = u;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--grace", &v)) != 0) {
      int g;
      if (r < 0 || pulse_cli_parse_int(v, 0, 7 * 86400, &g) != 0)
        return fprintf(stderr,
                       "pulse-publish: --grace needs 0..604800 seconds\n"),
               2;
      a->o.grace_seconds = g;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--first-step", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->first_step) != 0)
        return fprintf(stderr,
                       "pulse-publish: --first-step needs an integer\n"),
               2;
      a->have_first = 1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--interval-ms", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 3600000, &a->interval_ms) != 0)
        return fprintf(stderr,
                       "pulse-publish: --interval-ms needs 0..3600000\n"),
               2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 256, &threads) != 0)
        return fprintf(stderr, "pulse-publish: --threads needs 0..256\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--upload", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->up.target = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--multipart-mb", &v)) !=
               0) {
      int mb;
      if (r < 0 || pulse_cli_parse_int(v, 5, 5 * 1024 * 1024, &mb) != 0)
        return fprintf(stderr,
                       "pulse-publish: --multipart-mb needs 5..5242880\n"),
               2;
      a->up.multipart_bytes = (uint64_t)mb << 20;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--part-mb", &v)) != 0) {
      int mb;
      if (r < 0 || pulse_cli_parse_int(v, 5, 5 * 1024, &mb) != 0)
        return fprintf(stderr, "pulse-publish: --part-mb needs 5..5120\n"), 2;
      a->up.part_bytes = (uint64_t)mb << 20;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--cacert", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->up.cacert = v;
    } else if (pulse_cli_opt_flag(argv[i], "--new-key")) {
      a->new_key = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--unsigned")) {
      a->unsigned_ = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--exit-after-publish")) {
      a->exit_after = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--plain")) {
      a->o.pos_model = PULSE_POS_PLAIN;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--format", &v)) != 0) {
      int format;
      if (r < 0 || pulse_cli_parse_int(v, PULSE_PATCH_VERSION_MIN,
                                       PULSE_PATCH_VERSION_MAX, &format) != 0)
        return fprintf(stderr,
                       "pulse-publish: --format needs an integer in %d..%d\n",
                       PULSE_PATCH_VERSION_MIN, PULSE_PATCH_VERSION_MAX),
               2;
      a->o.format_version = (uint32_t)format;
    } else if (pulse_cli_opt_flag(argv[i], "--sync-anchors")) {
      a->o.anchor_sync = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--json")) {
      a->json = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--verify")) {
      a->do_verify = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--public-key")) {
      a->print_key = 1;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "pulse-publish: unknown option '%s'\n", argv[i]);
      return usage(stderr), 2;
    } else {
      a->ckpts[a->nckpts++] = argv[i];
    }
  }
  if (a->store == NULL || (a->new_key && a->unsigned_) ||
      (a->do_verify && a->nckpts > 0) ||
      (a->print_key && (a->nckpts > 0 || a->unsigned_)) ||
      (a->rotate_path != NULL && (a->unsigned_ || a->do_verify)) ||
      (!a->do_verify && !a->print_key && a->nckpts == 0 &&
       a->listen == NULL && a->rotate_path == NULL))
    return usage(stderr), 2;
  a->o.threads = threads;
  a->up.keep_anchors = (unsigned)a->o.keep_anchors;
  a->up.grace_seconds = (uint32_t)a->o.grace_seconds;
  return -1;
}

/* A new store takes its table (and, without --first-step, its first step)
 * from the first checkpoint, which stays open in *first for the first
 * commit; *info (the caller frees it) borrows its names. */
static int table_from_first(publish_args *a, pulse_st_model **first,
                            pulse_tensor_info **info) {
  pulse_store_head *head = NULL;
  int fresh = pulse_store_head_load(a->store, &head) == PULSE_ERR_NOT_FOUND;
  pulse_store_head_free(head);
  if (!fresh || a->nckpts == 0)
    return 0;
  pulse_status st = pulse_st_model_open(a->ckpts[0], first);
  if (st != PULSE_OK)
    return fail(a->ckpts[0], st);
  size_t n = pulse_st_model_tensor_count(*first);
  *info = calloc(n + 1, sizeof **info);
  if (*info == NULL)
    return fail("memory", PULSE_ERR_NOMEM);
  for (size_t i = 0; i < n; i++) {
    pulse_st_tensor t;
    pulse_st_model_tensor_get(*first, i, &t);
    (*info)[i].name = t.name;
    (*info)[i].dtype = PULSE_DTYPE_BF16;
    (*info)[i].ndim = t.ndim;
    memcpy((*info)[i].shape, t.shape, sizeof t.shape);
  }
  a->o.tensors = *info;
  a->o.tensor_count = n;
  if (!a->have_first) {
    const char *s = pulse_st_model_metadata_get(*first, "step");
    if (s == NULL || pulse_cli_parse_u64(s, &a->first_step) != 0)
      a->first_step = 0;
  }
  return 0;
}

/* --listen: the server exists before the publisher so that every head is
 * notified; the publisher takes it as its hook's context. */
static int start_server(publish_args *a, const pulse_sign_key *key,
                        pulse_server **srv) {
  char host[256];
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  pulse_status st =
      pulse_server_parse_listen(a->listen, host, sizeof host, &so.port);
  if (st != PULSE_OK)
    return fail("--listen", st);
  so.host = host;
  so.store_dir = a->store;
  so.key = key;
  so.watch = 0; /* this process is the only writer: it notifies */
  if ((st = pulse_server_create(&so, srv)) != PULSE_OK)
    return fail(a->listen, st);
  a->o.on_head = pulse_server_on_head;
  a->o.on_head_ctx = *srv;
  printf("pulse-publish: serving %s on http://%s:%u\n", a->store,
         host[0] ? host : "0.0.0.0", (unsigned)pulse_server_port(*srv));
  fflush(stdout);
  return 0;
}

/* Publishes every checkpoint as the step after the head (the first of a new
 * store: first_step); *first, when open, is the first checkpoint and is
 * taken. A stop signal between steps ends cleanly and sets *stopped. */
static int publish_all(const publish_args *a, pulse_pub *pub,
                       pulse_st_model **first, sigset_t *stop, int *stopped) {
  int rc = 0;
  pulse_status st;
  size_t n = pulse_pub_tensor_count(pub);
  pulse_pub_tensor *t = calloc(n + 1, sizeof *t);
  void **copies = calloc(n + 1, sizeof *copies);
  /* The publisher's copy of the table: the first checkpoint's names are
   * gone once it is closed. */
  pulse_tensor_info *table = calloc(n + 1, sizeof *table);
  if (t == NULL || copies == NULL || table == NULL) {
    free(t), free(copies), free(table);
    return fail("memory", PULSE_ERR_NOMEM);
  }
  for (size_t i = 0; i < n; i++)
    table[i] = *pulse_pub_tensor_info(pub, i);
  for (size_t k = 0; k < a->nckpts && rc == 0; k++) {
    pulse_st_model *m = NULL;
    if (k == 0 && *first != NULL) {
      m = *first;
      *first = NULL;
    } else if ((st = pulse_st_model_open(a->ckpts[k], &m)) != PULSE_OK) {
      rc = fail(a->ckpts[k], st);
      break;
    }
    uint64_t head_step = 0, step;
    step = pulse_pub_head_step(pub, &head_step) ? head_step + 1 : a->first_step;
    rc = load_step(a->ckpts[k], table, n, m, t, copies);
    pulse_pub_figures f;
    if (rc == 0 && (st = pulse_pub_commit(pub, step, t, n, &f)) != PULSE_OK)
      rc = fail(a->ckpts[k], st);
    if (rc == 0)
      print_figures(&f, a->json);
    if (rc == 0)
      rc = upload(a);
    for (size_t i = 0; i < n; i++) {
      free(copies[i]);
      copies[i] = NULL;
    }
    pulse_st_model_close(m);
    /* A stop signal between steps ends publishing cleanly. */
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM)) {
      int sig;
      sigwait(stop, &sig);
      *stopped = 1;
      break;
    }
    if (a->interval_ms > 0 && k + 1 < a->nckpts)
      sleep_ms((unsigned)a->interval_ms);
  }
  free(t), free(copies), free(table);
  return rc;
}

int main(int argc, char **argv) {
  publish_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;
  if (a.do_verify)
    return verify(a.store, a.key_path);
  if (a.print_key)
    return print_public_key(a.store, a.key_path);

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  signal(SIGPIPE, SIG_IGN);

  rc = 0;
  pulse_sign_key *key = NULL, *next_key = NULL;
  pulse_pub *pub = NULL;
  pulse_server *srv = NULL;
  pulse_st_model *first = NULL;
  pulse_tensor_info *info = NULL;
  /* Creates the folder; objects in their grace period stay. */
  pulse_status st = pulse_store_recover_grace(a.store, a.o.grace_seconds, NULL);
  if (st == PULSE_OK)
    st = get_key(a.store, a.key_path, a.new_key, a.unsigned_, &key);
  if (st != PULSE_OK) {
    rc = fail(a.key_path ? a.key_path : a.store, st);
    goto done;
  }
  a.o.key = key;
  if (a.rotate_path != NULL &&
      (st = rotate_key_get(a.rotate_path, &next_key)) != PULSE_OK) {
    rc = fail(a.rotate_path, st);
    goto done;
  }
  if ((rc = table_from_first(&a, &first, &info)) != 0)
    goto done;
  /* The server signs catch-ups with the key of the heads it will serve
   * (the new one, from the rotation on; it builds none before). */
  if (a.listen != NULL &&
      (rc = start_server(&a, next_key ? next_key : key, &srv)) != 0)
    goto done;
  if (a.up.target != NULL &&
      (st = pulse_upload_create(&a.up, &a.uploader)) != PULSE_OK) {
    rc = fail("--upload", st);
    goto done;
  }
  if ((st = pulse_pub_create(a.store, &a.o, &pub)) != PULSE_OK) {
    rc = fail(a.store, st);
    goto done;
  }
  int stopped = 0;
  if (next_key != NULL && (rc = rotate(&a, pub, next_key)) != 0)
    goto done;
  rc = publish_all(&a, pub, &first, &stop, &stopped);
  pulse_pub_figures f;
  if ((st = pulse_pub_flush(pub, &f)) != PULSE_OK && rc == 0)
    rc = fail("final anchor", st);
  else if (f.flush)
    print_figures(&f, a.json);
  if (rc == 0 && f.flush)
    rc = upload(&a);
  if (rc == 0 && srv != NULL && !a.exit_after && !stopped) {
    fprintf(stderr,
            "pulse-publish: published; serving until SIGINT or SIGTERM\n");
    int sig;
    sigwait(&stop, &sig);
  }
done:
  /* The server goes first: the publisher's last hook call was the flush. */
  pulse_server_free(srv);
  pulse_pub_free(pub);
  pulse_upload_free(a.uploader);
  pulse_st_model_close(first);
  free(info);
  pulse_sign_key_free(key);
  pulse_sign_key_free(next_key);
  return rc;
}
