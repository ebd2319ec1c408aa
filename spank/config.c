/*
 * config.c: parse the plugin's plugstack.conf arguments.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "values.h"

static const char *const opt_names[SR_OPT_COUNT] = {
	[SR_OPT_ROBUST] = "robust",
	[SR_OPT_SPARES] = "robust-spares",
	[SR_OPT_CKPT_EVERY] = "robust-ckpt-every",
	[SR_OPT_HANG_TIMEOUT] = "robust-hang-timeout",
};

static const char *const opt_envs[SR_OPT_COUNT] = {
	[SR_OPT_ROBUST] = "SLURM_ROBUST",
	[SR_OPT_SPARES] = "SLURM_ROBUST_SPARES",
	[SR_OPT_CKPT_EVERY] = "SLURM_ROBUST_CKPT_EVERY",
	[SR_OPT_HANG_TIMEOUT] = "SLURM_ROBUST_HANG_TIMEOUT",
};

/* The plugstack keys, each parsed by one handler. */
enum sr_key {
	KEY_JOURNAL = 0,
	KEY_TASK_EXIT,
	KEY_DEFAULT_PROFILE,
	KEY_MAX_SPARES,
	KEY_DEFAULT_SPARES,
	KEY_DEFAULT_CKPT_EVERY,
	KEY_DEFAULT_HANG_TIMEOUT,
	KEY_DISABLE,
	KEY_COUNT
};

static const char *const key_names[KEY_COUNT] = {
	[KEY_JOURNAL] = "journal",
	[KEY_TASK_EXIT] = "task_exit",
	[KEY_DEFAULT_PROFILE] = "default_profile",
	[KEY_MAX_SPARES] = "max_spares",
	[KEY_DEFAULT_SPARES] = "default_spares",
	[KEY_DEFAULT_CKPT_EVERY] = "default_ckpt_every",
	[KEY_DEFAULT_HANG_TIMEOUT] = "default_hang_timeout",
	[KEY_DISABLE] = "disable",
};

#define KEY_LIST "journal, task_exit, default_profile, max_spares, " \
	"default_spares, default_ckpt_every, default_hang_timeout, disable"

const char *sr_opt_name(enum sr_opt opt)
{
	return (opt < SR_OPT_COUNT) ? opt_names[opt] : "?";
}

const char *sr_opt_env(enum sr_opt opt)
{
	return (opt < SR_OPT_COUNT) ? opt_envs[opt] : "?";
}

int sr_journal_template_check(const char *tmpl, char *err, size_t errlen)
{
	size_t i, n = strlen(tmpl);

	if (tmpl[0] != '/') {
		snprintf(err, errlen, "journal: '%.200s' is not an absolute "
			 "path", tmpl);
		return -1;
	}
	if (n >= SR_PATH_MAX) {
		snprintf(err, errlen, "journal: path is %zu bytes, over the "
			 "%d-byte limit", n, SR_PATH_MAX - 1);
		return -1;
	}
	for (i = 0; i < n; i++) {
		if (tmpl[i] != '%')
			continue;
		if (tmpl[i + 1] == 'n' || tmpl[i + 1] == '%') {
			i++;
			continue;
		}
		snprintf(err, errlen, "journal: unknown escape '%%%c' in "
			 "'%.200s' (only %%n for the node name and %%%% for "
			 "'%%')", tmpl[i + 1] ? tmpl[i + 1] : '?', tmpl);
		return -1;
	}
	return 0;
}

static int parse_record_mode(const char *text, enum sr_record_mode *out,
			     char *err, size_t errlen)
{
	char shown[64];

	if (strcmp(text, "all") == 0)
		*out = SR_RECORD_ALL;
	else if (strcmp(text, "robust") == 0)
		*out = SR_RECORD_ROBUST;
	else if (strcmp(text, "off") == 0)
		*out = SR_RECORD_OFF;
	else {
		sr_printable(text, shown, sizeof(shown));
		snprintf(err, errlen, "task_exit: '%s' is not one of all, "
			 "robust, off", shown);
		return -1;
	}
	return 0;
}

/* disable=NAME[,NAME...]: each NAME is an option name, with or without the
 * leading "--". */
static int parse_disable(struct sr_config *cfg, const char *text, char *err,
			 size_t errlen)
{
	char word[64], shown[64];
	const char *p = text;

	while (*p != '\0') {
		size_t n = strcspn(p, ",");
		enum sr_opt opt;
		const char *w;

		if (n == 0 || n >= sizeof(word))
			goto bad;
		memcpy(word, p, n);
		word[n] = '\0';
		w = (strncmp(word, "--", 2) == 0) ? word + 2 : word;
		for (opt = 0; opt < SR_OPT_COUNT; opt++) {
			if (strcmp(w, opt_names[opt]) == 0)
				break;
		}
		if (opt == SR_OPT_COUNT)
			goto bad;
		cfg->disabled[opt] = 1;
		p += n;
		if (*p == ',')
			p++;
	}
	return 0;
bad:
	sr_printable(text, shown, sizeof(shown));
	snprintf(err, errlen, "disable: '%s' is not a comma list of robust, "
		 "robust-spares, robust-ckpt-every, robust-hang-timeout",
		 shown);
	return -1;
}

