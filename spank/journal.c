/*
 * journal.c: format task-exit records and append them to the node journal.
 */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Slurm's special step ids (slurm/slurm.h), repeated so that this file
 * builds without the Slurm headers in the unit-test harness. */
#define SR_STEP_PENDING 0xfffffffdU
#define SR_STEP_EXTERN 0xfffffffcU
#define SR_STEP_BATCH 0xfffffffbU
#define SR_STEP_INTERACTIVE 0xfffffffaU

/* Pause between two attempts to take the journal lock. */
#define SR_LOCK_POLL_NS 2000000L

void sr_step_name(uint32_t step_id, char *buf, size_t len)
{
	switch (step_id) {
	case SR_STEP_BATCH:
		snprintf(buf, len, "batch");
		break;
	case SR_STEP_EXTERN:
		snprintf(buf, len, "extern");
		break;
	case SR_STEP_INTERACTIVE:
		snprintf(buf, len, "interactive");
		break;
	case SR_STEP_PENDING:
		snprintf(buf, len, "pending");
		break;
	default:
		snprintf(buf, len, "%" PRIu32, step_id);
		break;
	}
}

int sr_json_escape(const char *in, char *out, size_t outlen)
{
	size_t o = 0;
	const unsigned char *p;

	for (p = (const unsigned char *)in; *p != '\0'; p++) {
		char tmp[8];
		size_t n;

		if (*p == '"' || *p == '\\') {
			tmp[0] = '\\';
			tmp[1] = (char)*p;
			n = 2;
		} else if (*p < 0x20 || *p >= 0x7f) {
			snprintf(tmp, sizeof(tmp), "\\u%04x", (unsigned)*p);
			n = 6;
		} else {
			tmp[0] = (char)*p;
			n = 1;
		}
		if (o + n >= outlen)
			return -1;
		memcpy(out + o, tmp, n);
		o += n;
	}
	if (o >= outlen)
		return -1;
	out[o] = '\0';
	return 0;
}

int sr_node_name_check(const char *node, char *err, size_t errlen)
{
	size_t i, n = (node == NULL) ? 0 : strlen(node);

	if (n == 0 || n >= SR_NODE_MAX || node[0] == '.')
		goto bad;
	for (i = 0; i < n; i++) {
		char c = node[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		      c == '-'))
			goto bad;
	}
	return 0;
bad:
	snprintf(err, errlen, "node name is not a safe path component "
		 "(1 to %d of [A-Za-z0-9._-], not starting with '.')",
		 SR_NODE_MAX - 1);
	return -1;
}

int sr_journal_expand(const char *tmpl, const char *node, char *out,
		      size_t outlen, char *err, size_t errlen)
{
	size_t o = 0, nlen = strlen(node);
	const char *p;

	for (p = tmpl; *p != '\0'; p++) {
		const char *piece = p;
		size_t n = 1;

		if (p[0] == '%' && p[1] == 'n') {
			piece = node;
			n = nlen;
			p++;
		} else if (p[0] == '%' && p[1] == '%') {
			p++;
		} else if (p[0] == '%') {
			snprintf(err, errlen, "journal: unknown escape in "
				 "'%.200s'", tmpl);
			return -1;
		}
		if (o + n >= outlen) {
			snprintf(err, errlen, "journal: expanded path is over "
				 "%zu bytes", outlen - 1);
			return -1;
		}
		memcpy(out + o, piece, n);
		o += n;
	}
	out[o] = '\0';
	return 0;
}

