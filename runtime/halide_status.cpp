// Halide's errors as halformer::Error (see halide_status.h): the runtime's error handler
// keeps the message per thread, and check_kernel turns a non-zero status into an Error.
#include "halide_status.h"

#include <HalideRuntime.h>

#include "halformer/error.h"

namespace halformer {
namespace {

// Halide's default error handler prints and aborts; ours keeps the message so that a
// failing kernel (e.g. no CUDA driver) becomes an Error with the runtime's own words.
thread_local std::string g_halide_error;
void record_halide_error(void*, const char* msg) { g_halide_error += msg; }
struct InstallErrorHandler {
  InstallErrorHandler() { halide_set_error_handler(record_halide_error); }
} g_install_error_handler;


}  // namespace

std::string take_halide_error() {
  std::string msg;
  msg.swap(g_halide_error);
  return msg;
}

void check_kernel(int status, const char* what) {
  if (status != 0) {
    std::string msg = g_halide_error;
    g_halide_error.clear();
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    throw Error(std::string("kernel '") + what + "' failed (Halide error " + std::to_string(status) +
                (msg.empty() ? "" : ": " + msg) + ")");
  }
  g_halide_error.clear();
}

// body(i) for i in [0, n) on Halide's thread pool (so within the calling model's thread

}  // namespace halformer
