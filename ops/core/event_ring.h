// The per-process timelines of the device lease and the link turn: the newest events of one
// kind, kept in this process only (never in the shared segment). Private to the core.
#ifndef CROSSOVER_TF_OPS_CORE_EVENT_RING_H_
#define CROSSOVER_TF_OPS_CORE_EVENT_RING_H_

#include <cstddef>
#include <vector>

namespace crossover {

constexpr size_t kTimelineCapacity = 16384;  // events kept per timeline

// The newest `capacity` events of one kind, oldest first on read.
template <typename Event>
class EventRing {
 public:
  explicit EventRing(size_t capacity = kTimelineCapacity) : capacity_(capacity) {}
  void Push(const Event& e) {
    if (events_.size() < capacity_) {
      last_ = events_.size();
      events_.push_back(e);
    } else {
      last_ = next_;
      events_[last_] = e;
    }
    next_ = (last_ + 1) % capacity_;
  }
  Event* Last() { return events_.empty() ? nullptr : &events_[last_]; }
  std::vector<Event> Ordered() const {
    if (events_.size() < capacity_) return events_;
    std::vector<Event> ordered(events_.begin() + next_, events_.end());
    ordered.insert(ordered.end(), events_.begin(), events_.begin() + next_);
    return ordered;
  }

 private:
  size_t capacity_, next_ = 0, last_ = 0;
  std::vector<Event> events_;
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_EVENT_RING_H_
