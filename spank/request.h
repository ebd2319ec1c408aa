/*
 * request.h: the robust options one job or step asked for, validated.
 *
 * Pure (no Slurm calls). The option callbacks store into one sr_request;
 * sr_request_env turns it into the environment variables the launcher reads.
 */
#ifndef SLURM_ROBUST_SPANK_REQUEST_H
#define SLURM_ROBUST_SPANK_REQUEST_H

#include <stddef.h>

#include "common.h"
#include "config.h"

struct sr_request {
	int given[SR_OPT_COUNT];
	char profile[SR_PROFILE_MAX + 1];	/* for SR_OPT_ROBUST     */
	unsigned long value[SR_OPT_COUNT];	/* for the numeric ones  */
};

/* Room for the longest value: a profile name or a decimal number. */
#define SR_ENV_VALUE_MAX (SR_PROFILE_MAX + 24)

struct sr_env_var {
	const char *name;
	char value[SR_ENV_VALUE_MAX];
};

/* Validate text as the value of opt (NULL or "" for a bare --robust) and
 * store it. Returns 0, or -1 with a message naming the option in err. */
int sr_request_set(struct sr_request *req, const struct sr_config *cfg,
		   enum sr_opt opt, const char *text, char *err,
		   size_t errlen);

/* 1 when any robust option was given. */
int sr_request_active(const struct sr_request *req);

/* Fill out[] with the variables to export and return how many: none when
 * the request is inactive; else SLURM_ROBUST (the profile, the site's
 * default_profile when only other options were given) and each numeric
 * option that was given or has a site default. */
size_t sr_request_env(const struct sr_request *req,
		      const struct sr_config *cfg,
		      struct sr_env_var out[SR_OPT_COUNT]);

#endif
