#include "device_lease.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

namespace crossover {
namespace {

// The segment's layout. The compatibility rule: the first 16 bytes (SegmentHeader) are the same
// in every build from layout version 5 on, and a process uses a segment only if its magic,
// layout version and size all equal its own. Any change to SharedLease below the header must
// bump kLayoutVersion (the size alone can stay the same). A segment of any other layout is
// replaced only when no process is live on it (see CheckReplaceable); while one is, opening
// fails with an error naming both layouts. Versions 1-4 had no version field: their magic
// was "CROSSOV<version>" and their size sat where the version is now (see ReadLayout).
constexpr uint64_t kMagic = 0x5341454c534f5243ULL;  // "CROSLEAS": never changes
#ifdef CROSSOVER_LEASE_TEST_LAYOUT_PAD
constexpr uint32_t kLayoutVersion = 1006;  // a test build with another layout (ops/Makefile)
#else
constexpr uint32_t kLayoutVersion = 6;  // 6: slots carry their member's job label
#endif
constexpr uint64_t kLegacyMagicMask = 0x00ffffffffffffffULL;  // "CROSSOV" without the digit
constexpr uint64_t kLegacyMagicPrefix = 0x00564f53534f5243ULL;
constexpr size_t kTimelineCapacity = 16384;
constexpr int64_t kNsPerS = 1000000000;
constexpr int64_t kPollNs = 20 * 1000 * 1000;        // liveness re-check period while waiting
constexpr int64_t kOpenBoundNs = 30 * kNsPerS;       // wait for a creator/repairer to finish
constexpr int64_t kReleaseLockBoundNs = 10 * kNsPerS;  // internal-lock wait when releasing
constexpr int64_t kLockGraceNs = 200 * 1000 * 1000;  // internal-lock wait past a passed deadline
constexpr double kMaxInspectBoundS = 60;             // Inspect's longest internal-lock wait
constexpr int kOpenAttempts = 100;                   // bound on replace-and-retry rounds
constexpr off_t kSlotLockBase = 1 << 20;             // slot i's lock byte: kSlotLockBase + i
// Every process that uses the segment holds a read lock on this byte from before it lets
// other openers in (flock) until it closes the segment, so that it counts as live to an opener
// of another layout even before it has claimed a slot.
constexpr off_t kPresenceLockByte = kSlotLockBase - 1;

int64_t NowNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * kNsPerS + ts.tv_nsec;
}
int64_t MonoNs() { return NowNs(CLOCK_MONOTONIC); }
int64_t WallNs() { return NowNs(CLOCK_REALTIME); }
timespec ToTimespec(int64_t ns) {
  return timespec{static_cast<time_t>(ns / kNsPerS), static_cast<long>(ns % kNsPerS)};
}

std::atomic<int> g_init_delay_ms{0};

}  // namespace

struct Slot {
  uint64_t nonce;  // identity of the process that claimed this slot last
  int32_t pid;
  uint64_t pid_ns;
  char job[kMaxJobLen + 1];  // the member's job label, NUL-terminated
};

// One job's place in the link turn order on this host (see DeviceLease::TurnWait).
enum TurnState : int32_t { kTurnFree = 0, kTurnJoining = 1, kTurnActive = 2 };
struct TurnEntry {
  Owner who;        // the process of this host that runs the job's allreduces
  int32_t state;    // TurnState
  int32_t jobs;     // how many jobs the group has, as this job was told
  int64_t offset;   // global index of the job's first turn
  int64_t done;     // turns finished here; the next one is offset + done
};

// The first bytes of every segment, whatever its layout version (see kLayoutVersion).
struct SegmentHeader {
  std::atomic<uint64_t> magic;  // written last by the creator: the segment is initialised
  uint32_t layout_version;
  uint32_t struct_size;
};
static_assert(sizeof(SegmentHeader) == 16, "the header is fixed across layout versions");

struct SharedLease {
  SegmentHeader header;  // first: at offset 0 in every layout
#ifdef CROSSOVER_LEASE_TEST_LAYOUT_PAD
  char test_pad[CROSSOVER_LEASE_TEST_LAYOUT_PAD];
#endif
  pthread_mutex_t mu;              // robust, process-shared
  std::atomic<uint32_t> wake_seq;  // futex word: bumped on every release and repair
  std::atomic<int32_t> locker_pid; // who took mu last (for the "stuck inside" message)
  // Guarded by mu.
  Owner holder;                    // empty: free
  int64_t held_since_wall_ns;
  Owner last_holder;
  Owner reserved_for;              // see DeviceLease::Release(reserve_s)
  int64_t reserved_until_mono_ns;
  int32_t reserved_priority;
  uint64_t next_ticket;
  WaiterQueue queue;
  Slot slots[kMaxProcesses];
  uint64_t total_handoffs;
  uint64_t total_recoveries;
  TurnEntry turns[kMaxTurnJobs];   // indexed by position
};

const char* const kTurnStatsFields[5] = {"turns", "waited", "skipped", "wait_s",
                                         "max_wait_s"};

std::vector<double> TurnStats::Values() const {
  return {static_cast<double>(turns), static_cast<double>(waited),
          static_cast<double>(skipped), wait_s, max_wait_s};
}

const char* const kLeaseStatsFields[9] = {"acquires", "handoffs",   "contended",
                                          "recoveries", "wait_s",   "hold_s",
                                          "max_wait_s", "max_hold_s", "held"};

std::vector<double> LeaseStats::Values() const {
  return {static_cast<double>(acquires), static_cast<double>(handoffs),
          static_cast<double>(contended), static_cast<double>(recoveries), wait_s, hold_s,
          max_wait_s, max_hold_s, held ? 1.0 : 0.0};
}

// ----- WaiterQueue ------------------------------------------------------------------------

bool WaiterQueue::Push(const Waiter& w) {
  if (size >= kMaxWaiters) return false;
  int at = size;
  while (at > 0 && entries[at - 1].priority < w.priority) --at;
  // Shift the lower classes back by one. A crash in here leaves a duplicate (Repair drops it)
  // and at worst hides the last entry, whose owner then queues again.
  for (int i = size; i > at; --i) entries[i] = entries[i - 1];
  entries[at] = w;
  ++size;  // last: before this the queue reads as it was, up to that duplicate
  return true;
}

int WaiterQueue::Index(uint64_t ticket) const {
  for (int i = 0; i < size; ++i) {
    if (entries[i].ticket == ticket) return i;
  }
  return -1;
}

bool WaiterQueue::Remove(uint64_t ticket) {
  const int at = Index(ticket);
  if (at < 0) return false;
  // A crash in this loop leaves a duplicate of some entry; Repair() drops it.
  for (int i = at; i + 1 < size; ++i) entries[i] = entries[i + 1];
  --size;
  return true;
}

int WaiterQueue::Repair(const std::function<bool(const Owner&)>& alive, int64_t now_mono_ns) {
  int dropped = 0;
  if (size < 0 || size > kMaxWaiters) {
    dropped += size < 0 ? 0 : size - kMaxWaiters;
    size = std::clamp(size, 0, kMaxWaiters);
  }
  int kept = 0;
  for (int i = 0; i < size; ++i) {
    const Waiter& w = entries[i];
    bool duplicate = false;
    for (int j = 0; j < kept && !duplicate; ++j) duplicate = entries[j].ticket == w.ticket;
    if (w.ticket == 0 || duplicate || w.deadline_mono_ns < now_mono_ns || !alive(w.who)) {
      ++dropped;
      continue;
    }
    entries[kept++] = w;
  }
  size = kept;
  return dropped;
}

