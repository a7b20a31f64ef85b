#include "device_lease.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace crossover {
namespace {

constexpr uint64_t kMagic = 0x31564f53534f5243ULL;  // "CROSSOV1", bump on layout change
constexpr int kMaxWaiters = 16;
constexpr size_t kTimelineCapacity = 16384;
constexpr int64_t kPollNs = 20 * 1000 * 1000;       // liveness re-check period while waiting
constexpr int kOpenAttempts = 200;                  // x 5 ms: bound on waiting for a creator

int64_t NowNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
int64_t MonoNs() { return NowNs(CLOCK_MONOTONIC); }
int64_t WallNs() { return NowNs(CLOCK_REALTIME); }

}  // namespace

// A process identity that survives pid reuse: pid plus its start time in clock ticks.
struct Owner {
  int32_t pid;
  uint64_t start_ticks;
  bool operator==(const Owner& o) const { return pid == o.pid && start_ticks == o.start_ticks; }
};

struct Waiter {
  Owner who;
  int64_t since_wall_ns;
};

struct SharedLease {
  std::atomic<uint64_t> magic;  // written last by the creator: the segment is initialised
  uint32_t struct_size;
  int32_t creator_pid;
  pthread_mutex_t mu;            // robust, process-shared
  std::atomic<uint32_t> wake_seq;  // futex word: bumped on every release
  // Guarded by mu.
  Owner holder;                  // pid 0: free
  int64_t held_since_wall_ns;
  Owner last_holder;
  int32_t num_waiters;
  Waiter waiters[kMaxWaiters];   // FIFO
  uint64_t total_handoffs;
  uint64_t total_recoveries;
};

namespace {

// Reads (state, start time) from /proc/<pid>/stat. False if the process does not exist.
bool ReadProcStat(int32_t pid, char* state, uint64_t* start_ticks) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  const size_t paren = line.rfind(')');  // comm may contain spaces and parentheses
  if (paren == std::string::npos) return false;
  std::istringstream fields(line.substr(paren + 2));
  std::string field;
  // After comm: field 3 is state; start time is field 22, i.e. the 20th after comm.
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3) *state = field.empty() ? '?' : field[0];
    if (i == 22) {
      *start_ticks = std::strtoull(field.c_str(), nullptr, 10);
      return true;
    }
  }
  return false;
}

Owner Self() {
  static const Owner self = [] {
    Owner o{static_cast<int32_t>(getpid()), 0};
    char state;
    ReadProcStat(o.pid, &state, &o.start_ticks);
    return o;
  }();
  return self;
}

// A zombie (killed but not yet reaped) counts as dead: it will never release.
bool Alive(const Owner& o) {
  if (o.pid <= 0) return false;
  char state = '?';
  uint64_t start = 0;
  if (!ReadProcStat(o.pid, &state, &start)) return kill(o.pid, 0) == 0 || errno == EPERM;
  if (state == 'Z' || state == 'X') return false;
  return start == o.start_ticks;
}

void Warn(const std::string& msg) { fprintf(stderr, "[crossover lease] %s\n", msg.c_str()); }

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, timeout, nullptr, 0);
}

bool ValidChars(const std::string& s, size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
  });
}

std::string SegmentName(const std::string& group, const std::string& device_key) {
  return "/crossover." + group + "." + device_key;
}

std::string Errno(const std::string& what) { return what + ": " + strerror(errno); }

LeaseStatus InitShared(SharedLease* s) {
  s->struct_size = sizeof(SharedLease);
  s->creator_pid = Self().pid;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(&s->mu, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) return LeaseStatus::Error(LeaseCode::kInternal, "pthread_mutex_init failed");
  s->wake_seq.store(0);
  s->holder = Owner{0, 0};
  s->last_holder = Owner{0, 0};
  s->num_waiters = 0;
  s->total_handoffs = s->total_recoveries = 0;
  s->magic.store(kMagic, std::memory_order_release);
  return LeaseStatus::Ok();
}

