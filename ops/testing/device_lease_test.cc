// Tests of the lease core on its own (no TensorFlow): the states that are rare in real runs
// (a process dead or stopped inside the critical section, a creator that stalls, a queue left
// half-shifted) are made on purpose, in real processes.
//
//   device_lease_test            runs every test
//   device_lease_test NAME ...   runs the named tests;  --list prints the names
#include "core/lease_dir.h"
#include "core/link_turn.h"
#include "testing/lease_test_hooks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace crossover {
namespace {

struct Failure {
  std::string what;
};

#define EXPECT(cond, msg)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::ostringstream _m;                                                              \
      _m << __LINE__ << ": " #cond ": " << msg;                                           \
      throw Failure{_m.str()};                                                            \
    }                                                                                     \
  } while (0)

double MonoS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// A group of our own for each test, in /dev/shm or in dir; its segment is removed when the
// test ends.
struct TestGroup {
  std::string group, key = "dev";
  SegmentLocation options;
  explicit TestGroup(const std::string& test, const std::string& dir = "") {
    group = "ut" + std::to_string(getpid()) + "-" + test;
    options.dir = dir;
    unlink(Path().c_str());
  }
  ~TestGroup() { unlink(Path().c_str()); }
  std::string Path() const {
    return (options.dir.empty() ? kDefaultLeaseDir : options.dir) + "/crossover." + group + "." +
           key;
  }
  std::shared_ptr<DeviceLease> Open(const std::string& job = "") const {
    std::shared_ptr<DeviceLease> lease;
    SegmentLocation with_job = options;
    with_job.job = job;
    const LeaseStatus status = DeviceLease::Get(group, key, &lease, with_job);
    EXPECT(status.ok(), status.message);
    return lease;
  }
  std::shared_ptr<LinkTurn> OpenLinkTurn() const {
    std::shared_ptr<LinkTurn> turn;
    const LeaseStatus status = LinkTurn::Get(group, key, &turn, options);
    EXPECT(status.ok(), status.message);
    return turn;
  }
};

// A fresh directory under /tmp, removed (empty) at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "/tmp/crossover-ut-XXXXXX";
    EXPECT(mkdtemp(name) != nullptr, "mkdtemp");
    path = name;
  }
  ~TempDir() { rmdir(path.c_str()); }
};

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Runs body in a forked child; returns its exit code (or 128 + signal).
int InChild(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A child that holds the lease until told to let go (or until its 30 s bound).
struct HolderChild {
  pid_t pid = -1;
  int to_child[2], from_child[2];
  explicit HolderChild(const TestGroup& g) {
    EXPECT(pipe(to_child) == 0 && pipe(from_child) == 0, "pipe");
    pid = fork();
    if (pid == 0) {
      auto lease = g.Open();
      if (!lease->Acquire(10, 0).ok()) _exit(1);
      char byte = 'h';
      if (write(from_child[1], &byte, 1) != 1) _exit(1);
      alarm(30);
      if (read(to_child[0], &byte, 1) != 1) _exit(1);
      lease->Yield();
      _exit(0);
    }
    char byte;
    EXPECT(read(from_child[0], &byte, 1) == 1, "holder did not start");
  }
  int LetGo() {
    char byte = 'g';
    EXPECT(write(to_child[1], &byte, 1) == 1, "pipe");
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~HolderChild() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);
  }
};

// A child that takes the lease's internal mutex and stops (as Ctrl-Z would), holding it.
pid_t StoppedInsideTheLock(const TestGroup& g) {
  const pid_t child = fork();
  if (child == 0) {
    auto mine = g.Open();
    LeaseTestHooks::LockInternal(*mine);
    raise(SIGSTOP);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, WUNTRACED);
  EXPECT(WIFSTOPPED(status), "child did not stop");
  return child;
}

// ----- tests ------------------------------------------------------------------------------

void TestValidation() {
  EXPECT(DeviceLease::ValidateName("g_1-A", "gpu0").ok(), "valid names rejected");
  for (const std::string& bad : std::vector<std::string>{"", "a b", "x/y", "nl\n", std::string(kMaxGroupLen + 1, 'a')}) {
    const LeaseStatus s = DeviceLease::ValidateName(bad, "gpu0");
    EXPECT(s.code == LeaseCode::kInvalidArgument, "group '" << bad << "' accepted");
  }
  EXPECT(!DeviceLease::ValidateName("g", std::string(kMaxDeviceKeyLen + 1, 'k')).ok(), "long key");
  EXPECT(DeviceLease::ValidateTimeout(600).ok(), "600 s rejected");
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {0.0, -1.0, inf, std::nan(""), 1e10}) {
    const LeaseStatus s = DeviceLease::ValidateTimeout(bad);
    EXPECT(s.code == LeaseCode::kInvalidArgument && Contains(s.message, "timeout"),
           bad << " accepted: " << s.message);
  }
  TestGroup g("validation");
  const LeaseStatus s = g.Open()->Acquire(inf, 0);
  EXPECT(s.code == LeaseCode::kInvalidArgument, "Acquire(inf) did not fail cleanly");
}

Waiter W(uint64_t nonce, uint64_t ticket) {
  Waiter w;
  w.who.nonce = nonce;
  w.ticket = ticket;
  return w;
}

void TestQueueRepair() {
  WaiterQueue q{};
  for (uint64_t t = 1; t <= 3; ++t) EXPECT(q.Push(W(10 + t, t)), "push");
  EXPECT(q.Index(2) == 1 && q.Remove(2) && q.Index(2) == -1 && q.size == 2, "remove own only");
  EXPECT(!q.Remove(2), "removed twice");
  auto all_alive = [](const Owner&) { return true; };
  // What a crash leaves in the middle of removing the head of [A, B, C]: B copied over A and
  // C over B, but the size not yet decremented: [B, C, C]. Or only the first copy: [B, B, C].
  for (std::vector<uint64_t> left : {std::vector<uint64_t>{2, 3, 3}, {2, 2, 3}}) {
    WaiterQueue half{};
    half.size = 3;
    for (int i = 0; i < 3; ++i) half.entries[i] = W(10 + left[i], left[i]);
    EXPECT(half.Repair(all_alive, 0) == 1, "one duplicate expected");
    EXPECT(half.size == 2 && half.entries[0].ticket == 2 && half.entries[1].ticket == 3,
           "repaired queue is not [B, C]");
  }
  WaiterQueue dead{};
  dead.Push(W(1, 1));
  dead.Push(W(2, 2));
  EXPECT(dead.Repair([](const Owner& o) { return o.nonce != 1; }, 0) == 1, "dead entry kept");
  EXPECT(dead.size == 1 && dead.entries[0].ticket == 2, "wrong survivor");
  WaiterQueue garbage{};
  garbage.size = 1000;
  garbage.Repair(all_alive, 0);
  EXPECT(garbage.size == 0, "impossible size not repaired");
  WaiterQueue expiring{};  // a live waiter's entry past its deadline stands for nobody
  for (uint64_t t = 1; t <= 2; ++t) {
    Waiter w = W(t, t);
    w.deadline_host_mono_ns = 1000 * t;
    expiring.Push(w);
  }
  EXPECT(expiring.Repair(all_alive, 1500) == 1, "expired entry kept");
  EXPECT(expiring.size == 1 && expiring.entries[0].ticket == 2, "wrong survivor");
  WaiterQueue full{};
  for (int i = 0; i < kMaxWaiters; ++i) EXPECT(full.Push(W(1, i + 1)), "push");
  EXPECT(!full.Push(W(1, 999)), "pushed past capacity");
}

