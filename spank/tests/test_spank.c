/*
 * test_spank.c: unit-test driver for the plugin's pure modules (values.c,
 * config.c, request.c, journal.c). It links the same objects' sources that
 * the plugin does, without Slurm. Driven by tests/unit/test_spank_units.py:
 *
 *   test_spank list                 names of the self-tests
 *   test_spank run NAME             run one self-test (exit 0 = pass)
 *   test_spank format NODE JOB STEP TASK WAIT_STATUS
 *                                   print one task-exit record
 *   test_spank append PATH NODE WAIT_STATUS
 *                                   append one record to PATH
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "journal.h"
#include "request.h"
#include "values.h"

static int failures;

#define CHECK(cond)                                                          \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, \
				__LINE__, #cond);                            \
			failures++;                                          \
		}                                                            \
	} while (0)

#define CHECK_STR_HAS(hay, needle)                                           \
	do {                                                                 \
		if (strstr((hay), (needle)) == NULL) {                       \
			fprintf(stderr, "%s:%d: '%s' lacks '%s'\n", __FILE__,  \
				__LINE__, (hay), (needle));                  \
			failures++;                                          \
		}                                                            \
	} while (0)

static void test_count(void)
{
	static const char *const bad[] = { "", "-1", "+1", " 1", "1 ", "01",
					   "1e3", "0x10", "65", "9999999999",
					   "1.5", "abc" };
	char err[SR_ERR_MAX];
	unsigned long v = 99;
	size_t i;

	CHECK(sr_parse_count("--x", "0", 0, 64, &v, err, sizeof(err)) == 0);
	CHECK(v == 0);
	CHECK(sr_parse_count("--x", "64", 0, 64, &v, err, sizeof(err)) == 0);
	CHECK(v == 64);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 7;
		CHECK(sr_parse_count("--robust-spares", bad[i], 0, 64, &v, err,
				     sizeof(err)) == -1);
		CHECK(v == 7);
		CHECK_STR_HAS(err, "--robust-spares");
		CHECK_STR_HAS(err, "from 0 to 64");
	}
	CHECK(sr_parse_count("--x", NULL, 1, 5, &v, err, sizeof(err)) == -1);
	CHECK(sr_parse_count("--x", "0", 1, 5, &v, err, sizeof(err)) == -1);
	CHECK_STR_HAS(err, "out of range");
}

static void test_profile(void)
{
	static const char *const bad[] = { "", "-x", ".x", "a b", "(null)",
					   "a/b", "x\n",
					   "abcdefghijabcdefghijabcdefghijabc" };
	char out[SR_PROFILE_MAX + 1], err[SR_ERR_MAX];
	size_t i;

	CHECK(sr_parse_profile("--robust", "default", out, sizeof(out), err,
			       sizeof(err)) == 0);
	CHECK(strcmp(out, "default") == 0);
	CHECK(sr_parse_profile("--robust", "Big_1.b-2", out, sizeof(out), err,
			       sizeof(err)) == 0);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK(sr_parse_profile("--robust", bad[i], out, sizeof(out),
				       err, sizeof(err)) == -1);
		CHECK_STR_HAS(err, "--robust");
	}
	/* Control bytes never reach a log line. */
	CHECK(strchr(err, '\n') == NULL);
}

static void test_printable(void)
{
	char out[8];

	sr_printable("ab\x01\n", out, sizeof(out));
	CHECK(strcmp(out, "ab??") == 0);
	sr_printable("abcdefghijkl", out, sizeof(out));
	CHECK(strcmp(out, "abcd...") == 0);
	sr_printable(NULL, out, sizeof(out));
	CHECK(strcmp(out, "(none)") == 0);
}

static int parse(struct sr_config *cfg, char *err, int argc, ...)
{
	char *argv[16];
	va_list ap;
	int i;

	va_start(ap, argc);
	for (i = 0; i < argc && i < 16; i++)
		argv[i] = va_arg(ap, char *);
	va_end(ap);
	return sr_config_parse(cfg, argc, argv, err, SR_ERR_MAX);
}

