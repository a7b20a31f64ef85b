// The SIGBUS handler that names a truncated segment (see segment_fault.h).
#include "core/segment_fault.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace crossover {
namespace {

// One watched mapping. The handler reads it lock-free: begin is published last (release) and
// cleared first, and the message is written only while begin is 0.
struct Watched {
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> length{0};
  char message[768];
  size_t message_length = 0;
};

Watched g_watched[kMaxWatchedSegments];
std::mutex g_watch_mu;  // serialises Watch/Unwatch (never taken by the handler)
struct sigaction g_previous;

void OnBusError(int sig, siginfo_t* info, void* context) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Watched& w : g_watched) {
    const uintptr_t begin = w.begin.load(std::memory_order_acquire);
    if (begin != 0 && address >= begin && address < begin + w.length.load()) {
      ssize_t ignored = write(STDERR_FILENO, w.message, w.message_length);
      (void)ignored;
      break;
    }
  }
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (!(g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_handler != SIG_DFL &&
      g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: the signal is blocked inside its handler, so the raised one is
  // delivered, and kills the process, as soon as this returns.
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

void InstallHandler() {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = OnBusError;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, &g_previous);
}

}  // namespace

void WatchSegmentMapping(const void* begin, size_t length, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, InstallHandler);
  std::lock_guard<std::mutex> lock(g_watch_mu);
  for (Watched& w : g_watched) {
    if (w.begin.load() != 0) continue;
    const std::string text =
        "[crossover lease] lease segment " + path + " was truncated while this process had it "
        "mapped (SIGBUS on access): a process that can write the file cut it short (root, the "
        "job's user, or in group mode any member of the lease directory's group: "
        "docs/deploying.md, \"What group members can still do\"). The lease cannot go on: stop "
        "the group's jobs, check who can write the lease directory, and start them again.\n";
    w.message_length = std::min(text.size(), sizeof(w.message));
    memcpy(w.message, text.data(), w.message_length);
    w.length.store(length);
    w.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
    return;
  }
}

void UnwatchSegmentMapping(const void* begin) {
  std::lock_guard<std::mutex> lock(g_watch_mu);
  for (Watched& w : g_watched) {
    if (w.begin.load() == reinterpret_cast<uintptr_t>(begin)) w.begin.store(0);
  }
}

}  // namespace crossover
