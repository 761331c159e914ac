/*
 * writelog.c: a user-space stand-in for device-mapper's log-writes target.
 *
 * LD_PRELOADed into a process, it records, in order, every write, truncate,
 * create, unlink and fsync/fdatasync made to files under $POWERLOSS_DIR, with
 * the bytes written, to the log $POWERLOSS_LOG. tests/powerloss/replay.py then
 * rebuilds the files as a power loss at any point would leave them on a disk
 * that drops every write not yet flushed (each file as of its last sync).
 * Writes to a file named "powerloss.mark" in the directory are logged as marks
 * (the harness writes one after each commit returns) and never reach a file.
 *
 * Used because this kernel has no device-mapper (no "device-mapper" in
 * /proc/misc or /proc/devices, no modules to load): docs/reliability.md.
 *
 * Record: type (1 byte) | path length (u32) | path | offset (u64) | length (u64) | data.
 * Types: C create, W write (offset, data), T truncate (offset = new size),
 * S sync of a file, D sync of the directory, U unlink, M mark (data).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FDS 65536
#define MARK_NAME "powerloss.mark"

static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static char *watched[MAX_FDS]; /* fd -> path, for files under the directory */
static char dir[PATH_MAX];
static size_t dir_len;
static int log_fd = -1;
static int ready;

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);

static void init(void) {
    if (ready)
        return;
    real_open = dlsym(RTLD_NEXT, "open");
    real_openat = dlsym(RTLD_NEXT, "openat");
    real_close = dlsym(RTLD_NEXT, "close");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_ftruncate64 = dlsym(RTLD_NEXT, "ftruncate64");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    real_unlinkat = dlsym(RTLD_NEXT, "unlinkat");
    const char *d = getenv("POWERLOSS_DIR");
    const char *l = getenv("POWERLOSS_LOG");
    if (d && l && realpath(d, dir)) {
        dir_len = strlen(dir);
        log_fd = (int)syscall(SYS_openat, AT_FDCWD, l, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    }
    ready = 1;
}

static void put(const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = syscall(SYS_write, log_fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            abort(); /* a log with a hole would be a lie */
        }
        c += w;
        n -= (size_t)w;
    }
}

static void record(char type, const char *path, uint64_t off, const void *data, uint64_t len) {
    uint32_t plen = (uint32_t)strlen(path);
    put(&type, 1);
    put(&plen, sizeof plen);
    put(path, plen);
    put(&off, sizeof off);
    put(&len, sizeof len);
    if (len)
        put(data, len);
}

/* The canonical path of fd if it lies under the directory (or is it), else NULL. */
static char *under_dir(int fd) {
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return NULL;
    target[n] = 0;
    if (strncmp(target, dir, dir_len) != 0 || (target[dir_len] != '/' && target[dir_len] != 0))
        return NULL;
    return strdup(target);
}

static int is_mark(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash && strcmp(slash + 1, MARK_NAME) == 0;
}

static int exists_at(int dirfd, const char *path) {
    struct stat st;
    return fstatat(dirfd, path, &st, 0) == 0;
}

static int after_open(int fd, int existed) {
    if (fd < 0 || fd >= MAX_FDS || log_fd < 0)
        return fd;
    char *path = under_dir(fd);
    free(watched[fd]);
    watched[fd] = path;
    if (path && !existed && !is_mark(path))
        record('C', path, 0, NULL, 0);
    return fd;
}

static int do_openat(int dirfd, const char *path, int flags, mode_t mode) {
    pthread_mutex_lock(&lock);
    init();
    int existed = (flags & O_CREAT) ? exists_at(dirfd, path) : 1;
    int fd = real_openat(dirfd, path, flags, mode);
    after_open(fd, existed);
    pthread_mutex_unlock(&lock);
    return fd;
}

#define MODE_ARG(flags) \
    mode_t mode = 0; \
    if ((flags) & (O_CREAT | O_TMPFILE)) { \
        va_list ap; \
        va_start(ap, flags); \
        mode = (mode_t)va_arg(ap, int); \
        va_end(ap); \
    }

