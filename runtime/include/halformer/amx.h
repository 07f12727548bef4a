// Can this process use AMX tiles? Shared by the generators (schedules/cpu_matmul.h
// amx_tiles) and the planner (ModelConfig::amx_tiles), which must agree; no dependencies.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace halformer {

// The CPU and the OS both (GCC's check includes the OS's tile state, which Linux enables
// from 5.16 and a hypervisor may hide). Halide's host detection credits Sapphire Rapids from
// AVX-VNNI and AVX512-BF16 alone, so builds for this host ask this too. Linux still grants
// the tile registers per process on request (runtime/cpu_features.h request_amx_tile_state).
inline bool amx_usable_here() {
#if defined(__x86_64__) && defined(__GNUC__)
  // CPUID leaf 7 EDX: AMX-BF16 (bit 22), AMX-TILE (24), AMX-INT8 (25); then the OS: OSXSAVE
  // (leaf 1 ECX bit 27) and XCR0's tile state (XTILECFG bit 17, XTILEDATA 18). (By hand:
  // clang's __builtin_cpu_supports knows no "amx-*".)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const unsigned amx = (1u << 22) | (1u << 24) | (1u << 25);
  if ((d & amx) != amx) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
#else
  return false;
#endif
}

}  // namespace halformer
