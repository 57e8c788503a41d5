/* A small thread pool (not OpenMP) for the float16-weight kernels (half_gemv.c).

   The caller publishes a job of n chunks; the caller and up to threads-1 workers claim chunks with one atomic
   ticket (generation << 32 | next chunk) and the caller waits only for chunks claimed by others, never for a
   worker to wake up: a descheduled worker (a busy neighbour process) costs nothing, the caller then runs every
   chunk itself. Workers spin ~SPIN_NS after a job, then sleep on a condition variable. */
#ifndef PRIMESPEECH_POOL_H
#define PRIMESPEECH_POOL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_WORKERS 63
#define SPIN_NS 200000L
typedef void (*chunk_fn)(const void *ctx, int64_t chunk);

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int nworkers;
  atomic_int sleepers;
  atomic_uint_fast64_t ticket;
  atomic_int_fast64_t done;
  chunk_fn fn;
  const void *ctx;
  int64_t nchunks;
  int active; /* workers allowed in the current job */
  atomic_int busy; /* a caller owns the pool */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0, 0, 0};

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* claim and run chunks of generation gen; returns when none is left */
static void run_chunks(uint64_t gen, chunk_fn fn, const void *ctx, int64_t nchunks) {
  for (;;) {
    uint64_t t = atomic_load(&pool.ticket);
    if ((t >> 32) != gen || (int64_t)(t & 0xffffffffu) >= nchunks) return;
    if (!atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) continue;
    fn(ctx, (int64_t)(t & 0xffffffffu));
    atomic_fetch_add(&pool.done, 1);
  }
}

static void *worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  uint64_t seen = atomic_load(&pool.ticket) >> 32;
  for (;;) {
    int64_t t0 = now_ns();
    uint64_t t;
    for (int i = 0;; i++) {
      t = atomic_load(&pool.ticket);
      if ((t >> 32) != seen) break;
      CPU_RELAX();
      if ((i & 63) == 63 && now_ns() - t0 > SPIN_NS) {
        pthread_mutex_lock(&pool.mu);
        atomic_fetch_add(&pool.sleepers, 1);
        while (((t = atomic_load(&pool.ticket)) >> 32) == seen) pthread_cond_wait(&pool.cv, &pool.mu);
        atomic_fetch_sub(&pool.sleepers, 1);
        pthread_mutex_unlock(&pool.mu);
        break;
      }
    }
    seen = t >> 32;
    /* the job's fields were written before the ticket was published */
    chunk_fn fn = pool.fn;
    const void *ctx = pool.ctx;
    int64_t nchunks = pool.nchunks;
    const int active = pool.active;
    atomic_thread_fence(memory_order_seq_cst);
    if (id < active) run_chunks(seen, fn, ctx, nchunks); /* claims fail unless seen is still the open job */
  }
  return NULL;
}

/* a forked child has no workers: start afresh (the caller would run every chunk itself anyway) */
static void after_fork(void) {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  pool.mu = mu;
  pool.cv = cv;
  pool.nworkers = 0;
  atomic_store(&pool.sleepers, 0);
  atomic_store(&pool.busy, 0);
}

/* run fn(ctx, 0 .. nchunks-1) on up to `threads` threads (the caller included); returns when all are done */
static void parallel(chunk_fn fn, const void *ctx, int64_t nchunks, int threads) {
  /* one job at a time: a second Python thread calling in meanwhile (ctypes releases the GIL) runs its own
     chunks inline */
  if (threads <= 1 || nchunks <= 1 || atomic_exchange(&pool.busy, 1)) {
    for (int64_t c = 0; c < nchunks; c++) fn(ctx, c);
    return;
  }
  static int atfork = 0;
  if (!atfork) atfork = 1 + pthread_atfork(NULL, NULL, after_fork);
  if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
  while (pool.nworkers < threads - 1) { /* started on first use */
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, worker, (void *)(intptr_t)pool.nworkers) != 0) {
      pthread_attr_destroy(&attr);
      break;
    }
    pthread_attr_destroy(&attr);
    pool.nworkers++;
  }
  if (pool.nworkers == 0) {
    for (int64_t c = 0; c < nchunks; c++) fn(ctx, c);
    atomic_store(&pool.busy, 0);
    return;
  }
  /* close the previous generation (no claim can succeed, a late worker cannot mix two jobs' fields), then
     write the job and publish it */
  const uint64_t closed = (atomic_load(&pool.ticket) >> 32) + 1, gen = closed + 1;
  atomic_store(&pool.ticket, (closed << 32) | 0xffffffffu);
  atomic_thread_fence(memory_order_seq_cst);
  pool.fn = fn;
  pool.ctx = ctx;
  pool.nchunks = nchunks;
  pool.active = threads - 1;
  atomic_store(&pool.done, 0);
  atomic_store(&pool.ticket, gen << 32);
  if (atomic_load(&pool.sleepers) > 0) {
    pthread_mutex_lock(&pool.mu);
    pthread_cond_broadcast(&pool.cv);
    pthread_mutex_unlock(&pool.mu);
  }
  run_chunks(gen, fn, ctx, nchunks);
  for (int i = 0; atomic_load(&pool.done) < nchunks; i++) {
    if (i > 4096) sched_yield(); /* a worker holding a chunk was descheduled */
    else CPU_RELAX();
  }
  atomic_store(&pool.busy, 0);
}

#endif