namespace {

void EmitWarning(const std::string& msg) { fprintf(stderr, "[crossover lease] %s\n", msg.c_str()); }

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, timeout, nullptr, 0);
}

void WakeAll(SharedLease* s) {
  s->wake_seq.fetch_add(1);
  Futex(&s->wake_seq, FUTEX_WAKE, INT_MAX, nullptr);
}

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-';
}
bool JobChar(char c) { return NameChar(c) || c == '.' || c == ':' || c == '@'; }

bool ValidChars(const std::string& s, size_t max_len, bool (*allowed)(char) = NameChar) {
  return !s.empty() && s.size() <= max_len && std::all_of(s.begin(), s.end(), allowed);
}

std::string SegmentName(const std::string& group, const std::string& device_key) {
  return "/crossover." + group + "." + device_key;
}

// The default job label: "<host>:<pid>", the host cut and its odd characters replaced so
// that the label stays valid.
std::string DefaultJob() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == 0) snprintf(host, sizeof(host), "host");
  const std::string pid = ":" + std::to_string(getpid());
  std::string label(host, strnlen(host, kMaxJobLen - pid.size()));
  std::replace_if(label.begin(), label.end(), [](char c) { return !JobChar(c); }, '-');
  return label + pid;
}

void WriteJob(char (&slot_job)[kMaxJobLen + 1], const std::string& job) {
  memset(slot_job, 0, sizeof(slot_job));
  memcpy(slot_job, job.data(), std::min(job.size(), kMaxJobLen));
}
std::string ReadJob(const char (&slot_job)[kMaxJobLen + 1]) {
  return std::string(slot_job, strnlen(slot_job, kMaxJobLen));
}

}  // namespace

// File systems whose futexes or file locks do not work across hosts (or, for FUSE, depend on
// a daemon that may not implement them): a lease there would exclude nobody on another host,
// silently. Refused, not warned: a false refusal is loud and fixable, a false pass is not.
// crossover_tf/lease/segments.py keeps the same table.
const char* NonLocalFileSystem(int64_t f_type) {
  switch (static_cast<uint32_t>(f_type)) {
    case 0x6969: return "nfs";
    case 0x517B: return "smb";
    case 0xFF534D42: return "cifs";
    case 0xFE534D42: return "smb2";
    case 0x01021997: return "9p";
    case 0x00C36400: return "ceph";
    case 0x65735546: return "fuse";
    case 0x5346414F: return "afs";
    case 0x73757245: return "coda";
    case 0x0BD00BD0: return "lustre";
    case 0x47504653: return "gpfs";
    case 0x01161970: return "gfs2";
    case 0x7461636F: return "ocfs2";
    default: return nullptr;
  }
}

namespace {

// A segment file and how it must be owned (see CheckOwnership).
struct SegmentFile {
  std::string dir, path;
  bool shared_group = false;
  gid_t dir_gid = 0;
};

std::string Errno(const std::string& what) { return what + ": " + strerror(errno); }
LeaseStatus Internal(const std::string& what) {
  return LeaseStatus::Error(LeaseCode::kInternal, Errno(what));
}

std::string Octal(unsigned value, const char* format = "%04o") {
  char text[16];
  snprintf(text, sizeof(text), format, value);
  return text;
}

// Checks the lease directory (it exists, is a directory, on a local file system) and names
// the segment file in it. dir "" is kDefaultLeaseDir.
LeaseStatus ResolveSegmentFile(const std::string& dir_in, const std::string& name,
                               bool shared_group, SegmentFile* out) {
  const std::string dir = dir_in.empty() ? kDefaultLeaseDir : dir_in;
  char real[PATH_MAX];
  struct stat st;
  if (realpath(dir.c_str(), real) == nullptr || stat(real, &st) != 0) {
    return LeaseStatus::Error(
        LeaseCode::kInvalidArgument,
        Errno("crossover lease directory " + dir + " cannot be used") +
            " (it must exist and be the same directory for every job of the group on this host)");
  }
  if (!S_ISDIR(st.st_mode)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease directory " + dir + " is not a directory");
  }
  struct statfs fs;
  if (statfs(real, &fs) != 0) return Internal("statfs " + dir);
  if (const char* kind = NonLocalFileSystem(fs.f_type)) {
    return LeaseStatus::Error(
        LeaseCode::kInvalidArgument,
        "crossover lease directory " + dir + " is on a " + kind + " file system (f_type " +
            Octal(static_cast<uint32_t>(fs.f_type), "0x%x") + "), not a local one: the "
            "lease's futex and file locks do not work across hosts, so jobs that share this "
            "directory from two hosts would compute at once without an error. Use a directory "
            "on a local file system of this host that every job of the group on it sees (a "
            "tmpfs such as /dev/shm, or a local disk)");
  }
  out->dir = real;
  out->path = (out->dir == "/" ? "" : out->dir) + name;
  out->shared_group = shared_group;
  out->dir_gid = st.st_gid;
  return LeaseStatus::Ok();
}

// Opens the segment file, creating it if missing. In group mode the name appears only with
// its final group and mode (made unnamed, then linked), so a peer of another uid never meets
// a file it cannot open or must refuse.
int OpenOrCreate(const SegmentFile& file) {
  constexpr int kFlags = O_RDWR | O_CLOEXEC | O_NOFOLLOW;
  if (!file.shared_group) return open(file.path.c_str(), kFlags | O_CREAT, 0600);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int fd = open(file.path.c_str(), kFlags);
    if (fd >= 0 || errno != ENOENT) return fd;
    const int unnamed = open(file.dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (unnamed < 0) return -1;
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", unnamed);
    const bool made = fchown(unnamed, static_cast<uid_t>(-1), file.dir_gid) == 0 &&
                      fchmod(unnamed, 0660) == 0 &&
                      linkat(AT_FDCWD, proc, AT_FDCWD, file.path.c_str(), AT_SYMLINK_FOLLOW) == 0;
    const int saved = errno;
    close(unnamed);
    errno = saved;
    if (!made && errno != EEXIST) return -1;  // EEXIST: a peer linked its own first
  }
  errno = ENOENT;
  return -1;
}

LeaseStatus OpenError(const SegmentFile& file) {
  std::string msg = Errno("crossover lease: cannot open segment " + file.path);
  if (errno != EACCES && errno != EPERM) return LeaseStatus::Error(LeaseCode::kInternal, msg);
  if (file.shared_group) {
    msg += "; in group mode (shared_group) every job's user must be a member of the group of "
           "the lease directory " + file.dir + " (gid " + std::to_string(file.dir_gid) +
           "), which must let that group in (e.g. mode 2770)";
  } else {
    msg += "; it belongs to another user: jobs of several users share a lease in group mode "
           "(shared_group), in a directory of a group they all belong to";
  }
  return LeaseStatus::Error(LeaseCode::kPermissionDenied, msg);
}

uint64_t PidNamespace() {
  char buf[64] = {0};
  const ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);  // "pid:[4026531836]"
  if (n <= 0) return 0;
  const char* open = strchr(buf, '[');
  return open ? std::strtoull(open + 1, nullptr, 10) : 0;
}

// Fresh kernel randomness per call: a seeded generator's state would be copied by fork(), and
// a parent and child could then draw the same identity.
uint64_t RandomNonce() {
  static std::atomic<uint64_t> fallback_counter{0};
  uint64_t nonce = 0;
  while (nonce == 0) {
    if (getrandom(&nonce, sizeof(nonce), 0) != static_cast<ssize_t>(sizeof(nonce))) {
      nonce = static_cast<uint64_t>(WallNs()) ^ (uint64_t{static_cast<uint32_t>(getpid())} << 40) ^
              fallback_counter.fetch_add(1);
    }
  }
  return nonce;
}

