/* sim_dense.c - the dense baseline messages (sim_dense.h). */
#include <math.h>
#include <string.h>

#include "endian_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"
#include "sim_dense.h"

static const uint8_t MAGIC[4] = {'P', 'L', 'D', 'V'};
#define VERSION 1u

static inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Infinities and NaNs: every exponent bit set. */
static inline int f32_bits_finite(uint32_t u) {
  return (u & 0x7F800000u) != 0x7F800000u;
}

static unsigned width_of(pulse_sim_dense_values values) {
  return values == PULSE_SIM_DENSE_FP32   ? 4u
         : values == PULSE_SIM_DENSE_BF16 ? 2u
                                         : 0u;
}

size_t pulse_sim_dense_size(pulse_sim_dense_values values, uint64_t count) {
  unsigned w = width_of(values);
  if (w == 0 || count == 0 || count > PULSE_SIM_DENSE_MAX_COUNT ||
      count > (SIZE_MAX - PULSE_SIM_DENSE_HEADER) / w)
    return 0;
  return PULSE_SIM_DENSE_HEADER + (size_t)count * w;
}

pulse_status pulse_sim_dense_encode(const pulse_sim_dense_header *h,
                                   const float *x, uint8_t *out) {
  if (h == NULL || x == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "dense message: NULL argument");
  if (pulse_sim_dense_size(h->values, h->count) == 0 || h->samples == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "dense message: bad kind, count or samples");
  for (uint64_t i = 0; i < h->count; i++)
    if (!isfinite(x[i]) || (h->values == PULSE_SIM_DENSE_BF16 &&
                            !f32_bits_finite(pulse_f32_bits_from_bf16(
                                pulse_bf16_from_f32_bits(bits_of(x[i]))))))
      return pulse_fail(PULSE_ERR_ARG,
                        "dense message: value %llu of sender %u is not "
                        "finite in its kind (the run diverged)",
                        (unsigned long long)i, h->sender);
  memset(out, 0, PULSE_SIM_DENSE_HEADER);
  memcpy(out, MAGIC, 4);
  out[4] = VERSION;
  out[5] = (uint8_t)h->values;
  pulse_store_le32(out + 8, h->sender);
  pulse_store_le64(out + 16, h->step);
  pulse_store_le64(out + 24, h->samples);
  pulse_store_le64(out + 32, h->count);
  uint8_t *v = out + PULSE_SIM_DENSE_HEADER;
  if (h->values == PULSE_SIM_DENSE_FP32)
    for (uint64_t i = 0; i < h->count; i++)
      pulse_store_le32(v + 4 * i, bits_of(x[i]));
  else
    for (uint64_t i = 0; i < h->count; i++)
      pulse_store_le16(v + 2 * i, pulse_bf16_from_f32_bits(bits_of(x[i])));
  return PULSE_OK;
}

pulse_status pulse_sim_dense_decode(const uint8_t *data, size_t size,
                                   const pulse_sim_dense_header *want,
                                   pulse_sim_dense_header *got, float *x) {
  if ((data == NULL && size > 0) || want == NULL || x == NULL)
    return pulse_fail(PULSE_ERR_ARG, "dense message: NULL argument");
  if (size < PULSE_SIM_DENSE_HEADER)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "dense message: %zu bytes, the header alone is %u", size,
                      PULSE_SIM_DENSE_HEADER);
  if (memcmp(data, MAGIC, 4) != 0)
    return pulse_fail(PULSE_ERR_MAGIC, "dense message: no PLDV magic");
  if (data[4] != VERSION)
    return pulse_fail(PULSE_ERR_VERSION, "dense message: version %u", data[4]);
  pulse_sim_dense_header h;
  h.values = (pulse_sim_dense_values)data[5];
  h.sender = pulse_load_le32(data + 8);
  h.step = pulse_load_le64(data + 16);
  h.samples = pulse_load_le64(data + 24);
  h.count = pulse_load_le64(data + 32);
  if (pulse_load_le16(data + 6) != 0 || pulse_load_le32(data + 12) != 0 ||
      width_of(h.values) == 0 || h.samples == 0 || h.count == 0 ||
      h.count > PULSE_SIM_DENSE_MAX_COUNT)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "dense message: bad kind, reserved field, samples or "
                      "count");
  if (h.values != want->values)
    return pulse_fail(PULSE_ERR_DTYPE,
                      "dense message of sender %u: values of kind %u, %u "
                      "expected",
                      h.sender, (unsigned)h.values, (unsigned)want->values);
  if (h.step != want->step)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "dense message of sender %u: step %llu, %llu expected",
                      h.sender, (unsigned long long)h.step,
                      (unsigned long long)want->step);
  if (h.count != want->count)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "dense message of sender %u: %llu values, %llu expected",
                      h.sender, (unsigned long long)h.count,
                      (unsigned long long)want->count);
  size_t need = pulse_sim_dense_size(h.values, h.count);
  if (need == 0 || size < need)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "dense message of sender %u: %zu bytes, %zu expected",
                      h.sender, size, need);
  if (size > need)
    return pulse_fail(PULSE_ERR_TRAILING,
                      "dense message of sender %u: %zu bytes, %zu expected",
                      h.sender, size, need);
  const uint8_t *v = data + PULSE_SIM_DENSE_HEADER;
  uint64_t bad = h.count;
  if (h.values == PULSE_SIM_DENSE_FP32) {
    for (uint64_t i = 0; i < h.count; i++) {
      uint32_t u = pulse_load_le32(v + 4 * i);
      bad = f32_bits_finite(u) ? bad : i;
      x[i] = float_of(u);
    }
  } else {
    for (uint64_t i = 0; i < h.count; i++) {
      uint32_t u = pulse_f32_bits_from_bf16(pulse_load_le16(v + 2 * i));
      bad = f32_bits_finite(u) ? bad : i;
      x[i] = float_of(u);
    }
  }
  if (bad != h.count)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "dense message of sender %u: value %llu is not "
                      "finite",
                      h.sender, (unsigned long long)bad);
  if (got)
    *got = h;
  return PULSE_OK;
}
