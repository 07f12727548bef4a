// runtime/weight_load.cpp's relative_position_bucket as a JSON filter, for
// tests/layers/check_relative_buckets.py (which compares it with transformers' T5).
// stdin:  [{"buckets": B, "distance": D, "bidirectional": bool, "from": r0, "to": r1}, ...]
// stdout: [[bucket(r0), ..., bucket(r1)], ...]
#include <iostream>
#include <nlohmann/json.hpp>

#include "halformer/weights.h"

int main() {
  const nlohmann::json jobs = nlohmann::json::parse(std::cin);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& j : jobs) {
    nlohmann::json row = nlohmann::json::array();
    for (int r = j.at("from").get<int>(); r <= j.at("to").get<int>(); ++r)
      row.push_back(halformer::relative_position_bucket(r, j.at("bidirectional").get<bool>(), j.at("buckets").get<int>(),
                                                        j.at("distance").get<int>()));
    out.push_back(row);
  }
  std::cout << out.dump() << "\n";
}
