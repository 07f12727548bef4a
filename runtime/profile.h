// HALFORMER_PROFILE=1: every kernel call timed (KernelTimer), a per-kernel table printed at
// exit. On a GPU device, host<->device copies show up as "upload" / "download" and
// device-to-device copies as "device_copy".
#pragma once

#include <HalideRuntime.h>

namespace halformer {

double now_ms();  // a steady clock, in milliseconds

// Times the enclosing scope as one call of kernel `name` (nothing when not profiling).
struct KernelTimer {
  const char* name;
  const halide_device_interface_t* iface;
  double t0;
  KernelTimer(const char* n, const halide_device_interface_t* i);
  ~KernelTimer();
};

}  // namespace halformer
