/* The start helper: a shared library the reaper (reaper/helper.py) loads, whose function (`gpuyard_start`, or
   `gpuyard_start_private` for a replica with a mount namespace of its own) starts a replica's first process
   with vfork, as CPython's _posixsubprocess does for subprocess: nothing of the reaper's memory is
   copied, and the child takes, in C, the steps that only the process itself can take before its exec:

   - every signal the reaper catches or ignores back to its default action;
   - a new session (its own process group);
   - a child subreaper (PR_SET_CHILD_SUBREAPER, kept across exec), so that no descendant of the replica
     escapes it while it runs;
   - while it is still the platform's user, the folders `folders` names, in order (its working directory, its
     job's checkpoint and output folders, its private /tmp, and the platform's folders above them), each with
     its mode and owner, as reaper/folders.py's `make_folders` (step "folders"): the executor makes none;
   - the cgroup `cgroup_procs` names (NULL: none);
   - stdin, stdout and stderr;
   - with `gpuyard_start_private`, while it is still root: a mount namespace of its own, whose mounts receive
     the host's (slave) and send nothing back, the folders `binds` names bound over theirs (its private /tmp,
     its volumes), those `read_only` names remounted read-only (a write there fails with EROFS) and, with
     `hide_pids`, a proc of its own on /proc with hidepid=2 (only its own user's processes): the
     reaper's own mounts are untouched (step "namespace" when one cannot be made);
   - no supplementary group, then `gid` and `uid` (-1: its own), with the raw system calls: the C library's
     wrappers would synchronise with the parent's threads, whose memory a vfork child shares;
   - its working directory; every other descriptor closed but `error_fd`; no signal blocked;
   - exec of each of `paths` in turn (the parent looked the command up on the replica's PATH), with `argv`
     and `envp`.

   The child allocates nothing and returns to no caller: it execs, or writes "STEP:ERRNO:MESSAGE" to
   `error_fd` and exits 127. `error_fd` is closed on exec, which tells the reaper the replica has started.
   The parent blocks every signal around vfork, so that none of the reaper's handlers runs in the child. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PR_SET_CHILD_SUBREAPER
#define PR_SET_CHILD_SUBREAPER 36
#endif
#ifdef SYS_setresuid32 /* (32-bit ABIs: the calls of 32-bit ids) */
#define SETRESUID SYS_setresuid32
#define SETRESGID SYS_setresgid32
#define SETGROUPS SYS_setgroups32
#else
#define SETRESUID SYS_setresuid
#define SETRESGID SYS_setresgid
#define SETGROUPS SYS_setgroups
#endif

struct gpuyard_start {
    char *const *paths; /* the command's candidates, in order, NULL-terminated */
    char *const *argv;
    char *const *envp;
    int stdin_fd, output_fd, error_fd;
    const char *cgroup_procs;
    long uid, gid;
    const char *cwd;
    char *const *folders; /* the folders to make before anything else, in order, NULL-terminated (NULL: none) */
    const long *folder_ids; /* for each of them: its mode, uid and gid (-1: the platform's) */
};

/* What `gpuyard_start_private` adds: pairs of folders, each bound over the second (source, target, …,
   NULL), in order; `hide_pids`: a proc of its own with hidepid=2 on /proc; `read_only`: targets of those
   remounted read-only after them (NULL-terminated; NULL: none). */
struct gpuyard_private {
    char *const *binds;
    int hide_pids;
    char *const *read_only;
};

static size_t append(char *line, size_t at, size_t size, const char *text) {
    while (*text && at + 1 < size) line[at++] = *text++;
    line[at] = '\0';
    return at;
}

/* `value` (>= 0) in decimal into `out` (room for 24 characters), without the C library's formatting. */
static size_t decimal(char *out, long value) {
    char digits[24];
    size_t n = 0;
    do digits[n++] = (char)('0' + value % 10), value /= 10;
    while (value && n < sizeof digits - 1);
    for (size_t i = 0; i < n; i++) out[i] = digits[n - 1 - i];
    out[n] = '\0';
    return n;
}

static void fail(int error_fd, const char *step, int err) __attribute__((noreturn));
static void fail(int error_fd, const char *step, int err) {
    char line[256], number[24];
    decimal(number, err < 0 ? 0 : err);
    size_t at = append(line, 0, sizeof line, step);
    at = append(line, at, sizeof line, ":");
    at = append(line, at, sizeof line, number);
    at = append(line, at, sizeof line, ":");
    at = append(line, at, sizeof line, strerror(err)); /* (glibc: a constant table, no allocation) */
    ssize_t ignored = write(error_fd, line, at);
    (void)ignored;
    _exit(127);
}

/* Every descriptor above 2 but `keep`: close_range where the kernel has it (5.9), else the open ones listed
   by getdents64 into a buffer on the stack. */
