/*
 * common.h: shared limits and names of the slurm_robust SPANK plugin.
 *
 * Everything here is plain C with no Slurm dependency, so the pure modules
 * (values.c, config.c, journal.c) build into the unit-test harness as well.
 */
#ifndef SLURM_ROBUST_SPANK_COMMON_H
#define SLURM_ROBUST_SPANK_COMMON_H

#include <stddef.h>

/* Prefix of every log line the plugin writes, so its lines in slurmd's log are found by
 * one grep. */
#define SR_LOG_PREFIX "slurm_robust"

/* Bounds of the option values (inclusive). The upper bounds keep hostile or
 * mistyped values from reaching the launcher; a site may lower the spares
 * bound further with max_spares= in plugstack.conf. */
#define SR_SPARES_HARD_MAX 1024UL
#define SR_SPARES_DEFAULT_MAX 64UL
#define SR_CKPT_EVERY_MIN 1UL
#define SR_CKPT_EVERY_MAX 1000000UL
#define SR_HANG_TIMEOUT_MIN 1UL
#define SR_HANG_TIMEOUT_MAX 604800UL /* one week, in seconds */

/* A profile name: [A-Za-z0-9][A-Za-z0-9_.-]*, at most this many bytes. */
#define SR_PROFILE_MAX 32
#define SR_DEFAULT_PROFILE "default"

/* Longest journal path after expansion, and longest node name. */
#define SR_PATH_MAX 1024
#define SR_NODE_MAX 256

/* One task-exit record is far below this; snprintf into it is checked. */
#define SR_RECORD_MAX 1024

/* Size of the error-message buffers the pure modules fill in. */
#define SR_ERR_MAX 256

/* Default journal, per node (docs/SCHEMAS.md, slurm_robust.task_exit). */
#define SR_DEFAULT_JOURNAL "/var/lib/slurm_robust/task_exit.jsonl"

#endif
