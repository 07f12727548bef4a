// Kernels built for AMX (Sapphire Rapids and later: linear_int8 / linear_bf16 multiply
// more than 8 rows in tile registers) need Linux's tile state before their first call, as
// Model::load asks for it. Included by the reduced-precision layer tests (one per program).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "cpu_features.h"  // request_amx_tile_state (runtime/cpu_features.cpp, linked in)

namespace amx_tile_state {
inline const std::string kRefused = halformer::request_amx_tile_state();
}  // namespace amx_tile_state

TEST(AmxTileState, Granted) { EXPECT_EQ(amx_tile_state::kRefused, ""); }
