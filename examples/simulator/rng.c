/* splitmix64: tiny, fast, and a seed reproduces every draw (--seed). */
#include "sim.h"

uint64_t rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* 53 random bits as a double in [0,1): compares exactly against rates 0 and 1. */
double rng_unit(uint64_t *state) { return (double)(rng_next(state) >> 11) * 0x1.0p-53; }

double wall_seconds(void) {
  uv_timeval64_t tv;
  uv_gettimeofday(&tv);
  return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}
