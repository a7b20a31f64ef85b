// The segment file: where it lives, and opening, creating, checking and replacing it (the
// "one segment per name", layout, file system and ownership guarantees of lease_segment.h).
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "core/lease_dir.h"
#include "core/lease_segment.h"
#include "core/segment_fault.h"

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
constexpr uint32_t kLayoutVersion = 1008;  // a test build with another layout (ops/Makefile)
#else
// 6: slots carry their member's job label; 7: queue deadlines and reservations on the host's
// CLOCK_MONOTONIC (HostMonoNs), whatever a member's time namespace; 8: each slot's usage
// counters (LeaseUsage) and the overlapping-hold check, for observers (the exporter).
constexpr uint32_t kLayoutVersion = 8;
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

LeaseStatus ResolveSegmentFile(const std::string& dir_in, const std::string& name,
                               bool shared_group, SegmentFile* out) {
  const std::string dir = dir_in.empty() ? kDefaultLeaseDir : dir_in;
  std::shared_ptr<const TrustedDir> opened;
  const LeaseStatus trusted =
      OpenTrustedDir(dir, shared_group ? DirUse::kGroup : DirUse::kPrivate, &opened);
  if (!trusted.ok()) return trusted;
  struct statfs fs;
  if (fstatfs(opened->fd(), &fs) != 0) return Internal("statfs " + dir);
  if (LocalFileSystem(fs.f_type) == nullptr) {
    return LeaseStatus::Error(
        LeaseCode::kInvalidArgument,
        "crossover lease directory " + dir + " is on " + FileSystemText(fs.f_type) + ", not a "
            "file system known to be local (tmpfs, ext4, xfs, btrfs, zfs, f2fs, overlayfs): "
            "the lease's futex, shared mapping and file locks must be coherent among the "
            "host's processes, and on a network or cluster file system jobs that share this "
            "directory from two hosts would compute at once without an error. Use a directory "
            "on a local file system of this host that every job of the group on it sees (a "
            "tmpfs such as /dev/shm, or a local disk)");
  }
  out->base = name.substr(name.find_first_not_of('/'));
  out->path = (opened->path() == "/" ? "" : opened->path()) + "/" + out->base;
  out->shared_group = shared_group;
  out->dir_gid = opened->st().st_gid;
  out->dir = std::move(opened);
  return LeaseStatus::Ok();
}

