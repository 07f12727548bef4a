// Does this CPU have the instruction set a model's kernels were compiled for? Halide
// compiles `host` kernels for the features of the build machine (AVX-512, VNNI, ...); run
// on a CPU without them, the first kernel would die of SIGILL. Model::load asks first.
#include "cpu_features.h"

#include "halformer/amx.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

namespace halformer {
namespace {

// Halide x86 target features (Halide's Target.h) -> the CPUID features they need, in
// GCC's __builtin_cpu_supports names. A composite feature lists every member.
const std::map<std::string, std::vector<const char*>>& x86_features() {
  static const std::vector<const char*> skylake{"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq"};
  auto with = [](std::vector<const char*> base, std::initializer_list<const char*> more) {
    base.insert(base.end(), more);
    return base;
  };
  static const auto cannonlake = with(skylake, {"avx512ifma", "avx512vbmi"});
  static const auto zen4 = with(cannonlake, {"avx512vnni", "avx512bf16", "avx512vbmi2", "avx512bitalg", "avx512vpopcntdq"});
  static const std::map<std::string, std::vector<const char*>> m{
      {"sse41", {"sse4.1"}},
      {"sse42", {"sse4.2"}},
      {"avx", {"avx"}},
      {"avx2", {"avx2"}},
      {"fma", {"fma"}},
      {"f16c", {"f16c"}},
      {"avx512", {"avx512f", "avx512cd"}},
      {"avx512_skylake", skylake},
      {"avx512_cannonlake", cannonlake},
      {"avx512_sapphirerapids", with(cannonlake, {"avx512vnni", "avx512bf16", "avxvnni"})},
      {"avx512_zen4", zen4},
      {"avx512_zen5", with(zen4, {"avxvnni"})},
      {"avxvnni", {"avxvnni"}},
      // Not a Halide feature: Model::load appends it for models whose linears use AMX
      // tiles (ModelConfig::amx_tiles; Halide's avx512_sapphirerapids alone does not say).
      {"amx", {"amx-tile", "amx-int8", "amx-bf16"}},
  };
  return m;
}

// __builtin_cpu_supports needs a string literal per call: one switch over the names above.
bool cpu_has(const std::string& f) {
  if (f.rfind("amx-", 0) == 0) return amx_usable_here();  // the three together, OS included
  __builtin_cpu_init();
#define HF_CHECK(name) \
  if (f == name) return __builtin_cpu_supports(name);
  HF_CHECK("sse4.1") HF_CHECK("sse4.2") HF_CHECK("avx") HF_CHECK("avx2") HF_CHECK("fma") HF_CHECK("f16c")
  HF_CHECK("avx512f") HF_CHECK("avx512cd") HF_CHECK("avx512vl") HF_CHECK("avx512bw") HF_CHECK("avx512dq")
  HF_CHECK("avx512ifma") HF_CHECK("avx512vbmi") HF_CHECK("avx512vnni") HF_CHECK("avx512bf16")
  HF_CHECK("avx512vbmi2") HF_CHECK("avx512bitalg") HF_CHECK("avx512vpopcntdq") HF_CHECK("avxvnni")
#undef HF_CHECK
  return false;
}

}  // namespace

std::vector<std::string> missing_cpu_features(const std::string& halide_target) {
  // HALFORMER_CPU_LACKS=avx2,fma: act as a CPU without those (to test this path on any machine).
  std::vector<std::string> lacks;
  if (const char* e = std::getenv("HALFORMER_CPU_LACKS")) {
    std::stringstream ss(e);
    for (std::string f; std::getline(ss, f, ',');)
      if (!f.empty()) lacks.push_back(f);
  }
  auto has = [&](const std::string& f) {
    for (const auto& l : lacks)
      if (l == f) return false;
    return cpu_has(f);
  };
  std::vector<std::string> missing;
  std::stringstream ss(halide_target);
  for (std::string part; std::getline(ss, part, '-');) {
    auto it = x86_features().find(part);
    if (it == x86_features().end()) continue;
    for (const char* f : it->second) {
      bool listed = false;
      for (const auto& m : missing) listed |= m == f;
      if (!listed && !has(f)) missing.push_back(f);
    }
  }
  return missing;
}

std::string request_amx_tile_state() {
  // Linux keeps the 8 KB of tile registers out of a process's state until it asks
  // (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); the grant covers every thread.
  static std::once_flag once;
  static std::string why;
  std::call_once(once, [] {
    if (!amx_usable_here()) return;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0)
      why = std::string("Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) +
            ")";
  });
  return why;
}

}  // namespace halformer
