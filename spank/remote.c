/*
 * remote.c: slurmstepd (root). Exports the validated options to the step's
 * tasks and writes one trusted record per task exit to the node's journal.
 *
 * Nothing here may crash or stall slurmstepd: every spank_get_item result is
 * checked, buffers are fixed-size with checked snprintf, and the journal
 * append is bounded (journal.c). A failure is logged and the record dropped;
 * the task and the step carry on.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "common.h"
#include "contexts.h"
#include "journal.h"
#include "options.h"

int sr_remote_init(spank_t sp, int argc, char **argv)
{
	return sr_options_init(sp, argc, argv, "slurmstepd init");
}

int sr_remote_post_opt(spank_t sp)
{
	struct sr_env_var env[SR_OPT_COUNT];
	char summary[SR_OPT_COUNT * (SR_ENV_VALUE_MAX + 32)] = "";
	size_t i, n, used = 0;
	uint32_t job = 0, step = 0;
	char step_name[24];
	spank_err_t rc;

	if (!sr_options_ready())
		return 0;
	n = sr_request_env(sr_options_request(), sr_options_config(), env);
	for (i = 0; i < n; i++) {
		rc = spank_setenv(sp, env[i].name, env[i].value, 1);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("%s: slurmstepd post_opt: setenv %s: %s",
				    SR_LOG_PREFIX, env[i].name,
				    spank_strerror(rc));
			return -1;
		}
		used += (size_t)snprintf(summary + used, sizeof(summary) - used,
					 " %s=%s", env[i].name, env[i].value);
		if (used >= sizeof(summary))	/* cut, never overrun */
			used = sizeof(summary) - 1;
	}
	/* One line per robust step and node: what the tasks were given. */
	if (n > 0 && spank_get_item(sp, S_JOB_ID, &job) == ESPANK_SUCCESS &&
	    spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS) {
		sr_step_name(step, step_name, sizeof(step_name));
		slurm_info("%s: slurmstepd: job %u step %s:%s", SR_LOG_PREFIX,
			   job, step_name, summary);
	}
	return 0;
}

/*
 * The node name comes from slurmstepd's own process environment, where
 * slurmstepd puts its slurmd's node name (measured on 22.05: correct for
 * every slurmd of a multiple-slurmd host). The job's environment
 * (spank_getenv) is NOT used: the user controls it, and srun forwards the
 * batch node's SLURMD_NODENAME to every node of a step.
 */
static int node_name(char *out, size_t len, char *err, size_t errlen)
{
	const char *env = getenv("SLURMD_NODENAME");

	if (env != NULL && env[0] != '\0') {
		if ((size_t)snprintf(out, len, "%s", env) >= len) {
			snprintf(err, errlen, "SLURMD_NODENAME is too long");
			return -1;
		}
	} else if (gethostname(out, len) < 0) {
		snprintf(err, errlen, "gethostname: %s", strerror(errno));
		return -1;
	}
	out[len - 1] = '\0';
	return sr_node_name_check(out, err, errlen);
}

/* 1 when this step's task exits should be recorded under task_exit=. */
static int wanted(spank_t sp, const struct sr_config *cfg)
{
	char buf[SR_PROFILE_MAX + 1];
	spank_err_t rc;

	if (cfg->record == SR_RECORD_OFF)
		return 0;
	if (cfg->record == SR_RECORD_ALL ||
	    sr_request_active(sr_options_request()))
		return 1;
	/* A step of a robust job run without options (srun inside the batch
	 * script) inherits SLURM_ROBUST from the batch step's environment. */
	rc = spank_getenv(sp, "SLURM_ROBUST", buf, sizeof(buf));
	return rc == ESPANK_SUCCESS || rc == ESPANK_NOSPACE;
}

static int get_u32(spank_t sp, spank_item_t item, const char *what,
		   uint32_t *out)
{
	spank_err_t rc = spank_get_item(sp, item, out);

	if (rc != ESPANK_SUCCESS) {
		slurm_error("%s: task_exit: cannot get %s: %s", SR_LOG_PREFIX,
			    what, spank_strerror(rc));
		return -1;
	}
	return 0;
}

/* Fill rec from the spank handle; returns 1 to record, 0 to skip, -1. */
static int gather(spank_t sp, struct sr_task_exit *rec)
{
	struct timespec now;
	spank_err_t rc;
	pid_t pid = 0;

	if (get_u32(sp, S_JOB_ID, "job id", &rec->job_id) < 0 ||
	    get_u32(sp, S_JOB_STEPID, "step id", &rec->step_id) < 0 ||
	    get_u32(sp, S_TASK_GLOBAL_ID, "global task id",
		    &rec->task_id) < 0 ||
	    get_u32(sp, S_SLURM_RESTART_COUNT, "restart count",
		    &rec->restart_count) < 0)
		return -1;
	/* The extern step's placeholder is killed at every job end: noise. */
	if (rec->step_id == SLURM_EXTERN_CONT)
		return 0;
	if ((rc = spank_get_item(sp, S_TASK_ID, &rec->local_task_id)) !=
	    ESPANK_SUCCESS ||
	    (rc = spank_get_item(sp, S_TASK_PID, &pid)) != ESPANK_SUCCESS ||
	    (rc = spank_get_item(sp, S_TASK_EXIT_STATUS, &rec->wait_status)) !=
	    ESPANK_SUCCESS) {
		slurm_error("%s: task_exit: cannot get task data: %s",
			    SR_LOG_PREFIX, spank_strerror(rc));
		return -1;
	}
	rec->pid = (long)pid;
	if (clock_gettime(CLOCK_REALTIME, &now) < 0) {
		slurm_error("%s: task_exit: clock_gettime: %s", SR_LOG_PREFIX,
			    strerror(errno));
		return -1;
	}
	rec->time = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
	return 1;
}

int sr_remote_task_exit(spank_t sp)
{
	const struct sr_config *cfg = sr_options_config();
	struct sr_task_exit rec;
	char node[SR_NODE_MAX], path[SR_PATH_MAX], line[SR_RECORD_MAX];
	char err[SR_ERR_MAX] = "";
	int n, rv = -1;

	memset(&rec, 0, sizeof(rec));
	if (!sr_options_ready() || !wanted(sp, cfg))
		return 0;
	if ((n = gather(sp, &rec)) <= 0)
		return n;
	if (node_name(node, sizeof(node), err, sizeof(err)) < 0)
		goto fail;
	rec.node = node;
	if (sr_journal_expand(cfg->journal, node, path, sizeof(path), err,
			      sizeof(err)) < 0)
		goto fail;
	if ((n = sr_format_task_exit(&rec, line, sizeof(line), err,
				     sizeof(err))) < 0)
		goto fail;
	if (sr_journal_append(path, line, (size_t)n, SR_LOCK_TIMEOUT_MS, err,
			      sizeof(err)) < 0)
		goto fail;
	slurm_debug("%s: task_exit: recorded job %u task %u status %d in %s",
		    SR_LOG_PREFIX, rec.job_id, rec.task_id, rec.wait_status,
		    path);
	rv = 0;
fail:
	if (rv < 0)
		slurm_error("%s: task_exit: job %u task %u: %s", SR_LOG_PREFIX,
			    rec.job_id, rec.task_id, err);
	return rv;
}
