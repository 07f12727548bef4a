// Can this process use AMX tiles? Shared by the generators (schedules/cpu_matmul.h
// amx_tiles) and the planner (ModelConfig::amx_tiles), which must agree; no dependencies.
#pragma once

namespace halformer {

// The CPU and the OS both (GCC's check includes the OS's tile state, which Linux enables
// from 5.16 and a hypervisor may hide). Halide's host detection credits Sapphire Rapids from
// AVX-VNNI and AVX512-BF16 alone, so builds for this host ask this too. Linux still grants
// the tile registers per process on request (runtime/cpu_features.h request_amx_tile_state).
inline bool amx_usable_here() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
         __builtin_cpu_supports("amx-bf16");
#else
  return false;
#endif
}

}  // namespace halformer