LeaseStatus InitShared(SharedLease* s) {
  memset(static_cast<void*>(s), 0, sizeof(SharedLease));
  s->header.layout_version = kLayoutVersion;
  s->header.struct_size = sizeof(SharedLease);
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(&s->mu, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) return LeaseStatus::Error(LeaseCode::kInternal, "pthread_mutex_init failed");
  s->header.magic.store(kMagic, std::memory_order_release);
  return LeaseStatus::Ok();
}

// Takes flock(LOCK_EX) on fd, waiting at most until deadline (flock itself has no timeout).
LeaseStatus FlockBounded(int fd, const std::string& path, int64_t deadline) {
  for (int64_t sleep_us = 100;; sleep_us = std::min<int64_t>(sleep_us * 2, 10000)) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return LeaseStatus::Ok();
    if (errno != EWOULDBLOCK && errno != EINTR) return Internal("flock " + path);
    if (MonoNs() >= deadline) {
      return LeaseStatus::Error(
          LeaseCode::kDeadlineExceeded,
          "lease segment " + path + " is being created or repaired by another "
          "process that has not finished within " + std::to_string(kOpenBoundNs / kNsPerS) +
          " s (stopped or wedged?); resume or kill it");
    }
    usleep(sleep_us);
  }
}

// Group mode: the segment belongs to the lease directory's group and is 0660, whoever of
// the group made it; anything else could be another group's and is refused, never deleted.
LeaseStatus CheckGroupOwnership(const struct stat& st, const SegmentFile& file) {
  if (st.st_gid != file.dir_gid) {
    return LeaseStatus::Error(
        LeaseCode::kPermissionDenied,
        file.path + " belongs to group " + std::to_string(st.st_gid) + ", not to the group of "
            "its lease directory (gid " + std::to_string(file.dir_gid) + "): in group mode a "
            "lease segment must belong to the lease directory's group. Another group's jobs "
            "use this name, or the file is stale: use another lease directory or group name, "
            "or remove the file if no job uses it");
  }
  if ((st.st_mode & 07777) != 0660) {
    return LeaseStatus::Error(
        LeaseCode::kPermissionDenied,
        file.path + " has permissions " + Octal(st.st_mode & 07777) + "; in group mode a "
            "lease segment must be 0660 (its owner and the directory's group, nobody else). "
            "Remove the file (no job should be using it) and start again");
  }
  return LeaseStatus::Ok();
}