int open(const char *path, int flags, ...) { MODE_ARG(flags) return do_openat(AT_FDCWD, path, flags, mode); }
int open64(const char *path, int flags, ...) { MODE_ARG(flags) return do_openat(AT_FDCWD, path, flags, mode); }
int openat(int d, const char *path, int flags, ...) { MODE_ARG(flags) return do_openat(d, path, flags, mode); }
int openat64(int d, const char *path, int flags, ...) { MODE_ARG(flags) return do_openat(d, path, flags, mode); }

int close(int fd) {
    pthread_mutex_lock(&lock);
    init();
    if (fd >= 0 && fd < MAX_FDS) {
        free(watched[fd]);
        watched[fd] = NULL;
    }
    int r = real_close(fd);
    pthread_mutex_unlock(&lock);
    return r;
}

static ssize_t logged_write(int fd, const void *buf, size_t n, off_t off, int positioned,
                            ssize_t (*fn)(int, const void *, size_t, off_t)) {
    pthread_mutex_lock(&lock);
    init();
    char *path = (fd >= 0 && fd < MAX_FDS) ? watched[fd] : NULL;
    ssize_t w;
    if (path && is_mark(path)) {
        record('M', path, 0, buf, n);
        w = (ssize_t)n;
    } else {
        off_t at = positioned || !path ? off : lseek(fd, 0, SEEK_CUR);
        w = positioned ? fn(fd, buf, n, off) : real_write(fd, buf, n);
        if (path && w > 0)
            record('W', path, (uint64_t)at, buf, (uint64_t)w);
    }
    pthread_mutex_unlock(&lock);
    return w;
}

ssize_t write(int fd, const void *buf, size_t n) { return logged_write(fd, buf, n, 0, 0, NULL); }
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    init();
    return logged_write(fd, buf, n, off, 1, real_pwrite);
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    init();
    return logged_write(fd, buf, n, off, 1, real_pwrite64);
}

static int logged_truncate(int fd, off_t size, int (*fn)(int, off_t)) {
    pthread_mutex_lock(&lock);
    int r = fn(fd, size);
    char *path = (fd >= 0 && fd < MAX_FDS) ? watched[fd] : NULL;
    if (path && r == 0)
        record('T', path, (uint64_t)size, NULL, 0);
    pthread_mutex_unlock(&lock);
    return r;
}

int ftruncate(int fd, off_t size) { init(); return logged_truncate(fd, size, real_ftruncate); }
int ftruncate64(int fd, off_t size) { init(); return logged_truncate(fd, size, real_ftruncate64); }

static int logged_sync(int fd, int (*fn)(int)) {
    pthread_mutex_lock(&lock);
    int r = fn(fd);
    char *path = (fd >= 0 && fd < MAX_FDS) ? watched[fd] : NULL;
    if (path && r == 0 && !is_mark(path)) {
        struct stat st;
        int is_dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
        record(is_dir ? 'D' : 'S', path, 0, NULL, 0);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int fsync(int fd) { init(); return logged_sync(fd, real_fsync); }
int fdatasync(int fd) { init(); return logged_sync(fd, real_fdatasync); }

static int logged_unlink(int dirfd, const char *path, int flags) {
    pthread_mutex_lock(&lock);
    init();
    char full[PATH_MAX];
    int fd = (int)syscall(SYS_openat, dirfd, path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    char *canon = fd >= 0 ? under_dir(fd) : NULL;
    if (fd >= 0)
        syscall(SYS_close, fd);
    int r = dirfd == AT_FDCWD && flags == 0 ? real_unlink(path) : real_unlinkat(dirfd, path, flags);
    if (canon && r == 0 && log_fd >= 0) {
        snprintf(full, sizeof full, "%s", canon);
        record('U', full, 0, NULL, 0);
    }
    free(canon);
    pthread_mutex_unlock(&lock);
    return r;
}

int unlink(const char *path) { return logged_unlink(AT_FDCWD, path, 0); }
int unlinkat(int d, const char *path, int flags) { return logged_unlink(d, path, flags); }
