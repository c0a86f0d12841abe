/* cli_args.h - small command-line helpers shared by the programs in
 * tools/: "--name VALUE" / "--name=VALUE" options and strict number parsing.
 * Parsers return 0 on success and -1 on bad input, leaving the output alone;
 * they print nothing. Thread-safe: no shared state. */
#ifndef PULSE_CLI_ARGS_H
#define PULSE_CLI_ARGS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Matches the option `name` (e.g. "--params") at argv[*i], written either
 * as "--params VALUE" or "--params=VALUE".
 * @return 1 when it matches: *value points into argv and *i is advanced past
 *         a separate VALUE; 0 when argv[*i] is something else; -1 when it is
 *         this option but no value follows. */
int pulse_cli_opt_value(int argc, char **argv, int *i, const char *name,
                       const char **value);

/** 1 when `arg` is exactly the flag `name`, else 0. */
int pulse_cli_opt_flag(const char *arg, const char *name);

/** Parses a non-negative integer: decimal digits, optionally in scientific
 * form with an integral value ("1e7", "2.5e6"), optionally followed by one
 * decimal suffix k, M, G, T (10^3..10^12). Rejects signs, overflow and
 * trailing characters. */
int pulse_cli_parse_u64(const char *s, uint64_t *out);

/** Parses a finite double (strtod syntax, no trailing characters). */
int pulse_cli_parse_double(const char *s, double *out);

/** Parses a decimal int within [min, max]. */
int pulse_cli_parse_int(const char *s, int min, int max, int *out);

/** Prints "PROG: WHAT: message (NAME): detail" for a failed pulse call to
 * stderr, the detail being pulse_error_detail(). @return 1, the exit status
 * of a program that stops on it. */
int pulse_cli_fail(const char *prog, const char *what, int status);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_CLI_ARGS_H */
