/* The partial route (issue 34): a worker whose targets hold some of the
 * published tensors fetches the patch's section index, its header and
 * table, and the sections of its tensors only, each verified; it ends bit
 * identical to the trainer. Every failure of that route (a server that
 * ignores Range, no index, a flipped byte in a section, an index signed by
 * another key or naming a wrong hash) falls back to the whole patch,
 * verified whole, and ends identical too. Bytes are counted by a proxy in
 * front of the server (range_proxy.c): what the server sent. */
#include <inttypes.h>

#include "inf_testutil.h"
#include "range_proxy.h"
#include "store_impl.h"
#include "store_sections_impl.h"

/* The two tensors the worker holds: embed.weight (about a third of the
 * elements) and layer.0.norm.bias: two of the four. */
static const int held[2] = {0, 2};

typedef struct {
  it_trainer t;
  range_proxy *proxy;
  char url[64];
  const char *urls[2];
  char *cache;
  pulse_sub *sub;
  uint16_t *data[2];
} fx;

static void fx_up(fx *f, int mode) {
  it_trainer_up(&f->t, 100, 8, 64);
  it_trainer_run(&f->t, 0, 0, 0.05);
  f->proxy = range_proxy_start(f->t.port, mode);
  cr_assert_not_null(f->proxy);
  snprintf(f->url, sizeof f->url, "http://127.0.0.1:%u", (unsigned)range_proxy_port(f->proxy));
  f->cache = tu_make_dir();
  pulse_sub_opts o = it_sub_opts(&f->t, f->cache, f->urls);
  f->urls[0] = f->url;
  cr_assert_eq(pulse_sub_create(&o, &f->sub), PULSE_OK, "%s", pulse_error_detail());
  for (int k = 0; k < 2; k++) {
    const pulse_tensor_info *in = &f->t.m.info[held[k]];
    f->data[k] = tu_alloc(f->t.m.numel[held[k]] * 2);
    cr_assert_eq(pulse_sub_attach_host(f->sub, in->name, in->ndim, in->shape, f->data[k]),
                 PULSE_OK, "%s", pulse_error_detail());
  }
  /* The anchor of step 0 (fetched whole, as anchors are). */
  cr_assert_eq(pulse_sub_sync(f->sub), PULSE_OK, "%s", pulse_sub_error(f->sub));
}

static void fx_down(fx *f) {
  pulse_sub_free(f->sub);
  range_proxy_stop(f->proxy);
  for (int k = 0; k < 2; k++)
    free(f->data[k]);
  tu_rm_rf(f->cache);
  it_trainer_down(&f->t);
}

static void expect_step(const fx *f, uint64_t step, const char *what) {
  cr_assert_eq(pulse_sub_step(f->sub), step, "%s", what);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(memcmp(f->data[k], f->t.bits[step][held[k]], f->t.m.numel[held[k]] * 2), 0,
                 "%s: '%s' is not step %" PRIu64, what, f->t.m.info[held[k]].name, step);
}

/* The head's newest patch. */
static pulse_store_object newest_patch(const fx *f) {
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f->t.dir, &h), PULSE_OK, "%s", pulse_error_detail());
  pulse_store_object o = *pulse_store_head_patch(h, pulse_store_head_patch_count(h) - 1);
  pulse_store_head_free(h);
  return o;
}

/* Commits the next step and syncs it; returns the bytes the server sent
 * for that sync and sets *size to the patch's size. */
static uint64_t step_and_sync(fx *f, uint64_t step, uint64_t *size) {
  it_trainer_run(&f->t, step, step, 0.05);
  *size = newest_patch(f).size;
  uint64_t before = range_proxy_bytes(f->proxy);
  cr_assert_eq(pulse_sub_sync(f->sub), PULSE_OK, "%s", pulse_sub_error(f->sub));
  return range_proxy_bytes(f->proxy) - before;
}

/* Four steps synced through the partial route, each bit identical and
 * at most the held tensors' share of the patch from the server. */
