/* The benchmark printed in the KVM async page faults patch series (2010,
 * its benchmark.c), for a Linux guest in the lab (scripts/lab/linux-apf.sh):
 * -f faulting threads write one byte at random pages of an array of -m
 * bytes (larger than what the host keeps resident, smaller than the
 * guest's memory), -w working threads increment counters, for -t seconds;
 * the working threads' total is the figure. As printed in the seed, with
 * -m read as a 64-bit count and the prefault timed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t barrier;
static volatile int stop;
static size_t pages;

static void *fault_thread(void *p)
{
    char *mem = p;
    pthread_barrier_wait(&barrier);
    while (!stop)
        mem[(random() % pages) << 12] = 10;
    pthread_barrier_wait(&barrier);
    return NULL;
}

static void *work_thread(void *p)
{
    unsigned long *i = p;
    pthread_barrier_wait(&barrier);
    while (!stop)
        (*i)++;
    pthread_barrier_wait(&barrier);
    return NULL;
}

int main(int argc, char **argv)
{
    int ft = 1, wt = 1, opt;
    unsigned int timeout = 5;
    size_t mem = 1024 * 1024 * 1024;
    void *buf;
    pthread_t t;
    unsigned long *res, sum = 0;
    while ((opt = getopt(argc, argv, "f:w:m:t:")) != -1) {
        switch (opt) {
        case 'f': ft = atoi(optarg); break;
        case 'w': wt = atoi(optarg); break;
        case 'm': mem = strtoull(optarg, NULL, 0); break;
        case 't': timeout = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-f num] [-w num] [-m bytes] [-t secs]\n", argv[0]);
            return 1;
        }
    }
    pages = mem >> 12;
    if (posix_memalign(&buf, 4096, pages << 12))
        return 1;
    res = calloc(wt, sizeof *res);
    pthread_barrier_init(&barrier, NULL, ft + wt + 1);
    for (int i = 0; i < ft; i++) {
        pthread_create(&t, NULL, fault_thread, buf);
        pthread_detach(t);
    }
    for (int i = 0; i < wt; i++) {
        pthread_create(&t, NULL, work_thread, &res[i]);
        pthread_detach(t);
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    memset(buf, 0, pages << 12); /* prefault */
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("BM: start (prefault %ld ms)\n", (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000);
    fflush(stdout);
    pthread_barrier_wait(&barrier);
    pthread_barrier_destroy(&barrier);
    pthread_barrier_init(&barrier, NULL, ft + wt + 1);
    sleep(timeout);
    stop = 1;
    pthread_barrier_wait(&barrier);
    for (int i = 0; i < wt; i++) {
        sum += res[i];
        printf("BM: worker %d: %lu\n", i, res[i]);
    }
    printf("BM: total: %lu\n", sum);
    return 0;
}