// A lease segment must be ours alone (or, in group mode, our group's): another user's segment
// could be used to stall or fake our jobs' turns, so refuse it rather than share or delete it.
LeaseStatus CheckOwnership(const struct stat& st, const SegmentFile& file) {
  const std::string& path = file.path;
  if (!S_ISREG(st.st_mode)) {
    return LeaseStatus::Error(LeaseCode::kPermissionDenied, path + " is not a regular file");
  }
  if (file.shared_group) return CheckGroupOwnership(st, file);
  if (st.st_uid != geteuid()) {
    return LeaseStatus::Error(
        LeaseCode::kPermissionDenied,
        path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this process (uid " +
            std::to_string(geteuid()) + "): another user uses this group name; pick another "
            "group, or remove the file if it is stale");
  }
  if ((st.st_mode & 077) != 0) {
    return LeaseStatus::Error(
        LeaseCode::kPermissionDenied,
        path + " has permissions " + Octal(st.st_mode & 07777) + "; a lease segment must be "
        "private to its owner (0600), unless jobs of several users share it in group mode "
        "(shared_group). Remove the file (no job should be using it) and start again");
  }
  return LeaseStatus::Ok();
}

// True if the name still refers to the inode we hold open (it was not replaced meanwhile).
bool NameRefersTo(const std::string& path, const struct stat& st) {
  struct stat named;
  return lstat(path.c_str(), &named) == 0 && named.st_ino == st.st_ino &&
         named.st_dev == st.st_dev;
}

// A segment's layout as its header tells it, read without mapping it (it may be any size).
struct Layout {
  off_t size = 0;
  uint64_t magic = 0;
  uint32_t version = 0;  // 0: unknown
  bool legacy = false;   // a header from before layout version 5
};

Layout OurLayout() { return Layout{sizeof(SharedLease), kMagic, kLayoutVersion, false}; }

Layout ReadLayout(int fd, off_t size) {
  Layout found;
  found.size = size;
  SegmentHeader header{};
  if (size < static_cast<off_t>(sizeof(header)) ||
      pread(fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    return found;
  }
  found.magic = header.magic.load();
  found.legacy = (found.magic & kLegacyMagicMask) == kLegacyMagicPrefix;
  const char digit = static_cast<char>(found.magic >> 56);  // "CROSSOV<digit>"
  if (found.legacy && digit >= '1' && digit <= '9') {
    found.version = static_cast<uint32_t>(digit - '0');
  } else if (found.magic == kMagic) {
    found.version = header.layout_version;
  }
  return found;
}

std::string Describe(const Layout& l) {
  char magic[32];
  snprintf(magic, sizeof(magic), "0x%016llx", static_cast<unsigned long long>(l.magic));
  std::string text = std::to_string(l.size) + " bytes, magic " + magic + ", layout version ";
  if (l.version == 0) return text + "unknown (not a lease header)";
  text += std::to_string(l.version);
  return l.legacy ? text + " (legacy header without a version field)" : text;
}

std::string LayoutMismatch(int fd, off_t size) {
  return "found " + Describe(ReadLayout(fd, size)) + "; this build expects " +
         Describe(OurLayout());
}

// Who is live on a segment of another layout: any fcntl lock (OFD or POSIX) on any byte of
// the file. The layout's slot bytes may lie anywhere, so the whole file is tested: every
// build since slot locks (layout 2) locks a byte per process, and from layout 5 on also the
// presence byte. (Layout 1 judged liveness by pid and took no locks: its users cannot be seen.) The opener's fd is a fresh open file description with no locks of its own,
// so its own locks never count. Empty if nobody is (or the answer is unknown: then it says).
std::string LiveProcess(int fd) {
  struct flock fl = {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;  // to the end of the file and past it
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return Errno("cannot test its locks (F_OFD_GETLK)");
  if (fl.l_type == F_UNLCK) return "";
  if (fl.l_pid > 0) return "pid " + std::to_string(fl.l_pid) + " holds a lock on it";
  return "a process holds a lock on its byte " + std::to_string(fl.l_start) +
         " (an open-file-description lock: its pid is not known)";
}

// A segment that is not of our layout may be replaced only if nobody is live on it: its
// users would otherwise keep their own lease on the unlinked inode while we start another,
// and one process of each build could hold the device at once.
LeaseStatus CheckReplaceable(int fd, const std::string& path, off_t size) {
  const std::string live = LiveProcess(fd);
  if (live.empty()) return LeaseStatus::Ok();
  return LeaseStatus::Error(
      LeaseCode::kPermissionDenied,
      "lease segment " + path + " has another layout (" + LayoutMismatch(fd, size) +
          ") and is in use: " + live + ". Jobs built from another version of crossover_tf "
          "share this device; stop them (or let them finish) before starting this one, or use "
          "another group name");
}

// Marks this open file description as live on the segment (see kPresenceLockByte).
bool HoldPresence(int fd) {
  struct flock fl = {};
  fl.l_type = F_RDLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kPresenceLockByte;
  fl.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

bool IsOurLayout(const SharedLease* s) {
  return s->header.magic.load(std::memory_order_acquire) == kMagic &&
         s->header.layout_version == kLayoutVersion &&
         s->header.struct_size == sizeof(SharedLease);
}

// Opens, creates or replaces the segment. Everything that decides what the segment is happens
// under flock() on its inode, so concurrent starters agree on one segment: a creator holds the
// lock until the segment is initialised, and only the holder of the lock on the inode the
// name currently refers to may unlink it.
LeaseStatus OpenSegment(const SegmentFile& file, int* fd_out, SharedLease** shared_out,
                        std::vector<std::string>* warnings) {
  const std::string& path = file.path;
  const int64_t deadline = MonoNs() + kOpenBoundNs;
  for (int attempt = 0; attempt < kOpenAttempts; ++attempt) {
    const int fd = OpenOrCreate(file);
    if (fd < 0) return OpenError(file);
    auto fail = [fd](LeaseStatus status) {
      close(fd);
      return status;
    };
    LeaseStatus status = FlockBounded(fd, path, deadline);
    if (!status.ok()) return fail(status);
    struct stat st;
    if (fstat(fd, &st) != 0) return fail(Internal("fstat " + path));
    status = CheckOwnership(st, file);
    if (!status.ok()) return fail(status);
    if (!NameRefersTo(path, st)) {  // replaced by a repairer while we waited for the lock
      close(fd);
      continue;
    }
    const bool fresh = st.st_size == 0;
    if (fresh && ftruncate(fd, sizeof(SharedLease)) != 0) return fail(Internal("ftruncate"));
    if (fresh || st.st_size == static_cast<off_t>(sizeof(SharedLease))) {
      void* p = mmap(nullptr, sizeof(SharedLease), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return fail(Internal("mmap " + path));
      auto* s = static_cast<SharedLease*>(p);
      if (fresh) {
        if (const int ms = g_init_delay_ms.load()) usleep(ms * 1000);
        status = InitShared(s);
        if (!status.ok()) {
          munmap(p, sizeof(SharedLease));
          return fail(status);
        }
      }
      if (IsOurLayout(s)) {
        if (!HoldPresence(fd)) {  // nobody takes a write lock on that byte; never expected
          munmap(p, sizeof(SharedLease));
          return fail(Internal("locking the presence byte of " + path));
        }
        flock(fd, LOCK_UN);
        *fd_out = fd;
        *shared_out = s;
        return LeaseStatus::Ok();
      }
      munmap(p, sizeof(SharedLease));
    }
    // Another layout, garbage, or a creator that died before finishing. We hold the lock of
    // the inode the name refers to; replace it unless a process is live on it.
    status = CheckReplaceable(fd, path, st.st_size);
    if (!status.ok()) return fail(status);
    warnings->push_back("replacing stale or incompatible segment " + path + " (" +
                        Describe(ReadLayout(fd, st.st_size)) + "; nobody uses it)");
    // A sticky directory (e.g. /dev/shm) keeps another user's file: say so rather than retry.
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return fail(Internal("removing stale segment " + path));
    }
    close(fd);
  }
  return LeaseStatus::Error(LeaseCode::kInternal, "could not open lease segment " + path +
                                                      " after " +
                                                      std::to_string(kOpenAttempts) + " tries");
}

// True while some open file description holds the lock byte of slot (or when that cannot be
// told). fd must hold no slot lock itself, or its own slot reads as free.
bool SlotLocked(int fd, int32_t slot) {
  struct flock fl = {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kSlotLockBase + slot;
  fl.l_len = 1;
  if (fd < 0 || fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}

// o is live: its slot still carries its nonce (not reused since) and the slot's byte is locked.
bool OwnerLive(int fd, const SharedLease* s, const Owner& o) {
  if (o.empty() || o.slot < 0 || o.slot >= kMaxProcesses) return false;
  return s->slots[o.slot].nonce == o.nonce && SlotLocked(fd, o.slot);
}

// Who is live on the segment, read with its mutex held; dead entries are skipped, not repaired.
LeaseSnapshot TakeSnapshot(int fd, const SharedLease* s) {
  LeaseSnapshot snap;
  for (int i = 0; i < kMaxProcesses; ++i) {
    const Slot& slot = s->slots[i];
    if (slot.nonce == 0 || !SlotLocked(fd, i)) continue;
    snap.members.push_back(
        LeaseMember{ReadJob(slot.job), slot.pid, slot.pid_ns, s->holder.nonce == slot.nonce});
  }
  if (OwnerLive(fd, s, s->holder)) snap.held_since_wall_ns = s->held_since_wall_ns;
  const int64_t now = MonoNs();
  for (int i = 0; i < std::clamp(s->queue.size, 0, kMaxWaiters); ++i) {
    const Waiter& w = s->queue.entries[i];
    if (w.deadline_mono_ns < now || !OwnerLive(fd, s, w.who)) continue;
    snap.queue.push_back(LeaseWaiter{ReadJob(s->slots[w.who.slot].job), w.who.pid,
                                     w.who.pid_ns, w.priority, w.since_wall_ns});
  }
  return snap;
}

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
// Every lease this process opened, kept open until it exits: a process stays a member (its
// slot locked) of every lease it joined. The TF kernels that reference a lease come and go
// (tf.random.set_seed clears the eager kernel cache), and a member that vanished meanwhile
// would fail its peers' join check while it waits for them at a barrier.
std::map<std::string, std::shared_ptr<DeviceLease>>& Registry() {
  static auto* registry = new std::map<std::string, std::shared_ptr<DeviceLease>>();
  return *registry;
}

}  // namespace

// ----- the internal mutex -----------------------------------------------------------------

// Holds the shared mutex for one critical section. On every lock it drops a dead holder and
// dead or duplicate waiters, so no path acts on stale state. Warnings are written only after
// unlocking: a blocked stderr must never stall every job on the device.
class DeviceLease::Locked {
 public:
  explicit Locked(DeviceLease* lease) : lease_(lease), s_(lease->shared_) {}
  ~Locked() { Unlock(); }

  LeaseStatus Lock(int64_t deadline_mono) {
    const timespec abs = ToTimespec(std::max(deadline_mono, MonoNs() + kLockGraceNs));
    const int rc = pthread_mutex_clocklock(&s_->mu, CLOCK_MONOTONIC, &abs);
    if (rc == ETIMEDOUT) {
      return LeaseStatus::Error(
          LeaseCode::kDeadlineExceeded,
          "crossover lease " + lease_->name_ + ": its internal lock is held by pid " +
              std::to_string(s_->locker_pid.load()) +
              ", which has not let go (a stopped process, e.g. Ctrl-Z, or a wedged one?); "
              "resume or kill it");
    }
    if (rc != 0 && rc != EOWNERDEAD) {
      return LeaseStatus::Error(LeaseCode::kInternal,
                                "lease " + lease_->name_ + " is unusable (" + strerror(rc) +
                                    "); stop its jobs and remove " + lease_->path_);
    }
    locked_ = true;
    s_->locker_pid.store(getpid());
    if (rc == EOWNERDEAD) {  // a process died inside the critical section
      pthread_mutex_consistent(&s_->mu);
      Warn("a process died while updating " + lease_->name_ + "; repairing its state");
      Count(1);
    }
    DropDead();
    return LeaseStatus::Ok();
  }

  void Unlock() {
    if (locked_) pthread_mutex_unlock(&s_->mu);
    locked_ = false;
    for (const std::string& w : warnings_) EmitWarning(w);
    warnings_.clear();
  }

  void Warn(std::string msg) { warnings_.push_back(std::move(msg)); }

 private:
  void DropDead() {
    int repaired = 0;
    if (!s_->holder.empty() && !lease_->Alive(s_->holder)) {
      Warn("holder pid " + std::to_string(s_->holder.pid) + " of " + lease_->name_ +
           " is gone; reclaiming the lease");
      s_->holder = Owner{};
      ++repaired;
    }
    // Expired entries go too: a waiter that could not take this lock by its deadline (a
    // process stopped inside it) returned without removing its ticket, and lives on.
    repaired += s_->queue.Repair([this](const Owner& o) { return lease_->Alive(o); }, MonoNs());
    for (int i = 0; i < kMaxTurnJobs; ++i) {
      TurnEntry& e = s_->turns[i];
      if (e.state != kTurnFree && !lease_->Alive(e.who)) {
        Warn("job at link turn position " + std::to_string(i) + " of " + lease_->name_ +
             " (pid " + std::to_string(e.who.pid) + ") is gone; its turns are no longer waited for");
        e = TurnEntry{};
        ++repaired;
      }
    }
    if (repaired) {
      Count(repaired);
      WakeAll(s_);
    }
  }
  void Count(int repaired) {
    s_->total_recoveries += repaired;
    lease_->recoveries_.fetch_add(repaired);
  }

  DeviceLease* const lease_;
  SharedLease* const s_;
  bool locked_ = false;
  std::vector<std::string> warnings_;
};

// ----- opening and identity ---------------------------------------------------------------

LeaseStatus DeviceLease::ValidateName(const std::string& group, const std::string& device_key) {
  if (!ValidChars(group, kMaxGroupLen)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease group '" + group + "' is invalid: use 1-" +
                                  std::to_string(kMaxGroupLen) + " characters from [A-Za-z0-9_-]");
  }
  if (!ValidChars(device_key, kMaxDeviceKeyLen)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease device key '" + device_key + "' is invalid: use 1-" +
                                  std::to_string(kMaxDeviceKeyLen) +
                                  " characters from [A-Za-z0-9_-]");
  }
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::ValidateJob(const std::string& job) {
  if (job.empty() || ValidChars(job, kMaxJobLen, JobChar)) return LeaseStatus::Ok();
  return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                            "crossover lease job label '" + job + "' is invalid: use 1-" +
                                std::to_string(kMaxJobLen) +
                                " characters from [A-Za-z0-9_.:@-] (or none: <host>:<pid>)");
}

LeaseStatus DeviceLease::ValidatePriority(int64_t priority) {
  if (priority >= kSecondary && priority <= kPrimary) return LeaseStatus::Ok();
  return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                            "crossover lease priority must be 0 (secondary), 1 (normal) or 2 "
                            "(primary), got " + std::to_string(priority));
}

LeaseStatus DeviceLease::ValidateReserve(double reserve_s) {
  if (std::isfinite(reserve_s) && reserve_s >= 0 && reserve_s <= kMaxReserveS) {
    return LeaseStatus::Ok();
  }
  std::ostringstream msg;
  msg << "crossover lease reservation must be in [0, " << kMaxReserveS << "] s, got "
      << reserve_s;
  return LeaseStatus::Error(LeaseCode::kInvalidArgument, msg.str());
}

LeaseStatus DeviceLease::ValidateTimeout(double timeout_s) {
  if (std::isfinite(timeout_s) && timeout_s > 0 && timeout_s <= kMaxTimeoutS) {
    return LeaseStatus::Ok();
  }
  std::ostringstream msg;
  msg << "crossover lease timeout must be a number of seconds in (0, " << kMaxTimeoutS
      << "], got " << timeout_s
      << " (a finite bound turns a stuck peer into an error instead of a hang)";
  return LeaseStatus::Error(LeaseCode::kInvalidArgument, msg.str());
}

namespace {
// fork() support: the child must not keep its parent's slot lock alive (it would make a dead
// parent look alive) nor believe it holds its parent's lease.
std::vector<std::shared_ptr<DeviceLease>>& ForkingLeases() {
  static auto* leases = new std::vector<std::shared_ptr<DeviceLease>>();
  return *leases;
}
}  // namespace

struct ForkHandlers {
  static void Prepare() {
    RegistryMutex().lock();
    for (auto& entry : Registry()) {
      if (entry.second) ForkingLeases().push_back(entry.second);
    }
    for (auto& lease : ForkingLeases()) lease->local_mu_.lock();
  }
  static void Parent() {
    for (auto& lease : ForkingLeases()) lease->local_mu_.unlock();
    ForkingLeases().clear();
    RegistryMutex().unlock();
  }
  static void Child() {
    for (auto& lease : ForkingLeases()) {
      lease->ForgetIdentityAfterForkLocked();
      lease->local_mu_.unlock();
    }
    ForkingLeases().clear();
    RegistryMutex().unlock();
  }
};

LeaseStatus DeviceLease::Get(const std::string& group, const std::string& device_key,
                             std::shared_ptr<DeviceLease>* out, const LeaseOptions& options) {
  LeaseStatus status = ValidateName(group, device_key);
  if (status.ok()) status = ValidateJob(options.job);
  const std::string name = SegmentName(group, device_key);
  SegmentFile file;
  if (status.ok()) status = ResolveSegmentFile(options.dir, name, options.shared_group, &file);
  if (!status.ok()) return status;
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers, [] {
    pthread_atfork(ForkHandlers::Prepare, ForkHandlers::Parent, ForkHandlers::Child);
  });
  std::vector<std::string> warnings;
  {
    std::lock_guard<std::mutex> registry_lock(RegistryMutex());
    if (auto found = Registry().find(file.path); found != Registry().end()) {
      const std::shared_ptr<DeviceLease>& existing = found->second;
      status = existing->AdoptJob(options.job);
      if (status.ok()) *out = existing;
      return status;
    }
    int fd = -1;
    SharedLease* shared = nullptr;
    status = OpenSegment(file, &fd, &shared, &warnings);
    if (status.ok()) {
      std::shared_ptr<DeviceLease> lease(
          new DeviceLease(name, file.path, options.job, fd, shared));
      status = lease->Register();  // claims our slot; repairs state left by crashed runs
      if (status.ok()) {
        Registry()[file.path] = lease;
        *out = lease;
      }
    }
  }
  for (const std::string& w : warnings) EmitWarning(w);
  return status;
}

DeviceLease::DeviceLease(std::string name, std::string path, std::string job, int fd,
                         SharedLease* shared)
    : name_(std::move(name)),
      path_(std::move(path)),
      shared_(shared),
      lock_fd_(fd),
      job_(std::move(job)),
      events_(kTimelineCapacity),
      turn_events_(kTimelineCapacity) {}

DeviceLease::~DeviceLease() {
  TurnLeave();
  Release();
  munmap(shared_, sizeof(SharedLease));
  if (lock_fd_ >= 0) close(lock_fd_);  // drops our slot lock: we are gone
}

LeaseStatus DeviceLease::Identity(Owner* me) {
  std::lock_guard<std::mutex> local(local_mu_);
  if (identity_pid_ != getpid()) {
    LeaseStatus status = ClaimSlotLocked();
    if (!status.ok()) return status;
  }
  *me = me_;
  return LeaseStatus::Ok();
}

// A slot is ours while we hold an open-file-description lock on its byte. The kernel drops
// the lock when the process dies, so a peer in any PID namespace can tell we are gone.
LeaseStatus DeviceLease::ClaimSlotLocked() {
  if (lock_fd_ < 0) {
    return LeaseStatus::Error(LeaseCode::kInternal,
                              "lease " + name_ + " could not be reopened after fork()");
  }
  // Under the internal mutex, so that a slot's lock byte and its record change together for
  // anyone who reads both under it (Inspect).
  Locked locked(this);
  LeaseStatus status = locked.Lock(MonoNs() + kReleaseLockBoundNs);
  if (!status.ok()) return status;
  int slot = -1;
  for (int i = 0; i < kMaxProcesses && slot < 0; ++i) {
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = kSlotLockBase + i;
    fl.l_len = 1;
    if (fcntl(lock_fd_, F_OFD_SETLK, &fl) == 0) {
      slot = i;
    } else if (errno != EAGAIN && errno != EACCES) {
      return Internal("locking a slot of " + name_);
    }
  }
  if (slot < 0) {
    return LeaseStatus::Error(LeaseCode::kResourceExhausted,
                              "lease " + name_ + " is open in " + std::to_string(kMaxProcesses) +
                                  " processes already, the most one device supports");
  }
  const Owner me{RandomNonce(), slot, static_cast<int32_t>(getpid()), PidNamespace()};
  Slot& record = shared_->slots[slot];
  record.nonce = me.nonce;
  record.pid = me.pid;
  record.pid_ns = me.pid_ns;
  WriteJob(record.job, job_.empty() ? DefaultJob() : job_);
  locked.Unlock();
  me_ = me;
  my_nonce_.store(me.nonce);
  identity_pid_ = getpid();
  return LeaseStatus::Ok();
}

void DeviceLease::ForgetIdentityAfterForkLocked() {
  // Reopen the segment as a new open file description; dup3 drops our reference to the
  // parent's (and with it any claim on the parent's slot lock).
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", lock_fd_);
  const int fresh = open(path, O_RDWR | O_CLOEXEC);
  if (fresh >= 0) {
    dup3(fresh, lock_fd_, O_CLOEXEC);
    close(fresh);
    HoldPresence(lock_fd_);  // the new description has none; best effort, the slot follows
  } else {
    close(lock_fd_);
    lock_fd_ = -1;
  }
  identity_pid_ = 0;
  me_ = Owner{};
  stats_.held = false;
  // my_nonce_ keeps the parent's nonce until we claim our own: the parent then counts as
  // alive to us, never as a dead holder to reclaim from.
}

bool DeviceLease::Alive(const Owner& o) const {
  if (o.empty()) return false;
  if (o.nonce == my_nonce_.load()) return true;
  return OwnerLive(lock_fd_, shared_, o);
}

LeaseStatus DeviceLease::Register() {
  Owner me;
  return Identity(&me);
}

// A process is one job: a lease opened with the default label takes the first explicit one
// (rewriting its slot's label), and a second, different explicit label is an error.
LeaseStatus DeviceLease::AdoptJob(const std::string& job) {
  if (job.empty()) return LeaseStatus::Ok();
  std::lock_guard<std::mutex> local(local_mu_);
  if (job_ == job) return LeaseStatus::Ok();
  if (!job_.empty()) {
    return LeaseStatus::Error(
        LeaseCode::kInvalidArgument,
        "crossover lease " + path_ + " is open in this process as job '" + job_ + "', not '" +
            job + "': a process belongs to one job, so give every lease it opens one label");
  }
  job_ = job;
  if (identity_pid_ != getpid()) return LeaseStatus::Ok();  // the next claim writes it
  Locked locked(this);
  const LeaseStatus status = locked.Lock(MonoNs() + kReleaseLockBoundNs);
  if (!status.ok()) return status;
  Slot& record = shared_->slots[me_.slot];
  if (record.nonce == me_.nonce) WriteJob(record.job, job_);
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::SegmentPath(const std::string& dir, const std::string& group,
                                     const std::string& device_key, std::string* path) {
  LeaseStatus status = ValidateName(group, device_key);
  SegmentFile file;
  if (status.ok()) status = ResolveSegmentFile(dir, SegmentName(group, device_key), false, &file);
  if (status.ok()) *path = file.path;
  return status;
}

// Reads the segment like a member would, minus everything that makes one: a fresh open file
// description (no presence or slot lock, so it counts for nobody), no O_CREAT, no repair.
LeaseStatus DeviceLease::Inspect(const std::string& path, double bound_s, LeaseSnapshot* out) {
  if (!(std::isfinite(bound_s) && bound_s > 0 && bound_s <= kMaxInspectBoundS)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease inspection bound must be in (0, " +
                                  std::to_string(static_cast<int>(kMaxInspectBoundS)) + "] s");
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return LeaseStatus::Error(errno == ENOENT ? LeaseCode::kInvalidArgument
                                              : LeaseCode::kPermissionDenied,
                              Errno("crossover lease: cannot inspect " + path));
  }
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) {
    close(*f);
    delete f;
  });
  struct stat st;
  if (fstat(fd, &st) != 0) return Internal("fstat " + path);
  if (!S_ISREG(st.st_mode) || st.st_size != static_cast<off_t>(sizeof(SharedLease))) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "lease segment " + path + " has another layout (" +
                                  LayoutMismatch(fd, st.st_size) + ") or is being created");
  }
  void* p = mmap(nullptr, sizeof(SharedLease), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Internal("mmap " + path);
  std::unique_ptr<void, void (*)(void*)> unmapper(p, [](void* q) { munmap(q, sizeof(SharedLease)); });
  auto* s = static_cast<SharedLease*>(p);
  if (!IsOurLayout(s)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "lease segment " + path + " has another layout (" +
                                  LayoutMismatch(fd, st.st_size) + ") or is being created");
  }
  const timespec abs = ToTimespec(MonoNs() + static_cast<int64_t>(bound_s * 1e9));
  const int rc = pthread_mutex_clocklock(&s->mu, CLOCK_MONOTONIC, &abs);
  if (rc == ETIMEDOUT) {
    return LeaseStatus::Error(
        LeaseCode::kDeadlineExceeded,
        "crossover lease " + path + ": its internal lock is held by pid " +
            std::to_string(s->locker_pid.load()) + ", which has not let go within " +
            std::to_string(bound_s) + " s (a stopped or wedged process?)");
  }
  if (rc != 0 && rc != EOWNERDEAD) {
    return LeaseStatus::Error(LeaseCode::kInternal,
                              "lease " + path + " is unusable (" + strerror(rc) + ")");
  }
  // A dead locker: the next member's lock repairs what it left (DropDead runs on every lock).
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&s->mu);
  *out = TakeSnapshot(fd, s);
  pthread_mutex_unlock(&s->mu);
  return LeaseStatus::Ok();
}

