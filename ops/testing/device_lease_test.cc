// Tests of the lease core on its own (no TensorFlow): the states that are rare in real runs
// (a process dead or stopped inside the critical section, a creator that stalls, a queue left
// half-shifted) are made on purpose, in real processes.
//
// GoogleTest (Debian's libgtest-dev), one TEST(LeaseCore, Name) each, with gtest_main:
//   device_lease_test                                   runs every test
//   device_lease_test --gtest_filter=LeaseCore.Name     runs one;  --gtest_list_tests lists them
// Many tests fork: gtest's assertions belong to the test process only, so code that may run in
// a forked child (the helpers below) checks with REQUIRE, and the children's lambdas return
// exit codes that the test asserts on.
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

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace crossover {
namespace {

// The test process: a forked child has another pid (it inherits this value).
const pid_t kTestPid = getpid();

// What a forked child exits with when one of its REQUIREs fails.
constexpr int kChildRequireFailed = 99;

// Ends a test at a failed REQUIRE (reported above it by ADD_FAILURE_AT); gtest catches it.
struct RequireFailure : std::runtime_error {
  RequireFailure() : std::runtime_error("a REQUIRE failed (reported above): the test ends here") {}
};

// REQUIRE(cond, msg): a check for the helpers, where gtest's ASSERT_* cannot go (constructors,
// functions that return a value) and that may run in a forked child. In the test process it
// fails the test where it stands and ends it (an exception, which gtest catches); in a child it
// prints the failure and _exits kChildRequireFailed, so the child never runs on into gtest.
[[noreturn]] void RequireFailed(const char* file, int line, const char* cond,
                                const std::string& msg) {
  if (getpid() != kTestPid) {
    fprintf(stderr, "%s:%d: in child %d: %s: %s\n", file, line, static_cast<int>(getpid()), cond,
            msg.c_str());
    _exit(kChildRequireFailed);
  }
  ADD_FAILURE_AT(file, line) << cond << ": " << msg;
  throw RequireFailure{};
}

#define REQUIRE(cond, msg)                                \
  do {                                                    \
    if (!(cond)) {                                        \
      std::ostringstream _m;                              \
      _m << msg;                                          \
      RequireFailed(__FILE__, __LINE__, #cond, _m.str()); \
    }                                                     \
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
    REQUIRE(status.ok(), status.message);
    return lease;
  }
  std::shared_ptr<LinkTurn> OpenLinkTurn() const {
    std::shared_ptr<LinkTurn> turn;
    const LeaseStatus status = LinkTurn::Get(group, key, &turn, options);
    REQUIRE(status.ok(), status.message);
    return turn;
  }
};

// A fresh directory under /tmp, removed (empty) at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "/tmp/crossover-ut-XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr, "mkdtemp");
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
    REQUIRE(pipe(to_child) == 0 && pipe(from_child) == 0, "pipe");
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
    close(from_child[1]);  // only the child writes: if it dies first, the read below sees EOF
    from_child[1] = -1;
    char byte;
    REQUIRE(read(from_child[0], &byte, 1) == 1, "holder did not start");
  }
  int LetGo() {
    char byte = 'g';
    REQUIRE(write(to_child[1], &byte, 1) == 1, "pipe");
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
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) {
      if (fd >= 0) close(fd);
    }
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
  REQUIRE(WIFSTOPPED(status), "child did not stop");
  return child;
}

// ----- tests ------------------------------------------------------------------------------

TEST(LeaseCore, Validation) {
  ASSERT_TRUE(DeviceLease::ValidateName("g_1-A", "gpu0").ok()) << "valid names rejected";
  for (const std::string& bad : std::vector<std::string>{"", "a b", "x/y", "nl\n", std::string(kMaxGroupLen + 1, 'a')}) {
    const LeaseStatus s = DeviceLease::ValidateName(bad, "gpu0");
    ASSERT_TRUE(s.code == LeaseCode::kInvalidArgument) << "group '" << bad << "' accepted";
  }
  ASSERT_TRUE(!DeviceLease::ValidateName("g", std::string(kMaxDeviceKeyLen + 1, 'k')).ok())
      << "long key";
  ASSERT_TRUE(DeviceLease::ValidateTimeout(600).ok()) << "600 s rejected";
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {0.0, -1.0, inf, std::nan(""), 1e10}) {
    const LeaseStatus s = DeviceLease::ValidateTimeout(bad);
    ASSERT_TRUE(s.code == LeaseCode::kInvalidArgument && Contains(s.message, "timeout"))
        << bad << " accepted: " << s.message;
  }
  TestGroup g("validation");
  const LeaseStatus s = g.Open()->Acquire(inf, 0);
  ASSERT_TRUE(s.code == LeaseCode::kInvalidArgument) << "Acquire(inf) did not fail cleanly";
}

Waiter W(uint64_t nonce, uint64_t ticket) {
  Waiter w;
  w.who.nonce = nonce;
  w.ticket = ticket;
  return w;
}

TEST(LeaseCore, QueueRepair) {
  WaiterQueue q{};
  for (uint64_t t = 1; t <= 3; ++t) ASSERT_TRUE(q.Push(W(10 + t, t))) << "push";
  ASSERT_TRUE(q.Index(2) == 1 && q.Remove(2) && q.Index(2) == -1 && q.size == 2)
      << "remove own only";
  ASSERT_TRUE(!q.Remove(2)) << "removed twice";
  auto all_alive = [](const Owner&) { return true; };
  // What a crash leaves in the middle of removing the head of [A, B, C]: B copied over A and
  // C over B, but the size not yet decremented: [B, C, C]. Or only the first copy: [B, B, C].
  for (std::vector<uint64_t> left : {std::vector<uint64_t>{2, 3, 3}, {2, 2, 3}}) {
    WaiterQueue half{};
    half.size = 3;
    for (int i = 0; i < 3; ++i) half.entries[i] = W(10 + left[i], left[i]);
    ASSERT_TRUE(half.Repair(all_alive, 0) == 1) << "one duplicate expected";
    ASSERT_TRUE(half.size == 2 && half.entries[0].ticket == 2 && half.entries[1].ticket == 3)
        << "repaired queue is not [B, C]";
  }
  WaiterQueue dead{};
  dead.Push(W(1, 1));
  dead.Push(W(2, 2));
  ASSERT_TRUE(dead.Repair([](const Owner& o) { return o.nonce != 1; }, 0) == 1)
      << "dead entry kept";
  ASSERT_TRUE(dead.size == 1 && dead.entries[0].ticket == 2) << "wrong survivor";
  WaiterQueue garbage{};
  garbage.size = 1000;
  garbage.Repair(all_alive, 0);
  ASSERT_TRUE(garbage.size == 0) << "impossible size not repaired";
  WaiterQueue expiring{};  // a live waiter's entry past its deadline stands for nobody
  for (uint64_t t = 1; t <= 2; ++t) {
    Waiter w = W(t, t);
    w.deadline_host_mono_ns = 1000 * t;
    expiring.Push(w);
  }
  ASSERT_TRUE(expiring.Repair(all_alive, 1500) == 1) << "expired entry kept";
  ASSERT_TRUE(expiring.size == 1 && expiring.entries[0].ticket == 2) << "wrong survivor";
  WaiterQueue full{};
  for (int i = 0; i < kMaxWaiters; ++i) ASSERT_TRUE(full.Push(W(1, i + 1))) << "push";
  ASSERT_TRUE(!full.Push(W(1, 999))) << "pushed past capacity";
}