void TestReentrantAndStats() {
  TestGroup g("reentrant");
  auto lease = g.Open();
  EXPECT(lease->Acquire(1, 7).ok() && lease->Acquire(1, 7).ok(), "acquire");
  EXPECT(lease->Stats().acquires == 1 && lease->Stats().held, "re-entrant acquire counted");
  EXPECT(lease->Yield().ok() && lease->Yield().ok(), "yield");
  const LeaseStats s = lease->Stats();
  EXPECT(!s.held && s.Values().size() == sizeof(kLeaseStatsFields) / sizeof(char*), "stats");
  const std::vector<LeaseEvent> events = lease->Timeline();
  EXPECT(events.size() == 1 && events[0].tag == 7 && events[0].yielded_ns >= events[0].acquired_ns,
         "timeline");
}

void TestFailedDrainStillYields() {
  TestGroup g("drain");
  auto lease = g.Open();
  EXPECT(lease->Acquire(1, 0).ok(), "acquire");
  const LeaseStatus s = lease->YieldAfter(
      [] { return LeaseStatus::Error(LeaseCode::kInternal, "stream failed"); });
  EXPECT(s.code == LeaseCode::kInternal && s.message == "stream failed", "drain error lost");
  EXPECT(!lease->Stats().held, "still held after a failed drain");
  EXPECT(InChild([&] { return g.Open()->Acquire(0.5, 0).ok() ? 0 : 1; }) == 0,
         "a peer could not acquire after the failed drain");
}

void TestForeignOrOpenSegmentRefused() {
  TestGroup g("owner");
  int fd = open(g.Path().c_str(), O_CREAT | O_RDWR, 0600);
  fchmod(fd, 0644);
  close(fd);
  std::shared_ptr<DeviceLease> lease;
  LeaseStatus s = DeviceLease::Get(g.group, g.key, &lease);
  EXPECT(s.code == LeaseCode::kPermissionDenied && Contains(s.message, "0644"), s.message);
  struct stat st;
  EXPECT(stat(g.Path().c_str(), &st) == 0, "a refused segment must not be deleted");
  if (geteuid() == 0) {
    chmod(g.Path().c_str(), 0600);
    EXPECT(chown(g.Path().c_str(), 65534, 65534) == 0, "chown");
    s = DeviceLease::Get(g.group, g.key, &lease);
    EXPECT(s.code == LeaseCode::kPermissionDenied && Contains(s.message, "uid 65534"), s.message);
  }
}

// A process stopped (Ctrl-Z) inside the critical section: acquire must fail within its timeout
// with a message that names the process, and work again once that process is gone.
void TestStoppedInsideCriticalSection() {
  TestGroup g("stopped");
  auto lease = g.Open();
  const pid_t child = StoppedInsideTheLock(g);
  const double start = MonoS();
  const LeaseStatus s = lease->Acquire(1.0, 0);
  const double took = MonoS() - start;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT(s.code == LeaseCode::kDeadlineExceeded && Contains(s.message, "internal lock") &&
             Contains(s.message, std::to_string(child)),
         s.message);
  EXPECT(took < 3.0, "took " << took << " s");
  const uint64_t before = lease->Stats().recoveries;
  EXPECT(lease->Acquire(2.0, 0).ok(), "lease unusable after the stopped process died");
  EXPECT(lease->Stats().recoveries > before, "the owner-died repair did not run");
  lease->Yield();
}

// A creator that stalls between sizing and initialising the segment: a second starter must
// wait for it and use the same segment, never replace it.
void TestStalledCreatorIsWaitedFor() {
  TestGroup g("stall");
  struct Shared {
    std::atomic<int> inside, overlaps, done;
  };
  auto* shared = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                                           MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (shared) Shared{};
  auto cycle = [&](double hold_s) {
    auto lease = g.Open();
    for (int i = 0; i < 5; ++i) {
      if (!lease->Acquire(10, 0).ok()) return 1;
      if (shared->inside.fetch_add(1) != 0) shared->overlaps++;
      usleep(static_cast<useconds_t>(hold_s * 1e6));
      shared->inside.fetch_sub(1);
      lease->Yield();
    }
    return 0;
  };
  const pid_t creator = fork();
  if (creator == 0) {
    LeaseTestHooks::SetInitDelayMs(1500);
    _exit(cycle(0.05));
  }
  usleep(200000);  // the creator is now inside its 1.5 s stall
  const int mine = cycle(0.05);
  int status = 0;
  waitpid(creator, &status, 0);
  EXPECT(mine == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "a starter failed");
  EXPECT(shared->overlaps.load() == 0, shared->overlaps.load() << " overlaps: two segments");
  munmap(shared, sizeof(Shared));
}

// A process that dies inside the critical section leaves the robust mutex owner-dead; the
// next locker repairs and carries on.
void TestDeathInsideCriticalSection() {
  TestGroup g("ownerdead");
  auto lease = g.Open();
  EXPECT(InChild([&] {
           auto mine = g.Open();
           LeaseTestHooks::LockInternal(*mine);
           WaiterQueue& q = LeaseTestHooks::Queue(*mine);
           q.size = 2;  // a half-done update: a duplicate, dead entry
           q.entries[0] = q.entries[1] = W(12345, 1);
           return 0;
         }) == 0,
         "child");
  const uint64_t before = lease->Stats().recoveries;
  EXPECT(lease->Acquire(2.0, 0).ok(), "acquire after a death inside the critical section");
  EXPECT(lease->Stats().recoveries > before, "no repair counted");
  EXPECT(LeaseTestHooks::Queue(*lease).size == 0, "dead entries left in the queue");
  lease->Yield();
}

// Past kMaxWaiters waiting threads, a further waiter gets a clear error at once.
void TestFullQueueIsAClearError() {
  TestGroup g("full");
  auto lease = g.Open();
  HolderChild holder(g);
  std::vector<std::thread> waiters;
  std::atomic<int> ok{0};
  for (int i = 0; i < kMaxWaiters; ++i) {
    waiters.emplace_back([&] { ok += lease->Acquire(20, 0).ok(); });
  }
  for (int i = 0; i < 200 && LeaseTestHooks::Queue(*lease).size < kMaxWaiters; ++i) {
    usleep(10000);
  }
  EXPECT(LeaseTestHooks::Queue(*lease).size == kMaxWaiters, "waiters did not queue");
  const double start = MonoS();
  const LeaseStatus s = lease->Acquire(5, 0);
  EXPECT(s.code == LeaseCode::kResourceExhausted && Contains(s.message, "waiting threads"),
         s.message);
  EXPECT(MonoS() - start < 1.0, "the error was not immediate");
  EXPECT(holder.LetGo() == 0, "holder");
  for (auto& t : waiters) t.join();
  EXPECT(ok.load() == kMaxWaiters, "queued waiters did not all get the device");
  lease->Yield();
}

// Processes forked from one parent must get distinct identities, or each would take the
// other's hold for its own (re-entrant) and both would be on the device.
void TestForkedProcessesHaveDistinctIdentities() {
  TestGroup warm("warm"), g("forked");
  warm.Open()->Acquire(1, 0);  // the parent has drawn an identity before forking
  HolderChild holder(g);       // child's first identity on g is drawn after the fork
  const LeaseStatus s = g.Open()->Acquire(0.3, 0);
  EXPECT(s.code == LeaseCode::kDeadlineExceeded, "parent entered while its child held: "
                                                     << s.message);
  EXPECT(holder.LetGo() == 0, "holder");
}

