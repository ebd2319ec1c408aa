/*
 * values.c: strict parsers for option values and plugstack arguments.
 */
#include "values.h"

#include <stdio.h>
#include <string.h>

#include "common.h"

/* Longest decimal text accepted: 20 digits would overflow unsigned long on
 * some platforms; every bound here is far below 10^9. */
#define SR_COUNT_DIGITS_MAX 9

/* How much of a rejected value is echoed back in a message. */
#define SR_ECHO_MAX 48

void sr_printable(const char *text, char *out, size_t outlen)
{
	static const char ellipsis[] = "...";
	size_t i = 0, n;

	if (outlen == 0)
		return;
	if (text == NULL) {
		snprintf(out, outlen, "(none)");
		return;
	}
	n = strlen(text);
	for (i = 0; i < n && i + 1 < outlen; i++) {
		unsigned char c = (unsigned char)text[i];
		out[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
	}
	out[i] = '\0';
	/* Mark a cut so a reader never mistakes a prefix for the value. */
	if (i < n && outlen > sizeof(ellipsis))
		memcpy(out + outlen - sizeof(ellipsis), ellipsis,
		       sizeof(ellipsis));
}

int sr_parse_count(const char *what, const char *text, unsigned long min,
		   unsigned long max, unsigned long *out, char *err,
		   size_t errlen)
{
	char shown[SR_ECHO_MAX];
	unsigned long value = 0;
	size_t i, n;

	if (text == NULL || text[0] == '\0') {
		snprintf(err, errlen, "%s needs a value: a whole number "
			 "from %lu to %lu", what, min, max);
		return -1;
	}
	n = strlen(text);
	for (i = 0; i < n; i++) {
		if (text[i] < '0' || text[i] > '9')
			break;
	}
	if (i < n || n > SR_COUNT_DIGITS_MAX || (n > 1 && text[0] == '0')) {
		sr_printable(text, shown, sizeof(shown));
		snprintf(err, errlen, "%s: '%s' is not a whole number from "
			 "%lu to %lu", what, shown, min, max);
		return -1;
	}
	for (i = 0; i < n; i++)
		value = value * 10 + (unsigned long)(text[i] - '0');
	if (value < min || value > max) {
		snprintf(err, errlen, "%s: %lu is out of range: give a whole "
			 "number from %lu to %lu", what, value, min, max);
		return -1;
	}
	*out = value;
	return 0;
}

static int profile_char_ok(char c, int first)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	    (c >= '0' && c <= '9'))
		return 1;
	return !first && (c == '_' || c == '-' || c == '.');
}

int sr_parse_profile(const char *what, const char *text, char *out,
		     size_t outlen, char *err, size_t errlen)
{
	char shown[SR_ECHO_MAX];
	size_t i, n;

	n = (text == NULL) ? 0 : strlen(text);
	if (n == 0 || n > SR_PROFILE_MAX || n >= outlen)
		goto bad;
	for (i = 0; i < n; i++) {
		if (!profile_char_ok(text[i], i == 0))
			goto bad;
	}
	memcpy(out, text, n + 1);
	return 0;
bad:
	sr_printable(text, shown, sizeof(shown));
	snprintf(err, errlen, "%s: '%s' is not a profile name: use 1 to %d "
		 "letters, digits, '_', '-' or '.', starting with a letter or "
		 "digit", what, shown, SR_PROFILE_MAX);
	return -1;
}

int sr_parse_bool(const char *what, const char *text, int *out, char *err,
		  size_t errlen)
{
	static const char *const yes[] = { "on", "yes", "true", "1" };
	static const char *const no[] = { "off", "no", "false", "0" };
	char shown[SR_ECHO_MAX];
	size_t i;

	for (i = 0; text != NULL && i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcmp(text, yes[i]) == 0) {
			*out = 1;
			return 0;
		}
		if (strcmp(text, no[i]) == 0) {
			*out = 0;
			return 0;
		}
	}
	sr_printable(text, shown, sizeof(shown));
	snprintf(err, errlen, "%s: '%s' is not on/off (also yes/no, "
		 "true/false, 1/0)", what, shown);
	return -1;
}
