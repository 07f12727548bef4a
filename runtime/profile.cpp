// The kernel profile (see profile.h): a process-wide table of time and calls per kernel
// name, filled by KernelTimer and printed at exit when HALFORMER_PROFILE is set.
#include "profile.h"

#include <HalideBuffer.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace halformer {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

namespace {

struct Profile {
  std::mutex lock;
  std::map<std::string, std::pair<double, long>> total;  // name -> (ms, calls)
  ~Profile() {
    std::vector<std::pair<double, std::string>> rows;
    double sum = 0;
    for (auto& [name, t] : total) rows.push_back({t.first, name}), sum += t.first;
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "%-24s %10s %8s %6s\n", "kernel", "total ms", "calls", "share");
    for (auto& [ms, name] : rows)
      std::fprintf(stderr, "%-24s %10.2f %8ld %5.1f%%\n", name.c_str(), ms, total[name].second, 100 * ms / sum);
  }
};
Profile* profile() {
  static std::unique_ptr<Profile> p(std::getenv("HALFORMER_PROFILE") ? new Profile : nullptr);
  return p.get();
}
// GPU launches return before the kernel ends: when profiling on a device, wait for it
// (through a one-element device buffer, as Halide syncs per buffer) so that each row
// of the table is that kernel's own time, not the launch's.
void sync_device_for_profile(const halide_device_interface_t* iface) {
  if (!iface) return;
  // Never freed: a destructor at process exit could outlive the device context.
  static thread_local Halide::Runtime::Buffer<float>* probe = nullptr;
  if (!probe || probe->raw_buffer()->device_interface != iface) {
    probe = new Halide::Runtime::Buffer<float>(1);
    if (probe->device_malloc(iface) != 0) return;
  }
  probe->device_sync();
}

}  // namespace

KernelTimer::KernelTimer(const char* n, const halide_device_interface_t* i)
    : name(n), iface(i), t0(profile() ? (sync_device_for_profile(i), now_ms()) : 0) {}
KernelTimer::~KernelTimer() {
  if (Profile* p = profile()) {
    sync_device_for_profile(iface);
    std::lock_guard<std::mutex> guard(p->lock);  // calls may run on several threads
    auto& e = p->total[name];
    e.first += now_ms() - t0;
    e.second += 1;
  }
}

}  // namespace halformer
