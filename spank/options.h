/*
 * options.h: the plugin's one piece of state -- its configuration and the
 * robust options of this job or step -- and the option registration.
 *
 * Slurm calls option callbacks without a spank handle, so the state is file
 * static, as in pyxis; each process (sbatch, srun, one slurmstepd) has its own.
 */
#ifndef SLURM_ROBUST_SPANK_OPTIONS_H
#define SLURM_ROBUST_SPANK_OPTIONS_H

#include <slurm/spank.h>

#include "config.h"
#include "request.h"

/* Parse the plugstack arguments and register the enabled options. Call from
 * slurm_spank_init in every context that uses the options (local, remote,
 * allocator), as spank_option_register requires. Returns 0 or -1 (logged). */
int sr_options_init(spank_t sp, int argc, char **argv, const char *phase);

/* 1 once sr_options_init succeeded; every later callback is a no-op before. */
int sr_options_ready(void);

const struct sr_config *sr_options_config(void);
const struct sr_request *sr_options_request(void);

#endif