// ----- acquire and release ----------------------------------------------------------------

LeaseStatus DeviceLease::Acquire(double timeout_s, int64_t tag, int32_t priority) {
  LeaseStatus status = ValidateTimeout(timeout_s);
  if (status.ok()) status = ValidatePriority(priority);
  if (!status.ok()) return status;
  Owner me;
  status = Identity(&me);
  if (!status.ok()) return status;
  const int64_t start_mono = MonoNs();
  const int64_t request_wall = WallNs();
  const int64_t deadline = start_mono + static_cast<int64_t>(timeout_s * 1e9);
  SharedLease* s = shared_;
  Locked locked(this);
  status = locked.Lock(deadline);
  if (!status.ok()) return status;
  bool contended = false, reentrant = false;
  status = WaitForTurn(&locked, me, priority, deadline, timeout_s, &contended, &reentrant);
  if (!status.ok() || reentrant) return status;
  const bool handoff = !s->last_holder.empty() && !(s->last_holder == me);
  // WaitForTurn let us in, so no reservation holds against us: ours is used up, and one
  // left for a class no higher than ours has expired or is overtaken by this hold.
  s->reserved_for = Owner{};
  s->holder = me;
  s->last_holder = me;
  s->held_since_wall_ns = WallNs();
  if (handoff) ++s->total_handoffs;
  const int64_t acquired_wall = s->held_since_wall_ns;
  locked.Unlock();
  RecordAcquired(request_wall, acquired_wall, start_mono, handoff, contended, tag, priority);
  return LeaseStatus::Ok();
}

