/* `lupin test`: runs busted on a plugin author's specs, with the paths set
 * so `require "lupin.testing"` works from any directory and the author's
 * folder is the plugin directory (docs/writing-a-plugin.md). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "cli.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char gw_test_usage[] =
    "usage: lupin test [--plugins DIR] [DIR|FILE...] [-- BUSTED-OPTIONS...]\n"
    "\n"
    "Runs busted (under luajit) on plugin specs: each DIR is a plugin folder whose\n"
    "*_spec.lua files, at any depth, are run; a FILE is one spec file.  The specs\n"
    "`require \"lupin.testing\"` (docs/writing-a-plugin.md); its harnesses load\n"
    "plugins from the plugin folders: the DIRs, or --plugins DIR (repeatable), or\n"
    "the current directory.  Default: the current directory.  Options after --\n"
    "go to busted (e.g. --filter=NAME, -o TAP).  busted runs in the first plugin\n"
    "folder and reads its .busted, if any.\n"
    "Exit 0 when every spec passed, 1 when one failed or errored, 2 on a usage\n"
    "error (no such path, no spec files), 3 when busted or luajit is missing.\n";

#define MAX_PATHS 64 /* spec paths, and busted options after -- */

/* The full path of an executable named on $PATH, or -1. */
static int find_program(const char *name, char *out, size_t n) {
  const char *path = getenv("PATH");
  if (!path) path = "/usr/bin:/bin";
  while (*path) {
    size_t len = strcspn(path, ":");
    snprintf(out, n, "%.*s/%s", (int)len, len ? path : ".", name);
    if (access(out, X_OK) == 0) return 0;
    path += len + (path[len] == ':');
  }
  return -1;
}

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_spec(const char *name) {
  size_t n = strlen(name);
  return n > 9 && !strcmp(name + n - 9, "_spec.lua");
}

/* Whether dir holds a *_spec.lua file at any depth (hidden folders skipped,
 * as busted skips them). */
static int has_specs(const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int found = 0;
  struct dirent *e;
  while (!found && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    found =
        is_spec(e->d_name) ? !is_dir(sub) : depth < 16 && is_dir(sub) && has_specs(sub, depth + 1);
  }
  closedir(d);
  return found;
}

/* Where lupin_native.so is: next to this binary (a build tree), or in the
 * install's PREFIX/lib/lua/5.1; "" when neither (then package.cpath). */
static void native_dir(char *out, size_t n) {
  char exe[PATH_MAX], probe[PATH_MAX + 64];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  out[0] = 0;
  if (len <= 0) return;
  exe[len] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return;
  *slash = 0;
  snprintf(probe, sizeof probe, "%s/lupin_native.so", exe);
  if (access(probe, R_OK) == 0) {
    snprintf(out, n, "%s", exe);
    return;
  }
  snprintf(probe, sizeof probe, "%s/../lib/lua/5.1/lupin_native.so", exe);
  if (access(probe, R_OK) == 0) snprintf(out, n, "%.*s/../lib/lua/5.1", PATH_MAX - 16, exe);
}