static int parse_default(struct sr_config *cfg, enum sr_opt opt,
			 const char *key, const char *text, unsigned long min,
			 unsigned long max, char *err, size_t errlen)
{
	if (sr_parse_count(key, text, min, max, &cfg->default_value[opt], err,
			   errlen) < 0)
		return -1;
	cfg->has_default[opt] = 1;
	return 0;
}

static int apply_key(struct sr_config *cfg, enum sr_key key,
		     const char *val, char *err, size_t errlen)
{
	const char *name = key_names[key];

	switch (key) {
	case KEY_JOURNAL:
		if (sr_journal_template_check(val, err, errlen) < 0)
			return -1;
		snprintf(cfg->journal, sizeof(cfg->journal), "%s", val);
		return 0;
	case KEY_TASK_EXIT:
		return parse_record_mode(val, &cfg->record, err, errlen);
	case KEY_DEFAULT_PROFILE:
		return sr_parse_profile(name, val, cfg->default_profile,
					sizeof(cfg->default_profile), err,
					errlen);
	case KEY_MAX_SPARES:
		return sr_parse_count(name, val, 0, SR_SPARES_HARD_MAX,
				      &cfg->max_spares, err, errlen);
	case KEY_DEFAULT_SPARES:
		return parse_default(cfg, SR_OPT_SPARES, name, val, 0,
				     SR_SPARES_HARD_MAX, err, errlen);
	case KEY_DEFAULT_CKPT_EVERY:
		return parse_default(cfg, SR_OPT_CKPT_EVERY, name, val,
				     SR_CKPT_EVERY_MIN, SR_CKPT_EVERY_MAX, err,
				     errlen);
	case KEY_DEFAULT_HANG_TIMEOUT:
		return parse_default(cfg, SR_OPT_HANG_TIMEOUT, name, val,
				     SR_HANG_TIMEOUT_MIN, SR_HANG_TIMEOUT_MAX,
				     err, errlen);
	case KEY_DISABLE:
		return parse_disable(cfg, val, err, errlen);
	case KEY_COUNT:
		break;
	}
	snprintf(err, errlen, "internal: unhandled key %d", (int)key);
	return -1;
}

static void config_defaults(struct sr_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->journal, sizeof(cfg->journal), "%s", SR_DEFAULT_JOURNAL);
	cfg->record = SR_RECORD_ALL;
	snprintf(cfg->default_profile, sizeof(cfg->default_profile), "%s",
		 SR_DEFAULT_PROFILE);
	cfg->max_spares = SR_SPARES_DEFAULT_MAX;
}

static int find_key(const char *arg, size_t keylen, enum sr_key *out)
{
	enum sr_key key;

	for (key = 0; key < KEY_COUNT; key++) {
		if (strlen(key_names[key]) == keylen &&
		    strncmp(arg, key_names[key], keylen) == 0) {
			*out = key;
			return 0;
		}
	}
	return -1;
}

int sr_config_parse(struct sr_config *cfg, int argc, char **argv, char *err,
		    size_t errlen)
{
	int seen[KEY_COUNT] = { 0 };
	char shown[64];
	int i;

	config_defaults(cfg);
	for (i = 0; i < argc; i++) {
		const char *eq = strchr(argv[i], '=');
		enum sr_key key;

		if (eq == NULL || find_key(argv[i], (size_t)(eq - argv[i]),
					   &key) < 0) {
			sr_printable(argv[i], shown, sizeof(shown));
			snprintf(err, errlen, "unknown plugstack argument '%s'; "
				 "valid keys: " KEY_LIST, shown);
			return -1;
		}
		if (seen[key]++ && key != KEY_DISABLE) {
			snprintf(err, errlen, "plugstack argument '%s' is given "
				 "twice", key_names[key]);
			return -1;
		}
		if (apply_key(cfg, key, eq + 1, err, errlen) < 0)
			return -1;
	}
	if (cfg->has_default[SR_OPT_SPARES] &&
	    cfg->default_value[SR_OPT_SPARES] > cfg->max_spares) {
		snprintf(err, errlen, "default_spares=%lu is above "
			 "max_spares=%lu", cfg->default_value[SR_OPT_SPARES],
			 cfg->max_spares);
		return -1;
	}
	return 0;
}