TEST(LeaseCore, ReentrantAndStats) {
  TestGroup g("reentrant");
  auto lease = g.Open();
  ASSERT_TRUE(lease->Acquire(1, 7).ok() && lease->Acquire(1, 7).ok()) << "acquire";
  ASSERT_TRUE(lease->Stats().acquires == 1 && lease->Stats().held) << "re-entrant acquire counted";
  ASSERT_TRUE(lease->Yield().ok() && lease->Yield().ok()) << "yield";
  const LeaseStats s = lease->Stats();
  ASSERT_TRUE(!s.held && s.Values().size() == sizeof(kLeaseStatsFields) / sizeof(char*)) << "stats";
  const std::vector<LeaseEvent> events = lease->Timeline();
  ASSERT_TRUE(events.size() == 1 && events[0].tag == 7 &&
              events[0].yielded_ns >= events[0].acquired_ns)
      << "timeline";
}

TEST(LeaseCore, FailedDrainStillYields) {
  TestGroup g("drain");
  auto lease = g.Open();
  ASSERT_TRUE(lease->Acquire(1, 0).ok()) << "acquire";
  const LeaseStatus s = lease->YieldAfter(
      [] { return LeaseStatus::Error(LeaseCode::kInternal, "stream failed"); });
  ASSERT_TRUE(s.code == LeaseCode::kInternal && s.message == "stream failed") << "drain error lost";
  ASSERT_TRUE(!lease->Stats().held) << "still held after a failed drain";
  ASSERT_TRUE(InChild([&] { return g.Open()->Acquire(0.5, 0).ok() ? 0 : 1; }) == 0)
      << "a peer could not acquire after the failed drain";
}

TEST(LeaseCore, ForeignOrOpenSegmentRefused) {
  TestGroup g("owner");
  int fd = open(g.Path().c_str(), O_CREAT | O_RDWR, 0600);
  fchmod(fd, 0644);
  close(fd);
  std::shared_ptr<DeviceLease> lease;
  LeaseStatus s = DeviceLease::Get(g.group, g.key, &lease);
  ASSERT_TRUE(s.code == LeaseCode::kPermissionDenied && Contains(s.message, "0644")) << s.message;
  struct stat st;
  ASSERT_TRUE(stat(g.Path().c_str(), &st) == 0) << "a refused segment must not be deleted";
  if (geteuid() == 0) {
    chmod(g.Path().c_str(), 0600);
    ASSERT_TRUE(chown(g.Path().c_str(), 65534, 65534) == 0) << "chown";
    s = DeviceLease::Get(g.group, g.key, &lease);
    ASSERT_TRUE(s.code == LeaseCode::kPermissionDenied && Contains(s.message, "uid 65534"))
        << s.message;
  }
}

// A process stopped (Ctrl-Z) inside the critical section: acquire must fail within its timeout
// with a message that names the process, and work again once that process is gone.
TEST(LeaseCore, StoppedInsideCriticalSection) {
  TestGroup g("stopped");
  auto lease = g.Open();
  const pid_t child = StoppedInsideTheLock(g);
  const double start = MonoS();
  const LeaseStatus s = lease->Acquire(1.0, 0);
  const double took = MonoS() - start;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(s.code == LeaseCode::kDeadlineExceeded && Contains(s.message, "internal lock") &&
              Contains(s.message, std::to_string(child)))
      << s.message;
  ASSERT_TRUE(took < 3.0) << "took " << took << " s";
  const uint64_t before = lease->Stats().recoveries;
  ASSERT_TRUE(lease->Acquire(2.0, 0).ok()) << "lease unusable after the stopped process died";
  ASSERT_TRUE(lease->Stats().recoveries > before) << "the owner-died repair did not run";
  lease->Yield();
}

