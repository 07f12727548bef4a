// One public call into a Model (model.cpp, engine.cpp): its Stack and the model's thread
// limit for the calling thread, for as long as the call lasts.
#pragma once

#include "stack.h"
#include "threads.h"

namespace halformer {

struct Call {
  CallThreads threads;
  Stack stack;
  Stack* operator->() { return &stack; }
};

}  // namespace halformer