// Returns with the mutex held once this thread may take the lease: it is free and nobody is
// ahead in the queue. Each waiting thread has its own ticket and removes only that ticket.
// True while another live process's reservation keeps waiters of this class out.
bool DeviceLease::ReservedAgainst(const Owner& me, int32_t priority) const {
  const SharedLease* s = shared_;
  return !s->reserved_for.empty() && !(s->reserved_for == me) &&
         priority < s->reserved_priority && MonoNs() < s->reserved_until_mono_ns &&
         Alive(s->reserved_for);
}

LeaseStatus DeviceLease::WaitForTurn(Locked* locked, const Owner& me, int32_t priority,
                                     int64_t deadline, double timeout_s, bool* contended,
                                     bool* reentrant) {
  SharedLease* s = shared_;
  uint64_t ticket = 0;
  for (;;) {
    if (s->holder == me) {  // held already, by this or another thread of this process
      if (ticket) s->queue.Remove(ticket);
      *reentrant = true;
      return LeaseStatus::Ok();
    }
    const int position = ticket ? s->queue.Index(ticket) : -1;
    const bool first = ticket ? position == 0 : s->queue.size == 0;
    if (s->holder.empty() && first && !ReservedAgainst(me, priority)) {
      if (ticket) s->queue.Remove(ticket);
      return LeaseStatus::Ok();
    }
    const int64_t now = MonoNs();
    if (ticket && position < 0 && now >= deadline) return TimeoutError(timeout_s, me);  // expired
    if (ticket == 0 || position < 0) {  // queue up (again, if our entry was dropped)
      if (ticket) locked->Warn("a waiter's queue entry of " + name_ + " vanished; requeueing");
      ticket = ++s->next_ticket;
      if (!s->queue.Push(Waiter{me, ticket, WallNs(), priority, deadline})) {
        return LeaseStatus::Error(
            LeaseCode::kResourceExhausted,
            "crossover lease " + name_ + " already has " + std::to_string(kMaxWaiters) +
                " waiting threads, the most it queues; too many jobs or threads share "
                "one device");
      }
      *contended = true;
      continue;
    }
    if (now >= deadline) {
      s->queue.Remove(ticket);
      return TimeoutError(timeout_s, me);
    }
    const uint32_t seq = s->wake_seq.load();
    locked->Unlock();
    const timespec wait = ToTimespec(std::min(kPollNs, deadline - now));
    Futex(&s->wake_seq, FUTEX_WAIT, seq, &wait);
    // On failure our ticket stays, but it carries our deadline: a timed-out Lock has waited
    // past it, so the ticket has expired already (and any other failure leaves a lease that
    // is unusable anyway, the ticket expiring at the deadline). The next process to take the
    // lock drops it (DropDead), whoever that is, without waiting for this thread to return,
    // so no process-local record of it is needed.
    LeaseStatus status = locked->Lock(deadline);
    if (!status.ok()) return status;
  }
}