int sr_format_task_exit(const struct sr_task_exit *rec, char *buf,
			size_t len, char *err, size_t errlen)
{
	char node[SR_NODE_MAX * 6 + 1], step[24], exit_code[16], sig[16];
	int st = rec->wait_status, core = 0, n;

	if (sr_json_escape(rec->node, node, sizeof(node)) < 0) {
		snprintf(err, errlen, "node name too long to record");
		return -1;
	}
	sr_step_name(rec->step_id, step, sizeof(step));
	snprintf(exit_code, sizeof(exit_code), "null");
	snprintf(sig, sizeof(sig), "null");
	if (WIFEXITED(st)) {
		snprintf(exit_code, sizeof(exit_code), "%d", WEXITSTATUS(st));
	} else if (WIFSIGNALED(st)) {
		snprintf(sig, sizeof(sig), "%d", WTERMSIG(st));
		core = WCOREDUMP(st) ? 1 : 0;
	}
	n = snprintf(buf, len,
		     "{\"schema\":\"%s\",\"v\":%d,\"time\":%.6f,"
		     "\"node\":\"%s\",\"job_id\":\"%" PRIu32 "\","
		     "\"step_id\":\"%s\",\"task_id\":%" PRIu32 ","
		     "\"local_task_id\":%d,\"pid\":%ld,\"wait_status\":%d,"
		     "\"exit_code\":%s,\"signal\":%s,\"core_dumped\":%s,"
		     "\"restart_count\":%" PRIu32 "}\n",
		     SR_TASK_EXIT_SCHEMA, SR_TASK_EXIT_VERSION, rec->time, node,
		     rec->job_id, step, rec->task_id, rec->local_task_id,
		     rec->pid, st, exit_code, sig, core ? "true" : "false",
		     rec->restart_count);
	if (n < 0 || (size_t)n >= len) {
		snprintf(err, errlen, "record does not fit in %zu bytes", len);
		return -1;
	}
	return n;
}

/* A directory on the way to the journal: owned by root or by us, and if
 * others may write to it, sticky (so they cannot rename our entries). The
 * journal's own directory must not be writable by others at all. */
static int check_dir(int fd, const char *name, int last, char *err,
		     size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		snprintf(err, errlen, "fstat %s: %s", name, strerror(errno));
		return -1;
	}
	if (st.st_uid != 0 && st.st_uid != geteuid()) {
		snprintf(err, errlen, "directory %s is owned by uid %u, not root; "
			 "journal path refused", name, (unsigned)st.st_uid);
		return -1;
	}
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) &&
	    (last || !(st.st_mode & S_ISVTX))) {
		snprintf(err, errlen, "directory %s is writable by others (mode "
			 "%04o); journal path refused", name,
			 (unsigned)(st.st_mode & 07777));
		return -1;
	}
	return 0;
}

/* Walk path's directories from "/" with openat(O_NOFOLLOW) on every
 * component, checking each (check_dir); create the last one (0755) if it is
 * missing. Returns a descriptor of the journal's directory and points *base
 * at the file name inside buf, or -1 with a reason in err. */
static int open_parent(const char *path, char *buf, size_t buflen,
		       const char **base, char *err, size_t errlen)
{
	char *comp, *next, *slash;
	int dirfd, fd;

	if (path[0] != '/') {
		snprintf(err, errlen, "journal path %s is not absolute", path);
		return -1;
	}
	if (snprintf(buf, buflen, "%s", path) >= (int)buflen) {
		snprintf(err, errlen, "journal path too long");
		return -1;
	}
	slash = strrchr(buf, '/');
	*slash = '\0';
	*base = slash + 1;
	if (**base == '\0' || strcmp(*base, ".") == 0 || strcmp(*base, "..") == 0) {
		snprintf(err, errlen, "journal path %s names no file", path);
		return -1;
	}
	dirfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0 || check_dir(dirfd, "/", buf[0] == '\0', err, errlen) < 0)
		goto fail;
	for (comp = buf + 1; comp < slash && *comp; comp = next) {
		next = strchr(comp, '/');
		if (next != NULL)
			*next++ = '\0';
		else
			next = slash;
		if (*comp == '\0' || strcmp(comp, ".") == 0)
			continue;
		if (strcmp(comp, "..") == 0) {
			snprintf(err, errlen, "journal path %s has '..'", path);
			goto fail;
		}
		fd = openat(dirfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
			    O_CLOEXEC);
		if (fd < 0 && errno == ENOENT && next >= slash) {
			/* One level only: a missing grandparent means a wrong
			 * journal= path, reported as such. */
			if (mkdirat(dirfd, comp, 0755) < 0 && errno != EEXIST) {
				snprintf(err, errlen, "cannot create directory "
					 "%s: %s", comp, strerror(errno));
				goto fail;
			}
			fd = openat(dirfd, comp, O_RDONLY | O_DIRECTORY |
				    O_NOFOLLOW | O_CLOEXEC);
		}
		if (fd < 0 && errno == ENOENT) {
			snprintf(err, errlen, "cannot create directory of %s: "
				 "%s is missing (a wrong journal= path?)", path,
				 comp);
			goto fail;
		}
		if (fd < 0) {
			snprintf(err, errlen, "open directory %s of %s: %s%s",
				 comp, path, strerror(errno),
				 (errno == ELOOP || errno == ENOTDIR) ?
				 " (a symlink or not a directory: refused)" : "");
			goto fail;
		}
		close(dirfd);
		dirfd = fd;
		if (check_dir(dirfd, comp, next >= slash, err, errlen) < 0)
			goto fail;
	}
	return dirfd;
