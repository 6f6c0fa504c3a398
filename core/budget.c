/* Call budgets: the watchdog that cuts a plugin call running past its
 * deadline.
 *
 * LuaJIT's instruction hook does not fire inside compiled traces, and a
 * volatile load from FFI is hoisted out of a compiled loop all the same, so
 * neither can stop `while true do end` once the JIT has compiled it.  What
 * does: lua/lupin/runtime/budget.lua rewrites every plugin file at load so that each
 * loop body, each `goto` and each function entry calls lupin_budget_poll()
 * through FFI (a C call is never hoisted, interpreted or compiled), and this
 * file's thread sets `cut` once the running call's deadline has passed.  The
 * Lua side then throws from the plugin's own frame (see budget.lua).
 *
 * The thread reads `deadline` (written by the Lua side before and after each
 * plugin call) and sleeps until it, or a tick when no call runs: per call the
 * runtime pays a few stores, and the cut lands about a tick late. */
#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <time.h>

#define TICK_NS 2000000L /* 2 ms: how late a cut can land */

int lupin_budget_poll(const volatile int32_t *cut) { return *cut; }

/* Sleeps that long, a tick at most. */
static void sleep_for(double seconds) {
  if (seconds > (double)TICK_NS / 1e9) seconds = (double)TICK_NS / 1e9;
  if (seconds <= 0) seconds = 1e-4;
  struct timespec ts = {0, (long)(seconds * 1e9)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

/* CPU seconds the runtime's thread has run. */
static double cpu_of(const lupin_budget *b) {
  struct timespec ts;
  if (clock_gettime(b->cpu_clock, &ts)) return 1e300; /* cannot tell: cut */
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A deadline is wall-clock time, but a call is cut only once the runtime's
 * thread has also had that much CPU since the watchdog first saw the call:
 * on a loaded machine a descheduled call is not blamed for the wait.  A
 * call first seen late must run one more tick. */
static void *watch(void *ud) {
  lupin_budget *b = ud;
  double seen = 0, wall0 = 0, cpu0 = 0, tick = (double)TICK_NS / 1e9;
  while (!__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE)) {
    /* an aligned double store is atomic on the targets LuaJIT runs on */
    double deadline = b->deadline, now = lupin_now();
    if (deadline <= 0) {
      sleep_for(tick);
      continue;
    }
    if (deadline != seen) {
      seen = deadline, wall0 = now, cpu0 = cpu_of(b);
    }
    if (now < deadline) {
      sleep_for(deadline - now);
      continue;
    }
    double need = deadline - wall0 > tick ? deadline - wall0 : tick;
    if (cpu_of(b) - cpu0 >= need) b->cut = 1; /* still over a tick later: set again */
    sleep_for(tick);
  }
  return NULL;
}

int lupin__budget_start(lupin_budget *b, char *err, size_t errlen) {
  int rc = pthread_getcpuclockid(pthread_self(), &b->cpu_clock);
  if (rc) {
    lupin__errf(err, errlen, "cannot read this thread's CPU clock: error %d", rc);
    return -1;
  }
  /* the watchdog takes no signal meant for the host */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = pthread_create(&b->thread, NULL, watch, b);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    lupin__errf(err, errlen, "cannot start the budget watchdog: error %d", rc);
    return -1;
  }
  b->running = 1;
  return 0;
}

void lupin__budget_stop(lupin_budget *b) {
  if (!b->running) return;
  __atomic_store_n(&b->stop, 1, __ATOMIC_RELEASE);
  pthread_join(b->thread, NULL);
  b->running = 0;
}