LeaseStatus DeviceLease::TimeoutError(double timeout_s, const Owner& me) const {
  const SharedLease* s = shared_;
  std::ostringstream msg;
  msg << "crossover lease " << name_ << ": acquire timed out after " << timeout_s << " s; ";
  if (!s->holder.empty()) {
    msg << "held by pid " << s->holder.pid;
    if (s->holder.pid_ns != me.pid_ns) msg << " (of another PID namespace)";
    msg << " for " << (WallNs() - s->held_since_wall_ns) / 1e9 << " s";
  } else {
    msg << "queued behind " << s->queue.size << " other waiting thread(s)";
  }
  msg << " (a peer job stuck or holding the device too long?)";
  return LeaseStatus::Error(LeaseCode::kDeadlineExceeded, msg.str());
}

LeaseStatus DeviceLease::Release(double reserve_s) {
  LeaseStatus status = ValidateReserve(reserve_s);
  if (!status.ok()) return status;
  Owner me;
  status = Identity(&me);
  if (!status.ok()) return status;
  int32_t priority;
  {
    std::lock_guard<std::mutex> local(local_mu_);  // never inside the shared mutex: lock order
    priority = held_priority_;
  }
  SharedLease* s = shared_;
  Locked locked(this);
  status = locked.Lock(MonoNs() + kReleaseLockBoundNs);
  if (!status.ok()) return status;
  if (!(s->holder == me)) return LeaseStatus::Ok();
  // Stamped while still holding: the next holder's acquired_ns is taken after ours under the
  // same mutex, so the two processes' timelines never seem to overlap.
  const int64_t released_wall = WallNs(), released_mono = MonoNs();
  if (reserve_s > 0) {
    s->reserved_for = me;
    s->reserved_priority = priority;
    s->reserved_until_mono_ns = released_mono + static_cast<int64_t>(reserve_s * 1e9);
  }
  s->holder = Owner{};
  s->wake_seq.fetch_add(1);
  const bool wake = s->queue.size > 0;
  locked.Unlock();
  if (wake) Futex(&s->wake_seq, FUTEX_WAKE, INT_MAX, nullptr);
  RecordReleased(released_wall, released_mono);
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::ReleaseAfter(const std::function<LeaseStatus()>& drain,
                                      double reserve_s) {
  const LeaseStatus drained = drain();
  const LeaseStatus released = Release(reserve_s);
  return drained.ok() ? released : drained;
}

// ----- link turns -------------------------------------------------------------------------

LeaseStatus DeviceLease::ValidateTurn(int64_t position, int64_t jobs) {
  if (jobs >= 1 && jobs <= kMaxTurnJobs && position >= 0 && position < jobs) {
    return LeaseStatus::Ok();
  }
  return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                            "crossover link turn: jobs must be in [1, " +
                                std::to_string(kMaxTurnJobs) + "] and position in [0, jobs), got "
                                "position " + std::to_string(position) + " of " +
                                std::to_string(jobs) + " jobs");
}

LeaseStatus DeviceLease::TurnJoin(int32_t position, int32_t jobs, int64_t* next_index) {
  LeaseStatus status = ValidateTurn(position, jobs);
  Owner me;
  if (status.ok()) status = Identity(&me);
  if (!status.ok()) return status;
  SharedLease* s = shared_;
  Locked locked(this);
  status = locked.Lock(MonoNs() + kReleaseLockBoundNs);
  if (!status.ok()) return status;
  int64_t next = kTurnUnconstrained;
  for (int i = 0; i < kMaxTurnJobs; ++i) {
    const TurnEntry& e = s->turns[i];
    if (e.state == kTurnFree || e.who == me) continue;
    if (e.jobs != jobs) {
      return LeaseStatus::Error(
          LeaseCode::kInvalidArgument,
          "crossover link turn of " + name_ + ": pid " + std::to_string(e.who.pid) +
              " joined as one of " + std::to_string(e.jobs) + " jobs, this process as one of " +
              std::to_string(jobs) + "; every job of the group must name the same count");
    }
    if (i == position) {
      return LeaseStatus::Error(
          LeaseCode::kInvalidArgument,
          "crossover link turn position " + std::to_string(position) + " of " + name_ +
              " is taken by pid " + std::to_string(e.who.pid) +
              "; give each job of the group its own position");
    }
    // The latest index whose turn at `position` comes before e's next turn.
    if (e.state == kTurnActive) next = std::min(next, e.offset + e.done - (position > i));
  }
  for (TurnEntry& e : s->turns) {
    if (e.who == me) e = TurnEntry{};
  }
  s->turns[position] = TurnEntry{me, kTurnJoining, jobs, 0, 0};
  locked.Unlock();
  std::lock_guard<std::mutex> local(local_mu_);
  turn_position_ = position;
  *next_index = next;
  return LeaseStatus::Ok();
}