static void test_config(void)
{
	struct sr_config cfg;
	char err[SR_ERR_MAX];

	CHECK(parse(&cfg, err, 0) == 0);
	CHECK(strcmp(cfg.journal, SR_DEFAULT_JOURNAL) == 0);
	CHECK(cfg.record == SR_RECORD_ALL);
	CHECK(strcmp(cfg.default_profile, "default") == 0);
	CHECK(cfg.max_spares == SR_SPARES_DEFAULT_MAX);

	CHECK(parse(&cfg, err, 6, "journal=/x/%n/%%j.jsonl", "task_exit=robust",
		    "default_profile=site", "max_spares=4", "default_spares=2",
		    "disable=robust-ckpt-every,--robust-hang-timeout") == 0);
	CHECK(strcmp(cfg.journal, "/x/%n/%%j.jsonl") == 0);
	CHECK(cfg.record == SR_RECORD_ROBUST);
	CHECK(strcmp(cfg.default_profile, "site") == 0);
	CHECK(cfg.max_spares == 4);
	CHECK(cfg.has_default[SR_OPT_SPARES] &&
	      cfg.default_value[SR_OPT_SPARES] == 2);
	CHECK(!cfg.disabled[SR_OPT_ROBUST] && !cfg.disabled[SR_OPT_SPARES]);
	CHECK(cfg.disabled[SR_OPT_CKPT_EVERY]);
	CHECK(cfg.disabled[SR_OPT_HANG_TIMEOUT]);

	CHECK(parse(&cfg, err, 1, "jornal=/x") == -1);
	CHECK_STR_HAS(err, "unknown plugstack argument 'jornal=/x'");
	CHECK_STR_HAS(err, "journal, task_exit");
	CHECK(parse(&cfg, err, 1, "verbose") == -1);
	CHECK(parse(&cfg, err, 2, "max_spares=1", "max_spares=2") == -1);
	CHECK_STR_HAS(err, "twice");
	CHECK(parse(&cfg, err, 1, "journal=rel/path") == -1);
	CHECK_STR_HAS(err, "absolute");
	CHECK(parse(&cfg, err, 1, "journal=/x/%j") == -1);
	CHECK_STR_HAS(err, "unknown escape");
	CHECK(parse(&cfg, err, 1, "task_exit=some") == -1);
	CHECK(parse(&cfg, err, 1, "disable=robust-foo") == -1);
	CHECK(parse(&cfg, err, 1, "disable=") == 0);
	CHECK(parse(&cfg, err, 2, "max_spares=1", "default_spares=2") == -1);
	CHECK_STR_HAS(err, "above max_spares=1");
	CHECK(parse(&cfg, err, 1, "default_hang_timeout=0") == -1);
	CHECK(parse(&cfg, err, 1, "default_profile=a b") == -1);
}

static void test_request(void)
{
	struct sr_config cfg;
	struct sr_request req;
	struct sr_env_var env[SR_OPT_COUNT];
	char err[SR_ERR_MAX];

	CHECK(parse(&cfg, err, 2, "max_spares=8", "default_hang_timeout=300")
	      == 0);
	memset(&req, 0, sizeof(req));
	CHECK(!sr_request_active(&req));
	CHECK(sr_request_env(&req, &cfg, env) == 0);

	CHECK(sr_request_set(&req, &cfg, SR_OPT_SPARES, "9", err,
			     sizeof(err)) == -1);
	CHECK_STR_HAS(err, "--robust-spares: 9 is out of range");
	CHECK(!sr_request_active(&req));
	CHECK(sr_request_set(&req, &cfg, SR_OPT_SPARES, "1", err,
			     sizeof(err)) == 0);
	CHECK(sr_request_set(&req, &cfg, SR_OPT_CKPT_EVERY, "0", err,
			     sizeof(err)) == -1);
	CHECK(sr_request_env(&req, &cfg, env) == 3);
	CHECK(strcmp(env[0].name, "SLURM_ROBUST") == 0);
	CHECK(strcmp(env[0].value, "default") == 0);
	CHECK(strcmp(env[1].name, "SLURM_ROBUST_SPARES") == 0);
	CHECK(strcmp(env[1].value, "1") == 0);
	CHECK(strcmp(env[2].name, "SLURM_ROBUST_HANG_TIMEOUT") == 0);
	CHECK(strcmp(env[2].value, "300") == 0);

	CHECK(sr_request_set(&req, &cfg, SR_OPT_ROBUST, NULL, err,
			     sizeof(err)) == 0);
	CHECK(strcmp(req.profile, "default") == 0);
	CHECK(sr_request_set(&req, &cfg, SR_OPT_ROBUST, "(null)", err,
			     sizeof(err)) == 0);
	CHECK(strcmp(req.profile, "default") == 0);
	CHECK(sr_request_set(&req, &cfg, SR_OPT_ROBUST, "(x)", err,
			     sizeof(err)) == -1);
	CHECK(sr_request_set(&req, &cfg, SR_OPT_ROBUST, "fast", err,
			     sizeof(err)) == 0);
	CHECK(sr_request_set(&req, &cfg, SR_OPT_HANG_TIMEOUT, "60", err,
			     sizeof(err)) == 0);
	CHECK(sr_request_env(&req, &cfg, env) == 3);
	CHECK(strcmp(env[0].value, "fast") == 0);
	CHECK(strcmp(env[2].value, "60") == 0);
}