// A creator that stalls between sizing and initialising the segment: a second starter must
// wait for it and use the same segment, never replace it.
TEST(LeaseCore, StalledCreatorIsWaitedFor) {
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
  ASSERT_TRUE(mine == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a starter failed";
  ASSERT_TRUE(shared->overlaps.load() == 0) << shared->overlaps.load() << " overlaps: two segments";
  munmap(shared, sizeof(Shared));
}

// A process that dies inside the critical section leaves the robust mutex owner-dead; the
// next locker repairs and carries on.
TEST(LeaseCore, DeathInsideCriticalSection) {
  TestGroup g("ownerdead");
  auto lease = g.Open();
  ASSERT_TRUE(InChild([&] {
                auto mine = g.Open();
                LeaseTestHooks::LockInternal(*mine);
                WaiterQueue& q = LeaseTestHooks::Queue(*mine);
                q.size = 2;  // a half-done update: a duplicate, dead entry
                q.entries[0] = q.entries[1] = W(12345, 1);
                return 0;
              }) == 0)
      << "child";
  const uint64_t before = lease->Stats().recoveries;
  ASSERT_TRUE(lease->Acquire(2.0, 0).ok()) << "acquire after a death inside the critical section";
  ASSERT_TRUE(lease->Stats().recoveries > before) << "no repair counted";
  ASSERT_TRUE(LeaseTestHooks::Queue(*lease).size == 0) << "dead entries left in the queue";
  lease->Yield();
}

// Past kMaxWaiters waiting threads, a further waiter gets a clear error at once.
TEST(LeaseCore, FullQueueIsAClearError) {
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
  ASSERT_TRUE(LeaseTestHooks::Queue(*lease).size == kMaxWaiters) << "waiters did not queue";
  const double start = MonoS();
  const LeaseStatus s = lease->Acquire(5, 0);
  ASSERT_TRUE(s.code == LeaseCode::kResourceExhausted && Contains(s.message, "waiting threads"))
      << s.message;
  ASSERT_TRUE(MonoS() - start < 1.0) << "the error was not immediate";
  ASSERT_TRUE(holder.LetGo() == 0) << "holder";
  for (auto& t : waiters) t.join();
  ASSERT_TRUE(ok.load() == kMaxWaiters) << "queued waiters did not all get the device";
  lease->Yield();
}

// Processes forked from one parent must get distinct identities, or each would take the
// other's hold for its own (re-entrant) and both would be on the device.
TEST(LeaseCore, ForkedProcessesHaveDistinctIdentities) {
  TestGroup warm("warm"), g("forked");
  warm.Open()->Acquire(1, 0);  // the parent has drawn an identity before forking
  HolderChild holder(g);       // child's first identity on g is drawn after the fork
  const LeaseStatus s = g.Open()->Acquire(0.3, 0);
  ASSERT_TRUE(s.code == LeaseCode::kDeadlineExceeded)
      << "parent entered while its child held: " << s.message;
  ASSERT_TRUE(holder.LetGo() == 0) << "holder";
}

// Waiters queue by priority class, FIFO within a class.
TEST(LeaseCore, QueueOrdersByPriority) {
  WaiterQueue q{};
  const int32_t classes[] = {kNormal, kSecondary, kPrimary, kNormal, kSecondary, kPrimary};
  for (uint64_t t = 0; t < 6; ++t) {
    Waiter w = W(100 + t, t + 1);
    w.priority = classes[t];
    ASSERT_TRUE(q.Push(w)) << "push";
  }
  const uint64_t expected[] = {3, 6, 1, 4, 2, 5};
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(q.entries[i].ticket == expected[i])
        << "position " << i << ": ticket " << q.entries[i].ticket;
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
  ASSERT_TRUE(LeaseTestHooks::Queue(lease).size == size) << "waiters did not queue";
}

TEST(LeaseCore, PrimaryGoesBeforeEarlierSecondary) {
  TestGroup g("prio");
  auto lease = g.Open();
  ASSERT_TRUE(lease->Acquire(1, 0).ok()) << "acquire";
  TimedAcquirer secondary(g, kSecondary, 10);
  ASSERT_NO_FATAL_FAILURE(WaitForQueue(*lease, 1));
  TimedAcquirer primary(g, kPrimary, 10);
  ASSERT_NO_FATAL_FAILURE(WaitForQueue(*lease, 2));
  ASSERT_TRUE(LeaseTestHooks::Queue(*lease).entries[0].priority == kPrimary) << "primary not first";
  lease->Yield();
  ASSERT_TRUE(primary.Wait() == 0 && secondary.Wait() == 0) << "acquirers failed";
  ASSERT_TRUE(primary.AcquiredS() < secondary.AcquiredS()) << "secondary went first";
}

// A primary's reservation keeps a waiting secondary out for its duration, lets the primary
// itself straight back in, and never blocks a waiter of the same class.
TEST(LeaseCore, ReservationKeepsLowerClassesOut) {
  TestGroup g("reserve");
  auto lease = g.Open();
  ASSERT_TRUE(lease->Acquire(1, 0, kPrimary).ok()) << "acquire";
  TimedAcquirer secondary(g, kSecondary, 10);
  ASSERT_NO_FATAL_FAILURE(WaitForQueue(*lease, 1));
  ASSERT_TRUE(lease->Yield(2.0).ok()) << "yield with reservation";
  usleep(100000);
  ASSERT_TRUE(secondary.AcquiredS() == 0) << "secondary took a reserved lease";
  const double back = MonoS();
  ASSERT_TRUE(lease->Acquire(1, 0, kPrimary).ok() && MonoS() - back < 0.05)
      << "reserver not let in";
  const double released = MonoS();
  ASSERT_TRUE(lease->Yield(0.3).ok()) << "yield";
  ASSERT_TRUE(secondary.Wait() == 0) << "secondary failed";
  const double waited = secondary.AcquiredS() - released;
  ASSERT_TRUE(waited > 0.25 && waited < 1.0) << "secondary waited " << waited << " s, not ~0.3 s";

  ASSERT_TRUE(lease->Acquire(1, 0, kNormal).ok()) << "acquire";
  TimedAcquirer peer(g, kNormal, 10);
  ASSERT_NO_FATAL_FAILURE(WaitForQueue(*lease, 1));
  const double handed = MonoS();
  ASSERT_TRUE(lease->Yield(2.0).ok()) << "yield";
  ASSERT_TRUE(peer.Wait() == 0 && peer.AcquiredS() - handed < 0.5) << "same class was held out";
  ASSERT_TRUE(DeviceLease::ValidateReserve(-1).code == LeaseCode::kInvalidArgument &&
              DeviceLease::ValidatePriority(3).code == LeaseCode::kInvalidArgument)
      << "bad reservation or priority accepted";
}

// ----- link turns -------------------------------------------------------------------------

// Memory shared by a test and its forked jobs: a start barrier and the order turns were taken.
struct TurnLog {
  std::atomic<int> ready;
  std::atomic<int> size;
  int positions[64];
  static TurnLog* Make() {
    void* p = mmap(nullptr, sizeof(TurnLog), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    REQUIRE(p != MAP_FAILED, "mmap");
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

TEST(LeaseCore, TurnValidation) {
  ASSERT_TRUE(LinkTurn::ValidatePosition(1, 2).ok()) << "position 1 of 2 rejected";
  for (auto [p, j] : std::vector<std::pair<int, int>>{{2, 2}, {-1, 2}, {0, 0},
                                                      {0, kMaxLinkTurnJobs + 1}}) {
    ASSERT_TRUE(!LinkTurn::ValidatePosition(p, j).ok()) << "accepted position " << p << " of " << j;
  }
  TestGroup g("turn_validation");
  auto turn = g.OpenLinkTurn();
  bool skipped;
  ASSERT_TRUE(Contains(turn->Wait(1, &skipped).message, "not joined")) << "wait before join";
  ASSERT_TRUE(Contains(turn->Done().message, "not joined")) << "done before join";
  int64_t next;
  ASSERT_TRUE(turn->Join(0, 2, &next).ok() && next == kLinkTurnUnconstrained) << "join";
  ASSERT_TRUE(Contains(turn->Wait(1, &skipped).message, "TurnStart first")) << "wait before start";
  ASSERT_TRUE(!turn->Start(kLinkTurnUnconstrained).ok()) << "unconstrained offset accepted";
  // Another job that claims the same position, or another job count, is refused.
  const int taken = InChild([&] {
    int64_t n;
    const LeaseStatus s = g.OpenLinkTurn()->Join(0, 2, &n);
    return Contains(s.message, "position 0") && Contains(s.message, "is taken") ? 0 : 1;
  });
  ASSERT_TRUE(taken == 0) << "a second job joined at a taken position";
  const int count = InChild([&] {
    int64_t n;
    const LeaseStatus s = g.OpenLinkTurn()->Join(1, 3, &n);
    return Contains(s.message, "same count") ? 0 : 1;
  });
  ASSERT_TRUE(count == 0) << "a job with another job count joined";
}

// Two jobs take their turns alternately, whatever order they reach them in: job 1 reaches
// its turns faster, but still waits for job 0's before each of its own.
TEST(LeaseCore, TurnsAlternate) {
  TestGroup g("turns_alternate");
  TurnLog* log = TurnLog::Make();
  const pid_t a = Spawn([&] { return TurnJob(g, log, 0, 2, 5, 30); });
  const pid_t b = Spawn([&] { return TurnJob(g, log, 1, 2, 5, 1); });
  const int ra = Reap(a), rb = Reap(b);
  ASSERT_TRUE(ra == 0 && rb == 0) << "jobs failed or skipped turns: " << ra << ", " << rb;
  // Whichever joined second goes first (see LinkTurn::Join); then they alternate.
  ASSERT_TRUE(log->Order() == "0101010101" || log->Order() == "1010101010")
      << "turn order " << log->Order();
  munmap(log, sizeof(TurnLog));
}

// A job that joins late takes the turn just before the next one of the jobs already turning:
// it does not wait for them (one may be paused), and they wait for its first allreduce.
TEST(LeaseCore, LateJobGoesFirst) {
  TestGroup g("late_job");
  auto turn = g.OpenLinkTurn();
  ASSERT_TRUE(JoinAndStart(*turn, 0, 2)) << "join";
  bool skipped;
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(turn->Wait(1, &skipped).ok() && !skipped) << "turn alone";
    ASSERT_TRUE(turn->Done().ok()) << "done";
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
  ASSERT_TRUE(turn->Wait(5, &skipped).ok() && !skipped) << "turn after the late job's";
  log->Record(0);
  ASSERT_TRUE(Reap(late) == 0) << "late joiner failed";
  ASSERT_TRUE(log->Order() == "10")
      << "job 0 went before the late job's first turn: " << log->Order();
  // A job alone, or the first of its group, is unconstrained.
  TestGroup alone("late_job_alone");
  int64_t first = 0;
  ASSERT_TRUE(alone.OpenLinkTurn()->Join(1, 2, &first).ok() && first == kLinkTurnUnconstrained)
      << "alone";
  ASSERT_TRUE(turn->Leave().ok()) << "leave";
  munmap(log, sizeof(TurnLog));
}

// A job that died (or left) is not waited for; a live one that pauses is, for wait_s at most.
TEST(LeaseCore, DeadOrPausedPeer) {
  TestGroup g("dead_or_paused");
  int to_child[2];
  ASSERT_TRUE(pipe(to_child) == 0) << "pipe";
  TurnLog* log = TurnLog::Make();
  auto turn = g.OpenLinkTurn();
  ASSERT_TRUE(JoinAndStart(*turn, 1, 2)) << "join";
  bool skipped = true;
  ASSERT_TRUE(turn->Wait(1, &skipped).ok() && !skipped && turn->Done().ok()) << "alone";
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
  ASSERT_TRUE(turn->Wait(0.3, &skipped).ok() && skipped) << "did not skip a paused peer";
  ASSERT_TRUE(MonoS() - t0 >= 0.29 && MonoS() - t0 < 2) << "waited " << MonoS() - t0;
  kill(paused, SIGKILL);
  Reap(paused);
  ASSERT_TRUE(turn->Done().ok()) << "done";
  t0 = MonoS();
  ASSERT_TRUE(turn->Wait(5, &skipped).ok() && !skipped) << "waited for a dead peer";
  ASSERT_TRUE(MonoS() - t0 < 1) << "a dead peer held us " << MonoS() - t0 << " s";
  const LinkTurnStats stats = turn->Stats();
  ASSERT_TRUE(stats.turns == 3 && stats.skipped == 1 && stats.waited == 1)
      << "stats " << stats.turns << "/" << stats.skipped << "/" << stats.waited;
  const std::vector<LinkTurnEvent> turns = turn->Timeline();
  ASSERT_TRUE(turns.size() == 3 && turns[0].skipped == 0 && turns[1].skipped == 1 &&
              turns[2].skipped == 0)
      << "timeline of " << turns.size() << " turns";
  ASSERT_TRUE(turns[1].start_ns - turns[1].request_ns >= 290000000 &&
              turns[1].done_ns >= turns[1].start_ns && turns[2].done_ns == 0)
      << "turn times " << turns[1].request_ns << " " << turns[1].start_ns << " " << turns[1].done_ns
      << " " << turns[2].done_ns;
  close(to_child[0]);
  close(to_child[1]);
  munmap(log, sizeof(TurnLog));
}

// A waiter whose wait for the internal lock times out (a process stopped inside it, then
// killed) must leave no ticket behind: once the holder lets go, a fresh process gets the lease
// at once, and so does the waiter itself, instead of queueing behind a ghost until it exits.
TEST(LeaseCore, WaiterStuckOnInternalLockLeavesNoTicket) {
  TestGroup g("ghost");
  auto lease = g.Open();  // the waiter, W
  HolderChild holder(g);  // H
  LeaseStatus first;
  std::thread waiter([&] { first = lease->Acquire(1.5, 0); });
  ASSERT_NO_FATAL_FAILURE(WaitForQueue(*lease, 1));
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
  ASSERT_TRUE(WIFSTOPPED(status)) << "S did not stop";
  ASSERT_TRUE(first.code == LeaseCode::kDeadlineExceeded &&
              Contains(first.message, "internal lock"))
      << "W did not time out on the internal lock: " << first.message;
  ASSERT_TRUE(holder.LetGo() == 0) << "holder";
  double start = MonoS();
  ASSERT_TRUE(InChild([&] {
                const LeaseStatus s = g.Open()->Acquire(2.0, 0);
                if (!s.ok()) fprintf(stderr, "fresh acquire: %s\n", s.message.c_str());
                return s.ok() ? 0 : 1;
              }) == 0)
      << "a fresh process could not acquire the free lease (a ghost ticket?)";
  ASSERT_TRUE(MonoS() - start < 1.0) << "the fresh acquire took " << MonoS() - start << " s";
  start = MonoS();
  const LeaseStatus again = lease->Acquire(2.0, 0);
  ASSERT_TRUE(again.ok()) << "W's own next acquire: " << again.message;
  ASSERT_TRUE(MonoS() - start < 1.0) << "W's next acquire took " << MonoS() - start << " s";
  ASSERT_TRUE(LeaseTestHooks::Queue(*lease).size == 0) << "tickets left in the queue";
  lease->Yield();
}

// A segment of an older layout (legacy header, 4800 bytes) that a live process of that build
// still uses, shown by a lock on a byte where that build kept its slots: it must be refused
// with both layouts named, and left as it is; once that process is gone it is replaced.
TEST(LeaseCore, OlderLayoutInUseIsRefused) {
  TestGroup g("oldlayout");
  const int fd = open(g.Path().c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_TRUE(fd >= 0 && ftruncate(fd, 4800) == 0) << "planting " << g.Path();
  const char legacy[12] = {'C', 'R', 'O', 'S', 'S', 'O', 'V', '3', '\xc0', '\x12', 0, 0};
  ASSERT_TRUE(pwrite(fd, legacy, sizeof(legacy), 0) == sizeof(legacy)) << "pwrite";
  close(fd);
  int go[2], ready[2];
  ASSERT_TRUE(pipe(go) == 0 && pipe(ready) == 0) << "pipe";
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
  close(ready[1]);  // only the child writes: if it fails first, the read below sees EOF
  ready[1] = -1;
  char byte;
  ASSERT_TRUE(read(ready[0], &byte, 1) == 1) << "the old build's process did not start";
  std::shared_ptr<DeviceLease> lease;
  const LeaseStatus refused = DeviceLease::Get(g.group, g.key, &lease);
  struct stat st;
  const bool kept = stat(g.Path().c_str(), &st) == 0 && st.st_size == 4800;
  byte = 'g';
  ASSERT_TRUE(write(go[1], &byte, 1) == 1) << "pipe";
  int status = 0;
  waitpid(user, &status, 0);
  for (int p : {go[0], go[1], ready[0]}) close(p);
  ASSERT_TRUE(refused.code == LeaseCode::kPermissionDenied &&
              Contains(refused.message, "found 4800 bytes") &&
              Contains(refused.message, "layout version 3 (legacy") &&
              Contains(refused.message, "layout version 8") && Contains(refused.message, "in use"))
      << refused.message;
  ASSERT_TRUE(kept) << "a segment in use was replaced";
  const LeaseStatus replaced = DeviceLease::Get(g.group, g.key, &lease);
  ASSERT_TRUE(replaced.ok()) << "not replaced once nobody used it: " << replaced.message;
  ASSERT_TRUE(lease->Acquire(1, 0).ok() && lease->Yield().ok()) << "acquire on the new segment";
}


// A lease directory holds the segment as a plain file; another directory (or /dev/shm) with
// the same names is another lease. A bad directory fails with a message naming it.
TEST(LeaseCore, LeaseDirectory) {
  TempDir dir;
  TestGroup g("dir", dir.path), shm("dir");
  auto lease = g.Open();
  struct stat st;
  ASSERT_TRUE(stat(g.Path().c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
              (st.st_mode & 0777) == 0600)
      << "no private segment file at " << g.Path();
  ASSERT_TRUE(lease->path() == g.Path()) << lease->path();
  ASSERT_TRUE(lease->Acquire(1, 0).ok()) << "acquire in the directory";
  ASSERT_TRUE(InChild([&] {
                return g.Open()->Acquire(0.3, 0).code == LeaseCode::kDeadlineExceeded ? 0 : 1;
              }) == 0)
      << "a peer in the same directory did not wait";
  ASSERT_TRUE(InChild([&] { return shm.Open()->Acquire(0.3, 0).ok() ? 0 : 1; }) == 0)
      << "/dev/shm and the directory are the same lease";
  lease->Yield();
  std::shared_ptr<DeviceLease> none;
  SegmentLocation missing;
  missing.dir = dir.path + "/absent";
  LeaseStatus s = DeviceLease::Get(g.group, g.key, &none, missing);
  ASSERT_TRUE(s.code == LeaseCode::kInvalidArgument && Contains(s.message, missing.dir) &&
              Contains(s.message, "must exist"))
      << s.message;
  SegmentLocation file;
  file.dir = g.Path();
  s = DeviceLease::Get(g.group, g.key, &none, file);
  ASSERT_TRUE(s.code == LeaseCode::kInvalidArgument && Contains(s.message, "is not a directory"))
      << s.message;
}

// Only file systems known to be local are accepted (an allowlist): network, cluster and FUSE
// ones, and any unknown type, are refused.
TEST(LeaseCore, OnlyLocalFileSystemsAccepted) {
  for (int64_t magic : {0x6969L, 0x517BL, 0xFF534D42L, 0xFE534D42L, 0x01021997L, 0x00C36400L,
                        0x65735546L, 0x19830326L /* beegfs */, 0x20030528L /* panfs */,
                        0x12345678L /* unknown */}) {
    ASSERT_TRUE(LocalFileSystem(magic) == nullptr) << "accepted: " << std::hex << magic;
  }
  for (int64_t magic : {0x01021994L /* tmpfs */, 0xEF53L /* ext4 */, 0x58465342L /* xfs */}) {
    ASSERT_TRUE(LocalFileSystem(magic) != nullptr) << "refused: " << std::hex << magic;
  }
  ASSERT_TRUE(std::string(LocalFileSystem(0x01021994)) == "tmpfs") << "name";
  ASSERT_TRUE(FileSystemText(0x6969) == "nfs (0x6969)") << FileSystemText(0x6969);
  ASSERT_TRUE(FileSystemText(0x12345678) == "an unknown type (0x12345678)") << "unknown";
}

// Every process that opens the lease is a member under its job label; Inspect lists members,
// holder and queue without becoming a member and without creating anything.
TEST(LeaseCore, MembersAndInspect) {
  TempDir dir;
  TestGroup g("members", dir.path);
  auto lease = g.Open("jobA");
  HolderChild holder(g);  // a child of jobA (it inherits the label) holds
  std::thread waiter([&] { lease->Acquire(5, 0); lease->Yield(); });
  LeaseSnapshot snap;
  for (int i = 0; i < 200 && snap.queue.empty(); ++i) {
    ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &snap).ok()) << "inspect";
    usleep(10000);
  }
  ASSERT_TRUE(snap.members.size() == 2) << snap.members.size() << " members";
  int holding = 0;
  for (const LeaseMember& m : snap.members) {
    ASSERT_TRUE(m.job == "jobA" && m.pid_ns != 0) << m.job;
    holding += m.holding ? (m.pid == holder.pid ? 1 : 100) : 0;
  }
  ASSERT_TRUE(holding == 1) << "the holder is not the held member";
  ASSERT_TRUE(snap.held_since_wall_ns > 0) << "no hold time";
  ASSERT_TRUE(snap.queue.size() == 1 && snap.queue[0].pid == getpid() &&
              snap.queue[0].job == "jobA" && snap.queue[0].priority == kNormal)
      << snap.queue.size() << " waiting";
  ASSERT_TRUE(holder.LetGo() == 0) << "holder";
  waiter.join();
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &snap).ok()) << "inspect";
  ASSERT_TRUE(snap.members.size() == 1 && !snap.members[0].holding && snap.queue.empty() &&
              snap.held_since_wall_ns == 0)
      << snap.members.size() << " members after";
  const std::string absent = dir.path + "/crossover.none.dev";
  const LeaseStatus s = DeviceLease::Inspect(absent, 1, &snap);
  struct stat st;
  ASSERT_TRUE(!s.ok() && Contains(s.message, absent) && stat(absent.c_str(), &st) != 0)
      << s.message;
}

// What an observer reads of each member (the exporter's counters): acquisitions, waits by
// bucket, hand-offs, holds (the current one included, never more than its yield counts).
TEST(LeaseCore, UsageCounters) {
  TempDir dir;
  TestGroup g("usage", dir.path);
  auto lease = g.Open("jobA");
  HolderChild holder(g);
  std::atomic<bool> acquired{false};
  std::thread waiter([&] { acquired = lease->Acquire(5, 0).ok(); });
  usleep(50000);
  ASSERT_TRUE(holder.LetGo() == 0) << "holder";
  waiter.join();
  ASSERT_TRUE(acquired) << "acquire";
  usleep(30000);
  LeaseSnapshot during, after;
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &during).ok() && during.members.size() == 1)
      << during.members.size() << " members";
  ASSERT_TRUE(lease->Yield().ok()) << "yield";
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &after).ok() && after.members.size() == 1)
      << "after";
  const LeaseUsage& u = during.members[0].usage;
  ASSERT_TRUE(during.members[0].holding && u.acquires == 1 && u.contended == 1 && u.handoffs == 1)
      << u.acquires << " " << u.contended << " " << u.handoffs;
  ASSERT_TRUE(u.wait_ns > 40000000 && u.wait_ns < 5000000000LL) << u.wait_ns;
  ASSERT_TRUE(u.wait_buckets[3] == 1) << "a 50 ms wait is in the (10 ms, 100 ms] bucket";
  ASSERT_TRUE(u.hold_ns >= 30000000 && during.held_for_ns == u.hold_ns)
      << "current hold " << u.hold_ns;
  const LeaseUsage& v = after.members[0].usage;
  ASSERT_TRUE(v.hold_ns >= u.hold_ns && v.hold_ns < u.hold_ns + 1000000000) << v.hold_ns;
  ASSERT_TRUE(!after.members[0].holding && after.held_for_ns == 0) << "released";
  ASSERT_TRUE(after.overlapping_holds == 0 && after.handoffs == 1) << after.overlapping_holds;
}