// Maps an existing segment if it is initialised and of our layout. *stale is set when the
// segment can never become valid (wrong size or magic, or its creator died mid-initialisation).
SharedLease* MapExisting(int fd, bool* stale) {
  *stale = false;
  for (int attempt = 0; attempt < kOpenAttempts; ++attempt) {
    struct stat st;
    if (fstat(fd, &st) != 0) return nullptr;
    if (st.st_size == static_cast<off_t>(sizeof(SharedLease))) {
      void* p = mmap(nullptr, sizeof(SharedLease), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return nullptr;
      auto* s = static_cast<SharedLease*>(p);
      const uint64_t magic = s->magic.load(std::memory_order_acquire);
      if (magic == kMagic && s->struct_size == sizeof(SharedLease)) return s;
      const bool creator_gone = s->creator_pid != 0 && kill(s->creator_pid, 0) != 0 && errno == ESRCH;
      munmap(p, sizeof(SharedLease));
      if (magic != 0 || creator_gone) {
        *stale = true;
        return nullptr;
      }
    } else if (st.st_size != 0) {
      *stale = true;  // another layout: a different version or garbage
      return nullptr;
    }
    usleep(5000);  // creator between shm_open and initialisation
  }
  *stale = true;  // never initialised within the bound: its creator is stuck or dead
  return nullptr;
}

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::weak_ptr<DeviceLease>>& Registry() {
  static auto* registry = new std::map<std::string, std::weak_ptr<DeviceLease>>();
  return *registry;
}

}  // namespace

LeaseStatus DeviceLease::ValidateName(const std::string& group, const std::string& device_key) {
  if (!ValidChars(group, 64)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease group '" + group +
                                  "' is invalid: use 1-64 characters from [A-Za-z0-9_-]");
  }
  if (!ValidChars(device_key, 32)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease device key '" + device_key +
                                  "' is invalid: use 1-32 characters from [A-Za-z0-9_-]");
  }
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::Get(const std::string& group, const std::string& device_key,
                             std::shared_ptr<DeviceLease>* out) {
  LeaseStatus status = ValidateName(group, device_key);
  if (!status.ok()) return status;
  const std::string name = SegmentName(group, device_key);
  std::lock_guard<std::mutex> registry_lock(RegistryMutex());
  if (auto existing = Registry()[name].lock()) {
    *out = existing;
    return LeaseStatus::Ok();
  }
  SharedLease* shared = nullptr;
  for (int attempt = 0; attempt < 8 && shared == nullptr; ++attempt) {
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {  // we create it
      if (ftruncate(fd, sizeof(SharedLease)) != 0) {
        close(fd);
        return LeaseStatus::Error(LeaseCode::kInternal, Errno("ftruncate " + name));
      }
      void* p = mmap(nullptr, sizeof(SharedLease), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) return LeaseStatus::Error(LeaseCode::kInternal, Errno("mmap " + name));
      shared = static_cast<SharedLease*>(p);
      status = InitShared(shared);
      if (!status.ok()) return status;
      break;
    }
    if (errno != EEXIST) return LeaseStatus::Error(LeaseCode::kInternal, Errno("shm_open " + name));
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) {
      if (errno == ENOENT) continue;  // removed between our two opens
      return LeaseStatus::Error(LeaseCode::kInternal, Errno("shm_open " + name));
    }
    bool stale = false;
    shared = MapExisting(fd, &stale);
    close(fd);
    if (shared == nullptr) {
      if (!stale) return LeaseStatus::Error(LeaseCode::kInternal, Errno("mapping " + name));
      Warn("removing stale or incompatible segment /dev/shm" + name + " and recreating it");
      shm_unlink(name.c_str());
    }
  }
  if (shared == nullptr) {
    return LeaseStatus::Error(LeaseCode::kInternal, "could not open lease segment " + name);
  }
  std::shared_ptr<DeviceLease> lease(new DeviceLease(name, shared));
  status = lease->Lock(/*check_liveness=*/true);  // repairs state left by crashed runs
  if (!status.ok()) return status;
  lease->Unlock();
  Registry()[name] = lease;
  *out = lease;
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::Unlink(const std::string& group, const std::string& device_key) {
  LeaseStatus status = ValidateName(group, device_key);
  if (!status.ok()) return status;
  if (shm_unlink(SegmentName(group, device_key).c_str()) != 0 && errno != ENOENT) {
    return LeaseStatus::Error(LeaseCode::kInternal, Errno("shm_unlink"));
  }
  return LeaseStatus::Ok();
}