static void test_expand(void)
{
	char out[64], err[SR_ERR_MAX];

	CHECK(sr_journal_expand("/a/%n/b%%n", "node1", out, sizeof(out), err,
				sizeof(err)) == 0);
	CHECK(strcmp(out, "/a/node1/b%n") == 0);
	CHECK(sr_journal_expand("/a/%n/%n", "node1", out, 12, err,
				sizeof(err)) == -1);
	CHECK(sr_journal_expand("/a/%x", "n", out, sizeof(out), err,
				sizeof(err)) == -1);
	CHECK(sr_node_name_check("node-1.a_b", err, sizeof(err)) == 0);
	CHECK(sr_node_name_check("..", err, sizeof(err)) == -1);
	CHECK(sr_node_name_check(".hidden", err, sizeof(err)) == -1);
	CHECK(sr_node_name_check("a/b", err, sizeof(err)) == -1);
	CHECK(sr_node_name_check("", err, sizeof(err)) == -1);
	CHECK(sr_node_name_check(NULL, err, sizeof(err)) == -1);
}

static void test_escape(void)
{
	char out[64];

	CHECK(sr_json_escape("a\"b\\c\n\x01\xc3", out, sizeof(out)) == 0);
	CHECK(strcmp(out, "a\\\"b\\\\c\\u000a\\u0001\\u00c3") == 0);
	CHECK(sr_json_escape("abcdef", out, 6) == -1);
	CHECK(sr_json_escape("abcde", out, 6) == 0);
}

static void test_steps(void)
{
	char out[24];

	sr_step_name(0xfffffffbU, out, sizeof(out));
	CHECK(strcmp(out, "batch") == 0);
	sr_step_name(0xfffffffcU, out, sizeof(out));
	CHECK(strcmp(out, "extern") == 0);
	sr_step_name(0xfffffffaU, out, sizeof(out));
	CHECK(strcmp(out, "interactive") == 0);
	sr_step_name(12, out, sizeof(out));
	CHECK(strcmp(out, "12") == 0);
}

static void test_format_small_buffer(void)
{
	struct sr_task_exit rec = { 1.5, "node1", 1, 0, 0, 0, 42, 9, 0 };
	char buf[64], err[SR_ERR_MAX];

	CHECK(sr_format_task_exit(&rec, buf, sizeof(buf), err, sizeof(err))
	      == -1);
	CHECK_STR_HAS(err, "does not fit");
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* A reader holding a flock on the (world-readable) journal does not stall
 * the append (finding 4); the separate 0600 lock file, which only the
 * writer's uid can open, is waited on within the deadline. */
static void test_lock_timeout(void)
{
	char dir[] = "/tmp/sr_spank_lockXXXXXX", path[256], lock[256];
	char err[SR_ERR_MAX];
	double t0, took;
	int fd, lfd;

	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/j.jsonl", dir);
	snprintf(lock, sizeof(lock), "%s/.j.jsonl.lock", dir);
	fd = open(path, O_RDONLY | O_CREAT, 0644);
	CHECK(fd >= 0);
	CHECK(flock(fd, LOCK_EX) == 0);
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == 0);
	close(fd);
	lfd = open(lock, O_RDONLY);
	CHECK(lfd >= 0);
	CHECK(flock(lfd, LOCK_EX) == 0);
	t0 = now_ms();
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == -1);
	took = now_ms() - t0;
	CHECK_STR_HAS(err, "stayed locked for 100 ms");
	CHECK(took >= 90.0 && took < 2000.0);
	close(lfd);
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == 0);
	unlink(path);
	unlink(lock);
	rmdir(dir);
}

/* No component of the path is followed as a link (finding 10), and a
 * directory others may write to (not sticky) is refused. */
static void test_path_components(void)
{
	char dir[] = "/tmp/sr_spank_walkXXXXXX", real[256], alias[256];
	char path[300], err[SR_ERR_MAX];

	CHECK(mkdtemp(dir) != NULL);
	snprintf(real, sizeof(real), "%s/real", dir);
	snprintf(alias, sizeof(alias), "%s/alias", dir);
	CHECK(mkdir(real, 0755) == 0);
	CHECK(symlink(real, alias) == 0);
	snprintf(path, sizeof(path), "%s/j.jsonl", alias);
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == -1);
	CHECK_STR_HAS(err, "symlink");
	snprintf(path, sizeof(path), "%s/j.jsonl", real);
	CHECK(chmod(real, 0777) == 0);
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == -1);
	CHECK_STR_HAS(err, "writable by others");
	CHECK(chmod(real, 0755) == 0);
	CHECK(sr_journal_append("rel/j.jsonl", "x\n", 2, 100, err,
				sizeof(err)) == -1);
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == 0);
	unlink(path);
	snprintf(path, sizeof(path), "%s/.j.jsonl.lock", real);
	unlink(path);
	unlink(alias);
	rmdir(real);
	rmdir(dir);
}

