/*
 * plugin.c: the SPANK entry points of slurm_robust. Each one only dispatches
 * on spank_context() to the file of that context (contexts.h).
 *
 * The plugin name below makes Slurm carry options to the remote side as
 * _SLURM_SPANK_OPTION_slurm_robust_<option> (an internal detail; the job
 * reads SLURM_ROBUST* variables, see README.md).
 */
#include <slurm/spank.h>

#include "contexts.h"

SPANK_PLUGIN(slurm_robust, 1);

int slurm_spank_init(spank_t sp, int argc, char **argv)
{
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return sr_client_init(sp, argc, argv);
	case S_CTX_REMOTE:
		return sr_remote_init(sp, argc, argv);
	default:
		/* slurmd itself and prolog/epilog: nothing to do. */
		return 0;
	}
}

int slurm_spank_init_post_opt(spank_t sp, int argc, char **argv)
{
	(void)argc;
	(void)argv;
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return sr_client_post_opt(sp);
	case S_CTX_REMOTE:
		return sr_remote_post_opt(sp);
	default:
		return 0;
	}
}

int slurm_spank_task_exit(spank_t sp, int argc, char **argv)
{
	(void)argc;
	(void)argv;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	return sr_remote_task_exit(sp);
}
