/*
 * config.h: the plugin's plugstack.conf arguments.
 *
 *   optional /path/slurm_robust_spank.so journal=/var/lib/x/%n/task_exit.jsonl \
 *       task_exit=all default_spares=1 max_spares=8 disable=robust-ckpt-every
 *
 * Pure (no Slurm calls): sr_config_parse fills a struct or says what is wrong.
 * An unknown or repeated key is an error, as in pyxis's config.c.
 */
#ifndef SLURM_ROBUST_SPANK_CONFIG_H
#define SLURM_ROBUST_SPANK_CONFIG_H

#include <stddef.h>

#include "common.h"

/* The job options, in the order they are registered and exported. */
enum sr_opt {
	SR_OPT_ROBUST = 0,	/* --robust[=PROFILE]           */
	SR_OPT_SPARES,		/* --robust-spares=K            */
	SR_OPT_CKPT_EVERY,	/* --robust-ckpt-every=N        */
	SR_OPT_HANG_TIMEOUT,	/* --robust-hang-timeout=SECONDS */
	SR_OPT_COUNT
};

/* Which task exits are written to the journal. */
enum sr_record_mode {
	SR_RECORD_ALL = 0,	/* every task of every step (default) */
	SR_RECORD_ROBUST,	/* only steps of jobs using --robust* */
	SR_RECORD_OFF		/* none                               */
};

struct sr_config {
	char journal[SR_PATH_MAX];	/* template: %n = node, %% = '%'  */
	enum sr_record_mode record;
	char default_profile[SR_PROFILE_MAX + 1];
	unsigned long max_spares;
	/* Site defaults exported when a job uses robust mode but leaves the
	 * option out; has_default[opt] says whether one was configured. */
	int has_default[SR_OPT_COUNT];
	unsigned long default_value[SR_OPT_COUNT];
	int disabled[SR_OPT_COUNT];
};

/* Long option name without dashes, e.g. "robust-spares". */
const char *sr_opt_name(enum sr_opt opt);

/* Environment variable that carries the option to the job, e.g.
 * "SLURM_ROBUST_SPARES". */
const char *sr_opt_env(enum sr_opt opt);

/* Fill cfg with the defaults, then apply argv (key=value words). Returns 0,
 * or -1 with a reason in err. */
int sr_config_parse(struct sr_config *cfg, int argc, char **argv, char *err,
		    size_t errlen);

/* Check a journal template (absolute, only %n and %% escapes, short enough). */
int sr_journal_template_check(const char *tmpl, char *err, size_t errlen);

#endif
