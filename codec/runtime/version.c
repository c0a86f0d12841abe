/* version.c - the library's version (pulse_version.h, written by CMake). */
#include "pulse_version.h"

const char *pulse_version(void) { return PULSE_VERSION_STRING; }

unsigned pulse_version_number(void) { return PULSE_VERSION_NUMBER; }
