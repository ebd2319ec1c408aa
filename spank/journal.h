/*
 * journal.h: the trusted task-exit record (docs/SCHEMAS.md,
 * slurm_robust.task_exit v1) and its append to the node's journal.
 *
 * Plain POSIX, no Slurm calls, so the unit-test harness exercises exactly
 * the code slurmstepd runs. Nothing here blocks without a bound: the lock is
 * taken with LOCK_NB in a loop up to a deadline, a FIFO or other non-regular
 * file at the path is refused (O_NONBLOCK open, then fstat), and the record
 * is one write() of a buffer whose size is checked.
 */
#ifndef SLURM_ROBUST_SPANK_JOURNAL_H
#define SLURM_ROBUST_SPANK_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define SR_TASK_EXIT_SCHEMA "slurm_robust.task_exit"
#define SR_TASK_EXIT_VERSION 1

/* How long task_exit may wait for the journal lock, in milliseconds. */
#define SR_LOCK_TIMEOUT_MS 500

struct sr_task_exit {
	double time;		/* Unix seconds                       */
	const char *node;	/* Slurm node name                    */
	uint32_t job_id;
	uint32_t step_id;	/* Slurm's, incl. SLURM_BATCH_SCRIPT  */
	uint32_t task_id;	/* global task id                     */
	int local_task_id;
	long pid;
	int wait_status;	/* raw status from wait()             */
	uint32_t restart_count;	/* times the job was requeued         */
};

/* "batch", "extern", "interactive", "pending", or the decimal step id. */
void sr_step_name(uint32_t step_id, char *buf, size_t len);

/* JSON string body of in (no quotes): escapes '"', '\\', control bytes and
 * bytes >= 0x80 (as \u00XX, so the line is always valid UTF-8 JSON).
 * Returns 0, or -1 when out is too small. */
int sr_json_escape(const char *in, char *out, size_t outlen);

/* A node name is 1 to SR_NODE_MAX-1 bytes of [A-Za-z0-9._-], not starting
 * with '.', so that it is safe as one path component. */
int sr_node_name_check(const char *node, char *err, size_t errlen);

/* Expand a journal template: %n becomes the node name, %% a '%'. */
int sr_journal_expand(const char *tmpl, const char *node, char *out,
		      size_t outlen, char *err, size_t errlen);

/* Format one record as a JSON line ending in '\n'. Returns its length, or
 * -1 with a reason in err. */
int sr_format_task_exit(const struct sr_task_exit *rec, char *buf,
			size_t len, char *err, size_t errlen);

/* Append line (len bytes) to path: walk the (absolute) path from "/" with
 * openat(O_NOFOLLOW) on every component, each directory owned by root or the
 * caller and sticky if others may write it (the last not writable by others
 * at all); create the parent directory (one level, mode 0755) and the file
 * (0644) if missing; refuse a symlink, a non-regular file, a file not owned
 * by the caller's euid, a group/world-writable file or one with several hard
 * links; lock the separate 0600 lock file ".<name>.lock" (never the readable
 * journal, which any user could flock) within lock_timeout_ms; write once.
 * Returns 0, or -1 with a reason in err. */
int sr_journal_append(const char *path, const char *line, size_t len,
		      int lock_timeout_ms, char *err, size_t errlen);

#endif
