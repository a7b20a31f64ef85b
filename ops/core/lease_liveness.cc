// Slot locks, identities and job labels of lease members (see lease_liveness.h).
#include "core/lease_liveness.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/lease_internal.h"

namespace crossover {

uint64_t PidNamespace() {
  char buf[64] = {0};
  const ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);  // "pid:[4026531836]"
  if (n <= 0) return 0;
  const char* open = strchr(buf, '[');
  return open ? std::strtoull(open + 1, nullptr, 10) : 0;
}

namespace {

int64_t ReadTimeNamespaceOffsetNs() {
  FILE* f = fopen("/proc/self/timens_offsets", "re");
  if (f == nullptr) return 0;  // no time namespaces on this kernel
  char clock[32];
  long long seconds = 0, nanoseconds = 0;
  int64_t offset = 0;
  while (fscanf(f, "%31s %lld %lld", clock, &seconds, &nanoseconds) == 3) {
    if (strcmp(clock, "monotonic") == 0 || strcmp(clock, "1") == 0) {
      offset = static_cast<int64_t>(seconds) * kNsPerS + nanoseconds;
    }
  }
  fclose(f);
  return offset;
}

}  // namespace

int64_t TimeNamespaceOffsetNs() {
  static const int64_t offset = ReadTimeNamespaceOffsetNs();
  return offset;
}

// A seeded generator's state would be copied by fork(), and a parent and child could then
// draw the same identity: hence fresh kernel randomness per call.
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

namespace {
struct flock ByteLock(short type, off_t byte) {
  struct flock fl = {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  return fl;
}
}  // namespace

bool HoldPresence(int fd) {
  struct flock fl = ByteLock(F_RDLCK, kPresenceLockByte);
  return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

// A slot is ours while we hold an open-file-description lock on its byte. The kernel drops
// the lock when the process dies, so a peer in any PID namespace can tell we are gone.
LeaseStatus LockFreeSlot(int fd, const std::string& name, int* slot) {
  *slot = -1;
  for (int i = 0; i < kMaxProcesses && *slot < 0; ++i) {
    struct flock fl = ByteLock(F_WRLCK, kSlotLockBase + i);
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
      *slot = i;
    } else if (errno != EAGAIN && errno != EACCES) {
      return Internal("locking a slot of " + name);
    }
  }
  return LeaseStatus::Ok();
}

bool SlotLocked(int fd, int32_t slot) {
  struct flock fl = ByteLock(F_WRLCK, kSlotLockBase + slot);
  if (fd < 0 || fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}

bool OwnerLive(int fd, const Slot (&slots)[kMaxProcesses], const Owner& o) {
  if (o.empty() || o.slot < 0 || o.slot >= kMaxProcesses) return false;
  return slots[o.slot].nonce == o.nonce && SlotLocked(fd, o.slot);
}

// The layout's slot bytes may lie anywhere, so the whole file is tested: every build since
// slot locks (layout 2) locks a byte per process, and from layout 5 on also the presence byte.
// (Layout 1 judged liveness by pid and took no locks: its users cannot be seen.) The opener's
// fd is a fresh open file description with no locks of its own, so its own locks never count.
// Empty if nobody is (or the answer is unknown: then it says).
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

bool JobChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-' || c == '.' || c == ':' || c == '@';
}

// The host cut and its odd characters replaced, so that the label stays valid.
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

}  // namespace crossover