// Waiters queue by priority class, FIFO within a class.
void TestQueueOrdersByPriority() {
  WaiterQueue q{};
  const int32_t classes[] = {kNormal, kSecondary, kPrimary, kNormal, kSecondary, kPrimary};
  for (uint64_t t = 0; t < 6; ++t) {
    Waiter w = W(100 + t, t + 1);
    w.priority = classes[t];
    EXPECT(q.Push(w), "push");
  }
  const uint64_t expected[] = {3, 6, 1, 4, 2, 5};
  for (int i = 0; i < 6; ++i) {
    EXPECT(q.entries[i].ticket == expected[i], "position " << i << ": ticket "
                                                          << q.entries[i].ticket);
  }
}

// A process that acquires in a child and reports when, through shared memory.
struct TimedAcquirer {
  pid_t pid;
  std::atomic<int64_t>* acquired_ns;
  TimedAcquirer(const TestGroup& g, int32_t priority, double timeout_s) {
    acquired_ns = static_cast<std::atomic<int64_t>*>(
        mmap(nullptr, sizeof(std::atomic<int64_t>), PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    acquired_ns->store(0);
    pid = fork();
    if (pid == 0) {
      auto lease = g.Open();
      if (!lease->Acquire(timeout_s, 0, priority).ok()) _exit(1);
      acquired_ns->store(static_cast<int64_t>(MonoS() * 1e9));
      lease->Yield();
      _exit(0);
    }
  }
  int Wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  double AcquiredS() const { return acquired_ns->load() / 1e9; }
};

void WaitForQueue(DeviceLease& lease, int size) {
  for (int i = 0; i < 500 && LeaseTestHooks::Queue(lease).size < size; ++i) usleep(2000);
  EXPECT(LeaseTestHooks::Queue(lease).size == size, "waiters did not queue");
}

void TestPrimaryGoesBeforeEarlierSecondary() {
  TestGroup g("prio");
  auto lease = g.Open();
  EXPECT(lease->Acquire(1, 0).ok(), "acquire");
  TimedAcquirer secondary(g, kSecondary, 10);
  WaitForQueue(*lease, 1);
  TimedAcquirer primary(g, kPrimary, 10);
  WaitForQueue(*lease, 2);
  EXPECT(LeaseTestHooks::Queue(*lease).entries[0].priority == kPrimary, "primary not first");
  lease->Yield();
  EXPECT(primary.Wait() == 0 && secondary.Wait() == 0, "acquirers failed");
  EXPECT(primary.AcquiredS() < secondary.AcquiredS(), "secondary went first");
}

// A primary's reservation keeps a waiting secondary out for its duration, lets the primary
// itself straight back in, and never blocks a waiter of the same class.
void TestReservationKeepsLowerClassesOut() {
  TestGroup g("reserve");
  auto lease = g.Open();
  EXPECT(lease->Acquire(1, 0, kPrimary).ok(), "acquire");
  TimedAcquirer secondary(g, kSecondary, 10);
  WaitForQueue(*lease, 1);
  EXPECT(lease->Yield(2.0).ok(), "yield with reservation");
  usleep(100000);
  EXPECT(secondary.AcquiredS() == 0, "secondary took a reserved lease");
  const double back = MonoS();
  EXPECT(lease->Acquire(1, 0, kPrimary).ok() && MonoS() - back < 0.05, "reserver not let in");
  const double released = MonoS();
  EXPECT(lease->Yield(0.3).ok(), "yield");
  EXPECT(secondary.Wait() == 0, "secondary failed");
  const double waited = secondary.AcquiredS() - released;
  EXPECT(waited > 0.25 && waited < 1.0, "secondary waited " << waited << " s, not ~0.3 s");

  EXPECT(lease->Acquire(1, 0, kNormal).ok(), "acquire");
  TimedAcquirer peer(g, kNormal, 10);
  WaitForQueue(*lease, 1);
  const double handed = MonoS();
  EXPECT(lease->Yield(2.0).ok(), "yield");
  EXPECT(peer.Wait() == 0 && peer.AcquiredS() - handed < 0.5, "same class was held out");
  EXPECT(DeviceLease::ValidateReserve(-1).code == LeaseCode::kInvalidArgument &&
             DeviceLease::ValidatePriority(3).code == LeaseCode::kInvalidArgument,
         "bad reservation or priority accepted");
}

struct Test {
  const char* name;
  void (*fn)();
};

// ----- link turns -------------------------------------------------------------------------

// Memory shared by a test and its forked jobs: a start barrier and the order turns were taken.
struct TurnLog {
  std::atomic<int> ready;
  std::atomic<int> size;
  int positions[64];
  static TurnLog* Make() {
    void* p = mmap(nullptr, sizeof(TurnLog), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    EXPECT(p != MAP_FAILED, "mmap");
    return new (p) TurnLog{};
  }
  void Record(int position) { positions[size.fetch_add(1)] = position; }
  std::string Order() const {
    std::string out;
    for (int i = 0; i < size.load(); ++i) out += std::to_string(positions[i]);
    return out;
  }
};

pid_t Spawn(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    _exit(body());
  }
  return pid;
}

int Reap(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Joins at position and starts where Join says (what one rank alone would agree on).
bool JoinAndStart(LinkTurn& turn, int position, int jobs) {
  int64_t next = 0;
  return turn.Join(position, jobs, &next).ok() &&
         turn.Start(next == kLinkTurnUnconstrained ? 0 : next).ok();
}

// Joins at position, waits until `jobs` processes have joined, then takes `turns` turns, each
// "allreducing" for hold_ms. Exit code 0 only if no turn was skipped.
int TurnJob(const TestGroup& g, TurnLog* log, int position, int jobs, int turns, int hold_ms) {
  auto turn = g.OpenLinkTurn();
  if (!JoinAndStart(*turn, position, jobs)) return 2;
  log->ready.fetch_add(1);
  while (log->ready.load() < jobs) usleep(1000);
  for (int k = 0; k < turns; ++k) {
    bool skipped = true;
    if (!turn->Wait(10, &skipped).ok() || skipped) return 3;
    log->Record(position);
    usleep(hold_ms * 1000);
    if (!turn->Done().ok()) return 4;
  }
  return turn->Leave().ok() ? 0 : 5;
}

void TestTurnValidation() {
  EXPECT(LinkTurn::ValidatePosition(1, 2).ok(), "position 1 of 2 rejected");
  for (auto [p, j] : std::vector<std::pair<int, int>>{{2, 2}, {-1, 2}, {0, 0},
                                                      {0, kMaxLinkTurnJobs + 1}}) {
    EXPECT(!LinkTurn::ValidatePosition(p, j).ok(), "accepted position " << p << " of " << j);
  }
  TestGroup g("turn_validation");
  auto turn = g.OpenLinkTurn();
  bool skipped;
  EXPECT(Contains(turn->Wait(1, &skipped).message, "not joined"), "wait before join");
  EXPECT(Contains(turn->Done().message, "not joined"), "done before join");
  int64_t next;
  EXPECT(turn->Join(0, 2, &next).ok() && next == kLinkTurnUnconstrained, "join");
  EXPECT(Contains(turn->Wait(1, &skipped).message, "TurnStart first"), "wait before start");
  EXPECT(!turn->Start(kLinkTurnUnconstrained).ok(), "unconstrained offset accepted");
  // Another job that claims the same position, or another job count, is refused.
  const int taken = InChild([&] {
    int64_t n;
    const LeaseStatus s = g.OpenLinkTurn()->Join(0, 2, &n);
    return Contains(s.message, "position 0") && Contains(s.message, "is taken") ? 0 : 1;
  });
  EXPECT(taken == 0, "a second job joined at a taken position");
  const int count = InChild([&] {
    int64_t n;
    const LeaseStatus s = g.OpenLinkTurn()->Join(1, 3, &n);
    return Contains(s.message, "same count") ? 0 : 1;
  });
  EXPECT(count == 0, "a job with another job count joined");
}

// Two jobs take their turns alternately, whatever order they reach them in: job 1 reaches
// its turns faster, but still waits for job 0's before each of its own.
void TestTurnsAlternate() {
  TestGroup g("turns_alternate");
  TurnLog* log = TurnLog::Make();
  const pid_t a = Spawn([&] { return TurnJob(g, log, 0, 2, 5, 30); });
  const pid_t b = Spawn([&] { return TurnJob(g, log, 1, 2, 5, 1); });
  const int ra = Reap(a), rb = Reap(b);
  EXPECT(ra == 0 && rb == 0, "jobs failed or skipped turns: " << ra << ", " << rb);
  // Whichever joined second goes first (see LinkTurn::Join); then they alternate.
  EXPECT(log->Order() == "0101010101" || log->Order() == "1010101010",
         "turn order " << log->Order());
  munmap(log, sizeof(TurnLog));
}

// A job that joins late takes the turn just before the next one of the jobs already turning:
// it does not wait for them (one may be paused), and they wait for its first allreduce.
void TestLateJobGoesFirst() {
  TestGroup g("late_job");
  auto turn = g.OpenLinkTurn();
  EXPECT(JoinAndStart(*turn, 0, 2), "join");
  bool skipped;
  for (int k = 0; k < 3; ++k) {
    EXPECT(turn->Wait(1, &skipped).ok() && !skipped, "turn alone");
    EXPECT(turn->Done().ok(), "done");
  }
  TurnLog* log = TurnLog::Make();
  const pid_t late = Spawn([&] {
    auto l = g.OpenLinkTurn();
    int64_t n = -1;
    // Turn (2, 1) is the latest before job 0's next turn (3, 0).
    if (!l->Join(1, 2, &n).ok() || n != 2) return 1;
    if (!l->Start(n).ok()) return 2;
    bool sk = true;
    const double t0 = MonoS();
    if (!l->Wait(5, &sk).ok() || sk || MonoS() - t0 > 1) return 3;
    log->ready.store(1);
    usleep(300 * 1000);  // its first allreduce
    log->Record(1);
    return l->Done().ok() && l->Leave().ok() ? 0 : 4;
  });
  while (log->ready.load() < 1) usleep(1000);
  EXPECT(turn->Wait(5, &skipped).ok() && !skipped, "turn after the late job's");
  log->Record(0);
  EXPECT(Reap(late) == 0, "late joiner failed");
  EXPECT(log->Order() == "10", "job 0 went before the late job's first turn: " << log->Order());
  // A job alone, or the first of its group, is unconstrained.
  TestGroup alone("late_job_alone");
  int64_t first = 0;
  EXPECT(alone.OpenLinkTurn()->Join(1, 2, &first).ok() && first == kLinkTurnUnconstrained, "alone");
  EXPECT(turn->Leave().ok(), "leave");
  munmap(log, sizeof(TurnLog));
}

// A job that died (or left) is not waited for; a live one that pauses is, for wait_s at most.
void TestDeadOrPausedPeer() {
  TestGroup g("dead_or_paused");
  int to_child[2];
  EXPECT(pipe(to_child) == 0, "pipe");
  TurnLog* log = TurnLog::Make();
  auto turn = g.OpenLinkTurn();
  EXPECT(JoinAndStart(*turn, 1, 2), "join");
  bool skipped = true;
  EXPECT(turn->Wait(1, &skipped).ok() && !skipped && turn->Done().ok(), "alone");
  // The peer joins now, so its first turn comes before our next one; then it pauses.
  const pid_t paused = Spawn([&] {
    auto l = g.OpenLinkTurn();
    if (!JoinAndStart(*l, 0, 2)) return 1;
    log->ready.fetch_add(1);
    char byte;
    return read(to_child[0], &byte, 1) == 1 ? 0 : 2;  // alive, never turning, until told
  });
  while (log->ready.load() < 1) usleep(1000);
  double t0 = MonoS();
  EXPECT(turn->Wait(0.3, &skipped).ok() && skipped, "did not skip a paused peer");
  EXPECT(MonoS() - t0 >= 0.29 && MonoS() - t0 < 2, "waited " << MonoS() - t0);
  kill(paused, SIGKILL);
  Reap(paused);
  EXPECT(turn->Done().ok(), "done");
  t0 = MonoS();
  EXPECT(turn->Wait(5, &skipped).ok() && !skipped, "waited for a dead peer");
  EXPECT(MonoS() - t0 < 1, "a dead peer held us " << MonoS() - t0 << " s");
  const LinkTurnStats stats = turn->Stats();
  EXPECT(stats.turns == 3 && stats.skipped == 1 && stats.waited == 1,
         "stats " << stats.turns << "/" << stats.skipped << "/" << stats.waited);
  const std::vector<LinkTurnEvent> turns = turn->Timeline();
  EXPECT(turns.size() == 3 && turns[0].skipped == 0 && turns[1].skipped == 1 &&
             turns[2].skipped == 0,
         "timeline of " << turns.size() << " turns");
  EXPECT(turns[1].start_ns - turns[1].request_ns >= 290000000 &&
             turns[1].done_ns >= turns[1].start_ns && turns[2].done_ns == 0,
         "turn times " << turns[1].request_ns << " " << turns[1].start_ns << " "
                       << turns[1].done_ns << " " << turns[2].done_ns);
  close(to_child[0]);
  close(to_child[1]);
  munmap(log, sizeof(TurnLog));
}

// A waiter whose wait for the internal lock times out (a process stopped inside it, then
// killed) must leave no ticket behind: once the holder lets go, a fresh process gets the lease
// at once, and so does the waiter itself, instead of queueing behind a ghost until it exits.
void TestWaiterStuckOnInternalLockLeavesNoTicket() {
  TestGroup g("ghost");
  auto lease = g.Open();  // the waiter, W
  HolderChild holder(g);  // H
  LeaseStatus first;
  std::thread waiter([&] { first = lease->Acquire(1.5, 0); });
  WaitForQueue(*lease, 1);
  const pid_t stopped = fork();  // S: stops inside the internal lock while W waits
  if (stopped == 0) {
    auto mine = g.Open();
    LeaseTestHooks::LockInternal(*mine);
    raise(SIGSTOP);
    _exit(0);
  }
  int status = 0;
  waitpid(stopped, &status, WUNTRACED);
  waiter.join();
  kill(stopped, SIGKILL);
  waitpid(stopped, nullptr, 0);
  EXPECT(WIFSTOPPED(status), "S did not stop");
  EXPECT(first.code == LeaseCode::kDeadlineExceeded && Contains(first.message, "internal lock"),
         "W did not time out on the internal lock: " << first.message);
  EXPECT(holder.LetGo() == 0, "holder");
  double start = MonoS();
  EXPECT(InChild([&] {
           const LeaseStatus s = g.Open()->Acquire(2.0, 0);
           if (!s.ok()) fprintf(stderr, "fresh acquire: %s\n", s.message.c_str());
           return s.ok() ? 0 : 1;
         }) == 0,
         "a fresh process could not acquire the free lease (a ghost ticket?)");
  EXPECT(MonoS() - start < 1.0, "the fresh acquire took " << MonoS() - start << " s");
  start = MonoS();
  const LeaseStatus again = lease->Acquire(2.0, 0);
  EXPECT(again.ok(), "W's own next acquire: " << again.message);
  EXPECT(MonoS() - start < 1.0, "W's next acquire took " << MonoS() - start << " s");
  EXPECT(LeaseTestHooks::Queue(*lease).size == 0, "tickets left in the queue");
  lease->Yield();
}

// A segment of an older layout (legacy header, 4800 bytes) that a live process of that build
// still uses, shown by a lock on a byte where that build kept its slots: it must be refused
// with both layouts named, and left as it is; once that process is gone it is replaced.
void TestOlderLayoutInUseIsRefused() {
  TestGroup g("oldlayout");
  const int fd = open(g.Path().c_str(), O_CREAT | O_RDWR, 0600);
  EXPECT(fd >= 0 && ftruncate(fd, 4800) == 0, "planting " << g.Path());
  const char legacy[12] = {'C', 'R', 'O', 'S', 'S', 'O', 'V', '3', '\xc0', '\x12', 0, 0};
  EXPECT(pwrite(fd, legacy, sizeof(legacy), 0) == sizeof(legacy), "pwrite");
  close(fd);
  int go[2], ready[2];
  EXPECT(pipe(go) == 0 && pipe(ready) == 0, "pipe");
  const pid_t user = fork();  // the old build's process: a slot lock, nothing else
  if (user == 0) {
    const int mine = open(g.Path().c_str(), O_RDWR);
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (1 << 20) + 3;
    fl.l_len = 1;
    char byte = 'r';
    if (mine < 0 || fcntl(mine, F_OFD_SETLK, &fl) != 0 || write(ready[1], &byte, 1) != 1) {
      _exit(1);
    }
    alarm(30);
    _exit(read(go[0], &byte, 1) == 1 ? 0 : 1);
  }
  char byte;
  EXPECT(read(ready[0], &byte, 1) == 1, "the old build's process did not start");
  std::shared_ptr<DeviceLease> lease;
  const LeaseStatus refused = DeviceLease::Get(g.group, g.key, &lease);
  struct stat st;
  const bool kept = stat(g.Path().c_str(), &st) == 0 && st.st_size == 4800;
  byte = 'g';
  EXPECT(write(go[1], &byte, 1) == 1, "pipe");
  int status = 0;
  waitpid(user, &status, 0);
  for (int p : {go[0], go[1], ready[0], ready[1]}) close(p);
  EXPECT(refused.code == LeaseCode::kPermissionDenied &&
             Contains(refused.message, "found 4800 bytes") &&
             Contains(refused.message, "layout version 3 (legacy") &&
             Contains(refused.message, "layout version 8") && Contains(refused.message, "in use"),
         refused.message);
  EXPECT(kept, "a segment in use was replaced");
  const LeaseStatus replaced = DeviceLease::Get(g.group, g.key, &lease);
  EXPECT(replaced.ok(), "not replaced once nobody used it: " << replaced.message);
  EXPECT(lease->Acquire(1, 0).ok() && lease->Yield().ok(), "acquire on the new segment");
}


// A lease directory holds the segment as a plain file; another directory (or /dev/shm) with
// the same names is another lease. A bad directory fails with a message naming it.
void TestLeaseDirectory() {
  TempDir dir;
  TestGroup g("dir", dir.path), shm("dir");
  auto lease = g.Open();
  struct stat st;
  EXPECT(stat(g.Path().c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600,
         "no private segment file at " << g.Path());
  EXPECT(lease->path() == g.Path(), lease->path());
  EXPECT(lease->Acquire(1, 0).ok(), "acquire in the directory");
  EXPECT(InChild([&] { return g.Open()->Acquire(0.3, 0).code == LeaseCode::kDeadlineExceeded ? 0 : 1; }) == 0,
         "a peer in the same directory did not wait");
  EXPECT(InChild([&] { return shm.Open()->Acquire(0.3, 0).ok() ? 0 : 1; }) == 0,
         "/dev/shm and the directory are the same lease");
  lease->Yield();
  std::shared_ptr<DeviceLease> none;
  SegmentLocation missing;
  missing.dir = dir.path + "/absent";
  LeaseStatus s = DeviceLease::Get(g.group, g.key, &none, missing);
  EXPECT(s.code == LeaseCode::kInvalidArgument && Contains(s.message, missing.dir) &&
             Contains(s.message, "must exist"), s.message);
  SegmentLocation file;
  file.dir = g.Path();
  s = DeviceLease::Get(g.group, g.key, &none, file);
  EXPECT(s.code == LeaseCode::kInvalidArgument && Contains(s.message, "is not a directory"),
         s.message);
}

// Only file systems known to be local are accepted (an allowlist): network, cluster and FUSE
// ones, and any unknown type, are refused.
void TestOnlyLocalFileSystemsAccepted() {
  for (int64_t magic : {0x6969L, 0x517BL, 0xFF534D42L, 0xFE534D42L, 0x01021997L, 0x00C36400L,
                        0x65735546L, 0x19830326L /* beegfs */, 0x20030528L /* panfs */,
                        0x12345678L /* unknown */}) {
    EXPECT(LocalFileSystem(magic) == nullptr, "accepted: " << std::hex << magic);
  }
  for (int64_t magic : {0x01021994L /* tmpfs */, 0xEF53L /* ext4 */, 0x58465342L /* xfs */}) {
    EXPECT(LocalFileSystem(magic) != nullptr, "refused: " << std::hex << magic);
  }
  EXPECT(std::string(LocalFileSystem(0x01021994)) == "tmpfs", "name");
  EXPECT(FileSystemText(0x6969) == "nfs (0x6969)", FileSystemText(0x6969));
  EXPECT(FileSystemText(0x12345678) == "an unknown type (0x12345678)", "unknown");
}

// Every process that opens the lease is a member under its job label; Inspect lists members,
// holder and queue without becoming a member and without creating anything.
void TestMembersAndInspect() {
  TempDir dir;
  TestGroup g("members", dir.path);
  auto lease = g.Open("jobA");
  HolderChild holder(g);  // a child of jobA (it inherits the label) holds
  std::thread waiter([&] { lease->Acquire(5, 0); lease->Yield(); });
  LeaseSnapshot snap;
  for (int i = 0; i < 200 && snap.queue.empty(); ++i) {
    EXPECT(DeviceLease::Inspect(g.Path(), 1, &snap).ok(), "inspect");
    usleep(10000);
  }
  EXPECT(snap.members.size() == 2, snap.members.size() << " members");
  int holding = 0;
  for (const LeaseMember& m : snap.members) {
    EXPECT(m.job == "jobA" && m.pid_ns != 0, m.job);
    holding += m.holding ? (m.pid == holder.pid ? 1 : 100) : 0;
  }
  EXPECT(holding == 1, "the holder is not the held member");
  EXPECT(snap.held_since_wall_ns > 0, "no hold time");
  EXPECT(snap.queue.size() == 1 && snap.queue[0].pid == getpid() &&
             snap.queue[0].job == "jobA" && snap.queue[0].priority == kNormal,
         snap.queue.size() << " waiting");
  EXPECT(holder.LetGo() == 0, "holder");
  waiter.join();
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &snap).ok(), "inspect");
  EXPECT(snap.members.size() == 1 && !snap.members[0].holding && snap.queue.empty() &&
             snap.held_since_wall_ns == 0, snap.members.size() << " members after");
  const std::string absent = dir.path + "/crossover.none.dev";
  const LeaseStatus s = DeviceLease::Inspect(absent, 1, &snap);
  struct stat st;
  EXPECT(!s.ok() && Contains(s.message, absent) && stat(absent.c_str(), &st) != 0, s.message);
}

// What an observer reads of each member (the exporter's counters): acquisitions, waits by
// bucket, hand-offs, holds (the current one included, never more than its yield counts).
void TestUsageCounters() {
  TempDir dir;
  TestGroup g("usage", dir.path);
  auto lease = g.Open("jobA");
  HolderChild holder(g);
  std::atomic<bool> acquired{false};
  std::thread waiter([&] { acquired = lease->Acquire(5, 0).ok(); });
  usleep(50000);
  EXPECT(holder.LetGo() == 0, "holder");
  waiter.join();
  EXPECT(acquired, "acquire");
  usleep(30000);
  LeaseSnapshot during, after;
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &during).ok() && during.members.size() == 1,
         during.members.size() << " members");
  EXPECT(lease->Yield().ok(), "yield");
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &after).ok() && after.members.size() == 1, "after");
  const LeaseUsage& u = during.members[0].usage;
  EXPECT(during.members[0].holding && u.acquires == 1 && u.contended == 1 && u.handoffs == 1,
         u.acquires << " " << u.contended << " " << u.handoffs);
  EXPECT(u.wait_ns > 40000000 && u.wait_ns < 5000000000LL, u.wait_ns);
  EXPECT(u.wait_buckets[3] == 1, "a 50 ms wait is in the (10 ms, 100 ms] bucket");
  EXPECT(u.hold_ns >= 30000000 && during.held_for_ns == u.hold_ns, "current hold " << u.hold_ns);
  const LeaseUsage& v = after.members[0].usage;
  EXPECT(v.hold_ns >= u.hold_ns && v.hold_ns < u.hold_ns + 1000000000, v.hold_ns);
  EXPECT(!after.members[0].holding && after.held_for_ns == 0, "released");
  EXPECT(after.overlapping_holds == 0 && after.handoffs == 1, after.overlapping_holds);
}

