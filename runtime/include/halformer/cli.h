// The inference binary's command line (runtime/cli_main.cpp), for any model: each
// model's generated <name>_main.cpp is `return halformer::run_cli(*descriptor, argc, argv);`.
#pragma once

#include "halformer/model_config.h"

namespace halformer {

int run_cli(const ModelDescriptor& model, int argc, char** argv);

}  // namespace halformer
