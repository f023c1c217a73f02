#define _GNU_SOURCE
#include <fcntl.h>
#include "CUploadSystem.h"

int upload_o_direct_flag(void) {
#ifdef O_DIRECT
    return O_DIRECT;
#else
    return 0;
#endif
}

#if defined(__GLIBC__)
#include <malloc.h>
#endif

int upload_set_malloc_thresholds(int mmap_bytes, int trim_bytes, int arenas) {
#if defined(__GLIBC__)
    return mallopt(M_MMAP_THRESHOLD, mmap_bytes) && (trim_bytes <= 0 || mallopt(M_TRIM_THRESHOLD, trim_bytes))
        && (arenas <= 0 || mallopt(M_ARENA_MAX, arenas));
#else
    (void)mmap_bytes;
    (void)trim_bytes;
    (void)arenas;
    return 0;
#endif
}

// The commit a release is built from: tools/package writes build_commit.h (git-ignored) for its build, so that only this
// file is compiled again, not every C target as a -D flag would.
#if __has_include("build_commit.h")
#include "build_commit.h"
#endif
#ifndef UPLOAD_BUILD_COMMIT
#define UPLOAD_BUILD_COMMIT "unknown"
#endif

const char *upload_build_commit(void) {
    return UPLOAD_BUILD_COMMIT;
}

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long upload_now_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

static void upload_close(int *fd) {
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

// One read of the child's output: what fits is kept, all is counted. Returns what read returned; the pipe is closed
// at its end or on an error other than "nothing yet".
static ssize_t upload_read_output(int *fd, char *output, size_t output_capacity, upload_run_result *result) {
    char scratch[4096];
    ssize_t n = read(*fd, scratch, sizeof(scratch));
    if (n > 0) {
        size_t room = output_capacity - result->output_length;
        size_t kept = (size_t)n < room ? (size_t)n : room;
        if (kept > 0) memcpy(output + result->output_length, scratch, kept);
        result->output_length += kept;
        result->output_total += (size_t)n;
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        upload_close(fd);
    }
    return n;
}

upload_run_result upload_run_isolated(
    const char *command, char *const envp[], const void *input, size_t input_length, int timeout_ms, int grace_ms, char *output,
    size_t output_capacity) {
    upload_run_result result;
    memset(&result, 0, sizeof(result));
    int in_pipe[2] = {-1, -1};
    int out_pipe[2] = {-1, -1};
    if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0) {
        result.error = errno;
        upload_close(&in_pipe[0]);
        upload_close(&in_pipe[1]);
        return result;
    }
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
    posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 2);
    // Every other descriptor of the caller's is closed (the pipes are close-on-exec; others may not be).
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setsigdefault(&attributes, &all);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {"/bin/sh", "-c", (char *)command, NULL};
    pid_t pid = 0;
    int spawned = posix_spawn(&pid, "/bin/sh", &actions, &attributes, argv, envp);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    upload_close(&in_pipe[0]);
    upload_close(&out_pipe[1]);
    if (spawned != 0) {
        result.error = spawned;
        upload_close(&in_pipe[1]);
        upload_close(&out_pipe[0]);
        return result;
    }
    result.started = 1;
    fcntl(in_pipe[1], F_SETFL, fcntl(in_pipe[1], F_GETFL) | O_NONBLOCK);
    fcntl(out_pipe[0], F_SETFL, fcntl(out_pipe[0], F_GETFL) | O_NONBLOCK);
    if (input_length == 0) upload_close(&in_pipe[1]);
    // A descriptor that becomes readable when the child exits (Linux 5.3); without it, waitpid is asked every 50 ms.
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    // A write to a pipe the child closed must fail with EPIPE here, not raise SIGPIPE in the caller's thread.
    sigset_t pipe_only, previous;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &previous);
    size_t written = 0;
    long long deadline = timeout_ms > 0 ? upload_now_ms() + timeout_ms : -1;
    int stage = 0; // 0: running, 1: TERM sent, 2: KILL sent
    int exited = 0;
    while (!exited) {
        struct pollfd fds[3];
        int count = 0;
        int out_index = -1, in_index = -1, pid_index = -1;
        if (out_pipe[0] >= 0) {
            fds[count] = (struct pollfd){.fd = out_pipe[0], .events = POLLIN};
            out_index = count++;
        }
        if (in_pipe[1] >= 0) {
            fds[count] = (struct pollfd){.fd = in_pipe[1], .events = POLLOUT};
            in_index = count++;
        }
        if (pidfd >= 0) {
            fds[count] = (struct pollfd){.fd = pidfd, .events = POLLIN};
            pid_index = count++;
        }
        int wait_ms = pidfd >= 0 ? -1 : 50;
        if (deadline >= 0) {
            long long left = deadline - upload_now_ms();
            if (left < 0) left = 0;
            if (wait_ms < 0 || left < wait_ms) wait_ms = (int)left;
        }
        int ready = poll(fds, (nfds_t)count, wait_ms);
        if (ready < 0 && errno != EINTR) break;
        if (ready > 0 && out_index >= 0 && (fds[out_index].revents & (POLLIN | POLLHUP | POLLERR))) {
            upload_read_output(&out_pipe[0], output, output_capacity, &result);
        }
        if (ready > 0 && in_index >= 0 && (fds[in_index].revents & (POLLOUT | POLLHUP | POLLERR))) {
            ssize_t n = write(in_pipe[1], (const char *)input + written, input_length - written);
            if (n > 0) written += (size_t)n;
            if ((n < 0 && errno != EAGAIN && errno != EINTR) || written >= input_length) upload_close(&in_pipe[1]);
        }
        // Asked without reaping: until it is reaped its pid, and so its process group's id, cannot be given to
        // another process, which the group's KILL below would otherwise reach.
        siginfo_t info;
        memset(&info, 0, sizeof(info));
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) {
            exited = 1;
            break;
        }
        if (deadline >= 0 && upload_now_ms() >= deadline) {
            if (stage == 0) {
                kill(-pid, SIGTERM);
                stage = 1;
                result.timed_out = 1;
                deadline = upload_now_ms() + (grace_ms > 0 ? grace_ms : 0);
            } else {
                kill(-pid, SIGKILL);
                stage = 2;
                deadline = -1;
            }
        }
        (void)pid_index;
    }
    // What it left running in its group goes with it (or, when poll failed, it too), before it is reaped.
    kill(-pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    result.status = status;
    // What the group wrote before it ended is still in the pipe; it is read until the pipe is empty (a process that
    // left the group may hold the pipe open, so its end is not waited for).
    for (int reads = 0; out_pipe[0] >= 0 && reads < 4096; reads++) {
        ssize_t n = upload_read_output(&out_pipe[0], output, output_capacity, &result);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
    }
    struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_only, NULL, &zero) > 0) {}
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    upload_close(&pidfd);
    upload_close(&in_pipe[1]);
    upload_close(&out_pipe[0]);
    return result;
}