// The overlapping-hold check counts a hold begun while another process is inside one, and
// not a dead holder's hold that the next one reclaims.
TEST(LeaseCore, OverlappingHoldsAreCounted) {
  TempDir dir;
  TestGroup g("overlap", dir.path);
  auto lease = g.Open();
  const pid_t dies_holding = Spawn([&] { return g.Open()->Acquire(5, 0).ok() ? 0 : 1; });
  ASSERT_TRUE(Reap(dies_holding) == 0) << "child";
  ASSERT_TRUE(lease->Acquire(5, 0).ok() && lease->Yield().ok()) << "reclaimed";
  LeaseSnapshot snap;
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.overlapping_holds == 0)
      << snap.overlapping_holds << " after a dead holder";
  LeaseTestHooks::MarkInside(*lease, 12345);  // "another process is inside its hold"
  ASSERT_TRUE(lease->Acquire(5, 0).ok() && lease->Yield().ok()) << "acquire";
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.overlapping_holds == 1)
      << snap.overlapping_holds << " overlaps";
  ASSERT_TRUE(lease->Acquire(5, 0).ok() && lease->Yield().ok()) << "acquire";
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.overlapping_holds == 1)
      << "a clean hold counted: " << snap.overlapping_holds;
}

// An observer never keeps a copy taken while a member is in the middle of a change: it retries
// and, past its bound, says so instead of showing a half-made change.
TEST(LeaseCore, ObserverWaitsOutAChangeInProgress) {
  TempDir dir;
  TestGroup g("torn", dir.path);
  auto lease = g.Open();
  LeaseSnapshot snap;
  LeaseTestHooks::StepChangeSeq(*lease);  // "stopped in the middle of an update"
  const LeaseStatus torn = DeviceLease::Inspect(g.Path(), 0.2, &snap);
  ASSERT_TRUE(torn.code == LeaseCode::kDeadlineExceeded &&
              Contains(torn.message, "in the middle of an update"))
      << torn.message;
  LeaseTestHooks::StepChangeSeq(*lease);
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 0.2, &snap).ok() && snap.members.size() == 1)
      << "settled";
}

