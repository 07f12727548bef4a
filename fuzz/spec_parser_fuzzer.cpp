// libFuzzer harness: the spec parser and validator (tools/spec), then, for a valid spec,
// the "not supported yet" checks and the build plan. Any input must give either a Spec
// or at least one diagnostic with a message, never a crash, hang or sanitizer report.
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -I tools/spec -I runtime/include \
//     fuzz/spec_parser_fuzzer.cpp tools/spec/*.cpp -lyaml-cpp -o fuzz_spec_parser
//   ./fuzz_spec_parser -dict=fuzz/spec.dict NEW_CORPUS fuzz/corpus/spec_parser models tests/tools/spec/broken
//
// Also built without libFuzzer (fuzz/replay_main.cpp) to replay fuzz/regressions/ in the
// unit tests.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "plan.h"
#include "spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  halformer::ParseResult r = halformer::parse_spec_string(text, "fuzz.yaml");
  for (const auto& d : r.diagnostics) {
    if (d.message.empty()) std::abort();  // every diagnostic says what is wrong
    (void)d.str();
  }
  if (!r.ok()) {
    if (r.diagnostics.empty()) std::abort();  // failed without saying why
    return 0;
  }
  const auto unsupported = halformer::check_supported(*r.spec);
  for (const auto& d : unsupported) {
    if (d.message.empty()) std::abort();
    (void)d.str();
  }
  if (unsupported.empty()) {
    halformer::Plan plan = halformer::make_plan(*r.spec);
    if (plan.kernels.empty()) std::abort();
  }
  return 0;
}
