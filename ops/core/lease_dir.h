// The lease directory: which file systems may hold a lease, and which directories and segment
// files a job may trust with it. Private to the core.
//
// Why a trust rule: whoever can rename, replace or write a segment file can split a pair (move
// a live segment away, and the next job starts a second lease: two holders at once) or fake its
// join check (swap in a file with made-up members). So a job uses a directory only if no other
// user can change its entries, the rule OpenSSH's StrictModes and systemd-tmpfiles apply:
//  * the directory and every directory above it are owned by root or by this job's user, and
//    none is writable by group or others unless it is sticky (a sticky directory such as /tmp
//    or /dev/shm lets nobody but a file's owner rename or remove it);
//  * group mode (several users share a lease): the directory may also belong to a member of
//    its group; it is writable by that group, never by others (sticky or not), sticky (so no
//    member renames or removes another's segment), and this job's user is a member of the
//    group. Members can still write each other's 0660 segments: they must trust each other;
//  * every segment file is a regular file, this user's and private to it (0600; group mode:
//    0660, of the directory's group, its owner root, this user or a member of that group).
// Anything else is refused, naming the path, its owner and mode, and the command that fixes it.
#ifndef CROSSOVER_TF_OPS_CORE_LEASE_DIR_H_
#define CROSSOVER_TF_OPS_CORE_LEASE_DIR_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "core/lease_types.h"

namespace crossover {

// Local file systems known to keep shared mappings, futexes and open-file-description locks
// coherent among the processes of one host: the name of f_type, or nullptr for any other
// (network, cluster and FUSE file systems, and any type not known to be local, are refused:
// a false refusal is loud and fixable, a false pass would exclude nobody on another host).
const char* LocalFileSystem(int64_t f_type);
// f_type as "name (0xMAGIC)", or "an unknown type (0xMAGIC)", for refusals.
std::string FileSystemText(int64_t f_type);

// Who trusts the directory: a job that will create and write segments in it, or an observer
// (status, exporter) that only reads them and accepts a directory of either mode.
enum class DirUse { kPrivate, kGroup, kObserve };

// The trust rule for dir (absolute, symlinks resolved) and every directory above it. On
// success *group_mode says whether the directory is a group-mode one (its group may write).
LeaseStatus CheckDirTrust(const std::string& dir, DirUse use, bool* group_mode = nullptr);

// The trust rule for a segment file, given its fstat, its directory's group and mode. An
// observer accepts a private segment (0600) of any user; a job only its own.
LeaseStatus CheckSegmentTrust(const std::string& path, const struct stat& st, gid_t dir_gid,
                              bool group_mode, bool observer);

// True if uid's primary group is gid or uid is listed among gid's members.
bool UidInGroup(uid_t uid, gid_t gid);

// "0640"-style text of a mode's permission bits.
std::string ModeText(mode_t mode);
// "PATH (owner uid U (name), group G, mode 0640)", for refusals.
std::string DescribeFile(const std::string& path, const struct stat& st);

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_LEASE_DIR_H_
