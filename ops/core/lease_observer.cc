// A C entry point to the lease core's observer (DeviceLease::Inspect), for readers that must
// not load TensorFlow: the node exporter (crossover_tf/node/exporter.py) runs once per node
// beside the jobs, and a TensorFlow import would cost it seconds and hundreds of MiB for a read
// of a few KiB. Built as its own library (_lease_observer.so, no TensorFlow) from the same core
// sources as the op library, so both read one layout. It reads as status does: read-only,
// non-blocking, the trust rule checked, nothing joined, created or repaired.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "core/device_lease.h"

namespace crossover {
namespace {

// A JSON string: job labels are [A-Za-z0-9_.:@-] by construction, but a segment is another
// process's memory, so every byte is escaped as JSON needs.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void WriteUsage(std::ostringstream& out, const LeaseUsage& u) {
  out << "{\"acquires\":" << u.acquires << ",\"contended\":" << u.contended
      << ",\"handoffs\":" << u.handoffs << ",\"hold_ns\":" << u.hold_ns
      << ",\"wait_ns\":" << u.wait_ns << ",\"wait_buckets\":[";
  for (int i = 0; i < kWaitBuckets; ++i) out << (i ? "," : "") << u.wait_buckets[i];
  out << "],\"link_turns\":" << u.link_turns << ",\"link_turn_waits\":" << u.link_turn_waits
      << ",\"link_turn_wait_ns\":" << u.link_turn_wait_ns << "}";
}

std::string ToJson(const LeaseSnapshot& snap) {
  std::ostringstream out;
  out << "{\"members\":[";
  for (size_t i = 0; i < snap.members.size(); ++i) {
    const LeaseMember& m = snap.members[i];
    out << (i ? "," : "") << "{\"job\":" << Quoted(m.job) << ",\"pid\":" << m.pid
        << ",\"pid_ns\":" << m.pid_ns << ",\"holding\":" << (m.holding ? "true" : "false")
        << ",\"usage\":";
    WriteUsage(out, m.usage);
    out << "}";
  }
  out << "],\"queue\":[";
  for (size_t i = 0; i < snap.queue.size(); ++i) {
    const LeaseWaiter& w = snap.queue[i];
    out << (i ? "," : "") << "{\"job\":" << Quoted(w.job) << ",\"pid\":" << w.pid
        << ",\"pid_ns\":" << w.pid_ns << ",\"priority\":" << w.priority
        << ",\"since_wall_ns\":" << w.since_wall_ns << "}";
  }
  out << "],\"held_since_wall_ns\":" << snap.held_since_wall_ns
      << ",\"held_for_ns\":" << snap.held_for_ns
      << ",\"overlapping_holds\":" << snap.overlapping_holds << ",\"handoffs\":" << snap.handoffs
      << ",\"recoveries\":" << snap.recoveries << ",\"wait_bucket_upper_ns\":[";
  for (int i = 0; i < kWaitBuckets - 1; ++i) out << (i ? "," : "") << kWaitBucketUpperNs[i];
  out << "]}";
  return out.str();
}

char* Copy(const std::string& text) {
  char* out = static_cast<char*>(malloc(text.size() + 1));
  if (out != nullptr) memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

}  // namespace
}  // namespace crossover

extern "C" {

// Reads the lease segment file at path as an observer, retrying for a consistent copy for at
// most bound_s. Returns 0 and sets *out to the lease as JSON, or a LeaseCode (> 0) and sets
// *out to the error message; -1 if out of memory. The caller frees *out with
// crossover_lease_free.
int crossover_lease_observe(const char* path, double bound_s, char** out) {
  crossover::LeaseSnapshot snap;
  const crossover::LeaseStatus status = crossover::DeviceLease::Inspect(path, bound_s, &snap);
  *out = crossover::Copy(status.ok() ? crossover::ToJson(snap) : status.message);
  if (*out == nullptr) return -1;
  return static_cast<int>(status.code);
}

void crossover_lease_free(char* text) { free(text); }

}  // extern "C"
