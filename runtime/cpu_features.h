// The CPU features a model's kernels need vs what this CPU has (runtime/cpu_features.cpp).
#pragma once

#include <string>
#include <vector>

namespace halformer {

// The CPUID features (GCC's names: "avx2", "avx512f", "avx512vnni", ...) that the Halide
// target string (e.g. "x86-64-linux-avx-avx2-f16c-fma-sse41") needs and this CPU lacks;
// empty when it can run. HALFORMER_CPU_LACKS=f1,f2 pretends the CPU lacks those.
std::vector<std::string> missing_cpu_features(const std::string& halide_target);

// Kernels built for AMX targets (avx512_sapphirerapids: linear_int8 / linear_bf16 over 8
// rows) multiply in tile registers, which Linux grants a process only on request: asks
// once (where the CPU has AMX; elsewhere nothing to ask). Returns "" when granted or not
// needed, else why not. Call before the first kernel; Model::load does.
std::string request_amx_tile_state();

}  // namespace halformer
