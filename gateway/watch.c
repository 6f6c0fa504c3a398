/* Watching for reloads: the directory holding the config file and every
 * plugin directory of the current generation (home/plugins, the runtime's,
 * the config's pluginDirs).  Directories, not files: editors save by writing
 * a new file and renaming it over the old one, which a watch on the old inode
 * would miss.  Events are debounced: a reload runs RELOAD_DEBOUNCE_MS after the
 * last one, so saving several files at once gives one reload. */
#include "gateway.h"

#include <stdlib.h>
#include <string.h>

#define RELOAD_DEBOUNCE_MS 150

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static void on_reload_timer(uv_timer_t *t) {
  lupin_gateway *gw = t->data;
  char err[2048];
  gw_reload(gw, "file change", err, sizeof err, NULL, NULL);
}

static void on_event(uv_fs_event_t *h, const char *file, int events, int status) {
  (void)events;
  gw_watch *w = (gw_watch *)h;
  lupin_gateway *gw = w->gw;
  if (status < 0 || gw->draining) return;
  size_t n = file ? strlen(file) : 0;
  int hit = !file || (w->config && !strcmp(file, base_name(gw->opts.config))) ||
            (w->plugins && n > 4 && !strcmp(file + n - 4, ".lua"));
  if (!hit) return;
  gw_log(gw, LUPIN_LOG_DEBUG, "watch: %s/%s changed", w->dir, file ? file : "");
  uv_timer_start(gw->reload_timer, on_reload_timer, RELOAD_DEBOUNCE_MS, 0);
}

static void close_free(uv_handle_t *h) {
  gw_watch *w = (gw_watch *)h;
  free(w->dir);
  free(w);
}

static gw_watch *find(gw_watch *list, const char *dir) {
  for (; list; list = list->next)
    if (!strcmp(list->dir, dir)) return list;
  return NULL;
}

static void add(gw_watch **list, const char *dir, int config, int plugins) {
  gw_watch *w = find(*list, dir);
  if (!w) {
    w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) {
      free(w);
      return;
    }
    w->next = *list;
    *list = w;
  }
  w->config |= config;
  w->plugins |= plugins;
}

static void add_plugin_dir(void *ud, const char *dir) { add(ud, dir, 0, 1); }

/* The set the current generation asks for, as unstarted watches. */
static gw_watch *wanted(lupin_gateway *gw) {
  gw_watch *list = NULL;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", gw->opts.config);
  char *slash = strrchr(dir, '/');
  if (slash == dir)
    dir[1] = 0; /* the root */
  else if (slash)
    *slash = 0;
  else
    snprintf(dir, sizeof dir, ".");
  add(&list, dir, 1, 0);
  lupin_runtime_plugin_dirs(gw->rt, add_plugin_dir, &list);
  return list;
}

static void stop_one(gw_watch *w) { uv_close((uv_handle_t *)&w->h, close_free); }

static void free_handle(uv_handle_t *h) { free(h); }

void gw_watch_sync(lupin_gateway *gw) {
  if (!gw->reload_timer) {
    gw->reload_timer = malloc(sizeof *gw->reload_timer);
    if (!gw->reload_timer) {
      gw_log(gw, LUPIN_LOG_WARN, "watch: out of memory: file changes do not reload");
      return;
    }
    uv_timer_init(gw->loop, gw->reload_timer);
    gw->reload_timer->data = gw;
  }
  gw_watch *want = wanted(gw), *keep = NULL;
  /* keep the running watches still wanted, with the same role */
  for (gw_watch *w = gw->watches, *next; w; w = next) {
    next = w->next;
    gw_watch *x = find(want, w->dir);
    if (x && x->config == w->config && x->plugins == w->plugins) {
      w->next = keep;
      keep = w;
    } else {
      stop_one(w);
    }
  }
  for (gw_watch *x = want, *next; x; x = next) {
    next = x->next;
    if (find(keep, x->dir)) {
      free(x->dir);
      free(x);
      continue;
    }
    x->gw = gw;
    uv_fs_event_init(gw->loop, &x->h);
    int rc = uv_fs_event_start(&x->h, on_event, x->dir, 0);
    if (rc) {
      gw_log(gw, LUPIN_LOG_WARN, "watch: cannot watch %s: %s", x->dir, uv_strerror(rc));
      uv_close((uv_handle_t *)&x->h, close_free);
      continue;
    }
    gw_log(gw, LUPIN_LOG_DEBUG, "watch: %s (%s)", x->dir,
           x->config && x->plugins ? "config, plugins"
           : x->config             ? "config"
                                   : "plugins");
    x->next = keep;
    keep = x;
  }
  gw->watches = keep;
}

void gw_watch_stop(lupin_gateway *gw) {
  for (gw_watch *w = gw->watches, *next; w; w = next) {
    next = w->next;
    stop_one(w);
  }
  gw->watches = NULL;
  if (gw->reload_timer && !uv_is_closing((uv_handle_t *)gw->reload_timer))
    uv_close((uv_handle_t *)gw->reload_timer, free_handle);
  gw->reload_timer = NULL;
}
