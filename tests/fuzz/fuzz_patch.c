/* fuzz_patch.c - libFuzzer target for the patch decoder: pulse_patch_open on
 * the input; when it opens, every tensor up to a size bound gets the
 * deterministic base of patch_testutil.h (the corpus seeds are encoded
 * against it), then decode_tensor, apply (partial table, and the full
 * table when every tensor is small), apply through class indexes, and a
 * one-patch squash run on copies.
 *
 * Besides memory errors (ASan/UBSan) it traps on broken promises: a decoded
 * change list out of range or not increasing, a failed apply that wrote, a
 * successful apply whose result differs from the decoded changes, an
 * indexed apply that ends otherwise than the plain one or leaves an index
 * that does not describe the weights, a squash output that does not open. */
#include "../codec/patch_testutil.h"

#define MAX_NUMEL (1ull << 22) /* per tensor */
#define MAX_TOTAL (1ull << 23) /* all tensors of one input */

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_patch: %s failed at line %d\n", #cond, __LINE__);  \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

typedef struct {
  int given;      /* small enough to get a base */
  uint16_t *base; /* pristine deterministic base */
  uint64_t numel;
  int decoded; /* decode_tensor succeeded */
  pulse_changes changes;
} tensor_state;

static int all_equal(const pulse_host_tensor *h, const tensor_state *ts,
                     size_t n, int to_target) {
  for (size_t i = 0; i < n; i++) {
    uint16_t *want = pt_copy(ts[i].base, ts[i].numel);
    if (to_target)
      pt_apply_changes(want, &ts[i].changes);
    int same = pt_first_diff(want, h[i].data, ts[i].numel) == PT_NONE;
    free(want);
    if (!same)
      return 0;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pulse_patch *p = NULL;
  if (pulse_patch_open(data, size, &p) != PULSE_OK) {
    CHECK(p == NULL);
    return 0;
  }
  size_t n = pulse_patch_tensor_count(p);
  tensor_state *ts = pt_alloc((n + 1) * sizeof *ts);
  pulse_host_tensor *h = pt_alloc((n + 1) * sizeof *h);
  size_t nh = 0; /* tensors given a base, in table order */
  uint64_t total = 0, changed_sum = 0;
  for (size_t i = 0; i < n; i++) {
    pulse_patch_tensor e;
    CHECK(pulse_patch_tensor_get(p, i, &e) == PULSE_OK);
    size_t idx = SIZE_MAX;
    CHECK(pulse_patch_tensor_find(p, e.info.name, &idx) == PULSE_OK &&
          idx == i);
    CHECK(e.changed <= e.numel);
    changed_sum += e.changed;
    if (e.numel > MAX_NUMEL || total + e.numel > MAX_TOTAL)
      continue;
    total += e.numel;
    tensor_state *t = &ts[i];
    t->given = 1;
    t->numel = e.numel;
    t->base = pt_alloc((size_t)e.numel * sizeof *t->base);
    for (uint64_t j = 0; j < e.numel; j++)
      t->base[j] = pt_fuzz_base_bits(i, j);
    t->changes = (pulse_changes)PULSE_CHANGES_INIT;
    CHECK(pulse_patch_decode_tensor(p, i, t->base, e.numel - 1, &t->changes) !=
          PULSE_OK);
    if (pulse_patch_decode_tensor(p, i, t->base, e.numel, &t->changes) ==
        PULSE_OK) {
      t->decoded = 1;
      CHECK(t->changes.count == e.changed);
      for (uint64_t j = 0; j < t->changes.count; j++) {
        CHECK(t->changes.pos[j] < e.numel);
        CHECK(j == 0 || t->changes.pos[j] > t->changes.pos[j - 1]);
        CHECK(t->changes.old_bits[j] == t->base[t->changes.pos[j]]);
        CHECK(t->changes.old_bits[j] != t->changes.new_bits[j]);
      }
    }
    h[nh].name = e.info.name;
    h[nh].numel = e.numel;
    nh++;
  }
  CHECK(changed_sum == pulse_patch_total_changed(p));

  /* Hosts hold copies of the bases of the tensors that got one. */
  tensor_state *hs = pt_alloc((nh + 1) * sizeof *hs);
  for (size_t i = 0, k = 0; i < n; i++)
    if (ts[i].given) {
      hs[k] = ts[i];
      h[k].data = pt_copy(ts[i].base, ts[i].numel);
      k++;
    }
  int all_decoded = 1;
  for (size_t k = 0; k < nh; k++)
    all_decoded &= hs[k].decoded;

  pulse_status st_partial = PULSE_OK;
  for (int partial = 1; partial >= 0; partial--) {
    if (!partial && nh != n)
      break;
    pulse_apply_opts ao;
    pulse_apply_opts_init(&ao);
    ao.partial_table = partial;
    ao.threads = partial ? 1 : 2;
    pulse_status st = pulse_patch_apply(p, h, nh, &ao);
    if (partial)
      st_partial = st;
    if (st == PULSE_OK) {
      CHECK(all_decoded);
      CHECK(all_equal(h, hs, nh, 1));
      for (size_t k = 0; k < nh; k++) /* back to the base */
        memcpy(h[k].data, hs[k].base, (size_t)hs[k].numel * 2);
    } else {
      CHECK(all_equal(h, hs, nh, 0));
    }
  }

  /* Through class indexes of the bases: the same status and result, and
   * the indexes still describe the weights, whichever they are. */
  pulse_class_index **ix = pt_alloc((nh + 1) * sizeof *ix);
  for (size_t k = 0; k < nh; k++)
    CHECK(pulse_class_index_build(h[k].data, h[k].numel, 1, &ix[k]) == PULSE_OK);
  pulse_apply_opts iao;
  pulse_apply_opts_init(&iao);
  iao.partial_table = 1;
  iao.class_index = ix;
  pulse_status ist = pulse_patch_apply(p, h, nh, &iao);
  CHECK(ist == st_partial);
  CHECK(all_equal(h, hs, nh, ist == PULSE_OK));
  for (size_t k = 0; k < nh; k++) {
    CHECK(pulse_class_index_check(ix[k], h[k].data, h[k].numel) == PULSE_OK);
    pulse_class_index_free(ix[k]);
    memcpy(h[k].data, hs[k].base, (size_t)hs[k].numel * 2);
  }
  free(ix);
  /* A chain of one: decodes every section and encodes it again. */
  if (nh == n) {
    const uint16_t **base = pt_alloc((n + 1) * sizeof *base);
    for (size_t i = 0; i < n; i++)
      base[i] = ts[i].base;
    pulse_encode_opts o;
    pulse_encode_opts_init(&o);
    o.chunk_log2 = pulse_patch_chunk_log2(p);
    for (int with_base = 0; with_base < 2; with_base++) {
      o.pos_model = with_base ? PULSE_POS_CLASS : PULSE_POS_PLAIN;
      pulse_buffer out = {NULL, 0};
      pulse_status st = pulse_patch_squash((const pulse_patch *const *)&p, 1,
                                           with_base ? base : NULL, &o, &out);
      if (st == PULSE_OK) {
        pulse_patch *q = NULL;
        CHECK(pulse_patch_open(out.data, out.size, &q) == PULSE_OK);
        CHECK(pulse_patch_step(q) == pulse_patch_step(p));
        CHECK(pulse_patch_tensor_count(q) == n);
        pulse_patch_free(q);
      }
      pulse_buffer_free(&out);
    }
    free(base);
  }

  for (size_t k = 0; k < nh; k++)
    free(h[k].data);
  for (size_t i = 0; i < n; i++) {
    free(ts[i].base);
    pulse_changes_free(&ts[i].changes);
  }
  free(hs);
  free(h);
  free(ts);
  pulse_patch_free(p);
  return 0;
}
