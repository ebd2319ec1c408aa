/*
 * options.c: plugstack configuration, option table and option callbacks.
 */
#include "options.h"

#include <stdio.h>
#include <string.h>

#include "common.h"

static struct {
	int ready;
	struct sr_config cfg;
	struct sr_request req;
} state;

static int option_cb(int val, const char *optarg, int remote);

/* Usage text shown by --help; arginfo is the word after '='. */
static struct spank_option option_table[SR_OPT_COUNT] = {
	[SR_OPT_ROBUST] = {
		"robust", "[PROFILE]",
		"Run under slurm_robust fault tolerance; PROFILE names the "
		"site's settings (default: the site default profile). Sets "
		"SLURM_ROBUST in the job.", 2, SR_OPT_ROBUST, option_cb },
	[SR_OPT_SPARES] = {
		"robust-spares", "K",
		"Keep K warm spare nodes inside the allocation (implies "
		"--robust). Sets SLURM_ROBUST_SPARES.", 1, SR_OPT_SPARES,
		option_cb },
	[SR_OPT_CKPT_EVERY] = {
		"robust-ckpt-every", "N",
		"Snapshot training state every N steps (implies --robust). "
		"Sets SLURM_ROBUST_CKPT_EVERY.", 1, SR_OPT_CKPT_EVERY,
		option_cb },
	[SR_OPT_HANG_TIMEOUT] = {
		"robust-hang-timeout", "SECONDS",
		"Treat SECONDS without training progress as a hang (implies "
		"--robust). Sets SLURM_ROBUST_HANG_TIMEOUT.", 1,
		SR_OPT_HANG_TIMEOUT, option_cb },
};

static int option_cb(int val, const char *optarg, int remote)
{
	char err[SR_ERR_MAX];

	if (!state.ready || val < 0 || val >= SR_OPT_COUNT)
		return -1;
	if (sr_request_set(&state.req, &state.cfg, (enum sr_opt)val, optarg,
			   err, sizeof(err)) < 0) {
		/* In sbatch/srun this reaches the user's terminal and the
		 * non-zero return refuses the job; in slurmstepd it goes to
		 * the slurmd log and the value is not exported. */
		slurm_error("%s: %s: %s", SR_LOG_PREFIX,
			    remote ? "slurmstepd" : "option", err);
		return -1;
	}
	return 0;
}

int sr_options_init(spank_t sp, int argc, char **argv, const char *phase)
{
	char err[SR_ERR_MAX];
	spank_err_t rc;
	int opt;

	memset(&state, 0, sizeof(state));
	if (sr_config_parse(&state.cfg, argc, argv, err, sizeof(err)) < 0) {
		slurm_error("%s: %s: plugstack.conf: %s", SR_LOG_PREFIX, phase,
			    err);
		return -1;
	}
	state.ready = 1;
	for (opt = 0; opt < SR_OPT_COUNT; opt++) {
		if (state.cfg.disabled[opt])
			continue;
		rc = spank_option_register(sp, &option_table[opt]);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("%s: %s: cannot register --%s: %s",
				    SR_LOG_PREFIX, phase, option_table[opt].name,
				    spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

int sr_options_ready(void)
{
	return state.ready;
}

const struct sr_config *sr_options_config(void)
{
	return &state.cfg;
}

const struct sr_request *sr_options_request(void)
{
	return &state.req;
}
