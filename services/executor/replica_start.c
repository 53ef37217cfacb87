/* gpuyard-replica-start: a replica's first process takes its last steps, then becomes the replica's command.

   The reaper (reaper.py) starts it with posix_spawn, which has already made it a new session's leader, reset
   the signals the reaper ignores and given it stdin, stdout and stderr. It adds what only the process itself
   can do, in the order of the reaper's own forked child (its fallback):

     gpuyard-replica-start ERROR_FD CGROUP_DIR UID GID CWD COMMAND [ARG...]

   - becomes a child subreaper (PR_SET_CHILD_SUBREAPER, kept across exec), so that no descendant of the
     replica escapes it while it runs;
   - joins the cgroup CGROUP_DIR ("-": none);
   - drops every supplementary group and takes GID and UID ("-": keeps its own);
   - enters CWD, closes every descriptor above 2 but ERROR_FD, and execs COMMAND, looked up in the PATH of
     its environment (the replica's).

   A step that fails writes "STEP:ERRNO:MESSAGE" to ERROR_FD and exits 127; the exec closes ERROR_FD (close on
   exec), which tells the reaper that the replica has started. It is one process with the replica: no fork,
   nothing left running of its own. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PR_SET_CHILD_SUBREAPER
#define PR_SET_CHILD_SUBREAPER 36
#endif

static int error_fd = -1;

static void fail(const char *step, int err) {
    char line[512];
    int n = snprintf(line, sizeof line, "%s:%d:%s", step, err, strerror(err));
    if (error_fd >= 0 && n > 0) {
        ssize_t ignored = write(error_fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)ignored;
    }
    _exit(127);
}

static int number(const char *text, long *value) {
    char *end;
    errno = 0;
    *value = strtol(text, &end, 10);
    return errno == 0 && end != text && *end == '\0';
}

static void join_cgroup(const char *dir) {
    char path[4096], pid[32];
    if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= (int)sizeof path) fail("cgroup", ENAMETOOLONG);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) fail("cgroup", errno);
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (write(fd, pid, (size_t)n) != n) fail("cgroup", errno);
    close(fd);
}

/* Every descriptor above 2 but error_fd: close_range where the kernel has it (5.9), else /proc/self/fd. */
static void close_others(void) {
    unsigned int keep = (unsigned int)error_fd;
#ifdef SYS_close_range
    if ((keep <= 3 || syscall(SYS_close_range, 3u, keep - 1, 0u) == 0) &&
        syscall(SYS_close_range, keep + 1, ~0u, 0u) == 0)
        return;
#endif
    DIR *fds = opendir("/proc/self/fd");
    if (fds == NULL) fail("setup", errno);
    int own = dirfd(fds);
    struct dirent *entry;
    while ((entry = readdir(fds)) != NULL) {
        long fd;
        if (number(entry->d_name, &fd) && fd > 2 && fd != error_fd && fd != own) close((int)fd);
    }
    closedir(fds);
}

int main(int argc, char **argv) {
    long value;
    if (argc < 7 || !number(argv[1], &value) || value < 3) {
        fprintf(stderr, "usage: gpuyard-replica-start ERROR_FD CGROUP_DIR UID GID CWD COMMAND [ARG...]\n");
        return 127;
    }
    error_fd = (int)value;
    if (fcntl(error_fd, F_SETFD, FD_CLOEXEC) != 0) fail("setup", errno);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) fail("setup", errno);
    if (strcmp(argv[2], "-") != 0) join_cgroup(argv[2]);
    if (strcmp(argv[3], "-") != 0) {
        long uid, gid;
        if (!number(argv[3], &uid) || !number(argv[4], &gid)) fail("user", EINVAL);
        if (setgroups(0, NULL) != 0) fail("user", errno);
        if (setgid((gid_t)gid) != 0) fail("user", errno);
        if (setuid((uid_t)uid) != 0) fail("user", errno);
    }
    if (chdir(argv[5]) != 0) fail("cwd", errno);
    close_others();
    execvp(argv[6], argv + 6);
    fail("exec", errno);
    return 127;
}
