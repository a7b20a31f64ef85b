// lease_cli: drives the device lease from real processes, without TensorFlow, so that tests
// can run races, kills and PID-namespace setups quickly and many times.
//
//   lease_cli cycles GROUP KEY N HOLD_US OUT [BARRIER_DIR COUNT]
//       N acquire/hold/release cycles; writes "start_ns end_ns" lines (CLOCK_MONOTONIC) to OUT.
//   lease_cli hold GROUP KEY READY_FILE        acquire, write READY_FILE, sleep until killed
//   lease_cli acquire GROUP KEY TIMEOUT OUT    one acquire; writes "ok MONO_NS WALL_NS" or
//                                              "error MSG" (wall: comparable across time
//                                              namespaces, where MONO_NS is not)
//   lease_cli reserve GROUP KEY RESERVE_S READY  acquire as a primary, yield with a reservation
//                                              of RESERVE_S, write READY, sleep until killed
//   lease_cli stale-race GROUP TRIALS          two starters on a planted stale segment
//   lease_cli stress GROUP SECONDS PROCS       workers cycle while random ones are SIGKILLed
//   lease_cli thread-timeout GROUP             two threads wait behind a peer; one times out
//   lease_cli fork-child GROUP                 a forked child must not own its parent's hold
//   lease_cli priority GROUP SECONDS MICRO_US  a primary's steps alone, then beside a secondary
//                                              that computes in micro-batches of MICRO_US
//   lease_cli grab-lock GROUP KEY READY        maps an existing segment and takes its internal
//                                              mutex its own way (as a group member's code could,
//                                              not recording itself), writes READY, sleeps
//
// build/lease_cli_other_layout is the same CLI built with another segment layout (ops/Makefile),
// to run jobs of two builds against one segment.
//
// Environment (as a deployment would set it): CROSSOVER_LEASE_DIR (the lease directory, default
// /dev/shm), CROSSOVER_LEASE_SHARED_GROUP=1 (group mode), CROSSOVER_LEASE_JOB (the job label).
// LEASE_CLI_EXIT_LINGER_MS=N (tests only): the process lingers N ms after the lease's own exit
// handler (last member out) has run, as a TensorFlow process does while it tears down.
//
// Every mode bounds its loops in count and time. The last line printed is a summary of
// key=value pairs that the tests parse; the exit code is 0 unless the mode itself failed.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "core/device_lease.h"
#include "core/lease_segment.h"

namespace {

using crossover::DeviceLease;
using crossover::LeaseStatus;

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void Die(const std::string& msg) {
  fprintf(stderr, "lease_cli: %s\n", msg.c_str());
  exit(2);
}

std::string Env(const char* name) {
  const char* value = getenv(name);
  return value ? value : "";
}

crossover::SegmentLocation LocationFromEnv() {
  crossover::SegmentLocation location;
  location.dir = Env("CROSSOVER_LEASE_DIR");
  location.shared_group = Env("CROSSOVER_LEASE_SHARED_GROUP") == "1";
  location.job = Env("CROSSOVER_LEASE_JOB");
  return location;
}

std::shared_ptr<DeviceLease> Open(const std::string& group, const std::string& key) {
  std::shared_ptr<DeviceLease> lease;
  const LeaseStatus status = DeviceLease::Get(group, key, &lease, LocationFromEnv());
  if (!status.ok()) Die(status.message);
  return lease;
}

void Unlink(const std::string& group, const std::string& key) {
  std::string path;
  if (DeviceLease::SegmentPath(Env("CROSSOVER_LEASE_DIR"), group, key, &path).ok()) {
    unlink(path.c_str());
  }
}

// Shared between a driver and the workers it forks: who is on the device right now, so that a
// second process entering while another is inside is counted as an overlap.
struct Probe {
  std::atomic<int32_t> occupant;
  std::atomic<uint64_t> acquisitions, overlaps, timeouts, errors, stop;
  std::atomic<int32_t> num_killed;
  std::atomic<int32_t> killed[4096];