// Opens the segment file, creating it if missing. In group mode the name appears only with
// its final group and mode (made unnamed, then linked), so a peer of another uid never meets
namespace {

// a file it cannot open or must refuse.
int OpenOrCreate(const SegmentFile& file) {
  // O_NONBLOCK: a file held under another process's write lease (F_SETLEASE) fails the open
  // at once instead of blocking it for the lease-break time.
  constexpr int kFlags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  const int dir = file.dir->fd();
  if (!file.shared_group) return openat(dir, file.base.c_str(), kFlags | O_CREAT, 0600);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int fd = openat(dir, file.base.c_str(), kFlags);
    if (fd >= 0 || errno != ENOENT) return fd;
    const int unnamed = openat(dir, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (unnamed < 0) return -1;
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", unnamed);
    const bool made = fchown(unnamed, static_cast<uid_t>(-1), file.dir_gid) == 0 &&
                      fchmod(unnamed, 0660) == 0 &&
                      linkat(AT_FDCWD, proc, dir, file.base.c_str(), AT_SYMLINK_FOLLOW) == 0;
    const int saved = errno;
    close(unnamed);
    errno = saved;
    if (!made && errno != EEXIST) return -1;  // EEXIST: a peer linked its own first
  }
  errno = ENOENT;
  return -1;
}

LeaseStatus OpenError(const SegmentFile& file) {
  const int error = errno;
  std::string msg = Errno("crossover lease: cannot open segment " + file.path);
  if (error != EACCES && error != EPERM) return LeaseStatus::Error(LeaseCode::kInternal, msg);
  struct stat st;
  const bool exists = fstatat(file.dir->fd(), file.base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  if (!exists && errno == ENOENT) {  // nothing there: the directory refused the creation
    return LeaseStatus::Error(
        LeaseCode::kPermissionDenied,
        "crossover lease: cannot create segment " + file.path + ": the lease directory " +
            file.dir->path() + " is not writable by this process (uid " + std::to_string(geteuid()) +
            "). Make it writable by every job of the group on this host (docs/deploying.md: "
            "`install -d -m 1777 DIR` as root, `install -d -m 0700 DIR` as the jobs' user, or "
            "group mode in `install -d -m 3770 -g GROUP DIR`)");
  }
  errno = error;
  if (file.shared_group) {
    msg += "; in group mode (shared_group) every job's user must be a member of the group of "
           "the lease directory " + file.dir->path() + " (gid " + std::to_string(file.dir_gid) +
           "), which must let that group in (e.g. mode 3770)";
  } else {
    msg += "; it belongs to another user" +
           (exists ? " (" + DescribeFile(file.path, st) + ")" : std::string()) +
           ": jobs of several users share a lease in group mode (shared_group), in a "
           "directory of a group they all belong to";
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

namespace {

// Gives a fresh (empty) segment file its blocks before it is mapped: a sparse file on a full
// file system would kill the first process that writes to the mapping with SIGBUS, and stay
// behind to kill the next. On failure the fresh file, whose flock we hold, is removed.
LeaseStatus AllocateFresh(int fd, const SegmentFile& file) {
  const int rc = posix_fallocate(fd, 0, sizeof(SharedLease));
  if (rc == 0) return LeaseStatus::Ok();
  unlinkat(file.dir->fd(), file.base.c_str(), 0);  // ours: fresh, under our flock, named
  struct statvfs vfs;
  std::string free_text = "unknown";
  if (fstatvfs(file.dir->fd(), &vfs) == 0) {
    free_text = std::to_string(static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize) +
                " bytes free";
  }
  return LeaseStatus::Error(
      rc == ENOSPC || rc == EDQUOT ? LeaseCode::kResourceExhausted : LeaseCode::kInternal,
      "crossover lease: cannot allocate " + std::to_string(sizeof(SharedLease)) + " bytes for "
          "segment " + file.path + ": " + strerror(rc) + " (lease directory " + file.dir->path() +
          ": " + free_text + "). Free space there, or point CROSSOVER_LEASE_DIR at a "
          "directory with room (Docker's default /dev/shm is 64 MB: --shm-size)");
}

}  // namespace

// True if the name still refers to the inode we hold open (it was not replaced meanwhile).
bool NameRefersTo(const std::string& path, const struct stat& st) {
  struct stat named;
  return lstat(path.c_str(), &named) == 0 && named.st_ino == st.st_ino &&
         named.st_dev == st.st_dev;
}

bool NameRefersTo(int dir_fd, const std::string& base, const struct stat& st) {
  struct stat named;
  return fstatat(dir_fd, base.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
         named.st_ino == st.st_ino && named.st_dev == st.st_dev;
}

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
    // The trust rule before the flock: a file planted by someone else, and held under their
    // flock, must be refused at once, not waited for.
    struct stat st;
    if (fstat(fd, &st) != 0) return fail(Internal("fstat " + path));
    LeaseStatus status =
        CheckSegmentTrust(path, st, file.dir_gid, file.shared_group, /*observer=*/false);
    if (!status.ok()) return fail(status);
    status = FlockBounded(fd, path, deadline);
    if (!status.ok()) return fail(status);
    if (fstat(fd, &st) != 0) return fail(Internal("fstat " + path));
    if (!NameRefersTo(file.dir->fd(), file.base, st)) {  // replaced while we waited for it
      close(fd);
      continue;
    }
    const bool fresh = st.st_size == 0;
    if (fresh) {
      status = AllocateFresh(fd, file);
      if (!status.ok()) return fail(status);
    }
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
        WatchSegmentMapping(s, sizeof(SharedLease), path);  // a truncation names the file
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
    if (unlinkat(file.dir->fd(), file.base.c_str(), 0) != 0 && errno != ENOENT) {
      return fail(Internal("removing stale segment " + path));
    }
    close(fd);
  }
  return LeaseStatus::Error(LeaseCode::kInternal, "could not open lease segment " + path +
                                                      " after " +
                                                      std::to_string(kOpenAttempts) + " tries");
}

namespace {

// The bytes of the state an observer reads (everything after the internal mutex's words), so
// that two copies can be compared without the mutex and its futex word, which change on
// every take.
std::pair<size_t, size_t> ObservedBytes(const SharedLease& s) {
  const char* base = reinterpret_cast<const char*>(&s);
  const size_t begin = reinterpret_cast<const char*>(&s.holder) - base;
  return {begin, sizeof(SharedLease) - begin};
}

LeaseStatus PreadAll(int fd, unsigned char* buf, const std::string& path) {
  size_t done = 0;
  while (done < sizeof(SharedLease)) {
    const ssize_t n = pread(fd, buf + done, sizeof(SharedLease) - done, done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                                "lease segment " + path + " became shorter while read (" +
                                    (n < 0 ? std::string(strerror(errno)) : "truncated") + ")");
    }
    done += n;
  }
  return LeaseStatus::Ok();
}

}  // namespace

LeaseStatus ReadSegment(const std::string& path, double bound_s,
                        const std::function<void(int fd, const SharedLease& s)>& read) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::shared_ptr<const TrustedDir> opened;
  LeaseStatus status = OpenTrustedDir(dir, DirUse::kObserve, &opened);
  if (!status.ok()) return status;
  const bool group_mode = opened->group_mode();
  const struct stat& dir_st = opened->st();
  struct stat named, st;
  if (fstatat(opened->fd(), base.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0) {
    return LeaseStatus::Error(errno == ENOENT ? LeaseCode::kInvalidArgument
                                              : LeaseCode::kPermissionDenied,
                              Errno("crossover lease: cannot inspect " + path));
  }
  // Before opening: a FIFO or device planted under a lease name is never opened, and a file
  // that fails the trust rule is refused without touching it.
  status = CheckSegmentTrust(path, named, dir_st.st_gid, group_mode, /*observer=*/true);
  if (!status.ok()) return status;
  // Read-only (an observer needs no write access and changes nothing), non-blocking (a file
  // held under a write lease fails at once instead of blocking for the lease-break time).
  const int fd = openat(opened->fd(), base.c_str(),
                        O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const bool leased = errno == EWOULDBLOCK;
    return LeaseStatus::Error(
        LeaseCode::kPermissionDenied,
        Errno("crossover lease: cannot inspect " + path) +
            (leased ? " (another process holds a file lease on it)" : ""));
  }
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) {
    close(*f);
    delete f;
  });
  if (fstat(fd, &st) != 0) return Internal("fstat " + path);
  if (st.st_ino != named.st_ino || st.st_dev != named.st_dev) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "lease segment " + path + " was replaced while read");
  }
  status = CheckSegmentTrust(path, st, dir_st.st_gid, group_mode, /*observer=*/true);
  if (!status.ok()) return status;
  if (st.st_size != static_cast<off_t>(sizeof(SharedLease))) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "lease segment " + path + " has another layout (" +
                                  LayoutMismatch(fd, st.st_size) + ") or is being created");
  }
  // Copied, never mapped (a file truncated under a mapping kills its reader with SIGBUS), and
  // its mutex never taken (a planted or stopped locker would stall the reader): two copies are
  // read until they agree on the observed state with no change in progress (an even
  // change_seq, read after the first copy and again after the second: nothing changed while
  // the second was read), for at most bound_s. Past it, the last copy is used if no change
  // was in progress (only unbracketed state, such as the queue, may then be off), else the
  // read fails: a member stopped inside a change would otherwise show it half done.
  std::unique_ptr<unsigned char[]> first(new unsigned char[sizeof(SharedLease)]);
  std::unique_ptr<unsigned char[]> second(new unsigned char[sizeof(SharedLease)]);
  const auto* copy = reinterpret_cast<const SharedLease*>(second.get());
  const int64_t deadline = MonoNs() + static_cast<int64_t>(bound_s * 1e9);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    status = PreadAll(fd, first.get(), path);
    if (status.ok()) status = PreadAll(fd, second.get(), path);
    if (!status.ok()) return status;
    if (!IsOurLayout(copy)) {
      return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                                "lease segment " + path + " has another layout (" +
                                    LayoutMismatch(fd, st.st_size) + ") or is being created");
    }
    const auto [begin, length] = ObservedBytes(*copy);
    const bool settled = copy->change_seq.load() % 2 == 0 &&
                         reinterpret_cast<const SharedLease*>(first.get())->change_seq.load() ==
                             copy->change_seq.load();
    if (settled && memcmp(first.get() + begin, second.get() + begin, length) == 0) break;
    if (MonoNs() > deadline || attempt == 999) {
      if (settled) break;
      return LeaseStatus::Error(
          LeaseCode::kDeadlineExceeded,
          "lease segment " + path + ": a member (pid " + std::to_string(copy->locker_pid.load()) +
              " took its lock last) stayed in the middle of an update for " +
              std::to_string(bound_s) + " s (stopped, e.g. Ctrl-Z?); not read");
    }
  }
  read(fd, *copy);
  return LeaseStatus::Ok();
}

}  // namespace crossover