DeviceLease::DeviceLease(std::string name, SharedLease* shared)
    : name_(std::move(name)), shared_(shared) {
  events_.reserve(256);
}

DeviceLease::~DeviceLease() {
  Release();
  munmap(shared_, sizeof(SharedLease));
}

LeaseStatus DeviceLease::Lock(bool check_liveness) {
  const int rc = pthread_mutex_lock(&shared_->mu);
  if (rc == EOWNERDEAD) {
    // A process died inside the critical section: the state may be half-updated.
    pthread_mutex_consistent(&shared_->mu);
    Warn("previous owner of " + name_ + " died while updating it; repairing");
    RepairLocked(/*check_liveness=*/true);
    return LeaseStatus::Ok();
  }
  if (rc != 0) {
    return LeaseStatus::Error(
        LeaseCode::kInternal,
        "lease " + name_ + " is unusable (" + strerror(rc) + "); remove /dev/shm" + name_);
  }
  RepairLocked(check_liveness);
  return LeaseStatus::Ok();
}

void DeviceLease::Unlock() { pthread_mutex_unlock(&shared_->mu); }

void DeviceLease::RepairLocked(bool check_liveness) {
  SharedLease* s = shared_;
  uint64_t repaired = 0;
  if (s->num_waiters < 0 || s->num_waiters > kMaxWaiters || s->holder.pid < 0) {
    Warn("lease " + name_ + " had impossible state; resetting it");
    s->num_waiters = 0;
    s->holder = Owner{0, 0};
    ++repaired;
  }
  if (check_liveness) {
    const Owner me = Self();
    if (s->holder.pid != 0 && !(s->holder == me) && !Alive(s->holder)) {
      Warn("holder pid " + std::to_string(s->holder.pid) + " of " + name_ + " is dead; reclaiming");
      s->holder = Owner{0, 0};
      ++repaired;
    }
    int kept = 0;
    for (int i = 0; i < s->num_waiters; ++i) {
      if (s->waiters[i].who == me || Alive(s->waiters[i].who)) {
        s->waiters[kept++] = s->waiters[i];
      } else {
        ++repaired;
      }
    }
    s->num_waiters = kept;
  }
  if (repaired) {
    s->total_recoveries += repaired;
    s->wake_seq.fetch_add(1);
    Futex(&s->wake_seq, FUTEX_WAKE, INT_MAX, nullptr);
    std::lock_guard<std::mutex> stats_lock(local_mu_);
    stats_.recoveries += repaired;
  }
}