  bool WasKilled(int32_t pid) const {
    const int n = std::min<int>(num_killed.load(), 4096);
    for (int i = 0; i < n; ++i) {
      if (killed[i].load() == pid) return true;
    }
    return false;
  }
  // Called right after acquiring: the device must be empty, or hold a process we killed.
  void Enter() {
    const int32_t me = getpid();
    int32_t seen = 0;
    while (!occupant.compare_exchange_strong(seen, me)) {
      if (!WasKilled(seen)) {
        ++overlaps;
        occupant.store(me);
        break;
      }
    }
    ++acquisitions;
  }
  void Leave() {
    int32_t me = getpid();
    occupant.compare_exchange_strong(me, 0);
  }
};

Probe* NewProbe() {
  void* p = mmap(nullptr, sizeof(Probe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) Die("mmap probe");
  memset(p, 0, sizeof(Probe));
  return static_cast<Probe*>(p);
}

// Acquire, hold for hold_us, release; counts timeouts and errors instead of stopping.
bool Cycle(DeviceLease& lease, Probe* probe, int hold_us, double timeout_s) {
  const LeaseStatus status = lease.Acquire(timeout_s, 0);
  if (!status.ok()) {
    ++(status.code == crossover::LeaseCode::kDeadlineExceeded ? probe->timeouts : probe->errors);
    fprintf(stderr, "lease_cli[%d]: %s\n", getpid(), status.message.c_str());
    return false;
  }
  probe->Enter();
  if (hold_us > 0) usleep(hold_us);
  probe->Leave();
  lease.Yield();
  return true;
}

void WaitAtBarrier(const std::string& dir, int count) {
  mkdir(dir.c_str(), 0700);
  std::ofstream(dir + "/" + std::to_string(getpid())) << "here";
  const int64_t deadline = MonoNs() + 60LL * 1000000000;
  for (;;) {
    int arrived = 0;
    std::unique_ptr<FILE, int (*)(FILE*)> ls(popen(("ls " + dir).c_str(), "r"), pclose);
    char line[256];
    while (ls && fgets(line, sizeof(line), ls.get())) ++arrived;
    if (arrived >= count) return;
    if (MonoNs() > deadline) Die("barrier " + dir + " not reached within 60 s");
    usleep(2000);
  }
}

int Cycles(char** argv, int argc) {
  auto lease = Open(argv[2], argv[3]);
  const int n = atoi(argv[4]), hold_us = atoi(argv[5]);
  if (argc > 8) WaitAtBarrier(argv[7], atoi(argv[8]));
  std::ofstream out(argv[6]);
  for (int i = 0; i < n; ++i) {
    const LeaseStatus status = lease->Acquire(30.0, 0);
    if (!status.ok()) Die(status.message);
    const int64_t start = MonoNs();
    usleep(hold_us);
    const int64_t end = MonoNs();
    lease->Yield();
    out << start << " " << end << std::endl;  // flushed: tests watch progress
  }
  printf("mode=cycles cycles=%d\n", n);
  return 0;
}

int Hold(char** argv) {
  auto lease = Open(argv[2], argv[3]);
  const LeaseStatus status = lease->Acquire(30.0, 0);
  if (!status.ok()) Die(status.message);
  std::ofstream(argv[4]) << getpid();
  sleep(120);
  return 0;
}

int AcquireOnce(char** argv) {
  auto lease = Open(argv[2], argv[3]);
  const LeaseStatus status = lease->Acquire(atof(argv[4]), 0);
  std::ofstream out(argv[5]);
  if (status.ok()) {
    timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    out << "ok " << MonoNs() << " " << int64_t{wall.tv_sec} * 1000000000 + wall.tv_nsec << "\n";
  } else {
    out << "error " << status.message << "\n";
  }
  return 0;
}

// A process that maps an existing segment itself and takes its mutex without the core (so
// without recording itself), as any member of a group-mode lease can: the next member's wait
// must name this process, not the last one that recorded itself.
int GrabLock(char** argv) {
  std::string path;
  LeaseStatus status = DeviceLease::SegmentPath(Env("CROSSOVER_LEASE_DIR"), argv[2], argv[3],
                                                &path);
  if (!status.ok()) Die(status.message);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) Die("open " + path + ": " + strerror(errno));
  void* p = mmap(nullptr, sizeof(crossover::SharedLease), PROT_READ | PROT_WRITE, MAP_SHARED,
                 fd, 0);
  if (p == MAP_FAILED) Die("mmap " + path + ": " + strerror(errno));
  auto* shared = static_cast<crossover::SharedLease*>(p);
  const int rc = pthread_mutex_lock(&shared->mu);
  if (rc != 0 && rc != EOWNERDEAD) Die(std::string("pthread_mutex_lock: ") + strerror(rc));
  std::ofstream(argv[4]) << getpid();
  sleep(120);
  return 0;
}

// A primary that yields with a reservation and stays alive (a dead reserver's reservation does
// not count), so that a peer's acquire meets the reservation.
int Reserve(char** argv) {
  auto lease = Open(argv[2], argv[3]);
  LeaseStatus status = lease->Acquire(30.0, 0, crossover::kPrimary);
  if (status.ok()) status = lease->Yield(atof(argv[4]));
  if (!status.ok()) Die(status.message);
  std::ofstream(argv[5]) << getpid();
  sleep(120);
  return 0;
}

// Two starters race on a planted, stale segment (7 bytes of garbage), then cycle. Any moment
// at which both are inside counts as an overlap: they landed on different segments.
int StaleRace(char** argv) {
  const std::string group = argv[2];
  const int trials = atoi(argv[3]);
  Probe* probe = NewProbe();
  for (int t = 0; t < trials; ++t) {
    const std::string key = "race" + std::to_string(t);
    Unlink(group, key);
    std::string path;
    if (!DeviceLease::SegmentPath(Env("CROSSOVER_LEASE_DIR"), group, key, &path).ok()) {
      Die("bad lease directory or names");
    }
    const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd < 0 || write(fd, "garbage", 7) != 7) Die("planting " + path);
    close(fd);
    pid_t kids[2];
    for (pid_t& kid : kids) {
      kid = fork();
      if (kid == 0) {
        std::shared_ptr<DeviceLease> lease;
        const LeaseStatus status = DeviceLease::Get(group, key, &lease);
        if (!status.ok()) {
          ++probe->errors;
          _exit(1);
        }
        for (int i = 0; i < 20; ++i) Cycle(*lease, probe, 200, 5.0);
        _exit(0);
      }
    }
    for (pid_t kid : kids) waitpid(kid, nullptr, 0);
    Unlink(group, key);
  }
  printf("mode=stale-race trials=%d acquisitions=%lu overlaps=%lu errors=%lu timeouts=%lu\n",
         trials, probe->acquisitions.load(), probe->overlaps.load(), probe->errors.load(),
         probe->timeouts.load());
  return 0;
}

