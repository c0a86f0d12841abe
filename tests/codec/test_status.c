/* Error details: a failure that wraps the detail of the one below it reads
 * whole (the wrapped text is not overwritten while it is formatted). Shape
 * checks: a shape is valid or not whatever the order of its dimensions. */
#include <criterion/criterion.h>
#include <string.h>

#include "status_impl.h"

Test(status, wrapping_the_previous_detail_keeps_it_whole) {
  pulse_fail(PULSE_ERR_CORRUPT, "chunk: stream length does not match its content");
  pulse_status st = pulse_fail(PULSE_ERR_CORRUPT, "tensor '%s' chunk %d: %s", "w", 3,
                               pulse_error_detail());
  st = pulse_fail(st, "apply: %s", pulse_error_detail());
  cr_assert_eq(st, PULSE_ERR_CORRUPT);
  cr_assert_str_eq(pulse_error_detail(),
                   "apply: tensor 'w' chunk 3: chunk: stream length does not match its content");
}

Test(status, long_details_are_cut_not_overrun) {
  char big[2000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  pulse_fail(PULSE_ERR_ARG, "%s", big);
  pulse_fail(PULSE_ERR_ARG, "outer: %s", pulse_error_detail());
  size_t n = strlen(pulse_error_detail());
  cr_assert(n > 100 && n < sizeof big, "%zu", n);
  cr_assert_eq(strncmp(pulse_error_detail(), "outer: xxx", 10), 0);
}

#include "pulse_codec.h"

Test(status, shape_overflow_does_not_depend_on_dimension_order) {
  const uint64_t big = 1ull << 40;
  const uint64_t orders[3][3] = {{big, big, 0}, {0, big, big}, {big, 0, big}};
  for (int i = 0; i < 3; i++) {
    uint64_t n = 7;
    cr_assert_eq(pulse_shape_numel(orders[i], 3, &n), PULSE_ERR_OVERFLOW, "order %d", i);
  }
  const uint64_t fine[3] = {0, 1ull << 31, 1ull << 31};
  uint64_t n = 7;
  cr_assert_eq(pulse_shape_numel(fine, 3, &n), PULSE_OK);
  cr_assert_eq(n, 0);
  const uint64_t full[2] = {1ull << 32, (1ull << 32) - 1};
  cr_assert_eq(pulse_shape_numel(full, 2, &n), PULSE_OK);
  cr_assert_eq(n, (1ull << 32) * ((1ull << 32) - 1));
}
