// The C++ API of a generated model library. Build (after `halformer build
// models/reverse-tiny.yaml -o out/reverse-tiny`):
//   c++ -std=c++17 examples/reverse_api.cpp -I runtime/include -I out/reverse-tiny \
//       out/reverse-tiny/libreverse-tiny.a -lpthread -ldl -o reverse_api
//   ./reverse_api models/reverse-tiny.safetensors
#include <cstdio>
#include <exception>

#include "reverse-tiny.h"  // the model's descriptor, halformer_model_reverse_tiny()

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s WEIGHTS.safetensors\n", argv[0]);
    return 2;
  }
  try {
    auto model = halformer::Model::load(*halformer_model_reverse_tiny(), argv[1]);
    auto result = model.greedy({{3, 7, 1, 9}, {5, 4, 3, 2, 1, 13}}, 20);
    for (const auto& seq : result.tokens) {
      for (int t : seq) std::printf("%d ", t);
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
