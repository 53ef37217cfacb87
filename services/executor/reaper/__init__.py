"""The reaper: one small process per executor process, the parent of every replica that executor starts, which
outlives the executor so that no replica's end is ever lost.

The executor starts it at its own start (`reaper_client.py`) and asks it, over a socket pair (its
descriptor's number is its argument), to start each replica; the reaper starts a child (below), which makes
itself the replica's first process: a new session, its folders (its working directory, its job's checkpoint and
output folders, its private /tmp: the executor makes none), the cgroup of its limits, stdin from /dev/null,
stdout and stderr to the executor's pipe, a mount namespace of its own where asked, its user (an
unprivileged one when the platform is root), its working directory, then exec. The reaper does not wait for a forked child's exec before starting the
next or reaping others (a burst of starts execs in parallel);
each child's error pipe says, at its end, that the exec succeeded, or why the child could not start. Before
it answers with the pid, the reaper writes the replica's pid file (pid and start time), so an attempt is never
started twice, even when the executor dies right after asking. Answers go in the order of the requests.

When a replica's first process ends, the reaper writes its status to `replica-<r>.exit` (atomically, before
anything else), then tells the executor. If the executor is gone, nothing waits on it: the file is there for
the next executor, which reports it (`LocalBackend.adopt`). The reaper also keeps a read end of each replica's
output pipe, so a replica whose executor died never gets SIGPIPE: its output waits in the pipe (the replica
blocks when the pipe is full) until the next executor opens the pipe through `/proc/<reaper>/fd/<n>`. What a
replica printed last while no executor read its pipe, the reaper appends to the replica's log file itself.
An exit file the disk refuses (full) is written again at every turn of the reaper's loop until the disk takes
it; the reaper does not exit before.

Where the executor built the start helper (`replica_start.c`, a shared library, `start_helper.py`; its path
is the reaper's second argument), the reaper starts a replica through it: a vfork (nothing of the reaper's
memory is copied) whose child takes the steps that only the process itself can take, in C, then execs the
command. Without it (no C compiler on the node, or a library that cannot be loaded), the reaper forks and
its child takes the same steps in Python: about 1.4 ms more CPU per replica (`benchmarks/start_costs.py`).

Every replica's first process is a child subreaper (PR_SET_CHILD_SUBREAPER, kept across exec): a descendant
whose parent ends (`setsid sleep 1000 &`, a double fork) is re-parented to it, not to init, so nothing of the
replica escapes while it runs. When that first process ends, its remaining descendants are re-parented to the
reaper (a subreaper too), which kills every child it did not start itself, until none is left: nothing of a
job outlives its end, with or without cgroups.

The reaper exits when its executor is gone and it has no child left. It ignores SIGTERM, SIGINT and SIGHUP
(an executor's restart, or a platform upgrade, never ends a job; the executor stops jobs itself when it is
asked to). This package imports only the standard library: it runs as `python -I -S reaper/__main__.py`,
imports all of its modules at its start, and keeps running the code it started with across an upgrade of the
platform.

Messages are JSON, one per SOCK_SEQPACKET packet. Executor → reaper: a start (`argv`, `env`, `cwd`,
`pid_file`, `exit_file`, `log_file`, `record`: more fields of the pid file, `user`: [uid, gid] or null,
`cgroup`: a path or null, `folders`: [[path, mode, uid, gid], …] or null, made first, in order, while it is
still the platform's user (`folders.py`: uid -1 the platform's; one already there kept when its owner's, given to
its owner when the platform's, refused otherwise), `binds`: [[source, target], …] or null, `read_only`:
[target, …] or null, and `hide_pids`: a mount namespace of the replica's own, made while it is still root,
with those folders bound over theirs, those of `read_only` then remounted read-only, and a proc with
hidepid=2)
with two descriptors (the pipe's write end, for the replica, and a read end the reaper keeps). Reaper →
executor: `{"pid", "start", "fd"}` or `{"error": errno, "step", "message"}` for each start, in order, and
`{"exited": pid, "status": n}` (a negative status: killed by signal -n) for each end. The steps a start's
error names: request, spawn, setup, folders, cgroup, namespace, user, cwd, exec, pid_file.

The modules: `loop.py` the reaper itself (its loop, the executor's requests and answers, the replicas' starts
and ends), `helper.py` the start helper's binding, `child.py` a forked child's steps in Python, `folders.py`
the folders it makes, `kernel.py` the Linux calls both make through libc, `files.py` what the reaper reads of /proc and how it writes the pid
and exit files. `__main__.py` runs it.
"""
