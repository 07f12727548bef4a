// Halide's errors as halformer::Error: a failing kernel call (or device operation) throws
// with the Halide runtime's own message, instead of Halide's default print-and-abort.
#pragma once

#include <string>

namespace halformer {

// Throws Error("kernel '<what>' failed (...)") unless status is 0.
void check_kernel(int status, const char* what);
// The Halide runtime's messages since the last check_kernel on this thread (and clears them).
std::string take_halide_error();

}  // namespace halformer
