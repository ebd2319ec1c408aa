/*
 * client.c: sbatch, salloc (allocator context) and srun (local context).
 *
 * Options are validated by their callbacks (options.c): a bad value makes
 * the callback return -1 and the command refuses the job with our message.
 * After option parsing the validated values are also put into this
 * process's environment: salloc's shell and sbatch with --export=ALL (the
 * default) pass them on, and srun forwards them to its tasks. slurmstepd
 * sets the same values again from the options it receives (remote.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "contexts.h"
#include "options.h"

int sr_client_init(spank_t sp, int argc, char **argv)
{
	return sr_options_init(sp, argc, argv, "init");
}

int sr_client_post_opt(spank_t sp)
{
	struct sr_env_var env[SR_OPT_COUNT];
	size_t i, n;

	(void)sp;
	if (!sr_options_ready())
		return 0;
	n = sr_request_env(sr_options_request(), sr_options_config(), env);
	for (i = 0; i < n; i++) {
		if (setenv(env[i].name, env[i].value, 1) < 0) {
			slurm_error("%s: post_opt: setenv %s: %s",
				    SR_LOG_PREFIX, env[i].name,
				    strerror(errno));
			return -1;
		}
	}
	return 0;
}