LeaseStatus DeviceLease::Acquire(double timeout_s, int64_t tag) {
  const Owner me = Self();
  const int64_t start_mono = MonoNs();
  const int64_t request_wall = WallNs();
  const int64_t deadline = start_mono + static_cast<int64_t>(timeout_s * 1e9);
  SharedLease* s = shared_;
  LeaseStatus status = Lock(/*check_liveness=*/false);
  if (!status.ok()) return status;
  if (s->holder == me) {
    Unlock();
    return LeaseStatus::Ok();
  }
  bool contended = false;
  for (int64_t polls = 0;; ++polls) {
    const bool first_in_line = s->num_waiters == 0 || s->waiters[0].who == me;
    if (s->holder.pid == 0 && first_in_line) break;
    if (!contended) {  // queue up once; FIFO order makes two contenders alternate
      contended = true;
      if (s->num_waiters >= kMaxWaiters) {
        Unlock();
        return LeaseStatus::Error(LeaseCode::kResourceExhausted,
                                  "lease " + name_ + " has too many waiters");
      }
      s->waiters[s->num_waiters++] = Waiter{me, request_wall};
    }
    const int64_t now = MonoNs();
    if (now >= deadline) {
      int kept = 0;
      for (int i = 0; i < s->num_waiters; ++i) {
        if (!(s->waiters[i].who == me)) s->waiters[kept++] = s->waiters[i];
      }
      s->num_waiters = kept;
      const int32_t holder = s->holder.pid;
      const double held_s = holder ? (WallNs() - s->held_since_wall_ns) / 1e9 : 0.0;
      Unlock();
      std::ostringstream msg;
      msg << "crossover lease " << name_ << ": acquire timed out after " << timeout_s << " s; ";
      if (holder) {
        msg << "held by pid " << holder << " for " << held_s << " s";
      } else {
        msg << "queued behind another waiting process";
      }
      msg << " (a peer job stuck or holding the device too long?)";
      return LeaseStatus::Error(LeaseCode::kDeadlineExceeded, msg.str());
    }
    const uint32_t seq = s->wake_seq.load();
    Unlock();
    const int64_t wait_ns = std::min(kPollNs, deadline - now);
    timespec ts{static_cast<time_t>(wait_ns / 1000000000), static_cast<long>(wait_ns % 1000000000)};
    Futex(&s->wake_seq, FUTEX_WAIT, seq, &ts);
    status = Lock(/*check_liveness=*/true);
    if (!status.ok()) return status;
  }
  if (contended) {  // we are the queue head
    std::copy(s->waiters + 1, s->waiters + s->num_waiters, s->waiters);
    --s->num_waiters;
  }
  const bool handoff = s->last_holder.pid != 0 && !(s->last_holder == me);
  s->holder = me;
  s->last_holder = me;
  s->held_since_wall_ns = WallNs();
  if (handoff) ++s->total_handoffs;
  const int64_t acquired_wall = s->held_since_wall_ns;
  Unlock();

  const int64_t acquired_mono = MonoNs();
  std::lock_guard<std::mutex> stats_lock(local_mu_);
  const double waited = (acquired_mono - start_mono) / 1e9;
  stats_.acquires++;
  stats_.handoffs += handoff;
  stats_.contended += contended;
  stats_.wait_s += waited;
  stats_.max_wait_s = std::max(stats_.max_wait_s, waited);
  stats_.held = true;
  held_since_mono_ns_ = acquired_mono;
  LeaseEvent event{request_wall, acquired_wall, 0, tag};
  if (events_.size() < kTimelineCapacity) {
    events_.push_back(event);
    next_event_ = events_.size() % kTimelineCapacity;
  } else {
    events_[next_event_] = event;
    next_event_ = (next_event_ + 1) % kTimelineCapacity;
  }
  return LeaseStatus::Ok();
}

bool DeviceLease::Release() {
  const Owner me = Self();
  SharedLease* s = shared_;
  if (!Lock(/*check_liveness=*/false).ok()) return false;
  if (!(s->holder == me)) {
    Unlock();
    return false;
  }
  s->holder = Owner{0, 0};
  const bool wake = s->num_waiters > 0;
  s->wake_seq.fetch_add(1);
  Unlock();
  if (wake) Futex(&s->wake_seq, FUTEX_WAKE, INT_MAX, nullptr);

  const int64_t released_mono = MonoNs();
  const int64_t released_wall = WallNs();
  std::lock_guard<std::mutex> stats_lock(local_mu_);
  const double held = (released_mono - held_since_mono_ns_) / 1e9;
  stats_.hold_s += held;
  stats_.max_hold_s = std::max(stats_.max_hold_s, held);
  stats_.held = false;
  if (!events_.empty()) {
    const size_t last = (next_event_ + events_.size() - 1) % events_.size();
    events_[last].released_ns = released_wall;
  }
  return true;
}

LeaseStats DeviceLease::Stats() const {
  std::lock_guard<std::mutex> stats_lock(local_mu_);
  return stats_;
}

std::vector<LeaseEvent> DeviceLease::Timeline() const {
  std::lock_guard<std::mutex> stats_lock(local_mu_);
  if (events_.size() < kTimelineCapacity) return events_;
  std::vector<LeaseEvent> ordered(events_.begin() + next_event_, events_.end());
  ordered.insert(ordered.end(), events_.begin(), events_.begin() + next_event_);
  return ordered;
}

}  // namespace crossover
