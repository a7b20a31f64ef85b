// Who a process is on a lease segment, and whether it is still alive: a member's slot, the
// open-file-description locks that prove it lives, and its job label. Shared by the device
// lease and the link turn (both record who waits, holds or turns as an Owner).
//
// Liveness that holds across PID namespaces (containers with a shared /dev/shm): each process
// owns a slot whose byte it locks with an open-file-description lock on the segment. The kernel
// drops that lock when the process dies, whatever namespace either side is in, so "dead" is
// never guessed from a pid that may belong to another namespace.
#ifndef CROSSOVER_TF_OPS_CORE_LEASE_LIVENESS_H_
#define CROSSOVER_TF_OPS_CORE_LEASE_LIVENESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "core/lease_types.h"

namespace crossover {

// Who holds, waits or turns: a slot (whose lock byte proves liveness) plus a nonce that makes
// the identity unique even after the slot is reused. pid and pid namespace are for messages
// only.
struct Owner {
  uint64_t nonce = 0;  // 0: nobody
  int32_t slot = -1;
  int32_t pid = 0;
  uint64_t pid_ns = 0;
  bool operator==(const Owner& o) const { return nonce == o.nonce; }
  bool empty() const { return nonce == 0; }
};

// A member's record in the segment (its slot).
struct Slot {
  uint64_t nonce;  // identity of the process that claimed this slot last
  int32_t pid;
  uint64_t pid_ns;
  char job[kMaxJobLen + 1];  // the member's job label, NUL-terminated
};

constexpr off_t kSlotLockBase = 1 << 20;  // slot i's lock byte: kSlotLockBase + i
// Every process that uses the segment holds a read lock on this byte from before it lets
// other openers in (flock) until it closes the segment, so that it counts as live to an opener
// of another layout even before it has claimed a slot.
constexpr off_t kPresenceLockByte = kSlotLockBase - 1;

uint64_t PidNamespace();
// Fresh kernel randomness per call (never 0): a process's identity on a segment.
uint64_t RandomNonce();

// Marks this open file description as live on the segment (see kPresenceLockByte).
bool HoldPresence(int fd);
// Locks the byte of the first free slot through fd; *slot is -1 when all kMaxProcesses are
// taken. name is the lease's, for the error message.
LeaseStatus LockFreeSlot(int fd, const std::string& name, int* slot);
// True while some open file description holds the lock byte of slot (or when that cannot be
// told). fd must hold no slot lock itself, or its own slot reads as free.
bool SlotLocked(int fd, int32_t slot);
// o is live: its slot still carries its nonce (not reused since) and the slot's byte is locked.
bool OwnerLive(int fd, const Slot (&slots)[kMaxProcesses], const Owner& o);
// Who is live on a segment file of any layout (any lock on any byte of it); empty if nobody.
std::string LiveProcess(int fd);

// Job labels, as slots keep them.
bool JobChar(char c);  // [A-Za-z0-9_.:@-]
std::string DefaultJob();  // "<host>:<pid>"
void WriteJob(char (&slot_job)[kMaxJobLen + 1], const std::string& job);
std::string ReadJob(const char (&slot_job)[kMaxJobLen + 1]);

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_LEASE_LIVENESS_H_
