// Naming the segment when its mapping faults. Private to the core.
//
// Why: a segment is a shared file, and whoever may write it (root, the job's user, in group
// mode any member of the directory's group) can truncate it. Every process that has it mapped
// then dies of SIGBUS at its next access, with nothing but "Bus error" to go on. No access to a
// truncated mapping can be made to succeed, so the process still dies of SIGBUS (exit 135), but
// first it writes which segment it was and what happened. Other SIGBUS faults go on to the
// handler that was there before (Python's faulthandler, say), or to the default action.
#ifndef CROSSOVER_TF_OPS_CORE_SEGMENT_FAULT_H_
#define CROSSOVER_TF_OPS_CORE_SEGMENT_FAULT_H_

#include <cstddef>
#include <string>

namespace crossover {

// Names [begin, begin + length) as the mapping of the segment file at path, installing the
// SIGBUS handler on first use. At most kMaxWatchedSegments at once; past that, a mapping is
// simply not named.
constexpr int kMaxWatchedSegments = 64;
void WatchSegmentMapping(const void* begin, size_t length, const std::string& path);
// Forgets the mapping at begin (before munmap).
void UnwatchSegmentMapping(const void* begin);

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_SEGMENT_FAULT_H_