fail:
	if (dirfd >= 0)
		close(dirfd);
	return -1;
}

/* Refuse a journal a user could have planted or could write to. */
static int check_file(int fd, const char *path, char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		snprintf(err, errlen, "fstat %s: %s", path, strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s is not a regular file", path);
		return -1;
	}
	if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) ||
	    st.st_nlink != 1) {
		snprintf(err, errlen, "%s is not trusted (owner uid %u, mode "
			 "%04o, %lu links; want uid %u, not group/world "
			 "writable, 1 link)", path, (unsigned)st.st_uid,
			 (unsigned)(st.st_mode & 07777),
			 (unsigned long)st.st_nlink, (unsigned)geteuid());
		return -1;
	}
	return 0;
}

static double monotonic_ms(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
		return 0.0;
	return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* flock with a deadline: LOCK_NB attempts, SR_LOCK_POLL_NS apart. */
static int lock_bounded(int fd, const char *path, int timeout_ms, char *err,
			size_t errlen)
{
	const struct timespec pause = { 0, SR_LOCK_POLL_NS };
	double deadline = monotonic_ms() + (double)timeout_ms;

	for (;;) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK && errno != EINTR) {
			snprintf(err, errlen, "flock %s: %s", path,
				 strerror(errno));
			return -1;
		}
		if (monotonic_ms() >= deadline) {
			snprintf(err, errlen, "%s stayed locked for %d ms; "
				 "record dropped", path, timeout_ms);
			return -1;
		}
		nanosleep(&pause, NULL);
	}
}

int sr_journal_append(const char *path, const char *line, size_t len,
		      int lock_timeout_ms, char *err, size_t errlen)
{
	char dir[SR_PATH_MAX], lockname[SR_PATH_MAX];
	const char *base = NULL;
	int rv = -1, fd = -1, lockfd = -1, dirfd;
	ssize_t n;

	dirfd = open_parent(path, dir, sizeof(dir), &base, err, errlen);
	if (dirfd < 0)
		return -1;
	/* The lock is a separate 0600 file of ours: the journal itself is
	 * readable by everyone, and any reader could flock it and stall us. */
	if (snprintf(lockname, sizeof(lockname), ".%s.lock", base) >=
	    (int)sizeof(lockname)) {
		snprintf(err, errlen, "journal name too long");
		goto fail;
	}
	lockfd = openat(dirfd, lockname, O_RDONLY | O_CREAT | O_CLOEXEC |
			O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0600);
	if (lockfd < 0) {
		snprintf(err, errlen, "open %s/%s: %s", dir, lockname,
			 strerror(errno));
		goto fail;
	}
	if (check_file(lockfd, lockname, err, errlen) < 0)
		goto fail;
	if (lock_bounded(lockfd, lockname, lock_timeout_ms, err, errlen) < 0)
		goto fail;
	fd = openat(dirfd, base, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC |
		    O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
	if (fd < 0) {
		snprintf(err, errlen, "open %s: %s", path, strerror(errno));
		goto fail;
	}
	if (check_file(fd, path, err, errlen) < 0)
		goto fail;
	do {
		n = write(fd, line, len);
	} while (n < 0 && errno == EINTR);
	if (n < 0 || (size_t)n != len) {
		snprintf(err, errlen, "write %s: %s (%zd of %zu bytes)", path,
			 n < 0 ? strerror(errno) : "short write", n, len);
		goto fail;
	}
	rv = 0;
fail:
	if (fd >= 0 && close(fd) < 0 && rv == 0) {
		snprintf(err, errlen, "close %s: %s", path, strerror(errno));
		rv = -1;
	}
	/* close() also drops the lock. */
	if (lockfd >= 0)
		close(lockfd);
	close(dirfd);
	return rv;
}