// Workers cycle with short random holds; the driver SIGKILLs a random one every 50-300 ms and
// starts a replacement. A worker that times out or errs exits non-zero; one that does not stop
// when asked has hung.
int Stress(char** argv) {
  const std::string group = argv[2];
  const double seconds = atof(argv[3]);
  const int procs = atoi(argv[4]);
  if (procs < 2 || procs > 16 || seconds <= 0 || seconds > 600) Die("stress: bad arguments");
  Probe* probe = NewProbe();
  std::mt19937 rng(getpid());
  auto start_worker = [&]() {
    const pid_t pid = fork();
    if (pid == 0) {
      std::mt19937 local(getpid());
      auto lease = Open(group, "stress");
      while (!probe->stop.load()) {
        if (!Cycle(*lease, probe, local() % 2000, 10.0)) _exit(3);
        usleep(local() % 500);
      }
      _exit(0);
    }
    return pid;
  };
  std::vector<pid_t> workers;
  for (int i = 0; i < procs; ++i) workers.push_back(start_worker());
  uint64_t kills = 0, failures = 0, hangs = 0;
  const int64_t end = MonoNs() + static_cast<int64_t>(seconds * 1e9);
  while (MonoNs() < end) {
    usleep(50000 + rng() % 250000);
    const size_t victim = rng() % workers.size();
    const int slot = probe->num_killed.fetch_add(1);
    if (slot < 4096) probe->killed[slot].store(workers[victim]);
    kill(workers[victim], SIGKILL);
    int status = 0;
    waitpid(workers[victim], &status, 0);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) ++failures;  // died on its own
    ++kills;
    workers[victim] = start_worker();
  }
  probe->stop.store(1);
  const int64_t stop_deadline = MonoNs() + 20LL * 1000000000;
  for (pid_t pid : workers) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (MonoNs() > stop_deadline) {
        ++hangs;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      usleep(10000);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) ++failures;
  }
  Unlink(group, "stress");
  printf("mode=stress seconds=%g procs=%d acquisitions=%lu kills=%lu overlaps=%lu "
         "timeouts=%lu errors=%lu failures=%lu hangs=%lu\n",
         seconds, procs, probe->acquisitions.load(), kills, probe->overlaps.load(),
         probe->timeouts.load(), probe->errors.load(), failures, hangs);
  return 0;
}

