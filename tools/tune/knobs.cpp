// Schedule knobs (tuning_db.h): the knobs of each generator and the values the tuner
// tries, for CPU and for GPU targets; the Halide autoschedulers it can try; and the split
// of a kernel's GeneratorParams into its shape (the database key) and its knobs.
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "tuning_db.h"

namespace halformer::tune {

// ---------------------------------------------------------------- knobs

namespace {

std::vector<std::string> ints(std::initializer_list<int> v) {
  std::vector<std::string> r;
  for (int i : v) r.push_back(std::to_string(i));
  return r;
}

const std::map<std::string, std::vector<Knob>>& cpu_table() {
  static const std::map<std::string, std::vector<Knob>> t = [] {
    // The matmul's hand tile depends on the ISA (generators/schedules/cpu_matmul.h:
    // matmul_knobs_for); "0" is that default.
    std::vector<Knob> matmul{{"vec", ints({8, 16, 32}), "0"},
                             {"tile_n", ints({1, 2, 3, 4}), "0"},
                             {"tile_m", ints({1, 2, 4, 5, 6, 8, 12}), "0"},
                             {"parallel", {"false", "true"}, "true"}};
    // Reduced-precision linears: also whether calls of more than 8 rows use AMX tiles
    // (generators/schedules/cpu_matmul.h; searched only on AMX CPUs, below).
    std::vector<Knob> matmul_amx = matmul;
    matmul_amx.push_back({"amx", {"false", "true"}, "true"});
    std::vector<Knob> vec_only{{"vec", ints({4, 8, 16, 32}), "16"}};
    return std::map<std::string, std::vector<Knob>>{
        {"linear", matmul},
        {"linear_residual", matmul},
        {"linear_gated", matmul},
        {"linear_int8", matmul_amx},
        {"linear_int8_residual", matmul_amx},
        {"linear_int8_gated", matmul_amx},
        {"linear_bf16", matmul_amx},
        {"linear_bf16_residual", matmul_amx},
        {"linear_bf16_gated", matmul_amx},
        {"attention",
         {{"vec", ints({4, 8, 16, 32}), "0"},
          {"tile_q", ints({1, 2, 4, 6, 8, 16, 32}), "0"},
          {"v_features", ints({0, 16, 32, 64}), "0"},
          {"v_queries", ints({0, 1, 2, 4, 6, 8}), "0"}}},
        {"layernorm", {{"vec", ints({4, 8, 16, 32}), "16"}, {"rows_per_task", ints({1, 2, 4, 8, 16, 32}), "8"}}},
        {"embedding", vec_only},
        {"softmax", vec_only},
        {"pooling", vec_only},
        {"argmax", {{"lanes", ints({4, 8, 16, 32, 64}), "16"}}},
    };
  }();
  return t;
}

const std::map<std::string, std::vector<Knob>>& gpu_table() {
  static const std::map<std::string, std::vector<Knob>> t = [] {
    // schedules/gpu.h: many-row tiles, register tile rows, K unrolling, K slices and
    // register-staged K chunks;
    // few-row slices and the row count where the many-row path starts.
    std::vector<Knob> matmul{{"gpu_tile_n", ints({32, 64, 128}), "64"},
                             {"gpu_tile_m", ints({8, 16, 32}), "16"},
                             {"gpu_reg_m", ints({2, 4, 8}), "4"},
                             {"gpu_unroll_k", ints({1, 4, 8}), "4"},
                             {"gpu_slice_n", ints({16, 32, 64}), "32"},
                             {"gpu_k_slice", ints({0, 256, 512, 1024}), "512"},
                             {"gpu_stage_k", ints({0, 4, 8}), "8"},
                             {"gpu_split_rows", ints({256, 1024, 4096}), "256"}};
    return std::map<std::string, std::vector<Knob>>{
        {"linear", matmul},
        {"linear_residual", matmul},
        {"linear_gated", matmul},
        {"attention",
         {{"gpu_tile_q", ints({1, 2, 4, 8, 16, 32}), "8"},
          {"gpu_key_lanes", ints({8, 16, 32, 64, 128}), "32"},
          {"gpu_reduce_lanes", ints({0, 8, 16, 32}), "32"},
          {"gpu_score_queries", ints({0, 1, 2, 4, 8}), "1"},
          {"gpu_v_queries", ints({0, 1, 2, 4, 8}), "2"}}},
        {"layernorm", {{"gpu_threads", ints({32, 64, 128, 256}), "32"}}},
        {"argmax", {{"lanes", ints({4, 8, 16, 32, 64}), "16"}}},
    };
  }();
  return t;
}

const std::vector<Knob>& lookup(const std::map<std::string, std::vector<Knob>>& t, const std::string& g) {
  static const std::vector<Knob> none;
  auto it = t.find(g);
  return it == t.end() ? none : it->second;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

const std::vector<Knob>& cpu_knobs(const std::string& generator) { return lookup(cpu_table(), generator); }
const std::vector<Knob>& gpu_knobs(const std::string& generator) { return lookup(gpu_table(), generator); }

bool is_knob(const std::string& generator, const std::string& param) {
  if (param == "autoscheduler" || param.rfind("autoscheduler.", 0) == 0) return true;
  for (const auto* list : {&cpu_knobs(generator), &gpu_knobs(generator)})
    for (const auto& k : *list)
      if (k.name == param) return true;
  return false;
}

const std::vector<Autoscheduler>& autoschedulers() {
  static const std::vector<Autoscheduler> a{
      {"Adams2019", "libautoschedule_adams2019.so", false},
      {"Mullapudi2016", "libautoschedule_mullapudi2016.so", false},
      {"Li2018", "libautoschedule_li2018.so", false},
      {"Anderson2021", "libautoschedule_anderson2021.so", true},
  };
  return a;
}

const Autoscheduler* find_autoscheduler(const std::string& name) {
  for (const auto& a : autoschedulers())
    if (lower(a.name) == lower(name)) return &a;
  return nullptr;
}

Params shape_params(const std::string& generator, const std::vector<std::pair<std::string, std::string>>& params) {
  Params p;
  for (const auto& [k, v] : params)
    if (!is_knob(generator, k)) p[k] = v;
  return p;
}

Params knob_params(const std::string& generator, const std::vector<std::pair<std::string, std::string>>& params) {
  Params p;
  for (const auto& [k, v] : params)
    if (is_knob(generator, k)) p[k] = v;
  return p;
}

}  // namespace halformer::tune