// Link-turn waits are counted in the waiting member's slot.
TEST(LeaseCore, LinkTurnUsage) {
  TempDir dir;
  TestGroup g("turn_usage", dir.path);
  auto turn = g.OpenLinkTurn();
  ASSERT_TRUE(JoinAndStart(*turn, 0, 2)) << "join";
  int in_turn[2];
  ASSERT_TRUE(pipe(in_turn) == 0) << "pipe";
  const pid_t peer = Spawn([&] {  // joins second, so it turns first
    auto mine = g.OpenLinkTurn();
    bool skipped = true;
    if (!JoinAndStart(*mine, 1, 2) || !mine->Wait(5, &skipped).ok() || skipped) return 2;
    char byte = 't';
    if (write(in_turn[1], &byte, 1) != 1) return 3;
    usleep(60000);
    return mine->Done().ok() && mine->Leave().ok() ? 0 : 4;
  });
  close(in_turn[1]);  // only the peer writes: if it fails first, the read below sees EOF
  char byte;
  ASSERT_TRUE(read(in_turn[0], &byte, 1) == 1) << "the peer did not take its turn";
  bool skipped = true;
  ASSERT_TRUE(turn->Wait(5, &skipped).ok() && !skipped) << "wait";
  ASSERT_TRUE(Reap(peer) == 0) << "peer";
  LeaseSnapshot snap;
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.members.size() == 1)
      << "inspect";
  const LeaseUsage& u = snap.members[0].usage;
  ASSERT_TRUE(u.link_turns == 1 && u.link_turn_waits == 1 && u.link_turn_wait_ns > 30000000)
      << u.link_turns << " " << u.link_turn_waits << " " << u.link_turn_wait_ns;
  ASSERT_TRUE(turn->Done().ok() && turn->Leave().ok()) << "done";
  close(in_turn[0]);
}

