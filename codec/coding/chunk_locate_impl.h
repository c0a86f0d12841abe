/* chunk_locate_impl.h - what the tests force of chunk_locate.c beside
 * chunk_impl.h's instruction sets. */
#ifndef PULSE_CHUNK_LOCATE_IMPL_H
#define PULSE_CHUNK_LOCATE_IMPL_H

#include "chunk_impl.h"

/* pulse_chunk_locate_isa's two-pass windows (AVX-512BW and BMI2): the
 * default where the CPU runs them; on one that does not, the reference's
 * loop. */
#define PULSE_CHUNK_LOCATE_WINDOW 4
/* The windows with pass 1 eight classes at a time (AVX-512 VBMI and
 * BITALG, GFNI): the default from 1/256 to 1/40 of a chunk changed;
 * forced, at any density; on a CPU without them, the reference's loop. */
#define PULSE_CHUNK_LOCATE_GROUPS 5

#endif
