/* gateway.h -- the gateway host `lupin serve` (docs/gateway.md), its
 * process room (gateway/): the gateway object opened and run (gateway.c),
 * its settings (settings.c), reloads and file watches (watch.c), the
 * workers started and joined (workers.c).  It includes the rooms below
 * (admin.h and down: loop/loop.h describes the order); like any host it
 * embeds the runtime through lupin.h alone. */
#ifndef LUPIN_GATEWAY_H
#define LUPIN_GATEWAY_H

#include "admin/admin.h"
#include "epp/epp.h"

/* Reads the gateway section (settings.c): declare before loading a config,
 * read after each load. */
int gw_settings_declare(lupin_runtime *rt, char *err, size_t errlen);
int gw_settings_read(lupin_runtime *rt, gw_settings *out, char *err, size_t errlen);

/* A watched directory (watch.c): the config's, a plugin directory, or both. */
typedef struct gw_watch {
  uv_fs_event_t h; /* first: the handle's pointer frees the watch */
  lupin_gateway *gw;
  int config;  /* holds the config file: its name triggers a reload */
  int plugins; /* a plugin directory: any *.lua triggers a reload */
  char *dir;
  struct gw_watch *next;
} gw_watch;

int gw_open(lupin_gateway *gw, const gw_options *o, char *err, size_t errlen);
int gw_run(lupin_gateway *gw);
/* Reloads the config and plugins; why names the trigger in the log line.
 * Returns 0 with the new generation's number in *generation (may be NULL) or
 * -1 with err; *seconds (may be NULL): how long it took either way. */
int gw_reload(lupin_gateway *gw, const char *why, char *err, size_t errlen, uint64_t *generation,
              double *seconds);
/* Watching the config file and plugin directories (watch.c): (re)computes the
 * watched set from the current generation; stop closes every watch. */
void gw_watch_sync(lupin_gateway *gw);
void gw_watch_stop(lupin_gateway *gw);

/* Starts the followers once the leader is open: each opens its own loop,
 * runtime (sharing the leader's lupin_shared) and listener on the leader's
 * listening socket.  -1 with err when one could not start. */
int gw_workers_start(lupin_gateway *leader, size_t n, char *err, size_t errlen);
/* The leader's number of workers: --workers, else gateway.workers, 0: cores. */
void gw_workers_wanted(lupin_gateway *gw, size_t *n);
/* Waits for the followers to end; returns the worst exit code. */
int gw_workers_join(lupin_gateway *leader);
/* gateway.c's parts a follower runs. */
void gw_drain(lupin_gateway *gw, const char *why);
int gw_endpoints_load(lupin_gateway *gw, char *err, size_t errlen);
/* Makes the endpoints those of a full list (empty_ok: an empty list empties
 * the pool; else gateway.allowEmptyEndpoints decides). */
void gw_endpoints_apply(lupin_gateway *gw, const lupin_endpoint_desc *d, size_t n, int empty_ok);
int gw_open_follower(lupin_gateway *gw, const lupin_gateway *leader, char *err, size_t errlen);

#endif