// The overlapping-hold check counts a hold begun while another process is inside one, and
// not a dead holder's hold that the next one reclaims.
void TestOverlappingHoldsAreCounted() {
  TempDir dir;
  TestGroup g("overlap", dir.path);
  auto lease = g.Open();
  const pid_t dies_holding = Spawn([&] { return g.Open()->Acquire(5, 0).ok() ? 0 : 1; });
  EXPECT(Reap(dies_holding) == 0, "child");
  EXPECT(lease->Acquire(5, 0).ok() && lease->Yield().ok(), "reclaimed");
  LeaseSnapshot snap;
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.overlapping_holds == 0,
         snap.overlapping_holds << " after a dead holder");
  LeaseTestHooks::MarkInside(*lease, 12345);  // "another process is inside its hold"
  EXPECT(lease->Acquire(5, 0).ok() && lease->Yield().ok(), "acquire");
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.overlapping_holds == 1,
         snap.overlapping_holds << " overlaps");
  EXPECT(lease->Acquire(5, 0).ok() && lease->Yield().ok(), "acquire");
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.overlapping_holds == 1,
         "a clean hold counted: " << snap.overlapping_holds);
}

// An observer never keeps a copy taken while a member is in the middle of a change: it retries
// and, past its bound, says so instead of showing a half-made change.
void TestObserverWaitsOutAChangeInProgress() {
  TempDir dir;
  TestGroup g("torn", dir.path);
  auto lease = g.Open();
  LeaseSnapshot snap;
  LeaseTestHooks::StepChangeSeq(*lease);  // "stopped in the middle of an update"
  const LeaseStatus torn = DeviceLease::Inspect(g.Path(), 0.2, &snap);
  EXPECT(torn.code == LeaseCode::kDeadlineExceeded &&
             Contains(torn.message, "in the middle of an update"), torn.message);
  LeaseTestHooks::StepChangeSeq(*lease);
  EXPECT(DeviceLease::Inspect(g.Path(), 0.2, &snap).ok() && snap.members.size() == 1, "settled");
}