static int close_others(int keep) {
#ifdef SYS_close_range
    if ((keep <= 3 || syscall(SYS_close_range, 3u, (unsigned)keep - 1, 0u) == 0) &&
        syscall(SYS_close_range, (unsigned)keep + 1, ~0u, 0u) == 0)
        return 0;
#endif
    int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return -1;
    char buffer[4096];
    for (;;) {
        long got = syscall(SYS_getdents64, dir, buffer, sizeof buffer);
        if (got <= 0) break;
        for (long at = 0; at < got;) {
            struct {
                unsigned long long ino;
                long long off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *entry = (void *)(buffer + at);
            int fd = 0, digits = 0;
            for (const char *c = entry->name; *c >= '0' && *c <= '9'; c++, digits++) fd = fd * 10 + (*c - '0');
            if (digits && entry->name[digits] == '\0' && fd > 2 && fd != keep && fd != dir) close(fd);
            at += entry->reclen;
        }
    }
    close(dir);
    return 0;
}

/* The folders of `s->folders` (step "folders"): each made with its mode (whatever the umask) and given to its
   uid and gid (-1: left the platform's); one already there is kept when it is a folder, not a link, of its
   owner-to-be, given to it when the platform owns it, refused with EEXIST otherwise. No link is followed: each
   is in a folder of the platform's that no job can write in. */
static void make_folders(const struct gpuyard_start *s) {
    uid_t platform = geteuid();
    for (size_t i = 0; s->folders != NULL && s->folders[i] != NULL; i++) {
        const char *path = s->folders[i];
        mode_t mode = (mode_t)s->folder_ids[3 * i];
        long uid = s->folder_ids[3 * i + 1], gid = s->folder_ids[3 * i + 2];
        if (mkdir(path, mode) != 0) {
            struct stat found;
            uid_t owner = uid < 0 ? platform : (uid_t)uid;
            if (errno != EEXIST || lstat(path, &found) != 0) fail(s->error_fd, "folders", errno);
            if (!S_ISDIR(found.st_mode) || (found.st_uid != owner && found.st_uid != platform))
                fail(s->error_fd, "folders", EEXIST);
            if (found.st_uid == owner) continue;
        }
        if ((uid >= 0 && fchownat(AT_FDCWD, path, (uid_t)uid, (gid_t)gid, AT_SYMLINK_NOFOLLOW) != 0) ||
            chmod(path, mode) != 0)
            fail(s->error_fd, "folders", errno);
    }
}

/* A mount namespace of its own (step "namespace"): the caller is root. A read-only remount keeps the nosuid,
   nodev and noexec of the bound folder's mount (statfs's `f_flags`, a plain system call, unlike statvfs,
   which may read /proc/mounts: the ST_ flags have the MS_ values). */
static void private_mounts(int error_fd, const struct gpuyard_private *p) {
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
        fail(error_fd, "namespace", errno);
    for (char *const *pair = p->binds; pair != NULL && pair[0] != NULL && pair[1] != NULL; pair += 2)
        if (mount(pair[0], pair[1], NULL, MS_BIND | MS_REC, NULL) != 0) fail(error_fd, "namespace", errno);
    for (char *const *target = p->read_only; target != NULL && *target != NULL; target++) {
        struct statfs found;
        if (statfs(*target, &found) != 0) fail(error_fd, "namespace", errno);
        unsigned long kept = (unsigned long)found.f_flags & (MS_NOSUID | MS_NODEV | MS_NOEXEC);
        if (mount(NULL, *target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | kept, NULL) != 0)
            fail(error_fd, "namespace", errno);
    }
    if (p->hide_pids && mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2") != 0)
        fail(error_fd, "namespace", errno);
}

static void child(const struct gpuyard_start *s, const struct gpuyard_private *p) __attribute__((noreturn));
static void child(const struct gpuyard_start *s, const struct gpuyard_private *p) {
    int err = 0;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction now;
        if (sig != SIGKILL && sig != SIGSTOP && sigaction(sig, NULL, &now) == 0 && now.sa_handler != SIG_DFL)
            sigaction(sig, &dfl, NULL);
    }
    if (setsid() < 0) fail(s->error_fd, "setup", errno);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) fail(s->error_fd, "setup", errno);
    make_folders(s); /* (before its cgroup: their kernel memory is not charged to the job's) */
    if (s->cgroup_procs != NULL) {
        int fd = open(s->cgroup_procs, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) fail(s->error_fd, "cgroup", errno);
        char pid[24];
        size_t n = decimal(pid, (long)getpid());
        if (write(fd, pid, n) != (ssize_t)n) fail(s->error_fd, "cgroup", errno);
        close(fd);
    }
    if (dup2(s->stdin_fd, 0) < 0 || dup2(s->output_fd, 1) < 0 || dup2(s->output_fd, 2) < 0)
        fail(s->error_fd, "setup", errno);
    if (p != NULL) private_mounts(s->error_fd, p);
    if (s->uid >= 0) {
        if (syscall(SETGROUPS, 0, NULL) != 0 || syscall(SETRESGID, s->gid, s->gid, s->gid) != 0 ||
            syscall(SETRESUID, s->uid, s->uid, s->uid) != 0)
            fail(s->error_fd, "user", errno);
    }
    if (chdir(s->cwd) != 0) fail(s->error_fd, "cwd", errno);
    if (close_others(s->error_fd) != 0 || fcntl(s->error_fd, F_SETFD, FD_CLOEXEC) != 0)
        fail(s->error_fd, "setup", errno);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (char *const *path = s->paths; *path != NULL; path++) {
        execve(*path, s->argv, s->envp);
        if (err == 0 && errno != ENOENT && errno != ENOTDIR) err = errno; /* (as os.execvpe: the first
                                                                              other error, else the last) */
        if (path[1] == NULL && err == 0) err = errno;
    }
    fail(s->error_fd, "exec", err ? err : ENOENT);
}

static long start(const struct gpuyard_start *s, const struct gpuyard_private *p) {
    sigset_t all, before;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &before);
    pid_t pid = vfork();
    if (pid == 0) child(s, p);
    int err = errno;
    sigprocmask(SIG_SETMASK, &before, NULL);
    return pid < 0 ? -(long)err : (long)pid;
}

/* The child's pid, or -errno when vfork failed. */
long gpuyard_start(const struct gpuyard_start *s) { return start(s, NULL); }

/* The same, in a mount namespace of its own (`p`), made before it leaves root. */
long gpuyard_start_private(const struct gpuyard_start *s, const struct gpuyard_private *p) { return start(s, p); }