// Finds this process's entry (with the shared mutex held); an error if it never joined or a
// peer dropped it as dead (which only happens if our slot lock was lost).
LeaseStatus DeviceLease::MyTurnEntry(Locked* locked, int32_t* position) {
  Owner me;
  LeaseStatus status = Identity(&me);
  if (!status.ok()) return status;
  {
    std::lock_guard<std::mutex> local(local_mu_);
    *position = turn_position_;
  }
  status = locked->Lock(MonoNs() + kReleaseLockBoundNs);
  if (!status.ok()) return status;
  if (*position < 0 || !(shared_->turns[*position].who == me)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover link turn of " + name_ + ": this process has not "
                              "joined (TurnJoin before TurnStart, TurnWait or TurnDone)");
  }
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::TurnStart(int64_t offset) {
  if (offset <= -kTurnUnconstrained || offset >= kTurnUnconstrained) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover link turn offset must be within +-2^62, got " +
                                  std::to_string(offset));
  }
  Locked locked(this);
  int32_t position;
  const LeaseStatus status = MyTurnEntry(&locked, &position);
  if (!status.ok()) return status;
  TurnEntry& e = shared_->turns[position];
  e.state = kTurnActive;
  e.offset = offset;
  e.done = 0;
  WakeAll(shared_);
  return LeaseStatus::Ok();
}

// The position of a live job whose next turn comes before `position`'s next turn, or -1.
// Turn (g, p) comes before (g', p') if g < g', or g == g' and p < p'.
int DeviceLease::TurnBlocker(int32_t position) const {
  const TurnEntry& mine = shared_->turns[position];
  const int64_t g = mine.offset + mine.done;
  for (int i = 0; i < kMaxTurnJobs; ++i) {
    const TurnEntry& e = shared_->turns[i];
    if (i == position || e.state != kTurnActive) continue;
    const int64_t their = e.offset + e.done;
    if (their < g || (their == g && i < position)) return i;
  }
  return -1;
}

LeaseStatus DeviceLease::TurnWait(double wait_s, bool* skipped) {
  *skipped = false;
  LeaseStatus status = ValidateTimeout(wait_s);
  if (!status.ok()) return status;
  const int64_t start = MonoNs(), request_wall = WallNs();
  const int64_t deadline = start + static_cast<int64_t>(wait_s * 1e9);
  Locked locked(this);
  int32_t position;
  status = MyTurnEntry(&locked, &position);
  if (!status.ok()) return status;
  if (shared_->turns[position].state != kTurnActive) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover link turn of " + name_ + ": TurnStart first");
  }
  bool waited = false;
  while (TurnBlocker(position) >= 0) {
    const int64_t now = MonoNs();
    if (now >= deadline) {
      *skipped = true;
      break;
    }
    waited = true;
    const uint32_t seq = shared_->wake_seq.load();
    locked.Unlock();
    const timespec wait = ToTimespec(std::min(kPollNs, deadline - now));
    Futex(&shared_->wake_seq, FUTEX_WAIT, seq, &wait);
    status = locked.Lock(MonoNs() + kReleaseLockBoundNs);  // also drops peers that died
    if (!status.ok()) return status;
  }
  // Stamped under the mutex, like the lease's release: the predecessor's done_ns was taken
  // before its count went up, so the two turns never seem to overlap in the timelines.
  const int64_t start_wall = WallNs();
  locked.Unlock();
  const double seconds = (MonoNs() - start) / 1e9;
  std::lock_guard<std::mutex> local(local_mu_);
  turn_stats_.turns++;
  turn_stats_.waited += waited;
  turn_stats_.skipped += *skipped;
  turn_stats_.wait_s += seconds;
  turn_stats_.max_wait_s = std::max(turn_stats_.max_wait_s, seconds);
  turn_events_.Push(TurnEvent{request_wall, start_wall, 0, *skipped ? 1 : 0});
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::TurnDone() {
  Locked locked(this);
  int32_t position;
  const LeaseStatus status = MyTurnEntry(&locked, &position);
  if (!status.ok()) return status;
  const int64_t done_wall = WallNs();
  shared_->turns[position].done++;
  WakeAll(shared_);
  locked.Unlock();
  std::lock_guard<std::mutex> local(local_mu_);
  if (TurnEvent* last = turn_events_.Last()) last->done_ns = done_wall;
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::TurnLeave() {
  int32_t position;
  {
    std::lock_guard<std::mutex> local(local_mu_);
    position = turn_position_;
    turn_position_ = -1;
  }
  if (position < 0) return LeaseStatus::Ok();
  Owner me;
  LeaseStatus status = Identity(&me);
  if (!status.ok()) return status;
  Locked locked(this);
  status = locked.Lock(MonoNs() + kReleaseLockBoundNs);
  if (!status.ok()) return status;
  if (shared_->turns[position].who == me) shared_->turns[position] = TurnEntry{};
  WakeAll(shared_);
  return LeaseStatus::Ok();
}

TurnStats DeviceLease::GetTurnStats() const {
  std::lock_guard<std::mutex> local(local_mu_);
  return turn_stats_;
}

std::vector<TurnEvent> DeviceLease::TurnTimeline() const {
  std::lock_guard<std::mutex> local(local_mu_);
  return turn_events_.Ordered();
}

// ----- this process's statistics and timeline ---------------------------------------------

void DeviceLease::RecordAcquired(int64_t request_wall, int64_t acquired_wall, int64_t start_mono,
                                 bool handoff, bool contended, int64_t tag, int32_t priority) {
  const int64_t acquired_mono = MonoNs();
  std::lock_guard<std::mutex> local(local_mu_);
  const double waited = (acquired_mono - start_mono) / 1e9;
  stats_.acquires++;
  stats_.handoffs += handoff;
  stats_.contended += contended;
  stats_.wait_s += waited;
  stats_.max_wait_s = std::max(stats_.max_wait_s, waited);
  stats_.held = true;
  held_since_mono_ns_ = acquired_mono;
  held_priority_ = priority;
  events_.Push(LeaseEvent{request_wall, acquired_wall, 0, tag});
}

void DeviceLease::RecordReleased(int64_t released_wall, int64_t released_mono) {
  std::lock_guard<std::mutex> local(local_mu_);
  const double held = (released_mono - held_since_mono_ns_) / 1e9;
  stats_.hold_s += held;
  stats_.max_hold_s = std::max(stats_.max_hold_s, held);
  stats_.held = false;
  if (LeaseEvent* last = events_.Last()) last->released_ns = released_wall;
}

LeaseStats DeviceLease::Stats() const {
  std::lock_guard<std::mutex> local(local_mu_);
  LeaseStats stats = stats_;
  stats.recoveries = recoveries_.load();
  return stats;
}

std::vector<LeaseEvent> DeviceLease::Timeline() const {
  std::lock_guard<std::mutex> local(local_mu_);
  return events_.Ordered();
}

// ----- test hooks -------------------------------------------------------------------------

void LeaseTestHooks::LockInternal(DeviceLease& lease) {
  pthread_mutex_lock(&lease.shared_->mu);
  lease.shared_->locker_pid.store(getpid());
}
void LeaseTestHooks::SetInitDelayMs(int ms) { g_init_delay_ms.store(ms); }
WaiterQueue& LeaseTestHooks::Queue(DeviceLease& lease) { return lease.shared_->queue; }

}  // namespace crossover