// Link-turn waits are counted in the waiting member's slot.
void TestLinkTurnUsage() {
  TempDir dir;
  TestGroup g("turn_usage", dir.path);
  auto turn = g.OpenLinkTurn();
  EXPECT(JoinAndStart(*turn, 0, 2), "join");
  int in_turn[2];
  EXPECT(pipe(in_turn) == 0, "pipe");
  const pid_t peer = Spawn([&] {  // joins second, so it turns first
    auto mine = g.OpenLinkTurn();
    bool skipped = true;
    if (!JoinAndStart(*mine, 1, 2) || !mine->Wait(5, &skipped).ok() || skipped) return 2;
    char byte = 't';
    if (write(in_turn[1], &byte, 1) != 1) return 3;
    usleep(60000);
    return mine->Done().ok() && mine->Leave().ok() ? 0 : 4;
  });
  char byte;
  EXPECT(read(in_turn[0], &byte, 1) == 1, "the peer did not take its turn");
  bool skipped = true;
  EXPECT(turn->Wait(5, &skipped).ok() && !skipped, "wait");
  EXPECT(Reap(peer) == 0, "peer");
  LeaseSnapshot snap;
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.members.size() == 1, "inspect");
  const LeaseUsage& u = snap.members[0].usage;
  EXPECT(u.link_turns == 1 && u.link_turn_waits == 1 && u.link_turn_wait_ns > 30000000,
         u.link_turns << " " << u.link_turn_waits << " " << u.link_turn_wait_ns);
  EXPECT(turn->Done().ok() && turn->Leave().ok(), "done");
  close(in_turn[0]);
  close(in_turn[1]);
}