// A peer holds for 1 s while two threads of this process wait: one gives up after 0.3 s, the
// other must still get the device once the peer lets go, with nobody inside twice.
int ThreadTimeout(char** argv) {
  const std::string group = argv[2], key = "threads";
  Probe* probe = NewProbe();
  int ready[2];
  if (pipe(ready) != 0) Die("pipe");
  const pid_t peer = fork();
  if (peer == 0) {
    auto lease = Open(group, key);
    if (!lease->Acquire(10.0, 0).ok()) _exit(1);
    probe->Enter();
    if (write(ready[1], "x", 1) != 1) _exit(1);
    usleep(1000000);
    probe->Leave();
    lease->Yield();
    _exit(0);
  }
  char byte;
  if (read(ready[0], &byte, 1) != 1) Die("peer did not start");
  auto lease = Open(group, key);
  LeaseStatus quick, patient;
  std::thread impatient([&] { quick = lease->Acquire(0.3, 0); });
  std::thread waiting([&] {
    patient = lease->Acquire(10.0, 0);
    if (patient.ok()) probe->Enter();
  });
  impatient.join();
  waiting.join();
  probe->Leave();
  lease->Yield();
  int status = 0;
  waitpid(peer, &status, 0);
  Unlink(group, key);
  printf("mode=thread-timeout impatient_timed_out=%d patient_ok=%d overlaps=%lu peer_ok=%d\n",
         quick.code == crossover::LeaseCode::kDeadlineExceeded, patient.ok(),
         probe->overlaps.load(), WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return 0;
}

// The parent holds the lease and forks. The child must not be able to release the parent's
// hold, and must wait like any other process.
int ForkChild(char** argv) {
  const std::string group = argv[2], key = "fork";
  auto lease = Open(group, key);
  if (!lease->Acquire(5.0, 0).ok()) Die("parent could not acquire");
  const pid_t child = fork();
  if (child == 0) {
    lease->Yield();                                // must not free the parent's hold
    const LeaseStatus status = lease->Acquire(0.3, 0);  // so this must time out
    _exit(status.code == crossover::LeaseCode::kDeadlineExceeded ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  // A fresh process (exec'd, so no inherited state) must still find the lease held.
  char result[] = "/tmp/lease_cli_forkXXXXXX";
  const int result_fd = mkstemp(result);
  if (result_fd < 0) Die("mkstemp");
  close(result_fd);
  const pid_t other = fork();
  if (other == 0) {
    execl("/proc/self/exe", "lease_cli", "acquire", group.c_str(), key.c_str(), "0.3", result,
          static_cast<char*>(nullptr));
    _exit(2);
  }
  waitpid(other, nullptr, 0);
  std::string outcome;
  std::ifstream(result) >> outcome;
  unlink(result);
  const bool parent_holds = outcome == "error";
  lease->Yield();
  Unlink(group, key);
  printf("mode=fork-child child_saw_parent_hold=%d parent_still_holds=%d\n", child_ok,
         parent_holds);
  return 0;
}

// A primary job's step as the lease sees it: compute (4 ms), allreduce (8 ms, device free),
// apply (1 ms), then a 1 ms gap before the next step, yielding at step end with a reservation.
// Runs alone for SECONDS, then beside a secondary that holds the device for MICRO_US at a time
// (one micro-batch). Reports the primary's steps in each phase, its worst wait for the device,
// and how much of the device the secondary got.
int Priority(char** argv) {
  const std::string group = argv[2];
  const double seconds = atof(argv[3]);
  const int micro_us = atoi(argv[4]);
  if (seconds <= 0 || seconds > 120 || micro_us <= 0 || micro_us > 1000000) {
    Die("priority: bad arguments");
  }
  Probe* probe = NewProbe();
  struct Result {
    std::atomic<uint64_t> steps, secondary_holds;
    std::atomic<int64_t> max_wait_ns, secondary_busy_ns;
  };
  auto* result = static_cast<Result*>(mmap(nullptr, sizeof(Result) * 2, PROT_READ | PROT_WRITE,
                                           MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  memset(static_cast<void*>(result), 0, sizeof(Result) * 2);
  auto primary = [&](Result* r) {
    auto lease = Open(group, "prio");
    const int64_t end = MonoNs() + static_cast<int64_t>(seconds * 1e9);
    while (MonoNs() < end) {
      for (int hold_us : {4000, 1000}) {  // compute, then apply
        const int64_t asked = MonoNs();
        if (!lease->Acquire(10.0, 0, crossover::kPrimary).ok()) _exit(3);
        const int64_t waited = MonoNs() - asked;
        if (waited > r->max_wait_ns.load()) r->max_wait_ns.store(waited);
        probe->Enter();
        usleep(hold_us);
        probe->Leave();
        const bool step_end = hold_us == 1000;
        lease->Yield(step_end ? 0.02 : 0.0);
        usleep(step_end ? 1000 : 8000);  // next step's input, or the allreduce
      }
      ++r->steps;
    }
    _exit(0);
  };
  for (int phase = 0; phase < 2; ++phase) {
    probe->stop.store(0);
    const pid_t p = fork();
    if (p == 0) primary(&result[phase]);
    pid_t s = -1;
    if (phase == 1) {
      s = fork();
      if (s == 0) {
        auto lease = Open(group, "prio");
        while (!probe->stop.load()) {
          if (!lease->Acquire(10.0, 0, crossover::kSecondary).ok()) _exit(3);
          const int64_t start = MonoNs();
          probe->Enter();
          usleep(micro_us);
          probe->Leave();
          result[1].secondary_busy_ns += MonoNs() - start;
          ++result[1].secondary_holds;
          lease->Yield();
        }
        _exit(0);
      }
    }
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("primary failed");
    probe->stop.store(1);
    if (s > 0) waitpid(s, &status, 0);
  }
  Unlink(group, "prio");
  printf("mode=priority solo_steps=%lu paired_steps=%lu primary_ratio=%.3f "
         "max_wait_us=%ld micro_us=%d secondary_holds=%lu secondary_busy=%.3f overlaps=%lu\n",
         result[0].steps.load(), result[1].steps.load(),
         static_cast<double>(result[1].steps.load()) / result[0].steps.load(),
         result[1].max_wait_ns.load() / 1000, micro_us, result[1].secondary_holds.load(),
         result[1].secondary_busy_ns.load() / (seconds * 1e9), probe->overlaps.load());
  return 0;
}

}  // namespace

int g_exit_linger_ms = 0;

void LingerAtExit() { usleep(static_cast<useconds_t>(g_exit_linger_ms) * 1000); }

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  // Registered before any lease is opened: exit handlers run last-registered first, so this
  // one runs after the lease's.
  if (const char* linger = getenv("LEASE_CLI_EXIT_LINGER_MS")) {
    g_exit_linger_ms = std::min(std::max(atoi(linger), 0), 10000);
    atexit(LingerAtExit);
  }
  if (mode == "cycles" && argc >= 7) return Cycles(argv, argc);
  if (mode == "hold" && argc == 5) return Hold(argv);
  if (mode == "acquire" && argc == 6) return AcquireOnce(argv);
  if (mode == "reserve" && argc == 6) return Reserve(argv);
  if (mode == "stale-race" && argc == 4) return StaleRace(argv);
  if (mode == "stress" && argc == 5) return Stress(argv);
  if (mode == "thread-timeout" && argc == 3) return ThreadTimeout(argv);
  if (mode == "fork-child" && argc == 3) return ForkChild(argv);
  if (mode == "priority" && argc == 5) return Priority(argv);
  if (mode == "grab-lock" && argc == 5) return GrabLock(argv);
  fprintf(stderr, "usage: see the comment at the top of ops/testing/lease_cli.cc\n");
  return 2;
}