/* A FIFO at the journal path must not block (no reader) nor be written. */
static void test_fifo_refused(void)
{
	char dir[] = "/tmp/sr_spank_fifoXXXXXX", path[256], err[SR_ERR_MAX];

	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/j.jsonl", dir);
	CHECK(mkfifo(path, 0644) == 0);
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == -1);
	unlink(path);
	rmdir(dir);
}

static void test_untrusted_files(void)
{
	char dir[] = "/tmp/sr_spank_trustXXXXXX", path[256], alias[256];
	char err[SR_ERR_MAX];
	int fd;

	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/j.jsonl", dir);
	snprintf(alias, sizeof(alias), "%s/l.jsonl", dir);
	fd = open(path, O_WRONLY | O_CREAT, 0644);
	CHECK(fd >= 0 && fchmod(fd, 0666) == 0);
	close(fd);
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == -1);
	CHECK_STR_HAS(err, "not trusted");
	CHECK(chmod(path, 0644) == 0);
	CHECK(symlink(path, alias) == 0);
	CHECK(sr_journal_append(alias, "x\n", 2, 100, err, sizeof(err)) == -1);
	unlink(alias);
	CHECK(link(path, alias) == 0);
	CHECK(sr_journal_append(path, "x\n", 2, 100, err, sizeof(err)) == -1);
	CHECK_STR_HAS(err, "2 links");
	unlink(alias);
	unlink(path);
	rmdir(dir);
}

struct self_test {
	const char *name;
	void (*fn)(void);
};

static const struct self_test self_tests[] = {
	{ "count", test_count },
	{ "profile", test_profile },
	{ "printable", test_printable },
	{ "config", test_config },
	{ "request", test_request },
	{ "expand", test_expand },
	{ "escape", test_escape },
	{ "steps", test_steps },
	{ "format_small_buffer", test_format_small_buffer },
	{ "lock_timeout", test_lock_timeout },
	{ "path_components", test_path_components },
	{ "fifo_refused", test_fifo_refused },
	{ "untrusted_files", test_untrusted_files },
};

#define N_SELF_TESTS (sizeof(self_tests) / sizeof(self_tests[0]))

static int cmd_format(char **argv, const char *append_path)
{
	struct sr_task_exit rec;
	char line[SR_RECORD_MAX], err[SR_ERR_MAX];
	int n;

	memset(&rec, 0, sizeof(rec));
	rec.time = 1700000000.25;
	rec.node = argv[0];
	rec.job_id = (uint32_t)strtoul(argv[1], NULL, 10);
	rec.step_id = (uint32_t)strtoul(argv[2], NULL, 10);
	rec.task_id = (uint32_t)strtoul(argv[3], NULL, 10);
	rec.local_task_id = 0;
	rec.pid = 4242;
	rec.wait_status = (int)strtol(argv[4], NULL, 10);
	n = sr_format_task_exit(&rec, line, sizeof(line), err, sizeof(err));
	if (n < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	if (append_path == NULL) {
		fputs(line, stdout);
		return 0;
	}
	if (sr_journal_append(append_path, line, (size_t)n, SR_LOCK_TIMEOUT_MS,
			      err, sizeof(err)) < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	size_t i;

	if (argc == 2 && strcmp(argv[1], "list") == 0) {
		for (i = 0; i < N_SELF_TESTS; i++)
			printf("%s\n", self_tests[i].name);
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "run") == 0) {
		for (i = 0; i < N_SELF_TESTS; i++) {
			if (strcmp(argv[2], self_tests[i].name) == 0) {
				self_tests[i].fn();
				return failures ? 1 : 0;
			}
		}
		fprintf(stderr, "no self-test %s\n", argv[2]);
		return 2;
	}
	if (argc == 7 && strcmp(argv[1], "format") == 0)
		return cmd_format(argv + 2, NULL);
	if (argc == 5 && strcmp(argv[1], "append") == 0) {
		char *fargv[5] = { argv[3], "1", "0", "0", argv[4] };

		return cmd_format(fargv, argv[2]);
	}
	fprintf(stderr, "usage: %s list | run NAME | format NODE JOB STEP "
		"TASK WAIT_STATUS | append PATH NODE WAIT_STATUS\n", argv[0]);
	return 2;
}
