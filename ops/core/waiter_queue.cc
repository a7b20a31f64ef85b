// The device lease's waiter queue (see waiter_queue.h).
#include "core/waiter_queue.h"

#include <algorithm>

namespace crossover {

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

int WaiterQueue::Repair(const std::function<bool(const Owner&)>& alive,
                        int64_t now_host_mono_ns) {
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
    if (w.ticket == 0 || duplicate || w.deadline_host_mono_ns < now_host_mono_ns || !alive(w.who)) {
      ++dropped;
      continue;
    }
    entries[kept++] = w;
  }
  size = kept;
  return dropped;
}

}  // namespace crossover
