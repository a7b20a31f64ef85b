// The segment file: where it lives, and opening, creating, checking and replacing it (the
// "one segment per name", layout, file system and ownership guarantees of lease_segment.h).
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "lease_segment.h"

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
constexpr int64_t kOpenBoundNs = 30 * kNsPerS;  // wait for a creator/repairer to finish
constexpr int kOpenAttempts = 100;              // bound on replace-and-retry rounds

std::atomic<int> g_init_delay_ms{0};

}  // namespace

void SetSegmentInitDelayMs(int ms) { g_init_delay_ms.store(ms); }

std::string SegmentName(const std::string& group, const std::string& device_key) {
  return "/crossover." + group + "." + device_key;
}

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

std::string Octal(unsigned value, const char* format = "%04o") {
  char text[16];
  snprintf(text, sizeof(text), format, value);
  return text;
}

}  // namespace

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
namespace {

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

bool IsOurLayout(const SharedLease* s) {
  return s->header.magic.load(std::memory_order_acquire) == kMagic &&
         s->header.layout_version == kLayoutVersion &&
         s->header.struct_size == sizeof(SharedLease);
}

}  // namespace

// Everything that decides what the segment is happens under flock() on its inode, so
// concurrent starters agree on one segment: a creator holds the lock until the segment is
// initialised, and only the holder of the lock on the inode the name currently refers to may
// unlink it.
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

LeaseStatus ReadSegment(const std::string& path, double bound_s,
                        const std::function<void(int fd, const SharedLease& s)>& read) {
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
  read(fd, *s);
  pthread_mutex_unlock(&s->mu);
  return LeaseStatus::Ok();
}

}  // namespace crossover
