/* The lab's disk benchmark, run inside a Linux guest (scripts/lab/vs-qemu.sh):
 *   blkbench write DEV COUNT   COUNT 4 KiB writes with O_DSYNC (each one a
 *                              write and a flush on a virtio-blk disk)
 *   blkbench read DEV BYTES    BYTES read sequentially with O_DIRECT in
 *                              128 KiB requests (no page cache)
 * Prints one line: "BLK: <what> <count> <microseconds>". Static, no libc
 * beyond what the guest's busybox initramfs needs. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: blkbench write DEV COUNT | read DEV BYTES\n");
        return 2;
    }
    long long n = atoll(argv[3]);
    void *buf;
    if (posix_memalign(&buf, 4096, 128 << 10)) return 1;
    memset(buf, 0x5a, 128 << 10);
    if (!strcmp(argv[1], "write")) {
        int fd = open(argv[2], O_WRONLY | O_DSYNC);
        if (fd < 0) { perror(argv[2]); return 1; }
        long long t0 = now_us();
        for (long long i = 0; i < n; i++)
            if (pwrite(fd, buf, 4096, i * 4096) != 4096) { perror("pwrite"); return 1; }
        printf("BLK: write4k-dsync %lld %lld\n", n, now_us() - t0);
    } else if (!strcmp(argv[1], "read")) {
        int fd = open(argv[2], O_RDONLY | O_DIRECT);
        if (fd < 0) { perror(argv[2]); return 1; }
        long long t0 = now_us(), done = 0;
        while (done < n) {
            ssize_t r = pread(fd, buf, 128 << 10, done);
            if (r <= 0) { perror("pread"); return 1; }
            done += r;
        }
        printf("BLK: read128k-direct %lld %lld\n", done, now_us() - t0);
    } else {
        return 2;
    }
    return 0;
}
