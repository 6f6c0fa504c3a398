/* State shared by the runtimes of one process (lupin.h, docs/workers.md). */
#include "internal.h"

#include <stdlib.h>

struct lupin_shared {
  pthread_mutex_t lock;
};

lupin_shared *lupin_shared_new(char *err, size_t errlen) {
  lupin_shared *s = calloc(1, sizeof *s);
  if (!s) {
    lupin__errf(err, errlen, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&s->lock, NULL);
  return s;
}

void lupin_shared_free(lupin_shared *s) {
  if (!s) return;
  pthread_mutex_destroy(&s->lock);
  free(s);
}