static void some_tensors(uint32_t format_version) {
  it_format_version = format_version;
  fx f;
  fx_up(&f, RANGE_PROXY_PASS);
  it_format_version = 0;
  /* The held tensors' share of the elements, which their sections follow. */
  uint64_t all = 0, mine = 0;
  for (int i = 0; i < TU_TENSORS; i++)
    all += f.t.m.numel[i];
  for (int k = 0; k < 2; k++)
    mine += f.t.m.numel[held[k]];
  for (uint64_t s = 1; s <= 4; s++) {
    uint64_t size = 0, got = step_and_sync(&f, s, &size);
    expect_step(&f, s, "along the chain");
    /* The head, the index and the headers of four requests come on top
     * of the header, table and sections: a few KiB. */
    cr_assert_lt(got, size * mine / all + 8192,
                 "step %" PRIu64 ": %" PRIu64 " bytes for a patch of %" PRIu64
                 " (the held share: %" PRIu64 ")",
                 s, got, size, size * mine / all);
    cr_log_info("step %" PRIu64 ": %" PRIu64 " bytes from the server for a patch of %" PRIu64
                " (held share %.0f%%)",
                s, got, size, 100.0 * (double)mine / (double)all);
  }
  cr_assert_geq(range_proxy_partials(f.proxy), 4);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.partial_fetches, 4, "%" PRIu64 " partial fetches", fig.partial_fetches);
  if (format_version != 0) {
    pulse_store_object o = newest_patch(&f);
    size_t n = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", f.t.dir, o.path);
    uint8_t *bytes = tu_read(path, &n);
    cr_assert_not_null(bytes, "%s", path);
    pulse_patch *p = NULL;
    cr_assert_eq(pulse_patch_open(bytes, n, &p), PULSE_OK, "%s",
                 pulse_error_detail());
    cr_assert_eq(pulse_patch_format_version(p), format_version);
    pulse_patch_free(p);
    free(bytes);
  }
  fx_down(&f);
}

Test(partial,
     a_worker_holding_some_tensors_fetches_their_sections_and_ends_identical) {
  some_tensors(0);
}

/* Version 3's value model closes the table: the header-and-table range
 * brings it, and the sections decode against it. */
Test(partial, version_3_patches_take_the_partial_route_too) {
  some_tensors(3);
}

Test(partial, a_server_that_ignores_range_sends_the_patch_whole_and_the_worker_ends_identical) {
  fx f;
  fx_up(&f, RANGE_PROXY_NO_RANGE);
  for (uint64_t s = 1; s <= 2; s++) {
    uint64_t size = 0, got = step_and_sync(&f, s, &size);
    expect_step(&f, s, "through a server without Range");
    cr_assert_geq(got, size, "the whole patch came");
    cr_assert_lt(got, 2 * size, "the patch came once: %" PRIu64 " bytes", got);
  }
  cr_assert_eq(range_proxy_partials(f.proxy), 0);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.partial_fetches, 0, "a whole patch counted as partial");
  fx_down(&f);
}

Test(partial, a_store_without_section_indexes_gives_whole_patches) {
  fx f;
  fx_up(&f, RANGE_PROXY_NO_SECTIONS);
  uint64_t size = 0, got = step_and_sync(&f, 1, &size);
  expect_step(&f, 1, "without an index");
  cr_assert_geq(got, size);
  cr_assert_geq(range_proxy_sections(f.proxy), 1, "the index was not asked for");
  fx_down(&f);
}

Test(partial, a_flipped_byte_in_a_section_is_refused_and_the_patch_comes_whole) {
  fx f;
  fx_up(&f, RANGE_PROXY_FLIP_SECTION);
  uint64_t size = 0, got = step_and_sync(&f, 1, &size);
  cr_assert_eq(range_proxy_flips(f.proxy), 1, "no section was flipped");
  expect_step(&f, 1, "after a flipped section");
  cr_assert_geq(got, size, "the whole patch came after the refusal");
  fx_down(&f);
}

/* Rewrites the newest patch's index: signed by `key`, with one byte of
 * section `k`'s hash flipped when k >= 0. */