void TestJobLabels() {
  TestGroup g("jobs");
  std::shared_ptr<DeviceLease> lease;
  SegmentLocation bad;
  bad.job = "a b";
  LeaseStatus s = DeviceLease::Get(g.group, g.key, &lease, bad);
  EXPECT(s.code == LeaseCode::kInvalidArgument && Contains(s.message, "job label 'a b'"),
         s.message);
  EXPECT(DeviceLease::ValidateJob(std::string(kMaxJobLen, 'j')).ok() &&
             !DeviceLease::ValidateJob(std::string(kMaxJobLen + 1, 'j')).ok() &&
             DeviceLease::ValidateJob("").ok() && DeviceLease::ValidateJob("h.x:12@a_b-c").ok(),
         "label rule");
  auto plain = g.Open();  // the default label, "<host>:<pid>"
  LeaseSnapshot snap;
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.members.size() == 1, "inspect");
  const std::string suffix = ":" + std::to_string(getpid());
  const std::string& label = snap.members[0].job;
  EXPECT(label.size() > suffix.size() && label.compare(label.size() - suffix.size(),
                                                       suffix.size(), suffix) == 0, label);
  EXPECT(g.Open("trainer")->path() == plain->path(), "a first explicit label is adopted");
  EXPECT(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.members.size() == 1 &&
             snap.members[0].job == "trainer", snap.members[0].job);
  SegmentLocation other;
  other.job = "other";
  s = DeviceLease::Get(g.group, g.key, &lease, other);
  EXPECT(s.code == LeaseCode::kInvalidArgument && Contains(s.message, "as job 'trainer'"),
         s.message);
}

