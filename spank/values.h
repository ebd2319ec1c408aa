/*
 * values.h: strict parsers for option values and plugstack arguments.
 *
 * Pure functions (no Slurm calls, no logging): each returns 0 on success or -1
 * with a one-line reason in err, so the caller decides where the message goes
 * (sbatch's stderr in allocator context, the slurmd log in slurmstepd).
 */
#ifndef SLURM_ROBUST_SPANK_VALUES_H
#define SLURM_ROBUST_SPANK_VALUES_H

#include <stddef.h>

/* Parse a plain decimal whole number in [min, max]: digits only, no sign, no
 * blanks, no leading zeros beyond a lone "0". `what` names the value in err. */
int sr_parse_count(const char *what, const char *text, unsigned long min,
		   unsigned long max, unsigned long *out, char *err,
		   size_t errlen);

/* Check a profile name ([A-Za-z0-9][A-Za-z0-9_.-]*, at most SR_PROFILE_MAX
 * bytes) and copy it to out (outlen > SR_PROFILE_MAX). */
int sr_parse_profile(const char *what, const char *text, char *out,
		     size_t outlen, char *err, size_t errlen);

/* Parse on/off style words: on|yes|true|1 and off|no|false|0. */
int sr_parse_bool(const char *what, const char *text, int *out, char *err,
		  size_t errlen);

/* Copy text for a log line: printable ASCII only (others become '?'), cut
 * with "..." when longer than outlen allows. Always NUL-terminates. */
void sr_printable(const char *text, char *out, size_t outlen);

#endif
