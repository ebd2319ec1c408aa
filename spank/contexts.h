/*
 * contexts.h: one handler per SPANK context, called by plugin.c's dispatcher.
 *
 *   client.c  sbatch/salloc (allocator) and srun (local): options, env
 *   remote.c  slurmstepd (root): env for the tasks, task-exit records
 */
#ifndef SLURM_ROBUST_SPANK_CONTEXTS_H
#define SLURM_ROBUST_SPANK_CONTEXTS_H

#include <slurm/spank.h>

int sr_client_init(spank_t sp, int argc, char **argv);
int sr_client_post_opt(spank_t sp);

int sr_remote_init(spank_t sp, int argc, char **argv);
int sr_remote_post_opt(spank_t sp);
int sr_remote_task_exit(spank_t sp);

#endif