TEST(LeaseCore, JobLabels) {
  TestGroup g("jobs");
  std::shared_ptr<DeviceLease> lease;
  SegmentLocation bad;
  bad.job = "a b";
  LeaseStatus s = DeviceLease::Get(g.group, g.key, &lease, bad);
  ASSERT_TRUE(s.code == LeaseCode::kInvalidArgument && Contains(s.message, "job label 'a b'"))
      << s.message;
  ASSERT_TRUE(DeviceLease::ValidateJob(std::string(kMaxJobLen, 'j')).ok() &&
              !DeviceLease::ValidateJob(std::string(kMaxJobLen + 1, 'j')).ok() &&
              DeviceLease::ValidateJob("").ok() && DeviceLease::ValidateJob("h.x:12@a_b-c").ok())
      << "label rule";
  auto plain = g.Open();  // the default label, "<host>:<pid>"
  LeaseSnapshot snap;
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.members.size() == 1)
      << "inspect";
  const std::string suffix = ":" + std::to_string(getpid());
  const std::string& label = snap.members[0].job;
  ASSERT_TRUE(label.size() > suffix.size() &&
              label.compare(label.size() - suffix.size(), suffix.size(), suffix) == 0)
      << label;
  ASSERT_TRUE(g.Open("trainer")->path() == plain->path()) << "a first explicit label is adopted";
  ASSERT_TRUE(DeviceLease::Inspect(g.Path(), 1, &snap).ok() && snap.members.size() == 1 &&
              snap.members[0].job == "trainer")
      << snap.members[0].job;
  SegmentLocation other;
  other.job = "other";
  s = DeviceLease::Get(g.group, g.key, &lease, other);
  ASSERT_TRUE(s.code == LeaseCode::kInvalidArgument && Contains(s.message, "as job 'trainer'"))
      << s.message;
}