// Group mode (root only: it makes a directory of another group): segments are created 0660
// and of the directory's group whatever the umask; one of another group or with other bits
// is refused and kept.
void TestGroupMode() {
  if (geteuid() != 0) {
    printf("[SKIP] group_mode: needs root to chown a directory to another group\n");
    return;
  }
  TempDir dir;
  constexpr gid_t kGroup = 62000;
  EXPECT(chown(dir.path.c_str(), 0, kGroup) == 0 && chmod(dir.path.c_str(), 03770) == 0, "dir");
  TestGroup g("groupmode", dir.path), planted("planted", dir.path);
  g.options.shared_group = planted.options.shared_group = true;
  const mode_t old_umask = umask(077);
  auto lease = g.Open();
  umask(old_umask);
  struct stat st;
  EXPECT(stat(g.Path().c_str(), &st) == 0 && (st.st_mode & 07777) == 0660 && st.st_gid == kGroup,
         "segment mode " << std::oct << (st.st_mode & 07777) << " gid " << std::dec << st.st_gid);
  EXPECT(lease->Acquire(1, 0).ok() && lease->Yield().ok(), "acquire in group mode");
  std::shared_ptr<DeviceLease> refused;
  LeaseStatus s;
  struct Case { gid_t gid; mode_t mode; const char* says; };
  for (const Case& c : {Case{kGroup + 1, 0660, "belongs to group 62001"},
                        Case{kGroup, 0664, "permissions 0664"}}) {
    const int fd = open(planted.Path().c_str(), O_CREAT | O_RDWR, 0600);
    EXPECT(fd >= 0 && fchown(fd, 0, c.gid) == 0 && fchmod(fd, c.mode) == 0, "planting");
    close(fd);
    s = DeviceLease::Get(planted.group, planted.key, &refused, planted.options);
    EXPECT(s.code == LeaseCode::kPermissionDenied && Contains(s.message, c.says), s.message);
    EXPECT(stat(planted.Path().c_str(), &st) == 0, "a refused segment must not be deleted");
    unlink(planted.Path().c_str());
  }
  SegmentLocation not_group = g.options;
  not_group.shared_group = false;
  TestGroup fresh("groupmode2", dir.path);  // a 0660 segment opened without group mode
  fresh.options.shared_group = true;
  // Made by another process: this one keeps every lease it opened, whatever options it asks.
  const pid_t maker = fork();
  if (maker == 0) {
    fresh.Open();
    _exit(0);
  }
  int maker_status = 0;
  EXPECT(maker > 0 && waitpid(maker, &maker_status, 0) == maker && maker_status == 0,
         "making the group-mode segment in a child");
  // Without group mode the sticky group directory passes as a shared scratch directory (as
  // /tmp does: nobody renames another's file), and the group's 0660 segment is refused.
  s = DeviceLease::Get(fresh.group, fresh.key, &refused, not_group);
  EXPECT(s.code == LeaseCode::kPermissionDenied && Contains(s.message, "has permissions 0660") &&
             Contains(s.message, "group mode"),
         s.message);
}

// The trust rule (lease_dir.h), checked on every open: a lease directory that another user
// owns, or that others may write without the sticky bit (or, in group mode, at all), or with a
// directory above it that others may write, is refused with the path, its owner and mode and
// the command that fixes it, and nothing is created in it; a sticky (/dev/shm-like), a private
// and a proper group directory pass.
void TestDirectoryTrustRule() {
  if (geteuid() != 0) {
    printf("  (skipped: needs root to chown the directory)\n");
    return;
  }
  TempDir parent;
  const std::string dir = parent.path + "/leases";
  EXPECT(mkdir(dir.c_str(), 0700) == 0, "mkdir");
  struct Case {
    uid_t uid;
    gid_t gid;
    mode_t mode;
    bool group;
    const char* says;
  };
  const Case refused[] = {
      {65534, 0, 0755, false, "is owned by neither root nor this job's user"},
      {65534, 65534, 01777, false, "is owned by neither root nor this job's user"},
      {0, 0, 0777, false, "writable by its group or by others and is not sticky"},
      {0, 62000, 0770, false, "writable by its group or by others and is not sticky"},
      {0, 62000, 03777, true, "writable by others"},
      {0, 62000, 02750, true, "not writable by its group"},
      {0, 62000, 02770, true, "is not sticky: in group mode any member could rename"},
  };
  int n = 0;
  for (const Case& c : refused) {
    EXPECT(chown(dir.c_str(), c.uid, c.gid) == 0 && chmod(dir.c_str(), c.mode) == 0, "dir");
    TestGroup g("trust" + std::to_string(n++), dir);
    g.options.shared_group = c.group;
    std::shared_ptr<DeviceLease> lease;
    const LeaseStatus s = DeviceLease::Get(g.group, g.key, &lease, g.options);
    EXPECT(s.code == LeaseCode::kPermissionDenied && Contains(s.message, "trust rule") &&
               Contains(s.message, c.says) && Contains(s.message, dir + " (owner uid " +
                                                                   std::to_string(c.uid)) &&
               Contains(s.message, "install -d -m") &&
               (!c.group || Contains(s.message, "install -d -m 3770 -g GROUP")),
           "mode " << std::oct << c.mode << ": " << s.message);
    EXPECT(access(g.Path().c_str(), F_OK) != 0, "a segment was created in a refused directory");
  }
  // A directory above the lease directory that others may write: they could swap the lease
  // directory itself. Sticky, they cannot.
  EXPECT(chown(dir.c_str(), 0, 0) == 0 && chmod(dir.c_str(), 0700) == 0, "dir");
  EXPECT(chmod(parent.path.c_str(), 0777) == 0, "parent");
  TestGroup above("trustabove", dir);
  std::shared_ptr<DeviceLease> lease;
  LeaseStatus s = DeviceLease::Get(above.group, above.key, &lease, above.options);
  EXPECT(s.code == LeaseCode::kPermissionDenied &&
             Contains(s.message, parent.path + " (owner uid 0") && Contains(s.message, "not sticky"),
         s.message);
  EXPECT(chmod(parent.path.c_str(), 01777) == 0, "parent");
  const Case passed[] = {{0, 0, 01777, false, ""}, {0, 0, 0700, false, ""},
                         {0, 62000, 03770, true, ""}};
  for (const Case& c : passed) {
    EXPECT(chown(dir.c_str(), c.uid, c.gid) == 0 && chmod(dir.c_str(), c.mode) == 0, "dir");
    TestGroup g("trust" + std::to_string(n++), dir);
    g.options.shared_group = c.group;
    auto ok = g.Open();
    EXPECT(ok->Acquire(1, 0).ok() && ok->Yield().ok(), "mode " << std::oct << c.mode);
  }
  chmod(parent.path.c_str(), 0700);
  rmdir(dir.c_str());
}

