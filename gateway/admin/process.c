/* process_* series, as Prometheus' process collector names and computes
 * them (client_golang's procfs one), read from /proc at each scrape.  A
 * series whose source cannot be read is left out rather than written as 0,
 * which would read as a real value. */
#include "admin/admin.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

typedef struct proc_stat {
  double utime, stime, starttime; /* clock ticks */
  double vsize, rss;              /* bytes, pages */
} proc_stat;

/* /proc/self/stat: fields after the command, which is in parentheses and
 * may itself hold spaces or parentheses (hence the last ')'). */
static int read_stat(proc_stat *st) {
  char buf[1024];
  FILE *f = fopen("/proc/self/stat", "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  /* field 3 (state) is first after ") " */
  double v[24];
  int i = 0;
  for (char *save = NULL, *tok = strtok_r(p + 2, " ", &save); tok && i < 24;
       tok = strtok_r(NULL, " ", &save), i++)
    v[i] = strtod(tok, NULL);
  if (i < 24) return -1;
  /* v[k] is field k + 3: utime 14, stime 15, starttime 22, vsize 23, rss 24 */
  *st = (proc_stat){v[11], v[12], v[19], v[20], v[21]};
  return 0;
}

/* The boot time (btime of /proc/stat), seconds since the epoch. */
static double boot_time(void) {
  char line[256];
  double t = -1;
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "btime ", 6)) {
      t = strtod(line + 6, NULL);
      break;
    }
  fclose(f);
  return t;
}

static double open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  double n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* not the descriptor opendir holds */
}

static void one(lh_expo *e, lh_family_id id, double v) {
  if (v < 0) return;
  lh_expo_family(e, id);
  lh_expo_sample(e, NULL, v);
}

void gw_process_metrics(lh_expo *e) {
  double ticks = (double)sysconf(_SC_CLK_TCK), page = (double)sysconf(_SC_PAGESIZE);
  proc_stat st;
  if (!read_stat(&st) && ticks > 0) {
    double boot = boot_time();
    one(e, LH_M_CPU, (st.utime + st.stime) / ticks);
    one(e, LH_M_RSS, st.rss * page);
    one(e, LH_M_VSIZE, st.vsize);
    one(e, LH_M_START_TIME, boot < 0 ? -1 : boot + st.starttime / ticks);
  }
  one(e, LH_M_OPEN_FDS, open_fds());
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl))
    one(e, LH_M_MAX_FDS, rl.rlim_cur == RLIM_INFINITY ? -1 : (double)rl.rlim_cur);
}