static int usage_error(const char *fmt, const char *arg) {
  fputs("lupin test: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs("\n\n", stderr);
  fputs(gw_test_usage, stderr);
  return GW_EXIT_USAGE;
}

/* Appends path (absolute) to the colon-separated list. */
static void add_dir(char *list, size_t n, const char *dir) {
  char abs[PATH_MAX];
  if (!realpath(dir, abs)) snprintf(abs, sizeof abs, "%s", dir);
  size_t used = strlen(list);
  snprintf(list + used, n - used, "%s%s", used ? ":" : "", abs);
}

static int run_busted(char **args) {
  pid_t pid = fork();
  if (pid < 0) {
    perror("lupin test: fork");
    return GW_EXIT_START;
  }
  if (pid == 0) {
    execv(args[0], args);
    perror("lupin test: cannot run busted");
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    ;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return GW_EXIT_START;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? GW_EXIT_OK : GW_EXIT_CONFIG;
}

/* The lupin home whose lua/ holds lupin.testing: $LUPIN_HOME (main's
 * guess_home sets it for a source tree's binary), else the install this
 * binary is in (PREFIX/bin/lupin: PREFIX/share/lupin, wherever PREFIX was
 * copied to), else the compiled-in default. */
static const char *test_home(void) {
  static char home[PATH_MAX + 32];
  const char *env = getenv("LUPIN_HOME");
  if (env && *env) return env;
  char exe[PATH_MAX], probe[PATH_MAX + 64];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  char *slash = len > 0 ? (exe[len] = 0, strrchr(exe, '/')) : NULL;
  if (slash) {
    *slash = 0;
    snprintf(probe, sizeof probe, "%s/../share/lupin/lua/lupin/testing.lua", exe);
    if (access(probe, R_OK) == 0 && realpath(probe, home)) {
      *strstr(home, "/lua/lupin/testing.lua") = 0;
      return home;
    }
  }
  return LUPIN_DEFAULT_HOME;
}

int gw_test_main(int argc, char **argv) {
  const char *home = test_home();
  static char plugins[8192], lpath[PATH_MAX * 2 + 64], cpath[PATH_MAX + 32], busted[PATH_MAX],
      luajit[PATH_MAX], ndir[PATH_MAX + 32];
  const char *paths[MAX_PATHS];
  char *args[MAX_PATHS * 2 + 8];
  int n_paths = 0, explicit_plugins = 0, i = 2;
  for (; i < argc && strcmp(argv[i], "--"); i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(gw_test_usage, stdout);
      return GW_EXIT_OK;
    } else if (!strcmp(a, "--plugins") && i + 1 < argc) {
      if (!is_dir(argv[++i])) return usage_error("no such directory: %s", argv[i]);
      add_dir(plugins, sizeof plugins, argv[i]);
      explicit_plugins = 1;
    } else if (a[0] == '-') {
      return usage_error("bad argument %s", a);
    } else if (n_paths == MAX_PATHS) {
      return usage_error("too many paths (at most 64), at %s", a);
    } else if (access(a, R_OK)) {
      return usage_error("no such file or directory: %s", a);
    } else if (is_dir(a) && !has_specs(a, 0)) {
      return usage_error("no *_spec.lua files in %s", a);
    } else {
      paths[n_paths++] = a;
    }
  }
  if (!n_paths) {
    if (!has_specs(".", 0)) return usage_error("no *_spec.lua files in %s", ".");
    paths[n_paths++] = ".";
  }
  for (int p = 0; p < n_paths && !explicit_plugins; p++)
    if (is_dir(paths[p])) add_dir(plugins, sizeof plugins, paths[p]);
  if (!plugins[0]) add_dir(plugins, sizeof plugins, ".");
  if (find_program("busted", busted, sizeof busted)) {
    fputs("lupin test: busted is not installed (Debian: apt-get install lua-busted)\n", stderr);
    return GW_EXIT_START;
  }
  if (find_program("luajit", luajit, sizeof luajit)) {
    fputs("lupin test: luajit is not installed (Debian: apt-get install luajit)\n", stderr);
    return GW_EXIT_START;
  }
  setenv("LUPIN_HOME", home, 1);
  setenv("LUPIN_TEST_PLUGINS", plugins, 1);
  native_dir(ndir, sizeof ndir);
  snprintf(lpath, sizeof lpath, "--lpath=%.*s/lua/?.lua;%.*s/lua/?/init.lua", PATH_MAX, home,
           PATH_MAX, home);
  snprintf(cpath, sizeof cpath, "--cpath=%.*s/?.so", PATH_MAX, ndir);
  /* busted runs in the first plugin folder: it reads that folder's .busted,
   * not the caller's (a source tree's would add its own specs) */
  static char chdir_arg[PATH_MAX + 16], abs_paths[MAX_PATHS][PATH_MAX];
  snprintf(chdir_arg, sizeof chdir_arg, "--directory=%.*s", PATH_MAX, plugins);
  char *colon = strchr(chdir_arg, ':');
  if (colon) *colon = 0;
  int n = 0;
  /* luajit runs the busted script itself: busted's --lua re-runs it through
   * a shell command line, which would split paths at spaces and ';' */
  args[n++] = luajit;
  args[n++] = busted;
  args[n++] = lpath;
  if (ndir[0]) args[n++] = cpath;
  args[n++] = chdir_arg;
  for (int k = i + 1; k < argc && n < MAX_PATHS + 5; k++)
    args[n++] = argv[k];
  for (int p = 0; p < n_paths; p++) {
    if (!realpath(paths[p], abs_paths[p])) snprintf(abs_paths[p], PATH_MAX, "%s", paths[p]);
    args[n++] = abs_paths[p];
  }
  args[n] = NULL;
  fflush(stdout);
  return run_busted(args);
}
