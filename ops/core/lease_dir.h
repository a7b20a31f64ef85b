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
//  * links: the path is walked one component at a time from "/" (openat, O_NOFOLLOW), and a
//    symbolic link on it is followed only if it belongs to root or to this job's user (an
//    observer: also to the owner of the directory that holds it). Its directory already passed
//    the rule, so nobody else can replace the link; a link anyone else owns could be re-pointed
//    between two jobs' opens, putting them on two directories (two holders at once). The
//    directory is then used through the descriptor the walk opened, never by its name again.
// Anything else is refused, naming the path, its owner and mode, and the command that fixes it.
#ifndef CROSSOVER_TF_OPS_CORE_LEASE_DIR_H_
#define CROSSOVER_TF_OPS_CORE_LEASE_DIR_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
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
// (status, exporter) that only reads them and accepts a directory of either mode (one that
// passes as a group-mode directory is observed as one, its group's 0660 segments read).
enum class DirUse { kPrivate, kGroup, kObserve };

// A lease directory that passed the trust rule, held open (O_PATH) so that every later open,
// creation, check and removal in it goes through this descriptor: re-pointing a link or
// renaming a directory on its path after the walk changes nothing for the holder.
class TrustedDir {
 public:
  TrustedDir() = default;
  TrustedDir(int fd, std::string path, const struct stat& st, bool group_mode);
  TrustedDir(const TrustedDir&) = delete;
  TrustedDir& operator=(const TrustedDir&) = delete;
  ~TrustedDir();

  int fd() const { return fd_; }
  // The directory's path with every link resolved (what the walk opened), for messages and
  // for keying segments: every spelling of one directory gives one path.
  const std::string& path() const { return path_; }
  const struct stat& st() const { return st_; }
  bool group_mode() const { return group_mode_; }

 private:
  int fd_ = -1;
  std::string path_;
  struct stat st_ = {};
  bool group_mode_ = false;
};

// Walks dir (absolute, or relative to the working directory) from "/", checking the trust
// rule on every directory and link it meets, and opens it. On success *out holds it;
// group_mode says whether it is a group-mode directory (its group may write).
LeaseStatus OpenTrustedDir(const std::string& dir, DirUse use,
                           std::shared_ptr<const TrustedDir>* out);

// The trust rule for a segment file, given its fstat, its directory's group and mode. An
// observer accepts a private segment (0600) of any user, and in a group-mode directory also
// the group's 0660 ones; a job only its own.
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