static void forge_index(const fx *f, const pulse_sign_key *key, int k) {
  pulse_store_object o = newest_patch(f);
  char ppath[4096], rel[160], spath[4096];
  snprintf(ppath, sizeof ppath, "%s/%s", f->t.dir, o.path);
  store_sections_path(o.sha256, rel, sizeof rel);
  snprintf(spath, sizeof spath, "%s/%s", f->t.dir, rel);
  size_t n = 0;
  uint8_t *patch = tu_read(ppath, &n);
  cr_assert_not_null(patch);
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(store_sections_build(patch, n, o.sha256, key, &b), PULSE_OK, "%s",
               pulse_error_detail());
  if (k >= 0) {
    b.data[STORE_SECTIONS_FIXED + 32 * (size_t)k] ^= 1;
    /* Signed again, so that only the hash is wrong. */
    size_t body = b.size - PULSE_SIGN_SIGNATURE_BYTES, dl = strlen(STORE_SECTIONS_DOMAIN);
    uint8_t *msg = tu_alloc(dl + body);
    memcpy(msg, STORE_SECTIONS_DOMAIN, dl);
    memcpy(msg + dl, b.data, body);
    cr_assert_eq(pulse_sign(key, msg, dl + body, b.data + body), PULSE_OK);
    free(msg);
  }
  store_sections s;
  cr_assert_eq(store_sections_parse(b.data, b.size, &s), PULSE_OK, "the forgery parses");
  store_sections_free(&s);
  cr_assert_eq(tu_write(spath, b.data, b.size), 0);
  pulse_buffer_free(&b);
  free(patch);
}

Test(partial, an_index_signed_by_another_key_is_refused) {
  fx f;
  fx_up(&f, RANGE_PROXY_PASS);
  pulse_sign_key *other = NULL;
  cr_assert_eq(pulse_sign_key_generate(&other), PULSE_OK);
  it_trainer_run(&f.t, 1, 1, 0.05);
  forge_index(&f, other, -1);
  uint64_t size = newest_patch(&f).size, before = range_proxy_bytes(f.proxy);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_step(&f, 1, "after a forged index");
  cr_assert_geq(range_proxy_bytes(f.proxy) - before, size, "the whole patch came");
  cr_assert_eq(range_proxy_partials(f.proxy), 0, "sections were asked on a forged index");
  pulse_sign_key_free(other);
  fx_down(&f);
}

Test(partial, an_index_naming_a_wrong_section_hash_is_refused) {
  fx f;
  fx_up(&f, RANGE_PROXY_PASS);
  it_trainer_run(&f.t, 1, 1, 0.05);
  forge_index(&f, f.t.key, held[0]); /* the publisher's key, a wrong hash */
  uint64_t size = newest_patch(&f).size, before = range_proxy_bytes(f.proxy);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_step(&f, 1, "after a wrong section hash");
  cr_assert_geq(range_proxy_bytes(f.proxy) - before, size, "the whole patch came");
  cr_assert_geq(range_proxy_partials(f.proxy), 1, "the sections were not asked for");
  fx_down(&f);
}

Test(partial, a_worker_holding_every_tensor_fetches_whole_patches) {
  it_trainer t;
  it_trainer_up(&t, 100, 8, 64);
  it_trainer_run(&t, 0, 0, 0.05);
  range_proxy *proxy = range_proxy_start(t.port, RANGE_PROXY_PASS);
  char url[64], *cache = tu_make_dir();
  const char *urls[2];
  snprintf(url, sizeof url, "http://127.0.0.1:%u", (unsigned)range_proxy_port(proxy));
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets tg;
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  it_trainer_run(&t, 1, 2, 0.05);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 2));
  cr_assert_eq(range_proxy_partials(proxy), 0, "ranges asked by a worker holding everything");
  /* The first patch's index told it; the next patches are not asked. */
  cr_assert_leq(range_proxy_sections(proxy), 1, "%d indexes asked", range_proxy_sections(proxy));
  pulse_sub_free(sub);
  range_proxy_stop(proxy);
  it_targets_free(&tg);
  tu_rm_rf(cache);
  it_trainer_down(&t);
}

