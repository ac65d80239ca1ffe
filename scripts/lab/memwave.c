/* memwave: a guest that allocates and frees memory in waves, for the
 * balloon's lab scenarios (scripts/lab/linux-balloon*.sh).
 *
 *   memwave -k KEEP_MIB -w WAVE_MIB -n WAVES -s SLEEP_S [-h HOLD_S [-f PATH]]
 *
 * Fills KEEP_MIB with a pattern and keeps it; then WAVES times: maps
 * WAVE_MIB, writes every page, checks it, unmaps it (the guest frees it:
 * with free page reporting the host hears of it) and sleeps SLEEP_S.
 * Then holds for HOLD_S, or until PATH exists (the host inflates and
 * deflates meanwhile; the guest's script says when), and checks the kept
 * pattern again. Prints "MEMWAVE: ..." lines: each wave's
 * time (the guest's work), and at the end "keep ok" or "keep corrupt". */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static uint64_t *map(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(2); }
    return p;
}

/* Write (or check) one word per 512 bytes: every page touched, cheaply. */
static long pass(uint64_t *p, size_t bytes, uint64_t seed, int check) {
    long bad = 0;
    for (size_t i = 0; i < bytes / 8; i += 64) {
        uint64_t v = seed ^ (i * 0x9e3779b97f4a7c15ull);
        if (check) bad += p[i] != v; else p[i] = v;
    }
    return bad;
}

int main(int argc, char **argv) {
    long keep = 16, wave = 64, waves = 3, sleep_s = 4, hold = 0;
    const char *until = NULL;
    int o;
    while ((o = getopt(argc, argv, "k:w:n:s:h:f:")) != -1) {
        if (o == 'f') { until = optarg; continue; }
        long v = atol(optarg);
        switch (o) {
        case 'k': keep = v; break;
        case 'w': wave = v; break;
        case 'n': waves = v; break;
        case 's': sleep_s = v; break;
        case 'h': hold = v; break;
        default: fprintf(stderr, "usage: memwave -k MiB -w MiB -n N -s S [-h S]\n"); return 2;
        }
    }
    size_t kb = (size_t)keep << 20, wb = (size_t)wave << 20;
    uint64_t *k = map(kb);
    pass(k, kb, 0x6b656570, 0);
    double total = 0;
    for (long n = 1; n <= waves; n++) {
        double t = now_ms();
        uint64_t *w = map(wb);
        pass(w, wb, n, 0);
        long bad = pass(w, wb, n, 1);
        munmap(w, wb);
        t = now_ms() - t;
        total += t;
        printf("MEMWAVE: wave %ld %ld MiB %.0f ms%s\n", n, wave, t, bad ? " CORRUPT" : "");
        fflush(stdout);
        sleep(sleep_s);
    }
    printf("MEMWAVE: waves done %ld in %.0f ms\n", waves, total);
    fflush(stdout);
    for (long s = 0; s < hold; s++) {
        if (until && access(until, F_OK) == 0) break;
        sleep(1);
    }
    long bad = pass(k, kb, 0x6b656570, 1);
    printf("MEMWAVE: keep %s (%ld MiB, %ld bad words)\n", bad ? "corrupt" : "ok", keep, bad);
    fflush(stdout);
    return bad != 0;
}
