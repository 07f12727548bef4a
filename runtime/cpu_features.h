// The CPU features a model's kernels need vs what this CPU has (runtime/cpu_features.cpp).
#pragma once

#include <string>
#include <vector>

namespace halformer {

// The CPUID features (GCC's names: "avx2", "avx512f", "avx512vnni", ...) that the Halide
// target string (e.g. "x86-64-linux-avx-avx2-f16c-fma-sse41") needs and this CPU lacks;
// empty when it can run. HALFORMER_CPU_LACKS=f1,f2 pretends the CPU lacks those.
std::vector<std::string> missing_cpu_features(const std::string& halide_target);

}  // namespace halformer
