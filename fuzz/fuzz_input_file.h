// The fuzzers' input as a file: written to one memfd (reused across runs) and opened by
// path, as the runtime and the importer open theirs.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace halformer_fuzz {

// Replaces the memfd's contents with data[0, size) and returns a path that opens it.
inline std::string input_file(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("halformer-fuzz", 0);
  if (fd < 0 || ::ftruncate(fd, 0) != 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, off_t(done));
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace halformer_fuzz