Test(partial, a_relay_mirrors_the_indexes_and_its_workers_take_the_partial_route) {
  it_trainer t;
  it_trainer_up(&t, 100, 8, 64);
  it_trainer_run(&t, 0, 0, 0.05);
  char *relay_cache = tu_make_dir(), *cache = tu_make_dir();
  const char *rurls[2], *urls[2];
  pulse_sub_opts ro = it_sub_opts(&t, relay_cache, rurls);
  ro.mirror = 1;
  pulse_sub *relay;
  cr_assert_eq(pulse_sub_create(&ro, &relay), PULSE_OK);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = relay_cache;
  so.threads = 2;
  so.watch = 1;
  pulse_server *rsrv;
  cr_assert_eq(pulse_server_create(&so, &rsrv), PULSE_OK);
  cr_assert_eq(pulse_sub_sync(relay), PULSE_OK, "%s", pulse_sub_error(relay));
  pulse_server_notify(rsrv, -1);
  range_proxy *proxy = range_proxy_start(pulse_server_port(rsrv), RANGE_PROXY_PASS);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u", (unsigned)range_proxy_port(proxy));
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  uint16_t *data[2];
  for (int k = 0; k < 2; k++) {
    const pulse_tensor_info *in = &t.m.info[held[k]];
    data[k] = tu_alloc(t.m.numel[held[k]] * 2);
    cr_assert_eq(pulse_sub_attach_host(sub, in->name, in->ndim, in->shape, data[k]), PULSE_OK);
  }
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  for (uint64_t s = 1; s <= 3; s++) {
    it_trainer_run(&t, s, s, 0.05);
    cr_assert_eq(pulse_sub_sync(relay), PULSE_OK, "%s", pulse_sub_error(relay));
    pulse_server_notify(rsrv, -1);
    cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
    cr_assert_eq(pulse_sub_step(sub), s);
    for (int k = 0; k < 2; k++)
      cr_assert_eq(memcmp(data[k], t.bits[s][held[k]], t.m.numel[held[k]] * 2), 0,
                   "'%s' is not step %" PRIu64 " through the relay", t.m.info[held[k]].name, s);
  }
  cr_assert_geq(range_proxy_partials(proxy), 3, "the workers of the relay fetched whole");
  /* The relay's cache is a store whose indexes check, and it keeps only
   * those of the patches its head names. */
  cr_assert_eq(pulse_store_verify(relay_cache, PULSE_STORE_VERIFY_HASHES, t.pub, NULL), PULSE_OK,
               "%s", pulse_error_detail());
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/sections", relay_cache);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(relay_cache, &h), PULSE_OK);
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "the relay kept no index");
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += e->d_name[0] != '.';
  closedir(d);
  cr_assert_eq(n, (int)pulse_store_head_patch_count(h));
  pulse_store_head_free(h);
  pulse_sub_free(sub);
  range_proxy_stop(proxy);
  pulse_server_free(rsrv);
  pulse_sub_free(relay);
  for (int k = 0; k < 2; k++)
    free(data[k]);
  tu_rm_rf(cache);
  tu_rm_rf(relay_cache);
  it_trainer_down(&t);
}

Test(partial, an_index_signed_before_a_key_rotation_is_taken_under_the_new_head) {
  /* Patch 1 and its index are signed by the first key; the head that
   * names it then rotates to a second key (its record signed by the
   * first): the worker that pinned the first key follows the rotation and
   * takes the index of the rotated-from key. */
  fx f;
  fx_up(&f, RANGE_PROXY_PASS);
  it_trainer_run(&f.t, 1, 1, 0.05);
  pulse_sign_key *k2 = NULL;
  cr_assert_eq(pulse_sign_key_generate(&k2), PULSE_OK);
  cr_assert_eq(pulse_pub_rotate_key(f.t.pub_, k2, NULL), PULSE_OK, "%s", pulse_error_detail());
  uint64_t size = newest_patch(&f).size, before = range_proxy_bytes(f.proxy);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_step(&f, 1, "across the rotation");
  cr_assert_lt(range_proxy_bytes(f.proxy) - before, size, "the patch came whole");
  cr_assert_geq(range_proxy_partials(f.proxy), 1);
  /* Patch 2 and its index under the new key. */
  uint64_t got = step_and_sync(&f, 2, &size);
  expect_step(&f, 2, "after the rotation");
  cr_assert_lt(got, size, "the patch came whole");
  pulse_pub_free(f.t.pub_); /* before the key it borrows */
  f.t.pub_ = NULL;
  pulse_sign_key_free(k2);
  fx_down(&f);
}
