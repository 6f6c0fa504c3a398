/* Timeouts pushed back by a store (gw_timer in loop/loop.h).  A client
 * connection's timeout moves three times a request and an endpoint's at
 * every piece of a streamed answer; with the libuv timer left armed for the
 * earliest deadline, those moves cost a store, and the timer re-arms once
 * per timeout's length at most. */
#include "loop/loop.h"

static void fire(uv_timer_t *h) {
  gw_timer *t = (gw_timer *)h;
  if (!t->pending) return;
  uint64_t now = uv_now(h->loop);
  if (now < t->due) { /* moved since it was armed */
    uv_timer_start(h, fire, t->due - now, 0);
    return;
  }
  t->pending = 0;
  t->cb(h);
}

void gw_timer_init(uv_loop_t *loop, gw_timer *t, void *data) {
  uv_timer_init(loop, &t->handle);
  t->handle.data = data;
  t->pending = 0;
}

void gw_timer_set(gw_timer *t, uv_timer_cb cb, uint64_t ms) {
  t->due = uv_now(t->handle.loop) + ms;
  t->pending = 1;
  t->cb = cb;
  if (!uv_is_active((uv_handle_t *)&t->handle) || uv_timer_get_due_in(&t->handle) > ms)
    uv_timer_start(&t->handle, fire, ms, 0);
}

void gw_timer_clear(gw_timer *t) { t->pending = 0; }
