#pragma once
#include <stdexcept>
#include <string>

namespace halformer {
// Every user-facing failure (bad weights, bad input) is an Error with a message that
// names the file/tensor/argument and what was expected.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace halformer