// Group mode (root only: it makes a directory of another group): segments are created 0660
// and of the directory's group whatever the umask; one of another group or with other bits
// is refused and kept.
TEST(LeaseCore, GroupMode) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown a directory to another group";
  TempDir dir;
  constexpr gid_t kGroup = 62000;
  ASSERT_TRUE(chown(dir.path.c_str(), 0, kGroup) == 0 && chmod(dir.path.c_str(), 03770) == 0)
      << "dir";
  TestGroup g("groupmode", dir.path), planted("planted", dir.path);
  g.options.shared_group = planted.options.shared_group = true;
  const mode_t old_umask = umask(077);
  auto lease = g.Open();
  umask(old_umask);
  struct stat st;
  ASSERT_TRUE(stat(g.Path().c_str(), &st) == 0 && (st.st_mode & 07777) == 0660 &&
              st.st_gid == kGroup)
      << "segment mode " << std::oct << (st.st_mode & 07777) << " gid " << std::dec << st.st_gid;
  ASSERT_TRUE(lease->Acquire(1, 0).ok() && lease->Yield().ok()) << "acquire in group mode";
  std::shared_ptr<DeviceLease> refused;
  LeaseStatus s;
  struct Case { gid_t gid; mode_t mode; const char* says; };
  for (const Case& c : {Case{kGroup + 1, 0660, "belongs to group 62001"},
                        Case{kGroup, 0664, "permissions 0664"}}) {
    const int fd = open(planted.Path().c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_TRUE(fd >= 0 && fchown(fd, 0, c.gid) == 0 && fchmod(fd, c.mode) == 0) << "planting";
    close(fd);
    s = DeviceLease::Get(planted.group, planted.key, &refused, planted.options);
    ASSERT_TRUE(s.code == LeaseCode::kPermissionDenied && Contains(s.message, c.says)) << s.message;
    ASSERT_TRUE(stat(planted.Path().c_str(), &st) == 0) << "a refused segment must not be deleted";
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
  ASSERT_TRUE(maker > 0 && waitpid(maker, &maker_status, 0) == maker && maker_status == 0)
      << "making the group-mode segment in a child";
  // Without group mode the sticky group directory passes as a shared scratch directory (as
  // /tmp does: nobody renames another's file), and the group's 0660 segment is refused.
  s = DeviceLease::Get(fresh.group, fresh.key, &refused, not_group);
  ASSERT_TRUE(s.code == LeaseCode::kPermissionDenied &&
              Contains(s.message, "has permissions 0660") && Contains(s.message, "group mode"))
      << s.message;
}

// The trust rule (lease_dir.h), checked on every open: a lease directory that another user
// owns, or that others may write without the sticky bit (or, in group mode, at all), or with a
// directory above it that others may write, is refused with the path, its owner and mode and
// the command that fixes it, and nothing is created in it; a sticky (/dev/shm-like), a private
// and a proper group directory pass.
TEST(LeaseCore, DirectoryTrustRule) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown the directory";
  TempDir parent;
  const std::string dir = parent.path + "/leases";
  ASSERT_TRUE(mkdir(dir.c_str(), 0700) == 0) << "mkdir";
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
    ASSERT_TRUE(chown(dir.c_str(), c.uid, c.gid) == 0 && chmod(dir.c_str(), c.mode) == 0) << "dir";
    TestGroup g("trust" + std::to_string(n++), dir);
    g.options.shared_group = c.group;
    std::shared_ptr<DeviceLease> lease;
    const LeaseStatus s = DeviceLease::Get(g.group, g.key, &lease, g.options);
    ASSERT_TRUE(s.code == LeaseCode::kPermissionDenied && Contains(s.message, "trust rule") &&
                Contains(s.message, c.says) &&
                Contains(s.message, dir + " (owner uid " + std::to_string(c.uid)) &&
                Contains(s.message, "install -d -m") &&
                (!c.group || Contains(s.message, "install -d -m 3770 -g GROUP")))
        << "mode " << std::oct << c.mode << ": " << s.message;
    ASSERT_TRUE(access(g.Path().c_str(), F_OK) != 0)
        << "a segment was created in a refused directory";
  }
  // A directory above the lease directory that others may write: they could swap the lease
  // directory itself. Sticky, they cannot.
  ASSERT_TRUE(chown(dir.c_str(), 0, 0) == 0 && chmod(dir.c_str(), 0700) == 0) << "dir";
  ASSERT_TRUE(chmod(parent.path.c_str(), 0777) == 0) << "parent";
  TestGroup above("trustabove", dir);
  std::shared_ptr<DeviceLease> lease;
  LeaseStatus s = DeviceLease::Get(above.group, above.key, &lease, above.options);
  ASSERT_TRUE(s.code == LeaseCode::kPermissionDenied &&
              Contains(s.message, parent.path + " (owner uid 0") &&
              Contains(s.message, "not sticky"))
      << s.message;
  ASSERT_TRUE(chmod(parent.path.c_str(), 01777) == 0) << "parent";
  const Case passed[] = {{0, 0, 01777, false, ""}, {0, 0, 0700, false, ""},
                         {0, 62000, 03770, true, ""}};
  for (const Case& c : passed) {
    ASSERT_TRUE(chown(dir.c_str(), c.uid, c.gid) == 0 && chmod(dir.c_str(), c.mode) == 0) << "dir";
    TestGroup g("trust" + std::to_string(n++), dir);
    g.options.shared_group = c.group;
    auto ok = g.Open();
    ASSERT_TRUE(ok->Acquire(1, 0).ok() && ok->Yield().ok()) << "mode " << std::oct << c.mode;
  }
  chmod(parent.path.c_str(), 0700);
  rmdir(dir.c_str());
}