// Read what you hold: the member list comes from the mapping this process holds, so a file
// swapped in under the name (here a copy of the real one, a perfect forgery) never passes a
// join check; and once the name no longer refers to the mapping, the member list and every
// acquire are errors, never a silent second lease.
void TestRenamedSegmentIsAnErrorForItsMembers() {
  TempDir dir;
  TestGroup g("renamed", dir.path);
  auto lease = g.Open("jobA");
  HolderChild holder(g);  // a second member (a child of jobA, on the same mapping)
  LeaseSnapshot snap;
  LeaseStatus s = lease->Members(&snap);
  EXPECT(s.ok() && snap.members.size() == 2 && snap.held_since_wall_ns > 0,
         s.message << " / " << snap.members.size() << " members");
  EXPECT(holder.LetGo() == 0, "holder");
  const std::string moved = dir.path + "/moved-away";
  EXPECT(rename(g.Path().c_str(), moved.c_str()) == 0, "rename");
  const int from = open(moved.c_str(), O_RDONLY), to = open(g.Path().c_str(), O_CREAT | O_WRONLY, 0600);
  std::vector<char> bytes(1 << 16);
  const ssize_t n = read(from, bytes.data(), bytes.size());
  EXPECT(n > 0 && write(to, bytes.data(), n) == n, "copying the segment");
  close(from);
  close(to);
  s = lease->Members(&snap);
  EXPECT(s.code == LeaseCode::kFailedPrecondition && Contains(s.message, "renamed") &&
             Contains(s.message, g.Path()),
         s.message);
  s = lease->Acquire(1, 0);
  EXPECT(s.code == LeaseCode::kFailedPrecondition && Contains(s.message, "renamed"), s.message);
  unlink(moved.c_str());
}

// The last member out removes the segment (at exit, under the creation flock): a member that
// leaves while another is live leaves it; the last one removes it.
void TestLastMemberOutRemovesTheSegment() {
  TempDir dir;
  TestGroup g("lastout", dir.path);
  EXPECT(InChild([&]() -> int {
           g.Open();
           exit(0);  // not _exit: the exit handlers run
         }) == 0,
         "a lone member");
  EXPECT(access(g.Path().c_str(), F_OK) != 0, "a lone member's segment was left behind");
  int go[2];
  EXPECT(pipe(go) == 0, "pipe");
  const pid_t first = fork();
  if (first == 0) {
    g.Open();
    char byte;
    alarm(30);
    exit(read(go[0], &byte, 1) == 1 ? 0 : 1);
  }
  for (int i = 0; i < 500 && access(g.Path().c_str(), F_OK) != 0; ++i) usleep(10000);
  EXPECT(InChild([&]() -> int {
           g.Open();
           exit(0);
         }) == 0,
         "the second member");
  const bool kept = access(g.Path().c_str(), F_OK) == 0;
  char byte = 'g';
  EXPECT(write(go[1], &byte, 1) == 1, "pipe");
  int status = 0;
  waitpid(first, &status, 0);
  close(go[0]);
  close(go[1]);
  EXPECT(kept, "the segment was removed while a member was live");
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the first member");
  EXPECT(access(g.Path().c_str(), F_OK) != 0, "the last member's segment was left behind");
}

// An observer (status, the exporter) never blocks: a member stopped inside the internal lock
// does not delay it (it copies the segment, never locking it), and a planted file that fails
// the trust rule is refused at once, with the reason.
void TestObserverNeverBlocks() {
  TempDir dir;
  TestGroup g("observe", dir.path), planted("planted", dir.path);
  auto lease = g.Open("jobA");
  const pid_t child = StoppedInsideTheLock(g);
  LeaseSnapshot snap;
  double start = MonoS();
  const LeaseStatus s = DeviceLease::Inspect(g.Path(), 2, &snap);
  const double took = MonoS() - start;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT(s.ok() && snap.members.size() == 1 && snap.members[0].job == "jobA",
         s.message << " / " << snap.members.size() << " members");
  EXPECT(took < 0.5, "an observer waited " << took << " s behind a stopped locker");
  const int fd = open(planted.Path().c_str(), O_CREAT | O_RDWR, 0666);
  EXPECT(fd >= 0 && fchmod(fd, 0666) == 0 && ftruncate(fd, 1 << 14) == 0, "planting");
  close(fd);
  start = MonoS();
  const LeaseStatus refused = DeviceLease::Inspect(planted.Path(), 2, &snap);
  EXPECT(refused.code == LeaseCode::kPermissionDenied && Contains(refused.message, "0666"),
         refused.message);
  EXPECT(MonoS() - start < 0.5, "refusing took " << MonoS() - start << " s");
}

const Test kTests[] = {
    {"validation", TestValidation},
    {"queue_repair", TestQueueRepair},
    {"reentrant_and_stats", TestReentrantAndStats},
    {"usage_counters", TestUsageCounters},
    {"overlapping_holds_are_counted", TestOverlappingHoldsAreCounted},
    {"link_turn_usage", TestLinkTurnUsage},
    {"observer_waits_out_a_change_in_progress", TestObserverWaitsOutAChangeInProgress},
    {"failed_drain_still_yields", TestFailedDrainStillYields},
    {"foreign_or_open_segment_refused", TestForeignOrOpenSegmentRefused},
    {"stopped_inside_critical_section", TestStoppedInsideCriticalSection},
    {"stalled_creator_is_waited_for", TestStalledCreatorIsWaitedFor},
    {"death_inside_critical_section", TestDeathInsideCriticalSection},
    {"full_queue_is_a_clear_error", TestFullQueueIsAClearError},
    {"forked_processes_have_distinct_identities", TestForkedProcessesHaveDistinctIdentities},
    {"queue_orders_by_priority", TestQueueOrdersByPriority},
    {"primary_goes_before_earlier_secondary", TestPrimaryGoesBeforeEarlierSecondary},
    {"reservation_keeps_lower_classes_out", TestReservationKeepsLowerClassesOut},
    {"turn_validation", TestTurnValidation},
    {"turns_alternate", TestTurnsAlternate},
    {"late_job_goes_first", TestLateJobGoesFirst},
    {"dead_or_paused_peer", TestDeadOrPausedPeer},
    {"waiter_stuck_on_internal_lock_leaves_no_ticket",
     TestWaiterStuckOnInternalLockLeavesNoTicket},
    {"older_layout_in_use_is_refused", TestOlderLayoutInUseIsRefused},
    {"lease_directory", TestLeaseDirectory},
    {"only_local_file_systems_accepted", TestOnlyLocalFileSystemsAccepted},
    {"members_and_inspect", TestMembersAndInspect},
    {"job_labels", TestJobLabels},
    {"group_mode", TestGroupMode},
    {"directory_trust_rule", TestDirectoryTrustRule},
    {"renamed_segment_is_an_error_for_its_members", TestRenamedSegmentIsAnErrorForItsMembers},
    {"last_member_out_removes_the_segment", TestLastMemberOutRemovesTheSegment},
    {"observer_never_blocks", TestObserverNeverBlocks},
};

}  // namespace
}  // namespace crossover

int main(int argc, char** argv) {
  using crossover::kTests;
  std::vector<std::string> wanted(argv + 1, argv + argc);
  if (wanted.size() == 1 && wanted[0] == "--list") {
    for (const auto& t : kTests) printf("%s\n", t.name);
    return 0;
  }
  int passed = 0, failed = 0;
  for (const auto& t : kTests) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), t.name) == wanted.end()) {
      continue;
    }
    try {
      t.fn();
      printf("[ OK ] %s\n", t.name);
      ++passed;
    } catch (const crossover::Failure& f) {
      printf("[FAIL] %s: %s\n", t.name, f.what.c_str());
      ++failed;
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
