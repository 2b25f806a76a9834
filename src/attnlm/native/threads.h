/* Threads of the C step (decode_step.c): a team runs fn(ctx, t, nt) on nt threads, which
 * meet at BARRIER(). With OpenMP, a parallel region and its barrier; without it (Apple's
 * clang has none), POSIX threads started per call and a spinning barrier, the same threads
 * and the same shares of the work, so the same numbers. */
#ifndef ATTNLM_THREADS_H
#define ATTNLM_THREADS_H

typedef void (*TeamFn)(void *ctx, int t, int nt);
#ifdef _OPENMP
#include <omp.h>
#define BARRIER() _Pragma("omp barrier")
static void run_team(int threads, TeamFn fn, void *ctx) {
#pragma omp parallel num_threads(threads)
    fn(ctx, omp_get_thread_num(), omp_get_num_threads());
}
#else /* a compiler without OpenMP (Apple's clang): POSIX threads and a spinning barrier */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#define MAX_TEAM 256
typedef struct {
    atomic_int arrived, phase, go;
    int n;
} Team;
static _Thread_local Team *my_team; /* the team this thread runs in (NULL: none) */

/* every thread of the team waits here until all have come (their writes seen by all after) */
static void team_barrier(void) {
    Team *tm = my_team;
    if (!tm || tm->n < 2) return;
    const int phase = atomic_load_explicit(&tm->phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&tm->arrived, 1, memory_order_acq_rel) == tm->n - 1) {
        atomic_store_explicit(&tm->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&tm->phase, phase + 1, memory_order_release);
        return;
    }
    for (int spins = 0; atomic_load_explicit(&tm->phase, memory_order_acquire) == phase;)
        if (++spins > 4096) sched_yield(); /* more threads than free cores: let them run */
}
#define BARRIER() team_barrier()

typedef struct {
    TeamFn fn;
    void *ctx;
    Team *tm;
    int t;
} Member;

static void *member_main(void *arg) {
    const Member *me = arg;
    while (!atomic_load_explicit(&me->tm->go, memory_order_acquire)) sched_yield();
    my_team = me->tm;
    me->fn(me->ctx, me->t, me->tm->n);
    return NULL;
}

static void run_team(int threads, TeamFn fn, void *ctx) {
    Team tm;
    pthread_t ids[MAX_TEAM];
    Member members[MAX_TEAM];
    threads = threads < 1 ? 1 : threads > MAX_TEAM ? MAX_TEAM : threads;
    atomic_init(&tm.arrived, 0), atomic_init(&tm.phase, 0), atomic_init(&tm.go, 0);
    int n = 1; /* the threads started (one that cannot be made leaves the team smaller) */
    for (int t = 1; t < threads; t++) {
        members[n] = (Member){fn, ctx, &tm, n};
        if (pthread_create(&ids[n], NULL, member_main, &members[n]) != 0) break;
        n++;
    }
    tm.n = n;
    atomic_store_explicit(&tm.go, 1, memory_order_release);
    Team *outer = my_team;
    my_team = &tm;
    fn(ctx, 0, n);
    my_team = outer;
    for (int t = 1; t < n; t++) pthread_join(ids[t], NULL);
}
#endif
#endif /* ATTNLM_THREADS_H */