// Read what you hold: the member list comes from the mapping this process holds, so a file
// swapped in under the name (here a copy of the real one, a perfect forgery) never passes a
// join check; and once the name no longer refers to the mapping, the member list and every
// acquire are errors, never a silent second lease.
TEST(LeaseCore, RenamedSegmentIsAnErrorForItsMembers) {
  TempDir dir;
  TestGroup g("renamed", dir.path);
  auto lease = g.Open("jobA");
  HolderChild holder(g);  // a second member (a child of jobA, on the same mapping)
  LeaseSnapshot snap;
  LeaseStatus s = lease->Members(&snap);
  ASSERT_TRUE(s.ok() && snap.members.size() == 2 && snap.held_since_wall_ns > 0)
      << s.message << " / " << snap.members.size() << " members";
  ASSERT_TRUE(holder.LetGo() == 0) << "holder";
  const std::string moved = dir.path + "/moved-away";
  ASSERT_TRUE(rename(g.Path().c_str(), moved.c_str()) == 0) << "rename";
  const int from = open(moved.c_str(), O_RDONLY), to = open(g.Path().c_str(), O_CREAT | O_WRONLY, 0600);
  std::vector<char> bytes(1 << 16);
  const ssize_t n = read(from, bytes.data(), bytes.size());
  ASSERT_TRUE(n > 0 && write(to, bytes.data(), n) == n) << "copying the segment";
  close(from);
  close(to);
  s = lease->Members(&snap);
  ASSERT_TRUE(s.code == LeaseCode::kFailedPrecondition && Contains(s.message, "renamed") &&
              Contains(s.message, g.Path()))
      << s.message;
  s = lease->Acquire(1, 0);
  ASSERT_TRUE(s.code == LeaseCode::kFailedPrecondition && Contains(s.message, "renamed"))
      << s.message;
  unlink(moved.c_str());
}

// The last member out removes the segment (at exit, under the creation flock): a member that
// leaves while another is live leaves it; the last one removes it.
TEST(LeaseCore, LastMemberOutRemovesTheSegment) {
  TempDir dir;
  TestGroup g("lastout", dir.path);
  ASSERT_TRUE(InChild([&]() -> int {
                g.Open();
                exit(0);  // not _exit: the exit handlers run
              }) == 0)
      << "a lone member";
  ASSERT_TRUE(access(g.Path().c_str(), F_OK) != 0) << "a lone member's segment was left behind";
  int go[2];
  ASSERT_TRUE(pipe(go) == 0) << "pipe";
  const pid_t first = fork();
  if (first == 0) {
    g.Open();
    char byte;
    alarm(30);
    exit(read(go[0], &byte, 1) == 1 ? 0 : 1);
  }
  for (int i = 0; i < 500 && access(g.Path().c_str(), F_OK) != 0; ++i) usleep(10000);
  ASSERT_TRUE(InChild([&]() -> int {
                g.Open();
                exit(0);
              }) == 0)
      << "the second member";
  const bool kept = access(g.Path().c_str(), F_OK) == 0;
  char byte = 'g';
  ASSERT_TRUE(write(go[1], &byte, 1) == 1) << "pipe";
  int status = 0;
  waitpid(first, &status, 0);
  close(go[0]);
  close(go[1]);
  ASSERT_TRUE(kept) << "the segment was removed while a member was live";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the first member";
  ASSERT_TRUE(access(g.Path().c_str(), F_OK) != 0) << "the last member's segment was left behind";
}

// An observer (status, the exporter) never blocks: a member stopped inside the internal lock
// does not delay it (it copies the segment, never locking it), and a planted file that fails
// the trust rule is refused at once, with the reason.
TEST(LeaseCore, ObserverNeverBlocks) {
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
  ASSERT_TRUE(s.ok() && snap.members.size() == 1 && snap.members[0].job == "jobA")
      << s.message << " / " << snap.members.size() << " members";
  ASSERT_TRUE(took < 0.5) << "an observer waited " << took << " s behind a stopped locker";
  const int fd = open(planted.Path().c_str(), O_CREAT | O_RDWR, 0666);
  ASSERT_TRUE(fd >= 0 && fchmod(fd, 0666) == 0 && ftruncate(fd, 1 << 14) == 0) << "planting";
  close(fd);
  start = MonoS();
  const LeaseStatus refused = DeviceLease::Inspect(planted.Path(), 2, &snap);
  ASSERT_TRUE(refused.code == LeaseCode::kPermissionDenied && Contains(refused.message, "0666"))
      << refused.message;
  ASSERT_TRUE(MonoS() - start < 0.5) << "refusing took " << MonoS() - start << " s";
}

}  // namespace
}  // namespace crossover
