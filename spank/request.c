/*
 * request.c: validate robust option values and derive the job environment.
 */
#include "request.h"

#include <stdio.h>
#include <string.h>

#include "values.h"

/* How Slurm spells a missing optional option argument it forwards. */
#define SR_SLURM_NULL_ARG "(null)"

int sr_request_set(struct sr_request *req, const struct sr_config *cfg,
		   enum sr_opt opt, const char *text, char *err,
		   size_t errlen)
{
	char what[64];
	unsigned long min = 0, max = 0;

	snprintf(what, sizeof(what), "--%s", sr_opt_name(opt));
	switch (opt) {
	case SR_OPT_ROBUST:
		/* A bare --robust means the site's default profile. Slurm
		 * 22.05 forwards a missing optional argument as the text
		 * "(null)" (through SLURM_SPANK_* in the job environment, read
		 * again by srun inside the job); it is no profile name, so
		 * reading it as "no value" is unambiguous. */
		if (text == NULL || text[0] == '\0' ||
		    strcmp(text, SR_SLURM_NULL_ARG) == 0)
			text = cfg->default_profile;
		if (sr_parse_profile(what, text, req->profile,
				     sizeof(req->profile), err, errlen) < 0)
			return -1;
		req->given[opt] = 1;
		return 0;
	case SR_OPT_SPARES:
		min = 0;
		max = cfg->max_spares;
		break;
	case SR_OPT_CKPT_EVERY:
		min = SR_CKPT_EVERY_MIN;
		max = SR_CKPT_EVERY_MAX;
		break;
	case SR_OPT_HANG_TIMEOUT:
		min = SR_HANG_TIMEOUT_MIN;
		max = SR_HANG_TIMEOUT_MAX;
		break;
	case SR_OPT_COUNT:
	default:
		snprintf(err, errlen, "internal: unknown option %d", (int)opt);
		return -1;
	}
	if (sr_parse_count(what, text, min, max, &req->value[opt], err,
			   errlen) < 0)
		return -1;
	req->given[opt] = 1;
	return 0;
}

int sr_request_active(const struct sr_request *req)
{
	int opt;

	for (opt = 0; opt < SR_OPT_COUNT; opt++) {
		if (req->given[opt])
			return 1;
	}
	return 0;
}

size_t sr_request_env(const struct sr_request *req,
		      const struct sr_config *cfg,
		      struct sr_env_var out[SR_OPT_COUNT])
{
	size_t n = 0;
	int opt;

	if (!sr_request_active(req))
		return 0;
	out[n].name = sr_opt_env(SR_OPT_ROBUST);
	snprintf(out[n].value, sizeof(out[n].value), "%s",
		 req->given[SR_OPT_ROBUST] ? req->profile
					   : cfg->default_profile);
	n++;
	for (opt = SR_OPT_ROBUST + 1; opt < SR_OPT_COUNT; opt++) {
		unsigned long v;

		if (req->given[opt])
			v = req->value[opt];
		else if (cfg->has_default[opt])
			v = cfg->default_value[opt];
		else
			continue;
		out[n].name = sr_opt_env((enum sr_opt)opt);
		snprintf(out[n].value, sizeof(out[n].value), "%lu", v);
		n++;
	}
	return n;
}
